//! Why a key, a key block or a sealed value was refused.

/// An encryption error. None of them carries a secret.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CryptError {
    /// The passphrase or key file does not open the key block.
    #[error(
        "wrong passphrase or key file: it does not unlock this pool's key (nothing was changed)"
    )]
    WrongKey,
    /// The key block fails its checksum or its fields make no sense.
    #[error("the key block is damaged: {0}")]
    DamagedKeyBlock(String),
    /// A key block of a version this build does not know.
    #[error("the key block has version {0}; this build knows version {ver}", ver = crate::KEYBLOCK_VERSION)]
    UnknownVersion(u32),
    /// A key file that is not private, empty, too long or unreadable.
    #[error("key file {path}: {why}")]
    KeyFile { path: String, why: String },
    /// A sealed value that fails authentication: damaged, or moved from
    /// another place.
    #[error("authentication failed: the bytes were changed or belong elsewhere")]
    Authentication,
    /// A sealed value shorter than its nonce and tag.
    #[error("a sealed value of {0} bytes is shorter than its nonce and tag")]
    Short(usize),
    /// The key derivation function refused its parameters.
    #[error("key derivation: {0}")]
    Kdf(String),
}
