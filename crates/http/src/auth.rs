//! The optional bearer token of the HTTP frontend: read from a file only
//! its owner may read (never from the command line), kept as its BLAKE3
//! hash (whose equality is constant-time) and never logged or printed.
//! A request carries it as `Authorization: Bearer TOKEN`, or, from a
//! browser's login prompt, as HTTP Basic with any user name and the
//! token as password.

use crate::error::HttpError;
use base64::Engine;
use std::path::Path;

/// A token requests must present.
#[derive(Clone)]
pub struct Token(blake3::Hash);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<hidden>)")
    }
}

impl Token {
    /// The token `secret` (surrounding white space is not part of it).
    pub fn new(secret: &str) -> Token {
        Token(blake3::hash(secret.trim().as_bytes()))
    }

    /// Reads the token from `path`: a regular file that group and others
    /// cannot read, holding the token on one line.
    pub fn from_file(path: &Path) -> Result<Token, HttpError> {
        use std::os::unix::fs::MetadataExt;
        let bad = |why: String| HttpError::TokenFile(path.display().to_string(), why);
        let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(bad(format!(
                "mode {:o} lets other users read it; chmod 600 it",
                meta.mode() & 0o777
            )));
        }
        let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let text = std::str::from_utf8(&text).map_err(|_| bad("not UTF-8 text".into()))?;
        if text.trim().is_empty() {
            return Err(bad("empty: put the token on its first line".into()));
        }
        if text.trim().contains(['\n', '\r']) {
            return Err(bad("more than one line: the token is the whole file".into()));
        }
        Ok(Token::new(text))
    }

    /// Whether an `Authorization` header value carries the token.
    pub(crate) fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let Some(given) = authorization.and_then(credential) else {
            return false;
        };
        // blake3::Hash compares in constant time.
        blake3::hash(given.trim().as_bytes()) == self.0
    }
}

/// The secret of `Bearer X` (X) or `Basic base64(user:X)` (X).
fn credential(value: &[u8]) -> Option<String> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, rest) = value.split_once(' ')?;
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(rest.trim().to_string());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(rest.trim())
            .ok()?;
        let pair = String::from_utf8(raw).ok()?;
        return pair.split_once(':').map(|(_, pass)| pass.to_string());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_and_basic_carry_the_token_and_nothing_else_does() {
        let t = Token::new("abc");
        let basic = |s: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            )
        };
        assert!(t.admits(Some(b"Bearer abc")));
        assert!(t.admits(Some(b"bearer  abc ")));
        assert!(t.admits(Some(basic("u:abc").as_bytes())));
        assert!(t.admits(Some(basic(":abc").as_bytes())));
        for bad in [
            "".to_string(),
            "abc".into(),
            "Bearer".into(),
            "Bearer ab".into(),
            "Bearer abcd".into(),
            "Token abc".into(),
            basic("abc"),
            basic("abc:x"),
            "Basic !!!".into(),
        ] {
            assert!(!t.admits(Some(bad.as_bytes())), "{bad:?}");
        }
        assert!(!t.admits(None));
        assert!(!t.admits(Some(&[0xff, 0xfe])));
    }
}
