//! A compaction whose outputs are written but not installed when a checkpoint commits and GC
//! runs: GC must keep them (the PUT of the second output is held by a hooked store).

use super::{RETAINED, memory_files, small_settings};
use crate::clock::{ManualClock, SharedClock};
use crate::state::lsm::gc::{LiveWriter, collect_garbage};
use crate::state::lsm::tree::{LsmSettings, LsmTree};
use crate::state::manifest::{Protected, RetentionPolicy};
use crate::state::test_support::block_on;
use crate::state::{Shard, StateWrite};
use bytes::Bytes;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Once armed, holds the second SST PUT until released.
#[derive(Debug, Default)]
struct HoldSecondSstPut {
    armed: std::sync::atomic::AtomicBool,
    seen: std::sync::atomic::AtomicU64,
    held: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl crate::state::hooked_store::RequestHook for HoldSecondSstPut {
    async fn before(
        &self,
        request: crate::state::hooked_store::Request,
        location: Option<&Path>,
    ) -> object_store::Result<()> {
        use std::sync::atomic::Ordering;
        let sst = request == crate::state::hooked_store::Request::Put
            && location.is_some_and(|l| l.as_ref().ends_with(".sst"));
        if sst && self.armed.load(Ordering::SeqCst) && self.seen.fetch_add(1, Ordering::SeqCst) == 1
        {
            let released = self.release.notified();
            self.held.notify_one();
            released.await;
        }
        Ok(())
    }
}

/// Two rounds of ten keys, each flushed to an SST of its own; returns what the tree holds.
async fn two_flushed_rounds(tree: &LsmTree) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut model = BTreeMap::new();
    for round in 0u8..2 {
        for i in 0u8..10 {
            let key = vec![i, round];
            let value = vec![round; 30];
            tree.apply(vec![StateWrite {
                key: key.clone(),
                value: Some(Bytes::from(value.clone())),
                expires_at_ms: None,
            }])
            .await
            .expect("apply");
            model.insert(key, value);
        }
        tree.flush().await.expect("flush");
    }
    model
}

#[test]
fn gc_keeps_a_compaction_output_written_before_a_checkpoint_and_installed_after_it() {
    block_on(async {
        // Two flushes start a compaction whose merge writes several outputs; the PUT of the
        // second is held, so the first is in the store and not yet in the version when a
        // checkpoint commits and GC runs.
        let hook = Arc::new(HoldSecondSstPut::default());
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let store: Arc<dyn ObjectStore> = Arc::new(crate::state::hooked_store::HookedStore::new(
            inner,
            hook.clone(),
        ));
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        let root = Path::from("shard");
        let tree = Arc::new(LsmTree::new(
            memory_files(&store),
            root.clone(),
            1,
            LsmSettings {
                // No flush but the test's.
                memtable_bytes_max: 1 << 20,
                ..small_settings()
            },
            clock,
        ));
        let model = two_flushed_rounds(&tree).await;
        let first_output = tree.next_seq();
        hook.armed.store(true, std::sync::atomic::Ordering::SeqCst);
        let held = hook.held.notified();
        let compaction = tokio::spawn({
            let tree = tree.clone();
            async move { tree.compact_until_settled().await }
        });
        held.await;
        let seq = tree.next_seq();
        assert!(
            seq <= first_output,
            "a checkpoint taken now does not hold the compaction's first output (written, not \
             installed, seq {first_output}): next_seq {seq}"
        );
        tree.checkpoint_committed(seq);
        let gc = RetentionPolicy {
            retained_checkpoints: RETAINED,
            grace: Duration::ZERO,
            ..RetentionPolicy::default()
        };
        collect_garbage(
            &store,
            &root,
            &LiveWriter::of(&tree, &gc),
            &Protected::default(),
            &gc,
            u64::MAX / 2,
        )
        .await
        .expect("gc");
        hook.release.notify_one();
        compaction
            .await
            .expect("no panic")
            .expect("the compaction finds its outputs");
        for id in tree.live_ssts() {
            let path = Path::from(format!("shard/{}", id.object_name()));
            assert!(store.head(&path).await.is_ok(), "{path} is in the store");
        }
        let got: BTreeMap<Vec<u8>, Vec<u8>> = tree
            .scan(b"", None, usize::MAX)
            .await
            .expect("every SST reads")
            .into_iter()
            .map(|(k, v)| (k, v.to_vec()))
            .collect();
        assert_eq!(got, model);
    });
}
