#!/usr/bin/env bash
# Installs what Cairn needs on Debian (as root): `deps.sh` for building and
# running it, `deps.sh test` also for the test suite and benchmarks. Called
# by setup.sh and test.sh, so each of the README's commands works alone.
set -euo pipefail
export PATH="$HOME/.cargo/bin:$PATH"
export DEBIAN_FRONTEND=noninteractive
pkgs=(fuse3 build-essential pkg-config)
if [ "${1:-}" = test ]; then
  # setfattr/getfattr (attr), fio, bindfs and sqlite3 for tests and benches,
  # e2fsprogs for the small loop filesystems of the full-host tests.
  pkgs+=(fio bindfs sqlite3 git attr e2fsprogs util-linux)
  # Real NBD clients and a reference server for the cairn-nbd tests:
  # nbdinfo, nbdcopy and nbdfuse (in libnbd-bin on Debian 12; newer
  # releases may split nbdfuse out), qemu-img and qemu-io, nbdkit.
  pkgs+=(libnbd-bin qemu-utils nbdkit)
  # vim for the path history tests (crates/cli/tests/path_history.rs: a
  # save with backupcopy=no, by rename over the file).
  pkgs+=(vim)
  # Sharing tests and bench/share.sh: Samba (smbd, smbclient),
  # nfs-ganesha with its VFS backend, and libnfs's client tools. The tests
  # start their own servers on loopback ports; the packages' own services
  # would listen on every interface, so they are neither started by the
  # install nor enabled (see below). samba-vfs-modules holds the
  # shadow_copy2 and glusterfs_fuse modules `cairn share smb` loads (samba
  # only recommends it). python3 runs the tests' NFSv4 client that
  # presents file handles (crates/cli/tests/tools).
  pkgs+=(samba samba-vfs-modules smbclient nfs-ganesha nfs-ganesha-vfs libnfs-utils python3)
  # gnuplot (no X) for bench/volumes_latency.sh's plot.
  pkgs+=(gnuplot-nox)
  # promtool (prometheus) checks the metrics endpoint; headless chromium
  # and node/npm run the dashboard's browser test (playwright-core drives
  # Debian's /usr/bin/chromium over CDP: no browser download, no
  # chromedriver); curl scrapes in bench/foundation.sh METRICS=1. A cold
  # install of these (about 290 packages on a minimal Debian 12) is timed
  # in bench/RESULTS.md, "Measured without a bench script".
  pkgs+=(prometheus chromium curl)
  # node and npm: any install will do (Debian's, or NodeSource's nodejs,
  # which carries npm).
  command -v node >/dev/null || pkgs+=(nodejs)
  command -v npm >/dev/null || pkgs+=(npm)
  if apt-cache show nbdfuse >/dev/null 2>&1; then pkgs+=(nbdfuse); fi
fi
# Another apt or dpkg run (unattended upgrades, a second install) holds the
# dpkg lock: wait for it (up to 10 minutes) instead of failing.
apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
# Services a package would start at install (Samba's, nfs-ganesha's) stay
# stopped: policy-rc.d refuses starts while apt runs (removed after, unless
# the admin had one), and units installed now are disabled.
no_services() {
  [ -e /usr/sbin/policy-rc.d ] && return 1
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod 0755 /usr/sbin/policy-rc.d
}
if [ ${#missing[@]} -gt 0 ]; then
  if no_services; then trap 'rm -f /usr/sbin/policy-rc.d' EXIT; fi
  apt_get update -qq
  apt_get install -y -qq "${missing[@]}" >/dev/null
  if [[ " ${missing[*]} " == *" samba "* || " ${missing[*]} " == *" nfs-ganesha "* ]] \
    && [ -d /run/systemd/system ]; then
    systemctl disable --now smbd nmbd samba-ad-dc nfs-ganesha >/dev/null 2>&1 || true
  fi
fi
if ! command -v cargo >/dev/null; then
  apt_get update -qq
  apt_get install -y -qq cargo rustc >/dev/null
fi
if [ "${1:-}" = test ]; then
  # s3s-fs: the file-backed S3 server the s3 tier tests start on a loopback
  # port (crates/objstore/src/testing.rs). Pinned (0.14.1 builds with rustc
  # 1.95; about 5 minutes on 2 cores), built only when that version is not
  # installed yet.
  S3S_FS_VERSION=0.14.1
  if [ "$("$HOME/.cargo/bin/s3s-fs" --version 2>/dev/null)" != "s3s-fs $S3S_FS_VERSION" ]; then
    cargo install s3s-fs --features binary --version "$S3S_FS_VERSION" --locked
  fi
  command -v rustup >/dev/null && { rustup component add rustfmt clippy >/dev/null 2>&1 || true; }
  command -v cargo-clippy >/dev/null || apt_get install -y -qq rust-clippy >/dev/null 2>&1 || true
  command -v rustfmt >/dev/null || apt_get install -y -qq rustfmt >/dev/null 2>&1 || true
fi
