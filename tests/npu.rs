//! The emulated NPU and the cpu backend against the CPU int8 reference, bit for bit, and every rule
//! the emulator enforces (envelopes, domains, syncs).

mod npu_util;

use npu_util::{random_i8, slow_target, Case, A3B, ROWS};
use ork_moe::layout::Tiles;
use ork_moe::npu::{
    emu, flags, BackendChoice, BackendKind, CoreMask, Device, DeviceConfig, Error, MatMul,
    Primitive,
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

#[test]
fn every_envelope_violation_is_an_error() {
    let dev = emu_device();
    let too_deep = Case::random(2, emu::RUN_MAX_K + 32, 32, 1);
    let (a, b, mut c) = too_deep.upload(&dev, flags::CPU_FILLED, 0);
    let err = dev.run_i8(too_deep.matmul(&a, &b), &mut c).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Envelope {
                primitive: Primitive::RunI8,
                ..
            }
        ),
        "{err}"
    );

    for k in [768, 1408, 4608, 5120] {
        let case = Case::random(2, k, 64, 2);
        let (a, b, mut c) = case.upload(&dev, flags::CPU_FILLED, 0);
        let err = dev
            .run_stream_i8(vec![case.matmul(&a, &b)], &mut c)
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Envelope {
                    primitive: Primitive::StreamI8,
                    ..
                }
            ),
            "k={k}: {err}"
        );
        let err = dev
            .run_chain_i8(vec![case.matmul(&a, &b)], &mut c, CoreMask::ALL)
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Envelope {
                    primitive: Primitive::ChainI8,
                    ..
                }
            ),
            "k={k}: {err}"
        );
        // run_i8 takes what stream refuses: the caller's fallback.
        dev.run_i8(case.matmul(&a, &b), &mut c).unwrap();
    }

    let case = Case::random(4, 512, 64, 3);
    let (a, b, mut c) = case.upload(&dev, flags::CPU_FILLED, 0);
    let bad = |mm: MatMul, c: &mut _| matches!(dev.run_i8(mm, c), Err(Error::InvalidArgument(_)));
    assert!(
        bad(
            MatMul {
                k: 500,
                ..case.matmul(&a, &b)
            },
            &mut c
        ),
        "K not a multiple of 32"
    );
    assert!(
        bad(
            MatMul {
                n: 48,
                ..case.matmul(&a, &b)
            },
            &mut c
        ),
        "N not a multiple of 32"
    );
    assert!(
        bad(
            MatMul {
                m: 0,
                ..case.matmul(&a, &b)
            },
            &mut c
        ),
        "no rows"
    );
    assert!(
        bad(
            MatMul {
                m: 5,
                ..case.matmul(&a, &b)
            },
            &mut c
        ),
        "A past its buffer"
    );
    assert!(
        bad(
            MatMul {
                b_offset: 1,
                ..case.matmul(&a, &b)
            },
            &mut c
        ),
        "B past its buffer"
    );
    assert!(
        bad(
            MatMul {
                c_offset: 1,
                ..case.matmul(&a, &b)
            },
            &mut c
        ),
        "C past its buffer"
    );

    let mut c2 = dev.alloc::<i32>(2 * 4 * 64, flags::CPU_FILLED, 0).unwrap();
    let overlap = vec![
        case.matmul(&a, &b),
        MatMul {
            c_offset: 100,
            ..case.matmul(&a, &b)
        },
    ];
    assert!(
        matches!(
            dev.run_stream_i8(overlap, &mut c2),
            Err(Error::InvalidArgument(_))
        ),
        "overlapping outputs"
    );
    let other_a = vec![
        case.matmul(&a, &b),
        MatMul {
            a_offset: 0,
            m: 2,
            c_offset: 256,
            ..case.matmul(&a, &b)
        },
    ];
    assert!(
        matches!(
            dev.run_stream_i8(other_a, &mut c2),
            Err(Error::InvalidArgument(_))
        ),
        "stream without shared A"
    );

    assert!(matches!(
        dev.alloc::<i8>(16, flags::CPU_FILLED, emu::DOMAINS),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        dev.alloc::<i8>(16, 1 << 11, 0),
        Err(Error::InvalidArgument(_))
    ));

    let other = emu_device();
    let (oa, _, _) = case.upload(&other, flags::CPU_FILLED, 0);
    assert!(
        bad(case.matmul(&oa, &b), &mut c),
        "buffer of another device"
    );
}

#[test]
fn a_missing_sync_is_caught() {
    let case = Case::random(8, 512, 64, 4);
    // Lenient emulator: the NPU reads the stale (never synced, zero) device view of A.
    let dev = emu_device();
    let (mut a, b, mut c) = case.upload(&dev, flags::CPU_FILLED, 0);
    a.as_mut_slice()
        .copy_from_slice(&random_i8(case.a.len(), 99));
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
    assert_ne!(
        c.as_slice(),
        &case.expected[..],
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
fn a_missing_weight_sync_gives_wrong_results() {
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
    assert_eq!(
        std::fs::read(dir.join("submit-0-g0-b.bin")).unwrap().len(),
        case.b.len()
    );
    std::fs::remove_dir_all(dir).unwrap();
}
