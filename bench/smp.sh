#!/usr/bin/env bash
# SMP / mixed-load benchmark (the HAMMER SMP seed's workloads): Cairn vs the
# native directory, bindfs (a FUSE passthrough of a plain directory) and btrfs
# (on a loop device backed by a sparse file), all on the same disk, in one run.
# Workloads (STEPS), each run RUNS rounds, every round on a fresh directory,
# the targets interleaved within a round (native, bindfs, btrfs, cairn, native,
# ...) so that a slow phase of a shared disk hits every target alike:
#   blogbench  bench/blogbench/blogbench.c (an equivalent of Blogbench, which
#              Debian does not ship; compiled at run time with cc -O2 -pthread):
#              BB_WRITERS threads creating blogs (article 1-64 KiB + 1-5
#              pictures 4-200 KiB), BB_REWRITERS replacing articles (new file
#              renamed over), BB_COMMENTERS appending 1-4 KiB, BB_READERS
#              reading whole random files; BB_ITERATIONS iterations of
#              BB_SECONDS; read and write scores are files per iteration,
#              median over iterations and rounds; for a FUSE target, the CPU
#              its server used per round (read from /proc; time the readers
#              did not get)
#   dbench     file-server mix: dbench DBENCH_CLIENTS clients, the client.txt
#              load file of the Debian package, DBENCH_SECONDS; MB/s
#   postmark   mail-server mix: PM_FILES files of 500-10000 bytes in
#              PM_SUBDIRS subdirectories, PM_TRANSACTIONS transactions;
#              transactions/s (the transaction phase timed by this script:
#              postmark itself only counts whole seconds)
#   sqlite     python3 sqlite3, journal_mode=WAL, synchronous=FULL, one
#              ~200-byte insert per transaction for SQLITE_SECONDS; commits/s
#   fio        4 KiB random write into an existing FIO_MB file (written
#              sequentially, synced, caches dropped first), psync, buffered,
#              end_fsync, FIO_SECONDS; then 4 KiB random read of that file from
#              cold caches (drop_caches; FUSE targets and btrfs remounted);
#              IOPS
#   seq        sequential write of a SEQ_MB file of fresh random bytes in 1 MiB
#              writes (fio, psync, buffered, no preallocation) with an fsync at
#              the end, timed to the end of the fsync; then, from cold caches
#              (drop_caches; FUSE targets and btrfs remounted), a sequential
#              read of it in 1 MiB reads; MB/s each
#   untar      extract a tar of UNTAR_FILES files of 0-UNTAR_MAX_KB KiB in
#              nested directories (generated deterministically once per run)
#              with a Python tool timing each open(O_CREAT)+write+close;
#              files/s and p50/p99/max latency in ms (no final sync)
# Each workload prints a table as soon as it is done (figure per target, ratio
# cairn/target); a summary table of every figure closes the run.
#
# Needs root (drop_caches, loop device, mounts). Missing tools (dbench,
# postmark, sqlite3, fio, bindfs, btrfs-progs, python3, gcc, fuse3) are
# installed with apt-get.
# Environment (defaults):
#   TARGETS="native bindfs btrfs cairn"  targets to measure (cairn is needed
#                    for the ratio columns); BASE_BIN=/path/to/older/cairn adds
#                    the target "base": that binary on a pool of its own, in
#                    the same rounds, with a cairn/base ratio; the target
#                    "memfs" is the in-memory FUSE file system of
#                    crates/fuse/examples/memfs.rs (Cairn's mount options,
#                    INIT and transport, handlers that cost next to
#                    nothing): what any FUSE file system could reach;
#                    "memfsdisk" is that memfs also writing each write's
#                    bytes to a file in the work dir, synced each second
#                    (no index, no checksum): what a FUSE file system that
#                    keeps its data on disk could reach at best
#   STEPS="blogbench dbench postmark sqlite fio untar"
#   RUNS=3
#   BB_WRITERS=3 BB_REWRITERS=1 BB_COMMENTERS=2 BB_READERS=8
#   BB_ITERATIONS=5 BB_SECONDS=6 BB_MAX_BLOGS=2000 (then writers recycle blogs)
#   BB_WRITE_RATE=0  files per second the writing threads write at most
#                    together (0: as fast as they can); below the slowest
#                    target's write score per second, every target works
#                    under the same write load and the read scores compare
#   DBENCH_CLIENTS=4 DBENCH_SECONDS=20
#   PM_FILES=5000 PM_TRANSACTIONS=20000 PM_SUBDIRS=10
#   SQLITE_SECONDS=6
#   FIO_MB=1024 FIO_SECONDS=5
#   SEQ_MB=4096 (the seq step, not in the default STEPS)
#   UNTAR_FILES=30000 UNTAR_MAX_KB=16
#   BTRFS_GB=8       size of the btrfs loop file (sparse)
#   POOL_DEV_GB=16   size of each cairn pool's device (sparse)
#   MIN_FREE_GB=...  free space required in BENCH_DIR (default: a budget
#                    from the targets and sizes above)
#   BENCH_DIR=/var/tmp  where the work dir is made (pick the disk to test)
#   BIN=...          the cairn binary (default: cargo build --release)
#   MEMFS=...        the memfs binary (default: cargo build --release
#                    --example memfs -p cairn-fuse, when a target)
#   CAIRN_MOUNT_OPTS="--commit-interval 5"  extra options for `cairn mount`
#   KEEP=1           keep the work dir
# The defaults took 26 minutes on a 2-core VM with the four targets (blogbench
# 7, dbench 6, fio 8, postmark 3, sqlite 1.5, untar 1.5); for a run of about
# 15 minutes: DBENCH_SECONDS=10 BB_ITERATIONS=3 FIO_MB=512, or fewer TARGETS.
# Quick run: RUNS=1 BB_ITERATIONS=2 BB_SECONDS=3 DBENCH_SECONDS=5
#   PM_FILES=1000 PM_TRANSACTIONS=4000 SQLITE_SECONDS=3 FIO_MB=256
#   FIO_SECONDS=3 UNTAR_FILES=5000 bench/smp.sh
set -euo pipefail
shopt -s inherit_errexit

