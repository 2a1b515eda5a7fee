//! The dispatch cache file reader (`ORK_DISPATCH_CACHE`) on arbitrary bytes:
//! - `parse` never panics;
//! - whatever it accepts is verdicts within the format's limits (times finite and not negative,
//!   sample counts and shapes positive, rows buckets powers of two, at most `MAX_CLASSES`) that
//!   render to a text it parses back to the same;
//! - every proper prefix of an accepted text is refused (a truncated file is seen as one).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ork_moe::moe::dispatch::memory::{parse, render, MAX_CLASSES};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok((key, verdicts)) = parse(text) else {
        return;
    };
    assert!(verdicts.len() <= MAX_CLASSES);
    for (c, r) in &verdicts {
        assert!(c.k > 0 && c.n > 0 && c.rows_bucket.is_power_of_two());
        assert!(r.library.is_finite() && r.library >= 0.0);
        assert!(r.ggml.is_finite() && r.ggml >= 0.0);
        assert!(r.library_samples > 0 && r.ggml_samples > 0);
    }
    let again = render(&key, &verdicts);
    assert_eq!(parse(&again), Ok((key, verdicts)));
    for cut in (0..text.len()).filter(|&i| text.is_char_boundary(i)) {
        assert!(parse(&text[..cut]).is_err(), "prefix of {} bytes", cut);
    }
});
