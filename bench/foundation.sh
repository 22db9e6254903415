#!/usr/bin/env bash
# Foundation benchmark: Cairn vs bindfs (a FUSE passthrough of a plain
# directory) vs the native directory, all on the same disk, in one run.
# Measures sequential write, cold and warm sequential read, fio 4k random
# read/write IOPS, create/stat/unlink of many small files and untar of a source
# tree, then prints a markdown table with cairn/native and cairn/bindfs ratios.
# All figures are "higher is better".
#
# Needs root (drop_caches), fuse3, bindfs, fio, python3, tar.
# Environment:
#   SIZE_GB=4        size of the sequential file
#   FILES=100000     number of small files
#   RUNS=3           rounds of each measurement (median printed); sequential
#                    write and cold read run in interleaved rounds over the targets
#   FIO_SECONDS=20   duration of each fio run
#   FIO_MB=256       size of the fio file
#   BENCH_DIR=/var/tmp  where the work dir is made (pick the disk to test)
#   TAR_SRC=...      tree to tar for the untar test (default: rust-src or /usr/share/doc)
#   CAIRN_MOUNT_OPTS="--commit-interval 5"  extra options for `cairn mount`
#   KEEP=1           keep the work dir
#   STEPS="files untar"  run only these measurements (of seq_write cold_read
#                    warm_read fio files untar; the reads need seq_write)
#   MIRROR=1         give cairn's pool a second tier device, so that its
#                    metadata is kept as two copies (docs/redundancy.md,
#                    "Redundant metadata"); with BASE_BIN=$BIN and no MIRROR for the
#                    base pool this measures the cost of the second copy:
#                    MIRROR=1 BASE_BIN=target/release/cairn STEPS="files untar"
#   METRICS=1        cost of the metrics endpoint: cairn mounts with
#                    --metrics 127.0.0.1:$METRICS_PORT (default 9469), scraped
#                    every second while the bench runs, and the target "base"
#                    is the same binary on its own pool without metrics. Only
#                    these two targets run (ALL_TARGETS=1 adds native and
#                    bindfs), every step in interleaved rounds (one round of
#                    each target in turn, the order swapped every round), and
#                    the report is per step: medians of RUNS rounds, the
#                    per-round on/off ratios and their median:
#                    METRICS=1 SIZE_GB=1 FILES=10000 FIO_SECONDS=5 FIO_MB=64 bench/foundation.sh
# Quick run: SIZE_GB=1 FILES=10000 RUNS=1 FIO_SECONDS=5 bench/foundation.sh
set -euo pipefail

SIZE_GB=${SIZE_GB:-4}
FILES=${FILES:-100000}
RUNS=${RUNS:-3}
FIO_SECONDS=${FIO_SECONDS:-20}
FIO_MB=${FIO_MB:-256}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
TARGETS=(native bindfs cairn)
# ONLY="cairn" (or "native cairn", ...): measure only these targets (with
# BASE_BIN, base is added); a regression check needs no bindfs, whose small
# files and untar take minutes a round.
if [ -n "${ONLY:-}" ]; then read -ra TARGETS <<<"$ONLY"; fi
if [ "${METRICS:-0}" = 1 ] && [ "${ALL_TARGETS:-0}" != 1 ]; then TARGETS=(cairn); fi
# BASE_BIN=/path/to/older/cairn adds the target "base": that binary on a pool
# of its own, measured in the same rounds, with a cairn/base column (to show
# a change costs nothing); every step then runs in interleaved rounds.
# Regression check: ONLY=cairn BASE_BIN=/path/to/older/cairn bench/foundation.sh
if [ "${METRICS:-0}" = 1 ]; then
    BASE_BIN=${BASE_BIN:-${CARGO_TARGET_DIR:-$(cd "$(dirname "$0")/.." && pwd)/target}/release/cairn}
    CAIRN_METRICS_OPTS="--metrics 127.0.0.1:${METRICS_PORT:-9469}"
fi
[ -n "${BASE_BIN:-}" ] && TARGETS+=(base)
# Each pool's device: room for the sequential file and the small files.
POOL_DEV_GB=${POOL_DEV_GB:-$((SIZE_GB * 2 + 4))}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"
declare -A RES UNIT RATIOS RATIO

. "$(dirname "$0")/lib.sh"

# ------------------------------------------------------------------ setup

