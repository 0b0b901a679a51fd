//! The disk cache's directory: one per cache, `{parent}/weir-block-cache-XXXXXX`, deleted with
//! the cache — and, since a process killed with SIGKILL (or by the OOM killer) deletes nothing,
//! deleted by the next cache created under the same parent once no process holds it.
//!
//! A cache holds an exclusive lock (`flock`) on the `.lock` file in its directory for as long
//! as it lives; the kernel releases it when the process dies, however it dies. Creating a cache
//! deletes each sibling directory whose lock it can take, and each one without a lock file (a
//! Weir from before the lock, or a directory being created this instant) once it is an hour
//! old.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// Prefix of the cache directories' names.
const DIR_PREFIX: &str = "weir-block-cache-";

/// The file a live cache keeps locked.
const LOCK_FILE: &str = ".lock";

/// A directory without a lock file younger than this may be one being created: it stays.
const UNLOCKED_AGE_MIN: Duration = Duration::from_secs(3600);

/// A new cache directory under `parent` (created when missing), locked by the returned file
/// for as long as it is held, after deleting the directories of caches no process holds.
///
/// # Errors
/// When `parent` or the directory cannot be created or locked.
pub(super) fn create(parent: &Path) -> std::io::Result<(tempfile::TempDir, File)> {
    std::fs::create_dir_all(parent)?;
    let removed = remove_abandoned(parent, crate::clock::wall_now());
    if removed > 0 {
        tracing::info!(parent = %parent.display(), removed, "deleted disk cache directories of processes gone");
    }
    let dir = tempfile::Builder::new()
        .prefix(DIR_PREFIX)
        .tempdir_in(parent)?;
    // Locked under another name, then renamed: another process that finds `.lock` always
    // finds it locked (before the rename it sees a young directory without one, which stays).
    let unnamed = dir.path().join(".lock-new");
    let lock = File::create(&unnamed)?;
    lock.try_lock().map_err(std::io::Error::other)?;
    std::fs::rename(&unnamed, dir.path().join(LOCK_FILE))?;
    Ok((dir, lock))
}

/// Deletes the cache directories under `parent` that no process holds (module docs), judged at
/// `now`; returns how many. Errors skip a directory: another process may be deleting it too.
fn remove_abandoned(parent: &Path, now: SystemTime) -> usize {
    let mut removed = 0;
    for entry in std::fs::read_dir(parent).into_iter().flatten().flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(DIR_PREFIX)
            || !entry.file_type().is_ok_and(|t| t.is_dir())
        {
            continue;
        }
        let path = entry.path();
        let abandoned = match File::open(path.join(LOCK_FILE)) {
            // Held while deleting, so no one else takes it meanwhile.
            Ok(lock) => lock.try_lock().is_ok() && std::fs::remove_dir_all(&path).is_ok(),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                let age = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .map(|m| now.duration_since(m).unwrap_or_default())
                    .unwrap_or_default();
                age >= UNLOCKED_AGE_MIN && std::fs::remove_dir_all(&path).is_ok()
            }
            Err(_) => false,
        };
        removed += usize::from(abandoned);
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_cache_deletes_the_directories_of_caches_no_process_holds() {
        let parent = tempfile::tempdir().expect("a directory");
        let (live, _lock) = create(parent.path()).expect("creates");
        // A killed process's directory: its lock file is there, nobody holds it.
        let killed = parent.path().join(format!("{DIR_PREFIX}killed"));
        std::fs::create_dir(&killed).expect("creates");
        std::fs::write(killed.join(LOCK_FILE), b"").expect("writes");
        std::fs::write(killed.join("0000000000000001.block"), [7u8; 64]).expect("writes");
        // Without a lock file: one from an older Weir, and one being created right now.
        let (old, new) = (
            parent.path().join(format!("{DIR_PREFIX}old")),
            parent.path().join(format!("{DIR_PREFIX}new")),
        );
        for dir in [&old, &new] {
            std::fs::create_dir(dir).expect("creates");
        }
        std::fs::File::open(&old)
            .and_then(|d| d.set_modified(crate::clock::wall_now() - 2 * UNLOCKED_AGE_MIN))
            .expect("ages it");
        let other = parent.path().join("not-a-cache");
        std::fs::create_dir(&other).expect("creates");

        let (second, _second_lock) = create(parent.path()).expect("creates");
        assert!(!killed.exists(), "a dead process's cache goes");
        assert!(!old.exists(), "an old directory without a lock goes");
        assert!(new.exists(), "a young one may be being created: it stays");
        assert!(live.path().exists(), "a held cache stays");
        assert!(second.path().exists() && other.exists());
        drop(live);
        assert_eq!(
            remove_abandoned(parent.path(), crate::clock::wall_now()),
            0,
            "a dropped cache deleted its own directory"
        );
    }
}
