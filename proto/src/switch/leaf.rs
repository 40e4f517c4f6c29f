//! A leaf job's half of [`Job`] (docs/PROTOCOL.md, "Aggregation trees"):
//! the partials of its slots, their resend timers, and what its spines
//! answer. The table calls these methods; the tree's invariants are in
//! [`super::uplink`]'s docs.
//!
//! Owns: the leaf's `impl Job` ([`Job::uplink`], [`Job::partial_ready`],
//! [`Job::on_spine_result`], [`Job::up_timeout`] and the other spine
//! handlers, a self-provisioned job's provisioning on its spines among
//! them), [`SpineNack`] (what a spine's NACK did) and [`ProvisionStep`]
//! (what a spine's answer to a PROVISION did).
//!
//! Layering: above `job` (the [`Job`] these methods extend) and `uplink`
//! (the [`Uplink`] sessions they drive). A job holds its `Uplink`, so
//! `job.rs` names `uplink.rs`; these methods were in `uplink.rs`, which made
//! the two name each other. Here they name both and nothing names them but
//! the table.

use std::time::Instant;

use crate::handshake::ProbeAnswer;
use crate::member::collective::FAST_RETRANSMIT_GAP;
use crate::provision::TenantKey;
use crate::provisioner::{Outcome, ProvisionError, ProvisionSpec};
use crate::session::{nack_meaning, NackMeaning};
use crate::tag::{AuthMode, TAG_LEN};
use crate::wire::{
    flags, HeaderRepr, MsgType, NackPayload, NackReason, SpineRefusal, UpstreamWaitPayload,
    HEADER_LEN,
};

use super::config::{SpineAddr, MAX_SPINES};
use super::counters::DropReason;
use super::job::{Job, UpTimer};
use super::reply::ReplyMsg;
use super::tenant::JobOrigin;
use super::uplink::{Uplink, SPINE_SILENT_AFTER, UPLINK_JOIN_RESEND, UP_HEARTBEAT_EVERY};

/// How many spine seqs below [`FAST_RETRANSMIT_GAP`] each spine RESULT
/// looks back at for fast retransmit: a few, so that a run of lost RESULTs
/// still finds the older partials, and the walk stays short.
const FAST_LOOKBACK: u32 = 8;

/// What a spine's NACK did to the leaf.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct SpineNack {
    /// It answered us: the session changed (rejoin or refused).
    pub ours: bool,
    /// A refusal not seen before (to be logged).
    pub refused: Option<SpineRefusal>,
    /// Unauthenticated: send the spine a probe now.
    pub probe: bool,
}

/// What a spine's answer to the leaf's PROVISION did (a self-provisioned
/// job, docs/PROTOCOL.md, "Tenants and self-provisioned jobs", Trees).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ProvisionStep {
    /// Not an answer to this round: ignored (a NACK counted as
    /// unauthenticated).
    Ignored,
    /// The round moved on (a CHALLENGE: the claim goes now; a NACK 7 or
    /// 9: a fresh ask goes now).
    Progress,
    /// The spine has the job: the HELLO goes now.
    Provisioned,
    /// The spine refused: asked again in
    /// [`REFUSED_RETRY`](super::uplink::REFUSED_RETRY); the refusal, if it
    /// is news (to be logged).
    Refused(Option<SpineRefusal>),
}

/// The spine refusal a provisioning refusal is shown as (`None`: ours, an
/// address the spine sees otherwise than the leaf's uplink is declared).
fn spine_refusal(e: &ProvisionError) -> Option<SpineRefusal> {
    match e.quota() {
        Some(q) => Some(SpineRefusal::ProvisionQuota(q)),
        None => e.reason().map(SpineRefusal::ProvisionRefused),
    }
}

// A leaf's side of the aggregation trees: the partials of its slots and its
// sessions with the spines (docs/PROTOCOL.md, "Aggregation trees").
impl Job {
    /// The leaf's spine sessions, if this job is a leaf of a tree.
    pub fn uplink(&self) -> Option<&Uplink> {
        self.uplink.as_ref()
    }

