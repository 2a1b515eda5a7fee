//! What the runtime's bare return codes mean here: error names, the runtime's version, and why no
//! NPU answered.
//!
//! The matmul API has no version query (`rknn_query` takes a model context from `rknn_init`; on a
//! matmul context it is undocumented), so the version comes from the string the vendor compiles into
//! the library, the one `strings librknnrt.so | grep 'librknnrt version'` shows (the file name does not
//! always carry it).

use std::fmt::Write;
use std::path::Path;

/// The marker before the version in the vendor's library.
const VERSION_MARKER: &[u8] = b"librknnrt version: ";

/// The `RKNN_ERR_*` name of a return code.
pub fn code_name(code: i32) -> &'static str {
    match code {
        0 => "RKNN_SUCC",
        -1 => "RKNN_ERR_FAIL",
        -2 => "RKNN_ERR_TIMEOUT",
        -3 => "RKNN_ERR_DEVICE_UNAVAILABLE",
        -4 => "RKNN_ERR_MALLOC_FAIL",
        -5 => "RKNN_ERR_PARAM_INVALID",
        -6 => "RKNN_ERR_MODEL_INVALID",
        -7 => "RKNN_ERR_CTX_INVALID",
        -8 => "RKNN_ERR_INPUT_INVALID",
        -9 => "RKNN_ERR_OUTPUT_INVALID",
        -10 => "RKNN_ERR_DEVICE_UNMATCH",
        _ => "unknown code",
    }
}

/// The version string compiled into the library at `file` ("2.3.2 (429f97ae6b@2025-04-09T09:09:27)").
pub fn runtime_version(file: &str) -> Option<String> {
    let bytes = std::fs::read(file).ok()?;
    let at = bytes
        .windows(VERSION_MARKER.len())
        .position(|w| w == VERSION_MARKER)?;
    let rest = &bytes[at + VERSION_MARKER.len()..];
    let end = rest
        .iter()
        .take(200)
        .position(|&b| b == 0 || b == b'\n' || !(b == b' ' || b.is_ascii_graphic()))?;
    let v = String::from_utf8_lossy(&rest[..end]).trim().to_string();
    (!v.is_empty()).then_some(v)
}

/// Major and minor of a version string ("2.3.2 (...)" → (2, 3); "2.0.0b0" → (2, 0)).
pub fn version_number(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Why creating the first matmul context failed with `code`, naming the library and what this
/// machine shows of the NPU driver.
pub fn no_device(library: &str, code: i32) -> String {
    let mut s = format!(
        "{library}: rknn_matmul_create failed with {code} ({}), so no NPU answered. Likely causes: the \
         vendor rknpu kernel driver (0.9.8 or newer) is not loaded (librknnrt cannot drive mainline \
         Linux's rocket driver), or this user may not open its device node",
        code_name(code)
    );
    let _ = write!(s, "; {}", super::device_nodes());
    s
}

/// The DRM nodes and the driver behind each (`renderD129: rknpu`), from sysfs, and whether the
/// current user may open those of rknpu; older vendor kernels expose `/dev/rknpu` instead.
pub fn device_nodes(drm: &Path, dev: &Path) -> String {
    let mut nodes: Vec<(String, String)> = std::fs::read_dir(drm)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("renderD") && !name.starts_with("card") || name.contains('-') {
                return None;
            }
            let driver = std::fs::read_link(e.path().join("device/driver")).ok()?;
            let driver = driver.file_name()?.to_string_lossy().into_owned();
            Some((name, driver))
        })
        .collect();
    nodes.sort();
    let rknpu: Vec<&(String, String)> = nodes
        .iter()
        .filter(|(_, d)| d.eq_ignore_ascii_case("rknpu"))
        .collect();
    let legacy = dev.join("rknpu");
    if rknpu.is_empty() && !legacy.exists() {
        let seen: Vec<String> = nodes.iter().map(|(n, d)| format!("{n}: {d}")).collect();
        return if seen.is_empty() {
            "no DRM device node exists on this machine (no /dev/dri/renderD*, no /dev/rknpu)".into()
        } else {
            format!(
                "no device node is driven by rknpu (DRM nodes: {}; no /dev/rknpu)",
                seen.join(", ")
            )
        };
    }
    let mut found: Vec<String> = rknpu
        .iter()
        .map(|(n, _)| access(&dev.join("dri").join(n)))
        .collect();
    if legacy.exists() {
        found.push(access(&legacy));
    }
    format!("rknpu device nodes: {}", found.join(", "))
}

/// `path` and whether this process may open it for reading and writing.
fn access(path: &Path) -> String {
    let ok = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .is_ok();
    let verdict = if ok {
        "opens"
    } else {
        "cannot be opened by this user (add it to the group owning it, often render or video)"
    };
    format!("{} {verdict}", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_as_the_vendor_writes_them() {
        assert_eq!(
            version_number("2.3.2 (429f97ae6b@2025-04-09T09:09:27)"),
            Some((2, 3))
        );
        assert_eq!(version_number("2.0.0b0"), Some((2, 0)));
        assert_eq!(
            version_number("1.6.0 (9a7b5d24c@2023-12-13T17:31:11)"),
            Some((1, 6))
        );
        assert_eq!(version_number("unknown"), None);
    }

    #[test]
    fn the_version_string_is_read_from_the_file() {
        let dir = std::env::temp_dir().join(format!("ork-rknn-diag-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("lib.so");
        let mut bytes = vec![0u8; 4096];
        bytes.extend_from_slice(b"librknnrt version: 2.3.2 (429f97ae6b@2025-04-09T09:09:27)\0tail");
        std::fs::write(&f, &bytes).unwrap();
        assert_eq!(
            runtime_version(f.to_str().unwrap()).as_deref(),
            Some("2.3.2 (429f97ae6b@2025-04-09T09:09:27)")
        );
        std::fs::write(&f, b"no marker here").unwrap();
        assert_eq!(runtime_version(f.to_str().unwrap()), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn device_nodes_name_the_driver_of_each() {
        let root = std::env::temp_dir().join(format!("ork-rknn-nodes-{}", std::process::id()));
        let (drm, dev) = (root.join("drm"), root.join("dev"));
        let node = |name: &str, driver: &str| {
            let d = root.join("devices").join(name);
            std::fs::create_dir_all(d.join("drivers").join(driver)).unwrap();
            std::fs::create_dir_all(drm.join(name)).unwrap();
            std::os::unix::fs::symlink(d.join("drivers").join(driver), d.join("driver")).unwrap();
            std::os::unix::fs::symlink(&d, drm.join(name).join("device")).unwrap();
        };
        std::fs::create_dir_all(dev.join("dri")).unwrap();
        assert!(device_nodes(&drm, &dev).starts_with("no DRM device node"));
        node("renderD128", "panfrost");
        let s = device_nodes(&drm, &dev);
        assert!(
            s.contains("no device node is driven by rknpu") && s.contains("renderD128: panfrost")
        );
        node("renderD129", "RKNPU");
        let s = device_nodes(&drm, &dev);
        assert!(s.contains("renderD129 cannot be opened"), "{s}");
        std::fs::write(dev.join("dri/renderD129"), b"").unwrap();
        assert!(device_nodes(&drm, &dev).contains("renderD129 opens"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
