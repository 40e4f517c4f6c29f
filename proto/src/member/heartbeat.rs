//! What a HEARTBEAT answer says a stalled seq waits for: [`Waiting`] (the
//! ranks whose contributions are missing, or, from a leaf switch, the
//! spine it waits for: [`SpineWait`]; docs/PROTOCOL.md, "Sessions" and
//! "Aggregation trees").
//!
//! Invariants: decoding never fails: a malformed spine block reads as "no
//! rank missing" (the header's length check already guarantees the block
//! of an accepted answer); the ranks listed are at most `count`.

use std::net::SocketAddrV4;
use std::time::Duration;

use crate::wire::{
    flags, read_u16s, HeaderRepr, SpineRefusal, SpineSessionState, UpstreamWaitPayload,
    UPSTREAM_WAIT_LEN,
};

/// A leaf switch's answer to a stalled chunk: it has every local
/// contribution and waits for its spine (docs/PROTOCOL.md, "Aggregation
/// trees").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpineWait {
    /// The spine's aggregation address.
    pub spine: SocketAddrV4,
    /// Its index in the job's spines (the tree).
    pub tree: u16,
    /// How long the spine had been silent towards the leaf (None: never
    /// heard from).
    pub silent_for: Option<Duration>,
    /// The leaves the spine said the chunk waits for.
    pub leaves: Vec<u16>,
    /// The spine refuses the leaf: the tree is declared inconsistently.
    pub refused: Option<SpineRefusal>,
}

/// A HEARTBEAT answer: what a stalled seq waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// These ranks' contributions (none: the switch has them all).
    Ranks(Vec<u16>),
    /// A spine, says the leaf switch.
    Spine(SpineWait),
}

impl Waiting {
    /// Decodes the answer with header `r` and body `payload` (what
    /// `session::Event::Waiting` points at).
    pub fn parse(r: &HeaderRepr, payload: &[u8]) -> Waiting {
        let u16s = |b: &[u8]| read_u16s(b, r.count.into()).collect();
        if !r.has_flag(flags::UPSTREAM) {
            return Waiting::Ranks(u16s(payload));
        }
        let Ok(w) = UpstreamWaitPayload::parse(payload) else {
            return Waiting::Ranks(Vec::new());
        };
        Waiting::Spine(SpineWait {
            spine: SocketAddrV4::new(w.spine_ip.into(), w.spine_port),
            tree: w.tree,
            silent_for: (w.silent_ms != UpstreamWaitPayload::NEVER)
                .then(|| Duration::from_millis(w.silent_ms.into())),
            leaves: u16s(payload.get(UPSTREAM_WAIT_LEN..).unwrap_or(&[])),
            refused: match w.session {
                SpineSessionState::Refused(r) => Some(r),
                _ => None,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{MsgType, NackReason};

    fn answer(flags: u8, count: u16, payload: &[u8]) -> Waiting {
        let mut h = HeaderRepr::new(MsgType::Heartbeat, 1);
        h.flags = flags;
        h.count = count;
        Waiting::parse(&h, payload)
    }

    #[test]
    fn an_answer_names_the_missing_ranks_or_the_spine() {
        assert_eq!(answer(0, 2, &[0, 1, 0, 4]), Waiting::Ranks(vec![1, 4]));
        let mut p = vec![0u8; UPSTREAM_WAIT_LEN];
        UpstreamWaitPayload {
            spine_ip: [198, 19, 255, 2],
            spine_port: 48879,
            tree: 1,
            silent_ms: 4200,
            session: SpineSessionState::Refused(SpineRefusal::Nack(NackReason::BadSecret)),
        }
        .emit(&mut p)
        .unwrap();
        p.extend([0u8, 3]);
        assert_eq!(
            answer(flags::UPSTREAM, 1, &p),
            Waiting::Spine(SpineWait {
                spine: "198.19.255.2:48879".parse().unwrap(),
                tree: 1,
                silent_for: Some(Duration::from_millis(4200)),
                leaves: vec![3],
                refused: Some(SpineRefusal::Nack(NackReason::BadSecret)),
            })
        );
        // A truncated spine block: nothing missing, no panic.
        assert_eq!(answer(flags::UPSTREAM, 0, &[1, 2]), Waiting::Ranks(vec![]));
    }
}
