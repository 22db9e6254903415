//! The two sides of a mirror copy as `cairn_mirror::copy` reaches them
//! (`Source`, `Mirror`): a pool here through its daemon or opened by this
//! command (`control::client`), or a pool on another host through `cairn
//! mirror ... --json` over ssh. Replies are decoded into their types
//! (`cairn_mirror::reply`): one missing a field is an error.

use crate::control::client::{call_as, Session};
use crate::control::protocol::Request;
use crate::mirror::{absolute, text};
use anyhow::{Context, Result};
use cairn_mirror::copy::EndpointResult;
use cairn_mirror::reply::{
    CandidatesReply, HoldReply, LackingHexReply, LackingReply, ReadReply, RollbackReply,
    StatusReply, WriteReply,
};
use serde::de::DeserializeOwned;
use std::path::Path;

/// The source of a copy: the pool behind a path, one request at a time.
pub struct PoolSource<'a>(pub &'a Path);

impl cairn_mirror::Source for PoolSource<'_> {
    fn name(&self) -> String {
        self.0.display().to_string()
    }

    fn status(&self) -> EndpointResult<StatusReply> {
        Ok(call_as(self.0, Request::MirrorStatus)?)
    }

    fn candidates(&self, since: u64, out: &Path) -> EndpointResult<()> {
        let path = text(out);
        call_as::<CandidatesReply>(self.0, Request::MirrorCandidates { since, path })?;
        Ok(())
    }

    fn read(
        &self,
        since: u64,
        out: &Path,
        lacking: &Path,
        batch_mib: u64,
    ) -> EndpointResult<ReadReply> {
        let req = Request::MirrorRead {
            since,
            path: text(out),
            lacking: Some(text(lacking)),
            batch_mib: Some(batch_mib),
        };
        Ok(call_as(self.0, req)?)
    }

    fn hold(&self, mirror: &str, at: &str, tid: u64) -> EndpointResult<()> {
        let req = Request::MirrorHold {
            mirror: mirror.into(),
            at: at.into(),
            tid,
        };
        call_as::<HoldReply>(self.0, req)?;
        Ok(())
    }
}

/// Where a mirror is: a pool here (directory or mount point; opened once
/// for all the steps of a copy when not mounted), or one reached over ssh
/// (`ssh:[user@]host:POOL`, where `cairn mirror write` runs; no daemon
/// needed there).
pub enum Dest {
    /// `name`: how holds and errors name it.
    Local {
        name: String,
        s: Session,
    },
    Ssh {
        host: String,
        pool: String,
    },
}

impl Dest {
    pub fn close(self) -> Result<()> {
        match self {
            Dest::Local { s, .. } => s.close(),
            Dest::Ssh { .. } => Ok(()),
        }
    }

    pub fn parse(p: &Path) -> Result<Dest> {
        let s = text(p);
        let Some(rest) = s.strip_prefix("ssh:") else {
            let name = absolute(p).map_or(text(p), |p| text(&p));
            return Ok(Dest::Local {
                name,
                s: Session::open_mirror(p)?,
            });
        };
        match rest.split_once(':') {
            Some((host, pool)) if !host.is_empty() && !pool.is_empty() => Ok(Dest::Ssh {
                host: host.into(),
                pool: pool.into(),
            }),
            _ => anyhow::bail!("{s}: expected ssh:[user@]host:POOL"),
        }
    }

    /// Runs `cairn mirror CMD POOL TAIL --json` on the host over ssh
    /// (CAIRN_SSH: the ssh command, default `ssh`; CAIRN_REMOTE: the
    /// remote cairn, default `cairn`; TAIL words already quoted), with
    /// `input` on its stdin, and decodes its answer.
    fn remote<T: DeserializeOwned>(
        &self,
        cmd_name: &str,
        tail: &[&str],
        input: Option<&Path>,
    ) -> Result<T> {
        let Dest::Ssh { host, pool } = self else {
            anyhow::bail!("cairn mirror {cmd_name}: not a remote mirror");
        };
        let ssh = std::env::var("CAIRN_SSH").unwrap_or_else(|_| "ssh".into());
        let cairn = std::env::var("CAIRN_REMOTE").unwrap_or_else(|_| "cairn".into());
        let mut words = ssh.split_whitespace();
        let mut cmd = std::process::Command::new(words.next().unwrap_or("ssh"));
        // `--` ends ssh's options: a host is never taken for one.
        cmd.args(words).arg("--").arg(host);
        let remote = format!(
            "{} mirror {cmd_name} {} {} --json",
            quote(&cairn),
            quote(pool),
            tail.join(" ")
        );
        cmd.arg(remote).stderr(std::process::Stdio::inherit());
        cmd.stdin(match input {
            Some(f) => std::process::Stdio::from(std::fs::File::open(f)?),
            None => std::process::Stdio::null(),
        });
        let out = cmd.output().with_context(|| format!("running {ssh}"))?;
        if !out.status.success() {
            anyhow::bail!("cairn mirror {cmd_name} on {host} failed ({})", out.status);
        }
        serde_json::from_slice(&out.stdout).context("the remote cairn's answer")
    }
}

impl cairn_mirror::Mirror for Dest {
    fn name(&self) -> String {
        match self {
            Dest::Local { name, .. } => name.clone(),
            Dest::Ssh { host, pool } => format!("ssh:{host}:{pool}"),
        }
    }

    fn status(&self) -> EndpointResult<StatusReply> {
        Ok(match self {
            Dest::Local { s, .. } => s.call_as(Request::MirrorStatus)?,
            Dest::Ssh { .. } => self.remote("status", &[], None)?,
        })
    }

    fn write(&self, stream: &Path) -> EndpointResult<WriteReply> {
        let req = Request::MirrorWrite {
            path: text(stream),
            force: false,
        };
        Ok(match self {
            Dest::Local { s, .. } => s.call_as(req)?,
            Dest::Ssh { .. } => self.remote("write", &[], Some(stream))?,
        })
    }

    fn rollback(&self, snapshot: &str) -> EndpointResult<RollbackReply> {
        let req = Request::MirrorRollback {
            snapshot: snapshot.into(),
        };
        Ok(match self {
            Dest::Local { s, .. } => s.call_as(req)?,
            Dest::Ssh { .. } => self.remote("rollback", &[&quote(snapshot)], None)?,
        })
    }

    /// Writes into `out` which of the hashes in `wanted` the mirror lacks.
    fn lacking(&self, wanted: &Path, out: &Path) -> EndpointResult<()> {
        match self {
            Dest::Local { s, .. } => {
                s.call_as::<LackingReply>(Request::MirrorLacking {
                    path: text(wanted),
                    out: text(out),
                })?;
            }
            Dest::Ssh { .. } => {
                let v: LackingHexReply = self.remote("lacking", &[], Some(wanted))?;
                std::fs::write(out, decode_hex(&v.lacking)?)?;
            }
        }
        Ok(())
    }
}

/// A pool opened for a restore, named as given.
pub fn local(name: &Path, s: Session) -> Dest {
    Dest::Local {
        name: name.display().to_string(),
        s,
    }
}

fn decode_hex(s: &str) -> Result<Vec<u8>> {
    let bad = || anyhow::anyhow!("a bad hash list from the mirror");
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| bad()))
        .collect()
}

/// `s` quoted for a POSIX shell.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
