#!/usr/bin/env bash
# Tiering and cache benchmark (the TIER seed's iometer profiles and the
# swapcache md5 loop), in one run:
#  1. the four iometer profiles with fio (direct I/O, NUMJOBS psync jobs,
#     RUNTIME seconds each, in this order on the same pool):
#       Max-Throughput-100%-read       32 KiB sequential read
#       RealLife-60%-random-65%-read   8 KiB, 60% random / 40% sequential
#       Max-Throughput-50%-read        32 KiB sequential, 50% read
#       Random-8K-70%-read             8 KiB random, 70% read
#     on three configurations:
#       pool  a fast nvme device (FAST_MB) plus an emulated slow hdd device
#       fast  the fast device alone, sized as the whole pool (FAST_MB +
#             SLOW_MB) so that capacity is not the difference
#       slow  the emulated slow device alone
#     with three sets, each a file written beforehand from /dev/urandom
#     whose accessed region is cut in NUMJOBS parts, one per job:
#       fit  a FIT_MB file, all of it accessed: fits the fast tier
#       hot  a BIG_MB file (larger than the fast tier) whose last HOT_MB
#            are accessed: that hot region is written last, so it lands on
#            the slow tier, and the mover must bring it up (and move cold
#            data down to make room) during the warm-up
#       big  a BIG_MB file, all of it accessed uniformly: the working set
#            itself is larger than the fast tier
#     The pool is warmed up before measuring: WARM_PASSES sequential read
#     passes over the accessed region (HOT_WARM_PASSES for hot), then
#     `tier migrate --now` twice. For hot, tier_demote_idle_secs is
#     HOT_IDLE_SECS (the cold data was written a minute before; the
#     benchmark compresses the hours a real pool has into that minute).
#  2. the swapcache md5 loop: a file of MD5_MB homed on the slow device of
#     a pool with a small nvme tier (filled first by another file) and an
#     ssd cache device, read_cache_mib=MD5_RAM_MB (smaller than the file),
#     tier mover off (so only the caches act); PASSES times: drop caches,
#     time md5sum of the file. Ratio against the same md5 on a pool of the
#     fast device alone with the same read_cache_mib.
# Figures are medians over RUNS where repeated; ratios are against figures
# measured in this same run. The slow device is emulated by Cairn itself
# (every I/O serialized, costing SLOW_LATENCY + bytes/SLOW_BW): results on
# it are labelled "emulated". Needs root (drop_caches), fuse3, fio, python3.
# Environment (defaults; QUICK=1 gives a ~4 minute run with smaller sizes,
# RUNTIME=5 and PASSES=4):
#   FAST_MB=1024 FIT_MB=512 BIG_MB=2048 HOT_MB=FIT_MB SLOW_MB=3*BIG_MB
#   SLOW_LATENCY=5ms SLOW_BW=100M RUNTIME=20 NUMJOBS=4 RUNS=1 WARM_PASSES=1
#   HOT_WARM_PASSES=5 HOT_IDLE_SECS=20
#   MD5_MB=512 MD5_RAM_MB=64 MD5_FAST_MB=64 PASSES=6
#   POOL_CONF="key=value ..."  cairn.toml settings for the fio pools
#     (e.g. "history_retention_secs=60"; default: the shipped config)
#   SETS="fit hot big"  working sets to run (SETS= skips fio); PASSES=0 skips md5
#   BENCH_DIR=/var/tmp KEEP=1
#   SEED=1  run only the TIER seed comparison (see seed_profiles below):
#     SEED_FILE_MB=512 SEED_FAST_MB=2048 SEED_SLOW_MB=2048 SEED_DEPTH=64
#     SEED_RUNTIME=RUNTIME SEED_ROUNDS=3
set -euo pipefail

if [ -n "${QUICK:-}" ]; then
    FAST_MB=${FAST_MB:-256} FIT_MB=${FIT_MB:-128} BIG_MB=${BIG_MB:-384}
    RUNTIME=${RUNTIME:-5} MD5_MB=${MD5_MB:-96} MD5_RAM_MB=${MD5_RAM_MB:-32}
    PASSES=${PASSES:-4}
