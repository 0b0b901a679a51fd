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
/// log field, where the chain is what the reader needs). A cause whose text its error already
/// printed (as `object_store`'s errors print their inner error and return it as the source) is
/// not printed again.
#[derive(Debug)]
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut next = self.0.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            if !shown.contains(&text) {
                write!(f, ": {text}")?;
            }
            shown = text;
            next = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Chain;

    /// An error that prints its inner error and also returns it as its source.
    #[derive(Debug, thiserror::Error)]
    #[error("Generic S3 error: {0}")]
    struct Wrapping(#[source] std::io::Error);

    /// An error that names its cause only as its source.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot read the catalog")]
    struct Reading(#[source] Wrapping);

    #[test]
    fn a_chain_shows_each_cause_once_even_when_an_error_prints_its_source() {
        let err = Reading(Wrapping(std::io::Error::other("connection reset")));
        assert_eq!(
            Chain(&err).to_string(),
            "cannot read the catalog: Generic S3 error: connection reset"
        );
    }
}
