//! A userspace stand-in for the switch on loopback: the same entry point
//! that switchd runs (`proto::switch::entry::Switch`: the lock-free data
//! path, else the job table), behind a plain UDP socket on 127.0.0.1, one
//! declared job and any tenants (whose workers provision jobs of their
//! own, docs/PROTOCOL.md "Tenants and self-provisioned jobs").
//!
//! For trying the library (and the Python package and DDP hook) on one
//! machine without root or XDP, and for the tests of the worker's I/O shell.
//! Not a switch: one thread, one `recv_from` per datagram, no forwarding.
//!
//! Owns: its sockets (one per seq lane: ports P..P+L-1) and thread;
//! stopped and joined on drop. Replies leave from P, as switchd's, except
//! a RESULT to a member granted lane replies, which leaves from its lane's
//! port (docs/PROTOCOL.md, "Seq lanes"; the switch picks the port, this
//! shell only sends from that socket). Invariants: it
//! only binds loopback addresses and only admits sources in 127.0.0.0/8;
//! `restart()` replaces the job table with a new generation (the same
//! tenants, no provisioned jobs), as a switchd restart does, so workers
//! must re-join (or provision again) and resend. Tenants admit only
//! 127.0.0.0/8 too, whatever their `allowed_sources` said. The table's
//! timers run about every 10 ms, so a provisioned job's lease runs out
//! here as on switchd.
//!
//! Scripted restarts (tests): [`LoopbackConfig::script`] makes the
//! stand-in restart itself at an exact point of the traffic, not at a
//! timer's: when the first DATA of a chosen collective and seq arrives
//! (the new switch takes that DATA, as a real restart would), optionally
//! with fewer seq lanes or the job's statistics turned on or off, and
//! optionally after starving one rank of a collective's RESULTs from a seq
//! on (they are dropped until the restart, as if lost). It fires once.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use proto::provision::{TenantKey, TenantName};
use proto::seq::serial_offset;
use proto::switch::engine::ResultRef;
use proto::switch::entry::{encode_result, Handoff, Switch, Transmit};
use proto::switch::{
    Encoded, Endpoint, Ipv4Prefix, JobConfig, JobConfigError, JobTable, Priority, Reply, Source,
    TableConfig, TenantConfig, TenantError,
};
use proto::tag::Tag;
use proto::wire::{Dtype, Header, HeaderRepr, MsgType, MAX_ELEMS_PER_CHUNK, SECRET_LEN};

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
    /// Seq lanes (a power of two, 1..=64): DATA of seq s is taken on port
    /// P + (s mod L) too, as switchd's `seq_lanes` (docs/PROTOCOL.md, "Seq
    /// lanes"); the CHALLENGE tells workers.
    pub seq_lanes: u16,
    /// Tenants whose workers provision jobs here (see
    /// [`LoopbackConfig::tenant`]).
    pub tenants: Vec<TenantConfig>,
    /// A restart at an exact point of the traffic (None: only the
    /// [`LoopbackSwitch::restart`] calls).
    pub script: Option<ScriptedRestart>,
}

/// A restart the stand-in makes itself, once, at an exact point of the
/// traffic ([`LoopbackConfig::script`]), for tests that need the switch to
/// restart in a precise state of the ranks (docs/PROTOCOL.md, "Sessions" and
/// the resume point).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScriptedRestart {
    /// The switch restarts when the first DATA of collective `at.0` with
    /// seq `at.1` arrives (from any rank); that DATA goes to the new
    /// switch. The seq's sender keeps to its window, so at that moment
    /// every chunk of its share below `at.1` − the window is complete and
    /// its RESULTs sent.
    pub at: (u32, u32),
    /// Seq lanes after the restart (a power of two, at most the lanes the
    /// stand-in started with); None: unchanged.
    pub lanes: Option<u16>,
    /// Whether the job is `stats = true` after the restart (an operator
    /// who changed its declaration); None: unchanged.
    pub stats: Option<bool>,
    /// Until the restart (this one, or a [`LoopbackSwitch::restart`] call
    /// before it), no RESULT of this collective with a seq at or
    /// past `from_seq` reaches this rank (dropped, as if lost): a rank that
    /// lacks RESULTs of a collective that the other ranks completed.
    pub starve: Option<Starve>,
}

