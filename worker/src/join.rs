//! Joining a job, and the session's traffic on socket 0.
//!
//! Owns: [`Worker::join`](crate::Worker::join) (open socket 0, join, wait
//! until every rank has), the join round that every re-join runs again
//! (HELLO → CHALLENGE → JOIN, each repeated until answered, after a
//! PROVISION for a self-provisioned job, until a JOIN_ACK), the lane
//! sockets a JOIN_ACK grants, the choice of transport at the first HELLO
//! (the GSO probe), the control messages and the LEAVE, and the error a
//! session that cannot go on ends with. Invariant: the transport is
//! settled by the end of the first join, before any collective's batch is
//! used.

use std::io;
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use proto::handshake::JoinParams;
use proto::member::{Event as MemberEvent, Member, Shape};
use proto::session::{SessionConfig, SessionError};
use proto::wire::{MsgType, NackReason, OP_SUM};

use crate::buffers::{KeptBits, KeptInput};
use crate::error::io_err;
use crate::gso::{self, TransportKind};
use crate::mmsg::{self, DatagramBatch};
use crate::sockets::{open_socket, wait_readable};
use crate::threads::{self, LaneSockets};
use crate::{Worker, WorkerConfig, WorkerError, WorkerStats};

impl Worker {
    /// Opens the socket, joins the job and waits until every rank has joined.
    pub fn join(cfg: WorkerConfig) -> Result<Worker, WorkerError> {
        let sw = cfg.switch;
        let sock = open_socket(&cfg).map_err(io_err("opening", sw))?;
        let wants_gso = cfg.transport_kind != TransportKind::Mmsg;
        let gro = wants_gso
            && match gso::set_gro(sock.as_raw_fd(), true) {
                Ok(()) => true,
                Err(e) => {
                    Self::gso_refused(&cfg, "setsockopt(UDP_GRO)", e)?;
                    false
                }
            };
        let params = join_params(&cfg, &sock)?;
        let session_cfg = SessionConfig {
            join_timeout: cfg.join_timeout,
            stall_timeout: cfg.stall_timeout,
        };
        let mut w = Worker {
            member: Member::new(params, session_cfg, cfg.transport, rand::random()),
            sock,
            next_seq: 0,
            next_collective: 0,
            input: KeptInput::default(),
            prev_input: KeptInput::default(),
            kept_bits: KeptBits::default(),
            last_failed: false,
            prev_first_seq: 0,
            prev_collective: None,
            prev_shape: Shape::all_reduce(0),
            buf: vec![0u8; 9216],
            rx: vec![0u8; 9216],
            txb: DatagramBatch::new(mmsg::BATCH, mmsg::SLOT),
            rxb: DatagramBatch::new(mmsg::BATCH, mmsg::SLOT),
            kind: TransportKind::Mmsg,
            gro,
            probe_gso: gro,
            burst: gso::BurstLimit::default(),
            stats: WorkerStats::default(),
            data_key_spent: false,
            last_grad: None,
            rejoin_due: false,
            failed: None,
            lane_socks: LaneSockets::default(),
            lanes: Vec::new(),
            joins: 0,
            active: 1,
            cfg,
        };
        if w.wants_threads() {
            w.member.ask_lane_replies(true);
        }
        w.member.start_join(0, 0, Instant::now());
        let (c, s) = w.join_round()?;
        w.next_collective = c;
        w.next_seq = s;
        Ok(w)
    }

    /// A kernel refused `call` of the udp-gso transport with `e`: an error
    /// when it was asked for, else one warning and `Ok` (mmsg it is).
    fn gso_refused(
        cfg: &WorkerConfig,
        call: &'static str,
        e: io::Error,
    ) -> Result<(), WorkerError> {
        let (reason, fix) = gso::unavailable_hint(&e);
        if cfg.transport_kind == TransportKind::UdpGso {
            return Err(WorkerError::TransportUnavailable {
                call,
                switch: cfg.switch,
                source: e,
                reason,
                fix,
            });
        }
        tracing::warn!(
            job = cfg.job,
            rank = cfg.rank,
            "transport auto: using mmsg, not udp-gso: {call} failed: {e}: {reason}"
        );
        Ok(())
    }

