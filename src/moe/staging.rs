//! Prefetch's queue and staging area: experts of calls the host announces ahead, inflated on
//! dedicated threads (`super::prefetch`) and waiting there for their calls.
//!
//! At real scale every prefill ubatch inflates every expert again, and without prefetch that
//! happens inside the calls, on the host's threads, while the NPU waits. Yet weights do not
//! depend on activations: a host that knows its graph (the patched llama.cpp lists a graph's
//! MUL_MAT_ID nodes when the graph starts) announces the calls, and threads of their own inflate
//! the announced experts in graph order while ggml runs the attention and everything else between
//! the calls. On the RK3588 these threads sit on the four A55s, which CPU-only llama.cpp leaves idle
//! (`-t 4` on the A76s), so the A76s keep the dense part and the NPU keeps its DRAM bandwidth
//! (docs/BOARD-MODEL.md).
//!
//! - Inflated experts wait in a staging area of bounded size (`ORK_PREFETCH_MB`); a call takes its
//!   experts from there (verified by key and fingerprint like a cache hit) and inflates the rest
//!   itself. A call withdraws its own experts still queued when it starts; one a thread is
//!   inflating then (claimed, [`Claim`]) it waits for, so no expert is inflated twice.
//! - While a call runs the threads start no expert: its NPU runs have the DRAM (the board model
//!   finds that sharing it with the prefetch costs more than the prefetch gains then).
//! - The host's weights are read only between an announcement and the next [`Staging::fence`]
//!   (the end of the graph): the fence empties the queue and waits for the experts in flight, so
//!   weights freed after it are never touched. Staged experts are the library's own memory and may
//!   outlive it; one not taken within the next graph is dropped.
//! - Prefetching changes where an expert is inflated, never its bytes: results are bit for bit
//!   those without it.

use super::cache::{Expert, Fingerprint, Key};
use super::plan::Plan;
use crate::sync::lock;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Bytes the host keeps valid until the fence that follows their announcement.
pub trait HeldBytes: Send + Sync {
    fn bytes(&self) -> &[u8];
}

impl HeldBytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// One projection's weights, as an announcement holds them.
pub struct HeldWeights {
    pub data: Arc<dyn HeldBytes>,
    pub name: Option<String>,
}

/// A call announced ahead: its plan (from the same metadata the call will bring) and weights.
pub(super) struct Announced {
    pub plan: Plan,
    pub weights: Vec<HeldWeights>,
}

impl Announced {
    /// The address of the first projection's weights: what a call withdraws its jobs by.
    pub fn addr(&self) -> usize {
        self.weights[0].data.bytes().as_ptr() as usize
    }
}

/// One expert of an announced call.
pub(super) struct Job {
    pub call: Arc<Announced>,
    pub expert: usize,
}

struct StagedExpert {
    fingerprint: Fingerprint,
    expert: Arc<Expert>,
    /// The fence count when it was staged.
    epoch: u64,
}

/// What the prefetch did since the context was created, and what it is doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchStats {
    /// Experts inflated by the prefetch threads.
    pub staged: u64,
    /// Of those, taken by their call.
    pub taken: u64,
    /// Dropped untaken (their call never came, or came with other bytes).
    pub dropped: u64,
    /// Jobs withdrawn by their own call or emptied by a fence before they ran.
    pub withdrawn: u64,
    /// Jobs a call's thread took while it waited for the call's NPU runs ([`Staging::help_job`]).
    pub helped: u64,
    /// Jobs queued now.
    pub queued: u64,
    /// Prefetch threads waiting now: for a job, for room in the staging area, or for the
    /// running calls to end. All of them with jobs queued: nothing moves until a call takes a
    /// staged expert, ends, or a fence comes.
    pub waiting: u64,
}

impl std::fmt::Display for PrefetchStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "prefetch: {} staged, {} taken, {} dropped, {} withdrawn, {} jobs by waiting calls",
            self.staged, self.taken, self.dropped, self.withdrawn, self.helped
        )
    }
}

