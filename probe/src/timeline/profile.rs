//! The board profile: the JSON object the board check writes (every parameter, `backend`,
//! `runtime_version`, `all_bit_exact`, the `measured` list, and fields of its own), and the
//! settings read back from one.

use super::fit::{self, Fitted, RunPoint, SyncPoint};
use super::params::{index, Params, SPECS};
use super::settings::{Origin, ProfileInfo, Settings};
use serde_json::{Map, Value};

/// A board profile's fields for `params` and `info`: every parameter and `info`'s fields, for a
/// writer that adds fields of its own (the board check's per-shape rows and timings).
pub fn fields(params: &Params, info: &ProfileInfo) -> Map<String, Value> {
    let mut fields = Map::new();
    fields.insert("backend".into(), info.backend.clone().into());
    fields.insert(
        "runtime_version".into(),
        info.runtime_version.clone().into(),
    );
    fields.insert("all_bit_exact".into(), info.all_bit_exact.into());
    if let Some(names) = &info.measured {
        fields.insert("measured".into(), names.clone().into());
    }
    for s in SPECS {
        let v = params.get(s.name).expect("every spec has a field");
        fields.insert(s.name.into(), v.into());
    }
    fields
}

/// Defaults overridden by the parameters a board profile carries. Keys that are not
/// parameters (the board check's per-shape rows, timings of its own) are ignored; a
/// parameter with a value that is not a usable number is an error. A parameter the profile's
/// `measured` list leaves out keeps the profile's value, marked [`Origin::ProfileKept`]. The
/// measurement arrays `run_us_vs_m` and `sync_us_vs_bytes`, where present, replace the parameters
/// fitted to them ([`fit`], [`Origin::ProfileFit`]); a rejected fit is noted and the parameter
/// keeps the value above.
pub fn read(text: &str, path: &str) -> Result<Settings, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("{path}: {e}"))?;
    let Value::Object(fields) = &v else {
        return Err(format!("{path}: a board profile is a JSON object"));
    };
    let measured = match v.get("measured") {
        None | Some(Value::Null) => None,
        Some(Value::Array(names)) => Some(
            names
                .iter()
                .map(|n| n.as_str().map(String::from))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| format!("{path}: measured is not a list of names"))?,
        ),
        Some(_) => return Err(format!("{path}: measured is not a list of names")),
    };
    let mut s = Settings::default();
    for (key, value) in fields {
        let Some(i) = index(key) else { continue };
        let x = value
            .as_f64()
            .ok_or_else(|| format!("{path}: {key} is not a number"))?;
        s.params.set(key, x).map_err(|e| format!("{path}: {e}"))?;
        s.origins[i] = match &measured {
            Some(names) if !names.iter().any(|n| n == key) => Origin::ProfileKept(path.to_string()),
            _ => Origin::Profile(path.to_string()),
        };
    }
    let text_of = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    s.profile = Some(ProfileInfo {
        path: path.to_string(),
        backend: text_of("backend"),
        runtime_version: text_of("runtime_version"),
        all_bit_exact: v.get("all_bit_exact").and_then(Value::as_bool),
        measured,
    });
    let runs = points(&v, "run_us_vs_m", path, |r| {
        Some(RunPoint {
            m: r.get("m")?.as_f64()?,
            k: r.get("k")?.as_f64()?,
            n: r.get("n")?.as_f64()?,
            cores: r.get("cores")?.as_f64()?,
            us: r.get("us")?.as_f64()?,
        })
    })?;
    let syncs = points(&v, "sync_us_vs_bytes", path, |r| {
        Some(SyncPoint {
            bytes: r.get("bytes")?.as_f64()?,
            core_type: r.get("core_type")?.as_str()?.to_string(),
            us: r.get("us")?.as_f64()?,
        })
    })?;
    if let Some(rows) = runs {
        apply(&mut s, fit::runs(&rows), path);
    }
    if let Some(rows) = syncs {
        apply(&mut s, fit::syncs(&rows), path);
    }
    Ok(s)
}

/// The rows of measurement array `key`, each read by `row`; `None` when the profile has none.
fn points<T>(
    v: &Value,
    key: &str,
    path: &str,
    row: impl Fn(&Value) -> Option<T>,
) -> Result<Option<Vec<T>>, String> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(rows)) => rows
            .iter()
            .map(|r| row(r).ok_or_else(|| format!("{path}: {key} has a malformed row: {r}")))
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(format!("{path}: {key} is not a list")),
    }
}

