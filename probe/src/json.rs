//! The probe's JSON output. Rows and profiles are `serde_json` values, written with each item of
//! the top level on a line of its own, and each row of an array of objects too: a run's output
//! reads and diffs by line.

use serde_json::Value;

/// Prints `rows` as one JSON array, a row per line.
pub fn print_rows(rows: Vec<Value>) {
    println!("{}", text(&Value::Array(rows)));
}

/// `value` as JSON text: the top level's items one per line, the rows of an array of objects one
/// per line below their key, everything else compact.
pub fn text(value: &Value) -> String {
    let mut out = String::new();
    write(value, 0, &mut out);
    out
}

fn write(value: &Value, depth: usize, out: &mut String) {
    let items: Vec<(Option<&str>, &Value)> = match value {
        Value::Array(items) if depth == 0 || items.iter().any(Value::is_object) => {
            items.iter().map(|v| (None, v)).collect()
        }
        Value::Object(fields) if depth == 0 => {
            fields.iter().map(|(k, v)| (Some(k.as_str()), v)).collect()
        }
        _ => {
            out.push_str(&value.to_string());
            return;
        }
    };
    let (open, close) = if value.is_array() {
        ('[', ']')
    } else {
        ('{', '}')
    };
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return;
    }
    let indent = "  ".repeat(depth + 1);
    for (i, (key, item)) in items.into_iter().enumerate() {
        out.push_str(if i == 0 { "\n" } else { ",\n" });
        out.push_str(&indent);
        if let Some(key) = key {
            out.push_str(&Value::from(key).to_string());
            out.push_str(": ");
        }
        write(item, depth + 1, out);
    }
    out.push('\n');
    out.push_str(&"  ".repeat(depth));
    out.push(close);
}

/// `x` to 4 decimals: the measuring subcommands' timings and ratios, whose noise is far larger
/// (not finite: written as `null`).
pub fn fixed(x: f64) -> f64 {
    format!("{x:.4}")
        .parse()
        .expect("a formatted float reads back")
}

/// `x` to 5 significant digits: small errors (NMSE).
pub fn sci(x: f64) -> f64 {
    format!("{x:.4e}")
        .parse()
        .expect("a formatted float reads back")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn top_level_items_and_rows_one_per_line() {
        let profile = json!({
            "a": 1.5,
            "rows": [{"x": true}, {}],
            "s": "q\"uote",
            "k\u{1}y": [1.0, null],
        });
        let text = text(&profile);
        assert_eq!(
            text,
            "{\n  \"a\": 1.5,\n  \"rows\": [\n    {\"x\":true},\n    {}\n  ],\n  \
             \"s\": \"q\\\"uote\",\n  \"k\\u0001y\": [1.0,null]\n}"
        );
        let parsed: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed, profile);
        let keys: Vec<&String> = parsed.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["a", "rows", "s", "k\u{1}y"], "order kept");

        let rows = json!([{"b": 2, "a": [{"c": 1}]}, {"n": "\u{1b}"}]);
        assert_eq!(
            super::text(&rows),
            "[\n  {\"b\":2,\"a\":[{\"c\":1}]},\n  {\"n\":\"\\u001b\"}\n]"
        );
        assert_eq!(super::text(&json!([])), "[]");
    }

    #[test]
    fn rounded_numbers_and_null_for_what_is_not_finite() {
        assert_eq!(fixed(58.53604), 58.536);
        assert_eq!(fixed(2.0), 2.0);
        assert_eq!(sci(1.234_567e-5), 1.2346e-5);
        let row = json!({"x": fixed(f64::NAN), "y": sci(f64::INFINITY), "z": fixed(0.00004)});
        assert_eq!(row.to_string(), r#"{"x":null,"y":null,"z":0.0}"#);
    }
}
