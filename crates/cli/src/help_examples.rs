//! One or more example invocations per command, by command path (commands
//! that carry their own `Example:` in after_help are not listed).

pub fn for_path(path: &str) -> Option<&'static str> {
    EXAMPLES.iter().find(|(p, _)| *p == path).map(|(_, e)| *e)
}

const EXAMPLES: &[(&str, &str)] = &[
    ("mkfs", "  cairn mkfs /srv/pool --device ssd:/srv/pool/data.0:100G\n  cairn mkfs /srv/pool --redundancy copies=2 --device ssd:/disk1/cairn:100G --device ssd:/disk2/cairn:100G\n  cairn mkfs /srv/pool --device ssd:/dev/nvme0n1 --device hdd:/dev/sdb --compression zstd\n  cairn mkfs /srv/pool --encrypt --device ssd:/srv/pool/data.0:100G   # asks for a passphrase twice"),
    ("mount", "  cairn mount /srv/pool /mnt/pool\n  cairn mount /srv/pool /mnt/pool --metrics 127.0.0.1:9469   # metrics and dashboard\n  mount -t fuse.cairn /srv/pool /mnt/pool                   # through mount.fuse.cairn\n  cairn mount /srv/pool /mnt/pool --keep-mount              # cairn restart works under it"),
    ("key change", "  cairn key change /mnt/pool                                   # types the old passphrase, then the new one twice\n  cairn key change /srv/pool --key-file old.key --new-key-file new.key"),
    ("umount", "  cairn umount /mnt/pool\n  umount /mnt/pool   # also works (as root): the daemon flushes and exits"),
    ("restart", "  cairn restart /mnt/pool   # after an upgrade of the binary; NFS and SMB servers stay up"),
    ("check", "  cairn check /srv/pool"),
    ("info", "  cairn info /mnt/pool\n  cairn info /srv/pool --json | jq .dedup_ratio"),
    ("sync", "  cairn sync /mnt/pool"),
    ("snapshot create", "  cairn snapshot create /mnt/pool before-upgrade"),
    ("snapshot auto", "  cairn snapshot auto /mnt/pool   # from a timer: cairn-snapshot@NAME.timer"),
    ("snapshot list", "  cairn snapshot list /mnt/pool --json"),
    ("snapshot delete", "  cairn snapshot delete /mnt/pool before-upgrade"),
    ("snapshot verify", "  cairn snapshot verify /mnt/pool before-upgrade"),
    ("history", "  cairn history /mnt/pool/etc/app.conf\n  cairn history --inode --json /mnt/pool/etc/app.conf\n  cairn history /mnt/pool/.snapshots/before-upgrade/etc/app.conf\n  cairn history --off /mnt/pool/scratch"),
    ("undo", "  cairn undo --snapshot before-upgrade /mnt/pool/etc/app.conf\n  cairn undo --tid 0x2a -o /tmp/old.conf /mnt/pool/etc/app.conf"),
    ("prune", "  cairn prune /mnt/pool --dry-run\n  cairn prune /mnt/pool --keep-daily 7 --keep-weekly 4"),
    ("reblock", "  cairn reblock /mnt/pool --max-live 60"),
    ("gc", "  cairn gc /mnt/pool --max-live 90"),
    ("scrub", "  cairn scrub /mnt/pool || echo damaged"),
    ("device add", "  cairn device add /mnt/pool hdd:/dev/sdc\n  cairn device add /mnt/pool ssd:/dev/nvme1n1:role=cache"),
    ("device remove", "  cairn device remove /mnt/pool /dev/sdc"),
    ("device replace", "  cairn device replace /mnt/pool 1 ssd:/dev/sdd   # device 1 died or is failing"),
    ("redundancy set", "  cairn redundancy set /mnt/pool copies=2\n  cairn redundancy set /mnt/pool ssd:copies=2,hdd:copies=1\n  cairn redundancy set /mnt/pool ec=4+2"),
    ("redundancy show", "  cairn redundancy show /mnt/pool\n  cairn redundancy show /mnt/pool --json | jq .bytes_at_risk"),
    ("redundancy rebuild", "  cairn redundancy rebuild /mnt/pool   # after a lost device or a raised policy"),
    ("tier status", "  cairn tier status /mnt/pool"),
    ("tier migrate", "  cairn tier migrate /mnt/pool --now"),
    ("mirror read", "  cairn mirror read /mnt/pool --since 0x40 -o /backup/pool.stream"),
    ("mirror write", "  cairn mirror write /srv/mirror -i /backup/pool.stream"),
    ("mirror copy", "  cairn mirror copy /mnt/pool /srv/mirror\n  cairn mirror copy /mnt/pool ssh:backup@host:/srv/mirror\n  cairn mirror copy /mnt/pool s3:backups/pool1:endpoint=https://s3.example.net --credentials-file /etc/cairn/s3.cred"),
    ("mirror restore", "  cairn mkfs /srv/restored --mirror\n  cairn mirror restore s3:backups/pool1:endpoint=https://s3.example.net /srv/restored --credentials-file /etc/cairn/s3.cred\n  cairn mirror promote /srv/restored"),
    ("mirror stream", "  cairn mirror stream /mnt/pool /srv/mirror --interval 1"),
    ("mirror status", "  cairn mirror status /srv/mirror"),
    ("mirror promote", "  cairn mirror promote /srv/mirror"),
    ("mirror rollback", "  cairn mirror rollback /srv/mirror nightly-2024-05-01"),
    ("mirror release", "  cairn mirror release /mnt/pool 6f1c0b7e-1d2a-4c55-9a3e-0c1d2e3f4a5b"),
    ("service mount", "  cairn service mount tank   # reads /etc/cairn/tank.toml; systemctl start cairn@tank"),
    ("service snapshot", "  cairn service snapshot tank   # systemctl enable --now cairn-snapshot@tank.timer"),
    ("completions", "  cairn completions bash > /etc/bash_completion.d/cairn\n  cairn completions zsh > ~/.zfunc/_cairn\n  cairn completions fish > ~/.config/fish/completions/cairn.fish"),
    ("man", "  cairn man --dir /usr/local/share/man/man1 && man cairn-snapshot-create"),
];
