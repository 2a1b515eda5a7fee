//! Device buffers: memory flags, an IOMMU domain, and the CPU's view of the elements.

use super::error::{Error, Result};
use super::flags;
use super::storage::{Elem, Storage};
use std::fmt;

/// A device buffer of `len` elements of `T` in one IOMMU domain.
pub struct Buffer<T: Elem> {
    device: u64,
    flags: u32,
    domain: u32,
    len: usize,
    storage: Box<dyn Storage<T>>,
}

impl<T: Elem> Buffer<T> {
    /// A buffer of `len` elements on the device numbered `device`, over the backend's `storage`.
    pub(super) fn new(
        device: u64,
        flags: u32,
        domain: u32,
        len: usize,
        storage: Box<dyn Storage<T>>,
    ) -> Buffer<T> {
        Buffer {
            device,
            flags,
            domain,
            len,
            storage,
        }
    }

    /// The number of the device that made this buffer: a submit takes only its own device's.
    pub(super) fn device_id(&self) -> u64 {
        self.device
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn flags(&self) -> u32 {
        self.flags
    }

    pub fn domain(&self) -> u32 {
        self.domain
    }

    pub fn is_cacheable(&self) -> bool {
        self.flags & flags::CACHEABLE != 0
    }

    /// The CPU view. For a cacheable output, call [`Buffer::sync_from_device`] after the submit
    /// first, or this shows what the CPU cache held before it.
    pub fn as_slice(&self) -> &[T] {
        self.storage.cpu()
    }

    /// The CPU view for writing. For a cacheable buffer, call [`Buffer::sync_to_device`] before
    /// a submit reads it.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        self.storage.cpu_mut()
    }

    /// Copies `data` into the CPU view at element `offset`.
    pub fn write(&mut self, offset: usize, data: &[T]) -> Result<()> {
        let end = offset
            .checked_add(data.len())
            .filter(|&e| e <= self.len)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "write of {} at {offset} past {}",
                    data.len(),
                    self.len
                ))
            })?;
        self.storage.cpu_mut()[offset..end].copy_from_slice(data);
        Ok(())
    }

    /// Makes the CPU's writes visible to the device (cache flush). A no-op for non-cacheable buffers.
    pub fn sync_to_device(&mut self) -> Result<()> {
        self.storage.sync_to_device()
    }

    /// Makes the device's writes visible to the CPU (cache invalidate). A no-op for non-cacheable
    /// buffers.
    pub fn sync_from_device(&mut self) -> Result<()> {
        self.storage.sync_from_device()
    }

    pub(crate) fn storage(&self) -> &dyn Storage<T> {
        &*self.storage
    }

    pub(crate) fn storage_mut(&mut self) -> &mut dyn Storage<T> {
        &mut *self.storage
    }
}

impl<T: Elem> fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("len", &self.len)
            .field("flags", &format_args!("{:#x}", self.flags))
            .field("domain", &self.domain)
            .finish()
    }
}
