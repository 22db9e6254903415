# Shell helpers shared by the benchmark scripts (sourced, not run).
log() { printf '[bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.6f", b - a }'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "n/a"; else printf "%.2f", a / b }'; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

is_mounted() { grep -q " $1 " /proc/self/mountinfo; }

# postmark_cfg DIR: the postmark run of bench/smp.sh in DIR: PM_FILES files
# of 500-10000 bytes in PM_SUBDIRS subdirectories, PM_TRANSACTIONS
# transactions.
postmark_cfg() {
    printf 'set location %s\nset number %s\nset transactions %s\nset size 500 10000\n' \
        "$1" "$PM_FILES" "$PM_TRANSACTIONS"
    printf 'set subdirectories %s\nrun\nquit\n' "$PM_SUBDIRS"
}

# Makes $W/untar.tar once: UNTAR_FILES files of 0..UNTAR_MAX_KB KiB of seeded
# random bytes, 50 to a directory, in two levels of directories.
MKTAR_PY='
import io, random, sys, tarfile
out, n, maxkb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(20240601)
with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tf:
    made = set()
    for i in range(n):
        leaf = i // 50
        parts = ["tree", "d%03d" % (leaf // 20), "e%02d" % (leaf % 20)]
        for k in range(1, len(parts) + 1):
            d = "/".join(parts[:k])
            if d not in made:
                made.add(d)
                ti = tarfile.TarInfo(d)
                ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 1700000000
                tf.addfile(ti)
        data = rng.randbytes(rng.randint(0, maxkb * 1024))
        ti = tarfile.TarInfo("/".join(parts) + "/f%05d.dat" % i)
        ti.size, ti.mode, ti.mtime = len(data), 0o644, 1700000000
        tf.addfile(ti, io.BytesIO(data))
'

# Extracts the tar into DIR (the tar is read into memory first); times each
# file's open(O_CREAT|O_WRONLY)+write+close.
UNTAR_PY='
import os, sys, tarfile, time
tar, dest = sys.argv[1], sys.argv[2]
entries = []
with tarfile.open(tar, "r:") as tf:
    for m in tf:
        if m.isdir():
            entries.append((m.name, None))
        elif m.isfile():
            entries.append((m.name, tf.extractfile(m).read()))
lat = []
clock = time.perf_counter
t0 = clock()
for name, data in entries:
    p = os.path.join(dest, name)
    if data is None:
        os.mkdir(p, 0o755)
        continue
    a = clock()
    fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    off = 0
    while off < len(data):
        off += os.write(fd, data[off:])
    os.close(fd)
    lat.append(clock() - a)
total = clock() - t0
lat.sort()
pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000
print("untar_rate %.1f" % (len(lat) / total))
print("untar_p50 %.4f" % pct(0.50))
print("untar_p99 %.4f" % pct(0.99))
print("untar_max %.4f" % (lat[-1] * 1000))
'

# make_untar_tarball: $W/untar.tar (UNTAR_FILES, UNTAR_MAX_KB; bench/smp.sh's untar
# step and bench/roundtrip.sh).
make_untar_tarball() {
    log "making the untar tarball: $UNTAR_FILES files of 0-$UNTAR_MAX_KB KiB"
    python3 -c "$MKTAR_PY" "$W/untar.tar" "$UNTAR_FILES" "$UNTAR_MAX_KB"
    log "tarball $(du -h "$W/untar.tar" | cut -f1)"
}

# install_missing COMMAND:PACKAGE...: installs with apt-get the Debian
# package of each command that is not on PATH.
install_missing() {
    local pkgs=() pair
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null || pkgs+=("${pair#*:}")
    done
    [ ${#pkgs[@]} -gt 0 ] || return 0
    log "installing ${pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${pkgs[@]}" >&2 ||
        { apt-get update -q >&2 && apt-get install -y -q "${pkgs[@]}" >&2; } ||
        die "could not install ${pkgs[*]}"
}

# Unmounts the FUSE targets under $W (cairn, base, bindfs), lazily if busy.
unmount_fuse_targets() {
    if is_mounted "$W/cairnmnt"; then
        "$BIN" umount "$W/cairnmnt" >/dev/null 2>&1 || fusermount3 -u -z "$W/cairnmnt"
    fi
    if is_mounted "$W/basemnt"; then
        "$BASE_BIN" umount "$W/basemnt" >/dev/null 2>&1 || fusermount3 -u -z "$W/basemnt"
    fi
    if is_mounted "$W/bindmnt"; then
        fusermount3 -u "$W/bindmnt" 2>/dev/null || fusermount3 -u -z "$W/bindmnt"
    fi
    local m
    for m in "$W/memfsmnt" "$W/memfsdiskmnt"; do
        if is_mounted "$m"; then
            fusermount3 -u "$m" 2>/dev/null || fusermount3 -u -z "$m"
        fi
    done
}

# mount_memfs DIR [ARG...]: serves $MEMFS (crates/fuse/examples/memfs.rs,
# given DIR and ARGs) on DIR in
# the background, once it is mounted; in a session of its own, as `cairn
# mount` starts Cairn's daemon and libfuse starts bindfs. With autogroup
# scheduling (kernel.sched_autogroup_enabled, on in Debian's kernels) each
# session is a CPU group: a daemon in the load's own group answers each
# request about 1 us sooner (the two task switches stay in one group), so a
# memfs started in the bench's session measured a ceiling about 5% above
# what a daemon of its own reaches (docs/transport.md, "The round-trip
# floor").
mount_memfs() {
    setsid "$MEMFS" "$@" >"$1.log" 2>&1 </dev/null &
    local pid _
    for _ in $(seq 50); do
        if is_mounted "$1"; then
            pid=$(memfs_pid "$@") || die "memfs serving $1 not found"
            in_own_session "$pid" || die "memfs (pid $pid) does not lead a session of its own"
            return 0
        fi
        sleep 0.1
    done
    die "memfs did not mount on $1: $(cat "$1.log")"
}

# memfs_pid DIR [ARG...]: the pid of the memfs ($MEMFS) serving DIR, started
# with those ARGs.
memfs_pid() { pgrep -xf -- "$MEMFS $*"; }

# unmount_memfs DIR [ARG...]: unmounts the memfs serving DIR and waits for
# its process to end, so that a memfs mounted there next is the only one
# `memfs_pid` finds (a remount for a cold read).
unmount_memfs() {
    local pid _
    pid=$(memfs_pid "$@") || die "memfs serving $1 not found"
    fusermount3 -u "$1"
    for _ in $(seq 100); do
        [ -d "/proc/$pid" ] || return 0
        sleep 0.1
    done
    die "memfs (pid $pid) still runs 10 s after $1 was unmounted"
}

# in_own_session PID: true when process PID leads a session (its session
# id is its own pid), so not this shell's: a daemon the way `cairn mount`
# and libfuse start theirs.
in_own_session() {
    [ "$(ps -o sid= -p "$1" | tr -d ' ')" = "$1" ]
}

drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

# Empties every cache between the data and the reader: remount (every target
# but native; the script defines mount_target and unmount_target) and
# drop_caches.
make_cold() {
    if [ "$1" != native ]; then unmount_target "$1"; fi
    drop_caches
    if [ "$1" != native ]; then mount_target "$1"; fi
}

# set_conf TOML KEY VALUE: sets `KEY = VALUE` in a pool's cairn.toml (mkfs
# writes every key with its default; a key it lacks is appended).
set_conf() {
    if grep -q "^$2 = " "$1"; then
        sed -i "s|^$2 = .*|$2 = $3|" "$1"
    else
        echo "$2 = $3" >>"$1"
    fi
}

# Cairn is measured over FUSE io_uring where the kernel offers it, but
# `cairn mount` does not turn the host-wide fuse.enable_uring on by itself
# (only with --enable-uring-module): say so when it is off, and turn it on
# for the host when BENCH_ENABLE_URING=1.
bench_uring_param=/sys/module/fuse/parameters/enable_uring
if [ -r "$bench_uring_param" ] && [ "$(cat "$bench_uring_param")" != Y ]; then
    if [ "${BENCH_ENABLE_URING:-0}" = 1 ]; then
        echo Y >"$bench_uring_param" && log "turned on fuse.enable_uring (BENCH_ENABLE_URING=1)"
    else
        log "fuse.enable_uring=N: Cairn mounts use /dev/fuse threads (BENCH_ENABLE_URING=1 turns io_uring on)"
    fi
fi

# Per-round results of the scripts that compare configurations in
# interleaved rounds (encryption.sh, redundancy.sh): they declare
# `declare -A RES` (RES[key] = space-separated per-round values).
add() { RES[$1]="${RES[$1]:-} $2"; }
# vals KEY: the values of RES[KEY] in the array V.
vals() { read -ra V <<<"${RES[$1]:-}"; }
med() { vals "$1"; if [ ${#V[@]} -eq 0 ]; then echo n/a; else median "${V[@]}"; fi; }
latest() { vals "$1"; echo "${V[-1]}"; }
# quiet CMD...: runs CMD with its output kept aside; on failure shows the
# exact command and its output and stops the script.
quiet() {
    local out
    if ! out=$("$@" 2>&1); then
        log "command failed: $*"
        printf '%s\n' "$out" >&2
        exit 1
    fi
}
# verdict VALUE OP TARGET
verdict() {
    awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN {
        if (v == "n/a") { print "n/a"; exit }
        ok = (op == "<=") ? v + 0 <= t + 0 : v + 0 >= t + 0
        print ok ? "PASS" : "MISS" }'
}

# build_cairn: BIN, or the cairn of profile PROFILE under ROOT, built
# first unless NO_BUILD (encryption.sh, redundancy.sh).
build_cairn() {
    if [ -z "${BIN:-}" ]; then
        if [ -z "${NO_BUILD:-}" ]; then
            log "building cairn (profile $PROFILE)"
            # (without OUT_DIR: build scripts read it, a value from the
            # caller's environment would make cargo rebuild them each time)
            (cd "$ROOT" && env -u OUT_DIR cargo build --profile "$PROFILE" -p cairn-cli >&2)
        fi
        BIN=${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE/cairn
    fi
    [ -x "$BIN" ] || die "no binary at $BIN"
}
