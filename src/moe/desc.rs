//! Tensor descriptors and their validation into a [`Problem`], from metadata only.
//!
//! Everything that decides accept / decline / reject is here and reads no tensor data, so every one
//! of ggml's threads reaches the same answer. The byte extents computed here (overflow-checked) are
//! what the C boundary turns into slices; nothing outside them is ever touched.

use super::{Error, ErrorKind};
use crate::inflate::Layout;
use crate::quant::GgmlType;

/// ggml's `GGML_TYPE_I32`.
pub const GGML_TYPE_I32: i32 = 26;

/// A weight descriptor's `type` code names its layout too (`include/ork_moe.h`): ggml's type id
/// in the low 16 bits, a repacked layout's rows per group from this bit ...
pub const LAYOUT_ROWS_SHIFT: u32 = 16;
/// ... and its bytes per chunk from this one; nothing above the type id means plain blocks.
pub const LAYOUT_CHUNK_SHIFT: u32 = 24;

/// The `type` code of weights of `ty` stored in `layout`.
pub fn weight_code(ty: GgmlType, layout: Layout) -> i32 {
    match layout {
        Layout::Plain => ty.id(),
        Layout::Repacked { rows, chunk } => {
            ty.id() | ((rows as i32) << LAYOUT_ROWS_SHIFT) | ((chunk as i32) << LAYOUT_CHUNK_SHIFT)
        }
    }
}

/// The weight type and layout a weight `type` code names, if the library reads that pair: plain
/// blocks of a type it inflates, or one of [`Layout::REPACKED`]. Any other code, among them
/// layouts a later ggml may add, is `None` and declined.
pub fn weight_format(code: i32) -> Option<(GgmlType, Layout)> {
    let code = u32::try_from(code).ok()?;
    let ty = GgmlType::from_id((code & 0xffff) as i32)?;
    let (rows, chunk) = (
        (code >> LAYOUT_ROWS_SHIFT) & 0xff,
        code >> LAYOUT_CHUNK_SHIFT,
    );
    let layout = match (rows, chunk) {
        (0, 0) => Layout::Plain,
        _ => Layout::Repacked {
            rows: rows as usize,
            chunk: chunk as usize,
        },
    };
    layout.supports(ty).then_some((ty, layout))
}

/// The deepest K taken: int8 products (|a·b| <= 127·127) summed in int32 cannot overflow up to
/// 2^31 / 127² ≈ 133 000; devices take less per GEMM and the engine sums depth segments.
pub const MAX_K: usize = 1 << 17;

/// One tensor as ggml describes it. `addr` is the data pointer as a number: validation needs it
/// only for alignment and overlap checks.
#[derive(Clone, Copy, Debug)]
pub struct TensorDesc<'a> {
    pub ty: i32,
    pub ne: [i64; 4],
    pub nb: [usize; 4],
    pub addr: usize,
    pub name: Option<&'a str>,
}

/// A validated MUL_MAT_ID call. Strides of f32 / i32 tensors are in elements; the stride of a
/// dimension of size 1 is never used and is 0 here, whatever the descriptor said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub wtype: GgmlType,
    /// How the experts' blocks are arranged (plain rows, or one of ggml-cpu's repacks).
    pub layout: Layout,
    /// Depth (`as.ne[0]`).
    pub k: usize,
    /// Output channels per expert (`as.ne[1]`).
    pub n: usize,
    pub n_expert: usize,
    /// Slots per token (`ids.ne[0]`).
    pub n_used: usize,
    pub n_tokens: usize,
    /// Activation rows per token (`b.ne[1]`): 1 = broadcast to all slots, else slot `s` reads row
    /// `s % b_rows`.
    pub b_rows: usize,
    /// Bytes of one weight row, and the row / expert strides of `as` in bytes (`w_nb1` is the row
    /// size when there is one row).
    pub w_row_bytes: usize,
    pub w_nb1: usize,
    pub w_nb2: usize,
    pub b_s1: usize,
    pub b_s2: usize,
    pub ids_s0: usize,
    pub ids_s1: usize,
    pub dst_s1: usize,
    pub dst_s2: usize,
    /// Bytes from each data pointer to the end of its last element.
    pub w_extent: usize,
    pub b_extent: usize,
    pub ids_extent: usize,
    pub dst_extent: usize,
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

fn declined(msg: String) -> Error {
    Error::new(ErrorKind::NotHandled, msg)
}

fn overflow(what: &str) -> Error {
    invalid(format!("{what}: the tensor's byte size overflows"))
}

/// Bytes spanned by a tensor whose innermost run is `inner` bytes, with `(count, stride)` for each
/// outer dimension; `None` on overflow or when it exceeds what a slice may span.
fn extent(inner: usize, outer: &[(usize, usize)]) -> Option<usize> {
    let mut end = inner;
    for &(count, stride) in outer {
        end = end.checked_add(count.checked_sub(1)?.checked_mul(stride)?)?;
    }
    (end <= isize::MAX as usize).then_some(end)
}

