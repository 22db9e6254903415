#!/usr/bin/env bash
# Mirror stream benchmark: what `cairn mirror copy` (incremental replication)
# costs in wall time and bytes on the wire, against baselines measured in the
# same run on the same tree:
#   1. a source tree of FILES files (deterministic random data, log-normal
#      sizes, about TOTAL_MB in all) in a Cairn mount, in a plain directory
#      and in a btrfs subvolume (all three identical);
#   2. full copy: `cairn mirror copy SRC_MNT MIRROR_MNT` into a fresh mirror
#      pool, mounted (read-only) as the baselines' destinations are (bytes =
#      the stream's size from --json), `cp -a` into a fresh
#      Cairn mount (+ cairn sync), `rsync -a --delete` into an empty plain
#      directory (bytes = "Total bytes sent"), `btrfs send SNAP | btrfs
#      receive` between two loop-mounted btrfs filesystems (bytes = the send
#      stream's size);
#   3. each incremental round changes CHANGE_PCT % of the files (seeded:
#      rewrite, append, delete, rename, a quarter each) identically in the
#      three sources, then times `cairn mirror copy`, `rsync -a --delete` and
#      `btrfs send -p PARENT NEW | btrfs receive` again;
#   4. a file whose content the mirror already holds: a clone (`cp`) and a
#      rewrite (`cat >`) of the largest file, each mirrored on its own (chunk
#      bytes sent, which should be 0);
#   5. checks that the mirror (mounted read-only) equals the source.
# Every timed step starts cold (the source pool remounted, page cache
# dropped; COLD=0 to skip) and ends durable (cairn sync / sync -f for the
# baselines). Figures are medians of ROUNDS rounds; ratios are medians of the
# per-round ratios, with PASS/MISS against targets. A MISS never fails the
# script; a failed step does (exit 1).
# Needs root (losetup, mount, drop_caches), fuse3, python3; installs rsync and
# btrfs-progs with apt-get when missing.
# Environment:
#   FILES=100000     files in the tree
#   TOTAL_MB=...     total size of the tree (default FILES * 2048 / 100000,
#                    i.e. 2 GiB for 100000 files; so FILES alone scales it)
#   ROUNDS=3         rounds of each measurement (median printed)
#   CHANGE_PCT=1     percentage of the files changed per incremental round
#   SEED=1           seed of the tree and of the changes
#   BENCH_DIR=/var/tmp  where the work dir is made (pick the disk to test)
#   COLD=1           remount the source and drop caches before each timed step
#   VERIFY=1         compare the mirror with the source at the end
#   NO_BUILD=1       use target/release/cairn as it is
#   KEEP=1           keep the work dir (mounts and loop devices are undone)
# Quick run: FILES=5000 ROUNDS=1 bench/mirror.sh
set -euo pipefail

FILES=${FILES:-100000}
TOTAL_MB=${TOTAL_MB:-$((FILES * 2048 / 100000))}
[ "$TOTAL_MB" -ge 1 ] || TOTAL_MB=1
ROUNDS=${ROUNDS:-3}
CHANGE_PCT=${CHANGE_PCT:-1}
SEED=${SEED:-1}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
COLD=${COLD:-1}
VERIFY=${VERIFY:-1}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"
declare -A RES    # RES[name] = space-separated per-round values
LOOPS=()          # loop devices we attached

. "$(dirname "$0")/lib.sh"
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
# json FIELD: one JSON document on stdin, prints FIELD (a.b for nesting).
json() {
    python3 -c 'import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1].split("."):
    v = v[k]
print(v)' "$1"
}
med() { [ -n "${RES[$1]:-}" ] || { echo n/a; return; }; median ${RES[$1]}; }
# sec NAME: the median of a time, in seconds with 3 decimals.
sec() { awk -v v="$(med "$1")" 'BEGIN { if (v == "n/a") print v; else printf "%.3f", v }'; }

# ------------------------------------------------------------------ setup

