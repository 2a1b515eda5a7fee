//! Device buffers of finished calls kept for reuse, so that a call does not pay for fresh zeroed
//! pages (allocation showed up as the largest host cost of a 512-token call).

use super::Error;
use crate::npu::{flags, Buffer, Device, Elem};
use crate::sync::lock;
use std::sync::Mutex;

/// Spare buffers kept per kind, and their total bytes.
const SPARE_COUNT: usize = 256;
const SPARE_BYTES: usize = 128 << 20;
/// Buffer lengths are rounded up to this many elements, so that spares fit later requests.
const SPARE_GRAIN: usize = 16 << 10;

/// Spare CPU-filled buffers of one element type.
pub(super) struct Spares<T: Elem>(Mutex<Vec<Buffer<T>>>);

impl<T: Elem> Default for Spares<T> {
    fn default() -> Spares<T> {
        Spares(Mutex::new(Vec::new()))
    }
}

impl<T: Elem> Spares<T> {
    /// The smallest spare holding at least `len` elements, or a new buffer.
    pub(super) fn take(&self, device: &Device, len: usize) -> Result<Buffer<T>, Error> {
        let mut pool = lock(&self.0);
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
        let mut pool = lock(&self.0);
        pool.push(b);
        let bytes = |p: &Vec<Buffer<T>>| p.iter().map(|b| b.len() * size_of::<T>()).sum::<usize>();
        while pool.len() > SPARE_COUNT || bytes(&pool) > SPARE_BYTES {
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