fn dims(t: &TensorDesc, what: &str) -> Result<[usize; 4], Error> {
    let mut d = [0usize; 4];
    for (i, &e) in t.ne.iter().enumerate() {
        if e <= 0 {
            return Err(invalid(format!(
                "{what}: ne[{i}] = {e}; every dimension must be at least 1"
            )));
        }
        d[i] = usize::try_from(e).map_err(|_| overflow(what))?;
    }
    if d[3] != 1 {
        return Err(invalid(format!(
            "{what}: ne[3] = {} but MUL_MAT_ID tensors are at most 3-D",
            d[3]
        )));
    }
    Ok(d)
}

/// The byte strides of `t` that are used: those of dimensions of size 1 are 0.
fn used_strides(t: &TensorDesc, d: &[usize; 4]) -> [usize; 3] {
    std::array::from_fn(|i| if d[i] > 1 { t.nb[i] } else { 0 })
}

/// Strides in 4-byte elements, or `None` when the data or a stride is not whole aligned elements
/// (a layout ggml's own path handles and this one declines).
fn elem_strides(addr: usize, nb: [usize; 3]) -> Option<[usize; 3]> {
    let aligned = addr.is_multiple_of(4) && nb.iter().all(|s| s.is_multiple_of(4));
    aligned.then(|| nb.map(|s| s / 4))
}

/// Steps of the exact search in [`disjoint_runs`] beyond which it gives up (a few µs).
const SEARCH_STEPS: usize = 1 << 14;

/// Whether the runs `[o, o + inner)` at the offsets `o = i·s + j·t` (`i < e`, `j < f`, with
/// `dims = [(e, s), (f, t)]`) are pairwise disjoint; `None` when that is not decided within
/// [`SEARCH_STEPS`] steps.
///
/// Two runs meet iff their offsets differ by less than `inner`, i.e. iff some `(i, j) ≠ (0, 0)`
/// with `|i| < e`, `|j| < f` has `|i·s + j·t| < inner`. A dimension whose stride is below `inner`
/// meets at its first step; if the larger stride steps over the whole span of the smaller
/// dimension (every contiguous, padded or permuted layout), nothing meets; otherwise, for each
/// `j` of the shorter dimension, `|i·s + j·t|` is convex in `i`, so the nearest `i` (clamped to
/// its range) decides. Sound and complete; only the search is bounded.
fn disjoint_runs(inner: usize, dims: [(usize, usize); 2]) -> Option<bool> {
    let inner = inner as u128;
    let [a, b] = dims.map(|(count, stride)| (count as u128, stride as u128));
    let used = |(count, _): (u128, u128)| count > 1;
    if [a, b].into_iter().any(|d| used(d) && d.1 < inner) {
        return Some(false);
    }
    if !(used(a) && used(b)) {
        return Some(true);
    }
    let ((e_small, s_small), (e_big, s_big)) = if a.1 <= b.1 { (a, b) } else { (b, a) };
    if s_big >= (e_small - 1) * s_small + inner {
        return Some(true);
    }
    let ((e_loop, s_loop), (e_free, s_free)) = if e_small <= e_big {
        ((e_small, s_small), (e_big, s_big))
    } else {
        ((e_big, s_big), (e_small, s_small))
    };
    if e_loop - 1 > SEARCH_STEPS as u128 {
        return None;
    }
    let (s_free, lim, inner) = (s_free as i128, e_free as i128 - 1, inner as i128);
    for j in 1..e_loop as i128 {
        let x = j * s_loop as i128;
        let q = x.div_euclid(s_free);
        for i in [-q, -q - 1] {
            if (i.clamp(-lim, lim) * s_free + x).abs() < inner {
                return Some(false);
            }
        }
    }
    Some(true)
}

/// Whether every byte of `[0, extent)` belongs to one of the runs `[o, o + inner)` (offsets as in
/// [`disjoint_runs`]): a contiguous tensor.
fn dense(inner: usize, dims: [(usize, usize); 2]) -> bool {
    let [a, b] = dims;
    let by_stride = if a.1 <= b.1 { [a, b] } else { [b, a] };
    let mut span = inner;
    for (count, stride) in by_stride.into_iter().filter(|&(c, _)| c > 1) {
        if stride != span {
            return false;
        }
        span = span.saturating_mul(count);
    }
    true
}

/// One tensor's memory as the overlap checks see it: `[addr, addr + extent)`, made of runs of
/// `inner` bytes (the first at `addr`, the last ending at `addr + extent`).
struct Span {
    addr: usize,
    extent: usize,
    inner: usize,
    dense: bool,
}

impl Span {
    fn meets(&self, lo: usize, len: usize) -> bool {
        lo < self.addr + self.extent && self.addr < lo + len
    }

