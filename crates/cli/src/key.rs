//! Where an encrypted pool's secret comes from, for every command that
//! opens a pool: `--key-file FILE` (a global option), a systemd credential
//! named `cairn-key` (`LoadCredential=` in a unit), the pipe a `cairn
//! mount` hands the daemon it starts (the fd named by `CAIRN_KEY_FD`), or
//! the passphrase typed at the terminal. Never a command line argument or
//! an environment variable's value; never logged. Also `cairn key change`.

use anyhow::{bail, Context, Result};
use cairn_crypt::{read_key_file, Secret};
use cairn_fs::pool::config::PoolConfig;
use cairn_fs::pool::key::is_encrypted;
use cairn_fs::Pool;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

/// The global `--key-file`, set once by main.
static KEY_FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
/// The environment variable naming the daemon's key pipe.
const KEY_FD_ENV: &str = "CAIRN_KEY_FD";
/// Set once the key pipe has been read (its fd is then closed).
static PIPE_TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The systemd credential that holds a pool's key file.
const CREDENTIAL: &str = "cairn-key";

/// Records the global `--key-file` (main calls it once).
pub fn set_key_file(f: Option<PathBuf>) {
    let _ = KEY_FILE.set(f);
}

/// The global `--key-file`, if given.
pub fn key_file() -> Option<&'static Path> {
    KEY_FILE.get().and_then(|f| f.as_deref())
}

/// The secret of the pool at `pool`: None when it is not encrypted (a
/// key file given for it is refused then: it names the wrong pool).
pub fn secret_for(pool: &Path) -> Result<Option<Secret>> {
    if !is_encrypted(pool)? {
        if let Some(f) = key_file() {
            bail!(
                "pool {} is not encrypted: --key-file {} is only for encrypted pools",
                pool.display(),
                f.display()
            );
        }
        return Ok(None);
    }
    if let Some(s) = from_pipe()? {
        return Ok(Some(s));
    }
    if let Some(f) = key_file().map(Path::to_path_buf).or_else(credential) {
        return Ok(Some(read_key_file(&f)?));
    }
    Ok(Some(prompt(&format!(
        "Passphrase for pool {}: ",
        pool.display()
    ))?))
}

/// Opens the pool at `pool` (through `storage`), unlocking its key first
/// if it is encrypted.
pub fn open_pool(
    pool: &Path,
    config: Option<PoolConfig>,
    storage: Option<Arc<dyn cairn_devices::Storage>>,
) -> Result<Pool> {
    let secret = secret_for(pool)?;
    let storage = storage.unwrap_or_else(cairn_devices::HostStorage::shared);
    Ok(Pool::open_keyed(pool, config, storage, secret.as_ref())?)
}

/// Opens the pool at `pool` for a mirror command (taking a stream, its
/// questions, status): an encrypted mirror without its key when none is
/// given (no --key-file, credential or key pipe), so that a backup host
/// never needs it; any other pool as `open_pool` opens it.
pub fn open_pool_for_mirror(pool: &Path) -> Result<Pool> {
    if !is_encrypted(pool)? {
        // A key given is the source's (`mirror copy` of a pool not mounted).
        let storage = cairn_devices::HostStorage::shared();
        return Ok(Pool::open_keyed(pool, None, storage, None)?);
    }
    match sealed_mirror(pool)? {
        Some(p) => Ok(p),
        None => open_pool(pool, None, None),
    }
}

/// The pool at `pool` opened without its key if it is an encrypted mirror
/// and no key is given (no --key-file, credential or key pipe); None
/// otherwise (not encrypted, a key given, or not a mirror).
pub fn sealed_mirror(pool: &Path) -> Result<Option<Pool>> {
    let given =
        key_file().is_some() || credential().is_some() || std::env::var_os(KEY_FD_ENV).is_some();
    if given || !is_encrypted(pool)? {
        return Ok(None);
    }
    match Pool::open_sealed(pool, None, cairn_devices::HostStorage::shared()) {
        Err(cairn_fs::FsError::Key(_)) => Ok(None),
        r => Ok(Some(r?)),
    }
}

/// The key file of the systemd credential `cairn-key`, if the unit has one.
fn credential() -> Option<PathBuf> {
    let dir = std::env::var_os("CREDENTIALS_DIRECTORY")?;
    let f = Path::new(&dir).join(CREDENTIAL);
    f.exists().then_some(f)
}

