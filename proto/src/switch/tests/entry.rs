//! The one entry point ([`crate::switch::entry::Switch`]): DATA of an
//! active job takes the lock-free path; a completion's RESULT goes to every
//! member once, from the thread that owns its socket (one hand-off per
//! other thread, or one per member where the shell says so); a resend goes
//! to its sender alone; every RESULT is the bytes the table encodes for it.

use super::*;
use crate::switch::engine::ResultRef;
use crate::switch::entry::{encode_result, Handoff, Switch, Transmit};
use crate::tag::Tag;
use crate::wire::flags;

/// A test shell: rank r's socket belongs to thread `r mod threads`; what
/// each thread sent, and the hand-offs, recorded in order.
pub(super) struct Shell {
    pub(super) me: usize,
    pub(super) threads: usize,
    pub(super) seq_hand_offs: bool,
    /// (sending thread, reply, bytes).
    pub(super) sent: Vec<(usize, Reply, Vec<u8>)>,
    pub(super) handoffs: Vec<(usize, Handoff)>,
    pub(super) unsent: usize,
}

impl Shell {
    pub(super) fn new(me: usize, threads: usize) -> Shell {
        Shell {
            me,
            threads,
            seq_hand_offs: true,
            sent: Vec::new(),
            handoffs: Vec::new(),
            unsent: 0,
        }
    }
}

impl Transmit for Shell {
    fn route(&mut self, r: &mut Reply) -> Option<usize> {
        Some(usize::from(r.rank) % self.threads)
    }

    fn hands_off_seqs(&self) -> bool {
        self.seq_hand_offs
    }

    fn send_result(&mut self, r: &Reply, hdr: &HeaderRepr, res: &ResultRef<'_>, token: &Tag) {
        let mut buf = [0u8; 2048];
        let e = encode_result(hdr, res, token, &mut buf).expect("fits");
        self.sent.push((self.me, *r, buf[..e.len].to_vec()));
    }

    fn send_reply(&mut self, r: &Reply, encode: impl FnOnce(&mut [u8]) -> Option<Encoded>) {
        let mut buf = [0u8; 2048];
        let e = encode(&mut buf).expect("fits");
        self.sent.push((self.me, *r, buf[..e.len].to_vec()));
    }

    fn hand_off(&mut self, thread: usize, h: Handoff) {
        self.handoffs.push((thread, h));
    }

    fn unsent(&mut self, _: &Reply) {
        self.unsent += 1;
    }
}

/// Rank `rank`'s DATA of `seq` (job 5, one element).
pub(super) fn data_bytes(rank: u16, seq: u32) -> Vec<u8> {
    let (h, p) = data_message(rank, seq, &[1.0 + f32::from(rank)], GEN);
    frame(&h, &p)
}

/// Every reply in `sent` is the very bytes the table encodes for it.
pub(super) fn encoded_as_the_table_does(s: &Switch, sent: &[(usize, Reply, Vec<u8>)]) {
    let t = s.table();
    for (_, r, bytes) in sent {
        let mut buf = [0u8; 2048];
        let e = t.encode(r, &mut buf).expect("encodes");
        assert_eq!(&buf[..e.len], &bytes[..], "{r:?}");
    }
}

#[test]
fn a_fan_out_goes_to_each_member_once_from_its_socket_s_thread() {
    let s = Switch::new(active_table(4, 4, 8));
    // Ranks 0..3 arrive on thread 0; the last completes the seq.
    let mut on0 = Shell::new(0, 2);
    let mut batch = s.batch(0, t0());
    for rank in 0..4 {
        let h = batch.on_datagram(&data_bytes(rank, 0), endpoint(rank), false, &mut on0);
        assert!(h.lock_free, "rank {rank}'s DATA took the table's lock");
        let want = if rank == 3 {
            DataOutcome::Completed { seq: 0 }
        } else {
            DataOutcome::Taken
        };
        assert_eq!(h.verdict, Verdict::Data(want));
    }
    assert!(!batch.holds_table(), "DATA alone never locks the table");
    drop(batch);
    // Thread 0 sent to its own ranks and handed the seq once to thread 1.
    let ranks: Vec<u16> = on0.sent.iter().map(|(_, r, _)| r.rank).collect();
    assert_eq!(ranks, [0, 2]);
    assert_eq!(on0.handoffs, [(1, Handoff::Results { job: 5, seq: 0 })]);
    let mut on1 = Shell::new(1, 2);
    let mut batch = s.batch(1, t0());
    for (t, h) in on0.handoffs.drain(..) {
        assert_eq!(t, 1);
        batch.on_handoff(h, &mut on1);
    }
    drop(batch);
    let ranks: Vec<u16> = on1.sent.iter().map(|(_, r, _)| r.rank).collect();
    assert_eq!(ranks, [1, 3]);
    assert!(on1.handoffs.is_empty() && on0.unsent + on1.unsent == 0);
    encoded_as_the_table_does(&s, &on0.sent);
    encoded_as_the_table_does(&s, &on1.sent);
    for (_, r, bytes) in on0.sent.iter().chain(&on1.sent) {
        let h = HeaderRepr::parse(&crate::wire::Header::new_checked(&bytes[..]).unwrap());
        let h = h.unwrap();
        assert_eq!((h.msg_type, h.rank, h.seq), (MsgType::Result, r.rank, 0));
        assert_eq!(r.to, endpoint(r.rank));
    }
    // Counted once per member, on the table's counters too.
    let t = s.table();
    assert_eq!(t.get(5).unwrap().counters().results_sent, 4);
    assert_eq!(t.table_counters().results_sent, 4);
}

