//! The stand-in librknnrt (rknnrt_standin.c) for the rknn tests: built once per variant and test
//! binary, then one private copy per test that needs its own switches or counters (each copy is a
//! separate library instance, so tests running at once do not share its state).
#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// The stand-in's build variants (`-DSTANDIN_SDK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sdk {
    /// 2.3.2, the default.
    V2_3,
    /// 2.0.0b0: dynamic shapes under their first name (`rknn_matmul_create_dyn_shape`).
    V2_0,
    /// 1.6.0: no `rknn_create_mem2`, no dynamic shapes.
    V1_6,
}

impl Sdk {
    fn flag(self) -> &'static str {
        match self {
            Sdk::V2_3 => "-DSTANDIN_SDK=232",
            Sdk::V2_0 => "-DSTANDIN_SDK=20",
            Sdk::V1_6 => "-DSTANDIN_SDK=16",
        }
    }
}

/// The C compiler for the target the tests run on: `ORK_STANDIN_CC`, else cargo's per-target
/// `CC_<triple>` or `CC`, else the Debian cross compiler when built for aarch64, else `cc`.
fn compiler() -> String {
    let triple = if cfg!(target_arch = "aarch64") {
        "aarch64_unknown_linux_gnu"
    } else {
        "x86_64_unknown_linux_gnu"
    };
    let from_env = [
        "ORK_STANDIN_CC".to_string(),
        format!("CC_{triple}"),
        "CC".to_string(),
    ]
    .into_iter()
    .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()));
    if let Some(cc) = from_env {
        return cc;
    }
    let cross = "aarch64-linux-gnu-gcc";
    let have_cross = Command::new(cross)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if cfg!(target_arch = "aarch64") && have_cross {
        cross.into()
    } else {
        "cc".into()
    }
}

/// The stand-in's source, embedded so that the tests of any package of the workspace (the
/// probe's too) build it from this one file.
const SOURCE: &str = include_str!("rknnrt_standin.c");

/// Builds the stand-in variant once per test binary; its path.
pub fn build(sdk: Sdk) -> &'static str {
    static LIBS: [OnceLock<String>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    LIBS[sdk as usize].get_or_init(|| {
        let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let stem = format!("librknnrt-standin-{sdk:?}-{}", std::process::id());
        let src = tmp.join(format!("{stem}.c"));
        std::fs::write(&src, SOURCE).expect("write the stand-in's source");
        let out = tmp.join(format!("{stem}.so"));
        let cc = compiler();
        let status = Command::new(&cc)
            .args([
                "-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-shared", "-fPIC",
            ])
            .arg(sdk.flag())
            .arg("-o")
            .arg(&out)
            .arg(&src)
            .arg("-lpthread")
            .status()
            .unwrap_or_else(|e| panic!("running {cc}: {e}"));
        assert!(
            status.success(),
            "{cc} failed to build the stand-in runtime"
        );
        out.to_string_lossy().into_owned()
    })
}

/// The stand-in's counters (`standin_counters` in the C file, same order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub imports: u64,
    pub live_views: u64,
    pub live_buffers: u64,
    pub contexts_created: u64,
    pub live_contexts: u64,
    pub binds: u64,
    pub runs: u64,
    pub violations: u64,
    pub overlapping_binds: u64,
    pub core_mask_refused: u64,
    pub shape_switches: u64,
    pub faults_injected: u64,
}

/// A private instance of the stand-in, configured before the backend opens it.
pub struct Standin {
    pub path: String,
    counters: unsafe extern "C" fn(*mut Counters),
}

impl Standin {
    /// A fresh copy of variant `sdk`, configured with `spec` (the words of RKNN_STANDIN).
    pub fn new(sdk: Sdk, spec: &str) -> Standin {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        // One test at a time between copying and dlopen, so no copy is opened half-written.
        static COPYING: Mutex<()> = Mutex::new(());
        let _guard = COPYING.lock().unwrap_or_else(|e| e.into_inner());
        let path = format!(
            "{}.{}.so",
            build(sdk).trim_end_matches(".so"),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        std::fs::copy(build(sdk), &path).expect("copy the stand-in");
        let c_path = CString::new(path.clone()).unwrap();
        // SAFETY: a valid path; loading the stand-in runs no initialiser but its config reader.
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen {path}");
        let sym = |name: &str| {
            let c = CString::new(name).unwrap();
            // SAFETY: a live handle and a valid C string.
            let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
            assert!(!p.is_null(), "{name} in the stand-in");
            p
        };
        // SAFETY: the stand-in's functions of these names have exactly these prototypes.
        let configure: unsafe extern "C" fn(*const c_char) -> c_int =
            unsafe { std::mem::transmute::<*mut c_void, _>(sym("rknn_standin_configure")) };
        // SAFETY: as above.
        let counters: unsafe extern "C" fn(*mut Counters) =
            unsafe { std::mem::transmute::<*mut c_void, _>(sym("rknn_standin_counters")) };
        let c_spec = CString::new(spec).unwrap();
        // SAFETY: a valid C string; the stand-in copies it.
        assert_eq!(unsafe { configure(c_spec.as_ptr()) }, 0, "spec {spec:?}");
        // The handle stays open: the backend's dlopen of the same path gets this instance.
        Standin { path, counters }
    }

    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        // SAFETY: writes one Counters, whose layout mirrors the C struct.
        unsafe { (self.counters)(&mut c) };
        c
    }
}
