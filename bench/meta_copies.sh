#!/usr/bin/env bash
# The cost of the second metadata copy on a one-device pool (its copy lies
# beside the first, on the same disk): BIN (a cairn binary) makes a fresh
# sparse pool in $WORK (/tmp) with `--meta-copies 1` and one with the
# default 2, in turns (the order swapped each round), ROUNDS times
# (default 3). On each: FILES (default 2000) x (create a 4 KiB file +
# fsync it) through the mount, then SYNCS (default 20) x (create PER_SYNC
# (default 500) 4 KiB files, then time `cairn sync MNT`, a commit). Prints
# a line per run and the medians per copy count: files/s of create+fsync,
# the `cairn sync` wall time (median, p90; the command's own start-up
# included) and the daemon's mean metadata commit time over the run
# (`cairn info --json`: service.commit_meta, every commit).
#   bash bench/meta_copies.sh target/release/cairn
set -euo pipefail
BIN=$(realpath "$1")
cd "$(dirname "$0")"
source ./lib.sh
ROUNDS=${ROUNDS:-3} FILES=${FILES:-2000} SYNCS=${SYNCS:-20} PER_SYNC=${PER_SYNC:-500}
D=${WORK:-/tmp}/cairn-meta-copies-bench.$$
trap '{ is_mounted "$D/mnt" && "$BIN" umount "$D/mnt"; } >/dev/null 2>&1; rm -rf "$D"' EXIT

# run COPIES: one pool with COPIES metadata copies; prints "files_per_s
# sync_p50_ms sync_p90_ms commit_meta_mean_ms".
run() {
    rm -rf "$D"
    mkdir -p "$D/mnt"
    "$BIN" mkfs "$D/pool" --sparse --meta-copies "$1" >/dev/null 2>&1
    "$BIN" mount "$D/pool" "$D/mnt" >/dev/null
    python3 - "$D/mnt" "$BIN" "$FILES" "$SYNCS" "$PER_SYNC" <<'PY'
import json, os, subprocess, sys, time
mnt, cairn = sys.argv[1], sys.argv[2]
files, syncs, per_sync = map(int, sys.argv[3:6])
buf = os.urandom(4096)
os.mkdir(f"{mnt}/f")
t = time.perf_counter()
for i in range(files):
    fd = os.open(f"{mnt}/f/{i:06}", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, buf)
    os.fsync(fd)
    os.close(fd)
rate = files / (time.perf_counter() - t)
lat = []
for s in range(syncs):
    os.mkdir(f"{mnt}/s{s}")
    for i in range(per_sync):
        with open(f"{mnt}/s{s}/{i:04}", "wb") as f:
            f.write(buf)
    a = time.perf_counter()
    subprocess.run([cairn, "sync", mnt], check=True, stdout=subprocess.DEVNULL)
    lat.append((time.perf_counter() - a) * 1e3)
lat.sort()
info = json.loads(subprocess.run([cairn, "info", "--json", mnt], check=True,
                                 capture_output=True, text=True).stdout)
m = info["service"]["commit_meta"]
mean = m["sum_seconds"] / max(m["count"], 1) * 1e3
print(f"{rate:.0f} {lat[len(lat) // 2]:.1f} {lat[(len(lat) * 9) // 10]:.1f} {mean:.2f}")
PY
    "$BIN" umount "$D/mnt" >/dev/null
}

declare -A rate p50 p90 meta
for r in $(seq "$ROUNDS"); do
    order="1 2"
    [ $((r % 2)) -eq 0 ] && order="2 1"
    for c in $order; do
        out=$(run "$c")
        read -r f s50 s90 m <<<"$out"
        echo "round $r meta_copies $c: create+fsync $f files/s, cairn sync p50 $s50 ms p90 $s90 ms, metadata commit mean $m ms"
        rate[$c]+="$f " p50[$c]+="$s50 " p90[$c]+="$s90 " meta[$c]+="$m "
    done
done
for c in 1 2; do
    # shellcheck disable=SC2086
    echo "median meta_copies $c: create+fsync $(median ${rate[$c]}) files/s, cairn sync p50 $(median ${p50[$c]}) ms p90 $(median ${p90[$c]}) ms, metadata commit mean $(median ${meta[$c]}) ms"
done
