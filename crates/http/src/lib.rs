//! HTTP frontend of a mounted pool: Prometheus metrics at `/metrics` and a
//! read-only web dashboard at `/` (HTML, JS and CSS embedded in the binary)
//! with the JSON it polls under `/api/`. Beside the FUSE and NBD frontends:
//! it reads `cairn_fs::Fs` and takes what it cannot reach (FUSE and NBD
//! counters) as closures from the binary. GET (and HEAD) only; anything
//! else is 405. Loopback only unless remote access is allowed. The figures
//! carry no path or name; the routes that do (`routes::DETAIL`) are off
//! unless enabled, and an optional token guards every route.

mod auth;
mod error;
mod metrics;
mod routes;
mod scan;
mod server;

pub use auth::Token;
pub use error::HttpError;
pub use metrics::{Kind, Sample, Value};
pub use routes::DETAIL;
pub use server::{serve, Options, Server};

/// Figures the HTTP side cannot read from `Fs` itself (FUSE and NBD
/// counters), produced at each scrape.
pub type ExtraFn = Box<dyn Fn() -> Vec<Sample> + Send + Sync>;
