//! Parameters fitted to a board profile's measurement arrays: a least-squares line through a
//! run's time against its MACs gives the run floor (the intercept) and the per-core throughput
//! (the slope); one through a big core's sync time against the bytes synced gives the sync's
//! fixed cost and rate. A fit the points cannot support is rejected with the reason, and the
//! parameter keeps its value.

/// The routed experts' (K, N) whose one-core runs the run fit takes: gate/up and down of
/// Qwen3-30B-A3B, the shapes most of the NPU's work has.
pub const EXPERT_SHAPES: [(f64, f64); 2] = [(2048.0, 768.0), (768.0, 2048.0)];

/// One `run_us_vs_m` row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunPoint {
    pub m: f64,
    pub k: f64,
    pub n: f64,
    pub cores: f64,
    pub us: f64,
}

/// One `sync_us_vs_bytes` row.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncPoint {
    pub bytes: f64,
    pub core_type: String,
    pub us: f64,
}

/// `y = intercept + slope · x`, by least squares over `points` (x, y).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Line {
    pub intercept: f64,
    pub slope: f64,
}

/// The least-squares line through `points`; `None` with fewer than two distinct x.
pub fn line(points: &[(f64, f64)]) -> Option<Line> {
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    // Equal x give sxx = 0 exactly; distinct ones a positive sum.
    (sxx > 0.0).then(|| {
        let slope = sxy / sxx;
        Line {
            intercept: mean_y - slope * mean_x,
            slope,
        }
    })
}

