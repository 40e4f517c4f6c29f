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
//! refused and the connection closed. Each connection is served on a thread
//! of its own, so an idle or slow client never holds up another; at most
//! [`MAX_CONNECTIONS`] are open at once (one more is told so and closed), a
//! read waits at most [`READ_TIMEOUT`] and a connection lives at most
//! [`CONNECTION_DEADLINE`], so those threads are bounded in number and in
//! life.
//!
//! Supervision ([`crate::supervise`]): a panic or an unexpected return of
//! the accept loop is logged and the loop restarted on the same listener,
//! with backoff; after too many failures switchd stops and exits non-zero
//! rather than run on without its admin socket. A panic while serving one
//! connection ends only that connection's thread.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::{JobSection, TenantSection};
use crate::ratelog::LogLimiter;
use crate::stats::SwitchStats;
use crate::supervise::{self, Health, Policy};

/// Longest request line taken (a job declaration is a few hundred bytes).
pub const MAX_REQUEST_BYTES: u64 = 64 * 1024;

/// Admin connections served at once.
pub const MAX_CONNECTIONS: usize = 16;

/// Longest wait for the next bytes of a request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest an admin connection stays open.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(60);

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
    /// Change a job's worker count between collectives (docs/PROTOCOL.md,
    /// "Elastic jobs").
    ResizeJob { id: u16, n_workers: u16 },
    /// List the tenants ([`crate::tenants::TenantRow`]s).
    Tenants,
    /// Declare a tenant. Its `key_file` is an absolute path that switchd
    /// reads itself: the key never crosses the admin socket, and switchd
    /// applies its own checks (and the file's permissions) to the file, as
    /// for a `[[tenant]]` of its config.
    AddTenant { tenant: Box<TenantSection> },
    /// Remove a tenant (refused while it has jobs).
    RemoveTenant { name: String },
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

/// Work for the control thread ([`crate::control`]), with where to send
/// the answer.
pub enum AdminCall {
    /// A switchctl request, answered as JSON.
    Request {
        request: AdminRequest,
        reply: mpsc::Sender<AdminReply>,
    },
    /// Every counter, typed, for `/metrics` ([`crate::metrics`]): the
    /// control thread calls this with a fresh snapshot.
    Snapshot(Box<dyn FnOnce(SwitchStats) + Send>),
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
    health: Arc<Health>,
}

impl AdminServer {
    /// Why its supervisor gave up on it (switchd is then stopping and
    /// exits non-zero), or `None`.
    pub fn failed(&self) -> Option<String> {
        self.health.failed()
    }
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
    let health = supervise::health();
    let thread_health = health.clone();
    let calls = Arc::new(calls);
    let open = Arc::new(AtomicUsize::new(0));
    let handle = std::thread::Builder::new()
        .name("admin".into())
        .spawn(move || {
            supervise::supervise(
                "admin",
                Policy::default(),
                &thread_stop,
                &thread_health,
                || accept_loop(&listener, &calls, &open, &thread_stop),
                supervise::stop_switchd,
            )
        })
        .map_err(io_err(path, "spawning the admin thread"))?;
    Ok(AdminServer {
        path: path.to_owned(),
        handle: Some(handle),
        stop,
        health,
    })
}

/// Accepts until `stop`, handing each connection to a thread of its own.
fn accept_loop(
    listener: &UnixListener,
    calls: &Arc<mpsc::Sender<AdminCall>>,
    open: &Arc<AtomicUsize>,
    stop: &AtomicBool,
) -> Result<(), String> {
    let mut accept_log = LogLimiter::<1>::new();
    while !stop.load(Ordering::SeqCst) {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(e) => {
                if let Some(suppressed) = accept_log.check(0, Instant::now()) {
                    tracing::warn!(suppressed, "admin socket accept failed: {e}; retrying");
                }
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        if open.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            refuse_busy(stream);
            continue;
        }
        open.fetch_add(1, Ordering::SeqCst);
        let guard = OpenGuard(open.clone());
        let conn_calls = calls.clone();
        let spawned = std::thread::Builder::new()
            .name("admin-conn".into())
            .spawn(move || {
                let _guard = guard;
                if let Err(e) = serve_connection(stream, &conn_calls) {
                    tracing::debug!("admin connection: {e}");
                }
            });
        if let Err(e) = spawned {
            // The closure (and its guard) was dropped: the place is free.
            if let Some(suppressed) = accept_log.check(0, Instant::now()) {
                tracing::warn!(
                    suppressed,
                    "admin connection dropped: spawning its thread: {e}"
                );
            }
        }
    }
    Ok(())
}

/// Releases a connection's place in [`MAX_CONNECTIONS`].
struct OpenGuard(Arc<AtomicUsize>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Tells a client beyond [`MAX_CONNECTIONS`] why it is closed.
fn refuse_busy(stream: UnixStream) {
    let _ = stream.set_nonblocking(true);
    let reply = AdminReply::err(format!(
        "switchd is serving {MAX_CONNECTIONS} admin connections already; try again shortly"
    ));
    let mut out = serde_json::to_vec(&reply).unwrap_or_default();
    out.push(b'\n');
    let _ = (&stream).write_all(&out);
}

/// Reads up to `buf`'s worth, waiting at most [`READ_TIMEOUT`] and never
/// past the connection's deadline.
struct DeadlineReader {
    stream: UnixStream,
    deadline: Instant,
}

impl std::io::Read for DeadlineReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("admin connection open longer than {CONNECTION_DEADLINE:?}"),
            ));
        }
        self.stream.set_read_timeout(Some(left.min(READ_TIMEOUT)))?;
        self.stream.read(buf)
    }
}

