//! [`validate`]: the four descriptors of a `MUL_MAT_ID` call into a [`Problem`], one check after
//! the other in a fixed order (so that a call broken in several ways always gets the same error).

use super::memory::{dense, disjoint_runs, extent, Span};
use super::{
    declined, invalid, overflow, weight_format, Problem, TensorDesc, GGML_TYPE_I32,
    LAYOUT_CHUNK_SHIFT, LAYOUT_ROWS_SHIFT, MAX_K,
};
use crate::inflate::Layout;
use crate::moe::Error;
use crate::quant::GgmlType;

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
    let tensors = [(w, "as"), (b, "b"), (ids, "ids"), (dst, "dst")];
    check_types(&tensors)?;
    let d = [
        dims(w, "as")?,
        dims(b, "b")?,
        dims(ids, "ids")?,
        dims(dst, "dst")?,
    ];
    check_shapes(d)?;
    check_data(&tensors)?;
    let (wtype, layout) = weights_taken(w)?;
    check_activations_taken(b)?;
    let k = d[0][0];
    let w_row_bytes = weight_row_bytes(wtype, k)?;
    check_depth(k)?;
    check_contiguous_rows(w, b, wtype)?;
    if let Layout::Repacked { rows, .. } = layout {
        check_repacked(w, d[0][1], rows, (wtype, layout), w_row_bytes)?;
    }
    let nb = [
        used_strides(w, &d[0]),
        used_strides(b, &d[1]),
        used_strides(ids, &d[2]),
        used_strides(dst, &d[3]),
    ];
    let runs = runs(&tensors, d, nb, w_row_bytes)?;
    check_dst_elements(dst, &runs[3], nb[3][0], d[0][1])?;
    check_dst_apart(&tensors, &runs)?;
    check_inputs_distinct(w, b, &runs)?;
    problem((wtype, layout), &tensors, d, nb, &runs)
}

/// Type ids: any ggml type for the weights and the activations (declined later if not taken
/// here), I32 for `ids` and F32 for `dst`.
fn check_types(tensors: &[(&TensorDesc, &str); 4]) -> Result<(), Error> {
    for (t, what) in tensors {
        if t.ty < 0 {
            return Err(invalid(format!(
                "{what}: type id {} is not a ggml type",
                t.ty
            )));
        }
    }
    let [_, _, (ids, _), (dst, _)] = tensors;
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
    Ok(())
}

/// The sizes of `t`: each at least 1, and 3-D at most.
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

/// The shapes of `as` [K, N, n_expert], `b` [K, b_rows, n_tokens], `ids` [n_used, n_tokens] and
/// `dst` [N, n_used, n_tokens] agree, `b_rows` dividing `n_used`.
fn check_shapes([wd, bd, idd, dd]: [[usize; 4]; 4]) -> Result<(), Error> {
    let [k, n, ..] = wd;
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
    Ok(())
}

/// No tensor's data is NULL.
fn check_data(tensors: &[(&TensorDesc, &str); 4]) -> Result<(), Error> {
    for (t, what) in tensors {
        if t.addr == 0 {
            return Err(invalid(format!("{what}: data is NULL")));
        }
    }
    Ok(())
}

/// The weight type and layout, if the library reads them ([`weight_format`]); else declined.
fn weights_taken(w: &TensorDesc) -> Result<(GgmlType, Layout), Error> {
    if let Some(format) = weight_format(w.ty) {
        return Ok(format);
    }
    let (rows, chunk) = (
        (w.ty >> LAYOUT_ROWS_SHIFT) & 0xff,
        w.ty >> LAYOUT_CHUNK_SHIFT,
    );
    Err(declined(if (rows, chunk) == (0, 0) {
        format!("as: weight type id {} is not supported", w.ty)
    } else {
        format!(
            "as: type code {:#x} (ggml type {} in a {rows}x{chunk} repacked layout) is not \
             supported",
            w.ty,
            w.ty & 0xffff
        )
    }))
}

