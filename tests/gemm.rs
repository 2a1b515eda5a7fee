//! Every int8 GEMM kernel path equals the scalar reference bit for bit, on odd and padded sizes,
//! on random data and on the -128/127 extremes, whole, per share and on the pool.

use ork_moe::gemm::{self, Shape};
use ork_moe::isa::Isa;
use ork_moe::layout::Tiles;
use ork_moe::pool::{self, Pool};
use ork_moe::testutil::Rng;

const T: Tiles = Tiles::RK3588;
/// Written after C to catch out-of-bounds stores.
const SENTINEL: i32 = 0x5a5a_5a5a;

fn bytes(rng: &mut Rng, len: usize) -> Vec<i8> {
    let mut v = vec![0; len];
    rng.fill_i8(&mut v);
    v
}

/// Inputs named for the failure message.
fn inputs(kind: &str, m: usize, kp: usize, np: usize, rng: &mut Rng) -> (Vec<i8>, Vec<i8>) {
    let (la, lb) = (T.a_len(m, kp), T.b_len(kp, np));
    match kind {
        "random" => (bytes(rng, la), bytes(rng, lb)),
        // Largest positive products: where vpmaddubsw-style int16 pair sums would saturate.
        "min*min" => (vec![-128; la], vec![-128; lb]),
        "min*max" => (vec![-128; la], vec![127; lb]),
        "max*max" => (vec![127; la], vec![127; lb]),
        // Extremes mixed at random, so sums of both signs and every lane position are hit.
        "extremes" => {
            let pick = |v: Vec<i8>| {
                v.into_iter()
                    .map(|x| if x < 0 { -128 } else { 127 })
                    .collect()
            };
            (pick(bytes(rng, la)), pick(bytes(rng, lb)))
        }
        _ => unreachable!(),
    }
}

const KINDS: [&str; 5] = ["random", "min*min", "min*max", "max*max", "extremes"];

fn expected(shape: Shape, a: &[i8], b: &[i8]) -> Vec<i32> {
    let mut c = vec![0; T.c_len(shape.m, shape.np)];
    gemm::reference(&T, shape, a, b, &mut c);
    c
}

/// Runs `f` on a C filled with the sentinel (so stale values show) and checks it and what follows.
fn check(label: &str, want: &[i32], f: impl FnOnce(&mut [i32])) {
    let mut c = vec![SENTINEL; want.len() + 16];
    f(&mut c[..want.len()]);
    assert!(
        c[want.len()..].iter().all(|&x| x == SENTINEL),
        "{label}: wrote past C"
    );
    if let Some(i) = (0..want.len()).find(|&i| c[i] != want[i]) {
        panic!("{label}: C[{i}] = {} but reference says {}", c[i], want[i]);
    }
}

const ROWS: [usize; 14] = [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 33, 64, 129];

#[test]
fn every_path_matches_the_reference() {
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let depths_widths = [
        (32, 32),
        (64, 96),
        (96, 64),
        (768, 32),
        (2048, 64),
        (32, 160),
    ];
    let paths = Isa::available();
    eprintln!("paths covered: {:?}", paths);
    for &m in &ROWS {
        for &(kp, np) in &depths_widths {
            for kind in KINDS {
                let shape = Shape { m, kp, np };
                let (a, b) = inputs(kind, m, kp, np, &mut rng);
                let want = expected(shape, &a, &b);
                for &isa in &paths {
                    check(&format!("{} {kind} {shape:?}", isa.name()), &want, |c| {
                        gemm::gemm_isa(isa, &T, shape, &a, &b, c)
                    });
                }
            }
        }
    }
}

