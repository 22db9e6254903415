//! Administration of a pool while it is mounted or not: the same requests
//! (snapshots, history, prune, reblock, sync) run inside the mount daemon,
//! reached through its control socket, or in this process on an unmounted
//! pool. One JSON request line in; progress lines and one result line out.

pub mod client;
pub mod exec;
pub mod protocol;
pub mod replies;
pub mod server;
