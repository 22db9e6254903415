#!/usr/bin/env bash
# What one kernel round trip costs, and how many a small-file load makes:
# the profile behind the mail-server (postmark) and small-file creation
# (untar) targets of bench/smp.sh.
#   1. Round trip: a C loop of getxattr(2) of a missing attribute (a request
#      no cache answers: every call reaches the file system) on the native
#      directory, bindfs (FUSE over /dev/fuse) and Cairn (FUSE over
#      io_uring); microseconds per call, median of RUNS rounds.
#   2. Requests, for each of LOADS: postmark (PM_FILES files,
#      PM_TRANSACTIONS transactions, PM_SUBDIRS subdirectories) and untar
#      (UNTAR_FILES files of 0-UNTAR_MAX_KB KiB, timed per create+write+
#      close), as bench/smp.sh runs them, on Cairn under `perf record -e
#      sched:sched_switch -g`: every time the load blocks in a FUSE request,
#      its kernel stack says which system call and which kernel path asked.
#      Printed per call site, with the daemon's own request counts (its
#      metrics endpoint) beside them.
#   3. The floor: requests x round trip, against the load's run time
#      (postmark: creation, transactions, deletion; untar: its creates and
#      writes) on tmpfs, the native directory, btrfs on a loop device and
#      Cairn. No FUSE file system that the kernel asks this often runs the
#      load faster than the crossing plus tmpfs's run (the page cache and
#      VFS work with no file system under it), whatever its handlers do.
#   4. Per request: one more run of each load on memfs and on Cairn with
#      the fuse:fuse_request_send/end tracepoints; for each request type,
#      its count and mean latency (send to reply) on both, and the time
#      Cairn's handlers add over memfs's (count x difference), largest
#      first: where Cairn's own cost per request is.
# Needs root (mounts, a loop device), gcc, bindfs, postmark, btrfs-progs and
# perf (linux-perf), installed with apt-get when missing.
# The ceiling is also measured, not only estimated: the loads run on memfs
# (crates/fuse/examples/memfs.rs), an in-memory FUSE file system served
# with Cairn's own mount options, INIT capabilities and transport, in a
# session of its own as Cairn's daemon is (bench/lib.sh, `mount_memfs`),
# whose handlers cost next to nothing; Cairn's time over memfs's is its own.
#
# Environment (defaults): RUNS=3 RT_CALLS=200000 PM_FILES=5000
#   PM_TRANSACTIONS=20000 PM_SUBDIRS=10 UNTAR_FILES=30000 UNTAR_MAX_KB=16
#   LOADS="postmark untar" BENCH_DIR=/var/tmp BIN=(cargo build)
#   METRICS_PORT=9599 KEEP=1 (keep the work dir)
#   MEMFS=(cargo build --release --example memfs -p cairn-fuse)
set -euo pipefail
shopt -s inherit_errexit

RUNS=${RUNS:-3}
RT_CALLS=${RT_CALLS:-200000}
PM_FILES=${PM_FILES:-5000}
PM_TRANSACTIONS=${PM_TRANSACTIONS:-20000}
PM_SUBDIRS=${PM_SUBDIRS:-10}
UNTAR_FILES=${UNTAR_FILES:-30000}
UNTAR_MAX_KB=${UNTAR_MAX_KB:-16}
LOADS=${LOADS:-postmark untar}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
METRICS_PORT=${METRICS_PORT:-9599}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || die "run as root (mounts, perf tracepoints)"
install_missing postmark:postmark bindfs:bindfs cc:gcc perf:linux-perf fusermount3:fuse3 \
    python3:python3 curl:curl mkfs.btrfs:btrfs-progs losetup:mount
if [ -z "${BIN:-}" ]; then
    log "building cairn (release)"
    (cd "$ROOT" && cargo build --release -q -p cairn-cli)
    BIN=$ROOT/target/release/cairn
fi
if [ -z "${MEMFS:-}" ]; then
    log "building memfs (release)"
    (cd "$ROOT" && cargo build --release -q --example memfs -p cairn-fuse)
    MEMFS=$ROOT/target/release/examples/memfs
