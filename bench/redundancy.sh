#!/usr/bin/env bash
# Redundancy benchmark (issue 51): what copies of data across devices cost
# and how fast a lost device is rebuilt, against baselines measured in the
# same run on backing files in the same host directory (BENCH_DIR):
#  1. sequential write: fio, WRITE_MB in 1 MiB psync writes of fresh random
#     bytes (fio's scrambled buffers), no preallocation (as dd), end_fsync,
#     from dropped caches, into a fresh pool / filesystem each time, on two
#     device files of WDEV_MB:
#       cairn copies=2    `mkfs --redundancy copies=2`, both device files
#       cairn copies=1    the same two device files with copies=1
#       btrfs raid1       `mkfs.btrfs -d raid1 -m raid1` on two loop devices
#                         over backing files of the same size
#     targets: copies=2 / copies=1 >= 0.9, copies=2 / btrfs raid1 >= 1.
#     All device files share one host disk, so copies=2 (and raid1) write
#     twice the bytes to the same disk: mostly seen in the final fsync.
#     The host's own ceiling for that ratio is measured in the same rounds:
#       host one          fio, WRITE_MB in 1 MiB O_DIRECT writes + fsync to
#                         one plain file in the work dir
#       host two          the same to two files at once (two fio jobs): its
#                         rate is WRITE_MB over the time both took
#     host two / host one is what any copies=2 can reach against copies=1
#     on this disk when the disk is the limit (no target: the evidence).
#  2. 4 KiB random reads: fio randread, psync, buffered (as bench/
#     foundation.sh: FUSE mounts need not take O_DIRECT), FIO_SECONDS per
#     run, over a READ_MB file of random bytes in a fresh copies=2 pool of two
#     devices, from cold (unmounted, page cache dropped, mounted):
#       healthy           both devices
#       degraded          one device file moved away (`mv d1 d1.gone`) while
#                         unmounted; the pool mounts read-write on its own
#                         (it logs DEGRADED); the lost copies stay in the
#                         records (for the device's return) and reads go
#                         to the online copy first
#     Odd rounds run healthy first, even rounds degraded first and then bring
#     the device back (the background re-replication makes the copies again,
#     waited for) before healthy. target: degraded / healthy >= 0.8.
#  3. rebuild of a lost device: a copies=2 pool of two RBDEV_MB devices
#     holding one RB_GIB GiB file, one device file moved away (and deleted);
#     mounted (degraded), the mount's re-replication pass waited for (see
#     the note below), caches dropped, then timed:
#       cairn             `cairn device replace MNT 1 ssd:NEW:RBDEV_MB`
#       dd                `dd if=SURVIVOR of=NEW bs=1M count=RB_GIB*1024
#                         conv=notrunc,fsync`: the same bytes between the same
#                         backing files (NEW a fresh preallocated file), the
#                         issue's "physical limit" (one stream of I/O: a copy
#                         with several I/Os in flight, as btrfs's, can beat
#                         it on a disk that serves them in parallel)
#       btrfs replace     btrfs raid1 of two RBDEV_MB loop devices holding the
#                         same file, one backing file deleted, mounted
#                         -o degraded, `btrfs replace start -B 2 NEWLOOP MNT`
#     targets: cairn / dd <= 1.3, cairn / btrfs <= 1. With VERIFY=1 Cairn's
#     rebuilt copy is then read alone (the surviving device moved away in
#     turn) and its md5 compared with the file's at write time; btrfs's file
#     is read with both devices (its new device cannot be mounted alone: the
#     chunks its degraded mount allocated are single, on the old device).
#     Note: the benchmark waits for the background pass a degraded mount
#     starts before running `device replace`, so that the time is the
#     replacement's alone (the two take turns: one run at a time).
#  4. erasure coding (ec=4+2): a pool of six device files of ECDEV_MB
#     (`mkfs --redundancy ec=4+2`) holding one EC_MB file written as in 1
#     (new segments keep three copies until `cairn redundancy rebuild`
#     gathers them into stripes of four with two parity members, then the
#     extra copies are freed):
#       space             the bytes of slots in use on all six devices
#                         (`tier status`) over the file's bytes, after the
#                         rebuild: target <= 1.55 (copies=2 takes 2)
#       sequential read   fio 1 MiB reads of the whole file, cold (mounted
#                         from dropped caches), healthy and with two of the
#                         six device files moved away (the pool mounts
#                         read-write on its own: parity covers two); rounds
#                         alternate the order. target: degraded / healthy
#                         >= 0.5
# Every figure is the median of ROUNDS interleaved rounds (each round runs
# every configuration of a measurement once, in an order that changes by
# round, so that a noisy stretch of a shared machine falls on all alike);
# each ratio is the median of the per-round ratios, PASS/MISS against its
# target. A MISS never fails the script; a failed step does (exit 1), and so
# does a panic in a Cairn pool's log (a bug: the log is kept in RESULT_DIR).
# Prints a markdown table and writes it to RESULT_DIR/report.md with the pools'
# logs in RESULT_DIR/logs.
# Needs root (losetup, mount, drop_caches), fuse3, fio, python3; installs
# btrfs-progs with apt-get when missing; btrfs in the kernel.
# Environment (defaults; QUICK=1 gives a ~3 minute run: WRITE_MB=512
# READ_MB=256 RB_GIB=1 FIO_SECONDS=5):
#   WRITE_MB=2048      size of the sequential write
#   READ_MB=1024       size of the random-read file
#   RB_GIB=4           GiB held by the pool that is rebuilt
#   ROUNDS=3           interleaved rounds (medians)
#   FIO_SECONDS=20     duration of each random-read run
#   EC_MB=1024         size of the erasure-coded file
#   STEPS="write read rebuild ec"  measurements to run
#   VERIFY=1           check the rebuilt copies' content (0 skips)
#   LOOP_DIO=1         btrfs loop devices with --direct-io=on (no second
#                      copy of their blocks in the host's page cache)
#   BENCH_DIR=/var/tmp where the work dir (device files) is made
#   RESULT_DIR=BENCH_DIR/cairn-redundancy-DATE  report and logs
#   PROFILE=release    cargo profile built and used (target/PROFILE/cairn)
#   NO_BUILD=1         use the binary as it is; BIN=/path/to/cairn overrides
#   KEEP=1             keep the work dir (mounts and loop devices are undone)
# Run: bench/redundancy.sh            (default sizes: 13 minutes on 2 cores)
#      QUICK=1 bench/redundancy.sh    (quick check)
set -euo pipefail