    /// The generation of the leaf's session with spine `spine` (None: not
    /// joined).
    pub fn spine_gen(&self, spine: usize) -> Option<u32> {
        self.uplink.as_ref()?.spines.get(spine)?.joined_gen
    }

    /// Runs `f` on the partial of `seq` awaiting its spine and its values.
    pub fn with_partial<R>(
        &self,
        seq: u32,
        f: impl FnOnce(&super::engine::Partial, &[f32]) -> R,
    ) -> Option<R> {
        self.core.engine.with_partial(seq, f)
    }

    /// Runs `f` on the partial of `seq` as it goes up: its float32 values
    /// (little-endian) and, in a stats job, its trailer.
    pub fn with_partial_wire<R>(
        &self,
        seq: u32,
        f: impl FnOnce(&super::engine::Partial, &[u8]) -> R,
    ) -> Option<R> {
        self.core.engine.with_partial_wire(seq, f)
    }

    /// The resume point to announce to spine `spine`: (collective, its
    /// seq) of the leaf's floor, the oldest chunk it still needs the spine
    /// for (after a spine restart, the spine resumes there, not at the
    /// job's start).
    pub fn spine_resume(&self, spine: usize) -> (u32, u32) {
        let seq = self
            .uplink
            .as_ref()
            .map_or(0, |u| u.cfg.spine_seq_from(spine, self.floor()));
        (self.floor_collective(), seq)
    }

    /// The collective of the chunk at the floor, as far as the pool knows.
    fn floor_collective(&self) -> u32 {
        let floor = self.floor();
        let engine = &self.core.engine;
        let at = engine.state_at(engine.index(floor));
        let before = engine.state_at(engine.index(floor.wrapping_sub(1)));
        at.partial
            .filter(|p| p.seq == floor)
            .map(|p| p.collective)
            .or(at.agg.filter(|a| a.seq == floor).map(|a| a.collective))
            .or(before
                .shadow
                .filter(|s| s.seq == floor.wrapping_sub(1))
                .map(|s| s.collective))
            .unwrap_or(self.resume_collective)
    }

    /// Every local rank left: leave every joined spine (the spine starts
    /// afresh once all its leaves have; a self-provisioned job there ends).
    /// Returns those spines.
    pub(super) fn leave_uplink(&mut self) -> impl Iterator<Item = usize> + use<> {
        let mut left = [false; MAX_SPINES];
        if let Some(u) = &mut self.uplink {
            for (k, s) in u.spines.iter_mut().enumerate() {
                left[k] = s.joined_gen.take().is_some();
                s.join_due = None;
                if let Some(p) = &mut s.prov {
                    // The spine's job ends with its leaves: provisioned
                    // again when the leaf's ranks are back.
                    p.stop();
                    s.provisioned = false;
                    s.provision_due = None;
                }
            }
        }
        (0..MAX_SPINES).filter(move |k| left[*k])
    }

    /// Starts joining every spine that has not answered (on activation); a
    /// self-provisioned job provisions itself there first.
    pub(super) fn start_uplink(&mut self, now: Instant) {
        let id = self.config.id;
        if let Some(u) = &mut self.uplink {
            for k in 0..u.spines.len() {
                if u.spines[k].joined_gen.is_none() {
                    u.restart(id, k, now);
                }
            }
        }
    }

    /// A self-provisioned leaf job (made by `key`'s tenant, whose
    /// `[tenant.upstream]` made it a leaf) provisions itself on every spine
    /// before joining it: under its own id, as worker `leaf_index` of
    /// `n_leaves`, f32, auth port, with its stats and priority
    /// (docs/PROTOCOL.md, "Tenants and self-provisioned jobs", Trees).
    /// `serial`: the table's nonce serial now. Nothing for a declared job
    /// or one without an uplink.
    pub(super) fn provision_uplink(&mut self, key: &TenantKey, serial: u64) {
        let JobOrigin::Provisioned { tenant, name } = self.origin() else {
            return;
        };
        let spec = ProvisionSpec {
            tenant: tenant.clone(),
            key: *key,
            job_name: name.clone(),
            auth: AuthMode::Port,
            stats: self.config.stats,
            priority: self.config.priority as u8,
        };
        let id = self.config.id;
        if let Some(u) = &mut self.uplink {
            u.provision_with(spec, id, serial);
        }
    }

