//! How each setting's value is written: as text (an environment variable, or a C string) and as
//! the `ork_config` field that carries it. The rows of [`super::settings!`] pick one spelling each.

use crate::isa::Isa;
use crate::moe::outliers::Rule;
use crate::npu::CoreMask;
use std::ffi::OsString;
use std::fmt::{Debug, Display};
use std::path::PathBuf;

/// A setting's value as text.
pub trait Spelling {
    type Value;
    /// The value `text` spells; `Err` says what was expected (the caller names the variable).
    fn parse(&self, text: &str) -> Result<Self::Value, String>;
}

/// A spelling whose every value is one word, which an `ork_config` field holds as a code.
pub trait Worded: Spelling {
    fn word(&self, value: &Self::Value) -> &'static str;
}

/// How an `ork_config` field holds a setting: what `ork_config_default` reports, and how a
/// caller's field is applied. `C` is a tuple for a setting of two fields.
pub trait CField {
    type Value;
    type C;
    fn to_c(&self, value: &Self::Value) -> Self::C;
    /// Sets `value` from the field(s) named `field`; `Err` is the whole message.
    fn apply_c(&self, field: &str, c: Self::C, value: &mut Self::Value) -> Result<(), String>;
}

fn expected(field: &str, c: impl Debug, want: impl Display) -> String {
    format!("{field} {c:?}: expected {want}")
}

/// `a, b or c`.
fn one_of<'a>(words: impl IntoIterator<Item = &'a str>) -> String {
    let words: Vec<_> = words.into_iter().collect();
    match words.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// One of a list of words, any case.
pub struct Words<T: 'static>(pub &'static [(&'static str, T)]);

impl<T: Copy + PartialEq> Spelling for Words<T> {
    type Value = T;
    fn parse(&self, text: &str) -> Result<T, String> {
        let lower = text.to_ascii_lowercase();
        let found = self.0.iter().find(|(w, _)| *w == lower);
        found
            .map(|&(_, t)| t)
            .ok_or_else(|| one_of(self.0.iter().map(|(w, _)| *w)))
    }
}

impl<T: Copy + PartialEq> Worded for Words<T> {
    fn word(&self, value: &T) -> &'static str {
        let found = self.0.iter().find(|(_, t)| t == value);
        found.map(|&(w, _)| w).expect("every value has a word")
    }
}

/// A worded setting in C: `codes` give each word's code (the header's constants).
pub struct Coded<'a, C: 'static, S> {
    pub codes: &'static [(C, &'static str)],
    pub spelling: &'a S,
}

impl<C: Copy + PartialEq + Debug + Display, S: Worded> CField for Coded<'_, C, S> {
    type Value = S::Value;
    type C = C;
    fn to_c(&self, value: &S::Value) -> C {
        let word = self.spelling.word(value);
        let found = self.codes.iter().find(|(_, w)| *w == word);
        found.map(|&(c, _)| c).expect("every word has a code")
    }
    fn apply_c(&self, field: &str, c: C, value: &mut S::Value) -> Result<(), String> {
        let (_, word) = self
            .codes
            .iter()
            .find(|(code, _)| *code == c)
            .ok_or_else(|| format!("unknown {field} {c}"))?;
        *value = self
            .spelling
            .parse(word)
            .map_err(|want| expected(field, c, want))?;
        Ok(())
    }
}

/// The kernel path: `best` or an [`Isa`] this CPU has.
pub struct KernelPath;

impl Spelling for KernelPath {
    type Value = Isa;
    fn parse(&self, text: &str) -> Result<Isa, String> {
        if text.eq_ignore_ascii_case("best") {
            return Ok(Isa::best());
        }
        let available = || {
            let names = Isa::available().into_iter().map(Isa::name);
            format!("one of best, {}", names.collect::<Vec<_>>().join(", "))
        };
        match Isa::from_name(text) {
            Some(isa) if isa.is_available() => Ok(isa),
            Some(isa) => Err(format!(
                "a path this CPU has ({} is not: {})",
                isa.name(),
                available()
            )),
            None => Err(available()),
        }
    }
}

impl Worded for KernelPath {
    /// The path in use, never `best`: `ork_config_default` reports what `best` chose.
    fn word(&self, isa: &Isa) -> &'static str {
        isa.name()
    }
}

/// A whole number, the same in C.
pub struct Whole;

impl Spelling for Whole {
    type Value = u32;
    fn parse(&self, text: &str) -> Result<u32, String> {
        text.parse().map_err(|_| "a whole number".into())
    }
}

impl CField for Whole {
    type Value = u32;
    type C = u32;
    fn to_c(&self, value: &u32) -> u32 {
        *value
    }
    fn apply_c(&self, _: &str, c: u32, value: &mut u32) -> Result<(), String> {
        *value = c;
        Ok(())
    }
}

/// A whole number up to a bound.
pub struct AtMost(pub usize);

impl Spelling for AtMost {
    type Value = usize;
    fn parse(&self, text: &str) -> Result<usize, String> {
        let n: usize = text
            .parse()
            .map_err(|_| format!("a whole number, at most {}", self.0))?;
        (n <= self.0)
            .then_some(n)
            .ok_or_else(|| format!("at most {}", self.0))
    }
}

