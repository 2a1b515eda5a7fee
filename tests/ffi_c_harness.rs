//! Builds the C harness, the `ork_config` checks and the hostile callers (`tests/c/`) with the
//! system C compiler against the `libork_moe.so` that this `cargo test` built, and runs them: the
//! C ABI exercised the way C callers use it.
//!
//! `cargo test` runs the QUICK matrix; `ORK_C_HARNESS_FULL=1` runs the full one (as
//! `make -C tests/c` does). Skipped, with a note, when the C compiler targets another architecture
//! than this test (the aarch64 qemu run).

use std::path::PathBuf;
use std::process::Command;

fn host_cc_matches_this_arch() -> bool {
    let out = Command::new("cc").arg("-dumpmachine").output();
    match out {
        Ok(o) if o.status.success() => {
            String::from_utf8_lossy(&o.stdout).starts_with(std::env::consts::ARCH)
        }
        _ => false,
    }
}

#[test]
fn c_harness_passes() {
    if !host_cc_matches_this_arch() {
        eprintln!(
            "skipped: the system C compiler does not target {}",
            std::env::consts::ARCH
        );
        return;
    }
    // Cargo builds the cdylib for an integration test next to the test executable, in
    // target/<profile>/deps; it copies it up to target/<profile> only on `cargo build`, so a copy
    // there may be stale. Use the one built with this test.
    let exe = std::env::current_exe().expect("test executable path");
    let libdir: PathBuf = exe.parent().expect("test executable dir").to_path_buf();
    assert!(
        libdir.join("libork_moe.so").exists(),
        "{} has no libork_moe.so; cargo builds the cdylib beside the integration tests",
        libdir.display()
    );
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let build = libdir.join("c-harness");
    let quick = if std::env::var_os("ORK_C_HARNESS_FULL").is_some() {
        "0"
    } else {
        "1"
    };
    let out = Command::new("make")
        .arg("-C")
        .arg(manifest.join("tests/c"))
        .arg(format!("LIBDIR={}", libdir.display()))
        .arg(format!("BUILD={}", build.display()))
        .arg(format!("QUICK={quick}"))
        .args(["run", "abi-mirror"])
        .output()
        .expect("make runs (is it installed?)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "C harness failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.lines().any(|l| l == "all checks passed"));
    assert!(stdout.contains("config: all checks passed"));
    assert!(stdout.contains("hostile: all checks passed"));
    assert!(stdout.contains("abi-mirror: the ggml patch's ABI types match"));
}
