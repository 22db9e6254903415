//! The errors of the object-store client. Messages name the operation and
//! the object key, never credentials.

#[derive(Debug, thiserror::Error)]
pub enum ObjError {
    #[error("bad object-store locator '{spec}': {why}")]
    BadLocator { spec: String, why: String },
    #[error("object-store credentials: {0}")]
    Credentials(String),
    #[error("object store: {op} {key}: no answer within {secs} s")]
    Timeout {
        op: &'static str,
        key: String,
        secs: u64,
    },
    #[error("object store: {op} {key}: not found")]
    NotFound { op: &'static str, key: String },
    /// The store answered no, or did not answer (`down`: connection
    /// refused, 5xx after the retries).
    #[error("object store: {op} {key}: {why}")]
    Request {
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
