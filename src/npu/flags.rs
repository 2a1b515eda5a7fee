//! The rknpu kernel driver's memory flags (`rknpu_ioctl.h`), carried by every
//! [`Buffer`](super::Buffer).

pub const NON_CONTIGUOUS: u32 = 1 << 0;
/// CPU accesses go through the cache: CPU writes need a sync to the device, device writes a
/// sync from the device.
pub const CACHEABLE: u32 = 1 << 1;
pub const WRITE_COMBINE: u32 = 1 << 2;
pub const KERNEL_MAPPING: u32 = 1 << 3;
pub const IOMMU: u32 = 1 << 4;
pub const ZEROING: u32 = 1 << 5;
pub const SECURE: u32 = 1 << 6;
pub const DMA32: u32 = 1 << 7;
pub const TRY_ALLOC_SRAM: u32 = 1 << 8;
pub const TRY_ALLOC_NBUF: u32 = 1 << 9;
pub const IOMMU_LIMIT_IOVA_ALIGNMENT: u32 = 1 << 10;
/// Every flag the driver knows.
pub const ALL: u32 = (1 << 11) - 1;
/// Default for buffers the CPU fills (weights, activations): fast CPU writes, explicit syncs.
pub const CPU_FILLED: u32 = NON_CONTIGUOUS | CACHEABLE | IOMMU_LIMIT_IOVA_ALIGNMENT;
/// Non-cacheable (write-combined CPU mapping): no syncs, slow CPU fills (about 1 GB/s on the board).
pub const UNCACHED: u32 = NON_CONTIGUOUS | IOMMU_LIMIT_IOVA_ALIGNMENT;
