//! The part of `rknn_api.h` / `rknn_matmul_api.h` (SDK 2.3.2) this backend uses, laid out as the
//! C headers lay it out (checked at compile time), and the library opened with `dlopen`.
//!
//! Required symbols are those of SDK >= 2.0 (`rknn_create_mem2` is new there, and before 2.0
//! `rknn_matmul_info` had another layout); the dynamic-shape pair is optional: 2.0 names the creator
//! `rknn_matmul_create_dyn_shape`, 2.1 on `rknn_matmul_create_dynamic_shape` (same prototype).

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
/// `RKNN_MAX_DYNAMIC_SHAPE_NUM`: shapes one dynamic-shape context may declare.
pub(super) const MAX_DYNAMIC_SHAPES: usize = 512;
/// `RKNN_NPU_CORE_0`; core `i` is `CORE_0 << i`.
pub(super) const CORE_0: c_int = 1;

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

/// `rknn_matmul_shape`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulShape {
    pub m: i32,
    pub k: i32,
    pub n: i32,
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
    assert!(size_of::<MatmulShape>() == 12);
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
type CreateDynamicFn = unsafe extern "C" fn(
    *mut Context,
    *mut MatmulInfo,
    c_int,
    *mut MatmulShape,
    *mut IoAttr,
) -> c_int;
type SetDynamicShapeFn = unsafe extern "C" fn(Context, *mut MatmulShape) -> c_int;

/// The dynamic-shape entry points (one context serving several M).
pub struct Dynamic {
    pub create: CreateDynamicFn,
    pub set_shape: SetDynamicShapeFn,
}

/// The runtime's entry points.
pub struct Api {
    /// The name it was opened by.
    pub path: String,
    /// The file the dynamic loader found, when it can tell.
    pub file: Option<String>,
    /// The version string compiled into the library (`librknnrt version: 2.3.2 (...)`), if found.
    pub version: Option<String>,
    pub matmul_create: CreateFn,
    pub matmul_set_io_mem: SetIoMemFn,
    pub matmul_set_core_mask: SetCoreMaskFn,
    pub matmul_run: CtxFn,
    pub matmul_destroy: CtxFn,
    pub create_mem2: CreateMem2Fn,
    pub create_mem_from_fd: CreateMemFromFdFn,
    pub destroy_mem: DestroyMemFn,
    pub mem_sync: MemSyncFn,
    pub dynamic: Option<Dynamic>,
}

/// What an older runtime is told.
const SDK_NEEDED: &str = "ork-moe needs the NPU runtime of SDK 2.0 or newer (rknn_create_mem2, \
     rknn_mem_sync, the 64-byte rknn_matmul_info); install librknnrt.so of SDK 2.3.2 from \
     airockchip/rknn-toolkit2 (rknpu2/runtime/Linux/librknn_api/aarch64), see docs/BOARD.md";

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
        let sym = |name: &str| -> Option<*mut c_void> {
            let c = CString::new(name).expect("symbol names have no NUL");
            // SAFETY: handle is a live dlopen handle, c a valid C string.
            let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        let create = sym("rknn_matmul_create").ok_or_else(|| {
            format!("{path} has no rknn_matmul_create: not the Rockchip NPU runtime")
        })?;
        let file = loaded_file(create);
        let version = file.as_deref().and_then(super::diag::runtime_version);
        let found = || {
            let v = version.as_deref().unwrap_or("of unknown version");
            match &file {
                Some(f) if f != path => format!("{path} ({f}, librknnrt {v})"),
                _ => format!("{path} (librknnrt {v})"),
            }
        };
        if let Some(v) = version.as_deref().and_then(super::diag::version_number) {
            if v < (2, 0) {
                return Err(format!("{}: {SDK_NEEDED}", found()));
            }
        }
        let need = |name: &str| {
            sym(name).ok_or_else(|| format!("{}: missing symbol {name}; {SDK_NEEDED}", found()))
        };
        let set_shape = sym("rknn_matmul_set_dynamic_shape");
        let create_dynamic =
            sym("rknn_matmul_create_dynamic_shape").or_else(|| sym("rknn_matmul_create_dyn_shape"));
        // SAFETY: in every transmute below, the symbol is the runtime's function of that name, whose C
        // prototype in rknn_api.h / rknn_matmul_api.h matches the function pointer type it becomes
        // (the two dynamic-shape creators share one prototype).
        unsafe {
            Ok(Api {
                path: path.to_string(),
                matmul_create: std::mem::transmute::<*mut c_void, CreateFn>(create),
                matmul_set_io_mem: std::mem::transmute::<*mut c_void, SetIoMemFn>(need(
                    "rknn_matmul_set_io_mem",
                )?),
                matmul_set_core_mask: std::mem::transmute::<*mut c_void, SetCoreMaskFn>(need(
                    "rknn_matmul_set_core_mask",
                )?),
                matmul_run: std::mem::transmute::<*mut c_void, CtxFn>(need("rknn_matmul_run")?),
                matmul_destroy: std::mem::transmute::<*mut c_void, CtxFn>(need(
                    "rknn_matmul_destroy",
                )?),
                create_mem2: std::mem::transmute::<*mut c_void, CreateMem2Fn>(need(
                    "rknn_create_mem2",
                )?),
                create_mem_from_fd: std::mem::transmute::<*mut c_void, CreateMemFromFdFn>(need(
                    "rknn_create_mem_from_fd",
                )?),
                destroy_mem: std::mem::transmute::<*mut c_void, DestroyMemFn>(need(
                    "rknn_destroy_mem",
                )?),
                mem_sync: std::mem::transmute::<*mut c_void, MemSyncFn>(need("rknn_mem_sync")?),
                dynamic: create_dynamic.zip(set_shape).map(|(c, s)| Dynamic {
                    create: std::mem::transmute::<*mut c_void, CreateDynamicFn>(c),
                    set_shape: std::mem::transmute::<*mut c_void, SetDynamicShapeFn>(s),
                }),
                file,
                version,
            })
        }
    }

    /// How the library is named in messages: the name it was opened by and the file it is.
    pub fn describe(&self) -> String {
        match &self.file {
            Some(f) if *f != self.path => format!("{} ({f})", self.path),
            _ => self.path.clone(),
        }
    }
}

/// The file of the shared object that holds `addr` (what `dlopen` resolved a bare name to).
fn loaded_file(addr: *mut c_void) -> Option<String> {
    // SAFETY: Dl_info is plain data (pointers and an address), for which all zeros is a value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: addr is a symbol of a loaded library; dladdr only writes info.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a C string owned by the loader for as long as the library stays loaded
    // (it is never unloaded); it is copied at once.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(name.to_string_lossy().into_owned())
}
