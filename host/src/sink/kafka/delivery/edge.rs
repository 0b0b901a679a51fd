//! What a stage's sink writes to an internal topic besides its records (docs/topologies.md):
//! the watermark markers of its checkpoints, with their frontier, and each record's origin
//! (`crate::time::edge`).

use super::{Destination, KafkaSink, SinkError};
use crate::ids::Partition;
use crate::runtime::{InputRecord, StagedEmit};
use crate::time::edge::{FRONTIER_HEADER, Frontier, ORIGIN_HEADER, Origin, TopicKey};
use crate::time::watermark::{MARKER_HEADER, Marker};
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};

/// Room an origin header takes in a record: its name, its 16 bytes, and their lengths.
const ORIGIN_HEADER_BYTES: u64 = (ORIGIN_HEADER.len() + 16 + 16) as u64;

impl KafkaSink {
    /// Whether [`KafkaSink::watermark`] writes anything: an output is an internal topic.
    pub fn writes_markers(&self) -> bool {
        self.outputs
            .iter()
            .flatten()
            .any(|o| o.marker_partitions.is_some())
    }

    /// Writes `marker` — the shard's watermark at a checkpoint — and the checkpoint's
    /// `frontier` when given (a second header) to every partition of each output that is an
    /// internal topic, with the checkpoint's outputs (in its transaction, exactly-once),
    /// timestamped with the watermark; nothing when none is.
    ///
    /// # Errors
    /// [`SinkError`] when an earlier delivery failed for good.
    pub async fn watermark(
        &mut self,
        marker: Marker,
        frontier: Option<&Frontier>,
    ) -> Result<(), SinkError> {
        let value = marker.encode();
        let frontier = frontier.map(Frontier::encode);
        for output in 0..self.outputs.len() {
            let Some(out) = self.outputs[output].take() else {
                continue;
            };
            let mut sent = Ok(());
            for partition in 0..out.marker_partitions.unwrap_or(0) {
                let mut headers = OwnedHeaders::new_with_capacity(2).insert(KafkaHeader {
                    key: MARKER_HEADER,
                    value: Some(value.as_bytes()),
                });
                if let Some(frontier) = &frontier {
                    headers = headers.insert(KafkaHeader {
                        key: FRONTIER_HEADER,
                        value: Some(frontier.as_bytes()),
                    });
                }
                let destination = Destination::Output {
                    output: u16::try_from(output).unwrap_or(u16::MAX),
                    topic: u16::MAX,
                    partition: Partition(marker.shard),
                    offset: -1,
                };
                let to = (&*out.topic, Some(partition));
                sent = self
                    .send(
                        to,
                        None,
                        b"",
                        Some(headers),
                        marker.watermark_ms,
                        destination,
                    )
                    .await;
                if sent.is_err() {
                    break;
                }
            }
            self.outputs[output] = Some(out);
            sent?;
        }
        Ok(())
    }

    /// The origin header's value of `emit` for `source` (of the input topic `input`) when its
    /// output is an internal topic; none for another output, or for a fired timer's emit (its
    /// source offset is -1).
    pub(super) fn origin(
        &self,
        emit: &StagedEmit,
        source: &InputRecord,
        input: TopicKey,
    ) -> Option<[u8; 16]> {
        self.outputs
            .get(usize::from(emit.output))
            .and_then(Option::as_ref)
            .filter(|o| o.marker_partitions.is_some() && source.offset >= 0)
            .map(|_| {
                Origin {
                    shard: source.partition,
                    input,
                    offset: source.offset,
                }
                .encode()
            })
    }

    /// The most an emit may take, keys, value and headers (bytes): the topics' limit less
    /// room for the origin header when an output is an internal topic.
    pub fn emit_bytes_max(&self) -> u64 {
        let max = self.limits().output_bytes_max;
        if self.writes_markers() {
            max.saturating_sub(ORIGIN_HEADER_BYTES)
        } else {
            max
        }
    }
}