RUNS=${RUNS:-3}
read -r -a TARGETS <<<"${TARGETS:-native bindfs btrfs cairn}"
[ -n "${BASE_BIN:-}" ] && [[ " ${TARGETS[*]} " != *" base "* ]] && TARGETS+=(base)
STEPS=${STEPS:-blogbench dbench postmark sqlite fio untar}
BB_WRITERS=${BB_WRITERS:-3}
BB_REWRITERS=${BB_REWRITERS:-1}
BB_COMMENTERS=${BB_COMMENTERS:-2}
BB_READERS=${BB_READERS:-8}
BB_ITERATIONS=${BB_ITERATIONS:-5}
BB_SECONDS=${BB_SECONDS:-6}
BB_MAX_BLOGS=${BB_MAX_BLOGS:-2000}
BB_WRITE_RATE=${BB_WRITE_RATE:-0}
DBENCH_CLIENTS=${DBENCH_CLIENTS:-4}
DBENCH_SECONDS=${DBENCH_SECONDS:-20}
PM_FILES=${PM_FILES:-5000}
PM_TRANSACTIONS=${PM_TRANSACTIONS:-20000}
PM_SUBDIRS=${PM_SUBDIRS:-10}
SQLITE_SECONDS=${SQLITE_SECONDS:-6}
FIO_MB=${FIO_MB:-1024}
FIO_SECONDS=${FIO_SECONDS:-5}
SEQ_MB=${SEQ_MB:-4096}
UNTAR_FILES=${UNTAR_FILES:-30000}
UNTAR_MAX_KB=${UNTAR_MAX_KB:-16}
BTRFS_GB=${BTRFS_GB:-8}
POOL_DEV_GB=${POOL_DEV_GB:-16}
BENCH_DIR=${BENCH_DIR:-/var/tmp}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"
# RES[key,target]: median figure; METRICS: "key|label|better" in print order
declare -A RES
METRICS=()
LOOP=""

