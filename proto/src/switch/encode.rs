//! The replies' bytes: [`JobTable::encode`] writes a queued [`Reply`]'s
//! aggregation header and payload; [`JobTable::encode_result_head`] writes
//! only a RESULT's header and hands back its payload and token
//! ([`ResultHead`]), so that a shell copies the payload once, straight to
//! where it is sent. [`Encoded`] is what either wrote.
//!
//! Invariants:
//! * Encoding reads the table and changes nothing: a reply whose job or
//!   result is gone, or that does not fit, is `None` (the worker's resend
//!   recovers).
//! * A NACK's tag covers its header as sent, so the header is written
//!   first; a heartbeat answer lists at most [`MAX_MISSING_LISTED`] ranks.
//! * The LEAVE of a leaf job that ended with its last rank is sent as it
//!   was encoded then (the table's `departing`): the job is gone.
//! * The sizes the encoder relies on are checked at compile time.
//!
//! Layering: with the table (its methods, in a file of their own, as
//! `provisioning`); [`entry`](super::entry) calls them for what the table
//! and the data path hand back.

use super::job::ResultView;
use super::reply::{Reply, ReplyMsg};
use super::JobTable;
use crate::wire::{
    self, ChallengePayload, HeaderRepr, MsgType, NackPayload, ProvisionedPayload,
    CHALLENGE_PAYLOAD_LEN, HEADER_LEN, JOIN_ACK_PAYLOAD_LEN, NACK_PAYLOAD_LEN, PROVISIONED_CREATED,
};

/// Most ranks one heartbeat answer lists (it stays small whatever n is).
pub const MAX_MISSING_LISTED: usize = 512;

/// A reply written by [`JobTable::encode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoded {
    /// Bytes of aggregation header and payload written.
    pub len: usize,
    /// Send with CE set in the IP header (a RESULT whose sum saw congestion).
    pub ce: bool,
}

/// A RESULT's aggregation header, written by
/// [`JobTable::encode_result_head`], and what follows it.
pub struct ResultHead<'a> {
    /// The header's and the payload's bytes together.
    pub encoded: Encoded,
    /// The shadow, read-locked while this is held.
    data: ResultView<'a>,
    /// The payload's folded Internet checksum sum ([`crate::checksum`]),
    /// made when the result was.
    pub payload_sum: u16,
    /// The RESULT token, sent after the payload (docs/PROTOCOL.md, "RESULT
    /// tokens").
    pub token: crate::tag::Tag,
}

impl ResultHead<'_> {
    /// The payload (the shadow's bytes), sent after the header.
    pub fn payload(&self) -> &[u8] {
        self.data.payload()
    }
}

impl JobTable {
    /// Whether job `job`'s RESULTs carry a tag (`auth = "mac"`): they are
    /// encoded whole by [`JobTable::encode`], not by
    /// [`JobTable::encode_result_head`].
    pub fn is_tagged(&self, job: u16) -> bool {
        self.jobs
            .get(&job)
            .is_some_and(|j| j.auth() == crate::tag::AuthMode::Mac)
    }

