//! The board model's parameters: every one with its unit and source (or "assumption"),
//! overridable by name, loadable from a board profile (`profile`), and printed with every
//! result.

use ork_moe::npu::emu::{CostModel, DOMAIN_BYTES};

/// Name, unit and source of one parameter.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub name: &'static str,
    pub unit: &'static str,
    pub source: &'static str,
}

const MIB: f64 = (1u64 << 20) as f64;

/// One definition per parameter: the struct field, the [`SPECS`] row and the by-name access are
/// generated from the same line, so they cannot drift apart.
macro_rules! params {
    ($($field:ident: $unit:literal = $default:expr; $source:literal;)*) => {
        /// The parameters, by field; [`SPECS`] lists them with units and sources, in this order.
        #[derive(Clone, Debug, PartialEq)]
        pub struct Params {
            $(pub $field: f64,)*
        }

        impl Default for Params {
            fn default() -> Params {
                Params { $($field: $default,)* }
            }
        }

        /// Every parameter, in the order the results print them.
        pub const SPECS: &[Spec] = &[$(Spec {
            name: stringify!($field),
            unit: $unit,
            source: $source,
        },)*];

        impl Params {
            /// The value of parameter `name`.
            pub fn get(&self, name: &str) -> Option<f64> {
                match name {
                    $(stringify!($field) => Some(self.$field),)*
                    _ => None,
                }
            }

            fn slot(&mut self, name: &str) -> Option<&mut f64> {
                match name {
                    $(stringify!($field) => Some(&mut self.$field),)*
                    _ => None,
                }
            }
        }
    };
}

