//! What the CPU-executed backends (emu, cpu) share: argument checks, the task plan as data, and
//! its execution on the CPU int8 GEMM.
//!
//! A plan is a list of [`Task`]s (which GEMM, which rows, which output channels, which core),
//! computed before anything runs, as the board's driver does. Execution then groups the tasks of
//! one N-range ("slab": contiguous in B and C) into work units of whole N-tiles, so any number of
//! threads can claim units without sharing an output element.

use super::buffer::Buffer;
use super::error::{Error, Result};
use super::submit::MatMul;
use crate::gemm::{self, Shape};
use crate::isa::Isa;
use crate::layout::Tiles;
use crate::sync::lock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// One hardware task: rows `m0..m1` × output channels `n0..n1` of GEMM `gemm`, on `core`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    pub core: usize,
    pub gemm: usize,
    pub n0: usize,
    pub n1: usize,
    pub m0: usize,
    pub m1: usize,
}

impl Task {
    pub fn rows(&self) -> usize {
        self.m1 - self.m0
    }

    pub fn channels(&self) -> usize {
        self.n1 - self.n0
    }
}

/// Checks what every backend needs: padded dims, operands inside their buffers, buffers of this
/// device, outputs inside C and not overlapping.
pub fn validate(device: u64, tiles: &Tiles, gemms: &[MatMul], c: &Buffer<i32>) -> Result<()> {
    let bad = |s: String| Err(Error::InvalidArgument(s));
    if gemms.is_empty() {
        return bad("a submit needs at least one GEMM".into());
    }
    if c.device_id() != device {
        return bad("C belongs to another device".into());
    }
    let mut regions = Vec::with_capacity(gemms.len());
    for (i, g) in gemms.iter().enumerate() {
        if g.a.device_id() != device || g.b.device_id() != device {
            return bad(format!("GEMM {i}: buffer of another device"));
        }
        if g.m == 0 || g.k == 0 || g.n == 0 {
            return bad(format!(
                "GEMM {i}: empty shape m={} k={} n={}",
                g.m, g.k, g.n
            ));
        }
        if !g.k.is_multiple_of(tiles.align) || !g.n.is_multiple_of(tiles.align) {
            return bad(format!(
                "GEMM {i}: k={} and n={} must be multiples of {}",
                g.k, g.n, tiles.align
            ));
        }
        let fits = |off: usize, len: Option<usize>, have: usize| {
            len.and_then(|l| l.checked_add(off))
                .is_some_and(|e| e <= have)
        };
        if !fits(g.a_offset, g.m.checked_mul(g.k), g.a.len()) {
            return bad(format!(
                "GEMM {i}: A ({}x{} at {}) past its buffer ({})",
                g.m,
                g.k,
                g.a_offset,
                g.a.len()
            ));
        }
        if !fits(g.b_offset, g.k.checked_mul(g.n), g.b.len()) {
            return bad(format!(
                "GEMM {i}: B ({}x{} at {}) past its buffer ({})",
                g.k,
                g.n,
                g.b_offset,
                g.b.len()
            ));
        }
        if !fits(g.c_offset, g.m.checked_mul(g.n), c.len()) {
            return bad(format!(
                "GEMM {i}: C ({}x{} at {}) past its buffer ({})",
                g.m,
                g.n,
                g.c_offset,
                c.len()
            ));
        }
        regions.push((g.c_offset, g.c_offset + g.m * g.n));
    }
    regions.sort_unstable();
    if regions.windows(2).any(|w| w[1].0 < w[0].1) {
        return bad("outputs of one submit overlap in C".into());
    }
    Ok(())
}

/// Parts one expert of a call is split into over `ways` workers (the caller's threads, or the NPU
/// cores' submitters): its share of them by its `rows` of the call's `total`, at least one, at
/// most one per N-tile of its `tiles`. Only an expert with a large share is split (a dense
/// call's one expert: all of them). The engine's work items and the board model's runs follow it.
pub fn expert_parts(rows: usize, total: usize, ways: usize, tiles: usize) -> usize {
    (rows * ways).div_ceil(total.max(1)).clamp(1, tiles.max(1))
}

/// The `ways` a call's experts are split over on the NPU's `cores` submitters: a call of one
/// expert (a dense matmul's) in two parts per core, so that the first round of parts is read
/// back and scattered while the second runs, instead of every core idling through the scatter.
pub fn submitter_ways(cores: usize, one_expert: bool) -> usize {
    cores * if one_expert { 2 } else { 1 }
}

