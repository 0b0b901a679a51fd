//! The compiled-component directory (`[runtime] compiled_dir`): where each compiled component
//! is kept, how it is written, and how the directory is kept within
//! `compiled_dir_bytes_max` by deleting the least recently used files, as a cache.
//!
//! Layout: `{dir}/{engine compatibility hash}/{SHA-256 of the component}.cwasm`. A file's
//! modification time is its last use: set when it is written and again when it is loaded.
//! Files of another engine configuration (an older wasmtime, other limits) are never loaded
//! again by this host; they go first as they age.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use wasmtime::Engine;
use wasmtime::component::Component;

/// A half-written file (`store` writes aside, then renames) left this long by a crashed
/// writer is deleted by a prune.
const PARTIAL_AGE_MAX: Duration = Duration::from_secs(3600);

/// `{dir}/{engine compatibility hash}/{SHA-256 of the component}.cwasm`.
pub(super) fn path(dir: &Path, engine: &Engine, component: &[u8]) -> PathBuf {
    use sha2::Digest;
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    dir.join(format!("{:016x}", hasher.finish())).join(format!(
        "{}.cwasm",
        hex::encode(sha2::Sha256::digest(component))
    ))
}

/// Takes the lock of the compiled file at `path` (`{path}.lock`, an exclusive `flock`),
/// waiting while another thread or process holds it — compiling the same component, which
/// then is in the directory. `None` (no lock: at worst a second compile) when the lock file
/// cannot be made or locked. Released when dropped.
pub(super) fn lock(path: &Path) -> Option<std::fs::File> {
    let parent = path.parent()?;
    let locked = std::fs::create_dir_all(parent)
        .and_then(|()| {
            std::fs::File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path.with_extension(LOCK_EXTENSION))
        })
        .and_then(|file| file.lock().map(|()| file));
    match locked {
        Ok(file) => Some(file),
        Err(err) => {
            tracing::debug!(path = %path.display(), error = %err, "cannot lock the compiled operator; compiling without");
            None
        }
    }
}

/// The extension of a compiled file's lock file.
const LOCK_EXTENSION: &str = "lock";

/// Marks the file at `path` as just used (its modification time), so that a prune keeps it
/// over files used longer ago. A failure only makes it an earlier candidate.
pub(super) fn touch(path: &Path) {
    let touched = std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(crate::clock::wall_now()));
    if let Err(err) = touched {
        tracing::debug!(path = %path.display(), error = %err, "cannot mark the compiled operator as used");
    }
}

/// Writes `component`'s compiled form at `path` (aside, then renamed, so that a reader never
/// sees part of it), then prunes `dir` to `bytes_max`. A failure only costs a later compile:
/// it is logged, not returned.
pub(super) fn store(component: &Component, dir: &Path, path: &Path, bytes_max: u64) {
    let written = component
        .serialize()
        .map_err(|e| std::io::Error::other(format!("{e:#}")))
        .and_then(|bytes| {
            let parent = path.parent().expect("compiled paths have a directory");
            std::fs::create_dir_all(parent)?;
            let mut file = tempfile::Builder::new()
                .prefix(PARTIAL_PREFIX)
                .tempfile_in(parent)?;
            std::io::Write::write_all(&mut file, &bytes)?;
            file.persist(path).map_err(|e| e.error)?;
            Ok(())
        });
    if let Err(err) = written {
        tracing::warn!(path = %path.display(), error = %err, "cannot keep the compiled operator");
        return;
    }
    let pruned = prune(dir, bytes_max, path, crate::clock::wall_now());
    if pruned.deleted > 0 {
        tracing::info!(
            dir = %dir.display(),
            deleted = pruned.deleted,
            deleted_bytes = pruned.deleted_bytes,
            kept_bytes = pruned.kept_bytes,
            "pruned the compiled-component directory (least recently used first)"
        );
    }
}

/// The prefix of half-written files.
const PARTIAL_PREFIX: &str = ".partial-";

/// What a prune did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Pruned {
    /// Compiled files deleted (half-written ones not counted).
    pub deleted: usize,
    /// Their bytes.
    pub deleted_bytes: u64,
    /// Bytes of the compiled files kept.
    pub kept_bytes: u64,
}

