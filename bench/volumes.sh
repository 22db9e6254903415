#!/usr/bin/env bash
# Block volumes over NBD (the mount daemon serving --nbd-socket), with fio's
# nbd engine (libnbd) as the client.
# (a) Bytes per write: a 1 GiB volume with 4 KiB blocks, filled first, then
#     4 KiB random writes for WRITE_SECS with a flush at the end (fio
#     end_fsync) and a commit (`cairn sync`): device bytes written per client
#     byte. "data" is the growth of the data device's allocated blocks (a
#     sparse file), "total" the daemon's /proc/PID/io write_bytes (data,
#     intent log and metadata). With and without a volume snapshot held, for
#     pool record sizes 64K (default) and 4K, writing as fast as the server
#     takes them; then, with 4K records, an A_SIZE (4G) volume written at
#     A_RATE (1000) writes/s for A_SECS (60): fewer writes per commit over
#     more metadata pages, so each write's metadata share is larger (and
#     grows with the history the run leaves, so these rows run longer).
# (b) The knfsd lesson: JOBS (64) concurrent clients, one connection each,
#     queue depth 1, of 4 KiB random I/O (50% reads, 50% writes) for
#     LOAD_SECS against a pool on an emulated slow disk (hdd: latency 2 ms,
#     200 MiB/s, one I/O at a time) with the NBD worker pool fixed at 8,
#     fixed at 128, and adaptive 2..128: ops/s, median and p99 latency of
#     reads and writes, and the pool's peak workers; medians of ROUNDS rounds
#     (interleaved, a fresh mount each). Reads wait for the disk; writes are
#     buffered, so they only wait for a free worker: few workers make the
#     writes queue behind reads stuck on the disk.
# (c) Latency at a given rate (the ddsnap seed's method) against raw
#     nbdkit file and qemu-nbd/qcow2, and snapshot-create time under writes:
#     bench/volumes_latency.sh, run last (LATENCY=0 skips it; its own
#     environment variables apply).
# Environment: ROUNDS=3 WRITE_SECS=10 LOAD_SECS=10 JOBS=64, NO_BUILD=1 (use
#   target/release/cairn as is), BIN, BENCH_DIR=/var/tmp, KEEP=1, LATENCY=1,
#   A_SIZE=4G A_RATE=1000 A_SECS=60 (the rate-limited rows of (a)).
# Needs root (mounts), fio with the nbd engine (`fio --enghelp=nbd`).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3}
WRITE_SECS=${WRITE_SECS:-10}
LOAD_SECS=${LOAD_SECS:-10}
JOBS=${JOBS:-64}
[ "$(id -u)" = 0 ] || die "run as root (mounts)"
command -v fio >/dev/null || die "fio is missing (scripts/deps.sh test)"
fio --enghelp=nbd >/dev/null 2>&1 || die "this fio has no nbd engine"
if [ -z "${BIN:-}" ]; then
    [ -n "${NO_BUILD:-}" ] || cargo build --release -q -p cairn-cli >&2
    BIN=$PWD/target/release/cairn
