//! History (HAMMER's versioned tree): the versions of a file and of a
//! path, `@@0x<tid>`
//! views, snapshots, prune and the content hashes of snapshot trees.

pub mod asof;
pub mod live_debts;
pub mod liveness;
pub mod nohistory;
pub mod path_versions;
pub mod prune;
pub mod snapshot;
pub mod treehash;
pub mod versions;
