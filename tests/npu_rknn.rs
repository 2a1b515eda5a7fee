//! The rknn backend through a real dlopen of the stand-in runtime (tests/standin), against the
//! CPU int8 reference, bit for bit.

mod npu_util;
mod standin;

use npu_util::{random_i8, slow_target, Case, A3B, ROWS};
use ork_moe::npu::{
    flags, rknn, BackendChoice, BackendKind, Buffer, CoreMask, Device, DeviceConfig, Error, MatMul,
    Primitive,
};
use standin::{Sdk, Standin};

/// The shared stand-in instance of the tests that need no private switches or counters.
fn standin() -> &'static str {
    standin::build(Sdk::V2_3)
}

fn device() -> Device {
    Device::rknn(Some(standin())).expect("the stand-in runtime opens")
}

#[test]
fn opens_through_dlopen_and_reports_the_runtime_tiles() {
    let dev = device();
    assert_eq!(dev.backend(), BackendKind::Rknn);
    assert_eq!(dev.tiles(), ork_moe::layout::Tiles::RK3588);
    assert_eq!(
        dev.runtime_version().as_deref(),
        Some("2.3.2 (ork-moe stand-in)")
    );
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
    // One N-tile, so one core writes C in place (a GEMM split over cores has its other slices
    // copied into C by the CPU when the submit finishes, visible at once).
    let case = Case::random(4, 512, 32, 8);
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
            rknn: ork_moe::npu::rknn::Config {
                lib: Some(lib.into()),
                ..Default::default()
            },
            ..DeviceConfig::default()
        })
    };
    let standin = standin();
    let auto = |lib| open(BackendChoice::Auto, lib).unwrap().backend();
    assert_eq!(auto(standin), BackendKind::Rknn);
    assert_eq!(auto("/nonexistent/librknnrt.so"), BackendKind::Emu);
    assert!(open(BackendChoice::Rknn, "/nonexistent/librknnrt.so").is_err());
    // Decided at open: no NPU device falls back to the emulator, a single-core chip keeps the NPU.
    let none = Standin::new(Sdk::V2_3, "no_device=1");
    assert_eq!(auto(&none.path), BackendKind::Emu);
    let one = Standin::new(Sdk::V2_3, "cores=1");
    assert_eq!(auto(&one.path), BackendKind::Rknn);
}

// ---- What only the real runtime decides, caught by the stand-in ----
// Each test says which mistake of the backend it catches; each was seen to fail on a deliberate
// break of the rule it guards.

/// Two experts' weights in one B buffer and A at an offset, as the engine and the tests use them:
/// every run_i8 then needs operands at offsets (B's per-core slices, A at 64, C's slices).
struct Offsets {
    m: usize,
    gate: Case,
    up: Case,
    a: Buffer<i8>,
    b: Buffer<i8>,
}

impl Offsets {
    fn new(dev: &Device, m: usize, k: usize, n: usize, seed: u64) -> Offsets {
        let x = random_i8(m * k, seed);
        let gate = Case::from_rows(m, k, n, &x, &random_i8(n * k, seed + 1));
        let up = Case::from_rows(m, k, n, &x, &random_i8(n * k, seed + 2));
        let mut a = dev
            .alloc::<i8>(64 + gate.a.len(), flags::CPU_FILLED, 0)
            .unwrap();
        a.write(64, &gate.a).unwrap();
        a.sync_to_device().unwrap();
        let mut b = dev
            .alloc::<i8>(2 * gate.b.len(), flags::CPU_FILLED, 0)
            .unwrap();
        b.write(0, &gate.b).unwrap();
        b.write(gate.b.len(), &up.b).unwrap();
        b.sync_to_device().unwrap();
        Offsets { m, gate, up, a, b }
    }

