//! Cairn's S3 object-store client, shared by the `s3` tier device (and
//! later by mirrors to a bucket): where a store is (`Locator`, parsed from
//! `s3:BUCKET[/PREFIX]:endpoint=URL[:region=R]`), who we are to it
//! (`Credentials`, from the environment or a 0600 file, never printed),
//! and a blocking client (`ObjectClient`) over `object_store` with
//! retries and backoff for 5xx and throttling answers, a hard time limit
//! on every call, and request counters (`ClientStats`).

pub mod client;
pub mod credentials;
pub mod error;
pub mod locator;
pub mod stats;
pub mod testing;

pub use client::{ClientOptions, ObjectClient, PutInfo};
pub use credentials::Credentials;
pub use error::ObjError;
pub use locator::Locator;
pub use stats::{ClientStats, StatsSnapshot};
