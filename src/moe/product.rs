//! The int32 product of one work item: its expert's rows times its padded channels, on the device
//! or, for a small batch, on the CPU kernels; an expert deeper than one device GEMM as the sum
//! of its depth segments' products.

use super::cache::Segment;
use super::call::{Call, Item, Prepared, Product};
use super::resources::Resources;
use super::stats::{bump, Stage};
use super::Error;
use crate::npu::{in_stream_envelope, Buffer, CoreMask, MatMul};
use std::time::Instant;

/// The int32 product of `item` (its group's rows × padded channels `n0..n1`): on the device
/// (on `core`, or over the device's core mask), or on the CPU kernels for a small batch.
pub(super) fn product(
    res: &Resources,
    call: &Call,
    prep: &Prepared,
    item: &Item,
    core: Option<CoreMask>,
) -> Result<Product, Error> {
    let t = Instant::now();
    let m = call.routing().groups[item.group].len;
    let nc = item.n1 - item.n0;
    let segments = &prep.expert.segments;
    let mut c = res.spare_c.take(&res.device, res.tiles.c_len(m, nc))?;
    segment_product(res, call, prep, item, core, &segments[0], &mut c)?;
    // Deeper than one device GEMM: the segments' int32 products add up to the full one
    // exactly (|sum| <= K·127·127 < 2^31 for the K validation admits).
    let mut sum: Option<Vec<i32>> = None;
    for seg in &segments[1..] {
        let acc = match &mut sum {
            Some(acc) => acc,
            None => sum.insert(c.as_slice()[..res.tiles.c_len(m, nc)].to_vec()),
        };
        segment_product(res, call, prep, item, core, seg, &mut c)?;
        for (a, &x) in acc.iter_mut().zip(c.as_slice()) {
            *a += x;
        }
    }
    call.clock.add(Stage::Gemm, t);
    Ok(Product { c, sum })
}

/// The int32 product of `item` over one depth segment of its expert, into `c` (native C, the
/// group's rows × the item's channels).
fn segment_product(
    res: &Resources,
    call: &Call,
    prep: &Prepared,
    item: &Item,
    core: Option<CoreMask>,
    seg: &Segment,
    c: &mut Buffer<i32>,
) -> Result<(), Error> {
    let m = call.routing().groups[item.group].len;
    let (n0, nc) = (item.n0, item.n1 - item.n0);
    let ks = seg.k1 - seg.k0;
    let (a_offset, b_offset) = (seg.k0 * m, seg.b_offset + res.tiles.b_len(ks, n0));
    if call.plan.on_cpu {
        let shape = crate::gemm::Shape { m, kp: ks, np: nc };
        let a = &prep.a.as_slice()[a_offset..a_offset + res.tiles.a_len(m, ks)];
        let b = &prep.expert.b.as_slice()[b_offset..b_offset + res.tiles.b_len(ks, nc)];
        crate::gemm::gemm_isa(res.isa, &res.tiles, shape, a, b, c.as_mut_slice());
        bump(&res.counters.cpu_gemms, 1);
        return Ok(());
    }
    let mm = MatMul {
        m,
        k: ks,
        n: nc,
        a: &prep.a,
        a_offset,
        b: &prep.expert.b,
        b_offset,
        c_offset: 0,
    };
    // The stream envelope holds for the padded K too: 512 is a multiple of the padding.
    let sub = match core {
        Some(core) => res.device.prepare_i8_on(mm, c, core)?,
        None if in_stream_envelope(ks) => res.device.prepare_stream_i8(vec![mm], c)?,
        None => res.device.prepare_i8(mm, c)?,
    };
    sub.run_share(0, 1);
    sub.finish()?;
    Ok(c.sync_from_device()?)
}
