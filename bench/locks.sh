#!/usr/bin/env bash
# Lock contention under load: for each Cairn binary (BIN, and BASE_BIN when
# given, e.g. a build from before a locking change), a fresh pool is
# mounted, dbench runs DBENCH_CLIENTS clients of the file-server mix for
# DBENCH_SECONDS, and `cairn info --json` gives the lock counters since the
# mount: how often each lock was taken, how often a taker waited, the time
# spent waiting (total and longest). RUNS rounds per binary, interleaved;
# the table shows each round.
# Environment: BIN (default: cargo build --release), BASE_BIN, RUNS=3,
#   DBENCH_CLIENTS=4 DBENCH_SECONDS=10, BENCH_DIR=/var/tmp, KEEP=1.
# Needs root (mounts); installs dbench with apt-get if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
RUNS=${RUNS:-3}
DBENCH_CLIENTS=${DBENCH_CLIENTS:-4}
DBENCH_SECONDS=${DBENCH_SECONDS:-10}
LOADFILE=/usr/share/dbench/client.txt
command -v dbench >/dev/null || apt-get install -y -qq dbench >&2
[ -r "$LOADFILE" ] || die "no dbench load file at $LOADFILE"
if [ -z "${BIN:-}" ]; then
    cargo build --release -q -p cairn-cli >&2
    BIN=$PWD/target/release/cairn
fi
W=$(mktemp -d "${BENCH_DIR:-/var/tmp}/cairn-locks.XXXXXX")
cleanup() {
    for m in "$W"/mnt-*; do
        [ -d "$m" ] && is_mounted "$m" && fusermount3 -u "$m" 2>/dev/null || true
    done
    [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT

# round NAME BINARY N: one dbench run on a fresh pool; prints a table row.
round() {
    local name=$1 bin=$2 n=$3 pool="$W/pool-$1-$3" mnt="$W/mnt-$1-$3" out mbs
    mkdir -p "$pool" "$mnt"
    "$bin" mkfs "$pool" --device "ssd:$pool/data.0:8G" >/dev/null 2>&1
    "$bin" mount "$pool" "$mnt" >&2
    out=$(dbench -D "$mnt" -t "$DBENCH_SECONDS" -c "$LOADFILE" "$DBENCH_CLIENTS" 2>&1) ||
        { printf '%s\n' "$out" | tail -5 >&2; die "dbench failed on $name"; }
    mbs=$(printf '%s\n' "$out" | awk '/^Throughput/ { print $2 }')
    "$bin" info --json "$pool" | python3 -c '
import json, sys
name, n, mbs = sys.argv[1:4]
for l in json.load(sys.stdin).get("locks", []):
    print("%-6s %-3s %-9s %-13s %10d %9d %10.3f %9.3f" % (name, n, mbs, l["name"],
          l["acquired"], l["waited"], l["wait_us_total"] / 1e6, l["wait_us_max"] / 1e3))
' "$name" "$n" "$mbs"
    "$bin" umount "$mnt" >&2
    rm -rf "$pool"
}

printf '%-6s %-3s %-9s %-13s %10s %9s %10s %9s\n' binary run "dbench" lock taken waited "wait s" "max ms"
for n in $(seq "$RUNS"); do
    round cairn "$BIN" "$n"
    [ -z "${BASE_BIN:-}" ] || round base "$BASE_BIN" "$n"
done
