#!/usr/bin/env bash
# Sharing benchmark (issue 55): a Cairn mount served by Samba and by
# nfs-ganesha against the same servers, in the same run, serving a plain
# directory of the same host filesystem (native). One smbd serves two
# shares (cairn: what `cairn share smb` prints; native: the same without
# shadow_copy2) and one ganesha.nfsd two NFSv4 exports (cairn: what
# `cairn share nfs --ganesha-only` prints; native: the same block), both on
# loopback ports. Clients on the same host: smbclient, and libnfs
# (nfs-cp to read the big file; bench/share_nfs.py to write it and for
# small files: one NFSv4 session, one create-write-close or
# open-read-close per file). libnfs 4.0 (Debian 12) cannot encode an NFSv4
# WRITE of about 4000 bytes or more, so NFS writes go out 3 KiB at a time:
# the NFS write figure is a rate of small WRITEs, not a client's stream.
# Each round runs every step on native, then on cairn (the order swapped
# every other round); the table gives medians over RUNS rounds and the
# medians of the per-round cairn/native ratios.
#  smb write   smbclient put of a BIG_MB file of random bytes (from /dev/shm)
#  smb read    smbclient get of it to /dev/null, host caches dropped before
#  smb small   put of SMALL_FILES files of SMALL_KB KiB (mput from /dev/shm),
#              then, caches dropped, get of them all (mget); files/s each
#  nfs write   share_nfs.py write of the first NFS_WRITE_MB of that file
#  nfs read    nfs-cp of the BIG_MB file (put by SMB, then not counted)
#              to /dev/shm, host caches dropped before
#  nfs small   share_nfs.py put, then (caches dropped) get: files/s each
# Every round uses names of its own: the files of the last round are
# deleted on the host, behind the servers' backs, and ganesha keeps the
# handle of a name it looked up for a while (a new file under an old name
# then gives NFS4ERR_STALE, as on any filesystem: the old handle's file is
# gone). "Caches dropped" is echo 3 > drop_caches: the servers keep the mount, so
# Cairn is not remounted and its own RAM read cache may still hold data.
# Needs root; installs samba, smbclient, nfs-ganesha(-vfs), libnfs-utils
# when missing (scripts/deps.sh test does too).
# Environment (defaults): RUNS=3 BIG_MB=1024 NFS_WRITE_MB=256
#   SMALL_FILES=2000 SMALL_KB=4
#   BENCH_DIR=/var/tmp (where the pool and the native directory live)
#   BIN=... the cairn binary (default: cargo build --release)
#   NO_BUILD=1 with BIN unset: use target/release/cairn as it is
#   MOUNT_ARGS="--keep-mount": extra flags of the pool's `cairn mount`
set -euo pipefail
shopt -s inherit_errexit
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

RUNS=${RUNS:-3}
BIG_MB=${BIG_MB:-1024}
NFS_WRITE_MB=${NFS_WRITE_MB:-256}
SMALL_FILES=${SMALL_FILES:-2000}
SMALL_KB=${SMALL_KB:-4}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
[ "$(id -u)" = 0 ] || die "needs root (servers, drop_caches)"
install_missing smbd:samba smbclient:smbclient ganesha.nfsd:nfs-ganesha \
    nfs-cp:libnfs-utils
if ! dpkg-query -W -f='${Status}' nfs-ganesha-vfs 2>/dev/null | grep -q "ok installed"; then
    log "installing nfs-ganesha-vfs"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q nfs-ganesha-vfs >&2
fi
if [ -z "${BIN:-}" ]; then
    if [ "${NO_BUILD:-0}" != 1 ]; then
        log "building cairn (release)"
        (cd "$ROOT" && cargo build --release -q -p cairn-cli)
    fi
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/cairn
fi

W=$(mktemp -d "$BENCH_DIR/cairn-share.XXXXXX")
SHM=$(mktemp -d /dev/shm/cairn-share.XXXXXX)
SMB_PID="" NFS_PID=""
cleanup() {
    [ -z "$SMB_PID" ] || kill "$SMB_PID" 2>/dev/null || true
    [ -z "$NFS_PID" ] || kill "$NFS_PID" 2>/dev/null || true
    sleep 1
    unmount_fuse_targets
    rm -rf "$W" "$SHM"
}
[ "${KEEP:-0}" = 1 ] || trap cleanup EXIT

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() {
    local i
    for i in $(seq 1 60); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.5
    done
    die "nothing listens on port $1 ($2)"
}