    /// Whether the leaf provisions its job on spine `spine` now (a
    /// self-provisioned job without the spine's PROVISIONED for this
    /// session): the spine's CHALLENGE, NACK and PROVISIONED are the
    /// provisioner's ([`Job::on_spine_provision`]).
    pub(super) fn provisioning_on(&self, spine: usize) -> bool {
        self.uplink
            .as_ref()
            .and_then(|u| u.spines.get(spine))
            .is_some_and(|s| s.provisioning())
    }

    /// A CHALLENGE, NACK or PROVISIONED from spine `spine` while the leaf
    /// provisions its job there: the provisioner judges it by its nonces.
    /// A PROVISIONED (its tag verified under the job's derived secret, the
    /// leaf job's own) lets the HELLO go; a refusal is a spine refusal,
    /// asked again in [`REFUSED_RETRY`](super::uplink::REFUSED_RETRY).
    pub(super) fn on_spine_provision(
        &mut self,
        spine: usize,
        hdr: &HeaderRepr,
        payload: &[u8],
        now: Instant,
    ) -> ProvisionStep {
        let id = self.config.id;
        let Some(u) = self.uplink.as_mut() else {
            return ProvisionStep::Ignored;
        };
        let s = &mut u.spines[spine];
        let Some(p) = s.prov.as_mut().filter(|_| !s.provisioned) else {
            return ProvisionStep::Ignored;
        };
        let before = (p.stats().restarts, p.challenged());
        match p.handle_parsed(hdr, payload, now) {
            None if (p.stats().restarts, p.challenged()) != before => ProvisionStep::Progress,
            None => {
                if hdr.msg_type == MsgType::Nack {
                    s.counters.unauthenticated += 1;
                }
                ProvisionStep::Ignored
            }
            Some(Outcome::Provisioned { .. }) => {
                u.provisioned_by(id, spine, now);
                ProvisionStep::Provisioned
            }
            Some(Outcome::Refused(e)) => match spine_refusal(&e) {
                Some(why) => ProvisionStep::Refused(u.refused_by(id, spine, why, now)),
                None => {
                    u.retry_later(id, spine, now);
                    ProvisionStep::Refused(None)
                }
            },
        }
    }

    /// A partial is ready: it goes up now if its spine has joined (else
    /// when it does). Returns the spine to send it to now.
    pub(super) fn partial_ready(&mut self, seq: u32, now: Instant) -> Option<usize> {
        let idx = self.core.engine.index(seq);
        let u = self.uplink.as_mut()?;
        let (spine, _) = u.cfg.route(seq);
        let joined = u.spines[spine].joined_gen.is_some();
        let rto = u.rto(spine, 0);
        self.ctl.partials_sent += 1;
        if joined {
            u.spines[spine].counters.partials_sent += 1;
        }
        self.up_timers[idx] = UpTimer {
            sent_at: joined.then_some(now),
            deadline: Some(if joined { now + rto } else { now }),
            resends: 0,
            fast_resent: false,
        };
        joined.then_some(spine)
    }