/// Splits channels `n0..n1` (whole N-tiles) over `cores`: contiguous ranges, sizes differing by at
/// most one tile, larger first; cores that get nothing are left out.
pub fn split_channels(
    tiles: &Tiles,
    n0: usize,
    n1: usize,
    cores: &[usize],
) -> Vec<(usize, usize, usize)> {
    let n_tiles = (n1 - n0) / tiles.b_n;
    let used = cores.len().min(n_tiles).max(1);
    let (base, extra) = (n_tiles / used, n_tiles % used);
    let mut out = Vec::with_capacity(used);
    let mut at = n0;
    for (i, &core) in cores.iter().take(used).enumerate() {
        let len = (base + usize::from(i < extra)) * tiles.b_n;
        out.push((core, at, at + len));
        at += len;
    }
    out
}

/// Tasks of GEMM `gemm` (`m` rows) on `core` for channels `n0..n1`: slices of at most `n_max`
/// channels, each cut into row chunks of at most `m_max`.
pub fn tasks_for(
    gemm: usize,
    core: usize,
    m: usize,
    (n0, n1): (usize, usize),
    n_max: usize,
    m_max: usize,
) -> Vec<Task> {
    let mut out = Vec::new();
    let mut n = n0;
    while n < n1 {
        let ne = (n + n_max).min(n1);
        let mut r = 0;
        while r < m {
            let re = (r + m_max).min(m);
            out.push(Task {
                core,
                gemm,
                n0: n,
                n1: ne,
                m0: r,
                m1: re,
            });
            r = re;
        }
        n = ne;
    }
    out
}

/// A GEMM's operands as the device sees them.
pub struct GemmView<'a> {
    pub m: usize,
    pub k: usize,
    /// Native A (`m·k` elements).
    pub a: &'a [i8],
    /// Native B (`k·n` elements).
    pub b: &'a [i8],
}

/// How the CPU-executed backends run their submits: the kernel path of their int8 GEMM and how
/// many of the crate's pool threads a submit's shares may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostExec {
    pub isa: Isa,
    pub threads: usize,
}

impl Default for HostExec {
    /// The best kernel path on every core.
    fn default() -> HostExec {
        HostExec {
            isa: Isa::best(),
            threads: crate::pool::cores(),
        }
    }
}

/// How an [`Execution`] cuts its work.
#[derive(Clone, Copy, Debug)]
pub struct Split {
    /// Threads expected to run the shares.
    pub threads: usize,
    /// Execute every planned row range as its own GEMM (gather A rows, scatter C rows), as the
    /// hardware tasks do; otherwise adjacent row ranges of a slab run as one GEMM, which gives the
    /// same bits (exact int32) without packing B once per range.
    pub per_task: bool,
}

/// Adjacent row ranges merged.
fn coalesce(mut rows: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    rows.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(rows.len());
    for (m0, m1) in rows {
        match out.last_mut() {
            Some(last) if last.1 == m0 => last.1 = m1,
            _ => out.push((m0, m1)),
        }
    }
    out
}

/// Work unit: channels `c0..c1` of one slab of GEMM `gemm`, for the row ranges of its tasks.
struct Unit {
    gemm: usize,
    c0: usize,
    c1: usize,
    row_ranges: Vec<(usize, usize)>,
}

/// A planned submit executing on the CPU: units claimed by any number of threads.
pub struct Execution<'a> {
    tiles: Tiles,
    isa: Isa,
    gemms: Vec<GemmView<'a>>,
    units: Vec<Unit>,
    c_parts: Vec<Mutex<Option<&'a mut [i32]>>>,
    next: AtomicUsize,
}