setup_pool() {
    mkdir -p "$W/pool" "$W/cairnmnt" "$W/native"
    "$BIN" mkfs "$W/pool" --device "ssd:$W/pool/data.0:$((BIG_MB * 3 / 1024 + 4))G" >&2
    # shellcheck disable=SC2086 # MOUNT_ARGS: words on purpose
    "$BIN" mount "$W/pool" "$W/cairnmnt" ${MOUNT_ARGS:-} >&2
}

start_smbd() {
    SMB_PORT=$(free_port)
    local d="$W/smb"
    mkdir -p "$d"/{private,lock,state,cache,run,ncalrpc}
    {
        printf '[global]\n    server role = standalone server\n    smb ports = %s\n' "$SMB_PORT"
        printf '    interfaces = lo\n    bind interfaces only = yes\n    map to guest = Bad User\n'
        printf '    guest account = root\n    disable netbios = yes\n    load printers = no\n'
        printf '    printcap name = /dev/null\n    disable spoolss = yes\n'
        for k in private:private\ dir lock:lock\ directory state:state\ directory \
            cache:cache\ directory run:pid\ directory ncalrpc:ncalrpc\ dir; do
            printf '    %s = %s/%s\n' "${k#*:}" "$d" "${k%%:*}"
        done
        printf '    log file = %s/smbd.log\n' "$d"
        "$BIN" share smb "$W/cairnmnt" --name cairn
        printf '    guest ok = yes\n[native]\n    path = %s\n    read only = no\n    guest ok = yes\n' "$W/native"
    } >"$d/smb.conf"
    setsid smbd --foreground --no-process-group -s "$d/smb.conf" >"$d/smbd.out" 2>&1 </dev/null &
    SMB_PID=$!
    wait_port "$SMB_PORT" smbd
}

start_ganesha() {
    NFS_PORT=$(free_port)
    local d="$W/nfs"
    mkdir -p "$d/recovery"
    {
        printf 'NFS_CORE_PARAM {\n    Protocols = 4;\n    NFS_Port = %s;\n' "$NFS_PORT"
        printf '    Bind_addr = 127.0.0.1;\n    Enable_NLM = false;\n    Enable_RQUOTA = false;\n}\n'
        printf 'NFSV4 {\n    Graceless = true;\n    RecoveryRoot = "%s/recovery";\n}\n' "$d"
        printf 'NFS_KRB5 { Active_krb5 = false; }\n'
        "$BIN" share nfs "$W/cairnmnt" --ganesha-only --pseudo /cairn |
            sed 's/Squash = Root_Squash/Squash = No_Root_Squash/'
        printf 'EXPORT {\n    Export_Id = 65100;\n    Path = "%s";\n    Pseudo = "/native";\n' "$W/native"
        printf '    Protocols = 4;\n    Access_Type = RW;\n    Squash = No_Root_Squash;\n    SecType = sys;\n'
        printf '    CLIENT { Clients = 127.0.0.1; Access_Type = RW; }\n    FSAL { Name = VFS; }\n}\n'
    } >"$d/ganesha.conf"
    # Its own session: ganesha.nfsd signals its whole process group when
    # it shuts down, which would take this script with it.
    setsid ganesha.nfsd -F -N NIV_EVENT -L "$d/ganesha.log" -f "$d/ganesha.conf" -p "$d/ganesha.pid" \
        >"$d/ganesha.out" 2>&1 </dev/null &
    NFS_PID=$!
    wait_port "$NFS_PORT" ganesha
}

dir_of() { if [ "$1" = cairn ]; then echo "$W/cairnmnt"; else echo "$W/native"; fi; }
smb() { smbclient "//127.0.0.1/$1" -N -p "$SMB_PORT" -c "$2" >"$W/smbclient.out" 2>&1 ||
    die "smbclient $1 -c '$2': $(tail -3 "$W/smbclient.out")"; }
url() { echo "nfs://127.0.0.1/$1/$2?version=4&nfsport=$NFS_PORT"; }
rate() { awk -v n="$1" -v s="$2" 'BEGIN { printf "%.1f", n / s }'; }

declare -A R
record() { R[$1,$2]="${R[$1,$2]:-} $3"; log "$1 $2: $3"; }