    /// A CHALLENGE from spine `spine`: true when the JOIN should go now.
    pub(super) fn on_spine_challenge(
        &mut self,
        spine: usize,
        hdr: &HeaderRepr,
        payload: &[u8],
        now: Instant,
    ) -> bool {
        let id = self.config.id;
        let Some(u) = self.uplink.as_mut() else {
            return false;
        };
        let s = &mut u.spines[spine];
        if let (Some(_), Some(g)) = (s.joined_gen, s.guard.as_mut()) {
            // An answer to our probe, perhaps (docs/PROTOCOL.md, "Sessions").
            match g.on_challenge(hdr, payload) {
                ProbeAnswer::NotOurs => {}
                ProbeAnswer::SameGeneration => {
                    s.counters.spoofed_triggers += 1;
                    // A provisioned job watches whether the spine still
                    // answers its HEARTBEATs (`heartbeat_spines`).
                    s.probed_alive = s.prov.is_some();
                }
                ProbeAnswer::Restarted { .. } => {
                    // A self-provisioned job provisions again: the
                    // restarted spine may not have it.
                    s.counters.probed_restarts += 1;
                    u.restart(id, spine, now);
                }
            }
            return false;
        }
        // Only the first CHALLENGE of an attempt: a copy of the HELLO gets a
        // second one with an older or newer nonce, and switching nonces after
        // the JOIN went out would make every resend a replay.
        if s.joined_gen.is_some() || s.hs.challenged() || s.hs.on_challenge(hdr, payload).is_err() {
            return false;
        }
        s.join_due = Some(now + UPLINK_JOIN_RESEND);
        true
    }

    /// A JOIN_ACK from spine `spine`: the session is up; every partial
    /// waiting for it becomes due. Unless the spine's job has another chunk
    /// size: then it is refused (returned, to be logged once).
    pub(super) fn on_spine_join_ack(
        &mut self,
        spine: usize,
        hdr: &HeaderRepr,
        payload: &[u8],
        now: Instant,
    ) -> Option<SpineRefusal> {
        let elems = self.config.elems_per_chunk;
        let stats = self.config.stats;
        let id = self.config.id;
        let u = self.uplink.as_mut()?;
        let s = &mut u.spines[spine];
        if s.hs.gen() != Some(hdr.gen) || s.joined_gen.is_some() {
            return None;
        }
        // Only a JOIN_ACK whose tag verifies under this join's session key.
        let ack = s.hs.on_join_ack(hdr, payload).ok()?;
        if ack.auth != AuthMode::Port {
            return u.refused_by(id, spine, SpineRefusal::AuthDiffers, now);
        }
        let guard = ack.session;
        let result_key = ack.result_key;
        let ack = ack.payload;
        if ack.elems_per_chunk != elems {
            let why = SpineRefusal::ElemsDiffer {
                spine: ack.elems_per_chunk,
            };
            return u.refused_by(id, spine, why, now);
        }
        if ack.stats != u8::from(stats) {
            let why = SpineRefusal::StatsDiffer { spine: ack.stats };
            return u.refused_by(id, spine, why, now);
        }
        let s = &mut u.spines[spine];
        s.refused = None;
        s.joined_since_provision = true;
        s.joined_gen = Some(hdr.gen);
        s.guard = Some(guard);
        s.result_key = result_key;
        s.window = hdr.window.max(1);
        s.join_due = None;
        let k = u.cfg.k().max(1) as usize;
        for (i, t) in self.up_timers.iter_mut().enumerate() {
            if i % k == spine && t.deadline.is_some() {
                t.deadline = Some(now);
            }
        }
        None
    }

