//! The engine: configuration, the per-call shared state, the two phases, and statistics.

use super::cache::{fingerprint, name_hash, Cache, Expert, Key, Lookup, Verify};
use super::desc::{validate, Problem, TensorDesc};
use super::quantize::quantize_row;
use super::route::{Group, Routing};
use super::scatter::{publish, scale_row, QUAD};
use super::{Error, ErrorKind};
use crate::inflate::{inflate_expert, ExpertWeights, InflateError};
use crate::layout::Tiles;
use crate::npu::{flags, BackendChoice, BackendKind, Buffer, CoreMask, Device, MatMul};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

/// What happens to calls below `min_rows` rows per expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmallBatch {
    /// `NotHandled`: the caller's own path runs them.
    Decline,
    /// Taken, but the GEMMs run on the CPU int8 kernels instead of the device.
    Cpu,
}

/// How [`Engine::run_mt`] uses the caller's threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MtMode {
    /// Every caller thread takes a share of the work (phase 1 split, phase 2 work items).
    Coop,
    /// Caller thread 0 runs the call on the crate's pool; the others wait in the caller's barrier.
    /// Kept to measure against `Coop` where the caller's idle threads spin.
    Leader,
}

/// Engine configuration (the C `ork_config`).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub backend: BackendChoice,
    /// NPU cores bitmask (1..7).
    pub core_mask: u8,
    /// Expert cache budget in bytes.
    pub cache_bytes: u64,
    /// Calls whose average rows per used expert ([`Problem::rows_per_expert`]) are below this go
    /// to `small_batch`.
    pub min_rows: u32,
    pub small_batch: SmallBatch,
    /// Threads of the single-caller entry point (0: all cores).
    pub n_threads: u32,
    pub cache_verify: Verify,
    pub mt_mode: MtMode,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            backend: BackendChoice::Auto,
            core_mask: CoreMask::ALL.0,
            cache_bytes: 1 << 30,
            min_rows: 8,
            small_batch: SmallBatch::Decline,
            n_threads: 0,
            cache_verify: Verify::Sampled,
            mt_mode: MtMode::Coop,
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn env_parse<T>(name: &str, parse: impl Fn(&str) -> Option<T>) -> Option<T> {
    let v = env(name)?;
    let parsed = parse(v.trim());
    if parsed.is_none() {
        log::warn!("ignoring {name}={v:?}: not a valid value");
    }
    parsed
}

/// One of `choices`' words, any case.
fn env_word<T: Copy>(name: &str, choices: &[(&str, T)]) -> Option<T> {
    env_parse(name, |s| {
        let word = s.to_ascii_lowercase();
        choices.iter().find(|(w, _)| *w == word).map(|&(_, v)| v)
    })
}

impl Config {
    /// Overrides fields from `ORK_BACKEND`, `ORK_CORE_MASK`, `ORK_CACHE_MB`, `ORK_MIN_ROWS`,
    /// `ORK_MIN_ROWS_MODE` (`decline`|`cpu`), `ORK_THREADS`, `ORK_CACHE_VERIFY` (`sampled`|`full`),
    /// `ORK_MT_MODE` (`coop`|`leader`).
    /// Invalid values are ignored with a warning.
    pub fn with_env(mut self) -> Config {
        if let Some(b) = env_parse("ORK_BACKEND", BackendChoice::parse) {
            self.backend = b;
        }
        let int = |s: &str| s.parse::<u64>().ok();
        if let Some(m) = env_parse("ORK_CORE_MASK", |s| {
            let v = s
                .strip_prefix("0x")
                .map_or_else(|| s.parse().ok(), |h| u8::from_str_radix(h, 16).ok());
            v.filter(|&m: &u8| (1..=7).contains(&m))
        }) {
            self.core_mask = m;
        }
        if let Some(mb) = env_parse("ORK_CACHE_MB", |s| {
            int(s).and_then(|m| m.checked_mul(1 << 20))
        }) {
            self.cache_bytes = mb;
        }
        if let Some(r) = env_parse("ORK_MIN_ROWS", |s| s.parse().ok()) {
            self.min_rows = r;
        }
        let small_batch = [("decline", SmallBatch::Decline), ("cpu", SmallBatch::Cpu)];
        if let Some(m) = env_word("ORK_MIN_ROWS_MODE", &small_batch) {
            self.small_batch = m;
        }
        if let Some(t) = env_parse("ORK_THREADS", |s| s.parse().ok()) {
            self.n_threads = t;
        }
        if let Some(v) = env_word(
            "ORK_CACHE_VERIFY",
            &[("sampled", Verify::Sampled), ("full", Verify::Full)],
        ) {
            self.cache_verify = v;
        }
        if let Some(m) = env_word(
            "ORK_MT_MODE",
            &[("coop", MtMode::Coop), ("leader", MtMode::Leader)],
        ) {
            self.mt_mode = m;
        }
        self
    }
}

