//! What a pipeline does on the ways a record can go wrong or arrive late, and what its output
//! guarantees: the policies of [`super::PipelineSettings`] (and of an API pipeline spec).

use serde::Deserialize;

/// What a late record (its timestamp at or before the shard's watermark) does (docs/time.md).
/// Late records are counted in `weir_late_records_total` whatever this says.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LateRecords {
    /// Deliver it like any other (the operator can compare its timestamp with the watermark).
    #[default]
    Process,
    /// Send it to the dead-letter topic with `weir.error.kind = late`.
    DeadLetter,
    /// Drop it.
    Drop,
}

impl LateRecords {
    /// Every policy, in [`LateRecords::index`] order.
    pub const ALL: [LateRecords; 3] = [
        LateRecords::Process,
        LateRecords::DeadLetter,
        LateRecords::Drop,
    ];

    /// Its position in [`LateRecords::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its name, as configured (the metric's `policy` label).
    pub fn as_str(self) -> &'static str {
        match self {
            LateRecords::Process => "process",
            LateRecords::DeadLetter => "dead_letter",
            LateRecords::Drop => "drop",
        }
    }
}

/// What happens to a record whose call fails for good (as Kafka Streams'
/// `default.deserialization.exception.handler` / `processing.exception.handler`: continue or
/// fail). The record has been re-run alone first, so the failure is its own.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// Send it to the dead-letter topic with the reason, and go on.
    #[default]
    DeadLetter,
    /// Drop it (counted in `records_skipped_failed`), and go on.
    Skip,
    /// Stop the pipeline: nothing after the record is committed; it fails again on restart.
    Fail,
}

/// The output's guarantee after crashes and rebalances (docs/checkpoints.md).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Every output is delivered; the outputs of records after the last checkpoint are sent
    /// again after a failure. The manifest write commits a checkpoint.
    #[default]
    AtLeastOnce,
    /// A `read_committed` consumer sees every output once: one transactional producer per
    /// shard, whose transaction commits the interval's outputs and the input offsets together
    /// (naming the checkpoint's manifest). Needs `state.backend = "lsm"`.
    ExactlyOnce,
}
