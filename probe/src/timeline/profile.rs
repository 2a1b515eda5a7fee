//! The board profile: the JSON object the board check writes (every parameter, `backend`,
//! `runtime_version`, `all_bit_exact`, the `measured` list, and fields of its own), and the
//! settings read back from one.

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
/// `measured` list leaves out keeps the profile's value, marked [`Origin::ProfileKept`].
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
    Ok(s)
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
