#!/usr/bin/env bash
# Encryption at rest benchmark (issue 53): what `mkfs --encrypt` costs. An
# encrypted pool (`--encrypt --key-file K`, K 32 random bytes, mode 0600;
# every mount with `--key-file K`) against the same pool unencrypted: one
# device file `ssd:WORK/dev-TYPE:SIZE` of the same size for both, default
# mkfs otherwise, in the same host directory (BENCH_DIR), in the same run.
# Every measurement but the mount time uses a fresh pool of each type in
# each round (one pool at a time, the other's device file deleted):
#  1. write   sequential write: fio, WRITE_MB in 1 MiB psync writes of fresh
#             random bytes (fio's scrambled buffers), no preallocation, end
#             fsync, from dropped caches, into the fresh pool, as step 1 of
#             bench/redundancy.sh; MB/s over the whole run with the fsync.
#             target: encrypted / plain >= 0.9
#  2. read    cold sequential read of that file: unmounted, page cache
#             dropped, mounted, fio 1 MiB psync reads of the whole file;
#             MB/s. target >= 0.9 (with STEPS=read alone the file is still
#             written, its write not counted; without read, it is not read)
#  3. rand    a fresh pool holding a FIO_MB file written as in 1; from cold
#             (unmounted, caches dropped, mounted) 4 KiB random reads: fio
#             randread, psync, buffered (FUSE mounts need not take
#             O_DIRECT), FIO_SECONDS, fio's IOPS; then from cold again 4 KiB
#             random writes over the same file: fio randwrite, psync,
#             buffered, FIO_SECONDS, end_fsync=1, IOPS = the writes done over
#             fio's wall time (the final fsync, where buffered blocks are
#             packed and sealed, included). targets: each >= 0.9
#  4. postmark  postmark as bench/smp.sh runs it (postmark_cfg of lib.sh:
#             PM_FILES files of 500-10000 bytes in PM_SUBDIRS subdirectories,
#             PM_TRANSACTIONS transactions) on the fresh pool's mount;
#             transactions/s of the transaction phase (timed here: postmark
#             counts whole seconds). target >= 0.95. PM_TRANSACTIONS is
#             100000, not smp.sh's 20000: a Cairn pool runs about 16000/s on
#             2 cores, and a phase of a second is swung by one commit
#  5. sqlite  python3's sqlite3, journal_mode=WAL, synchronous=FULL, SQL_TX
#             inserts of one ~200-byte row, each its own transaction
#             (commit: an fsync of the WAL), in a file on the mount;
#             commits/s. target >= 0.95
#  6. mount   the time of `cairn mount` (until it returns: it returns once
#             the mount answers) of a pool holding MOUNT_FILES files of 100
#             random bytes in 100 directories. One pool of each type is made
#             once per run (files written by a python loop, then unmounted)
#             and kept through the step; each round mounts each from dropped
#             caches (and unmounts it after checking one directory's count).
#             target: encrypted time / plain time <= 1.2. The issue asks for
#             10^6 files: MOUNT_FILES=1000000 gives its figure (the default,
#             100000, keeps the default run under 15 minutes on 2 cores).
# Every figure is the median of ROUNDS interleaved rounds (odd rounds run the
# encrypted pool first, even rounds the plain one first, so that a noisy
# stretch of a shared machine falls on both alike); each ratio (encrypted /
# plain) is the median of the per-round ratios, PASS/MISS against its
# target. A MISS never fails the script; a failed step does (exit 1), and so
# does a panic in a pool's log (a bug: the log is kept in RESULT_DIR/logs).
# Prints a markdown table and writes it to RESULT_DIR/report.md, with the
# pools' logs in RESULT_DIR/logs.
# Needs root (mount, drop_caches), fuse3; installs fio, postmark and python3
# with apt-get when missing.
# Environment (defaults; QUICK=1 gives a ~3 minute run: WRITE_MB=512
# FIO_MB=256 FIO_SECONDS=5 PM_FILES=1000 PM_TRANSACTIONS=30000 SQL_TX=300
# MOUNT_FILES=20000):
#   WRITE_MB=2048      size of the sequential write (and read)
#   FIO_MB=1024        size of the random read/write file
#   FIO_SECONDS=20     duration of each random read and write run
#   PM_FILES=5000 PM_TRANSACTIONS=100000 PM_SUBDIRS=10  postmark
#   SQL_TX=2000        SQLite transactions (commits) per run
#   MOUNT_FILES=100000 files in the pools whose mount is timed (the issue:
#                      1000000)
#   ROUNDS=3           interleaved rounds (medians)
#   STEPS="write read rand postmark sqlite mount"  measurements to run
#   BENCH_DIR=/var/tmp where the work dir (device files) is made
#   RESULT_DIR=BENCH_DIR/cairn-encryption-DATE  report and logs
#   PROFILE=release    cargo profile built and used (target/PROFILE/cairn)
#   NO_BUILD=1         use the binary as it is; BIN=/path/to/cairn overrides
#   KEEP=1             keep the work dir (mounts are undone)
# Run: bench/encryption.sh            (default sizes: about 9 minutes on 2
#                                      cores, estimated from the QUICK run;
#                                      MOUNT_FILES=1000000 adds about 3)
#      QUICK=1 bench/encryption.sh    (quick check: 2 min 42 s on 2 cores
#                                      with PM_TRANSACTIONS=4000, ~3 min now)
set -euo pipefail

