//! The emulated NPU and the cpu backend against the CPU int8 reference, bit for bit, and every rule
//! the emulator enforces (envelopes, domains, syncs).

mod npu_util;

use npu_util::{random_i8, slow_target, Case, A3B, ROWS};
use ork_moe::layout::Tiles;
use ork_moe::npu::emu::{self, RUN_MAX_K};
use ork_moe::npu::Primitive::{self, ChainI8, RunI8, StreamI8};
use ork_moe::npu::{
    flags, BackendChoice, BackendKind, CoreMask, Device, DeviceConfig, Error, MatMul,
};

/// The lenient emulator: stale input is read, as on the board.
fn emu_device() -> Device {
    Device::emu(emu::Config {
        strict: false,
        ..emu::Config::default()
    })
}

fn strict_emu() -> Device {
    Device::emu(emu::Config::default())
}

#[test]
fn every_row_count_matches_the_reference() {
    // K = 2048 caps a task at 16 rows, so most row counts span several tasks: run once with the
    // tasks coalesced and once with every task's rows gathered and scattered on their own.
    for per_task in [false, true] {
        let dev = Device::emu(emu::Config {
            per_task,
            ..emu::Config::default()
        });
        for &m in &ROWS {
            let case = Case::random(m, 2048, 96, m as u64);
            assert!(case.run(&dev) == case.expected, "m={m} per_task={per_task}");
        }
    }
}

#[test]
fn a3b_shapes_match_the_reference() {
    let dev = emu_device();
    let cpu = Device::cpu();
    // Every row count on the first shape, a spread of them on the others (the scalar reference
    // that checks them is slow).
    let shapes: &[(usize, usize)] = if slow_target() { &A3B[..2] } else { &A3B };
    for (i, &(k, n)) in shapes.iter().enumerate() {
        let rows: &[usize] = if i == 0 && !slow_target() {
            &ROWS
        } else {
            &[1, 3, 16, 129]
        };
        for &m in rows {
            let case = Case::random(m, k, n, (k * 7 + n + m) as u64);
            assert!(case.run(&dev) == case.expected, "emu k={k} n={n} m={m}");
            assert!(case.run(&cpu) == case.expected, "cpu k={k} n={n} m={m}");
        }
    }
}

#[test]
fn padded_sizes_match_a_plain_row_major_product() {
    let dev = emu_device();
    let t = Tiles::RK3588;
    for &(m, k, n) in &[
        (1, 1, 1),
        (3, 50, 40),
        (5, 33, 65),
        (17, 100, 31),
        (129, 70, 300),
    ] {
        let (a, w) = (random_i8(m * k, 11), random_i8(n * k, 12));
        let case = Case::from_rows(m, k, n, &a, &w);
        let mut got = vec![0i32; m * n];
        t.unpack_c(&case.run(&dev), m, n, &mut got);
        for r in 0..m {
            for j in 0..n {
                let want: i32 = (0..k)
                    .map(|x| a[r * k + x] as i32 * w[j * k + x] as i32)
                    .sum();
                assert_eq!(got[r * n + j], want, "m={m} k={k} n={n} at ({r},{j})");
            }
        }
    }
}

#[test]
fn extremes_accumulate_exactly_at_the_largest_k() {
    let dev = emu_device();
    let (m, k, n) = (3, emu::RUN_MAX_K, 32);
    for (av, bv) in [(-128i8, -128i8), (127, -128), (127, 127)] {
        let case = Case::from_rows(m, k, n, &vec![av; m * k], &vec![bv; n * k]);
        let got = case.run(&dev);
        assert_eq!(got, case.expected);
        assert!(got.iter().all(|&x| x == av as i32 * bv as i32 * k as i32));
    }
}