fi
FAST_MB=${FAST_MB:-1024}
FIT_MB=${FIT_MB:-512}
BIG_MB=${BIG_MB:-2048}
HOT_MB=${HOT_MB:-$FIT_MB}
SLOW_MB=${SLOW_MB:-$((3 * BIG_MB))}
HOT_WARM_PASSES=${HOT_WARM_PASSES:-5}
HOT_IDLE_SECS=${HOT_IDLE_SECS:-20}
SLOW_LATENCY=${SLOW_LATENCY:-5ms}
SLOW_BW=${SLOW_BW:-100M}
RUNTIME=${RUNTIME:-20}
NUMJOBS=${NUMJOBS:-4}
RUNS=${RUNS:-1}
WARM_PASSES=${WARM_PASSES:-1}
MD5_MB=${MD5_MB:-512}
MD5_RAM_MB=${MD5_RAM_MB:-64}
MD5_FAST_MB=${MD5_FAST_MB:-64}
PASSES=${PASSES:-6}
POOL_CONF=${POOL_CONF:-}
SETS=${SETS-fit hot big}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"

. "$(dirname "$0")/lib.sh"
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }

[ "$(id -u)" = 0 ] || die "run as root (drop_caches, FUSE mounts)"
for t in fio fusermount3 python3 md5sum awk; do
    command -v "$t" >/dev/null || die "$t not installed (Debian: apt-get install -y ${t/fusermount3/fuse3})"
done
[ "$BIG_MB" -gt "$FAST_MB" ] || die "BIG_MB ($BIG_MB) must exceed FAST_MB ($FAST_MB)"
[ "$FIT_MB" -lt "$FAST_MB" ] || die "FIT_MB ($FIT_MB) must be below FAST_MB ($FAST_MB)"
[ "$HOT_MB" -lt "$FAST_MB" ] || die "HOT_MB ($HOT_MB) must be below FAST_MB ($FAST_MB)"
[ "$MD5_MB" -gt "$MD5_RAM_MB" ] || die "MD5_MB must exceed MD5_RAM_MB"
(cd "$ROOT" && cargo build --release -p cairn-cli >&2)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/cairn
T_START=$(now)
W=$(mktemp -d "$BENCH_DIR/cairn-tiering.XXXXXX")
MNT="$W/mnt"
mkdir -p "$MNT"
cleanup() {
    set +eu
    if mountpoint -q "$MNT"; then
        "$BIN" umount "$MNT" >/dev/null 2>&1 || fusermount3 -u -z "$MNT"
    fi
    if [ -z "${KEEP:-}" ]; then rm -rf --one-file-system "$W"; else log "kept $W"; fi
}
trap cleanup EXIT
log "work dir $W on $(findmnt -n -o SOURCE,FSTYPE -T "$W" | tr -s ' ')"

SLOW_EMU="latency=$SLOW_LATENCY:bw=$SLOW_BW"
fast_dev() { echo "nvme:$W/$1-fast.img:${2}M"; }            # pool name, MiB
slow_dev() { echo "hdd:$W/$1-slow.img:${SLOW_MB}M:$SLOW_EMU"; } # pool name

# mkpool NAME KEY=VALUE... -- DEVICE... : make a pool, set config keys, mount
mkpool() {
    local p="$W/$1" kv=() devs=()
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do kv+=("$1"); shift; done
    shift
    for d in "$@"; do devs+=(--device "$d"); done
    "$BIN" mkfs "$p" --force "${devs[@]}" >/dev/null
    for x in "${kv[@]}"; do
        grep -q "^${x%%=*} = " "$p/cairn.toml" || die "no key ${x%%=*} in cairn.toml"
        sed -i "s/^${x%%=*} = .*/${x%%=*} = ${x#*=}/" "$p/cairn.toml"
    done
    "$BIN" mount "$p" "$MNT" >/dev/null
}
unmount() { "$BIN" umount "$MNT" >/dev/null; }
remount() { unmount; "$BIN" mount "$W/$1" "$MNT" >/dev/null; }
rmpool() { unmount; rm -rf "${W:?}/$1" "$W/$1"-*.img; }
# MiB used per tier device: "nvme 1020 hdd 1030"
placement() {
    "$BIN" tier status "$MNT" --json | python3 -c '
import json, sys
print(" ".join("%s %d" % (d["class"], d["used"] >> 20) for d in json.load(sys.stdin) if d["role"] == "tier"))'
}
info_field() { # python expression on j (the info JSON)
    "$BIN" info "$MNT" --json | python3 -c "import json, sys; j = json.load(sys.stdin); print($1)"
}

