use super::*;
use crate::timeline::price::{price, Core};
use crate::timeline::simulate::simulate;
use crate::timeline::work::{Graph, Unit, Withdraw, Work};

fn params() -> Params {
    Params {
        big_cores: 2.0,
        little_cores: 0.0,
        shared_dram_gbps: 10.0,
        memcpy_gbps_big_core: 1e6,
        ..Params::default()
    }
}

fn dense(g: &mut Graph, us: f64, bytes: u64, deps: &[u32]) -> u32 {
    g.push(Work::Dense { us, bytes }, Unit::Big, deps, 0)
}

#[test]
fn independent_tasks_share_the_cores() {
    let p = params();
    let mut g = Graph::default();
    for _ in 0..4 {
        dense(&mut g, 100.0, 0, &[]);
    }
    let t = timeline(&g, &p).unwrap();
    assert!((t.serial_us - 400.0).abs() < 1e-6);
    assert!((t.scheduled_us - 200.0).abs() < 1e-6);
    assert!((t.bound.cpu_us - 200.0).abs() < 1e-6);
}

#[test]
fn work_only_the_little_cores_may_do_is_bounded_by_them() {
    // Two A76s idle, two A55s at half speed with 4 x 100 µs (A76 time) of their own work:
    // 400 µs on the A55s, not the 133 µs of all four cores together.
    let p = Params {
        little_cores: 2.0,
        little_core_factor: 0.5,
        memcpy_gbps_little_core: 1e6,
        ..params()
    };
    let mut g = Graph::default();
    for _ in 0..4 {
        g.push(
            Work::Dense {
                us: 100.0,
                bytes: 0,
            },
            Unit::Little,
            &[],
            0,
        );
    }
    let t = timeline(&g, &p).unwrap();
    assert!((t.scheduled_us - 400.0).abs() < 1e-6, "{}", t.scheduled_us);
    assert!((t.bound.cpu_us - 400.0).abs() < 1e-6, "{}", t.bound.cpu_us);
}

#[test]
fn a_call_takes_over_its_prefetch_and_pauses_the_others() {
    // 2 A76s, 2 A55s at half speed. A call starts (`begin`, 10 µs) and runs 500 µs; each
    // prefetch waits for some 150 µs of A55 work (300 µs there) first.
    let p = Params {
        little_cores: 2.0,
        little_core_factor: 0.5,
        memcpy_gbps_little_core: 1e6,
        ..params()
    };
    let little = |g: &mut Graph, us: f64, deps: &[u32]| {
        g.push(Work::Dense { us, bytes: 0 }, Unit::Little, deps, 0)
    };
    let case = |unused: bool| {
        let mut g = Graph::default();
        let begin = dense(&mut g, 10.0, 0, &[]);
        let body = dense(&mut g, 500.0, 0, &[begin]);
        let end = g.join(&[body], 0);
        let later = dense(&mut g, 1.0, 0, &[end]);
        let (x, y) = (little(&mut g, 150.0, &[]), little(&mut g, 150.0, &[]));
        // Its own call's: not started when the call starts, so the A76s take it (or drop it).
        let own = little(&mut g, 100.0, &[x]);
        g.tasks[own as usize].withdrawn_by = Some(Withdraw { by: begin, unused });
        // A later call's: ready during this call, it waits for the call's end.
        let next = little(&mut g, 100.0, &[y]);
        g.tasks[next as usize].withdrawn_by = Some(Withdraw {
            by: later,
            unused: false,
        });
        g.calls.push((begin, end));
        let s = simulate(&g, &p).unwrap();
        (s.end[own as usize], s.end[next as usize])
    };
    let (own, next) = case(false);
    assert!(
        (own - 400.0).abs() < 1e-6,
        "taken over: 300 + 100 on an A76, not {own}"
    );
    assert!(
        (next - 710.0).abs() < 1e-6,
        "paused until 510, then 200 on an A55, not {next}"
    );
    let (own, _) = case(true);
    assert!(
        (own - 300.0).abs() < 1e-6,
        "an unused expert withdrawn costs nothing: {own}"
    );
}

