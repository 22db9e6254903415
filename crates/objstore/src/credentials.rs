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
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        parse(&text).map_err(bad)
    }
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
}
