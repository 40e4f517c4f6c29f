//! The admin interface: a Unix socket (mode 0600, so root only) speaking
//! one JSON request per line and one JSON reply per line. `switchctl` is
//! its client.
//!
//! Owns: the listener thread and the request/reply types. It never touches
//! the job table itself: each request travels over a channel to the control
//! thread ([`crate::control`]), which answers it; the dataplane threads never
//! see admin work.
//!
//! Limits: a request line is at most [`MAX_REQUEST_BYTES`]; a longer one is
//! refused and the connection closed.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::JobSection;

/// Longest request line taken (a job declaration is a few hundred bytes).
pub const MAX_REQUEST_BYTES: u64 = 64 * 1024;

/// Default path of the admin socket.
pub const DEFAULT_SOCKET: &str = "/run/aggswitch/switchd.sock";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum AdminRequest {
    /// List the jobs.
    Jobs,
    /// Counters of one job, or of the whole switch.
    Stats { job: Option<u16> },
    /// Declare a job.
    AddJob { job: JobSection },
    /// Remove a job; its workers get NACK 1 and fail.
    RemoveJob { id: u16 },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdminReply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub data: serde_json::Value,
}

impl AdminReply {
    pub fn ok(data: serde_json::Value) -> AdminReply {
        AdminReply {
            ok: true,
            error: None,
            data,
        }
    }
    pub fn err(msg: impl Into<String>) -> AdminReply {
        AdminReply {
            ok: false,
            error: Some(msg.into()),
            data: serde_json::Value::Null,
        }
    }
}

/// A request on its way to the dataplane, with where to send the reply.
pub struct AdminCall {
    pub request: AdminRequest,
    pub reply: mpsc::Sender<AdminReply>,
}

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("admin socket {path}: {call} failed: {source}")]
    Io {
        path: PathBuf,
        call: &'static str,
        source: std::io::Error,
    },
    #[error(
        "admin socket {0} is in use by a running switchd (stop it, or set switch.admin_socket)"
    )]
    InUse(PathBuf),
    #[error("cannot reach switchd at {path}: {source} (is switchd running? is this the socket in its config's switch.admin_socket?)")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("switchd sent a reply that is not JSON: {0}")]
    BadReply(String),
}

fn io_err<'a>(
    path: &'a Path,
    call: &'static str,
) -> impl FnOnce(std::io::Error) -> AdminError + 'a {
    move |source| AdminError::Io {
        path: path.to_owned(),
        call,
        source,
    }
}

/// The listening side, removed from the filesystem on drop.
pub struct AdminServer {
    path: PathBuf,
    handle: Option<std::thread::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the socket and serves requests on a thread, forwarding each to
/// `calls`.
pub fn serve(path: &Path, calls: mpsc::Sender<AdminCall>) -> Result<AdminServer, AdminError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_err(path, "creating its directory"))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_socket() {
            if UnixStream::connect(path).is_ok() {
                return Err(AdminError::InUse(path.to_owned()));
            }
            // Left over from a switchd that did not exit cleanly.
            std::fs::remove_file(path).map_err(io_err(path, "removing a stale socket"))?;
        }
    }
    let listener = UnixListener::bind(path).map_err(io_err(path, "bind"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err(path, "chmod 0600"))?;
    listener
        .set_nonblocking(true)
        .map_err(io_err(path, "set_nonblocking"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let thread_stop = stop.clone();
    let handle = std::thread::Builder::new()
        .name("admin".into())
        .spawn(move || {
            while !thread_stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        if let Err(e) = serve_connection(stream, &calls) {
                            tracing::debug!("admin connection: {e}");
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(e) => {
                        tracing::warn!("admin socket accept failed: {e}");
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            }
        })
        .map_err(io_err(path, "spawning the admin thread"))?;
    Ok(AdminServer {
        path: path.to_owned(),
        handle: Some(handle),
        stop,
    })
}

fn serve_connection(stream: UnixStream, calls: &mpsc::Sender<AdminCall>) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let mut line = String::new();
    loop {
        line.clear();
        let n = std::io::Read::take(&mut reader, MAX_REQUEST_BYTES + 1).read_line(&mut line)?;
        if n == 0 {
            break;
        }
        if n as u64 > MAX_REQUEST_BYTES {
            let reply = AdminReply::err(format!(
                "request longer than {MAX_REQUEST_BYTES} bytes refused (one JSON request per line)"
            ));
            let mut out = serde_json::to_vec(&reply).unwrap_or_default();
            out.push(b'\n');
            writer.write_all(&out)?;
            break;
        }
        let reply = match serde_json::from_str::<AdminRequest>(line.trim()) {
            Err(e) => AdminReply::err(format!("bad request: {e}")),
            Ok(request) => {
                let (tx, rx) = mpsc::channel();
                if calls.send(AdminCall { request, reply: tx }).is_err() {
                    AdminReply::err("switchd is shutting down")
                } else {
                    rx.recv_timeout(Duration::from_secs(5))
                        .unwrap_or_else(|_| AdminReply::err("switchd did not answer in 5 s"))
                }
            }
        };
        let mut out = serde_json::to_vec(&reply).unwrap_or_default();
        out.push(b'\n');
        writer.write_all(&out)?;
    }
    Ok(())
}

/// Sends one request to a running switchd and returns its reply.
pub fn request(path: &Path, req: &AdminRequest) -> Result<AdminReply, AdminError> {
    let stream = UnixStream::connect(path).map_err(|source| AdminError::Connect {
        path: path.to_owned(),
        source,
    })?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io_err(path, "set_read_timeout"))?;
    let mut w = stream.try_clone().map_err(io_err(path, "try_clone"))?;
    let mut line = serde_json::to_vec(req).map_err(|e| AdminError::BadReply(e.to_string()))?;
    line.push(b'\n');
    w.write_all(&line).map_err(io_err(path, "write"))?;
    let mut reply = String::new();
    BufReader::new(stream)
        .read_line(&mut reply)
        .map_err(io_err(path, "read"))?;
    serde_json::from_str(reply.trim()).map_err(|e| AdminError::BadReply(format!("{e}: {reply}")))
}
