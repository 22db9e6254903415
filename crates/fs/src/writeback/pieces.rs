//! Pieces: how the flush stores a small overwrite of a committed block.
//! The bytes written (a patch, `patch.rs`) become chunks of their own, laid
//! as pieces over the block's committed extent, instead of a new whole
//! chunk read, patched and rewritten. The flush then writes only the bytes
//! written and reads nothing, and the version the overwrite replaced keeps
//! only the bytes it covered: history grows with the bytes overwritten,
//! not by a whole chunk per small write.
//!
//! A block gathers pieces until they are too many (`MAX_PIECES`); the next
//! patch of that block is then written as a whole chunk again, and the old
//! base goes to history with the pieces. Pieces never overlap, so they
//! hold at most the whole block: aligned 4 KiB writes (a database, a
//! volume with 4 KiB blocks) stay pieces for good, and cost their own size
//! on the devices (`volumes_layer::small_random_writes_cost_about_their_
//! size_on_the_devices`: 1.01 bytes per byte written, where rewriting a
//! block once its pieces held half of it cost 2.03). Each whole chunk
//! history keeps stands for `MAX_PIECES` overwrites (512-byte writes: at
//! most five times the bytes overwritten). A block its pieces cover
//! entirely still holds its base chunk until it is written whole again
//! (or reblocked): space, not writes.

use crate::types::{Extent, Piece};
use crate::writeback::patch::Patch;

/// Pieces one extent holds at most: a cold read of the block reads at most
/// this many chunks besides its base.
pub const MAX_PIECES: usize = 32;

/// The chunk of a piece the flush has yet to write (`plan`).
pub const NEW_PIECE: u64 = u64::MAX;

/// The extent that puts `patch` over the committed extent `ext` as pieces:
/// the old pieces the patch leaves visible (cut where it covers them) and
/// one new piece per range of the patch, in order, with chunk `NEW_PIECE`
/// (filled in when the flush has written them). An append (the patch's
/// bytes past the valid ones run on from them, no gap) grows the extent:
/// its new bytes are all pieces, so nothing of the base past the old
/// length shows. None when the block is better written whole: the patch
/// leaves a gap past the valid bytes, or the pieces would be more than
/// `MAX_PIECES` (or, never for a valid patch, hold more than `record`
/// bytes).
#[allow(
    clippy::cast_possible_truncation,
    reason = "offsets within one record (record size <= 1 MiB, check_geometry)"
)]
pub fn plan(ext: &Extent, patch: &Patch, record: u64) -> Option<Extent> {
    let old = ext.len as usize;
    if patch.end() > old && !appends(patch, old) {
        return None;
    }
    let ranges: Vec<(u32, u32)> = patch
        .ranges()
        .map(|(off, b)| (off as u32, (off + b.len()) as u32))
        .collect();
    let mut pieces: Vec<Piece> = ext
        .pieces
        .iter()
        .flat_map(|p| uncovered(p, &ranges))
        .collect();
    pieces.extend(ranges.iter().map(|&(lo, hi)| Piece {
        off: lo,
        len: hi - lo,
        chunk: NEW_PIECE,
        from: 0,
    }));
    pieces.sort_unstable_by_key(|p| p.off);
    let bytes: u64 = pieces.iter().map(|p| p.len as u64).sum();
    if pieces.len() > MAX_PIECES || bytes > record {
        return None;
    }
    Some(Extent {
        chunk: ext.chunk,
        len: ext.len.max(patch.end() as u32),
        pieces,
    })
}

/// True when the patch's bytes past `old` form one run starting at `old`.
fn appends(patch: &Patch, old: usize) -> bool {
    let mut at = old;
    for (off, b) in patch.ranges() {
        let end = off + b.len();
        if end <= old {
            continue;
        }
        if off > at {
            return false;
        }
        at = at.max(end);
    }
    at == patch.end()
}

/// The parts of `p` that none of `ranges` (sorted, disjoint, [lo, hi))
/// covers.
fn uncovered(p: &Piece, ranges: &[(u32, u32)]) -> Vec<Piece> {
    gaps(p.off, p.off + p.len, ranges.iter().copied())
        .into_iter()
        .map(|(lo, hi)| part(p, lo, hi))
        .collect()
}

/// The ranges of `lo..hi` that none of `covered` (sorted, disjoint,
/// [lo, hi)) covers.
pub fn gaps(lo: u32, hi: u32, covered: impl IntoIterator<Item = (u32, u32)>) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut at = lo;
    for (a, b) in covered {
        if b <= at || a >= hi {
            continue;
        }
        if a > at {
            out.push((at, a));
        }
        at = at.max(b);
    }
    if at < hi {
        out.push((at, hi));
    }
    out
}