if [ -n "${QUICK:-}" ]; then
    WRITE_MB=${WRITE_MB:-512} READ_MB=${READ_MB:-256} RB_GIB=${RB_GIB:-1} EC_MB=${EC_MB:-256}
    FIO_SECONDS=${FIO_SECONDS:-5}
fi
WRITE_MB=${WRITE_MB:-2048}
READ_MB=${READ_MB:-1024}
RB_GIB=${RB_GIB:-4}
ROUNDS=${ROUNDS:-3}
FIO_SECONDS=${FIO_SECONDS:-20}
EC_MB=${EC_MB:-1024}
STEPS=${STEPS:-write read rebuild ec}
VERIFY=${VERIFY:-1}
LOOP_DIO=${LOOP_DIO:-1}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
RESULT_DIR=${RESULT_DIR:-$BENCH_DIR/cairn-redundancy-$(date +%Y%m%d-%H%M%S)}
PROFILE=${PROFILE:-release}
# Device sizes: twice the data plus 1 GiB. btrfs needs room beyond its
# data: `btrfs replace` on a degraded mount allocates chunks on the
# surviving device, and fails with ENOSPC when it is full of chunks.
WDEV_MB=$((WRITE_MB * 2 + 1024))
RDDEV_MB=$((READ_MB * 2 + 1024))
RBDEV_MB=$((RB_GIB * 1024 * 2 + 1024))
# Three copies of the file over six devices before it is striped.
ECDEV_MB=$((EC_MB / 2 + 256))

ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"
declare -A RES # RES[key] = space-separated per-round values
declare -A NOTE

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"

# ------------------------------------------------------------------ setup

check_tools() {
    [ "$(id -u)" = 0 ] || die "run as root (losetup, mount, drop_caches)"
    install_missing mkfs.btrfs:btrfs-progs
    local t
    for t in fio fusermount3 python3 losetup mkfs.btrfs btrfs dd md5sum fallocate awk; do
        command -v "$t" >/dev/null || die "$t not installed"
    done
    grep -qw btrfs /proc/filesystems || modprobe btrfs 2>/dev/null || die "no btrfs in this kernel"
}