/// Sets each fitted parameter, or notes why its fit was rejected.
fn apply(s: &mut Settings, fitted: [Fitted; 2], path: &str) {
    for (name, result) in fitted {
        let i = index(name).expect("a fit names a parameter");
        match result.and_then(|(value, how)| s.params.set(name, value).map(|()| how)) {
            Ok(how) => {
                s.origins[i] = Origin::ProfileFit {
                    path: path.to_string(),
                    how,
                };
            }
            Err(why) => s.rejected_fits.push((name, why)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile `ork-probe board --quick` wrote on the emulator.
    const BOARD_CHECK_PROFILE: &str = include_str!("../../../tests/data/board-profile-emu.json");

    fn write(params: &Params, info: &ProfileInfo) -> String {
        Value::Object(fields(params, info)).to_string()
    }

    #[test]
    fn a_profile_sets_its_parameters_and_ignores_other_keys() {
        let text = r#"{"backend": "rknn", "runtime_version": "2.3.2", "cores": 3,
            "all_bit_exact": true, "run_us_floor": 61.5, "context_create_us": 1234,
            "core_tops": 0.9, "dram_gbps": 17, "inflate_gbps_big_core": 6.25,
            "shapes": [{"k": 2048, "n": 768, "us": 80}], "host": "rock-5b"}"#;
        let s = read(text, "board.json").unwrap();
        assert_eq!(s.params.run_us_floor, 61.5);
        assert_eq!(s.params.context_create_us, 1234.0);
        assert_eq!(s.params.inflate_gbps_big_core, 6.25);
        assert_eq!(
            s.params.shared_dram_gbps,
            Params::default().shared_dram_gbps
        );
        let info = s.profile.as_ref().unwrap();
        assert_eq!(
            (info.backend.as_str(), info.runtime_version.as_str()),
            ("rknn", "2.3.2")
        );
        assert_eq!(info.all_bit_exact, Some(true));
        let i = index("core_tops").unwrap();
        assert_eq!(s.origins[i], Origin::Profile("board.json".into()));
        assert!(s.describe()[i].contains("board profile board.json"));
        for bad in [r#"{"core_tops": "fast"}"#, r#"{"cores": 7}"#, "[1]", "{"] {
            assert!(read(bad, "p").is_err(), "{bad}");
        }
    }

    #[test]
    fn a_written_profile_reads_back_to_the_same_parameters() {
        let mut p = Params::default();
        p.set("run_us_floor", 77.25).unwrap();
        p.set("mul_mat_id_share", 0.7).unwrap();
        let info = ProfileInfo {
            path: String::new(),
            backend: "emu".into(),
            runtime_version: "n/a".into(),
            all_bit_exact: Some(true),
            measured: None,
        };
        let s = read(&write(&p, &info), "x.json").unwrap();
        assert_eq!(s.params, p);
        assert_eq!(s.profile.unwrap().backend, "emu");
        assert!(s
            .origins
            .iter()
            .all(|o| *o == Origin::Profile("x.json".into())));
    }

    #[test]
    fn parameters_a_profile_did_not_measure_are_marked_kept() {
        let info = ProfileInfo {
            measured: Some(vec!["run_us_floor".into(), "core_tops".into()]),
            ..ProfileInfo::default()
        };
        let mut p = Params::default();
        p.set("run_us_floor", 70.0).unwrap();
        let s = read(&write(&p, &info), "b.json").unwrap();
        assert_eq!(s.params, p);
        assert_eq!(s.profile.as_ref().unwrap().measured, info.measured);
        for (spec, origin) in SPECS.iter().zip(&s.origins) {
            let measured = ["run_us_floor", "core_tops"].contains(&spec.name);
            let want = if measured {
                Origin::Profile("b.json".into())
            } else {
                Origin::ProfileKept("b.json".into())
            };
            assert_eq!(*origin, want, "{}", spec.name);
        }
        let i = index("task_us").unwrap();
        assert!(s.describe()[i].contains("not measured there"));
        for bad in [r#"{"measured": "all"}"#, r#"{"measured": [1]}"#] {
            assert!(read(bad, "p").is_err(), "{bad}");
        }
    }

    /// A profile whose runs lie on 25 µs + MACs / 250 000 per µs (0.5 TOPS) and whose big-core
    /// syncs lie on 6 µs + bytes at 4 GB/s, beside scalars that differ from both.
    const ON_LINES: &str = r#"{"run_us_floor": 61.5, "core_tops": 0.9, "sync_us": 10,
        "sync_gbps": 20, "measured": ["run_us_floor", "core_tops", "sync_us", "sync_gbps"],
        "run_us_vs_m": [
            {"m": 16, "k": 2048, "n": 768, "cores": 1, "us": 125.663296},
            {"m": 16, "k": 2048, "n": 768, "cores": 3, "us": 50},
            {"m": 64, "k": 768, "n": 2048, "cores": 1, "us": 427.653184},
            {"m": 64, "k": 2048, "n": 4096, "cores": 1, "us": 9999}],
        "sync_us_vs_bytes": [
            {"bytes": 4096, "core_type": "big", "us": 7.024},
            {"bytes": 1048576, "core_type": "big", "us": 268.144},
            {"bytes": 1048576, "core_type": "little", "us": 1}]}"#;

    #[test]
    fn the_measurement_arrays_replace_the_parameters_fitted_to_them() {
        let s = read(ON_LINES, "b.json").unwrap();
        let p = &s.params;
        assert!((p.run_us_floor - 25.0).abs() < 1e-6, "{}", p.run_us_floor);
        assert!((p.core_tops - 0.5).abs() < 1e-9, "{}", p.core_tops);
        assert!((p.sync_us - 6.0).abs() < 1e-6, "{}", p.sync_us);
        assert!((p.sync_gbps - 4.0).abs() < 1e-9, "{}", p.sync_gbps);
        for name in ["run_us_floor", "core_tops", "sync_us", "sync_gbps"] {
            let i = index(name).unwrap();
            assert!(
                matches!(&s.origins[i], Origin::ProfileFit { path, .. } if path == "b.json"),
                "{name}: {:?}",
                s.origins[i]
            );
            assert!(s.describe()[i].contains("least-squares line"), "{name}");
        }
        assert!(s.rejected_fits.is_empty());
    }

    #[test]
    fn a_rejected_fit_keeps_the_profiles_value_and_says_why() {
        // One M only; syncs that do not grow with the size.
        let text = r#"{"run_us_floor": 61.5, "core_tops": 0.9,
            "run_us_vs_m": [{"m": 32, "k": 2048, "n": 768, "cores": 1, "us": 300},
                            {"m": 32, "k": 768, "n": 2048, "cores": 1, "us": 310},
                            {"m": 64, "k": 2048, "n": 768, "cores": 3, "us": 400}],
            "sync_us_vs_bytes": [{"bytes": 4096, "core_type": "big", "us": 0.03},
                                 {"bytes": 1048576, "core_type": "big", "us": 0.03}]}"#;
        let s = read(text, "r.json").unwrap();
        assert_eq!((s.params.run_us_floor, s.params.core_tops), (61.5, 0.9));
        assert_eq!(s.params.sync_us, Params::default().sync_us);
        for (name, origin) in [
            ("run_us_floor", Origin::Profile("r.json".into())),
            ("core_tops", Origin::Profile("r.json".into())),
            ("sync_us", Origin::Default),
            ("sync_gbps", Origin::Default),
        ] {
            let i = index(name).unwrap();
            assert_eq!(s.origins[i], origin, "{name}");
            assert!(s.describe()[i].contains("fit rejected"), "{name}");
        }
        let why = |name: &str| &s.rejected_fits.iter().find(|r| r.0 == name).unwrap().1;
        assert!(why("core_tops").contains("1 distinct M"));
        assert!(why("sync_gbps").contains("does not grow"));
        // Set on the command line, a parameter drops its rejection.
        let mut s = s.clone();
        s.apply_override("core_tops=0.7").unwrap();
        assert!(!s.describe()[index("core_tops").unwrap()].contains("fit rejected"));
        for bad in [
            r#"{"run_us_vs_m": {"m": 1}}"#,
            r#"{"run_us_vs_m": [{"m": 16, "k": 2048}]}"#,
            r#"{"sync_us_vs_bytes": [{"bytes": 1, "core_type": 3, "us": 1}]}"#,
        ] {
            assert!(read(bad, "p").is_err(), "{bad}");
        }
    }

    #[test]
    fn a_profile_the_board_check_wrote_loads() {
        let s = read(BOARD_CHECK_PROFILE, "board-profile-emu.json").unwrap();
        assert_eq!(s.params.run_us_floor, 1.863);
        assert_eq!(s.params.core_tops, 0.26787327927788884);
        assert_eq!(s.params.inflate_gbps_big_core_q4_k, 10.414662570187518);
        assert_eq!(s.params.big_cores, 4.0);
        let info = s.profile.as_ref().unwrap();
        assert_eq!(
            (info.backend.as_str(), info.all_bit_exact),
            ("emu", Some(true))
        );
        let measured = info.measured.as_ref().unwrap();
        assert_eq!(measured.len(), 18);
        let kept = Origin::ProfileKept("board-profile-emu.json".into());
        assert_eq!(s.origins[index("context_create_us").unwrap()], kept);
        // Written back, it reads to the same parameters.
        let again = read(&write(&s.params, info), "again.json").unwrap();
        assert_eq!(again.params, s.params);
    }
}
