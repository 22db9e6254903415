//! Encryption at rest (issue 53). A pool made with `--encrypt` has a
//! random 256-bit data key, kept only wrapped (`keyblock.rs`): sealed with
//! XChaCha20-Poly1305 under a key derived from the administrator's secret
//! (`secret.rs`: a passphrase through Argon2id, or 32 raw bytes from a key
//! file). Changing the secret rewraps the data key; nothing else is
//! rewritten. Every key Cairn uses is derived from the data key with
//! BLAKE3's key derivation, one per purpose (`keys.rs`), and every sealed
//! value carries its own random 192-bit nonce and binds, as associated
//! data, the place it belongs to (`aead.rs`).
//!
//! This crate is a mechanism at the bottom of the stack: it knows nothing
//! of chunks, elements or pools; the layers above say what they seal and
//! what it is bound to.

mod aead;
mod error;
mod keyblock;
mod keys;
mod names;
mod secret;
mod xaes;

pub use aead::{Cipher, Sealer, SubkeyCache, NONCE_LEN, OVERHEAD, TAG_LEN};
pub use error::CryptError;
pub use keyblock::{KeyBlock, KeySource, KEYBLOCK_LEN, KEYBLOCK_MAGIC, KEYBLOCK_VERSION};
pub use keys::{DataKey, PoolKeys};
pub use names::{NameSealer, NAME_OVERHEAD};
pub use secret::{read_key_file, Secret, MAX_PASSPHRASE};
