//! ork-moe: the routed-expert matmuls of Mixture-of-Experts models (ggml's `MUL_MAT_ID`) on the
//! RK3588 NPU.
//!
//! Layers, lowest first; each depends only on those above it in this list:
//! - [`quant`]: GGML block formats and their reference dequantization;
//! - [`layout`]: the NPU's native int8 tilings;
//! - [`inflate`]: quantized expert weights straight into native int8 B tiles plus channel scales;
//! - [`gemm`]: the CPU int8 GEMM that defines "correct" and serves as the CPU fallback;
//! - [`npu`]: the device interface with the emulated and the librknnrt backends;
//! - [`moe`]: the `MUL_MAT_ID` engine;
//! - [`config`]: the environment, read once, into the typed configuration passed down;
//! - [`ffi`]: the C ABI.
//!
//! [`isa`] (instruction-set detection), [`cpus`] (core types) and [`pool`] (the one worker pool)
//! sit beside the bottom layers and are shared by the kernels, the devices and the tools.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::missing_safety_doc)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod config;
pub mod cpus;
pub mod ffi;
pub mod gemm;
pub mod inflate;
pub mod isa;
pub mod layout;
pub mod moe;
pub mod npu;
pub mod pool;
pub mod quant;
mod sync;
#[cfg(any(test, feature = "testutil"))]
pub mod testutil;