    /// A NACK from spine `spine` (`header`: its header bytes as received).
    /// One that answers us (it echoes our HELLO's or JOIN's nonce, or, once
    /// joined, the probe's, or its tag verifies under our session with the
    /// spine) means what it means to a worker ([`nack_meaning`]): join again
    /// now (it restarted, went back to joining, or our nonce aged), wait,
    /// ignore it, or, when it refuses the leaf, ask again in
    /// [`REFUSED_RETRY`](super::uplink::REFUSED_RETRY). Any other is
    /// ignored and counted; once joined, it makes us probe. Returns what it
    /// did ([`SpineNack`]).
    pub(super) fn on_spine_nack(
        &mut self,
        spine: usize,
        header: &[u8; HEADER_LEN],
        nack: &NackPayload,
        now: Instant,
    ) -> SpineNack {
        let id = self.config.id;
        let Some(u) = self.uplink.as_mut() else {
            return SpineNack::default();
        };
        let s = &mut u.spines[spine];
        let joined = s.joined_gen.is_some();
        let ours = s.hs.nack_is_ours(nack)
            || (joined
                && s.guard
                    .as_ref()
                    .is_some_and(|g| g.nack_is_authentic(header, nack)));
        if !ours {
            s.counters.unauthenticated += 1;
            return SpineNack {
                probe: joined && u.want_probe(id, spine, now),
                ..SpineNack::default()
            };
        }
        if nack.reason == NackReason::UnknownJob && s.prov.is_some() {
            // The spine lacks our self-provisioned job (it restarted, or
            // the job's lease ran out there): provision it again, at once
            // if the spine had it since the last round, else (it forgot the
            // job it had just made) as a refusal, a second later.
            let refused = if s.joined_since_provision {
                u.start_provision(spine, now);
                None
            } else {
                u.refused_by(id, spine, SpineRefusal::Nack(nack.reason), now)
            };
            return SpineNack {
                ours: true,
                refused,
                probe: false,
            };
        }
        // The worker's table (docs/PROTOCOL.md, "Sessions"); a refusal is
        // asked again later, as the operator may fix the declaration. A
        // restart (a stale nonce or generation while joining) provisions a
        // self-provisioned job again; a rejoin (the spine kept our session:
        // its NACK is tagged under it) does not.
        let refused = match nack_meaning(nack.reason, joined) {
            NackMeaning::Refused => u.refused_by(id, spine, SpineRefusal::Nack(nack.reason), now),
            NackMeaning::Restart => {
                u.restart(id, spine, now);
                None
            }
            NackMeaning::Rejoin => {
                u.start_join(id, spine, now);
                None
            }
            NackMeaning::Wait | NackMeaning::Ignore => None,
        };
        SpineNack {
            ours: true,
            refused,
            probe: false,
        }
    }

    /// A RESULT from spine `spine` under a generation that is not our
    /// session's: not trusted to reset anything; counted, and, once joined,
    /// a probe. Returns whether to send the probe now.
    pub(super) fn on_foreign_spine_result(&mut self, spine: usize, now: Instant) -> bool {
        let id = self.config.id;
        self.ctl_drops.bump(DropReason::StaleGeneration);
        let Some(u) = self.uplink.as_mut() else {
            return false;
        };
        let s = &mut u.spines[spine];
        s.counters.unauthenticated += 1;
        s.joined_gen.is_some() && u.want_probe(id, spine, now)
    }

    /// The spine's RESULT for spine seq `hdr.seq` (`ce`: its IP header said
    /// CE on the way down): the partial becomes the final sum. Returns the leaf seq to answer the local ranks with.
    pub(super) fn on_spine_result(
        &mut self,
        spine: usize,
        hdr: &HeaderRepr,
        payload: &[u8],
        ce: bool,
        now: Instant,
    ) -> Option<u32> {
        let u = self.uplink.as_mut()?;
        if u.spines[spine].joined_gen != Some(hdr.gen) {
            // The caller checked: only a RESULT of an unjoined spine.
            self.ctl_drops.bump(DropReason::StaleGeneration);
            return None;
        }
        // Its token, after everything else, proves the spine made it.
        let Some(at) = payload.len().checked_sub(TAG_LEN) else {
            self.ctl_drops.bump(DropReason::PayloadLength);
            return None;
        };
        let (payload, token) = payload.split_at(at);
        let authentic = u.spines[spine]
            .result_key
            .as_ref()
            .is_some_and(|k| k.verify_token(hdr, token));
        if !authentic {
            u.spines[spine].counters.bad_tokens += 1;
            self.ctl_drops.bump(DropReason::BadTag);
            return None;
        }
        let seq = u.cfg.leaf_seq(spine, hdr.seq);
        // A stats job's RESULT ends with the spine's trailer, passed on to
        // the local ranks unchanged.
        let (payload, stats) = if self.config.stats {
            let Some(at) = payload.len().checked_sub(crate::stats::STATS_LEN) else {
                self.ctl_drops.bump(DropReason::PayloadLength);
                return None;
            };
            let (values, t) = payload.split_at(at);
            match crate::stats::GradStats::parse(t) {
                Ok(s) => (values, Some(s)),
                Err(_) => {
                    self.ctl_drops.bump(DropReason::PayloadLength);
                    return None;
                }
            }
        } else {
            (payload, None)
        };
        let ece = hdr.has_flag(flags::ECE) || ce;
        if !self
            .core
            .engine
            .finish_partial_with_stats(seq, payload, stats, ece)
        {
            // A copy, or the RESULT of a partial already answered.
            self.ctl_drops.bump(DropReason::Duplicate);
            return None;
        }
        let idx = self.core.engine.index(seq);
        let t = std::mem::take(&mut self.up_timers[idx]);
        if let Some(sent) = t.sent_at {
            // Timed from the first send, resent or not. Karn's rule (no
            // samples from resent partials) left the estimate blind to a
            // queue: under one, every partial timed out, none gave a
            // sample, and the leaf resent each partial several times into
            // the very queue. From the first send a sample never
            // underestimates: it is the RTT, or the RTO plus the RTT.
            u.spines[spine]
                .rtt
                .on_sample(now.saturating_duration_since(sent));
        }
        u.spines[spine].counters.results += 1;
        self.ctl.chunks_completed += 1;
        if self.core.engine.shadow(seq).is_some_and(|s| s.ece) {
            self.ctl.ece_marked += 1;
        }
        Some(seq)
    }

