//! The soak's checks at its end (module docs of `soak`): every host up, the outputs caught up
//! with the input, every partition running on one host, the groups' offsets the last
//! checkpoints'; and the store's size, sampled along the way.

use super::hosts::HostSetup;
use super::traffic::{PARTITIONS, tally_input};
use super::{PIPELINES, Soak, SoakOptions};
use crate::client::ApiClient;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long the final checks wait for the outputs to catch up with everything produced.
const CATCH_UP_MAX: Duration = Duration::from_secs(600);

/// After the input stopped and every fault is over: every host up, the outputs caught up,
/// then the checks of the module docs. Returns what did not hold.
pub(super) async fn final_checks(soak: &Soak, opts: &SoakOptions) -> Vec<String> {
    let mut problems = Vec::new();
    for host in &soak.hosts {
        let mut host = host.lock().await;
        if host.pid().is_none() || host.exited(Duration::ZERO).await {
            problems.push(format!(
                "host {} was not running at the end: {}",
                host.index,
                host.tail()
            ));
            if let Err(err) = host.start(&soak.setup).await {
                problems.push(format!("host {} does not start: {err:#}", host.index));
            }
        }
    }
    // The oracle is what the inputs hold (`InputTally`), read back now that nothing more is
    // produced.
    for traffic in &soak.traffic {
        let (bootstrap, input) = (opts.bootstrap.clone(), traffic.input.clone());
        let tally = tokio::task::spawn_blocking(move || tally_input(&bootstrap, &input)).await;
        match tally {
            Ok(Ok(tally)) => {
                let (note, problem) = traffic.adopt_input(tally);
                if let Some(note) = note {
                    eprintln!("soak: {note}");
                }
                problems.extend(problem);
            }
            Ok(Err(err)) => {
                problems.push(format!("{}: cannot be read back: {err:#}", traffic.input))
            }
            Err(err) => problems.push(format!("{}: cannot be read back: {err}", traffic.input)),
        }
    }
    let deadline = Instant::now() + CATCH_UP_MAX;
    while !soak.traffic.iter().all(|t| {
        t.ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .caught_up()
    }) {
        if Instant::now() > deadline {
            problems.push(format!(
                "the outputs did not catch up within {CATCH_UP_MAX:?} of the input's end"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Late duplicates, if any, come in now.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for traffic in &soak.traffic {
        problems.extend(traffic.problems());
    }
    for name in PIPELINES {
        problems.extend(partitions_running(soak, name).await);
        problems.extend(offsets_committed(soak, opts, name).await);
    }
    problems
}

/// Whether the hosts report every partition of `pipeline` running, each on one host.
async fn partitions_running(soak: &Soak, pipeline: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let view = soak.tenant_api().pipeline(pipeline).await;
        let mut running: Vec<i32> = match &view {
            Ok(view) => view
                .status
                .hosts
                .iter()
                .filter(|h| matches!(h.phase, weir_host::api::pipelines::HostPhase::Running))
                .flat_map(|h| h.partitions.iter().map(|p| p.0))
                .collect(),
            Err(_) => Vec::new(),
        };
        running.sort_unstable();
        if running == (0..PARTITIONS).collect::<Vec<_>>() {
            return Vec::new();
        }
        if Instant::now() > deadline {
            return vec![format!(
                "{pipeline}: partitions running {running:?}, not each of 0..{PARTITIONS} once: {view:?}"
            )];
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Whether `pipeline`'s consumer group has committed its last checkpoints' offsets: a
/// checkpoint is asked for, then the group's offsets compared with each partition's newest
/// checkpoint (they may trail it for a moment: at-least-once commits them asynchronously).
async fn offsets_committed(soak: &Soak, opts: &SoakOptions, pipeline: &str) -> Vec<String> {
    let api = soak.tenant_api();
    let Ok(view) = api.pipeline(pipeline).await else {
        return vec![format!("{pipeline}: no answer from the API")];
    };
    let _ = api.trigger_checkpoint(pipeline).await;
    let group = format!("weir.{}.{pipeline}.{}", soak.tenant, view.definition.uid);
    let topic = format!("{}.in-{pipeline}", soak.tenant);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let checkpointed = newest_checkpoints(api, pipeline, &topic).await;
        let committed = committed_offsets(&opts.bootstrap, &group, &topic);
        match (&checkpointed, &committed) {
            (Ok(c), Ok(g)) if c.len() == PARTITIONS as usize && c == g => return Vec::new(),
            _ if Instant::now() > deadline => {
                return vec![format!(
                    "{pipeline}: the group's committed offsets {committed:?} are not the last checkpoints' {checkpointed:?}"
                )];
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Each partition's newest checkpoint's offset of `topic`.
async fn newest_checkpoints(
    api: &ApiClient,
    pipeline: &str,
    topic: &str,
) -> anyhow::Result<BTreeMap<i32, i64>> {
    let mut newest: BTreeMap<i32, (u64, i64)> = BTreeMap::new();
    for checkpoint in api.checkpoints(pipeline).await? {
        let Some(offset) = checkpoint.offsets.get(topic).map(|o| o.0) else {
            continue;
        };
        let entry = newest.entry(checkpoint.partition.0).or_insert((0, offset));
        if checkpoint.committed_ms >= entry.0 {
            *entry = (checkpoint.committed_ms, offset);
        }
    }
    Ok(newest.into_iter().map(|(p, (_, o))| (p, o)).collect())
}

/// The group's committed offsets of `topic`, by partition.
fn committed_offsets(
    bootstrap: &str,
    group: &str,
    topic: &str,
) -> anyhow::Result<BTreeMap<i32, i64>> {
    let consumer: BaseConsumer = crate::kafka::client(bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut wanted = rdkafka::TopicPartitionList::new();
    for p in 0..PARTITIONS {
        wanted.add_partition(topic, p);
    }
    let committed = consumer.committed_offsets(wanted, Duration::from_secs(10))?;
    Ok(committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            rdkafka::Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect())
}

/// The objects and bytes under the soak's store.
pub(super) async fn store_size(
    opts: &SoakOptions,
    setup: &HostSetup,
) -> anyhow::Result<(u64, u64)> {
    use futures::TryStreamExt as _;
    use object_store::ObjectStore as _;
    let mut options: BTreeMap<String, String> = setup.store_options.iter().cloned().collect();
    options.insert("aws_endpoint".to_owned(), format!("http://{}", opts.s3));
    let (store, prefix) =
        weir_host::state::lsm::backend::object_store_from_url(&setup.store_url, &options)?;
    let objects: Vec<_> = store.list(Some(&prefix)).try_collect().await?;
    Ok((
        objects.len() as u64,
        objects.iter().map(|o| o.size).sum::<u64>(),
    ))
}
