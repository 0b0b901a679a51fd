//! The soak's `weir serve` hosts: each a process of the `weir` binary with its own config, its
//! own link to S3 (the soak holds it) and, when the machine lets the soak mount one, its disk
//! cache on a small tmpfs that a fault can fill.

use anyhow::Context as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// The disk cache's tmpfs, bytes.
const CACHE_TMPFS_BYTES: u64 = 64 << 20;

/// One `weir serve` host.
#[derive(Debug)]
pub struct Host {
    /// Its number (0 is never killed).
    pub index: usize,
    /// Where its API listens.
    pub api: SocketAddr,
    config: PathBuf,
    log: PathBuf,
    /// Its disk cache directory, on a tmpfs of its own if one could be mounted.
    cache: PathBuf,
    cache_mounted: bool,
    process: Option<Child>,
    /// How many times it was started.
    pub starts: u64,
    /// How the process last exited, when [`Host::exited`] saw it (not after a kill).
    pub last_exit: Option<std::process::ExitStatus>,
}

/// What a host's config needs.
#[derive(Debug, Clone)]
pub struct HostSetup {
    /// The catalog's and the state's store.
    pub store_url: String,
    /// `object_store` options for it, but the endpoint (the host's link).
    pub store_options: Vec<(String, String)>,
    /// The brokers, as the host reaches them.
    pub bootstrap: String,
    /// The `weir` binary.
    pub bin: PathBuf,
    /// The admin key.
    pub admin_key: String,
}

impl Host {
    /// Host `index` in `dir`, its API on a free port, reaching S3 at `s3` (its link).
    ///
    /// # Errors
    /// When a port cannot be bound or the config written.
    pub fn new(
        index: usize,
        dir: &Path,
        s3: SocketAddr,
        setup: &HostSetup,
    ) -> anyhow::Result<Self> {
        let api = stable_port()?;
        let work = dir.join(format!("host-{index}"));
        let cache = work.join("cache");
        std::fs::create_dir_all(&cache)?;
        let cache_mounted = mount_tmpfs(&cache);
        let config = dir.join(format!("host-{index}.toml"));
        let mut options: String = setup
            .store_options
            .iter()
            .map(|(k, v)| format!("{k} = \"{v}\"\n"))
            .collect();
        options.push_str(&format!("aws_endpoint = \"http://{s3}\"\n"));
        std::fs::write(
            &config,
            format!(
                r#"listen = "{api}"
store_url = "{store}"
[store_options]
{options}
[pipelines]
host_id = "soak-host-{index}"
bootstrap_servers = "{bootstrap}"
reconcile_interval = "1s"
work_dir = "{work}"
memtable_bytes_max = 262144
block_cache_bytes = 8388608
disk_cache_bytes = 33554432
[pipelines.consumer]
"session.timeout.ms" = "6000"
"#,
                store = setup.store_url,
                bootstrap = setup.bootstrap,
                work = work.display(),
            ),
        )?;
        Ok(Self {
            index,
            api,
            config,
            log: dir.join(format!("host-{index}.log")),
            cache,
            cache_mounted,
            process: None,
            starts: 0,
            last_exit: None,
        })
    }