/// Views of one call's tensors, built by the caller from a [`Problem`]'s extents. `dst` is atomic
/// so that all threads of a cooperative call may hold it; every element is written by exactly one
/// thread (relaxed stores, plain stores on every target).
pub struct Inputs<'a> {
    /// The whole `as` tensor; its address is part of the cache key.
    pub weights: &'a [u8],
    pub name: Option<&'a str>,
    pub b: &'a [f32],
    pub ids: &'a [i32],
    pub dst: &'a [AtomicU32],
}

/// A call the engine takes: the validated problem and where its GEMMs run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub problem: Problem,
    /// Small batch under [`SmallBatch::Cpu`]: GEMMs on the CPU int8 kernels.
    pub on_cpu: bool,
}

/// Time spent per stage in one call, summed over the threads that worked on it (ns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stages {
    pub route: u64,
    pub quant: u64,
    pub inflate: u64,
    pub gemm: u64,
    pub scatter: u64,
}

#[derive(Default)]
struct StageClock([AtomicU64; 5]);

impl StageClock {
    fn add(&self, stage: usize, since: Instant) {
        self.0[stage].fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    fn get(&self) -> Stages {
        let v = self.0.each_ref().map(|a| a.load(Ordering::Relaxed));
        Stages {
            route: v[0],
            quant: v[1],
            inflate: v[2],
            gemm: v[3],
            scatter: v[4],
        }
    }
}

const ROUTE: usize = 0;
const QUANT: usize = 1;
const INFLATE: usize = 2;
const GEMM: usize = 3;
const SCATTER: usize = 4;

/// Counters since the engine was created (the C `ork_stats`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub calls: u64,
    pub handled: u64,
    pub declined: u64,
    pub rows: u64,
    pub experts_inflated: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_evictions: u64,
    pub bytes_inflated: u64,
    pub submits_run_i8: u64,
    pub submits_stream: u64,
    pub submits_chain: u64,
    pub cpu_gemms: u64,
    /// Modelled NPU time (emulator cost model), never a measurement.
    pub modelled_npu_us: f64,
    pub backend: Option<BackendKind>,
}

#[derive(Default)]
struct Counters {
    calls: AtomicU64,
    handled: AtomicU64,
    declined: AtomicU64,
    rows: AtomicU64,
    experts_inflated: AtomicU64,
    bytes_inflated: AtomicU64,
    cpu_gemms: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// One activation share: quantized rows `first..first + scales.len()`, each `kp` bytes.
struct QuantShare {
    first: usize,
    q: Vec<i8>,
    scales: Vec<f32>,
}

/// A used expert ready for its GEMMs: weights, its rows in native A (synced), their scales.
struct Prepared {
    expert: Arc<Expert>,
    a: Buffer<i8>,
    row_scales: Vec<f32>,
}

type PreparedSlot = OnceLock<Result<Prepared, Error>>;

/// A phase-2 work item: padded channels `n0..n1` of group `group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Item {
    group: usize,
    n0: usize,
    n1: usize,
}