/// Only F32 activations are taken.
fn check_activations_taken(b: &TensorDesc) -> Result<(), Error> {
    if b.ty != GgmlType::F32.id() {
        return Err(declined(format!(
            "b: type id {} (only F32 activations are taken)",
            b.ty
        )));
    }
    Ok(())
}

/// Bytes of one weight row of depth `k`: whole blocks of the type.
fn weight_row_bytes(wtype: GgmlType, k: usize) -> Result<usize, Error> {
    wtype.row_bytes(k).ok_or_else(|| {
        invalid(format!(
            "as: K = {k} is not a multiple of {}'s block size {}",
            wtype.name(),
            wtype.block_elems()
        ))
    })
}

/// Depth `k` at most [`MAX_K`].
fn check_depth(k: usize) -> Result<(), Error> {
    if k > MAX_K {
        return Err(declined(format!(
            "as: K = {k} exceeds {MAX_K}, beyond which int8 products could overflow int32 sums"
        )));
    }
    Ok(())
}

/// Rows are read as contiguous runs of blocks / floats; the extents assume it.
fn check_contiguous_rows(w: &TensorDesc, b: &TensorDesc, wtype: GgmlType) -> Result<(), Error> {
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
    Ok(())
}

/// ggml repacks whole row groups of packed rows only (`n` rows in groups of `rows`, each row
/// `w_row_bytes` apart, as plain rows); anything else is not such a tensor.
fn check_repacked(
    w: &TensorDesc,
    n: usize,
    rows: usize,
    (wtype, layout): (GgmlType, Layout),
    w_row_bytes: usize,
) -> Result<(), Error> {
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
    Ok(())
}

/// One tensor's bytes: runs of `inner` bytes at the offsets of its two outer dimensions
/// (`(count, byte stride)`), `extent` bytes from its data pointer to its end.
struct Runs {
    inner: usize,
    dims: [(usize, usize); 2],
    extent: usize,
}

impl Runs {
    fn span(&self, t: &TensorDesc) -> Span {
        Span {
            addr: t.addr,
            extent: self.extent,
            inner: self.inner,
            dense: dense(self.inner, self.dims),
        }
    }
}

/// The runs of `as` (weight rows), `b` (activation rows), `ids` (elements) and `dst` (output
/// rows) from their sizes `d` and used strides `nb`. A size that overflows is invalid whatever
/// the layout.
fn runs(
    tensors: &[(&TensorDesc, &str); 4],
    [wd, bd, idd, _]: [[usize; 4]; 4],
    [w_nb, b_nb, ids_nb, dst_nb]: [[usize; 3]; 4],
    w_row_bytes: usize,
) -> Result<[Runs; 4], Error> {
    let [k, n, n_expert, _] = wd;
    let [n_used, n_tokens, ..] = idd;
    let b_row_bytes = k.checked_mul(4).ok_or_else(|| overflow("b"))?;
    let dst_row_bytes = n.checked_mul(4).ok_or_else(|| overflow("dst"))?;
    let layouts = [
        (w_row_bytes, [(n, w_nb[1]), (n_expert, w_nb[2])]),
        (b_row_bytes, [(bd[1], b_nb[1]), (n_tokens, b_nb[2])]),
        (4, [(n_used, ids_nb[0]), (n_tokens, ids_nb[1])]),
        (dst_row_bytes, [(n_used, dst_nb[1]), (n_tokens, dst_nb[2])]),
    ];
    let run = |i: usize| -> Result<Runs, Error> {
        let (inner, dims) = layouts[i];
        let extent = extent(inner, &dims).ok_or_else(|| overflow(tensors[i].1))?;
        Ok(Runs {
            inner,
            dims,
            extent,
        })
    };
    let runs = [run(0)?, run(1)?, run(2)?, run(3)?];
    for ((t, what), r) in tensors.iter().zip(&runs) {
        if t.addr.checked_add(r.extent).is_none() {
            return Err(overflow(what));
        }
    }
    Ok(runs)
}

