//! The part of `rknn_api.h` / `rknn_matmul_api.h` (SDK 2.3.2) this backend uses, laid out as the
//! C headers lay it out (checked at compile time), and the library opened with `dlopen`.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::mem::{offset_of, size_of};

/// `rknn_context` / `rknn_matmul_ctx`: `uint64_t` everywhere but 32-bit ARM.
#[cfg(target_arch = "arm")]
pub type Context = u32;
#[cfg(not(target_arch = "arm"))]
pub type Context = u64;

pub(super) const MAX_NAME_LEN: usize = 256;
pub(super) const MAX_DIMS: usize = 16;

/// `RKNN_INT8_MM_INT8_TO_INT32`.
pub(super) const INT8_MM_INT8_TO_INT32: c_int = 2;
/// `RKNN_MM_LAYOUT_NATIVE`.
pub(super) const LAYOUT_NATIVE: i16 = 1;
/// `RKNN_QUANT_TYPE_PER_LAYER_SYM`.
pub(super) const QUANT_PER_LAYER_SYM: i16 = 0;
/// `RKNN_TENSOR_INT8`, `RKNN_TENSOR_INT32`.
pub(super) const TENSOR_INT8: c_int = 2;
pub(super) const TENSOR_INT32: c_int = 6;
/// `rknn_mem_alloc_flags` of `rknn_create_mem2` (not the driver's flags).
pub(super) const MEM_CACHEABLE: u64 = 1 << 0;
pub(super) const MEM_NON_CACHEABLE: u64 = 1 << 1;
pub(super) const MEM_TRY_ALLOC_SRAM: u64 = 1 << 2;
/// `rknn_mem_sync_mode`.
pub(super) const SYNC_TO_DEVICE: c_int = 1;
pub(super) const SYNC_FROM_DEVICE: c_int = 2;
/// `RKNN_SUCC`.
pub(super) const SUCC: c_int = 0;

/// `rknn_matmul_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MatmulInfo {
    pub m: i32,
    pub k: i32,
    pub n: i32,
    pub ty: c_int,
    pub b_layout: i16,
    pub b_quant_type: i16,
    pub ac_layout: i16,
    pub ac_quant_type: i16,
    pub iommu_domain_id: i32,
    pub group_size: i16,
    pub reserved: [i8; 34],
}

/// `rknn_matmul_tensor_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TensorAttr {
    pub name: [c_char; MAX_NAME_LEN],
    pub n_dims: u32,
    pub dims: [u32; MAX_DIMS],
    pub size: u32,
    pub ty: c_int,
}

/// `rknn_matmul_io_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IoAttr {
    pub a: TensorAttr,
    pub b: TensorAttr,
    pub c: TensorAttr,
}

/// `rknn_tensor_mem`.
#[repr(C)]
#[derive(Debug)]
pub struct TensorMem {
    pub virt_addr: *mut c_void,
    pub phys_addr: u64,
    pub fd: i32,
    pub offset: i32,
    pub size: u32,
    pub flags: u32,
    pub priv_data: *mut c_void,
}

const _: () = {
    assert!(size_of::<MatmulInfo>() == 64);
    assert!(offset_of!(MatmulInfo, ty) == 12);
    assert!(offset_of!(MatmulInfo, b_layout) == 16);
    assert!(offset_of!(MatmulInfo, ac_layout) == 20);
    assert!(offset_of!(MatmulInfo, iommu_domain_id) == 24);
    assert!(offset_of!(MatmulInfo, group_size) == 28);
    assert!(offset_of!(MatmulInfo, reserved) == 30);
    assert!(size_of::<TensorAttr>() == 332);
    assert!(offset_of!(TensorAttr, n_dims) == 256);
    assert!(offset_of!(TensorAttr, dims) == 260);
    assert!(offset_of!(TensorAttr, size) == 324);
    assert!(offset_of!(TensorAttr, ty) == 328);
    assert!(size_of::<IoAttr>() == 3 * 332);
    assert!(offset_of!(IoAttr, c) == 664);
};

#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<TensorMem>() == 40);
    assert!(offset_of!(TensorMem, phys_addr) == 8);
    assert!(offset_of!(TensorMem, fd) == 16);
    assert!(offset_of!(TensorMem, offset) == 20);
    assert!(offset_of!(TensorMem, size) == 24);
    assert!(offset_of!(TensorMem, flags) == 28);
    assert!(offset_of!(TensorMem, priv_data) == 32);
};

impl MatmulInfo {
    /// An int8 × int8 → int32 GEMM with every operand in the native layout.
    pub fn int8_native(m: usize, k: usize, n: usize, domain: u32) -> MatmulInfo {
        MatmulInfo {
            m: m as i32,
            k: k as i32,
            n: n as i32,
            ty: INT8_MM_INT8_TO_INT32,
            b_layout: LAYOUT_NATIVE,
            b_quant_type: QUANT_PER_LAYER_SYM,
            ac_layout: LAYOUT_NATIVE,
            ac_quant_type: QUANT_PER_LAYER_SYM,
            iommu_domain_id: domain as i32,
            group_size: 0,
            reserved: [0; 34],
        }
    }
}

