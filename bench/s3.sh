#!/usr/bin/env bash
# The S3 object-store tier (issue 19) against two S3 servers on this
# machine: a three-node Garage cluster (three `garage server` processes on
# loopback ports, replication factor 3, sqlite metadata) and s3s-fs (one
# file-backed server, the one the tests use).
#
# For each store: a pool of one local ssd device with the mover off and
# tier_fast_full_pct = 1 (so `cairn tier migrate --now` demotes every sealed
# segment), plus the bucket added as an s3 tier. Then ROUNDS times:
#   demotion   DATA_MB of incompressible data written and synced, then
#              `tier migrate --now` timed: MB/s demoted, PUTs per GiB;
#   foreground FG_MB written with fsync (dd) alone, then again while a
#              demotion of another DATA_MB runs, then alone again: the
#              ratio of "during" to the mean of the two "alone" (target:
#              the demotion slows foreground writes by at most 10%);
#   cold read  remount (RAM cache empty) and page cache dropped: the first
#              sequential read of the demoted data (MB/s, GETs per GiB), the
#              second read in the same mount, page cache dropped (Cairn's
#              RAM cache, sized to hold the data: local speed), and
#              the same read from a local file on the same disk for scale;
#   random     RANDOM_N 4 KiB reads at random offsets of cold demoted data:
#              GETs per read (target: 1).
# Then once per store, a mirror kept in the bucket: a pool of DATA_MB
# (half of it a copy of the other half: dedup) copied with `cairn mirror
# copy SRC s3:...` (MB/s, PUTs per GiB), an increment of 1/8 of it, and
# `cairn mirror restore` into a new mirror pool (MB/s, GETs per GiB).
# Medians over ROUNDS. Prints one table per store and a summary.
#
# Environment (defaults): STORES="garage s3s" DATA_MB=1024 FG_MB=512
#   ROUNDS=3 RANDOM_N=200 BENCH_DIR=/var/tmp NO_BUILD=1 (use
#   target/release/cairn as is) BIN GARAGE (binary; installed with
#   `cargo install garage --locked` if missing: ~20 min on 2 cores)
#   S3S_FS (binary; scripts/deps.sh test installs it).
# Quick run: DATA_MB=256 FG_MB=128 ROUNDS=1 bash bench/s3.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

STORES=${STORES:-garage s3s}
DATA_MB=${DATA_MB:-1024}
FG_MB=${FG_MB:-512}
ROUNDS=${ROUNDS:-3}
RANDOM_N=${RANDOM_N:-200}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
GARAGE=${GARAGE:-$(command -v garage || echo "$HOME/.cargo/bin/garage")}
S3S_FS=${S3S_FS:-$(command -v s3s-fs || echo "$HOME/.cargo/bin/s3s-fs")}
if [ -z "${BIN:-}" ]; then
    [ -n "${NO_BUILD:-}" ] || cargo build --release -p cairn-cli >&2
    BIN=$PWD/target/release/cairn
