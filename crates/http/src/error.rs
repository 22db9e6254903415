//! Errors of the HTTP frontend.

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("{0} is not a loopback address; metrics and the dashboard have no authentication: allow it with --metrics-allow-remote (or metrics_allow_remote = true) on a trusted network")]
    NotLoopback(std::net::SocketAddr),
    #[error("listening on {0}: {1}")]
    Bind(std::net::SocketAddr, String),
    #[error("starting a thread: {0}")]
    Thread(#[from] std::io::Error),
}
