#!/usr/bin/env bash
# Runs every test of the project on a fresh machine: installs what it needs
# (Rust components; qemu-system-x86, grub-pc-bin, xorriso, mtools, tshark, opensm,
# infiniband-diags, libumad2sim0, ibsim-utils with apt-get
# when root; a QEMU with the vfio-user client and the Linux guest, cached
# under target/), then formatting, clippy on the host crates and on the kernel,
# the host unit and model-backed tests, the QEMU end-to-end tests, and a
# short run of every fuzz target (cargo-fuzz, installed under target/tools).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"
# shellcheck source=scripts/deps.sh
. scripts/deps.sh

# A fresh clone gains nothing from incremental caches but their 2 GB.
export CARGO_INCREMENTAL=0

step() { printf '\n== %s\n' "$*"; }
start=$(date +%s)

step "dependencies"
ensure_rust
ensure_qemu
ensure_iso_tools
ensure_tshark
ensure_ib_peers
ensure_vfu

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (host crates)"
cargo clippy --all-targets --quiet -- -D warnings

step "cargo clippy (kernel, boot)"
RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR=target/kernel cargo kclippy --release --quiet -- -D warnings

step "kernel image and GRUB ISO"
./run-qemu.sh --build-only --iso

step "cargo test (unit, model-backed, QEMU end-to-end)"
cargo test --quiet --no-fail-fast

step "fuzz targets (build, replay the seeds: fuzz/README.md)"
scripts/fuzz.sh --smoke

printf '\n== all tests passed in %ss\n' "$(( $(date +%s) - start ))"
