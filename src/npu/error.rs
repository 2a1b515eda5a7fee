//! What a submit or an allocation can fail with.

use super::kinds::Primitive;
use std::fmt;

/// What a submit can fail with. Every variant is something the caller can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The shape is outside what this primitive does correctly on the NPU: use another primitive
    /// (`run_i8` for chain/stream) or the CPU.
    Envelope {
        primitive: Primitive,
        reason: String,
    },
    /// Inconsistent arguments: unpadded dims, an operand past the end of its buffer, overlapping
    /// outputs, a buffer of another device, bad flags...
    InvalidArgument(String),
    /// The IOMMU domain has no room for the buffer.
    OutOfMemory {
        domain: u32,
        requested: u64,
        available: u64,
    },
    /// A submit's buffers are not all in one IOMMU domain (on the board: fault, NPU soft reset).
    DomainMismatch { expected: u32, found: u32 },
    /// A cacheable input was written by the CPU and not synced to the device (strict emulation).
    NotSynced { operand: &'static str },
    /// The backend itself failed (runtime missing, runtime error code...).
    Device(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Envelope { primitive, reason } => {
                write!(f, "{} outside its envelope: {reason}", primitive.name())
            }
            Error::InvalidArgument(s) => write!(f, "invalid argument: {s}"),
            Error::OutOfMemory {
                domain,
                requested,
                available,
            } => {
                write!(f, "out of memory in IOMMU domain {domain}: {requested} bytes requested, {available} free")
            }
            Error::DomainMismatch { expected, found } => {
                write!(
                    f,
                    "buffers of one submit in different IOMMU domains ({expected} and {found})"
                )
            }
            Error::NotSynced { operand } => write!(
                f,
                "{operand} written by the CPU and not synced to the device"
            ),
            Error::Device(s) => write!(f, "device error: {s}"),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
