//! Random MUL_MAT_ID cases, valid and broken, with the codes their own reasons allow (worked out
//! by brute force over the elements, not by the library), and the check of one call against them.
//! Drawn from a seeded generator (the property test) or from fuzz input (the fuzz target).

use super::*;
use ork_moe::inflate::from_plain;
use ork_moe::moe::desc::weight_code;
use ork_moe::testutil::Rng;
use std::collections::BTreeSet;

/// Deepest K drawn, but for a few deep cases.
pub const MAX_K: usize = 1024;

/// A source of choices.
pub trait Draw {
    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: usize) -> usize;
    /// An activation value.
    fn normal(&mut self) -> f32;
    /// `n_blocks` blocks of `ty`.
    fn blocks(&mut self, ty: GgmlType, n_blocks: usize) -> Vec<u8>;
}

impl Draw for Rng {
    fn below(&mut self, n: usize) -> usize {
        Rng::below(self, n)
    }

    fn normal(&mut self) -> f32 {
        Rng::normal(self)
    }

    /// Valid blocks (finite scales, like real weights').
    fn blocks(&mut self, ty: GgmlType, n_blocks: usize) -> Vec<u8> {
        Rng::blocks(self, ty, n_blocks, 0.05)
    }
}

/// Why a case must not be OK, and the code that reason allows.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    Invalid(&'static str),
    Declined(&'static str),
    /// Shares bytes with dst, which the library may or may not be able to prove.
    MaybeInvalid(&'static str),
}

impl Reason {
    pub fn allows(&self, code: ork_result) -> bool {
        match self {
            Reason::Invalid(_) => code == ORK_INVALID_ARGUMENT,
            Reason::Declined(_) => code == ORK_NOT_HANDLED,
            Reason::MaybeInvalid(_) => code == ORK_INVALID_ARGUMENT || code == ORK_NOT_HANDLED,
        }
    }
}

/// Offsets of the `(count, stride)` lattice points.
fn offsets(dims: &[(usize, usize)]) -> Vec<usize> {
    dims.iter().fold(vec![0], |acc, &(count, stride)| {
        acc.iter()
            .flat_map(|&o| (0..count).map(move |i| o + i * stride))
            .collect()
    })
}

/// Whether runs of `len` bytes at `offsets` overlap one another.
fn runs_overlap(len: usize, mut offsets: Vec<usize>) -> bool {
    offsets.sort_unstable();
    offsets.windows(2).any(|w| w[1] - w[0] < len)
}

/// Every byte address covered by runs of `len` bytes at `base + offsets`.
fn bytes_of(base: usize, len: usize, offsets: &[usize]) -> BTreeSet<usize> {
    offsets
        .iter()
        .flat_map(|&o| base + o..base + o + len)
        .collect()
}

/// A random stride for a dimension whose natural one is `natural`: natural, padded, zero,
/// small, or anything up to a few times natural.
fn stride(rng: &mut impl Draw, natural: usize, unit: usize) -> usize {
    match rng.below(10) {
        0..=3 => natural,
        4..=6 => natural + unit * rng.below(4),
        7 => unit * rng.below(3),
        _ => unit * rng.below(3 * natural / unit + 2),
    }
}

pub struct Case {
    pub d: Descs,
    pub w: Arena,
    pub b: Arena,
    pub ids: Arena,
    pub dst: Arena,
    pub reasons: Vec<Reason>,
    pub bad_id: bool,
    /// Descriptors point at no real memory: only the check may be called... and the call, which
    /// must refuse before touching it.
    pub fake: bool,
    pub min_rows: u32,
    pub cpu_mode: bool,
}

/// A random case: a valid call in some layout, often broken on purpose in one way.
pub fn random_case(rng: &mut impl Draw) -> Case {
    // Half of the cases of a type ggml repacks, so that the repacked layouts keep their share
    // among all the types.
    let wt = if rng.below(2) == 0 {
        Layout::REPACKED[rng.below(Layout::REPACKED.len())].0
    } else {
        GgmlType::QUANTIZED[rng.below(GgmlType::QUANTIZED.len())]
    };
    // Mostly shallow, sometimes deep.
    let blocks = MAX_K / wt.block_elems();
    let depth = 1 + rng.below(blocks);
    let mut k = wt.block_elems() * (1 + rng.below(depth));
    if rng.below(48) == 0 {
        // Deeper than one device GEMM (10240 on the emulator, 8192 on the board's runtime).
        k = [8224usize, 10272, 14336, 16384][rng.below(4)].next_multiple_of(wt.block_elems());
    }
    let n = [1, 2, 5, 31, 32, 33, 64, 70][rng.below(8)];
    let n_expert = 1 + rng.below(6);
    let n_used = 1 + rng.below(4);
    let n_tokens = 1 + rng.below(9);
    let divisors: Vec<usize> = (1..=n_used).filter(|&d| n_used.is_multiple_of(d)).collect();
    let b_rows = divisors[rng.below(divisors.len())];
    let row_bytes = wt.row_bytes(k).unwrap();
    let mut reasons = Vec::new();

    // Weights: natural, padded, experts interleaved row by row, or random strides.
    let (mut w_nb1, mut w_nb2) = match rng.below(4) {
        0 => (row_bytes, n * row_bytes),
        1 => (n_expert * row_bytes, row_bytes),
        _ => {
            let nb1 = stride(rng, row_bytes, 1);
            (nb1, stride(rng, n * nb1.max(1), 1))
        }
    };
    if n == 1 && rng.below(2) == 0 {
        w_nb1 = 1 + rng.below(1000); // unused
    }
    if n_expert == 1 && rng.below(2) == 0 {
        w_nb2 = rng.below(100); // unused
    }
    let w_dims = [(n, w_nb1), (n_expert, w_nb2)];
    if runs_overlap(row_bytes, offsets(&w_dims)) {
        reasons.push(Reason::Declined("weight rows overlap"));
    }
    // Activations: natural, padded, permuted (tokens inner), broadcast with a junk nb[1], random.
    let kb = 4 * k;
    let (mut b_nb1, b_nb2) = match rng.below(4) {
        0 => (kb, b_rows * kb),
        1 => (kb * n_tokens + 4 * rng.below(3), kb + 4 * rng.below(3)),
        _ => {
            let nb1 = stride(rng, kb, 4);
            (nb1, stride(rng, b_rows * nb1.max(4), 4))
        }
    };
    if b_rows == 1 && rng.below(2) == 0 {
        b_nb1 = rng.below(1 << 20); // unused, odd or not
    }
    let b_dims = [(b_rows, b_nb1), (n_tokens, b_nb2)];
    if runs_overlap(kb, offsets(&b_dims)) {
        reasons.push(Reason::Declined("activation rows overlap"));
    }
    // ids: natural, transposed, or random (aliasing is harmless).
    let (ids_nb0, ids_nb1) = match rng.below(3) {
        0 => (4, 4 * n_used + 4 * rng.below(2)),
        1 => (4 * n_tokens, 4),
        _ => (4 * rng.below(n_tokens + 2), 4 * rng.below(2 * n_used + 2)),
    };
    // dst: natural, padded, permuted (tokens inner), or random.
    let nbytes = 4 * n;
    let (dst_nb1, dst_nb2) = match rng.below(4) {
        0 => (nbytes, n_used * nbytes),
        1 => (nbytes * n_tokens, nbytes),
        _ => {
            let nb1 = stride(rng, nbytes, 4);
            (nb1, stride(rng, n_used * nb1.max(4), 4))
        }
    };
    let dst_nb0 = if n == 1 { 4 * rng.below(3) } else { 4 };
    let dst_dims = [(n, dst_nb0), (n_used, dst_nb1), (n_tokens, dst_nb2)];
    if runs_overlap(4, offsets(&dst_dims)) {
        reasons.push(Reason::Invalid("dst elements overlap"));
    }

    let extent = |inner: usize, dims: &[(usize, usize)]| {
        inner + dims.iter().map(|&(c, s)| (c - 1) * s).sum::<usize>()
    };
    let mut w = Arena::new(extent(row_bytes, &w_dims) + rng.below(64));
    let mut b = Arena::new(extent(kb, &b_dims) + rng.below(64) + 4);
    let ids_dims = [(n_used, ids_nb0), (n_tokens, ids_nb1)];
    let mut ids = Arena::new(extent(4, &ids_dims) + rng.below(16) + 4);
    let dst = Arena::new(extent(4, &dst_dims) + rng.below(64) + 4);

    // Contents: data where the elements are, junk (NaN scales, NaN floats, out-of-range ids:
    // anything read from a gap shows) elsewhere.
    w.bytes_mut().fill(0xFF);
    for &o in &offsets(&w_dims) {
        let row = rng.blocks(wt, k / wt.block_elems());
        w.bytes_mut()[o..o + row_bytes].copy_from_slice(&row);
    }
    for i in (0..b.bytes().len() / 4 * 4).step_by(4) {
        b.put_f32(i, f32::NAN);
    }
    let zero_row = rng.below(5) == 0;
    for (ri, &o) in offsets(&b_dims).iter().enumerate() {
        for i in 0..k {
            let v = if zero_row && ri == 0 {
                0.0
            } else {
                rng.normal()
            };
            b.put_f32(o + 4 * i, v);
        }
    }
    for &o in &offsets(&ids_dims) {
        ids.put_i32(o, rng.below(n_expert) as i32);
    }

    let tensor = |ty: i32, ne: [usize; 3], nb: [usize; 3], addr: usize| Tensor {
        ty,
        ne: [ne[0] as i64, ne[1] as i64, ne[2] as i64, 1],
        nb: [nb[0], nb[1], nb[2], nb[2] * ne[2]],
        addr,
    };
    let mut d = Descs {
        w: tensor(
            wt.id(),
            [k, n, n_expert],
            [wt.block_bytes(), w_nb1, w_nb2],
            w.addr(),
        ),
        b: tensor(0, [k, b_rows, n_tokens], [4, b_nb1, b_nb2], b.addr()),
        ids: tensor(26, [n_used, n_tokens, 1], [ids_nb0, ids_nb1, 0], ids.addr()),
        dst: tensor(
            0,
            [n, n_used, n_tokens],
            [dst_nb0, dst_nb1, dst_nb2],
            dst.addr(),
        ),
    };
    let mut case = Case {
        d,
        w,
        b,
        ids,
        dst,
        reasons: Vec::new(),
        bad_id: false,
        fake: false,
        min_rows: [0, 0, 0, 1, 2, 3, 8, 64][rng.below(8)],
        cpu_mode: rng.below(3) == 0,
    };

    // One deliberate break, half of the time.
    let inv = Reason::Invalid;
    let dec = Reason::Declined;
    match rng.below(40) {
        0 => {
            d.w.ty = [30, 9999, 1, 0][rng.below(4)];
            reasons.push(dec("weight type not supported"));
        }
        1 => {
            d.b.ty = 1;
            reasons.push(dec("F16 activations"));
        }
        2 => {
            d.b.ne[0] += 32;
            reasons.push(inv("b.ne[0] != K"));
        }
        3 => {
            d.dst.ne[rng.below(3)] += 1;
            reasons.push(inv("dst.ne mismatch"));
        }
        4 => {
            d.ids.ne[1] += 1;
            reasons.push(inv("ids.ne[1] != n_tokens"));
        }
        5 if n_used > 1 => {
            d.b.ne[1] = n_used as i64 + 1;
            reasons.push(inv("b.ne[1] does not divide n_used"));
        }
        6 => {
            let t = rng.below(4);
            [&mut d.w, &mut d.b, &mut d.ids, &mut d.dst][t].ne[rng.below(4)] =
                -(rng.below(2) as i64);
            reasons.push(inv("a dimension below 1"));
        }
        7 => {
            [&mut d.w, &mut d.b, &mut d.ids, &mut d.dst][rng.below(4)].ne[3] = 2;
            reasons.push(inv("4-D"));
        }
        8 => {
            d.w.ne[0] += 16;
            d.b.ne[0] += 16;
            reasons.push(inv("K not whole blocks"));
        }
        9 => {
            [&mut d.w, &mut d.b, &mut d.ids, &mut d.dst][rng.below(4)].addr = 0;
            reasons.push(inv("NULL data"));
        }
        10 if n_used * n_tokens > 1 => {
            // Two outputs on one element: equal strides, or rows shorter than N.
            if n_used > 1 && n_tokens > 1 && rng.below(2) == 0 {
                d.dst.nb[2] = d.dst.nb[1];
            } else if n > 1 {
                let dim = if n_used > 1 { 1 } else { 2 };
                d.dst.nb[dim] = 4 * rng.below(n);
            } else {
                let dim = if n_used > 1 { 1 } else { 2 };
                d.dst.nb[dim] = 0;
            }
            reasons.push(inv("dst elements overlap (forced)"));
        }
        11 => {
            d.dst.addr = d.b.addr;
            reasons.push(inv("dst starts where b does"));
        }
        12 => {
            // dst somewhere inside b's buffer, when it fits: whether it shares bytes decides.
            let dst_len = case.dst.bytes().len();
            // (Only kept when it does one or the other: an accepted call would write b's buffer.)
            if let Some(room) = case.b.bytes().len().checked_sub(dst_len) {
                let addr = case.b.addr() + rng.below(room / 4 + 1) * 4;
                let dst_bytes = bytes_of(addr, 4, &offsets(&dst_dims));
                let b_bytes = bytes_of(case.b.addr(), kb, &offsets(&b_dims));
                let b_extent = case.b.addr()..case.b.addr() + extent(kb, &b_dims);
                let d_extent = addr..addr + extent(4, &dst_dims);
                if !dst_bytes.is_disjoint(&b_bytes) {
                    reasons.push(Reason::MaybeInvalid("dst shares bytes with b"));
                    d.dst.addr = addr;
                } else if b_extent.start < d_extent.end && d_extent.start < b_extent.end {
                    reasons.push(dec("dst interleaves with b"));
                    d.dst.addr = addr;
                }
            }
        }
        13 => {
            d.w.nb[0] += 2;
            reasons.push(dec("as.nb[0] not the block size"));
        }
        14 => {
            d.b.nb[0] = 8;
            reasons.push(dec("b.nb[0] != 4"));
        }
        15 => {
            d.b.addr += 2;
            reasons.push(dec("b misaligned"));
        }
        16 if n > 1 => {
            d.dst.nb[0] = 8;
            reasons.retain(|r| r != &inv("dst elements overlap"));
            if runs_overlap(
                4,
                offsets(&[(n, 8), (n_used, dst_nb1), (n_tokens, dst_nb2)]),
            ) {
                reasons.push(Reason::MaybeInvalid("dst elements overlap"));
            } else {
                reasons.push(dec("dst.nb[0] != 4"));
            }
        }
        17 => {
            // Sizes past the address space, on memory that does not exist.
            d.w.ne[2] = 1 << 40;
            d.w.nb[2] = 1 << 40;
            case.fake = true;
            reasons.push(inv("overflowing as"));
        }
        18 => {
            d.b.ne[2] = i64::MAX;
            d.ids.ne[1] = i64::MAX;
            d.dst.ne[2] = i64::MAX;
            case.fake = true;
            reasons.push(inv("overflowing token count"));
        }
        19 => {
            let o = offsets(&ids_dims)[rng.below(n_used * n_tokens)];
            case.ids
                .put_i32(o, [-1, n_expert as i32, i32::MAX][rng.below(3)]);
            case.bad_id = true;
        }
        20 if n_tokens > 1 => {
            // dst wholly in a gap of b, between token 0's rows and token 1's: apart, interleaved.
            let token_span = extent(kb, &b_dims[..1]);
            d.b.nb[2] = token_span + extent(4, &dst_dims).next_multiple_of(4);
            d.dst.addr = d.b.addr + token_span;
            case.fake = true;
            reasons.push(dec("dst interleaves with b"));
            // b's extent is now past its buffer: dst there may lie on the weights' or ids'.
            let d_extent = d.dst.addr..d.dst.addr + extent(4, &dst_dims);
            let real =
                |a: &Arena| a.addr() < d_extent.end && d_extent.start < a.addr() + a.bytes().len();
            if real(&case.w) || real(&case.ids) {
                reasons.push(Reason::MaybeInvalid("dst on another tensor's buffer"));
            }
        }
        21 => {
            // The experts in one of ggml-cpu's repacks of this type: whole groups of packed rows
            // are the same call, anything else is not a tensor ggml repacks.
            let layouts: Vec<Layout> = Layout::REPACKED
                .iter()
                .filter(|&&(ty, _)| ty == wt)
                .map(|&(_, layout)| layout)
                .collect();
            if !layouts.is_empty() {
                let layout = layouts[rng.below(layouts.len())];
                d.w.ty = weight_code(wt, layout);
                if !n.is_multiple_of(layout.rows()) {
                    reasons.push(inv("repacked rows not whole groups"));
                } else if w_nb1 != row_bytes {
                    reasons.push(inv("repacked rows not packed"));
                } else {
                    repack(&mut case.w, layout, wt, k, n, (n_expert, w_nb2));
                }
            }
        }
        _ => {}
    }
    // A 4th-dimension stride is never used, whatever it is.
    for t in [&mut d.w, &mut d.b, &mut d.ids, &mut d.dst] {
        if rng.below(4) == 0 {
            t.nb[3] = rng.below(7);
        }
    }
    let rows = n_used * n_tokens;
    let per_expert = rows.div_ceil(n_expert.min(rows));
    if per_expert < case.min_rows as usize && !case.cpu_mode {
        reasons.push(dec("below min_rows"));
    }
    case.d = d;
    case.reasons = reasons;
    case
}

/// Rewrites the `n_expert` experts (`nb2` bytes apart) of `n` packed rows of `k` weights of `ty`
/// in `w` into `layout`, one expert after the other (overlapping experts end up as junk, which a
/// call must not read: such rows are declined).
fn repack(
    w: &mut Arena,
    layout: Layout,
    ty: GgmlType,
    k: usize,
    n: usize,
    (n_expert, nb2): (usize, usize),
) {
    let len = n * ty.row_bytes(k).unwrap();
    for e in 0..n_expert {
        let at = if n_expert > 1 { e * nb2 } else { 0 };
        let plain = w.bytes()[at..at + len].to_vec();
        let expert = ExpertWeights {
            ty,
            data: &plain,
            row_stride: len / n,
            n,
            k,
        };
        from_plain(layout, &expert, &mut w.bytes_mut()[at..at + len]).unwrap();
    }
}

/// Which entry point a case goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    Single,
    /// `ork_mul_mat_id_mt` on this many threads (coop or leader, as the context says).
    Threads(usize),
}