impl CField for AtMost {
    type Value = usize;
    type C = u32;
    fn to_c(&self, value: &usize) -> u32 {
        *value as u32
    }
    fn apply_c(&self, field: &str, c: u32, value: &mut usize) -> Result<(), String> {
        *value = Some(c as usize)
            .filter(|&n| n <= self.0)
            .ok_or_else(|| expected(field, c, format_args!("at most {}", self.0)))?;
        Ok(())
    }
}

/// The NPU cores as a bit mask, 1..7 (decimal, or hexadecimal after `0x`).
pub struct CoreBits;

impl CoreBits {
    fn check(mask: Option<u8>) -> Option<CoreMask> {
        mask.filter(|m| (1..=7).contains(m)).map(CoreMask)
    }
}

impl Spelling for CoreBits {
    type Value = CoreMask;
    fn parse(&self, text: &str) -> Result<CoreMask, String> {
        let mask = match text.strip_prefix("0x") {
            Some(hex) => u8::from_str_radix(hex, 16).ok(),
            None => text.parse().ok(),
        };
        CoreBits::check(mask).ok_or_else(|| "1..7".into())
    }
}

impl CField for CoreBits {
    type Value = CoreMask;
    type C = u32;
    fn to_c(&self, value: &CoreMask) -> u32 {
        value.0 as u32
    }
    fn apply_c(&self, field: &str, c: u32, value: &mut CoreMask) -> Result<(), String> {
        *value = CoreBits::check(u8::try_from(c).ok()).ok_or_else(|| expected(field, c, "1..7"))?;
        Ok(())
    }
}

/// MiB as text, bytes in C.
pub struct MiB;

impl Spelling for MiB {
    type Value = u64;
    fn parse(&self, text: &str) -> Result<u64, String> {
        let mb: u64 = text.parse().map_err(|_| "a whole number of MiB")?;
        mb.checked_mul(1 << 20)
            .ok_or_else(|| "a smaller number of MiB".into())
    }
}

impl CField for MiB {
    type Value = u64;
    type C = u64;
    fn to_c(&self, bytes: &u64) -> u64 {
        *bytes
    }
    fn apply_c(&self, _: &str, c: u64, bytes: &mut u64) -> Result<(), String> {
        *bytes = c;
        Ok(())
    }
}

/// Threads per call: 0 is every core, and never more than the cores.
pub struct Threads;

impl Spelling for Threads {
    type Value = usize;
    fn parse(&self, text: &str) -> Result<usize, String> {
        let n: usize = text.parse().map_err(|_| "a whole number (0: all cores)")?;
        Ok(super::threads(n))
    }
}

impl CField for Threads {
    type Value = usize;
    type C = u32;
    fn to_c(&self, threads: &usize) -> u32 {
        *threads as u32
    }
    fn apply_c(&self, _: &str, c: u32, threads: &mut usize) -> Result<(), String> {
        *threads = super::threads(c as usize);
        Ok(())
    }
}

/// `auto` (`None`) or a count.
pub struct AutoOr;

impl Spelling for AutoOr {
    type Value = Option<usize>;
    fn parse(&self, text: &str) -> Result<Option<usize>, String> {
        match text {
            "auto" => Ok(None),
            n => Ok(Some(n.parse().map_err(|_| "auto or a whole number")?)),
        }
    }
}

/// [`AutoOr`] in C: the count, or the code `auto`, a value no count takes.
pub struct AutoCode<C> {
    pub auto: C,
}

impl<C> CField for AutoCode<C>
where
    C: Copy + PartialEq + Debug + Display + TryFrom<usize> + TryInto<usize>,
{
    type Value = Option<usize>;
    type C = C;
    /// A count the field cannot hold reports `auto`.
    fn to_c(&self, count: &Option<usize>) -> C {
        count.map_or(self.auto, |n| C::try_from(n).unwrap_or(self.auto))
    }
    fn apply_c(&self, field: &str, c: C, count: &mut Option<usize>) -> Result<(), String> {
        *count = match c {
            c if c == self.auto => None,
            c => Some(c.try_into().map_err(|_| {
                expected(field, c, format_args!("{} (auto) or a count", self.auto))
            })?),
        };
        Ok(())
    }
}

/// `true`/`false` as one of `words`; non-zero/0 in C.
pub struct Bool {
    pub words: &'static [(&'static str, bool)],
    pub want: &'static str,
}

/// The words of an on/off switch.
pub const FLAG: Bool = Bool {
    words: &[
        ("1", true),
        ("true", true),
        ("on", true),
        ("yes", true),
        ("0", false),
        ("false", false),
        ("off", false),
        ("no", false),
    ],
    want: "0 or 1",
};

impl Spelling for Bool {
    type Value = bool;
    fn parse(&self, text: &str) -> Result<bool, String> {
        Words(self.words).parse(text).map_err(|_| self.want.into())
    }
}