/// State shared by the threads of one call.
struct Call {
    plan: Plan,
    /// Identity of a cooperative call: the four data addresses and the caller's thread count.
    key: ([usize; 4], usize),
    /// Caller threads that take part (cooperative calls: they join through `key`).
    participants: usize,
    /// Threads that do the work: one quantization share each.
    nth: usize,
    /// Caller threads that joined.
    arrived: AtomicUsize,
    /// Activation rows per quantization share.
    chunk: usize,
    routing: OnceLock<Result<Routing, Error>>,
    quant: Vec<OnceLock<QuantShare>>,
    /// Phase-2 work items and, per group, its prepared expert (made by the first thread to need it).
    items: OnceLock<(Vec<Item>, Vec<PreparedSlot>)>,
    next: AtomicUsize,
    failed: AtomicBool,
    failure: Mutex<Option<Error>>,
    clock: StageClock,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn oom(what: &str) -> Error {
    Error::new(ErrorKind::OutOfMemory, format!("cannot allocate {what}"))
}

/// A zeroed vector, or OutOfMemory instead of aborting the process.
fn try_vec<T: Clone>(len: usize, value: T, what: &str) -> Result<Vec<T>, Error> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| oom(what))?;
    v.resize(len, value);
    Ok(v)
}

fn caught(payload: Box<dyn std::any::Any + Send>) -> Error {
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    Error::new(
        ErrorKind::Internal,
        format!("internal error (panic): {msg}"),
    )
}

impl Call {
    fn new(plan: Plan, key: ([usize; 4], usize), participants: usize, nth: usize) -> Call {
        let nth = nth.max(1);
        let rows = plan.problem.act_rows();
        Call {
            chunk: rows.div_ceil(nth),
            plan,
            key,
            participants: participants.max(1),
            nth,
            arrived: AtomicUsize::new(1),
            routing: OnceLock::new(),
            quant: (0..nth).map(|_| OnceLock::new()).collect(),
            items: OnceLock::new(),
            next: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            clock: StageClock::default(),
        }
    }

    fn fail(&self, e: Error) {
        self.failed.store(true, Ordering::Relaxed);
        lock(&self.failure).get_or_insert(e);
    }

    fn result(&self) -> Result<Stages, Error> {
        if let Some(Err(e)) = self.routing.get() {
            return Err(e.clone());
        }
        match lock(&self.failure).clone() {
            Some(e) => Err(e),
            None => Ok(self.clock.get()),
        }
    }

    /// The routing, once computed (after phase 1).
    fn routing(&self) -> &Routing {
        match self.routing.get() {
            Some(Ok(r)) => r,
            _ => unreachable!("phase 2 runs only after a successful routing"),
        }
    }
}

/// Splits each group's padded channels into parts so that no part holds much more than
/// `1/nth` of all rows × channels: only an expert with more than its share of the rows is split,
/// in whole 32-channel tiles.
fn plan_items(groups: &[Group], np: usize, tile: usize, nth: usize) -> Vec<Item> {
    let total: usize = groups.iter().map(|g| g.len).sum();
    let tiles = np / tile;
    let mut items = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        let parts = if nth > 1 {
            (g.len * nth).div_ceil(total.max(1)).clamp(1, tiles)
        } else {
            1
        };
        for p in 0..parts {
            let (t0, t1) = (p * tiles / parts, (p + 1) * tiles / parts);
            items.push(Item {
                group: gi,
                n0: t0 * tile,
                n1: t1 * tile,
            });
        }
    }
    items
}

/// The engine behind one `ork_ctx`. Safe to use from several threads at once.
pub struct Engine {
    config: Config,
    device: Device,
    tiles: Tiles,
    cache: Cache,
    counters: Counters,
    /// Cooperative calls still waiting for some of their threads.
    joining: Mutex<Vec<Arc<Call>>>,
    /// A and C device buffers of finished calls, reused so that a call does not pay for fresh
    /// zeroed pages (allocation showed up as the largest host cost of a 512-token call).
    spare_a: Mutex<Vec<Buffer<i8>>>,
    spare_c: Mutex<Vec<Buffer<i32>>>,
}

/// The RK3588's A tile width, fixed so that row pieces are constant-sized (inlined copies);
/// [`Engine::new`] checks the device's, and its C quad against [`QUAD`].
const A_K: usize = 16;