check_tools() {
    [ "$(id -u)" = 0 ] || die "run as root (drop_caches, FUSE mounts)"
    for t in fio bindfs fusermount3 python3 tar awk; do
        command -v "$t" >/dev/null || die "$t not installed"
    done
}

build_cairn() {
    log "building cairn (release)"
    (cd "$ROOT" && cargo build --release -p cairn-cli >&2)
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/cairn
    [ -x "$BIN" ] || die "no binary at $BIN"
}

setup_dirs() {
    W=$(mktemp -d "$BENCH_DIR/cairn-bench.XXXXXX")
    mkdir -p "$W/native" "$W/bindsrc" "$W/bindmnt" "$W/cairnmnt" "$W/basemnt"
    log "work dir $W on $(findmnt -n -o SOURCE,FSTYPE -T "$W" | tr -s ' ')"
    local second=()
    if [ "${MIRROR:-0}" = 1 ]; then
        mkdir -p "$W/dev1"
        second=(--device "ssd:$W/dev1/data.1:${POOL_DEV_GB}G")
    fi
    "$BIN" mkfs "$W/pool" --device "ssd:$W/pool/data.0:${POOL_DEV_GB}G" "${second[@]}" >&2
    [ "${MIRROR:-0}" != 1 ] || [ -L "$W/pool/meta.mirror" ] || die "MIRROR=1 but the pool has no metadata mirror"
    if [ -n "${BASE_BIN:-}" ]; then
        "$BASE_BIN" mkfs "$W/basepool" --device "ssd:$W/basepool/data.0:${POOL_DEV_GB}G" >&2
    fi
}


cleanup() {
    set +eu
    [ -n "${W:-}" ] || return 0
    [ -z "${SCRAPER:-}" ] || kill "$SCRAPER" 2>/dev/null
    unmount_fuse_targets
    if [ -z "${KEEP:-}" ]; then rm -rf --one-file-system "$W"; else log "kept $W"; fi
}

# ------------------------------------------------------------ mounts

dir_of() {
    case $1 in
        native) echo "$W/native" ;;
        bindfs) echo "$W/bindmnt" ;;
        cairn) echo "$W/cairnmnt" ;;
        base) echo "$W/basemnt" ;;
    esac
}

mount_target() {
    case $1 in
        bindfs) bindfs --no-allow-other "$W/bindsrc" "$W/bindmnt" ;;
        # shellcheck disable=SC2086
        cairn) "$BIN" mount "$W/pool" "$W/cairnmnt" ${CAIRN_MOUNT_OPTS:-} ${CAIRN_METRICS_OPTS:-} >&2 ;;
        # shellcheck disable=SC2086
        base) "$BASE_BIN" mount "$W/basepool" "$W/basemnt" ${CAIRN_MOUNT_OPTS:-} >&2 ;;
    esac
}

# Scrapes /metrics every second, as Prometheus would (METRICS=1), for the
# whole run (remounts included); its output goes nowhere, so that it holds
# no pipe of the script's command substitutions.
start_scraper() {
    ( while sleep 1; do curl -s -o /dev/null "http://127.0.0.1:${METRICS_PORT:-9469}/metrics" || true; done ) \
        </dev/null >/dev/null 2>&1 &
    SCRAPER=$!
}

unmount_target() {
    case $1 in
        bindfs) fusermount3 -u "$W/bindmnt" ;;
        cairn) "$BIN" umount "$W/cairnmnt" >&2 ;;
        base) "$BASE_BIN" umount "$W/basemnt" >&2 ;;
    esac
}



# ------------------------------------------------------- measurements

# Prints MB/s of writing the 4 GiB file (replacing it) with a final fsync.
write_seq_mbs() {
    local d t0
    d=$(dir_of "$1")
    rm -f "$d/seq"
    # The deletion is made durable before the clock starts, on every target
    # (Cairn would otherwise commit it in its first flush of the write).
    sync "$d"
    t0=$(now)
    # fio's default buffers are random and scrambled per I/O: no dedup/compression help
    fio --name=seqw --filename="$d/seq" --rw=write --bs=1M --size="${SIZE_GB}G" \
        --ioengine=psync --direct=0 --end_fsync=1 --output=/dev/null
    div $((SIZE_GB * 1024)) "$(elapsed "$t0")"
}

