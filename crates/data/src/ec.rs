//! Reed–Solomon parity over the members of a stripe (the codec is the
//! reed-solomon-simd crate): `parity` computes M parity shards from K data
//! shards of one length, `restore` gives back any one shard from any K
//! others. The codec works on 64-byte blocks: byte i of a parity shard
//! depends only on the block holding byte i in each data shard, so any
//! range of a stripe aligned to `ALIGN` is encoded and restored alone (a
//! chunk is rebuilt without reading whole segments).
//!
//! Encoders and decoders are kept (a few, `KEPT`) and reset for the next
//! stripe: a new one allocates and zeroes working space of several times
//! the shard length, and a degraded sequential read restores a 1 MiB
//! window per call (it spent a tenth of its time in that zeroing).

use crate::error::{DataError, Result};
use parking_lot::Mutex;
use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

/// Codecs kept for reuse, of each kind; more in use at once are made and
/// dropped (each holds working space of a few shard lengths).
const KEPT: usize = 4;
/// Codecs used for longer shards are dropped, not kept (their working
/// space stays as large as the longest shard they were used for).
const KEPT_LEN: usize = 2 << 20;

static ENCODERS: Mutex<Vec<ReedSolomonEncoder>> = Mutex::new(Vec::new());
static DECODERS: Mutex<Vec<ReedSolomonDecoder>> = Mutex::new(Vec::new());

/// Runs `f` with a kept encoder (or a new one), reset for `k`+`m` shards
/// of `len`, and keeps it after.
fn with_encoder<T>(
    k: usize,
    m: usize,
    len: usize,
    f: impl FnOnce(&mut ReedSolomonEncoder) -> Result<T>,
) -> Result<T> {
    let kept = ENCODERS.lock().pop();
    let mut enc = match kept {
        Some(mut e) => e.reset(k, m, len).map(|()| e),
        None => ReedSolomonEncoder::new(k, m, len),
    }
    .map_err(codec_err)?;
    let out = f(&mut enc);
    let mut kept = ENCODERS.lock();
    if kept.len() < KEPT && len <= KEPT_LEN {
        kept.push(enc);
    }
    out
}

/// As `with_encoder`, for a decoder.
fn with_decoder<T>(
    k: usize,
    m: usize,
    len: usize,
    f: impl FnOnce(&mut ReedSolomonDecoder) -> Result<T>,
) -> Result<T> {
    let kept = DECODERS.lock().pop();
    let mut dec = match kept {
        Some(mut d) => d.reset(k, m, len).map(|()| d),
        None => ReedSolomonDecoder::new(k, m, len),
    }
    .map_err(codec_err)?;
    let out = f(&mut dec);
    let mut kept = DECODERS.lock();
    if kept.len() < KEPT && len <= KEPT_LEN {
        kept.push(dec);
    }
    out
}

/// Ranges encoded or restored alone start and end on this.
pub const ALIGN: u64 = 64;

fn codec_err(e: reed_solomon_simd::Error) -> DataError {
    DataError::Parity(e.to_string())
}

/// `[off, off + len)` widened to `ALIGN` and cut at `limit` (a multiple
/// of `ALIGN`): the range of every member that restores those bytes.
pub fn aligned(off: u64, len: u64, limit: u64) -> (u64, u64) {
    assert!(limit.is_multiple_of(ALIGN), "a stripe's length is aligned");
    let start = off - off % ALIGN;
    let end = (off + len).div_ceil(ALIGN) * ALIGN;
    (start, end.min(limit))
}

/// The `m` parity shards of `data` (all of one even length).
pub fn parity(data: &[&[u8]], m: usize) -> Result<Vec<Vec<u8>>> {
    let len = data.first().map_or(0, |d| d.len());
    assert!(data.iter().all(|d| d.len() == len), "shards of one length");
    assert!(len.is_multiple_of(2) && len > 0, "a shard's length is even");
    let shards: Vec<Vec<u8>> = with_encoder(data.len(), m, len, |enc| {
        for d in data {
            enc.add_original_shard(d).map_err(codec_err)?;
        }
        let out = enc.encode().map_err(codec_err)?;
        Ok(out.recovery_iter().map(<[u8]>::to_vec).collect())
    })?;
    // Callers zip the shards with the parity members: one missing or
    // short would leave a member's parity unwritten.
    assert!(
        shards.len() == m && shards.iter().all(|s| s.len() == len),
        "{} parity shards for {m} of {len} bytes",
        shards.len()
    );
    Ok(shards)
}

/// Shard `want` (0..k data, k..k+m parity) of a `k`+`m` stripe, from
/// `have`: (index, bytes) of at least `k` other shards, all one length.
pub fn restore(k: usize, m: usize, have: &[(usize, &[u8])], want: usize) -> Result<Vec<u8>> {
    Ok(restore_many(k, m, have, &[want])?.swap_remove(0))
}