if [ -n "${QUICK:-}" ]; then
    WRITE_MB=${WRITE_MB:-512} FIO_MB=${FIO_MB:-256} FIO_SECONDS=${FIO_SECONDS:-5}
    PM_FILES=${PM_FILES:-1000} PM_TRANSACTIONS=${PM_TRANSACTIONS:-30000}
    SQL_TX=${SQL_TX:-300} MOUNT_FILES=${MOUNT_FILES:-20000}
fi
WRITE_MB=${WRITE_MB:-2048}
FIO_MB=${FIO_MB:-1024}
FIO_SECONDS=${FIO_SECONDS:-20}
PM_FILES=${PM_FILES:-5000}
PM_TRANSACTIONS=${PM_TRANSACTIONS:-100000}
PM_SUBDIRS=${PM_SUBDIRS:-10}
SQL_TX=${SQL_TX:-2000}
MOUNT_FILES=${MOUNT_FILES:-100000}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-write read rand postmark sqlite mount}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
RESULT_DIR=${RESULT_DIR:-$BENCH_DIR/cairn-encryption-$(date +%Y%m%d-%H%M%S)}
PROFILE=${PROFILE:-release}
# Device sizes: the data plus 1 GiB. The random writes rewrite blocks of
# the file into new chunks (the old ones freed later): room for it twice.
# Postmark writes about 10 KiB per file and per transaction; a small file
# of the mount step takes at most a 4 KiB block.
WDEV_MB=$((WRITE_MB + 1024))
RDEV_MB=$((FIO_MB * 2 + 1024))
PMDEV_MB=$(((PM_FILES + PM_TRANSACTIONS) / 100 + 1024))
SQLDEV_MB=1088
MDEV_MB=$((MOUNT_FILES / 256 + 1024))

ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"
declare -A RES # RES[key] = space-separated per-round values

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
# order: the two pool types in this round's order (odd rounds encrypted
# first).
order() { if [ $((R % 2)) = 1 ]; then echo "enc plain"; else echo "plain enc"; fi; }

# ------------------------------------------------------------------ setup

check_tools() {
    [ "$(id -u)" = 0 ] || die "run as root (mount, drop_caches)"
    install_missing fio:fio postmark:postmark python3:python3 fusermount3:fuse3 stdbuf:coreutils
    local t
    for t in fio postmark python3 fusermount3 stdbuf awk; do
        command -v "$t" >/dev/null || die "$t not installed"
    done
    python3 -c 'import sqlite3' || die "python3 has no sqlite3 module"
}