#[test]
fn stream_and_chain_match_the_reference_and_count() {
    let dev = emu_device();
    let (m, k, n) = (20, 2048, 768);
    let x = random_i8(m * k, 1);
    let gate = Case::from_rows(m, k, n, &x, &random_i8(n * k, 2));
    let up = Case::from_rows(m, k, n, &x, &random_i8(n * k, 3));
    let (a, bg, _) = gate.upload(&dev, flags::CPU_FILLED, 0);
    let (_, bu, _) = up.upload(&dev, flags::CPU_FILLED, 0);
    let mut c = dev.alloc::<i32>(2 * m * n, flags::CPU_FILLED, 0).unwrap();
    let gemms = |c_up| {
        vec![
            gate.matmul(&a, &bg),
            MatMul {
                c_offset: c_up,
                ..up.matmul(&a, &bu)
            },
        ]
    };
    dev.run_stream_i8(gemms(m * n), &mut c).unwrap();
    c.sync_from_device().unwrap();
    assert!(c.as_slice()[..m * n] == gate.expected[..]);
    assert!(c.as_slice()[m * n..] == up.expected[..]);

    c.as_mut_slice().fill(0);
    c.sync_to_device().unwrap();
    let report = dev
        .run_chain_i8(gemms(m * n), &mut c, CoreMask::CORE_1)
        .unwrap();
    c.sync_from_device().unwrap();
    assert!(c.as_slice()[..m * n] == gate.expected[..]);
    assert!(c.as_slice()[m * n..] == up.expected[..]);
    assert!(
        report.tasks_per_core[1] > 0
            && report.tasks_per_core[0] == 0
            && report.tasks_per_core[2] == 0
    );

    let s = dev.stats();
    assert_eq!(s.backend, "emu");
    assert_eq!(s.submits, [0, 1, 1]);
    assert_eq!(s.macs, 4 * (m * k * n) as u64);
    assert!(s.modelled_us > 0.0);
}

#[test]
fn run_i8_spreads_large_gemms_over_the_enabled_cores_and_caps_rows_per_task() {
    // Compute-bound model, so spreading over more cores always pays.
    let cost = emu::CostModel {
        dram_gbps: 1e9,
        ..emu::CostModel::default()
    };
    let dev = Device::emu(emu::Config {
        cost,
        ..emu::Config::default()
    });
    let case = Case::random(64, 2048, 768, 5);
    let (a, b, mut c) = case.upload(&dev, flags::CPU_FILLED, 0);
    let r = dev.run_i8(case.matmul(&a, &b), &mut c).unwrap();
    // CBUF: 32768 / 2048 = 16 rows per task, so 4 row chunks on each of the 3 cores.
    assert_eq!(r.tasks_per_core, [4, 4, 4]);
    assert_eq!(r.macs, 64 * 2048 * 768);
    // Bytes: A once per core (its row tasks together), B once, C once.
    assert_eq!(r.bytes, 3 * 64 * 2048 + 2048 * 768 + 64 * 768 * 4);
    dev.set_core_mask(CoreMask(CoreMask::CORE_0.0 | CoreMask::CORE_2.0));
    let r = dev.run_i8(case.matmul(&a, &b), &mut c).unwrap();
    assert_eq!(r.tasks_per_core[1], 0);
    c.sync_from_device().unwrap();
    assert!(c.as_slice() == &case.expected[..]);
}

/// What a row of [`REFUSALS`] tries on the lenient emulator.
enum Try {
    /// The primitive (chain on all cores) on the GEMMs made from the one GEMM of shape (M, K, N)
    /// whose operands are uploaded; C holds one output of that shape per GEMM.
    Submit(Primitive, (usize, usize, usize), Gemms),
    /// A buffer of 16 bytes.
    Alloc { flags: u32, domain: u32 },
    /// `run_i8` of a GEMM whose A is a buffer of another device.
    ForeignA,
}

type Gemms = for<'a> fn(&MatMul<'a>) -> Vec<MatMul<'a>>;

/// What a row expects.
#[derive(Debug)]
enum Want {
    Accepted,
    Envelope(Primitive),
    /// [`Error::InvalidArgument`] whose message names the rule.
    Invalid(&'static str),
}

fn copy<'a>(g: &MatMul<'a>) -> MatMul<'a> {
    MatMul { ..*g }
}

fn one<'a>(g: &MatMul<'a>) -> Vec<MatMul<'a>> {
    vec![copy(g)]
}

/// The (M, K, N) of the argument rows: 4 rows, K = 512, N = 64.
const SMALL: (usize, usize, usize) = (4, 512, 64);

