//! Device buffers of finished calls kept for reuse, so that a call does not pay for fresh zeroed
//! pages (allocation showed up as the largest host cost of a 512-token call), nor, on the board,
//! for a driver allocation and IOMMU mapping per buffer (milliseconds each): A and C of every
//! GEMM, and the native B of experts the cache did not keep.

use super::Error;
use crate::npu::{flags, Buffer, Device, Elem};
use crate::sync::lock;
use std::sync::Mutex;

/// Buffer lengths are rounded up to this many elements, so that spares fit later requests.
const SPARE_GRAIN: usize = 16 << 10;

/// Spare CPU-filled buffers of one element type, at most `count` of them and `bytes` in all.
pub(super) struct Spares<T: Elem> {
    pool: Mutex<Vec<Buffer<T>>>,
    count: usize,
    bytes: usize,
}

impl<T: Elem> Spares<T> {
    pub(super) fn new(count: usize, bytes: usize) -> Spares<T> {
        Spares {
            pool: Mutex::new(Vec::new()),
            count,
            bytes,
        }
    }

    /// The smallest spare holding at least `len` elements, or a new buffer.
    pub(super) fn take(&self, device: &Device, len: usize) -> Result<Buffer<T>, Error> {
        let mut pool = lock(&self.pool);
        let best = pool
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => Ok(pool.swap_remove(i)),
            None => {
                drop(pool);
                let len = len.div_ceil(SPARE_GRAIN) * SPARE_GRAIN;
                Ok(device.alloc::<T>(len, flags::CPU_FILLED, 0)?)
            }
        }
    }

    /// Keeps `b` for reuse within the count and byte limits (dropping the smallest spares first).
    pub(super) fn give(&self, b: Buffer<T>) {
        let mut pool = lock(&self.pool);
        pool.push(b);
        let bytes = |p: &Vec<Buffer<T>>| p.iter().map(|b| b.len() * size_of::<T>()).sum::<usize>();
        while pool.len() > self.count || bytes(&pool) > self.bytes {
            let smallest = pool
                .iter()
                .enumerate()
                .min_by_key(|(_, b)| b.len())
                .map(|(i, _)| i)
                .expect("not empty");
            pool.swap_remove(smallest);
        }
    }
}
