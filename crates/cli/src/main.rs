//! The `cairn` command line: the binary's edge, where typed errors become
//! messages and exit codes.

mod admin;
mod args;
mod control;
mod daemon;
mod daemon_wait;
mod help;
mod keeper;
mod key;
mod logging;
mod metrics;
mod mirror;
mod mirror_bucket;
mod mirror_ends;
mod nbd;
mod ready;
mod report;
mod salvage;
mod service;
mod share;
mod stop;
mod tiering;
mod volume;

use anyhow::{Context, Result};
use clap::FromArgMatches;

/// mimalloc instead of glibc's malloc: the daemon's request threads
/// allocate buffers that other threads free (a payload read by the NBD
/// reader and dropped by a worker, a reply built by a worker), and glibc
/// serializes those frees on the allocating thread's arena lock (4 KiB
/// volume I/O at 32,000 ops/s: about 1,100 waits in 6 s in free and
/// calloc). mimalloc frees to per-thread lists without a shared lock.
/// Built with `no_thp` (Cargo.toml): no transparent huge pages, whose
/// faults can compact memory for milliseconds (docs/transport.md, "The
/// binary's allocator").
/// (The binary's unit tests keep the counting allocator of cairn-fuzzkit,
/// their dev-dependency.)
#[cfg(not(test))]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (its index in mimalloc 2 and 3;
/// libmimalloc-sys names no constant for it) and its documented default.
const MI_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
const MI_PURGE_DELAY_DEFAULT: std::ffi::c_long = 10;
/// How long freed memory stays with the process before mimalloc gives it
/// back to the host. Its default, 10 ms, is shorter than the gap between
/// two flushes: each flush's chunk buffers (64 MiB of sealed or compressed
/// chunks packed on every core) then came in fresh pages, faulted and
/// zeroed by the kernel (12% of the daemon's samples writing to an
/// encrypted pool, which wrote 360-390 MB/s with 10 ms and 500-630 with
/// 500 ms). Half a second still gives an idle daemon's memory back soon.
const PURGE_DELAY_MS: std::ffi::c_long = 500;

/// Sets the purge delay, unless the environment set it
/// (`MIMALLOC_PURGE_DELAY`) or the option at `MI_PURGE_DELAY` does not
/// hold its documented default (another mimalloc: left alone).
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: reading and setting an option only stores an integer in
    // mimalloc's option table.
    unsafe {
        if libmimalloc_sys::mi_option_get(MI_PURGE_DELAY) == MI_PURGE_DELAY_DEFAULT {
            libmimalloc_sys::mi_option_set(MI_PURGE_DELAY, PURGE_DELAY_MS);
        }
    }
}

fn main() {
    tune_allocator();
    let cli = match help::command().try_get_matches() {
        Ok(m) => args::Cli::from_arg_matches(&m).unwrap_or_else(|e| e.exit()),
        Err(e) => e.exit(),
    };
    use args::Cmd;
    if !matches!(cli.cmd, Cmd::Mount(_) | Cmd::Nbd(_) | Cmd::Service(_)) {
        quiet_on_closed_stdout();
    }
    if let Err(e) = run(cli) {
        // Not eprintln: a daemon's stderr is its log, which may be full.
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "cairn: {}", error_chain(&e));
        let usage = e.downcast_ref::<control::client::UsageError>().is_some();
        std::process::exit(if usage { 2 } else { 1 });
    }
}

/// The error and its causes joined by ": ", leaving out a cause whose
/// text a message before it already holds (library errors that print
/// their cause in their own message would otherwise say it twice).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let m = cause.to_string();
        if out.contains(&m) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&m);
    }
    out
}

/// Reports and listings stop quietly when their reader goes away (`cairn
/// snapshot list T | head`), as other tools do: `println!` panics on a
/// closed stdout, and this hook turns that one panic into a quiet exit.
/// Servers keep the default hook, and SIGPIPE stays ignored everywhere (a
/// client must report a daemon that closed its socket, not die silently).
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let msg = (p.downcast_ref::<String>().map(String::as_str))
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info)
    }));
}