    /// Both GEMMs with run_i8 (split over the cores), into one C; true when both are exact.
    fn run(&self, dev: &Device, c: &mut Buffer<i32>) -> bool {
        let (m, k, n) = (self.m, self.gate.kp, self.gate.np);
        let mm = |b_offset, c_offset| MatMul {
            m,
            k,
            n,
            a: &self.a,
            a_offset: 64,
            b: &self.b,
            b_offset,
            c_offset,
        };
        dev.run_i8(mm(0, 0), c).unwrap();
        dev.run_i8(mm(self.gate.b.len(), m * n), c).unwrap();
        c.sync_from_device().unwrap();
        c.as_slice()[..m * n] == self.gate.expected[..]
            && c.as_slice()[m * n..2 * m * n] == self.up.expected[..]
    }
}

/// A view of a buffer at an offset is imported once and reused: a view made and destroyed on
/// every run makes the import count grow with the runs. A buffer destroyed before its views (in
/// `Mem::drop`) is a violation the stand-in reports.
#[test]
fn views_are_made_once_per_buffer_and_offset_and_die_before_their_buffer() {
    let s = Standin::new(Sdk::V2_3, "");
    let dev = Device::rknn(Some(&s.path)).unwrap();
    let ops = Offsets::new(&dev, 9, 512, 160, 3);
    let mut c = dev.alloc::<i32>(2 * 9 * 160, flags::CPU_FILLED, 0).unwrap();
    assert!(ops.run(&dev, &mut c));
    let after_one = s.counters();
    assert!(
        after_one.imports > 0,
        "operands at offsets go through views"
    );
    for _ in 0..10 {
        assert!(ops.run(&dev, &mut c));
    }
    // Other row counts: C's slices move with M, B's and A's offsets do not.
    for m in [1, 4, 17] {
        let mut c = dev.alloc::<i32>(2 * m * 160, flags::CPU_FILLED, 0).unwrap();
        let more = Offsets::new(&dev, m, 512, 160, 30 + m as u64);
        assert!(more.run(&dev, &mut c), "m={m}");
        assert!(more.run(&dev, &mut c), "m={m} again");
    }
    let after = s.counters();
    assert_eq!(after_one.imports, 6, "A at 64; B's slices at 2 + 3 offsets");
    assert_eq!(
        after.imports,
        4 * after_one.imports,
        "one import per new (buffer, offset)"
    );
    assert_eq!(
        after.live_views, after_one.live_views,
        "the m loop's buffers took their views along"
    );
    drop((ops, c));
    assert_eq!(s.counters().live_views, 0);
    drop(dev);
    let end = s.counters();
    assert_eq!(
        (end.live_buffers, end.live_contexts),
        (0, 0),
        "nothing leaks"
    );
    assert_eq!(end.violations, 0, "no buffer died before its views");
}

/// Binding operands to contexts is serialized process-wide: three per-core runs binding the same A
/// buffer on three contexts at once is a violation the stand-in (holding each binding 300 µs)
/// reports and refuses.
#[test]
fn binding_is_serialized_and_only_runs_overlap() {
    let s = Standin::new(Sdk::V2_3, "bind_us=300");
    let dev = Device::rknn(Some(&s.path)).unwrap();
    let cases: Vec<Case> = (0..3).map(|i| Case::random(5, 256, 96, 70 + i)).collect();
    std::thread::scope(|scope| {
        for case in &cases {
            let dev = &dev;
            scope.spawn(move || {
                for _ in 0..3 {
                    assert!(case.run(dev) == case.expected);
                }
            });
        }
    });
    let n = s.counters();
    assert_eq!(n.runs, 3 * 3 * 3, "every N-split ran");
    assert_eq!((n.violations, n.overlapping_binds), (0, 0), "{n:?}");
}