. "$(dirname "$0")/lib.sh"

has_target() { [[ " ${TARGETS[*]} " == *" $1 "* ]]; }

# ------------------------------------------------------------------ setup

# Installs the Debian packages of the missing tools.
ensure_tools() {
    install_missing dbench:dbench postmark:postmark sqlite3:sqlite3 fio:fio bindfs:bindfs \
        mkfs.btrfs:btrfs-progs python3:python3 cc:gcc fusermount3:fuse3 losetup:mount
    python3 -c 'import sqlite3' || die "python3 has no sqlite3 module"
}

check_env() {
    [ "$(id -u)" = 0 ] || die "run as root (drop_caches, loop device, mounts)"
    has_target cairn || die "TARGETS must include cairn (the ratios are cairn/target)"
    local t
    for t in "${TARGETS[@]}"; do
        case $t in native | bindfs | btrfs | memfs | memfsdisk | cairn | base) ;; *) die "unknown target $t" ;; esac
    done
    local need=${MIN_FREE_GB:-} avail
    if [ -z "$need" ]; then
        need=2 # the tarball and slack
        for t in "${TARGETS[@]}"; do
            case $t in
                native | bindfs) need=$((need + FIO_MB / 1024 + SEQ_MB / 1024 + 3)) ;;
                btrfs) need=$((need + BTRFS_GB)) ;;
                cairn | base) need=$((need + POOL_DEV_GB)) ;;
                memfsdisk) need=$((need + 4)) ;; # its log wraps at 4 GiB
            esac
        done
    fi
    avail=$(df --output=avail -BG "$BENCH_DIR" | tail -1 | tr -dc 0-9)
    [ "$avail" -ge "$need" ] || die "$BENCH_DIR has ${avail}G free, needs ${need}G (MIN_FREE_GB)"
    log "$BENCH_DIR: ${avail}G free, budget ${need}G"
}

build_tools() {
    if [ -z "${BIN:-}" ]; then
        log "building cairn (release)"
        (cd "$ROOT" && cargo build --release -p cairn-cli >&2)
        BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/cairn
    fi
    [ -x "$BIN" ] || die "no cairn binary at $BIN"
    if { has_target memfs || has_target memfsdisk; } && [ -z "${MEMFS:-}" ]; then
        log "building memfs (release)"
        (cd "$ROOT" && cargo build --release --example memfs -p cairn-fuse >&2)
        MEMFS=${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/memfs
    fi
    BLOGBENCH=$W/blogbench
    cc -O2 -pthread -o "$BLOGBENCH" "$ROOT/bench/blogbench/blogbench.c" ||
        die "could not compile blogbench"
}

setup_dirs() {
    W=$(mktemp -d "$BENCH_DIR/cairn-smp.XXXXXX")
    mkdir -p "$W/native" "$W/bindsrc" "$W/bindmnt" "$W/btrfsmnt" "$W/cairnmnt" "$W/basemnt" "$W/memfsmnt" \
        "$W/memfsdiskmnt"
    # memfsdisk's memfs arguments: its mount point, transport and log file
    # (the pid is found by them).
    MEMFSDISK=("$W/memfsdiskmnt" auto "$W/memfsdisk.log")
    log "work dir $W on $(findmnt -n -o SOURCE,FSTYPE -T "$W" | tr -s ' ')"
}

make_targets() {
    if has_target btrfs; then
        truncate -s "${BTRFS_GB}G" "$W/btrfs.img"
        LOOP=$(losetup -f --show "$W/btrfs.img")
        mkfs.btrfs -q -f "$LOOP" >&2
        log "btrfs on $LOOP (${BTRFS_GB}G sparse file)"
    fi
    if has_target cairn; then
        "$BIN" mkfs "$W/pool" --device "ssd:$W/pool/data.0:${POOL_DEV_GB}G" >&2
    fi
    if has_target base; then
        "$BASE_BIN" mkfs "$W/basepool" --device "ssd:$W/basepool/data.0:${POOL_DEV_GB}G" >&2
    fi
    local t
    for t in "${TARGETS[@]}"; do mount_target "$t"; done
}


cleanup() {
    set +eu
    [ -n "${W:-}" ] || return 0
    unmount_fuse_targets
    if is_mounted "$W/btrfsmnt"; then
        umount "$W/btrfsmnt" 2>/dev/null || umount -l "$W/btrfsmnt"
    fi
    if [ -n "$LOOP" ]; then losetup -d "$LOOP"; fi
    if [ -z "${KEEP:-}" ]; then rm -rf --one-file-system "$W"; else log "kept $W"; fi
}

# ------------------------------------------------------------ mounts

dir_of() {
    case $1 in
        native) echo "$W/native" ;;
        bindfs) echo "$W/bindmnt" ;;
        btrfs) echo "$W/btrfsmnt" ;;
        memfs) echo "$W/memfsmnt" ;;
        memfsdisk) echo "$W/memfsdiskmnt" ;;
        cairn) echo "$W/cairnmnt" ;;
        base) echo "$W/basemnt" ;;
    esac
}

