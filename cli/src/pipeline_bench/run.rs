//! One run of `weir bench` ([`measure`]): a fresh pipeline over the preloaded input, then the
//! latency phase, with the backend's store metered.

use super::*;

/// One run: a fresh pipeline over the preloaded input, then the latency phase.
#[allow(clippy::too_many_arguments)]
pub(super) async fn measure(
    opts: &PipelineBenchOptions,
    producer: &FutureProducer,
    input: &str,
    name: &str,
    workload: Workload,
    implementation: Implementation,
    backend: Backend,
    latency_events: &[Event],
) -> Result<BenchRun, PipelineBenchError> {
    let output = format!("{name}-out");
    let dlq = format!("{name}-dlq");
    // The latency phase's events go to a topic of the run's own, co-partitioned with the
    // input: every run's throughput phase reads exactly the preloaded events.
    let latency_input = format!("{name}-latency");
    crate::dev::ensure_topics(
        &opts.bootstrap_servers,
        &[
            (&output, opts.partitions),
            (&dlq, 1),
            (&latency_input, opts.partitions),
        ],
    )
    .await?;
    let settings = Settings {
        pipeline: PipelineSettings {
            name: name.to_owned(),
            operator: match (workload, implementation) {
                (Workload::Counter, _) => opts.counter_operator.clone(),
                (Workload::Aggregate, Implementation::Python) => {
                    opts.aggregate_python_operator.clone()
                }
                (Workload::Aggregate, _) => opts.aggregate_operator.clone(),
            },
            input_topics: vec![input.to_owned(), latency_input.clone()],
            output_topic: Some(output.clone()),
            dead_letter_topic: dlq,
            group_id: None,
            checkpoint_interval: opts.checkpoint_interval,
            delivery: Default::default(),
            in_flight_max: weir_host::config::DEFAULT_IN_FLIGHT_MAX,
            failure_policy: Default::default(),
            max_out_of_orderness: Default::default(),
            idle_timeout: None,
            idle_advance: false,
            late_records: Default::default(),
            iceberg: None,
            stages: Vec::new(),
            edges: Default::default(),
            outputs: Default::default(),
            parameters: Default::default(),
            tables: Default::default(),
            global_tables: Default::default(),
        },
        kafka: crate::kafka::settings(&opts.bootstrap_servers),
        runtime: RuntimeSettings::default(),
        state: StateSettings::default(),
        iceberg: Default::default(),
    };
    let clock: SharedClock = Arc::new(SystemClock);
    std::fs::create_dir_all(&opts.store_dir).map_err(PipelineBenchError::Caches)?;
    let (store, _) = weir_host::state::lsm::backend::object_store_from_url(
        &format!("file://{}", opts.store_dir.display()),
        &BTreeMap::new(),
    )?;
    let metering = Arc::new(Metering::new(&Default::default()));
    let store: Arc<dyn ObjectStore> = Arc::new(HookedStore::new(store, metering.clone()));
    let prefix = StorePath::from(name);
    let phases = Phases {
        opts,
        producer,
        input,
        latency_input: &latency_input,
        output: &output,
        latency_events,
    };
    let (mut run, stats, run_s) = match backend {
        Backend::Memory => {
            let backend = Arc::new(MemoryBackend::durable(store, prefix, clock.clone()));
            phases
                .run(settings, backend, clock, workload, implementation)
                .await?
        }
        Backend::Lsm { cache_bytes } => {
            let caches = BlockCaches::new(&CacheSettings {
                block_cache_bytes: cache_bytes,
                disk_cache_bytes: 0,
                disk_cache_dir: None,
            })
            .map_err(PipelineBenchError::Caches)?;
            let backend = Arc::new(LsmBackend::new(
                store,
                prefix,
                Arc::new(caches),
                LsmSettings::default(),
                clock.clone(),
            ));
            phases
                .run(settings, backend, clock, workload, implementation)
                .await?
        }
    };
    let mut durations: Vec<u64> = stats
        .checkpoint_history
        .lock()
        .expect("history lock")
        .iter()
        .map(|c| c.duration_ms)
        .collect();
    durations.sort_unstable();
    let kinds = [
        Request::Put,
        Request::Get,
        Request::List,
        Request::Copy,
        Request::Delete,
    ];
    let store_requests: BTreeMap<String, u64> = kinds
        .iter()
        .map(|k| (k.name().to_owned(), metering.requests(*k)))
        .collect();
    let all: u64 = store_requests.values().sum();
    let checkpoints = stats.checkpoints.load(Ordering::Relaxed).max(1);
    let put_class = metering.requests(Request::Put)
        + metering.requests(Request::List)
        + metering.requests(Request::Copy);
    // Every request of the run (opening, flushes, checkpoints, GC) over its checkpoints, at one
    // checkpoint per interval per partition for a month.
    let checkpoints_per_month =
        f64::from(opts.partitions.max(1)) * MONTH_S / opts.checkpoint_interval.as_secs_f64();
    let cost_per_checkpoint = (put_class as f64 * S3_PUT_PER_1000_USD
        + metering.requests(Request::Get) as f64 * S3_GET_PER_1000_USD)
        / 1000.0
        / checkpoints as f64;
    run.backend = backend;
    run.checkpoints = stats.checkpoints.load(Ordering::Relaxed);
    run.checkpoint_p50_ms = percentile_u64(&durations, 0.5);
    run.checkpoint_max_ms = durations.last().copied().unwrap_or(0) as f64;
    run.requests_per_checkpoint = all as f64 / checkpoints as f64;
    run.request_cost_per_month_usd = cost_per_checkpoint * checkpoints_per_month;
    run.output_topic = output;
    run.store_requests = store_requests;
    run.run_s = run_s;
    Ok(run)
}

