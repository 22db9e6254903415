//! Who we are to the store: an access key id and secret (and maybe a
//! session token), from a file named in cairn.toml or the environment
//! (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN). The
//! file must not be readable by others (mode 0600 or narrower) and holds
//! `aws_access_key_id = ...` / `aws_secret_access_key = ...` lines (the
//! AWS credentials file's keys; `[section]` lines and `#` comments are
//! ignored). Debug and Display never show the secret.

use crate::error::{ObjError, Result};
use std::path::Path;

#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub key_id: String,
    pub secret: String,
    pub token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials { <redacted> }")
    }
}

impl Credentials {
    /// From the file when one is named, else from the environment.
    pub fn resolve(file: Option<&Path>) -> Result<Credentials> {
        match file {
            Some(p) => Self::from_file(p),
            None => Self::from_env(),
        }
    }

    pub fn from_env() -> Result<Credentials> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        match (get("AWS_ACCESS_KEY_ID"), get("AWS_SECRET_ACCESS_KEY")) {
            (Some(key_id), Some(secret)) => Ok(Credentials {
                key_id,
                secret,
                token: get("AWS_SESSION_TOKEN"),
            }),
            _ => Err(ObjError::Credentials(
                "none: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or s3_credentials_file in cairn.toml".into(),
            )),
        }
    }

    /// Reads a credentials file, refusing one that others may read.
    pub fn from_file(path: &Path) -> Result<Credentials> {
        use std::os::unix::fs::MetadataExt;
        let bad = |why: String| ObjError::Credentials(format!("{}: {why}", path.display()));
        let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        if meta.mode() & 0o077 != 0 {
            return Err(bad(format!(
                "mode {:o} lets other users read it; chmod 600 it",
                meta.mode() & 0o777
            )));
        }
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        let text = read_limited(path).map_err(bad)?;
        parse(&text).map_err(bad)
    }
}

/// Largest credentials file read (a few lines in practice).
const MAX_BYTES: u64 = 64 << 10;

/// The file's text, at most `MAX_BYTES` of it (the file could be
/// replaced by something endless after the type check: the read is
/// bounded all the same). O_NONBLOCK: a FIFO put there meanwhile does not
/// hang the open.
fn read_limited(path: &Path) -> std::result::Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    if !f.metadata().map_err(|e| e.to_string())?.is_file() {
        return Err("not a regular file".into());
    }
    let mut buf = Vec::new();
    (f.take(MAX_BYTES + 1).read_to_end(&mut buf)).map_err(|e| e.to_string())?;
    if buf.len() as u64 > MAX_BYTES {
        return Err(format!(
            "larger than {MAX_BYTES} bytes: not a credentials file"
        ));
    }
    String::from_utf8(buf).map_err(|_| "not UTF-8 text".into())
}

fn parse(text: &str) -> std::result::Result<Credentials, String> {
    let (mut key_id, mut secret, mut token) = (None, None, None);
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('[') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("line {}: expected key = value", n + 1));
        };
        let v = v.trim().to_string();
        match k.trim() {
            "aws_access_key_id" => key_id = Some(v),
            "aws_secret_access_key" => secret = Some(v),
            "aws_session_token" => token = Some(v),
            other => return Err(format!("line {}: unknown key '{other}'", n + 1)),
        }
    }
    match (key_id, secret) {
        (Some(key_id), Some(secret)) => Ok(Credentials {
            key_id,
            secret,
            token,
        }),
        _ => Err("needs aws_access_key_id and aws_secret_access_key".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn file_must_be_private_and_debug_hides_the_secret() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("creds");
        std::fs::write(
            &p,
            "[default]\naws_access_key_id = AKID\naws_secret_access_key = s3cr3t\n",
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Credentials::from_file(&p).unwrap_err().to_string();
        assert!(e.contains("mode 644"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = Credentials::from_file(&p).unwrap();
        assert_eq!((c.key_id.as_str(), c.secret.as_str()), ("AKID", "s3cr3t"));
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("s3cr3t") && !shown.contains("AKID"),
            "{shown}"
        );
    }

    /// A credentials file that is /dev/zero (or endless, or huge) is
    /// refused with a clear error, with bounded memory.
    #[test]
    fn an_endless_or_huge_credentials_file_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("creds");
        let mut text = "aws_access_key_id = AKID\naws_secret_access_key = s\n".to_string();
        text.push_str(&"# comment\n".repeat(10_000));
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = Credentials::from_file(&p).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
        let e = Credentials::from_file(Path::new("/dev/zero"));
        // /dev/zero is 0666: refused for its mode or its type, never read.
        assert!(e.is_err());
        let e = read_limited(Path::new("/dev/zero")).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