impl<'a> Execution<'a> {
    /// Builds the units of `tasks` (each slab cut into whole N-tiles so that `split.threads` have
    /// about two units each) and hands each unit its disjoint part of C (`c`, at the GEMMs'
    /// `c_offsets`). The GEMMs run on kernel path `isa`.
    pub fn new(
        tiles: Tiles,
        isa: Isa,
        gemms: Vec<GemmView<'a>>,
        tasks: &[Task],
        c: &'a mut [i32],
        c_offsets: &[usize],
        split: Split,
    ) -> Execution<'a> {
        // Slabs: tasks sharing (gemm, n0, n1) differ only in rows and write one contiguous block.
        let mut slabs: BTreeMap<(usize, usize, usize), Vec<(usize, usize)>> = BTreeMap::new();
        for t in tasks {
            slabs
                .entry((t.gemm, t.n0, t.n1))
                .or_default()
                .push((t.m0, t.m1));
        }
        let pieces = (2 * split.threads).div_ceil(slabs.len().max(1)).max(1);
        let mut units = Vec::new();
        for ((gemm, n0, n1), mut rows) in slabs {
            if !split.per_task {
                rows = coalesce(rows);
            }
            let step = ((n1 - n0) / tiles.b_n).div_ceil(pieces).max(1) * tiles.b_n;
            let mut c0 = n0;
            while c0 < n1 {
                let c1 = (c0 + step).min(n1);
                units.push(Unit {
                    gemm,
                    c0,
                    c1,
                    row_ranges: rows.clone(),
                });
                c0 = c1;
            }
        }
        // Native C of GEMM g, channels c0..c1, is the block [c_off + c0·m, c_off + c1·m).
        let region = |u: &Unit| {
            let m = gemms[u.gemm].m;
            (c_offsets[u.gemm] + u.c0 * m, (u.c1 - u.c0) * m)
        };
        let mut order: Vec<usize> = (0..units.len()).collect();
        order.sort_by_key(|&i| region(&units[i]).0);
        let mut c_parts: Vec<Option<&'a mut [i32]>> = (0..units.len()).map(|_| None).collect();
        let mut rest = c;
        let mut at = 0;
        for &i in &order {
            let (start, len) = region(&units[i]);
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - at);
            let (part, tail) = tail.split_at_mut(len);
            c_parts[i] = Some(part);
            rest = tail;
            at = start + len;
        }
        Execution {
            tiles,
            isa,
            gemms,
            units,
            c_parts: c_parts.into_iter().map(Mutex::new).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Claims and executes units until none is left. Any number of threads may call it at once.
    pub fn run(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.units.len() {
                return;
            }
            // Each unit is claimed once, so this lock is never contended.
            if let Some(c) = lock(&self.c_parts[i]).as_deref_mut() {
                self.execute(&self.units[i], c);
            }
        }
    }

    /// The int32 result of GEMM `g` in native C order (for dumps), once [`Execution::run`] is done.
    pub fn result(&self, g: usize) -> Vec<i32> {
        let mut mine: Vec<usize> = (0..self.units.len())
            .filter(|&i| self.units[i].gemm == g)
            .collect();
        mine.sort_by_key(|&i| self.units[i].c0);
        mine.iter()
            .flat_map(|&i| lock(&self.c_parts[i]).as_deref().unwrap_or(&[]).to_vec())
            .collect()
    }

    fn execute(&self, u: &Unit, c: &mut [i32]) {
        let t = &self.tiles;
        let g = &self.gemms[u.gemm];
        let (m, k) = (g.m, g.k);
        let np = u.c1 - u.c0;
        let b = &g.b[u.c0 * k..u.c1 * k];
        for &(m0, m1) in &u.row_ranges {
            if (m0, m1) == (0, m) {
                gemm::gemm_isa(self.isa, t, Shape { m, kp: k, np }, g.a, b, c);
                continue;
            }
            // A task over a row range reads a strided part of native A and writes a strided part
            // of native C: gather the rows, multiply, scatter back.
            let rows = m1 - m0;
            let mut a = vec![0i8; rows * k];
            for (dst, src) in a
                .chunks_exact_mut(rows * t.a_k)
                .zip(g.a.chunks_exact(m * t.a_k))
            {
                dst.copy_from_slice(&src[m0 * t.a_k..m1 * t.a_k]);
            }
            let mut part = vec![0i32; rows * np];
            gemm::gemm_isa(self.isa, t, Shape { m: rows, kp: k, np }, &a, b, &mut part);
            for (dst, src) in c
                .chunks_exact_mut(m * t.c_n)
                .zip(part.chunks_exact(rows * t.c_n))
            {
                dst[m0 * t.c_n..m1 * t.c_n].copy_from_slice(src);
            }
        }
    }
}

/// Runs `share(ith, nth)` for every `ith` in `0..nth` on the crate's pool.
pub fn run_parallel<F: Fn(usize, usize) + Sync>(nth: usize, share: F) {
    crate::pool::global().run(nth, share);
}
