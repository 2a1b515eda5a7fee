use super::*;

/// A profile `ork-probe board --quick` wrote on the emulator.
const BOARD_CHECK_PROFILE: &str = include_str!("../../../../tests/data/board-profile-emu.json");

#[test]
fn reads_the_four_figures_and_skips_every_other_field() {
    let text = r#" {"backend": "rknn", "runtime_version": "2.3.2 \"x\" \u00e9\ud83d\ude00",
        "measured": ["run_us_floor", "core_tops"], "all_bit_exact": true, "driver": null,
        "run_us_floor": 61.5, "core_tops": 9e-1, "dram_gbps": 1.7E+1, "cores": 3,
        "shapes": [{"k": 2048, "n": 768, "us": 80, "nested": {"core_tops": "not this one"}}],
        "timings": {"tops_core_0": -0.25e0, "empty": {}, "none": []}} "#;
    let f = ProfileFigures::parse(text).unwrap();
    assert_eq!(
        f,
        ProfileFigures {
            run_us_floor: Some(61.5),
            task_us: None,
            core_tops: Some(0.9),
            dram_gbps: Some(17.0),
        }
    );
    let cost = CostModel::from_profile(text).unwrap();
    let defaults = CostModel::default();
    assert_eq!(
        cost,
        CostModel {
            submit_us: 61.5,
            task_us: defaults.task_us,
            core_tops: 0.9,
            dram_gbps: 17.0,
        }
    );
    assert_eq!(CostModel::from_profile("{}").unwrap(), defaults);
}

#[test]
fn a_profile_the_board_check_wrote_loads() {
    let cost = CostModel::from_profile(BOARD_CHECK_PROFILE).unwrap();
    assert_eq!(
        cost,
        CostModel {
            submit_us: 1.863,
            task_us: 2.0,
            core_tops: 0.26787327927788884,
            dram_gbps: 23.206446284187873,
        }
    );
}

#[test]
fn keys_are_compared_unescaped_and_the_last_of_a_repeated_key_counts() {
    let f = ProfileFigures::parse(r#"{"core\u005ftops": 2, "task_us": "x", "task_us": 0}"#);
    assert_eq!(
        f.unwrap(),
        ProfileFigures {
            task_us: Some(0.0),
            core_tops: Some(2.0),
            ..ProfileFigures::default()
        }
    );
}

#[test]
fn a_figure_that_is_not_a_usable_number_is_an_error_naming_it() {
    for (text, want) in [
        (r#"{"core_tops": "fast"}"#, "core_tops is not a number"),
        (r#"{"dram_gbps": null}"#, "dram_gbps is not a number"),
        (r#"{"task_us": [1]}"#, "task_us is not a number"),
        (r#"{"core_tops": 0}"#, "core_tops = 0 is out of range"),
        (r#"{"dram_gbps": -15}"#, "dram_gbps = -15 is out of range"),
        (
            r#"{"run_us_floor": -1e-3}"#,
            "run_us_floor = -0.001 is out of range",
        ),
    ] {
        let e = CostModel::from_profile(text).unwrap_err();
        assert!(e.contains(want), "{text}: {e}");
    }
    // Zero is a usable time.
    let f = ProfileFigures::parse(r#"{"run_us_floor": 0, "task_us": -0.0}"#).unwrap();
    assert_eq!((f.run_us_floor, f.task_us), (Some(0.0), Some(0.0)));
}

#[test]
fn rejects_what_is_not_a_json_object() {
    for bad in [
        "",
        " ",
        "[1]",
        "\"core_tops\"",
        "3",
        "{",
        "{\"a\":1,}",
        "{\"a\" 1}",
        "{\"a\":1 \"b\":2}",
        "{1:2}",
        "{\"a\":[1,]}",
        "{\"a\":[1 2]}",
        "{\"a\":01}",
        "{\"a\":1.}",
        "{\"a\":-}",
        "{\"a\":1e}",
        "{\"a\":.5}",
        "{\"a\":+1}",
        "{\"a\":1e999}",
        "{\"a\":-1e999}",
        "{\"a\":tru}",
        "{\"a\":nul}",
        "{\"a\":NaN}",
        "{\"a\":\"abc}",
        "{\"a\":\"\\x\"}",
        "{\"a\":\"\\u12\"}",
        "{\"a\":\"\\ud800\"}",
        "{\"a\":\"\\ud800\\u0041\"}",
        "{\"a\":\"\\udc00\"}",
        "{\"a\":\"a\u{1}b\"}",
        "{\"a\":\"tab\tin a string\"}",
        "{} {}",
        "{}x",
        "\u{feff}{}",
        "{\"a\":1}/* comment */",
    ] {
        let e = ProfileFigures::parse(bad).unwrap_err();
        assert!(e.starts_with("invalid JSON at byte"), "{bad:?} gives {e:?}");
    }
    let e = ProfileFigures::parse("{\"a\": [1, x]}").unwrap_err();
    assert!(e.starts_with("invalid JSON at byte 10: "), "{e}");
}

#[test]
fn nesting_is_limited() {
    let nested = |levels: usize| {
        format!(
            "{{\"a\":{}1{}}}",
            "[".repeat(levels - 1),
            "]".repeat(levels - 1)
        )
    };
    assert!(ProfileFigures::parse(&nested(MAX_DEPTH)).is_ok());
    let e = ProfileFigures::parse(&nested(MAX_DEPTH + 1)).unwrap_err();
    assert!(e.contains("nested too deeply"), "{e}");
    // Far deeper than the limit: refused, not a stack overflow.
    assert!(ProfileFigures::parse(&nested(1_000_000)).is_err());
}
