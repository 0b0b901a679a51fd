//! `weir soak`: Weir under many faults at once, for a given time and seed (issue 41, item 4;
//! docs/reliability.md). Three `weir serve` hosts on one store and one broker run two
//! pipelines of the `counter` test operator — one exactly-once on `lsm` with event-time and
//! processing-time timers, one at-least-once on `memory` — over steady input, while a
//! schedule drawn from the seed ([`schedule`]) kills, terminates, freezes and restarts hosts
//! (host 0 never), slows, cuts, half-opens and throttles the links to the broker and to S3
//! ([`link`], TCP proxies the soak owns), makes S3 answer 503 or crawl, fills a host's disk
//! cache, and switches a pipeline's operator version and state backend.
//!
//! At the end, against its input topics read back (what the pipelines consume; the producer's
//! acknowledgements can undercount them): every count exact, no output twice for
//! a `read_committed` reader of the exactly-once pipeline, every timer fired once, every
//! partition running, the consumer groups' committed offsets equal to the last checkpoints';
//! host 0's resident memory and open files at the end within 1.2× of the most they were from
//! minute 5 to a third of the way (a sixth of the way, for shorter soaks), the store's objects and bytes within 1.5× of minute
//! 10 (a third). It prints the faults by kind (how many overlapped another), the time from each
//! fault to the outputs of every partition flowing again (p50, p99, max) and the worst output
//! lag, and fails with the checks that did not hold.
//!
//! The soak is a tool beside the host library, not part of it: it drives `weir` binaries as an
//! operator would. The short test tier runs 2 minutes of it with a fixed seed on the shared
//! broker and S3 server; the long tier 30 minutes (`deploy/soak.sh`).

mod checks;
mod footprint;
mod hosts;
mod inject;
mod link;
mod report;
mod schedule;
mod traffic;

use crate::client::ApiClient;
use anyhow::Context as _;
use checks::{final_checks, store_size};
use hosts::{Host, HostSetup};
use inject::{RECOVERY_WAIT_MAX, inject};
use link::{Link, LinkFault};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::producer::FutureProducer;
pub use report::print;
use schedule::{Fault, FaultKind, Schedule};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use traffic::{PARTITIONS, Traffic};

/// `weir soak`'s options.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakOptions {
    /// How long the soak injects faults and produces input, minutes (then it recovers and
    /// checks).
    #[arg(long, default_value_t = 30.0)]
    pub minutes: f64,
    /// The seed the fault schedule is drawn from.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Faults of each kind (at least 3).
    #[arg(long, default_value_t = 3)]
    pub per_kind: usize,
    /// Faults of each process kind — SIGKILL, SIGTERM, SIGSTOP, leave and join — (default:
    /// `per_kind`): the process kills of a long soak.
    #[arg(long)]
    pub process_per_kind: Option<usize>,
    /// Records a second into each pipeline's input.
    #[arg(long, default_value_t = 200)]
    pub rate: u64,
    /// Where the soak's link to the broker listens — the address the broker advertises for
    /// its soak listener (deploy/local/kafka.sh) — and that listener, which the link forwards
    /// to.
    #[arg(long, default_value = "127.0.0.1:9098")]
    pub broker_link: SocketAddr,
    /// See `broker_link`.
    #[arg(long, default_value = "127.0.0.1:9097")]
    pub broker_upstream: SocketAddr,
    /// The broker for the soak's own clients (topics, input, readers).
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub bootstrap: String,
    /// The S3 server (deploy/local/s3.sh).
    #[arg(long, default_value = "127.0.0.1:9000")]
    pub s3: SocketAddr,
    /// The `counter` test operator component.
    #[arg(
        long,
        default_value = "target/wasm32-wasip2/guest/weir_test_counter.wasm"
    )]
    pub operator: PathBuf,
    /// The `weir` binary the hosts run (default: this one).
    #[arg(long)]
    pub weir: Option<PathBuf>,
    /// Where the hosts' configs, logs and work directories go (default: a new temporary
    /// directory, kept when a check fails).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Start a broker and an S3 server of the soak's own (deploy/local/, run from the
    /// repository's root) on ports of their own (`--own-ports`) instead of the shared ones,
    /// and restart the broker among the faults.
    #[arg(long)]
    pub own_services: bool,
    /// With `--own-services`: the S3 server's port; the broker's client port is 92 above it
    /// and its others follow (deploy/local/kafka.sh). Two soaks at once need two.
    #[arg(long, default_value_t = 19_000)]
    pub own_ports: u16,
}

