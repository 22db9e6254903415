#!/usr/bin/env bash
# Installs what Cairn needs on Debian (as root), builds it, creates a pool in
# ./pool (unless one exists) and mounts it on ./mnt, ready to use.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/deps.sh
cargo build --release -p cairn-cli
bash scripts/install-service.sh
POOL=${POOL:-$PWD/pool}
MNT=${MNT:-$PWD/mnt}
mkdir -p "$MNT"
# The device file is allocated for real: 8 GiB, or half the free space if
# that is less (POOL_SIZE=64G to choose).
if [ -z "${POOL_SIZE:-}" ]; then
  free=$(df --output=avail -B1 "$(dirname "$POOL")" | tail -1)
  POOL_SIZE=$(( free / 2 < 8 << 30 ? free / 2 : 8 << 30 ))
fi
[ -e "$POOL/superblock" ] || cairn mkfs "$POOL" --device "ssd:$POOL/data.0:$POOL_SIZE"
if grep -q " $MNT " /proc/self/mountinfo; then
  echo "already mounted on $MNT"
else
  cairn mount "$POOL" "$MNT"
fi
cairn_info() { echo "use it: ls $MNT; unmount: cairn umount $MNT"; }
cairn_info
