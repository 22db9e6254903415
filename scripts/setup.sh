#!/usr/bin/env bash
# Installs what Cairn needs on Debian (as root), builds it, creates a pool in
# ./pool (unless one exists) and mounts it on ./mnt, ready to use.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/deps.sh
cargo build --release -p cairn-cli
install -m 0755 target/release/cairn /usr/local/bin/cairn
POOL=${POOL:-$PWD/pool}
MNT=${MNT:-$PWD/mnt}
mkdir -p "$MNT"
[ -e "$POOL/superblock" ] || cairn mkfs "$POOL"
if grep -q " $MNT " /proc/self/mountinfo; then
  echo "already mounted on $MNT"
else
  cairn mount "$POOL" "$MNT"
fi
cairn_info() { echo "use it: ls $MNT; unmount: cairn umount $MNT"; }
cairn_info
