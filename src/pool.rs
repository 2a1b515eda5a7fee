//! The crate's one worker pool: persistent threads that help a caller run the shares of a job.
//!
//! `pool::global().run(nth, |ith, nth| ...)` runs share `ith` of `nth` for every `ith` and returns
//! when all are done. The caller always works on its own job, and idle workers join in; shares are
//! claimed one at a time from an atomic counter, so:
//! - the pool has `cores - 1` workers and the caller is the last core: the pool itself never runs
//!   more threads than the machine has cores;
//! - concurrent callers cannot deadlock or oversubscribe: a caller that finds the workers busy runs
//!   its shares on its own thread (at worst all of them), and nested calls from inside a share work
//!   the same way;
//! - a panic in a share is caught, the remaining shares still run, and the first panic is resumed
//!   on the caller's thread once the job is finished (never a hang).

use crate::sync::lock;
use std::any::Any;
use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;

type Share<'a> = dyn Fn(usize, usize) + Sync + 'a;

/// One `run` call as the workers see it.
struct Job {
    /// The caller's closure with its lifetime erased; dereferenced only while holding a claimed
    /// share (`next` returned `< nth`), and `run` does not return before every claimed share is done.
    share: *const Share<'static>,
    nth: usize,
    /// Next unclaimed share.
    next: AtomicUsize,
    /// Shares finished, and the first panic among them.
    done: Mutex<(usize, Option<Box<dyn Any + Send>>)>,
    all_done: Condvar,
}

// SAFETY: `share` points to a `Sync` closure, called only under the protocol above; everything else
// in `Job` is `Send + Sync` already.
unsafe impl Send for Job {}
// SAFETY: as for `Send`.
unsafe impl Sync for Job {}

impl Job {
    /// Claims and runs shares until none is left.
    fn work(&self) {
        loop {
            let ith = self.next.fetch_add(1, Ordering::Relaxed);
            if ith >= self.nth {
                return;
            }
            // SAFETY: share `ith` is claimed and not yet counted done, so `run` is still waiting
            // and the closure is alive.
            let share = unsafe { &*self.share };
            let result = panic::catch_unwind(AssertUnwindSafe(|| share(ith, self.nth)));
            let mut done = lock(&self.done);
            done.0 += 1;
            if let Err(payload) = result {
                done.1.get_or_insert(payload);
            }
            if done.0 == self.nth {
                self.all_done.notify_all();
            }
        }
    }

    fn exhausted(&self) -> bool {
        self.next.load(Ordering::Relaxed) >= self.nth
    }
}

struct Queue {
    jobs: VecDeque<Arc<Job>>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

/// A set of persistent worker threads. Use [`global`]; separate pools exist for tests.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool for `threads` concurrent threads in total: `threads - 1` workers plus the caller.
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                shutdown: false,
            }),
            wake: Condvar::new(),
        });
        let workers = (1..threads.max(1))
            .map(|i| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("ork-pool-{i}"))
                    .spawn(move || worker(&shared))
                    .expect("spawning a pool worker")
            })
            .collect();
        Pool { shared, workers }
    }

    /// Threads that can work on one job at once (workers + caller): the useful upper bound for `nth`.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `share(ith, nth)` for every `ith` in `0..nth`, on the calling thread and on whichever
    /// workers are idle, and returns when all shares are done. If shares panicked, resumes the first
    /// panic here after all shares have finished.
    pub fn run<F: Fn(usize, usize) + Sync>(&self, nth: usize, share: F) {
        if nth == 0 {
            return;
        }
        let share: &Share<'_> = &share;
        // SAFETY: only the lifetime is erased; `Job::work` dereferences the pointer only for claimed
        // shares, and this function waits below until every share is done.
        let share: *const Share<'static> =
            unsafe { std::mem::transmute(share as *const Share<'_>) };
        let job = Arc::new(Job {
            share,
            nth,
            next: AtomicUsize::new(0),
            done: Mutex::new((0, None)),
            all_done: Condvar::new(),
        });
        if nth > 1 && !self.workers.is_empty() {
            lock(&self.shared.queue).jobs.push_back(Arc::clone(&job));
            self.shared.wake.notify_all();
        }
        job.work();
        self.retire(&job);
        let mut done = lock(&job.done);
        while done.0 < nth {
            done = job.all_done.wait(done).unwrap_or_else(|e| e.into_inner());
        }
        if let Some(payload) = done.1.take() {
            drop(done);
            panic::resume_unwind(payload);
        }
    }

    /// Takes an exhausted job off the queue so workers stop looking at it.
    fn retire(&self, job: &Arc<Job>) {
        lock(&self.shared.queue)
            .jobs
            .retain(|j| !Arc::ptr_eq(j, job));
    }
}

fn worker(shared: &Shared) {
    loop {
        let job = {
            let mut q = lock(&shared.queue);
            loop {
                if q.shutdown {
                    return;
                }
                q.jobs.retain(|j| !j.exhausted());
                if let Some(job) = q.jobs.front() {
                    break Arc::clone(job);
                }
                q = shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        job.work();
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        lock(&self.shared.queue).shutdown = true;
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            // A worker never panics (shares are caught), so there is no payload to forward.
            let _ = w.join();
        }
    }
}

/// The process-wide pool, one thread per core (the caller counts as one). How many of them one
/// call uses is the caller's setting (`ORK_THREADS`, passed down as a thread count).
pub fn global() -> &'static Pool {
    static GLOBAL: OnceLock<Pool> = OnceLock::new();
    GLOBAL.get_or_init(|| Pool::new(cores()))
}

/// The machine's cores available to this process.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The CPUs the calling thread may run on (`taskset` narrows them); all cores if the kernel
/// does not say.
#[cfg(target_os = "linux")]
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain bits (all-zero is the empty set); sched_getaffinity writes at
    // most the size given; CPU_ISSET reads bits below CPU_SETSIZE of that set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return (0..cores()).collect();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

#[cfg(not(target_os = "linux"))]
pub fn allowed_cpus() -> Vec<usize> {
    (0..cores()).collect()
}

/// Restricts the calling thread to `cpus` (a dedicated thread's placement, e.g. the prefetch
/// threads on the RK3588's A55s). An error names the CPUs the kernel refused.
#[cfg(target_os = "linux")]
pub fn pin_current_thread(cpus: &[usize]) -> Result<(), String> {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        if c >= 8 * size_of::<libc::cpu_set_t>() {
            return Err(format!("CPU {c} is beyond the kernel's CPU set"));
        }
        // SAFETY: `c` is within the set, checked above.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    let r = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(format!(
            "sched_setaffinity to CPUs {cpus:?}: {}",
            std::io::Error::last_os_error()
        ))
    }
}