/// Everything the emulator refuses, and what `run_i8` takes instead of stream or chain.
#[rustfmt::skip]
const REFUSALS: &[(&str, Try, Want)] = &[
    ("run_i8 deeper than RUN_MAX_K", Try::Submit(RunI8, (2, RUN_MAX_K + 32, 32), one), Want::Envelope(RunI8)),
    ("stream, K=768", Try::Submit(StreamI8, (2, 768, 64), one), Want::Envelope(StreamI8)),
    ("chain, K=768", Try::Submit(ChainI8, (2, 768, 64), one), Want::Envelope(ChainI8)),
    ("run_i8 takes K=768", Try::Submit(RunI8, (2, 768, 64), one), Want::Accepted),
    ("stream, K=1408", Try::Submit(StreamI8, (2, 1408, 64), one), Want::Envelope(StreamI8)),
    ("chain, K=1408", Try::Submit(ChainI8, (2, 1408, 64), one), Want::Envelope(ChainI8)),
    ("run_i8 takes K=1408", Try::Submit(RunI8, (2, 1408, 64), one), Want::Accepted),
    ("stream, K=4608", Try::Submit(StreamI8, (2, 4608, 64), one), Want::Envelope(StreamI8)),
    ("chain, K=4608", Try::Submit(ChainI8, (2, 4608, 64), one), Want::Envelope(ChainI8)),
    ("run_i8 takes K=4608", Try::Submit(RunI8, (2, 4608, 64), one), Want::Accepted),
    ("stream, K=5120", Try::Submit(StreamI8, (2, 5120, 64), one), Want::Envelope(StreamI8)),
    ("chain, K=5120", Try::Submit(ChainI8, (2, 5120, 64), one), Want::Envelope(ChainI8)),
    ("run_i8 takes K=5120", Try::Submit(RunI8, (2, 5120, 64), one), Want::Accepted),
    ("K not a multiple of 32", Try::Submit(RunI8, SMALL, |g| vec![MatMul { k: 500, ..*g }]), Want::Invalid("k=500 and n=64 must be multiples of 32")),
    ("N not a multiple of 32", Try::Submit(RunI8, SMALL, |g| vec![MatMul { n: 48, ..*g }]), Want::Invalid("k=512 and n=48 must be multiples of 32")),
    ("no rows", Try::Submit(RunI8, SMALL, |g| vec![MatMul { m: 0, ..*g }]), Want::Invalid("empty shape")),
    ("A past its buffer", Try::Submit(RunI8, SMALL, |g| vec![MatMul { m: 5, ..*g }]), Want::Invalid("A (5x512 at 0) past")),
    ("B past its buffer", Try::Submit(RunI8, SMALL, |g| vec![MatMul { b_offset: 1, ..*g }]), Want::Invalid("B (512x64 at 1) past")),
    ("C past its buffer", Try::Submit(RunI8, SMALL, |g| vec![MatMul { c_offset: 1, ..*g }]), Want::Invalid("C (4x64 at 1) past")),
    ("overlapping outputs", Try::Submit(StreamI8, SMALL, |g| vec![copy(g), MatMul { c_offset: 100, ..*g }]), Want::Invalid("overlap")),
    ("stream without shared A", Try::Submit(StreamI8, SMALL, |g| vec![copy(g), MatMul { m: 2, c_offset: 256, ..*g }]), Want::Invalid("must share A")),
    ("a domain the NPU lacks", Try::Alloc { flags: flags::CPU_FILLED, domain: emu::DOMAINS }, Want::Invalid("IOMMU domain 8")),
    ("an unknown memory flag", Try::Alloc { flags: 1 << 11, domain: 0 }, Want::Invalid("unknown memory flags")),
    ("a buffer of another device", Try::ForeignA, Want::Invalid("buffer of another device")),
];

/// Runs `t` on `dev` (`other`: another device).
fn attempt(dev: &Device, other: &Device, t: &Try) -> Result<(), Error> {
    match *t {
        Try::Submit(primitive, (m, k, n), gemms) => {
            let case = Case::random(m, k, n, 1);
            let (a, b, _) = case.upload(dev, flags::CPU_FILLED, 0);
            let mut gemms = gemms(&case.matmul(&a, &b));
            let c_len = gemms.len() * case.expected.len();
            let mut c = dev.alloc::<i32>(c_len, flags::CPU_FILLED, 0).unwrap();
            match primitive {
                RunI8 => {
                    assert_eq!(gemms.len(), 1, "run_i8 takes one GEMM");
                    dev.run_i8(gemms.remove(0), &mut c)
                }
                ChainI8 => dev.run_chain_i8(gemms, &mut c, CoreMask::ALL),
                StreamI8 => dev.run_stream_i8(gemms, &mut c),
            }
            .map(drop)
        }
        Try::Alloc { flags, domain } => dev.alloc::<i8>(16, flags, domain).map(drop),
        Try::ForeignA => {
            let case = Case::random(SMALL.0, SMALL.1, SMALL.2, 1);
            let (_, b, mut c) = case.upload(dev, flags::CPU_FILLED, 0);
            let (foreign_a, _, _) = case.upload(other, flags::CPU_FILLED, 0);
            dev.run_i8(case.matmul(&foreign_a, &b), &mut c).map(drop)
        }
    }
}

