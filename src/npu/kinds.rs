//! The names the device layer counts and reports by: NPU cores, submit primitives, backends.

/// The three NPU cores, as a bit mask (`RKNN_NPU_CORE_0 = 1`, `_1 = 2`, `_2 = 4`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoreMask(pub u8);

impl CoreMask {
    pub const CORE_0: CoreMask = CoreMask(1);
    pub const CORE_1: CoreMask = CoreMask(2);
    pub const CORE_2: CoreMask = CoreMask(4);
    pub const ALL: CoreMask = CoreMask(7);
    /// Number of cores the RK3588 has.
    pub const CORES: usize = 3;

    /// The enabled core indices, lowest first. An empty or out-of-range mask means all cores.
    pub fn cores(self) -> Vec<usize> {
        let m = if self.0 & 7 == 0 { 7 } else { self.0 & 7 };
        (0..Self::CORES).filter(|c| m & (1 << c) != 0).collect()
    }
}

/// The submit primitives, for errors and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Primitive {
    RunI8,
    ChainI8,
    StreamI8,
}

impl Primitive {
    pub const ALL: [Primitive; 3] = [Primitive::RunI8, Primitive::ChainI8, Primitive::StreamI8];

    pub fn name(self) -> &'static str {
        match self {
            Primitive::RunI8 => "run_i8",
            Primitive::ChainI8 => "chain_i8",
            Primitive::StreamI8 => "stream_i8",
        }
    }

    /// Where this primitive's counters sit, as in [`Primitive::ALL`].
    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// Which backend a [`Device`](super::Device) runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    Emu,
    Rknn,
    Cpu,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Emu => "emu",
            BackendKind::Rknn => "rknn",
            BackendKind::Cpu => "cpu",
        }
    }
}
