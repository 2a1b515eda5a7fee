//! Tensor descriptors and their validation into a [`Problem`], from metadata only.
//!
//! Everything that decides accept / decline / reject is here and reads no tensor data, so every one
//! of ggml's threads reaches the same answer. The byte extents computed here (overflow-checked) are
//! what the C boundary turns into slices; nothing outside them is ever touched.
//!
//! This file holds the descriptors, the weight type codes, the validated [`Problem`] and the dense
//! matmul's translation into a routed call; `validate.rs` the checks, in their order; `memory.rs`
//! where a strided tensor's bytes lie (extents, distinct rows, overlaps).

mod memory;
#[cfg(test)]
mod tests;
mod validate;

pub use memory::Span;
pub use validate::validate;

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

    /// The weights' memory, from `addr`: their rows.
    pub fn weight_span(&self, addr: usize) -> Span {
        let dims = [(self.n, self.w_nb1), (self.n_expert, self.w_nb2)];
        Span {
            addr,
            extent: self.w_extent,
            inner: self.w_row_bytes,
            dense: memory::dense(self.w_row_bytes, dims),
        }
    }

    /// `dst`'s memory, from `addr`: its output rows.
    pub fn dst_span(&self, addr: usize) -> Span {
        let dims = [
            (self.n_used, 4 * self.dst_s1),
            (self.n_tokens, 4 * self.dst_s2),
        ];
        Span {
            addr,
            extent: self.dst_extent,
            inner: 4 * self.n,
            dense: memory::dense(4 * self.n, dims),
        }
    }
}