fn serve_connection(stream: UnixStream, calls: &mpsc::Sender<AdminCall>) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(READ_TIMEOUT))?;
    let mut reader = BufReader::new(DeadlineReader {
        stream: stream.try_clone()?,
        deadline: Instant::now() + CONNECTION_DEADLINE,
    });
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
                if calls
                    .send(AdminCall::Request { request, reply: tx })
                    .is_err()
                {
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
    request_from(path, req).map(|(reply, _)| reply)
}

/// [`request`], also returning the PID of the process that answered (the
/// socket's peer credentials), so that a caller that started a switchd can
/// tell it from another one answering on the same path.
pub fn request_from(path: &Path, req: &AdminRequest) -> Result<(AdminReply, u32), AdminError> {
    let stream = UnixStream::connect(path).map_err(|source| AdminError::Connect {
        path: path.to_owned(),
        source,
    })?;
    let pid = peer_pid(&stream).map_err(io_err(path, "getsockopt(SO_PEERCRED)"))?;
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
    let reply = serde_json::from_str(reply.trim())
        .map_err(|e| AdminError::BadReply(format!("{e}: {reply}")))?;
    Ok((reply, pid))
}

/// The PID of a connected Unix socket's peer. Hand-written over libc:
/// std's `UnixStream::peer_cred` is not stable yet.
#[allow(unsafe_code)]
fn peer_pid(stream: &UnixStream) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given, and
    // the descriptor is open for the life of `stream`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.pid as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A control thread stand-in that answers every request with its name.
    fn fake_control() -> mpsc::Sender<AdminCall> {
        let (tx, rx) = mpsc::channel::<AdminCall>();
        std::thread::spawn(move || {
            while let Ok(call) = rx.recv() {
                if let AdminCall::Request { request, reply } = call {
                    let _ = reply.send(AdminReply::ok(serde_json::json!({
                        "answered": format!("{request:?}"),
                    })));
                }
            }
        });
        tx
    }

    fn socket_path(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "switchd-admin-{tag}-{}-{:x}.sock",
            std::process::id(),
            rand::random::<u32>()
        ))
    }

    #[test]
    fn tenant_requests_travel_as_one_json_line_and_carry_no_key() {
        let tenant = TenantSection {
            name: "team-a".into(),
            key_file: "/etc/aggswitch/tenants/team-a.key".into(),
            allowed_sources: vec!["198.18.0.0/24".parse().unwrap()],
            max_jobs: 2,
            max_workers_per_job: 8,
            max_pool_bytes: 1 << 20,
            dtypes: vec!["f32".into()],
            auth: vec!["port".into()],
            max_priority: "normal".into(),
            job_ids: Some([100, 199]),
            lease_secs: 30,
            pool_slots: 64,
            upstream: None,
        };
        let path = socket_path("tenant");
        let _server = serve(&path, fake_control()).unwrap();
        for (req, cmd, answered) in [
            (
                AdminRequest::AddTenant {
                    tenant: Box::new(tenant),
                },
                "add_tenant",
                "AddTenant { tenant: TenantSection { name: \"team-a\", key_file: \"/etc/aggswitch/tenants/team-a.key\"",
            ),
            (AdminRequest::Tenants, "tenants", "Tenants"),
            (
                AdminRequest::RemoveTenant {
                    name: "team-a".into(),
                },
                "remove_tenant",
                "RemoveTenant { name: \"team-a\" }",
            ),
        ] {
            let line = serde_json::to_string(&req).unwrap();
            assert!(line.contains(&format!("\"cmd\":\"{cmd}\"")), "{line}");
            let reply = request(&path, &req).unwrap();
            let got = reply.data["answered"].as_str().unwrap_or_default();
            assert!(got.starts_with(answered), "{got}");
        }
        // A typo in a request is refused, naming the field.
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(b"{\"cmd\":\"remove_tenant\",\"nmae\":\"a\"}\n")
            .unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        assert!(
            line.contains("bad request") && line.contains("name"),
            "{line}"
        );
    }

    #[test]
    fn an_idle_client_does_not_block_another() {
        let path = socket_path("idle");
        let server = serve(&path, fake_control()).unwrap();
        // Connected and silent, and one that sent half a line.
        let idle = UnixStream::connect(&path).unwrap();
        let mut half = UnixStream::connect(&path).unwrap();
        half.write_all(b"{\"cmd\":").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        let reply = request(&path, &AdminRequest::Jobs).unwrap();
        let took = t0.elapsed();
        assert!(reply.ok, "{reply:?}");
        assert_eq!(reply.data["answered"], "Jobs");
        assert!(took < Duration::from_secs(1), "answered after {took:?}");
        // The idle clients are still open (not closed to make room).
        idle.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        let r = (&idle).read(&mut b);
        assert!(
            matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "idle client was closed or answered: {r:?}"
        );
        drop(server);
        assert!(!path.exists(), "socket left behind");
    }

    #[test]
    fn clients_beyond_the_limit_are_told_and_the_rest_still_served() {
        let path = socket_path("limit");
        let _server = serve(&path, fake_control()).unwrap();
        let idle: Vec<UnixStream> = (0..MAX_CONNECTIONS)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let busy = request(&path, &AdminRequest::Jobs).unwrap();
        assert!(!busy.ok);
        let why = busy.error.unwrap_or_default();
        assert!(why.contains("try again"), "{why}");
        drop(idle);
        // Places free up as the idle clients' threads see them close.
        let t0 = Instant::now();
        loop {
            let r = request(&path, &AdminRequest::Stats { job: Some(3) }).unwrap();
            if r.ok {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "still refused: {r:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
