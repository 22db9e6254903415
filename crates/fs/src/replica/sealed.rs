//! Mirror streams of an encrypted pool stay sealed end to end (ZFS's raw
//! send): the source seals each change as its own values are sealed
//! (`changes.rs`, `Change::Sealed`) and sends its key block, wrapped as on
//! its disk; the mirror stores the sealed values, chunks and snapshot
//! records as they come, keeps the source's chunk ids, and takes the key
//! block, so that it can receive, store and check streams without the key,
//! while mounting it, reading it or promoting it needs the key.

use crate::error::{FsError, Result};
use crate::pool::key;
use crate::vfs::Fs;

impl Fs {
    /// The key block a sealed stream of this pool carries (None: the pool
    /// is not encrypted, and its streams are plain).
    pub fn stream_key_block(&self) -> Result<Option<Vec<u8>>> {
        match self.is_sealed() {
            true => Ok(key::read_key_block(&self.pool.path)?.map(|b| b.encode())),
            false => Ok(None),
        }
    }

    /// True if this pool's element values are sealed (encrypted, held with
    /// or without its key): it takes sealed streams only.
    pub fn is_sealed(&self) -> bool {
        self.pool.keys.is_some() || self.pool.meta.is_opaque()
    }

    /// A mirror takes the key block of the source whose sealed stream it
    /// applies (`key::adopt_key_block`); a fresh mirror made plain keeps
    /// its values sealed from now on, without the key.
    pub fn take_key_block(&self, bytes: &[u8]) -> Result<()> {
        let block = cairn_crypt::KeyBlock::decode(bytes)
            .map_err(|e| FsError::BadRequest(format!("the stream's key block: {e}")))?;
        key::adopt_key_block(&self.pool.path, &block)?;
        if !self.is_sealed() {
            assert!(
                self.pool.meta.keep_sealed(),
                "a plain store's values take a mode once"
            );
        }
        if !self.pool.chunks.codec().is_encrypted() {
            self.pool.chunks.codec().seal_here();
        }
        let _last = self.flush_guard();
        let set = |w: &mut cairn_meta::MetaWrite<'_>| w.set_counter(key::SEALED_NAMES, 1);
        Ok(self.pool.meta.write(set)?)
    }
}
