//! The cost model from a board profile (`ORK_EMU_PROFILE`): the JSON object `ork-probe board`
//! writes. Of its fields only the four NPU figures matter here; every other one is checked as
//! JSON and skipped, so the library needs no JSON crate.
//!
//! The reader takes RFC 8259 JSON only (no trailing text, no comments, paired surrogates), limits
//! nesting to [`MAX_DEPTH`] containers, and returns an error, never a panic, on any input; the
//! fuzz target `profile` holds it to serde_json's reading of the same text.

use super::cost::CostModel;

/// Nesting deeper than this many arrays and objects is refused (the reader recurses per level).
const MAX_DEPTH: usize = 128;

/// The NPU figures a board profile carries, each absent or a number the cost model can use.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProfileFigures {
    /// µs, at least 0: the cost model's `submit_us`.
    pub run_us_floor: Option<f64>,
    /// µs, at least 0.
    pub task_us: Option<f64>,
    /// Positive.
    pub core_tops: Option<f64>,
    /// Positive.
    pub dram_gbps: Option<f64>,
}

/// A top-level field's last value: a number, or something else (an error if it is one of the four).
#[derive(Clone, Copy)]
enum Field {
    Number(f64),
    Other,
}

impl ProfileFigures {
    /// The profile keys of the four figures, in the order of the struct's fields.
    pub const KEYS: [&'static str; 4] = ["run_us_floor", "task_us", "core_tops", "dram_gbps"];

    /// Reads the four figures of a profile's text. A key given twice counts with its last value,
    /// as JSON readers that keep one value per key do.
    pub fn parse(text: &str) -> Result<ProfileFigures, String> {
        let fields = Reader::new(text).top_level()?;
        let mut figures = [None; 4];
        for ((key, field), slot) in Self::KEYS.iter().zip(fields).zip(&mut figures) {
            *slot = match field {
                None => None,
                Some(Field::Other) => return Err(format!("{key} is not a number")),
                Some(Field::Number(x)) => Some(checked(key, x)?),
            };
        }
        let [run_us_floor, task_us, core_tops, dram_gbps] = figures;
        Ok(ProfileFigures {
            run_us_floor,
            task_us,
            core_tops,
            dram_gbps,
        })
    }
}

/// `x` if figure `key` may take it: finite, and at least 0 for a time, positive for a rate (as
/// the board model's parameters are checked).
fn checked(key: &str, x: f64) -> Result<f64, String> {
    let (ok, expected) = match key {
        "run_us_floor" | "task_us" => (x >= 0.0, "a number of µs, at least 0"),
        _ => (x > 0.0, "a positive number"),
    };
    if ok && x.is_finite() {
        Ok(x)
    } else {
        Err(format!("{key} = {x} is out of range (expected {expected})"))
    }
}

impl CostModel {
    /// The default cost model with the NPU figures of a board profile's `text` in place of the
    /// defaults: `run_us_floor` (the fixed cost of one submit), `task_us`, `core_tops` and
    /// `dram_gbps`.
    pub fn from_profile(text: &str) -> Result<CostModel, String> {
        let f = ProfileFigures::parse(text)?;
        let d = CostModel::default();
        Ok(CostModel {
            submit_us: f.run_us_floor.unwrap_or(d.submit_us),
            task_us: f.task_us.unwrap_or(d.task_us),
            core_tops: f.core_tops.unwrap_or(d.core_tops),
            dram_gbps: f.dram_gbps.unwrap_or(d.dram_gbps),
        })
    }
}

struct Reader<'a> {
    s: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(text: &'a str) -> Reader<'a> {
        Reader {
            s: text.as_bytes(),
            at: 0,
        }
    }

    fn err<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("invalid JSON at byte {}: {what}", self.at))
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// Skips `c` after optional whitespace, or fails saying what was expected.
    fn expect(&mut self, c: u8, what: &str) -> Result<(), String> {
        self.ws();
        if self.peek() == Some(c) {
            self.at += 1;
            Ok(())
        } else {
            self.err(what)
        }
    }

    /// The whole text as one object: the last value of each of [`ProfileFigures::KEYS`].
    fn top_level(mut self) -> Result<[Option<Field>; 4], String> {
        let mut fields = [None; 4];
        self.ws();
        if self.peek() != Some(b'{') {
            return self.err("a board profile is a JSON object");
        }
        self.at += 1;
        self.ws();
        if self.peek() == Some(b'}') {
            self.at += 1;
        } else {
            loop {
                self.ws();
                if self.peek() != Some(b'"') {
                    return self.err("expected a key");
                }
                let key = self.string()?;
                self.expect(b':', "expected ':'")?;
                let field = self.value(1)?;
                if let Some(i) = ProfileFigures::KEYS.iter().position(|k| *k == key) {
                    fields[i] = Some(field);
                }
                self.ws();
                match self.peek() {
                    Some(b',') => self.at += 1,
                    Some(b'}') => {
                        self.at += 1;
                        break;
                    }
                    _ => return self.err("expected ',' or '}'"),
                }
            }
        }
        self.ws();
        if self.at != self.s.len() {
            return self.err("text after the object");
        }
        Ok(fields)
    }