round() {
    local t=$1 r=$2 d t0 s
    d=$(dir_of "$t")
    drop_caches
    t0=$(now); smb "$t" "put $SHM/big big$r"; s=$(elapsed "$t0")
    record smb_write "$t" "$(rate "$BIG_MB" "$s")"
    drop_caches
    t0=$(now); smb "$t" "get big$r /dev/null"; s=$(elapsed "$t0")
    record smb_read "$t" "$(rate "$BIG_MB" "$s")"
    drop_caches
    t0=$(now); nfs-cp "$(url "$t" "big$r")" "$SHM/got.big" >/dev/null; s=$(elapsed "$t0")
    record nfs_read "$t" "$(rate "$BIG_MB" "$s")"
    cmp -s "$SHM/big" "$SHM/got.big" || die "nfs read of $t: bytes differ"
    rm -f "$d/big$r" "$SHM/got.big"
    drop_caches
    t0=$(now); smb "$t" "mkdir s$r; cd s$r; lcd $SHM/small; prompt off; mput *"; s=$(elapsed "$t0")
    record smb_small_put "$t" "$(rate "$SMALL_FILES" "$s")"
    drop_caches
    rm -rf "$SHM/got" && mkdir "$SHM/got"
    t0=$(now); smb "$t" "cd s$r; lcd $SHM/got; prompt off; mget *"; s=$(elapsed "$t0")
    record smb_small_get "$t" "$(rate "$SMALL_FILES" "$s")"
    [ "$(find "$SHM/got" -type f | wc -l)" = "$SMALL_FILES" ] || die "smb mget of $t: files missing"
    rm -rf "$d/s$r"
    drop_caches
    s=$(python3 "$ROOT/bench/share_nfs.py" "$(url "$t" "")" write "part$r" "$SHM/part")
    record nfs_write "$t" "$(rate "$NFS_WRITE_MB" "$s")"
    cmp -s "$SHM/part" "$d/part$r" || die "nfs write of $t: bytes differ"
    rm -f "$d/part$r"
    drop_caches
    s=$(python3 "$ROOT/bench/share_nfs.py" "$(url "$t" "")" put "n$r" "$SMALL_FILES" $((SMALL_KB * 1024)))
    record nfs_small_put "$t" "$(rate "$SMALL_FILES" "$s")"
    drop_caches
    s=$(python3 "$ROOT/bench/share_nfs.py" "$(url "$t" "")" get "n$r" "$SMALL_FILES" $((SMALL_KB * 1024)))
    record nfs_small_get "$t" "$(rate "$SMALL_FILES" "$s")"
    rm -rf "$d/n$r"
}

setup_pool
head -c $((BIG_MB << 20)) /dev/urandom >"$SHM/big"
head -c $((NFS_WRITE_MB << 20)) "$SHM/big" >"$SHM/part"
mkdir "$SHM/small"
for i in $(seq 1 "$SMALL_FILES"); do head -c $((SMALL_KB * 1024)) /dev/urandom >"$SHM/small/f$i"; done
start_smbd
start_ganesha
for r in $(seq 1 "$RUNS"); do
    order="native cairn"
    [ $((r % 2)) = 0 ] && order="cairn native"
    for t in $order; do
        log "round $r: $t"
        round "$t" "$r"
    done
done

KEYS="smb_write smb_read nfs_read smb_small_put smb_small_get nfs_write nfs_small_put nfs_small_get"
declare -A LABEL=([smb_write]="SMB write ${BIG_MB} MiB file (MB/s)" [smb_read]="SMB read it, cold (MB/s)"
    [smb_small_put]="SMB put ${SMALL_FILES} x ${SMALL_KB} KiB (files/s)" [smb_small_get]="SMB get them, cold (files/s)"
    [nfs_write]="NFS write ${NFS_WRITE_MB} MiB file, 3 KiB WRITEs (MB/s)" [nfs_read]="NFS read it, cold (MB/s)"
    [nfs_small_put]="NFS create ${SMALL_FILES} x ${SMALL_KB} KiB (files/s)" [nfs_small_get]="NFS read them, cold (files/s)")
echo
echo "Cairn $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores, $(uname -r), servers and clients on one host, pool and native directory in $BENCH_DIR ($(df --output=fstype "$BENCH_DIR" | tail -1)); medians of $RUNS rounds."
echo
echo "| measurement | native | cairn | cairn/native (median of per-round ratios) | per round |"
echo "|---|---:|---:|---:|---|"
for k in $KEYS; do
    read -r -a n <<<"${R[$k,native]}"
    read -r -a c <<<"${R[$k,cairn]}"
    ratios=()
    for i in "${!n[@]}"; do ratios+=("$(div "${c[$i]}" "${n[$i]}")"); done
    echo "| ${LABEL[$k]} | $(median "${n[@]}") | $(median "${c[@]}") | $(median "${ratios[@]}") | ${ratios[*]} |"
done
