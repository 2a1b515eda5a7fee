//! What the CPU-executed backends (emu, cpu) share: argument checks, the task plan as data, and
//! its execution on the CPU int8 GEMM.
//!
//! A plan is a list of [`Task`]s (which GEMM, which rows, which output channels, which core),
//! computed before anything runs, as the board's driver does. Execution then groups the tasks of
//! one N-range ("slab": contiguous in B and C) into work units of whole N-tiles, so any number of
//! threads can claim units without sharing an output element.

use super::{Error, MatMul, Result, Scaled};
use crate::gemm::{self, Shape};
use crate::layout::Tiles;
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
/// device, outputs inside C and not overlapping, f32 outputs of the right size.
pub fn validate(
    device: u64,
    tiles: &Tiles,
    gemms: &[MatMul],
    c: &super::Buffer<i32>,
) -> Result<()> {
    let bad = |s: String| Err(Error::InvalidArgument(s));
    if gemms.is_empty() {
        return bad("a submit needs at least one GEMM".into());
    }
    if c.device != device {
        return bad("C belongs to another device".into());
    }
    let mut regions = Vec::with_capacity(gemms.len());
    for (i, g) in gemms.iter().enumerate() {
        if g.a.device != device || g.b.device != device {
            return bad(format!("GEMM {i}: buffer of another device"));
        }
        if g.m == 0 || g.k == 0 || g.n == 0 {
            return bad(format!(
                "GEMM {i}: empty shape m={} k={} n={}",
                g.m, g.k, g.n
            ));
        }
        if g.k % tiles.align != 0 || g.n % tiles.align != 0 {
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
        if let Some(s) = &g.scaled {
            if s.chan.len() < g.n
                || s.out.len() < g.m * g.n
                || s.rows.is_some_and(|r| r.len() < g.m)
            {
                return bad(format!(
                    "GEMM {i}: f32 output needs chan >= {}, rows >= {}, out >= {}",
                    g.n,
                    g.m,
                    g.m * g.n
                ));
            }
        }
    }
    regions.sort_unstable();
    if regions.windows(2).any(|w| w[1].0 < w[0].1) {
        return bad("outputs of one submit overlap in C".into());
    }
    Ok(())
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
    pub n: usize,
    /// Native A (`m·k` elements).
    pub a: &'a [i8],
    /// Native B (`k·n` elements).
    pub b: &'a [i8],
    pub chan: Option<&'a [f32]>,
    pub rows: Option<&'a [f32]>,
}

/// The CPU int8 GEMM on one native block (a slice of whole N-tiles).
pub type Kernel = fn(&Tiles, Shape, &[i8], &[i8], &mut [i32]);

/// The kernel the CPU-executed backends use.
pub fn kernel() -> Kernel {
    gemm::reference
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
    kernel: Kernel,
    gemms: Vec<GemmView<'a>>,
    units: Vec<Unit>,
    c_parts: Vec<Mutex<Option<&'a mut [i32]>>>,
    out_parts: Vec<Mutex<Option<&'a mut [f32]>>>,
    next: AtomicUsize,
}

impl<'a> Execution<'a> {
    /// Builds the units of `tasks` (each unit at most `unit_channels` wide, whole N-tiles) and
    /// hands each its disjoint part of C (`c`, at the GEMMs' `c_offsets`) and of the f32 outputs.
    pub fn new(
        tiles: Tiles,
        gemms: Vec<GemmView<'a>>,
        tasks: &[Task],
        c: &'a mut [i32],
        c_offsets: &[usize],
        mut outs: Vec<Option<&'a mut [f32]>>,
        unit_channels: usize,
    ) -> Execution<'a> {
        // Slabs: tasks sharing (gemm, n0, n1) differ only in rows and write one contiguous block.
        let mut slabs: BTreeMap<(usize, usize, usize), Vec<(usize, usize)>> = BTreeMap::new();
        for t in tasks {
            slabs
                .entry((t.gemm, t.n0, t.n1))
                .or_default()
                .push((t.m0, t.m1));
        }
        let step = unit_channels.max(tiles.b_n) / tiles.b_n * tiles.b_n;
        let mut units = Vec::new();
        for ((gemm, n0, n1), rows) in slabs {
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
        let mut out_parts: Vec<Option<&'a mut [f32]>> = (0..units.len()).map(|_| None).collect();
        for (g, out) in outs.iter_mut().enumerate() {
            let Some(out) = out.take() else { continue };
            let m = gemms[g].m;
            let mut mine: Vec<usize> = (0..units.len()).filter(|&i| units[i].gemm == g).collect();
            mine.sort_by_key(|&i| units[i].c0);
            let (mut rest, mut at) = (out, 0);
            for i in mine {
                let (start, len) = (units[i].c0 * m, (units[i].c1 - units[i].c0) * m);
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - at);
                let (part, tail) = tail.split_at_mut(len);
                out_parts[i] = Some(part);
                rest = tail;
                at = start + len;
            }
        }
        Execution {
            tiles,
            kernel: kernel(),
            gemms,
            units,
            c_parts: c_parts.into_iter().map(Mutex::new).collect(),
            out_parts: out_parts.into_iter().map(Mutex::new).collect(),
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
            // Each unit is claimed once, so these locks are never contended.
            let mut c = lock(&self.c_parts[i]);
            let mut out = lock(&self.out_parts[i]);
            if let Some(c) = c.as_deref_mut() {
                self.execute(&self.units[i], c, out.as_deref_mut());
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

    fn execute(&self, u: &Unit, c: &mut [i32], out: Option<&mut [f32]>) {
        let t = &self.tiles;
        let g = &self.gemms[u.gemm];
        let (m, k) = (g.m, g.k);
        let np = u.c1 - u.c0;
        let b = &g.b[u.c0 * k..u.c1 * k];
        for &(m0, m1) in &u.row_ranges {
            if (m0, m1) == (0, m) {
                (self.kernel)(t, Shape { m, kp: k, np }, g.a, b, c);
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
            (self.kernel)(t, Shape { m: rows, kp: k, np }, &a, b, &mut part);
            for (dst, src) in c
                .chunks_exact_mut(m * t.c_n)
                .zip(part.chunks_exact(rows * t.c_n))
            {
                dst[m0 * t.c_n..m1 * t.c_n].copy_from_slice(src);
            }
        }
        if let (Some(out), Some(chan)) = (out, g.chan) {
            scale(t, m, &chan[u.c0..u.c1], g.rows, c, out);
        }
    }
}

/// Poisoning cannot leave a part half-claimed: parts are only read or written under the lock.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `out = rows[m] · chan[n] · c` over a native C block (`m` rows, `chan.len()` channels); the
/// product of the two scales is taken first, so every backend rounds identically.
pub fn scale(t: &Tiles, m: usize, chan: &[f32], rows: Option<&[f32]>, c: &[i32], out: &mut [f32]) {
    for (j, (cg, og)) in c
        .chunks_exact(m * t.c_n)
        .zip(out.chunks_exact_mut(m * t.c_n))
        .enumerate()
    {
        for r in 0..m {
            let rs = rows.map_or(1.0, |s| s[r]);
            for q in 0..t.c_n {
                let i = r * t.c_n + q;
                og[i] = (rs * chan[j * t.c_n + q]) * cg[i] as f32;
            }
        }
    }
}

/// The f32 output slices of `gemms`, in order (None where no f32 result was asked for).
pub fn take_outs<'a>(gemms: &mut [MatMul<'a>]) -> Vec<Option<&'a mut [f32]>> {
    gemms
        .iter_mut()
        .map(|g| {
            g.scaled
                .as_mut()
                .map(|s: &mut Scaled<'a>| std::mem::take(&mut s.out))
        })
        .collect()
}

/// Runs `share(ith, nth)` for every `ith` in `0..nth` on the crate's pool.
pub fn run_parallel<F: Fn(usize, usize) + Sync>(nth: usize, share: F) {
    crate::pool::global().run(nth, share);
}

/// CPU threads a submit may use: the pool's, which never exceed the machine's cores.
pub fn cpu_threads() -> usize {
    crate::pool::global().threads()
}