/// Spare buffers kept per kind, and their total bytes.
const SPARE_COUNT: usize = 256;
const SPARE_BYTES: usize = 128 << 20;
/// Buffer lengths are rounded up to this many elements, so that spares fit later requests.
const SPARE_GRAIN: usize = 16 << 10;

/// The smallest spare holding at least `len` elements, or a new buffer.
fn take_spare<T: crate::npu::Elem>(
    device: &Device,
    spares: &Mutex<Vec<Buffer<T>>>,
    len: usize,
) -> Result<Buffer<T>, Error> {
    let mut pool = lock(spares);
    let best = pool
        .iter()
        .enumerate()
        .filter(|(_, b)| b.len() >= len)
        .min_by_key(|(_, b)| b.len())
        .map(|(i, _)| i);
    match best {
        Some(i) => Ok(pool.swap_remove(i)),
        None => {
            drop(pool);
            Ok(device.alloc::<T>(
                len.div_ceil(SPARE_GRAIN) * SPARE_GRAIN,
                flags::CPU_FILLED,
                0,
            )?)
        }
    }
}

/// Keeps `b` for reuse within the count and byte limits (dropping the smallest spares first).
fn give_spare<T: crate::npu::Elem>(spares: &Mutex<Vec<Buffer<T>>>, b: Buffer<T>) {
    let mut pool = lock(spares);
    pool.push(b);
    let bytes = |p: &Vec<Buffer<T>>| p.iter().map(|b| b.len() * size_of::<T>()).sum::<usize>();
    while pool.len() > SPARE_COUNT || bytes(&pool) > SPARE_BYTES {
        let smallest = pool
            .iter()
            .enumerate()
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i)
            .expect("not empty");
        pool.swap_remove(smallest);
    }
}

impl Engine {
    pub fn new(config: Config) -> Result<Engine, Error> {
        let device = Device::open(config.backend)?;
        Engine::with_device(config, device)
    }

