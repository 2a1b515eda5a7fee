//! The rknn backend through a real dlopen of the stand-in runtime (tests/standin), against the
//! CPU int8 reference, bit for bit.

mod npu_util;

use npu_util::{random_i8, slow_target, Case, A3B, ROWS};
use ork_moe::npu::{
    flags, BackendChoice, BackendKind, CoreMask, Device, DeviceConfig, Error, MatMul, Primitive,
};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

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

/// Builds the stand-in once per test binary.
fn standin() -> &'static str {
    static LIB: OnceLock<String> = OnceLock::new();
    LIB.get_or_init(|| {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/standin/rknnrt_standin.c");
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("librknnrt-standin-{}.so", std::process::id()));
        let cc = compiler();
        let status = Command::new(&cc)
            .args([
                "-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-shared", "-fPIC", "-o",
            ])
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

fn device() -> Device {
    Device::rknn(Some(standin())).expect("the stand-in runtime opens")
}

#[test]
fn opens_through_dlopen_and_reports_the_runtime_tiles() {
    let dev = device();
    assert_eq!(dev.backend(), BackendKind::Rknn);
    assert_eq!(dev.tiles(), ork_moe::layout::Tiles::RK3588);
    assert!(matches!(
        Device::rknn(Some("/nonexistent/librknnrt.so")),
        Err(Error::Device(_))
    ));
}

#[test]
fn every_row_count_matches_the_reference() {
    let dev = device();
    for &m in &ROWS {
        let case = Case::random(m, 256, 96, 40 + m as u64);
        assert!(case.run(&dev) == case.expected, "m={m}");
    }
}

#[test]
fn a3b_shapes_and_padding_match_the_reference() {
    let dev = device();
    let shapes: &[(usize, usize)] = if slow_target() { &A3B[..1] } else { &A3B };
    for &(k, n) in shapes {
        for m in [1, 16, 129] {
            let case = Case::random(m, k, n, (k + n + m) as u64);
            assert!(case.run(&dev) == case.expected, "k={k} n={n} m={m}");
        }
    }
    for &(m, k, n) in &[(3, 50, 40), (7, 33, 100)] {
        let case = Case::random(m, k, n, 5);
        assert!(case.run(&dev) == case.expected, "padded m={m} k={k} n={n}");
    }
    let extremes = Case::from_rows(2, 8192, 32, &vec![-128; 2 * 8192], &vec![-128; 32 * 8192]);
    assert!(extremes.run(&dev) == extremes.expected);
}

#[test]
fn operands_at_offsets_stream_and_chain_match() {
    let dev = device();
    let (m, k, n) = (9, 1024, 160);
    let x = random_i8(m * k, 1);
    let gate = Case::from_rows(m, k, n, &x, &random_i8(n * k, 2));
    let up = Case::from_rows(m, k, n, &x, &random_i8(n * k, 3));
    let mut a = dev
        .alloc::<i8>(64 + gate.a.len(), flags::CPU_FILLED, 2)
        .unwrap();
    a.write(64, &gate.a).unwrap();
    a.sync_to_device().unwrap();
    // Both experts' weights in one buffer, as an expert cache would keep them.
    let mut b = dev
        .alloc::<i8>(2 * gate.b.len(), flags::CPU_FILLED, 2)
        .unwrap();
    b.write(0, &gate.b).unwrap();
    b.write(gate.b.len(), &up.b).unwrap();
    b.sync_to_device().unwrap();
    let mut c = dev.alloc::<i32>(2 * m * n, flags::CPU_FILLED, 2).unwrap();
    let mm = |b_offset, c_offset| MatMul {
        m,
        k,
        n,
        a: &a,
        a_offset: 64,
        b: &b,
        b_offset,
        c_offset,
    };
    for primitive in [Primitive::StreamI8, Primitive::ChainI8, Primitive::RunI8] {
        c.as_mut_slice().fill(-1);
        c.sync_to_device().unwrap();
        match primitive {
            Primitive::StreamI8 => {
                dev.run_stream_i8(vec![mm(0, 0), mm(gate.b.len(), m * n)], &mut c)
            }
            Primitive::ChainI8 => dev.run_chain_i8(
                vec![mm(0, 0), mm(gate.b.len(), m * n)],
                &mut c,
                CoreMask::CORE_2,
            ),
            Primitive::RunI8 => dev
                .run_i8(mm(0, 0), &mut c)
                .and_then(|_| dev.run_i8(mm(gate.b.len(), m * n), &mut c)),
        }
        .unwrap();
        c.sync_from_device().unwrap();
        assert!(
            c.as_slice()[..m * n] == gate.expected[..],
            "{primitive:?} gate"
        );
        assert!(c.as_slice()[m * n..] == up.expected[..], "{primitive:?} up");
    }
    assert_eq!(dev.stats().submits, [2, 1, 1]);
}

#[test]
fn the_runtime_sees_stale_data_without_sync() {
    let dev = device();
    let case = Case::random(4, 512, 64, 8);
    let (mut a, b, mut c) = case.upload(&dev, flags::CPU_FILLED, 0);
    a.as_mut_slice()
        .copy_from_slice(&random_i8(case.a.len(), 77));
    dev.run_i8(case.matmul(&a, &b), &mut c).unwrap();
    assert!(
        c.as_slice().iter().all(|&x| x == 0),
        "results invisible before sync_from_device"
    );
    c.sync_from_device().unwrap();
    assert!(
        c.as_slice() == &case.expected[..],
        "the runtime read the old, synced A"
    );
    // Non-cacheable memory needs no syncs.
    let (a, b, mut c) = case.upload(&dev, flags::UNCACHED, 0);
    dev.run_i8(case.matmul(&a, &b), &mut c).unwrap();
    assert!(c.as_slice() == &case.expected[..]);
}

#[test]
fn envelopes_domains_and_threads() {
    let dev = device();
    let deep = Case::random(1, 8192 + 32, 32, 1);
    let (a, b, mut c) = deep.upload(&dev, flags::CPU_FILLED, 0);
    assert!(matches!(
        dev.run_i8(deep.matmul(&a, &b), &mut c),
        Err(Error::Envelope { .. })
    ));
    let down = Case::random(2, 768, 64, 2);
    let (a, b, mut c) = down.upload(&dev, flags::CPU_FILLED, 0);
    assert!(matches!(
        dev.run_stream_i8(vec![down.matmul(&a, &b)], &mut c),
        Err(Error::Envelope { .. })
    ));
    let (_, b1, _) = down.upload(&dev, flags::CPU_FILLED, 1);
    assert_eq!(
        dev.run_i8(down.matmul(&a, &b1), &mut c).unwrap_err(),
        Error::DomainMismatch {
            expected: 0,
            found: 1
        }
    );

    let cases: Vec<Case> = (0..4)
        .map(|i| Case::random(1 + 5 * i, 512, 96 + 32 * i, 60 + i as u64))
        .collect();
    std::thread::scope(|s| {
        for case in &cases {
            let dev = &dev;
            s.spawn(move || assert!(case.run(dev) == case.expected));
        }
    });
}

#[test]
fn auto_takes_the_runtime_when_it_answers_else_the_emulator() {
    let open = |backend, lib: &str| {
        Device::open(&DeviceConfig {
            backend,
            rknn_lib: Some(lib.into()),
            ..DeviceConfig::default()
        })
    };
    let standin = standin();
    let auto = |lib| open(BackendChoice::Auto, lib).unwrap().backend();
    assert_eq!(auto(standin), BackendKind::Rknn);
    assert_eq!(auto("/nonexistent/librknnrt.so"), BackendKind::Emu);
    assert!(open(BackendChoice::Rknn, "/nonexistent/librknnrt.so").is_err());
}
