#!/usr/bin/env bash
# History benchmark: what snapshots, old versions and prune cost.
#   1. snapshot creation time with 10^4, 10^5, 10^6 files (median of RUNS
#      `snapshot create --json` create_ms, plus the wall time of the command
#      and how long the background content hash took);
#   2. cold read of a 1 GiB file as of an old TID (after overwriting it once
#      fully) vs the current version, with the ratio;
#   3. pool physical size after each of CYCLES cycles of "overwrite everything
#      + cairn prune --keep-history 0" (should stay flat).
# Prints markdown tables. Needs root (drop_caches, FUSE), python3.
# Environment:
#   FILE_COUNTS="10000 100000 1000000"  tree sizes for the snapshot test
#   RUNS=5           snapshot creations per tree size / cold reads per version
#   BIG_MB=1024      size of the file read as of an old TID
#   CYCLES=20        overwrite + prune cycles
#   CYCLE_MB=256     data overwritten per cycle (in 8 files)
#   BENCH_DIR=/var/tmp  where the work dir is made (same disk as /work here)
#   SKIP=snap,read,prune  parts to skip
#   KEEP=1           keep the work dir
# Quick run: FILE_COUNTS="10000" RUNS=3 BIG_MB=256 CYCLES=5 CYCLE_MB=64 bench/history.sh
set -euo pipefail

FILE_COUNTS=${FILE_COUNTS:-"10000 100000 1000000"}
RUNS=${RUNS:-5}
BIG_MB=${BIG_MB:-1024}
CYCLES=${CYCLES:-20}
CYCLE_MB=${CYCLE_MB:-256}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
SKIP=${SKIP:-}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"

. "$(dirname "$0")/lib.sh"
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
skipped() { [[ ",$SKIP," == *",$1,"* ]]; }
# json FIELD: reads one JSON document on stdin, prints FIELD (a.b for nesting).
json() {
    python3 -c 'import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1].split("."):
    v = v[int(k)] if isinstance(v, list) else v[k]
print(v)' "$1"
}

# ------------------------------------------------------------------ setup

check_tools() {
    [ "$(id -u)" = 0 ] || die "run as root (drop_caches, FUSE mounts)"
    for t in fusermount3 python3 awk dd sha256sum findmnt; do
        command -v "$t" >/dev/null || die "$t not installed"
    done
}

build_cairn() {
    log "building cairn (release)"
    (cd "$ROOT" && cargo build --release -p cairn-cli >&2)
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/cairn
    [ -x "$BIN" ] || die "no binary at $BIN"
}

setup_dir() {
    W=$(mktemp -d "$BENCH_DIR/cairn-hbench.XXXXXX")
    POOL=$W/pool
    MNT=$W/mnt
    mkdir -p "$MNT"
    log "work dir $W on $(findmnt -n -o SOURCE,FSTYPE -T "$W" | tr -s ' ') ($(df -h --output=avail "$W" | tail -1 | tr -d ' ') free)"
}

is_mounted() { grep -q " $1 " /proc/self/mountinfo; }

cleanup() {
    set +eu
    [ -n "${W:-}" ] || return 0
    if is_mounted "$MNT"; then
        "$BIN" umount "$MNT" >/dev/null 2>&1 || fusermount3 -u -z "$MNT"
    fi
    if [ -z "${KEEP:-}" ]; then rm -rf --one-file-system "$W"; else log "kept $W"; fi
}

new_pool() {
    if is_mounted "$MNT"; then "$BIN" umount "$MNT" >&2; fi
    rm -rf --one-file-system "$POOL"
    "$BIN" mkfs "$POOL" >&2
    "$BIN" mount "$POOL" "$MNT" >&2
}

remount_cold() {
    "$BIN" umount "$MNT" >&2
    sync
    echo 3 >/proc/sys/vm/drop_caches
    "$BIN" mount "$POOL" "$MNT" >&2
}

# ------------------------------------------------ 1. snapshot creation

