//! The board check's NPU side: every primitive at the A3B shapes checked bit for bit against the
//! CPU int8 reference, and the costs the board model prices NPU work with (per-run floor, context
//! and buffer creation, syncs, throughput per core and on all cores, DRAM streaming).
//!
//! Each figure is a wall time around the device calls the engine makes. On the emulator that time
//! is this machine's CPU work (the caller marks it so); on `rknn` it is the board's.

use super::{Check, Effort, Findings};
use crate::bench::Timing;
use crate::gemm::{self as probe_gemm, Repeats};
use ork_moe::gemm::{self, Shape};
use ork_moe::isa::Isa;
use ork_moe::npu::{flags, Buffer, CoreMask, Device, MatMul, Primitive, Report};
use ork_moe::testutil::Rng;
use std::time::Instant;

/// (role, K, N) of the per-shape checks; the deep-K one takes the backend's deepest single run.
fn shapes(dev: &Device) -> [(&'static str, usize, usize); 4] {
    [
        ("gate/up", 2048, 768),
        ("down", 768, 2048),
        ("gate+up pair", 2048, 1536),
        ("deep K", dev.max_k(), 256),
    ]
}

fn err(e: ork_moe::npu::Error) -> String {
    e.to_string()
}

pub(super) fn us(t: &Timing) -> f64 {
    t.median * 1e6
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One GEMM on the device with random operands and its reference result. B is held in one or
/// more buffers of the same content, which the submits take in turn.
pub(super) struct Gemm {
    m: usize,
    kp: usize,
    np: usize,
    a: Buffer<i8>,
    b: Vec<Buffer<i8>>,
    next_b: usize,
    c: Buffer<i32>,
    expected: Vec<i32>,
}

impl Gemm {
    pub(super) fn new(
        dev: &Device,
        m: usize,
        k: usize,
        n: usize,
        seed: u64,
    ) -> Result<Gemm, String> {
        Gemm::with_b_copies(dev, m, k, n, seed, 1)
    }

    /// A GEMM whose B is in `copies` buffers, each submit taking the one after the last
    /// submit's: with two or more, no run reads the B the run before it read.
    pub(super) fn with_b_copies(
        dev: &Device,
        m: usize,
        k: usize,
        n: usize,
        seed: u64,
        copies: usize,
    ) -> Result<Gemm, String> {
        let t = dev.tiles();
        let (kp, np) = (t.pad(k), t.pad(n));
        let mut rng = Rng::new(seed);
        let mut a = vec![0i8; t.a_len(m, kp)];
        let mut b = vec![0i8; t.b_len(kp, np)];
        rng.fill_i8(&mut a);
        rng.fill_i8(&mut b);
        let mut expected = vec![0i32; t.c_len(m, np)];
        gemm::reference(&t, Shape { m, kp, np }, &a, &b, &mut expected);
        let (a, first_b, c) = probe_gemm::upload(dev, &a, &b, expected.len())?;
        let mut copies_of_b = vec![first_b];
        for _ in 1..copies {
            let mut copy = dev
                .alloc::<i8>(b.len(), flags::CPU_FILLED, 0)
                .map_err(err)?;
            copy.write(0, &b).map_err(err)?;
            copy.sync_to_device().map_err(err)?;
            copies_of_b.push(copy);
        }
        Ok(Gemm {
            m,
            kp,
            np,
            a,
            b: copies_of_b,
            next_b: 0,
            c,
            expected,
        })
    }

    pub(super) fn macs(&self) -> f64 {
        (self.m * self.kp * self.np) as f64
    }

    /// One `run_i8` over `cores` (`None`: the device's core mask); C is left unsynced.
    pub(super) fn submit(
        &mut self,
        dev: &Device,
        cores: Option<CoreMask>,
    ) -> Result<Report, String> {
        let b = &self.b[self.next_b];
        self.next_b = (self.next_b + 1) % self.b.len();
        let mm = MatMul {
            m: self.m,
            k: self.kp,
            n: self.np,
            a: &self.a,
            a_offset: 0,
            b,
            b_offset: 0,
            c_offset: 0,
        };
        match cores {
            Some(mask) => dev
                .prepare_i8_on(mm, &mut self.c, mask)
                .and_then(|s| s.run()),
            None => dev.run_i8(mm, &mut self.c),
        }
        .map_err(err)
    }

    /// Whether the last submit's C equals the reference.
    pub(super) fn exact(&mut self) -> Result<bool, String> {
        self.c.sync_from_device().map_err(err)?;
        Ok(self.c.as_slice() == &self.expected[..])
    }

    /// `reps.warmup` submits, then `reps.timed` timed ones; every result is checked (outside the
    /// timing). The first submit's report is returned.
    pub(super) fn timed(
        &mut self,
        dev: &Device,
        cores: Option<CoreMask>,
        reps: Repeats,
    ) -> Result<(Timing, Report, bool), String> {
        let mut first = None;
        let mut exact = true;
        let mut t = Vec::new();
        for i in 0..reps.warmup + reps.timed.max(1) {
            let start = Instant::now();
            let r = self.submit(dev, cores)?;
            if i >= reps.warmup {
                t.push(start.elapsed().as_secs_f64());
            }
            first.get_or_insert(r);
            exact &= self.exact()?;
        }
        Ok((Timing::of(t), first.expect("at least one run"), exact))
    }

    pub(super) fn check(&self, role: &str, primitive: String, t: &Timing, exact: bool) -> Check {
        Check {
            role: role.to_string(),
            k: self.kp,
            n: self.np,
            m: self.m,
            primitive,
            npu_us: us(t),
            npu_min_us: t.min * 1e6,
            npu_max_us: t.max * 1e6,
            cpu1_us: None,
            cpun_us: None,
            modelled_us: None,
            bit_exact: exact,
        }
    }
}

pub(super) fn on_core(c: usize) -> CoreMask {
    CoreMask(1 << c)
}

/// The cores a GEMM asked for one core actually ran on: on a single-core chip the backend runs
/// everything on core 0, whatever is asked.
pub fn usable_cores(dev: &Device, f: &mut Findings) -> Result<Vec<usize>, String> {
    let mut g = Gemm::new(dev, 1, 32, 32, 11)?;
    let mut found = Vec::new();
    for c in 0..CoreMask::CORES {
        let start = Instant::now();
        let r = g.submit(dev, Some(on_core(c)))?;
        let t = start.elapsed().as_secs_f64();
        let exact = g.exact()?;
        let once = Timing {
            median: t,
            min: t,
            max: t,
        };
        f.checks.push(g.check(
            "core probe",
            format!("run_i8 asking core {c}"),
            &once,
            exact,
        ));
        if r.tasks_per_core[c] > 0 {
            found.push(c);
        }
    }
    if found.is_empty() {
        return Err("no NPU core ran a GEMM asked of it".into());
    }
    Ok(found)
}

/// Every NPU measurement, in the order the text prints them.
pub fn measure(
    dev: &Device,
    cpu: &Device,
    isa: Isa,
    cores: &[usize],
    effort: Effort,
    f: &mut Findings,
) -> Result<(), String> {
    let first = on_core(cores[0]);
    f.set(
        "cores",
        cores.len() as f64,
        "NPU cores that ran a GEMM asked of them alone",
    );

    // The floor: the smallest GEMM the runtime takes, one row, one core.
    let mut tiny = Gemm::new(dev, 1, 32, 32, 1)?;
    let reps = Repeats {
        warmup: 3,
        timed: effort.pick(50, 300),
    };
    let (t, _, exact) = tiny.timed(dev, Some(first), reps)?;
    f.checks
        .push(tiny.check("run floor", format!("run_i8 core {}", cores[0]), &t, exact));
    let floor = us(&t);
    f.set(
        "run_us_floor",
        floor,
        format!(
            "M=1 K=32 N=32 run_i8 on core {}, median of {}",
            cores[0], reps.timed
        ),
    );
    eprintln!("board: run floor {floor:.1} us");

    context_create(dev, first, effort, f)?;
    buffer_create(dev, effort, f)?;
    sync(dev, effort, f)?;
    throughput(dev, cores, floor, effort, f)?;
    dram(dev, floor, effort, f)?;
    per_shape(dev, cpu, isa, effort, f)?;
    for primitive in [Primitive::StreamI8, Primitive::ChainI8] {
        f.checks.push(pair(dev, primitive, first, effort)?);
    }
    Ok(())
}

/// A matmul context: the first run of a new shape minus a later run of it, per context the
/// backend says the first run created (`Report::contexts_created`; only `rknn` creates any).
fn context_create(
    dev: &Device,
    core: CoreMask,
    effort: Effort,
    f: &mut Findings,
) -> Result<(), String> {
    let shapes = effort.pick(3, 8);
    let mut costs = Vec::new();
    let mut created = 0;
    for i in 0..shapes {
        // A depth no other GEMM of the check uses: a new context.
        let mut g = Gemm::new(dev, 1, 96 + 32 * i, 64, 100 + i as u64)?;
        let start = Instant::now();
        let r = g.submit(dev, Some(core))?;
        let first = start.elapsed().as_secs_f64() * 1e6;
        let first_exact = g.exact()?;
        let later = Repeats {
            warmup: 0,
            timed: 3,
        };
        let (t, _, exact) = g.timed(dev, Some(core), later)?;
        f.checks.push(g.check(
            "context create",
            "run_i8 of a new shape".into(),
            &t,
            first_exact && exact,
        ));
        let later = us(&t);
        if r.contexts_created > 0 {
            created += r.contexts_created;
            costs.push((first - later) / r.contexts_created as f64);
        }
    }
    f.num("contexts_created_by_the_check", created as f64);
    if costs.is_empty() {
        f.keep(
            "context_create_us",
            "this backend creates no matmul contexts (only librknnrt does)",
        );
        return Ok(());
    }
    let cost = median(costs);
    if cost <= 0.0 {
        f.keep(
            "context_create_us",
            format!("a new shape's first run was no slower than its later runs ({cost:.1} us)"),
        );
    } else {
        f.set(
            "context_create_us",
            cost,
            format!(
                "first run of {shapes} new shapes minus their later runs, per context created ({created})"
            ),
        );
        eprintln!("board: context create {cost:.0} us");
    }
    Ok(())
}

/// Creating one expert-sized device buffer (a gate/up expert's native B).
fn buffer_create(dev: &Device, effort: Effort, f: &mut Findings) -> Result<(), String> {
    let len = 2048 * 768;
    let n = effort.pick(5, 20);
    let mut held = Vec::new();
    let mut t = Vec::new();
    for _ in 0..n {
        let start = Instant::now();
        let b = dev.alloc::<i8>(len, flags::CPU_FILLED, 0).map_err(err)?;
        t.push(start.elapsed().as_secs_f64() * 1e6);
        // Held, as a cache holds its experts: each is a fresh allocation.
        held.push(b);
    }
    let v = median(t);
    f.set(
        "buffer_create_us",
        v,
        format!("alloc of a 1.5 MiB CPU_FILLED buffer, median of {n}"),
    );
    eprintln!("board: buffer create {v:.1} us");
    Ok(())
}

/// `sync_to_device` of a buffer the CPU just wrote, median over repeats.
pub(super) fn sync_time(dev: &Device, bytes: usize, reps: usize) -> Result<f64, String> {
    let mut b = dev.alloc::<i8>(bytes, flags::CPU_FILLED, 0).map_err(err)?;
    let mut t = Vec::new();
    for r in 0..reps + 1 {
        b.as_mut_slice().fill(r as i8);
        let start = Instant::now();
        b.sync_to_device().map_err(err)?;
        t.push(start.elapsed().as_secs_f64() * 1e6);
    }
    // The first sync of a buffer may set up what later ones reuse.
    Ok(median(t[1..].to_vec()))
}

/// The fixed cost of a sync (a 4 KiB buffer) and its rate (the growth to a large buffer).
fn sync(dev: &Device, effort: Effort, f: &mut Findings) -> Result<(), String> {
    let reps = effort.pick(5, 15);
    let (small, large) = (4096, effort.pick(4, 16) << 20);
    let ts = sync_time(dev, small, reps)?;
    let tl = sync_time(dev, large, reps)?;
    f.num("sync_4kib_us", ts);
    f.num(&format!("sync_{}mib_us", large >> 20), tl);
    f.set(
        "sync_us",
        ts,
        format!("sync_to_device of a 4 KiB buffer the CPU wrote, median of {reps}"),
    );
    if tl > 1.5 * ts && tl - ts > 1.0 {
        let gbps = (large - small) as f64 / (tl - ts) / 1e3;
        f.set(
            "sync_gbps",
            gbps,
            format!("growth of the sync time from 4 KiB to {} MiB", large >> 20),
        );
    } else {
        f.keep(
            "sync_gbps",
            format!(
                "the sync time did not grow with the size ({ts:.1} us for 4 KiB, {tl:.1} us for {} MiB)",
                large >> 20
            ),
        );
    }
    eprintln!(
        "board: sync {ts:.1} us (4 KiB), {tl:.1} us ({} MiB)",
        large >> 20
    );
    Ok(())
}

/// int8 TOPS of a compute-bound GEMM on each core alone and on all of the device's cores.
fn throughput(
    dev: &Device,
    cores: &[usize],
    floor: f64,
    effort: Effort,
    f: &mut Findings,
) -> Result<(), String> {
    let mut g = Gemm::new(dev, effort.pick(32, 256), 2048, 768, 3)?;
    let reps = Repeats {
        warmup: 1,
        timed: effort.pick(2, 5),
    };
    let tops = |t: &Timing, macs: f64| {
        let compute_us = us(t) - floor;
        (compute_us > 0.0).then(|| 2.0 * macs / compute_us / 1e6)
    };
    let mut per_core = Vec::new();
    for &c in cores {
        let (t, _, exact) = g.timed(dev, Some(on_core(c)), reps)?;
        f.checks
            .push(g.check("throughput", format!("run_i8 core {c}"), &t, exact));
        let x = tops(&t, g.macs());
        f.num(&format!("tops_core_{c}"), x.unwrap_or(f64::NAN));
        per_core.extend(x);
    }
    let (t, _, exact) = g.timed(dev, None, reps)?;
    f.checks
        .push(g.check("throughput", "run_i8 all cores".into(), &t, exact));
    let all = tops(&t, g.macs());
    f.num("tops_all_cores", all.unwrap_or(f64::NAN));
    if per_core.len() == cores.len() {
        let v = median(per_core);
        f.set(
            "core_tops",
            v,
            format!(
                "M={} K=2048 N=768 run_i8 on each core alone: 2·MACs / (time - run floor), median over the cores",
                g.m
            ),
        );
        eprintln!(
            "board: {v:.3} TOPS per core, {:.3} on all cores",
            all.unwrap_or(f64::NAN)
        );
    } else {
        f.keep(
            "core_tops",
            "a compute-bound GEMM took no longer than the run floor",
        );
    }
    Ok(())
}

/// The DRAM rate of one run: one row against a large B, bytes moved over the time past the floor.
fn dram(dev: &Device, floor: f64, effort: Effort, f: &mut Findings) -> Result<(), String> {
    let k = dev.max_k().min(8192);
    let n = effort.pick(1024, 2048);
    let mut g = Gemm::new(dev, 1, k, n, 4)?;
    let reps = Repeats {
        warmup: 1,
        timed: effort.pick(3, 7),
    };
    let (t, report, exact) = g.timed(dev, None, reps)?;
    f.checks
        .push(g.check("dram stream", "run_i8 all cores".into(), &t, exact));
    let past_floor = us(&t) - floor;
    if past_floor > 0.0 {
        let gbps = report.bytes as f64 / past_floor / 1e3;
        f.set(
            "dram_gbps",
            gbps,
            format!(
                "M=1 K={k} N={n} run_i8 ({:.1} MB moved) over its time past the run floor",
                report.bytes as f64 / 1e6
            ),
        );
        eprintln!("board: NPU DRAM stream {gbps:.2} GB/s");
    } else {
        f.keep(
            "dram_gbps",
            "a DRAM-bound GEMM took no longer than the run floor",
        );
    }
    Ok(())
}

/// The A3B shapes at a few row counts, through the primitive the engine picks (the probe's
/// `gemm` measurement: also the CPU int8 GEMM on one and on all threads).
fn per_shape(
    dev: &Device,
    cpu: &Device,
    isa: Isa,
    effort: Effort,
    f: &mut Findings,
) -> Result<(), String> {
    let rows: &[usize] = if effort.quick {
        &[16]
    } else {
        &[1, 16, 64, 128, 256]
    };
    let reps = Repeats {
        warmup: effort.pick(1, 2),
        timed: effort.pick(2, 7),
    };
    for (role, k, n) in shapes(dev) {
        for &m in rows {
            let r = probe_gemm::measure(dev, cpu, isa, (k, n, m), reps)?;
            f.checks.push(Check {
                role: role.to_string(),
                k,
                n,
                m,
                primitive: r.primitive.name().to_string(),
                npu_us: r.npu_us,
                npu_min_us: r.npu_spread_us.0,
                npu_max_us: r.npu_spread_us.1,
                cpu1_us: Some(r.cpu1_us),
                cpun_us: Some(r.cpun_us),
                modelled_us: r.modelled_us,
                bit_exact: r.bit_exact,
            });
        }
        eprintln!("board: {role} {k}x{n} checked");
    }
    Ok(())
}

/// Gate and up of one expert sharing A, as two GEMMs of one submit: a stream (over the cores) or
/// a chain (one core), both weights in one buffer as the expert cache keeps them.
fn pair(
    dev: &Device,
    primitive: Primitive,
    core: CoreMask,
    effort: Effort,
) -> Result<Check, String> {
    let t = dev.tiles();
    let (m, kp, np) = (effort.pick(16, 64), 2048, 768);
    let mut rng = Rng::new(21);
    let mut a = vec![0i8; t.a_len(m, kp)];
    let mut b = vec![0i8; 2 * t.b_len(kp, np)];
    rng.fill_i8(&mut a);
    rng.fill_i8(&mut b);
    let (b_len, c_len) = (t.b_len(kp, np), t.c_len(m, np));
    let mut expected = vec![0i32; 2 * c_len];
    for (i, c) in expected.chunks_exact_mut(c_len).enumerate() {
        let shape = Shape { m, kp, np };
        gemm::reference(&t, shape, &a, &b[i * b_len..(i + 1) * b_len], c);
    }
    let (ab, bb, mut cb) = probe_gemm::upload(dev, &a, &b, 2 * c_len)?;
    let submit = |c: &mut Buffer<i32>| {
        let gemms = (0..2)
            .map(|i| MatMul {
                m,
                k: kp,
                n: np,
                a: &ab,
                a_offset: 0,
                b: &bb,
                b_offset: i * b_len,
                c_offset: i * c_len,
            })
            .collect();
        match primitive {
            Primitive::ChainI8 => dev.run_chain_i8(gemms, c, core),
            _ => dev.run_stream_i8(gemms, c),
        }
        .map_err(err)
    };
    let (warmup, timed) = (effort.pick(1, 2), effort.pick(2, 7));
    let mut exact = true;
    let mut t = Vec::new();
    for i in 0..warmup + timed {
        let start = Instant::now();
        submit(&mut cb)?;
        if i >= warmup {
            t.push(start.elapsed().as_secs_f64());
        }
        cb.sync_from_device().map_err(err)?;
        exact &= cb.as_slice() == &expected[..];
    }
    let timing = Timing::of(t);
    Ok(Check {
        role: "gate, up sharing A".into(),
        k: kp,
        n: np,
        m,
        primitive: format!("{} x2", primitive.name()),
        npu_us: us(&timing),
        npu_min_us: timing.min * 1e6,
        npu_max_us: timing.max * 1e6,
        cpu1_us: None,
        cpun_us: None,
        modelled_us: None,
        bit_exact: exact,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ork_moe::moe::Config;
    use ork_moe::npu::BackendChoice;

    #[test]
    fn submits_take_the_copies_of_b_in_turn() {
        let mut device = Config::default().device;
        device.backend = BackendChoice::Emu;
        let dev = Device::open(&device).unwrap();
        let mut g = Gemm::with_b_copies(&dev, 4, 64, 64, 7, 3).unwrap();
        // The third copy alone made wrong: only every third run reads it.
        let len = g.b[2].as_slice().len();
        g.b[2].write(0, &vec![1i8; len]).unwrap();
        g.b[2].sync_to_device().unwrap();
        let mut exact = Vec::new();
        for _ in 0..6 {
            g.submit(&dev, None).unwrap();
            exact.push(g.exact().unwrap());
        }
        assert_eq!(exact, [true, true, false, true, true, false]);
    }
}
