//! Phase 1 of a call, on every one of its threads: the routing (once, by whichever thread comes
//! first) and the int8 quantization of the thread's share of the activation rows.

use super::call::{Call, QuantShare};
use super::desc::Problem;
use super::outliers::split_row;
use super::plan::Inputs;
use super::quantize::quantize_row_scaled;
use super::resources::{Resources, A_K};
use super::route::Routing;
use super::stats::Stage;
use super::{try_vec, Error};
use std::panic::{self, AssertUnwindSafe};
use std::time::Instant;

/// Phase 1, share `ith`: routing (computed once, by whichever thread comes first) and the
/// quantization of this share's activation rows.
pub(super) fn phase1(res: &Resources, call: &Call, io: &Inputs, ith: usize) {
    let p = &call.plan.problem;
    let routed = call.routing.get_or_init(|| {
        let t = Instant::now();
        let r = panic::catch_unwind(AssertUnwindSafe(|| Routing::new(p, io.ids)))
            .unwrap_or_else(|e| Err(Error::from_panic(e)));
        call.clock.add(Stage::Route, t);
        r
    });
    if routed.is_err() {
        return;
    }
    if call.quantized_at_gather() {
        return;
    }
    let t = Instant::now();
    let first = (ith * call.chunk).min(p.act_rows());
    let last = ((ith + 1) * call.chunk).min(p.act_rows());
    match quantize_rows(res, p, io, first, first..last, call.quantized_native()) {
        Ok(s) => {
            // Set once per share index; a second set cannot happen (one thread per ith).
            let _ = call.quant[ith].set(s);
        }
        Err(e) => call.fail(e),
    }
    call.clock.add(Stage::Quant, t);
}

/// The activation rows `rows` quantized (with the outlier split if configured), as a share
/// whose first row has index `first`: row after row, or with `native` in native A's order
/// (`[K/16][rows][16]`).
pub(super) fn quantize_rows(
    res: &Resources,
    p: &Problem,
    io: &Inputs,
    first: usize,
    rows: impl ExactSizeIterator<Item = usize>,
    native: bool,
) -> Result<QuantShare, Error> {
    let kp = res.tiles.pad(p.k);
    let n = rows.len();
    let mut q = try_vec(n * kp, 0i8, "quantized activations")?;
    let mut share = QuantShare {
        first,
        q: Vec::new(),
        scales: Vec::with_capacity(n),
        outliers: Vec::new(),
        ends: Vec::with_capacity(n),
    };
    let (mut scratch, mut channels) = (Vec::new(), Vec::new());
    let mut native_row = if native { vec![0i8; kp] } else { Vec::new() };
    for (i, r) in rows.enumerate() {
        let out = if native {
            &mut native_row[..]
        } else {
            &mut q[i * kp..(i + 1) * kp]
        };
        let off = p.b_offset(r);
        let x = &io.b[off..off + p.k];
        let scale = match res.config.outliers {
            Some(rule) => {
                scratch.resize(p.k, 0.0);
                let scale = split_row(x, rule, &mut scratch, &mut channels, out);
                share.outliers.extend(channels.iter().map(|&c| c as u32));
                scale
            }
            None => quantize_row_scaled(x, out),
        };
        share.scales.push(scale);
        share.ends.push(share.outliers.len() as u32);
        if native {
            for (kb, piece) in native_row.chunks_exact(A_K).enumerate() {
                let at = (kb * n + i) * A_K;
                q[at..at + A_K].copy_from_slice(piece);
            }
        }
    }
    share.q = q;
    Ok(share)
}