    /// Fast retransmit towards spine `spine`, whose RESULT for its seq
    /// `spine_seq` just came: the partials [`FAST_RETRANSMIT_GAP`] to
    /// `FAST_RETRANSMIT_GAP + FAST_LOOKBACK` spine seqs older, still
    /// unanswered, were most likely lost on the way up or their RESULT on
    /// the way down. Each goes again now (once per partial), its timer back
    /// at the base RTO. Without this a leaf that ran ahead of the other
    /// leaves has backed its waiting partials' timers off (their spine
    /// holds them, waiting too), and a lost RESULT then stalls the whole
    /// tree for up to `max_rto`. Calls `send(spine address, message)` for
    /// each, as [`Job::up_timeout`] does.
    pub(super) fn up_fast_retransmit(
        &mut self,
        spine: usize,
        spine_seq: u32,
        now: Instant,
        send: &mut dyn FnMut(SpineAddr, ReplyMsg),
    ) {
        let Some(u) = self.uplink.as_mut() else {
            return;
        };
        let rto = u.rto(spine, 0);
        for back in FAST_RETRANSMIT_GAP..FAST_RETRANSMIT_GAP + FAST_LOOKBACK {
            let seq = u.cfg.leaf_seq(spine, spine_seq.wrapping_sub(back));
            let idx = self.core.engine.index(seq);
            let t = self.up_timers[idx];
            if t.fast_resent || t.sent_at.is_none() {
                continue;
            }
            if self
                .core
                .engine
                .state_at(idx)
                .partial
                .is_none_or(|p| p.seq != seq)
            {
                continue;
            }
            self.up_timers[idx] = UpTimer {
                deadline: Some(now + rto),
                resends: 0,
                fast_resent: true,
                ..t
            };
            self.ctl.partials_resent += 1;
            u.spines[spine].counters.partials_resent += 1;
            send(
                u.cfg.spines[spine],
                ReplyMsg::UpData {
                    spine: spine as u16,
                    seq,
                    retx: true,
                },
            );
        }
    }

    /// Anything came from spine `spine`: it is alive. True if it had been
    /// reported silent (the table logs that it answers again).
    pub(super) fn heard_from_spine(&mut self, spine: usize, now: Instant) -> bool {
        let Some(s) = self.uplink.as_mut().and_then(|u| u.spines.get_mut(spine)) else {
            return false;
        };
        s.last_heard = Some(now);
        s.silent_since.take().is_some()
    }