setup_dirs() {
    local need avail
    need=$(((2 * (RBDEV_MB > WDEV_MB ? RBDEV_MB : WDEV_MB) + 2048) << 20))
    avail=$(df --output=avail -B1 "$BENCH_DIR" | tail -1)
    [ "$avail" -ge "$need" ] ||
        die "$BENCH_DIR has $((avail >> 20)) MiB free, this run needs about $((need >> 20)) MiB (lower RB_GIB, WRITE_MB)"
    W=$(mktemp -d "$BENCH_DIR/cairn-redundancy.XXXXXX")
    DEV=$W/dev POOL=$W/pool MNT=$W/mnt BT=$W/bt
    mkdir -p "$DEV" "$MNT" "$BT" "$RESULT_DIR/logs"
    log "work dir $W on $(findmnt -n -o SOURCE,FSTYPE -T "$W" | tr -s ' '); report in $RESULT_DIR"
}

cleanup() {
    set +eu
    [ -n "${W:-}" ] || return 0
    if is_mounted "$MNT"; then
        cp "$POOL/cairn.log" "$RESULT_DIR/logs/at-exit.log" 2>/dev/null
        "$BIN" umount "$MNT" >/dev/null 2>&1 || fusermount3 -u -z "$MNT"
    fi
    if is_mounted "$BT"; then umount "$BT" 2>/dev/null || umount -l "$BT"; fi
    detach_loops
    btrfs device scan --forget >/dev/null 2>&1
    if [ -z "${KEEP:-}" ]; then rm -rf --one-file-system "$W"; else log "kept $W"; fi
}

# ------------------------------------------------------------ cairn pools

# The pool's log, kept in RESULT_DIR/logs/LABEL.log; stops the script if a
# thread of the pool panicked (a bug).
save_log() {
    [ -f "$POOL/cairn.log" ] || return 0
    cp "$POOL/cairn.log" "$RESULT_DIR/logs/$1.log"
    if grep -q 'panicked' "$POOL/cairn.log"; then
        grep -A2 'panicked' "$POOL/cairn.log" >&2
        die "Cairn bug: a thread panicked during $1 (log: $RESULT_DIR/logs/$1.log)"
    fi
}

# new_pool COPIES DEV_MB: a fresh pool with redundancy copies=COPIES on two
# fresh device files d0, d1 of DEV_MB (blocks allocated), mounted.
new_pool() {
    destroy_pool
    quiet "$BIN" mkfs "$POOL" --redundancy "copies=$1" \
        --device "ssd:$DEV/d0:$2M" --device "ssd:$DEV/d1:$2M"
    quiet "$BIN" mount "$POOL" "$MNT"
}

mount_pool() { quiet "$BIN" mount "$POOL" "$MNT"; }
umount_pool() { quiet "$BIN" umount "$MNT"; }

# destroy_pool [LABEL]: unmounts, keeps the log (as LABEL), removes the pool
# and every device file and metadata mirror in DEV.
destroy_pool() {
    if is_mounted "$MNT"; then umount_pool; fi
    [ -z "${1:-}" ] || save_log "$1"
    rm -rf "$POOL"
    find "$DEV" -mindepth 1 -maxdepth 1 \( -name 'd*' -o -name 'cairn-meta-mirror-*' \) -exec rm -f {} +
}

# redundancy EXPR: a Python expression on j, the mount's `redundancy show
# --json`, evaluated and printed.
redundancy() {
    "$BIN" redundancy show "$MNT" --json |
        python3 -c "import json, sys; j = json.load(sys.stdin); print($1)"
}

# wait_until EXPR WHAT: polls `redundancy` until EXPR is True (60 s at most).
wait_until() {
    local _
    for _ in $(seq 120); do
        [ "$(redundancy "$1")" != True ] || return 0
        sleep 0.5
    done
    redundancy 'json.dumps(j)' >&2
    die "after 60 s still not $2 (redundancy show above)"
}
# The background re-replication leaves a missing device's copies in the
# records for its return (only `device replace` and `redundancy rebuild`
# drop them): a degraded pool is one with a device missing.
DEVICE_MISSING='any(d["state"] == "missing" for d in j["devices"])'
ALL_COPIES='j["short_segments"] == 0 and j["lost_segments"] == 0 and all(d["state"] == "online" for d in j["devices"])'