    /// Sends the HELLO in `buf[..len]` as the GSO probe and settles the
    /// transport: udp-gso with its batches when the kernel took it, else
    /// mmsg (UDP_GRO off again) and the HELLO sent plainly.
    fn probe_gso(&mut self, len: usize) -> Result<(), WorkerError> {
        self.probe_gso = false;
        let fd = self.sock.as_raw_fd();
        match gso::send_probe(fd, &self.buf[..len]) {
            Ok(()) => {
                self.kind = TransportKind::UdpGso;
                self.txb = DatagramBatch::new_gso(mmsg::GSO_BATCH, mmsg::SLOT);
                self.rxb = DatagramBatch::new_gro(mmsg::GRO_BATCH);
                Ok(())
            }
            Err(e) => {
                Self::gso_refused(&self.cfg, "sendmsg(UDP_SEGMENT)", e)?;
                gso::set_gro(fd, false)
                    .map_err(io_err("setsockopt(UDP_GRO off)", self.cfg.switch))?;
                self.gro = false;
                self.send(len)
            }
        }
    }

    /// Joins (HELLO → CHALLENGE → JOIN, each repeated until answered) until
    /// a JOIN_ACK, the member having started the join; returns the resume
    /// point.
    pub(crate) fn join_round(&mut self) -> Result<(u32, u32), WorkerError> {
        loop {
            let now = Instant::now();
            if let Some(ev) = self.member.handle_timeout(now) {
                if let Some(resume) = self.on_join_event(ev)? {
                    return Ok(resume);
                }
            }
            self.send_control(now)?;
            let Some(n) = self.recv()? else {
                let until = self
                    .member
                    .poll_timeout()
                    .map_or(Duration::from_millis(50), |d| {
                        d.saturating_duration_since(now)
                    });
                wait_readable(self.sock.as_raw_fd(), until);
                continue;
            };
            if let Some(ev) = self.member.handle(&self.rx[..n], Instant::now()) {
                if let Some(resume) = self.on_join_event(ev)? {
                    return Ok(resume);
                }
            }
        }
    }

    /// What the session said while joining: the resume point once joined.
    fn on_join_event(&mut self, ev: MemberEvent) -> Result<Option<(u32, u32)>, WorkerError> {
        let j = match ev {
            MemberEvent::Joined(j) => j,
            MemberEvent::Failed(e) => return Err(self.session_failed(e)),
            MemberEvent::Provisioned {
                job,
                lease_secs,
                created,
            } => {
                // Errors and logs name the job the switch gave.
                self.cfg.job = job;
                tracing::info!(
                    job,
                    rank = self.cfg.rank,
                    lease_secs,
                    created,
                    "provisioned"
                );
                return Ok(None);
            }
            _ => return Ok(None),
        };
        // DATA of seq s to the switch's port + (s mod lanes): its NIC may
        // steer each lane to a core of its own (docs/PROTOCOL.md, "Seq
        // lanes").
        self.txb.set_lanes(self.cfg.switch, j.seq_lanes);
        self.joins += 1;
        self.set_up_lane_sockets(j.lane_replies, j.seq_lanes)?;
        tracing::debug!(
            job = self.cfg.job,
            rank = self.cfg.rank,
            gen = j.gen,
            resume_collective = j.collective,
            resume_seq = j.seq,
            "joined"
        );
        Ok(Some((j.collective, j.seq)))
    }