    /// The first and the last run: always element bytes.
    fn end_runs(&self) -> [(usize, usize); 2] {
        [
            (self.addr, self.inner),
            (self.addr + self.extent - self.inner, self.inner),
        ]
    }

    /// `Some(true)` when the two tensors certainly share a byte, `Some(false)` when their extents
    /// are apart, `None` when the extents interleave and sharing is not proven. Proofs: an end run
    /// of one meets an end run of the other, or lies in the extent of the other when that one is
    /// dense.
    fn shares_bytes(&self, other: &Span) -> Option<bool> {
        if !self.meets(other.addr, other.extent) {
            return Some(false);
        }
        let run_in = |run: (usize, usize), t: &Span| {
            (t.dense && t.meets(run.0, run.1))
                || t.end_runs()
                    .iter()
                    .any(|&(lo, len)| run.0 < lo + len && lo < run.0 + run.1)
        };
        let proven = self.end_runs().iter().any(|&r| run_in(r, other))
            || other.end_runs().iter().any(|&r| run_in(r, self));
        proven.then_some(true)
    }
}

/// Validates the four descriptors of `dst = mul_mat_id(as, b, ids)`.
///
/// Err(InvalidArgument) only for calls that are invalid: mismatched shapes, NULL data, sizes that
/// overflow, `dst` elements that really overlap each other or an input. Err(NotHandled) for valid
/// calls this library does not take (weight type, F16 activations, layouts its kernels do not
/// read, overlaps it cannot rule out cheaply).
pub fn validate(
    w: &TensorDesc,
    b: &TensorDesc,
    ids: &TensorDesc,
    dst: &TensorDesc,
) -> Result<Problem, Error> {
    for (t, what) in [(w, "as"), (b, "b"), (ids, "ids"), (dst, "dst")] {
        if t.ty < 0 {
            return Err(invalid(format!(
                "{what}: type id {} is not a ggml type",
                t.ty
            )));
        }
    }
    if ids.ty != GGML_TYPE_I32 {
        return Err(invalid(format!(
            "ids: type id {} but ids must be I32 ({GGML_TYPE_I32})",
            ids.ty
        )));
    }
    if dst.ty != GgmlType::F32.id() {
        return Err(invalid(format!(
            "dst: type id {} but dst must be F32 (0)",
            dst.ty
        )));
    }
    let wd = dims(w, "as")?;
    let bd = dims(b, "b")?;
    let idd = dims(ids, "ids")?;
    let dd = dims(dst, "dst")?;
    let [k, n, n_expert, _] = wd;
    let [n_used, n_tokens, ..] = idd;
    let b_rows = bd[1];
    if idd[2] != 1 {
        return Err(invalid(format!("ids: ne[2] = {} but ids is 2-D", idd[2])));
    }
    if bd[0] != k {
        return Err(invalid(format!("b: ne[0] = {} but as has K = {k}", bd[0])));
    }
    if bd[2] != n_tokens {
        return Err(invalid(format!(
            "b: ne[2] = {} tokens but ids has {n_tokens}",
            bd[2]
        )));
    }
    if n_used % b_rows != 0 {
        return Err(invalid(format!(
            "b: ne[1] = {b_rows} does not divide the {n_used} slots of ids"
        )));
    }
    if dd[..3] != [n, n_used, n_tokens] {
        return Err(invalid(format!(
            "dst: ne = [{}, {}, {}] but the result is [{n}, {n_used}, {n_tokens}]",
            dd[0], dd[1], dd[2]
        )));
    }
    for (t, what) in [(w, "as"), (b, "b"), (ids, "ids"), (dst, "dst")] {
        if t.addr == 0 {
            return Err(invalid(format!("{what}: data is NULL")));
        }
    }

    let Some((wtype, layout)) = weight_format(w.ty) else {
        let (rows, chunk) = (
            (w.ty >> LAYOUT_ROWS_SHIFT) & 0xff,
            w.ty >> LAYOUT_CHUNK_SHIFT,
        );
        return Err(declined(if (rows, chunk) == (0, 0) {
            format!("as: weight type id {} is not supported", w.ty)
        } else {
            format!(
                "as: type code {:#x} (ggml type {} in a {rows}x{chunk} repacked layout) is not \
                 supported",
                w.ty,
                w.ty & 0xffff
            )
        }));
    };
    if b.ty != GgmlType::F32.id() {
        return Err(declined(format!(
            "b: type id {} (only F32 activations are taken)",
            b.ty
        )));
    }
    let Some(w_row_bytes) = wtype.row_bytes(k) else {
        return Err(invalid(format!(
            "as: K = {k} is not a multiple of {}'s block size {}",
            wtype.name(),
            wtype.block_elems()
        )));
    };

    if k > MAX_K {
        return Err(declined(format!(
            "as: K = {k} exceeds {MAX_K}, beyond which int8 products could overflow int32 sums"
        )));
    }

    // Rows are read as contiguous runs of blocks / floats; the extents below assume it.
    if w.nb[0] != wtype.block_bytes() {
        return Err(declined(format!(
            "as: nb[0] = {} is not {}'s block size {}",
            w.nb[0],
            wtype.name(),
            wtype.block_bytes()
        )));
    }
    if b.nb[0] != 4 {
        return Err(declined(format!(
            "b: nb[0] = {}: activation rows are not contiguous",
            b.nb[0]
        )));
    }
    // ggml repacks whole row groups of packed rows only; anything else is not such a tensor.
    if let Layout::Repacked { rows, .. } = layout {
        if !n.is_multiple_of(rows) {
            return Err(invalid(format!(
                "as: ne[1] = {n} rows do not split into the {rows}-row groups of {}",
                layout.name(wtype)
            )));
        }
        if w.nb[1] != w_row_bytes {
            return Err(invalid(format!(
                "as: nb[1] = {} but {} rows are packed plain rows of {w_row_bytes} bytes",
                w.nb[1],
                layout.name(wtype)
            )));
        }
    }

    // Byte extents: a size that overflows is invalid whatever the layout.
    let [_, w_nb1, w_nb2] = used_strides(w, &wd);
    let b_nb = used_strides(b, &bd);
    let ids_nb = used_strides(ids, &idd);
    let dst_nb = used_strides(dst, &dd);
    let w_dims = [(n, w_nb1), (n_expert, w_nb2)];
    let b_row_bytes = k.checked_mul(4).ok_or_else(|| overflow("b"))?;
    let b_dims = [(b_rows, b_nb[1]), (n_tokens, b_nb[2])];
    let ids_dims = [(n_used, ids_nb[0]), (n_tokens, ids_nb[1])];
    let dst_row_bytes = n.checked_mul(4).ok_or_else(|| overflow("dst"))?;
    let dst_dims = [(n_used, dst_nb[1]), (n_tokens, dst_nb[2])];
    let w_extent = extent(w_row_bytes, &w_dims).ok_or_else(|| overflow("as"))?;
    let b_extent = extent(b_row_bytes, &b_dims).ok_or_else(|| overflow("b"))?;
    let ids_extent = extent(4, &ids_dims).ok_or_else(|| overflow("ids"))?;
    let dst_extent = extent(dst_row_bytes, &dst_dims).ok_or_else(|| overflow("dst"))?;
    for (t, len, what) in [
        (w, w_extent, "as"),
        (b, b_extent, "b"),
        (ids, ids_extent, "ids"),
        (dst, dst_extent, "dst"),
    ] {
        if t.addr.checked_add(len).is_none() {
            return Err(overflow(what));
        }
    }

    // dst: every output element distinct memory, apart from the inputs.
    if dst_nb[0] != 4 && n > 1 {
        return Err(if dst_nb[0] < 4 {
            invalid(format!("dst: nb[0] = {} makes outputs overlap", dst.nb[0]))
        } else {
            declined(format!(
                "dst: nb[0] = {}: output rows are not contiguous",
                dst.nb[0]
            ))
        });
    }
    match disjoint_runs(dst_row_bytes, dst_dims) {
        Some(true) => {}
        Some(false) => {
            return Err(invalid(format!(
                "dst: strides nb[1] = {}, nb[2] = {} make outputs overlap",
                dst.nb[1], dst.nb[2]
            )))
        }
        None => {
            return Err(declined(format!(
                "dst: strides nb[1] = {}, nb[2] = {} interleave rows too finely to check cheaply",
                dst.nb[1], dst.nb[2]
            )))
        }
    }
    let span = |t: &TensorDesc, extent, inner, dims| Span {
        addr: t.addr,
        extent,
        inner,
        dense: dense(inner, dims),
    };
    let dst_span = span(dst, dst_extent, dst_row_bytes, dst_dims);
    for (input, what) in [
        (span(w, w_extent, w_row_bytes, w_dims), "as"),
        (span(b, b_extent, b_row_bytes, b_dims), "b"),
        (span(ids, ids_extent, 4, ids_dims), "ids"),
    ] {
        match dst_span.shares_bytes(&input) {
            Some(false) => {}
            Some(true) => return Err(invalid(format!("dst overlaps {what}"))),
            // The engine views each tensor as one slice, so interleaved extents are not taken.
            None => {
                return Err(declined(format!(
                    "dst and {what} interleave in memory: left to the caller"
                )))
            }
        }
    }

    // Distinct weight and activation rows bound the engine's own allocations (routing counts per
    // expert, quantized rows) by memory the caller really has; overlapping ones are views that
    // ggml's own path reads as well.
    if disjoint_runs(w_row_bytes, w_dims) != Some(true) {
        return Err(declined(format!(
            "as: strides nb[1] = {}, nb[2] = {} make weight rows overlap: left to the caller",
            w.nb[1], w.nb[2]
        )));
    }
    if disjoint_runs(b_row_bytes, b_dims) != Some(true) {
        return Err(declined(format!(
            "b: strides nb[1] = {}, nb[2] = {} make activation rows overlap (a broadcast view): \
             left to the caller",
            b.nb[1], b.nb[2]
        )));
    }
    let (Some(bs), Some(is), Some(ds)) = (
        elem_strides(b.addr, b_nb),
        elem_strides(ids.addr, ids_nb),
        elem_strides(dst.addr, dst_nb),
    ) else {
        return Err(declined(
            "b/ids/dst: data or strides are not whole aligned 4-byte elements".into(),
        ));
    };
    Ok(Problem {
        wtype,
        layout,
        k,
        n,
        n_expert,
        n_used,
        n_tokens,
        b_rows,
        w_row_bytes,
        w_nb1: if n > 1 { w_nb1 } else { w_row_bytes },
        w_nb2,
        b_s1: bs[1],
        b_s2: bs[2],
        ids_s0: is[0],
        ids_s1: is[1],
        dst_s1: ds[1],
        dst_s2: ds[2],
        w_extent,
        b_extent,
        ids_extent,
        dst_extent,
    })
}

