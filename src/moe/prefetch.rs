//! The prefetch threads: where they run (`ORK_PREFETCH`, `ORK_PREFETCH_CPUS`), and their work,
//! the announced experts inflated into the staging area (`super::staging`).

use super::expert::Weights;
use super::resources::Resources;
use super::staging::Job;
use super::{Config, Error, ErrorKind};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;

/// More prefetch threads than cores only contend; this bounds a mistyped setting.
const MAX_PREFETCH_THREADS: usize = 64;

/// How many prefetch threads run and where ([`Config::prefetch_threads`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Placement {
    pub threads: usize,
    cpus: Vec<usize>,
    /// The library picked the CPUs (idle slow cores): a thread that cannot run there does not
    /// run at all, where it would take a core from the host's threads.
    picked: bool,
}

impl Placement {
    /// The placement `config` asks for; by default (no thread count, no CPUs) one thread on each
    /// of `idle_slow_cores` (the machine's rule, `crate::cpus::idle_slow_cores`), or none. CPUs
    /// given for threads that run must be among the machine's `online` ones
    /// (`crate::cpus::online`).
    pub fn of(
        config: &Config,
        idle_slow_cores: impl FnOnce() -> Result<Vec<usize>, String>,
        online: impl FnOnce() -> Vec<usize>,
    ) -> Result<Placement, Error> {
        let given = |threads| Placement {
            threads,
            cpus: config.prefetch_cpus.clone(),
            picked: false,
        };
        let placement = match config.prefetch_threads {
            Some(n) => given(n),
            None if !config.prefetch_cpus.is_empty() => given(config.prefetch_cpus.len()),
            None => match idle_slow_cores() {
                Ok(cpus) => {
                    log::info!(
                        "prefetch: {} threads on the idle slow cores, cpu {} (ORK_PREFETCH=0: none)",
                        cpus.len(),
                        crate::cpus::list(&cpus)
                    );
                    Placement {
                        threads: cpus.len().min(MAX_PREFETCH_THREADS),
                        cpus,
                        picked: true,
                    }
                }
                Err(why) => {
                    log::debug!("prefetch: no threads by default: {why}");
                    given(0)
                }
            },
        };
        if placement.threads > 0 && !placement.picked {
            check_online(&placement.cpus, &online())?;
        }
        if placement.threads > MAX_PREFETCH_THREADS {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "{} prefetch threads: at most {MAX_PREFETCH_THREADS}",
                    placement.threads
                ),
            ));
        }
        Ok(placement)
    }
}

/// Every CPU of `cpus` (`ORK_PREFETCH_CPUS`) is one of the machine's `online` ones: a thread
/// pinned to a CPU that does not exist would run wherever the kernel puts it.
fn check_online(cpus: &[usize], online: &[usize]) -> Result<(), Error> {
    let absent: Vec<usize> = cpus
        .iter()
        .copied()
        .filter(|c| !online.contains(c))
        .collect();
    if absent.is_empty() {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::InvalidArgument,
        format!(
            "ORK_PREFETCH_CPUS: cpu {} not online on this machine (online: cpu {})",
            crate::cpus::list(&absent),
            crate::cpus::list(online)
        ),
    ))
}

/// The running prefetch threads of an engine; dropped, they finish their jobs and end.
pub(super) struct Prefetchers {
    res: Arc<Resources>,
    threads: Vec<JoinHandle<()>>,
}

impl Prefetchers {
    /// Starts the threads `placement` asks for.
    pub fn start(res: &Arc<Resources>, placement: &Placement) -> Result<Prefetchers, Error> {
        let mut started = Prefetchers {
            res: Arc::clone(res),
            threads: Vec::with_capacity(placement.threads),
        };
        for i in 0..placement.threads {
            let worker = Prefetcher {
                res: Arc::clone(res),
                cpus: placement.cpus.clone(),
                pinned_or_none: placement.picked,
            };
            let spawned = std::thread::Builder::new()
                .name(format!("ork-prefetch-{i}"))
                .spawn(move || worker.run());
            match spawned {
                Ok(t) => started.threads.push(t),
                // Dropping `started` stops the threads started so far.
                Err(e) => {
                    return Err(Error::new(
                        ErrorKind::OutOfMemory,
                        format!("starting prefetch thread {i}: {e}"),
                    ))
                }
            }
        }
        Ok(started)
    }

    /// Whether there is any prefetch thread.
    pub fn running(&self) -> bool {
        !self.threads.is_empty()
    }
}

impl Drop for Prefetchers {
    fn drop(&mut self) {
        let staging = self.res.experts.staging();
        staging.fence();
        staging.shut_down();
        for t in self.threads.drain(..) {
            // A prefetch thread catches its jobs' panics; a failed join has nothing left to undo.
            let _ = t.join();
        }
    }
}

/// One prefetch thread: takes announced experts and inflates them into the staging area.
struct Prefetcher {
    res: Arc<Resources>,
    cpus: Vec<usize>,
    /// [`Placement::picked`].
    pinned_or_none: bool,
}

impl Prefetcher {
    fn run(self) {
        if !self.cpus.is_empty() {
            if let Err(e) = crate::pool::pin_current_thread(&self.cpus) {
                if self.pinned_or_none {
                    // Announced experts it would have taken are inflated by their calls.
                    log::warn!("prefetch thread does not run: {e}");
                    return;
                }
                log::warn!("prefetch thread stays unpinned: {e}");
            }
        }
        while let Some(job) = self.res.experts.staging().next_job() {
            inflate_job(job, &self.res);
        }
    }
}