    /// Whether this worker asks for lane replies: it may run more than one
    /// thread (`threads` > 1, or auto on a host with a CPU to spare per
    /// rank).
    fn wants_threads(&self) -> bool {
        match self.cfg.threads {
            0 => {
                let (cpus, local) = threads::host_share();
                cpus / local >= 2
            }
            t => t > 1,
        }
    }

    /// After a JOIN_ACK: sockets 1..L open while the switch grants lane
    /// replies on L > 1 lanes (its RESULTs then come from its lane ports),
    /// none otherwise.
    fn set_up_lane_sockets(&mut self, granted: bool, seq_lanes: u16) -> Result<(), WorkerError> {
        let lanes = proto::wire::seq_lanes_from_wire(seq_lanes);
        let want = if granted { usize::from(lanes) } else { 1 };
        if self.lane_socks.lanes() == want {
            return Ok(());
        }
        if want == 1 {
            if self.wants_threads() {
                tracing::info!(
                    job = self.cfg.job,
                    rank = self.cfg.rank,
                    seq_lanes = lanes,
                    "the switch does not grant lane replies (seq_lanes 1, or an older switch): \
                     one thread carries each collective; set seq_lanes to the worker threads \
                     on the switch for more"
                );
            }
            self.lane_socks = LaneSockets::default();
            return Ok(());
        }
        let local = match self
            .sock
            .local_addr()
            .map_err(io_err("getsockname", self.cfg.switch))?
        {
            std::net::SocketAddr::V4(a) => a,
            std::net::SocketAddr::V6(_) => SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0),
        };
        self.lane_socks = LaneSockets::open(local, self.cfg.switch, lanes, self.gro)?;
        Ok(())
    }

    /// Sends the control messages the session has now (HELLO, JOIN, probe,
    /// HEARTBEAT); the join's first HELLO is the GSO probe.
    pub(crate) fn send_control(&mut self, now: Instant) -> Result<(), WorkerError> {
        while let Some(t) = self.member.poll_control(now) {
            let len = t.bytes().len();
            self.buf[..len].copy_from_slice(t.bytes());
            if self.probe_gso && t.msg_type == MsgType::Hello && !t.probe {
                self.probe_gso(len)?;
            } else {
                self.send(len)?;
            }
        }
        Ok(())
    }

    fn send(&self, len: usize) -> Result<(), WorkerError> {
        match self.sock.send(&self.buf[..len]) {
            Ok(_) => Ok(()),
            // A full socket buffer or an ICMP error is loss: the resend timer
            // covers it.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::ConnectionRefused
                ) || e.raw_os_error() == Some(libc::ENOBUFS) =>
            {
                Ok(())
            }
            Err(e) => Err(io_err("send", self.cfg.switch)(e)),
        }
    }

    /// Receives one datagram into `self.rx` (with UDP_GRO on: the first of
    /// a coalesced buffer, the rest are dropped like lost datagrams); None
    /// when nothing is waiting.
    pub(crate) fn recv(&mut self) -> Result<Option<usize>, WorkerError> {
        let got = if self.gro {
            gso::recv_first(self.sock.as_raw_fd(), &mut self.rx)
        } else {
            self.sock.recv(&mut self.rx)
        };
        match got {
            Ok(n) => Ok(Some(n)),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::ConnectionRefused
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(io_err("recv", self.cfg.switch)(e)),
        }
    }

    /// The error of a session that cannot go on.
    pub(crate) fn session_failed(&self, e: SessionError) -> WorkerError {
        let (job, rank) = (self.cfg.job, self.cfg.rank);
        match e {
            SessionError::Refused(reason) => self.refused(reason),
            SessionError::Handshake(source) => WorkerError::Handshake { job, rank, source },
            SessionError::JoinAck(source) => WorkerError::JoinAck { job, rank, source },
            SessionError::BadJoinAck { elems, slots } => {
                WorkerError::BadJoinAck { job, elems, slots }
            }
            SessionError::UnknownStats(value) => WorkerError::UnknownStats { job, rank, value },
            SessionError::JoinTimeout(waited) => WorkerError::JoinTimeout {
                job,
                rank,
                n: self.cfg.n_workers,
                switch: self.cfg.switch,
                waited,
            },
            SessionError::Provision(refusal) => WorkerError::Provision { rank, refusal },
            SessionError::ProvisionedJobVanishes { rounds } => {
                WorkerError::ProvisionedJobVanishes { job, rank, rounds }
            }
        }
    }

    fn refused(&self, reason: NackReason) -> WorkerError {
        WorkerError::Refused {
            job: self.cfg.job,
            rank: self.cfg.rank,
            reason,
            n_workers: self.cfg.n_workers,
            dtype: self.cfg.dtype,
        }
    }

    /// Tells the switch this rank is done (best effort; the LEAVE carries a
    /// MAC over the accepted JOIN's nonce, so nobody else can send it).
    pub fn leave(mut self) -> Result<(), WorkerError> {
        match self.member.emit_leave(&mut self.buf) {
            Some(len) => self.send(len),
            None => Ok(()),
        }
    }

    /// [`Worker::leave`] for a member whose job goes on without the switch,
    /// on the host path: the LEAVE says so (`LEAVE_FOR_HOSTS`), and a switch
    /// that is still alive counts it (`members_left_for_hosts`).
    pub fn leave_for_hosts(mut self) -> Result<(), WorkerError> {
        match self.member.emit_leave_for_hosts(&mut self.buf) {
            Some(len) => self.send(len),
            None => Ok(()),
        }
    }
}

