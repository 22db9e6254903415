#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests of every layer and the
# FUSE integration tests (real mounts; needs root and /dev/fuse).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/deps.sh test
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
# Assertions per 1,000 lines of library code stay at 5 or more (issue 52).
bash scripts/assert-density.sh 5.0
# The `suite` profile (Cargo.toml): release optimization without LTO, so
# the test binaries link quickly.
cargo test --workspace --profile suite -- --test-threads=2
# fuser is vendored with Cairn's FUSE-over-io_uring transport (vendor/fuser/PATCHES.md):
# its unit tests, and formatting of the files Cairn added.
rustfmt --edition 2024 --check vendor/fuser/src/uring.rs vendor/fuser/src/uring_sched.rs vendor/fuser/src/uring_load.rs vendor/fuser/src/uring_rescue.rs
CARGO_TARGET_DIR="$PWD/target" cargo test --release --manifest-path vendor/fuser/Cargo.toml --lib
