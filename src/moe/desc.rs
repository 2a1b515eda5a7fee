//! Tensor descriptors and their validation into a [`Problem`], from metadata only.
//!
//! Everything that decides accept / decline / reject is here and reads no tensor data, so every one
//! of ggml's threads reaches the same answer. The byte extents computed here (overflow-checked) are
//! what the C boundary turns into slices; nothing outside them is ever touched.

use super::{Error, ErrorKind};
use crate::quant::GgmlType;

/// ggml's `GGML_TYPE_I32`.
pub const GGML_TYPE_I32: i32 = 26;

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

/// A validated MUL_MAT_ID call. Strides of f32 / i32 tensors are in elements (their innermost
/// stride is always one element).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub wtype: GgmlType,
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
    /// Bytes of one weight row, and the row / expert strides of `as` in bytes.
    pub w_row_bytes: usize,
    pub w_nb1: usize,
    pub w_nb2: usize,
    pub b_s1: usize,
    pub b_s2: usize,
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

/// Strides of an f32/i32 tensor in elements; `None` when they are not whole, aligned elements
/// (a layout ggml's own path handles and this one declines).
fn elem_strides(t: &TensorDesc) -> Option<[usize; 3]> {
    let aligned = t.addr.is_multiple_of(4)
        && t.nb[0] == 4
        && t.nb[1].is_multiple_of(4)
        && t.nb[2].is_multiple_of(4);
    aligned.then(|| [1, t.nb[1] / 4, t.nb[2] / 4])
}

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.0.saturating_add(b.1) && b.0 < a.0.saturating_add(a.1)
}

/// Validates the four descriptors of `dst = mul_mat_id(as, b, ids)`.
///
/// Err(NotHandled) for valid calls this library does not take (weight type, strided activations);
/// Err(InvalidArgument) for descriptors ggml itself would reject.
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

    let Some(wtype) = GgmlType::from_id(w.ty).filter(|t| GgmlType::QUANTIZED.contains(t)) else {
        return Err(declined(format!(
            "as: weight type id {} is not supported",
            w.ty
        )));
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
    if w.nb[0] != wtype.block_bytes() || w.nb[1] < w_row_bytes {
        return Err(declined(format!(
            "as: strides nb[0] = {}, nb[1] = {} are not plain {} rows",
            w.nb[0],
            w.nb[1],
            wtype.name()
        )));
    }
    let (Some(bs), Some(is), Some(ds)) = (elem_strides(b), elem_strides(ids), elem_strides(dst))
    else {
        return Err(declined(
            "b/ids/dst: element strides are not whole aligned 4-byte elements".into(),
        ));
    };
    // Every output element is distinct memory, and the inputs' rows do not overlap: this bounds
    // the engine's own allocations (rows, quantized activations) by memory the caller really has.
    if dst.nb[1] < n * 4 || dst.nb[2] < n_used.saturating_mul(dst.nb[1]) {
        return Err(invalid(format!(
            "dst: strides nb[1] = {}, nb[2] = {} make outputs overlap",
            dst.nb[1], dst.nb[2]
        )));
    }
    let b_row_bytes = k.saturating_mul(4);
    let b_rows_ok = b_rows == 1 || b.nb[1] >= b_row_bytes;
    let b_tokens_ok = b.nb[2]
        >= (b_rows - 1)
            .saturating_mul(b.nb[1])
            .saturating_add(b_row_bytes);
    let ids_ok = ids.nb[1] >= n_used.saturating_mul(4);
    let w_experts_ok = w.nb[2] >= (n - 1).saturating_mul(w.nb[1]).saturating_add(w_row_bytes);
    if !(b_rows_ok && b_tokens_ok && ids_ok && w_experts_ok) {
        return Err(declined(
            "as/b/ids: overlapping rows (a broadcast view) are left to the caller".into(),
        ));
    }
    let w_extent =
        extent(w_row_bytes, &[(n, w.nb[1]), (n_expert, w.nb[2])]).ok_or_else(|| overflow("as"))?;
    let b_extent = extent(
        k.checked_mul(4).ok_or_else(|| overflow("b"))?,
        &[(b_rows, b.nb[1]), (n_tokens, b.nb[2])],
    )
    .ok_or_else(|| overflow("b"))?;
    let ids_extent =
        extent(4, &[(n_used, ids.nb[0]), (n_tokens, ids.nb[1])]).ok_or_else(|| overflow("ids"))?;
    let dst_extent = extent(
        n.checked_mul(4).ok_or_else(|| overflow("dst"))?,
        &[(n_used, dst.nb[1]), (n_tokens, dst.nb[2])],
    )
    .ok_or_else(|| overflow("dst"))?;
    for (t, len, what) in [
        (w, w_extent, "as"),
        (b, b_extent, "b"),
        (ids, ids_extent, "ids"),
        (dst, dst_extent, "dst"),
    ] {
        if t.addr == 0 {
            return Err(invalid(format!("{what}: data is NULL")));
        }
        if t.addr.checked_add(len).is_none() {
            return Err(overflow(what));
        }
    }
    for (t, len, what) in [
        (w, w_extent, "as"),
        (b, b_extent, "b"),
        (ids, ids_extent, "ids"),
    ] {
        if overlaps((dst.addr, dst_extent), (t.addr, len)) {
            return Err(invalid(format!("dst overlaps {what}")));
        }
    }
    Ok(Problem {
        wtype,
        k,
        n,
        n_expert,
        n_used,
        n_tokens,
        b_rows,
        w_row_bytes,
        w_nb1: w.nb[1],
        w_nb2: w.nb[2],
        b_s1: bs[1],
        b_s2: bs[2],
        ids_s1: is[1],
        dst_s1: ds[1],
        dst_s2: ds[2],
        w_extent,
        b_extent,
        ids_extent,
        dst_extent,
    })
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
        token * self.ids_s1 + slot
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
    }
}