/// Runs `case` on `ctx` (configured with the case's `min_rows` and mode) and checks it:
/// the check's code is one the reasons allow, the call's code is the check's (out-of-range ids
/// and NaN/Inf weight scales, which only the call sees, make it `INVALID_ARGUMENT`), inputs never
/// change, a refused call leaves `dst` untouched, a failed one old-or-final, an accepted one
/// exact; and an accepted call repeated on the same context gives the same bytes. Returns the
/// call's code.
pub fn run_case(ctx: *mut ork_ctx, c: &mut Case, entry: Entry) -> Result<ork_result, String> {
    let what = format!("{:?}, reasons {:?}, {entry:?}", c.d, c.reasons);
    let checked = check(ctx, &c.d);
    let msg = last_error();
    let allowed = if c.reasons.is_empty() {
        checked == ORK_OK
    } else {
        c.reasons.iter().any(|r| r.allows(checked))
    };
    if !allowed {
        return Err(format!("{what}: check gave {checked} ({msg})"));
    }
    // Only now may the call touch memory: the check accepted exactly what it should.
    let want = if checked == ORK_OK {
        let exp = expected_or_bad_id(c);
        exp.as_ref()
            .map(|e| (e.iter().any(|x| x.bits.is_none()), e.clone()))
    } else {
        None
    };
    let before = [&c.w, &c.b, &c.ids, &c.dst].map(|a| a.bytes().to_vec());
    let codes: Vec<(ork_result, String)> = match entry {
        Entry::Single => vec![(call(ctx, &c.d), last_error())],
        Entry::Threads(nth) => call_mt(ctx, &c.d, nth),
    };
    let want_code = match (&want, checked) {
        (_, code) if code != ORK_OK => code,
        (Some((false, _)), _) => ORK_OK,
        _ => ORK_INVALID_ARGUMENT,
    };
    for (rc, m) in &codes {
        if *rc != want_code {
            return Err(format!(
                "{what}: call gave {rc} ({m}), expected {want_code}"
            ));
        }
    }
    let after = [&c.w, &c.b, &c.ids, &c.dst].map(|a| a.bytes().to_vec());
    if before[..3] != after[..3] {
        return Err(format!("{what}: an input buffer changed"));
    }
    match want {
        None if before[3] != after[3] => Err(format!("{what}: refused, yet dst changed")),
        None => Ok(want_code),
        Some((true, exp)) => check_old_or_final(&c.dst, c.d.dst.addr, &exp)
            .map(|_| want_code)
            .map_err(|e| format!("{what}: bad weight scale: {e}")),
        Some((false, exp)) => {
            assert!(!c.fake, "{what}: accepted on memory that does not exist");
            check_dst(&c.dst, c.d.dst.addr, &exp).map_err(|e| format!("{what}: {e}"))?;
            c.dst.bytes_mut().fill(SENTINEL);
            if call(ctx, &c.d) != ORK_OK {
                return Err(format!("{what}: rerun failed: {}", last_error()));
            }
            check_dst(&c.dst, c.d.dst.addr, &exp).map_err(|e| format!("{what}: rerun: {e}"))?;
            Ok(want_code)
        }
    }
}

/// The expected outputs, or `None` when an id is out of range.
fn expected_or_bad_id(c: &Case) -> Option<Vec<Expected>> {
    if c.bad_id {
        return None;
    }
    let mem = Memory {
        w: &c.w,
        b: &c.b,
        ids: &c.ids,
    };
    Some(expected(&c.d, &mem))
}