# Does the mount take O_DIRECT? Otherwise fall back to buffered I/O with
# caches dropped before each run.
mkpool probe -- "$(fast_dev probe 64)"
if dd if=/dev/zero of="$MNT/d" bs=64k count=16 oflag=direct status=none 2>/dev/null &&
    dd if="$MNT/d" of=/dev/null bs=64k iflag=direct status=none 2>/dev/null; then
    DIRECT=1 IOMODE="O_DIRECT (fio --direct=1)"
else
    DIRECT=0 IOMODE="buffered, page cache dropped before each run (O_DIRECT refused)"
fi
rmpool probe
log "I/O mode: $IOMODE"

PROFILES=(mt100 reallife mt50 rand70)
declare -A PNAME PARGS
PNAME[mt100]="Max-Throughput-100%-read (32K seq)"
PARGS[mt100]="--rw=read --bs=32k"
PNAME[reallife]="RealLife-60%-random-65%-read (8K)"
PARGS[reallife]="--rw=randrw --percentage_random=60 --rwmixread=65 --bs=8k"
PNAME[mt50]="Max-Throughput-50%-read (32K seq)"
PARGS[mt50]="--rw=rw --rwmixread=50 --bs=32k"
PNAME[rand70]="Random-8K-70%-read"
PARGS[rand70]="--rw=randrw --rwmixread=70 --bs=8k"

# (read + write; ERR is fio's errno, 0 if none); job i works on part i of the region
# set_geom SET -> "FILE_MB REGION_OFFSET_MB REGION_MB WARM_PASSES"
set_geom() {
    case $1 in
        fit) echo "$FIT_MB 0 $FIT_MB $WARM_PASSES" ;;
        hot) echo "$BIG_MB $((BIG_MB - HOT_MB)) $HOT_MB $HOT_WARM_PASSES" ;;
        big) echo "$BIG_MB 0 $BIG_MB $WARM_PASSES" ;;
        *) die "unknown set $1 (fit, hot, big)" ;;
    esac
}