/// The expert id every token of a dense call routes to: [`dense_as_mul_mat_id`]'s `ids` reads this
/// one element for every token (stride 0).
pub static DENSE_IDS: [i32; 1] = [0];

/// A dense matmul, ggml's `MUL_MAT` of a weight matrix (`dst = w^T · b`: `w` [K, N], `b` [K, T]
/// f32, `dst` [N, T] f32), as the `MUL_MAT_ID` call that computes it: one expert, one slot per
/// token, every token routed to the expert through an `ids` of stride 0 over [`DENSE_IDS`]. So a
/// dense call is validated, planned, cached and run exactly as a routed one; [`validate`] checks
/// the rest. Batched (3-D or 4-D) operands are declined: ggml's own path broadcasts them.
pub fn dense_as_mul_mat_id<'a>(
    w: &TensorDesc<'a>,
    b: &TensorDesc<'a>,
    dst: &TensorDesc<'a>,
) -> Result<[TensorDesc<'a>; 4], Error> {
    for (t, what) in [(w, "as"), (b, "b"), (dst, "dst")] {
        if let Some(i) = (0..4).find(|&i| t.ne[i] <= 0) {
            return Err(invalid(format!(
                "{what}: ne[{i}] = {}; every dimension must be at least 1",
                t.ne[i]
            )));
        }
        if t.ne[2..] != [1, 1] {
            return Err(declined(format!(
                "{what}: ne = {:?}: a batched matmul is left to the caller",
                t.ne
            )));
        }
    }
    if dst.ne[..2] != [w.ne[1], b.ne[1]] {
        return Err(invalid(format!(
            "dst: ne = [{}, {}] but the result is [{}, {}]",
            dst.ne[0], dst.ne[1], w.ne[1], b.ne[1]
        )));
    }
    let tokens = b.ne[1];
    let per_token = |t: &TensorDesc<'a>| TensorDesc {
        ne: [t.ne[0], 1, tokens, 1],
        nb: [t.nb[0], t.nb[1], t.nb[1], t.nb[3]],
        ..*t
    };
    let ids = TensorDesc {
        ty: GGML_TYPE_I32,
        ne: [1, tokens, 1, 1],
        nb: [4, 0, 0, 0],
        addr: DENSE_IDS.as_ptr() as usize,
        name: None,
    };
    Ok([*w, per_token(b), ids, per_token(dst)])
}