    /// For a RESULT: writes only its aggregation header into `buf` and
    /// returns the payload that follows it (the shadow's bytes) and the
    /// token after that, so that a shell can copy the payload once,
    /// straight to where it is sent; `Encoded::len` counts all three. With
    /// it comes the payload's checksum sum, made once per result, so that a
    /// shell sums only the headers per destination. `None` for any other reply, if the header does not fit,
    /// or if the result is gone (as [`encode`]).
    ///
    /// [`encode`]: JobTable::encode
    pub fn encode_result_head(&self, r: &Reply, buf: &mut [u8]) -> Option<ResultHead<'_>> {
        let ReplyMsg::Result { seq, retx } = r.msg else {
            return None;
        };
        let job = self.jobs.get(&r.job)?;
        let hdr = job.result_header(seq, r.rank, retx, self.gen)?;
        let res = job.result_to(seq, r.rank)?;
        if res.tag.is_some() {
            // The shell copies one slice; a tagged RESULT goes through
            // `encode`.
            return None;
        }
        let token = job.result_trailer(&hdr, &res)?;
        hdr.emit_to(buf).ok()?;
        Some(ResultHead {
            encoded: Encoded {
                len: HEADER_LEN + res.payload().len() + token.len(),
                ce: res.ece,
            },
            payload_sum: res.payload_sum,
            token,
            data: res,
        })
    }

    /// Writes `r`'s aggregation header and payload into `buf`; `None` if it
    /// does not fit or its result is gone (the worker's resend recovers).
    pub fn encode(&self, r: &Reply, buf: &mut [u8]) -> Option<Encoded> {
        let gen = self.gen;
        let mut hdr = HeaderRepr::new(MsgType::Nack, r.job);
        hdr.rank = r.rank;
        hdr.gen = gen;
        let body = buf.get_mut(HEADER_LEN..)?;
        let (len, ce) = match r.msg {
            ReplyMsg::Result { seq, retx } => {
                let job = self.jobs.get(&r.job)?;
                hdr = job.result_header(seq, r.rank, retx, gen)?;
                let res = job.result_to(seq, r.rank)?;
                let n = res.payload().len();
                body.get_mut(..n)?.copy_from_slice(res.payload());
                // A mac job's tag or a port job's token.
                let t = job.result_trailer(&hdr, &res)?;
                body.get_mut(n..n + t.len())?.copy_from_slice(&t);
                (n + t.len(), res.ece)
            }
            ReplyMsg::JoinAck => {
                let job = self.jobs.get(&r.job)?;
                hdr = job.join_ack_header(r.rank, gen);
                (job.join_ack_payload(r.rank, &hdr)?.emit(body).ok()?, false)
            }
            ReplyMsg::Nack { reason, echo } => {
                // The tag covers the header as sent: write it first.
                hdr.emit_to(buf).ok()?;
                let mut nack = NackPayload::echoing(reason, echo);
                let key = self
                    .jobs
                    .get(&r.job)
                    .and_then(|j| j.session_key_for(r.rank, &r.to));
                if let (Some(key), Some(h)) = (key, buf.first_chunk::<HEADER_LEN>()) {
                    nack.tag = crate::auth::nack_tag(key, h, reason as u16, &echo);
                }
                let n = nack.emit(buf.get_mut(HEADER_LEN..)?).ok()?;
                return Some(Encoded {
                    len: HEADER_LEN + n,
                    ce: false,
                });
            }
            ReplyMsg::ProvisionRefusal {
                reason,
                detail,
                echo,
            } => {
                // No session yet: untagged.
                let nack = NackPayload {
                    detail,
                    ..NackPayload::echoing(reason, echo)
                };
                (nack.emit(body).ok()?, false)
            }
            ReplyMsg::Provisioned { nonce, created } => {
                let job = self.jobs.get(&r.job)?;
                let lease_secs = u32::try_from(job.lease()?.as_secs()).unwrap_or(u32::MAX);
                hdr.msg_type = MsgType::Provisioned;
                let p = ProvisionedPayload {
                    nonce,
                    lease_secs,
                    flags: if created { PROVISIONED_CREATED } else { 0 },
                    tag: crate::provision::provisioned_tag(
                        &job.config.secret,
                        r.job,
                        gen,
                        &nonce,
                        lease_secs,
                    ),
                };
                (p.emit(body).ok()?, false)
            }
            ReplyMsg::Challenge { .. } | ReplyMsg::ProvisionChallenge { .. } => {
                let (hello_nonce, nonce) = match r.msg {
                    ReplyMsg::Challenge { hello_nonce, nonce } => (hello_nonce, nonce),
                    ReplyMsg::ProvisionChallenge { ask_nonce, nonce } => (ask_nonce, nonce),
                    _ => return None,
                };
                hdr.msg_type = MsgType::Challenge;
                let p = ChallengePayload {
                    hello_nonce,
                    nonce,
                    observed_ip: r.to.source.ip,
                    observed_port: r.to.source.port,
                    // One lane is sent as 0, as before seq lanes.
                    seq_lanes: if self.seq_lanes > 1 {
                        self.seq_lanes
                    } else {
                        0
                    },
                };
                (p.emit(body).ok()?, false)
            }
            ReplyMsg::Missing { seq } => {
                let job = self.jobs.get(&r.job)?;
                hdr.msg_type = MsgType::Heartbeat;
                hdr.seq = seq;
                hdr.window = job.window();
                let room = body.len().min(2 * MAX_MISSING_LISTED);
                let n = job.write_missing_ranks(seq, &mut body[..room]);
                hdr.count = n as u16;
                (2 * n, false)
            }
            ReplyMsg::UpstreamWait {
                seq,
                spine,
                silent_ms,
            } => {
                let job = self.jobs.get(&r.job)?;
                let u = job.uplink()?;
                let addr = u.cfg.spines.get(spine as usize)?;
                hdr.msg_type = MsgType::Heartbeat;
                hdr.flags = wire::flags::UPSTREAM;
                hdr.seq = seq;
                hdr.window = job.window();
                let block = wire::UpstreamWaitPayload {
                    spine_ip: addr.ip,
                    spine_port: addr.port,
                    tree: spine,
                    silent_ms,
                    session: u.spines.get(spine as usize)?.state(),
                };
                let mut len = block.emit(body).ok()?;
                // The leaves the spine said this chunk waits for, if it
                // answered about this very chunk.
                let spine_seq = u.cfg.route(seq).1;
                let leaves = u.spines[spine as usize]
                    .waiting_for
                    .as_ref()
                    .filter(|(s, _)| *s == spine_seq)
                    .map_or(&[][..], |(_, l)| &l[..]);
                let n = wire::write_u16s(
                    leaves.iter().copied().take(MAX_MISSING_LISTED),
                    body.get_mut(len..)?,
                );
                len += 2 * n;
                hdr.count = n as u16;
                (len, false)
            }
            ReplyMsg::UpHeartbeat { spine, seq } => {
                let job = self.jobs.get(&r.job)?;
                let u = job.uplink()?;
                hdr = HeaderRepr::new(MsgType::Heartbeat, r.job);
                hdr.rank = u.cfg.leaf_index;
                hdr.gen = u.spines.get(spine as usize)?.joined_gen?;
                hdr.seq = seq;
                (0, false)
            }
            ReplyMsg::VersionRefusal => {
                let n = wire::emit_v1_refusal(r.job, r.rank, buf).ok()?;
                return Some(Encoded { len: n, ce: false });
            }
            ReplyMsg::OldRefusal { version, echo } => {
                let n = wire::emit_old_refusal(version, r.job, r.rank, &echo, buf).ok()?;
                return Some(Encoded { len: n, ce: false });
            }
            ReplyMsg::UpLeave { spine } if !self.jobs.contains_key(&r.job) => {
                // A provisioned leaf job that ended with its last rank.
                let kept = self.departing.get(&(r.job, spine))?;
                let at = buf.get_mut(..kept.len())?;
                at.copy_from_slice(kept);
                return Some(Encoded {
                    len: kept.len(),
                    ce: false,
                });
            }
            ReplyMsg::UpHello { spine }
            | ReplyMsg::UpProbe { spine }
            | ReplyMsg::UpJoin { spine }
            | ReplyMsg::UpLeave { spine } => {
                let job = self.jobs.get(&r.job)?;
                let s = job.uplink()?.spines.get(spine as usize)?;
                let n = if matches!(r.msg, ReplyMsg::UpProbe { .. }) {
                    let nonce = s.guard.as_ref()?.probe_nonce()?;
                    s.hs.emit_hello_with(nonce, buf).ok()?
                } else if matches!(r.msg, ReplyMsg::UpHello { .. }) {
                    s.hs.emit_hello(buf).ok()?
                } else if matches!(r.msg, ReplyMsg::UpLeave { .. }) {
                    s.hs.emit_leave(buf)?
                } else {
                    let (c, seq) = job.spine_resume(spine as usize);
                    s.hs.emit_join(c, seq, buf)?
                };
                return Some(Encoded { len: n, ce: false });
            }
            ReplyMsg::UpProvision { spine } => {
                let job = self.jobs.get(&r.job)?;
                let s = job.uplink()?.spines.get(spine as usize)?;
                let n = s.prov.as_ref()?.emit(buf)?;
                return Some(Encoded { len: n, ce: false });
            }
            ReplyMsg::UpData { spine, seq, retx } => {
                let job = self.jobs.get(&r.job)?;
                let u = job.uplink()?;
                let gen = u.spines.get(spine as usize)?.joined_gen?;
                // The values, and a stats job's trailer after them.
                let (p, len) = job.with_partial_wire(seq, |p, bytes| {
                    let at = body.get_mut(..bytes.len())?;
                    at.copy_from_slice(bytes);
                    Some((*p, bytes.len()))
                })??;
                hdr = HeaderRepr::new(MsgType::Data, r.job);
                hdr.rank = u.cfg.leaf_index;
                hdr.seq = u.cfg.route(seq).1;
                hdr.collective = p.collective;
                hdr.count = p.count;
                hdr.gen = gen;
                if retx {
                    hdr.flags |= wire::flags::RETX;
                }
                (len, p.ece)
            }
        };
        hdr.emit_to(buf).ok()?;
        Some(Encoded {
            len: HEADER_LEN + len,
            ce,
        })
    }
}

// Compile-time checks of the sizes the encoder relies on.
const _: () = assert!(NACK_PAYLOAD_LEN == 36 && CHALLENGE_PAYLOAD_LEN == 40);
const _: () = assert!(JOIN_ACK_PAYLOAD_LEN == 32);