struct State {
    queue: VecDeque<Job>,
    staged: HashMap<Key, StagedExpert>,
    staged_bytes: u64,
    in_flight: usize,
    /// Weights whose call has started since the last fence.
    started: HashSet<usize>,
    /// Experts a prefetch thread is inflating now ([`Claim`]).
    making: HashSet<Key>,
    /// Calls in progress: the prefetch threads wait for none.
    calls_running: usize,
    /// Prefetch threads waiting in [`Staging::next_job`].
    waiting: usize,
    epoch: u64,
    shutdown: bool,
    stats: PrefetchStats,
}

/// The queue of announced experts and the staging area, shared by the calls and the threads.
pub(super) struct Staging {
    budget: u64,
    state: Mutex<State>,
    moved: Condvar,
}

impl Staging {
    pub fn new(budget: u64) -> Staging {
        Staging {
            budget,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                staged: HashMap::new(),
                staged_bytes: 0,
                in_flight: 0,
                started: HashSet::new(),
                making: HashSet::new(),
                calls_running: 0,
                waiting: 0,
                epoch: 0,
                shutdown: false,
                stats: PrefetchStats::default(),
            }),
            moved: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn wait<'a>(&self, g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.moved.wait(g).unwrap_or_else(|e| e.into_inner())
    }

    /// Queues every expert of `call`.
    pub fn announce(&self, call: Announced) {
        let call = Arc::new(call);
        let mut g = self.lock();
        g.queue
            .extend((0..call.plan.problem.n_expert).map(|expert| Job {
                call: Arc::clone(&call),
                expert,
            }));
        drop(g);
        self.moved.notify_all();
    }

    /// A call on the weights at `addr` starts: its experts still queued are its own work, and,
    /// with `pause`, no prefetch thread starts another expert until it ends (the guard drops),
    /// which leaves the DRAM to the call's NPU runs.
    pub fn call_starts(self: &Arc<Self>, addr: usize, pause: bool) -> Option<PrefetchPause> {
        let mut g = self.lock();
        g.started.insert(addr);
        let before = g.queue.len();
        g.queue.retain(|j| j.call.addr() != addr);
        g.stats.withdrawn += (before - g.queue.len()) as u64;
        if !pause {
            return None;
        }
        g.calls_running += 1;
        Some(PrefetchPause(Arc::clone(self)))
    }

    /// The staged expert under `key` if its fingerprint matches (any other is dropped: the bytes
    /// changed).
    /// If a prefetch thread is inflating it, waits for it.
    pub fn take(&self, key: &Key, fingerprint: Fingerprint) -> Option<Arc<Expert>> {
        if self.budget == 0 {
            return None;
        }
        let mut g = self.lock();
        while g.making.contains(key) {
            g = self.wait(g);
        }
        let s = g.staged.remove(key)?;
        g.staged_bytes -= s.expert.bytes();
        let hit = s.fingerprint == fingerprint;
        if hit {
            g.stats.taken += 1;
        } else {
            g.stats.dropped += 1;
        }
        drop(g);
        self.moved.notify_all();
        hit.then_some(s.expert)
    }

    /// The right to inflate `key` of the call on the weights at `addr` for the staging area:
    /// `None` if its call has started (the call makes it), or it is staged or being made.
    pub fn claim(&self, key: Key, fingerprint: Fingerprint, addr: usize) -> Option<Claim<'_>> {
        let mut g = self.lock();
        if g.started.contains(&addr) || g.staged.contains_key(&key) || !g.making.insert(key) {
            return None;
        }
        Some(Claim {
            staging: self,
            key,
            fingerprint,
        })
    }

    /// The next job for a prefetch thread, once one is queued and the staging area has room;
    /// `None` at shutdown.
    pub fn next_job(&self) -> Option<Job> {
        let mut g = self.lock();
        loop {
            if g.shutdown {
                return None;
            }
            if g.calls_running == 0 && g.staged_bytes < self.budget {
                if let Some(job) = g.queue.pop_front() {
                    g.in_flight += 1;
                    return Some(job);
                }
            }
            g.waiting += 1;
            g = self.wait(g);
            g.waiting -= 1;
        }
    }

    /// A job for a call's thread that would otherwise wait for the call's NPU runs, if one is
    /// queued and a prefetch thread could start it now; never waits. On the RK3588 that is an
    /// idle A76 during a dense matmul's runs, which leave the DRAM to spare.
    pub fn help_job(&self) -> Option<Job> {
        let mut g = self.lock();
        if g.shutdown || g.calls_running > 0 || g.staged_bytes >= self.budget {
            return None;
        }
        let job = g.queue.pop_front()?;
        g.in_flight += 1;
        g.stats.helped += 1;
        Some(job)
    }

    /// A job taken by [`Staging::next_job`] or [`Staging::help_job`] is done (its [`Claim`], if
    /// any, is gone).
    pub fn finish(&self) {
        self.lock().in_flight -= 1;
        self.moved.notify_all();
    }

    /// The host's announced weights may go away after this returns: the queue is emptied and the
    /// jobs in flight are waited for. Staged experts not taken since the previous fence are
    /// dropped.
    pub fn fence(&self) {
        let mut g = self.lock();
        g.stats.withdrawn += g.queue.len() as u64;
        g.queue.clear();
        while g.in_flight > 0 {
            g = self.wait(g);
        }
        g.started.clear();
        let last = g.epoch;
        let before = g.staged.len();
        g.staged.retain(|_, s| s.epoch == last);
        g.stats.dropped += (before - g.staged.len()) as u64;
        g.staged_bytes = g.staged.values().map(|s| s.expert.bytes()).sum();
        g.epoch += 1;
        drop(g);
        self.moved.notify_all();
    }

    /// Stops the prefetch threads (after the job each is on).
    pub fn shut_down(&self) {
        self.lock().shutdown = true;
        self.moved.notify_all();
    }

    pub fn stats(&self) -> PrefetchStats {
        let g = self.lock();
        PrefetchStats {
            queued: g.queue.len() as u64,
            waiting: g.waiting as u64,
            ..g.stats
        }
    }
}