fi
W=$(mktemp -d "$BENCH_DIR/cairn-roundtrip.XXXXXX")
LOOP=""
cleanup() {
    unmount_fuse_targets
    if is_mounted "$W/btrfsmnt"; then umount "$W/btrfsmnt" || umount -l "$W/btrfsmnt"; fi
    if is_mounted "$W/tmpfs"; then umount "$W/tmpfs"; fi
    if [ -n "$LOOP" ]; then losetup -d "$LOOP"; fi
    [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/native" "$W/bindmnt" "$W/cairnmnt" "$W/btrfsmnt" "$W/tmpfs" "$W/memfsmnt"

mount_cairn() {
    "$BIN" mkfs "$W/pool" --device "ssd:$W/pool/data.0:8G" >/dev/null
    "$BIN" mount "$W/pool" "$W/cairnmnt" "$@" >/dev/null
}
umount_cairn() {
    "$BIN" umount "$W/cairnmnt" >/dev/null
    rm -rf "$W/pool"
}

# ------------------------------------------------------------ 1. round trip

cat >"$W/rt.c" <<'EOF'
/* Microseconds per getxattr(2) of a missing attribute on argv[1]. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/xattr.h>
#include <time.h>
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    long n = atol(argv[2]);
    char buf[64];
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        if (getxattr(argv[1], "user.cairn-bench-none", buf, sizeof buf) >= 0 ||
            (errno != ENODATA && errno != EOPNOTSUPP)) {
            perror("getxattr");
            return 1;
        }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.3f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 1e3 / n);
    return 0;
}
EOF
cc -O2 -o "$W/rt" "$W/rt.c"
echo x >"$W/native/f"
bindfs "$W/native" "$W/bindmnt"
mount_cairn
echo x >"$W/cairnmnt/f"
declare -A RT
for t in native bindmnt cairnmnt; do
    vals=()
    for _ in $(seq "$RUNS"); do
        vals+=("$("$W/rt" "$W/$t/f" "$RT_CALLS")")
    done
    RT[$t]=$(median "${vals[@]}")
    log "round trip on $t: ${vals[*]} us"
done
fusermount3 -u "$W/bindmnt"
umount_cairn

# -------------------------------------------------------------- 2. requests

# load_cmd LOAD DIR: sets CMD to the command of one run of LOAD in DIR.
load_cmd() {
    case $1 in
        postmark)
            postmark_cfg "$2" >"$W/postmark.cfg"
            CMD=(postmark "$W/postmark.cfg") ;;
        untar) CMD=(python3 -c "$UNTAR_PY" "$W/untar.tar" "$2") ;;
    esac
}

# round LOAD TARGET: prints the seconds of one run of LOAD on TARGET (the
# whole postmark run; untar's creates and writes, as smp.sh times them).
round() {
    local d=$W/$2/$1.run t0 out
    mkdir "$d"
    # Every file system's writes of the rounds before, not only this
    # target's, are on disk before the clock starts: native's postmark
    # leaves seconds of write-back that would otherwise land in the next
    # target's run (memfs has no disk; Cairn and btrfs do).
    sync
    if [ "$1" = untar ]; then
        out=$(python3 -c "$UNTAR_PY" "$W/untar.tar" "$d")
        awk -v n="$UNTAR_FILES" '/^untar_rate/ { printf "%.6f\n", n / $2 }' <<<"$out"
    else
        load_cmd "$1" "$d"
        t0=$(now)
        "${CMD[@]}" >/dev/null
        elapsed "$t0"
    fi
    rm -rf --one-file-system "$d"
}

# trace_requests LOAD TARGET: one run of LOAD on TARGET with every FUSE
# request's send and reply traced; $W/requests.LOAD.TARGET holds, per
# request type, its count and the sum of its latencies in microseconds.
trace_requests() {
    local d=$W/$2/$1.latency
    mkdir "$d"
    sync
    load_cmd "$1" "$d"
    perf record -q -a -o "$W/lat.data" -e fuse:fuse_request_send -e fuse:fuse_request_end \
        -- "${CMD[@]}" >/dev/null 2>"$W/perf.err" ||
        die "perf record failed: $(cat "$W/perf.err")"
    perf script -i "$W/lat.data" 2>/dev/null | python3 -c "$REQUEST_LATENCY_PY" \
        >"$W/requests.$1.$2"
    rm -rf --one-file-system "$d" "$W/lat.data"
}

# Reads `perf script` of the fuse_request_send/end tracepoints; prints
# "OPCODE COUNT MICROSECONDS" per request type (send to reply, summed).
REQUEST_LATENCY_PY='
import collections, re, sys
sent, n, us = {}, collections.Counter(), collections.Counter()
pat = re.compile(r" (\d+\.\d+): +fuse:fuse_request_(send|end): connection (\d+) req (\d+)(?: opcode \d+ \((\w+)\))?")
for line in sys.stdin:
    m = pat.search(line)
    if not m:
        continue
    key = (m.group(3), m.group(4))
    if m.group(2) == "send":
        sent[key] = (float(m.group(1)), m.group(5))
    elif key in sent:
        t0, op = sent.pop(key)
        n[op] += 1
        us[op] += (float(m.group(1)) - t0) * 1e6
for op in n:
    print(op, n[op], round(us[op], 1))
'

# The load's own run time (no tracing), RUNS rounds on tmpfs, the native
# directory, btrfs and Cairn, interleaved; the medians. Then one run on Cairn
# under perf, with the daemon's request counts before and after.
mount -t tmpfs -o size=4G tmpfs "$W/tmpfs"
truncate -s 8G "$W/btrfs.img"
LOOP=$(losetup -f --show "$W/btrfs.img")
mkfs.btrfs -q -f "$LOOP" >&2
mount "$LOOP" "$W/btrfsmnt"
mount_cairn --metrics "127.0.0.1:$METRICS_PORT"
mount_memfs "$W/memfsmnt"
declare -A TIMES
[[ " $LOADS " != *" untar "* ]] || make_untar_tarball
for load in $LOADS; do
    declare -A S=()
    for r in $(seq "$RUNS"); do
        for t in tmpfs native btrfsmnt memfsmnt cairnmnt; do
            S[$t]+=" $(round "$load" "$t")"
        done
        log "$load round $r/$RUNS (s): tmpfs ${S[tmpfs]##* } native ${S[native]##* }" \
            "btrfs ${S[btrfsmnt]##* } memfs ${S[memfsmnt]##* } cairn ${S[cairnmnt]##* }"
    done
    for t in tmpfs native btrfsmnt memfsmnt cairnmnt; do
        # shellcheck disable=SC2086 # the list of times, one word each
        TIMES[$load,$t]=$(median ${S[$t]})
    done
    mkdir "$W/cairnmnt/$load.traced"
    sync -f "$W/cairnmnt/$load.traced"
    curl -s "http://127.0.0.1:$METRICS_PORT/metrics" >"$W/metrics.$load.before"
    load_cmd "$load" "$W/cairnmnt/$load.traced"
    perf record -q -o "$W/perf.$load.data" -e sched:sched_switch -g -- "${CMD[@]}" \
        >/dev/null 2>"$W/perf.err" ||
        die "perf record failed: $(cat "$W/perf.err")"
    curl -s "http://127.0.0.1:$METRICS_PORT/metrics" >"$W/metrics.$load.after"
    perf script -i "$W/perf.$load.data" -F comm,ip,sym 2>/dev/null >"$W/stacks.$load"
    rm -rf --one-file-system "$W/cairnmnt/$load.traced"
    for t in memfsmnt cairnmnt; do
        trace_requests "$load" "$t"
    done
done
umount_cairn
fusermount3 -u "$W/memfsmnt"
umount "$W/tmpfs"
umount "$W/btrfsmnt"
losetup -d "$LOOP"
LOOP=""

for load in $LOADS; do
    case $load in
        postmark) comm=postmark ;;
        untar) comm=python3 ;;
    esac
python3 - "$load" "$comm" "$W/stacks.$load" "$W/metrics.$load.before" \
    "$W/metrics.$load.after" "${RT[cairnmnt]}" "${RT[native]}" "${RT[bindmnt]}" \
    "${TIMES[$load,tmpfs]}" "${TIMES[$load,native]}" "${TIMES[$load,btrfsmnt]}" \
    "${TIMES[$load,cairnmnt]}" "${TIMES[$load,memfsmnt]}" \
    "$W/requests.$load.memfsmnt" "$W/requests.$load.cairnmnt" <<'EOF'
import collections, re, sys
load, waiter, stacks, before, after = sys.argv[1:6]
rt_cairn, rt_native, rt_bindfs, tmpfs_s, native_s, btrfs_s, cairn_s, memfs_s = map(float, sys.argv[6:14])
lat_memfs, lat_cairn = sys.argv[14:16]

# Call sites: the frames between the FUSE request and the system call.
sites = collections.Counter()
def flush(comm, frames):
    if comm != waiter or "__fuse_simple_request" not in frames:
        return
    chain = []
    for f in frames[frames.index("__fuse_simple_request") + 1:]:
        if f.startswith(("__x64_sys", "__do_sys", "do_syscall_64")):
            chain.append(f.removeprefix("__x64_sys_").removeprefix("__do_sys_"))
            break
        chain.append(f)
    sites[" < ".join(chain[:1] + chain[1:-1][:3] + chain[-1:])] += 1
comm, frames = None, []
for line in open(stacks):
    if line.strip() and not line[0].isspace():
        flush(comm, frames)
        comm, frames = line.split()[0], []
    elif line.strip():
        parts = line.split(None, 1)
        frames.append(parts[1].strip() if len(parts) > 1 else "?")
flush(comm, frames)

def requests(path):
    out = {}
    for line in open(path):
        m = re.match(r'cairn_fuse_requests_total\{op="(\w+)"\} (\S+)', line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out
b, a = requests(before), requests(after)
ops = {op: a[op] - b.get(op, 0) for op in a if a[op] - b.get(op, 0) > 0}

total = sum(sites.values())
print(f"\n# {load}\n")
print("\n## One round trip (getxattr of a missing attribute, median, microseconds)\n")
print("| native | bindfs | cairn | cairn - native (the crossing) | bindfs/cairn |")
print("|---:|---:|---:|---:|---:|")
print(f"| {rt_native:.2f} | {rt_bindfs:.2f} | {rt_cairn:.2f} | {rt_cairn - rt_native:.2f} | {rt_bindfs / rt_cairn:.2f} |")
print(f"\n## Where {load} waits for the daemon ({total} waits in one run)\n")
print("| waits | kernel path (FUSE request < ... < system call) |")
print("|---:|---|")
for k, v in sites.most_common(14):
    print(f"| {v} | {k} |")
print("\n## The daemon's requests in the same run (metrics)\n")
print("| request | count |")
print("|---|---:|")
for op, n in sorted(ops.items(), key=lambda x: -x[1]):
    print(f"| {op} | {n:.0f} |")
floor = sum(ops.values()) * (rt_cairn - rt_native) / 1e6
print("\n## The floor\n")
print(f"- {sum(ops.values()):.0f} requests x {rt_cairn - rt_native:.2f} us of crossing = {floor:.2f} s")
what = {"postmark": "postmark's whole run (creation, transactions, deletion",
        "untar": "untar's creates and writes (no final sync"}[load]
print(f"- {what}; medians): tmpfs {tmpfs_s:.2f} s,")
print(f"  native {native_s:.2f} s, btrfs {btrfs_s:.2f} s, cairn {cairn_s:.2f} s")
print(f"- the crossing alone takes {floor / btrfs_s:.2f}x btrfs's whole run and {floor / cairn_s:.2f} of Cairn's")
bound = floor + tmpfs_s
print(f"- the best a FUSE file system can do here (handlers that cost nothing, no storage under the")
print(f"  page cache): the crossing plus tmpfs's run, {bound:.2f} s")
print(f"- Cairn runs at {bound / cairn_s:.2f}x that estimate's speed; the estimate runs at {btrfs_s / bound:.2f}x btrfs's")
print(f"- measured: memfs (an in-memory FUSE file system with Cairn's mount options, INIT and")
print(f"  transport) {memfs_s:.2f} s, {btrfs_s / memfs_s:.2f}x btrfs's speed; the estimate left out")
print(f"  {memfs_s - bound:+.2f} s of the kernel's own work per request (copies, inodes, pages)")
print(f"- **Cairn runs at {memfs_s / cairn_s:.2f}x the measured ceiling** (memfs's speed); its handlers")
print(f"  and storage cost {1e6 * (cairn_s - memfs_s) / max(sum(ops.values()), 1):.2f} us a request over memfs's")

def latencies(path):
    return {op: (int(c), float(u)) for op, c, u in (l.split() for l in open(path))}
m, c = latencies(lat_memfs), latencies(lat_cairn)
rows = []
for op in set(m) | set(c):
    (mn, mu), (cn, cu) = m.get(op, (0, 0.0)), c.get(op, (0, 0.0))
    rows.append((cu - cn * mu / mn if mn else cu, op, mn, mu / max(mn, 1), cn, cu / max(cn, 1)))
print("\n## Per request: mean latency, send to reply (one traced run each)\n")
print("| request | memfs count | memfs us | cairn count | cairn us | cairn's added time (count x difference, ms) |")
print("|---|---:|---:|---:|---:|---:|")
for added, op, mn, mmean, cn, cmean in sorted(rows, reverse=True):
    print(f"| {op} | {mn} | {mmean:.1f} | {cn} | {cmean:.1f} | {added / 1e3:.1f} |")
tm, tc = sum(u for _, u in m.values()), sum(u for _, u in c.values())
print(f"\n- time in requests: memfs {tm / 1e6:.2f} s, cairn {tc / 1e6:.2f} s ({tc / max(tm, 1):.2f}x)")
EOF
done