mount_target() {
    case $1 in
        bindfs) bindfs --no-allow-other "$W/bindsrc" "$W/bindmnt" ;;
        btrfs) mount "$LOOP" "$W/btrfsmnt" ;;
        memfs) mount_memfs "$W/memfsmnt" ;;
        memfsdisk) mount_memfs "${MEMFSDISK[@]}" ;;
        # shellcheck disable=SC2086
        cairn) "$BIN" mount "$W/pool" "$W/cairnmnt" ${CAIRN_MOUNT_OPTS:-} >&2 ;;
        # shellcheck disable=SC2086
        base) "$BASE_BIN" mount "$W/basepool" "$W/basemnt" ${CAIRN_MOUNT_OPTS:-} >&2 ;;
    esac
}

unmount_target() {
    case $1 in
        bindfs) fusermount3 -u "$W/bindmnt" ;;
        btrfs) umount "$W/btrfsmnt" ;;
        memfs) unmount_memfs "$W/memfsmnt" ;;
        memfsdisk) unmount_memfs "${MEMFSDISK[@]}" ;;
        cairn) "$BIN" umount "$W/cairnmnt" >&2 ;;
        base) "$BASE_BIN" umount "$W/basemnt" >&2 ;;
    esac
}



# ------------------------------------------------------- measurements
# Each bench_STEP TARGET DIR runs one round in the fresh directory DIR and
# prints "key value" lines (several lines of one key are all medianed).

# server_pid TARGET: the pid of TARGET's FUSE server (none for native and
# btrfs, which the kernel serves).
server_pid() {
    case $1 in
        cairn) pgrep -f -- " mount $W/pool " | head -1 ;;
        base) pgrep -f -- " mount $W/basepool " | head -1 ;;
        memfs) memfs_pid "$W/memfsmnt" ;;
        memfsdisk) memfs_pid "${MEMFSDISK[@]}" ;;
        bindfs) pgrep -f -- "bindfs .*$W/bindmnt" | head -1 ;;
    esac
}

# cpu_ticks PID: the user and system CPU time process PID used so far (all
# its threads, ended ones included), in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

bench_blogbench() {
    local out pid c0=""
    pid=$(server_pid "$1" || true)
    [ -z "$pid" ] || c0=$(cpu_ticks "$pid")
    out=$("$BLOGBENCH" "$2" "$BB_WRITERS" "$BB_REWRITERS" "$BB_COMMENTERS" "$BB_READERS" \
        "$BB_ITERATIONS" "$BB_SECONDS" "$BB_MAX_BLOGS" "$BB_WRITE_RATE")
    printf '%s\n' "$out" | sed 's/^/    /' >&2
    printf '%s\n' "$out" | awk '/^iteration/ { print "bb_read", $4; print "bb_write", $6 }'
    # The server's CPU over the round: time the readers did not get.
    if [ -n "$c0" ]; then
        echo "bb_server_cpu $(awk -v t="$(($(cpu_ticks "$pid") - c0))" -v hz="$(getconf CLK_TCK)" \
            'BEGIN { printf "%.2f", t / hz }')"
    fi
}

