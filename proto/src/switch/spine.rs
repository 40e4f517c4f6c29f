//! A leaf job's spines, the table's side (docs/PROTOCOL.md, "Aggregation
//! trees"): what a spine sends a leaf job of this switch
//! ([`JobTable::on_spine_message`]: its CHALLENGE, JOIN_ACK, NACK,
//! HEARTBEAT and RESULT, and its answers to a self-provisioned job's
//! PROVISION), what the leaf queues up to a spine ([`JobTable::up`],
//! [`JobTable::up_probe`]; the LEAVE of a job that ended,
//! [`JobTable::keep_leave`]) and the events they make (a spine answering
//! again, a spine refusing the leaf).
//!
//! The leaf's state and what each message does to it are
//! [`Job`](super::Job)'s (`leaf`); these methods hand a message to its
//! job, then queue what it asks for and log what it reports. The uplink's
//! timers are [`JobTable::handle_timeout`]'s.
//!
//! Invariant: a message reaches here only from one of its job's declared
//! spines (the address and port [`JobTable::handle`] matched), and
//! anything from a spine proves it alive.
//!
//! Layering: with the table (its methods, in a file of their own, as
//! `provisioning`); above `leaf` ([`ProvisionStep`]), whose `impl Job`
//! stays below the table.

use std::time::Instant;

use super::counters::DropReason;
use super::datapath::DataOutcome;
use super::event::Event;
use super::leaf::ProvisionStep;
use super::refusal::Verdict;
use super::reply::{Pending, Reply, ReplyMsg};
use super::{enqueue, JobTable};
use crate::wire::{self, HeaderRepr, MsgType, NackPayload, HEADER_LEN};

impl JobTable {
    /// Keeps the LEAVE of leaf job `job` to spine `spine`, encoded, for
    /// [`JobTable::encode`] after the job is removed.
    pub(super) fn keep_leave(&mut self, job: u16, spine: usize) {
        let Some(s) = self
            .jobs
            .get(&job)
            .and_then(|j| j.uplink())
            .and_then(|u| u.spines.get(spine))
        else {
            return;
        };
        let mut buf = [0u8; HEADER_LEN + crate::wire::LEAVE_PAYLOAD_LEN];
        if let Some(n) = s.hs.emit_leave(&mut buf) {
            self.departing
                .insert((job, spine as u16), buf[..n].to_vec());
        }
    }

    /// Queues `msg` up to spine `spine` of job `job`.
    pub(super) fn up(&mut self, job: u16, spine: usize, msg: ReplyMsg) {
        let Some(u) = self.jobs.get(&job).and_then(|j| j.uplink()) else {
            return;
        };
        let Some(addr) = u.cfg.spines.get(spine).copied() else {
            return;
        };
        let rank = u.cfg.leaf_index;
        self.reply(addr.endpoint(), job, rank, msg);
    }

    /// A message from spine `spine` of a leaf job.
    pub(super) fn on_spine_message(
        &mut self,
        hdr: &HeaderRepr,
        head: &[u8; HEADER_LEN],
        payload: &[u8],
        spine: usize,
        ce: bool,
        now: Instant,
    ) -> Verdict {
        let job_id = hdr.job;
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Verdict::Dropped(None);
        };
        // Anything from the spine proves it alive.
        if job.heard_from_spine(spine, now) {
            if let Some(addr) = job.uplink().map(|u| u.cfg.spines[spine]) {
                self.event(Event::SpineAnswering {
                    job: job_id,
                    tree: spine as u16,
                    spine: addr,
                });
            }
        }
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Verdict::Dropped(None);
        };
        // While a self-provisioned job is provisioned on this spine, its
        // CHALLENGE, NACK and PROVISIONED answer the leaf's PROVISION.
        if matches!(
            hdr.msg_type,
            MsgType::Challenge | MsgType::Nack | MsgType::Provisioned
        ) && job.provisioning_on(spine)
        {
            return match job.on_spine_provision(spine, hdr, payload, now) {
                ProvisionStep::Ignored => Verdict::Noted,
                ProvisionStep::Progress | ProvisionStep::Provisioned => {
                    self.handle_timeout(now);
                    Verdict::Noted
                }
                ProvisionStep::Refused(why) => {
                    self.spine_refused(job_id, spine, why);
                    Verdict::Noted
                }
            };
        }
        match hdr.msg_type {
            MsgType::Heartbeat => {
                job.on_spine_heartbeat(spine, hdr, payload, now);
                Verdict::Noted
            }
            MsgType::Challenge => {
                if job.on_spine_challenge(spine, hdr, payload, now) {
                    self.up(
                        job_id,
                        spine,
                        ReplyMsg::UpJoin {
                            spine: spine as u16,
                        },
                    );
                }
                Verdict::Noted
            }
            MsgType::JoinAck => {
                let refused = job.on_spine_join_ack(spine, hdr, payload, now);
                self.spine_refused(job_id, spine, refused);
                self.handle_timeout(now);
                Verdict::Noted
            }
            MsgType::Nack => {
                if let Ok(n) = NackPayload::parse(payload) {
                    let out = job.on_spine_nack(spine, head, &n, now);
                    self.spine_refused(job_id, spine, out.refused);
                    if out.probe {
                        self.up_probe(job_id, spine);
                    }
                    if out.ours {
                        self.handle_timeout(now);
                    }
                }
                Verdict::Noted
            }
            MsgType::Result if job.spine_gen(spine) != Some(hdr.gen) => {
                if job.on_foreign_spine_result(spine, now) {
                    self.up_probe(job_id, spine);
                }
                Verdict::Dropped(Some(DropReason::StaleGeneration))
            }
            MsgType::Result => match job.on_spine_result(spine, hdr, payload, ce, now) {
                Some(seq) => {
                    if let Some(rank) = job.uplink().map(|u| u.cfg.leaf_index) {
                        let (replies, counters) = (&mut self.replies, &mut self.counters);
                        job.up_fast_retransmit(spine, hdr.seq, now, &mut |addr, msg| {
                            let to = addr.endpoint();
                            let reply = Reply {
                                to,
                                job: job_id,
                                rank,
                                msg,
                            };
                            enqueue(replies, counters, Pending::One(reply));
                        });
                    }
                    self.queue(Pending::ResultToAll {
                        job: job_id,
                        seq,
                        next_rank: 0,
                    });
                    Verdict::Data(DataOutcome::Completed { seq })
                }
                None => Verdict::Dropped(Some(DropReason::Duplicate)),
            },
            // A copy of a PROVISIONED already taken.
            MsgType::Provisioned => Verdict::Noted,
            // What only a worker sends (the caller passes none of these).
            MsgType::Data
            | MsgType::Join
            | MsgType::Leave
            | MsgType::Hello
            | MsgType::Provision => Verdict::Dropped(Some(DropReason::UnexpectedType)),
        }
    }

    /// Queues a probe (a HELLO with its guard's probe nonce) to spine `spine`.
    fn up_probe(&mut self, job: u16, spine: usize) {
        let msg = ReplyMsg::UpProbe {
            spine: spine as u16,
        };
        self.up(job, spine, msg);
    }

    /// Logs a spine's new refusal of a leaf job (once per reason).
    fn spine_refused(&mut self, job: u16, tree: usize, why: Option<wire::SpineRefusal>) {
        let Some(why) = why else {
            return;
        };
        let addr = self
            .jobs
            .get(&job)
            .and_then(|j| j.uplink())
            .map(|u| u.cfg.spines[tree]);
        if let Some(spine) = addr {
            self.event(Event::SpineRefused {
                job,
                tree: tree as u16,
                spine,
                why,
            });
        }
    }
}