impl Problem {
    /// Rows (token, slot pairs) of the call.
    pub fn rows(&self) -> usize {
        self.n_used * self.n_tokens
    }

    /// Rows an expert gets on average when routing spreads them evenly (rounded up): the
    /// metadata-only measure the small-batch threshold compares against.
    pub fn rows_per_expert(&self) -> usize {
        self.rows().div_ceil(self.n_expert.min(self.rows()))
    }

    /// A call of one expert every row routes to: a dense matmul's (`dense_as_mul_mat_id`).
    pub fn one_expert(&self) -> bool {
        self.n_expert == 1
    }

    /// Each activation row is read by one row of the call alone (`b` has a row per slot: the
    /// down projection's input, a dense matmul's), so one expert's rows can be quantized where
    /// they are gathered, by no other.
    pub fn rows_read_once(&self) -> bool {
        self.b_rows == self.n_used
    }

    /// Activation rows of `b` (distinct quantized rows).
    pub fn act_rows(&self) -> usize {
        self.b_rows * self.n_tokens
    }

    /// Index into `b` (f32 elements) of the activation row read by `slot` of `token`.
    pub fn b_offset(&self, act_row: usize) -> usize {
        (act_row / self.b_rows) * self.b_s2 + (act_row % self.b_rows) * self.b_s1
    }

