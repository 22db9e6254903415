//! A blocking client for one bucket and prefix, over `object_store`'s S3
//! implementation run on a small shared tokio runtime. Every call is
//! bounded: `object_store` retries 5xx, throttling and transport errors
//! with exponential backoff for at most `timeout`, and the whole call
//! (retries included) is cut off at `timeout` too, so a store that is down
//! or hangs costs a caller at most that long. Calls are counted in
//! `stats`; whether the store answered the last call is its state.

use crate::credentials::Credentials;
use crate::error::{ObjError, Result};
use crate::locator::Locator;
use crate::stats::ClientStats;
use bytes::Bytes;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjPath;
use object_store::{BackoffConfig, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::OnceLock;
use std::time::Duration;

/// How long a call may take, retries included, and how often a failed
/// request is retried within that time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientOptions {
    pub timeout: Duration,
    pub max_retries: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_secs(10),
            max_retries: 5,
        }
    }
}

/// What an upload left in the store, as checked by a HEAD after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutInfo {
    pub size: u64,
    pub e_tag: Option<String>,
}

pub struct ObjectClient {
    locator: Locator,
    store: AmazonS3,
    opts: ClientOptions,
    pub stats: ClientStats,
}

/// Shows where the client goes, never its credentials.
impl std::fmt::Debug for ObjectClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectClient({})", self.locator)
    }
}

/// The runtime every client's requests run on (two worker threads).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cairn-s3")
            .enable_all()
            .build()
            .expect("tokio runtime for the object store")
    })
}

