#!/usr/bin/env bash
# Restarting the daemon under a mount (`cairn mount --keep-mount`,
# `cairn restart`; docs/sharing.md): what it costs.
#  pause   while a client creates, writes and fsyncs 4 KiB files in a
#          loop (bench/restart_load.py), RESTARTS restarts one second
#          apart: how long each `cairn restart` takes and the client's
#          slowest operation (what a caller waits), against its median
#  small   a kept mount (served from /dev/fuse) against a plain mount
#          with --io-uring off (/dev/fuse too) and one with the default
#          transport (io_uring where the kernel offers it): SMALL_FILES
#          files of 4 KiB created, then (caches dropped) read, files/s;
#          RUNS interleaved rounds, medians
# Environment (defaults): RESTARTS=5 RUNS=3 SMALL_FILES=5000
#   BENCH_DIR=/var/tmp  BIN=... (default: cargo build --release)
#   NO_BUILD=1 with BIN unset: use target/release/cairn as it is
set -euo pipefail
shopt -s inherit_errexit
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

RESTARTS=${RESTARTS:-5}
RUNS=${RUNS:-3}
SMALL_FILES=${SMALL_FILES:-5000}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
PROFILE=release
[ "$(id -u)" = 0 ] || die "needs root (drop_caches)"
build_cairn
W=$(mktemp -d "$BENCH_DIR/cairn-restart.XXXXXX")
cleanup() { unmount_fuse_targets; rm -rf "$W"; }
[ "${KEEP:-0}" = 1 ] || trap cleanup EXIT
LOAD="$ROOT/bench/restart_load.py"

# fresh_mount ARGS...: a new pool of 4 GiB mounted on $W/cairnmnt.
fresh_mount() {
    unmount_fuse_targets
    rm -rf "$W/pool" && mkdir -p "$W/pool" "$W/cairnmnt"
    quiet "$BIN" mkfs "$W/pool" --device "ssd:$W/pool/data.0:4G"
    quiet "$BIN" mount "$W/pool" "$W/cairnmnt" "$@"
}

log "pause: $RESTARTS restarts under an fsync loop"
fresh_mount --keep-mount
python3 "$LOAD" pause "$W/cairnmnt" "$BIN" "$RESTARTS"

declare -A RES
for r in $(seq 1 "$RUNS"); do
    for mode in kept devfuse default; do
        case $mode in
        kept) fresh_mount --keep-mount ;;
        devfuse) fresh_mount --io-uring off ;;
        default) fresh_mount ;;
        esac
        read -r c rd < <(python3 "$LOAD" small "$W/cairnmnt" "$SMALL_FILES")
        add "$mode.create" "$c"
        add "$mode.read" "$rd"
        log "round $r $mode: create $c files/s, cold read $rd files/s"
    done
done
unmount_fuse_targets
printf '\n| mount | create (files/s) | cold read (files/s) | create / kept | read / kept |\n|---|---:|---:|---:|---:|\n'
for mode in kept devfuse default; do
    printf '| %s | %s | %s | %s | %s |\n' "$mode" "$(med "$mode.create")" "$(med "$mode.read")" \
        "$(div "$(med "$mode.create")" "$(med kept.create)")" "$(div "$(med "$mode.read")" "$(med kept.read)")"
done