setup_dirs() {
    local need avail m=$WDEV_MB
    for d in "$RDEV_MB" "$PMDEV_MB" "$SQLDEV_MB" $((2 * MDEV_MB)); do
        [ "$d" -le "$m" ] || m=$d
    done
    need=$(((m + 2048) << 20))
    avail=$(df --output=avail -B1 "$BENCH_DIR" | tail -1)
    [ "$avail" -ge "$need" ] ||
        die "$BENCH_DIR has $((avail >> 20)) MiB free, this run needs about $((need >> 20)) MiB (lower WRITE_MB, FIO_MB, MOUNT_FILES)"
    W=$(mktemp -d "$BENCH_DIR/cairn-encryption.XXXXXX")
    MNT=$W/mnt KEY=$W/key
    mkdir -p "$MNT" "$RESULT_DIR/logs"
    # the key file: exactly 32 random bytes, mode 0600
    (umask 077 && head -c 32 /dev/urandom >"$KEY")
    log "work dir $W on $(findmnt -n -o SOURCE,FSTYPE -T "$W" | tr -s ' '); report in $RESULT_DIR"
}

cleanup() {
    set +eu
    [ -n "${W:-}" ] || return 0
    if is_mounted "$MNT"; then
        [ -z "${P:-}" ] || cp "$P/cairn.log" "$RESULT_DIR/logs/at-exit.log" 2>/dev/null
        "$BIN" umount "$MNT" >/dev/null 2>&1 || fusermount3 -u -z "$MNT"
    fi
    if [ -z "${KEEP:-}" ]; then rm -rf --one-file-system "$W"; else log "kept $W"; fi
}

# ------------------------------------------------------------ cairn pools

# use TYPE [SUFFIX]: TYPE enc or plain; sets P (pool dir), DEVF (device
# file) and KA (the options that open it) for the pool TYPE (SUFFIX tells
# the mount step's pools from the others).
use() {
    T=$1
    P=$W/pool-$1${2:-} DEVF=$W/dev-$1${2:-} KA=()
    [ "$1" != enc ] || KA=(--key-file "$KEY")
}

# The pool's log, kept in RESULT_DIR/logs/LABEL.log; stops the script if a
# thread of the pool panicked (a bug).
save_log() {
    [ -f "$P/cairn.log" ] || return 0
    cp "$P/cairn.log" "$RESULT_DIR/logs/$1.log"
    if grep -q 'panicked' "$P/cairn.log"; then
        grep -A2 'panicked' "$P/cairn.log" >&2
        die "Cairn bug: a thread panicked during $1 (log: $RESULT_DIR/logs/$1.log)"
    fi
}

# new_pool DEV_MB: a fresh pool of the current type (see `use`) on a fresh
# device file of DEV_MB (blocks allocated), mounted on MNT.
new_pool() {
    destroy_pool
    if [ "$T" = enc ]; then
        quiet "$BIN" mkfs "$P" --encrypt --key-file "$KEY" --device "ssd:$DEVF:$1M"
        [ -f "$P/key" ] || die "mkfs --encrypt wrote no key block in $P"
    else
        quiet "$BIN" mkfs "$P" --device "ssd:$DEVF:$1M"
        [ ! -e "$P/key" ] || die "the plain pool $P has a key block"
    fi
    mount_pool
}

mount_pool() { quiet "$BIN" mount "$P" "$MNT" "${KA[@]}"; }
umount_pool() { quiet "$BIN" umount "$MNT"; }
# cold: unmounted, page cache dropped, mounted again.
cold() {
    if is_mounted "$MNT"; then umount_pool; fi
    drop_caches
    mount_pool
}

# destroy_pool [LABEL]: unmounts, keeps the log (as LABEL), removes the pool,
# its device file and its metadata mirror (in the pool dir).
destroy_pool() {
    if is_mounted "$MNT"; then umount_pool; fi
    [ -z "${1:-}" ] || save_log "$1"
    rm -rf "$P" "$DEVF"
}

# ------------------------------------------------------- measurements

# fio_write FILE MB: sequential 1 MiB writes of fresh random bytes, fsync at
# the end, no preallocation (as bench/redundancy.sh); prints the seconds.
fio_write() {
    local t0
    t0=$(now)
    fio --name=seqw --filename="$1" --rw=write --bs=1M --size="$2M" --fallocate=none \
        --ioengine=psync --direct=0 --end_fsync=1 --output=/dev/null
    elapsed "$t0"
}