#[test]
fn without_seq_hand_offs_each_member_is_handed_off_alone() {
    let s = Switch::new(active_table(4, 4, 8));
    let mut sh = Shell::new(0, 2);
    sh.seq_hand_offs = false;
    for rank in 0..4 {
        s.on_datagram(
            0,
            &data_bytes(rank, 0),
            endpoint(rank),
            false,
            t0(),
            &mut sh,
        );
    }
    let handed: Vec<(usize, u16)> = sh
        .handoffs
        .iter()
        .map(|(t, h)| match h {
            Handoff::Reply(r) => (*t, r.rank),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(handed, [(1, 1), (1, 3)]);
    // Thread 1 sends each as handed.
    let mut on1 = Shell::new(1, 2);
    let mut batch = s.batch(1, t0());
    for (_, h) in sh.handoffs.drain(..) {
        batch.on_handoff(h, &mut on1);
    }
    drop(batch);
    assert_eq!(on1.sent.len(), 2);
    encoded_as_the_table_does(&s, &on1.sent);
}

#[test]
fn a_resend_goes_to_its_sender_alone_through_its_socket_s_thread() {
    let s = Switch::new(active_table(2, 4, 8));
    let mut sh = Shell::new(0, 2);
    for rank in 0..2 {
        s.on_datagram(
            0,
            &data_bytes(rank, 0),
            endpoint(rank),
            false,
            t0(),
            &mut sh,
        );
    }
    sh.handoffs.clear();
    sh.sent.clear();
    // Rank 1 lost its RESULT and sends again, received on thread 0.
    let h = s.on_datagram(0, &data_bytes(1, 0), endpoint(1), false, t0(), &mut sh);
    assert_eq!(h.verdict, Verdict::Data(DataOutcome::Retransmit { seq: 0 }));
    assert!(h.lock_free && sh.sent.is_empty());
    let [(1, Handoff::Reply(r))] = sh.handoffs[..] else {
        panic!("{:?}", sh.handoffs);
    };
    assert_eq!((r.rank, r.to), (1, endpoint(1)));
    let mut on1 = Shell::new(1, 2);
    s.batch(1, t0()).on_handoff(Handoff::Reply(r), &mut on1);
    let [(1, sent, ref bytes)] = on1.sent[..] else {
        panic!("{:?}", on1.sent);
    };
    let hdr = HeaderRepr::parse(&crate::wire::Header::new_checked(&bytes[..]).unwrap()).unwrap();
    assert!(hdr.has_flag(flags::RETX) && hdr.rank == 1);
    encoded_as_the_table_does(&s, &[(1, sent, bytes.clone())]);
}

#[test]
fn what_the_data_path_hands_back_goes_to_the_table_once_per_batch() {
    let s = Switch::new(active_table(2, 4, 8));
    let mut sh = Shell::new(0, 1);
    let mut batch = s.batch(0, t0());
    // A stranger's DATA (another port): the table drops it, unanswered.
    let mut stranger = endpoint(0);
    stranger.source.port += 1;
    let h = batch.on_datagram(&data_bytes(0, 0), stranger, false, &mut sh);
    assert!(!h.lock_free && batch.holds_table());
    assert_eq!(
        h.verdict,
        Verdict::Data(DataOutcome::Dropped(DropReason::SourceMismatch))
    );
    // A stale generation from a member: NACK 7, encoded by the table.
    let (mut hd, p) = data_message(0, 0, &[1.0], GEN ^ 1);
    hd.gen = GEN ^ 1;
    let h = batch.on_datagram(&frame(&hd, &p), endpoint(0), false, &mut sh);
    assert_eq!(
        h.verdict,
        Verdict::Data(DataOutcome::Nack(NackReason::StaleGeneration))
    );
    drop(batch);
    let [(0, r, _)] = sh.sent[..] else {
        panic!("{:?}", sh.sent);
    };
    assert!(matches!(
        r.msg,
        ReplyMsg::Nack {
            reason: NackReason::StaleGeneration,
            ..
        }
    ));
    encoded_as_the_table_does(&s, &sh.sent);
}
