#!/usr/bin/env bash
# Block volume latency at a given rate (the ddsnap seed's method): offered
# load of 4 KiB random I/O, 70% reads, at rising rates until latency goes
# vertical, on four NBD targets, each a VOL_GB volume on the filesystem of
# BENCH_DIR, prefilled once (fio sequential 1 MiB writes of the whole
# volume, fresh random bytes per write, flushed) so that reads hit data:
#   raw         `nbdkit file` over a plain file
#   cairn       a Cairn volume (block size 4K, pool record size RECORD) in a
#               pool whose sparse data device is a file, served by
#               `cairn nbd serve POOL --socket` (no FUSE mount), no snapshot
#   cairn-snap  the same with a snapshot held: `cairn volume snapshot` after
#               the prefill and again before each rate step (earlier ones
#               kept), so every step's writes overwrite snapshotted blocks
#   qcow2-snap  `qemu-nbd --persistent -f qcow2` (cache=writeback,
#               aio=threads: its defaults) over a qcow2 image (64 KiB
#               clusters) holding an internal snapshot taken the same way
#               (`qemu-img snapshot -c` after the prefill and before each
#               rate step, with qemu-nbd stopped for it)
# For each rate R of RATES (total IOPS offered), fio's nbd engine (libnbd,
# one connection): --rw=randrw --rwmixread=70 --bs=4k --iodepth=32
# --rate_iops=0.7R,0.3R (fio caps reads and writes separately) --runtime
# RUNTIME --time_based --numjobs=1, reads and writes reported together
# (unified_rw_reporting=mixed): achieved IOPS, completion latency (clat) p50
# and p99. A rate is sustained when achieved >= 95% of offered; a target
# stops after two consecutive unsustained rates. With ROUNDS > 1 each rate
# is run ROUNDS times and every figure is the median. raw, cairn and
# cairn-snap are interleaved, their servers up at once: each round of a
# rate runs every one of them once, in an order rotated by one per round,
# each run after a quiesce (`cairn sync` of the Cairn pools, then the
# host's `sync`), so that a noisy stretch of a shared machine falls on all
# alike. qcow2-snap runs after them (set up once they are torn down): its
# image's copy-on-write growth would otherwise push their data out of the
# host's page cache (see `run_targets` below).
# Then the snapshot-create cost: a fresh pool with a SNAP_GB volume
# (prefilled like the others unless SNAP_FILL=0) served by `cairn nbd
# serve`, fio writing 4 KiB random at SNAP_RATE IOPS to it, and SNAP_N times
# each, one kind after the other (each call after a pause taken in turn
# from SNAP_GAPS, so that the writes buffered since the last commit or
# snapshot range from a few MiB to a whole commit interval's): the wall time of `cairn volume snapshot` (process
# start to exit) and the daemon-side time (a volume_snapshot request on the
# pool's control socket, from connect to the reply: what the daemon spends,
# without the CLI's process start-up), and the same request with
# "wait": false (`--no-wait`: the snapshot is cut, durable with the commit
# it starts); median and max of each.
# Prints a markdown table per target, a summary with the issue's ratios
# (cairn-snap vs raw at half of raw's highest sustained rate, target <=
# 1.5x; Cairn vs qcow2 at every rate; snapshot create < 10 ms) and writes
# OUT_DIR/report.md (the same text) and OUT_DIR/latency.png (p99 solid, p50
# dashed, against achieved ops/s, log-log; gnuplot, Debian gnuplot-nox,
# installed if missing).
# Environment (defaults; QUICK=1 gives a ~3 minute run: VOL_GB=1,
# RATES="1000 4000 16000 64000", RUNTIME=5, SNAP_GB=2, SNAP_N=10):
#   VOL_GB=4 RATES="1000 2000 4000 8000 16000 32000 64000" RUNTIME=10
#   ROUNDS=1 RECORD=4K TARGETS="raw cairn cairn-snap qcow2-snap"
#   SNAP_GB=10 SNAP_RATE=2000 SNAP_N=20 SNAP_GAPS="0.5 1.5 3 5" SNAP_FILL=1 (SNAP_N=0
#   skips it), OUT_DIR=BENCH_DIR/cairn-volumes-latency-DATE, BENCH_DIR=/var/tmp,
#   KEEP=1 (keep the work dir), NO_BUILD=1 (use target/release/cairn as is),
#   BIN (a cairn binary to use).
# Needs root (apt-get for gnuplot), fio with the nbd engine, nbdkit,
# qemu-img/qemu-nbd, nbdinfo, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