/// A broker and an S3 server of the soak's own: started from deploy/local/ with ports and a
/// directory of their own; stopped when dropped.
#[derive(Debug)]
struct OwnServices {
    dir: PathBuf,
    /// The S3 server's port.
    s3_port: u16,
    /// The broker's client port (its others follow).
    kafka_port: u16,
}

impl OwnServices {
    /// Starts both under `dir`, S3 on `port`, the broker's client port 92 above it.
    ///
    /// # Errors
    /// When a script fails (it says why).
    async fn start(dir: &std::path::Path, port: u16) -> anyhow::Result<Self> {
        let services = Self {
            dir: dir.to_owned(),
            s3_port: port,
            kafka_port: port + 92,
        };
        services.kafka("start", false).await?;
        services.script("s3.sh", "start", &[]).await?;
        Ok(services)
    }

    /// `deploy/local/kafka.sh command` on the soak's broker, its data kept if `keep`.
    async fn kafka(&self, command: &str, keep: bool) -> anyhow::Result<()> {
        let keep = if keep { "1" } else { "0" };
        self.script("kafka.sh", command, &[("KAFKA_KEEP_DATA", keep)])
            .await
    }

    async fn script(&self, name: &str, command: &str, env: &[(&str, &str)]) -> anyhow::Result<()> {
        let script = PathBuf::from("deploy/local").join(name);
        anyhow::ensure!(
            script.exists(),
            "{} not found: run `weir soak --own-services` from the repository's root",
            script.display()
        );
        let output = tokio::process::Command::new("bash")
            .arg(&script)
            .arg(command)
            .env("WEIR_KAFKA_PORT_BASE", self.kafka_port.to_string())
            .env("WEIR_KAFKA_DIR", self.dir.join("kafka"))
            .env("WEIR_S3_PORT", self.s3_port.to_string())
            .env("WEIR_S3_DIR", self.dir.join("s3"))
            .envs(env.iter().copied())
            .output()
            .await?;
        anyhow::ensure!(
            output.status.success(),
            "{} {command} failed: {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    }
}

impl Drop for OwnServices {
    fn drop(&mut self) {
        for (script, port_var, port, dir_var, dir) in [
            (
                "kafka.sh",
                "WEIR_KAFKA_PORT_BASE",
                self.kafka_port,
                "WEIR_KAFKA_DIR",
                "kafka",
            ),
            ("s3.sh", "WEIR_S3_PORT", self.s3_port, "WEIR_S3_DIR", "s3"),
        ] {
            let _ = std::process::Command::new("bash")
                .arg(PathBuf::from("deploy/local").join(script))
                .arg("stop")
                .env(port_var, port.to_string())
                .env(dir_var, self.dir.join(dir))
                .output();
        }
    }
}

/// The two pipelines' names.
const PIPELINES: [&str; 2] = ["exact", "loose"];

/// What the soak measured and found.
#[derive(Debug, Default)]
pub struct SoakReport {
    /// Per kind: faults, of which overlapping another, and recovery times.
    pub faults: BTreeMap<FaultKind, (usize, usize, Vec<Duration>)>,
    /// The longest time from a record's production to its output being read.
    pub worst_lag: Duration,
    /// Host starts (restarts included) and process kills (SIGKILL and SIGTERM).
    pub starts: u64,
    /// See `starts`.
    pub kills: u64,
    /// Host 0's resident bytes and open files early, and at the end.
    pub footprint: ((u64, u64), (u64, u64)),
    /// Host 0's resident bytes and open files at the end of each minute of the soak (`None`
    /// when it could not be read then): a leak grows minute by minute, a cache fills and
    /// stays.
    pub footprint_by_minute: Vec<Option<(u64, u64)>>,
    /// The store's objects and bytes early, and at the end.
    pub store: ((u64, u64), (u64, u64)),
    /// Whether the soak was long enough for the store's growth to be checked.
    pub store_checked: bool,
    /// Whether the soak was long enough for host 0's footprint to be checked (twice the
    /// baseline's 5 minutes).
    pub footprint_checked: bool,
    /// The checks that failed.
    pub problems: Vec<String>,
}

/// Everything a running soak shares between its tasks.
struct Soak {
    hosts: Vec<Mutex<Host>>,
    /// Each host's link to S3.
    s3_links: Vec<Link>,
    setup: HostSetup,
    broker: Link,
    api: ApiClient,
    /// The tenant's client, once it has a key.
    tenant_api: std::sync::OnceLock<ApiClient>,
    tenant: String,
    traffic: [Traffic; 2],
    started: Instant,
    kills: std::sync::atomic::AtomicU64,
    /// Operator versions uploaded (1 and 2, the same component), and which each pipeline runs.
    versions: std::sync::Mutex<[u64; 2]>,
    /// The loose pipeline's backend now: `true` for lsm.
    loose_on_lsm: AtomicBool,
    /// The broker and S3 server of the soak's own, if it has them.
    own: Option<OwnServices>,
}

/// Runs a soak and returns its report (module docs).
///
/// # Errors
/// When the soak cannot be set up (services down, a binary missing); failed checks are in the
/// report, not errors.
pub async fn run(opts: &SoakOptions) -> anyhow::Result<SoakReport> {
    let length = Duration::from_secs_f64(opts.minutes * 60.0);
    let mut kinds: Vec<FaultKind> = FaultKind::ALL.to_vec();
    if opts.own_services {
        kinds.push(FaultKind::BrokerRestart);
    }
    let per_kind = (
        opts.per_kind,
        opts.process_per_kind.unwrap_or(opts.per_kind),
    );
    let schedule = Schedule::draw(opts.seed, length, 3, &kinds, per_kind);
    let dir = match &opts.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            dir.clone()
        }
        None => tempfile::Builder::new()
            .prefix("weir-soak-")
            .tempdir()?
            .keep(),
    };
    eprintln!(
        "soak: seed {}, {:.1} min, {} faults ({} overlapping), hosts in {}",
        opts.seed,
        opts.minutes,
        schedule.faults.len(),
        schedule.overlapping(),
        dir.display()
    );
    let (opts, own) = if opts.own_services {
        let own = OwnServices::start(&dir.join("services"), opts.own_ports).await?;
        let opts = SoakOptions {
            bootstrap: format!("127.0.0.1:{}", own.kafka_port),
            broker_link: SocketAddr::from(([127, 0, 0, 1], own.kafka_port + 6)),
            broker_upstream: SocketAddr::from(([127, 0, 0, 1], own.kafka_port + 5)),
            s3: SocketAddr::from(([127, 0, 0, 1], own.s3_port)),
            ..opts.clone()
        };
        (opts, Some(own))
    } else {
        (opts.clone(), None)
    };
    let opts = &opts;
    let mut soak = set_up(opts, &dir).await?;
    soak.own = own;
    for host in &soak.hosts {
        let mut host = host.lock().await;
        host.start(&soak.setup).await?;
    }
    create_pipelines(&soak, opts).await?;
    // The schedule's clock starts with the input, once every host and pipeline is up.
    soak.started = Instant::now();
    let soak = Arc::new(soak);