dbench_loadfile() {
    local f
    f=$(dpkg -L dbench 2>/dev/null | grep '/client\.txt$' | head -1 || true)
    echo "${f:-/usr/share/dbench/client.txt}"
}

bench_dbench() {
    local out v
    out=$(dbench -D "$2" -t "$DBENCH_SECONDS" -c "$DBENCH_LOADFILE" "$DBENCH_CLIENTS" 2>&1) ||
        { printf '%s\n' "$out" | tail -20 >&2; die "dbench failed on $1"; }
    v=$(printf '%s\n' "$out" | awk '/^Throughput/ { print $2 }')
    [ -n "$v" ] || { printf '%s\n' "$out" | tail -20 >&2; die "no dbench throughput on $1"; }
    printf '    %s\n' "$(printf '%s\n' "$out" | grep '^Throughput')" >&2
    echo "dbench $v"
}

# Runs postmark with stdout unbuffered and times its transaction phase (from
# "Performing transactions" to the next "Done"); prints transactions/s.
POSTMARK_PY='
import subprocess, sys, time
n = int(sys.argv[2])
p = subprocess.Popen(["stdbuf", "-o0", "postmark", sys.argv[1]], stdout=subprocess.PIPE)
buf, t0, t1 = b"", None, None
while True:
    c = p.stdout.read(1)
    if not c:
        break
    buf += c
    if t0 is None and buf.endswith(b"Performing transactions"):
        t0 = time.monotonic()
    elif t0 is not None and t1 is None and buf.endswith(b"Done"):
        t1 = time.monotonic()
if p.wait() != 0 or t1 is None:
    sys.stderr.write(buf.decode(errors="replace"))
    sys.exit("postmark failed")
for line in buf.decode().splitlines():
    if "seconds of transactions" in line:
        sys.stderr.write("    postmark: " + line.strip() + "\n")
print("postmark %.1f" % (n / (t1 - t0)))
'

bench_postmark() {
    postmark_cfg "$2" >"$W/postmark.cfg"
    (cd "$W" && python3 -c "$POSTMARK_PY" "$W/postmark.cfg" "$PM_TRANSACTIONS")
}

SQLITE_PY='
import os, sqlite3, sys, time
path, secs = sys.argv[1], float(sys.argv[2])
con = sqlite3.connect(path, isolation_level=None)
assert con.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
con.execute("PRAGMA synchronous=FULL")
con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, ts REAL, body BLOB)")
n, t0 = 0, time.monotonic()
end = t0 + secs
while True:
    con.execute("BEGIN")
    con.execute("INSERT INTO t (ts, body) VALUES (?, ?)", (time.time(), os.urandom(192)))
    con.execute("COMMIT")
    n += 1
    t = time.monotonic()
    if t >= end:
        break
con.close()
print("sqlite %.1f" % (n / (t - t0)))
'

bench_sqlite() { python3 -c "$SQLITE_PY" "$2/db.sqlite" "$SQLITE_SECONDS"; }

fio_iops() { # FILE randwrite|randread extra-args...
    local f=$1 rw=$2
    shift 2
    fio --name="$rw" --filename="$f" --rw="$rw" --bs=4k --size="${FIO_MB}M" \
        --runtime="$FIO_SECONDS" --time_based --ioengine=psync "$@" \
        --output-format=json --output="$W/fio.json" >/dev/null
    python3 -c 'import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
print(round(job[sys.argv[2]]["iops"]))' "$W/fio.json" "${rw#rand}"
}