# ------------------------------------------------------------ btrfs

# attach FILE: a loop device over FILE (in LOOP_DEV).
attach() {
    local dio=()
    [ "$LOOP_DIO" != 1 ] || dio=(--direct-io=on)
    LOOP_DEV=$(losetup --find --show "${dio[@]}" "$1")
}

# Detaches every loop device whose backing file is in the work dir.
detach_loops() {
    local d
    for d in $(losetup --list --noheadings --raw -O NAME,BACK-FILE 2>/dev/null |
        awk -v w="$W/" 'index($2, w) == 1 { print $1 }'); do
        losetup -d "$d" 2>/dev/null
    done
}

# new_btrfs DEV_MB: btrfs raid1 (data and metadata) over two loop devices
# over fresh preallocated backing files b0, b1 of DEV_MB, mounted on BT.
new_btrfs() {
    destroy_btrfs
    fallocate -l "$1M" "$DEV/b0"
    fallocate -l "$1M" "$DEV/b1"
    attach "$DEV/b0"
    BT0=$LOOP_DEV
    attach "$DEV/b1"
    BT1=$LOOP_DEV
    quiet mkfs.btrfs -q -f -d raid1 -m raid1 "$BT0" "$BT1"
    mount "$BT0" "$BT"
}

destroy_btrfs() {
    if is_mounted "$BT"; then umount "$BT"; fi
    detach_loops
    btrfs device scan --forget >/dev/null 2>&1 || true
    rm -f "$DEV"/b?
}

# ------------------------------------------------------- measurements

# fio_write FILE MB: sequential 1 MiB writes of fresh random bytes, fsync at
# the end, as dd would (no fallocate first: on btrfs, fio's default
# preallocation makes the writes allocate the space twice, 7 GiB of chunks
# for a 4 GiB file, and its degraded replace then fails with ENOSPC); prints
# the seconds.
fio_write() {
    local t0
    t0=$(now)
    fio --name=seqw --filename="$1" --rw=write --bs=1M --size="$2M" --fallocate=none \
        --ioengine=psync --direct=0 --end_fsync=1 --output=/dev/null
    elapsed "$t0"
}

# host_write N: WRITE_MB to each of N plain files at once, O_DIRECT;
# prints the rate of one file's bytes (MB/s).
host_write() {
    local t0 s jobs=() i
    for i in $(seq "$1"); do jobs+=(--name="h$i" --filename="$W/host$i"); done
    rm -f "$W"/host?
    drop_caches
    t0=$(now)
    fio --rw=write --bs=1M --size="${WRITE_MB}M" --direct=1 --ioengine=psync \
        --end_fsync=1 --output=/dev/null "${jobs[@]}"
    s=$(elapsed "$t0")
    rm -f "$W"/host?
    div "$WRITE_MB" "$s"
}

# One sequential write into a fresh pool or filesystem (or, h1 and h2,
# plain files: host_write): prints MB/s.
write_one() {
    local dir s
    case $1 in
        h1) host_write 1 && return ;;
        h2) host_write 2 && return ;;
        c2) new_pool 2 "$WDEV_MB" && dir=$MNT ;;
        c1) new_pool 1 "$WDEV_MB" && dir=$MNT ;;
        btrfs) new_btrfs "$WDEV_MB" && dir=$BT ;;
    esac
    drop_caches
    s=$(fio_write "$dir/seq" "$WRITE_MB")
    if [ "$1" = btrfs ]; then destroy_btrfs; else destroy_pool "write-$1-r$R"; fi
    div "$WRITE_MB" "$s"
}

bench_write() {
    local order t v
    for R in $(seq "$ROUNDS"); do
        case $((R % 3)) in
            1) order="c2 c1 btrfs h1 h2" ;;
            2) order="c1 btrfs c2 h2 h1" ;;
            0) order="btrfs c2 c1 h1 h2" ;;
        esac
        for t in $order; do
            v=$(write_one "$t")
            add "write_$t" "$v"
            log "write round $R: $t $v MB/s"
        done
        add write_ratio_c1 "$(div "$(latest write_c2)" "$(latest write_c1)")"
        add write_ratio_btrfs "$(div "$(latest write_c2)" "$(latest write_btrfs)")"
        add write_ratio_host "$(div "$(latest write_h2)" "$(latest write_h1)")"
    done
}