read_seq_mbs() {
    local t0
    t0=$(now)
    dd if="$(dir_of "$1")/seq" of=/dev/null bs=1M status=none
    div $((SIZE_GB * 1024)) "$(elapsed "$t0")"
}

# Runs `$2 TARGET` (prints MB/s) for all targets in interleaved rounds
# (native, bindfs, cairn, native, ...), so that a slow phase of a shared disk
# hits every target alike. Stores medians in RES[$1,*] and the per-round
# cairn/native ratios and their median in RATIOS[$1] and RATIO[$1].
interleaved() {
    local key=$1 fn=$2 r t v ratios=()
    declare -A got
    for r in $(seq "$RUNS"); do
        for t in "${TARGETS[@]}"; do
            v=$("$fn" "$t")
            got[$t]="${got[$t]:-} $v"
            log "$key round $r: $t $v MB/s"
        done
        [ -z "${got[native]:-}" ] || ratios+=("$(div "$(last ${got[cairn]})" "$(last ${got[native]})")")
    done
    for t in "${TARGETS[@]}"; do
        # shellcheck disable=SC2086
        RES[$key,$t]=$(median ${got[$t]})
    done
    RATIOS[$key]="${ratios[*]:-}"
    [ ${#ratios[@]} -eq 0 ] || RATIO[$key]=$(median "${ratios[@]}")
}

last() { echo "${@: -1}"; }

# A/B, or n/a when either was not measured.
ratio_of() { if [ "$1" = n/a ] || [ "$2" = n/a ]; then echo n/a; else div "$1" "$2"; fi; }

cold_read_mbs() {
    make_cold "$1"
    read_seq_mbs "$1"
}

bench_seq_write_all() { interleaved seqw write_seq_mbs; }
bench_cold_read_all() { interleaved cold cold_read_mbs; }

bench_warm_read() {
    local v=()
    read_seq_mbs "$1" >/dev/null
    for _ in $(seq "$RUNS"); do v+=("$(read_seq_mbs "$1")"); done
    RES[warm,$1]=$(median "${v[@]}")
    [ -n "${KEEP_SEQ:-}" ] || rm -f "$(dir_of "$1")/seq"
}

FIO_COMMON=(--bs=4k --ioengine=psync --direct=0)

# fio_iops TARGET randread|randwrite; each run starts from cold caches
fio_iops() {
    local f
    f="$(dir_of "$1")/fio.dat"
    fio --name=layout --filename="$f" --size="${FIO_MB}M" --rw=write --create_only=1 \
        "${FIO_COMMON[@]}" --output=/dev/null
    make_cold "$1"
    fio --name="$2" --filename="$f" --size="${FIO_MB}M" --rw="$2" "${FIO_COMMON[@]}" \
        --time_based --runtime="$FIO_SECONDS" --output-format=json --output="$W/fio.json" >/dev/null
    python3 -c 'import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
print(round(job[sys.argv[2]]["iops"]))' "$W/fio.json" "${2#rand}"
}

bench_fio() {
    RES[randread,$1]=$(fio_iops "$1" randread)
    RES[randwrite,$1]=$(fio_iops "$1" randwrite)
    rm -f "$(dir_of "$1")/fio.dat"
}

# Small-file phases, each timed on its own; prints ops/s.
# Usage: files.py create|stat|unlink ROOT N
FILES_PY='
import os, sys, time
phase, root, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
per = 1000
dirs = [os.path.join(root, "d%04d" % i) for i in range((n + per - 1) // per)]
paths = [os.path.join(dirs[i // per], "f%06d" % i) for i in range(n)]
data = b"x" * 100
t = time.monotonic()
if phase == "create":
    for d in dirs:
        os.mkdir(d)
    for p in paths:
        fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, data)
        os.close(fd)
elif phase == "stat":
    for p in paths:
        os.stat(p)
else:
    for p in paths:
        os.unlink(p)
    for d in dirs:
        os.rmdir(d)
print("%.1f" % (n / (time.monotonic() - t)))
'

bench_files() {
    local d r c=() s=() u=()
    d=$(dir_of "$1")/files
    for r in $(seq "$RUNS"); do
        mkdir -p "$d"
        c+=("$(python3 -c "$FILES_PY" create "$d" "$FILES")")
        make_cold "$1" # stat from a cold cache, not from the kernel's attribute cache
        s+=("$(python3 -c "$FILES_PY" stat "$d" "$FILES")")
        u+=("$(python3 -c "$FILES_PY" unlink "$d" "$FILES")")
        rmdir "$d"
        log "files round $r: $1 create ${c[-1]} stat ${s[-1]} unlink ${u[-1]} ops/s"
    done
    RES[create,$1]=$(median "${c[@]}")
    RES[stat,$1]=$(median "${s[@]}")
    RES[unlink,$1]=$(median "${u[@]}")
}

make_tarball() {
    local src=${TAR_SRC:-}
    local rs
    rs="$(rustc --print sysroot 2>/dev/null || true)/lib/rustlib/src/rust"
    if [ -z "$src" ]; then
        if [ -d "$rs" ]; then src=$rs; else src=/usr/share; fi
    fi
    TARBALL=/tmp/cairn-bench-$(echo "$src" | tr '/' '_').tar
    if [ ! -s "$TARBALL" ]; then
        log "making $TARBALL from $src (once)"
        tar -C "$(dirname "$src")" -cf "$TARBALL.part" "$(basename "$src")" 2>/dev/null || true
        mv "$TARBALL.part" "$TARBALL"
    fi
    NTAR=$(tar -tf "$TARBALL" | wc -l)
    log "untar test: $TARBALL, $NTAR entries, $(du -h "$TARBALL" | cut -f1)"
}

bench_untar() {
    local d t0 v=()
    d=$(dir_of "$1")/untar
    for _ in $(seq "$RUNS"); do
        rm -rf "$d" && mkdir "$d"
        t0=$(now)
        tar -C "$d" -xf "$TARBALL"
        v+=("$(div "$NTAR" "$(elapsed "$t0")")")
    done
    rm -rf "$d"
    RES[untar,$1]=$(median "${v[@]}")
}

# ------------------------------------- metrics on/off (METRICS=1)

# The result keys of a step.
step_keys() {
    case $1 in
        seq_write) echo seqw ;;
        cold_read) echo cold ;;
        warm_read) echo warm ;;
        fio) echo randread randwrite ;;
        files) echo create stat unlink ;;
        untar) echo untar ;;
    esac
}

