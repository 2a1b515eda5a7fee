//! What the engine did in one ubatch, per call: the builder's input, which the engine (or the
//! probe, from the engine's trace and the routing) can count.

use ork_moe::layout::Tiles;
use ork_moe::quant::GgmlType;

/// The projection a call computes: a routed expert's (MUL_MAT_ID), or a dense weight matrix's
/// (MUL_MAT, one expert every token routes to: `ork_mul_mat_mt`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proj {
    Gate,
    Up,
    /// llama.cpp's fused `ffn_gate_up_exps`: one call, N = 2·n_ff.
    GateUp,
    Down,
    /// An attention projection before the attention core (q, k, v).
    AttnIn,
    /// The attention output projection (o), after the core.
    AttnOut,
    /// A shared expert's gate, up or down, after the routed experts.
    Shared,
}

impl Proj {
    /// A routed projection: a MUL_MAT_ID, which the patch announces at graph begin for the
    /// prefetcher. Dense calls are not announced: their inflates run in the call.
    pub fn routed(self) -> bool {
        matches!(self, Proj::Gate | Proj::Up | Proj::GateUp | Proj::Down)
    }
}

/// One used expert of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertCall {
    /// Rows routed to it.
    pub rows: u32,
    /// Found in the cache (no inflate).
    pub hit: bool,
}

/// One call as the engine ran it (a MUL_MAT_ID, or a dense matmul as one expert): what the
/// engine (or the probe, from the engine's statistics and the routing) can count.
#[derive(Clone, Debug, PartialEq)]
pub struct CallWork {
    pub layer: u32,
    pub proj: Proj,
    /// K and N of one expert (unpadded).
    pub k: usize,
    pub n: usize,
    pub ty: GgmlType,
    /// Distinct activation rows quantized (tokens, or tokens × n_used for down).
    pub act_rows: u64,
    pub n_expert: usize,
    /// The used experts, in the order the engine handles them.
    pub experts: Vec<ExpertCall>,
}

impl CallWork {
    /// Bytes of one expert's quantized weights.
    pub fn q_bytes(&self) -> u64 {
        (self.n * self.ty.row_bytes(self.k).expect("K is whole blocks")) as u64
    }

    /// Bytes of one expert's native int8 B.
    pub fn b_bytes(&self) -> u64 {
        let t = Tiles::RK3588;
        t.b_len(t.pad(self.k), t.pad(self.n)) as u64
    }

    /// (token, slot) rows of the call.
    pub fn rows(&self) -> u64 {
        self.experts.iter().map(|e| e.rows as u64).sum()
    }

    /// A dense call's: one expert (`Problem::one_expert`).
    pub fn one_expert(&self) -> bool {
        self.n_expert == 1
    }

    /// Each activation row read by one row of the call (`Problem::rows_read_once`).
    pub fn rows_read_once(&self) -> bool {
        self.act_rows == self.rows()
    }
}

/// One ubatch's expert work and dense part.
#[derive(Clone, Debug, PartialEq)]
pub struct UbatchWork {
    pub tokens: usize,
    /// The calls in the order ggml runs them: per layer the dense calls the library takes
    /// (q, k, v, o; none with `ORK_DENSE=0`), gate, up (or gate_up), down, a shared expert's.
    pub calls: Vec<CallWork>,
    /// The dense part, per layer (index = `CallWork::layer`).
    pub dense: Vec<DenseWork>,
}

/// The dense part of one layer for one ubatch: what ggml runs on the CPU between the
/// MUL_MAT_ID calls, on the big cores (the reference ran `-t 4` on the A76).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DenseWork {
    /// Wall time of attention, norms, router (and shared expert) before the gate call.
    pub before_us: f64,
    /// Elements of ggml's SiLU·mul between up and down.
    pub act_elems: u64,
    /// Elements of the weighted sum of the experts' outputs after down.
    pub combine_elems: u64,
    /// DRAM bytes of `before`'s weights.
    pub bytes: u64,
}
