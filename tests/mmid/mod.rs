//! MUL_MAT_ID calls for the integration tests and the fuzz targets (which include this file):
//! tensors in any layout over real buffers, the C ABI entry points on caller threads with a real
//! barrier, and the expected result.
//!
//! Expected values come from an independent walk over the descriptors (every stride applied
//! here, not by the library) with the library's own int8 quantizers for weights and activations,
//! so an accepted call must match them bit for bit; an f64 product of the dequantized weights
//! bounds them from outside (quantization steps, docs/ACCURACY.md).
#![allow(dead_code)]

pub mod case;

use ork_moe::ffi::*;
use ork_moe::inflate::{inflate_expert_in, to_plain_with, ExpertWeights, Layout};
use ork_moe::isa::Isa;
use ork_moe::layout::Tiles;
use ork_moe::moe::desc::weight_format;
use ork_moe::moe::quantize::quantize_row;
use ork_moe::quant::{dequantize_row, GgmlType};
use std::ffi::c_void;
use std::sync::Barrier;

/// Bytes every buffer is filled with before a call; `dst` elements not written keep it.
pub const SENTINEL: u8 = 0xA5;

/// Bytes at an 8-aligned address (the part of `raw` from `base`).
pub struct Arena {
    raw: Vec<u8>,
    base: usize,
    len: usize,
}

impl Arena {
    pub fn new(len: usize) -> Arena {
        let raw = vec![SENTINEL; len + 8];
        let base = (8 - raw.as_ptr() as usize % 8) % 8;
        Arena { raw, base, len }
    }

    pub fn addr(&self) -> usize {
        self.raw.as_ptr() as usize + self.base
    }

