//! An encrypted pool's key block, `POOL/key` (format in cairn-crypt's
//! `keyblock.rs` and docs/FORMAT.md): made at mkfs, read at every open to
//! unwrap the data key, and replaced whole by `cairn key change` (a new
//! file synced and renamed over the old, so a crash leaves one or the
//! other, never a torn block). A pool without one is not encrypted.

use crate::error::{FsError, Result};
use crate::pool::PoolPaths;
use cairn_crypt::{KeyBlock, PoolKeys, Secret};
use std::path::Path;
use std::sync::Arc;

/// What `cairn info` says of an encrypted pool.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Encryption {
    /// The cipher of chunks and of the key's wrap.
    pub algorithm: String,
    /// What wraps the data key: a passphrase or a key file.
    pub key_source: String,
    /// When the pool was made encrypted, and when its key was last
    /// changed (unix seconds).
    pub created: u64,
    pub key_changed: u64,
    /// What is encrypted so far.
    pub covers: String,
    /// The pool whose key this is (its uuid, hex), when it is not this
    /// pool's own: a mirror of an encrypted pool holds its source's.
    #[serde(default)]
    pub key_of: Option<String>,
}

/// What this build encrypts.
const COVERS: &str = "file contents (chunks on every device, in the SSD cache and in bucket segments, and intent log records), metadata values (sizes, times, owners, modes, symlink targets, xattr values, extents), file and xattr names (in the metadata's keys), snapshot names and records, and mirror streams (sealed end to end: mirrors take them without the key)";

/// The counter (in the metadata) an encrypted pool's mkfs sets: its names
/// are sealed. Encrypted pools made before names were sealed lack it.
pub(crate) const SEALED_NAMES: &str = "sealed_names";

/// Refuses an encrypted pool whose names are not sealed (made by an
/// earlier build): its lookups would find nothing.
pub(crate) fn require_sealed_names(meta: &cairn_meta::MetaStore) -> Result<()> {
    match meta.read()?.counter(SEALED_NAMES)? {
        1 => Ok(()),
        0 => Err(FsError::Key(
            "this encrypted pool was made by an earlier build of Cairn that kept file names in the clear, a format this build does not read: mount it with that build and copy its files into a pool made now".into(),
        )),
        n => Err(FsError::Key(format!(
            "the pool's sealed-names counter is {n}; this build knows 1 (a newer format?)"
        ))),
    }
}

impl Encryption {
    fn of(b: &KeyBlock) -> Encryption {
        Encryption {
            algorithm: format!(
                "{} chunks; XChaCha20-Poly1305 metadata, intent log and key wrap; keyed BLAKE3 content hashes",
                b.cipher.name()
            ),
            key_source: b.source.name().into(),
            created: b.created,
            key_changed: b.changed,
            covers: COVERS.into(),
            key_of: None,
        }
    }
}

/// The pool's key block, or None for a pool that is not encrypted.
pub fn read_key_block(pool: &Path) -> Result<Option<KeyBlock>> {
    let p = PoolPaths::key(pool);
    let bytes = match cairn_devices::private::read_small(&p, 4096) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(FsError::Io(format!("{}: {e}", p.display()))),
    };
    KeyBlock::decode(&bytes)
        .map(Some)
        .map_err(|e| FsError::Key(format!("{}: {e}", p.display())))
}

/// True if the pool at `pool` is encrypted.
pub fn is_encrypted(pool: &Path) -> Result<bool> {
    Ok(PoolPaths::key(pool).exists() || read_key_block(pool)?.is_some())
}

/// Writes `b` as the pool's key block: a new file, synced, renamed over
/// the old one, and the directory synced.
pub fn write_key_block(pool: &Path, b: &KeyBlock) -> Result<()> {
    let p = PoolPaths::key(pool);
    let tmp = pool.join("key.new");
    let io = |e: std::io::Error| FsError::Io(format!("{}: {e}", p.display()));
    let _ = std::fs::remove_file(&tmp);
    let f = cairn_devices::private::private_options()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(io)?;
    use std::io::Write;
    (&f).write_all(&b.encode()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, &p).map_err(io)?;
    std::fs::File::open(pool)
        .and_then(|d| d.sync_all())
        .map_err(io)
}

