//! Errors of the HTTP frontend.

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("{0} is not a loopback address; metrics and the dashboard would be readable from other hosts: allow it with --metrics-allow-remote (or metrics_allow_remote = true) on a trusted network, with metrics_token_file")]
    NotLoopback(std::net::SocketAddr),
    #[error("listening on {0}: {1}")]
    Bind(std::net::SocketAddr, String),
    #[error("starting a thread: {0}")]
    Thread(#[from] std::io::Error),
    /// The token file (its contents never appear in the message).
    #[error("metrics token file {0}: {1}")]
    TokenFile(String, String),
}