# fio_run PROFILE FILE_MB REGION_OFFSET_MB REGION_MB -> "IOPS MB/s ERR"
fio_run() {
    local part=$(($4 / NUMJOBS)) out
    [ "$DIRECT" = 1 ] || drop
    # shellcheck disable=SC2086
    out=$(fio --name="$1" --filename="$MNT/ws" --filesize="$2M" --size="${part}M" \
        --offset="$3M" --offset_increment="${part}M" --numjobs="$NUMJOBS" --group_reporting \
        --ioengine=psync --direct="$DIRECT" --runtime="$RUNTIME" --time_based \
        --output-format=json ${PARGS[$1]} 2>>"$W/fio.err") || true
    # fio prints I/O errors on stdout ahead of the JSON
    python3 -c '
import json, sys
s = sys.stdin.read()
j = json.loads(s[s.index("{"):])["jobs"][0]
iops = j["read"]["iops"] + j["write"]["iops"]
mbs = (j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1e6
print("%.0f %.1f %d" % (iops, mbs, j["error"]))' <<<"$out" || die "fio gave no result for $1 (see $W/fio.err, KEEP=1)"
}

# SEED=1: the TIER seed's run alone. The four profiles back to back on one
# SEED_FILE_MB file, on a pool of a SEED_FAST_MB nvme device plus the
# emulated hdd (SLOW_LATENCY, SLOW_BW) and on the nvme device alone, in
# this same run. fio keeps SEED_DEPTH I/Os in flight: with O_DIRECT
# accepted, one job with ioengine=libaio and iodepth=SEED_DEPTH (direct=1);
# otherwise psync with SEED_DEPTH jobs (each synchronous, so the depth is the
# number of jobs). SEED_ROUNDS rounds, each on fresh pools, the two
# configurations in an order that alternates by round (so that a noisy
# stretch of a shared machine falls on both alike). Prints per profile the
# medians of IOPS and MB/s over the rounds, pool / fast-alone of the
# medians and the ratio of each round; then, from the last round, the
# space each pool held before and after deleting the file (info --json:
# history_only_bytes, stored_bytes). Pool settings are the shipped config
# (fine-grained history kept one day) plus POOL_CONF.
seed_profiles() {
    local fmb=${SEED_FILE_MB:-512} fast=${SEED_FAST_MB:-2048} slow=${SEED_SLOW_MB:-2048}
    local depth=${SEED_DEPTH:-64} rt=${SEED_RUNTIME:-$RUNTIME} cfg p r conf=() eng
    read -ra conf <<<"$POOL_CONF"
    if [ "$DIRECT" = 1 ]; then
        eng="--ioengine=libaio --iodepth=$depth --numjobs=1 --direct=1"
    else
        eng="--ioengine=psync --numjobs=$depth --direct=0"
    fi
    log "seed: $fmb MiB file, $rt s per profile, fio $eng"
    local rounds=${SEED_ROUNDS:-3} round order
    declare -A SIOPS SMBS
    for round in $(seq 1 "$rounds"); do
        order="pool fast"
        [ $((round % 2)) = 1 ] || order="fast pool"
        for cfg in $order; do
            seed_round "$cfg" "$round"
        done
    done
    echo "## TIER seed profiles: $fmb MiB file, ${fast} MiB nvme + emulated hdd ($SLOW_LATENCY, $SLOW_BW) vs nvme alone"
    echo
    echo "fio: $eng, $rt s per profile, in order. I/O mode: $IOMODE. Medians of $rounds rounds (fresh pools each, pool and nvme alone in alternating order)."
    echo
    echo "| profile | pool IOPS | pool MB/s | nvme alone IOPS | nvme alone MB/s | pool / nvme alone | per round |"
    echo "|---|---|---|---|---|---|---|"
    local pi pm fi_ fm each
    for p in "${PROFILES[@]}"; do
        pi=() pm=() fi_=() fm=() each=()
        for round in $(seq 1 "$rounds"); do
            pi+=("${SIOPS[pool,$p,$round]}") pm+=("${SMBS[pool,$p,$round]}")
            fi_+=("${SIOPS[fast,$p,$round]}") fm+=("${SMBS[fast,$p,$round]}")
            each+=("$(div "${SIOPS[pool,$p,$round]}" "${SIOPS[fast,$p,$round]}")")
        done
        pi=$(median "${pi[@]}") pm=$(median "${pm[@]}") fi_=$(median "${fi_[@]}") fm=$(median "${fm[@]}")
        echo "| ${PNAME[$p]} | $pi | $pm | $fi_ | $fm | $(div "$pi" "$fi_") | ${each[*]} |"
    done
    echo
    for cfg in pool fast; do
        echo "- $cfg (last round): before the delete ${SEED_HELD[$cfg,before]} MiB stored; after deleting the file: ${SEED_HELD[$cfg]}"
    done
}

# seed_round CFG ROUND: one configuration's run of the four profiles (see
# seed_profiles, whose locals it uses); sets SIOPS/SMBS[CFG,PROFILE,ROUND].
seed_round() {
    local cfg=$1 round=$2 p r
    case $cfg in
        pool) mkpool "seed-$cfg" "${conf[@]}" -- "$(fast_dev "seed-$cfg" "$fast")" \
            "hdd:$W/seed-$cfg-slow.img:${slow}M:$SLOW_EMU" ;;
        fast) mkpool "seed-$cfg" "${conf[@]}" -- "$(fast_dev "seed-$cfg" "$fast")" ;;
    esac
    head -c "$((fmb << 20))" /dev/urandom >"$MNT/ws"
    "$BIN" sync "$MNT" >/dev/null
    for p in "${PROFILES[@]}"; do
        [ "$DIRECT" = 1 ] || drop
        # shellcheck disable=SC2086
        r=$(fio --name="$p" --filename="$MNT/ws" --size="${fmb}M" $eng --group_reporting \
            --runtime="$rt" --time_based --output-format=json ${PARGS[$p]} 2>>"$W/fio.err" |
            python3 -c '
import json, sys
s = sys.stdin.read()
j = json.loads(s[s.index("{"):])["jobs"][0]
print("%.0f %.1f" % (j["read"]["iops"] + j["write"]["iops"],
                 (j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1e6))') ||
            die "fio gave no result for $p (see $W/fio.err, KEEP=1)"
        read -r "SIOPS[$cfg,$p,$round]" "SMBS[$cfg,$p,$round]" <<<"$r"
        log "seed round $round $cfg $p: ${SIOPS[$cfg,$p,$round]} IOPS ${SMBS[$cfg,$p,$round]} MB/s; placement $(placement)"
    done
    "$BIN" sync "$MNT" >/dev/null
    SEED_HELD[$cfg,before]=$(info_field 'j["stored_bytes"] >> 20')
    rm -f "$MNT/ws"
    "$BIN" sync "$MNT" >/dev/null
    SEED_HELD[$cfg]=$(info_field '"%d MiB stored, %d MiB of it history-only" % (j["stored_bytes"] >> 20, j["history_only_bytes"] >> 20)')
    rmpool "seed-$cfg"
}
declare -A SEED_HELD
if [ -n "${SEED:-}" ]; then
    seed_profiles
    exit 0
fi

declare -A IOPS MBS NOTE ERR
SRC="$W/src"
head -c "$((BIG_MB << 20))" /dev/urandom >"$SRC"

# bench_config SET(fit|big) CONFIG(pool|fast|slow) WS_MB
bench_config() {
    local set=$1 cfg=$2 name="$1-$2" t0 p r a b e iops=() mbs=() ws roff rmb warm
    local conf=()
    read -r ws roff rmb warm <<<"$(set_geom "$set")"
    read -ra conf <<<"$POOL_CONF"
    [ "$set" != hot ] || conf+=("tier_demote_idle_secs=$HOT_IDLE_SECS")
    case $cfg in
        pool) mkpool "$name" "${conf[@]}" -- "$(fast_dev "$name" "$FAST_MB")" "$(slow_dev "$name")" ;;
        fast) mkpool "$name" "${conf[@]}" -- "$(fast_dev "$name" $((FAST_MB + SLOW_MB)))" ;;
        slow) mkpool "$name" "${conf[@]}" -- "$(slow_dev "$name")" ;;
    esac
    log "$name: writing the $ws MiB file (accessed: $rmb MiB from $roff MiB)"
    t0=$(now)
    head -c "$((ws << 20))" "$SRC" >"$MNT/ws"
    "$BIN" sync "$MNT" >/dev/null
    NOTE[$name,write]=$(div "$ws" "$(elapsed "$t0")")
    NOTE[$name,placed]=$(placement)
    if [ "$cfg" = pool ]; then
        log "$name: warm-up ($warm read passes, 2 mover passes); placement: ${NOTE[$name,placed]}"
        t0=$(now)
        for _ in $(seq "$warm"); do
            dd if="$MNT/ws" of=/dev/null bs=1M skip="$roff" count="$rmb" iflag=direct status=none
        done
        NOTE[$name,warmread]=$(div $((rmb * warm)) "$(elapsed "$t0")")
        NOTE[$name,moved]=""
        for _ in 1 2; do
            NOTE[$name,moved]+="$("$BIN" tier migrate "$MNT" --now --json | python3 -c '
