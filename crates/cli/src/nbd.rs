//! Serving a pool's volumes over NBD from this process: the mount daemon
//! (`mount --nbd ADDR` / `--nbd-socket PATH`, or the pool config's nbd_*
//! keys) and `cairn nbd serve` on an unmounted pool; TCP requires TLS
//! (`--nbd-tls DIR`, a directory `cairn nbd tls-init` writes) unless
//! `--nbd-insecure`. The running servers are kept here so that `cairn
//! info` can report their statistics.

use crate::args::NbdArgs;
use crate::control::replies::NbdServer;
use crate::volume::{NbdServeArgs, NbdTlsInitArgs};
use anyhow::{bail, Context, Result};
use cairn_fs::pool::PoolPaths;
use cairn_fs::{Fs, FsError, Pool, PoolConfig};
use cairn_nbd::{Address, PoolExports, Server, ServerConfig, TlsConfig};
use parking_lot::Mutex;
use std::path::Path;
use std::sync::Arc;

/// The servers running in this process.
static SERVERS: Mutex<Vec<Server>> = Mutex::new(Vec::new());

/// Applies the command line's NBD settings over the config's.
pub fn apply(c: &mut PoolConfig, a: &NbdArgs) -> Result<()> {
    if let Some(l) = &a.listen {
        c.nbd_listen = l.clone();
    }
    if let Some(s) = &a.socket {
        c.nbd_socket = std::path::absolute(s)?.to_string_lossy().into_owned();
    }
    c.nbd_allow_remote |= a.allow_remote;
    if let Some(d) = &a.tls {
        c.nbd_tls = std::path::absolute(d)?.to_string_lossy().into_owned();
    }
    c.nbd_insecure |= a.insecure;
    if let Some(n) = a.workers_min {
        c.nbd_workers_min = n;
    }
    if let Some(n) = a.workers_max {
        c.nbd_workers_max = n;
    }
    Ok(())
}

/// Does the config ask for an NBD server?
pub fn wanted(c: &PoolConfig) -> bool {
    !c.nbd_listen.is_empty() || !c.nbd_socket.is_empty()
}

/// TLS for TCP clients, from `--nbd-tls DIR` or `nbd_tls` (folded into
/// the config by `apply`): None when not serving TCP, or when
/// `--nbd-insecure` (`nbd_insecure`) allows plain TCP; an error when TCP is
/// asked for with neither (or when DIR's files are missing or open).
pub fn tcp_security(c: &PoolConfig) -> Result<Option<TlsConfig>> {
    let tcp = c.nbd_address()?;
    let dir = (!c.nbd_tls.is_empty()).then(|| std::path::PathBuf::from(&c.nbd_tls));
    let Some(dir) = &dir else {
        if tcp.is_some() && !c.nbd_insecure {
            bail!(
                "NBD over TCP ({}) needs TLS, or any local user could read and write \
                 the volumes: create certificates with `cairn nbd tls-init DIR` and add \
                 --nbd-tls DIR (`nbd serve`: --tls DIR; clients connect to \
                 nbds://ADDR/VOL?tls-certificates=DIR), or serve on a Unix socket only, \
                 or accept plain TCP with --nbd-insecure (`nbd serve`: --insecure)",
                c.nbd_listen
            );
        }
        return Ok(None);
    };
    if c.nbd_insecure {
        bail!("TLS (--nbd-tls, nbd_tls) and plain TCP (--nbd-insecure, nbd_insecure) contradict each other: give one");
    }
    if tcp.is_none() {
        bail!("TLS (--nbd-tls) is for TCP: give a TCP address too (the Unix socket needs no TLS)");
    }
    let t = TlsConfig::from_dir(dir).context("NBD TLS directory (see `cairn nbd tls-init`)")?;
    Ok(Some(t))
}