/// An operand at 2 GiB or beyond is staged: `offset as i32` would turn it into a negative offset,
/// which the stand-in refuses (the real runtime's behaviour is undocumented).
#[test]
fn operands_at_2_gib_and_beyond_are_staged_never_wrapped() {
    let s = Standin::new(Sdk::V2_3, "");
    let dev = Device::rknn(Some(&s.path)).unwrap();
    let case = Case::random(3, 256, 96, 9);
    let at = (1usize << 31) + 4096;
    // Non-cacheable: the stand-in keeps one copy, and only the pages written are ever touched.
    let mut big = dev
        .alloc::<i8>(at + 2 * case.b.len(), flags::UNCACHED, 0)
        .unwrap();
    big.write(at, &case.b).unwrap();
    big.write(at + case.b.len(), &case.a).unwrap();
    let mut c = dev
        .alloc::<i32>(case.expected.len(), flags::UNCACHED, 0)
        .unwrap();
    let mm = MatMul {
        a_offset: at + case.b.len(),
        b_offset: at,
        ..case.matmul(&big, &big)
    };
    dev.run_i8(mm, &mut c).unwrap();
    assert!(c.as_slice() == &case.expected[..]);
    assert_eq!(
        s.counters().imports,
        0,
        "no view at an offset int32 cannot hold"
    );
}

/// A runtime without `rknn_create_mem2` is refused with the version found and the one needed,
/// not a bare "missing symbol".
#[test]
fn an_old_runtime_is_refused_naming_the_version_found_and_needed() {
    let old = standin::build(Sdk::V1_6);
    let Err(Error::Device(msg)) = Device::rknn(Some(old)) else {
        panic!("runtime 1.6.0 must be refused");
    };
    for part in [old, "1.6.0", "SDK 2.0 or newer"] {
        assert!(msg.contains(part), "{part:?} missing in: {msg}");
    }
    // 2.0 names the dynamic-shape creator differently; it opens and reuses contexts all the same.
    let s = Standin::new(Sdk::V2_0, "");
    let dev = Device::rknn(Some(&s.path)).unwrap();
    assert_eq!(
        dev.runtime_version().as_deref(),
        Some("2.0.0b0 (ork-moe stand-in)")
    );
    for m in 1..=5 {
        let case = Case::random(m, 256, 32, m as u64);
        assert!(case.run(&dev) == case.expected, "m={m}");
    }
    assert_eq!(dev.stats().contexts_created, 1);
    assert!(s.counters().shape_switches >= 5);
}

/// A single-core chip refuses a core mask: a backend that sets one on every context creation
/// fails every GEMM there.
#[test]
fn a_single_core_chip_runs_everything_on_its_one_core() {
    let s = Standin::new(Sdk::V2_3, "cores=1");
    let dev = Device::rknn(Some(&s.path)).unwrap();
    let refused_at_open = s.counters().core_mask_refused;
    assert_eq!(refused_at_open, 3, "open() tries each core once");
    let ops = Offsets::new(&dev, 7, 512, 160, 11);
    let mut c = dev.alloc::<i32>(2 * 7 * 160, flags::CPU_FILLED, 0).unwrap();
    assert!(ops.run(&dev, &mut c));
    let case = Case::random(4, 512, 64, 12);
    let (a, b, mut c) = case.upload(&dev, flags::CPU_FILLED, 0);
    for primitive in [Primitive::StreamI8, Primitive::ChainI8] {
        c.as_mut_slice().fill(0);
        c.sync_to_device().unwrap();
        match primitive {
            Primitive::StreamI8 => dev.run_stream_i8(vec![case.matmul(&a, &b)], &mut c),
            _ => dev.run_chain_i8(vec![case.matmul(&a, &b)], &mut c, CoreMask::CORE_2),
        }
        .unwrap();
        c.sync_from_device().unwrap();
        assert!(c.as_slice() == &case.expected[..], "{primitive:?}");
    }
    let st = dev.stats();
    assert_eq!(st.tasks_per_core[1..], [0, 0], "one core does everything");
    assert_eq!(
        s.counters().core_mask_refused,
        refused_at_open,
        "decided at open, not per call"
    );
}