/// The RESULTs a [`ScriptedRestart`] keeps from one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Starve {
    /// The rank (as its DATA names it) whose RESULTs are dropped.
    pub rank: u16,
    /// The collective whose RESULTs are dropped.
    pub collective: u32,
    /// Its first seq whose RESULT is dropped; every later one too.
    pub from_seq: u32,
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
            seq_lanes: 1,
            tenants: Vec::new(),
            script: None,
        }
    }

    /// A tenant with the spec's defaults (docs/PROTOCOL.md, "Tenant
    /// settings") but `max_jobs`, every dtype and auth mode, priority up to
    /// high, job ids 32768..=65535 and sources on loopback.
    pub fn tenant(name: TenantName, key: TenantKey, max_jobs: u16) -> TenantConfig {
        TenantConfig {
            name,
            key,
            allowed_sources: vec![LOOPBACK],
            max_jobs,
            max_workers_per_job: 256,
            max_pool_bytes: 1 << 30,
            dtypes: Dtype::ALL.to_vec(),
            auth: vec![proto::tag::AuthMode::Port, proto::tag::AuthMode::Mac],
            max_priority: Priority::High,
            job_ids: (32768, 65535),
            lease: proto::switch::tenant::DEFAULT_LEASE,
            pool_slots: 64,
            upstream: None,
        }
    }

    fn table(&self, gen: u32) -> Result<JobTable, LoopbackError> {
        let mut t = JobTable::new(
            TableConfig {
                seq_lanes: self.seq_lanes,
                ..TableConfig::new(gen, rand::random())
            },
            Instant::now(),
        );
        t.add(
            JobConfig {
                id: self.job,
                n_workers: self.n_workers,
                allowed_sources: vec![LOOPBACK],
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
        for tenant in &self.tenants {
            t.add_tenant(TenantConfig {
                allowed_sources: vec![LOOPBACK],
                ..tenant.clone()
            })?;
        }
        Ok(t)
    }
}

/// The only sources a loopback stand-in admits.
const LOOPBACK: Ipv4Prefix = Ipv4Prefix {
    addr: [127, 0, 0, 0],
    len: 8,
};

/// Room for the largest datagram of the protocol (a 9000-MTU chunk).
const DATAGRAM_MAX: usize = 9216;

/// Errors starting a [`LoopbackSwitch`].
#[derive(Debug, thiserror::Error)]
pub enum LoopbackError {
    #[error("loopback switch: {0}")]
    Job(#[from] JobConfigError),
    #[error("loopback switch: {0}")]
    Tenant(#[from] TenantError),
    #[error("loopback switch: {addr} is not a loopback address (use 127.0.0.1)")]
    NotLoopback { addr: SocketAddrV4 },
    #[error("loopback switch: binding UDP {addr} failed: {source}")]
    Bind {
        addr: SocketAddrV4,
        source: io::Error,
    },
    #[error("loopback switch: seq_lanes {0} is not a power of two in 1..=64")]
    SeqLanes(u16),
    #[error(
        "loopback switch: the scripted restart's seq_lanes {lanes} is not a power of two in \
         1..={started} (the lanes it starts with: their sockets stay)"
    )]
    ScriptLanes { lanes: u16, started: u16 },
}

/// A running stand-in; stopped when dropped.
pub struct LoopbackSwitch {
    addr: SocketAddrV4,
    /// The serving socket, shared: [`LoopbackSwitch::forge`] sends from it.
    tx: UdpSocket,
    stop: Arc<AtomicBool>,
    restarts: Arc<AtomicU32>,
    /// Seq lanes after the next restart (0: as configured).
    lanes_next: Arc<AtomicU32>,
    /// Datagrams received on each lane's port.
    per_lane: Arc<[AtomicU64]>,
    /// Datagrams the lock-free data path took (no table lock).
    lock_free: Arc<AtomicU64>,
    /// RESULTs a scripted restart's starving dropped.
    starved: Arc<AtomicU64>,
    /// The declared job's joined ranks, after the last control message.
    joined: Arc<AtomicU32>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl LoopbackSwitch {
    /// Binds `bind` (port 0: any free port) and serves `cfg` on a thread.
    pub fn start(cfg: LoopbackConfig, bind: SocketAddrV4) -> Result<Self, LoopbackError> {
        if !bind.ip().is_loopback() {
            return Err(LoopbackError::NotLoopback { addr: bind });
        }
        let lanes = cfg.seq_lanes;
        if !lanes.is_power_of_two() || lanes > proto::wire::MAX_SEQ_LANES {
            return Err(LoopbackError::SeqLanes(lanes));
        }
        if let Some(l) = cfg.script.and_then(|s| s.lanes) {
            if !l.is_power_of_two() || l > lanes {
                return Err(LoopbackError::ScriptLanes {
                    lanes: l,
                    started: lanes,
                });
            }
        }
        let first = cfg.table(1)?;
        let bind_err = |source| LoopbackError::Bind { addr: bind, source };
        let socks = bind_lanes(bind, lanes).map_err(bind_err)?;
        let addr = match socks[0].local_addr().map_err(bind_err)? {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => unreachable!("bound to an IPv4 address"),
        };
        let tx = socks[0].try_clone().map_err(bind_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let restarts = Arc::new(AtomicU32::new(0));
        let lanes_next = Arc::new(AtomicU32::new(0));
        let per_lane: Arc<[AtomicU64]> = (0..lanes).map(|_| AtomicU64::new(0)).collect();
        let lock_free = Arc::new(AtomicU64::new(0));
        let starved = Arc::new(AtomicU64::new(0));
        let joined = Arc::new(AtomicU32::new(0));
        let (st, rs, ln, pl) = (
            stop.clone(),
            restarts.clone(),
            lanes_next.clone(),
            per_lane.clone(),
        );
        let counts = Counts {
            per_lane: pl,
            lock_free: lock_free.clone(),
            starved: starved.clone(),
            joined: joined.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("loopback-switch".into())
            .spawn(move || serve(&socks, cfg, first, &st, (&rs, &ln), &counts))
            .map_err(bind_err)?;
        Ok(LoopbackSwitch {
            addr,
            tx,
            stop,
            restarts,
            lanes_next,
            per_lane,
            lock_free,
            starved,
            joined,
            handle: Some(handle),
        })
    }

    /// Datagrams received so far on each seq lane's port (P, P+1, …).
    pub fn datagrams_per_lane(&self) -> Vec<u64> {
        self.per_lane
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .collect()
    }

    /// Datagrams the switch's lock-free data path took so far (DATA from
    /// the members of the active job), as switchd takes them.
    pub fn lock_free_datagrams(&self) -> u64 {
        self.lock_free.load(Ordering::SeqCst)
    }

    /// Restarts so far: those asked by [`LoopbackSwitch::restart`] and the
    /// restarters (counted when asked; the serving thread makes them
    /// within 20 ms), and the scripted one once it fired.
    pub fn restarts(&self) -> u32 {
        self.restarts.load(Ordering::SeqCst)
    }

    /// RESULTs the scripted restart's [`Starve`] kept from its rank.
    pub fn starved_results(&self) -> u64 {
        self.starved.load(Ordering::SeqCst)
    }

    /// Ranks joined to the declared job since it last went back to
    /// joining (every rank left, or a restart), as the job table counted
    /// them after the last control message it took (JOIN, LEAVE, …): a
    /// rank that left while others stay still counts.
    pub fn joined_ranks(&self) -> u16 {
        self.joined.load(Ordering::SeqCst) as u16
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

    /// A handle that restarts the switch with `lanes` seq lanes (a power of
    /// two, at most the lanes it started with: its sockets stay), as an
    /// operator who changes `seq_lanes` and restarts switchd.
    pub fn restarter_with_lanes(&self, lanes: u16) -> impl Fn() + Send + Sync + 'static {
        let (r, l) = (self.restarts.clone(), self.lanes_next.clone());
        move || {
            l.store(lanes.into(), Ordering::SeqCst);
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

/// Binds `lanes` sockets on consecutive ports from `bind`'s (port 0: the
/// first is any free port; a few tries find one whose next ports are free
/// too), nonblocking.
fn bind_lanes(bind: SocketAddrV4, lanes: u16) -> io::Result<Vec<UdpSocket>> {
    let mut last = None;
    for _ in 0..32 {
        let first = UdpSocket::bind(bind)?;
        let port = first.local_addr()?.port();
        let mut socks = vec![first];
        for l in 1..lanes {
            let at = SocketAddrV4::new(*bind.ip(), port.wrapping_add(l));
            match UdpSocket::bind(at) {
                Ok(s) => socks.push(s),
                Err(e) => {
                    last = Some(e);
                    break;
                }
            }
        }
        if socks.len() == usize::from(lanes) {
            for s in &socks {
                s.set_nonblocking(true)?;
            }
            return Ok(socks);
        }
        if bind.port() != 0 {
            break;
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrInUse)))
}

/// Waits up to 20 ms (the serving loop checks `stop` this often) until
/// one of `socks` is readable.
fn wait_any(socks: &[UdpSocket]) {
    use std::os::fd::AsRawFd;
    let mut fds: Vec<libc::pollfd> = socks
        .iter()
        .map(|s| libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `fds` is a valid array of `fds.len()` pollfds.
    unsafe {
        libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 20);
    }
}

/// The stand-in's [`Transmit`]: one thread owns the lanes' sockets;
/// every reply is encoded whole and sent to the member's address from the
/// socket of the port the switch chose (`r.to.local_port`: P, or a lane's
/// port for a granted member's RESULT). A failed send is loss, which the
/// workers' timers cover.
struct Shell<'a> {
    /// Lane l's socket, bound to port `port + l`.
    socks: &'a [UdpSocket],
    port: u16,
    out: Vec<u8>,
    /// A scripted restart's starving, until it fires: the RESULTs it
    /// drops, the addresses its rank sent DATA from, and their count.
    starve: Option<Starve>,
    starved_from: Vec<SocketAddrV4>,
    starved: &'a AtomicU64,
}

impl Shell<'_> {
    fn send(&self, r: &Reply, len: usize) {
        let to = SocketAddrV4::new(Ipv4Addr::from(r.to.source.ip), r.to.source.port);
        if self.starves(to, &self.out[..len]) {
            self.starved.fetch_add(1, Ordering::SeqCst);
            return;
        }
        let lane = usize::from(r.to.local_port.wrapping_sub(self.port));
        let sock = self.socks.get(lane).unwrap_or(&self.socks[0]);
        let _ = sock.send_to(&self.out[..len], to);
    }

    /// Whether `datagram` to `to` is a RESULT the starving drops.
    fn starves(&self, to: SocketAddrV4, datagram: &[u8]) -> bool {
        let Some(st) = self.starve else {
            return false;
        };
        if !self.starved_from.contains(&to) {
            return false;
        }
        header_of(datagram).is_some_and(|h| {
            h.msg_type == MsgType::Result
                && h.collective == st.collective
                && serial_offset(st.from_seq, h.seq) >= 0
        })
    }
}

/// The aggregation header of `datagram`, if it has a valid one.
fn header_of(datagram: &[u8]) -> Option<HeaderRepr> {
    HeaderRepr::parse(&Header::new_checked(datagram).ok()?).ok()
}

impl Transmit for Shell<'_> {
    fn route(&mut self, _: &mut Reply) -> Option<usize> {
        Some(0)
    }

    fn send_result(&mut self, r: &Reply, hdr: &HeaderRepr, res: &ResultRef<'_>, token: &Tag) {
        if let Some(e) = encode_result(hdr, res, token, &mut self.out) {
            self.send(r, e.len);
        }
    }

    fn send_reply(&mut self, r: &Reply, encode: impl FnOnce(&mut [u8]) -> Option<Encoded>) {
        if let Some(e) = encode(&mut self.out) {
            self.send(r, e.len);
        }
    }

    /// One thread: nothing is handed off.
    fn hand_off(&mut self, _: usize, _: Handoff) {}

    fn unsent(&mut self, _: &Reply) {}
}

/// What the serving thread counts for [`LoopbackSwitch`].
struct Counts {
    per_lane: Arc<[AtomicU64]>,
    lock_free: Arc<AtomicU64>,
    starved: Arc<AtomicU64>,
    joined: Arc<AtomicU32>,
}

/// How often the serving loop runs the table's timers.
const TIMERS_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// Whether `datagram` from `from` is where `s` restarts the switch (a DATA
/// of its collective and seq); a DATA of the starved
/// rank tells the shell that rank's address first.
fn scripted_point(
    s: &ScriptedRestart,
    datagram: &[u8],
    from: SocketAddrV4,
    shell: &mut Shell<'_>,
) -> bool {
    let Some(h) = header_of(datagram) else {
        return false;
    };
    if h.msg_type != MsgType::Data {
        return false;
    }
    if let Some(st) = s.starve {
        if h.rank == st.rank && !shell.starved_from.contains(&from) {
            shell.starved_from.push(from);
        }
    }
    h.collective == s.at.0 && h.seq == s.at.1
}

fn serve(
    socks: &[UdpSocket],
    mut cfg: LoopbackConfig,
    first: JobTable,
    stop: &AtomicBool,
    (restarts, lanes_next): (&AtomicU32, &AtomicU32),
    counts: &Counts,
) {
    let mut switch = Switch::new(first);
    let mut restarted = 0;
    let mut buf = vec![0u8; DATAGRAM_MAX];
    // Bound at start: the first lane's port is the service's.
    let port = socks[0].local_addr().map_or(0, |a| a.port());
    let mut script = cfg.script;
    let mut shell = Shell {
        socks,
        port,
        out: vec![0u8; DATAGRAM_MAX],
        starve: script.and_then(|s| s.starve),
        starved_from: Vec::new(),
        starved: &counts.starved,
    };
    let mut seen = 0u64;
    let mut lane = 0;
    let mut timers_at = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        // The table's timers (provisioned jobs' leases, as switchd's
        // slow path runs them), every 10 ms or so.
        let now = Instant::now();
        if now.saturating_duration_since(timers_at) >= TIMERS_EVERY {
            timers_at = now;
            switch.batch(0, now).on_timeout(&mut shell);
        }
        let r = restarts.load(Ordering::SeqCst);
        if r != restarted {
            restarted = r;
            // Any restart ends the starving, as the scripted one does.
            shell.starve = None;
            match lanes_next.load(Ordering::SeqCst) {
                l @ 1..=64 if (l as usize) <= socks.len() && l.is_power_of_two() => {
                    cfg.seq_lanes = l as u16;
                }
                _ => {}
            }
            // Validated at start; the same config cannot fail now.
            if let Ok(t) = cfg.table(1 + r) {
                switch = Switch::new(t);
                counts.joined.store(0, Ordering::SeqCst);
            }
        }
        // Each lane's socket in turn; a poll once none has anything.
        let mut got = None;
        for _ in 0..socks.len() {
            lane = (lane + 1) % socks.len();
            if let Ok((len, SocketAddr::V4(from))) = socks[lane].recv_from(&mut buf) {
                got = Some((len, from));
                break;
            }
        }
        let Some((len, from)) = got else {
            wait_any(socks);
            continue;
        };
        counts.per_lane[lane].fetch_add(1, Ordering::SeqCst);
        seen += 1;
        if cfg.drop_every > 0 && seen.is_multiple_of(cfg.drop_every) {
            continue;
        }
        if let Some(s) = script {
            if scripted_point(&s, &buf[..len], from, &mut shell) {
                // The scripted restart, before this DATA: the new switch
                // takes it. It fires once and ends the starving.
                script = None;
                shell.starve = None;
                if let Some(l) = s.lanes {
                    cfg.seq_lanes = l;
                }
                if let Some(on) = s.stats {
                    cfg.stats = on;
                }
                restarted = restarts.fetch_add(1, Ordering::SeqCst) + 1;
                if let Ok(t) = cfg.table(1 + restarted) {
                    switch = Switch::new(t);
                    counts.joined.store(0, Ordering::SeqCst);
                }
            }
        }
        // Replies come from P whichever lane's port the message came to,
        // as switchd's (its rx); a RESULT's lane port is the switch's
        // choice.
        let ep = Endpoint {
            source: Source {
                mac: [0; 6],
                ip: from.ip().octets(),
                port: from.port(),
            },
            local_port: port,
            ..Endpoint::default()
        };
        // The switch decides every reply.
        let h = switch.on_datagram(0, &buf[..len], ep, false, Instant::now(), &mut shell);
        if h.lock_free {
            counts.lock_free.fetch_add(1, Ordering::SeqCst);
        } else {
            // The table's events (the data path logs none): not kept.
            let mut table = switch.table();
            while table.poll_event().is_some() {}
            let joined = table.get(cfg.job).map_or(0, |j| j.joined_ranks());
            counts.joined.store(joined.into(), Ordering::SeqCst);
        }
    }
}