    /// An engine on a device the caller opened (`config.backend` is not looked at), e.g. an
    /// emulator with injected faults.
    pub fn with_device(config: Config, device: Device) -> Result<Engine, Error> {
        device.set_core_mask(CoreMask(config.core_mask));
        let tiles = device.tiles();
        if tiles.a_k != A_K
            || tiles.c_n != QUAD
            || !tiles.b_n.is_multiple_of(QUAD)
            || tiles.b_k != 32
        {
            return Err(Error::new(
                ErrorKind::DeviceError,
                format!("unsupported tile sizes {tiles:?}"),
            ));
        }
        Ok(Engine {
            cache: Cache::new(config.cache_bytes),
            config,
            device,
            tiles,
            counters: Counters::default(),
            joining: Mutex::new(Vec::new()),
            spare_a: Mutex::new(Vec::new()),
            spare_c: Mutex::new(Vec::new()),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Validates the descriptors and applies the small-batch policy, from metadata only.
    pub fn plan(
        &self,
        w: &TensorDesc,
        b: &TensorDesc,
        ids: &TensorDesc,
        dst: &TensorDesc,
    ) -> Result<Plan, Error> {
        let problem = validate(w, b, ids, dst)?;
        let small = problem.rows_per_expert() < self.config.min_rows as usize;
        if small && self.config.small_batch == SmallBatch::Decline {
            return Err(Error::new(
                ErrorKind::NotHandled,
                format!(
                    "{} rows per expert is below min_rows {} (ORK_MIN_ROWS): left to the caller",
                    problem.rows_per_expert(),
                    self.config.min_rows
                ),
            ));
        }
        Ok(Plan {
            problem,
            on_cpu: small,
        })
    }

    /// Counts a declined call (the C boundary calls it once per call).
    pub fn note_declined(&self) {
        bump(&self.counters.calls, 1);
        bump(&self.counters.declined, 1);
    }

    fn threads(&self) -> usize {
        let pool = crate::pool::global().threads();
        match self.config.n_threads as usize {
            0 => pool,
            n => n.min(pool),
        }
    }

    /// Runs a planned call on the crate's pool.
    pub fn run(&self, plan: Plan, io: &Inputs) -> Result<Stages, Error> {
        let nth = self.threads();
        let call = Call::new(plan, ([0; 4], 1), 1, nth);
        self.begin(&call);
        self.run_on_pool(&call, io);
        let r = self.end(&call);
        self.recycle(call);
        r
    }

    /// Both phases of `call` on the crate's pool, `call.nth` threads.
    fn run_on_pool(&self, call: &Call, io: &Inputs) {
        let pool = crate::pool::global();
        pool.run(call.nth, |ith, _| self.phase1(call, io, ith));
        if let Some(Ok(_)) = call.routing.get() {
            pool.run(call.nth, |ith, _| self.phase2(call, io, ith));
        }
    }

    /// Runs a planned call cooperatively: every one of `nth` threads calls this with the same
    /// plan and tensors; `barrier` must be a full barrier across them. Every thread returns the
    /// same result.
    pub fn run_mt(
        &self,
        plan: Plan,
        io: &Inputs,
        ith: usize,
        nth: usize,
        barrier: &mut dyn FnMut(),
    ) -> Result<Stages, Error> {
        let key = (
            [
                io.weights.as_ptr() as usize,
                io.b.as_ptr() as usize,
                io.ids.as_ptr() as usize,
                io.dst.as_ptr() as usize,
            ],
            nth,
        );
        if self.config.mt_mode == MtMode::Leader {
            return self.run_led(plan, io, key, ith, nth, barrier);
        }
        let call = self.join(plan, key, nth, nth);
        let ith = ith.min(call.nth - 1);
        if let Err(p) = panic::catch_unwind(AssertUnwindSafe(|| self.phase1(&call, io, ith))) {
            call.fail(caught(p));
        }
        // Every thread sees the same routing result: an invalid id ends the call everywhere
        // before the barrier, with dst untouched.
        if let Some(Err(e)) = call.routing.get() {
            return Err(e.clone());
        }
        barrier();
        if let Err(p) = panic::catch_unwind(AssertUnwindSafe(|| self.phase2(&call, io, ith))) {
            call.fail(caught(p));
        }
        barrier();
        let r = if ith == 0 {
            self.end(&call)
        } else {
            call.result()
        };
        // The last thread out owns the call and returns its buffers.
        if let Some(call) = Arc::into_inner(call) {
            self.recycle(call);
        }
        r
    }

    /// [`MtMode::Leader`]: caller thread 0 runs the call on the crate's pool while the others wait
    /// in `barrier`; then every thread returns the call's result.
    fn run_led(
        &self,
        plan: Plan,
        io: &Inputs,
        key: ([usize; 4], usize),
        ith: usize,
        nth: usize,
        barrier: &mut dyn FnMut(),
    ) -> Result<Stages, Error> {
        let call = self.join(plan, key, nth, self.threads());
        if ith == 0 {
            // A panic must not skip the barrier: the other threads would wait forever.
            if let Err(p) = panic::catch_unwind(AssertUnwindSafe(|| self.run_on_pool(&call, io))) {
                call.fail(caught(p));
            }
        }
        barrier();
        let r = if ith == 0 {
            self.end(&call)
        } else {
            call.result()
        };
        if let Some(call) = Arc::into_inner(call) {
            self.recycle(call);
        }
        r
    }

    /// Returns a finished call's A buffers to the spares.
    fn recycle(&self, call: Call) {
        if let Some((_, prepared)) = call.items.into_inner() {
            for slot in prepared {
                if let Some(Ok(p)) = slot.into_inner() {
                    give_spare(&self.spare_a, p.a);
                }
            }
        }
    }

    /// Finds the cooperative call `key` still waiting for threads, or starts one.
    fn join(
        &self,
        plan: Plan,
        key: ([usize; 4], usize),
        participants: usize,
        nth: usize,
    ) -> Arc<Call> {
        let mut joining = lock(&self.joining);
        if let Some(i) = joining.iter().position(|c| c.key == key && c.plan == plan) {
            let call = Arc::clone(&joining[i]);
            if call.arrived.fetch_add(1, Ordering::Relaxed) + 1 >= call.participants {
                joining.swap_remove(i);
            }
            return call;
        }
        let call = Arc::new(Call::new(plan, key, participants, nth));
        self.begin(&call);
        if call.participants > 1 {
            joining.push(Arc::clone(&call));
        }
        call
    }

    fn begin(&self, call: &Call) {
        bump(&self.counters.calls, 1);
        bump(&self.counters.rows, call.plan.problem.rows() as u64);
    }

    fn end(&self, call: &Call) -> Result<Stages, Error> {
        let r = call.result();
        let p = &call.plan.problem;
        match &r {
            Ok(_) => {
                bump(&self.counters.handled, 1);
                log::debug!(
                    "handled {} K={} N={}: {} tokens x {} slots on {}",
                    p.wtype.name(),
                    p.k,
                    p.n,
                    p.n_tokens,
                    p.n_used,
                    self.device.backend().name()
                );
            }
            Err(e) => log::debug!("failed {} K={} N={}: {e}", p.wtype.name(), p.k, p.n),
        }
        r
    }

    /// Phase 1, share `ith`: routing (computed once, by whichever thread comes first) and the
    /// quantization of this share's activation rows.
    fn phase1(&self, call: &Call, io: &Inputs, ith: usize) {
        let p = &call.plan.problem;
        let routed = call.routing.get_or_init(|| {
            let t = Instant::now();
            let r = panic::catch_unwind(AssertUnwindSafe(|| Routing::new(p, io.ids)))
                .unwrap_or_else(|e| Err(caught(e)));
            call.clock.add(ROUTE, t);
            r
        });
        if routed.is_err() {
            return;
        }
        let t = Instant::now();
        let kp = self.tiles.pad(p.k);
        let first = (ith * call.chunk).min(p.act_rows());
        let last = ((ith + 1) * call.chunk).min(p.act_rows());
        let share = try_vec((last - first) * kp, 0i8, "quantized activations").map(|mut q| {
            let mut scales = Vec::with_capacity(last - first);
            for (r, out) in (first..last).zip(q.chunks_exact_mut(kp)) {
                let off = p.b_offset(r);
                scales.push(quantize_row(&io.b[off..off + p.k], out));
            }
            QuantShare { first, q, scales }
        });
        match share {
            Ok(s) => {
                // Set once per share index; a second set cannot happen (one thread per ith).
                let _ = call.quant[ith].set(s);
            }
            Err(e) => call.fail(e),
        }
        call.clock.add(QUANT, t);
    }

    /// Phase 2, on one thread: take items until none is left.
    fn phase2(&self, call: &Call, io: &Inputs, _ith: usize) {
        if call.failed.load(Ordering::Relaxed) {
            return;
        }
        let routing = call.routing();
        let np = self.tiles.pad(call.plan.problem.n);
        let (items, prepared) = call.items.get_or_init(|| {
            let split = if self.device.backend() == BackendKind::Rknn {
                1
            } else {
                call.nth
            };
            let items = plan_items(&routing.groups, np, self.tiles.b_n, split);
            (
                items,
                routing.groups.iter().map(|_| OnceLock::new()).collect(),
            )
        });
        while !call.failed.load(Ordering::Relaxed) {
            let i = call.next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else { break };
            let group = &routing.groups[item.group];
            let prep = prepared[item.group].get_or_init(|| self.prepare_group(call, io, group));
            let done = match prep {
                Ok(prep) => self.run_item(call, io, group, prep, item),
                Err(e) => Err(e.clone()),
            };
            if let Err(e) = done {
                call.fail(e);
            }
        }
    }

    /// The expert's weights (cached or inflated now) and its rows gathered into native A.
    fn prepare_group(&self, call: &Call, io: &Inputs, g: &Group) -> Result<Prepared, Error> {
        let p = &call.plan.problem;
        let expert = self.expert(call, io, g.expert)?;
        let t = Instant::now();
        let kp = self.tiles.pad(p.k);
        let rows = call.routing().rows_of(g);
        let m = rows.len();
        let mut a = take_spare(&self.device, &self.spare_a, m * kp)?;
        let mut row_scales = Vec::with_capacity(m);
        let mut src = Vec::with_capacity(m);
        for row in rows {
            let r = p.act_row(row.token as usize, row.slot as usize);
            let share = call.quant[r / call.chunk]
                .get()
                .expect("phase 1 quantized every share");
            src.push(&share.q[(r - share.first) * kp..(r - share.first + 1) * kp]);
            row_scales.push(share.scales[r - share.first]);
        }
        // Native A is [K/16][M][16]: filled in that order, the writes are one sequential stream
        // and each row is read 16 bytes at a time (m rows of 16-byte pieces stay in cache).
        let blocks = a.as_mut_slice()[..m * kp].chunks_exact_mut(m * A_K);
        for (kb, block) in blocks.enumerate() {
            let k0 = kb * A_K;
            for (piece, row) in block.chunks_exact_mut(A_K).zip(&src) {
                piece.copy_from_slice(&row[k0..k0 + A_K]);
            }
        }
        a.sync_to_device()?;
        call.clock.add(QUANT, t);
        Ok(Prepared {
            expert,
            a,
            row_scales,
        })
    }

    /// Expert `e`'s inflated weights, from the cache or inflated (and cached) now.
    fn expert(&self, call: &Call, io: &Inputs, e: usize) -> Result<Arc<Expert>, Error> {
        let t = Instant::now();
        let p = &call.plan.problem;
        let (off, len) = p.expert_bytes(e);
        let bytes = &io.weights[off..off + len];
        let key = Key {
            addr: io.weights.as_ptr() as usize + off,
            ty: p.wtype,
            k: p.k,
            n: p.n,
            row_stride: p.w_nb1,
            name_hash: name_hash(io.name),
        };
        let fp = fingerprint(
            bytes,
            p.n,
            p.w_row_bytes,
            p.w_nb1,
            p.wtype.block_bytes(),
            self.config.cache_verify,
        );
        if let Lookup::Hit(x) = self.cache.lookup(&key, fp) {
            call.clock.add(INFLATE, t);
            return Ok(x);
        }
        let (kp, np) = (self.tiles.pad(p.k), self.tiles.pad(p.n));
        let mut b = self
            .device
            .alloc::<i8>(self.tiles.b_len(kp, np), flags::CPU_FILLED, 0)?;
        let mut chan = try_vec(np, 0f32, "channel scales")?;
        let w = ExpertWeights {
            ty: p.wtype,
            data: bytes,
            row_stride: p.w_nb1,
            n: p.n,
            k: p.k,
        };
        inflate_expert(&w, &self.tiles, b.as_mut_slice(), &mut chan).map_err(|err| match err {
            InflateError::NonFiniteScale { row, block } => Error::new(
                ErrorKind::InvalidArgument,
                format!("as: expert {e}, row {row}, block {block} has a NaN or infinite scale"),
            ),
            other => Error::new(
                ErrorKind::Internal,
                format!("inflating expert {e}: {other}"),
            ),
        })?;
        b.sync_to_device()?;
        bump(&self.counters.experts_inflated, 1);
        bump(&self.counters.bytes_inflated, b.len() as u64);
        let x = Arc::new(Expert { b, chan });
        self.cache.insert(key, fp, Arc::clone(&x));
        call.clock.add(INFLATE, t);
        Ok(x)
    }

    /// GEMM of one item and the scatter of its f32 results to `dst`.
    fn run_item(
        &self,
        call: &Call,
        io: &Inputs,
        g: &Group,
        prep: &Prepared,
        item: &Item,
    ) -> Result<(), Error> {
        let t = Instant::now();
        let p = &call.plan.problem;
        let kp = self.tiles.pad(p.k);
        let (m, nc) = (g.len, item.n1 - item.n0);
        let b_offset = self.tiles.b_len(kp, item.n0);
        let rows = call.routing().rows_of(g);
        if call.plan.on_cpu {
            let shape = crate::gemm::Shape { m, kp, np: nc };
            let b = &prep.expert.b.as_slice()[b_offset..b_offset + self.tiles.b_len(kp, nc)];
            let mut c = try_vec(self.tiles.c_len(m, nc), 0i32, "GEMM output")?;
            crate::gemm::gemm(&self.tiles, shape, prep.a.as_slice(), b, &mut c);
            bump(&self.counters.cpu_gemms, 1);
            call.clock.add(GEMM, t);
            let t = Instant::now();
            self.scatter(p, rows, prep, item, &c, io.dst);
            call.clock.add(SCATTER, t);
            return Ok(());
        }
        let mut c = take_spare(&self.device, &self.spare_c, self.tiles.c_len(m, nc))?;
        let mm = MatMul {
            m,
            k: kp,
            n: nc,
            a: &prep.a,
            a_offset: 0,
            b: &prep.expert.b,
            b_offset,
            c_offset: 0,
            scaled: None,
        };
        // K == Kp here, since 512 is a multiple of the padding.
        let in_stream_envelope = p.k.is_multiple_of(512) && p.k <= 4096;
        let sub = if in_stream_envelope {
            self.device.prepare_stream_i8(vec![mm], &mut c)?
        } else {
            self.device.prepare_i8(mm, &mut c)?
        };
        sub.run_share(0, 1);
        sub.finish()?;
        c.sync_from_device()?;
        call.clock.add(GEMM, t);
        let t = Instant::now();
        self.scatter(p, rows, prep, item, c.as_slice(), io.dst);
        give_spare(&self.spare_c, c);
        call.clock.add(SCATTER, t);
        Ok(())
    }

    /// `dst[n, slot, token] = C[m][n] · (row_scale[m] · chan[n])` for the item's channels
    /// ([`scale_row`] per row).
    ///
    /// Native C is [N/4][M][4]: the 4 rows of a block hold one 64-byte run per tile, so a block's
    /// tiles (one line each) are read from memory once, for its first row, and from L1 for the
    /// other three, while every `dst` row is written front to back.
    fn scatter(
        &self,
        p: &Problem,
        rows: &[super::route::Row],
        prep: &Prepared,
        item: &Item,
        c: &[i32],
        dst: &[AtomicU32],
    ) {
        let isa = crate::isa::selected();
        let m = rows.len();
        let width = item.n1.min(p.n) - item.n0;
        let (chan, _) = prep.expert.chan[item.n0..item.n1].as_chunks::<QUAD>();
        let (c, _) = c.as_chunks::<QUAD>();
        for (mi, row) in rows.iter().enumerate() {
            let base = p.dst_offset(row.token as usize, row.slot as usize) + item.n0;
            let out = &dst[base..base + width];
            scale_row(isa, c, mi, m, prep.row_scales[mi], chan, out);
        }
        publish(isa);
    }

    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let cache = self.cache.stats();
        let dev = self.device.stats();
        Stats {
            calls: load(&c.calls),
            handled: load(&c.handled),
            declined: load(&c.declined),
            rows: load(&c.rows),
            experts_inflated: load(&c.experts_inflated),
            cache_hits: cache.hits,
            cache_misses: cache.misses,
            cache_evictions: cache.evictions,
            bytes_inflated: load(&c.bytes_inflated),
            submits_run_i8: dev.submits[0],
            submits_chain: dev.submits[1],
            submits_stream: dev.submits[2],
            cpu_gemms: load(&c.cpu_gemms),
            modelled_npu_us: dev.modelled_us,
            backend: Some(self.device.backend()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_split_only_the_oversized_expert() {
        let groups = [
            Group {
                expert: 3,
                start: 0,
                len: 90,
            },
            Group {
                expert: 1,
                start: 90,
                len: 6,
            },
            Group {
                expert: 2,
                start: 96,
                len: 4,
            },
        ];
        let one = plan_items(&groups, 768, 32, 1);
        assert_eq!(one.len(), 3);
        assert!(one.iter().all(|i| (i.n0, i.n1) == (0, 768)));
        let two = plan_items(&groups, 768, 32, 2);
        assert_eq!(two.iter().filter(|i| i.group == 0).count(), 2);
        assert_eq!(
            two[0],
            Item {
                group: 0,
                n0: 0,
                n1: 384
            }
        );
        assert_eq!(
            two[1],
            Item {
                group: 0,
                n0: 384,
                n1: 768
            }
        );
        assert_eq!(two.len(), 4);
    }
}
