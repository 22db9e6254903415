//! Handing a mount from one daemon to the next without unmounting it
//! (`cairn restart`, docs/sharing.md, "When the daemon restarts"): the state that crosses (state.rs)
//! and the socket it crosses on, with the /dev/fuse connection (link.rs).

pub mod link;
pub mod state;

pub use link::{Link, Message, Tag};
pub use state::{Handover, HandoverError, ViewTable};