/// No NPU device: the error names the library and the likely cause, not a bare
/// "rknn_matmul_create failed with -1".
#[test]
fn no_npu_device_is_reported_with_the_library_and_the_likely_cause() {
    let s = Standin::new(Sdk::V2_3, "no_device=1");
    let Err(Error::Device(msg)) = Device::rknn(Some(&s.path)) else {
        panic!("no device must fail to open");
    };
    for part in [
        s.path.as_str(),
        "-1 (RKNN_ERR_FAIL)",
        "rknpu kernel driver",
        "device node",
    ] {
        assert!(msg.contains(part), "{part:?} missing in: {msg}");
    }
}

/// Dynamic-shape contexts cover ranges of row counts: one context per (M, core) would be 3 × 40
/// here.
#[test]
fn contexts_are_reused_across_row_counts() {
    let count = |dynamic_m: usize| {
        let s = Standin::new(Sdk::V2_3, "");
        let dev = Device::rknn_with(&rknn::Config {
            lib: Some(s.path.clone()),
            dynamic_m,
        })
        .unwrap();
        for m in 1..=40 {
            let case = Case::random(m, 256, 96, 100 + m as u64);
            assert!(
                case.run(&dev) == case.expected,
                "m={m} dynamic_m={dynamic_m}"
            );
        }
        let created = dev.stats().contexts_created;
        assert_eq!(
            s.counters().contexts_created,
            created + 1,
            "all but the probe counted"
        );
        created
    };
    assert_eq!(
        count(rknn::DEFAULT_DYNAMIC_M),
        3,
        "one dynamic context per core"
    );
    assert_eq!(count(16), 3 * 3, "M buckets 1..=16, 17..=32, 33..=48");
    assert_eq!(
        count(0),
        3 * 40,
        "dynamic_m = 0: one context per M and core"
    );
}

/// A context whose reported dims differ from the packer's layout is a device error: the stand-in's
/// skewed B tile would otherwise pass unnoticed.
#[test]
fn reported_dims_that_differ_from_the_packer_are_a_device_error() {
    let s = Standin::new(Sdk::V2_3, "skew_after=1");
    let dev = Device::rknn(Some(&s.path)).unwrap();
    let case = Case::random(2, 256, 64, 1);
    let (a, b, mut c) = case.upload(&dev, flags::CPU_FILLED, 0);
    let Err(Error::Device(msg)) = dev.run_i8(case.matmul(&a, &b), &mut c) else {
        panic!("a context with other B tiles must not run");
    };
    assert!(
        msg.contains("lays out B") && msg.contains("[2, 8, 16, 32]"),
        "{msg}"
    );
    assert_eq!(s.counters().runs, 0);
}

/// A buffer holds at most `MAX_VIEWS` (64) views; operands at further offsets are copied through
/// staging buffers, still exact. Without the cap there would be one import per offset (69).
#[test]
fn a_buffers_views_are_capped_and_later_offsets_staged() {
    let s = Standin::new(Sdk::V2_3, "");
    let dev = Device::rknn(Some(&s.path)).unwrap();
    let experts: Vec<Case> = (0..70).map(|e| Case::random(2, 32, 32, 200 + e)).collect();
    let len = experts[0].b.len();
    let mut b = dev
        .alloc::<i8>(len * experts.len(), flags::CPU_FILLED, 0)
        .unwrap();
    for (e, case) in experts.iter().enumerate() {
        b.write(e * len, &case.b).unwrap();
    }
    b.sync_to_device().unwrap();
    for (e, case) in experts.iter().enumerate() {
        let (a, _, mut c) = case.upload(&dev, flags::CPU_FILLED, 0);
        let mm = MatMul {
            b_offset: e * len,
            ..case.matmul(&a, &b)
        };
        dev.run_i8(mm, &mut c).unwrap();
        c.sync_from_device().unwrap();
        assert!(c.as_slice() == &case.expected[..], "expert {e}");
    }
    assert_eq!(
        s.counters().imports,
        64,
        "offsets 1..=64 as views, the last 5 staged"
    );
}