/// A prefetch thread's right to make one expert ([`Staging::claim`]): [`Claim::stage`] puts it
/// in the staging area; dropped without (an error, a panic), the call inflates it itself.
pub(super) struct Claim<'a> {
    staging: &'a Staging,
    key: Key,
    fingerprint: Fingerprint,
}

impl Claim<'_> {
    pub fn stage(self, expert: Arc<Expert>) {
        let mut g = self.staging.lock();
        g.staged_bytes += expert.bytes();
        g.stats.staged += 1;
        let epoch = g.epoch;
        g.staged.insert(
            self.key,
            StagedExpert {
                fingerprint: self.fingerprint,
                expert,
                epoch,
            },
        );
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.staging.lock().making.remove(&self.key);
        self.staging.moved.notify_all();
    }
}

/// Held by a running call ([`Staging::call_starts`]).
pub(super) struct PrefetchPause(Arc<Staging>);

impl Drop for PrefetchPause {
    fn drop(&mut self) {
        self.0.lock().calls_running -= 1;
        self.0.moved.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::cache::{fingerprint, Verify};
    use crate::moe::desc::{validate, TensorDesc, GGML_TYPE_I32};
    use crate::npu::{flags, Device};
    use crate::quant::GgmlType;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A call on `weights`: 4 experts of one row of 32 Q4_0 weights, 8 tokens, 1 slot.
    fn announced(weights: &Arc<Vec<u8>>) -> Announced {
        let (b, ids, dst) = (vec![0f32; 32 * 8], vec![0i32; 8], vec![0f32; 8]);
        let t = |ty: i32, ne: [i64; 3], nb: [usize; 3], addr: usize| TensorDesc {
            ty,
            ne: [ne[0], ne[1], ne[2], 1],
            nb: [nb[0], nb[1], nb[2], nb[2] * ne[2] as usize],
            addr,
            name: None,
        };
        let problem = validate(
            &t(
                GgmlType::Q4_0.id(),
                [32, 1, 4],
                [18, 18, 18],
                weights.as_ptr() as usize,
            ),
            &t(
                GgmlType::F32.id(),
                [32, 1, 8],
                [4, 128, 128],
                b.as_ptr() as usize,
            ),
            &t(GGML_TYPE_I32, [1, 8, 1], [4, 4, 32], ids.as_ptr() as usize),
            &t(
                GgmlType::F32.id(),
                [1, 1, 8],
                [4, 4, 4],
                dst.as_ptr() as usize,
            ),
        )
        .expect("a valid call");
        Announced {
            plan: Plan {
                problem,
                pair: None,
                on_cpu: false,
            },
            weights: vec![HeldWeights {
                data: Arc::clone(weights) as Arc<dyn HeldBytes>,
                name: None,
            }],
        }
    }

    #[test]
    fn a_running_call_pauses_the_prefetch_threads() {
        let staging = Arc::new(Staging::new(1 << 20));
        let w = Arc::new(vec![0x11u8; 4 * 18]);
        // A dense matmul's call does not pause them: the job below starts while it runs.
        assert!(staging.call_starts(2, false).is_none());
        let other_call = staging.call_starts(1, true);
        staging.announce(announced(&w));
        let (tx, rx) = mpsc::channel();
        let s = Arc::clone(&staging);
        let thread = std::thread::spawn(move || {
            let job = s.next_job().expect("a job");
            tx.send(job.expert).unwrap();
            drop(job);
            s.finish();
        });
        // The thread waits with every job still queued: nothing but the call holds it back.
        let start = std::time::Instant::now();
        while staging.stats().waiting == 0 {
            assert!(rx.try_recv().is_err(), "a job started while a call ran");
            assert!(start.elapsed().as_secs() < 60, "the thread never waited");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(staging.stats().queued, 4);
        assert!(rx.try_recv().is_err(), "a job started while a call ran");
        drop(other_call);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(0));
        thread.join().unwrap();
        // Its own call withdraws the rest.
        let own = staging.call_starts(w.as_ptr() as usize, true);
        assert_eq!(staging.stats().withdrawn, 3);
        drop(own);
        staging.fence();
        assert_eq!(Arc::strong_count(&w), 1);
    }

    #[test]
    fn a_waiting_call_takes_jobs_only_when_a_prefetch_thread_could() {
        let staging = Arc::new(Staging::new(1 << 20));
        let w = Arc::new(vec![0x11u8; 4 * 18]);
        assert!(staging.help_job().is_none(), "nothing queued");
        staging.announce(announced(&w));
        // A routed call runs: its NPU runs have the DRAM.
        let routed = staging.call_starts(1, true);
        assert!(
            staging.help_job().is_none(),
            "a job while a routed call ran"
        );
        drop(routed);
        let job = staging.help_job().expect("a queued job");
        assert_eq!(job.expert, 0, "in graph order");
        assert_eq!(staging.stats().helped, 1);
        drop(job);
        staging.finish();
        // A full staging area: no job.
        let full = Staging::new(0);
        full.announce(announced(&w));
        assert!(full.help_job().is_none(), "a job past the budget");
        full.fence();
        staging.fence();
        assert_eq!(Arc::strong_count(&w), 1);
    }

    #[test]
    fn a_call_waits_for_an_expert_being_made() {
        let staging = Staging::new(1 << 20);
        let key = Key {
            addr: 64,
            ty: GgmlType::Q4_0,
            layout: crate::inflate::Layout::Plain,
            k: 32,
            n: 1,
            row_stride: 18,
            name_hash: 0,
            pair: 0,
        };
        let fp = fingerprint(&[7u8; 18], 1, 18, 18, 18, Verify::Sampled);
        let expert = Arc::new(Expert {
            b: Device::cpu()
                .alloc::<i8>(1024, flags::CPU_FILLED, 0)
                .unwrap(),
            chan: vec![1.0; 32],
            segments: Vec::new(),
        });
        let claim = staging.claim(key, fp, 1).expect("nobody makes it yet");
        assert!(staging.claim(key, fp, 1).is_none(), "claimed twice");
        std::thread::scope(|s| {
            let taker = s.spawn(|| staging.take(&key, fp).is_some());
            std::thread::sleep(Duration::from_millis(100));
            assert!(
                !taker.is_finished(),
                "the call did not wait for the expert being made"
            );
            claim.stage(expert);
            assert!(
                taker.join().unwrap(),
                "the call did not get the staged expert"
            );
        });
        // A claim given up (an error) releases a waiting call, which then inflates it itself.
        let claim = staging
            .claim(key, fp, 1)
            .expect("taken, so free to make again");
        std::thread::scope(|s| {
            let taker = s.spawn(|| staging.take(&key, fp).is_none());
            drop(claim);
            assert!(taker.join().unwrap());
        });
        // Once its call has started, nobody claims its experts.
        let other = Arc::new(Staging::new(1 << 20));
        let started = other.call_starts(1, true);
        assert!(other.claim(key, fp, 1).is_none());
        drop(started);
    }
}
