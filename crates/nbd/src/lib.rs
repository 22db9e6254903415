//! Cairn's NBD server: block volumes over the Network Block Device
//! protocol (fixed newstyle, structured replies, base:allocation), for
//! any storage implementing `Export`; Cairn's volumes are served through
//! `PoolExports` (volume.rs). Each connection has a reader
//! thread; requests run on a shared adaptive worker pool
//! (`cairn-workpool`), so a slow device gets more workers up to a limit;
//! one memory budget bounds the payloads in flight across connections
//! (budget.rs). TCP clients must start TLS with a client certificate
//! (tls.rs) unless the server is told to allow plain TCP.
//! See docs/format/volumes-and-nbd.md, "NBD (on the wire)", for the subset served.

mod budget;
mod command;
mod conn;
mod error;
mod export;
mod handshake;
mod mem;
pub mod proto;
mod server;
mod stats;
mod tls;
mod tls_gen;
mod unix;
mod volume;

pub use conn::FlightLimits;
pub use error::{errno, wire_errno, NbdError};
pub use export::{Export, Exports, StaticExports, HOLE, ZERO};
pub use handshake::negotiate;
pub use mem::MemExport;
pub use server::{serve_tcp, serve_unix, Address, Server, ServerConfig, ShutdownHandle};
pub use stats::{CommandStats, Stats};
pub use tls::{
    init_dir as tls_init_dir, TlsConfig, CA_CERT, CLIENT_CERT, CLIENT_KEY, SERVER_CERT, SERVER_KEY,
};
pub use volume::{PoolExports, VolumeExport};