fn as_wanted(got: &Result<(), Error>, want: &Want) -> bool {
    match (got, want) {
        (Ok(()), Want::Accepted) => true,
        (Err(Error::Envelope { primitive, .. }), Want::Envelope(p)) => primitive == p,
        (Err(Error::InvalidArgument(msg)), Want::Invalid(rule)) => msg.contains(rule),
        _ => false,
    }
}

#[test]
fn every_envelope_violation_is_an_error() {
    let (dev, other) = (emu_device(), emu_device());
    let wrong: Vec<String> = REFUSALS
        .iter()
        .filter_map(|(row, t, want)| {
            let got = attempt(&dev, &other, t);
            (!as_wanted(&got, want)).then(|| format!("{row}: want {want:?}, got {got:?}"))
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_missing_sync_is_caught() {
    let case = Case::random(8, 512, 64, 4);
    // Lenient emulator: the NPU reads the stale (never synced, zero) device view of A.
    let dev = emu_device();
    let (mut a, b, mut c) = case.upload(&dev, flags::CPU_FILLED, 0);
    let rewritten = case.with_native_a(random_i8(case.a.len(), 99));
    a.as_mut_slice().copy_from_slice(&rewritten.a);
    dev.run_i8(case.matmul(&a, &b), &mut c).unwrap();
    c.sync_from_device().unwrap();
    assert_eq!(
        c.as_slice(),
        &case.expected[..],
        "the NPU must have read the old A"
    );
    a.sync_to_device().unwrap();
    dev.run_i8(case.matmul(&a, &b), &mut c).unwrap();
    c.sync_from_device().unwrap();
    assert_ne!(rewritten.expected, case.expected);
    assert_eq!(
        c.as_slice(),
        &rewritten.expected[..],
        "after the sync the NPU reads the new A"
    );

    // Strict emulator: the stale input is an error.
    let dev = strict_emu();
    let (mut a, b, mut c) = case.upload(&dev, flags::CPU_FILLED, 0);
    a.as_mut_slice()[0] = 1;
    assert_eq!(
        dev.run_i8(case.matmul(&a, &b), &mut c).unwrap_err(),
        Error::NotSynced { operand: "A" }
    );
    a.sync_to_device().unwrap();
    dev.run_i8(case.matmul(&a, &b), &mut c).unwrap();

    // Results stay invisible to the CPU until synced from the device.
    let (a, b, mut c) = case.upload(&dev, flags::CPU_FILLED, 0);
    dev.run_i8(case.matmul(&a, &b), &mut c).unwrap();
    assert!(
        c.as_slice().iter().all(|&x| x == 0),
        "the CPU view is stale before sync_from_device"
    );
    c.sync_from_device().unwrap();
    assert!(c.as_slice() == &case.expected[..]);

    // Non-cacheable buffers need no sync either way.
    let (mut a, b, mut c) = case.upload(&dev, flags::UNCACHED, 0);
    a.as_mut_slice().copy_from_slice(&case.a);
    dev.run_i8(case.matmul(&a, &b), &mut c).unwrap();
    assert!(c.as_slice() == &case.expected[..]);
}

#[test]
fn a_missing_weight_sync_reads_the_zeroed_device_memory() {
    let dev = emu_device();
    let case = Case::random(4, 512, 64, 6);
    let mut a = dev.alloc::<i8>(case.a.len(), flags::CPU_FILLED, 0).unwrap();
    a.write(0, &case.a).unwrap();
    a.sync_to_device().unwrap();
    let mut b = dev.alloc::<i8>(case.b.len(), flags::CPU_FILLED, 0).unwrap();
    b.write(0, &case.b).unwrap(); // no sync: the board would read whatever was in DRAM
    let mut c = dev
        .alloc::<i32>(case.expected.len(), flags::CPU_FILLED, 0)
        .unwrap();
    dev.run_i8(case.matmul(&a, &b), &mut c).unwrap();
    c.sync_from_device().unwrap();
    assert_ne!(c.as_slice(), &case.expected[..]);
    assert!(
        c.as_slice().iter().all(|&x| x == 0),
        "B's device memory still holds its allocation's zeros"
    );
}

#[test]
fn concurrent_submits_from_several_threads() {
    let dev = emu_device();
    let cases: Vec<Case> = (0..6)
        .map(|i| Case::random(1 + 7 * i, 512 * (1 + i % 2), 64 * (1 + i), i as u64))
        .collect();
    std::thread::scope(|s| {
        for case in &cases {
            let dev = &dev;
            s.spawn(move || {
                for _ in 0..3 {
                    assert_eq!(case.run(dev), case.expected);
                }
            });
        }
    });
    assert_eq!(dev.stats().submits[0], 18);
}

#[test]
fn caller_threads_run_the_shares() {
    let dev = emu_device();
    let case = Case::random(33, 1024, 320, 8);
    let (a, b, mut c) = case.upload(&dev, flags::CPU_FILLED, 0);
    let sub = dev.prepare_i8(case.matmul(&a, &b), &mut c).unwrap();
    let nth = 5;
    std::thread::scope(|s| {
        for ith in 0..nth {
            let sub = &sub;
            s.spawn(move || sub.run_share(ith, nth));
        }
    });
    sub.finish().unwrap();
    c.sync_from_device().unwrap();
    assert!(c.as_slice() == &case.expected[..]);
}

#[test]
fn a_full_domain_fails_allocation_with_out_of_memory() {
    let dev = emu_device();
    // Zeroed and never touched: the pages are accounted, not backed.
    let gib = 1usize << 30;
    let held: Vec<_> = (0..3)
        .map(|_| dev.alloc::<i8>(gib, flags::CPU_FILLED, 3).unwrap())
        .collect();
    let err = dev.alloc::<i8>(gib, flags::CPU_FILLED, 3).unwrap_err();
    match err {
        Error::OutOfMemory {
            domain: 3,
            requested,
            available,
        } => {
            assert_eq!(requested, gib as u64);
            assert_eq!(available, emu::DOMAIN_BYTES - 3 * gib as u64);
        }
        other => panic!("expected out of memory, got {other}"),
    }
    // Other domains are separate address spaces; freeing gives the room back.
    dev.alloc::<i8>(gib, flags::CPU_FILLED, 4).unwrap();
    drop(held);
    dev.alloc::<i8>(gib, flags::CPU_FILLED, 3).unwrap();
}

#[test]
fn a_submit_across_domains_is_rejected() {
    let dev = emu_device();
    let case = Case::random(4, 512, 64, 7);
    let (a, _, mut c) = case.upload(&dev, flags::CPU_FILLED, 0);
    let (_, b1, _) = case.upload(&dev, flags::CPU_FILLED, 1);
    assert_eq!(
        dev.run_i8(case.matmul(&a, &b1), &mut c).unwrap_err(),
        Error::DomainMismatch {
            expected: 0,
            found: 1
        }
    );
}

#[test]
fn cpu_backend_takes_what_the_npu_refuses() {
    let dev = Device::cpu();
    assert_eq!(dev.backend(), BackendKind::Cpu);
    let case = Case::random(3, 768, 64, 10);
    let (a, b, mut c) = case.upload(&dev, flags::CPU_FILLED, 0);
    dev.run_stream_i8(vec![case.matmul(&a, &b)], &mut c)
        .unwrap();
    assert!(c.as_slice() == &case.expected[..]);
}

#[test]
fn backend_choice_parses_and_opens() {
    assert_eq!(BackendChoice::parse("AUTO"), Some(BackendChoice::Auto));
    assert_eq!(BackendChoice::parse(""), Some(BackendChoice::Auto));
    assert_eq!(BackendChoice::parse("emu"), Some(BackendChoice::Emu));
    assert_eq!(BackendChoice::parse("npu"), None);
    let open = |backend| {
        Device::open(&DeviceConfig {
            backend,
            ..DeviceConfig::default()
        })
        .unwrap()
    };
    assert_eq!(open(BackendChoice::Emu).backend(), BackendKind::Emu);
    assert_eq!(open(BackendChoice::Cpu).stats().backend, "cpu");
}

#[test]
fn dump_writes_the_buffers_of_each_submit() {
    let dir = std::env::temp_dir().join(format!("ork-npu-dump-{}", std::process::id()));
    let dev = Device::emu(emu::Config {
        dump: Some(dir.clone()),
        ..emu::Config::default()
    });
    let case = Case::random(2, 64, 32, 3);
    case.run(&dev);
    let c = std::fs::read(dir.join("submit-0-g0-c.bin")).unwrap();
    let c: Vec<i32> = c
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(c, case.expected);
    let bytes = |v: &[i8]| v.iter().map(|&x| x as u8).collect::<Vec<u8>>();
    for (operand, want) in [("a", &case.a), ("b", &case.b)] {
        let got = std::fs::read(dir.join(format!("submit-0-g0-{operand}.bin"))).unwrap();
        assert!(got == bytes(want), "{operand}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