    pub fn bytes(&self) -> &[u8] {
        &self.raw[self.base..self.base + self.len]
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.base..self.base + self.len]
    }

    pub fn f32_at(&self, off: usize) -> f32 {
        f32::from_le_bytes(self.bytes()[off..off + 4].try_into().unwrap())
    }

    pub fn put_f32(&mut self, off: usize, v: f32) {
        self.bytes_mut()[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }

    pub fn i32_at(&self, off: usize) -> i32 {
        i32::from_le_bytes(self.bytes()[off..off + 4].try_into().unwrap())
    }

    pub fn put_i32(&mut self, off: usize, v: i32) {
        self.bytes_mut()[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
}

/// One descriptor, with its data as an address (so it can cross threads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    pub ty: i32,
    pub ne: [i64; 4],
    pub nb: [usize; 4],
    pub addr: usize,
}

impl Tensor {
    pub fn c(&self) -> ork_tensor {
        ork_tensor {
            r#type: self.ty,
            ne: self.ne,
            nb: self.nb,
            data: self.addr as *mut c_void,
            name: std::ptr::null(),
        }
    }

    /// Byte offset of element (i0, i1, i2).
    pub fn at(&self, i0: usize, i1: usize, i2: usize) -> usize {
        i0 * self.nb[0] + i1 * self.nb[1] + i2 * self.nb[2]
    }
}

/// Bytes from the first element's start to the last one's end (elements of `elem` bytes; a
/// quantized row counts as one element of its row bytes, `ne0` then 1).
pub fn span(elem: usize, ne: [usize; 3], nb: [usize; 3]) -> usize {
    elem + (0..3).map(|i| (ne[i] - 1) * nb[i]).sum::<usize>()
}

/// A call's four descriptors.
#[derive(Clone, Copy, Debug)]
pub struct Descs {
    pub w: Tensor,
    pub b: Tensor,
    pub ids: Tensor,
    pub dst: Tensor,
}

impl Descs {
    /// The dense matmul (`a`, `b`, `dst`, 2-D, as ggml's MUL_MAT) that this call of one expert,
    /// one slot per token and one activation row per token computes.
    pub fn as_dense(&self) -> [Tensor; 3] {
        assert_eq!([self.w.ne[2], self.ids.ne[0], self.b.ne[1]], [1, 1, 1]);
        let tokens = self.ids.ne[1];
        let two_d = |t: &Tensor| Tensor {
            ne: [t.ne[0], tokens, 1, 1],
            nb: [
                t.nb[0],
                t.nb[2],
                t.nb[2] * tokens as usize,
                t.nb[2] * tokens as usize,
            ],
            ..*t
        };
        [self.w, two_d(&self.b), two_d(&self.dst)]
    }
}

/// The single-caller entry point.
pub fn call(ctx: *mut ork_ctx, d: &Descs) -> ork_result {
    ork_mul_mat_id(ctx, &d.w.c(), &d.b.c(), &d.ids.c(), &d.dst.c())
}

/// The metadata check.
pub fn check(ctx: *mut ork_ctx, d: &Descs) -> ork_result {
    ork_mul_mat_id_check(ctx, &d.w.c(), &d.b.c(), &d.ids.c(), &d.dst.c())
}

unsafe extern "C" fn barrier_wait(arg: *mut c_void) {
    // SAFETY: `arg` is the `Barrier` that `call_mt` passes, alive until its threads are joined.
    unsafe { (*(arg as *const Barrier)).wait() };
}

/// The cooperative entry point on `nth` threads sharing a `std::sync::Barrier` through the C
/// callback; each thread's code and `ork_last_error`.
pub fn call_mt(ctx: *mut ork_ctx, d: &Descs, nth: usize) -> Vec<(ork_result, String)> {
    let (w, b, ids, dst) = (d.w, d.b, d.ids, d.dst);
    on_threads(ctx, nth, move |ctx, th| {
        ork_mul_mat_id_mt(ctx, &w.c(), &b.c(), &ids.c(), &dst.c(), th)
    })
}

/// `entry` on `nth` threads sharing a `std::sync::Barrier` through the C callback, each with its
/// `ork_threads`; each thread's code and `ork_last_error`.
pub fn on_threads(
    ctx: *mut ork_ctx,
    nth: usize,
    entry: impl Fn(*mut ork_ctx, &ork_threads) -> ork_result + Copy + Send,
) -> Vec<(ork_result, String)> {
    let barrier = Barrier::new(nth);
    let (ctx, barrier_addr) = (ctx as usize, &barrier as *const Barrier as usize);
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..nth)
            .map(|ith| {
                s.spawn(move || {
                    let th = ork_threads {
                        ith: ith as i32,
                        nth: nth as i32,
                        barrier: Some(barrier_wait),
                        barrier_arg: barrier_addr as *mut c_void,
                        scratch: std::ptr::null_mut(),
                        scratch_size: 0,
                    };
                    let rc = entry(ctx as *mut ork_ctx, &th);
                    (rc, last_error())
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

pub fn last_error() -> String {
    // SAFETY: ork_last_error returns a NUL-terminated string valid until the next failing call
    // on this thread.
    unsafe { std::ffi::CStr::from_ptr(ork_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A context with `min_rows` etc. set on top of the defaults (no environment involved: every
/// field the tests depend on is set).
pub fn context(backend: i32, min_rows: u32, min_rows_mode: u32, mt_mode: u32) -> *mut ork_ctx {
    // SAFETY: all zeroes is an ork_config (integers, floats and NULL strings).
    let mut cfg: ork_config = unsafe { std::mem::zeroed() };
    cfg.struct_size = size_of::<ork_config>() as u32;
    ork_config_default(&mut cfg);
    cfg.dispatch = ORK_DISPATCH_ALWAYS;
    cfg.backend = backend;
    cfg.core_mask = 7;
    cfg.cache_bytes = 64 << 20;
    cfg.min_rows = min_rows;
    cfg.min_rows_mode = min_rows_mode;
    cfg.n_threads = 0;
    cfg.cache_verify = ORK_CACHE_VERIFY_FULL;
    cfg.mt_mode = mt_mode;
    let ctx = ork_ctx_new(&cfg);
    assert!(!ctx.is_null(), "ork_ctx_new: {}", last_error());
    ctx
}

/// What an accepted call must write to one output element.
#[derive(Clone, Copy, Debug)]
pub struct Expected {
    /// Byte offset in dst's buffer.
    pub off: usize,
    /// Bits of the int8 path's result; `None` when the element's expert cannot be inflated (a
    /// NaN or infinite scale: the call is then `INVALID_ARGUMENT`).
    pub bits: Option<u32>,
    /// The f64 product of the dequantized weights and the activations.
    pub exact: f64,
    /// Largest distance from `exact` the int8 path may give.
    pub bound: f64,
}

/// Views of the buffers a call reads, at the descriptors' addresses (all inside the arenas).
pub struct Memory<'a> {
    pub w: &'a Arena,
    pub b: &'a Arena,
    pub ids: &'a Arena,
}

fn offset_in(arena: &Arena, addr: usize) -> usize {
    addr.checked_sub(arena.addr())
        .filter(|&o| o <= arena.bytes().len())
        .expect("descriptor data inside its arena")
}

/// One used expert: native int8 weights, channel scales, dequantized rows (`n × k`).
type Inflated = (Vec<i8>, Vec<f32>, Vec<f32>);

/// Every output element of a valid call: walks the descriptors itself. `ids` must be in range.
pub fn expected(d: &Descs, mem: &Memory) -> Vec<Expected> {
    let (ty, layout) = weight_format(d.w.ty).expect("a supported weight type and layout");
    let [k, n, n_expert] = [0, 1, 2].map(|i| d.w.ne[i] as usize);
    let [n_used, n_tokens] = [0, 1].map(|i| d.ids.ne[i] as usize);
    let b_rows = d.b.ne[1] as usize;
    let tiles = Tiles::RK3588;
    let (kp, np) = (tiles.pad(k), tiles.pad(n));
    let row_bytes = ty.row_bytes(k).unwrap();
    let (w0, b0, ids0) = (
        offset_in(mem.w, d.w.addr),
        offset_in(mem.b, d.b.addr),
        offset_in(mem.ids, d.ids.addr),
    );
    let row_stride = if n > 1 { d.w.nb[1] } else { row_bytes };
    let mut experts: Vec<Option<Option<Inflated>>> = vec![None; n_expert];
    let mut out = Vec::new();
    let mut x = vec![0f32; k];
    let mut q = vec![0i8; kp];
    for t in 0..n_tokens {
        for s in 0..n_used {
            let e = mem.ids.i32_at(ids0 + d.ids.at(s, t, 0));
            let e = usize::try_from(e)
                .ok()
                .filter(|&e| e < n_expert)
                .expect("id in range");
            let inflated = experts[e].get_or_insert_with(|| {
                let start = w0 + e * if n_expert > 1 { d.w.nb[2] } else { 0 };
                let bytes = &mem.w.bytes()[start..start + (n - 1) * row_stride + row_bytes];
                let w = ExpertWeights {
                    ty,
                    data: bytes,
                    row_stride,
                    n,
                    k,
                };
                let mut b8 = vec![0i8; tiles.b_len(kp, np)];
                let mut chan = vec![0f32; np];
                inflate_expert_in(layout, &w, &tiles, &mut b8, &mut chan).ok()?;
                // The dequantized rows from the plain blocks (repacked rows are packed).
                let mut plain = bytes.to_vec();
                if layout != Layout::Plain {
                    to_plain_with(Isa::Scalar, layout, &w, &mut plain).unwrap();
                }
                let mut wf = vec![0f32; n * k];
                for (r, row) in wf.chunks_exact_mut(k).enumerate() {
                    dequantize_row(ty, &plain[r * row_stride..r * row_stride + row_bytes], row)
                        .unwrap();
                }
                Some((b8, chan, wf))
            });
            let Some((b8, chan, wf)) = inflated else {
                out.extend((0..n).map(|c| Expected {
                    off: d.dst.at(c, s, t),
                    bits: None,
                    exact: f64::NAN,
                    bound: 0.0,
                }));
                continue;
            };
            let r = s % b_rows;
            for (i, v) in x.iter_mut().enumerate() {
                *v = mem.b.f32_at(b0 + d.b.at(i, r, t));
            }
            let sx = quantize_row(&x, &mut q);
            for c in 0..n {
                let (mut acc, mut exact) = (0i32, 0f64);
                let (mut w_abs, mut x_abs, mut prod_abs) = (0f64, 0f64, 0f64);
                for i in 0..k {
                    let w8 = b8[tiles.b_index(kp, c, i)];
                    acc += w8 as i32 * q[i] as i32;
                    let wv = wf[c * k + i] as f64;
                    exact += wv * x[i] as f64;
                    w_abs += (chan[c] as f64 * w8 as f64).abs();
                    x_abs += (x[i] as f64).abs();
                    prod_abs += (w8 as f64 * q[i] as f64).abs();
                }
                let y = acc as f32 * (sx * chan[c]);
                // |w − s_n·q8| ≤ s_n·(1 + 2⁻⁷) (the Q8_0 saturating case; 1/2 + 2⁻⁷ otherwise),
                // |x − s_x·q| ≤ s_x/2 (plus rounding), and the f32 products round twice.
                let steps = chan[c] as f64 * 1.01 * x_abs + sx as f64 * 0.51 * w_abs;
                let rounding = 4e-7 * prod_abs * (sx as f64 * chan[c] as f64) + 1e-30;
                out.push(Expected {
                    off: d.dst.at(c, s, t),
                    bits: Some(y.to_bits()),
                    exact,
                    bound: steps + rounding,
                });
            }
        }
    }
    out
}

/// Checks an accepted call's `dst` buffer: every element as expected (any NaN for a NaN), every
/// other byte the sentinel. Returns a description of the first difference.
pub fn check_dst(dst: &Arena, dst_addr: usize, want: &[Expected]) -> Result<(), String> {
    check_elements(dst, dst_addr, want, false)
}

/// Checks `dst` after a call that failed during the work: every element the sentinel or its
/// expected value, every other byte the sentinel.
pub fn check_old_or_final(dst: &Arena, dst_addr: usize, want: &[Expected]) -> Result<(), String> {
    check_elements(dst, dst_addr, want, true)
}

fn check_elements(
    dst: &Arena,
    dst_addr: usize,
    want: &[Expected],
    old_allowed: bool,
) -> Result<(), String> {
    let base = offset_in(dst, dst_addr);
    let mut element = vec![false; dst.bytes().len()];
    for e in want {
        let off = base + e.off;
        element[off..off + 4].fill(true);
        let got = dst.f32_at(off);
        if old_allowed && dst.bytes()[off..off + 4] == [SENTINEL; 4] {
            continue;
        }
        let Some(bits) = e.bits else {
            return Err(format!(
                "dst byte {}: {got}, of an expert that failed",
                e.off
            ));
        };
        let want = f32::from_bits(bits);
        if got.to_bits() != bits && !(got.is_nan() && want.is_nan()) {
            return Err(format!(
                "dst byte {}: {got} ({:#x}), expected {want} ({bits:#x})",
                e.off,
                got.to_bits(),
            ));
        }
        if got.is_finite() && (got as f64 - e.exact).abs() > e.bound {
            return Err(format!(
                "dst byte {}: {got} is {} from the f64 product {}, beyond {}",
                e.off,
                (got as f64 - e.exact).abs(),
                e.exact,
                e.bound
            ));
        }
    }
    match (0..element.len()).find(|&i| !element[i] && dst.bytes()[i] != SENTINEL) {
        Some(i) => Err(format!(
            "dst buffer byte {i}, outside the outputs, was written"
        )),
        None => Ok(()),
    }
}

/// A call with its own buffers.
pub struct Owned {
    pub d: Descs,
    pub w: Arena,
    pub b: Arena,
    pub ids: Arena,
    pub dst: Arena,
}

impl Owned {
    /// Contiguous tensors (dst rows padded by 8 bytes, so that writes between rows show) with
    /// random weights and activations; slot 0 of most tokens goes to expert 0 (a hot expert that
    /// cooperative calls split), ids of one token distinct when `n_used <= n_expert`.
    pub fn contiguous(ty: GgmlType, shape: [usize; 6], rng: &mut ork_moe::testutil::Rng) -> Owned {
        let [k, n, n_expert, n_used, n_tokens, b_rows] = shape;
        let row = ty.row_bytes(k).expect("K whole blocks");
        let mut w = Arena::new(row * n * n_expert);
        for e in 0..n_expert * n {
            let blocks = rng.blocks(ty, k / ty.block_elems(), 0.05);
            w.bytes_mut()[e * row..(e + 1) * row].copy_from_slice(&blocks);
        }
        let mut b = Arena::new(4 * k * b_rows * n_tokens);
        for i in 0..k * b_rows * n_tokens {
            b.put_f32(4 * i, rng.normal());
        }
        let mut ids = Arena::new(4 * n_used * n_tokens);
        for t in 0..n_tokens {
            let mut used = Vec::new();
            for s in 0..n_used {
                let mut e = if s == 0 && rng.below(4) != 0 {
                    0
                } else {
                    rng.below(n_expert)
                };
                while n_used <= n_expert && used.contains(&e) {
                    e = rng.below(n_expert);
                }
                used.push(e);
                ids.put_i32(4 * (t * n_used + s), e as i32);
            }
        }
        let dnb1 = 4 * n + 8;
        let dst = Arena::new(dnb1 * n_used * n_tokens);
        let d = Descs {
            w: Tensor {
                ty: ty.id(),
                ne: [k as i64, n as i64, n_expert as i64, 1],
                nb: [ty.block_bytes(), row, row * n, row * n * n_expert],
                addr: w.addr(),
            },
            b: Tensor {
                ty: 0,
                ne: [k as i64, b_rows as i64, n_tokens as i64, 1],
                nb: [4, 4 * k, 4 * k * b_rows, 4 * k * b_rows * n_tokens],
                addr: b.addr(),
            },
            ids: Tensor {
                ty: 26,
                ne: [n_used as i64, n_tokens as i64, 1, 1],
                nb: [4, 4 * n_used, 4 * n_used * n_tokens, 4 * n_used * n_tokens],
                addr: ids.addr(),
            },
            dst: Tensor {
                ty: 0,
                ne: [n as i64, n_used as i64, n_tokens as i64, 1],
                nb: [4, dnb1, dnb1 * n_used, dnb1 * n_used * n_tokens],
                addr: dst.addr(),
            },
        };
        Owned { d, w, b, ids, dst }
    }

    pub fn memory(&self) -> Memory<'_> {
        Memory {
            w: &self.w,
            b: &self.b,
            ids: &self.ids,
        }
    }
}

/// Two projections of one input (a MoE FFN's gate and up), for the pair entry points: `gate`'s
/// call, and `up`'s weights and `dst` over gate's `b` and `ids`.
pub struct Pair {
    pub gate: Owned,
    pub up: Owned,
}

impl Pair {
    /// Two contiguous calls of one shape (`Owned::contiguous`).
    pub fn contiguous(ty: GgmlType, shape: [usize; 6], rng: &mut ork_moe::testutil::Rng) -> Pair {
        Pair {
            gate: Owned::contiguous(ty, shape, rng),
            up: Owned::contiguous(ty, shape, rng),
        }
    }

    /// The up projection as the pair computes it.
    pub fn up_descs(&self) -> Descs {
        Descs {
            w: self.up.d.w,
            dst: self.up.d.dst,
            ..self.gate.d
        }
    }

    /// What each projection's `dst` must hold.
    pub fn expected(&self) -> [Vec<Expected>; 2] {
        let up = Memory {
            w: &self.up.w,
            ..self.gate.memory()
        };
        [
            expected(&self.gate.d, &self.gate.memory()),
            expected(&self.up_descs(), &up),
        ]
    }

    /// Both `dst` buffers back to the sentinel.
    pub fn clear(&mut self) {
        self.gate.dst.bytes_mut().fill(SENTINEL);
        self.up.dst.bytes_mut().fill(SENTINEL);
    }

    /// Checks both `dst` buffers against [`Pair::expected`].
    pub fn check(&self, want: &[Vec<Expected>; 2]) -> Result<(), String> {
        check_dst(&self.gate.dst, self.gate.d.dst.addr, &want[0])?;
        check_dst(&self.up.dst, self.up.d.dst.addr, &want[1])
    }

    /// The pair's descriptors: `as0`, `as1`, `b`, `ids`, `dst0`, `dst1`.
    pub fn descs(&self) -> [Tensor; 6] {
        let (g, u) = (&self.gate.d, &self.up.d);
        [g.w, u.w, g.b, g.ids, g.dst, u.dst]
    }

    /// The single-caller pair entry point.
    pub fn call(&self, ctx: *mut ork_ctx) -> ork_result {
        let [w0, w1, b, ids, d0, d1] = self.descs().map(|t| t.c());
        ork_mul_mat_id_pair(ctx, &w0, &w1, &b, &ids, &d0, &d1)
    }

    /// The cooperative pair entry point on `nth` threads.
    pub fn call_mt(&self, ctx: *mut ork_ctx, nth: usize) -> Vec<(ork_result, String)> {
        let t = self.descs();
        on_threads(ctx, nth, move |ctx, th| {
            let [w0, w1, b, ids, d0, d1] = t.map(|t| t.c());
            ork_mul_mat_id_pair_mt(ctx, &w0, &w1, &b, &ids, &d0, &d1, th)
        })
    }

    /// Announces the pair (`ork_prefetch`).
    pub fn announce(&self, ctx: *mut ork_ctx) -> ork_result {
        let [w0, w1, b, ids, d0, d1] = self.descs().map(|t| t.c());
        ork_prefetch(ctx, &w0, &w1, &b, &ids, &d0, &d1)
    }
}
