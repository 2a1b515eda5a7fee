//! Verdicts remembered between runs (`ORK_DISPATCH_CACHE`): a small text file per machine, so a
//! second run starts decided.
//!
//! The file is untrusted input (another version of the library, another process, a user, a
//! truncated write): [`parse`] accepts exactly what [`render`] writes, and anything else makes
//! the whole file ignored with one warning. One line each:
//!
//! ```text
//! ork-moe dispatch verdicts 1
//! key backend=emu runtime=- slow_us=0 library=0.1.0
//! class routed 2 2048 768 64 library 1.25e-6 2.5e-6 12 9
//! end 1
//! ```
//!
//! `class` is kind, weight type code, K, N, rows bucket, the path taken, the library's and ggml's
//! seconds per row, and each path's sample count; `end` counts the classes, so a truncated file
//! is seen as one. A file whose key is not this engine's (another backend, runtime or library
//! version) is not used, and is replaced by the first save.
//!
//! Saving merges with the file as it is then (classes of other models stay) and replaces it by a
//! rename, so processes sharing the file never see half of one; when two save at once, the last
//! rename wins. A file that cannot be written (a read-only home) is reported once, then saving
//! stops.

use super::{Kind, OpClass, Path, Remembered};
use crate::moe::Config;
use crate::npu::{BackendKind, Device};
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read};
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[cfg(test)]
mod tests;

/// The first line: the format and its version.
pub const HEADER: &str = "ork-moe dispatch verdicts 1";
/// Larger files are not read.
pub const MAX_BYTES: u64 = 1 << 20;
/// Classes a file may hold.
pub const MAX_CLASSES: usize = 4096;

/// The verdicts of a file.
pub type Verdicts = BTreeMap<OpClass, Remembered>;

/// What the verdicts were measured on: the backend as the device reports it (with the runtime's
/// version, and the emulator's added wall time), and the library's version. Printable ASCII
/// without spaces within each value.
pub fn key(device: &Device, config: &Config) -> String {
    let backend = device.backend();
    let runtime = device.runtime_version().unwrap_or_else(|| "-".to_owned());
    let slow = match backend {
        BackendKind::Emu => format!(" slow_us={}", config.device.emu.slow_us),
        _ => String::new(),
    };
    format!(
        "backend={} runtime={}{slow} library={}",
        backend.name(),
        word(&runtime),
        env!("CARGO_PKG_VERSION")
    )
}

/// `text` with every character that is not printable ASCII, and every space, as `_`.
fn word(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .collect()
}

/// The file's text for `key` and `verdicts`.
pub fn render(key: &str, verdicts: &Verdicts) -> String {
    let mut out = format!("{HEADER}\nkey {key}\n");
    for (c, r) in verdicts {
        out += &format!(
            "class {} {} {} {} {} {} {:e} {:e} {} {}\n",
            c.kind.name(),
            c.weight,
            c.k,
            c.n,
            c.rows_bucket,
            r.path.name(),
            r.library,
            r.ggml,
            r.library_samples,
            r.ggml_samples
        );
    }
    out + &format!("end {}\n", verdicts.len())
}

/// The key and verdicts of a file's text, or what is wrong with it.
pub fn parse(text: &str) -> Result<(String, Verdicts), String> {
    let body = text
        .strip_suffix('\n')
        .ok_or("it does not end with a newline")?;
    let mut lines = body.split('\n').enumerate().map(|(i, l)| (i + 1, l));
    let mut next = |what: &str| lines.next().ok_or(format!("it ends before {what}"));
    let (_, header) = next("its header")?;
    if header != HEADER {
        return Err(format!("its first line is not {HEADER:?}"));
    }
    let (_, key) = next("its key")?;
    let key = key
        .strip_prefix("key ")
        .ok_or("its second line is no key")?;
    if key.is_empty() || !key.split(' ').all(|w| !w.is_empty() && word(w) == w) {
        return Err("its key is not printable words".to_owned());
    }
    let mut verdicts = Verdicts::new();
    loop {
        let (n, line) = next("its end line")?;
        let err = |e: String| format!("line {n}: {e}");
        if let Some(count) = line.strip_prefix("end ") {
            let count: usize = number(count).map_err(err)?;
            if count != verdicts.len() {
                return Err(err(format!("{} classes, not {count}", verdicts.len())));
            }
            break;
        }
        let (class, remembered) = class_line(line).map_err(err)?;
        if verdicts.len() == MAX_CLASSES {
            return Err(err(format!("more than {MAX_CLASSES} classes")));
        }
        if verdicts.insert(class, remembered).is_some() {
            return Err(err("a class seen before".to_owned()));
        }
    }
    if next("").is_ok() {
        return Err("lines after its end line".to_owned());
    }
    Ok((key.to_owned(), verdicts))
}