bench_fio() {
    local f=$2/fio.dat w r
    # fio's default buffers are random and scrambled per I/O: no dedup/compression help
    fio --name=layout --filename="$f" --rw=write --bs=1M --size="${FIO_MB}M" \
        --ioengine=psync --end_fsync=1 --output=/dev/null
    sync "$f" # on cairn: committed
    drop_caches
    w=$(fio_iops "$f" randwrite --end_fsync=1)
    make_cold "$1"
    r=$(fio_iops "$f" randread)
    log "  fio $1: randwrite $w IOPS, cold randread $r IOPS"
    echo "fio_randwrite $w"
    echo "fio_randread $r"
}

# seq_mbps SECONDS: SEQ_MB over SECONDS.
seq_mbps() { div "$SEQ_MB" "$1"; }

bench_seq() {
    local f=$2/seq.dat t0 w r
    drop_caches
    t0=$(now)
    # fio's buffers are fresh random bytes per write: no dedup or compression help
    fio --name=seqw --filename="$f" --rw=write --bs=1M --size="${SEQ_MB}M" \
        --fallocate=none --ioengine=psync --end_fsync=1 --output=/dev/null
    w=$(seq_mbps "$(elapsed "$t0")")
    make_cold "$1"
    t0=$(now)
    fio --name=seqr --filename="$f" --rw=read --bs=1M --size="${SEQ_MB}M" \
        --ioengine=psync --output=/dev/null
    r=$(seq_mbps "$(elapsed "$t0")")
    log "  seq $1: write $w MB/s, cold read $r MB/s"
    echo "seq_write $w"
    echo "seq_read $r"
}

bench_untar() { python3 -c "$UNTAR_PY" "$W/untar.tar" "$2"; }

# ------------------------------------------------------------- driver

# Runs bench_$1 for RUNS rounds over all targets (interleaved), each round on
# a fresh directory, and stores the medians in RES.
run_step() {
    local step=$1 r t d key v out keys=()
    declare -A got
    for r in $(seq "$RUNS"); do
        for t in "${TARGETS[@]}"; do
            d=$(dir_of "$t")/$step.$r
            mkdir "$d"
            # The previous round's writes and deletions are on disk before
            # the clock starts (all file systems: btrfs's and ext4's
            # write-back of one target's round would otherwise run in the
            # next target's), and committed in the target itself.
            sync
            sync "$d"
            log "$step round $r/$RUNS: $t"
            out=$("bench_$step" "$t" "$d")
            [ "$t" != memfsdisk ] || [ -s "${MEMFSDISK[2]}" ] ||
                die "memfsdisk kept nothing on disk: ${MEMFSDISK[2]} is empty"
            while read -r key v; do
                [ -n "$key" ] || continue
                [[ " ${keys[*]} " == *" $key "* ]] || keys+=("$key")
                got[$key,$t]="${got[$key,$t]:-} $v"
            done <<<"$out"
            log "  $t: $(echo "$out" | tr '\n' ' ')"
            rm -rf --one-file-system "$d"
        done
    done
    for key in "${keys[@]}"; do
        for t in "${TARGETS[@]}"; do
            # shellcheck disable=SC2086
            RES[$key,$t]=$(median ${got[$key,$t]:-})
        done
    done
}