params! {
    run_us_floor: "us" = CostModel::default().submit_us;
        "fixed cost of one rknn_matmul_run: published 54-67 us (resident, M=1) up to 174-407 us \
         (oRKLLM/ork-driver board runs, shared/reference/rk3588-npu-facts.md); the cost model's \
         default (src/npu/emu/cost.rs)";
    task_us: "us" = CostModel::default().task_us;
        "assumption (cost model): set-up of one hardware task on a core";
    core_tops: "TOPS" = CostModel::default().core_tops;
        "sustained int8 per NPU core: peak 2, 0.4-1.4 seen on large GEMMs (cost model default)";
    dram_gbps: "GB/s" = CostModel::default().dram_gbps;
        "DRAM bytes (read+written) one NPU run moves per second: 10-20 GB/s for streams the CPU \
         fills (cost model default)";
    cores: "NPU cores" = 3.0;
        "RK3588: 3 NPU cores (rknn_matmul_set_core_mask CORE_0..2)";
    context_create_us: "us" = 5000.0;
        "assumption: no public figure for rknn_matmul_create; a context compiles a register \
         program and creates its own buffers, each a MEM_CREATE (see buffer_create_us). The board \
         check measures it";
    buffer_create_us: "us" = 3400.0;
        "creating one expert-sized device buffer (MEM_CREATE + IOMMU map): 3.4 ms per 1.75 MiB \
         expert measured on a ROCK 5B, 'pure MEM_CREATE+IOMMU-map+DMA' (oRKLLM/ork-driver \
         MOE_LAYER_BLOCK_WIP.md, S0)";
    sync_us: "us" = 10.0;
        "assumption: fixed cost of one rknn_mem_sync (an ioctl); the board check measures it";
    sync_gbps: "GB/s" = 20.0;
        "assumption: CPU cache maintenance by address over a buffer whose lines are mostly \
         written back already; the board check measures it";
    domain_mb: "MiB" = DOMAIN_BYTES as f64 / MIB;
        "usable IOVA of one IOMMU domain, about 3.9 GiB of 4 (ork-driver board notes; \
         src/npu/emu DOMAIN_BYTES)";
    prefetch_mb: "MiB" = 1024.0;
        "the engine's staging budget for prefetched experts, ORK_PREFETCH_MB (default 1024 MiB), \
         inside one IOMMU domain";
    big_cores: "cores" = 4.0;
        "RK3588: 4 Cortex-A76 at 2.2-2.4 GHz (sbc-bench results/41BH.txt, ROCK 5B); ggml's \
         threads run on them (the CPU-only reference used taskset 4-7, -t 4)";
    little_cores: "cores" = 4.0;
        "RK3588: 4 Cortex-A55 at 1.8 GHz (same source)";
    little_core_factor: "x big core" = 0.4;
        "assumption: an A55 does a stage at 0.4x an A76 (in-order, half the NEON width, \
         1.8 vs 2.35 GHz; its memcpy is 0.56x the A76's, sbc-bench 41BH)";
    memcpy_gbps_big_core: "GB/s" = 10.8;
        "tinymembench standard memcpy on one A76 of a ROCK 5B: 10814 MB/s copied (sbc-bench \
         results/41BH.txt; 10.9-13.6 GB/s on other RK3588 boards in sbc-bench Results.md); \
         a core moves at most twice this (read + write)";
    memcpy_gbps_little_core: "GB/s" = 6.1;
        "tinymembench standard memcpy on one A55 of a ROCK 5B: 6114 MB/s (sbc-bench 41BH)";
    shared_dram_gbps: "GB/s" = 20.0;
        "DRAM bytes read+written per second shared by all CPU cores and the NPU: 17-22 GB/s \
         sequential on an RK1 (Turing Pi, RK1 compute module benchmarks); one A76's memcpy \
         already moves 21.6; the Mali GPU reads 25-27 (clpeak, Mixtile Blade 3)";
    inflate_gbps_big_core: "GB/s" = 2.67;
        "assumption: Q4_0 inflate, int8 bytes written per second on one A76, from the NEON \
         (dotprod) inflate out of q4_0_4x4 (the layout ggml gives the A76): 40.5 instructions per \
         32 weights at K=2048 (gate/up), 48.4 at K=768 (down), qemu counts (docs/BOARD-MODEL.md), \
         weighted 2:1 by the projections' weights, at an assumed 1.5 per cycle at 2.4 GHz (as \
         outlier_gweights_big_core); the board check measures it";
    inflate_gbps_big_core_q4_k: "GB/s" = 2.65;
        "assumption: Q4_K, derived as inflate_gbps_big_core from q4_K_8x4: 41.8 / 46.6 \
         instructions per 32 weights";
    inflate_gbps_big_core_q5_0: "GB/s" = 2.59;
        "assumption: Q5_0 (never repacked), derived as inflate_gbps_big_core: 42.1 / 49.3 \
         instructions per 32 weights";
    inflate_gbps_big_core_q8_0: "GB/s" = 2.15;
        "assumption: Q8_0, derived as inflate_gbps_big_core from q8_0_4x4: 51.2 / 58.1 \
         instructions per 32 weights";
    inflate_gbps_big_core_q6_k: "GB/s" = 2.16;
        "assumption: Q6_K, derived as inflate_gbps_big_core from q6_K_8x4: 51.5 / 56.7 \
         instructions per 32 weights";
    inflate_gbps_big_core_q4_1: "GB/s" = 3.06;
        "assumption: Q4_1 (never repacked), derived as inflate_gbps_big_core: 36.3 / 40.2 \
         instructions per 32 weights";
    quant_gelems_big_core: "Gelem/s" = 0.75;
        "assumption: activation quantization (f32 read, int8 written) on one A76 = this x86's \
         ~1 Gelem/s (perf split of ork-probe moe, docs/PERFORMANCE.md) x 0.75";
    gather_gbps_big_core: "GB/s" = 6.0;
        "assumption: gathering rows into native A, bytes written per second on one A76 = this \
         x86's ~8 GB/s x 0.75";
    scatter_gbps_big_core: "GB/s" = 4.7;
        "assumption: int32 C to scaled f32 dst, dst bytes per second on one A76 = this x86's \
         ~6.3 GB/s x 0.75";
    outlier_columns_down: "columns" = 55.0;
        "assumption: distinct outlier channels (ORK_OUTLIERS=6:8) per down-projection expert and \
         ubatch, as measured on the real-scale synthetic model (ggml-patch/realscale.sh: ~55 of \
         K=768, 2.3 per row, docs/PERFORMANCE.md); real Qwen3 activations may differ; 0 for \
         ORK_OUTLIERS=off";
    outlier_columns_gate_up: "columns" = 0.0;
        "assumption: the same for the gate/up input (none on the real-scale synthetic model)";
    outlier_gweights_big_core: "Gweight/s" = 0.36;
        "assumption: outlier-split weight columns (decode and correction) per second on one A76, \
         Q4_0/Q4_1/Q5_0/Q8_0: the decode of q4_0_4x4 (the A76's Q4_0 layout) is 6.1 NEON \
         instructions per weight (qemu count, docs/PERFORMANCE.md), at an assumed 1.5 per cycle \
         at 2.4 GHz 1.7 ns, times 1.64 for finding the outliers and adding the correction \
         (their share beside the decode in this x86's real-scale perf profile)";
    outlier_gweights_big_core_kquant: "Gweight/s" = 0.33;
        "assumption: the same for Q4_K/Q6_K: q4_K_8x4 6.6 instructions per weight (q6_K_8x4 \
         6.4), 1.8 ns, times 1.64";
    route_mrows_big_core: "Mrows/s" = 140.0;
        "assumption: routing (count + group the (token, slot) rows) on one A76 = this x86's \
         ~190 Mrows/s x 0.75";
    lookup_us: "us" = 4.0;
        "assumption: one expert-cache hit (key + sampled fingerprint) on one A76 = this x86's \
         ~2.7 us / 0.75";
    elementwise_gelems_big_core: "Gelem/s" = 1.0;
        "assumption: ggml's SiLU*mul and expert combine on one A76 (streaming f32 ops)";
    cpu_only_reference_tokps: "tok/s" = 21.3;
        "CPU-only llama.cpp prefill on a ROCK 5B (RK3588), Qwen3.6-35B-A3B Q4_K_M, llama-bench \
         pp64, taskset 4-7, -t 4: 21.30 tok/s (oRKLLM/ork-driver MOE_LAYER_BLOCK_WIP.md); for \
         context: Raspberry Pi 5 (4x A76), Qwen3-30B-A3B Q3_K_S, pp512 10.91 tok/s \
         (geerlingguy/ai-benchmarks#47)";
    reference_context: "tokens" = 64.0;
        "prompt length of the reference measurement (pp64)";
    mul_mat_id_share: "of CPU time" = 0.725;
        "assumption: MUL_MAT_ID's share of CPU-only prefill time, the middle of an estimated \
         70-75 %; measured on the x86 dev box (plain llama.cpp, repack on, 1 thread, pp512, a \
         4-layer Qwen3-30B-A3B-shaped model): 74 % Q4_0, 67 % Q4_K_M (docs/BOARD-MODEL.md)";
    dense_weight_bytes: "bytes/weight" = 0.5625;
        "assumption: the dense part's weights at Q4_K (4.5 bits), read once per ubatch";
    norm_gelems_big_core: "Gelem/s" = 0.5;
        "assumption: RMSNorm (the attention and FFN norms, Qwen3's q and k norms), f32 elements \
         per second on one A76: two streaming passes, half elementwise_gelems_big_core";
    rope_gelems_big_core: "Gelem/s" = 0.25;
        "assumption: RoPE on q and k, elements per second on one A76 (a sine and cosine per \
         pair, computed per row in ggml_rope_f32)";
    softmax_gelems_big_core: "Gelem/s" = 0.4;
        "assumption: the attention softmax (scale, mask, exp, sum), score elements per second on \
         one A76 (ggml_vec_soft_max_f32, vectorised expf)";
    kv_copy_gelems_big_core: "Gelem/s" = 0.5;
        "assumption: K and V written to the f16 KV cache (f32 to f16, V transposed), elements \
         per second on one A76";
    router_gmacs_big_core: "GMAC/s" = 5.0;
        "assumption: the F32 router matmul (llama-quantize keeps ffn_gate_inp in F32) on one \
         A76: 2 NEON FMA pipes of 4 lanes at 2.35 GHz is 18.8 GMAC/s peak, ggml's f32 path \
         reaches about a quarter of it";
    topk_us_per_token: "us" = 1.0;
        "assumption: the router's softmax over the experts, argsort, top-k and weight \
         normalisation, per token and layer on one A76";
    submit_cpu_us: "us" = 10.0;
        "assumption: CPU time of one rknn_matmul_run on its submitter thread (the submit ioctl \
         and the wake-up at its end); the rest of run_us_floor is the NPU's";
    leftover_cpu_factor: "x" = 1.0;
        "scale of the CPU leftover stages (norms, RoPE, softmax, KV copies, router and top-k, \
         submitter CPU time): 1 prices them at the rates above; the range takes 1.5 and 0.67";
    pi5_pp512_tokps: "tok/s" = 10.91;
        "Raspberry Pi 5 (4x A76, 2.4 GHz), Qwen3-30B-A3B Q3_K_S, 4 threads, llama-bench pp512 \
         (geerlingguy/ai-benchmarks#47): calibrates the attention's cost per MAC";
    pi5_pp4096_tokps: "tok/s" = 8.62;
        "the same board and model at pp4096 (same source): 21 % slower per token than pp512";
    pi5_clock_scale: "x" = 0.978;
        "the RK3588's A76 clock over the Pi 5's: 2348 MHz (sbc-bench 41BH, ROCK 5B) / 2400 MHz; \
         scales the Pi 5 figures to an RK3588 reference (memory differences ignored)";
    dmc_mhz: "MHz" = 2112.0;
        "memory-controller (DMC) frequency: 2112 MHz is the top of the RK3588 DMC table and \
         what the bandwidth figures were taken at; assumption: shared_dram_gbps, dram_gbps and \
         the memcpy rates scale with it (528 MHz when the DMC governor is missing, \
         airockchip/rknn-llm#532)";
}