import json, sys; r = json.load(sys.stdin); print("+%d/-%d " % (r["promoted"], r["demoted"]), end="")')"
        done
        NOTE[$name,warm]=$(placement)
    fi
    for p in "${PROFILES[@]}"; do
        iops=() mbs=() ERR[$name,$p]=""
        for _ in $(seq "$RUNS"); do
            r=$(fio_run "$p" "$ws" "$roff" "$rmb")
            read -r a b e <<<"$r"
            iops+=("$a") mbs+=("$b")
            [ "$e" = 0 ] || ERR[$name,$p]=" (fio error $e)"
        done
        IOPS[$name,$p]=$(median "${iops[@]}")
        MBS[$name,$p]=$(median "${mbs[@]}")
        log "$name ${PNAME[$p]}: ${IOPS[$name,$p]} IOPS ${MBS[$name,$p]} MB/s${ERR[$name,$p]} ($(placement))"
    done
    NOTE[$name,after]=$(placement)
    rmpool "$name"
}

for set in $SETS; do
    set_geom "$set" >/dev/null
    for cfg in fast slow pool; do bench_config "$set" $cfg; done
done

# ------------------------------------------------------------ md5 loop
if [ "$PASSES" -gt 0 ]; then
    log "md5 loop: $MD5_MB MiB file"
    head -c "$((MD5_MB << 20))" "$SRC" >"$W/md5src"
    SUM=$(md5sum <"$W/md5src" | cut -d' ' -f1)
    md5_pass() { # -> seconds; checks the sum
        local t0 s
        drop
        t0=$(now)
        s=$(md5sum <"$MNT/f" | cut -d' ' -f1)
        [ "$s" = "$SUM" ] || die "md5 of $MNT/f differs from its source"
        awk -v t="$(elapsed "$t0")" 'BEGIN { printf "%.2f", t }'
    }
    mkpool md5fast read_cache_mib="$MD5_RAM_MB" -- "$(fast_dev md5fast $((MD5_MB * 2)))"
    cp "$W/md5src" "$MNT/f"
    remount md5fast
    v=()
    for _ in 1 2 3; do
        s=$(md5_pass)
        v+=("$s")
    done
    MD5_FAST=$(median "${v[@]}")
    rmpool md5fast

    mkpool md5pool read_cache_mib="$MD5_RAM_MB" tier_interval_secs=0 \
        cache_fill_burst_mib="$((MD5_MB > 1024 ? MD5_MB : 1024))" -- \
        "$(fast_dev md5pool "$MD5_FAST_MB")" "$(slow_dev md5pool)" \
        "ssd:$W/md5pool-cache.img:$((MD5_MB * 2))M:role=cache"
    head -c "$(((MD5_FAST_MB + 8) << 20))" /dev/urandom >"$MNT/filler"
    "$BIN" sync "$MNT" >/dev/null
    cp "$W/md5src" "$MNT/f"
    "$BIN" sync "$MNT" >/dev/null
    MD5_PLACED=$(placement)
    remount md5pool
    MD5_ROWS=""
    for i in $(seq "$PASSES"); do
        s=$(md5_pass)
        r=$(info_field '"%d %d %d" % (j["ssd_cache"]["hits"], j["ssd_cache"]["misses"], j["ssd_cache"]["filled_bytes"] >> 20)')
        read -r hits misses filled <<<"$r"
        log "md5 pass $i: $s s (ssd cache: $hits hits, $misses misses, $filled MiB filled)"
        MD5_ROWS+="| pass $i | $s s | $(div "$s" "$MD5_FAST") x fast-alone | $hits / $misses / $filled MiB |"$'\n'
    done
    rmpool md5pool
