//! A pipeline of stages (docs/topologies.md) run in the test's process, as `weir run` runs one.

use anyhow::Context as _;
use std::sync::Arc;
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::Settings;
use weir_host::pipeline::PipelineStats;
use weir_host::runner::StagesError;
use weir_host::state::configured::ConfiguredBackend;

/// A pipeline of stages running in this process.
#[derive(Debug)]
pub struct RunningStages {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), StagesError>>,
}

impl RunningStages {
    /// Starts every stage of `settings`' plan, the internal topics first.
    ///
    /// # Errors
    /// A pipeline that is not one of stages or whose graph is invalid; a state backend that
    /// cannot be built.
    pub fn start(settings: &Settings) -> anyhow::Result<Self> {
        let plan = settings
            .stage_plan()
            .context("stages")?
            .map_err(|problems| anyhow::anyhow!("{problems:?}"))?;
        let clock: SharedClock = Arc::new(SystemClock);
        let backend = Arc::new(ConfiguredBackend::from_settings(
            &settings.state,
            clock.clone(),
        )?);
        let stats = plan
            .runs
            .iter()
            .map(|_| Arc::new(PipelineStats::default()))
            .collect();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let kafka = settings.kafka.clone();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            weir_host::runner::run_stages(&kafka, plan, stats, backend, clock, shutdown).await
        });
        Ok(Self { stop, task })
    }

    /// What `work` (a read of the outputs, say) returns, unless the stages end first: then
    /// why, at once rather than once `work` times out.
    ///
    /// # Errors
    /// `work`'s error; the stages' error, or that they ended, when they end first.
    pub async fn while_running<T>(
        &mut self,
        work: impl std::future::Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<T> {
        tokio::select! {
            done = work => done,
            ended = &mut self.task => match ended {
                Ok(Ok(())) => anyhow::bail!("the stages ended on their own"),
                Ok(Err(err)) => Err(err).context("a stage failed"),
                Err(err) => Err(err).context("the stages' task"),
            },
        }
    }

    /// Stops every stage (each drains and takes its last checkpoint).
    ///
    /// # Errors
    /// The first stage that failed.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await??;
        Ok(())
    }
}

/// The `[[pipeline.stages]]` of `toml` (a `weir run` config's stages, as the examples' TOML
/// helpers write them).
///
/// # Errors
/// TOML that is not such stages.
pub fn stages_of(toml: &str) -> anyhow::Result<Vec<weir_host::config::stages::StageSettings>> {
    #[derive(serde::Deserialize)]
    struct File {
        pipeline: Stages,
    }
    #[derive(serde::Deserialize)]
    struct Stages {
        stages: Vec<weir_host::config::stages::StageSettings>,
    }
    Ok(toml::from_str::<File>(toml)?.pipeline.stages)
}