if [ -n "${QUICK:-}" ]; then
    VOL_GB=${VOL_GB:-1} RATES=${RATES:-1000 4000 16000 64000} RUNTIME=${RUNTIME:-5}
    SNAP_GB=${SNAP_GB:-2} SNAP_N=${SNAP_N:-10}
fi
VOL_GB=${VOL_GB:-4}
RATES=${RATES:-1000 2000 4000 8000 16000 32000 64000}
RUNTIME=${RUNTIME:-10}
ROUNDS=${ROUNDS:-1}
RECORD=${RECORD:-4K}
TARGETS=${TARGETS:-raw cairn cairn-snap qcow2-snap}
SNAP_GB=${SNAP_GB:-10}
SNAP_RATE=${SNAP_RATE:-2000}
SNAP_N=${SNAP_N:-20}
SNAP_GAPS=${SNAP_GAPS:-0.5 1.5 3 5}
SNAP_FILL=${SNAP_FILL:-1}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
OUT_DIR=${OUT_DIR:-$BENCH_DIR/cairn-volumes-latency-$(date +%Y%m%d-%H%M%S)}

[ "$(id -u)" = 0 ] || die "run as root"
for t in fio nbdkit qemu-img qemu-nbd nbdinfo python3; do
    command -v "$t" >/dev/null || die "$t is missing (scripts/deps.sh test)"
done
fio --enghelp=nbd >/dev/null 2>&1 || die "this fio has no nbd engine"
if ! command -v gnuplot >/dev/null; then
    log "installing gnuplot-nox"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnuplot-nox >/dev/null ||
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnuplot-nox >/dev/null; } ||
        die "could not install gnuplot-nox"
fi
if [ -z "${BIN:-}" ]; then
    [ -n "${NO_BUILD:-}" ] || cargo build --release -q -p cairn-cli >&2
    BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/cairn
fi
[ -x "$BIN" ] || die "no cairn binary at $BIN"
T_START=$(now)
mkdir -p "$OUT_DIR"
W=$(mktemp -d "$BENCH_DIR/cairn-volumes-latency.XXXXXX")
declare -A SERVER_PID
FIO_PID=""
cleanup() {
    set +eu
    [ -z "$FIO_PID" ] || { kill "$FIO_PID" 2>/dev/null; wait "$FIO_PID" 2>/dev/null; }
    for t in "${!SERVER_PID[@]}"; do stop_server "$t"; done
    if [ -z "${KEEP:-}" ]; then rm -rf --one-file-system "$W"; else log "kept $W"; fi
}
trap cleanup EXIT
FSDESC=$(findmnt -n -o SOURCE,FSTYPE -T "$W" | tr -s ' ')
log "work dir $W on $FSDESC; results in $OUT_DIR"

VOL_BYTES=$((VOL_GB << 30))