#[test]
fn a_waiting_dense_call_takes_a_prefetch_on_an_idle_big_core() {
    // 2 A76s, 2 A55s at half speed. A dense call starts (`begin`, 10 µs) and keeps one A76
    // for 500 µs; three prefetches of 150 µs of A76 work (300 µs on an A55) are queued.
    let p = Params {
        little_cores: 2.0,
        little_core_factor: 0.5,
        memcpy_gbps_little_core: 1e6,
        ..params()
    };
    let case = |helps: bool| {
        let mut g = Graph::default();
        let begin = dense(&mut g, 10.0, 0, &[]);
        let body = dense(&mut g, 500.0, 0, &[begin]);
        let end = g.join(&[body], 0);
        let work = Work::Dense {
            us: 150.0,
            bytes: 0,
        };
        let prefetches: Vec<u32> = (0..3).map(|_| g.push(work, Unit::Little, &[], 0)).collect();
        if helps {
            g.helping.push((begin, end));
        }
        let s = simulate(&g, &p).unwrap();
        s.end[prefetches[2] as usize]
    };
    let third = case(true);
    assert!(
        (third - 160.0).abs() < 1e-6,
        "on the idle A76 from 10 µs: {third}"
    );
    let third = case(false);
    assert!(
        (third - 600.0).abs() < 1e-6,
        "after the first two on an A55: {third}"
    );
}

#[test]
fn dependencies_serialize() {
    let p = params();
    let mut g = Graph::default();
    let a = dense(&mut g, 100.0, 0, &[]);
    let b = dense(&mut g, 50.0, 0, &[a]);
    dense(&mut g, 25.0, 0, &[b]);
    let t = timeline(&g, &p).unwrap();
    assert!((t.scheduled_us - 175.0).abs() < 1e-6);
    assert!((t.bound.critical_path_us - 175.0).abs() < 1e-6);
    assert!((t.bound.cpu_us - 87.5).abs() < 1e-6);
}

#[test]
fn dram_is_shared_among_running_tasks() {
    // Two tasks each wanting 10 GB/s for 100 µs on a 10 GB/s budget: both take 200 µs.
    let p = params();
    let mut g = Graph::default();
    dense(&mut g, 100.0, 1_000_000, &[]);
    dense(&mut g, 100.0, 1_000_000, &[]);
    let t = timeline(&g, &p).unwrap();
    assert!((t.scheduled_us - 200.0).abs() < 1e-6, "{}", t.scheduled_us);
    assert!((t.bound.dram_us - 200.0).abs() < 1e-6);
    // A light task keeps its own speed next to a heavy one: max-min fairness.
    let mut g = Graph::default();
    dense(&mut g, 100.0, 200_000, &[]);
    dense(&mut g, 100.0, 2_000_000, &[]);
    let t = timeline(&g, &p).unwrap();
    // Light: 2 GB/s, granted; heavy gets 8 of its 20 GB/s until the light ends at 100 µs,
    // then 10: 0.4 of its work done at 100 µs, the rest (1.2 MB) at 10 GB/s, 120 µs.
    assert!((t.scheduled_us - 220.0).abs() < 1e-6, "{}", t.scheduled_us);
}

#[test]
fn a_chain_keeps_its_thread_through_a_blocking_run() {
    // Two cores; chain A: cpu 100 -> npu run (blocks the thread) -> cpu 100. A second
    // independent CPU task of 300 µs. While A blocks, only one core is left for it.
    let p = params();
    let mut g = Graph::default();
    let a0 = dense(&mut g, 100.0, 0, &[]);
    let run = Work::Run {
        primitive: ork_moe::npu::Primitive::RunI8,
        m: 32,
        k: 2048,
        n: 768,
    };
    let r = g.push_on(run, Unit::Npu(0), a0, &[], 0);
    g.push_on(
        Work::Dense {
            us: 100.0,
            bytes: 0,
        },
        Unit::Big,
        r,
        &[],
        0,
    );
    let other = dense(&mut g, 300.0, 0, &[]);
    let (run_us, _) = price(&run, Core::Npu, &p);
    let t = timeline(&g, &p).unwrap();
    assert!(t.scheduled_us >= 200.0 + run_us - 1e-6);
    // The other task ran alone on the second core from 0 to 300 µs.
    let s = simulate(&g, &p).unwrap();
    assert!((s.end[other as usize] - 300.0).abs() < 1e-6);
    assert_eq!(t.runs, 1);
}

#[test]
fn little_cores_are_slower_and_take_any_cpu_work() {
    let p = Params {
        big_cores: 1.0,
        little_cores: 1.0,
        little_core_factor: 0.5,
        ..params()
    };
    let mut g = Graph::default();
    g.push(Work::Lookup, Unit::AnyCpu, &[], 0);
    g.push(Work::Lookup, Unit::AnyCpu, &[], 0);
    let t = timeline(&g, &p).unwrap();
    // One lookup on the A76 (4 µs), one on the A55 (8 µs).
    assert!((t.scheduled_us - 2.0 * p.lookup_us).abs() < 1e-6);
}