/// Bytes `lo..hi` of the block that piece `p` holds.
fn part(p: &Piece, lo: u32, hi: u32) -> Piece {
    // A part of a piece: its bytes come from the same place in its chunk.
    assert!(
        p.off <= lo && lo < hi && hi <= p.off + p.len,
        "part {lo}..{hi} of piece {}+{}",
        p.off,
        p.len
    );
    Piece {
        off: lo,
        len: hi - lo,
        chunk: p.chunk,
        from: p.from + (lo - p.off),
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test data: small generated values, truncation intended"
)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Reads a block from an extent as the read path does, with chunk
    /// contents from `store` (the base at index `ext.chunk`).
    fn read(ext: &Extent, store: &[Vec<u8>]) -> Vec<u8> {
        let mut b = store[ext.chunk as usize].clone();
        b.resize(ext.len as usize, 0);
        for p in &ext.pieces {
            let src = &store[p.chunk as usize][p.from as usize..(p.from + p.len) as usize];
            b[p.off as usize..(p.off + p.len) as usize].copy_from_slice(src);
        }
        b
    }

    /// Random patches laid as pieces read back as the patched block, and
    /// the plan gives up exactly when the limits say.
    #[test]
    fn pieces_read_as_the_patched_block() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(14);
        let record = 4096u64;
        for _ in 0..500 {
            let base: Vec<u8> = (0..record).map(|_| rng.gen()).collect();
            let mut store = vec![base.clone()];
            // A valid length below the base's: appends grow it.
            let len = rng.gen_range(record as usize / 2..=record as usize);
            let mut ext = Extent::whole(0, len as u32);
            let mut want = base;
            want.truncate(len);
            for _ in 0..30 {
                let mut patch = Patch::default();
                for _ in 0..rng.gen_range(1..4) {
                    let off = rng.gen_range(0..record as usize - 1);
                    let n = rng.gen_range(1..200).min(record as usize - off);
                    let data: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                    patch.write(off, &data);
                    if want.len() < off + n {
                        want.resize(off + n, 0);
                    }
                    want[off..off + n].copy_from_slice(&data);
                }
                let Some(mut next) = plan(&ext, &patch, record) else {
                    let mut b = read(&ext, &store);
                    b.resize(b.len().max(patch.end()), 0);
                    patch.apply(&mut b);
                    assert_eq!(b, want);
                    let n = b.len() as u32;
                    store.push(b);
                    ext = Extent::whole(store.len() as u64 - 1, n);
                    continue;
                };
                assert!(next.pieces.len() <= MAX_PIECES);
                let bytes: u32 = next.pieces.iter().map(|p| p.len).sum();
                assert!(bytes as u64 <= record);
                let mut news = patch.ranges();
                for p in next.pieces.iter_mut().filter(|p| p.chunk == NEW_PIECE) {
                    let (off, b) = news.next().expect("a range per new piece");
                    assert_eq!(off, p.off as usize);
                    store.push(b.to_vec());
                    p.chunk = store.len() as u64 - 1;
                }
                assert!(news.next().is_none());
                assert_eq!(Extent::decode(&next.encode()).unwrap(), next);
                ext = next;
                assert_eq!(read(&ext, &store), want);
            }
        }
    }

    #[test]
    fn a_patch_past_the_valid_bytes_is_written_whole_unless_it_appends() {
        let ext = Extent::whole(0, 1000);
        let mut p = Patch::default();
        p.write(1005, &[1; 20]);
        assert!(
            plan(&ext, &p, 65536).is_none(),
            "a gap past the valid bytes"
        );
        let mut p = Patch::default();
        p.write(990, &[1; 20]);
        p.write(1010, &[2; 30]);
        let x = plan(&ext, &p, 65536).expect("an append");
        assert_eq!(x.len, 1040);
        // Over a base longer than the valid bytes (a block truncated in
        // place), the appended bytes are pieces, not the stale base.
        let store = vec![vec![7u8; 4096], vec![1; 50]];
        let mut x = x;
        for piece in x.pieces.iter_mut() {
            piece.chunk = 1;
        }
        let b = read(&x, &store);
        assert!(b[1000..1040].iter().all(|&v| v == 1), "stale base bytes");
        let mut p = Patch::default();
        p.write(0, &[1; 1000]);
        assert!(plan(&ext, &p, 1024).is_some(), "pieces may cover the block");
        let mut p = Patch::default();
        for k in 0..=MAX_PIECES {
            p.write(k * 4, &[1; 2]);
        }
        assert!(plan(&ext, &p, 65536).is_none(), "more than MAX_PIECES");
        let mut p = Patch::default();
        p.write(100, &[1; 100]);
        let x = plan(&ext, &p, 65536).expect("a small patch is a piece");
        assert_eq!(x.pieces.len(), 1);
        assert_eq!((x.pieces[0].off, x.pieces[0].len), (100, 100));
    }
}
