//! Replies the job table decided on, queued for the I/O shell to drain
//! (quinn-proto's style): the table decides who gets what, the shells
//! (switchd's dataplane, the loopback stand-in, the simulated network) only
//! pick a socket and call [`JobTable::encode`](super::JobTable::encode).
//!
//! Owns: [`Reply`] (one message to one endpoint), [`ReplyMsg`] and the
//! bounded queue of pending replies, where a RESULT or JOIN_ACK to every
//! member is one entry expanded rank by rank as it is drained.
//!
//! Invariant: every RESULT reply is made by [`Reply::result`] or
//! [`Reply::resend`], which apply the member's lane replies
//! ([`Endpoint::for_result`]): its `to.local_port` is the port it leaves
//! from. Every other reply leaves from the endpoint's `local_port`.
//!
//! Invariants: the queue never allocates after it is made (a full queue
//! drops the reply and counts it; the worker's resend recovers it); a
//! [`Reply`] is a small `Copy` value that another thread may encode later,
//! since it names the result by job and seq, and the shadow copy stays
//! until every rank has moved past that seq.

use std::collections::VecDeque;

use super::config::Endpoint;
use crate::wire::{NackReason, Nonce};

/// Replies that fit in the queue; the dataplane drains it after every
/// frame, so a handful is the most it ever holds.
pub const REPLY_QUEUE_CAPACITY: usize = 1024;

/// One message for one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub to: Endpoint,
    pub job: u16,
    pub rank: u16,
    pub msg: ReplyMsg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyMsg {
    /// The RESULT of `seq`, from the slot's shadow copy.
    Result {
        seq: u32,
        retx: bool,
    },
    JoinAck,
    Nack {
        reason: NackReason,
        echo: Nonce,
    },
    Challenge {
        hello_nonce: Nonce,
        nonce: Nonce,
    },
    /// A PROVISION ask answered (docs/PROTOCOL.md, "Tenants and
    /// self-provisioned jobs"): a CHALLENGE echoing the ask's nonce, with a
    /// provisioning nonce; the header's job is the ask's.
    ProvisionChallenge {
        ask_nonce: Nonce,
        nonce: Nonce,
    },
    /// A PROVISION refused: NACK `reason` with `detail` (the quota, for
    /// NACK 11), echoing the ask's or claim's nonce; never tagged (there is
    /// no session yet).
    ProvisionRefusal {
        reason: NackReason,
        detail: u16,
        echo: Nonce,
    },
    /// A claim answered: PROVISIONED for the reply's job, echoing the
    /// claim's switch nonce, tagged under the job's secret.
    Provisioned {
        nonce: Nonce,
        created: bool,
    },
    /// A HEARTBEAT answered with the ranks `seq` still waits for.
    Missing {
        seq: u32,
    },
    /// A leaf's HEARTBEAT answer: `seq` has every local contribution and
    /// waits for spine `spine`, silent for `silent_ms`
    /// ([`crate::wire::UpstreamWaitPayload`]).
    UpstreamWait {
        seq: u32,
        spine: u16,
        silent_ms: u32,
    },
    /// A version-1 NACK to a version-1 JOIN.
    VersionRefusal,
    /// A NACK 8 in version `version`'s layout (2 or 3) to a HELLO of that
    /// version, echoing its nonce.
    OldRefusal {
        version: u8,
        echo: Nonce,
    },
    /// A leaf's messages to spine `spine` (docs/PROTOCOL.md, "Aggregation
    /// trees"): its HELLO, its JOIN, and the partial sum of leaf seq `seq`.
    UpHello {
        spine: u16,
    },
    UpJoin {
        spine: u16,
    },
    UpData {
        spine: u16,
        seq: u32,
        retx: bool,
    },
    /// A HELLO with the probe's nonce: did spine `spine` restart?
    UpProbe {
        spine: u16,
    },
    /// Every local rank of the leaf left: it leaves the spine too.
    UpLeave {
        spine: u16,
    },
    /// A partial waits long for spine `spine`: what is its spine seq `seq`
    /// waiting for? (Also proves the spine alive.)
    UpHeartbeat {
        spine: u16,
        seq: u32,
    },
    /// A self-provisioned leaf job's PROVISION to spine `spine`: the ask or
    /// claim its provisioner has under way (docs/PROTOCOL.md, "Tenants and
    /// self-provisioned jobs", Trees).
    UpProvision {
        spine: u16,
    },
}

impl Reply {
    /// The RESULT of `seq` (a completion's, not a resend) to member `rank`
    /// of `job` at `to`, from the port its lane replies say
    /// ([`Endpoint::for_result`]).
    pub fn result(to: Endpoint, job: u16, rank: u16, seq: u32) -> Reply {
        Reply::result_msg(to, job, rank, seq, false)
    }

    /// The RESULT of `seq` sent again (`RETX`) to member `rank` of `job`
    /// at `to`, as [`Reply::result`].
    pub fn resend(to: Endpoint, job: u16, rank: u16, seq: u32) -> Reply {
        Reply::result_msg(to, job, rank, seq, true)
    }

    /// Every RESULT reply is made here: `to`'s lane replies pick the port
    /// it leaves from.
    fn result_msg(to: Endpoint, job: u16, rank: u16, seq: u32, retx: bool) -> Reply {
        Reply {
            to: to.for_result(seq),
            job,
            rank,
            msg: ReplyMsg::Result { seq, retx },
        }
    }

    /// Whether this goes up to a spine (through the uplink).
    pub fn is_upstream(&self) -> bool {
        matches!(
            self.msg,
            ReplyMsg::UpHello { .. }
                | ReplyMsg::UpProbe { .. }
                | ReplyMsg::UpJoin { .. }
                | ReplyMsg::UpData { .. }
                | ReplyMsg::UpLeave { .. }
                | ReplyMsg::UpHeartbeat { .. }
                | ReplyMsg::UpProvision { .. }
        )
    }
}

/// A queue entry: one reply, or one to every member of a job.
#[derive(Debug, Clone, Copy)]
pub(super) enum Pending {
    One(Reply),
    ResultToAll { job: u16, seq: u32, next_rank: u16 },
    JoinAckToAll { job: u16, next_rank: u16 },
}

#[derive(Debug)]
pub(super) struct ReplyQueue {
    q: VecDeque<Pending>,
}

impl ReplyQueue {
    pub fn new() -> ReplyQueue {
        ReplyQueue {
            q: VecDeque::with_capacity(REPLY_QUEUE_CAPACITY),
        }
    }

    /// Queues `p`; false (and nothing queued) when full.
    pub fn push(&mut self, p: Pending) -> bool {
        if self.q.len() >= REPLY_QUEUE_CAPACITY {
            return false;
        }
        self.q.push_back(p);
        true
    }

    pub fn front_mut(&mut self) -> Option<&mut Pending> {
        self.q.front_mut()
    }

    pub fn pop(&mut self) {
        self.q.pop_front();
    }

    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}
