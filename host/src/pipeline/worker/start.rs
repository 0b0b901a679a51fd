//! How a partition's worker starts: from its opened shard and sink, where the checkpoint left
//! the input, its lines to the consumer loop, and the pipeline's settings.

use super::PartitionWorker;
use crate::config::Settings;
use crate::ids::Partition;
use crate::pipeline::PipelineControl;
use crate::pipeline::PipelineStats;
use crate::pipeline::attempt::Execution;
use crate::pipeline::consumer_loop::Opened;
use crate::pipeline::events::{Assignment, EventSender};
use crate::pipeline::ports::ShardSink;
use crate::pipeline::timers::Timers;
use crate::runtime::guest_log::LogSource;
use crate::runtime::{Operator, WorldVersion};
use crate::state::Shard;
use crate::state::checkpoint::InputOffsets;
use crate::time::watermark::Idleness;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use tokio::time::Instant;

/// What a worker starts from besides the settings: its partition's opened shard and sink, where
/// the shard's checkpoint left the input, and its lines to the consumer loop.
pub(crate) struct WorkerStart<S: Shard, K: ShardSink> {
    /// The input partition.
    pub partition: Partition,
    /// The operator it calls.
    pub operator: Arc<Operator<S>>,
    /// The shard, recovered and claimed, and its sink.
    pub opened: Opened<S, K>,
    /// The run's figures.
    pub stats: Arc<PipelineStats>,
    /// The run's checkpoint requests and the operator's log sink.
    pub control: PipelineControl,
    /// What it tells the consumer loop.
    pub events: EventSender,
    /// What the consumer loop tells it besides the records.
    pub assignment: Assignment,
    /// The checkpoint's input offsets, where the shard's state resumes.
    pub offsets: InputOffsets,
    /// When the shard began to open (the recovery time is measured from it).
    pub opened_at: Instant,
    /// Whether the consumer is caught up on the partition, kept by the consumer loop.
    pub caught_up: Arc<AtomicBool>,
    /// The run's global tables on this host.
    pub global_tables: crate::runtime::GlobalTables,
}

impl<S: Shard, K: ShardSink> PartitionWorker<S, K> {
    /// A worker of `start`'s partition under the pipeline's `settings`: nothing admitted past
    /// the checkpoint's offsets, nothing dirty, its timers and watermark read from the shard as
    /// it runs.
    pub fn new(settings: &Settings, start: WorkerStart<S, K>) -> Self {
        let WorkerStart {
            partition,
            operator,
            opened:
                Opened {
                    shard,
                    sink,
                    edges,
                    tables: loaded,
                },
            stats,
            control,
            events,
            assignment,
            offsets,
            opened_at,
            caught_up,
            global_tables,
        } = start;
        let pipeline = &settings.pipeline;
        let call_settings = std::sync::Arc::new(crate::runtime::CallSettings {
            record_bytes_max: sink.output_bytes_max(),
            table: sink.emit_table(),
            parameters: std::sync::Arc::new(pipeline.parameters.clone()),
            global_tables,
        });
        // Tables never hold the watermark back: only the other inputs count.
        let streams: Vec<String> = pipeline
            .input_topics
            .iter()
            .filter(|t| !pipeline.tables.contains_key(*t))
            .cloned()
            .collect();
        let mut timers = Timers::new(
            &streams,
            pipeline.max_out_of_orderness,
            Idleness {
                timeout: pipeline.idle_timeout,
                advance: pipeline.idle_advance,
            },
            operator.clock().clone(),
            operator.meta().world != WorldVersion::V0_1,
        );
        // Inputs that are internal topics: their markers move their watermark.
        for (topic, upstream_shards) in &pipeline.edges.inputs {
            timers.watermarks_mut().set_edge(topic, *upstream_shards);
        }
        let mut worker = Self {
            partition,
            shard: Arc::new(shard),
            sink,
            settings: settings.runtime.clone(),
            source: LogSource::partition(&pipeline.name, partition, control.log_sink),
            execution: Execution::new(pipeline.in_flight_max, &settings.runtime, stats.clone()),
            operator,
            stats,
            events,
            assignment,
            gave_up: false,
            stall_reported: false,
            sink_held_reported: false,
            admitted: offsets.clone(),
            offsets,
            // Table rows loaded past the checkpoint: the next one saves them.
            dirty: loaded.records > 0,
            tables: pipeline.tables.clone(),
            checkpoint_interval: pipeline.checkpoint_interval,
            opened_at: Some(opened_at),
            failure_policy: pipeline.failure_policy,
            checkpoint_requests: control.checkpoint_requests,
            timers,
            marked: None,
            edges: super::edges::EdgeTracking::default(),
            late_records: pipeline.late_records,
            call_settings,
            caught_up,
        };
        if let Some(edges) = edges {
            worker.restore_edges(edges.as_deref());
        }
        worker
    }
}
