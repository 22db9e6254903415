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
#  6. index memory after indexing INDEX_MB MiB of unique blocks: the bytes
#     of the dedup index's B-tree pages per unique block (the most RAM the
#     index takes, all of it cached), and the daemon's RSS growth for
#     context (it includes the write buffer and the whole metadata cache,
#     which meta_cache_mib bounds)
# Figures are medians where repeated; ratios are against baselines measured
# in this same run. Needs root (drop_caches), fuse3, python3, tar.
# Environment: FILES=8 FILE_MB=1024 INDEX_MB=4096 TAR_SRC=/usr/share
#   BENCH_DIR=/var/tmp KEEP=1
set -euo pipefail

FILES=${FILES:-8}
FILE_MB=${FILE_MB:-1024}
INDEX_MB=${INDEX_MB:-4096}
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

log "index memory: $INDEX_MB MiB of unique 64 KiB blocks"
pool idx
PID=$(pgrep -f "mount $W/idx" | head -1)
RSS0=$(awk '/VmRSS/ { print $2 }' /proc/"$PID"/status)
for i in $(seq 1 $(( (INDEX_MB + 1023) / 1024 ))); do
    head -c 1G /dev/urandom >"$MNT/i$i"
    "$BIN" sync "$MNT" >/dev/null
done
read -r ENTRIES INDEX_BYTES < <("$BIN" info "$MNT" --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
print(j["index_entries"], j["index_ram_bytes"])')
RSS1=$(awk '/VmRSS/ { print $2 }' /proc/"$PID"/status)
unmount

cat <<EOF

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
| index entries | $ENTRIES | |
| index pages (most RAM it can take) | $((INDEX_BYTES >> 10)) KiB | $(div "$INDEX_BYTES" "$ENTRIES") bytes per unique block (target <= 20) |
| daemon RSS empty / indexed | $((RSS0 >> 10)) / $((RSS1 >> 10)) MiB | $(div "$(( (RSS1 - RSS0) * 1024 ))" "$ENTRIES") bytes per block, all metadata + write buffer (bounded by config) |
EOF