fi
W=$(mktemp -d "$BENCH_DIR/cairn-s3.XXXXXX")
chmod 700 "$W"
PIDS=()
cleanup() {
    is_mounted "$W/mnt" && "$BIN" umount "$W/mnt" >/dev/null 2>&1
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT

# ------------------------------------------------------------ stores
# Each sets ENDPOINT, REGION and writes $W/creds (0600).
creds() { # KEY SECRET
    (umask 077 && printf 'aws_access_key_id = %s\naws_secret_access_key = %s\n' "$1" "$2" >"$W/creds")
}

start_garage() {
    if [ ! -x "$GARAGE" ]; then
        log "installing garage (cargo install garage --locked)"
        cargo install garage --locked >&2
        GARAGE=$HOME/.cargo/bin/garage
    fi
    local g=$W/garage secret i id
    secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
    for i in 1 2 3; do
        mkdir -p "$g/n$i/meta" "$g/n$i/data"
        (umask 077 && cat >"$g/n$i.toml") <<EOF
metadata_dir = "$g/n$i/meta"
data_dir = "$g/n$i/data"
db_engine = "sqlite"
replication_factor = 3
rpc_bind_addr = "127.0.0.1:$((39000 + i * 10 + 1))"
rpc_public_addr = "127.0.0.1:$((39000 + i * 10 + 1))"
rpc_secret = "$secret"
[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$((39000 + i * 10))"
root_domain = ".s3.garage.localhost"
EOF
        "$GARAGE" -c "$g/n$i.toml" server >"$g/n$i.log" 2>&1 &
        PIDS+=($!)
    done
    gx() { "$GARAGE" -c "$g/n1.toml" "$@"; }
    for _ in $(seq 50); do gx status >/dev/null 2>&1 && break; sleep 0.2; done
    for i in 2 3; do gx node connect "$("$GARAGE" -c "$g/n$i.toml" node id -q)" >/dev/null; done
    for i in 1 2 3; do
        id=$("$GARAGE" -c "$g/n$i.toml" node id -q | cut -d@ -f1)
        gx layout assign -z "dc$i" -c 8G "$id" >/dev/null
    done
    gx layout apply --version 1 >/dev/null
    gx key create bench >/dev/null
    gx bucket create cairn >/dev/null
    gx bucket allow --read --write --owner cairn --key bench >/dev/null
    local info
    info=$(gx key info bench --show-secret)
    creds "$(awk '/Key ID:/ { print $3 }' <<<"$info")" "$(awk '/Secret key:/ { print $3 }' <<<"$info")"
    ENDPOINT=http://127.0.0.1:39010 REGION=garage
}

start_s3s() {
    [ -x "$S3S_FS" ] || die "s3s-fs not found (bash scripts/deps.sh test installs it)"
    local key secret
    key=bench$RANDOM secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    mkdir -p "$W/s3s/cairn"
    "$S3S_FS" --host 127.0.0.1 --port 39100 --access-key "$key" --secret-key "$secret" \
        "$W/s3s" >"$W/s3s.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 50); do
        curl -s -o /dev/null http://127.0.0.1:39100/ && break
        sleep 0.2
    done
    creds "$key" "$secret"
    ENDPOINT=http://127.0.0.1:39100 REGION=us-east-1
}

# ------------------------------------------------------------ pool
s3info() { # KEY -> the s3 device's object_store counter
    "$BIN" info "$W/mnt" --json | python3 -c '
import json, sys
d = [d for d in json.load(sys.stdin)["devices"] if d.get("object_store")]
print(d[0]["object_store"][sys.argv[1]] if d else 0)' "$1"
}

make_pool() {
    is_mounted "$W/mnt" && "$BIN" umount "$W/mnt" >/dev/null
    rm -rf "$W/pool" "$W/ssd.img"
    mkdir -p "$W/mnt"
    local gb=$(((DATA_MB * (ROUNDS * 2 + 1) + FG_MB * ROUNDS * 2) / 1024 + 2))
    "$BIN" mkfs "$W/pool" --device "ssd:$W/ssd.img:${gb}G" --sparse >/dev/null 2>&1
    local k
    # The RAM read cache holds one round's data, so that the second read
    # shows Cairn's cache (the kernel's page cache is dropped before it).
    for k in tier_interval_secs=0 gc_interval_secs=0 tier_fast_full_pct=1 \
        read_cache_mib=$((DATA_MB + 64)) "s3_credentials_file=\"$W/creds\""; do
        set_conf "$W/pool/cairn.toml" "${k%%=*}" "${k#*=}"
    done
    "$BIN" mount "$W/pool" "$W/mnt" >/dev/null
    "$BIN" device add "$W/mnt" "s3:cairn/bench-$1:endpoint=$ENDPOINT:region=$REGION" >/dev/null
}

remount_cold() {
    "$BIN" umount "$W/mnt" >/dev/null
    drop_caches
    "$BIN" mount "$W/pool" "$W/mnt" >/dev/null
}

write_data() { # FILE MB -> written and synced
    head -c $(($2 << 20)) /dev/urandom >"$1"
    "$BIN" sync "$W/mnt" >/dev/null
}

mbps() { awk -v mb="$1" -v s="$2" 'BEGIN { printf "%.1f", mb / s }'; }
per_gib() { awk -v n="$1" -v mb="$2" 'BEGIN { printf "%.0f", n * 1024 / mb }'; }

settle() { sync; sleep 2; }

fg_write() { # FILE -> MB/s of FG_MB written with fsync
    local t0
    t0=$(now)
    dd if="$W/fg.src" of="$1" bs=1M count="$FG_MB" conv=fsync status=none
    mbps "$FG_MB" "$(elapsed "$t0")"
}

seq_read() { # FILE -> MB/s
    local t0 mb
    mb=$(($(stat -c %s "$1") >> 20))
    t0=$(now)
    dd if="$1" of=/dev/null bs=1M status=none
    mbps "$mb" "$(elapsed "$t0")"
}

random_reads() { # FILE N -> reads done (4 KiB each, random offsets)
    python3 - "$1" "$2" <<'EOF'
import os, random, sys
path, n = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
blocks = os.fstat(fd).st_size // 4096
rng = random.Random(7)
for off in rng.sample(range(blocks), n):
    assert len(os.pread(fd, 4096, off * 4096)) == 4096
print(n)
EOF
}

jget() { # JSON-FILE PATH.TO.KEY
    python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): v = v[k]
print(v)' "$1" "$2"
}

mirror_step() { # STORE: copy to the bucket, an increment, a restore
    local s=$1 spec t0 half=$((DATA_MB / 2)) inc=$((DATA_MB / 8))
    spec="s3:cairn/mirror-$s:endpoint=$ENDPOINT:region=$REGION"
    rm -rf "$W/msrc" "$W/mdst" "$W/msrc.img" "$W/mdst.img"
    mkdir -p "$W/msrc.mnt" "$W/mdst.mnt"
    "$BIN" mkfs "$W/msrc" --device "ssd:$W/msrc.img:$((DATA_MB * 3 / 1024 + 2))G" --sparse >/dev/null 2>&1
    "$BIN" mkfs "$W/mdst" --mirror --device "ssd:$W/mdst.img:$((DATA_MB * 3 / 1024 + 2))G" --sparse >/dev/null 2>&1
    "$BIN" mount "$W/msrc" "$W/msrc.mnt" >/dev/null
    head -c $((half << 20)) /dev/urandom >"$W/msrc.mnt/a"
    cp "$W/msrc.mnt/a" "$W/msrc.mnt/b"
    log "$s: mirror copy of $DATA_MB MB ($half MB distinct) to the bucket"
    t0=$(now)
    "$BIN" mirror copy "$W/msrc.mnt" "$spec" --credentials-file "$W/creds" --json >"$W/m1.json"
    R[$s,mcopy]=$(mbps "$DATA_MB" "$(elapsed "$t0")")
    R[$s,mputs]=$(per_gib "$(jget "$W/m1.json" requests.puts)" "$DATA_MB")
    head -c $((inc << 20)) /dev/urandom >"$W/msrc.mnt/c"
    t0=$(now)
    "$BIN" mirror copy "$W/msrc.mnt" "$spec" --credentials-file "$W/creds" --json >"$W/m2.json"
    R[$s,minc]=$(mbps "$inc" "$(elapsed "$t0")")
    R[$s,mincput]=$(jget "$W/m2.json" bucket.chunks_put)
    local want
    want=$(cd "$W/msrc.mnt" && sha256sum a b c)
    "$BIN" umount "$W/msrc.mnt" >/dev/null
    log "$s: mirror restore into a new pool"
    drop_caches
    t0=$(now)
    "$BIN" mirror restore "$spec" "$W/mdst" --credentials-file "$W/creds" --json >"$W/m3.json"
    R[$s,mrestore]=$(mbps $((DATA_MB + inc)) "$(elapsed "$t0")")
    R[$s,mgets]=$(per_gib "$(jget "$W/m3.json" requests.gets)" $((DATA_MB + inc)))
    "$BIN" mount "$W/mdst" "$W/mdst.mnt" >/dev/null
    [ "$(cd "$W/mdst.mnt" && sha256sum a b c)" = "$want" ] || die "the restored pool's files differ from the source's"
    "$BIN" umount "$W/mdst.mnt" >/dev/null
    R[$s,mcheck]=$("$BIN" check "$W/mdst" >/dev/null 2>&1 && echo clean || echo FAILED)
}

declare -A R
one_store() { # STORE
    local s=$1 r
    "start_$s"
    make_pool "$s"
    head -c $((FG_MB << 20)) /dev/urandom >"$W/fg.src"
    head -c $((DATA_MB << 20)) /dev/urandom >"$W/local.bin"
    for r in $(seq "$ROUNDS"); do
        log "$s round $r: demotion of $DATA_MB MB"
        write_data "$W/mnt/d$r" "$DATA_MB"
        local p0 t0 p1
        p0=$(s3info puts)
        t0=$(now)
        "$BIN" tier migrate "$W/mnt" --now >/dev/null
        R[$s,demote,$r]=$(mbps "$DATA_MB" "$(elapsed "$t0")")
        p1=$(s3info puts)
        R[$s,puts,$r]=$(per_gib $((p1 - p0)) "$DATA_MB")

        log "$s round $r: foreground writes alone and during a demotion"
        # Alone, during, and alone again; the ratio is "during" over the
        # mean of the two "alone" writes, so that a drift of the machine
        # or of the pool's state over the round does not count as the
        # demotion's effect. Each write starts once the host has written
        # back what the step before left dirty, from a source in the page
        # cache.
        cat "$W/fg.src" >/dev/null
        settle
        local a1 a2
        a1=$(fg_write "$W/mnt/fg-a$r")
        write_data "$W/mnt/e$r" "$DATA_MB"
        settle
        "$BIN" tier migrate "$W/mnt" --now >/dev/null &
        local mig=$!
        sleep 0.5
        R[$s,fg_during,$r]=$(fg_write "$W/mnt/fg-b$r")
        wait "$mig"
        rm -f "$W/mnt/fg-a$r"
        settle
        a2=$(fg_write "$W/mnt/fg-c$r")
        R[$s,fg_alone,$r]=$(awk -v a="$a1" -v b="$a2" 'BEGIN { printf "%.1f", (a + b) / 2 }')
        R[$s,fg_ratio,$r]=$(div "${R[$s,fg_during,$r]}" "${R[$s,fg_alone,$r]}")
        log "$s round $r: foreground alone $a1 and $a2, during ${R[$s,fg_during,$r]} MB/s"

        log "$s round $r: cold reads"
        remount_cold
        local g0 g1
        g0=$(s3info gets)
        R[$s,read1,$r]=$(seq_read "$W/mnt/d$r")
        g1=$(s3info gets)
        R[$s,gets,$r]=$(per_gib $((g1 - g0)) "$DATA_MB")
        drop_caches
        R[$s,read2,$r]=$(seq_read "$W/mnt/d$r")
        R[$s,gets2,$r]=$(per_gib $(($(s3info gets) - g1)) "$DATA_MB")
        drop_caches
        R[$s,local,$r]=$(seq_read "$W/local.bin")
        remount_cold
        g0=$(s3info gets)
        random_reads "$W/mnt/e$r" "$RANDOM_N" >/dev/null
        g1=$(s3info gets)
        R[$s,rand,$r]=$(div $((g1 - g0)) "$RANDOM_N")
        log "$s round $r: demote ${R[$s,demote,$r]} MB/s, fg ${R[$s,fg_ratio,$r]}x, read ${R[$s,read1,$r]} then ${R[$s,read2,$r]} MB/s (GETs per GiB ${R[$s,gets,$r]} then ${R[$s,gets2,$r]}), ${R[$s,rand,$r]} GETs per 4K read"
    done
    "$BIN" umount "$W/mnt" >/dev/null
    mirror_step "$s"
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    PIDS=()
}

med() { # STORE KEY
    local v=() r
    for r in $(seq "$ROUNDS"); do v+=("${R[$1,$2,$r]}"); done
    median "${v[@]}"
}

for s in $STORES; do one_store "$s"; done

echo
echo "## S3 tier ($(date -u +%F), $(nproc) cores; DATA_MB=$DATA_MB FG_MB=$FG_MB, medians of $ROUNDS rounds)"
echo
echo "| | $(sed 's/ / | /g' <<<"$STORES") |"
echo "|---|$(for _ in $STORES; do printf -- '---:|'; done)"
row() { # LABEL KEY
    printf '| %s |' "$1"
    for s in $STORES; do printf ' %s |' "$(med "$s" "$2")"; done
    echo
}
row "demotion (MB/s)" demote
row "PUTs per GiB demoted" puts
row "foreground write alone (MB/s, fsync; mean of before and after)" fg_alone
row "foreground write during demotion (MB/s)" fg_during
row "during / alone (target >= 0.90)" fg_ratio
row "cold sequential read, first (MB/s; target >= 100)" read1
row "GETs per GiB read (first read)" gets
row "second read, RAM cache (MB/s)" read2
row "GETs per GiB read (second read)" gets2
row "local file on the same disk, cold (MB/s)" local
row "GETs per 4 KiB random read, cold (target 1)" rand
echo
echo "Mirror in the bucket (one round): $DATA_MB MB of which half is a copy of the other, then $((DATA_MB / 8)) MB more"
echo
echo "| | $(sed 's/ / | /g' <<<"$STORES") |"
echo "|---|$(for _ in $STORES; do printf -- '---:|'; done)"
row1() { # LABEL KEY
    printf '| %s |' "$1"
    for s in $STORES; do printf ' %s |' "${R[$s,$2]}"; done
    echo
}
row1 "mirror copy, full (MB/s of pool data)" mcopy
row1 "PUTs per GiB of pool data (half deduplicated)" mputs
row1 "increment (MB/s of new data)" minc
row1 "chunk objects the increment uploaded" mincput
row1 "restore into a new pool (MB/s)" mrestore
row1 "GETs per GiB restored" mgets
row1 "check of the restored pool" mcheck