    /// The spine's answer to our HEARTBEAT: the leaves its seq waits for.
    pub(super) fn on_spine_heartbeat(
        &mut self,
        spine: usize,
        hdr: &HeaderRepr,
        payload: &[u8],
        now: Instant,
    ) {
        let Some(s) = self.uplink.as_mut().and_then(|u| u.spines.get_mut(spine)) else {
            return;
        };
        if s.joined_gen != Some(hdr.gen) {
            return;
        }
        s.last_answer = Some(now);
        s.probed_alive = false;
        let leaves = crate::wire::read_u16s(payload, hdr.count.into()).collect();
        s.waiting_for = Some((hdr.seq, leaves));
    }

    /// The answer to a local rank's HEARTBEAT about `seq` when `seq` has
    /// every local contribution and waits for its spine: which spine, and
    /// how long it has been silent since the partial went up.
    pub(super) fn upstream_wait(&self, seq: u32, now: Instant) -> Option<ReplyMsg> {
        let u = self.uplink.as_ref()?;
        self.core.engine.with_partial(seq, |_, _| ())?;
        let (spine, _) = u.cfg.route(seq);
        let sent = self.up_timers[self.core.engine.index(seq)].sent_at;
        let since = u.spines[spine].quiet_since(sent);
        let silent_ms = since.map_or(UpstreamWaitPayload::NEVER, |t| {
            let ms = now.saturating_duration_since(t).as_millis();
            u32::try_from(ms).unwrap_or(UpstreamWaitPayload::NEVER - 1)
        });
        Some(ReplyMsg::UpstreamWait {
            seq,
            spine: spine as u16,
            silent_ms,
        })
    }

    /// HEARTBEATs to spines whose oldest partial has waited
    /// [`UP_HEARTBEAT_EVERY`], at most one per spine that often. Returns the
    /// spines found silent for [`SPINE_SILENT_AFTER`] and not yet reported,
    /// as a bit set ([`SpineSession::silent_for`](super::uplink::SpineSession::silent_for)
    /// says how long).
    ///
    /// A spine that restarted without a self-provisioned job answers
    /// neither its partials nor its HEARTBEATs: when the last HEARTBEAT to
    /// it went unanswered, such a leaf probes it too (a HELLO; NACK 1, or a
    /// CHALLENGE under a new generation, makes it provision again), as a
    /// worker of a provisioned job does (docs/PROTOCOL.md, "Workers and
    /// restarts"). When the probe was answered under the session's
    /// generation and the HEARTBEAT after it goes unanswered too, the spine
    /// runs but no longer counts the leaf a member (it lost the job and
    /// another leaf made it again): the leaf provisions again.
    fn heartbeat_spines(&mut self, now: Instant, send: &mut dyn FnMut(SpineAddr, ReplyMsg)) -> u64 {
        let id = self.config.id;
        let Some(u) = self.uplink.as_mut() else {
            return 0;
        };
        // The oldest partial in flight to each spine: (sent at, spine seq).
        let mut oldest = [None::<(Instant, u32)>; MAX_SPINES];
        for (idx, t) in self.up_timers.iter().enumerate() {
            let (Some(sent), Some(p)) = (t.sent_at, self.core.engine.state_at(idx).partial) else {
                continue;
            };
            let (spine, spine_seq) = u.cfg.route(p.seq);
            if oldest[spine].is_none_or(|(o, _)| sent < o) {
                oldest[spine] = Some((sent, spine_seq));
            }
        }
        let mut silent = 0u64;
        let mut probe = 0u64;
        let mut lost = 0u64;
        for (spine, s) in u.spines.iter_mut().enumerate() {
            let Some((sent, spine_seq)) = oldest[spine] else {
                continue;
            };
            if now.saturating_duration_since(sent) < UP_HEARTBEAT_EVERY
                || s.last_heartbeat
                    .is_some_and(|t| now.saturating_duration_since(t) < UP_HEARTBEAT_EVERY)
            {
                continue;
            }
            let unanswered = s
                .last_heartbeat
                .is_some_and(|hb| s.last_answer.is_none_or(|a| a < hb));
            if s.prov.is_some() && unanswered {
                if s.probed_alive {
                    lost |= 1 << spine;
                } else {
                    probe |= 1 << spine;
                }
            }
            s.last_heartbeat = Some(now);
            s.counters.heartbeats_sent += 1;
            send(
                u.cfg.spines[spine],
                ReplyMsg::UpHeartbeat {
                    spine: spine as u16,
                    seq: spine_seq,
                },
            );
            let quiet_since = s.quiet_since(Some(sent)).unwrap_or(sent);
            if s.silent_since.is_none()
                && now.saturating_duration_since(quiet_since) >= SPINE_SILENT_AFTER
            {
                s.silent_since = Some(quiet_since);
                silent |= 1 << spine;
            }
        }
        for spine in (0..u.spines.len()).filter(|k| lost & (1 << k) != 0) {
            u.start_provision(spine, now);
        }
        for spine in (0..u.spines.len()).filter(|k| probe & (1 << k) != 0) {
            if u.want_probe(id, spine, now) {
                let msg = ReplyMsg::UpProbe {
                    spine: spine as u16,
                };
                send(u.cfg.spines[spine], msg);
            }
        }
        silent
    }

