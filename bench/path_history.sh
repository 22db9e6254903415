#!/usr/bin/env bash
# History that follows a path (issue 54): what `cairn history PATH --json`
# costs on a path with VERSIONS versions (default 10000), each a save by
# rename over the name (write f.tmp, rename it over f: a new inode each
# time, as `sed -i` and editors save) followed by `cairn sync MNT` (a
# commit per version, as the history tests force one). Then ROUNDS
# (default 3) timed runs of each of:
#   path     `cairn history MNT/f --json` (the path's VERSIONS versions)
#   inode    `cairn history MNT/f --inode --json` (the last inode's one)
#   sync     `cairn sync MNT` with nothing to commit: the floor of a
#            command's start-up and control round trip
# Each time is the command's wall time (start-up, the daemon's flush and
# reads, the JSON reply and its printing included), output to /dev/null.
# The rounds run right after the commits, then again after a remount
# (which merges the ended versions still waiting for it). Prints each
# round and the medians; the target is path < 100 ms.
# Environment: BIN (default: cargo build --profile PROFILE, release),
#   NO_BUILD=1, VERSIONS=10000, ROUNDS=3, BENCH_DIR=/var/tmp, KEEP=1.
# Needs root (FUSE mounts), fuse3, python3.
#   bench/path_history.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"
. "$ROOT/bench/lib.sh"
PROFILE=${PROFILE:-release}
VERSIONS=${VERSIONS:-10000}
ROUNDS=${ROUNDS:-3}
TARGET_MS=100
[ "$(id -u)" = 0 ] || die "run as root (FUSE mounts)"
command -v python3 >/dev/null || die "python3 not installed"
build_cairn

W=$(mktemp -d "${BENCH_DIR:-/var/tmp}/cairn-path-history.XXXXXX")
MNT=$W/mnt
cleanup() {
    set +e
    if is_mounted "$MNT"; then
        "$BIN" umount "$MNT" >/dev/null 2>&1 || fusermount3 -u -z "$MNT"
    fi
    if [ -z "${KEEP:-}" ]; then rm -rf --one-file-system "$W"; else log "kept $W"; fi
}
trap cleanup EXIT
mkdir -p "$MNT"
quiet "$BIN" mkfs "$W/pool" --sparse
quiet "$BIN" mount "$W/pool" "$MNT"

log "making $VERSIONS versions of $MNT/f: rename over it + cairn sync, each"
t0=$(now)
python3 - "$MNT" "$BIN" "$VERSIONS" <<'PY'
import os, subprocess, sys
mnt, cairn, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(n):
    with open(f"{mnt}/f.tmp", "w") as f:
        f.write(f"version {i}\n")
    os.rename(f"{mnt}/f.tmp", f"{mnt}/f")
    subprocess.run([cairn, "sync", mnt], check=True, stdout=subprocess.DEVNULL)
PY
log "made them in $(elapsed "$t0") s"

# The history must list every version, each of its own inode.
"$BIN" history "$MNT/f" --json | python3 -c '
import json, sys
v, n = json.load(sys.stdin), int(sys.argv[1])
assert len(v) == n, f"history lists {len(v)} versions, not {n}"
assert len({x["ino"] for x in v}) == n, "versions share inodes"
assert all(x["inode_changed"] for x in v[1:]), "inode_changed missing"
' "$VERSIONS" || die "the history of $MNT/f is not the $VERSIONS versions made"

# timed_ms CMD...: wall time of CMD in ms, its output discarded.
timed_ms() {
    local t0
    t0=$(now)
    "$@" >/dev/null
    awk -v s="$(elapsed "$t0")" 'BEGIN { printf "%.1f", s * 1000 }'
}

# rounds STATE: ROUNDS timed rounds of the three commands, in RES[*-STATE].
declare -A RES
rounds() {
    local r p i s
    for r in $(seq "$ROUNDS"); do
        p=$(timed_ms "$BIN" history "$MNT/f" --json)
        i=$(timed_ms "$BIN" history "$MNT/f" --inode --json)
        s=$(timed_ms "$BIN" sync "$MNT")
        add "path-$1" "$p"
        add "inode-$1" "$i"
        add "sync-$1" "$s"
        log "$1, round $r: path $p ms, --inode $i ms, sync (floor) $s ms"
    done
}
# Right after the commits, part of the ended versions still wait in
# fresh_v1 for their merge into hist_v1 (meta/src/store/hist_lazy.rs);
# a mount merges them all.
rounds fresh
quiet "$BIN" umount "$MNT"
quiet "$BIN" mount "$W/pool" "$MNT"
rounds remounted

printf '\n| %s versions by rename, median of %s (ms) | right after | after a remount |\n|---|---:|---:|\n' \
    "$VERSIONS" "$ROUNDS"
for k in path:'`cairn history PATH --json`' inode:'`cairn history PATH --inode --json`' \
    sync:'`cairn sync MNT`, nothing to commit (floor)'; do
    printf '| %s | %s | %s |\n' "${k#*:}" "$(med "${k%%:*}-fresh")" "$(med "${k%%:*}-remounted")"
done
for st in fresh remounted; do
    printf 'path history < %s ms (%s): %s\n' "$TARGET_MS" "$st" "$(verdict "$(med "path-$st")" "<=" "$TARGET_MS")"
done