    /// The activation row (0..act_rows) that `slot` of `token` reads.
    pub fn act_row(&self, token: usize, slot: usize) -> usize {
        token * self.b_rows + slot % self.b_rows
    }

    /// Index into `ids` (i32 elements) of the expert id of `slot` of `token`.
    pub fn ids_offset(&self, token: usize, slot: usize) -> usize {
        token * self.ids_s1 + slot * self.ids_s0
    }

    /// Index into `dst` (f32 elements) of output channel 0 of `slot` of `token`.
    pub fn dst_offset(&self, token: usize, slot: usize) -> usize {
        token * self.dst_s2 + slot * self.dst_s1
    }

    /// Byte offset of expert `e`'s weights in `as`, and the byte length of its N rows.
    pub fn expert_bytes(&self, e: usize) -> (usize, usize) {
        (e * self.w_nb2, (self.n - 1) * self.w_nb1 + self.w_row_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descs(
        k: i64,
        n: i64,
        n_expert: i64,
        n_used: i64,
        n_tokens: i64,
    ) -> [TensorDesc<'static>; 4] {
        let wt = GgmlType::Q4_0;
        let row = (k as usize / 32) * 18;
        let w = TensorDesc {
            ty: wt.id(),
            ne: [k, n, n_expert, 1],
            nb: [18, row, row * n as usize, row * (n * n_expert) as usize],
            addr: 0x1000_0000,
            name: Some("blk.0.ffn_gate_exps.weight"),
        };
        let b = TensorDesc {
            ty: 0,
            ne: [k, 1, n_tokens, 1],
            nb: [
                4,
                4 * k as usize,
                4 * k as usize,
                4 * (k * n_tokens) as usize,
            ],
            addr: 0x2000_0000,
            name: None,
        };
        let ids = TensorDesc {
            ty: GGML_TYPE_I32,
            ne: [n_used, n_tokens, 1, 1],
            nb: [
                4,
                4 * n_used as usize,
                4 * (n_used * n_tokens) as usize,
                4 * (n_used * n_tokens) as usize,
            ],
            addr: 0x3000_0000,
            name: None,
        };
        let dst = TensorDesc {
            ty: 0,
            ne: [n, n_used, n_tokens, 1],
            nb: [
                4,
                4 * n as usize,
                4 * (n * n_used) as usize,
                4 * (n * n_used * n_tokens) as usize,
            ],
            addr: 0x4000_0000,
            name: None,
        };
        [w, b, ids, dst]
    }

    fn kind(r: Result<Problem, Error>) -> ErrorKind {
        r.expect_err("must fail").kind
    }

    #[test]
    fn a3b_gate_is_accepted_with_extents() {
        let [w, b, ids, dst] = descs(2048, 768, 128, 8, 64);
        let p = validate(&w, &b, &ids, &dst).unwrap();
        assert_eq!(
            (p.k, p.n, p.n_expert, p.n_used, p.n_tokens, p.b_rows),
            (2048, 768, 128, 8, 64, 1)
        );
        assert_eq!(p.w_extent, 128 * 768 * 64 * 18);
        assert_eq!(p.dst_extent, 768 * 8 * 64 * 4);
        assert_eq!(p.rows_per_expert(), 4);
        assert_eq!(p.act_row(3, 5), 3);
        assert_eq!(p.dst_offset(1, 2), 768 * 8 + 2 * 768);
    }

    #[test]
    fn rejects_and_declines() {
        let ok = descs(2048, 768, 128, 8, 4);
        let with = |f: &dyn Fn(&mut [TensorDesc<'static>; 4])| {
            let mut d = ok;
            f(&mut d);
            kind(validate(&d[0], &d[1], &d[2], &d[3]))
        };
        assert_eq!(with(&|d| d[0].ty = 20), ErrorKind::NotHandled); // IQ4_NL
        assert_eq!(with(&|d| d[0].ty = 9999), ErrorKind::NotHandled);
        assert_eq!(with(&|d| d[0].ty = -1), ErrorKind::InvalidArgument);
        assert_eq!(with(&|d| d[1].ty = 1), ErrorKind::NotHandled);
        assert_eq!(with(&|d| d[2].ty = 0), ErrorKind::InvalidArgument);
        assert_eq!(with(&|d| d[1].ne[0] = 1024), ErrorKind::InvalidArgument);
        assert_eq!(with(&|d| d[3].ne[1] = 7), ErrorKind::InvalidArgument);
        assert_eq!(with(&|d| d[1].ne[1] = 3), ErrorKind::InvalidArgument);
        assert_eq!(with(&|d| d[0].ne[0] = 2050), ErrorKind::InvalidArgument);
        assert_eq!(with(&|d| d[2].ne[1] = 0), ErrorKind::InvalidArgument);
        assert_eq!(with(&|d| d[0].ne[2] = i64::MAX), ErrorKind::InvalidArgument);
        assert_eq!(
            with(&|d| d[0].nb[2] = usize::MAX / 2),
            ErrorKind::InvalidArgument
        );
        assert_eq!(with(&|d| d[1].nb[0] = 8), ErrorKind::NotHandled);
        assert_eq!(
            with(&|d| d[3].addr = d[1].addr + 64),
            ErrorKind::InvalidArgument
        );
        assert_eq!(with(&|d| d[1].addr = 0), ErrorKind::InvalidArgument);
        assert_eq!(with(&|d| d[3].nb[2] = 4 * 768), ErrorKind::InvalidArgument);
        assert_eq!(with(&|d| d[1].nb[2] = 0), ErrorKind::NotHandled);
        assert_eq!(with(&|d| d[0].nb[2] = 18), ErrorKind::NotHandled);
        assert_eq!(with(&|d| d[3].nb[0] = 8), ErrorKind::NotHandled);
        assert_eq!(with(&|d| d[3].nb[0] = 2), ErrorKind::InvalidArgument);
        assert_eq!(with(&|d| d[3].addr += 2), ErrorKind::NotHandled);
    }

    #[test]
    fn layout_codes_name_exactly_the_repacks_the_library_reads() {
        for ty in GgmlType::QUANTIZED {
            assert_eq!(weight_format(ty.id()), Some((ty, Layout::Plain)));
        }
        for (ty, layout) in Layout::REPACKED {
            let code = weight_code(ty, layout);
            assert_eq!(weight_format(code), Some((ty, layout)), "{code:#x}");
        }
        let repacked = |ty: GgmlType, rows: i32, chunk: i32| {
            ty.id() | rows << LAYOUT_ROWS_SHIFT | chunk << LAYOUT_CHUNK_SHIFT
        };
        // Layouts ggml has and the library does not read (RISC-V's 16x1, IQ4_NL's, Q2_K's), or
        // that do not exist, and layouts of types that are never repacked.
        for code in [
            repacked(GgmlType::Q4_0, 16, 1),
            repacked(GgmlType::Q4_0, 8, 4),
            repacked(GgmlType::Q4_1, 4, 4),
            repacked(GgmlType::F32, 4, 4),
            20 | 4 << LAYOUT_ROWS_SHIFT | 4 << LAYOUT_CHUNK_SHIFT,
            repacked(GgmlType::Q4_0, 0, 8),
            repacked(GgmlType::Q4_0, 8, 0),
            GgmlType::F32.id(),
            1 << 15,
            -1,
        ] {
            assert_eq!(weight_format(code), None, "{code:#x}");
        }
    }

    #[test]
    fn repacked_weights_are_whole_groups_of_packed_rows() {
        let ok = descs(2048, 768, 128, 8, 64);
        let q4_0_8x8 = weight_code(GgmlType::Q4_0, Layout::Repacked { rows: 8, chunk: 8 });
        let with = |f: &dyn Fn(&mut [TensorDesc<'static>; 4])| {
            let mut d = ok;
            d[0].ty = q4_0_8x8;
            f(&mut d);
            validate(&d[0], &d[1], &d[2], &d[3])
        };
        let p = with(&|_| {}).unwrap();
        assert_eq!(
            (p.wtype, p.layout),
            (GgmlType::Q4_0, Layout::Repacked { rows: 8, chunk: 8 })
        );
        assert_eq!(p.w_extent, ok[0].nb[2] * 128);
        // Experts need not be adjacent: ggml's nb[2] is taken as it is.
        with(&|d| d[0].nb[2] += 64).unwrap();
        let e = with(&|d| {
            d[0].ne[1] = 764;
            d[3].ne[0] = 764;
        })
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message().contains("8-row groups of q4_0_8x8"), "{e}");
        let e = with(&|d| d[0].nb[1] += 18).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(
            e.message().contains("packed plain rows of 1152 bytes"),
            "{e}"
        );
        let e = with(&|d| d[0].ty = GgmlType::Q4_1.id() | 4 << 16 | 4 << 24).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotHandled);
        assert!(
            e.message().contains("ggml type 3 in a 4x4 repacked layout"),
            "{e}"
        );
    }

    /// Brute force: do the runs `[o, o + inner)` at `i·s + j·t` overlap?
    fn runs_meet(inner: usize, [(e, s), (f, t)]: [(usize, usize); 2]) -> bool {
        let mut offsets: Vec<usize> = (0..e)
            .flat_map(|i| (0..f).map(move |j| i * s + j * t))
            .collect();
        offsets.sort_unstable();
        offsets.windows(2).any(|w| w[1] - w[0] < inner)
    }

    #[test]
    fn disjoint_runs_is_exact_on_random_lattices() {
        let mut rng = crate::testutil::Rng::new(14);
        let (mut disjoint, mut searched) = (0, 0);
        for _ in 0..20000 {
            let inner = 1 + rng.below(6);
            let dims = [
                (1 + rng.below(7), rng.below(40)),
                (1 + rng.below(7), rng.below(40)),
            ];
            let got = disjoint_runs(inner, dims).expect("small lattices are decided");
            assert_eq!(got, !runs_meet(inner, dims), "inner {inner}, dims {dims:?}");
            disjoint += got as usize;
            let [(e, s), (f, t)] = dims;
            let nested = e < 2 || f < 2 || s.max(t) >= (e - 1) * s.min(t) + inner;
            searched += (got && !nested) as usize;
        }
        // Both answers, and interleaved (not nested) disjoint lattices, were exercised.
        assert!(disjoint > 2000 && disjoint < 18000, "{disjoint}");
        assert!(searched > 100, "{searched}");
        // Undecided only beyond the search bound; nested layouts never need the search.
        let big = SEARCH_STEPS + 2;
        assert_eq!(disjoint_runs(1, [(big, 3), (big, 5)]), None);
        assert_eq!(disjoint_runs(4, [(big, 4), (big, 4 * big)]), Some(true));
        assert_eq!(disjoint_runs(1, [(3, 2), (2, 5)]), Some(true));
    }

    #[test]
    fn permuted_and_broadcast_views_are_taken() {
        let (n, n_used, n_tokens) = (768usize, 8usize, 4usize);
        let ok = descs(2048, n as i64, 128, n_used as i64, n_tokens as i64);
        let take = |f: &dyn Fn(&mut [TensorDesc<'static>; 4])| {
            let mut d = ok;
            f(&mut d);
            validate(&d[0], &d[1], &d[2], &d[3])
        };
        // dst with slots and tokens swapped in memory (ggml_permute of a [N, n_tokens, n_used]).
        let p = take(&|d| d[3].nb[1..3].copy_from_slice(&[4 * n * n_tokens, 4 * n])).unwrap();
        assert_eq!((p.dst_s1, p.dst_s2), (n * n_tokens, n));
        assert_eq!(p.dst_extent, 4 * n * n_used * n_tokens);
        // b with one row per slot, stored token-major and permuted.
        let p = take(&|d| {
            d[1].ne[1] = n_used as i64;
            d[1].nb[1..3].copy_from_slice(&[4 * 2048 * n_tokens, 4 * 2048]);
        })
        .unwrap();
        assert_eq!((p.b_s1, p.b_s2, p.b_rows), (2048 * n_tokens, 2048, n_used));
        // A broadcast b: its nb[1] is never used, odd or not.
        let p = take(&|d| d[1].nb[1] = 3).unwrap();
        assert_eq!(p.b_s1, 0);
        // Transposed ids, and ids shared by every token (read-only, so aliasing is harmless).
        let p = take(&|d| d[2].nb[0..2].copy_from_slice(&[4 * n_tokens, 4])).unwrap();
        assert_eq!((p.ids_s0, p.ids_s1), (n_tokens, 1));
        assert_eq!(p.ids_offset(3, 2), 3 + 2 * n_tokens);
        assert_eq!(take(&|d| d[2].nb[1] = 0).unwrap().ids_s1, 0);
        // Experts interleaved row by row (as permuted): rows distinct.
        let row = 2048 / 32 * 18;
        take(&|d| d[0].nb[1..3].copy_from_slice(&[row * 128, row])).unwrap();
        // One output per row, 3 slots 2 floats apart, 2 tokens 3 floats apart: elements 0 2 4
        // and 3 5 7, interleaved (not nested) and distinct.
        let mut small = descs(32, 1, 4, 3, 2);
        small[3].nb = [4, 8, 12, 0];
        let p = validate(&small[0], &small[1], &small[2], &small[3]).unwrap();
        assert_eq!((p.dst_s1, p.dst_s2, p.dst_extent), (2, 3, 4 * 8));
    }

    #[test]
    fn overlap_with_inputs_is_invalid_only_when_proven() {
        let ok = descs(64, 32, 4, 2, 3);
        let with = |f: &dyn Fn(&mut [TensorDesc<'static>; 4])| {
            let mut d = ok;
            f(&mut d);
            validate(&d[0], &d[1], &d[2], &d[3]).map(drop)
        };
        // Same first element: certain.
        let r = with(&|d| d[3].addr = d[1].addr);
        assert_eq!(r.unwrap_err().kind, ErrorKind::InvalidArgument);
        // dst's rows in the gaps of a padded b: disjoint but interleaved, so declined, not invalid.
        let r = with(&|d| {
            d[1].nb[1..3].copy_from_slice(&[512, 512]);
            d[3].addr = d[1].addr + 256;
            d[3].nb[1..3].copy_from_slice(&[1024, 2048]);
        });
        assert_eq!(r.unwrap_err().kind, ErrorKind::NotHandled);
        // dst wholly inside a contiguous b: certain.
        let r = with(&|d| d[3].addr = d[1].addr + 4);
        assert_eq!(r.unwrap_err().kind, ErrorKind::InvalidArgument);
    }
}