    /// Reads one value inside `depth` containers: a number's value, anything else checked and
    /// skipped.
    fn value(&mut self, depth: usize) -> Result<Field, String> {
        self.ws();
        match self.peek() {
            None => self.err("unexpected end"),
            Some(b'{' | b'[') if depth >= MAX_DEPTH => self.err("nested too deeply"),
            Some(b'{') => self.object(depth + 1).map(|()| Field::Other),
            Some(b'[') => self.array(depth + 1).map(|()| Field::Other),
            Some(b'"') => self.string().map(|_| Field::Other),
            Some(b't') => self.literal("true"),
            Some(b'f') => self.literal("false"),
            Some(b'n') => self.literal("null"),
            Some(b'-' | b'0'..=b'9') => self.number().map(Field::Number),
            Some(_) => self.err("unexpected character"),
        }
    }

    fn literal(&mut self, word: &str) -> Result<Field, String> {
        if self.s[self.at..].starts_with(word.as_bytes()) {
            self.at += word.len();
            Ok(Field::Other)
        } else {
            self.err("unknown literal")
        }
    }

    /// An object whose `{` is next, `depth` containers deep with it.
    fn object(&mut self, depth: usize) -> Result<(), String> {
        self.at += 1;
        self.ws();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return self.err("expected a key");
            }
            self.string()?;
            self.expect(b':', "expected ':'")?;
            self.value(depth)?;
            self.ws();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return self.err("expected ',' or '}'"),
            }
        }
    }

    /// An array whose `[` is next, `depth` containers deep with it.
    fn array(&mut self, depth: usize) -> Result<(), String> {
        self.at += 1;
        self.ws();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(());
        }
        loop {
            self.value(depth)?;
            self.ws();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return self.err("expected ',' or ']'"),
            }
        }
    }

    /// Skips a run of ASCII digits; false if there was none.
    fn digits(&mut self) -> bool {
        let from = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.at += 1;
        }
        self.at > from
    }

    fn number(&mut self) -> Result<f64, String> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        // JSON forbids leading zeros ("01") and a bare sign.
        if self.peek() == Some(b'0') {
            self.at += 1;
        } else if !self.digits() {
            return self.err("expected digits");
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if !self.digits() {
                return self.err("expected digits after '.'");
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if !self.digits() {
                return self.err("expected exponent digits");
            }
        }
        // The grammar above is ASCII and a subset of what `f64::from_str` takes.
        let text = std::str::from_utf8(&self.s[start..self.at]).unwrap_or_default();
        match text.parse::<f64>() {
            Ok(x) if x.is_finite() => Ok(x),
            _ => Err(format!(
                "invalid JSON at byte {start}: number {text} out of range"
            )),
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let Some(digits) = self.s.get(self.at..self.at + 4) else {
            return self.err("bad \\u escape");
        };
        let mut v = 0;
        for &c in digits {
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => return self.err("bad \\u escape"),
            };
            v = v * 16 + u32::from(d);
        }
        self.at += 4;
        Ok(v)
    }

    /// A string whose `"` is next, unescaped.
    fn string(&mut self) -> Result<String, String> {
        self.at += 1;
        let mut out = String::new();
        loop {
            let start = self.at;
            while self
                .peek()
                .is_some_and(|c| c != b'"' && c != b'\\' && c >= 0x20)
            {
                self.at += 1;
            }
            // The text is a &str and the run ends before an ASCII byte or at the end: whole
            // characters.
            out.push_str(std::str::from_utf8(&self.s[start..self.at]).unwrap_or_default());
            match self.peek() {
                None => return self.err("unterminated string"),
                Some(b'"') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.at += 1;
                    let c = self.escape()?;
                    out.push(c);
                }
                Some(_) => return self.err("control character in string"),
            }
        }
    }

    /// The character of the escape after a `\`.
    fn escape(&mut self) -> Result<char, String> {
        let Some(c) = self.peek() else {
            return self.err("unterminated escape");
        };
        self.at += 1;
        Ok(match c {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = self.hex4()?;
                let code = match hi {
                    0xd800..=0xdbff => {
                        if !self.s[self.at..].starts_with(b"\\u") {
                            return self.err("unpaired surrogate");
                        }
                        self.at += 2;
                        let lo = self.hex4()?;
                        if !(0xdc00..=0xdfff).contains(&lo) {
                            return self.err("unpaired surrogate");
                        }
                        0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
                    }
                    0xdc00..=0xdfff => return self.err("unpaired surrogate"),
                    _ => hi,
                };
                match char::from_u32(code) {
                    Some(c) => c,
                    None => return self.err("bad code point"),
                }
            }
            _ => return self.err("unknown escape"),
        })
    }
}

#[cfg(test)]
mod tests;