impl ObjectClient {
    pub fn new(locator: &Locator, creds: &Credentials, opts: ClientOptions) -> Result<Self> {
        let rt = runtime();
        let _in_rt = rt.enter();
        let client = object_store::ClientOptions::new()
            .with_timeout(opts.timeout)
            .with_connect_timeout(opts.timeout.min(Duration::from_secs(5)))
            .with_allow_http(true);
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: opts.max_retries,
            retry_timeout: opts.timeout,
        };
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&locator.bucket)
            .with_region(&locator.region)
            .with_endpoint(&locator.endpoint)
            .with_allow_http(true)
            .with_virtual_hosted_style_request(false)
            .with_access_key_id(&creds.key_id)
            .with_secret_access_key(&creds.secret)
            .with_client_options(client)
            .with_retry(retry);
        if let Some(t) = &creds.token {
            b = b.with_token(t);
        }
        let store = b.build().map_err(|e| ObjError::Client(e.to_string()))?;
        Ok(ObjectClient {
            locator: locator.clone(),
            store,
            opts,
            stats: ClientStats::default(),
        })
    }

    pub fn locator(&self) -> &Locator {
        &self.locator
    }

    pub fn timeout(&self) -> Duration {
        self.opts.timeout
    }

    /// Runs one call to completion or its time limit, counting errors and
    /// noting whether the store answered.
    fn run<T>(
        &self,
        op: &'static str,
        key: &str,
        fut: impl Future<Output = object_store::Result<T>>,
    ) -> Result<T> {
        let limit = self.opts.timeout;
        let got = runtime().block_on(async { tokio::time::timeout(limit, fut).await });
        let err = match got {
            Ok(Ok(v)) => {
                self.stats.set_reachable(true);
                return Ok(v);
            }
            Ok(Err(object_store::Error::NotFound { .. })) => {
                self.stats.set_reachable(true);
                return Err(ObjError::NotFound {
                    op,
                    key: key.to_string(),
                });
            }
            Ok(Err(e)) => {
                let down = !matches!(
                    e,
                    object_store::Error::PermissionDenied { .. }
                        | object_store::Error::Unauthenticated { .. }
                        | object_store::Error::Precondition { .. }
                        | object_store::Error::AlreadyExists { .. }
                );
                ObjError::Request {
                    endpoint: self.locator.endpoint.clone(),
                    op,
                    key: key.to_string(),
                    why: crate::error::classify(&e),
                    down,
                }
            }
            Err(_) => {
                self.stats.timeouts.fetch_add(1, Relaxed);
                ObjError::Timeout {
                    endpoint: self.locator.endpoint.clone(),
                    op,
                    key: key.to_string(),
                    secs: limit.as_secs(),
                }
            }
        };
        self.stats.errors.fetch_add(1, Relaxed);
        self.stats.set_reachable(!err.is_unreachable());
        Err(err)
    }

    /// Bytes `range` of object `key` (one ranged GET).
    pub fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        // An empty or reversed range is the caller's arithmetic gone
        // wrong (the store would answer it with the whole object or an
        // error).
        debug_assert!(range.start < range.end, "GET of bytes {range:?} of {key}");
        self.stats.gets.fetch_add(1, Relaxed);
        let path = ObjPath::from(key);
        let b = self.run("GET", key, self.store.get_range(&path, range))?;
        self.stats.bytes_in.fetch_add(b.len() as u64, Relaxed);
        Ok(b)
    }

    /// The whole of object `key` (one GET).
    pub fn get(&self, key: &str) -> Result<Bytes> {
        self.stats.gets.fetch_add(1, Relaxed);
        let path = ObjPath::from(key);
        let fetch = async { self.store.get(&path).await?.bytes().await };
        let b = self.run("GET", key, fetch)?;
        self.stats.bytes_in.fetch_add(b.len() as u64, Relaxed);
        Ok(b)
    }

    /// Size and entity tag of `key`, None if there is no such object.
    pub fn head(&self, key: &str) -> Result<Option<PutInfo>> {
        self.stats.heads.fetch_add(1, Relaxed);
        let path = ObjPath::from(key);
        match self.run("HEAD", key, self.store.head(&path)) {
            Ok(m) => Ok(Some(PutInfo {
                size: m.size,
                e_tag: m.e_tag,
            })),
            Err(ObjError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Uploads `data` as object `key` in one PUT (an object appears whole
    /// or not at all), then checks with a HEAD that the store holds it:
    /// same size and entity tag, and where the tag is an MD5 (single-part
    /// uploads on S3, Garage, MinIO, s3s), the MD5 of `data`.
    pub fn put_verified(&self, key: &str, data: Bytes) -> Result<PutInfo> {
        let len = data.len() as u64;
        let md5 = md5_hex(&data);
        self.stats.puts.fetch_add(1, Relaxed);
        let path = ObjPath::from(key);
        let put = self.run(
            "PUT",
            key,
            self.store.put(&path, PutPayload::from_bytes(data)),
        )?;
        self.stats.bytes_out.fetch_add(len, Relaxed);
        let bad = |why: String| ObjError::Verify {
            key: key.to_string(),
            why,
        };
        let got = self
            .head(key)?
            .ok_or_else(|| bad("gone after upload".into()))?;
        if got.size != len {
            return Err(bad(format!("size {} stored, {len} sent", got.size)));
        }
        if put.e_tag.is_some() && got.e_tag != put.e_tag {
            return Err(bad("entity tag changed since the upload".into()));
        }
        if let Some(tag) = got.e_tag.as_deref().map(|t| t.trim_matches('"')) {
            if tag.len() == 32 && tag.bytes().all(|b| b.is_ascii_hexdigit()) && tag != md5 {
                return Err(bad(format!("MD5 {tag} stored, {md5} sent")));
            }
        }
        Ok(got)
    }

    /// Names (relative to the locator's prefix) and sizes of the objects
    /// whose name starts with `start`. One LIST call (its pages counted
    /// once).
    pub fn list(&self, start: &str) -> Result<Vec<(String, u64)>> {
        use futures::TryStreamExt;
        self.stats.lists.fetch_add(1, Relaxed);
        let base = self.locator.key("");
        let dir = base.trim_end_matches('/');
        let prefix = (!dir.is_empty()).then(|| ObjPath::from(dir));
        let listed = self.run(
            "LIST",
            dir,
            self.store.list(prefix.as_ref()).try_collect::<Vec<_>>(),
        )?;
        let strip = |k: &str| match dir.is_empty() {
            true => Some(k.to_string()),
            false => k.strip_prefix(dir)?.strip_prefix('/').map(str::to_string),
        };
        Ok(listed
            .into_iter()
            .filter_map(|m| Some((strip(m.location.as_ref())?, m.size)))
            .filter(|(n, _)| n.starts_with(start) && !n.contains('/'))
            .collect())
    }

    /// Deletes `key`; one that is already gone is no error.
    pub fn delete(&self, key: &str) -> Result<()> {
        self.stats.deletes.fetch_add(1, Relaxed);
        let path = ObjPath::from(key);
        match self.run("DELETE", key, self.store.delete(&path)) {
            Ok(()) | Err(ObjError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn md5_hex(data: &[u8]) -> String {
    use md5::Digest;
    md5::Md5::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