fi
W=$(mktemp -d "${BENCH_DIR:-/var/tmp}/cairn-volumes.XXXXXX")
SOCK=$W/nbd.sock
MNT=$W/mnt
cleanup() {
    if is_mounted "$MNT"; then "$BIN" umount "$MNT" >/dev/null 2>&1 || fusermount3 -u -z "$MNT"; fi
    [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$MNT"

uri() { echo "nbd+unix:///$1?socket=$SOCK"; }

# mount_pool ARGS...: mounts $W/pool serving NBD on $SOCK; sets DAEMON_PID.
mount_pool() {
    local out
    out=$("$BIN" mount "$W/pool" "$MNT" --nbd-socket "$SOCK" "$@")
    DAEMON_PID=$(sed -n 's/.*(pid \([0-9]*\),.*/\1/p' <<<"$out")
    [ -n "$DAEMON_PID" ] || die "no daemon pid in: $out"
}
umount_pool() { "$BIN" umount "$MNT" >/dev/null; }
new_pool() { # mkfs args...
    rm -rf "$W/pool" "$W"/dev-*
    "$BIN" mkfs "$W/pool" "$@" >/dev/null 2>&1 || die "mkfs $*"
}
write_bytes() { awk '/^write_bytes/ { print $2 }' "/proc/$DAEMON_PID/io"; }
alloc_bytes() { du -B1 "$1" | awk '{ print $1 }'; }
# fill VOL SIZE: sequential 1 MiB writes over the whole volume, flushed.
# Fresh random bytes in every write (fio reuses its buffers otherwise, and
# dedup would store a fraction of the blocks).
fill() {
    fio --name=fill --ioengine=nbd --uri="$(uri "$1")" --rw=write --bs=1M --size="$2" \
        --iodepth=8 --refill_buffers --end_fsync=1 --output=/dev/null
    "$BIN" sync "$MNT" >/dev/null
}
# json_get FILE EXPR: evaluates EXPR on the fio JSON (as j) with python3.
json_get() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }

# ---------------------------------------------------------------- (a)
bytes_per_write() { # RECORD SNAP(yes|no) SIZE RATE(0: unlimited) SECS: prints a table row
    local rec=$1 snap=$2 size=$3 rate=$4 secs=$5 dev="$W/dev-data.0" wb0 du0 wb1 du1 client
    new_pool --record-size "$rec" --device "ssd:$dev:12G" --sparse
    mount_pool
    "$BIN" volume create "$MNT" v "$size" --block-size 4K >/dev/null
    fill v "$size"
    [ "$snap" = no ] || "$BIN" volume snapshot "$MNT" v held >/dev/null
    "$BIN" sync "$MNT" >/dev/null
    wb0=$(write_bytes) du0=$(alloc_bytes "$dev")
    local limit=()
    [ "$rate" = 0 ] || limit=(--rate_iops="$rate")
    fio --name=rw --ioengine=nbd --uri="$(uri v)" --rw=randwrite --bs=4k --size="$size" \
        --refill_buffers --iodepth=16 "${limit[@]}" --time_based --runtime="$secs" --end_fsync=1 \
        --output-format=json --output="$W/a.json"
    "$BIN" sync "$MNT" >/dev/null
    wb1=$(write_bytes) du1=$(alloc_bytes "$dev")
    client=$(json_get "$W/a.json" 'j["jobs"][0]["write"]["io_bytes"]')
    umount_pool
    [ "$rate" != 0 ] || rate=max
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$size" "$rate" "$secs" "$rec" "$snap" \
        "$(div "$client" 1048576)" "$(div $((du1 - du0)) 1048576)" "$(div $((wb1 - wb0)) 1048576)" \
        "$(div $((du1 - du0)) "$client")" "$(div $((wb1 - wb0)) "$client")"
}

log "(a) bytes per 4 KiB random write"
echo "### (a) Device bytes per client byte: 4 KiB random writes to a filled volume (then flush + commit)"
echo
echo "| volume | writes/s | seconds | record size | snapshot held | client MiB | data device MiB | total written MiB (daemon) | data / client | total / client |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for rec in 64K 4K; do
    for snap in no yes; do bytes_per_write "$rec" "$snap" 1G 0 "$WRITE_SECS"; done
done
for snap in no yes; do bytes_per_write 4K "$snap" "${A_SIZE:-4G}" "${A_RATE:-1000}" "${A_SECS:-60}"; done
echo

# ---------------------------------------------------------------- (b)
CONFIGS="fixed-8:8:8 fixed-128:128:128 adaptive-2..128:2:128"
load_round() { # NAME MIN MAX ROUND: appends "ops rp50 rp99 wp50 wp99 peak" to $W/b-NAME
    local name=$1 min=$2 max=$3 n=$4 out="$W/b.json"
    mount_pool --nbd-workers-min "$min" --nbd-workers-max "$max"
    fio --name=c --ioengine=nbd --uri="$(uri v)" --rw=randrw --rwmixread=50 --bs=4k \
        --size=256M --numjobs="$JOBS" --iodepth=1 --time_based --runtime="$LOAD_SECS" \
        --group_reporting --output-format=json --output="$out"
    local peak
    peak=$("$BIN" info "$MNT" --json | python3 -c \
        'import json,sys; print(json.load(sys.stdin)["nbd"][0]["stats"]["pool"]["peak_workers"])')
    umount_pool
    json_get "$out" '"%.0f %.2f %.2f %.2f %.2f" % (j["jobs"][0]["read"]["iops"] + j["jobs"][0]["write"]["iops"], *[j["jobs"][0][d]["clat_ns"]["percentile"][q] / 1e6 for d in ("read", "write") for q in ("50.000000", "99.000000")])' |
        sed "s/\$/ $peak/" >>"$W/b-$name"
    log "  $name round $n: $(tail -1 "$W/b-$name")"
}

log "(b) $JOBS clients of 4 KiB random I/O on an emulated slow disk, $ROUNDS rounds"
new_pool --record-size 4K --device "hdd:$W/dev-slow.img:2G:latency=2ms:bw=200M" --sparse
mount_pool
"$BIN" volume create "$MNT" v 256M --block-size 4K >/dev/null
fill v 256M
umount_pool
for n in $(seq "$ROUNDS"); do
    for c in $CONFIGS; do
        IFS=: read -r name min max <<<"$c"
        load_round "$name" "$min" "$max" "$n"
    done
done
col() { median $(awk -v c="$2" '{ print $c }' "$W/b-$1"); }
echo "### (b) $JOBS clients, 4 KiB random 50% read / 50% write, emulated disk (2 ms, 200 MiB/s), median of $ROUNDS rounds of ${LOAD_SECS} s"
echo
echo "| NBD workers | ops/s | read p50 ms | read p99 ms | write p50 ms | write p99 ms | peak workers | ops/s vs fixed-8 |"
echo "|---|---|---|---|---|---|---|---|"
base=$(col fixed-8 1)
for c in $CONFIGS; do
    name=${c%%:*}
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$(col "$name" 1)" "$(col "$name" 2)" \
        "$(col "$name" 3)" "$(col "$name" 4)" "$(col "$name" 5)" "$(col "$name" 6)" "$(div "$(col "$name" 1)" "$base")"
done
if [ "${LATENCY:-1}" != 0 ]; then
    echo
    NO_BUILD=1 BIN=$BIN bash bench/volumes_latency.sh
fi