fn run(cli: args::Cli) -> Result<()> {
    use args::Cmd;
    key::set_key_file(cli.key_file);
    match cli.cmd {
        Cmd::Mkfs(a) => {
            let mut opts = a.options()?;
            match (a.encrypt, key::key_file()) {
                (true, f) => opts.encrypt = Some(key::new_secret(f, "the new pool")?),
                (false, Some(f)) => anyhow::bail!(
                    "--key-file {} is for an encrypted pool: add --encrypt",
                    f.display()
                ),
                (false, None) => {}
            }
            let made = cairn_fs::pool::mkfs_report(&a.pool, opts)
                .with_context(|| format!("mkfs {}", a.pool.display()))?;
            let sb = &made.superblock;
            for w in &made.warnings {
                eprintln!("cairn: WARNING: {w}");
            }
            if let Some(c) = &a.compression {
                let path = cairn_fs::pool::PoolPaths::config(&a.pool);
                let mut cfg = cairn_fs::PoolConfig::load(&path)?;
                cfg.compression = c.clone();
                cfg.save(&path)?;
            }
            println!(
                "created pool {} (record size {} KiB, segment size {} MiB)",
                a.pool.display(),
                sb.record_size >> 10,
                sb.segment_size >> 20
            );
            for d in &made.devices {
                println!("  {d}");
            }
            println!("  {}", made.metadata);
            println!("  {}", made.log);
            if a.encrypt {
                println!("  encrypted (XAES-256-GCM contents, XChaCha20-Poly1305 metadata): keep the passphrase or key file safe, without it the pool cannot be read");
            }
            Ok(())
        }
        Cmd::Key(args::KeyCmd::Change {
            target,
            new_key_file,
        }) => key::change(&target, new_key_file.as_deref()),
        Cmd::Mount(a) => daemon::mount(a),
        Cmd::Umount(a) => daemon::umount(&a.mountpoint),
        Cmd::Restart(a) => keeper::restart(&a.mountpoint),
        Cmd::Check(a) => report::check(&a.pool),
        Cmd::Salvage(a) => salvage::run(&a),
        Cmd::Info(a) => report::info(&a.pool, a.json),
        Cmd::Sync(t) => admin::sync(&t),
        Cmd::Snapshot(c) => admin::snapshot(c),
        Cmd::History(a) => admin::history(&a),
        Cmd::Undo(a) => admin::undo(&a),
        Cmd::Prune(a) => admin::prune(&a),
        Cmd::Reblock(a) => admin::reblock(&a),
        Cmd::Gc(a) => admin::gc(&a),
        Cmd::Scrub(t) => admin::scrub(&t),
        Cmd::Device(c) => tiering::device(c),
        Cmd::Tier(c) => tiering::tier(c),
        Cmd::Redundancy(c) => tiering::redundancy(c),
        Cmd::Mirror(c) => mirror::run(c),
        Cmd::Volume(c) => volume::run(c),
        Cmd::Nbd(c) => volume::nbd(c),
        Cmd::Service(c) => service::run(c),
        Cmd::Share(c) => share::run(c),
        Cmd::Completions { shell } => help::completions(shell),
        Cmd::Man { dir } => help::man(&dir),
    }
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Outer(#[from] std::io::Error);

    #[test]
    fn a_cause_already_in_the_message_is_said_once() {
        let io = std::io::Error::other("disk on fire");
        let e = anyhow::Error::from(Outer(io)).context("mirror copy");
        assert_eq!(error_chain(&e), "mirror copy: outer: disk on fire");
        let e = anyhow::anyhow!("inner").context("middle").context("top");
        assert_eq!(error_chain(&e), "top: middle: inner");
    }
}