    // Input and output.
    let stop = Arc::new(AtomicBool::new(false));
    let producer: FutureProducer = crate::kafka::client(&opts.bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()?;
    let (mut background, mut producers) = (Vec::new(), Vec::new());
    for traffic in &soak.traffic {
        let (traffic, producer, stop) = (traffic.clone(), producer.clone(), stop.clone());
        let rate = opts.rate;
        producers.push(tokio::spawn(async move {
            traffic.produce(producer, rate, stop).await;
        }));
    }
    for traffic in &soak.traffic {
        let (traffic, bootstrap) = (traffic.clone(), opts.bootstrap.clone());
        background.push(tokio::spawn(async move {
            if let Err(err) = traffic.read(&bootstrap).await {
                eprintln!("soak: reader of {} failed: {err:#}", traffic.output);
            }
        }));
    }

    // The faults, each in a task of its own, and the samples along the way.
    let mut report = SoakReport::default();
    let recoveries = Arc::new(std::sync::Mutex::new(Vec::new()));
    // A fault that could not be injected, or after which the outputs never flowed again, is a
    // failed check: the table would otherwise count what did not happen.
    let fault_problems = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut faults = Vec::new();
    for fault in schedule.faults.clone() {
        let (soak, recoveries, problems) =
            (soak.clone(), recoveries.clone(), fault_problems.clone());
        faults.push(tokio::spawn(async move {
            tokio::time::sleep_until(tokio::time::Instant::from_std(soak.started + fault.at)).await;
            let problem = match inject(&soak, &fault).await {
                Ok(Some(recovered)) => {
                    recoveries
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((fault.kind, recovered));
                    return;
                }
                Ok(None) => format!(
                    "{} at {:?}: the outputs did not flow again within {RECOVERY_WAIT_MAX:?}",
                    fault.kind.as_str(),
                    fault.at
                ),
                Err(err) => format!(
                    "{} at {:?} could not be injected: {err:#}",
                    fault.kind.as_str(),
                    fault.at
                ),
            };
            eprintln!("soak: {problem}");
            problems
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(problem);
        }));
    }
    let by_minute = Arc::new(std::sync::Mutex::new(Vec::new()));
    background.push(tokio::spawn({
        let (soak, by_minute) = (soak.clone(), by_minute.clone());
        async move {
            let mut minutes = tokio::time::interval_at(
                tokio::time::Instant::from_std(soak.started + MINUTE),
                MINUTE,
            );
            loop {
                minutes.tick().await;
                // A fault holding host 0 (a link cut, a full cache) leaves the minute unread.
                let sample = soak.hosts[0].try_lock().ok().and_then(|h| h.footprint());
                by_minute
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(sample);
            }
        }
    }));
    let early = (length / 6).min(FOOTPRINT_BASELINE);
    tokio::time::sleep_until(tokio::time::Instant::from_std(soak.started + early)).await;
    let footprint_early = soak.hosts[0].lock().await.footprint();
    let store_at = (length / 3).min(Duration::from_secs(600));
    tokio::time::sleep_until(tokio::time::Instant::from_std(soak.started + store_at)).await;
    let store_early = store_size(opts, &soak.setup).await?;
    tokio::time::sleep_until(tokio::time::Instant::from_std(soak.started + length)).await;
    stop.store(true, Ordering::Relaxed);
    // Every send acknowledged or failed before the input is read back as the oracle.
    for producer in producers {
        let _ = producer.await;
    }
    for fault in faults {
        let _ = fault.await;
    }
    eprintln!(
        "soak: input stopped and every fault over after {:?}",
        soak.started.elapsed()
    );

    // Recovery, then the checks.
    report.problems.extend(
        fault_problems
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..),
    );
    report.problems.extend(final_checks(&soak, opts).await);
    let footprint_late = soak.hosts[0].lock().await.footprint();
    if footprint_early.is_none() || footprint_late.is_none() {
        report
            .problems
            .push("host 0's resident memory and open files could not be read".to_owned());
    }
    report.footprint = (
        footprint_early.unwrap_or_default(),
        footprint_late.unwrap_or_default(),
    );
    report.store = (store_early, store_size(opts, &soak.setup).await?);
    report.footprint_by_minute = by_minute.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (rss1, fds1) = report.footprint.1;
    // From minute 5 a host has settled (its caches warm, its share of partitions held): a soak
    // must reach it, and outlast it, for the growth after it to mean a leak. Shorter soaks
    // sample a sixth of the way in and print it; how many partitions host 0 holds then (its
    // files: segments, connections) is chance (the short tier's soak saw 48 → 65).
    let (rss0, fds0) = footprint::settled(&report.footprint_by_minute, report.footprint.0, length);
    let footprint_checked = length >= 2 * FOOTPRINT_BASELINE;
    report.footprint_checked = footprint_checked;
    if footprint_checked && (rss1 as f64 > 1.2 * rss0 as f64 || fds1 as f64 > 1.2 * fds0 as f64) {
        report.problems.push(format!(
            "host 0 grew: {rss0} → {rss1} resident bytes, {fds0} → {fds1} open files (more than 1.2×)"
        ));
    }
    let ((objects0, bytes0), (objects1, bytes1)) = report.store;
    // GC keeps every object younger than its grace period (10 minutes): before twice that, a
    // store only grows, and the check says nothing.
    let grace_passed = length >= 2 * GC_GRACE;
    report.store_checked = grace_passed;
    if grace_passed
        && (objects1 as f64 > 1.5 * objects0 as f64 || bytes1 as f64 > 1.5 * bytes0 as f64)
    {
        report.problems.push(format!(
            "the store grew: {objects0} → {objects1} objects, {bytes0} → {bytes1} bytes (more than 1.5×)"
        ));
    }
    for fault in &schedule.faults {
        let entry = report.faults.entry(fault.kind).or_default();
        entry.0 += 1;
        let overlaps = schedule
            .faults
            .iter()
            .any(|g| !std::ptr::eq(g, fault) && g.at < fault.until() && fault.at < g.until());
        entry.1 += usize::from(overlaps);
    }
    for (kind, took) in recoveries.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        report.faults.entry(*kind).or_default().2.push(*took);
    }
    report.worst_lag = soak
        .traffic
        .iter()
        .map(|t| t.ledger.lock().unwrap_or_else(|e| e.into_inner()).worst_lag)
        .max()
        .unwrap_or_default();
    let mut starts = 0;
    for host in &soak.hosts {
        starts += host.lock().await.starts;
    }
    report.starts = starts;
    report.kills = soak.kills.load(Ordering::Relaxed);
    for task in background {
        task.abort();
    }
    // The hosts (and the soak's own services) stop before their directory goes.
    drop(soak);
    if report.problems.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("soak: kept {} (hosts' logs)", dir.display());
    }
    Ok(report)
}