/// Every output element is distinct memory: contiguous output rows (`nb0`, the used stride of
/// `dst`'s `n` channels) that do not overlap one another.
fn check_dst_elements(dst: &TensorDesc, runs: &Runs, nb0: usize, n: usize) -> Result<(), Error> {
    if nb0 != 4 && n > 1 {
        return Err(if nb0 < 4 {
            invalid(format!("dst: nb[0] = {} makes outputs overlap", dst.nb[0]))
        } else {
            declined(format!(
                "dst: nb[0] = {}: output rows are not contiguous",
                dst.nb[0]
            ))
        });
    }
    match disjoint_runs(runs.inner, runs.dims) {
        Some(true) => Ok(()),
        Some(false) => Err(invalid(format!(
            "dst: strides nb[1] = {}, nb[2] = {} make outputs overlap",
            dst.nb[1], dst.nb[2]
        ))),
        None => Err(declined(format!(
            "dst: strides nb[1] = {}, nb[2] = {} interleave rows too finely to check cheaply",
            dst.nb[1], dst.nb[2]
        ))),
    }
}

/// `dst` shares no byte with an input.
fn check_dst_apart(tensors: &[(&TensorDesc, &str); 4], runs: &[Runs; 4]) -> Result<(), Error> {
    let dst = runs[3].span(tensors[3].0);
    for ((t, what), r) in tensors[..3].iter().zip(runs) {
        match dst.shares_bytes(&r.span(t)) {
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
    Ok(())
}

/// Distinct weight and activation rows bound the engine's own allocations (routing counts per
/// expert, quantized rows) by memory the caller really has; overlapping ones are views that
/// ggml's own path reads as well.
fn check_inputs_distinct(w: &TensorDesc, b: &TensorDesc, runs: &[Runs; 4]) -> Result<(), Error> {
    if disjoint_runs(runs[0].inner, runs[0].dims) != Some(true) {
        return Err(declined(format!(
            "as: strides nb[1] = {}, nb[2] = {} make weight rows overlap: left to the caller",
            w.nb[1], w.nb[2]
        )));
    }
    if disjoint_runs(runs[1].inner, runs[1].dims) != Some(true) {
        return Err(declined(format!(
            "b: strides nb[1] = {}, nb[2] = {} make activation rows overlap (a broadcast view): \
             left to the caller",
            b.nb[1], b.nb[2]
        )));
    }
    Ok(())
}

/// The validated call, its f32 / i32 strides in elements (declined unless the data and the
/// strides are whole aligned elements).
fn problem(
    (wtype, layout): (GgmlType, Layout),
    tensors: &[(&TensorDesc, &str); 4],
    [wd, bd, idd, _]: [[usize; 4]; 4],
    [w_nb, b_nb, ids_nb, dst_nb]: [[usize; 3]; 4],
    [w, b, ids, dst]: &[Runs; 4],
) -> Result<Problem, Error> {
    let [(_, _), (b_desc, _), (ids_desc, _), (dst_desc, _)] = tensors;
    let (Some(bs), Some(is), Some(ds)) = (
        elem_strides(b_desc.addr, b_nb),
        elem_strides(ids_desc.addr, ids_nb),
        elem_strides(dst_desc.addr, dst_nb),
    ) else {
        return Err(declined(
            "b/ids/dst: data or strides are not whole aligned 4-byte elements".into(),
        ));
    };
    let [k, n, n_expert, _] = wd;
    let [n_used, n_tokens, ..] = idd;
    Ok(Problem {
        wtype,
        layout,
        k,
        n,
        n_expert,
        n_used,
        n_tokens,
        b_rows: bd[1],
        w_row_bytes: w.inner,
        w_nb1: if n > 1 { w_nb[1] } else { w.inner },
        w_nb2: w_nb[2],
        b_s1: bs[1],
        b_s2: bs[2],
        ids_s0: is[0],
        ids_s1: is[1],
        dst_s1: ds[1],
        dst_s2: ds[2],
        w_extent: w.extent,
        b_extent: b.extent,
        ids_extent: ids.extent,
        dst_extent: dst.extent,
    })
}
