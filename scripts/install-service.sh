#!/usr/bin/env bash
# Installs Cairn as a service (as root; setup.sh calls it): the binary, the
# systemd units cairn@.service, cairn-snapshot@.service and .timer, the
# mount(8) helper /sbin/mount.fuse.cairn (for `mount -t fuse.cairn` and
# fstab), man pages in /usr/local/share/man/man1 and bash completion.
# Describe a pool in /etc/cairn/NAME.toml, then:
#   systemctl enable --now cairn@NAME cairn-snapshot@NAME.timer
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/cairn}
install -m 0755 "$BIN" /usr/local/bin/cairn
install -m 0755 scripts/service/mount.fuse.cairn /sbin/mount.fuse.cairn
install -d -m 0755 /etc/cairn /etc/systemd/system
for u in 'cairn@.service' 'cairn-snapshot@.service' 'cairn-snapshot@.timer'; do
  install -m 0644 "scripts/service/$u" "/etc/systemd/system/$u"
done
[ -d /run/systemd/system ] && systemctl daemon-reload || true
install -d /usr/local/share/man/man1
/usr/local/bin/cairn man --dir /usr/local/share/man/man1 >/dev/null
command -v mandb >/dev/null && mandb -q 2>/dev/null || true
install -d /etc/bash_completion.d
/usr/local/bin/cairn completions bash > /etc/bash_completion.d/cairn
if [ ! -e /etc/cairn/example.toml.sample ]; then
  cat > /etc/cairn/example.toml.sample <<'EOT'
# Copy to /etc/cairn/NAME.toml, then: systemctl enable --now cairn@NAME
pool = "/srv/pool"
mountpoint = "/mnt/pool"
options = ["--metrics", "127.0.0.1:9469"]
EOT
fi
echo "installed cairn, its units, mount.fuse.cairn, man pages and completions"
