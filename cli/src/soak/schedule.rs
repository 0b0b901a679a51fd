//! The soak's fault schedule, drawn from its seed: every kind of fault at least three times,
//! at least a fifth of the faults overlapping another, process faults never on the host that
//! is never killed and never two at once on one host.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// A kind of fault the soak injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// SIGKILL a host, started again after the fault's length.
    Kill,
    /// SIGTERM a host (it drains), started again after the fault's length.
    Term,
    /// SIGSTOP a host past its session timeout, then SIGCONT: it must be fenced.
    Stop,
    /// A host leaves (SIGTERM) and joins again a while later.
    LeaveJoin,
    /// Latency added on a link (host to broker, or a host to S3).
    LinkLatency,
    /// A link cut: connections closed, new ones refused.
    LinkCut,
    /// A link half-open: connections open, nothing through.
    LinkHalfOpen,
    /// A link's bandwidth capped.
    LinkBandwidth,
    /// The S3 server answering `503 Slow Down` (a host's link to it).
    S3Unavailable,
    /// The S3 server slow (a host's link to it: seconds per request).
    S3Slow,
    /// A host's local disk cache directory full.
    DiskFull,
    /// A pipeline switched to another version of its operator.
    VersionSwitch,
    /// A pipeline's state moved to the other backend.
    BackendSwitch,
    /// The broker stopped and started again, its data kept (a soak on its own services).
    BrokerRestart,
}

impl FaultKind {
    /// Every kind but the broker's restart (which needs a broker of the soak's own).
    pub const ALL: [FaultKind; 13] = [
        FaultKind::Kill,
        FaultKind::Term,
        FaultKind::Stop,
        FaultKind::LeaveJoin,
        FaultKind::LinkLatency,
        FaultKind::LinkCut,
        FaultKind::LinkHalfOpen,
        FaultKind::LinkBandwidth,
        FaultKind::S3Unavailable,
        FaultKind::S3Slow,
        FaultKind::DiskFull,
        FaultKind::VersionSwitch,
        FaultKind::BackendSwitch,
    ];

    /// How the report names it.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Kill => "SIGKILL",
            FaultKind::Term => "SIGTERM",
            FaultKind::Stop => "SIGSTOP/SIGCONT",
            FaultKind::LeaveJoin => "leave and join",
            FaultKind::LinkLatency => "link latency",
            FaultKind::LinkCut => "link cut",
            FaultKind::LinkHalfOpen => "link half-open",
            FaultKind::LinkBandwidth => "link bandwidth cap",
            FaultKind::S3Unavailable => "S3 503",
            FaultKind::S3Slow => "S3 slow",
            FaultKind::DiskFull => "disk cache full",
            FaultKind::VersionSwitch => "operator version switch",
            FaultKind::BackendSwitch => "backend switch",
            FaultKind::BrokerRestart => "broker restart",
        }
    }

    /// Whether it ends or stops a host's process.
    pub fn is_process(self) -> bool {
        matches!(
            self,
            FaultKind::Kill | FaultKind::Term | FaultKind::Stop | FaultKind::LeaveJoin
        )
    }

    /// How long it lasts: a range scaled to the soak's length (`scale` 1 for 30 minutes).
    fn length(self, scale: f64, rng: &mut StdRng) -> Duration {
        let (low, high) = match self {
            // The pause before the host starts again.
            FaultKind::Kill | FaultKind::Term => (1.0, 6.0),
            // Past the 6 s session timeout, so that the host is fenced.
            FaultKind::Stop => (9.0, 14.0),
            FaultKind::LeaveJoin => (15.0, 60.0),
            FaultKind::LinkLatency | FaultKind::LinkBandwidth | FaultKind::S3Slow => (5.0, 30.0),
            FaultKind::LinkCut
            | FaultKind::LinkHalfOpen
            | FaultKind::S3Unavailable
            | FaultKind::DiskFull => (3.0, 20.0),
            // Instantaneous: the rest of the fault is the pipeline taking it in.
            FaultKind::VersionSwitch | FaultKind::BackendSwitch => (0.0, 0.0),
            // The broker down between its stop and its start.
            FaultKind::BrokerRestart => (2.0, 15.0),
        };
        // Short soaks keep their faults short, but never shorter than a session timeout for a
        // stop (it must be fenced).
        let shrink = scale.clamp(0.25, 1.0);
        let secs = rng.gen_range(low..=high) * if self == FaultKind::Stop { 1.0 } else { shrink };
        Duration::from_secs_f64(secs)
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone)]
pub struct Fault {
    /// When it starts, from the soak's start.
    pub at: Duration,
    /// What it is.
    pub kind: FaultKind,
    /// How long it lasts (for a kill, a stop, a leave: until the host is back).
    pub length: Duration,
    /// The host it hits (process, link and disk faults; hosts are numbered from 0), or the
    /// pipeline (switches: 0 or 1).
    pub target: usize,
    /// Link faults: the broker's link (`true`) or the target host's link to S3.
    pub on_broker: bool,
}

impl Fault {
    /// When it ends.
    pub fn until(&self) -> Duration {
        self.at + self.length
    }

    fn overlaps(&self, other: &Fault) -> bool {
        self.at < other.until().max(other.at + Duration::from_secs(1))
            && other.at < self.until().max(self.at + Duration::from_secs(1))
    }
}

/// A soak's faults, in order of their start.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The faults.
    pub faults: Vec<Fault>,
}

