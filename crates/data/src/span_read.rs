//! Small reads of chunks sealed span by span (an encrypted pool's
//! uncompressed chunks of more than one span, `chunk.rs`): only the spans
//! the bytes touch are read, with one device read, and opened, each
//! authenticated at its index; a plain chunk's small reads check their
//! spans' checksums instead (`store.rs`).

use crate::aligned::{cached, read_direct};
use crate::chunk::CHUNK_HEADER_LEN;
use crate::codec::{span_sealed_len, stored_spans};
use crate::error::Result;
use crate::records::{corrupt, ChunkRec};
use crate::store::ChunkStore;

impl ChunkStore {
    /// True if `rec` is sealed span by span: the pool is encrypted and the
    /// record's length is such a chunk's (`span_sealed_len`).
    pub(crate) fn is_span_sealed(&self, rec: &ChunkRec) -> bool {
        self.codec.is_encrypted()
            && span_sealed_len(rec.raw_len as usize)
                .is_some_and(|n| CHUNK_HEADER_LEN + n == rec.len as usize)
    }

    /// Opens whole chunk `rec` (a span-sealed record, its stored bytes
    /// `chunk`) into `dst`, its raw bytes: straight in when its header is
    /// such a chunk's, else unsealed as any chunk is (which refuses what
    /// is neither). An error names the chunk.
    pub(crate) fn open_into(&self, rec: &ChunkRec, chunk: &[u8], dst: &mut [u8]) -> Result<()> {
        if dst.len() != rec.raw_len as usize {
            return Err(corrupt(rec, "raw length differs from record".into()));
        }
        let opened = (self.codec.open_chunk_into(chunk, &rec.hash, dst))
            .map_err(|why| corrupt(rec, why.to_string()))?;
        if !opened {
            dst.copy_from_slice(&self.raw_of(rec, chunk, false)?);
        }
        self.heat.touch(rec.segment, rec.len as u64);
        Ok(())
    }

    /// Raw bytes `from..from + dst.len()` of chunk `rec` into `dst` when
    /// it is sealed span by span (else None), from the copy reads go to
    /// first: the spans they touch, opened. An error names the chunk (a
    /// damaged or moved span fails its authentication), and the caller
    /// tries the other copies.
    pub(crate) fn read_spans_here(
        &self,
        rec: &ChunkRec,
        from: usize,
        dst: &mut [u8],
    ) -> Option<Result<()>> {
        if !self.is_span_sealed(rec) {
            return None;
        }
        if dst.is_empty() {
            return Some(Ok(()));
        }
        Some(self.read_spans(rec, from, dst))
    }

    /// `read_spans_here` of a chunk sealed span by span.
    fn read_spans(&self, rec: &ChunkRec, from: usize, dst: &mut [u8]) -> Result<()> {
        let (first, off, len, skip) = stored_spans(rec.raw_len as usize, from, from + dst.len());
        let mut open = |stored: &[u8]| {
            let raw = (self.codec.open_spans(rec.raw_len, &rec.hash, first, stored))
                .map_err(|why| corrupt(rec, why.to_string()))?;
            let part = raw
                .get(skip..skip + dst.len())
                .ok_or_else(|| corrupt(rec, "read beyond the chunk's raw length".into()))?;
            dst.copy_from_slice(part);
            Ok(())
        };
        let _gate = self.segs.io_gate.read();
        let (dev, at) = self.segs.locate(rec)?;
        let at = at + (CHUNK_HEADER_LEN + off) as u64;
        if !cached(rec.raw_len) && read_direct(&dev, at, len, &mut open)?.is_some() {
            return Ok(());
        }
        let mut buf = vec![0u8; len];
        dev.read_at(&mut buf, at)?;
        open(&buf)
    }
}
