//! A leaf's side of an aggregation tree (docs/PROTOCOL.md, "Aggregation
//! trees"): the leaf sums its local ranks' chunk, sends that partial up to
//! the chunk's spine as an ordinary worker of the spine's job (rank = the
//! leaf's index), keeps it until the spine's RESULT returns and resends it
//! on a timer; the spine is an unchanged switch whose members are leaves.
//!
//! Owns: [`Upstream`] (what an operator declares: the leaf's index, the
//! number of leaves, the spines in tree order, the leaf's own uplink
//! address) and [`Uplink`] (per spine: the join handshake, the spine's
//! generation and window, the RTT estimate).
//!
//! Invariants:
//! * Chunk `seq` goes through spine `seq mod K` as that spine's seq
//!   `seq div K`, so every spine sees consecutive seqs and all leaves agree
//!   on the tree of every chunk without talking to each other.
//! * The sum is taken in tree order: ranks in order within a leaf, leaves in
//!   order at the spine; the result is bit-identical whatever the arrival
//!   order, retransmissions included.
//! * A partial stays in its slot until the spine's RESULT replaces it; the
//!   leaf's floor does not pass it, so its local ranks' window cannot run
//!   past what the spine has not answered.

use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::handshake::{Handshake, JoinParams};
use crate::wire::{Nonce, DTYPE_F32, NONCE_LEN, OP_SUM, SECRET_LEN};
use crate::worker::{RttEstimator, TransportConfig};

/// Most spines a job may have.
pub const MAX_SPINES: usize = 64;
/// How often an unanswered HELLO or JOIN to a spine is sent again.
pub const UPLINK_JOIN_RESEND: Duration = Duration::from_millis(200);

/// A spine's address: its aggregation address and UDP port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpineAddr {
    pub ip: [u8; 4],
    pub port: u16,
}

/// A leaf's place in the trees of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// This leaf's rank in the spines' job (leaves are summed in this order).
    pub leaf_index: u16,
    /// Leaves of the job (the spines' job has this many ranks).
    pub n_leaves: u16,
    /// The spines, in tree order: chunk seq `s` goes through `spines[s mod K]`.
    pub spines: Vec<SpineAddr>,
    /// The leaf's own address and UDP port on the uplink (the JOIN's MAC
    /// covers it; the spine must see the same).
    pub local_ip: [u8; 4],
    pub local_port: u16,
}

impl Upstream {
    pub fn k(&self) -> u32 {
        self.spines.len() as u32
    }

    /// The spine of leaf seq `seq`, and the seq it has there.
    pub fn route(&self, seq: u32) -> (usize, u32) {
        let k = self.k().max(1);
        ((seq % k) as usize, seq / k)
    }

    /// The leaf seq of seq `spine_seq` at spine `spine`.
    pub fn leaf_seq(&self, spine: usize, spine_seq: u32) -> u32 {
        spine_seq.wrapping_mul(self.k()).wrapping_add(spine as u32)
    }

    /// The first seq at spine `spine` of chunks from leaf seq `seq` on.
    pub fn spine_seq_from(&self, spine: usize, seq: u32) -> u32 {
        let k = self.k().max(1);
        let (s, r) = (seq / k, seq % k);
        if (spine as u32) < r {
            s + 1
        } else {
            s
        }
    }

    /// The index of the spine at `ip`:`port`, if it is one of ours.
    pub fn spine_at(&self, ip: [u8; 4], port: u16) -> Option<usize> {
        self.spines
            .iter()
            .position(|s| s.ip == ip && s.port == port)
    }
}

/// The leaf's session with one spine.
#[derive(Debug, Clone)]
pub struct SpineSession {
    pub hs: Handshake,
    /// Generation the spine announced in its JOIN_ACK (None: not joined).
    pub joined_gen: Option<u32>,
    /// Window the spine allows, and the RTT to it.
    pub window: u16,
    pub rtt: RttEstimator,
    /// When the HELLO or JOIN of the current attempt goes out again.
    pub join_due: Option<Instant>,
    /// Attempts so far (a counter in the hello nonce).
    attempts: u64,
}

/// Every spine session of one leaf job, and the transport tunables.
#[derive(Debug, Clone)]
pub struct Uplink {
    pub cfg: Upstream,
    pub spines: Vec<SpineSession>,
    pub transport: TransportConfig,
    /// Key of the hello nonces (derived from the switch's nonce key).
    nonce_key: [u8; 32],
}

impl Uplink {
    pub fn new(cfg: Upstream, job: u16, secret: [u8; SECRET_LEN], nonce_key: [u8; 32]) -> Uplink {
        let transport = TransportConfig::default();
        let spines = (0..cfg.spines.len())
            .map(|_| SpineSession {
                hs: Handshake::new(
                    JoinParams {
                        job,
                        rank: cfg.leaf_index,
                        n_workers: cfg.n_leaves,
                        dtype: DTYPE_F32,
                        op: OP_SUM,
                        secret,
                        ip: cfg.local_ip,
                        port: cfg.local_port,
                    },
                    [0; NONCE_LEN],
                ),
                joined_gen: None,
                window: 1,
                rtt: RttEstimator::new(&transport),
                join_due: None,
                attempts: 0,
            })
            .collect();
        Uplink {
            cfg,
            spines,
            transport,
            nonce_key,
        }
    }

    /// A hello nonce no one else can guess: HMAC of the switch's key over
    /// the job, spine and attempt (proto reads no random source).
    fn hello_nonce(&self, job: u16, spine: usize, attempt: u64) -> Nonce {
        let Ok(mut m) = <Hmac<Sha256>>::new_from_slice(&self.nonce_key) else {
            unreachable!("HMAC accepts every key length")
        };
        m.update(b"aggswitch v2 uplink hello");
        m.update(&job.to_be_bytes());
        m.update(&(spine as u32).to_be_bytes());
        m.update(&attempt.to_be_bytes());
        let full = m.finalize().into_bytes();
        let mut n = [0u8; NONCE_LEN];
        n.copy_from_slice(&full[..NONCE_LEN]);
        n
    }

    /// Starts (or restarts) joining spine `spine` now.
    pub fn start_join(&mut self, job: u16, spine: usize, now: Instant) {
        let attempt = self.spines[spine].attempts + 1;
        let nonce = self.hello_nonce(job, spine, attempt);
        let s = &mut self.spines[spine];
        s.attempts = attempt;
        s.hs.restart(nonce);
        s.joined_gen = None;
        s.join_due = Some(now);
    }

    /// Whether every spine has answered our JOIN.
    pub fn all_joined(&self) -> bool {
        self.spines.iter().all(|s| s.joined_gen.is_some())
    }

    /// The retransmission timeout towards spine `spine` after `resends`.
    pub fn rto(&self, spine: usize, resends: u32) -> Duration {
        let base = self.spines[spine].rtt.rto();
        let doublings = resends.min(self.transport.max_backoff_doublings);
        (base * 2u32.pow(doublings)).min(self.transport.max_rto)
    }
}