impl IoAttr {
    pub fn zeroed() -> IoAttr {
        let t = TensorAttr {
            name: [0; MAX_NAME_LEN],
            n_dims: 0,
            dims: [0; MAX_DIMS],
            size: 0,
            ty: 0,
        };
        IoAttr { a: t, b: t, c: t }
    }
}

type CreateFn = unsafe extern "C" fn(*mut Context, *mut MatmulInfo, *mut IoAttr) -> c_int;
type SetIoMemFn = unsafe extern "C" fn(Context, *mut TensorMem, *mut TensorAttr) -> c_int;
type SetCoreMaskFn = unsafe extern "C" fn(Context, c_int) -> c_int;
type CtxFn = unsafe extern "C" fn(Context) -> c_int;
type CreateMem2Fn = unsafe extern "C" fn(Context, u64, u64) -> *mut TensorMem;
type CreateMemFromFdFn =
    unsafe extern "C" fn(Context, i32, *mut c_void, u32, i32) -> *mut TensorMem;
type DestroyMemFn = unsafe extern "C" fn(Context, *mut TensorMem) -> c_int;
type MemSyncFn = unsafe extern "C" fn(Context, *mut TensorMem, c_int) -> c_int;

/// The runtime's entry points.
pub struct Api {
    pub path: String,
    pub matmul_create: CreateFn,
    pub matmul_set_io_mem: SetIoMemFn,
    pub matmul_set_core_mask: SetCoreMaskFn,
    pub matmul_run: CtxFn,
    pub matmul_destroy: CtxFn,
    pub create_mem2: CreateMem2Fn,
    pub create_mem_from_fd: CreateMemFromFdFn,
    pub destroy_mem: DestroyMemFn,
    pub mem_sync: MemSyncFn,
}

/// Library names tried when no path is given.
pub(super) const DEFAULT_NAMES: [&str; 3] = [
    "librknnrt.so",
    "/usr/lib/librknnrt.so",
    "/usr/lib64/librknnrt.so",
];

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call on
    // this thread; it is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-NULL, NUL-terminated (above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

impl Api {
    /// Opens `path`, or the first of [`DEFAULT_NAMES`] that loads, and resolves every symbol.
    /// The library stays loaded for the life of the process (buffers may outlive any device).
    pub fn open(path: Option<&str>) -> Result<Api, String> {
        let candidates: Vec<&str> = match path {
            Some(p) => vec![p],
            None => DEFAULT_NAMES.to_vec(),
        };
        let mut errors = Vec::new();
        for name in candidates {
            let c_name =
                CString::new(name).map_err(|_| format!("library path {name:?} contains NUL"))?;
            // SAFETY: c_name is a valid C string; dlopen runs the library's initialisers, which is
            // what loading the vendor runtime means.
            let handle =
                unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if handle.is_null() {
                errors.push(format!("{name}: {}", dl_error()));
                continue;
            }
            return Api::resolve(handle, name);
        }
        Err(errors.join("; "))
    }

    fn resolve(handle: *mut c_void, path: &str) -> Result<Api, String> {
        let sym = |name: &str| -> Result<*mut c_void, String> {
            let c = CString::new(name).expect("symbol names have no NUL");
            // SAFETY: handle is a live dlopen handle, c a valid C string.
            let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
            if p.is_null() {
                Err(format!("{path}: missing symbol {name}"))
            } else {
                Ok(p)
            }
        };
        // SAFETY: in every transmute below, the symbol is the runtime's function of that name, whose C
        // prototype in rknn_api.h / rknn_matmul_api.h matches the function pointer type it becomes.
        unsafe {
            Ok(Api {
                path: path.to_string(),
                matmul_create: std::mem::transmute::<*mut c_void, CreateFn>(sym(
                    "rknn_matmul_create",
                )?),
                matmul_set_io_mem: std::mem::transmute::<*mut c_void, SetIoMemFn>(sym(
                    "rknn_matmul_set_io_mem",
                )?),
                matmul_set_core_mask: std::mem::transmute::<*mut c_void, SetCoreMaskFn>(sym(
                    "rknn_matmul_set_core_mask",
                )?),
                matmul_run: std::mem::transmute::<*mut c_void, CtxFn>(sym("rknn_matmul_run")?),
                matmul_destroy: std::mem::transmute::<*mut c_void, CtxFn>(sym(
                    "rknn_matmul_destroy",
                )?),
                create_mem2: std::mem::transmute::<*mut c_void, CreateMem2Fn>(sym(
                    "rknn_create_mem2",
                )?),
                create_mem_from_fd: std::mem::transmute::<*mut c_void, CreateMemFromFdFn>(sym(
                    "rknn_create_mem_from_fd",
                )?),
                destroy_mem: std::mem::transmute::<*mut c_void, DestroyMemFn>(sym(
                    "rknn_destroy_mem",
                )?),
                mem_sync: std::mem::transmute::<*mut c_void, MemSyncFn>(sym("rknn_mem_sync")?),
            })
        }
    }
}