/// One fitted parameter: its value and how it was fitted, or why the fit was rejected.
pub type Fitted = (&'static str, Result<(f64, String), String>);

fn distinct(xs: impl Iterator<Item = f64>) -> usize {
    let mut v: Vec<f64> = xs.collect();
    v.sort_by(f64::total_cmp);
    v.dedup();
    v.len()
}

/// `run_us_floor` and `core_tops` from the one-core runs at [`EXPERT_SHAPES`]: time against
/// MACs (M·K·N), so both shapes share one line; the slope is µs per MAC, a TOPS figure is
/// 2 / (slope · 10⁶).
pub fn runs(rows: &[RunPoint]) -> [Fitted; 2] {
    let used: Vec<&RunPoint> = rows
        .iter()
        .filter(|r| r.cores == 1.0 && EXPERT_SHAPES.contains(&(r.k, r.n)))
        .collect();
    let what = "run_us_vs_m, 1 core, K×N 2048×768 and 768×2048";
    let reject = |why: String| -> [Fitted; 2] {
        [("run_us_floor", Err(why.clone())), ("core_tops", Err(why))]
    };
    let ms = distinct(used.iter().map(|r| r.m));
    if ms < 2 {
        return reject(format!("{what}: {ms} distinct M, a line needs 2"));
    }
    let points: Vec<(f64, f64)> = used.iter().map(|r| (r.m * r.k * r.n, r.us)).collect();
    let l = line(&points).expect("two distinct M at fixed K·N are two distinct MACs");
    if l.slope <= 0.0 || !l.slope.is_finite() {
        return reject(format!(
            "{what}: the time does not grow with M (slope {:.3e} µs per MAC)",
            l.slope
        ));
    }
    let how = format!(
        "least-squares line over {what} ({} runs, {ms} M): {:.1} µs + {:.1} MACs/µs",
        points.len(),
        l.intercept,
        1.0 / l.slope
    );
    let floor = if l.intercept >= 0.0 {
        Ok((l.intercept, format!("intercept of the {how}")))
    } else {
        Err(format!(
            "{what}: the line's intercept is negative ({:.1} µs)",
            l.intercept
        ))
    };
    [
        ("run_us_floor", floor),
        (
            "core_tops",
            Ok((2.0 / (l.slope * 1e6), format!("slope of the {how}"))),
        ),
    ]
}

/// `sync_us` and `sync_gbps` from the big core's syncs: time against bytes. The model prices a
/// little core's sync at `little_core_factor` of this rate, so the little core's rows are not
/// fitted.
pub fn syncs(rows: &[SyncPoint]) -> [Fitted; 2] {
    let points: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| r.core_type == "big")
        .map(|r| (r.bytes, r.us))
        .collect();
    let what = "sync_us_vs_bytes, big core";
    let reject =
        |why: String| -> [Fitted; 2] { [("sync_us", Err(why.clone())), ("sync_gbps", Err(why))] };
    let sizes = distinct(points.iter().map(|p| p.0));
    let Some(l) = line(&points) else {
        return reject(format!("{what}: {sizes} distinct sizes, a line needs 2"));
    };
    if l.slope <= 0.0 || !l.slope.is_finite() {
        return reject(format!(
            "{what}: the time does not grow with the size (slope {:.3e} µs per byte)",
            l.slope
        ));
    }
    // bytes per µs is 10⁶ bytes per second: GB/s is that over 10³.
    let gbps = 1.0 / l.slope / 1e3;
    let how = format!(
        "least-squares line over {what} ({} syncs, {sizes} sizes): {:.1} µs + {gbps:.2} GB/s",
        points.len(),
        l.intercept
    );
    let fixed = if l.intercept >= 0.0 {
        Ok((l.intercept, format!("intercept of the {how}")))
    } else {
        Err(format!(
            "{what}: the line's intercept is negative ({:.1} µs)",
            l.intercept
        ))
    };
    [
        ("sync_us", fixed),
        ("sync_gbps", Ok((gbps, format!("slope of the {how}")))),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(m: f64, k: f64, n: f64, cores: f64, us: f64) -> RunPoint {
        RunPoint { m, k, n, cores, us }
    }

    /// Runs on the line 40 µs + MACs / 300 000 per µs (0.6 TOPS), at both expert shapes, plus
    /// rows the fit must leave out: three cores, and a projection shape far off the line.
    fn runs_on_a_line(ms: &[f64]) -> Vec<RunPoint> {
        let mut rows = Vec::new();
        for &m in ms {
            for (k, n) in EXPERT_SHAPES {
                rows.push(run(m, k, n, 1.0, 40.0 + m * k * n / 300_000.0));
                rows.push(run(m, k, n, 3.0, 1.0));
            }
            rows.push(run(m, 2048.0, 4096.0, 1.0, 5.0));
        }
        rows
    }

    fn value(f: &Fitted) -> f64 {
        f.1.as_ref().unwrap().0
    }

    #[test]
    fn a_line_through_exact_points_is_found_and_needs_two_distinct_x() {
        let l = line(&[(1.0, 5.0), (3.0, 9.0), (4.0, 11.0)]).unwrap();
        assert!((l.intercept - 3.0).abs() < 1e-12 && (l.slope - 2.0).abs() < 1e-12);
        // Noise symmetric about the line leaves it where it is.
        let l = line(&[(0.0, 1.0), (0.0, -1.0), (2.0, 5.0), (2.0, 3.0)]).unwrap();
        assert!((l.intercept - 0.0).abs() < 1e-12 && (l.slope - 2.0).abs() < 1e-12);
        assert_eq!(line(&[(2.0, 1.0), (2.0, 3.0)]), None);
        assert_eq!(line(&[]), None);
    }

    #[test]
    fn runs_at_the_expert_shapes_give_the_floor_and_the_throughput() {
        let [floor, tops] = runs(&runs_on_a_line(&[16.0, 64.0, 256.0]));
        assert_eq!(floor.0, "run_us_floor");
        assert_eq!(tops.0, "core_tops");
        assert!((value(&floor) - 40.0).abs() < 1e-6, "{floor:?}");
        assert!((value(&tops) - 0.6).abs() < 1e-9, "{tops:?}");
        assert!(floor.1.unwrap().1.contains("intercept"));
    }

    #[test]
    fn a_run_fit_without_two_m_or_with_a_flat_line_is_rejected() {
        for rows in [runs_on_a_line(&[32.0]), runs_on_a_line(&[]), Vec::new()] {
            for (name, r) in runs(&rows) {
                let why = r.expect_err(name);
                assert!(why.contains("distinct M"), "{why}");
            }
        }
        // Time falling with M.
        let falling: Vec<RunPoint> = [16.0, 32.0]
            .iter()
            .map(|&m| run(m, 2048.0, 768.0, 1.0, 500.0 - m))
            .collect();
        for (name, r) in runs(&falling) {
            assert!(r.expect_err(name).contains("does not grow"));
        }
        // A steep line through a negative intercept: the throughput stands, the floor does not.
        let steep: Vec<RunPoint> = [16.0, 32.0]
            .iter()
            .map(|&m| run(m, 2048.0, 768.0, 1.0, 20.0 * m - 100.0))
            .collect();
        let [floor, tops] = runs(&steep);
        assert!(floor.1.unwrap_err().contains("negative"));
        assert!(tops.1.is_ok());
    }

    #[test]
    fn big_core_syncs_give_the_fixed_cost_and_the_rate() {
        // 8 µs + bytes at 5 GB/s (5000 bytes per µs); the little core's rows are off the line.
        let mut rows = Vec::new();
        for bytes in [4096.0, 1048576.0, 16777216.0] {
            let sync = |core_type: &str, us| SyncPoint {
                bytes,
                core_type: core_type.into(),
                us,
            };
            rows.push(sync("big", 8.0 + bytes / 5000.0));
            rows.push(sync("little", 1.0));
        }
        let [fixed, rate] = syncs(&rows);
        assert_eq!((fixed.0, rate.0), ("sync_us", "sync_gbps"));
        assert!((value(&fixed) - 8.0).abs() < 1e-6, "{fixed:?}");
        assert!((value(&rate) - 5.0).abs() < 1e-9, "{rate:?}");
    }

    #[test]
    fn a_sync_fit_with_one_size_or_a_flat_line_is_rejected() {
        let at = |bytes: f64, us: f64| SyncPoint {
            bytes,
            core_type: "big".into(),
            us,
        };
        let one_size = [at(4096.0, 3.0), at(4096.0, 4.0)];
        for (name, r) in syncs(&one_size) {
            assert!(r.expect_err(name).contains("1 distinct sizes"));
        }
        // The emulator's syncs cost the same at every size.
        let flat = [at(4096.0, 0.03), at(1048576.0, 0.03)];
        for (name, r) in syncs(&flat) {
            assert!(r.expect_err(name).contains("does not grow"));
        }
    }
}
