//! Helpers of the redundancy tests: a pool of ssd device files with a
//! policy, the JSON a command prints, and the space a pool takes.

use super::{cairn_ok, Fs};
use serde_json::Value;

/// What `cairn ARGS` (which must succeed) prints, as JSON.
pub fn json(args: &[&str]) -> Value {
    let out = cairn_ok(args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

/// A pool of `devs` ssd devices (d0, d1...) of `size` each with
/// redundancy `policy`, mounted.
pub fn pool_with(devs: usize, size: &str, policy: &str) -> Fs {
    let mut fs = Fs::create();
    let mut args = vec!["--redundancy".to_string(), policy.to_string()];
    for i in 0..devs {
        args.push("--device".into());
        args.push(format!("ssd:{}:{size}", fs.dev(&format!("d{i}"))));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fs.mkfs(&args);
    fs.mount();
    fs
}

/// Bytes in use on the devices, summed (`tier status`): the space the
/// pool takes.
pub fn slots_used(fs: &Fs) -> u64 {
    let v = json(&["tier", "status", fs.mnt.to_str().unwrap(), "--json"]);
    let devs = v.as_array().unwrap().iter();
    devs.map(|d| d["used"].as_u64().unwrap()).sum()
}