/// The DMC frequency the bandwidth parameters' figures were measured at.
pub const DMC_MHZ_OF_RATES: f64 = 2112.0;

/// The position of parameter `name` in [`SPECS`].
pub fn index(name: &str) -> Option<usize> {
    SPECS.iter().position(|s| s.name == name)
}

impl Params {
    /// Sets parameter `name` after checking the value is one the model can use.
    pub fn set(&mut self, name: &str, value: f64) -> Result<(), String> {
        let ok = match name {
            _ if !value.is_finite() => false,
            "mul_mat_id_share" => value > 0.0 && value < 1.0,
            "cores" => (1.0..=3.0).contains(&value) && value.fract() == 0.0,
            "big_cores" => value >= 1.0 && value.fract() == 0.0,
            "little_cores" => value >= 0.0 && value.fract() == 0.0,
            "task_us" | "sync_us" | "lookup_us" | "context_create_us" | "buffer_create_us"
            | "run_us_floor" => value >= 0.0,
            "outlier_columns_down" | "outlier_columns_gate_up" => {
                value >= 0.0 && value.fract() == 0.0
            }
            _ => value > 0.0,
        };
        let slot = self
            .slot(name)
            .ok_or_else(|| format!("unknown board model parameter {name:?}"))?;
        if !ok {
            return Err(format!("{name} = {value} is out of range"));
        }
        *slot = value;
        Ok(())
    }