check_tools() {
    [ "$(id -u)" = 0 ] || die "run as root (losetup, mount, drop_caches)"
    local need=()
    command -v rsync >/dev/null || need+=(rsync)
    command -v mkfs.btrfs >/dev/null && command -v btrfs >/dev/null || need+=(btrfs-progs)
    if [ ${#need[@]} -gt 0 ]; then
        log "installing ${need[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 ||
            { apt-get update -qq >/dev/null && apt-get install -y -qq "${need[@]}" >/dev/null; } ||
            die "could not install ${need[*]}"
    fi
    for t in python3 rsync btrfs mkfs.btrfs losetup fusermount3 diff dd; do
        command -v "$t" >/dev/null || die "$t not installed"
    done
    grep -qw btrfs /proc/filesystems || modprobe btrfs 2>/dev/null || die "no btrfs in this kernel"
}

build_cairn() {
    if [ -z "${NO_BUILD:-}" ]; then
        log "building cairn (release)"
        (cd "$ROOT" && cargo build --release -p cairn-cli >&2)
    fi
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/cairn
    [ -x "$BIN" ] || die "no binary at $BIN"
}

setup_dirs() {
    # Room: the tree in the plain source and destination, the Cairn source,
    # mirror and cp -a pools, the stream file and the two btrfs images.
    local need avail
    need=$(((TOTAL_MB * 10 + 4096) << 20))
    avail=$(df --output=avail -B1 "$BENCH_DIR" | tail -1)
    [ "$avail" -ge "$need" ] ||
        die "$BENCH_DIR has $(mib "$avail") MiB free, this run needs about $(mib "$need") MiB (lower FILES or TOTAL_MB)"
    W=$(mktemp -d "$BENCH_DIR/cairn-mirror.XXXXXX")
    mkdir -p "$W/plain/src" "$W/plain/dst" "$W/pools" "$W/mnt/src" "$W/mnt/cp" \
        "$W/mnt/mirror" "$W/mnt/bta" "$W/mnt/btb" "$W/btrfs" "$W/tmp"
    # `cairn mirror copy` keeps its stream in a file under TMPDIR.
    export TMPDIR="$W/tmp"
    SRC_POOL=$W/pools/src SRC_MNT=$W/mnt/src MIRROR=$W/pools/mirror MIRROR_MNT=$W/mnt/mirror
    CP_POOL=$W/pools/cp CP_MNT=$W/mnt/cp
    BTA=$W/mnt/bta BTB=$W/mnt/btb
    POOL_GB=$(((TOTAL_MB * 3 >> 10) + 2))
    log "work dir $W on $(findmnt -n -o SOURCE,FSTYPE -T "$W" | tr -s ' ')"
}

cleanup() {
    set +eu
    [ -n "${W:-}" ] || return 0
    local m
    for m in "$W/mnt/src" "$W/mnt/cp" "$W/mnt/mirror"; do
        if is_mounted "$m"; then "$BIN" umount "$m" >/dev/null 2>&1 || fusermount3 -u -z "$m"; fi
    done
    for m in "$W/mnt/bta" "$W/mnt/btb"; do
        if is_mounted "$m"; then umount "$m" 2>/dev/null || umount -l "$m"; fi
    done
    for m in "${LOOPS[@]}"; do losetup -d "$m" 2>/dev/null; done
    if [ -z "${KEEP:-}" ]; then rm -rf --one-file-system "$W"; else log "kept $W"; fi
}

# new_pool POOL [mkfs options]: a fresh pool with one sparse device file.
new_pool() {
    local p=$1
    shift
    rm -rf "$p"
    quiet "$BIN" mkfs "$p" --device "ssd:$p/data.0:${POOL_GB}G" --sparse "$@"
}

# A btrfs filesystem on a sparse image attached to a loop device.
new_btrfs() {
    local img=$1 mnt=$2 dev
    truncate -s "$(((TOTAL_MB * 3 >> 10) + 2))G" "$img"
    dev=$(losetup --find --show "$img")
    LOOPS+=("$dev")
    quiet mkfs.btrfs -q -f "$dev"
    mount "$dev" "$mnt"
}

# ------------------------------------------------------------ the tree

# gen.py ROOT FILES TOTAL_BYTES SEED: FILES files of random bytes (seeded),
# log-normal sizes scaled to TOTAL_BYTES, 100 per directory.
GEN_PY='
import os, random, sys
root, n, total, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
w = [rng.lognormvariate(0, 1.5) for _ in range(n)]
scale = total / sum(w)
for i in range(n):
    d = os.path.join(root, "%03d" % (i // 10000), "%02d" % (i // 100 % 100))
    if i % 100 == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%06d" % i), "wb") as f:
        f.write(rng.randbytes(int(w[i] * scale)))
'

# changes.py ROOT SEED PCT: changes PCT % of the regular files under ROOT
# (picked by SEED from the sorted list, so identical trees change
# identically): a quarter each rewritten (new random content, 0.5-1.5 times
# the size), appended to (100 B - 16 KiB), deleted, renamed. Prints the
# bytes written.
CHANGES_PY='
import os, random, sys
root, seed, pct = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
files = []
for d, dirs, names in os.walk(root):
    dirs.sort()
    for name in sorted(names):
        p = os.path.join(d, name)
        if os.path.isfile(p) and not os.path.islink(p):
            files.append(os.path.relpath(p, root))
rng = random.Random(seed)
pick = rng.sample(files, max(4, min(len(files), round(len(files) * pct / 100))))
written = 0
for k, rel in enumerate(pick):
    p = os.path.join(root, rel)
    c = random.Random(seed * 1000003 + k)
    kind = k % 4
    if kind == 0:
        data = c.randbytes(max(1, int(os.path.getsize(p) * c.uniform(0.5, 1.5))))
        with open(p, "wb") as f:
            f.write(data)
        written += len(data)
    elif kind == 1:
        data = c.randbytes(c.randint(100, 16384))
        with open(p, "ab") as f:
            f.write(data)
        written += len(data)
    elif kind == 2:
        os.unlink(p)
    else:
        os.rename(p, p + ".r%d" % seed)
print(written)
'

build_tree() {
    log "generating $FILES files, $TOTAL_MB MiB (seed $SEED)"
    python3 -c "$GEN_PY" "$W/plain/src" "$FILES" $((TOTAL_MB << 20)) "$SEED"
    TREE_BYTES=$(du -s -B1 --apparent-size "$W/plain/src" | cut -f1)
    log "copying the tree into the Cairn source and the btrfs source (untimed)"
    new_pool "$SRC_POOL"
    quiet "$BIN" mount "$SRC_POOL" "$SRC_MNT"
    cp -a "$W/plain/src/." "$SRC_MNT/"
    quiet "$BIN" sync "$SRC_MNT"
    new_btrfs "$W/btrfs/a.img" "$BTA"
    new_btrfs "$W/btrfs/b.img" "$BTB"
    quiet btrfs subvolume create "$BTA/data"
    cp -a "$W/plain/src/." "$BTA/data/"
    quiet btrfs subvolume snapshot -r "$BTA/data" "$BTA/snap0"
    sync
}

# Cold start for the next timed step: the source pool's daemon restarted
# (no cached metadata or data) and the page cache dropped.
cold() {
    [ "$COLD" = 1 ] || return 0
    quiet "$BIN" umount "$SRC_MNT"
    drop_caches
    quiet "$BIN" mount "$SRC_POOL" "$SRC_MNT"
}

# ------------------------------------------------------- measurements

# cairn_copy KEY: times `cairn mirror copy` from the source mount into the
# mirror pool; records KEY_time, KEY_bytes, KEY_chunk.
cairn_copy() {
    local t0 t out cmd=("$BIN" mirror copy "$SRC_MNT" "$MIRROR_MNT" --json)
    cold
    t0=$(now)
    out=$("${cmd[@]}" 2>"$W/err") || {
        log "cairn failed: ${cmd[*]}"
        cat "$W/err" >&2
        exit 1
    }
    t=$(elapsed "$t0")
    add "$1_time" "$t"
    add "$1_bytes" "$(json read.bytes <<<"$out")"
    add "$1_chunk" "$(json read.chunk_bytes <<<"$out")"
    log "$1: cairn mirror copy ${t}s, stream $(json read.bytes <<<"$out") bytes" \
        "(chunks $(json read.chunk_bytes <<<"$out"), TIDs $(json read.since <<<"$out")..$(json read.upto <<<"$out"))"
}

# cp -a of the Cairn source tree into a fresh Cairn pool, committed.
cp_full() {
    local t0 t
    is_mounted "$CP_MNT" && quiet "$BIN" umount "$CP_MNT"
    new_pool "$CP_POOL"
    quiet "$BIN" mount "$CP_POOL" "$CP_MNT"
    cold
    t0=$(now)
    cp -a "$SRC_MNT/." "$CP_MNT/"
    quiet "$BIN" sync "$CP_MNT"
    t=$(elapsed "$t0")
    add full_cp_time "$t"
    log "full: cp -a ${t}s"
    quiet "$BIN" umount "$CP_MNT"
    rm -rf "$CP_POOL"
}

# rsync_copy KEY: rsync -a --delete of the plain source into the plain
# destination, flushed; bytes = "Total bytes sent".
rsync_copy() {
    local t0 t b
    cold
    t0=$(now)
    rsync -a --delete --stats --no-human-readable "$W/plain/src/" "$W/plain/dst/" >"$W/rsync.out"
    sync -f "$W/plain/dst"
    t=$(elapsed "$t0")
    b=$(awk -F: '/^Total bytes sent/ { gsub(/[ ,]/, "", $2); print $2 }' "$W/rsync.out")
    [ -n "$b" ] || die "no 'Total bytes sent' in rsync --stats output"
    add "$1_rsync_time" "$t"
    add "$1_rsync_bytes" "$b"
    log "$1: rsync ${t}s, $b bytes sent"
}

# btrfs_copy KEY SNAP [PARENT]: btrfs send (incremental with PARENT) piped
# through dd (which counts the bytes) into btrfs receive, flushed.
btrfs_copy() {
    local key=$1 snap=$2 parent=${3:-} t0 t b p=()
    [ -z "$parent" ] || p=(-p "$BTA/$parent")
    cold
    t0=$(now)
    btrfs -q send "${p[@]}" "$BTA/$snap" 2>"$W/err" | dd bs=1M 2>"$W/dd.err" |
        btrfs -q receive "$BTB" >/dev/null 2>>"$W/err" || {
        log "btrfs send/receive failed"
        cat "$W/err" >&2
        exit 1
    }
    sync -f "$BTB"
    t=$(elapsed "$t0")
    b=$(awk '/bytes/ { print $1 }' "$W/dd.err")
    add "${key}_btrfs_time" "$t"
    add "${key}_btrfs_bytes" "$b"
    log "$key: btrfs send/receive ${t}s, $b bytes"
}

bench_full() {
    local r
    for r in $(seq "$ROUNDS"); do
        log "full copy, round $r of $ROUNDS"
        is_mounted "$MIRROR_MNT" && quiet "$BIN" umount "$MIRROR_MNT"
        new_pool "$MIRROR" --mirror
        quiet "$BIN" mount "$MIRROR" "$MIRROR_MNT"
        cairn_copy full
        cp_full
        rm -rf "$W/plain/dst" && mkdir "$W/plain/dst"
        rsync_copy full
        if [ -d "$BTB/snap0" ]; then
            quiet btrfs subvolume delete "$BTB/snap0"
            quiet btrfs subvolume sync "$BTB"
        fi
        btrfs_copy full snap0
        add full_ratio_cp "$(div "$(last ${RES[full_time]})" "$(last ${RES[full_cp_time]})")"
    done
}

# One round: the same changes (seed SEED*1000+R) in the three sources, then
# the three incremental copies.
bench_incremental() {
    local r s a b c
    for r in $(seq "$ROUNDS"); do
        s=$((SEED * 1000 + r))
        log "incremental, round $r of $ROUNDS: changing $CHANGE_PCT % of the files (seed $s)"
        a=$(python3 -c "$CHANGES_PY" "$SRC_MNT" "$s" "$CHANGE_PCT")
        b=$(python3 -c "$CHANGES_PY" "$W/plain/src" "$s" "$CHANGE_PCT")
        c=$(python3 -c "$CHANGES_PY" "$BTA/data" "$s" "$CHANGE_PCT")
        [ "$a" = "$b" ] && [ "$a" = "$c" ] || die "the sources changed differently ($a, $b, $c bytes): they were not identical"
        add changed "$a"
        quiet "$BIN" sync "$SRC_MNT"
        quiet btrfs subvolume snapshot -r "$BTA/data" "$BTA/snap$r"
        sync
        cairn_copy incr
        rsync_copy incr
        btrfs_copy incr "snap$r" "snap$((r - 1))"
        add incr_ratio_bytes "$(div "$(last ${RES[incr_bytes]})" "$a")"
        add incr_ratio_rsync "$(div "$(last ${RES[incr_rsync_time]})" "$(last ${RES[incr_time]})")"
        add incr_ratio_btrfs "$(div "$(last ${RES[incr_time]})" "$(last ${RES[incr_btrfs_time]})")"
    done
}

last() { echo "${@: -1}"; }

# Content the mirror already holds under a new name: a clone (cp, which
# Cairn makes with copy_file_range) and a rewrite (cat >) of the largest
# file, each mirrored on its own. Done in the plain source too (for VERIFY).
bench_held() {
    local rel
    rel=$(cd "$W/plain/src" && find . -type f -printf '%s %P\n' | sort -k1,1nr -k2 |
        awk 'NR == 1 { sub(/^[0-9]+ /, ""); print }')
    HELD_FILE=$rel HELD_SIZE=$(stat -c %s "$W/plain/src/$rel")
    log "held content: $rel ($HELD_SIZE bytes) cloned, then rewritten"
    cp "$SRC_MNT/$rel" "$SRC_MNT/$rel.clone"
    cp "$W/plain/src/$rel" "$W/plain/src/$rel.clone"
    quiet "$BIN" sync "$SRC_MNT"
    cairn_copy held_clone
    cat "$SRC_MNT/$rel" >"$SRC_MNT/$rel.rewrite"
    cat "$W/plain/src/$rel" >"$W/plain/src/$rel.rewrite"
    quiet "$BIN" sync "$SRC_MNT"
    cairn_copy held_rewrite
}

# The mirror, mounted read-only, against the plain source (content) and the
# Cairn source (names, sizes, modes, mtimes).
verify() {
    [ "$VERIFY" = 1 ] || return 0
    local m=$MIRROR_MNT st
    log "verifying the mirror"
    st=$("$BIN" mirror status "$MIRROR" --json)
    [ "$(json tid <<<"$st")" = "$("$BIN" mirror status "$SRC_MNT" --json | json tid)" ] ||
        die "mirror at TID $(json tid <<<"$st"), source elsewhere"
    diff -r -q "$W/plain/src" "$m" >"$W/diff.out" 2>&1 || {
        head -20 "$W/diff.out" >&2
        die "the mirror's content differs from the source tree"
    }
    local listing='%P %y %s %m %T@\n'
    diff <(cd "$SRC_MNT" && find . -printf "$listing" | sort) \
        <(cd "$m" && find . -printf "$listing" | sort) >"$W/diff.out" || {
        head -20 "$W/diff.out" >&2
        die "the mirror's metadata differs from the Cairn source"
    }
    quiet "$BIN" umount "$m"
    VERIFIED=yes
}

# ------------------------------------------------------------- report

# verdict VALUE OP TARGET
verdict() {
    awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN {
        if (v == "n/a") { print "n/a"; exit }
        ok = (op == "<=") ? v + 0 <= t + 0 : v + 0 >= t + 0
        print ok ? "PASS" : "MISS" }'
}

print_table() {
    local ft fb it ib
    echo
    echo "Cairn $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores," \
        "$(uname -r), work dir on $(findmnt -n -o FSTYPE -T "$W"); tree: $FILES files, $(mib "$TREE_BYTES") MiB;" \
        "medians of ROUNDS=$ROUNDS; each step from cold caches (COLD=$COLD) and flushed."
    echo
    echo "| | cairn mirror copy | rsync -a --delete | btrfs send/receive | cp -a (into Cairn) |"
    echo "|---|---:|---:|---:|---:|"
    echo "| full: time (s) | $(sec full_time) | $(sec full_rsync_time) | $(sec full_btrfs_time) | $(sec full_cp_time) |"
    echo "| full: bytes sent | $(med full_bytes) | $(med full_rsync_bytes) | $(med full_btrfs_bytes) | n/a |"
    echo "| incremental: time (s) | $(sec incr_time) | $(sec incr_rsync_time) | $(sec incr_btrfs_time) | n/a |"
    echo "| incremental: bytes sent | $(med incr_bytes) | $(med incr_rsync_bytes) | $(med incr_btrfs_bytes) | n/a |"
    echo
    echo "Incremental rounds change $CHANGE_PCT % of the files; bytes changed (written) per round:${RES[changed]}" \
        "(median $(med changed)); cairn chunk bytes sent per round:${RES[incr_chunk]}."
    echo
    echo "| ratio (median of per-round ratios) | value | per round | target | |"
    echo "|---|---:|---|---|---|"
    local row key label op target v
    for row in "incr_ratio_bytes|cairn incremental bytes / bytes changed|<=|1.2" \
        "incr_ratio_rsync|rsync incremental time / cairn incremental time|>=|10" \
        "incr_ratio_btrfs|cairn incremental time / btrfs incremental time|<=|1" \
        "full_ratio_cp|cairn full time / cp -a time|<=|1.5"; do
        IFS='|' read -r key label op target <<<"$row"
        v=$(med "$key")
        echo "| $label | $v |${RES[$key]:-} | $op $target | $(verdict "$v" "$op" "$target") |"
    done
    echo
    echo "Content the mirror already holds ($HELD_FILE, $HELD_SIZE bytes, under a new name):"
    echo
    echo "| case | time (s) | stream bytes | chunk bytes sent |"
    echo "|---|---:|---:|---:|"
    echo "| clone (cp) | $(sec held_clone_time) | $(med held_clone_bytes) | $(med held_clone_chunk) |"
    echo "| rewrite (cat >) | $(sec held_rewrite_time) | $(med held_rewrite_bytes) | $(med held_rewrite_chunk) |"
    echo
    echo "Mirror checked against the source (content, names, sizes, modes, mtimes): ${VERIFIED:-skipped}."
}

main() {
    check_tools
    build_cairn
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    # A failing step names itself (set -E: also inside functions).
    set -E
    trap 'log "step failed (exit $?) at line $LINENO: $BASH_COMMAND"' ERR
    setup_dirs
    build_tree
    bench_full
    bench_incremental
    bench_held
    verify
    print_table
}

main "$@"
