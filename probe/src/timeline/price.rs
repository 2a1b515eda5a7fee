//! A task's solo time (alone on its unit, at full speed) and its DRAM bytes: a CPU stage at its
//! core's rate, never moving more than twice that core's memcpy per second; an NPU run as the
//! emulator's cost model prices it on one core.

use super::params::Params;
use super::work::{Unit, Work};
use ork_moe::npu::emu::modelled_submit;
use ork_moe::quant::GgmlType;

/// The kind of core a task runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Core {
    Big,
    Little,
    Npu,
    None,
}

/// A task's time alone on `core` (µs) and its DRAM bytes.
pub fn price(w: &Work, core: Core, p: &Params) -> (f64, u64) {
    let speed = if core == Core::Little {
        p.little_core_factor
    } else {
        1.0
    };
    let memcpy = if core == Core::Little {
        p.memcpy_gbps_little_core
    } else {
        p.memcpy_gbps_big_core
    };
    // Per byte on a big core at `gbps`, slower on a little one.
    let at = |bytes: u64, gbps: f64| bytes as f64 / (gbps * 1e3 * speed);
    let (us, bytes) = match *w {
        Work::Join => (0.0, 0),
        Work::Route { rows } => (rows as f64 / (p.route_mrows_big_core * speed), 0),
        Work::Quant { elems } => (
            elems as f64 / (p.quant_gelems_big_core * 1e3 * speed),
            5 * elems,
        ),
        Work::Gather { bytes } => (at(bytes, p.gather_gbps_big_core), 2 * bytes),
        Work::Concat { bytes } => (bytes as f64 / (memcpy * 1e3), 2 * bytes),
        Work::Lookup => (p.lookup_us / speed, 0),
        // The kernel zeroes the pages it hands out.
        Work::BufferCreate { bytes } => (p.buffer_create_us, bytes),
        Work::Inflate {
            ty,
            q_bytes,
            out_bytes,
        } => (at(out_bytes, inflate_gbps(ty, p)), q_bytes + out_bytes),
        // Maintenance of lines mostly written back already: CPU time, little DRAM traffic.
        Work::Sync { bytes } => (p.sync_us + at(bytes, p.sync_gbps), 0),
        Work::ContextCreate => (p.context_create_us, 0),
        Work::Run { primitive, m, k, n } => {
            let parts = modelled_submit(
                &p.npu_cost(),
                primitive,
                &[(m as usize, k as usize, n as usize)],
                &[0],
            );
            (parts.total_us(&p.npu_cost()), parts.bytes)
        }
        Work::Outliers {
            ty,
            weights,
            q_bytes,
        } => {
            let gweights = match ty {
                GgmlType::Q4_K | GgmlType::Q6_K => p.outlier_gweights_big_core_kquant,
                _ => p.outlier_gweights_big_core,
            };
            (weights as f64 / (gweights * 1e3 * speed), q_bytes)
        }
        Work::Scatter { c_bytes, dst_bytes } => {
            (at(dst_bytes, p.scatter_gbps_big_core), c_bytes + dst_bytes)
        }
        Work::Submit { runs } => (
            runs as f64 * p.submit_cpu_us * p.leftover_cpu_factor / speed,
            0,
        ),
        Work::Elementwise { elems } => (
            elems as f64 / (p.elementwise_gelems_big_core * 1e3 * speed),
            8 * elems,
        ),
        Work::Dense { us, bytes } => (us / speed, bytes),
    };
    let cap = match core {
        Core::Big | Core::Little => bytes as f64 / (2.0 * memcpy * 1e3),
        Core::Npu | Core::None => 0.0,
    };
    (us.max(cap), bytes)
}

/// Inflate output GB/s of one big core for `ty`.
fn inflate_gbps(ty: GgmlType, p: &Params) -> f64 {
    match ty {
        GgmlType::Q4_K => p.inflate_gbps_big_core_q4_k,
        GgmlType::Q5_0 => p.inflate_gbps_big_core_q5_0,
        GgmlType::Q8_0 => p.inflate_gbps_big_core_q8_0,
        GgmlType::Q6_K => p.inflate_gbps_big_core_q6_k,
        GgmlType::Q4_1 => p.inflate_gbps_big_core_q4_1,
        _ => p.inflate_gbps_big_core,
    }
}

pub fn core_of(unit: Unit) -> Core {
    match unit {
        Unit::Free => Core::None,
        Unit::Big | Unit::AnyCpu => Core::Big,
        Unit::Little => Core::Little,
        Unit::Npu(_) | Unit::AnyNpu => Core::Npu,
    }
}
