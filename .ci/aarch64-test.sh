#!/usr/bin/env bash
# Runs the whole Rust test suite for aarch64 under qemu-user: once as a Cortex-A76 (RK3588's big core,
# with the dot-product extension) and once as a Cortex-A72 (no dotprod: the fallback kernels); then the
# C harness, cross-compiled, on each.
# Uses Debian's rustc-web (rustup cannot fetch other targets here); see .ci/setup.sh.
# Timings under qemu mean nothing; this checks results only.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/bin:$PATH
# Outside the clone, so that CI reuses the cross build.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR_ARM:-$HOME/.cache/ork-moe/target-arm}
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
target_dir=$(realpath -m "$CARGO_TARGET_DIR")
cpus=${*:-cortex-a76 cortex-a72}
for cpu in $cpus; do
    echo "== aarch64 tests under qemu -cpu $cpu =="
    # ORK_TEST_RUNNER: how a test starts a child process of its own binary (tests/dispatch.rs)
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -cpu $cpu" \
        ORK_TEST_RUNNER="qemu-aarch64-static -cpu $cpu" \
        cargo test --release --target aarch64-unknown-linux-gnu
    # The C harness, cross-compiled against the aarch64 library (the cargo test above skips it: the
    # host's cc targets x86-64).
    echo "== C harness (QUICK) for aarch64 under qemu -cpu $cpu =="
    make -C tests/c CC=aarch64-linux-gnu-gcc QUICK=1 BUILD="$target_dir/c-harness-aarch64" \
        LIBDIR="$target_dir/aarch64-unknown-linux-gnu/release/deps" \
        RUNNER="qemu-aarch64-static -cpu $cpu" run
done