/// Inflates the expert of an announced call into the staging area: a prefetch thread's job, or
/// one a waiting call's thread took ([`Staging::help_job`](super::staging::Staging::help_job)).
/// Errors and panics stay here: the call inflates the expert itself and reports what goes wrong
/// then.
pub(super) fn inflate_job(job: Job, res: &Resources) {
    let experts = &res.experts;
    let done = panic::catch_unwind(AssertUnwindSafe(|| {
        let call = &job.call;
        let weights: Vec<Weights> = call
            .plan
            .problems()
            .zip(&call.weights)
            .map(|(problem, w)| Weights {
                problem,
                data: w.data.bytes(),
                name: w.name.as_deref(),
            })
            .collect();
        experts.prefetch(
            &res.device,
            &res.spare_b,
            &res.tiles,
            res.isa,
            &weights,
            job.expert,
        )
    }));
    match done {
        Ok(Ok(())) => {}
        Ok(Err(e)) => log::debug!("prefetch of expert {}: {e}", job.expert),
        Err(p) => log::warn!(
            "prefetch of expert {}: {}",
            job.expert,
            Error::from_panic(p)
        ),
    }
    // The job holds the host's weights: gone before the fence can count it finished.
    drop(job);
    experts.staging().finish();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpus::{pick_idle_slow, Cluster, Cpus};

    /// The RK3588 as `crate::cpus` describes it: four A76s, then four A55s.
    fn rk3588() -> Cpus {
        let cluster = |cpus: Vec<usize>, capacity, max_mhz, part: &str| Cluster {
            cpus,
            capacity: Some(capacity),
            max_mhz: Some(max_mhz),
            part: Some(part.into()),
        };
        Cpus {
            clusters: vec![
                cluster(vec![4, 5, 6, 7], 1024, 2304, "Cortex-A76"),
                cluster(vec![0, 1, 2, 3], 530, 1800, "Cortex-A55"),
            ],
        }
    }

    fn config(threads: Option<usize>, cpus: Vec<usize>) -> Config {
        Config {
            prefetch_threads: threads,
            prefetch_cpus: cpus,
            ..Config::default()
        }
    }

    fn placement(threads: usize, cpus: Vec<usize>, picked: bool) -> Placement {
        Placement {
            threads,
            cpus,
            picked,
        }
    }

    #[test]
    fn by_default_prefetch_threads_go_to_the_idle_slow_cores() {
        let auto = config(None, Vec::new());
        // llama.cpp under `taskset -c 4-7` on the board: one thread pinned to each A55, or none.
        let all = || (0..8).collect();
        let board = Placement::of(&auto, || pick_idle_slow(&rk3588(), &[4, 5, 6, 7]), all);
        assert_eq!(board, Ok(placement(4, vec![0, 1, 2, 3], true)));
        // On every core, or on one A55 too: none, they would take cores from the host.
        for allowed in [(0..8).collect(), vec![3, 4, 5, 6, 7]] {
            let shared = Placement::of(&auto, || pick_idle_slow(&rk3588(), &allowed), all);
            assert_eq!(shared, Ok(placement(0, Vec::new(), false)), "{allowed:?}");
        }
        // A machine of one core type: none.
        let one_type = Cpus {
            clusters: vec![rk3588().clusters.remove(0)],
        };
        let x86 = Placement::of(&auto, || pick_idle_slow(&one_type, &[4]), all);
        assert_eq!(x86, Ok(placement(0, Vec::new(), false)));
        // More idle slow cores than threads are useful: the bound, not an error.
        let many = Placement::of(&auto, || Ok((0..100).collect()), all);
        assert_eq!(many.map(|p| p.threads), Ok(MAX_PREFETCH_THREADS));
    }

    #[test]
    fn given_threads_or_cpus_are_taken_as_given() {
        let no_rule = || -> Result<Vec<usize>, String> { panic!("the machine was consulted") };
        let all = || (0..8).collect();
        let cpus = Placement::of(&config(None, vec![2, 5]), no_rule, all);
        assert_eq!(cpus, Ok(placement(2, vec![2, 5], false)));
        let threads = Placement::of(&config(Some(3), vec![1]), no_rule, all);
        assert_eq!(threads, Ok(placement(3, vec![1], false)));
        let none = Placement::of(&config(Some(0), Vec::new()), no_rule, all);
        assert_eq!(none, Ok(placement(0, Vec::new(), false)));
        let too_many = config(Some(MAX_PREFETCH_THREADS + 1), Vec::new());
        let e = Placement::of(&too_many, no_rule, all).expect_err("too many");
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn cpus_given_must_be_online() {
        let no_rule = || -> Result<Vec<usize>, String> { panic!("the machine was consulted") };
        let two = || vec![0, 1];
        let e = Placement::of(&config(None, vec![1, 2, 3, 7]), no_rule, two).expect_err("cpu 2");
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert_eq!(
            e.message(),
            "ORK_PREFETCH_CPUS: cpu 2-3,7 not online on this machine (online: cpu 0-1)"
        );
        // No thread runs: nothing is pinned, nothing to check.
        let idle = Placement::of(&config(Some(0), vec![7]), no_rule, two);
        assert_eq!(idle, Ok(placement(0, vec![7], false)));
    }
}
