#!/usr/bin/env bash
# Installs Cairn as a service (as root; setup.sh calls it): the binary, the
# systemd units cairn@.service, cairn-snapshot@.service and .timer, the
# mount(8) helper mount.fuse.cairn (for `mount -t fuse.cairn` and fstab),
# man pages and bash, zsh and fish completions.
# Describe a pool in /etc/cairn/NAME.toml, then:
#   systemctl enable --now cairn@NAME cairn-snapshot@NAME.timer
#
# Where (environment; the defaults install for real):
#   BIN=target/release/cairn   the binary to install
#   DESTDIR=                   staging root prepended to every path below
#                              (packaging, tests); systemctl and mandb run
#                              only without it
#   PREFIX=/usr/local          binary in PREFIX/bin, man pages in
#                              PREFIX/share/man/man1, zsh and fish
#                              completions under PREFIX/share
#   SBINDIR=/sbin              mount.fuse.cairn (mount(8) looks in /sbin)
#   SYSCONFDIR=/etc            cairn/ (pool descriptions), bash_completion.d
#   UNITDIR=SYSCONFDIR/systemd/system
# The units and the mount helper name the binary as PREFIX/bin/cairn.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/cairn}
DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/usr/local}
SBINDIR=${SBINDIR:-/sbin}
SYSCONFDIR=${SYSCONFDIR:-/etc}
UNITDIR=${UNITDIR:-$SYSCONFDIR/systemd/system}
MANDIR=$PREFIX/share/man/man1
ZSHDIR=$PREFIX/share/zsh/site-functions
FISHDIR=$PREFIX/share/fish/vendor_completions.d
BASHDIR=$SYSCONFDIR/bash_completion.d
D=$DESTDIR
[ -x "$BIN" ] || { echo "install-service.sh: no binary at $BIN (cargo build --release -p cairn-cli)" >&2; exit 1; }
install -d -m 0755 "$D$PREFIX/bin" "$D$SBINDIR" "$D$SYSCONFDIR/cairn" "$D$UNITDIR" \
  "$D$MANDIR" "$D$BASHDIR" "$D$ZSHDIR" "$D$FISHDIR"
install -m 0755 "$BIN" "$D$PREFIX/bin/cairn"
# The installed binary's path goes into the helper and the units.
sed "s|/usr/local/bin/cairn|$PREFIX/bin/cairn|g" scripts/service/mount.fuse.cairn > "$D$SBINDIR/mount.fuse.cairn"
chmod 0755 "$D$SBINDIR/mount.fuse.cairn"
for u in 'cairn@.service' 'cairn-snapshot@.service' 'cairn-snapshot@.timer'; do
  sed "s|/usr/local/bin/cairn|$PREFIX/bin/cairn|g" "scripts/service/$u" > "$D$UNITDIR/$u"
  chmod 0644 "$D$UNITDIR/$u"
done
"$BIN" man --dir "$D$MANDIR" >/dev/null
"$BIN" completions bash > "$D$BASHDIR/cairn"
"$BIN" completions zsh > "$D$ZSHDIR/_cairn"
"$BIN" completions fish > "$D$FISHDIR/cairn.fish"
if [ ! -e "$D$SYSCONFDIR/cairn/example.toml.sample" ]; then
  cat > "$D$SYSCONFDIR/cairn/example.toml.sample" <<'EOT'
# Copy to /etc/cairn/NAME.toml, then: systemctl enable --now cairn@NAME
pool = "/srv/pool"
mountpoint = "/mnt/pool"
options = ["--metrics", "127.0.0.1:9469"]
EOT
fi
if [ -z "$D" ]; then
  if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
  if command -v mandb >/dev/null; then mandb -q 2>/dev/null || true; fi
fi
echo "installed into ${D:-/}: $PREFIX/bin/cairn, $SBINDIR/mount.fuse.cairn, units in $UNITDIR, man pages in $MANDIR, completions (bash, zsh, fish)"