# randread MODE: cold 4 KiB random reads of the pool's file; prints IOPS.
randread() {
    if is_mounted "$MNT"; then umount_pool; fi
    drop_caches
    mount_pool
    if [ "$1" = degraded ]; then
        wait_until "$DEVICE_MISSING" "degraded (a device missing)"
        grep -q DEGRADED "$POOL/cairn.log" || die "the degraded mount logged no DEGRADED"
    else
        wait_until "$ALL_COPIES" "healthy (every copy made)"
    fi
    fio --name=randread --filename="$MNT/rr" --size="${READ_MB}M" --rw=randread --bs=4k \
        --ioengine=psync --direct=0 --time_based --runtime="$FIO_SECONDS" \
        --output-format=json --output="$W/fio.json" >/dev/null
    python3 -c 'import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
if job["error"]:
    sys.exit("fio error %d" % job["error"])
print(round(job["read"]["iops"]))' "$W/fio.json"
}

bench_read() {
    local v mode order
    for R in $(seq "$ROUNDS"); do
        new_pool 2 "$RDDEV_MB"
        fio_write "$MNT/rr" "$READ_MB" >/dev/null
        order="healthy degraded"
        [ $((R % 2)) = 1 ] || order="degraded healthy"
        for mode in $order; do
            if [ "$mode" = degraded ]; then
                umount_pool
                mv "$DEV/d1" "$DEV/d1.gone"
            elif [ -e "$DEV/d1.gone" ]; then
                # back from degraded: the device returns, its copies are
                # made again in the background (waited for by randread)
                umount_pool
                mv "$DEV/d1.gone" "$DEV/d1"
                mount_pool
            fi
            v=$(randread "$mode")
            add "read_$mode" "$v"
            log "random read round $R: $mode $v IOPS ($(redundancy '"%d segments, %d short" % (j["segments"], j["short_segments"])'))"
        done
        destroy_pool "read-r$R"
        add read_ratio "$(div "$(latest read_degraded)" "$(latest read_healthy)")"
    done
}

# md5 FILE
md5() { md5sum <"$1" | cut -d' ' -f1; }

# The cairn pool of the rebuild round: RB_GIB GiB file, device 1 lost.
rebuild_setup_cairn() {
    new_pool 2 "$RBDEV_MB"
    fio_write "$MNT/f" $((RB_GIB * 1024)) >/dev/null
    [ "$VERIFY" != 1 ] || SUM=$(md5 "$MNT/f")
    umount_pool
    mv "$DEV/d1" "$DEV/d1.gone" # the device is lost ...
    rm "$DEV/d1.gone"           # ... for good (and its space is free)
}