# Runs STEP for RUNS rounds, one round of each target in turn (cairn with
# metrics, base without; the order swapped every round), and keeps per
# key the medians in RES and the per-round cairn/base ratios in
# RATIOS (median in RATIO).
round_robin() {
    local step=$1 rounds=$RUNS r t k order
    declare -A vals=() pr=()
    for r in $(seq "$rounds"); do
        if [ $((r % 2)) = 1 ]; then order=("${TARGETS[@]}"); else
            order=(); for t in "${TARGETS[@]}"; do order=("$t" "${order[@]}"); done
        fi
        if [ "$step" = seq_write ] || [ "$step" = cold_read ]; then
            local saved=("${TARGETS[@]}")
            TARGETS=("${order[@]}")
            RUNS=1 "bench_${step}_all"
            TARGETS=("${saved[@]}")
        else
            for t in "${order[@]}"; do RUNS=1 "bench_$step" "$t"; done
        fi
        for k in $(step_keys "$step"); do
            for t in "${TARGETS[@]}"; do vals[$k,$t]="${vals[$k,$t]:-} ${RES[$k,$t]}"; done
            pr[$k]="${pr[$k]:-} $(div "${RES[$k,cairn]}" "${RES[$k,base]}")"
            log "$k round $r: cairn${CAIRN_METRICS_OPTS:+ (metrics)} ${RES[$k,cairn]}, base ${RES[$k,base]}, ratio $(last ${pr[$k]})"
        done
    done
    for k in $(step_keys "$step"); do
        # shellcheck disable=SC2086
        for t in "${TARGETS[@]}"; do RES[$k,$t]=$(median ${vals[$k,$t]}); done
        RATIOS[$k]=${pr[$k]# }
        # shellcheck disable=SC2086
        RATIO[$k]=$(median ${pr[$k]})
    done
}

print_metrics_table() {
    echo
    echo "Cairn $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores," \
        "$(uname -r), work dir on $(findmnt -n -o FSTYPE -T "$W"): metrics on (scraped every second)" \
        "vs off, same binary, $RUNS interleaved rounds per step. Higher is better; on/off < 1 is a cost."
    echo
    echo "| step | metrics on (median) | metrics off (median) | on/off per round | on/off median |"
    echo "|---|---:|---:|---|---:|"
    local step k
    for step in ${STEPS:-seq_write cold_read warm_read fio files untar}; do
        for k in $(step_keys "$step"); do
            echo "| $k | ${RES[$k,cairn]:-n/a} | ${RES[$k,base]:-n/a} | ${RATIOS[$k]:-n/a} | ${RATIO[$k]:-n/a} |"
        done
    done
}

# ------------------------------------------------------------- report

print_table() {
    local rows=(
        "seqw|sequential write ${SIZE_GB} GiB + fsync (MB/s)"
        "cold|cold sequential read (MB/s)"
        "warm|warm sequential re-read (MB/s)"
        "randread|fio 4k random read, ${FIO_MB} MB file, from cold (IOPS)"
        "randwrite|fio 4k random write, buffered (IOPS)"
        "create|create ${FILES} small files (ops/s)"
        "stat|stat ${FILES} files, cold (ops/s)"
        "unlink|unlink ${FILES} files (ops/s)"
        "untar|untar ${NTAR} entries (entries/s)"
    )
    echo
    echo "Cairn $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores," \
        "$(uname -r), work dir on $(findmnt -n -o FSTYPE -T "$W"); medians of $RUNS runs" \
        "(fio: one run each). Higher is better."
    echo
    local base_h="" base_s=""
    if [ -n "${BASE_BIN:-}" ]; then base_h=" base | cairn/base |" base_s="---:|---:|"; fi
    echo "| measurement | native | bindfs | cairn | cairn/native | cairn/bindfs |$base_h"
    echo "|---|---:|---:|---:|---:|---:|$base_s"
    local row key label n b c x extra
    for row in "${rows[@]}"; do
        key=${row%%|*} label=${row#*|}
        n=${RES[$key,native]:-n/a} b=${RES[$key,bindfs]:-n/a} c=${RES[$key,cairn]:-n/a}
        extra=""
        if [ -n "${BASE_BIN:-}" ]; then
            x=${RES[$key,base]:-n/a}
            extra=" $x | $(ratio_of "$c" "$x") |"
        fi
        echo "| $label | $n | $b | $c | $(ratio_of "$c" "$n") | $(ratio_of "$c" "$b") |$extra"
    done
    echo
    echo "Per interleaved round, cairn/native: sequential write ${RATIOS[seqw]:-n/a}" \
        "(median ${RATIO[seqw]:-n/a}); cold read ${RATIOS[cold]:-n/a} (median ${RATIO[cold]:-n/a})."
}

main() {
    check_tools
    build_cairn
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    setup_dirs
    make_tarball
    [[ " ${TARGETS[*]} " != *" bindfs "* ]] || mount_target bindfs
    mount_target cairn
    [ -z "${BASE_BIN:-}" ] || mount_target base
    [ -z "${CAIRN_METRICS_OPTS:-}" ] || start_scraper
    local step t
    if [ "${METRICS:-0}" = 1 ]; then
        KEEP_SEQ=1
        for step in ${STEPS:-seq_write cold_read warm_read fio files untar}; do
            round_robin "$step"
        done
        print_metrics_table
        return
    fi
    # one measurement at a time across all targets, so they see the same machine state
    [ -z "${BASE_BIN:-}" ] || KEEP_SEQ=1
    for step in ${STEPS:-seq_write cold_read warm_read fio files untar}; do
        if [ "$step" = seq_write ] || [ "$step" = cold_read ]; then
            "bench_${step}_all"
            continue
        fi
        # Against an older binary every step runs in interleaved rounds
        # (the order swapped every round), with per-round cairn/base ratios.
        if [ -n "${BASE_BIN:-}" ]; then
            round_robin "$step"
            continue
        fi
        for t in "${TARGETS[@]}"; do
            log "$step: $t"
            "bench_$step" "$t"
        done
    done
    print_table
    if [ -n "${BASE_BIN:-}" ]; then
        echo
        local k
        for k in $(for step in warm_read fio files untar; do step_keys "$step"; done); do
            [ -z "${RATIOS[$k]:-}" ] || echo "Per interleaved round, cairn/base $k: ${RATIOS[$k]} (median ${RATIO[$k]})"
        done
    fi
}

main "$@"
