//! The RK3588 cost model: a *modelled* submit time from published figures, never a measurement.
//!
//! Figures (see docs/PERFORMANCE.md): 2 TOPS int8 peak per core, 0.4–1.4 TOPS seen in practice on
//! large GEMMs, a fixed per-submit cost of about 50–400 µs (public measurements disagree), DRAM
//! about 10–20 GB/s for streams the CPU fills. A submit costs its fixed cost plus the larger of
//! the busiest core's compute and the DRAM time of everything the tasks read and write.

/// Parameters of the model; each has an `ORK_EMU_*` variable (`crate::config`).
#[derive(Clone, Debug, PartialEq)]
pub struct CostModel {
    /// Fixed cost of one submit, µs (`ORK_EMU_SUBMIT_US`).
    pub submit_us: f64,
    /// Set-up cost of one task on a core, µs (`ORK_EMU_TASK_US`; no public figure, an assumption).
    pub task_us: f64,
    /// Sustained int8 TOPS of one core (`ORK_EMU_CORE_TOPS`; peak is 2).
    pub core_tops: f64,
    /// DRAM bandwidth the NPU gets, GB/s (`ORK_EMU_DRAM_GBPS`).
    pub dram_gbps: f64,
}

impl Default for CostModel {
    fn default() -> CostModel {
        CostModel {
            submit_us: 100.0,
            task_us: 2.0,
            core_tops: 0.4,
            dram_gbps: 15.0,
        }
    }
}

/// What the model needs of one task.
#[derive(Clone, Copy, Debug)]
pub struct TaskCost {
    pub core: usize,
    pub macs: u64,
    pub bytes: u64,
}

impl CostModel {
    /// Modelled time of one submit of `tasks`, µs.
    pub fn submit_us(&self, tasks: &[TaskCost]) -> f64 {
        let mut core_us = [0f64; super::super::CoreMask::CORES];
        let mut bytes = 0u64;
        for t in tasks {
            // One MAC is two operations; TOPS·1e6 operations per µs.
            core_us[t.core] += self.task_us + 2.0 * t.macs as f64 / (self.core_tops * 1e6);
            bytes += t.bytes;
        }
        let compute = core_us.into_iter().fold(0.0, f64::max);
        let memory = bytes as f64 / (self.dram_gbps * 1e3);
        self.submit_us + compute.max(memory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busiest_core_or_dram_bounds_the_time() {
        let m = CostModel {
            submit_us: 100.0,
            task_us: 0.0,
            core_tops: 1.0,
            dram_gbps: 10.0,
        };
        // 1e6 MACs = 2e6 ops at 1e6 ops/µs: 2 µs on core 0; 1 µs on core 1.
        let t = [
            TaskCost {
                core: 0,
                macs: 1_000_000,
                bytes: 0,
            },
            TaskCost {
                core: 1,
                macs: 500_000,
                bytes: 0,
            },
        ];
        assert!((m.submit_us(&t) - 102.0).abs() < 1e-9);
        // 1e5 bytes at 1e4 bytes/µs: 10 µs of DRAM dominates.
        let t = [TaskCost {
            core: 0,
            macs: 1_000_000,
            bytes: 100_000,
        }];
        assert!((m.submit_us(&t) - 110.0).abs() < 1e-9);
    }
}