# ------------------------------------------------------------ servers
# Each target has its own server and socket; all stay up while the rates
# are run.
sock_of() { echo "$W/nbd-$1.sock"; }
uri() { # TARGET
    case $1 in
        cairn*) echo "nbd+unix:///v?socket=$(sock_of "$1")" ;;
        *) echo "nbd+unix:///?socket=$(sock_of "$1")" ;;
    esac
}
pool_of() { echo "$W/pool-$1"; }
start_server() { # TARGET
    local SOCK
    SOCK=$(sock_of "$1")
    rm -f "$SOCK"
    case $1 in
        raw) nbdkit --foreground --unix "$SOCK" file file="$W/raw.img" >>"$W/server.log" 2>&1 & ;;
        cairn*) "$BIN" nbd serve "$(pool_of "$1")" --socket "$SOCK" >>"$W/server.log" 2>&1 & ;;
        qcow2*) qemu-nbd --socket="$SOCK" --persistent --shared=8 -f qcow2 "$W/img.qcow2" >>"$W/server.log" 2>&1 & ;;
        *) die "unknown target $1" ;;
    esac
    SERVER_PID[$1]=$!
    for _ in $(seq 200); do
        nbdinfo --size "$(uri "$1")" >/dev/null 2>&1 && return 0
        kill -0 "${SERVER_PID[$1]}" 2>/dev/null || break
        sleep 0.05
    done
    tail -5 "$W/server.log" >&2
    die "the $1 server did not come up on $SOCK"
}
stop_server() { # TARGET
    local pid=${SERVER_PID[$1]:-}
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    unset "SERVER_PID[$1]"
}
# quiesce: before each measured run, nothing of an earlier run is still
# being written: the Cairn pools commit what they buffer, and the host
# writes back its dirty pages (raw's and qcow2's writes went there).
quiesce() {
    local t
    for t in "${!SERVER_PID[@]}"; do
        case $t in cairn*) "$BIN" sync "$(pool_of "$t")" >/dev/null ;; esac
    done
    sync
}

# json_get FILE EXPR: EXPR on the fio JSON (as j); fio may print errors
# ahead of the JSON.
json_get() {
    python3 -c '
import json, sys
s = open(sys.argv[1]).read()
j = json.loads(s[s.index("{"):])
print(eval(sys.argv[2]))' "$1" "$2"
}

# prefill TARGET SIZE_BYTES: sequential 1 MiB writes of fresh random bytes
# (no dedup, no compression), flushed; prints MB/s.
prefill() {
    fio --name=fill --ioengine=nbd --uri="$(uri "$1")" --rw=write --bs=1M --size="$2" \
        --iodepth=8 --refill_buffers --end_fsync=1 --output-format=json \
        --output="$W/fill.json" >/dev/null 2>>"$W/fio.err" || die "prefill of $1 failed (see $W/fio.err)"
    json_get "$W/fill.json" '"%.0f" % (j["jobs"][0]["write"]["bw_bytes"] / 1e6)'
}

# setup TARGET: makes the target's backing store, serves it, prefills it,
# takes the first snapshot (snapshot targets); sets FILL[TARGET].
declare -A FILL
setup() {
    local t=$1
    case $t in
        raw) truncate -s "$VOL_BYTES" "$W/raw.img" ;;
        cairn*)
            "$BIN" mkfs "$(pool_of "$t")" --force --record-size "$RECORD" \
                --device "ssd:$W/$t-data.img:$((VOL_GB * 4))G" --sparse >/dev/null 2>&1 ||
                die "mkfs for $t"
            "$BIN" volume create "$(pool_of "$t")" v "${VOL_GB}G" --block-size 4K >/dev/null
            ;;
        qcow2*) qemu-img create -q -f qcow2 "$W/img.qcow2" "${VOL_GB}G" ;;
    esac
    start_server "$t"
    FILL[$t]=$(prefill "$t" "$VOL_BYTES")
    log "$t: prefilled $VOL_GB GiB at ${FILL[$t]} MB/s"
    sync # the host's dirty pages written back before measuring (all targets alike)
    resnap "$t" 0
}
# resnap TARGET N: (snapshot targets) takes snapshot sN with the server up
# again afterwards.
resnap() {
    case $1 in
        cairn-snap) "$BIN" volume snapshot "$(pool_of "$1")" v "s$2" >/dev/null ;;
        qcow2-snap)
            stop_server "$1"
            qemu-img snapshot -c "s$2" "$W/img.qcow2"
            start_server "$1"
            ;;
    esac
}
teardown() { # TARGET
    stop_server "$1"
    rm -rf "${W:?}/raw.img" "$W/img.qcow2" "$(pool_of "$1")" "$W/$1"-data.img
}

