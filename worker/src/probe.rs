//! Is the switch there? One HELLO, answered or not, without joining.
//!
//! A host path (aggswitch.torch's fallback) asks this before it starts on
//! the switch and, while it runs without the switch, at a bounded rate to
//! learn when it is back. A HELLO changes nothing at the switch (it only
//! ever answers with a CHALLENGE or a refusal, docs/PROTOCOL.md "Joining"),
//! so probing costs the switch one CHALLENGE and a running job nothing.
//!
//! A self-provisioned job may not exist at the switch (it ended when its
//! ranks left for the hosts, or the switch restarted): its probe is a
//! PROVISION ask instead, whose CHALLENGE proves the switch runs and knows
//! the tenant (and whose claim is never sent: the probe creates nothing).
//!
//! Owns: its own socket (ephemeral port, the worker's bind address), closed
//! when the probe returns. An answer counts only if it echoes the probe's
//! random nonce, so a stale or forged datagram cannot say "alive".

use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use proto::handshake::Handshake;
use proto::provisioner::{Outcome, Provisioner, PROVISION_LEN};
use proto::wire::{Header, HeaderRepr, MsgType, NackPayload, NackReason};

use crate::error::io_err;
use crate::join::join_params;
use crate::sockets::{open_socket, wait_readable};
use crate::{WorkerConfig, WorkerError};

/// How often the HELLO is resent while no answer came (a lost datagram
/// should not make a live switch look dead).
const RESEND: Duration = Duration::from_millis(200);

/// What a probe learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchAnswer {
    /// A CHALLENGE echoing the probe: the switch runs and knows the job (a
    /// self-provisioned job: the tenant); `gen` is its generation (it
    /// changes when switchd restarts).
    Alive { gen: u32 },
    /// A refusal echoing the probe (unknown job, source not allowed, rank
    /// out of range).
    Refused(NackReason),
    /// Nothing within the timeout.
    Silent,
}

/// Sends a HELLO for `cfg`'s job and rank (resent every 200 ms) and waits
/// up to `timeout` for an answer that echoes it.
pub fn probe_switch(cfg: &WorkerConfig, timeout: Duration) -> Result<SwitchAnswer, WorkerError> {
    let sw = cfg.switch;
    let mut probe_cfg = cfg.clone();
    probe_cfg.bind = cfg.bind.map(|b| std::net::SocketAddrV4::new(*b.ip(), 0));
    let sock: UdpSocket = open_socket(&probe_cfg).map_err(io_err("opening", sw))?;
    if cfg.provision.is_some() {
        return probe_provisioned(cfg, &sock, timeout);
    }
    let mut hs = Handshake::new(join_params(cfg, &sock)?, rand::random());
    let mut hello = [0u8; 128];
    let len = hs
        .emit_hello(&mut hello)
        .expect("a HELLO fits in 128 bytes");
    let deadline = Instant::now() + timeout;
    let mut next_send = Instant::now();
    let mut rx = [0u8; 2048];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(SwitchAnswer::Silent);
        }
        if now >= next_send {
            // A send error (no route yet, the link down) is a silent switch.
            let _ = sock.send(&hello[..len]);
            next_send = now + RESEND;
        }
        wait_readable(sock.as_raw_fd(), next_send.min(deadline) - now);
        while let Ok(n) = sock.recv(&mut rx) {
            if let Some(answer) = answer(&mut hs, &rx[..n], cfg) {
                return Ok(answer);
            }
        }
    }
}

/// The answer `datagram` gives to the probe, if it is one.
fn answer(hs: &mut Handshake, datagram: &[u8], cfg: &WorkerConfig) -> Option<SwitchAnswer> {
    let h = Header::new_checked(datagram).ok()?;
    let r = HeaderRepr::parse(&h).ok()?;
    if r.job != cfg.job || r.rank != cfg.rank {
        return None;
    }
    match r.msg_type {
        MsgType::Challenge => {
            hs.on_challenge(&r, h.payload()).ok()?;
            Some(SwitchAnswer::Alive { gen: r.gen })
        }
        MsgType::Nack => {
            let nack = NackPayload::parse(h.payload()).ok()?;
            hs.nack_is_ours(&nack)
                .then_some(SwitchAnswer::Refused(nack.reason))
        }
        _ => None,
    }
}

/// The probe of a self-provisioned job: a PROVISION ask (resent every
/// 200 ms); its CHALLENGE or refusal is the answer.
fn probe_provisioned(
    cfg: &WorkerConfig,
    sock: &UdpSocket,
    timeout: Duration,
) -> Result<SwitchAnswer, WorkerError> {
    let p = join_params(cfg, sock)?;
    let asker = p.asker();
    let Some(spec) = p.provision else {
        return Ok(SwitchAnswer::Silent);
    };
    let mut prov = Provisioner::new(spec, asker, rand::random());
    let start = Instant::now();
    prov.start(start);
    let deadline = start + timeout;
    let mut ask = [0u8; PROVISION_LEN];
    let mut rx = [0u8; 2048];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(SwitchAnswer::Silent);
        }
        // Only asks go: the provisioner never claims before a CHALLENGE,
        // and the probe returns at the CHALLENGE.
        if let Some(len) = prov.poll_transmit(now, &mut ask) {
            // A send error (no route yet, the link down) is a silent switch.
            let _ = sock.send(&ask[..len]);
        }
        let next = prov.poll_timeout().unwrap_or(deadline).min(deadline);
        wait_readable(sock.as_raw_fd(), next.saturating_duration_since(now));
        while let Ok(n) = sock.recv(&mut rx) {
            let Ok(h) = Header::new_checked(&rx[..n]) else {
                continue;
            };
            let Ok(r) = HeaderRepr::parse(&h) else {
                continue;
            };
            match prov.handle_parsed(&r, h.payload(), Instant::now()) {
                // The switch answered; the join will report the mismatch.
                Some(Outcome::Refused(e)) => {
                    return Ok(match e.reason() {
                        Some(reason) => SwitchAnswer::Refused(reason),
                        None => SwitchAnswer::Alive { gen: r.gen },
                    })
                }
                Some(Outcome::Provisioned { gen, .. }) => return Ok(SwitchAnswer::Alive { gen }),
                None => {}
            }
            if let Some(gen) = prov.challenged() {
                return Ok(SwitchAnswer::Alive { gen });
            }
        }
    }
}
