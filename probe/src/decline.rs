//! `ork-probe decline`: what the ggml hook costs when the library declines, i.e. at every decode
//! step. Times the C entry points the patch calls on each of ggml's threads for each MUL_MAT_ID
//! of a Qwen3-30B-A3B decode step (one token, 8 of 128 experts): `ork_supports_type`, the pair
//! check of up and gate, and the checks of gate/up and down, all declined below `ORK_MIN_ROWS`.
//! The context is the environment's, as inside llama.cpp.

use super::json::{self, fixed};
use super::options::Options;
use ork_moe::ffi::{
    ork_ctx, ork_ctx_free, ork_ctx_new, ork_last_error, ork_mul_mat_id_check,
    ork_mul_mat_id_pair_check, ork_supports_type, ork_tensor, ORK_NOT_HANDLED,
};
use ork_moe::moe::desc::GGML_TYPE_I32;
use ork_moe::quant::GgmlType;
use serde_json::json;
use std::ffi::{c_char, c_void, CStr};
use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

const ROUNDS: usize = 15;
const CALLS: usize = 20_000;
/// Qwen3-30B-A3B: layers, experts, experts per token, hidden size, expert FFN size.
const LAYERS: usize = 48;
const N_EXPERT: usize = 128;
const N_USED: usize = 8;
const HIDDEN: usize = 2048;
const FFN: usize = 768;

/// One decode-step MUL_MAT_ID's tensors, named as llama.cpp names them; no data (a check reads
/// metadata only).
struct Decode {
    w: [ork_tensor; 2],
    b: ork_tensor,
    ids: ork_tensor,
    dst: [ork_tensor; 2],
}

/// A contiguous tensor's descriptor; `block` is (values, bytes) of one block or element.
fn tensor(ty: i32, ne: [usize; 3], block: (usize, usize), data: usize, name: &CStr) -> ork_tensor {
    let nb0 = block.1;
    let nb1 = ne[0] / block.0 * nb0;
    let nb2 = nb1 * ne[1];
    ork_tensor {
        r#type: ty,
        ne: [ne[0] as i64, ne[1] as i64, ne[2] as i64, 1],
        nb: [nb0, nb1, nb2, nb2 * ne[2]],
        data: data as *mut c_void,
        name: name.as_ptr() as *const c_char,
    }
}

impl Decode {
    /// `k × n` experts of type code `code` (`ty`'s blocks), `b_rows` activation rows per token.
    fn new(ty: GgmlType, code: i32, k: usize, n: usize, b_rows: usize) -> Decode {
        let w = |addr, name| {
            let block = (ty.block_elems(), ty.block_bytes());
            tensor(code, [k, n, N_EXPERT], block, addr, name)
        };
        let f32s = |ne, addr, name| tensor(GgmlType::F32.id(), ne, (1, 4), addr, name);
        Decode {
            w: [
                w(0x1000_0000, c"blk.0.ffn_up_exps.weight"),
                w(0x5000_0000, c"blk.0.ffn_gate_exps.weight"),
            ],
            b: f32s([k, b_rows, 1], 0x9000_0000, c"ffn_norm-0 (reshaped)"),
            ids: tensor(
                GGML_TYPE_I32,
                [N_USED, 1, 1],
                (1, 4),
                0x9100_0000,
                c"ffn_moe_topk-0",
            ),
            dst: [
                f32s([n, N_USED, 1], 0x9200_0000, c"ffn_moe_up-0"),
                f32s([n, N_USED, 1], 0x9300_0000, c"ffn_moe_gate-0"),
            ],
        }
    }

    fn check(&self, ctx: *const ork_ctx) -> u32 {
        ork_mul_mat_id_check(ctx, &self.w[0], &self.b, &self.ids, &self.dst[0])
    }

    fn pair_check(&self, ctx: *const ork_ctx) -> u32 {
        let (w, d) = (&self.w, &self.dst);
        ork_mul_mat_id_pair_check(ctx, &w[0], &w[1], &self.b, &self.ids, &d[0], &d[1])
    }
}

/// Median over interleaved rounds of the nanoseconds per call of each of `calls`.
fn per_call_ns(calls: &[&dyn Fn() -> u32]) -> Vec<f64> {
    let mut rounds = vec![Vec::with_capacity(ROUNDS); calls.len()];
    for _ in 0..ROUNDS {
        for (f, times) in calls.iter().zip(&mut rounds) {
            let t = Instant::now();
            for _ in 0..CALLS {
                black_box(f());
            }
            times.push(t.elapsed().as_secs_f64() * 1e9 / CALLS as f64);
        }
    }
    rounds
        .into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect()
}

pub fn run(opts: &Options) -> Result<ExitCode, String> {
    let ctx = ork_ctx_new(std::ptr::null());
    if ctx.is_null() {
        // SAFETY: ork_last_error returns a NUL-terminated string valid until the next failure.
        let msg = unsafe { CStr::from_ptr(ork_last_error()) };
        return Err(format!("ork_ctx_new: {}", msg.to_string_lossy()));
    }
    let types = opts.types(&[GgmlType::Q4_0, GgmlType::Q4_K]);
    let mut rows = Vec::new();
    for ty in types {
        if ty.row_bytes(FFN).is_none() {
            continue;
        }
        let code = ty.id();
        let (gate, down) = (
            Decode::new(ty, code, HIDDEN, FFN, 1),
            Decode::new(ty, code, FFN, HIDDEN, N_USED),
        );
        for (what, d) in [("gate", &gate), ("down", &down)] {
            let rc = d.check(ctx);
            if rc != ORK_NOT_HANDLED {
                return Err(format!(
                    "{} {what} decode check returned {rc}, not NOT_HANDLED: run with the \
                     default ORK_MIN_ROWS",
                    ty.name()
                ));
            }
        }
        let ns = per_call_ns(&[
            &|| ork_supports_type(code) as u32,
            &|| gate.pair_check(ctx),
            &|| gate.check(ctx),
            &|| down.check(ctx),
        ]);
        let [supports, pair, gate_ns, down_ns] = ns[..] else {
            unreachable!()
        };
        // Per layer and thread the patch asks: the up/gate pair (supports_type for both), then
        // up, gate and down alone (supports_type each).
        let layer = 5.0 * supports + pair + 2.0 * gate_ns + down_ns;
        rows.push((
            ty,
            supports,
            pair,
            gate_ns,
            down_ns,
            layer * LAYERS as f64 / 1e3,
        ));
    }
    ork_ctx_free(ctx);
    if opts.json {
        json::print_rows(
            rows.iter()
                .map(|&(ty, s, p, g, d, step)| {
                    json!({
                        "type": ty.name(),
                        "supports_type_ns": fixed(s),
                        "pair_check_ns": fixed(p),
                        "gate_check_ns": fixed(g),
                        "down_check_ns": fixed(d),
                        "step_us_per_thread": fixed(step),
                    })
                })
                .collect(),
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "declined decode calls (Qwen3-30B-A3B, 1 token, {N_USED} of {N_EXPERT} experts), ns per \
         call, medians of {ROUNDS} interleaved rounds of {CALLS} calls"
    );
    println!(
        "{:<6} {:>14} {:>14} {:>15} {:>15} {:>22}",
        "type",
        "supports_type",
        "pair_check",
        "check gate/up",
        "check down",
        "per step, per thread"
    );
    for (ty, s, p, g, d, step) in rows {
        println!(
            "{:<6} {s:>14.1} {p:>14.1} {g:>15.1} {d:>15.1} {:>19.1} us",
            ty.name(),
            step
        );
    }
    Ok(ExitCode::SUCCESS)
}
