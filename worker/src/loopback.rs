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
use std::time::Duration;

use proto::switch::{
    DataOutcome, Endpoint, Ipv4Prefix, Job, JobConfig, JobConfigError, JobTable, JoinOutcome,
    Source, Verdict,
};
use proto::wire::{
    emit_nack, write_f32s, Header, HeaderRepr, MsgType, NackReason, HEADER_LEN,
    JOIN_ACK_PAYLOAD_LEN, MAX_ELEMS_PER_CHUNK, NACK_PAYLOAD_LEN, SECRET_LEN,
};

/// The one job a [`LoopbackSwitch`] serves.
#[derive(Clone)]
pub struct LoopbackConfig {
    pub job: u16,
    pub n_workers: u16,
    pub secret: [u8; SECRET_LEN],
    /// Slots in the pool, a power of two.
    pub pool_slots: u16,
    pub elems_per_chunk: u16,
    /// Drop every n-th datagram received (0: none), to exercise resends.
    pub drop_every: u64,
}

impl LoopbackConfig {
    pub fn new(job: u16, n_workers: u16, secret: [u8; SECRET_LEN]) -> LoopbackConfig {
        LoopbackConfig {
            job,
            n_workers,
            secret,
            pool_slots: 64,
            elems_per_chunk: 362,
            drop_every: 0,
        }
    }

    fn table(&self, gen: u32) -> Result<JobTable, JobConfigError> {
        let mut t = JobTable::new(gen);
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
                window: self.pool_slots,
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
        let stop = Arc::new(AtomicBool::new(false));
        let restarts = Arc::new(AtomicU32::new(0));
        let (st, rs) = (stop.clone(), restarts.clone());
        let handle = std::thread::Builder::new()
            .name("loopback-switch".into())
            .spawn(move || serve(sock, cfg, first, &st, &rs))
            .map_err(bind_err)?;
        Ok(LoopbackSwitch {
            addr,
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
        let Ok(h) = Header::new_checked(&buf[..len]) else {
            continue;
        };
        let Ok(hdr) = HeaderRepr::parse(&h) else {
            continue;
        };
        let ep = Endpoint {
            source: Source {
                mac: [0; 6],
                ip: from.ip().octets(),
                port: from.port(),
            },
            ..Endpoint::default()
        };
        let gen = table.gen();
        let verdict = table.handle(&hdr, h.payload(), ep, false);
        let Some(job) = table.get(cfg.job) else {
            continue;
        };
        let tx = Replier {
            sock: &sock,
            job,
            gen,
        };
        match verdict {
            Verdict::Join(JoinOutcome::Activated) => {
                for (rank, e) in job.members() {
                    tx.join_ack(rank, addr_of(e), &mut out);
                }
            }
            Verdict::Join(JoinOutcome::AckAgain) => tx.join_ack(hdr.rank, from, &mut out),
            Verdict::Data(DataOutcome::Completed { seq }) => {
                for (rank, e) in job.members() {
                    tx.result(seq, rank, addr_of(e), false, &mut out);
                }
            }
            Verdict::Data(DataOutcome::Retransmit { seq }) => {
                tx.result(seq, hdr.rank, from, true, &mut out)
            }
            Verdict::Join(JoinOutcome::Nack(reason)) | Verdict::Data(DataOutcome::Nack(reason)) => {
                tx.nack(hdr.job, hdr.rank, reason, from, &mut out)
            }
            Verdict::Heartbeat { seq } => tx.heartbeat(hdr.rank, seq, from, &mut out),
            Verdict::NackUnknownJob => {
                tx.nack(hdr.job, hdr.rank, NackReason::UnknownJob, from, &mut out)
            }
            _ => {}
        }
    }
}

fn addr_of(e: &Endpoint) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::from(e.source.ip), e.source.port)
}

/// Writes the replies a verdict implies; a failed send is loss, which the
/// workers' timers cover.
struct Replier<'a> {
    sock: &'a UdpSocket,
    job: &'a Job,
    gen: u32,
}

impl Replier<'_> {
    fn join_ack(&self, rank: u16, to: SocketAddrV4, out: &mut [u8]) {
        let emitted = self
            .job
            .join_ack_header(rank, self.gen)
            .emit_to(out)
            .is_ok()
            && self
                .job
                .join_ack_payload()
                .emit(&mut out[HEADER_LEN..])
                .is_ok();
        if emitted {
            let _ = self
                .sock
                .send_to(&out[..HEADER_LEN + JOIN_ACK_PAYLOAD_LEN], to);
        }
    }

    fn result(&self, seq: u32, rank: u16, to: SocketAddrV4, retx: bool, out: &mut [u8]) {
        let (Some(hdr), Some(res)) = (
            self.job.result_header(seq, rank, retx, self.gen),
            self.job.result(seq),
        ) else {
            return;
        };
        if hdr.emit_to(out).is_ok() {
            let n = write_f32s(res.values, &mut out[HEADER_LEN..]);
            let _ = self.sock.send_to(&out[..HEADER_LEN + n], to);
        }
    }

    /// The ranks `seq` still waits for, as switchd answers (at most 512).
    fn heartbeat(&self, rank: u16, seq: u32, to: SocketAddrV4, out: &mut [u8]) {
        let mut h = HeaderRepr::new(MsgType::Heartbeat, self.job.id());
        h.rank = rank;
        h.seq = seq;
        h.gen = self.gen;
        h.window = self.job.window();
        let n = self
            .job
            .write_missing_ranks(seq, &mut out[HEADER_LEN..HEADER_LEN + 1024]);
        h.count = n as u16;
        if h.emit_to(out).is_ok() {
            let _ = self.sock.send_to(&out[..HEADER_LEN + 2 * n], to);
        }
    }

    fn nack(&self, job: u16, rank: u16, reason: NackReason, to: SocketAddrV4, out: &mut [u8]) {
        let mut h = HeaderRepr::new(MsgType::Nack, job);
        h.rank = rank;
        h.gen = self.gen;
        if h.emit_to(out).is_ok() && emit_nack(reason, &mut out[HEADER_LEN..]).is_ok() {
            let _ = self.sock.send_to(&out[..HEADER_LEN + NACK_PAYLOAD_LEN], to);
        }
    }
}