# rate_run TARGET R: one fio run at R IOPS offered -> "achieved p50_us p99_us"
rate_run() {
    local r=$2 rr rw
    rr=$((r * 7 / 10)) rw=$((r - r * 7 / 10))
    fio --name=lat --ioengine=nbd --uri="$(uri "$1")" --size="$VOL_BYTES" --rw=randrw \
        --rwmixread=70 --bs=4k --iodepth=32 --rate_iops="$rr,$rw" --runtime="$RUNTIME" \
        --time_based --numjobs=1 --norandommap --randrepeat=0 --refill_buffers \
        --unified_rw_reporting=mixed --output-format=json --output="$W/lat.json" \
        >/dev/null 2>>"$W/fio.err" || die "fio failed on $1 at $r IOPS (see $W/fio.err)"
    json_get "$W/lat.json" '"%.0f %.0f %.0f %d" % (j["jobs"][0]["mixed"]["iops"],
        j["jobs"][0]["mixed"]["clat_ns"]["percentile"]["50.000000"] / 1e3,
        j["jobs"][0]["mixed"]["clat_ns"]["percentile"]["99.000000"] / 1e3, j["jobs"][0]["error"])'
}

# The rates, the targets given to `run_targets` interleaved: for each
# rate, ROUNDS rounds that each run every one still going once (the order rotated by one each
# round, a quiesce before each run), so that a noisy stretch of the
# machine falls on all of them alike; the medians go to $W/res-TARGET as
# "offered achieved p50 p99 sustained(1|0)". A target stops after two
# unsustained rates in a row.
declare -A FAILS
run_targets() { # TARGET...
    local ts=("$@") t n=0 r round k live
    for t in "${ts[@]}"; do
        log "target $t: setup"
        setup "$t"
        : >"$W/res-$t"
        FAILS[$t]=0
    done
    for r in $RATES; do
        n=$((n + 1))
        live=()
        for t in "${ts[@]}"; do
            [ "${FAILS[$t]}" -ge 2 ] || live+=("$t")
        done
        [ ${#live[@]} -gt 0 ] || break
        for t in "${live[@]}"; do
            [ $n = 1 ] || resnap "$t" $n
            : >"$W/runs-$t"
        done
        for round in $(seq "$ROUNDS"); do
            k=$(((round - 1) % ${#live[@]}))
            for t in "${live[@]:k}" "${live[@]:0:k}"; do
                quiesce
                read -r a p50 p99 e <<<"$(rate_run "$t" "$r")"
                [ "$e" = 0 ] || die "fio error $e on $t at $r IOPS"
                echo "$a $p50 $p99" >>"$W/runs-$t"
            done
        done
        for t in "${live[@]}"; do
            rate_result "$t" "$r"
        done
    done
    for t in "${ts[@]}"; do teardown "$t"; done
}
# rate_result TARGET R: the medians of the runs at R to $W/res-TARGET.
rate_result() {
    local t=$1 r=$2 a p50 p99 ok
    col() { awk -v c="$1" '{ print $c }' "$W/runs-$t"; }
    a=$(median $(col 1)) p50=$(median $(col 2)) p99=$(median $(col 3))
    ok=$(awk -v a="$a" -v r="$r" 'BEGIN { print (a >= 0.95 * r) ? 1 : 0 }')
    echo "$r $a $p50 $p99 $ok" >>"$W/res-$t"
    log "$t @ $r IOPS: achieved $a, p50 $p50 us, p99 $p99 us$([ "$ok" = 1 ] || echo ' (not sustained)')"
    if [ "$ok" = 1 ]; then FAILS[$t]=0; else FAILS[$t]=$((FAILS[$t] + 1)); fi
}
# qcow2 after the others, not beside them: its image grows by a 64 KiB
# cluster at the first write to each cluster after each snapshot (16 GiB
# for a 4 GiB volume over the seven rates, 2026-11-29), and with it in the
# host's page cache the targets' data no longer fit the cache of a 24 GiB
# machine: the Cairn daemons read 3 GiB each back from the disk during the
# last rates, and their p99 at 32,000 ops/s went from 0.8 to 2.3 ms (a
# contest for the page cache, not the targets' own latency). The targets
# of the issue's ratio (raw, cairn-snap) stay interleaved.
FIRST=() LATER=()
for t in $TARGETS; do
    case $t in qcow2*) LATER+=("$t") ;; *) FIRST+=("$t") ;; esac
done
[ ${#FIRST[@]} = 0 ] || run_targets "${FIRST[@]}"
[ ${#LATER[@]} = 0 ] || run_targets "${LATER[@]}"

# ------------------------------------------------------------ snapshot create
if [ "$SNAP_N" -gt 0 ]; then
    t=cairn-snaptime
    log "snapshot create: ${SNAP_GB} GiB volume, $SNAP_N x (CLI, control socket) under $SNAP_RATE write IOPS"
    "$BIN" mkfs "$(pool_of $t)" --force --record-size "$RECORD" \
        --device "ssd:$W/$t-data.img:$((SNAP_GB * 3))G" --sparse >/dev/null 2>&1 || die "mkfs for $t"
    "$BIN" volume create "$(pool_of $t)" v "${SNAP_GB}G" --block-size 4K >/dev/null
    start_server $t
    SNAP_FILLED="empty (SNAP_FILL=0)"
    if [ "$SNAP_FILL" = 1 ]; then
        SNAP_FILLED="prefilled at $(prefill $t $((SNAP_GB << 30))) MB/s"
    fi
    fio --name=w --ioengine=nbd --uri="$(uri $t)" --size="${SNAP_GB}G" --rw=randwrite --bs=4k \
        --iodepth=32 --rate_iops="$SNAP_RATE" --runtime=3600 --time_based --norandommap \
        --randrepeat=0 --refill_buffers --output-format=json --output="$W/snapw.json" \
        >/dev/null 2>>"$W/fio.err" &
    FIO_PID=$!
    sleep 3
    python3 - "$BIN" "$(pool_of $t)" "$SNAP_N" "$SNAP_GAPS" >"$W/snaptimes" <<'EOF'
import itertools, json, socket, subprocess, sys, time
binary, pool, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
gap_list = [float(g) for g in sys.argv[4].split()]

def cli(snap):
    t = time.perf_counter()
    subprocess.run([binary, "volume", "snapshot", pool, "v", snap], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t

def request(snap, wait):
    t = time.perf_counter()
    s = socket.socket(socket.AF_UNIX)
    s.connect(pool + "/control.sock")
    req = {"op": "volume_snapshot", "name": "v", "snap": snap, "wait": wait}
    s.sendall(json.dumps(req).encode() + b"\n")
    reply = json.loads(s.makefile("rb").readline())
    took = time.perf_counter() - t
    s.close()
    if "ok" not in reply:
        sys.exit("snapshot %s: %s" % (snap, reply))
    return took

# One kind after the other (a cut's commit would hold up the next durable
# snapshot, and the other way round), each call after the next pause.
cols = []
for kind, take in (("c", cli), ("d", lambda s: request(s, True)),
                   ("e", lambda s: request(s, False))):
    gaps = itertools.cycle(gap_list)
    col = []
    for i in range(n):
        time.sleep(next(gaps))
        col.append(take("%s%d" % (kind, i)))
    cols.append(col)
for row in zip(*cols):
    print(" ".join("%.3f" % (x * 1e3) for x in row))
EOF
    kill -INT "$FIO_PID"
    wait "$FIO_PID" || true
    FIO_PID=""
    SNAP_FIO=$(json_get "$W/snapw.json" '"%.0f write IOPS, p50 %.0f us, p99 %.0f us" % (j["jobs"][0]["write"]["iops"],
        j["jobs"][0]["write"]["clat_ns"]["percentile"]["50.000000"] / 1e3,
        j["jobs"][0]["write"]["clat_ns"]["percentile"]["99.000000"] / 1e3)' 2>/dev/null ||
        echo "fio gave no result")
    teardown $t
    stat_ms() { # column -> "median max"
        local v
        mapfile -t v < <(awk -v c="$1" '{ print $c }' "$W/snaptimes")
        echo "$(median "${v[@]}") $(printf '%s\n' "${v[@]}" | sort -g | tail -1)"
    }
    read -r CLI_MED CLI_MAX <<<"$(stat_ms 1)"
    read -r D_MED D_MAX <<<"$(stat_ms 2)"
    read -r C_MED C_MAX <<<"$(stat_ms 3)"
    log "snapshot create: CLI median $CLI_MED ms max $CLI_MAX ms; daemon median $D_MED ms max $D_MAX ms; cut (--no-wait) median $C_MED ms max $C_MAX ms"
fi
WALL=$(awk -v t="$(elapsed "$T_START")" 'BEGIN { printf "%.0f", t }')

verdict() { # median max -> met or missed against 10 ms
    awk -v a="$1" -v b="$2" 'BEGIN { print (b < 10) ? "met, max included" : (a < 10 ? "met at the median, not at the max" : "missed") }'
}

# ------------------------------------------------------------ plot
PNG=$OUT_DIR/latency.png
{
    echo "set terminal pngcairo size 1000,650"
    echo "set output '$PNG'"
    echo "set title 'NBD 4 KiB random, 70% read, iodepth 32, ${VOL_GB} GiB volume: p99 (solid), p50 (dashed)'"
    echo "set xlabel 'achieved ops/s'; set ylabel 'completion latency (us)'"
    echo "set logscale xy; set grid; set key top left"
    plots=() i=0
    for t in $TARGETS; do
        i=$((i + 1))
        cp "$W/res-$t" "$OUT_DIR/$t.dat"
        plots+=("'$OUT_DIR/$t.dat' using 2:4 with linespoints lc $i lw 2 dt 1 title '$t p99'")
        plots+=("'$OUT_DIR/$t.dat' using 2:3 with linespoints lc $i lw 1 dt 2 notitle")
    done
    if [ "${#plots[@]}" -gt 0 ]; then
        printf 'plot %s' "${plots[0]}"
        printf ', %s' "${plots[@]:1}"
        echo
    fi
} >"$W/plot.gp"
if [ -n "${TARGETS// /}" ]; then
    gnuplot "$W/plot.gp" 2>>"$W/gnuplot.err" || log "gnuplot failed: $(cat "$W/gnuplot.err")"
fi

# ------------------------------------------------------------ report
# field TARGET RATE COLUMN: a figure from the results ("" if not run)
field() { awk -v r="$2" -v c="$3" '$1 == r { print $c }' "$W/res-$1" 2>/dev/null; }
has() { [[ " $TARGETS " == *" $1 "* ]]; }
ratio() { [ -n "$1" ] && [ -n "$2" ] && div "$1" "$2" || echo "n/a"; }
# vs_qcow2 TARGET: per rate "R: p50 ratio, p99 ratio;" then the verdict.
# A rate only Cairn ran counts as Cairn ahead (qcow2 had already failed two
# lower rates); a rate only qcow2 ran counts against Cairn if qcow2
# sustained it.
vs_qcow2() {
    awk 'FNR == NR { q50[$1] = $3; q99[$1] = $4; qs[$1] = $5; next }
        { c[$1] = 1
          if (!($1 in q50)) { s = s sprintf("%s: qcow2 stopped before%s; ", $1, $5 ? "" : " (Cairn not sustained either)"); next }
          a = $3 / q50[$1]; b = $4 / q99[$1]; if (a >= 1 || b >= 1) bad = 1
          s = s sprintf("%s: %.2f, %.2f; ", $1, a, b) }
        END { for (r in q50) if (!(r in c)) { s = s sprintf("%s: Cairn stopped before; ", r); if (qs[r]) bad = 1 }
              printf "%s-> %s", s, bad ? "NOT ahead at every rate" : "ahead at every rate" }' \
        "$W/res-qcow2-snap" "$W/res-$1"
}
report() {
    cat <<EOF
## Cairn block volumes: latency at a given rate ($(date -u +%F), $(nproc) cores, wall time ${WALL}s)

fio nbd engine (libnbd, one connection), 4 KiB random, 70% read, iodepth 32, rate-limited
(--rate_iops offered split 70/30 between reads and writes), ${RUNTIME} s per rate, ROUNDS=$ROUNDS
(medians; raw and the Cairn targets interleaved, qcow2 after them, a quiesce before each run); ${VOL_GB} GiB volume prefilled with
random bytes; every backing store on $FSDESC
(host page cache in use for all four). Latency is fio's completion latency (clat) of reads and
writes together. Sustained: achieved >= 95% of offered; a target stops after two unsustained
rates in a row. Cairn: \`cairn nbd serve\` (no mount), record size $RECORD, volume block size 4K,
sparse ssd data device, shipped config. Snapshot targets take a fresh snapshot before each rate
(earlier ones kept), so each step's writes overwrite snapshotted data. qcow2: qemu-nbd
$(qemu-nbd --version | head -1 | awk '{ print $2 }') defaults (cache=writeback, aio=threads), 64 KiB clusters.
EOF
    for t in $TARGETS; do
        echo
        echo "### $t (prefill ${FILL[$t]:-?} MB/s)"
        echo
        echo "| offered ops/s | achieved ops/s | p50 us | p99 us | sustained |"
        echo "|---|---|---|---|---|"
        awk '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 ? "yes" : "no" }' "$W/res-$t"
    done
    echo
    echo "### Summary"
    echo
    if has raw && has cairn-snap; then
        local rmax half rh
        rmax=$(awk '$5 == 1 { m = $1 } END { print m + 0 }' "$W/res-raw")
        half=$((rmax / 2))
        rh=$(awk -v h="$half" '$1 <= h { m = $1 } END { print m + 0 }' "$W/res-raw")
        if [ "$rh" -gt 0 ] && [ -n "$(field cairn-snap "$rh" 3)" ]; then
            local p50r p99r
            p50r=$(ratio "$(field cairn-snap "$rh" 3)" "$(field raw "$rh" 3)")
            p99r=$(ratio "$(field cairn-snap "$rh" 4)" "$(field raw "$rh" 4)")
            echo "- raw's highest sustained rate: $rmax ops/s; at $rh ops/s (the highest rate run <= half of it):" \
                "cairn-snap / raw latency p50 ${p50r}x, p99 ${p99r}x (target <= 1.5x:" \
                "$(awk -v a="$p50r" -v b="$p99r" 'BEGIN { print (a <= 1.5 && b <= 1.5) ? "met" : (a <= 1.5 ? "met at p50, missed at p99" : "missed") }'))"
        else
            echo "- cairn-snap / raw at half of raw's highest sustained rate ($rmax ops/s): no common rate"
        fi
    fi
    if has qcow2-snap; then
        local c
        for c in cairn cairn-snap; do
            has "$c" || continue
            echo "- $c vs qcow2-snap, latency $c / qcow2-snap per offered rate (p50, p99; below 1: Cairn ahead): $(vs_qcow2 "$c")"
        done
    fi
    if [ "$SNAP_N" -gt 0 ]; then
        echo "- snapshot create on a ${SNAP_GB} GiB volume ($SNAP_FILLED) while fio writes 4 KiB random at $SNAP_RATE IOPS ($SNAP_FIO), $SNAP_N times each, pauses of $SNAP_GAPS s in turn before the calls:"
        echo "  \`cairn volume snapshot\` wall time median $CLI_MED ms, max $CLI_MAX ms;" \
            "daemon side (control-socket request to reply, durable) median $D_MED ms, max $D_MAX ms;" \
            "cut only (\`--no-wait\`, durable with the commit it starts) median $C_MED ms, max $C_MAX ms" \
            "(target < 10 ms, durable: $(verdict "$D_MED" "$D_MAX"); cut: $(verdict "$C_MED" "$C_MAX"))"
    fi
    echo "- plot: $PNG (data: $OUT_DIR/TARGET.dat: offered achieved p50_us p99_us sustained)"
}
report | tee "$OUT_DIR/report.md"
