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
#   RUNS=3           repetitions of the cheap measurements (median printed)
#   FIO_SECONDS=20   duration of each fio run
#   FIO_MB=256       size of the fio file
#   BENCH_DIR=/var/tmp  where the work dir is made (pick the disk to test)
#   TAR_SRC=...      tree to tar for the untar test (default: rust-src or /usr/share/doc)
#   CAIRN_MOUNT_OPTS="--commit-interval 5"  extra options for `cairn mount`
#   KEEP=1           keep the work dir
# Quick run: SIZE_GB=1 FILES=10000 RUNS=1 FIO_SECONDS=5 bench/foundation.sh
set -euo pipefail

SIZE_GB=${SIZE_GB:-4}
FILES=${FILES:-100000}
RUNS=${RUNS:-3}
FIO_SECONDS=${FIO_SECONDS:-20}
FIO_MB=${FIO_MB:-256}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
TARGETS=(native bindfs cairn)

ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"
declare -A RES UNIT

log() { printf '[bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.6f", b - a }'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "n/a"; else printf "%.2f", a / b }'; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

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
    mkdir -p "$W/native" "$W/bindsrc" "$W/bindmnt" "$W/cairnmnt"
    log "work dir $W on $(findmnt -n -o SOURCE,FSTYPE -T "$W" | tr -s ' ')"
    "$BIN" mkfs "$W/pool" >&2
}

cleanup() {
    set +e
    if mountpoint -q "$W/cairnmnt" 2>/dev/null; then
        "$BIN" umount "$W/cairnmnt" >/dev/null 2>&1 || fusermount3 -u -z "$W/cairnmnt"
    fi
    if mountpoint -q "$W/bindmnt" 2>/dev/null; then
        fusermount3 -u "$W/bindmnt" || fusermount3 -u -z "$W/bindmnt"
    fi
    if [ -n "${W:-}" ] && [ -z "${KEEP:-}" ]; then rm -rf "$W"; fi
}

# ------------------------------------------------------------ mounts

dir_of() {
    case $1 in
        native) echo "$W/native" ;;
        bindfs) echo "$W/bindmnt" ;;
        cairn) echo "$W/cairnmnt" ;;
    esac
}

mount_target() {
    case $1 in
        bindfs) bindfs --no-allow-other "$W/bindsrc" "$W/bindmnt" ;;
        # shellcheck disable=SC2086
        cairn) "$BIN" mount "$W/pool" "$W/cairnmnt" ${CAIRN_MOUNT_OPTS:-} >&2 ;;
    esac
}

unmount_target() {
    case $1 in
        bindfs) fusermount3 -u "$W/bindmnt" ;;
        cairn) "$BIN" umount "$W/cairnmnt" >&2 ;;
    esac
}

drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

# Empties every cache between the data and the reader: FUSE remount + drop_caches.
make_cold() {
    if [ "$1" != native ]; then unmount_target "$1"; fi
    drop_caches
    if [ "$1" != native ]; then mount_target "$1"; fi
}