# seq_one TYPE: a fresh pool, the sequential write then the cold sequential
# read of its file; prints "WRITE_MBps READ_MBps".
seq_one() {
    local s w r t0
    use "$1"
    new_pool "$WDEV_MB"
    drop_caches
    s=$(fio_write "$MNT/seq" "$WRITE_MB")
    w=$(div "$WRITE_MB" "$s")
    r=-
    if [ -n "$SEQ_READ" ]; then
        cold
        t0=$(now)
        fio --name=seqr --filename="$MNT/seq" --rw=read --bs=1M --size="${WRITE_MB}M" \
            --ioengine=psync --direct=0 --output=/dev/null
        r=$(div "$WRITE_MB" "$(elapsed "$t0")")
    fi
    destroy_pool "seq-$1-r$R"
    echo "$w $r"
}

bench_seq() {
    local t v w r
    for R in $(seq "$ROUNDS"); do
        for t in $(order); do
            v=$(seq_one "$t")
            read -r w r <<<"$v"
            [ -z "$SEQ_WRITE" ] || add "write_$t" "$w"
            [ -z "$SEQ_READ" ] || add "read_$t" "$r"
            log "sequential round $R: $t write $w MB/s, cold read $r MB/s"
        done
        [ -z "$SEQ_WRITE" ] || add write_ratio "$(div "$(latest write_enc)" "$(latest write_plain)")"
        [ -z "$SEQ_READ" ] || add read_ratio "$(div "$(latest read_enc)" "$(latest read_plain)")"
    done
}

# fio_rand randread|randwrite ARGS...: 4 KiB random I/O over MNT/rr for
# FIO_SECONDS; prints "IOPS" (reads: fio's; writes: ios / wall time, the
# end fsync included).
fio_rand() {
    local rw=$1 t0 s
    shift
    t0=$(now)
    fio --name="$rw" --filename="$MNT/rr" --size="${FIO_MB}M" --rw="$rw" --bs=4k \
        --ioengine=psync --direct=0 --time_based --runtime="$FIO_SECONDS" "$@" \
        --output-format=json --output="$W/fio.json" >/dev/null
    s=$(elapsed "$t0")
    python3 -c 'import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
if job["error"]:
    sys.exit("fio error %d" % job["error"])
d = job[sys.argv[2]]
print(round(d["iops"]) if sys.argv[2] == "read" else round(d["total_ios"] / float(sys.argv[3])))' \
        "$W/fio.json" "${rw#rand}" "$s"
}

# rand_one TYPE: a fresh pool holding FIO_MB, cold random reads then cold
# random writes; prints "READ_IOPS WRITE_IOPS".
rand_one() {
    local r w
    use "$1"
    new_pool "$RDEV_MB"
    fio_write "$MNT/rr" "$FIO_MB" >/dev/null
    cold
    r=$(fio_rand randread)
    cold
    w=$(fio_rand randwrite --end_fsync=1)
    destroy_pool "rand-$1-r$R"
    echo "$r $w"
}

bench_rand() {
    local t v w r
    for R in $(seq "$ROUNDS"); do
        for t in $(order); do
            v=$(rand_one "$t")
            read -r r w <<<"$v"
            add "rr_$t" "$r"
            add "rw_$t" "$w"
            log "random round $R: $t 4 KiB read $r IOPS, 4 KiB write $w IOPS"
        done
        add rr_ratio "$(div "$(latest rr_enc)" "$(latest rr_plain)")"
        add rw_ratio "$(div "$(latest rw_enc)" "$(latest rw_plain)")"
    done
}

# Runs postmark with stdout unbuffered and times its transaction phase (from
# "Performing transactions" to the next "Done"); prints transactions/s (as
# bench/smp.sh).
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
print("%.1f" % (n / (t1 - t0)))
'

postmark_one() {
    local v
    use "$1"
    new_pool "$PMDEV_MB"
    postmark_cfg "$MNT" >"$W/postmark.cfg"
    v=$(cd "$W" && python3 -c "$POSTMARK_PY" "$W/postmark.cfg" "$PM_TRANSACTIONS")
    destroy_pool "postmark-$1-r$R"
    echo "$v"
}