fi
WALL=$(awk -v t="$(elapsed "$T_START")" 'BEGIN { printf "%.0f", t }')

# ------------------------------------------------------------ report
RAM_CACHE_MB=$(sed -n 's/.*read_cache_mib=\([0-9]*\).*/\1/p' <<<"$POOL_CONF")
RAM_CACHE_MB=${RAM_CACHE_MB:-256}
ratio_cell() { # a b target -> "r" or "r (miss)"
    local r
    r=$(div "$1" "$2")
    awk -v r="$r" -v t="$3" 'BEGIN { if (r == "n/a" || r + 0 >= t) print r; else print r " (miss)" }'
}
cat <<EOF

## Cairn tiering benchmark ($(date -u +%F), $(nproc) cores, $((RUNTIME))s per fio run, $NUMJOBS psync jobs, RUNS=$RUNS, wall time ${WALL}s)

(emulated slow device: latency $SLOW_LATENCY, bw $SLOW_BW; hdd class, every I/O serialized)
fast = nvme file on $(findmnt -n -o SOURCE,FSTYPE -T "$W" | tr -s ' '): $FAST_MB MiB in the pool, $((FAST_MB + SLOW_MB)) MiB alone (the pool's capacity); slow: $SLOW_MB MiB; I/O: $IOMODE;
fio pools: shipped config (read_cache_mib 256, tier_interval_secs 30, history_retention_secs 86400)${POOL_CONF:+ overridden by: $POOL_CONF}; ratios are of IOPS (the same as of MB/s); pool warmed up with $WARM_PASSES sequential read pass(es) of the set then 2x \`tier migrate --now\`.
EOF
# set_title SET: what the set is, for the report
set_title() {
    local ws roff rmb warm
    read -r ws roff rmb warm <<<"$(set_geom "$1")"
    case $1 in
        fit) echo "Working set $rmb MiB, fits the $FAST_MB MiB fast tier" ;;
        hot) echo "Hot region: $rmb MiB accessed at the end of a $ws MiB file (the file is larger than the $FAST_MB MiB fast tier; the hot region was written last, onto the slow tier; warm-up $warm passes, tier_demote_idle_secs=$HOT_IDLE_SECS)" ;;
        big) echo "Working set $ws MiB accessed uniformly, larger than the $FAST_MB MiB fast tier: at most $((FAST_MB * 9 / 10)) MiB of it (tier_fast_full_pct) plus the $RAM_CACHE_MB MiB RAM cache is off the slow device, so a uniform random read hits the slow device with probability >= $(awk -v w="$ws" -v f="$FAST_MB" -v r="$RAM_CACHE_MB" 'BEGIN { printf "%.2f", (w - f * 0.9 - r) / w }') and pool/slow cannot exceed about $(awk -v w="$ws" -v f="$FAST_MB" -v r="$RAM_CACHE_MB" 'BEGIN { printf "%.1f", w / (w - f * 0.9 - r) }') on random profiles" ;;
    esac
}
for set in $SETS; do
    fits=0
    [ "$set" = big ] || fits=1
    cat <<EOF

### $(set_title "$set")

| profile | pool IOPS | pool MB/s | fast IOPS | fast MB/s | slow IOPS (emulated) | slow MB/s | pool/slow (target >= 10) | pool/fast$([ $fits = 1 ] && echo " (target >= 0.9)") |
|---|---|---|---|---|---|---|---|---|
EOF
    for p in "${PROFILES[@]}"; do
        pf=$(div "${IOPS[$set-pool,$p]}" "${IOPS[$set-fast,$p]}")
        [ $fits = 1 ] && pf=$(ratio_cell "${IOPS[$set-pool,$p]}" "${IOPS[$set-fast,$p]}" 0.9)
        echo "| ${PNAME[$p]} | ${IOPS[$set-pool,$p]}${ERR[$set-pool,$p]} | ${MBS[$set-pool,$p]} | ${IOPS[$set-fast,$p]}${ERR[$set-fast,$p]} | ${MBS[$set-fast,$p]} | ${IOPS[$set-slow,$p]}${ERR[$set-slow,$p]} | ${MBS[$set-slow,$p]} | $(ratio_cell "${IOPS[$set-pool,$p]}" "${IOPS[$set-slow,$p]}" 10) | $pf |"
    done
    cat <<EOF

| $set set, MiB used per tier device | pool | fast | slow |
|---|---|---|---|
| after writing the set | ${NOTE[$set-pool,placed]} | ${NOTE[$set-fast,placed]} | ${NOTE[$set-slow,placed]} |
| after warm-up (read ${NOTE[$set-pool,warmread]} MB/s; mover promoted/demoted ${NOTE[$set-pool,moved]}) | ${NOTE[$set-pool,warm]} | | |
| after the four profiles | ${NOTE[$set-pool,after]} | ${NOTE[$set-fast,after]} | ${NOTE[$set-slow,after]} |
| writing the set (MB/s) | ${NOTE[$set-pool,write]} | ${NOTE[$set-fast,write]} | ${NOTE[$set-slow,write]} |
EOF
done
[ "$PASSES" -gt 0 ] || exit 0
cat <<EOF

### md5 loop: $MD5_MB MiB file homed on the slow device (emulated: latency $SLOW_LATENCY, bw $SLOW_BW)

Pool: nvme tier $MD5_FAST_MB MiB (filled first by another file) + hdd tier + ssd cache device $((MD5_MB * 2)) MiB;
read_cache_mib=$MD5_RAM_MB; tier mover off; placement after writing: $MD5_PLACED. Caches dropped before each pass; the
SSD cache starts cold (remount). fast-alone: the same file on a pool of the nvme device alone, median of 3 passes: $MD5_FAST s.

| pass | time | ratio (target <= 1.5) | ssd cache hits / misses / filled (cumulative) |
|---|---|---|---|
$MD5_ROWS
EOF
