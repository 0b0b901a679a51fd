//! Injecting one fault of the soak's schedule: a signal, a host leaving, a link, S3 or disk
//! fault, a switch or a broker restart; healing it after its length; and timing how long the
//! outputs take to flow again.

use super::*;

/// How long after a fault the soak waits for the outputs to flow again before it gives up
/// measuring (the final checks still wait for everything).
pub(super) const RECOVERY_WAIT_MAX: Duration = Duration::from_secs(600);

/// Injects `fault`, heals it after its length, and returns how long it took from the fault
/// (a process fault, a switch: the signal or the call; a link, S3 or disk fault: its end) to
/// every partition's outputs flowing past where the input was then.
pub(super) async fn inject(soak: &Soak, fault: &Fault) -> anyhow::Result<Option<Duration>> {
    let mut offsets = soak.high_offsets();
    let mut since = Instant::now();
    match fault.kind {
        FaultKind::Kill | FaultKind::Term | FaultKind::LeaveJoin => {
            // The host's lock only for each step: other faults (its link, its disk) overlap.
            {
                let mut host = soak.hosts[fault.target].lock().await;
                if fault.kind == FaultKind::Kill {
                    host.kill().await;
                } else {
                    host.signal("TERM").await?;
                    if !host.exited(Duration::from_secs(60)).await {
                        anyhow::bail!(
                            "host {} did not stop on SIGTERM: {}",
                            host.index,
                            host.tail()
                        );
                    }
                    // A drain ends in a clean exit.
                    if let Some(status) = host.last_exit.filter(|s| !s.success()) {
                        anyhow::bail!(
                            "host {} exited with {status} on SIGTERM: {}",
                            host.index,
                            host.tail()
                        );
                    }
                }
            }
            soak.kills.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(fault.length).await;
            soak.hosts[fault.target]
                .lock()
                .await
                .start(&soak.setup)
                .await?;
        }
        FaultKind::Stop => {
            soak.hosts[fault.target].lock().await.signal("STOP").await?;
            tokio::time::sleep(fault.length).await;
            soak.hosts[fault.target].lock().await.signal("CONT").await?;
        }
        FaultKind::LinkLatency
        | FaultKind::LinkCut
        | FaultKind::LinkHalfOpen
        | FaultKind::LinkBandwidth
        | FaultKind::S3Unavailable
        | FaultKind::S3Slow => {
            let on_broker = fault.on_broker
                && !matches!(fault.kind, FaultKind::S3Unavailable | FaultKind::S3Slow);
            let what = match fault.kind {
                FaultKind::LinkLatency => LinkFault::Latency(Duration::from_millis(200)),
                FaultKind::LinkCut => LinkFault::Cut,
                FaultKind::LinkHalfOpen => LinkFault::HalfOpen,
                FaultKind::LinkBandwidth => LinkFault::Bandwidth(64 << 10),
                FaultKind::S3Unavailable => LinkFault::Http503,
                _ => LinkFault::Latency(Duration::from_millis(1500)),
            };
            if on_broker {
                soak.broker.set(what);
                tokio::time::sleep(fault.length).await;
                soak.broker.set(LinkFault::Healthy);
            } else {
                soak.s3_links[fault.target].set(what);
                tokio::time::sleep(fault.length).await;
                soak.s3_links[fault.target].set(LinkFault::Healthy);
            }
            (offsets, since) = (soak.high_offsets(), Instant::now());
        }
        FaultKind::DiskFull => {
            let host = soak.hosts[fault.target].lock().await;
            if !host.can_fill_cache() {
                anyhow::bail!(
                    "no tmpfs could be mounted for host {}'s disk cache (the soak runs as root to fill one)",
                    fault.target
                );
            }
            host.fill_cache(true)?;
            drop(host);
            tokio::time::sleep(fault.length).await;
            soak.hosts[fault.target].lock().await.fill_cache(false)?;
            (offsets, since) = (soak.high_offsets(), Instant::now());
        }
        FaultKind::VersionSwitch => {
            let pipeline = fault.target;
            let version = {
                let mut versions = soak.versions.lock().unwrap_or_else(|e| e.into_inner());
                versions[pipeline] = 3 - versions[pipeline];
                versions[pipeline]
            };
            retry_api(|| {
                soak.tenant_api()
                    .switch_operator(PIPELINES[pipeline], version, None)
            })
            .await?;
        }
        FaultKind::BrokerRestart => {
            let own = soak
                .own
                .as_ref()
                .context("a broker restart needs the soak's own broker (--own-services)")?;
            own.kafka("stop", true).await?;
            tokio::time::sleep(fault.length).await;
            own.kafka("start", true).await?;
            (offsets, since) = (soak.high_offsets(), Instant::now());
        }
        FaultKind::BackendSwitch => {
            let to_lsm = !soak.loose_on_lsm.fetch_xor(true, Ordering::Relaxed);
            let backend = if to_lsm { "lsm" } else { "memory" };
            let change = serde_json::from_value(serde_json::json!({ "state_backend": backend }))?;
            retry_api(|| soak.tenant_api().change_pipeline(PIPELINES[1], &change)).await?;
        }
    }
    Ok(soak
        .outputs_flowing(&offsets, since, RECOVERY_WAIT_MAX)
        .await)
}

/// Calls the API as a patient client does: an answer that the store is unavailable (an S3
/// fault overlapping the call: `503`) is asked again, for up to a minute.
async fn retry_api<T, F, Fut>(mut call: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::client::ClientError>>,
{
    use crate::client::ClientError;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match call().await {
            Ok(answer) => return Ok(answer),
            Err(ClientError::Problem { status: 503, .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(err) => return Err(err.into()),
        }
    }
}
