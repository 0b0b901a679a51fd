//! The kinds of failure the crate surface reports, each telling the caller what to do.
//!
//! Modules own precise `thiserror` enums; [`ErrorKind`] is the coarse classification that
//! callers (the pipeline loop, later the HTTP layer) branch on.

/// What the caller should do about an error. In the API (a failed pipeline's `reason_kind`)
/// as its snake_case name.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
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

/// Displays an error and its sources on one line, `: `-separated (for a status reason or a
/// log field, where the chain is what the reader needs).
#[derive(Debug)]
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(cause) = next {
            write!(f, ": {cause}")?;
            next = cause.source();
        }
        Ok(())
    }
}
