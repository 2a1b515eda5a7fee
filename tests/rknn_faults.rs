//! Faults injected into the stand-in runtime (RKNN_STANDIN's `fail=KIND:N`, `domain_mb=N`): what
//! the rknn backend returns for each, that nothing leaks, and that the device works on afterwards.

mod npu_util;
mod standin;

use npu_util::Case;
use ork_moe::npu::{flags, Device, Error, MatMul};
use standin::{Sdk, Standin};

/// A 2-core split GEMM (N = 64) with A at an offset, so one run touches every runtime call:
/// a view (import), a dynamic context per core (create), binds, runs, and syncs.
fn run_case(dev: &Device, case: &Case) -> Result<Vec<i32>, Error> {
    let mut a = dev.alloc::<i8>(64 + case.a.len(), flags::CPU_FILLED, 0)?;
    a.write(64, &case.a)?;
    a.sync_to_device()?;
    let mut b = dev.alloc::<i8>(case.b.len(), flags::CPU_FILLED, 0)?;
    b.write(0, &case.b)?;
    b.sync_to_device()?;
    let mut c = dev.alloc::<i32>(case.expected.len(), flags::CPU_FILLED, 0)?;
    let mm = MatMul {
        a_offset: 64,
        ..case.matmul(&a, &b)
    };
    dev.run_i8(mm, &mut c)?;
    c.sync_from_device()?;
    Ok(c.as_slice().to_vec())
}

/// Runs `spec`'s fault: the first call fails with what `expect` accepts, the next two are exact,
/// and once the device is gone the stand-in holds no buffer, view or context.
fn fault(spec: &str, expect: impl Fn(&Error) -> bool) {
    let s = Standin::new(Sdk::V2_3, spec);
    let dev = Device::rknn(Some(&s.path)).unwrap();
    let case = Case::random(3, 256, 64, 5);
    let err = run_case(&dev, &case).expect_err(spec);
    assert!(expect(&err), "{spec}: {err}");
    assert_eq!(s.counters().faults_injected, 1, "{spec}");
    for i in 0..2 {
        assert!(
            run_case(&dev, &case).unwrap() == case.expected,
            "{spec}: run {i} after the fault"
        );
    }
    drop(dev);
    let n = s.counters();
    assert_eq!(
        (n.live_buffers, n.live_views, n.live_contexts, n.violations),
        (0, 0, 0, 0),
        "{spec}: {n:?}"
    );
}

fn device_error(what: &'static str) -> impl Fn(&Error) -> bool {
    move |e| matches!(e, Error::Device(m) if m.contains(what))
}

#[test]
fn a_failed_allocation_is_out_of_memory() {
    // The 1st allocation after open (A).
    fault("fail=alloc:1", |e| {
        matches!(e, Error::OutOfMemory { domain: 0, .. })
    });
}

#[test]
fn a_failed_import_is_a_device_error_and_is_retried() {
    fault(
        "fail=import:1",
        device_error("rknn_create_mem_from_fd failed"),
    );
}

#[test]
fn a_failed_context_creation_is_a_device_error_and_is_retried() {
    // The probe at open is the 1st creation; the 2nd is the first GEMM's.
    fault(
        "fail=create:2",
        device_error("rknn_matmul_create_dynamic_shape (M=1..=64, K=256, N=32, domain 0) failed with -1 (RKNN_ERR_FAIL)"),
    );
}

#[test]
fn a_failed_bind_is_a_device_error() {
    fault(
        "fail=bind:2",
        device_error("rknn_matmul_set_io_mem failed with -1"),
    );
}

#[test]
fn a_failed_run_is_a_device_error() {
    fault("fail=run:2", device_error("rknn_matmul_run failed with -1"));
}

#[test]
fn a_failed_sync_is_a_device_error() {
    fault("fail=sync:1", device_error("rknn_mem_sync failed with -1"));
}

#[test]
fn every_later_failure_is_reported_too() {
    let s = Standin::new(Sdk::V2_3, "fail=run:2+");
    let dev = Device::rknn(Some(&s.path)).unwrap();
    let case = Case::random(3, 256, 64, 5);
    for _ in 0..3 {
        assert!(matches!(run_case(&dev, &case), Err(Error::Device(_))));
    }
    assert_eq!(s.counters().runs, 1, "only the 1st run got through");
}

#[test]
fn a_full_iommu_domain_fails_allocations_until_memory_is_freed() {
    let s = Standin::new(Sdk::V2_3, "domain_mb=1");
    let dev = Device::rknn(Some(&s.path)).unwrap();
    let half = dev.alloc::<i8>(600 << 10, flags::CPU_FILLED, 0).unwrap();
    let err = dev
        .alloc::<i8>(600 << 10, flags::CPU_FILLED, 0)
        .unwrap_err();
    assert!(
        matches!(err, Error::OutOfMemory { domain: 0, requested, .. } if requested == 600 << 10),
        "{err}"
    );
    // Another domain has its own space.
    assert!(dev.alloc::<i8>(600 << 10, flags::CPU_FILLED, 1).is_ok());
    drop(half);
    assert!(dev.alloc::<i8>(600 << 10, flags::CPU_FILLED, 0).is_ok());
    let case = Case::random(3, 256, 64, 6);
    assert!(run_case(&dev, &case).unwrap() == case.expected);
}
