//! Pools with an s3 tier for the tests that run one (s3s-fs started by
//! `cairn_objstore::testing::S3Server`): the configuration they share.

use super::Fs;
use cairn_objstore::testing::write_credentials;

/// Configures `fs` (made, not mounted) for an s3 tier driven by the test:
/// a 0600 credentials file named in cairn.toml, the background mover and
/// GC off, faster tiers kept at most 1% full (a mover pass demotes every
/// sealed segment), then `extra`.
pub fn configure_s3_tier(fs: &Fs, extra: &[(&str, &str)]) {
    let creds = fs.dir.join("s3.creds");
    write_credentials(&creds);
    for (k, v) in [
        ("tier_interval_secs", "0"),
        ("gc_interval_secs", "0"),
        ("tier_fast_full_pct", "1"),
    ] {
        fs.set_config(k, v);
    }
    fs.set_config(
        "s3_credentials_file",
        &format!("{:?}", creds.display().to_string()),
    );
    for (k, v) in extra {
        fs.set_config(k, v);
    }
}