#[cfg(not(target_os = "linux"))]
pub fn pin_current_thread(cpus: &[usize]) -> Result<(), String> {
    Err(format!("pinning threads to CPUs {cpus:?} needs Linux"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_share_runs_once() {
        let pool = Pool::new(3);
        for nth in [1, 2, 3, 7, 64] {
            let hits: Vec<AtomicU64> = (0..nth).map(|_| AtomicU64::new(0)).collect();
            pool.run(nth, |ith, n| {
                assert_eq!(n, nth);
                hits[ith].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "nth={nth}"
            );
        }
    }

    #[test]
    fn borrows_caller_data_mutably_through_disjoint_shares() {
        let pool = Pool::new(4);
        let out: Vec<Mutex<usize>> = (0..10).map(|_| Mutex::new(0)).collect();
        pool.run(out.len(), |ith, _| *out[ith].lock().unwrap() = ith * ith);
        assert_eq!(
            out.iter().map(|m| *m.lock().unwrap()).collect::<Vec<_>>(),
            (0..10).map(|i| i * i).collect::<Vec<_>>()
        );
    }

    #[test]
    fn concurrent_and_nested_callers_finish() {
        let pool = Pool::new(2);
        let total = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..6 {
                s.spawn(|| {
                    for _ in 0..50 {
                        pool.run(4, |_, _| {
                            pool.run(3, |_, _| {
                                total.fetch_add(1, Ordering::Relaxed);
                            })
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 6 * 50 * 4 * 3);
    }

    #[test]
    fn a_panicking_share_reaches_the_caller_after_the_others_finish() {
        let pool = Pool::new(3);
        let finished = AtomicU64::new(0);
        let result = panic::catch_unwind(AssertUnwindSafe(|| {
            pool.run(8, |ith, _| {
                if ith == 5 {
                    panic!("share five failed");
                }
                finished.fetch_add(1, Ordering::Relaxed);
            })
        }));
        let payload = result.expect_err("the panic must propagate");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"share five failed"));
        assert_eq!(finished.load(Ordering::Relaxed), 7);
        // The pool still works afterwards.
        let again = AtomicU64::new(0);
        pool.run(4, |_, _| {
            again.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(again.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn global_pool_never_exceeds_the_cores() {
        let cores = cores();
        assert_eq!(global().threads(), cores);
        let running = AtomicUsize::new(0);
        let peak = AtomicUsize::new(0);
        global().run(4 * cores, |_, _| {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(2));
            running.fetch_sub(1, Ordering::SeqCst);
        });
        assert!(peak.load(Ordering::SeqCst) <= cores);
    }
}