# SQL_TX inserts of one row, one transaction each, in WAL mode with
# synchronous=FULL; prints commits/s.
SQLITE_PY='
import os, sqlite3, sys, time
path, n = sys.argv[1], int(sys.argv[2])
con = sqlite3.connect(path, isolation_level=None)
assert con.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
con.execute("PRAGMA synchronous=FULL")
con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, ts REAL, body BLOB)")
t0 = time.monotonic()
for _ in range(n):
    con.execute("BEGIN")
    con.execute("INSERT INTO t (ts, body) VALUES (?, ?)", (time.time(), os.urandom(192)))
    con.execute("COMMIT")
t = time.monotonic() - t0
assert con.execute("SELECT count(*) FROM t").fetchone()[0] == n
con.close()
print("%.1f" % (n / t))
'

sqlite_one() {
    local v
    use "$1"
    new_pool "$SQLDEV_MB"
    v=$(python3 -c "$SQLITE_PY" "$MNT/db.sqlite" "$SQL_TX")
    destroy_pool "sqlite-$1-r$R"
    echo "$v"
}

# bench_small NAME: the rounds of a one-figure measurement (postmark,
# sqlite) run by NAME_one.
bench_small() {
    local t v
    for R in $(seq "$ROUNDS"); do
        for t in $(order); do
            v=$("$1_one" "$t")
            add "$1_$t" "$v"
            log "$1 round $R: $t $v $2"
        done
        add "$1_ratio" "$(div "$(latest "$1_enc")" "$(latest "$1_plain")")"
    done
}

# MOUNT_FILES files of 100 random bytes in 100 directories d0..d99.
MKFILES_PY='
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for d in range(100):
    os.mkdir(os.path.join(root, "d%d" % d))
for i in range(n):
    with open(os.path.join(root, "d%d" % (i % 100), "f%d" % i), "wb") as f:
        f.write(os.urandom(100))
'

bench_mount() {
    local t t0 s n
    n=$(((MOUNT_FILES + 99) / 100)) # files in d0
    for t in enc plain; do
        use "$t" -m
        new_pool "$MDEV_MB"
        t0=$(now)
        python3 -c "$MKFILES_PY" "$MNT" "$MOUNT_FILES"
        umount_pool
        s=$(elapsed "$t0")
        add "mkfiles_$t" "$(div "$MOUNT_FILES" "$s")"
        log "mount: $t pool filled with $MOUNT_FILES files in $(div "$s" 1) s (unmount included)"
    done
    for R in $(seq "$ROUNDS"); do
        for t in $(order); do
            use "$t" -m
            drop_caches
            t0=$(now)
            mount_pool
            s=$(elapsed "$t0")
            [ "$(find "$MNT/d0" -type f | wc -l)" = "$n" ] ||
                die "the $t pool mounted without its $n files in d0"
            umount_pool
            add "mount_$t" "$(awk -v s="$s" 'BEGIN { printf "%.3f", s }')"
            log "mount round $R: $t $(latest "mount_$t") s"
        done
        add mount_ratio "$(div "$(latest mount_enc)" "$(latest mount_plain)")"
    done
    for t in enc plain; do
        use "$t" -m
        destroy_pool "mount-$t"
    done
}

# ------------------------------------------------------------- report

