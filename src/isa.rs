//! Which instruction-set path the kernels take.
//!
//! Every kernel has a portable scalar reference; faster paths are chosen at run time from the
//! CPU's features. The configuration (`ORK_SIMD`, `crate::config`) can force a path (`scalar`,
//! `ssse3`, `avx2`, `avx512`, `neon`, `dotprod`) so tests and benchmarks pin one; a path the CPU
//! lacks is refused there, never run into an illegal instruction. Callers pass the path down
//! explicitly; [`Isa::best`] is the default.

use std::sync::OnceLock;

/// A kernel path. Later variants of one architecture include the earlier ones' features.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    Scalar,
    /// x86-64 SSSE3 (pshufb).
    Ssse3,
    /// x86-64 AVX2 (+FMA, F16C).
    Avx2,
    /// x86-64 AVX-512 F/BW/VL with VNNI.
    Avx512,
    /// aarch64 Advanced SIMD without the dot-product extension (Cortex-A72 and older).
    Neon,
    /// aarch64 with `sdot` (Cortex-A76/A55, as on RK3588).
    NeonDot,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Ssse3 => "ssse3",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
            Isa::NeonDot => "dotprod",
        }
    }

    pub fn from_name(s: &str) -> Option<Isa> {
        Isa::ALL
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(s.trim()))
    }

    pub const ALL: [Isa; 6] = [
        Isa::Scalar,
        Isa::Ssse3,
        Isa::Avx2,
        Isa::Avx512,
        Isa::Neon,
        Isa::NeonDot,
    ];

    /// Whether this CPU can run the path.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Ssse3 => std::arch::is_x86_feature_detected!("ssse3"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_available()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDot => std::arch::is_aarch64_feature_detected!("dotprod"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every path this CPU can run, scalar first: what the equality tests iterate over.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
    }

    /// The best path this CPU can run (detected once).
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| Isa::available().into_iter().max().unwrap_or(Isa::Scalar))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_scalar_is_always_there() {
        for isa in Isa::ALL {
            assert_eq!(Isa::from_name(isa.name()), Some(isa));
        }
        assert_eq!(Isa::available()[0], Isa::Scalar);
        assert!(Isa::best().is_available());
    }
}
