#!/usr/bin/env bash
# fsync latency of the intent log: BIN (a cairn binary) mounts a fresh
# sparse pool in $WORK (/tmp); 3000 x (4 KiB pwrite at a random offset of a
# 64 MiB file + fsync); prints ops/s, p50 and p99 in us, and the time
# `cairn mount` took. Compare two builds by running them in turns:
#   for r in 1 2 3; do bash bench/fsync_log.sh OLD; bash bench/fsync_log.sh NEW; done
# MKFS_ARGS adds mkfs arguments, e.g. the log's two places in one build:
#   for r in 1 2 3; do MKFS_ARGS="--intent-log pool-dir" bash bench/fsync_log.sh B; bash bench/fsync_log.sh B; done
set -euo pipefail
BIN=$1; D=${WORK:-/tmp}/cairn-fsync-bench.$$; mkdir -p $D/mnt
$BIN mkfs $D/pool --sparse ${MKFS_ARGS:-} >/dev/null
t0=$(date +%s.%N); $BIN mount $D/pool $D/mnt; t1=$(date +%s.%N)
python3 - "$D/mnt/f" <<'PY'
import os,sys,time,random,statistics
p=sys.argv[1]; fd=os.open(p,os.O_CREAT|os.O_RDWR,0o644); os.ftruncate(fd,64<<20); os.fsync(fd)
buf=os.urandom(4096); lat=[]; r=random.Random(1)
t=time.perf_counter()
for i in range(3000):
    a=time.perf_counter(); os.pwrite(fd,buf,r.randrange(0,16384)*4096); os.fsync(fd); lat.append(time.perf_counter()-a)
el=time.perf_counter()-t; lat.sort()
print(f"ops/s {3000/el:.0f} p50_us {lat[1500]*1e6:.0f} p99_us {lat[2970]*1e6:.0f}", end=" ")
PY
echo "mount_s $(echo "$t1 - $t0" | bc)"
$BIN umount $D/mnt >/dev/null; rm -rf $D
