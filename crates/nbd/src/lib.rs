//! Cairn's NBD server: block volumes over the Network Block Device
//! protocol (fixed newstyle, structured replies, base:allocation), for
//! any storage implementing `Export`; Cairn's volumes are served through
//! `PoolExports` (volume.rs). Each connection has a reader
//! thread; requests run on a shared adaptive worker pool
//! (`cairn-workpool`), so a slow device gets more workers up to a limit.
//! See docs/FORMAT.md, "NBD (on the wire)", for the subset served.

mod command;
mod conn;
mod error;
mod export;
mod handshake;
mod mem;
pub mod proto;
mod server;
mod stats;
mod unix;
mod volume;

pub use conn::FlightLimits;
pub use error::{errno, wire_errno, NbdError};
pub use export::{Export, Exports, StaticExports, HOLE, ZERO};
pub use handshake::negotiate;
pub use mem::MemExport;
pub use server::{serve_tcp, serve_unix, Address, Server, ServerConfig, ShutdownHandle};
pub use stats::{CommandStats, Stats};
pub use volume::{PoolExports, VolumeExport};
