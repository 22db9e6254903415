//! The daemon side of the control socket: one thread accepting, one thread
//! per connection, each running one request against the mounted filesystem.

use super::exec::{execute, info, report};
use super::protocol::MAX_REQUEST_LINE;
use super::protocol::{decode_request, read_line, ProtocolError, Reply, Request};
use cairn_fs::Fs;
use std::io::{BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;

/// Starts serving requests on `sock` (replacing a stale socket file).
pub fn spawn(fs: Arc<Fs>, sock: &Path) -> std::io::Result<()> {
    let _ = std::fs::remove_file(sock);
    let listener = UnixListener::bind(sock)?;
    std::fs::set_permissions(sock, std::fs::Permissions::from_mode(0o600))?;
    std::thread::Builder::new()
        .name("cairn-control".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                let fs = fs.clone();
                let _ = std::thread::Builder::new()
                    .name("cairn-request".into())
                    .spawn(move || serve_one(&fs, conn));
            }
        })?;
    Ok(())
}

fn send(w: &mut UnixStream, r: &Reply) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(r).expect("reply serializes");
    line.push(b'\n');
    w.write_all(&line)
}

fn serve_one(fs: &Arc<Fs>, conn: UnixStream) {
    let Ok(mut w) = conn.try_clone() else { return };
    let line = match read_line(&mut BufReader::new(conn), MAX_REQUEST_LINE) {
        Ok(Some(l)) => l,
        Ok(None) | Err(ProtocolError::Io(_)) => return,
        Err(e) => {
            let _ = send(&mut w, &Reply::Err(format!("malformed request: {e}")));
            return;
        }
    };
    let req = match decode_request(&line) {
        Ok(r) => r,
        Err(e) => {
            let _ = send(&mut w, &Reply::Err(format!("malformed request: {e}")));
            return;
        }
    };
    tracing::info!("control request: {req:?}");
    let creates = req.creates_snapshot();
    let progress = |d, t| {
        let _ = send(
            &mut w.try_clone().expect("socket clone"),
            &Reply::Progress(d, t),
        );
    };
    let done = match req {
        // Only the daemon logs to a file that can fill.
        Request::Info => info(fs, Some(crate::logging::dropped())).and_then(report),
        Request::Restart => crate::keeper::hand_over(fs),
        req => execute(fs, req, &progress),
    };
    let reply = match done {
        Ok(v) => Reply::Ok(v),
        Err(e) => Reply::Err(e.to_string()),
    };
    if creates {
        // A cut's snapshot is hashed once its commit is done.
        let fs = fs.clone();
        std::thread::spawn(move || {
            fs.commit_cuts();
            fs.spawn_snapshot_hasher();
        });
    }
    let _ = send(&mut w, &reply);
}
