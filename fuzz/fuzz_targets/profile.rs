//! The board profile reader (`ORK_EMU_PROFILE`) on arbitrary bytes:
//! - `ProfileFigures::parse` and `CostModel::from_profile` never panic;
//! - whenever serde_json reads the text as an object, the reader agrees with it on the four NPU
//!   figures: an error if one of them is not a number or out of the cost model's range (finite;
//!   at least 0 for `run_us_floor` and `task_us`, positive for `core_tops` and `dram_gbps`),
//!   otherwise each figure absent or the same number;
//! - whenever serde_json refuses the text (but for its nesting limit, lower than the reader's),
//!   or reads something other than an object, so does the reader.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ork_moe::npu::emu::{CostModel, ProfileFigures};
use serde_json::Value;

/// What serde_json makes of figure `key`: absent, a usable number, or an error.
fn expected(fields: &serde_json::Map<String, Value>, key: &str) -> Result<Option<f64>, ()> {
    let Some(v) = fields.get(key) else {
        return Ok(None);
    };
    let x = v.as_f64().ok_or(())?;
    let in_range = match key {
        "run_us_floor" | "task_us" => x >= 0.0,
        _ => x > 0.0,
    };
    if in_range && x.is_finite() {
        Ok(Some(x))
    } else {
        Err(())
    }
}

fuzz_target!(|data: &[u8]| {
    // The library reads a profile with `read_to_string`: text that is not UTF-8 never reaches it.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let got = ProfileFigures::parse(text);
    assert_eq!(
        CostModel::from_profile(text).is_ok(),
        got.is_ok(),
        "from_profile and parse disagree"
    );
    let fields = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(fields)) => fields,
        Err(e) if e.to_string().starts_with("recursion limit exceeded") => return,
        other => {
            assert!(
                got.is_err(),
                "serde_json gives {other:?}, the reader {got:?}"
            );
            return;
        }
    };
    let want: Result<Vec<Option<f64>>, ()> = ProfileFigures::KEYS
        .iter()
        .map(|k| expected(&fields, k))
        .collect();
    match (want, got) {
        (Ok(want), Ok(f)) => {
            let got = [f.run_us_floor, f.task_us, f.core_tops, f.dram_gbps];
            assert_eq!(want, got, "{text:?}");
        }
        (Err(()), Err(_)) => {}
        (want, got) => panic!("{text:?}: serde_json gives {want:?}, the reader {got:?}"),
    }
});