/// What `cfg`'s worker joins with from `sock`: its job and rank, and the
/// address and port the socket is bound to (the JOIN's MAC covers them).
pub(crate) fn join_params(cfg: &WorkerConfig, sock: &UdpSocket) -> Result<JoinParams, WorkerError> {
    let local = match sock
        .local_addr()
        .map_err(io_err("getsockname", cfg.switch))?
    {
        std::net::SocketAddr::V4(a) => a,
        std::net::SocketAddr::V6(_) => SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0),
    };
    Ok(JoinParams {
        job: cfg.job,
        rank: cfg.rank,
        n_workers: cfg.n_workers,
        dtype: cfg.dtype as u8,
        op: OP_SUM,
        secret: cfg.secret,
        ip: local.ip().octets(),
        port: local.port(),
        provision: cfg.provision.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel that refuses UDP GSO: a forced udp-gso is an error naming
    /// the call and the fix; auto goes on (with mmsg).
    #[test]
    fn a_refused_gso_fails_a_forced_udp_gso_and_lets_auto_fall_back() {
        let mut cfg = WorkerConfig::new("198.18.0.1:48879".parse().unwrap(), 1, 0, 2, [0; 32]);
        let eio = || io::Error::from_raw_os_error(libc::EIO);
        cfg.transport_kind = TransportKind::UdpGso;
        let e = Worker::gso_refused(&cfg, "sendmsg(UDP_SEGMENT)", eio())
            .expect_err("forced udp-gso cannot fall back")
            .to_string();
        for want in [
            "sendmsg(UDP_SEGMENT) failed",
            "198.18.0.1:48879",
            "transport \"udp-gso\" cannot work here",
            "transmit checksum offload off",
            "ethtool -K DEV tx on",
        ] {
            assert!(e.contains(want), "{want:?} missing from: {e}");
        }
        let old = Worker::gso_refused(
            &cfg,
            "setsockopt(UDP_GRO)",
            io::Error::from_raw_os_error(libc::ENOPROTOOPT),
        )
        .expect_err("forced udp-gso cannot fall back")
        .to_string();
        assert!(old.contains("lacks UDP GSO/GRO"), "{old}");
        cfg.transport_kind = TransportKind::Auto;
        assert!(Worker::gso_refused(&cfg, "sendmsg(UDP_SEGMENT)", eio()).is_ok());
    }
}