/// Shards `wants` of a `k`+`m` stripe, in that order, from one decode of
/// `have` (as for `restore`; none of `wants` among them).
pub fn restore_many(
    k: usize,
    m: usize,
    have: &[(usize, &[u8])],
    wants: &[usize],
) -> Result<Vec<Vec<u8>>> {
    assert!(
        !wants.is_empty() && wants.iter().all(|w| *w < k + m),
        "shards {wants:?} of a {k}+{m} stripe"
    );
    assert!(
        have.iter().all(|(i, _)| !wants.contains(i) && *i < k + m),
        "the shards given are others of the stripe"
    );
    if have.len() < k {
        return Err(DataError::Parity(format!(
            "{} of the {k} shards needed are readable",
            have.len()
        )));
    }
    let len = have[0].1.len();
    assert!(
        have.iter().all(|(_, b)| b.len() == len),
        "shards of one length"
    );
    // Every data shard, given or restored (only those wanted when no
    // parity is: no copy of the others).
    let parity_wanted = wants.iter().any(|w| *w >= k);
    let needed: Vec<usize> = match parity_wanted {
        true => (0..k).collect(),
        false => wants.to_vec(),
    };
    let data: Vec<Vec<u8>> = with_decoder(k, m, len, |dec| {
        for (i, b) in have {
            match *i < k {
                true => dec.add_original_shard(*i, b),
                false => dec.add_recovery_shard(i - k, b),
            }
            .map_err(codec_err)?;
        }
        let restored = dec.decode().map_err(codec_err)?;
        (needed.iter())
            .map(|&i| {
                let given = have.iter().find(|(j, _)| *j == i).map(|(_, b)| b.to_vec());
                given
                    .or_else(|| restored.restored_original(i).map(<[u8]>::to_vec))
                    .ok_or_else(|| DataError::Parity(format!("data shard {i} was not restored")))
            })
            .collect()
    })?;
    if !parity_wanted {
        return Ok(data);
    }
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let parities = parity(&refs, m)?;
    Ok((wants.iter())
        .map(|&w| match w < k {
            true => data[w].clone(),
            false => parities[w - k].clone(),
        })
        .collect())
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]
mod tests {
    use super::*;

    fn shards(k: usize, len: usize, seed: u8) -> Vec<Vec<u8>> {
        (0..k)
            .map(|i| {
                (0..len)
                    .map(|j| (j as u8).wrapping_mul(31).wrapping_add(seed ^ i as u8))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn any_two_of_six_are_restored_from_the_other_four() {
        let (k, m, len) = (4, 2, 4096);
        let data = shards(k, len, 7);
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let par = parity(&refs, m).unwrap();
        let all: Vec<&[u8]> = refs
            .iter()
            .copied()
            .chain(par.iter().map(Vec::as_slice))
            .collect();
        for a in 0..k + m {
            for b in a + 1..k + m {
                let have: Vec<(usize, &[u8])> = (0..k + m)
                    .filter(|i| *i != a && *i != b)
                    .map(|i| (i, all[i]))
                    .collect();
                assert_eq!(restore(k, m, &have, a).unwrap(), all[a], "lost {a},{b}");
                assert_eq!(restore(k, m, &have, b).unwrap(), all[b], "lost {a},{b}");
                let both = restore_many(k, m, &have, &[b, a]).unwrap();
                assert_eq!(both, vec![all[b].to_vec(), all[a].to_vec()], "lost {a},{b}");
            }
        }
        let three: Vec<(usize, &[u8])> = (3..6).map(|i| (i, all[i])).collect();
        assert!(
            restore(k, m, &three, 0).is_err(),
            "three shards cannot restore"
        );
    }

    /// Kept codecs are reset for each call: shapes and lengths that
    /// change from call to call still give exact shards.
    #[test]
    fn kept_codecs_serve_stripes_of_other_shapes() {
        for (round, (k, m, len)) in [(4, 2, 4096), (3, 1, 640), (4, 2, 128), (2, 2, 8192)]
            .into_iter()
            .cycle()
            .take(12)
            .enumerate()
        {
            let data = shards(k, len, round as u8);
            let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let par = parity(&refs, m).unwrap();
            assert_eq!(par.len(), m);
            let have: Vec<(usize, &[u8])> = (1..k)
                .map(|i| (i, refs[i]))
                .chain(std::iter::once((k, par[0].as_slice())))
                .collect();
            assert_eq!(restore(k, m, &have, 0).unwrap(), data[0], "round {round}");
            if m > 1 {
                assert_eq!(
                    restore(k, m, &have, k + 1).unwrap(),
                    par[1],
                    "round {round}"
                );
            }
        }
    }

    #[test]
    fn an_aligned_range_restores_alone() {
        let (k, m, len) = (3, 2, 8192);
        let data = shards(k, len, 3);
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let par = parity(&refs, m).unwrap();
        let (s, e) = aligned(1000, 300, len as u64);
        assert_eq!((s, e), (960, 1344));
        let (s, e) = (s as usize, e as usize);
        let have: Vec<(usize, &[u8])> =
            vec![(0, &data[0][s..e]), (3, &par[0][s..e]), (4, &par[1][s..e])];
        let got = restore(k, m, &have, 2).unwrap();
        assert_eq!(got, &data[2][s..e]);
        assert_eq!(aligned(8100, 500, 8192), (8064, 8192), "cut at the end");
    }
}