# The rows each step produces: "key|label|better".
rows_of() {
    local BB_PACE=""
    [ "$BB_WRITE_RATE" = 0 ] || BB_PACE=", writes at most $BB_WRITE_RATE files/s"
    case $1 in
        blogbench) printf '%s\n' \
            "bb_read|blogbench read score (files read per ${BB_SECONDS} s iteration${BB_PACE})|higher" \
            "bb_write|blogbench write score (files written per ${BB_SECONDS} s iteration)|higher" \
            "bb_server_cpu|blogbench: CPU the FUSE server used per round (s; ${BB_ITERATIONS} x ${BB_SECONDS} s)|lower" ;;
        dbench) echo "dbench|dbench ${DBENCH_CLIENTS} clients, ${DBENCH_SECONDS} s (MB/s)|higher" ;;
        postmark) echo "postmark|postmark ${PM_FILES} files, ${PM_TRANSACTIONS} transactions (transactions/s)|higher" ;;
        sqlite) echo "sqlite|SQLite WAL synchronous=FULL, 1 insert per transaction (commits/s)|higher" ;;
        fio) printf '%s\n' \
            "fio_randwrite|fio 4k random write into a ${FIO_MB} MiB file + fsync (IOPS)|higher" \
            "fio_randread|fio 4k random read, cold (IOPS)|higher" ;;
        seq) printf '%s\n' \
            "seq_write|sequential write ${SEQ_MB} MiB + fsync (MB/s)|higher" \
            "seq_read|sequential read ${SEQ_MB} MiB, cold (MB/s)|higher" ;;
        untar) printf '%s\n' \
            "untar_rate|untar ${UNTAR_FILES} files (files/s)|higher" \
            "untar_p50|untar create+write+close p50 (ms)|lower" \
            "untar_p99|untar create+write+close p99 (ms)|lower" \
            "untar_max|untar create+write+close max (ms)|lower" ;;
    esac
}

# One table per step: a row per target, a column per figure and its ratio.
print_step_table() {
    local step=$1 rows=() row key label t h="| target |" s="|---|"
    mapfile -t rows < <(rows_of "$step")
    METRICS+=("${rows[@]}")
    for row in "${rows[@]}"; do
        label=${row#*|}
        label=${label%|*}
        h+=" $label | cairn/target |"
        s+="---:|---:|"
    done
    echo
    echo "### $step (medians of $RUNS rounds)"
    echo
    echo "$h"
    echo "$s"
    for t in "${TARGETS[@]}"; do
        printf '| %s |' "$t"
        for row in "${rows[@]}"; do
            key=${row%%|*}
            printf ' %s | %s |' "${RES[$key,$t]:-n/a}" "$(div "${RES[$key,cairn]:-0}" "${RES[$key,$t]:-0}")"
        done
        echo
    done
}

print_summary() {
    local others=() t h s row key label better
    for t in "${TARGETS[@]}"; do [ "$t" = cairn ] || others+=("$t"); done
    echo
    echo "## Summary"
    echo
    echo "Cairn $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores," \
        "$(uname -r), work dir on $(findmnt -n -o FSTYPE -T "$W"); medians of $RUNS rounds" \
        "(blogbench: of all iterations of all rounds). Ratios are cairn/target:" \
        "above 1 is better for cairn where higher is better, below 1 where lower is better."
    echo
    h="| measurement | better |" s="|---|---|"
    for t in "${TARGETS[@]}"; do h+=" $t |" s+="---:|"; done
    for t in "${others[@]}"; do h+=" cairn/$t |" s+="---:|"; done
    echo "$h"
    echo "$s"
    for row in "${METRICS[@]}"; do
        key=${row%%|*} better=${row##*|}
        label=${row#*|}
        label=${label%|*}
        printf '| %s | %s |' "$label" "$better"
        for t in "${TARGETS[@]}"; do printf ' %s |' "${RES[$key,$t]:-n/a}"; done
        for t in "${others[@]}"; do
            printf ' %s |' "$(div "${RES[$key,cairn]:-0}" "${RES[$key,$t]:-0}")"
        done
        echo
    done
}

main() {
    [ "$(id -u)" = 0 ] || die "run as root (drop_caches, loop device, mounts)"
    ensure_tools
    check_env
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    setup_dirs
    build_tools
    DBENCH_LOADFILE=${DBENCH_LOADFILE:-$(dbench_loadfile)}
    [ -r "$DBENCH_LOADFILE" ] || die "no dbench load file at $DBENCH_LOADFILE"
    make_targets
    local step t0
    for step in $STEPS; do
        declare -F "bench_$step" >/dev/null || die "unknown step $step"
    done
    for step in $STEPS; do
        [ "$step" != untar ] || make_untar_tarball
        t0=$(now)
        run_step "$step"
        log "$step done in $(printf '%.0f' "$(elapsed "$t0")") s"
        print_step_table "$step"
    done
    print_summary
}

main "$@"