make_files() { # DIR N: N one-byte files, 1000 per directory
    python3 - "$1" "$2" <<'EOF'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
per = 1000
for d in range((n + per - 1) // per):
    dp = os.path.join(root, "d%05d" % d)
    os.mkdir(dp)
    for i in range(min(per, n - d * per)):
        fd = os.open(os.path.join(dp, "f%04d" % i), os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b"x")
        os.close(fd)
EOF
}

declare -a SNAP_ROWS=()

bench_snapshots() {
    local n t0 fill i out ms wall ms_all wall_all hash_s
    for n in $FILE_COUNTS; do
        new_pool
        log "snapshot: creating $n files"
        t0=$(now)
        mkdir "$MNT/tree"
        make_files "$MNT/tree" "$n"
        "$BIN" sync "$MNT" >/dev/null
        fill=$(elapsed "$t0")
        log "snapshot: $n files in ${fill}s"
        ms_all=()
        wall_all=()
        hash_s=n/a
        for i in $(seq 1 "$RUNS"); do
            echo "$i" >"$MNT/tree/changed" # each snapshot commits a change
            t0=$(now)
            out=$("$BIN" snapshot create "$MNT" "s$i" --json)
            wall=$(awk -v s="$(elapsed "$t0")" 'BEGIN { printf "%.1f", s * 1000 }')
            ms=$(json create_ms <<<"$out")
            ms_all+=("$ms")
            wall_all+=("$wall")
            if [ "$i" = 1 ]; then
                # time until the background content hash of s1 is recorded
                while :; do
                    h=$("$BIN" snapshot list "$MNT" --json | python3 -c 'import json, sys
print(next(s["hash"] for s in json.load(sys.stdin) if s["name"] == "s1"))')
                    [ "$h" != None ] && break
                    sleep 0.05
                done
                hash_s=$(elapsed "$t0")
            fi
        done
        log "snapshot: $n files: create_ms ${ms_all[*]}; wall ms ${wall_all[*]}; hash ${hash_s}s"
        SNAP_ROWS+=("| $n | $(printf '%.2f' "$(median "${ms_all[@]}")") | $(median "${wall_all[@]}") | $(printf '%.2f' "$hash_s") | $(printf '%.0f' "$fill") |")
    done
    "$BIN" umount "$MNT" >&2
}

# ------------------------------------------------ 2. old-version reads

READ_ROWS=()

read_secs() { # FILE: seconds to read it sequentially
    local t0
    t0=$(now)
    dd if="$1" of=/dev/null bs=1M status=none
    elapsed "$t0"
}

bench_old_read() {
    local t1 sum_old i cur old cur_all=() old_all=()
    new_pool
    log "read: writing ${BIG_MB} MiB, then overwriting it fully"
    dd if=/dev/urandom of="$MNT/big" bs=1M count="$BIG_MB" conv=fsync status=none
    t1=$("$BIN" sync "$MNT")
    sum_old=$(sha256sum <"$MNT/big" | cut -d' ' -f1)
    dd if=/dev/urandom of="$MNT/big" bs=1M count="$BIG_MB" conv=fsync,notrunc status=none
    "$BIN" sync "$MNT" >/dev/null
    [ "$(sha256sum <"$MNT/big@@$t1" | cut -d' ' -f1)" = "$sum_old" ] ||
        die "big@@$t1 does not read back the old content"
    for i in $(seq 1 "$RUNS"); do
        # alternate the order so neither version always goes first
        if [ $((i % 2)) = 1 ]; then
            remount_cold; cur=$(read_secs "$MNT/big")
            remount_cold; old=$(read_secs "$MNT/big@@$t1")
        else
            remount_cold; old=$(read_secs "$MNT/big@@$t1")
            remount_cold; cur=$(read_secs "$MNT/big")
        fi
        log "read: run $i: current ${cur}s, @@$t1 ${old}s"
        cur_all+=("$cur")
        old_all+=("$old")
    done
    cur=$(median "${cur_all[@]}")
    old=$(median "${old_all[@]}")
    READ_ROWS+=("| current version | $(printf '%.2f' "$cur") | $(div "$BIG_MB" "$cur") | 1.00 |")
    READ_ROWS+=("| as of old TID (big@@$t1) | $(printf '%.2f' "$old") | $(div "$BIG_MB" "$old") | $(div "$old" "$cur") |")
    "$BIN" umount "$MNT" >&2
}

# ------------------------------------------------ 3. prune keeps size flat

PRUNE_ROWS=()
PHYS=()

bench_prune_cycles() {
    local per c i p info phys used freed df_used
    per=$((CYCLE_MB / 8))
    new_pool
    log "prune: $CYCLE_MB MiB in 8 files, $CYCLES overwrite + prune cycles"
    for i in $(seq 0 7); do
        dd if=/dev/urandom of="$MNT/f$i" bs=1M count="$per" status=none
    done
    "$BIN" sync "$MNT" >/dev/null
    for c in $(seq 1 "$CYCLES"); do
        for i in $(seq 0 7); do
            dd if=/dev/urandom of="$MNT/f$i" bs=1M count="$per" conv=notrunc status=none
        done
        "$BIN" sync "$MNT" >/dev/null
        p=$("$BIN" prune "$MNT" --keep-history 0 --json)
        freed=$(json bytes_freed <<<"$p")
        df_used=$(df -B1 --output=used "$MNT" | tail -1 | tr -d ' ')
        "$BIN" umount "$MNT" >&2
        info=$("$BIN" info "$POOL" --json)
        phys=$(json physical_bytes <<<"$info")
        used=$(python3 -c 'import json, sys
print(sum(d["used"] for d in json.load(sys.stdin)["devices"]))' <<<"$info")
        "$BIN" mount "$POOL" "$MNT" >&2
        PHYS+=("$phys")
        PRUNE_ROWS+=("| $c | $(mib "$phys") | $(mib "$used") | $(mib "$df_used") | $(mib "$freed") |")
        log "prune: cycle $c: physical $(mib "$phys") MiB, device slots used $(mib "$used") MiB, freed $(mib "$freed") MiB"
    done
    "$BIN" umount "$MNT" >&2
}

# ------------------------------------------------------------------ main

check_tools
build_cairn
setup_dir
trap cleanup EXIT
log "cairn $("$BIN" --version | awk '{ print $2 }'), $(nproc) cores, kernel $(uname -r)"

skipped snap || bench_snapshots
skipped read || bench_old_read
skipped prune || bench_prune_cycles

echo
echo "## Cairn history benchmark ($(date -u +%Y-%m-%dT%H:%MZ), $(findmnt -n -o FSTYPE -T "$W") at $BENCH_DIR)"
if [ ${#SNAP_ROWS[@]} -gt 0 ]; then
    echo
    echo "### Snapshot creation (median of $RUNS)"
    echo
    echo "| files | create_ms (daemon) | wall ms (cairn snapshot create) | content hash done after s | tree creation s |"
    echo "|---:|---:|---:|---:|---:|"
    printf '%s\n' "${SNAP_ROWS[@]}"
fi
if [ ${#READ_ROWS[@]} -gt 0 ]; then
    echo
    echo "### Cold sequential read of a $BIG_MB MiB file (median of $RUNS, remount + drop_caches before each)"
    echo
    echo "| version | seconds | MiB/s | time vs current |"
    echo "|---|---:|---:|---:|"
    printf '%s\n' "${READ_ROWS[@]}"
fi
if [ ${#PRUNE_ROWS[@]} -gt 0 ]; then
    echo
    echo "### Pool size over $CYCLES cycles of overwriting $CYCLE_MB MiB + prune --keep-history 0"
    echo
    echo "| cycle | physical MiB (cairn info) | device slots used MiB | df used MiB (incl. space reserve) | freed by prune MiB |"
    echo "|---:|---:|---:|---:|---:|"
    printf '%s\n' "${PRUNE_ROWS[@]}"
    echo
    echo "physical bytes, last / first cycle: $(div "${PHYS[-1]}" "${PHYS[0]}") (1.00 = flat); median $(mib "$(median "${PHYS[@]}")") MiB for $CYCLE_MB MiB of live data"
fi