fn server_config(c: &PoolConfig, a: &NbdArgs) -> ServerConfig {
    let mut s = ServerConfig::default();
    s.pool.min = c.nbd_workers_min;
    s.pool.max = c.nbd_workers_max;
    s.allow_remote = c.nbd_allow_remote;
    s.insecure_tcp = c.nbd_insecure;
    s.after_close = Some(return_memory);
    if let Some(b) = a.budget {
        s.budget = b;
    }
    if let Some(t) = a.io_timeout {
        s.io_timeout = std::time::Duration::from_secs(t.max(1));
    }
    s
}

/// After an NBD connection closed: mimalloc returns the pages that freed
/// buffers held. Its purge of freed memory otherwise waits for a later
/// allocation, which an idle daemon may not make: 40 hostile connections
/// left 270 MiB resident after they closed, 3 GB before the budget.
fn return_memory() {
    // SAFETY: mi_collect only walks mimalloc's own structures and may be
    // called from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// Starts the servers the (validated) config asks for.
pub fn start(fs: &Arc<Fs>, c: &PoolConfig, a: &NbdArgs) -> Result<()> {
    let exports = Arc::new(PoolExports::new(fs.clone()));
    let mut started = Vec::new();
    if let Some(addr) = c.nbd_address()? {
        let mut cfg = server_config(c, a);
        cfg.tls = tcp_security(c)?;
        let tls = if cfg.tls.is_some() {
            "TLS, client certificates"
        } else {
            "plain TCP, no TLS"
        };
        let s = cairn_nbd::serve_tcp(addr, exports.clone(), cfg)
            .with_context(|| format!("NBD server on {addr}"))?;
        tracing::info!("NBD on {}: {tls}", address(&s));
        started.push(s);
    }
    if !c.nbd_socket.is_empty() {
        let p = Path::new(&c.nbd_socket);
        let s = cairn_nbd::serve_unix(p, exports, server_config(c, a))
            .with_context(|| format!("NBD server on {}", p.display()))?;
        started.push(s);
    }
    for s in &started {
        tracing::info!(
            "NBD: serving volumes on {} ({}..{} workers)",
            address(s),
            c.nbd_workers_min,
            c.nbd_workers_max
        );
    }
    SERVERS.lock().extend(started);
    Ok(())
}

fn address(s: &Server) -> String {
    match s.address() {
        Address::Tcp(a) => a.to_string(),
        Address::Unix(p) => format!("unix:{}", p.display()),
    }
}

/// Stops every server (closing connections after the requests in flight).
pub fn stop() {
    let servers = std::mem::take(&mut *SERVERS.lock());
    for s in servers {
        tracing::info!("NBD: stopping the server on {}", address(&s));
        s.shutdown();
    }
}

/// The servers' addresses and statistics, with the worker pool's queue
/// wait summarized (None when not serving).
pub fn servers() -> Option<Vec<NbdServer>> {
    let servers = SERVERS.lock();
    if servers.is_empty() {
        return None;
    }
    let list = servers
        .iter()
        .map(|s| {
            let st = s.stats();
            let w = &st.pool.queue_wait;
            NbdServer {
                address: address(s),
                queue_wait_mean_us: w.mean_us(),
                queue_wait_p99_us: w.p99_us(),
                stats: st,
            }
        })
        .collect();
    Some(list)
}

/// `cairn nbd serve`: open the pool, serve until a signal, close cleanly.
pub fn serve_unmounted(a: &NbdServeArgs) -> Result<()> {
    let pool = a
        .target
        .canonicalize()
        .with_context(|| format!("{}", a.target.display()))?;
    refuse_mounted(&pool)?;
    let mut c = PoolConfig::load(&PoolPaths::config(&pool))?;
    let nbd = a.nbd_args();
    apply(&mut c, &nbd)?;
    c.validate()?;
    tcp_security(&c)?;
    if !wanted(&c) {
        bail!("give --listen ADDR and/or --socket PATH (or set nbd_listen / nbd_socket in the pool's cairn.toml)");
    }
    let mut signals =
        signal_hook::iterator::Signals::new([libc::SIGTERM, libc::SIGINT, libc::SIGHUP])?;
    crate::daemon::init_logging();
    let p = match Pool::open_keyed(
        &pool,
        Some(c.clone()),
        cairn_devices::HostStorage::shared(),
        crate::key::secret_for(&pool)?.as_ref(),
    ) {
        Err(FsError::Busy) => return Err(in_use(&pool)),
        r => r?,
    };
    let fs = Fs::open(p)?;
    let flusher = fs.spawn_flusher();
    let sock = PoolPaths::control(&pool);
    crate::control::server::spawn(fs.clone(), &sock)
        .with_context(|| format!("control socket {}", sock.display()))?;
    fs.spawn_snapshot_hasher();
    let gc = fs.spawn_gc();
    let r = start(&fs, &c, &nbd);
    if r.is_ok() {
        for s in SERVERS.lock().iter() {
            println!(
                "serving the volumes of {} on {}",
                pool.display(),
                address(s)
            );
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
        signals.forever().next();
        tracing::info!("signal received, stopping");
    }
    stop();
    let _ = std::fs::remove_file(&sock);
    fs.shutdown()?;
    let _ = flusher.join();
    if let Some(h) = gc {
        let _ = h.join();
    }
    // As at unmount (daemon.rs): closed cleanly whatever still holds it.
    fs.pool().meta.close();
    r?;
    println!("stopped; pool {} closed", pool.display());
    Ok(())
}

fn in_use(pool: &Path) -> anyhow::Error {
    let at = crate::daemon::cairn_mounts()
        .unwrap_or_default()
        .into_iter()
        .find(|(_, p)| Path::new(p) == pool)
        .map_or(String::new(), |(m, _)| {
            format!(" (mounted on {})", m.display())
        });
    anyhow::anyhow!(
        "pool {} is in use{at}: `cairn nbd serve` needs an unmounted pool; \
         serve a mounted pool from its daemon instead (`cairn mount POOL MNT --nbd ADDR` \
         or `--nbd-socket PATH`)",
        pool.display()
    )
}

/// Refuses a mount point, or a pool that its daemon holds.
fn refuse_mounted(t: &Path) -> Result<()> {
    if !PoolPaths::superblock(t).exists() {
        let m = crate::daemon::cairn_mounts()?;
        if let Some((_, p)) = m.into_iter().find(|(m, _)| m == t) {
            return Err(in_use(Path::new(&p)));
        }
        bail!("{} is not a Cairn pool directory", t.display());
    }
    if crate::daemon::pool_locked(t) {
        return Err(in_use(t));
    }
    Ok(())
}

/// Each running server's address and statistics (for the metrics).
pub fn server_stats() -> Vec<(String, cairn_nbd::Stats)> {
    SERVERS
        .lock()
        .iter()
        .map(|s| (address(s), s.stats()))
        .collect()
}

/// `cairn nbd tls-init DIR`: a new CA, server and client certificates.
pub fn tls_init(a: &NbdTlsInitArgs) -> Result<()> {
    let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
    for n in &a.names {
        if !names.contains(n) {
            names.push(n.clone());
        }
    }
    cairn_nbd::tls_init_dir(&a.dir, &names)?;
    let d = std::path::absolute(&a.dir)?;
    println!(
        "wrote the NBD TLS directory {} (0700, files 0600)",
        d.display()
    );
    println!("server certificate for: {}", names.join(", "));
    println!(
        "serve:   cairn mount POOL MNT --nbd 127.0.0.1:10809 --nbd-tls {}",
        d.display()
    );
    println!(
        "clients: nbdinfo 'nbds://127.0.0.1:10809/VOL?tls-certificates={}'",
        d.display()
    );
    println!(
        "         qemu-img info --object tls-creds-x509,id=tls0,dir={},endpoint=client \\",
        d.display()
    );
    println!(
        "           --image-opts driver=nbd,server.type=inet,server.host=127.0.0.1,\
         server.port=10809,export=VOL,tls-creds=tls0"
    );
    println!("ca-key.pem signs new client certificates: keep it (and the directory) private");
    Ok(())
}
