//! HTTP frontend of a mounted pool: Prometheus metrics at `/metrics` and a
//! read-only web dashboard at `/` (HTML, JS and CSS embedded in the binary)
//! with the JSON it polls under `/api/`. Beside the FUSE and NBD frontends:
//! it reads `cairn_fs::Fs` and takes what it cannot reach (FUSE and NBD
//! counters) as closures from the binary. GET (and HEAD) only; anything
//! else is 405. Loopback only unless remote access is allowed.

mod error;
mod metrics;
mod scan;
mod server;

pub use error::HttpError;
pub use metrics::{Kind, Sample, Value};
pub use server::{serve, Options, Server};

/// Figures the HTTP side cannot read from `Fs` itself (FUSE and NBD
/// counters), produced at each scrape.
pub type ExtraFn = Box<dyn Fn() -> Vec<Sample> + Send + Sync>;
