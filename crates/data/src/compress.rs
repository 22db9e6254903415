//! Per-chunk compression. The pool's setting (`none`, `lz4`, `zstd[:level]`)
//! applies to chunks written from then on; each chunk records its own
//! method in its header, so the setting can change at any time. A block
//! that does not shrink by at least 1/8 is stored raw.

use std::fmt;
use std::str::FromStr;

pub const RAW: u8 = 0;
pub const LZ4: u8 = 1;
pub const ZSTD: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    None,
    Lz4,
    Zstd(i32),
}

impl FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!("invalid compression {s:?} (none, lz4, zstd or zstd:LEVEL with LEVEL 1..=19)")
        };
        match s {
            "none" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd(3)),
            _ => {
                let lvl = s.strip_prefix("zstd:").ok_or_else(bad)?;
                match lvl.parse::<i32>() {
                    Ok(l) if (1..=19).contains(&l) => Ok(Compression::Zstd(l)),
                    _ => Err(bad()),
                }
            }
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::None => write!(f, "none"),
            Compression::Lz4 => write!(f, "lz4"),
            Compression::Zstd(l) => write!(f, "zstd:{l}"),
        }
    }
}

/// Compresses `raw` if that saves at least 1/8; returns (method, bytes).
pub fn compress(c: Compression, raw: &[u8]) -> Option<(u8, Vec<u8>)> {
    let limit = raw.len() - raw.len() / 8;
    let (code, out) = match c {
        Compression::None => return None,
        Compression::Lz4 => (LZ4, lz4_flex::block::compress(raw)),
        Compression::Zstd(l) => (ZSTD, zstd::bulk::compress(raw, l).ok()?),
    };
    (out.len() <= limit).then_some((code, out))
}

/// Expands `stored` (written with `method`) into exactly `dst.len()` bytes.
pub fn decompress(method: u8, stored: &[u8], dst: &mut [u8]) -> Result<(), String> {
    let n = match method {
        LZ4 => lz4_flex::block::decompress_into(stored, dst).map_err(|e| format!("lz4: {e}"))?,
        ZSTD => zstd::bulk::decompress_to_buffer(stored, dst).map_err(|e| format!("zstd: {e}"))?,
        m => return Err(format!("unknown compression method {m}")),
    };
    if n != dst.len() {
        return Err(format!("decompressed {n} bytes, expected {}", dst.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse() {
        assert_eq!("lz4".parse::<Compression>().unwrap(), Compression::Lz4);
        assert_eq!(
            "zstd:7".parse::<Compression>().unwrap(),
            Compression::Zstd(7)
        );
        assert_eq!("zstd".parse::<Compression>().unwrap().to_string(), "zstd:3");
        assert!("zstd:99".parse::<Compression>().is_err());
        assert!("gzip".parse::<Compression>().is_err());
    }

    #[test]
    fn round_trip_and_incompressible() {
        let text = b"the quick brown fox jumps over the lazy dog ".repeat(1000);
        for c in [Compression::Lz4, Compression::Zstd(3)] {
            let (m, z) = compress(c, &text).expect("text shrinks");
            assert!(z.len() < text.len() / 4);
            let mut back = vec![0u8; text.len()];
            decompress(m, &z, &mut back).unwrap();
            assert_eq!(back, text);
        }
        let mut x = 1u64;
        let noise: Vec<u8> = (0..65536)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect();
        assert!(compress(Compression::Lz4, &noise).is_none());
        assert!(compress(Compression::Zstd(3), &noise).is_none());
    }
}