    /// The parameters at `dmc_mhz`: the bandwidths, taken at [`DMC_MHZ_OF_RATES`], scaled by
    /// the memory controller's frequency.
    pub fn at_dmc(&self) -> Params {
        let scale = self.dmc_mhz / DMC_MHZ_OF_RATES;
        Params {
            shared_dram_gbps: self.shared_dram_gbps * scale,
            dram_gbps: self.dram_gbps * scale,
            memcpy_gbps_big_core: self.memcpy_gbps_big_core * scale,
            memcpy_gbps_little_core: self.memcpy_gbps_little_core * scale,
            ..self.clone()
        }
    }

    /// The NPU part, as the emulator's cost model.
    pub fn npu_cost(&self) -> CostModel {
        CostModel {
            submit_us: self.run_us_floor,
            task_us: self.task_us,
            core_tops: self.core_tops,
            dram_gbps: self.dram_gbps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_parameter_has_a_source_and_a_settable_field() {
        let mut p = Params::default();
        for s in SPECS {
            assert!(!s.source.is_empty() && !s.unit.is_empty(), "{}", s.name);
            let v = p.get(s.name).unwrap();
            p.set(s.name, v).unwrap();
        }
        assert_eq!(p, Params::default());
        assert_eq!(p.npu_cost(), CostModel::default());
        assert!(p.set("nonsense", 1.0).is_err());
        assert!(p.set("mul_mat_id_share", 1.0).is_err());
        assert!(p.set("cores", 4.0).is_err());
        assert!(p.set("shared_dram_gbps", 0.0).is_err());
        assert!(p.set("core_tops", f64::NAN).is_err());
    }
}