impl Schedule {
    /// The schedule of a soak of `length` with `hosts` hosts (host 0 never killed) and
    /// `kinds` of fault, drawn from `seed`: each kind `per_kind.0` times, a process kind
    /// `per_kind.1` times (at least 3), between a tenth of the way in and three quarters of it
    /// (the rest is for recovering), a fifth of the faults at least overlapping another.
    pub fn draw(
        seed: u64,
        length: Duration,
        hosts: usize,
        kinds: &[FaultKind],
        per_kind: (usize, usize),
    ) -> Schedule {
        let mut rng = StdRng::seed_from_u64(seed);
        let scale = length.as_secs_f64() / 1800.0;
        let (from, to) = (length.mul_f64(0.1), length.mul_f64(0.75));
        let mut faults: Vec<Fault> = Vec::new();
        for &kind in kinds {
            let times = if kind.is_process() {
                per_kind.1
            } else {
                per_kind.0
            };
            for _ in 0..times.max(3) {
                let fault = Fault {
                    at: from + (to - from).mul_f64(rng.r#gen::<f64>()),
                    kind,
                    length: kind.length(scale, &mut rng),
                    target: if kind.is_process() {
                        rng.gen_range(1..hosts.max(2))
                    } else if matches!(kind, FaultKind::VersionSwitch | FaultKind::BackendSwitch) {
                        usize::from(kind == FaultKind::VersionSwitch && rng.gen_bool(0.5))
                    } else {
                        rng.gen_range(0..hosts)
                    },
                    on_broker: rng.gen_bool(0.5),
                };
                faults.push(fault);
            }
        }
        faults.sort_by_key(|f| f.at);
        separate_process_faults(&mut faults, hosts);
        ensure_overlaps(&mut faults, &mut rng);
        faults.sort_by_key(|f| f.at);
        Schedule { faults }
    }

    /// How many faults overlap another.
    pub fn overlapping(&self) -> usize {
        self.faults
            .iter()
            .enumerate()
            .filter(|(i, f)| {
                self.faults
                    .iter()
                    .enumerate()
                    .any(|(j, g)| *i != j && f.overlaps(g))
            })
            .count()
    }
}

/// Moves process faults so that no two hit one host at once (a killed host cannot be stopped):
/// a fault that would is moved to the other host, or after the one before it.
fn separate_process_faults(faults: &mut [Fault], hosts: usize) {
    let mut busy_until = vec![Duration::ZERO; hosts.max(2)];
    for fault in faults.iter_mut().filter(|f| f.kind.is_process()) {
        if busy_until[fault.target] > fault.at {
            // The other killable host, if it is free; else later on this one.
            let other = (1..hosts.max(2)).find(|h| busy_until[*h] <= fault.at);
            match other {
                Some(host) => fault.target = host,
                None => fault.at = busy_until[fault.target] + Duration::from_secs(2),
            }
        }
        busy_until[fault.target] = fault.until() + Duration::from_secs(2);
    }
}

/// Moves faults onto others until at least a fifth overlap one (a fault that is not a process
/// fault starts inside another's window).
fn ensure_overlaps(faults: &mut [Fault], rng: &mut StdRng) {
    let wanted = faults.len().div_ceil(5);
    for _ in 0..faults.len() {
        let schedule = Schedule {
            faults: faults.to_vec(),
        };
        if schedule.overlapping() >= wanted {
            return;
        }
        let lone = (0..faults.len()).find(|&i| {
            !faults[i].kind.is_process()
                && !faults
                    .iter()
                    .enumerate()
                    .any(|(j, g)| i != j && faults[i].overlaps(g))
        });
        let Some(lone) = lone else { return };
        let host = rng.gen_range(0..faults.len());
        if host != lone {
            let into = faults[host].length.mul_f64(0.5);
            faults[lone].at = faults[host].at + into;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_has_every_kind_thrice_a_fifth_overlapping_and_no_host_hit_twice_at_once() {
        let sizes = [
            (Duration::from_secs(120), (3, 3)),
            (Duration::from_secs(1800), (3, 3)),
            // A long soak's: a hundred process kills.
            (Duration::from_secs(1800), (5, 35)),
        ];
        // The shared services' kinds, and a soak's on its own broker (which it restarts too).
        let shared = FaultKind::ALL.to_vec();
        let own: Vec<FaultKind> = shared
            .iter()
            .copied()
            .chain([FaultKind::BrokerRestart])
            .collect();
        for seed in [1, 7, 41, 2026] {
            for ((length, per_kind), kinds) in sizes
                .into_iter()
                .flat_map(|size| [(size, &shared), (size, &own)])
            {
                let schedule = Schedule::draw(seed, length, 3, kinds, per_kind);
                for &kind in kinds {
                    let n = schedule.faults.iter().filter(|f| f.kind == kind).count();
                    assert!(n >= 3, "seed {seed}: {kind:?} {n} times");
                }
                assert!(
                    schedule.overlapping() * 5 >= schedule.faults.len(),
                    "seed {seed}: {} of {} overlap",
                    schedule.overlapping(),
                    schedule.faults.len()
                );
                let process: Vec<&Fault> = schedule
                    .faults
                    .iter()
                    .filter(|f| f.kind.is_process())
                    .collect();
                assert!(process.iter().all(|f| f.target != 0), "host 0 is never hit");
                for (i, a) in process.iter().enumerate() {
                    for b in &process[i + 1..] {
                        assert!(
                            a.target != b.target || a.until() <= b.at || b.until() <= a.at,
                            "seed {seed}: {a:?} and {b:?} hit one host at once"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_schedule() {
        let a = Schedule::draw(5, Duration::from_secs(600), 3, &FaultKind::ALL, (3, 3));
        let b = Schedule::draw(5, Duration::from_secs(600), 3, &FaultKind::ALL, (3, 3));
        let at = |s: &Schedule| s.faults.iter().map(|f| (f.at, f.kind)).collect::<Vec<_>>();
        assert_eq!(at(&a), at(&b));
    }
}
