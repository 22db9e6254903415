//! Data layer: file blocks become chunks (a self-describing header with the
//! content hash, then the bytes) appended to segments, fixed-size regions
//! placed on devices by the devices layer. The segment table (segment id ->
//! device slot) is the only way to find a segment, so a segment can move by
//! changing one entry. Chunk and segment records are encoded here; the
//! filesystem layer stores them in the metadata store.
//!
//! Modules form layers, bottom to top; each refers only to modules below
//! it (tests/layering.rs checks this):
//! compress, error, ec, deadline -> aligned -> chunk -> codec -> layout -> records ->
//! stripe_rec ->
//! stripes -> policy -> heat, cache, wpipe -> copies -> dead_pages ->
//! open_segment -> segments -> writer -> readahead -> store ->
//! stripe_read -> read, heal, verified -> relocate -> stripe_parity ->
//! stripe_build.
//!
//! Redundancy: a segment may have copies on other devices (`policy.rs`
//! says how many, `copies.rs` writes them in parallel, `heal.rs` reads
//! another copy when one fails its checks and rewrites the bad one,
//! `relocate.rs` makes and moves copies, reading them checked chunk by
//! chunk through `verified.rs`). A layout `ec=K+M` keeps M+1 copies of a
//! new segment until K sealed ones are gathered into a stripe with M
//! parity members (`ec.rs` the codec, `stripe_rec.rs` the record,
//! `stripes.rs` the table, `stripe_build.rs` making and repairing
//! stripes, `stripe_read.rs` restoring a member's bytes from the others).

mod aligned;
pub mod cache;
pub mod chunk;
pub mod codec;
pub mod compress;
mod copies;
mod dead_pages;
pub mod deadline;
pub mod ec;
pub mod error;
pub mod heal;
pub mod heat;
pub mod layout;
mod open_segment;
pub mod policy;
pub mod read;
pub mod readahead;
pub mod records;
pub mod relocate;
mod segments;
mod span_read;
pub mod store;
pub mod stripe_build;
pub mod stripe_parity;
mod stripe_read;
pub mod stripe_rec;
mod stripes;
mod verified;
mod wpipe;
pub mod writer;

pub use aligned::CACHED_CHUNK;
pub use chunk::{ChunkError, ChunkHeader, Hash, CHUNK_HEADER_LEN};
pub use codec::ChunkCodec;
pub use compress::Compression;
pub use error::DataError;
pub use heat::{Heat, HeatSample};
pub use policy::{Layout, Policy, PolicyError};
pub use records::{ChunkRec, SegmentRec};
pub use relocate::Relocation;
pub use store::ChunkStore;
pub use stripe_rec::StripeRec;
pub use writer::WriteBatch;
