//! The errors of the object-store client. Messages name the operation and
//! the object key, never credentials.

#[derive(Debug, thiserror::Error)]
pub enum ObjError {
    #[error("bad object-store locator '{spec}': {why}")]
    BadLocator { spec: String, why: String },
    #[error("object-store credentials: {0}")]
    Credentials(String),
    #[error("object store {endpoint}: {op} {key}: timed out (no answer within {secs} s)")]
    Timeout {
        endpoint: String,
        op: &'static str,
        key: String,
        secs: u64,
    },
    #[error("object store: {op} {key}: not found")]
    NotFound { op: &'static str, key: String },
    /// The store answered no, or did not answer (`down`: connection
    /// refused, 5xx after the retries); `why` starts with what happened
    /// (`classify`).
    #[error("object store {endpoint}: {op} {key}: {why}")]
    Request {
        endpoint: String,
        op: &'static str,
        key: String,
        why: String,
        down: bool,
    },
    #[error("object store: {key} did not verify after upload: {why}")]
    Verify { key: String, why: String },
    #[error("object store client: {0}")]
    Client(String),
}

impl ObjError {
    /// The store could not be reached or did not answer in time (as
    /// opposed to an answer saying no).
    pub fn is_unreachable(&self) -> bool {
        match self {
            ObjError::Timeout { .. } => true,
            ObjError::Request { down, .. } => *down,
            _ => false,
        }
    }
}

/// What a failed request came to, in words an administrator acts on:
/// "connection refused", "timed out", "unreachable" (no route, DNS,
/// reset), from the I/O error deepest in `e`'s source chain, followed by
/// the client's own message. Other errors keep their message.
pub fn classify(e: &(dyn std::error::Error + 'static)) -> String {
    use std::io::ErrorKind::*;
    let mut cause = None;
    let mut at: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(x) = at {
        if let Some(io) = x.downcast_ref::<std::io::Error>() {
            cause = Some(match io.kind() {
                ConnectionRefused => "connection refused (nothing listens there)",
                TimedOut => "timed out",
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => {
                    "connection lost"
                }
                // HostUnreachable, NetworkUnreachable, NotConnected,
                // AddrNotAvailable and the rest.
                _ => "unreachable",
            });
        }
        at = x.source();
    }
    let text = e.to_string();
    let cause = cause.or_else(|| {
        text.contains("error sending request")
            .then_some("unreachable")
    });
    match cause {
        Some(c) => format!("{c}: {text}"),
        None => text,
    }
}

impl From<ObjError> for std::io::Error {
    fn from(e: ObjError) -> Self {
        match e {
            ObjError::NotFound { .. } => std::io::Error::new(std::io::ErrorKind::NotFound, e),
            ObjError::Timeout { .. } => std::io::Error::new(std::io::ErrorKind::TimedOut, e),
            e => std::io::Error::other(e),
        }
    }
}

pub type Result<T> = std::result::Result<T, ObjError>;