/// The keys of the pool at `pool` unlocked with `secret`, with what
/// `cairn info` says of them; None for a pool that is not encrypted
/// (refused if a secret was given: the administrator meant another pool).
pub fn unlock(
    pool: &Path,
    uuid: [u8; 16],
    secret: Option<&Secret>,
) -> Result<Option<(Arc<PoolKeys>, Encryption)>> {
    let Some(block) = read_key_block(pool)? else {
        return match secret {
            Some(_) => Err(FsError::Key(format!(
                "pool {} is not encrypted: a key file or passphrase is only for encrypted pools",
                pool.display()
            ))),
            None => Ok(None),
        };
    };
    let mut info = Encryption::of(&block);
    if block.uuid != uuid {
        // A mirror's key block is its source's: `check_owner` confirms it
        // once the metadata is open.
        info.key_of = Some(crate::history::snapshot::hex(&block.uuid));
    }
    let Some(secret) = secret else {
        return Err(FsError::Key(format!(
            "pool {} is encrypted: give --key-file FILE (mode 0600, a passphrase line or 32 raw bytes), or type the passphrase at a terminal",
            pool.display()
        )));
    };
    let key = (block.unlock(secret))
        .map_err(|e| FsError::Key(format!("pool {}: {e}", pool.display())))?;
    Ok(Some((Arc::new(PoolKeys::derive(&key, block.cipher)), info)))
}

/// Refuses a key block of another pool unless this pool is a mirror (or a
/// promoted mirror) of that pool, which holds its source's key block.
pub(crate) fn check_owner(
    pool: &Path,
    info: &Encryption,
    role: crate::replica::Role,
) -> Result<()> {
    use crate::replica::Role;
    let Some(owner) = &info.key_of else {
        return Ok(());
    };
    match role {
        Role::Mirror { source } | Role::Promoted { source } if crate::history::snapshot::hex(&source) == *owner => Ok(()),
        _ => Err(FsError::Key(format!(
            "{}: the key block belongs to another pool (its uuid differs from the superblock's, and this pool is no mirror of that one)",
            PoolPaths::key(pool).display()
        ))),
    }
}

/// Checks that a pool opened without its key may be: an encrypted mirror
/// (or one not bound yet, whose first stream may bring a key block).
pub(crate) fn open_without_key(pool: &Path, meta: &cairn_meta::MetaStore) -> Result<()> {
    use crate::replica::Role;
    match Role::read(&meta.read()?)? {
        Role::Mirror { .. } | Role::Unbound => Ok(()),
        _ => Err(FsError::Key(format!(
            "pool {} is not a mirror: only a mirror's streams are taken without the pool's key",
            pool.display()
        ))),
    }
}

/// A mirror takes its source's key block from a sealed stream: written
/// when the mirror has none (its first stream), replaced when the source
/// changed its key since (same pool and key, a later change), refused
/// when it is another pool's.
pub fn adopt_key_block(pool: &Path, block: &KeyBlock) -> Result<()> {
    let refuse = |why: &str| {
        Err(FsError::Key(format!(
            "{}: {why}",
            PoolPaths::key(pool).display()
        )))
    };
    match read_key_block(pool)? {
        None => write_key_block(pool, block),
        Some(old) if old.uuid != block.uuid => {
            refuse("the mirror holds the key block of another pool than the stream's source")
        }
        Some(old) if old.changed >= block.changed => Ok(()),
        Some(_) => write_key_block(pool, block),
    }
}

/// Refuses the salvage of a damaged metadata store (its report and its
/// rebuild) for an encrypted pool: not done yet, and a rebuild that could
/// not open the sealed elements would keep none of them.
pub fn refuse_salvage(pool: &Path) -> Result<()> {
    match is_encrypted(pool)? {
        true => Err(FsError::Key(format!(
            "pool {} is encrypted: naming or rebuilding what a damaged metadata store holds is not supported for encrypted pools yet (mount --salvage reads what is intact)",
            pool.display()
        ))),
        false => Ok(()),
    }
}

/// Rewraps the pool's data key from `old` to `new`: only the key block
/// changes. Refused (nothing changed) if `old` does not unlock it.
pub fn change_key(pool: &Path, old: &Secret, new: &Secret, now: u64) -> Result<Encryption> {
    let block = read_key_block(pool)?
        .ok_or_else(|| FsError::Key(format!("pool {} is not encrypted", pool.display())))?;
    let changed = (block.rewrap(old, new, now))
        .map_err(|e| FsError::Key(format!("pool {}: {e}", pool.display())))?;
    write_key_block(pool, &changed)?;
    Ok(Encryption::of(&changed))
}