/// What the two phases of a run share.
struct Phases<'a> {
    opts: &'a PipelineBenchOptions,
    producer: &'a FutureProducer,
    input: &'a str,
    latency_input: &'a str,
    output: &'a str,
    latency_events: &'a [Event],
}

impl Phases<'_> {
    /// Runs the pipeline through both phases; the run (backend and checkpoint figures left for
    /// the caller), its stats and its wall time, s.
    async fn run<B: StateBackend>(
        &self,
        settings: Settings,
        backend: Arc<B>,
        clock: SharedClock,
        workload: Workload,
        implementation: Implementation,
    ) -> Result<(BenchRun, Arc<PipelineStats>, f64), PipelineBenchError> {
        let runtime = Runtime::<B::Shard>::new(&settings.runtime, clock)?;
        let operator = Arc::new(match implementation {
            Implementation::Wasm | Implementation::Python => {
                runtime.load_operator(&settings.pipeline.operator).await?
            }
            Implementation::Native => runtime.native_operator(match workload {
                Workload::Counter => Arc::new(NativeCounter),
                Workload::Aggregate => Arc::new(NativeFlightDelays),
            })?,
        });
        let bootstrap = &self.opts.bootstrap_servers;
        let expected: u64 = high_watermarks(bootstrap, self.input)?
            .iter()
            .map(|(_, h)| *h as u64)
            .sum();
        let stats = Arc::new(PipelineStats::default());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (_requests, control) = PipelineControl::new();
        let started = Instant::now();
        let mut pipeline = tokio::spawn(weir_host::runner::run_operator(
            settings,
            backend,
            operator,
            stats.clone(),
            control,
            async move {
                let _ = stop_rx.await;
            },
        ));
        // Throughput: the preloaded input, from the first processed record to the last.
        let mut first: Option<(Instant, u64, u64)> = None;
        let phase_started = Instant::now();
        while stats.records_done() < expected {
            if phase_started.elapsed() > PHASE_LIMIT || pipeline.is_finished() {
                break;
            }
            if first.is_none() && stats.records_done() > 0 {
                first = Some((
                    Instant::now(),
                    stats.records_done(),
                    stats.guest_call_ns.load(Ordering::Relaxed),
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let done = stats.records_done();
        let call_ns = stats.guest_call_ns.load(Ordering::Relaxed);
        // Measured from the first look that saw records done, unless most were done by then
        // (a run too short to measure so): then from the start.
        let (from, done_before, ns_before, includes_start) = match first {
            Some((at, n, ns)) if n.saturating_mul(2) < done => (at, n, ns, false),
            _ => (started, 0, 0, true),
        };
        let events = done.saturating_sub(done_before).max(1) as f64;
        let events_per_s = events / from.elapsed().as_secs_f64().max(1e-9);
        let call_ns_per_event = call_ns.saturating_sub(ns_before) as f64 / events;
        if done < expected {
            let _ = stop_tx.send(());
            (&mut pipeline).await.ok();
            return Err(PipelineBenchError::Timeout {
                phase: "throughput",
                done,
                expected,
                limit: PHASE_LIMIT,
            });
        }
        // Latency: a steady rate, each output read back; the first second warms up the reader
        // (its connection and first fetch) and is not measured.
        let reader = OutputReader::start(bootstrap, self.output)?;
        let warm_up = (self.opts.latency_rate as usize).min(self.latency_events.len() / 2);
        let (warming, measured) = self.latency_events.split_at(warm_up);
        let rate = Some(self.opts.latency_rate);
        produce(self.producer, self.latency_input, warming, rate).await?;
        let latency_started_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        produce(self.producer, self.latency_input, measured, rate).await?;
        let wanted = expected + self.latency_events.len() as u64;
        let deadline = Instant::now() + PHASE_LIMIT;
        while stats.records_done() < wanted && Instant::now() < deadline && !pipeline.is_finished()
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut latencies = reader
            .finish(latency_started_ms, measured.len(), Duration::from_secs(10))
            .await;
        let _ = stop_tx.send(());
        match pipeline.await {
            Ok(result) => result?,
            Err(_) => return Err(KafkaError::Canceled.into()),
        }
        let run_s = started.elapsed().as_secs_f64();
        if stats.records_done() < wanted {
            return Err(PipelineBenchError::Timeout {
                phase: "latency",
                done: stats.records_done().saturating_sub(expected),
                expected: self.latency_events.len() as u64,
                limit: PHASE_LIMIT,
            });
        }
        latencies.sort_unstable();
        let run = BenchRun {
            workload,
            implementation,
            backend: Backend::Memory,
            events: expected,
            events_per_s,
            includes_start,
            repeats: 1,
            events_per_s_min: events_per_s,
            events_per_s_max: events_per_s,
            call_ns_per_event,
            latency_samples: latencies.len() as u64,
            latency_p50_ms: percentile_u64(&latencies, 0.5),
            latency_p99_ms: percentile_u64(&latencies, 0.99),
            trap_rate: 0.0,
            checkpoints: 0,
            checkpoint_p50_ms: 0.0,
            checkpoint_max_ms: 0.0,
            store_requests: BTreeMap::new(),
            requests_per_checkpoint: 0.0,
            request_cost_per_month_usd: 0.0,
            output_topic: String::new(),
            run_s: 0.0,
        };
        Ok((run, stats, run_s))
    }
}