rebuild_cairn() {
    local t0 t out
    drop_caches
    mount_pool
    wait_until "$DEVICE_MISSING" "degraded (a device missing)"
    drop_caches
    t0=$(now)
    out=$("$BIN" device replace "$MNT" 1 "ssd:$DEV/d2:${RBDEV_MB}M" --json 2>"$W/err") || {
        log "cairn device replace failed"
        cat "$W/err" >&2
        exit 1
    }
    t=$(elapsed "$t0")
    add rb_cairn "$t"
    NOTE[rb_cairn_bytes]=$(python3 -c 'import json, sys; r = json.loads(sys.argv[1])
print("%d segments, %.1f MiB" % (r["segments"], r["bytes"] / 1048576))' "$out")
    log "rebuild round $R: cairn device replace ${t}s (${NOTE[rb_cairn_bytes]})"
    [ "$(redundancy "$ALL_COPIES")" = True ] || {
        redundancy 'json.dumps(j)' >&2
        die "after device replace the pool is not healthy"
    }
    umount_pool
    if [ "$VERIFY" = 1 ]; then
        # read the rebuilt copy alone: the survivor goes away in turn
        mv "$DEV/d0" "$DEV/d0.away"
        drop_caches
        mount_pool
        [ "$(md5 "$MNT/f")" = "$SUM" ] || die "the rebuilt copy of the file differs from what was written"
        [ "$(redundancy 'j["lost_segments"]')" = 0 ] || die "the rebuilt device lacks segments"
        umount_pool
        mv "$DEV/d0.away" "$DEV/d0"
        log "rebuild round $R: the rebuilt copy read alone matches (md5)"
    fi
    save_log "rebuild-cairn-r$R"
    rm -f "$DEV/d2"
}

# dd of the same bytes from the surviving device file to a fresh
# preallocated file where the new device goes.
rebuild_dd() {
    local t0 t
    rm -f "$DEV/d2"
    fallocate -l "${RBDEV_MB}M" "$DEV/d2"
    drop_caches
    t0=$(now)
    dd if="$DEV/d0" of="$DEV/d2" bs=1M count=$((RB_GIB * 1024)) conv=notrunc,fsync status=none
    t=$(elapsed "$t0")
    add rb_dd "$t"
    log "rebuild round $R: dd ${t}s"
    rm -f "$DEV/d2"
}

rebuild_btrfs() {
    local t0 t sum=""
    new_btrfs "$RBDEV_MB"
    fio_write "$BT/f" $((RB_GIB * 1024)) >/dev/null
    [ "$VERIFY" != 1 ] || sum=$(md5 "$BT/f")
    umount "$BT"
    losetup -d "$BT1" # the device is lost (devid 2: the second of mkfs)
    rm "$DEV/b1"
    btrfs device scan --forget >/dev/null 2>&1 || true
    mount -o degraded "$BT0" "$BT"
    fallocate -l "${RBDEV_MB}M" "$DEV/b2"
    attach "$DEV/b2"
    drop_caches
    t0=$(now)
    quiet btrfs replace start -B 2 "$LOOP_DEV" "$BT"
    t=$(elapsed "$t0")
    add rb_btrfs "$t"
    NOTE[rb_btrfs_used]=$(btrfs filesystem show --raw "$BT" | awk '$1 == "devid" && $2 == 2 { printf "%.1f MiB", $6 / 1048576 }')
    log "rebuild round $R: btrfs replace ${t}s (${NOTE[rb_btrfs_used]} allocated on the new device)"
    umount "$BT"
    if [ "$VERIFY" = 1 ]; then
        # Both devices: the new one cannot be read alone, as what the
        # degraded mount allocated (single chunks) is on the old one only.
        drop_caches
        quiet btrfs device scan "$BT0" "$LOOP_DEV"
        mount -o ro "$BT0" "$BT"
        [ "$(md5 "$BT/f")" = "$sum" ] || die "btrfs: the file differs after the replace"
        umount "$BT"
    fi
    destroy_btrfs
}

bench_rebuild() {
    local group
    for R in $(seq "$ROUNDS"); do
        for group in $([ $((R % 2)) = 1 ] && echo "cairn btrfs" || echo "btrfs cairn"); do
            if [ "$group" = btrfs ]; then
                rebuild_btrfs
                continue
            fi
            rebuild_setup_cairn
            if [ $((R % 2)) = 1 ]; then
                rebuild_dd
                rebuild_cairn
            else
                rebuild_cairn
                rebuild_dd
            fi
            destroy_pool
        done
        add rb_ratio_dd "$(div "$(latest rb_cairn)" "$(latest rb_dd)")"
        add rb_ratio_btrfs "$(div "$(latest rb_cairn)" "$(latest rb_btrfs)")"
    done
}

# new_ec_pool: a fresh ec=4+2 pool on six device files e0..e5 of ECDEV_MB,
# mounted.
new_ec_pool() {
    local devs=() i
    destroy_pool
    rm -f "$DEV"/e?
    for i in 0 1 2 3 4 5; do devs+=(--device "ssd:$DEV/e$i:${ECDEV_MB}M"); done
    quiet "$BIN" mkfs "$POOL" --redundancy ec=4+2 "${devs[@]}"
    mount_pool
}

# seqread MODE: cold sequential 1 MiB reads of the whole ec file; prints
# MB/s. MODE degraded moves e1 and e4 away first (and back after).
seqread() {
    local t0 s
    if is_mounted "$MNT"; then umount_pool; fi
    [ "$1" != degraded ] || mv "$DEV/e1" "$DEV/e1.gone"
    [ "$1" != degraded ] || mv "$DEV/e4" "$DEV/e4.gone"
    drop_caches
    mount_pool
    if [ "$1" = degraded ]; then
        wait_until "$DEVICE_MISSING" "degraded (devices missing)"
        grep -q DEGRADED "$POOL/cairn.log" || die "the degraded mount logged no DEGRADED"
    fi
    t0=$(now)
    fio --name=seqr --filename="$MNT/ec" --rw=read --bs=1M --size="${EC_MB}M" \
        --ioengine=psync --direct=0 --output=/dev/null
    s=$(elapsed "$t0")
    if [ "$1" = degraded ]; then
        [ "$(redundancy 'j["restored_from_parity"] > 0')" = True ] || die "the degraded read restored nothing from parity"
        umount_pool
        mv "$DEV/e1.gone" "$DEV/e1"
        mv "$DEV/e4.gone" "$DEV/e4"
    fi
    div "$EC_MB" "$s"
}

bench_ec() {
    local mode order v
    new_ec_pool
    fio_write "$MNT/ec" "$EC_MB" >/dev/null
    [ "$VERIFY" != 1 ] || SUM=$(md5 "$MNT/ec")
    quiet "$BIN" redundancy rebuild "$MNT"
    local used
    used=$("$BIN" tier status "$MNT" --json | python3 -c 'import json, sys
print(sum(d["used"] for d in json.load(sys.stdin)))')
    add ec_space "$(awk -v u="$used" -v b=$((EC_MB * 1048576)) 'BEGIN { printf "%.3f", u / b }')"
    NOTE[ec_stripes]=$(redundancy '"%d stripes, %d segments striped, %d waiting" % (j["stripes"], j["striped_segments"], j["waiting_for_stripe"])')
    log "ec: $(latest ec_space) bytes used per byte stored (${NOTE[ec_stripes]})"
    for R in $(seq "$ROUNDS"); do
        order="healthy degraded"
        [ $((R % 2)) = 1 ] || order="degraded healthy"
        for mode in $order; do
            v=$(seqread "$mode")
            add "ec_read_$mode" "$v"
            log "ec sequential read round $R: $mode $v MB/s"
        done
        add ec_read_ratio "$(div "$(latest ec_read_degraded)" "$(latest ec_read_healthy)")"
    done
    if [ "$VERIFY" = 1 ]; then
        if is_mounted "$MNT"; then umount_pool; fi
        mv "$DEV/e0" "$DEV/e0.gone"
        mv "$DEV/e5" "$DEV/e5.gone"
        drop_caches
        mount_pool
        [ "$(md5 "$MNT/ec")" = "$SUM" ] || die "ec: the file read with two devices lost differs"
        umount_pool
        mv "$DEV/e0.gone" "$DEV/e0"
        mv "$DEV/e5.gone" "$DEV/e5"
        log "ec: the file read with devices 0 and 5 lost matches (md5)"
    fi
    destroy_pool "ec"
    rm -f "$DEV"/e?
}

# ------------------------------------------------------------- report

sec() { awk -v v="$(med "$1")" 'BEGIN { if (v == "n/a") print v; else printf "%.2f s", v }'; }

print_table() {
    echo "## Cairn redundancy benchmark (issue 51)"
    echo
    echo "Cairn $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') ($PROFILE), $(nproc) cores," \
        "$(uname -r), device and backing files on $(findmnt -n -o SOURCE,FSTYPE -T "$W" | tr -s ' ')" \
        "in one directory; btrfs-progs $(btrfs --version | awk '{print $2}'), loop devices" \
        "$([ "$LOOP_DIO" = 1 ] && echo "with direct I/O" || echo buffered). Medians of ROUNDS=$ROUNDS" \
        "interleaved rounds; ratios are medians of the per-round ratios."
    echo
    echo "| measurement | cairn | baseline | ratio | target | result |"
    echo "|---|---:|---:|---:|---|---|"
    local row key label c b op target v
    for row in \
        "write_ratio_c1|sequential write ${WRITE_MB} MiB + fsync (MB/s): copies=2 vs copies=1, same two devices|$(med write_c2)|$(med write_c1)|>=|0.9" \
        "write_ratio_btrfs|sequential write ${WRITE_MB} MiB + fsync (MB/s): copies=2 vs btrfs raid1 (2 loop devices)|$(med write_c2)|$(med write_btrfs)|>=|1" \
        "write_ratio_host|the host disk's ceiling for the first row: two files written at once vs one (O_DIRECT, MB/s of one file)|$(med write_h2)|$(med write_h1)|none|-" \
        "read_ratio|4 KiB random read, ${READ_MB} MiB file, cold, ${FIO_SECONDS} s (IOPS): one of two devices missing vs healthy (copies=2)|$(med read_degraded)|$(med read_healthy)|>=|0.8" \
        "rb_ratio_dd|rebuild ${RB_GIB} GiB (s): cairn device replace vs dd of the same bytes between the same files|$(sec rb_cairn)|$(sec rb_dd)|<=|1.3" \
        "rb_ratio_btrfs|rebuild ${RB_GIB} GiB (s): cairn device replace vs btrfs replace start -B (raid1)|$(sec rb_cairn)|$(sec rb_btrfs)|<=|1"; do
        IFS='|' read -r key label c b op target <<<"$row"
        v=$(med "$key")
        if [ "$op" = none ]; then
            echo "| $label | $c | $b | $v | - | (ceiling) |"
            continue
        fi
        echo "| $label | $c | $b | $v | $op $target | $(verdict "$v" "$op" "$target") |"
    done
    v=$(med ec_space)
    echo "| ec=4+2 on six devices: bytes used per byte stored (${EC_MB} MiB file, after the rebuild) | $v | 2 (copies=2) | $v | <= 1.55 | $(verdict "$v" "<=" 1.55) |"
    v=$(med ec_read_ratio)
    echo "| sequential read, ${EC_MB} MiB, cold (MB/s): ec=4+2 with two of six devices lost vs healthy | $(med ec_read_degraded) | $(med ec_read_healthy) | $v | >= 0.5 | $(verdict "$v" ">=" 0.5) |"
    echo
    echo "Per round:"
    echo
    echo "- write MB/s: copies=2${RES[write_c2]:-}; copies=1${RES[write_c1]:-}; btrfs raid1${RES[write_btrfs]:-};" \
        "ratios vs copies=1${RES[write_ratio_c1]:-}, vs btrfs${RES[write_ratio_btrfs]:-};" \
        "host disk one file${RES[write_h1]:-}, two at once${RES[write_h2]:-}, ratios${RES[write_ratio_host]:-}"
    echo "- random read IOPS: degraded${RES[read_degraded]:-}; healthy${RES[read_healthy]:-}; ratios${RES[read_ratio]:-}"
    echo "- rebuild s: cairn${RES[rb_cairn]:-}; dd${RES[rb_dd]:-}; btrfs${RES[rb_btrfs]:-};" \
        "ratios vs dd${RES[rb_ratio_dd]:-}, vs btrfs${RES[rb_ratio_btrfs]:-}"
    echo "- ec=4+2 sequential read MB/s: degraded${RES[ec_read_degraded]:-}; healthy${RES[ec_read_healthy]:-}; ratios${RES[ec_read_ratio]:-}"
    echo
    echo "Device files: write ${WDEV_MB} MiB, random read ${RDDEV_MB} MiB, rebuild ${RBDEV_MB} MiB each." \
        "Rebuild copied (last round): cairn ${NOTE[rb_cairn_bytes]:-n/a}; btrfs ${NOTE[rb_btrfs_used]:-n/a}" \
        "allocated on the new device. Rebuilt data verified (md5 of the file; Cairn's new device read alone," \
        "btrfs's with both): $([ "$VERIFY" = 1 ] && echo yes || echo no)."
    [ -z "${NOTE[ec_stripes]:-}" ] || echo "ec=4+2 after the rebuild: ${NOTE[ec_stripes]}; device files ${ECDEV_MB} MiB each."
    echo "Wall time $(awk -v t="$(elapsed "$T_START")" 'BEGIN { printf "%.0f", t }') s."
}

main() {
    T_START=$(now)
    check_tools
    build_cairn
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    # A failing step names itself (set -E: also inside functions).
    set -E
    trap 'log "step failed (exit $?) at line $LINENO: $BASH_COMMAND"' ERR
    setup_dirs
    local step
    for step in $STEPS; do
        case $step in
            write | read | rebuild | ec) "bench_$step" ;;
            *) die "unknown step $step (write, read, rebuild, ec)" ;;
        esac
    done
    print_table | tee "$RESULT_DIR/report.md"
}

main "$@"
