//! Work on a live pool that users do not ask for by writing: GC and reblock
//! (space), scrub and check (verification), salvage and rebuild (damaged
//! metadata), tiering (migration by heat), device add/remove, and `cairn
//! info`.

pub mod check;
pub mod devices;
pub mod gc;
pub mod heatmap;
pub mod info;
pub mod objects;
pub mod reblock;
pub mod rebuild;
pub mod salvage;
pub mod scrub;
pub mod tier;
