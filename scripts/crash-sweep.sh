#!/usr/bin/env bash
# A longer crash-point sweep than the test suite's (crates/fs/tests/crash_sweep.rs):
#   bash scripts/crash-sweep.sh [POINTS] [SEEDS] [FIRST_SEED]
# runs POINTS crash points (default 20000) over SEEDS seeds (default
# POINTS/250) starting at FIRST_SEED (default: a random one, printed), and
# prints crash points per second and every failure with its seed, crash
# point and mode. Replay one failing seed with
#   CAIRN_CRASH_SEED=S CAIRN_CRASH_SEEDS=1 CAIRN_CRASH_AT=K cargo test --release -p cairn-fs --test crash_sweep crash_point_sweep -- --nocapture
# (CAIRN_CRASH_AT also prints the trace around that point).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
points=${1:-20000}
seeds=${2:-$(( (points + 249) / 250 ))}
first=${3:-$(( (RANDOM << 15 | RANDOM) + 1 ))}
echo "crash sweep: $points points over $seeds seeds from seed $first"
CAIRN_CRASH_POINTS=$points CAIRN_CRASH_SEEDS=$seeds CAIRN_CRASH_SEED=$first \
    cargo test --release -p cairn-fs --test crash_sweep crash_point_sweep -- --nocapture 2>&1 |
    grep -E '^(seed |FAILED |[0-9]+ crash points|test result)'
