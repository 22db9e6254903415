#!/usr/bin/env bash
# Dedup and compression benchmark (the lessfs two-pass test, sized for this
# machine), in one run:
#  1. unique pass: FILES files of FILE_MB MiB of incompressible data written
#     (dd bs=1M conv=fsync each) to a pool with dedup on; MB/s, physical size
#  2. duplicate pass: the same files again under new names; MB/s, physical
#  3. read-back: everything read cold and checksummed against the sources
#  4. baseline: the unique pass on a pool with dedup off, and on the native
#     directory (ratios against them)
#  5. compressible corpus (a tar of TAR_SRC) written to pools with lz4 and
#     zstd: ratio and MB/s
#  6. index memory: INDEX_STEPS steps of INDEX_STEP_MB MiB of unique data in
#     4 KiB blocks; after each, the dedup index's B-tree page bytes per
#     unique block (the most RAM the index takes, all of it cached) and the
#     daemon's RSS (everything: metadata cache bounded by INDEX_CACHE_MIB,
#     write buffer, read cache), extrapolated to 10^7 unique blocks
# Figures are medians where repeated; ratios are against baselines measured
# in this same run. Needs root (drop_caches), fuse3, python3, tar.
# Environment: FILES=8 FILE_MB=1024 INDEX_STEPS=4 INDEX_STEP_MB=1024
#   INDEX_CACHE_MIB=256 TAR_SRC=/usr/share ONLY_INDEX=1 (just part 6)
#   BENCH_DIR=/var/tmp KEEP=1
set -euo pipefail

FILES=${FILES:-8}
FILE_MB=${FILE_MB:-1024}
INDEX_STEPS=${INDEX_STEPS:-4}
INDEX_STEP_MB=${INDEX_STEP_MB:-1024}
INDEX_CACHE_MIB=${INDEX_CACHE_MIB:-256}
TAR_SRC=${TAR_SRC:-/usr/share}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"

. "$(dirname "$0")/lib.sh"
mbps() { awk -v mb="$1" -v a="$2" -v b="$3" 'BEGIN { printf "%.0f", mb / (b - a) }'; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }

[ "$(id -u)" = 0 ] || die "run as root"
(cd "$ROOT" && cargo build --release -p cairn-cli >&2)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/cairn
W=$(mktemp -d "$BENCH_DIR/cairn-dedup.XXXXXX")
MNT="$W/mnt"
mkdir -p "$MNT" "$W/src" "$W/native"
cleanup() {
    mountpoint -q "$MNT" && "$BIN" umount "$MNT" >/dev/null 2>&1 || true
    [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT

pool() { # name, mkfs options...
    local p="$W/$1"; shift
    "$BIN" mkfs "$p" --force "$@" >/dev/null
    "$BIN" mount "$p" "$MNT" >/dev/null
}
unmount() { "$BIN" umount "$MNT" >/dev/null; }
physical() { "$BIN" info "$MNT" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["stored_bytes"])'; }
write_set() { # dir, prefix -> MB/s
    local t0 t1
    t0=$(now)
    for i in $(seq 1 "$FILES"); do
        dd if="$W/src/u$i" of="$1/$2$i" bs=1M conv=fsync status=none
    done
    t1=$(now)
    mbps $((FILES * FILE_MB)) "$t0" "$t1"
}

if [ -z "${ONLY_INDEX:-}" ]; then
log "making $FILES x $FILE_MB MiB of unique data"
for i in $(seq 1 "$FILES"); do
    head -c "$((FILE_MB << 20))" /dev/urandom >"$W/src/u$i"
done
(cd "$W/src" && md5sum u* >"$W/sums")

log "baseline: native and dedup-off unique pass"
drop
NATIVE=$(write_set "$W/native" u)
rm -f "$W/native"/*
pool nodedup
sed -i 's/^dedup = .*/dedup = false/' "$W/nodedup/cairn.toml"
unmount
"$BIN" mount "$W/nodedup" "$MNT" >/dev/null
drop
NODEDUP=$(write_set "$MNT" u)
unmount
rm -rf "$W/nodedup"

log "unique and duplicate passes (dedup on)"
pool dedup
drop
UNIQUE=$(write_set "$MNT" u)
PHYS1=$(physical)
drop
DUP=$(write_set "$MNT" d)
PHYS2=$(physical)
unmount
"$BIN" mount "$W/dedup" "$MNT" >/dev/null
drop
t0=$(now)
(cd "$MNT" && md5sum -c --quiet "$W/sums") || die "read-back of the unique set differs"
sed 's/ u/ d/' "$W/sums" >"$W/sums.d"
(cd "$MNT" && md5sum -c --quiet "$W/sums.d") || die "read-back of the duplicate set differs"
t1=$(now)
READ=$(mbps $((2 * FILES * FILE_MB)) "$t0" "$t1")
unmount
rm -rf "$W/dedup"

log "compressible corpus: tar of $TAR_SRC"
tar -cf "$W/corpus.tar" -C "$(dirname "$TAR_SRC")" "$(basename "$TAR_SRC")" 2>/dev/null || true
CORPUS_MB=$(( $(stat -c %s "$W/corpus.tar") >> 20 ))
declare -A CRATIO CSPEED
for c in none lz4 zstd; do
    pool "c-$c" --compression "$c"
    drop
    t0=$(now)
    dd if="$W/corpus.tar" of="$MNT/corpus.tar" bs=1M conv=fsync status=none
    t1=$(now)
    CSPEED[$c]=$(mbps "$CORPUS_MB" "$t0" "$t1")
    CRATIO[$c]=$(div "$(stat -c %s "$W/corpus.tar")" "$(physical)")
    cmp "$W/corpus.tar" "$MNT/corpus.tar" || die "corpus differs ($c)"
    unmount
    rm -rf "$W/c-$c"
done

fi

log "index memory: $INDEX_STEPS x $INDEX_STEP_MB MiB of unique 4 KiB blocks"
"$BIN" mkfs "$W/idx" --force --record-size 4K >/dev/null
sed -i "s/^meta_cache_mib = .*/meta_cache_mib = $INDEX_CACHE_MIB/" "$W/idx/cairn.toml"
"$BIN" mount "$W/idx" "$MNT" >/dev/null
PID=$(pgrep -f "mount $W/idx" | head -1)
rss() { awk '/VmRSS/ { print $2 * 1024 }' /proc/"$PID"/status; }
RSS0=$(rss)
IDX_ROWS=""
PREV_N=0 PREV_RSS=$RSS0
for i in $(seq 1 "$INDEX_STEPS"); do
    head -c "$((INDEX_STEP_MB << 20))" /dev/urandom >"$MNT/i$i"
    "$BIN" sync "$MNT" >/dev/null
    read -r ENTRIES INDEX_BYTES < <("$BIN" info "$MNT" --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
print(j["index_entries"], j["index_ram_bytes"])')
    RSS1=$(rss)
    SLOPE=$(div "$((RSS1 - PREV_RSS))" "$((ENTRIES - PREV_N))")
    IDX_ROWS+="| $ENTRIES | $(div "$INDEX_BYTES" "$ENTRIES") | $((RSS1 >> 20)) MiB | $SLOPE |"$'\n'
    PREV_N=$ENTRIES PREV_RSS=$RSS1
done
# RSS at 10^7 unique blocks, continuing the last step's growth per block.
RSS_1E7=$(awk -v r="$RSS1" -v n="$ENTRIES" -v s="$SLOPE" 'BEGIN { x = r + (1e7 - n) * (s > 0 ? s : 0); printf "%.0f", x / 1048576 }')
unmount

[ -n "${ONLY_INDEX:-}" ] || cat <<EOF

## Cairn dedup/compression benchmark ($(date -u +%F), $FILES x $FILE_MB MiB, $(nproc) cores)

| measurement | value | ratio |
|---|---|---|
| native write (dd conv=fsync) | $NATIVE MB/s | |
| Cairn unique pass, dedup off | $NODEDUP MB/s | $(div "$NODEDUP" "$NATIVE") x native |
| Cairn unique pass, dedup on | $UNIQUE MB/s | $(div "$UNIQUE" "$NODEDUP") x dedup-off (target >= 0.8) |
| Cairn duplicate pass | $DUP MB/s | $(div "$DUP" "$UNIQUE") x unique pass (target >= 2) |
| read back + md5 (cold) | $READ MB/s | |
| physical after unique pass | $((PHYS1 >> 20)) MiB | |
| physical after duplicate pass | $((PHYS2 >> 20)) MiB | $(div "$PHYS2" "$PHYS1") x |
| corpus ($CORPUS_MB MiB tar of $TAR_SRC), none | ${CSPEED[none]} MB/s | ratio ${CRATIO[none]} |
| corpus, lz4 | ${CSPEED[lz4]} MB/s | ratio ${CRATIO[lz4]} |
| corpus, zstd:3 | ${CSPEED[zstd]} MB/s | ratio ${CRATIO[zstd]} |

EOF
cat <<EOF

Index memory (record size 4 KiB, meta_cache_mib = $INDEX_CACHE_MIB, daemon RSS $((RSS0 >> 20)) MiB when empty).
"index B/block" is the size of the dedup index's B-tree pages per unique
block: the most RAM the index takes even if all of it is cached (target
<= 20). RSS covers everything (metadata cache, write buffer, read cache),
which the config bounds; its growth per block over the last step,
continued, gives RSS at 10^7 unique blocks: about $RSS_1E7 MiB.

| unique blocks | index B/block | daemon RSS | RSS growth per block in step |
|---:|---:|---:|---:|
$IDX_ROWS
EOF