    /// Starts the host and waits until its API listens.
    ///
    /// # Errors
    /// When it cannot start, or exits or stays silent for 60 s.
    pub async fn start(&mut self, setup: &HostSetup) -> anyhow::Result<()> {
        // Two faults of one host may overlap in time (a drain outlasting its slot, then a
        // kill's restart): a second process beside the first would find its port taken.
        if let Some(child) = self.process.as_mut()
            && matches!(child.try_wait(), Ok(None))
        {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let before = std::fs::metadata(&self.log)?.len();
        let child = Command::new(&setup.bin)
            .arg("serve")
            .arg("--config")
            .arg(&self.config)
            .env("WEIR_ADMIN_KEY", &setup.admin_key)
            .env("RUST_LOG", "info,rdkafka=warn")
            .env_remove("FAILPOINTS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", setup.bin.display()))?;
        self.process = Some(child);
        self.starts += 1;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read(&self.log).unwrap_or_default();
            let since = text
                .get(usize::try_from(before).unwrap_or(0)..)
                .unwrap_or_default();
            if String::from_utf8_lossy(since).contains("weir serve listening") {
                return Ok(());
            }
            if let Some(status) = self
                .process
                .as_mut()
                .and_then(|p| p.try_wait().ok().flatten())
            {
                anyhow::bail!(
                    "host {} exited at start ({status}): {}",
                    self.index,
                    self.tail()
                );
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "host {} did not listen within 60 s: {}",
                self.index,
                self.tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(Child::id)
    }

    /// Sends `signal` (`KILL`, `TERM`, `STOP`, `CONT`).
    ///
    /// # Errors
    /// When `kill` cannot run.
    pub async fn signal(&self, signal: &str) -> anyhow::Result<()> {
        if let Some(pid) = self.pid() {
            Command::new("kill")
                .args(["-s", signal, &pid.to_string()])
                .status()
                .await?;
        }
        Ok(())
    }

    /// Waits up to `timeout` for the process to exit; `false` if it did not.
    pub async fn exited(&mut self, timeout: Duration) -> bool {
        let Some(child) = self.process.as_mut() else {
            return true;
        };
        match tokio::time::timeout(timeout, child.wait()).await {
            Ok(status) => {
                self.last_exit = status.ok();
                self.process = None;
                true
            }
            Err(_) => false,
        }
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.process.take() {
            let _ = child.kill().await;
        }
    }

    /// Resident memory and open file descriptors of the process now (from /proc).
    pub fn footprint(&self) -> Option<(u64, u64)> {
        let pid = self.pid()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let rss_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
        Some((rss_kib * 1024, fds))
    }

    /// Whether its disk cache has a tmpfs of its own that [`Host::fill_cache`] can fill.
    pub fn can_fill_cache(&self) -> bool {
        self.cache_mounted
    }

    /// Fills its disk cache's tmpfs to the last byte (`full`), or empties what that wrote.
    ///
    /// # Errors
    /// When the filler cannot be written or removed.
    pub fn fill_cache(&self, full: bool) -> anyhow::Result<()> {
        let filler = self.cache.join("soak-filler");
        if !full {
            let _ = std::fs::remove_file(&filler);
            return Ok(());
        }
        use std::io::Write as _;
        let mut file = std::fs::File::create(&filler)?;
        let block = vec![0u8; 1 << 20];
        // Until the file system says it is full.
        while file.write_all(&block).is_ok() {}
        let byte = [0u8; 1];
        while file.write_all(&byte).is_ok() {}
        Ok(())
    }

    /// The last lines of its log.
    pub fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(child) = self.process.as_mut() {
            let _ = child.start_kill();
        }
        if self.cache_mounted {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.cache)
                .status();
        }
    }
}

/// A free local port below the kernel's ephemeral range, for a host's API. A host is started
/// again and again on the same port; a port from the ephemeral range (what binding port 0
/// gives) can meanwhile become the local port of any outgoing connection, and the host's next
/// start then fails with "address in use" (the long tier's first 30-minute soak met it).
fn stable_port() -> anyhow::Result<SocketAddr> {
    use rand::Rng as _;
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    anyhow::ensure!(
        ephemeral_from > 11_000,
        "the ephemeral port range starts at {ephemeral_from}: no stable port below it"
    );
    let mut rng = rand::thread_rng();
    for _ in 0..1_000 {
        let port = rng.gen_range(10_000..ephemeral_from);
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return Ok(listener.local_addr()?);
        }
    }
    anyhow::bail!("no free port in 10000..{ephemeral_from}")
}

/// Mounts a tmpfs of [`CACHE_TMPFS_BYTES`] at `dir`; `false` when the machine does not let
/// the soak (not root, no mount).
fn mount_tmpfs(dir: &Path) -> bool {
    std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o"])
        .arg(format!("size={CACHE_TMPFS_BYTES}"))
        .arg("tmpfs")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hosts_api_port_is_never_one_an_outgoing_connection_can_take() {
        let ephemeral_from: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .expect("Linux")
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a range");
        for _ in 0..20 {
            let port = stable_port().expect("a free port").port();
            assert!((10_000..ephemeral_from).contains(&port), "{port}");
        }
    }
}
