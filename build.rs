//! Generates `include/ork_moe.h` from `src/ffi/` with cbindgen.
//!
//! The header is committed; CI regenerates it and fails on any difference. It is rewritten only
//! when its text changes, so builds of an unchanged tree leave the checkout untouched.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=src/ffi");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("cbindgen.toml is valid");
    let header = match cbindgen::Builder::new()
        // Only the C ABI module (cbindgen follows its `mod` declarations into the folder): the
        // rest of the crate has public consts and #[repr(C)] types (driver structs, block
        // formats) that are no part of the C API.
        .with_src(crate_dir.join("src").join("ffi").join("mod.rs"))
        .with_config(config)
        .generate()
    {
        Ok(bindings) => {
            let mut text = Vec::new();
            bindings.write(&mut text);
            text
        }
        Err(e) => {
            // A half-edited src/ffi/ must not hide rustc's own, better error behind this one.
            println!("cargo:warning=cbindgen could not generate the header: {e}");
            return;
        }
    };
    let path = crate_dir.join("include").join("ork_moe.h");
    if std::fs::read(&path).ok().as_deref() != Some(&header[..]) {
        std::fs::create_dir_all(path.parent().expect("has a parent")).expect("create include/");
        std::fs::write(&path, header).expect("write include/ork_moe.h");
    }
}
