#!/usr/bin/env bash
# Installs what the checks need on a fresh Debian 12 x86_64 machine (idempotent; fast when present):
# the aarch64 cross toolchain and qemu for the NEON runs, cmake/ninja for llama.cpp, GNU time for its
# memory check, jq for the benches' JSON, gguf+numpy.
set -euo pipefail

need_apt=()
dpkg --print-foreign-architectures | grep -qx arm64 || { dpkg --add-architecture arm64; need_update=1; }
# libc6:arm64: the aarch64 loader and libc at /lib for qemu-user (pointed at the cross sysroot instead,
# -L /usr/aarch64-linux-gnu, the C harness hung at its first library call under qemu 7.2).
for pkg in rustc-web cargo-web libstd-rust-web-dev:arm64 libc6:arm64 gcc-aarch64-linux-gnu g++-aarch64-linux-gnu \
           libc6-dev-arm64-cross \
           qemu-user-static cmake ninja-build time jq; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ "${#need_apt[@]}" -gt 0 ] || [ -n "${need_update:-}" ]; then
    apt-get update -qq
    if [ "${#need_apt[@]}" -gt 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
    fi
fi
python3 -c 'import gguf, numpy' 2>/dev/null || pip install -q gguf==0.19.0 numpy
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt
