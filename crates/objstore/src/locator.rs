//! Where a store is: `s3:BUCKET[/PREFIX]:endpoint=URL[:region=R]`, with
//! other `key=value` options handed back to the caller (the device spec
//! takes `size=`). The endpoint URL has colons of its own, so a `:` only
//! starts an option when a `word=` follows it. Credentials are never part
//! of a locator (an endpoint with `user:pass@` is refused).

use crate::error::{ObjError, Result};
use std::fmt;

pub const DEFAULT_REGION: &str = "us-east-1";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locator {
    pub bucket: String,
    /// Key prefix without leading or trailing '/', maybe empty.
    pub prefix: String,
    pub endpoint: String,
    pub region: String,
}

/// True if `s` looks like a locator (starts with `s3:`).
pub fn is_locator(s: &str) -> bool {
    s.starts_with("s3:")
}

/// Splits `a:b=c:d=http://x:9:e=f` into ["a", "b=c", "d=http://x:9", "e=f"].
fn split_options(s: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (i, tok) in s.split(':').enumerate() {
        let starts_option = tok.split_once('=').is_some_and(|(k, _)| {
            !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        });
        match out.last_mut() {
            Some(last) if i > 1 && !starts_option => {
                last.push(':');
                last.push_str(tok);
            }
            _ => out.push(tok.to_string()),
        }
    }
    out
}

impl Locator {
    /// Parses a locator; options it does not know come back as (key, value).
    pub fn parse_with_extras(spec: &str) -> Result<(Locator, Vec<(String, String)>)> {
        let bad = |why: &str| ObjError::BadLocator {
            spec: spec.to_string(),
            why: why.to_string(),
        };
        let rest = spec
            .strip_prefix("s3:")
            .ok_or_else(|| bad("expected s3:BUCKET[/PREFIX]:endpoint=URL[:region=R]"))?;
        let parts = split_options(rest);
        let (bucket, prefix) = match parts[0].split_once('/') {
            Some((b, p)) => (b.to_string(), p.trim_matches('/').to_string()),
            None => (parts[0].clone(), String::new()),
        };
        check_bucket(&bucket).map_err(|w| bad(&w))?;
        let (mut endpoint, mut region, mut extras) = (None, None, Vec::new());
        for p in &parts[1..] {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| bad(&format!("'{p}': expected key=value")))?;
            match k {
                "endpoint" => endpoint = Some(v.to_string()),
                "region" => region = Some(v.to_string()),
                _ => extras.push((k.to_string(), v.to_string())),
            }
        }
        let endpoint = endpoint.ok_or_else(|| bad("endpoint=URL is required"))?;
        check_endpoint(&endpoint).map_err(|w| bad(&w))?;
        let region = region.unwrap_or_else(|| DEFAULT_REGION.to_string());
        if region.is_empty() {
            return Err(bad("empty region"));
        }
        let loc = Locator {
            bucket,
            prefix,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            region,
        };
        Ok((loc, extras))
    }

    /// Parses a locator with no other options.
    pub fn parse(spec: &str) -> Result<Locator> {
        let (loc, extras) = Self::parse_with_extras(spec)?;
        match extras.first() {
            None => Ok(loc),
            Some((k, _)) => Err(ObjError::BadLocator {
                spec: spec.to_string(),
                why: format!("unknown option '{k}' (use endpoint or region)"),
            }),
        }
    }

    /// The key of `name` under the prefix.
    pub fn key(&self, name: &str) -> String {
        match self.prefix.is_empty() {
            true => name.to_string(),
            false => format!("{}/{name}", self.prefix),
        }
    }
}

fn check_bucket(b: &str) -> std::result::Result<(), String> {
    let ok = (3..=63).contains(&b.len())
        && b.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.');
    match ok {
        true => Ok(()),
        false => Err(format!(
            "bucket '{b}': 3 to 63 characters of a-z, 0-9, '-' and '.'"
        )),
    }
}

fn check_endpoint(e: &str) -> std::result::Result<(), String> {
    let Some(rest) = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
    else {
        return Err(format!(
            "endpoint '{e}': must start with http:// or https://"
        ));
    };
    let host = rest.split('/').next().unwrap_or_default();
    if host.contains('@') {
        return Err("credentials do not belong in the endpoint URL (use the environment or s3_credentials_file)".into());
    }
    if host.is_empty() {
        return Err(format!("endpoint '{e}': no host"));
    }
    Ok(())
}

impl fmt::Display for Locator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3:{}", self.bucket)?;
        if !self.prefix.is_empty() {
            write!(f, "/{}", self.prefix)?;
        }
        write!(f, ":endpoint={}:region={}", self.endpoint, self.region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let (l, x) =
            Locator::parse_with_extras("s3:bkt/a/b/:endpoint=http://127.0.0.1:9000:size=1G")
                .unwrap();
        assert_eq!(l.bucket, "bkt");
        assert_eq!(l.prefix, "a/b");
        assert_eq!(l.endpoint, "http://127.0.0.1:9000");
        assert_eq!(l.region, DEFAULT_REGION);
        assert_eq!(x, vec![("size".to_string(), "1G".to_string())]);
        assert_eq!(l.key("h"), "a/b/h");
        let again = Locator::parse(&l.to_string()).unwrap();
        assert_eq!(again, l);
        let l = Locator::parse("s3:bkt:endpoint=https://s3.example.com:region=eu-west-1").unwrap();
        assert_eq!((l.prefix.as_str(), l.region.as_str()), ("", "eu-west-1"));
        assert_eq!(l.key("h"), "h");
    }

    #[test]
    fn refuses_bad_ones() {
        for s in [
            "s3:bkt",
            "s3:B!:endpoint=http://x",
            "s3:bkt:endpoint=ftp://x",
            "s3:bkt:endpoint=http://key:secret@host:9000",
            "s3:bkt:endpoint=http://x:colour=red",
            "bkt:endpoint=http://x",
        ] {
            assert!(Locator::parse(s).is_err(), "{s}");
        }
    }
}
