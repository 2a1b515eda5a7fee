use super::super::{Choice, Class, Kind, OpClass, Params, Path, Remembered};
use super::*;
use std::path::PathBuf;

const P: Params = Params::DEFAULT;
const ROWS: usize = 32;
const KEY: &str = "backend=emu runtime=- slow_us=0 library=0.1.0";

/// A class after `calls` calls, each measured on the path it chose at `library` or `ggml`
/// seconds per row.
fn decided(library: f64, ggml: f64, calls: usize) -> Class {
    let mut c = Class::default();
    for _ in 0..calls {
        let x = c.choose(&P, ROWS);
        let per_row = if x.path == Path::Library {
            library
        } else {
            ggml
        };
        c.observe(&P, x.path, ROWS, per_row * ROWS as f64);
    }
    c
}

fn class(kind: Kind, k: usize, rows_bucket: usize) -> OpClass {
    OpClass {
        kind,
        weight: 2 | 8 << 8,
        k,
        n: 768,
        rows_bucket,
    }
}

/// Three decided classes: the library faster, ggml faster, a near tie (ggml's).
fn sample() -> (Vec<(OpClass, Class)>, Verdicts) {
    let classes = vec![
        (class(Kind::Routed, 2048, 64), decided(1.0e-6, 2.5e-6, 300)),
        (class(Kind::Pair, 2048, 1), decided(3.0e-6, 1.0e-6, 300)),
        (class(Kind::Dense, 4096, 512), decided(0.99e-6, 1.0e-6, 300)),
    ];
    let verdicts = classes
        .iter()
        .map(|(k, c)| (*k, c.to_remember().expect("decided")))
        .collect();
    (classes, verdicts)
}