/// A passphrase typed at the terminal (refused without one: a script
/// gives --key-file).
pub fn prompt(question: &str) -> Result<Secret> {
    let tty = std::fs::File::open("/dev/tty").ok().filter(|t| {
        // SAFETY: isatty only inspects an fd we own.
        unsafe { libc::isatty(t.as_raw_fd()) == 1 }
    });
    if tty.is_none() {
        bail!("the pool is encrypted and there is no terminal to type its passphrase: give --key-file FILE (mode 0600, a passphrase line or 32 raw bytes)");
    }
    let typed = rpassword::prompt_password(question).context("reading the passphrase")?;
    let typed = zeroize::Zeroizing::new(typed);
    Ok(Secret::passphrase(typed.as_bytes())?)
}

/// A new passphrase, typed twice.
pub fn prompt_new(what: &str) -> Result<Secret> {
    let first = prompt(&format!("New passphrase for {what}: "))?;
    let again = prompt("The same passphrase again: ")?;
    match (&first, &again) {
        (Secret::Passphrase(a), Secret::Passphrase(b)) if a == b => Ok(first),
        _ => bail!("the two passphrases differ: nothing was changed"),
    }
}

/// The secret for a new key (mkfs --encrypt, key change): `file`, or
/// typed twice.
pub fn new_secret(file: Option<&Path>, what: &str) -> Result<Secret> {
    match file {
        Some(f) => Ok(read_key_file(f)?),
        None => prompt_new(what),
    }
}

/// The secret a `cairn mount` passed its daemon through a pipe, read once.
fn from_pipe() -> Result<Option<Secret>> {
    let Some(fd) = std::env::var(KEY_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return Ok(None);
    };
    if fd <= 2 || PIPE_TAKEN.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return Ok(None);
    }
    // SAFETY: the fd was passed to this process for this purpose by the
    // `cairn mount` that started it; it is taken over once (`PIPE_TAKEN`).
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut bytes = zeroize::Zeroizing::new(Vec::new());
    (&mut f)
        .take(4096)
        .read_to_end(&mut bytes)
        .context("reading the key pipe")?;
    let Some((&kind, body)) = bytes.split_first() else {
        bail!("the key pipe from `cairn mount` was empty");
    };
    Ok(Some(match kind {
        b'R' if body.len() == 32 => {
            let mut k = zeroize::Zeroizing::new([0u8; 32]);
            k.copy_from_slice(body);
            Secret::RawKey(k)
        }
        b'P' => Secret::passphrase(body)?,
        _ => bail!("the key pipe from `cairn mount` holds no key"),
    }))
}

/// Hands `secret` to the daemon `cmd` starts: written into a pipe whose
/// read end the child inherits (named by `CAIRN_KEY_FD`). The pipe holds
/// it until the child reads it; nothing reaches a command line.
pub fn pass_to(secret: &Secret, cmd: &mut Command) -> Result<OwnedFd> {
    use std::os::unix::process::CommandExt;
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills two fds we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    let (r, w) = unsafe {
        (
            OwnedFd::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    let mut msg = zeroize::Zeroizing::new(Vec::with_capacity(64));
    match secret {
        Secret::RawKey(k) => {
            msg.push(b'R');
            msg.extend_from_slice(k.as_ref());
        }
        Secret::Passphrase(p) => {
            msg.push(b'P');
            msg.extend_from_slice(p);
        }
    }
    (&w).write_all(&msg).context("writing the key pipe")?;
    drop(w);
    let fd = r.as_raw_fd();
    cmd.env(KEY_FD_ENV, fd.to_string());
    // SAFETY: fcntl is async-signal-safe; it clears close-on-exec of the
    // read end in the child only.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(r)
}

/// `cairn key change TARGET`: rewraps the pool's data key with a new
/// secret (`--new-key-file`, or typed twice) after the current one
/// (`--key-file`, or typed) unlocks it. Online or not: only the key block
/// changes.
pub fn change(target: &Path, new_file: Option<&Path>) -> Result<()> {
    let (pool, _) = crate::control::client::resolve(target)?;
    if !is_encrypted(&pool)? {
        bail!(
            "pool {} is not encrypted: there is no key to change",
            pool.display()
        );
    }
    let old = secret_for(&pool)?.context("the pool's current key")?;
    let new = new_secret(new_file, &format!("pool {}", pool.display()))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let info = cairn_fs::pool::key::change_key(&pool, &old, &new, now)?;
    println!(
        "changed the key of pool {}: the data key is now wrapped by a {}; no data was rewritten",
        pool.display(),
        info.key_source
    );
    Ok(())
}