/// Deletes the least recently used compiled files under `dir` (every engine's) until the rest
/// take at most `bytes_max`, never `keep` (the file just written, which may alone be larger);
/// also deletes half-written files and lock files older than [`PARTIAL_AGE_MAX`] at `now`. Another host
/// process sharing the directory that loses a file it was about to load compiles the
/// component again. Errors (a file gone meanwhile, a directory not readable) skip the file.
pub(super) fn prune(dir: &Path, bytes_max: u64, keep: &Path, now: SystemTime) -> Pruned {
    let mut files: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
    let engines = std::fs::read_dir(dir).into_iter().flatten().flatten();
    for entry in engines.flat_map(|e| std::fs::read_dir(e.path()).into_iter().flatten().flatten()) {
        let path = entry.path();
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // `.tmp…`: a half-written file of the writer before this one (tempfile's default name).
        // A lock file an hour old outlived its compile (a holder keeps its lock on the file
        // deleted; a newcomer's new one only allows a second compile).
        let stale_lock = name.ends_with(".lock");
        if stale_lock || name.starts_with(PARTIAL_PREFIX) || name.starts_with(".tmp") {
            if now.duration_since(modified).unwrap_or_default() > PARTIAL_AGE_MAX {
                let _ = std::fs::remove_file(&path);
            }
        } else if meta.is_file() && name.ends_with(".cwasm") {
            files.push((modified, meta.len(), path));
        }
    }
    let mut total: u64 = files.iter().map(|(_, len, _)| len).sum();
    // Oldest use first.
    files.sort();
    let mut pruned = Pruned::default();
    for (_, len, path) in files {
        if total <= bytes_max {
            break;
        }
        if path == keep || std::fs::remove_file(&path).is_err() {
            continue;
        }
        total -= len;
        pruned.deleted += 1;
        pruned.deleted_bytes += len;
    }
    pruned.kept_bytes = total;
    pruned
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `len` bytes at `dir/{engine}/{name}.cwasm`, last used `age_s` before `now`.
    fn file(
        dir: &Path,
        engine: &str,
        name: &str,
        len: usize,
        now: SystemTime,
        age_s: u64,
    ) -> PathBuf {
        let path = dir.join(engine).join(format!("{name}.cwasm"));
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("creates");
        std::fs::write(&path, vec![0u8; len]).expect("writes");
        let f = std::fs::File::options()
            .write(true)
            .open(&path)
            .expect("opens");
        f.set_modified(now - Duration::from_secs(age_s))
            .expect("sets the time");
        path
    }

    #[test]
    fn a_prune_deletes_the_least_recently_used_files_of_every_engine_until_the_rest_fit() {
        let dir = tempfile::tempdir().expect("a directory");
        let now = crate::clock::wall_now();
        let old_engine = file(dir.path(), "aaaa", "old-engine", 100, now, 500);
        let used_long_ago = file(dir.path(), "bbbb", "a", 100, now, 400);
        let used_lately = file(dir.path(), "bbbb", "b", 100, now, 10);
        let just_written = file(dir.path(), "bbbb", "c", 150, now, 1000);
        let partial_old = dir.path().join("bbbb").join(".partial-x");
        std::fs::write(&partial_old, b"half").expect("writes");
        std::fs::File::options()
            .write(true)
            .open(&partial_old)
            .and_then(|f| f.set_modified(now - Duration::from_secs(7200)))
            .expect("ages it");
        let partial_new = dir.path().join("bbbb").join(".partial-y");
        std::fs::write(&partial_new, b"half").expect("writes");

        let pruned = prune(dir.path(), 260, &just_written, now);
        assert_eq!(
            pruned,
            Pruned {
                deleted: 2,
                deleted_bytes: 200,
                kept_bytes: 250
            }
        );
        assert!(!old_engine.exists() && !used_long_ago.exists());
        assert!(used_lately.exists(), "used lately: kept");
        assert!(
            just_written.exists(),
            "the file just written stays, however old its time"
        );
        assert!(
            !partial_old.exists(),
            "a writer's leftover an hour old goes"
        );
        assert!(partial_new.exists(), "a write in progress stays");

        // Within the limit nothing goes; touching a file makes it the newest.
        assert_eq!(prune(dir.path(), 250, &just_written, now).deleted, 0);
        touch(&used_lately);
        let pruned = prune(dir.path(), 200, &used_lately, crate::clock::wall_now());
        assert_eq!(pruned.deleted, 1);
        assert!(used_lately.exists() && !just_written.exists());
    }
}
