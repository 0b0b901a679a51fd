//! Writer tokens that say where a checkpoint came from.

use crate::ids::ManifestVersion;

/// The writer token of a checkpoint a backend switch converted from checkpoint `version` of
/// backend `from` (`convert-lsm-12`, `crate::checkpoints::convert`): [`converted_from`] reads
/// the version back.
pub fn conversion_token(from: &str, version: ManifestVersion) -> String {
    format!("convert-{from}-{version}")
}

/// The checkpoint a conversion wrote the checkpoint with `writer_token` from, or `None` when
/// no conversion wrote it: whose state and offsets it holds.
pub fn converted_from(writer_token: &str) -> Option<ManifestVersion> {
    let (_, version) = writer_token.strip_prefix("convert-")?.rsplit_once('-')?;
    version.parse().ok().map(ManifestVersion)
}

#[cfg(test)]
mod tests {
    use super::{conversion_token, converted_from};
    use crate::ids::ManifestVersion;

    /// A conversion's writer token names the checkpoint it converted; no other token does.
    #[test]
    fn a_converted_checkpoints_token_names_the_checkpoint_it_was_converted_from() {
        let token = conversion_token("lsm", ManifestVersion(12));
        assert_eq!(token, "convert-lsm-12");
        assert_eq!(converted_from(&token), Some(ManifestVersion(12)));
        assert_eq!(converted_from("restore-a-sp"), None);
        assert_eq!(converted_from("convert-lsm-x"), None);
        assert_eq!(converted_from("w-7"), None);
    }
}