print_table() {
    local enc_log_lines
    echo "## Cairn encryption at rest benchmark (issue 53)"
    echo
    echo "Cairn $("$BIN" --version 2>/dev/null | awk '{print $2}') ($BIN; script at" \
        "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')), $(nproc) cores, $(uname -r)," \
        "fuse.enable_uring=$(cat /sys/module/fuse/parameters/enable_uring 2>/dev/null || echo n/a)," \
        "device files on $(findmnt -n -o SOURCE,FSTYPE -T "$W" | tr -s ' '). Encrypted: \`mkfs --encrypt" \
        "--key-file\` (32-byte key file); plain: the same mkfs without it; one ssd device file each," \
        "a fresh pool per round (the mount step: one pool per type per run). Medians of ROUNDS=$ROUNDS" \
        "interleaved rounds (odd rounds encrypted first); ratios (encrypted / plain) are medians of the" \
        "per-round ratios."
    echo
    echo "| measurement | encrypted | plain | ratio | target | result |"
    echo "|---|---:|---:|---:|---|---|"
    local row key label e p op target v
    for row in \
        "write_ratio|sequential write ${WRITE_MB} MiB + fsync (MB/s)|write|>=|0.9" \
        "read_ratio|sequential read ${WRITE_MB} MiB, cold (MB/s)|read|>=|0.9" \
        "rr_ratio|4 KiB random read, ${FIO_MB} MiB file, cold, ${FIO_SECONDS} s (IOPS)|rr|>=|0.9" \
        "rw_ratio|4 KiB random write, ${FIO_MB} MiB file, ${FIO_SECONDS} s + fsync (IOPS)|rw|>=|0.9" \
        "postmark_ratio|postmark ${PM_FILES} files, ${PM_TRANSACTIONS} transactions (transactions/s)|postmark|>=|0.95" \
        "sqlite_ratio|SQLite WAL synchronous=FULL, ${SQL_TX} one-row transactions (commits/s)|sqlite|>=|0.95" \
        "mount_ratio|mount time, ${MOUNT_FILES} files, cold (s)|mount|<=|1.2"; do
        IFS='|' read -r key label v op target <<<"$row"
        e=$(med "${v}_enc")
        p=$(med "${v}_plain")
        v=$(med "$key")
        echo "| $label | $e | $p | $v | $op $target | $(verdict "$v" "$op" "$target") |"
    done
    echo
    echo "Per round (encrypted; plain; ratios):"
    echo
    echo "- sequential write MB/s:${RES[write_enc]:-};${RES[write_plain]:-};${RES[write_ratio]:-}"
    echo "- sequential read MB/s:${RES[read_enc]:-};${RES[read_plain]:-};${RES[read_ratio]:-}"
    echo "- 4 KiB random read IOPS:${RES[rr_enc]:-};${RES[rr_plain]:-};${RES[rr_ratio]:-}"
    echo "- 4 KiB random write IOPS:${RES[rw_enc]:-};${RES[rw_plain]:-};${RES[rw_ratio]:-}"
    echo "- postmark transactions/s:${RES[postmark_enc]:-};${RES[postmark_plain]:-};${RES[postmark_ratio]:-}"
    echo "- SQLite commits/s:${RES[sqlite_enc]:-};${RES[sqlite_plain]:-};${RES[sqlite_ratio]:-}"
    echo "- mount s:${RES[mount_enc]:-};${RES[mount_plain]:-};${RES[mount_ratio]:-}"
    [ -z "${RES[mkfiles_enc]:-}" ] ||
        echo "- filling the mount step's pools (files/s, unmount included):${RES[mkfiles_enc]}; ${RES[mkfiles_plain]}"
    echo
    enc_log_lines=$(cat "$RESULT_DIR"/logs/*.log 2>/dev/null | grep -c -E ' (WARN|ERROR) ' || true)
    echo "Device files: write ${WDEV_MB} MiB, random ${RDEV_MB} MiB, postmark ${PMDEV_MB} MiB," \
        "sqlite ${SQLDEV_MB} MiB, mount ${MDEV_MB} MiB. WARN/ERROR lines in the pools' logs: ${enc_log_lines}."
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
    local step seq_done=""
    SEQ_WRITE="" SEQ_READ=""
    for step in $STEPS; do
        [ "$step" != write ] || SEQ_WRITE=1
        [ "$step" != read ] || SEQ_READ=1
    done
    for step in $STEPS; do
        case $step in
            write | read)
                # one pass measures both (the read needs the written file)
                [ -n "$seq_done" ] || bench_seq
                seq_done=1
                ;;
            rand | mount) "bench_$step" ;;
            postmark) bench_small postmark transactions/s ;;
            sqlite) bench_small sqlite commits/s ;;
            *) die "unknown step $step (write, read, rand, postmark, sqlite, mount)" ;;
        esac
    done
    print_table | tee "$RESULT_DIR/report.md"
}

main "$@"
