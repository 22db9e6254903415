#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests of every layer and the
# FUSE integration tests (real mounts; needs root and /dev/fuse).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --workspace --release -- --test-threads=2