impl CField for Bool {
    type Value = bool;
    type C = u32;
    fn to_c(&self, on: &bool) -> u32 {
        *on as u32
    }
    fn apply_c(&self, _: &str, c: u32, on: &mut bool) -> Result<(), String> {
        *on = c != 0;
        Ok(())
    }
}

/// A finite number, at least 0 (or above 0 when `positive`); the same in C.
pub struct Number {
    pub positive: bool,
}

impl Number {
    fn check(&self, x: f64) -> Result<f64, &'static str> {
        match (x.is_finite(), self.positive) {
            (true, true) if x > 0.0 => Ok(x),
            (true, false) if x >= 0.0 => Ok(x),
            (_, true) => Err("a number above 0"),
            (_, false) => Err("a number of at least 0"),
        }
    }
}

impl Spelling for Number {
    type Value = f64;
    fn parse(&self, text: &str) -> Result<f64, String> {
        let x: f64 = text.parse().map_err(|_| "a number")?;
        Ok(self.check(x)?)
    }
}

impl CField for Number {
    type Value = f64;
    type C = f64;
    fn to_c(&self, x: &f64) -> f64 {
        *x
    }
    fn apply_c(&self, field: &str, c: f64, x: &mut f64) -> Result<(), String> {
        *x = self.check(c).map_err(|want| expected(field, c, want))?;
        Ok(())
    }
}

/// The outlier split: `off`, or `FACTOR:MAX` (a factor above 0, at least one channel); in C the
/// factor (0: off) and the channels.
pub struct Outliers;

impl Spelling for Outliers {
    type Value = Option<Rule>;
    fn parse(&self, text: &str) -> Result<Option<Rule>, String> {
        if text.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        let want = "off or FACTOR:MAX, e.g. 6:8";
        let (f, m) = text.split_once(':').ok_or(want)?;
        let factor = Number { positive: true }
            .parse(f.trim())
            .map_err(|_| want)?;
        let max_channels: usize = m.trim().parse().map_err(|_| want)?;
        if max_channels == 0 {
            return Err(want.into());
        }
        Ok(Some(Rule {
            factor: factor as f32,
            max_channels,
        }))
    }
}

impl CField for Outliers {
    type Value = Option<Rule>;
    type C = (f64, u32);
    fn to_c(&self, rule: &Option<Rule>) -> (f64, u32) {
        rule.map_or((0.0, 0), |r| (r.factor as f64, r.max_channels as u32))
    }
    fn apply_c(&self, field: &str, c: (f64, u32), rule: &mut Option<Rule>) -> Result<(), String> {
        *rule = match c {
            (0.0, _) => None,
            (f, max) if f.is_finite() && f > 0.0 && max > 0 => Some(Rule {
                factor: f as f32,
                max_channels: max as usize,
            }),
            c => {
                let want = "a factor above 0 and at least one channel, or factor 0 (off)";
                return Err(expected(field, c, want));
            }
        };
        Ok(())
    }
}

/// A C string field: NULL (`None`) keeps the environment's value, which `ork_config_default`
/// leaves in the environment (it reports NULL).
pub type CText = Option<OsString>;

/// Text kept as it is (a library name).
pub struct Text;

impl Spelling for Text {
    type Value = Option<String>;
    fn parse(&self, text: &str) -> Result<Option<String>, String> {
        Ok(Some(text.to_string()))
    }
}

impl CField for Text {
    type Value = Option<String>;
    type C = CText;
    fn to_c(&self, _: &Option<String>) -> CText {
        None
    }
    fn apply_c(&self, _: &str, c: CText, value: &mut Option<String>) -> Result<(), String> {
        if let Some(text) = c {
            *value = Some(text.to_string_lossy().into_owned());
        }
        Ok(())
    }
}

/// A folder (its bytes kept as given).
pub struct Folder;

impl Spelling for Folder {
    type Value = Option<PathBuf>;
    fn parse(&self, text: &str) -> Result<Option<PathBuf>, String> {
        Ok(Some(PathBuf::from(text)))
    }
}

impl CField for Folder {
    type Value = Option<PathBuf>;
    type C = CText;
    fn to_c(&self, _: &Option<PathBuf>) -> CText {
        None
    }
    fn apply_c(&self, _: &str, c: CText, value: &mut Option<PathBuf>) -> Result<(), String> {
        if let Some(path) = c {
            *value = Some(PathBuf::from(path));
        }
        Ok(())
    }
}

/// Text read by a parser of the value's own (CPU lists, fault plans).
pub struct Parsed<T>(pub fn(&str) -> Result<T, String>);

impl<T> Spelling for Parsed<T> {
    type Value = T;
    fn parse(&self, text: &str) -> Result<T, String> {
        (self.0)(text)
    }
}

impl<T> CField for Parsed<T> {
    type Value = T;
    type C = CText;
    fn to_c(&self, _: &T) -> CText {
        None
    }
    fn apply_c(&self, field: &str, c: CText, value: &mut T) -> Result<(), String> {
        if let Some(text) = c {
            let text = text.to_string_lossy();
            *value = (self.0)(&text).map_err(|want| expected(field, &text, want))?;
        }
        Ok(())
    }
}