/// Starts the link to the broker, makes the bucket, the topics and the hosts (not started).
async fn set_up(opts: &SoakOptions, dir: &std::path::Path) -> anyhow::Result<Soak> {
    let _ = rustls_provider();
    let run = format!("{:x}", rand::random::<u32>());
    let bucket = format!("weir-soak-{run}");
    let status = reqwest::Client::new()
        .put(format!("http://{}/{bucket}", opts.s3))
        .send()
        .await
        .with_context(|| format!("is the S3 server up at {}? (deploy/local/s3.sh)", opts.s3))?
        .status();
    anyhow::ensure!(status.is_success(), "CreateBucket answered {status}");
    let broker = Link::start(opts.broker_link, opts.broker_upstream)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} for the link to the broker (is another test using it?)",
                opts.broker_link
            )
        })?;
    let tenant = format!("soak-{run}");
    let topics: Vec<String> = [
        "in-exact",
        "out-exact",
        "dlq-exact",
        "in-loose",
        "out-loose",
        "dlq-loose",
    ]
    .iter()
    .map(|t| format!("{tenant}.{t}"))
    .collect();
    let admin: AdminClient<_> = crate::kafka::client(&opts.bootstrap).create()?;
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|t| {
            let partitions = if t.contains(".dlq") { 1 } else { PARTITIONS };
            NewTopic::new(t, partitions, TopicReplication::Fixed(1))
        })
        .collect();
    for created in admin.create_topics(&new, &AdminOptions::new()).await? {
        created.map_err(|(topic, code)| anyhow::anyhow!("cannot create {topic}: {code}"))?;
    }
    let admin_key = format!(
        "{:032x}{:032x}",
        rand::random::<u128>(),
        rand::random::<u128>()
    );
    let setup = HostSetup {
        store_url: format!("s3://{bucket}/weir"),
        store_options: [
            ("aws_region", "us-east-1"),
            ("aws_access_key_id", "test"),
            ("aws_secret_access_key", "test"),
            ("aws_allow_http", "true"),
            ("aws_virtual_hosted_style_request", "false"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect(),
        bootstrap: broker.addr().to_string(),
        bin: match &opts.weir {
            Some(bin) => bin.clone(),
            None => std::env::current_exe()?,
        },
        admin_key: admin_key.clone(),
    };
    let (mut hosts, mut s3_links) = (Vec::new(), Vec::new());
    for index in 0..3 {
        let link = Link::start("127.0.0.1:0".parse()?, opts.s3).await?;
        hosts.push(Mutex::new(Host::new(index, dir, link.addr(), &setup)?));
        s3_links.push(link);
    }
    let api_at = hosts[0].lock().await.api;
    Ok(Soak {
        hosts,
        s3_links,
        setup,
        broker,
        api: ApiClient::new(&format!("http://{api_at}"), &admin_key),
        tenant_api: std::sync::OnceLock::new(),
        tenant: tenant.clone(),
        traffic: [
            Traffic::new(topics[0].clone(), topics[1].clone(), true),
            Traffic::new(topics[3].clone(), topics[4].clone(), false),
        ],
        started: Instant::now(),
        kills: Default::default(),
        versions: std::sync::Mutex::new([1, 1]),
        loose_on_lsm: AtomicBool::new(false),
        own: None,
    })
}

/// The process's TLS provider for reqwest (needed even for plain HTTP).
fn rustls_provider() -> bool {
    weir_host::state::lsm::backend::object_store_from_url("memory:///", &Default::default()).is_ok()
}

/// Through host 0: the tenant, its key, the counter twice (versions 1 and 2) and the two
/// pipelines.
async fn create_pipelines(soak: &Soak, opts: &SoakOptions) -> anyhow::Result<()> {
    let api = &soak.api;
    api.create_tenant(&soak.tenant, None).await?;
    let key = api.create_api_key(&soak.tenant).await?.key;
    let tenant = ApiClient::new(&format!("http://{}", soak.hosts[0].lock().await.api), &key);
    let component = std::fs::read(&opts.operator)
        .with_context(|| format!("reading {}", opts.operator.display()))?;
    for _ in 0..2 {
        tenant.push_operator("counter", component.clone()).await?;
    }
    for (name, exactly_once) in [(PIPELINES[0], true), (PIPELINES[1], false)] {
        let spec = serde_json::json!({
            "operator": "counter",
            "operator_version": 1,
            "input_topics": [format!("in-{name}")],
            "output_topic": format!("out-{name}"),
            "dead_letter_topic": format!("dlq-{name}"),
            "checkpoint_interval_ms": 2000,
            "delivery": if exactly_once { "exactly_once" } else { "at_least_once" },
            "state_backend": if exactly_once { "lsm" } else { "memory" },
            "idle_timeout_ms": 2000,
            "idle_advance": exactly_once,
        });
        let spec = serde_json::from_value(spec)?;
        tenant.create_pipeline(name, &spec).await?;
    }
    // From here on, the soak's API calls are the tenant's, through host 0 (never killed).
    let _ = soak.tenant_api.set(tenant);
    Ok(())
}

impl Soak {
    fn tenant_api(&self) -> &ApiClient {
        self.tenant_api
            .get()
            .expect("create_pipelines set the tenant's client before any fault")
    }

    /// Every input partition's highest offset produced so far, of both pipelines.
    fn high_offsets(&self) -> [BTreeMap<i32, i64>; 2] {
        self.traffic.each_ref().map(|t| {
            t.ledger
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .high
                .clone()
        })
    }

    /// Waits until both pipelines have answered every partition past `offsets` (their input
    /// when a fault came), for at most `timeout`; returns how long from `since`.
    async fn outputs_flowing(
        &self,
        offsets: &[BTreeMap<i32, i64>; 2],
        since: Instant,
        timeout: Duration,
    ) -> Option<Duration> {
        let deadline = Instant::now() + timeout;
        loop {
            let answered = self.traffic.iter().zip(offsets).all(|(t, o)| {
                t.ledger
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .answered_past(o)
            });
            if answered {
                return Some(since.elapsed());
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// GC's grace period (`RetentionPolicy::default`): no object younger is deleted.
const GC_GRACE: Duration = Duration::from_secs(600);

/// How often host 0's footprint is sampled for the report.
const MINUTE: Duration = Duration::from_secs(60);

/// When host 0's footprint is sampled as the baseline of its check: minute 5.
const FOOTPRINT_BASELINE: Duration = Duration::from_secs(300);
