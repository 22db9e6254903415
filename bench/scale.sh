#!/usr/bin/env bash
# What a pool's metadata costs per file and per chunk, measured, for the
# scale-out estimates in docs/SCALE-OUT.md (100 TB, 1 PB).
#
# Two pools on the same disk, each measured mounted and after a cold
# remount:
#   files  FILES small files (FILE_KB each, in DIRS directories): metadata
#          bytes per file (meta.redb growth / files), and mount time;
#   data   DATA_GB of incompressible data in one file: metadata bytes per
#          chunk (meta.redb growth / chunks: extent element, chunk record,
#          dedup index entry, segment table), the heat table's bytes per
#          segment, the dedup index's RAM if all resident (cairn info
#          index_ram_bytes), and mount time.
# Mount time is `cairn mount` from start to the mount being usable (the
# daemon answers a stat of the root), page cache dropped before.
# Then the per-unit figures are multiplied out to 100 TB and 1 PB at the
# pool's record size (64 KiB chunks) and segment size.
#
# Environment (defaults): FILES=100000 FILE_KB=4 DIRS=100 DATA_GB=4
#   BENCH_DIR=/var/tmp NO_BUILD=1 (use target/release/cairn as is) BIN
# Quick run: FILES=20000 DATA_GB=1 bash bench/scale.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

FILES=${FILES:-100000}
FILE_KB=${FILE_KB:-4}
DIRS=${DIRS:-100}
DATA_GB=${DATA_GB:-4}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
if [ -z "${BIN:-}" ]; then
    [ -n "${NO_BUILD:-}" ] || cargo build --release -p cairn-cli >&2
    BIN=$PWD/target/release/cairn
fi
W=$(mktemp -d "$BENCH_DIR/cairn-scale.XXXXXX")
cleanup() {
    for m in "$W"/mnt-*; do
        [ -d "$m" ] && is_mounted "$m" && "$BIN" umount "$m" >/dev/null 2>&1
    done
    rm -rf "$W"
}
trap cleanup EXIT

meta_bytes() { stat -c %s "$W/pool-$1/meta.redb"; }
info() { "$BIN" info "$W/mnt-$1" --json; }
jget() { python3 -c 'import json,sys; print(json.load(sys.stdin)'"$1"')'; }

make_pool() { # NAME DEVICE_GB
    "$BIN" mkfs "$W/pool-$1" --device "ssd:$W/$1-data.img:${2}G" --sparse >/dev/null
    mkdir -p "$W/mnt-$1"
    "$BIN" mount "$W/pool-$1" "$W/mnt-$1" >/dev/null
}

# Seconds from `cairn mount` to a usable mount, cold.
mount_time() {
    "$BIN" umount "$W/mnt-$1" >/dev/null
    drop_caches
    local t0
    t0=$(now)
    "$BIN" mount "$W/pool-$1" "$W/mnt-$1" >/dev/null
    stat "$W/mnt-$1" >/dev/null
    elapsed "$t0"
}

log "work dir $W"
# ------------------------------------------------------------ files
make_pool files 8
M0=$(meta_bytes files)
log "creating $FILES files of $FILE_KB KiB in $DIRS directories"
python3 - "$W/mnt-files" "$FILES" "$FILE_KB" "$DIRS" <<'EOF'
import os, sys
root, n, kb, dirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
body = os.urandom(kb * 1024)
for d in range(dirs):
    os.mkdir(os.path.join(root, "d%d" % d))
for i in range(n):
    with open(os.path.join(root, "d%d" % (i % dirs), "f%d" % i), "wb") as f:
        f.write(body[: len(body) - 8] + i.to_bytes(8, "little"))
EOF
"$BIN" sync "$W/mnt-files" >/dev/null
F_TIME=$(mount_time files)
F_META=$(( $(meta_bytes files) - M0 ))
F_PER=$(div "$F_META" "$FILES")
log "files: metadata +$F_META bytes = $F_PER per file; mount ${F_TIME}s"

# ------------------------------------------------------------ data
make_pool data $((DATA_GB * 2 + 2))
M0=$(meta_bytes data)
log "writing $DATA_GB GiB of incompressible data"
head -c $((DATA_GB << 30)) /dev/urandom >"$W/mnt-data/big"
"$BIN" sync "$W/mnt-data" >/dev/null
D_TIME=$(mount_time data)
J=$(info data)
CHUNKS=$(jget '["chunks"]' <<<"$J")
SEGS=$(jget '["segments"]' <<<"$J")
SEG_SIZE=$(jget '["segment_size"]' <<<"$J")
RECORD=$(jget '["record_size"]' <<<"$J")
IDX_RAM=$(jget '["index_ram_bytes"]' <<<"$J")
IDX_N=$(jget '["index_entries"]' <<<"$J")
D_META=$(( $(meta_bytes data) - M0 ))
"$BIN" umount "$W/mnt-data" >/dev/null
HEAT=$(stat -c %s "$W/pool-data/heat" 2>/dev/null || echo 0)
C_PER=$(div "$D_META" "$CHUNKS")
I_PER=$(div "$IDX_RAM" "$CHUNKS")
H_PER=$(div "$HEAT" "$SEGS")
log "data: $CHUNKS chunks, $SEGS segments; metadata +$D_META bytes = $C_PER per chunk; dedup index $I_PER B/chunk in RAM; heat $H_PER B/segment; mount ${D_TIME}s"

# ------------------------------------------------------------ report
est() { # BYTES_OF_DATA -> "chunks meta_GB index_GB heat_MB segments"
    awk -v b="$1" -v r="$RECORD" -v s="$SEG_SIZE" -v c="$C_PER" -v i="$I_PER" -v h="$H_PER" 'BEGIN {
        n = b / r; g = b / s
        printf "%.3g chunks, metadata %.0f GB, dedup index %.0f GB if all in RAM, %.3g segments, heat table %.0f MB", n, n * c / 1e9, n * i / 1e9, g, g * h / 1e6 }'
}
echo
echo "## Scale measurements ($(date -u +%F), $(nproc) cores, $(df -T "$BENCH_DIR" | awk 'NR==2 { print $2 }') under $BENCH_DIR)"
echo
echo "| measured | value |"
echo "|---|---:|"
echo "| metadata per small file ($FILE_KB KiB, $FILES files, $DIRS dirs) | $F_PER bytes |"
echo "| metadata per $((RECORD >> 10)) KiB chunk ($CHUNKS chunks, extent + chunk record + dedup entry) | $C_PER bytes |"
echo "| dedup index entries / chunks | $IDX_N / $CHUNKS |"
echo "| dedup index B-tree bytes per chunk (all resident) | $I_PER bytes |"
echo "| heat table per $((SEG_SIZE >> 20)) MiB segment | $H_PER bytes |"
echo "| cold mount, $FILES files | ${F_TIME} s |"
echo "| cold mount, $DATA_GB GiB ($CHUNKS chunks) | ${D_TIME} s |"
echo
echo "Estimates at this record and segment size (incompressible, no dedup):"
echo "- 100 TB: $(est 1e14)"
echo "- 1 PB: $(est 1e15)"
