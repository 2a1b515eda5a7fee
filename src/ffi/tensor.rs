//! Tensor descriptors: `ork_tensor`, the weight layout codes, and the descriptors of one call
//! ([`Call`]) as the engine plans and reads them.

use super::invalid;
use crate::moe::desc::{weight_format, TensorDesc, DENSE_IDS, GGML_TYPE_I32};
use crate::moe::{Engine, Error, Inputs, PairInputs, Plan};
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::AtomicU32;

/// Weight layouts in `ork_tensor.type` (weights only): ggml's type id in the low 16 bits, and
/// for a tensor ggml-cpu has repacked (a `CPU_REPACK` buffer) the layout's rows per interleaved
/// group from this bit ...
pub const ORK_LAYOUT_ROWS_SHIFT: i32 = 16;
/// ... and its bytes per interleaved chunk from this one (below 128); 0 above the type id is
/// ggml's plain blocks. The layout is ggml's `tensor_traits<block, chunk, rows, ...>`, named
/// `<type>_<rows>x<chunk>` (docs/REPACK.md); the codes below are the ones the library reads.
pub const ORK_LAYOUT_CHUNK_SHIFT: i32 = 24;
/// `q4_0_4x4`: Q4_0 repacked for NEON with dotprod (the RK3588's Cortex-A76).
pub const ORK_TYPE_Q4_0_4X4: i32 = 2 | 4 << ORK_LAYOUT_ROWS_SHIFT | 4 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q4_0_4x8`: NEON with i8mm.
pub const ORK_TYPE_Q4_0_4X8: i32 = 2 | 4 << ORK_LAYOUT_ROWS_SHIFT | 8 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q4_0_8x8`: AVX2, or SVE-256 with i8mm.
pub const ORK_TYPE_Q4_0_8X8: i32 = 2 | 8 << ORK_LAYOUT_ROWS_SHIFT | 8 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q8_0_4x4`: NEON with dotprod.
pub const ORK_TYPE_Q8_0_4X4: i32 = 8 | 4 << ORK_LAYOUT_ROWS_SHIFT | 4 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q8_0_4x8`: NEON with i8mm.
pub const ORK_TYPE_Q8_0_4X8: i32 = 8 | 4 << ORK_LAYOUT_ROWS_SHIFT | 8 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q4_K_8x4`: NEON with dotprod.
pub const ORK_TYPE_Q4_K_8X4: i32 = 12 | 8 << ORK_LAYOUT_ROWS_SHIFT | 4 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q4_K_8x8`: AVX2, or NEON with i8mm.
pub const ORK_TYPE_Q4_K_8X8: i32 = 12 | 8 << ORK_LAYOUT_ROWS_SHIFT | 8 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q6_K_8x4`: NEON with dotprod.
pub const ORK_TYPE_Q6_K_8X4: i32 = 14 | 8 << ORK_LAYOUT_ROWS_SHIFT | 4 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q6_K_8x8`: NEON with i8mm.
pub const ORK_TYPE_Q6_K_8X8: i32 = 14 | 8 << ORK_LAYOUT_ROWS_SHIFT | 8 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q2_K_8x8`: AVX-512.
pub const ORK_TYPE_Q2_K_8X8: i32 = 10 | 8 << ORK_LAYOUT_ROWS_SHIFT | 8 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q5_K_8x4`: NEON with dotprod.
pub const ORK_TYPE_Q5_K_8X4: i32 = 13 | 8 << ORK_LAYOUT_ROWS_SHIFT | 4 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q5_K_8x8`: NEON with i8mm.
pub const ORK_TYPE_Q5_K_8X8: i32 = 13 | 8 << ORK_LAYOUT_ROWS_SHIFT | 8 << ORK_LAYOUT_CHUNK_SHIFT;
/// `iq4_nl_4x4`: NEON with dotprod.
pub const ORK_TYPE_IQ4_NL_4X4: i32 = 20 | 4 << ORK_LAYOUT_ROWS_SHIFT | 4 << ORK_LAYOUT_CHUNK_SHIFT;
/// `iq4_nl_8x8`: AVX2.
pub const ORK_TYPE_IQ4_NL_8X8: i32 = 20 | 8 << ORK_LAYOUT_ROWS_SHIFT | 8 << ORK_LAYOUT_CHUNK_SHIFT;
/// `mxfp4_4x4`: NEON with dotprod.
pub const ORK_TYPE_MXFP4_4X4: i32 = 39 | 4 << ORK_LAYOUT_ROWS_SHIFT | 4 << ORK_LAYOUT_CHUNK_SHIFT;
/// `mxfp4_8x8`: AVX2.
pub const ORK_TYPE_MXFP4_8X8: i32 = 39 | 8 << ORK_LAYOUT_ROWS_SHIFT | 8 << ORK_LAYOUT_CHUNK_SHIFT;

/// A tensor as ggml describes it (flat: no ggml types).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ork_tensor {
    /// `enum ggml_type` numbering (F32 0, Q4_0 2, Q4_1 3, Q5_0 6, Q8_0 8, Q4_K 12, Q6_K 14, I32 26);
    /// for the weights (`as`) also a layout code, `ORK_TYPE_*`: ggml's repacked bytes, `ne`
    /// and `nb` as ggml keeps them (those of the plain tensor). A layout code whose `ne[1]` is
    /// not a multiple of its rows, or whose `nb[1]` is not one plain row's bytes, is
    /// `ORK_INVALID_ARGUMENT` (ggml never repacks such a tensor); an unknown code
    /// `ORK_NOT_HANDLED`.
    pub r#type: i32,
    /// Elements per dimension, ggml order.
    pub ne: [i64; 4],
    /// Strides in bytes, ggml order.
    pub nb: [usize; 4],
    pub data: *mut c_void,
    /// Optional (NULL ok), e.g. "blk.0.ffn_gate_exps.weight": part of the expert cache key.
    pub name: *const c_char,
}

/// Whether weights of this ggml type, or layout code (`ORK_TYPE_*`), can ever be handled: a
/// decision that holds for the tensor's lifetime. 1 or 0.
#[no_mangle]
pub extern "C" fn ork_supports_type(ggml_type: i32) -> i32 {
    weight_format(ggml_type).is_some() as i32
}

/// The descriptor behind a caller's pointer; `what` names it in the error for NULL.
fn desc<'a>(t: *const ork_tensor, what: &str) -> Result<TensorDesc<'a>, Error> {
    // SAFETY: a non-NULL descriptor points to a readable ork_tensor, by contract.
    let t = unsafe { t.as_ref() }.ok_or_else(|| invalid(&format!("{what}: descriptor is NULL")))?;
    // Names key the cache only: read for a call that runs ([`Call::inputs`]), not by a check.
    Ok(TensorDesc {
        ty: t.r#type,
        ne: t.ne,
        nb: t.nb,
        addr: t.data as usize,
        name: None,
    })
}

/// The tensor's name, if it has one in UTF-8. `t` was checked non-NULL by [`desc`].
pub(super) fn name<'a>(t: *const ork_tensor) -> Option<&'a str> {
    // SAFETY: `t` points to a readable ork_tensor, by contract (checked non-NULL before).
    let p = unsafe { (*t).name };
    // SAFETY: a non-NULL name is a NUL-terminated string, by contract.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().ok())?
}

/// The descriptors of one call: `as`, `b`, `ids`, `dst`, and for a pair the second `as` and `dst`.
pub(super) struct Call<'a> {
    pub(super) w: TensorDesc<'a>,
    b: TensorDesc<'a>,
    ids: TensorDesc<'a>,
    dst: TensorDesc<'a>,
    pub(super) pair: Option<(TensorDesc<'a>, TensorDesc<'a>)>,
    /// A dense matmul ([`Engine::plan_dense`]), whose `ids` is the engine's one routed id.
    dense: bool,
    /// The weight descriptors, whose names [`Call::inputs`] reads.
    pub(super) weights: [*const ork_tensor; 2],
}

impl<'a> Call<'a> {
    pub(super) fn single(
        w: *const ork_tensor,
        b: *const ork_tensor,
        ids: *const ork_tensor,
        dst: *const ork_tensor,
    ) -> Result<Call<'a>, Error> {
        Ok(Call {
            w: desc(w, "as")?,
            b: desc(b, "b")?,
            ids: desc(ids, "ids")?,
            dst: desc(dst, "dst")?,
            pair: None,
            dense: false,
            weights: [w, w],
        })
    }

    pub(super) fn dense(
        w: *const ork_tensor,
        b: *const ork_tensor,
        dst: *const ork_tensor,
    ) -> Result<Call<'a>, Error> {
        // Only `ids.addr` is read ([`Call::inputs`]); the plan takes its extent from
        // `dense_as_mul_mat_id`'s descriptor.
        let ids = TensorDesc {
            ty: GGML_TYPE_I32,
            ne: [1; 4],
            nb: [4; 4],
            addr: DENSE_IDS.as_ptr() as usize,
            name: None,
        };
        Ok(Call {
            w: desc(w, "as")?,
            b: desc(b, "b")?,
            ids,
            dst: desc(dst, "dst")?,
            pair: None,
            dense: true,
            weights: [w, w],
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn pair(
        w0: *const ork_tensor,
        w1: *const ork_tensor,
        b: *const ork_tensor,
        ids: *const ork_tensor,
        dst0: *const ork_tensor,
        dst1: *const ork_tensor,
    ) -> Result<Call<'a>, Error> {
        let mut call = Call::single(w0, b, ids, dst0)?;
        call.pair = Some((desc(w1, "as1")?, desc(dst1, "dst1")?));
        call.weights[1] = w1;
        Ok(call)
    }

    pub(super) fn plan(&self, engine: &Engine) -> Result<Plan, Error> {
        match &self.pair {
            None if self.dense => engine.plan_dense(&self.w, &self.b, &self.dst),
            None => engine.plan(&self.w, &self.b, &self.ids, &self.dst),
            Some((w1, d1)) => engine.plan_pair(&self.w, w1, &self.b, &self.ids, &self.dst, d1),
        }
    }

    /// Views of the tensors over the extents validation computed for `plan`.
    pub(super) fn inputs(&self, plan: &Plan) -> Inputs<'a> {
        let p = &plan.problem;
        // Validation checked every pointer non-NULL, 4-byte alignment of the f32/i32 tensors, that
        // each extent fits the address space, and that no dst overlaps an input or the other dst;
        // the caller guarantees each tensor's memory is valid for its extent during the call and
        // that nothing else accesses a dst meanwhile. AtomicU32 has the size and alignment of f32.
        let bytes = |d: &TensorDesc, len: usize| {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(d.addr as *const u8, len) }
        };
        let out = |d: &TensorDesc, len: usize| {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(d.addr as *const AtomicU32, len / 4) }
        };
        // SAFETY: as above.
        let (b, ids) = unsafe {
            (
                std::slice::from_raw_parts(self.b.addr as *const f32, p.b_extent / 4),
                std::slice::from_raw_parts(self.ids.addr as *const i32, p.ids_extent / 4),
            )
        };
        let pair = match (&self.pair, &plan.pair) {
            (Some((w1, d1)), Some(p1)) => Some(PairInputs {
                weights: bytes(w1, p1.w_extent),
                name: name(self.weights[1]),
                dst: out(d1, p1.dst_extent),
            }),
            _ => None,
        };
        Inputs {
            weights: bytes(&self.w, p.w_extent),
            name: name(self.weights[0]),
            b,
            ids,
            dst: out(&self.dst, p.dst_extent),
            pair,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inflate::Layout;
    use crate::moe::desc::{weight_code, LAYOUT_CHUNK_SHIFT, LAYOUT_ROWS_SHIFT};

    #[test]
    fn the_headers_layout_codes_are_the_engines() {
        let shifts = (ORK_LAYOUT_ROWS_SHIFT as u32, ORK_LAYOUT_CHUNK_SHIFT as u32);
        assert_eq!(shifts, (LAYOUT_ROWS_SHIFT, LAYOUT_CHUNK_SHIFT));
        let header = [
            ORK_TYPE_Q4_0_4X4,
            ORK_TYPE_Q4_0_4X8,
            ORK_TYPE_Q4_0_8X8,
            ORK_TYPE_Q8_0_4X4,
            ORK_TYPE_Q8_0_4X8,
            ORK_TYPE_Q4_K_8X4,
            ORK_TYPE_Q4_K_8X8,
            ORK_TYPE_Q6_K_8X4,
            ORK_TYPE_Q6_K_8X8,
            ORK_TYPE_Q2_K_8X8,
            ORK_TYPE_Q5_K_8X4,
            ORK_TYPE_Q5_K_8X8,
            ORK_TYPE_IQ4_NL_4X4,
            ORK_TYPE_IQ4_NL_8X8,
            ORK_TYPE_MXFP4_4X4,
            ORK_TYPE_MXFP4_8X8,
        ];
        let engine = Layout::REPACKED.map(|(ty, layout)| weight_code(ty, layout));
        assert_eq!(header, engine);
        assert!(header.iter().all(|&code| ork_supports_type(code) == 1));
    }
}
