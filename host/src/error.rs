//! The kinds of failure the crate surface reports, each telling the caller what to do.
//!
//! Modules own precise `thiserror` enums; [`ErrorKind`] is the coarse classification that
//! callers (the pipeline loop, later the HTTP layer) branch on.

/// What the caller should do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The input is wrong (a bad config, a malformed Wasm file): fix it.
    InvalidInput,
    /// A dependency (broker, object store) is unreachable or overloaded: retry with backoff.
    Unavailable,
    /// Stored data failed a check (checksum, format): stop and alert.
    Corrupt,
    /// Another owner took over (a newer writer epoch): stop this shard.
    Fenced,
    /// The operator trapped or broke a limit: dead-letter the record, keep going.
    GuestFault,
    /// A bug in Weir.
    Internal,
}