    /// Everything due by `now`: PROVISIONs (asks, claims) to spines that
    /// have not provisioned a self-provisioned job, HELLOs and JOINs to
    /// spines not joined, partials whose spine has not answered in time.
    /// Calls `send(spine address, message)` for each. Returns the spines
    /// newly found silent (a bit set, see `heartbeat_spines`).
    pub(super) fn up_timeout(
        &mut self,
        now: Instant,
        send: &mut dyn FnMut(SpineAddr, ReplyMsg),
    ) -> u64 {
        let Some(u) = self.uplink.as_mut() else {
            return 0;
        };
        for (spine, s) in u.spines.iter_mut().enumerate() {
            if s.provisioning() {
                let Some(p) = s.prov.as_mut() else {
                    continue;
                };
                if s.provision_due.is_some_and(|d| d <= now) {
                    s.provision_due = None;
                    s.counters.provisions += 1;
                    p.start(now);
                }
                if p.poll_due(now) {
                    let msg = ReplyMsg::UpProvision {
                        spine: spine as u16,
                    };
                    send(u.cfg.spines[spine], msg);
                }
                continue;
            }
            if s.join_due.is_some_and(|d| d <= now) {
                let spine = spine as u16;
                send(
                    u.cfg.spines[spine as usize],
                    if s.hs.challenged() {
                        ReplyMsg::UpJoin { spine }
                    } else {
                        ReplyMsg::UpHello { spine }
                    },
                );
                s.join_due = Some(now + UPLINK_JOIN_RESEND);
            }
        }
        for idx in 0..self.up_timers.len() {
            let t = self.up_timers[idx];
            if t.deadline.is_none_or(|d| d > now) {
                continue;
            }
            let Some(p) = self.core.engine.state_at(idx).partial else {
                self.up_timers[idx] = UpTimer::default();
                continue;
            };
            let (spine, _) = u.cfg.route(p.seq);
            if u.spines[spine].joined_gen.is_none() {
                continue;
            }
            let first = t.sent_at.is_none();
            let resends = if first { 0 } else { t.resends + 1 };
            self.up_timers[idx] = UpTimer {
                sent_at: t.sent_at.or(Some(now)),
                deadline: Some(now + u.rto(spine, resends)),
                resends,
                ..t
            };
            if first {
                u.spines[spine].counters.partials_sent += 1;
            } else {
                self.ctl.partials_resent += 1;
                u.spines[spine].counters.partials_resent += 1;
            }
            send(
                u.cfg.spines[spine],
                ReplyMsg::UpData {
                    spine: spine as u16,
                    seq: p.seq,
                    retx: !first,
                },
            );
        }
        // The walk over every partial, a tenth as often as it may send.
        if u.heartbeat_pass_due.is_some_and(|d| d > now) {
            return 0;
        }
        u.heartbeat_pass_due = Some(now + UP_HEARTBEAT_EVERY / 10);
        self.heartbeat_spines(now, send)
    }
}