/// A folder of its own under the system's temporary one, empty.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ork-dispatch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn saved_and_loaded_verdicts_make_the_same_decisions() {
    let (classes, verdicts) = sample();
    let dir = scratch("same");
    let file = dir.join("sub/dispatch");
    Memory::new(file.clone(), KEY.into()).save(&verdicts);
    let loaded = Memory::new(file, KEY.into()).load();
    assert_eq!(loaded, verdicts);
    for (k, original) in classes {
        let mut again = Class::remembered(&loaded[&k]);
        let (v, w) = (original.verdict(), again.verdict());
        assert_eq!((w.path, w.decided, w.flips), (v.path, true, 0), "{k}");
        assert_eq!((w.library, w.ggml), (v.library, v.ggml), "{k}");
        assert_eq!(
            (w.library_samples, w.ggml_samples),
            (v.library_samples, v.ggml_samples)
        );
        // The first call takes the verdict: nothing left to explore before it.
        assert_eq!(
            again.choose(&P, ROWS),
            Choice {
                path: v.path,
                explore: false
            },
            "{k}"
        );
    }
    assert_eq!(
        loaded.values().map(|r| r.path).collect::<Vec<_>>(),
        [Path::Library, Path::Ggml, Path::Ggml]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_for_another_key_is_not_used_and_is_replaced_by_the_next_save() {
    let (_, verdicts) = sample();
    let dir = scratch("key");
    let file = dir.join("dispatch");
    Memory::new(file.clone(), KEY.into()).save(&verdicts);
    for other in [
        "backend=emu runtime=- slow_us=0 library=0.2.0",
        "backend=rknn runtime=2.3.2 library=0.1.0",
        "backend=emu runtime=- slow_us=20000 library=0.1.0",
    ] {
        assert!(Memory::new(file.clone(), other.into()).load().is_empty());
    }
    let ours: Verdicts = verdicts.iter().take(1).map(|(k, r)| (*k, *r)).collect();
    let rknn = Memory::new(
        file.clone(),
        "backend=rknn runtime=2.3.2 library=0.1.0".into(),
    );
    rknn.save(&ours);
    assert_eq!(rknn.load(), ours);
    assert!(Memory::new(file, KEY.into()).load().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_save_keeps_the_other_classes_of_its_key() {
    let (_, verdicts) = sample();
    let dir = scratch("merge");
    let memory = Memory::new(dir.join("dispatch"), KEY.into());
    let mut first = verdicts.clone();
    let (last, _) = first.pop_last().unwrap();
    memory.save(&first);
    let mut changed = verdicts.clone();
    changed.retain(|k, _| *k == last);
    memory.save(&changed);
    assert_eq!(memory.load(), verdicts);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_unwritable_place_is_given_up_and_nothing_else_breaks() {
    let (_, verdicts) = sample();
    let dir = scratch("readonly");
    // A regular file where the folder would be: no user can create the file below it.
    std::fs::write(dir.join("blocked"), "").unwrap();
    let memory = Memory::new(dir.join("blocked/ork-moe/dispatch"), KEY.into());
    memory.save(&verdicts);
    memory.save(&verdicts);
    assert!(memory.load().is_empty());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_text_is_one_line_each_and_parses_back() {
    let (_, verdicts) = sample();
    let text = render(KEY, &verdicts);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], HEADER);
    assert_eq!(lines[1], format!("key {KEY}"));
    assert_eq!(
        lines[2],
        "class routed 2050 2048 768 64 library 1e-6 2.5e-6 295 3"
    );
    assert_eq!(lines[5], "end 3");
    assert_eq!(parse(&text), Ok((KEY.to_owned(), verdicts)));
}

#[test]
fn every_truncation_and_every_malformed_line_is_rejected() {
    let (_, verdicts) = sample();
    let text = render(KEY, &verdicts);
    for cut in 0..text.len() {
        assert!(
            parse(&text[..cut]).is_err(),
            "cut at {cut}: {:?}",
            &text[..cut]
        );
    }
    let good = "class routed 2 64 32 8 library 1e-6 2e-6 3 4";
    for bad in [
        "",
        "class routed 2 64 32 8 library 1e-6 2e-6 3",
        "class routed 2 64 32 8 library 1e-6 2e-6 3 4 5",
        "class routed  2 64 32 8 library 1e-6 2e-6 3 4",
        "class mixed 2 64 32 8 library 1e-6 2e-6 3 4",
        "class routed 2 0 32 8 library 1e-6 2e-6 3 4",
        "class routed 2 64 32 6 library 1e-6 2e-6 3 4",
        "class routed 2 64 32 8 npu 1e-6 2e-6 3 4",
        "class routed 2 64 32 8 library inf 2e-6 3 4",
        "class routed 2 64 32 8 library NaN 2e-6 3 4",
        "class routed 2 64 32 8 library -1e-6 2e-6 3 4",
        "class routed 2 64 32 8 library 1e-6 2e-6 0 4",
        "class routed 2 64 32 8 library 1e-6 2e-6 +3 4",
        "class routed 2 64 32 8 library 1e-6 2e-6 3 99999999999999999999999",
        "class routed 2 64 32 8 library 1e-6 2e-6 3 4\r",
        "clasS routed 2 64 32 8 library 1e-6 2e-6 3 4",
        good, // a second time: a class seen before
    ] {
        let text = format!("{HEADER}\nkey {KEY}\n{good}\n{bad}\nend 2\n");
        assert!(parse(&text).is_err(), "{bad:?}");
    }
    let ok = format!("{HEADER}\nkey {KEY}\n{good}\nend 1\n");
    assert!(parse(&ok).is_ok());
    for bad in [
        ok.replace("verdicts 1", "verdicts 2"),
        ok.replace("end 1", "end 2"),
        ok.replace("end 1", "end"),
        ok.replace("key ", "key"),
        ok.replace("key b", "key  b"),
        ok.replace("runtime=-", "runtime=é"),
        ok.clone() + "\n",
        ok.clone() + "class",
        ok.replace('\n', "\r\n"),
    ] {
        assert!(parse(&bad).is_err(), "{bad:?}");
    }
}

#[test]
fn too_many_classes_are_refused() {
    let many: Verdicts = (1..=MAX_CLASSES + 1)
        .map(|k| {
            let r = Remembered {
                path: Path::Ggml,
                library: 1.0,
                ggml: 0.5,
                library_samples: 2,
                ggml_samples: 2,
            };
            (class(Kind::Routed, k, 1), r)
        })
        .collect();
    assert!(parse(&render(KEY, &many)).is_err());
    let mut fewer = many;
    fewer.pop_last();
    assert_eq!(parse(&render(KEY, &fewer)).unwrap().1.len(), MAX_CLASSES);
}

/// Random garbage and random damage to a good file: never a panic; whatever is accepted is
/// valid verdicts that render and parse back to the same.
#[test]
fn damaged_files_are_rejected_or_read_as_valid_verdicts() {
    let (_, verdicts) = sample();
    let good = render(KEY, &verdicts).into_bytes();
    let alphabet = b"class routed pair dense library ggml end key 0123456789.e-+\n ";
    let mut rng = crate::testutil::Rng::new(27);
    let mut accepted = 0;
    for round in 0..20_000 {
        let mut bytes = good.clone();
        if round % 4 == 0 {
            let len = rng.below(200);
            bytes = (0..len)
                .map(|_| alphabet[rng.below(alphabet.len())])
                .collect();
        }
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(bytes.len() + 1);
            match rng.below(4) {
                0 if at < bytes.len() => bytes[at] = alphabet[rng.below(alphabet.len())],
                1 if at < bytes.len() => {
                    bytes.remove(at);
                }
                2 => bytes.insert(at, alphabet[rng.below(alphabet.len())]),
                _ => bytes.truncate(at),
            }
        }
        let Ok(text) = std::str::from_utf8(&bytes) else {
            continue;
        };
        if let Ok((key, read)) = parse(text) {
            accepted += 1;
            assert!(read
                .values()
                .all(|r| r.library >= 0.0 && r.ggml.is_finite()));
            assert_eq!(parse(&render(&key, &read)), Ok((key, read)), "{text:?}");
        }
    }
    // Damage that keeps a file valid exists (a digit for a digit): some are accepted.
    assert!(accepted > 0);
}