#[test]
fn padded_real_sizes_match() {
    // K and N that are not multiples of 32, packed from row-major like the callers do.
    let mut rng = Rng::new(7);
    for &(m, k, n) in &[(3, 50, 40), (17, 100, 70), (33, 2000, 33)] {
        let (kp, np) = (T.pad(k), T.pad(n));
        let mut a = vec![0; T.a_len(m, kp)];
        T.pack_a(&bytes(&mut rng, m * k), m, k, &mut a);
        let mut b = vec![0; T.b_len(kp, np)];
        T.pack_b(&bytes(&mut rng, n * k), n, k, &mut b);
        let shape = Shape { m, kp, np };
        let want = expected(shape, &a, &b);
        for isa in Isa::available() {
            check(&format!("{} {shape:?}", isa.name()), &want, |c| {
                gemm::gemm_isa(isa, &T, shape, &a, &b, c)
            });
        }
    }
}

#[test]
fn real_expert_shapes_match() {
    // The A3B expert shapes at a few batch sizes (the reference is slow, so not all of them).
    let mut rng = Rng::new(11);
    for &(m, kp, np) in &[
        (8, 2048, 768),
        (3, 768, 2048),
        (2, 4096, 1408),
        (1, 1408, 4096),
    ] {
        let shape = Shape { m, kp, np };
        let (a, b) = inputs("extremes", m, kp, np, &mut rng);
        let want = expected(shape, &a, &b);
        for isa in Isa::available() {
            check(&format!("{} {shape:?}", isa.name()), &want, |c| {
                gemm::gemm_isa(isa, &T, shape, &a, &b, c)
            });
        }
    }
}

#[test]
fn shares_on_own_threads_and_on_the_pool_match() {
    let mut rng = Rng::new(3);
    let own_pool = Pool::new(3);
    for &(m, kp, np) in &[(5, 64, 32), (17, 96, 160), (64, 256, 320)] {
        let shape = Shape { m, kp, np };
        let (a, b) = inputs("random", m, kp, np, &mut rng);
        let want = expected(shape, &a, &b);
        for isa in Isa::available() {
            for nth in 1..=6 {
                check(
                    &format!("{} {nth} shares {shape:?}", isa.name()),
                    &want,
                    |c| {
                        std::thread::scope(|s| {
                            let mut rest = c;
                            for ith in 0..nth {
                                let cols = gemm::share_columns(&T, np, ith, nth);
                                let (part, tail) = rest.split_at_mut(cols.len() * m);
                                rest = tail;
                                let (a, b) = (&a, &b);
                                s.spawn(move || {
                                    gemm::gemm_share(isa, &T, shape, a, b, part, ith, nth)
                                });
                            }
                            assert!(rest.is_empty(), "shares must cover every column");
                        })
                    },
                );
            }
            for p in [pool::global(), &own_pool] {
                check(
                    &format!("{} pool of {} {shape:?}", isa.name(), p.threads()),
                    &want,
                    |c| gemm::gemm_parallel(p, isa, &T, shape, &a, &b, c),
                );
            }
        }
    }
}

#[test]
fn concurrent_callers_on_one_pool_get_their_own_results() {
    let mut rng = Rng::new(5);
    let shape = Shape {
        m: 9,
        kp: 128,
        np: 96,
    };
    let jobs: Vec<_> = (0..4)
        .map(|_| {
            let (a, b) = inputs("random", shape.m, shape.kp, shape.np, &mut rng);
            let want = expected(shape, &a, &b);
            (a, b, want)
        })
        .collect();
    std::thread::scope(|s| {
        for (a, b, want) in &jobs {
            s.spawn(move || {
                for _ in 0..20 {
                    check("concurrent", want, |c| {
                        gemm::gemm_parallel(
                            pool::global(),
                            ork_moe::isa::Isa::best(),
                            &T,
                            shape,
                            a,
                            b,
                            c,
                        )
                    });
                }
            });
        }
    });
}

#[test]
fn share_columns_are_whole_tiles_covering_all() {
    for np in [0, 32, 64, 96, 768, 1408] {
        for nth in 1..=8 {
            let mut next = 0;
            for ith in 0..nth {
                let cols = gemm::share_columns(&T, np, ith, nth);
                assert_eq!(cols.start, next);
                assert_eq!(cols.len() % 32, 0);
                assert!(cols.len() <= np.div_ceil(32).div_ceil(nth) * 32);
                next = cols.end;
            }
            assert_eq!(next, np);
        }
    }
}