/// One `class` line.
fn class_line(line: &str) -> Result<(OpClass, Remembered), String> {
    let fields: Vec<&str> = line.split(' ').collect();
    let ["class", kind, weight, k, n, bucket, path, library, ggml, library_samples, ggml_samples] =
        fields[..]
    else {
        return Err("not a class line of 11 fields".to_owned());
    };
    let kind = Kind::ALL
        .into_iter()
        .find(|x| x.name() == kind)
        .ok_or(format!("kind {kind:?}"))?;
    let class = OpClass {
        kind,
        weight: number(weight)?,
        k: positive(k)?,
        n: positive(n)?,
        rows_bucket: positive(bucket)?,
    };
    if !class.rows_bucket.is_power_of_two() || class.rows_bucket > 1 << 30 {
        return Err(format!("rows bucket {bucket}"));
    }
    let remembered = Remembered {
        path: Path::from_name(path).ok_or(format!("path {path:?}"))?,
        library: seconds(library)?,
        ggml: seconds(ggml)?,
        library_samples: positive(library_samples)?,
        ggml_samples: positive(ggml_samples)?,
    };
    Ok((class, remembered))
}

/// A number as [`render`] writes them: digits only, with a sign for a negative one.
fn number<T: std::str::FromStr>(text: &str) -> Result<T, String> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{text:?} is no whole number"));
    }
    text.parse()
        .map_err(|_| format!("{text:?} is out of range"))
}

fn positive<T: std::str::FromStr + Default + PartialOrd>(text: &str) -> Result<T, String> {
    let n: T = number(text)?;
    if n > T::default() {
        Ok(n)
    } else {
        Err(format!("{text:?} is not positive"))
    }
}

/// A time as [`render`] writes them (`{:e}`): finite, not negative.
fn seconds(text: &str) -> Result<f64, String> {
    let ok = |b: u8| b.is_ascii_digit() || b"-.e".contains(&b);
    match text.parse::<f64>() {
        Ok(t) if text.bytes().all(ok) && t.is_finite() && t >= 0.0 => Ok(t),
        _ => Err(format!("{text:?} is no time")),
    }
}

/// One engine's cache file and key.
pub struct Memory {
    path: PathBuf,
    key: String,
    /// A save failed: the file is not written again.
    failed: AtomicBool,
}

impl Memory {
    pub fn new(path: PathBuf, key: String) -> Memory {
        Memory {
            path,
            key,
            failed: AtomicBool::new(false),
        }
    }

    /// The cache file of an engine on `device`: `None` unless `ORK_DISPATCH=auto` and the file
    /// is not `off`.
    pub fn of(config: &Config, device: &Device) -> Option<Memory> {
        let path = config.dispatch_cache.clone()?;
        (config.dispatch == crate::moe::Dispatch::Auto)
            .then(|| Memory::new(path, key(device, config)))
    }

    /// The file's verdicts for this key; none when it is missing, made for another key, or
    /// malformed (then with a warning).
    pub fn load(&self) -> Verdicts {
        let shown = self.path.display();
        match self.read() {
            Ok(None) => Verdicts::new(),
            Ok(Some((key, verdicts))) if key == self.key => {
                log::info!("dispatch: {} verdicts from {shown}", verdicts.len());
                verdicts
            }
            Ok(Some((key, _))) => {
                log::info!("dispatch: {shown} is for {key}, not {}: not used", self.key);
                Verdicts::new()
            }
            Err(e) => {
                log::warn!("dispatch: ignoring the cache file {shown}: {e}");
                Verdicts::new()
            }
        }
    }

    /// The file's key and verdicts; `None` when there is no file.
    fn read(&self) -> Result<Option<(String, Verdicts)>, String> {
        let file = match fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let mut bytes = Vec::new();
        file.take(MAX_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| e.to_string())?;
        if bytes.len() as u64 > MAX_BYTES {
            return Err(format!("larger than {MAX_BYTES} bytes"));
        }
        let text = String::from_utf8(bytes).map_err(|_| "not UTF-8".to_owned())?;
        parse(&text).map(Some)
    }

    /// Writes `ours` over the file's verdicts of this key (others are dropped).
    pub fn save(&self, ours: &Verdicts) {
        if self.failed.load(Ordering::Relaxed) {
            return;
        }
        let mut all = match self.read() {
            Ok(Some((key, theirs))) if key == self.key => theirs,
            _ => Verdicts::new(),
        };
        all.extend(ours.iter().map(|(c, r)| (*c, *r)));
        if all.len() > MAX_CLASSES {
            all = ours
                .iter()
                .take(MAX_CLASSES)
                .map(|(c, r)| (*c, *r))
                .collect();
        }
        if let Err(e) = write_atomically(&self.path, &render(&self.key, &all)) {
            if !self.failed.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "dispatch: cannot write the cache file {}: {e}; verdicts are not remembered",
                    self.path.display()
                );
            }
        }
    }
}

/// Replaces `path` by `text` at once: written to a file of its own beside it, then renamed.
fn write_atomically(path: &FsPath, text: &str) -> io::Result<()> {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("no file name"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => FsPath::new("."),
    };
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        SEQUENCE.fetch_add(1, Ordering::Relaxed)
    ));
    let written = fs::write(&tmp, text).and_then(|()| fs::rename(&tmp, path));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}
