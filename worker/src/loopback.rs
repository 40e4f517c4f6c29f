//! A userspace stand-in for the switch on loopback: the same `proto` job
//! table that switchd runs, behind a plain UDP socket on 127.0.0.1, one job.
//!
//! For trying the library (and the Python package and DDP hook) on one
//! machine without root or XDP, and for the tests of the worker's I/O shell.
//! Not a switch: one thread, one `recv_from` per datagram, no forwarding.
//!
//! Owns: its socket and thread; stopped and joined on drop. Invariants: it
//! only binds loopback addresses and only admits sources in 127.0.0.0/8;
//! `restart()` replaces the job table with a new generation, as a switchd
//! restart does, so workers must re-join and resend.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::switch::{
    Endpoint, Ipv4Prefix, JobConfig, JobConfigError, JobTable, Source, TableConfig,
};
use proto::wire::{Dtype, MAX_ELEMS_PER_CHUNK, SECRET_LEN};

/// The one job a [`LoopbackSwitch`] serves.
#[derive(Clone)]
pub struct LoopbackConfig {
    pub job: u16,
    pub n_workers: u16,
    pub secret: [u8; SECRET_LEN],
    /// Slots in the pool, a power of two.
    pub pool_slots: u16,
    pub elems_per_chunk: u16,
    /// Element type of the job (summed as the switch sums it: the same
    /// `proto` job table).
    pub dtype: Dtype,
    /// Drop every n-th datagram received (0: none), to exercise resends.
    pub drop_every: u64,
    /// How the job authenticates DATA and RESULT.
    pub auth: proto::tag::AuthMode,
    /// The job is `stats = true`: its RESULTs carry gradient statistics.
    pub stats: bool,
}

impl LoopbackConfig {
    pub fn new(job: u16, n_workers: u16, secret: [u8; SECRET_LEN]) -> LoopbackConfig {
        LoopbackConfig {
            job,
            n_workers,
            secret,
            pool_slots: 64,
            elems_per_chunk: 362,
            dtype: Default::default(),
            drop_every: 0,
            auth: Default::default(),
            stats: false,
        }
    }

    fn table(&self, gen: u32) -> Result<JobTable, JobConfigError> {
        let mut t = JobTable::new(TableConfig::new(gen, rand::random()), Instant::now());
        t.add(
            JobConfig {
                id: self.job,
                n_workers: self.n_workers,
                allowed_sources: vec![Ipv4Prefix {
                    addr: [127, 0, 0, 0],
                    len: 8,
                }],
                secret: self.secret,
                pool_slots: self.pool_slots,
                elems_per_chunk: self.elems_per_chunk,
                dtype: self.dtype,
                window: self.pool_slots,
                priority: Default::default(),
                auth: self.auth,
                upstream: None,
                stats: self.stats,
            },
            MAX_ELEMS_PER_CHUNK,
        )?;
        Ok(t)
    }
}

/// Room for the largest datagram of the protocol (a 9000-MTU chunk).
const DATAGRAM_MAX: usize = 9216;

/// Errors starting a [`LoopbackSwitch`].
#[derive(Debug, thiserror::Error)]
pub enum LoopbackError {
    #[error("loopback switch: {0}")]
    Job(#[from] JobConfigError),
    #[error("loopback switch: {addr} is not a loopback address (use 127.0.0.1)")]
    NotLoopback { addr: SocketAddrV4 },
    #[error("loopback switch: binding UDP {addr} failed: {source}")]
    Bind {
        addr: SocketAddrV4,
        source: io::Error,
    },
}

/// A running stand-in; stopped when dropped.
pub struct LoopbackSwitch {
    addr: SocketAddrV4,
    /// The serving socket, shared: [`LoopbackSwitch::forge`] sends from it.
    tx: UdpSocket,
    stop: Arc<AtomicBool>,
    restarts: Arc<AtomicU32>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl LoopbackSwitch {
    /// Binds `bind` (port 0: any free port) and serves `cfg` on a thread.
    pub fn start(cfg: LoopbackConfig, bind: SocketAddrV4) -> Result<Self, LoopbackError> {
        if !bind.ip().is_loopback() {
            return Err(LoopbackError::NotLoopback { addr: bind });
        }
        let first = cfg.table(1)?;
        let bind_err = |source| LoopbackError::Bind { addr: bind, source };
        let sock = UdpSocket::bind(bind).map_err(bind_err)?;
        // The serving loop checks `stop` this often.
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .map_err(bind_err)?;
        let addr = match sock.local_addr().map_err(bind_err)? {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => unreachable!("bound to an IPv4 address"),
        };
        let tx = sock.try_clone().map_err(bind_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let restarts = Arc::new(AtomicU32::new(0));
        let (st, rs) = (stop.clone(), restarts.clone());
        let handle = std::thread::Builder::new()
            .name("loopback-switch".into())
            .spawn(move || serve(sock, cfg, first, &st, &rs))
            .map_err(bind_err)?;
        Ok(LoopbackSwitch {
            addr,
            tx,
            stop,
            restarts,
            handle: Some(handle),
        })
    }

    /// Where workers send to.
    pub fn addr(&self) -> SocketAddrV4 {
        self.addr
    }

    /// Loses every job state and starts a new generation, as a switchd
    /// restart does.
    pub fn restart(&self) {
        self.restarts.fetch_add(1, Ordering::SeqCst);
    }

    /// Sends `datagram` to `to` from the switch's own address and port, as
    /// an attacker spoofing the switch would: for tests of what a worker
    /// trusts (docs/PROTOCOL.md, "Sessions").
    pub fn forge(&self, to: SocketAddrV4, datagram: &[u8]) -> io::Result<()> {
        self.tx.send_to(datagram, to).map(|_| ())
    }

    /// A handle that restarts the switch from another thread.
    pub fn restarter(&self) -> impl Fn() + Send + Sync + 'static {
        let r = self.restarts.clone();
        move || {
            r.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Drop for LoopbackSwitch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn serve(
    sock: UdpSocket,
    cfg: LoopbackConfig,
    first: JobTable,
    stop: &AtomicBool,
    restarts: &AtomicU32,
) {
    let mut table = first;
    let mut restarted = 0;
    let mut buf = vec![0u8; DATAGRAM_MAX];
    let mut out = vec![0u8; DATAGRAM_MAX];
    let mut seen = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let r = restarts.load(Ordering::SeqCst);
        if r != restarted {
            restarted = r;
            // Validated at start; the same config cannot fail now.
            if let Ok(t) = cfg.table(1 + r) {
                table = t;
            }
        }
        let Ok((len, SocketAddr::V4(from))) = sock.recv_from(&mut buf) else {
            continue;
        };
        seen += 1;
        if cfg.drop_every > 0 && seen.is_multiple_of(cfg.drop_every) {
            continue;
        }
        let ep = Endpoint {
            source: Source {
                mac: [0; 6],
                ip: from.ip().octets(),
                port: from.port(),
            },
            ..Endpoint::default()
        };
        table.handle(&buf[..len], ep, false, Instant::now());
        // The table decided every reply; a failed send is loss, which the
        // workers' timers cover.
        while let Some(r) = table.poll_reply() {
            if let Some(e) = table.encode(&r, &mut out) {
                let to = SocketAddrV4::new(Ipv4Addr::from(r.to.source.ip), r.to.source.port);
                let _ = sock.send_to(&out[..e.len], to);
            }
        }
        while table.poll_event().is_some() {}
    }
}
