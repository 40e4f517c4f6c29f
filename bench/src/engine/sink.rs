//! What a backend reports into: [`Sink`], one feeding thread's reply
//! buffer and counters. It counts the engine's verdict on every DATA,
//! takes every reply the engine encodes, counts each RESULT in its ranks'
//! window ([`super::window`]) and checks, bit for bit, the RESULT of every
//! seq that is a multiple of [`SAMPLE_EVERY`] against the rank-order
//! reference sum ([`Reference`]).
//!
//! Invariants: the reply buffer is allocated once, at setup, and taking a
//! verdict or a right RESULT allocates nothing and makes no syscall. The
//! first wrong RESULT or refused hand-off is kept and fails the run (never
//! a panic in a feeding thread).

use std::sync::Arc;

use proto::reference::{fill_pattern, rank_order_sum};
use proto::switch::{DataOutcome, Encoded, Reply, ReplyMsg, Verdict};
use proto::tag::TAG_LEN;
use proto::wire::{write_f32s, Header, MsgType, HEADER_LEN};

use super::error::EngineError;
use super::window::Windows;

/// RESULTs of every seq that is a multiple of this are checked against the
/// reference (a prime, so the checked seqs walk over every slot and frame).
pub const SAMPLE_EVERY: u32 = 61;

/// The reference RESULT payloads, one per frame index `k < K`.
pub(super) struct Reference {
    payload_len: usize,
    bytes: Vec<u8>,
}

impl Reference {
    pub(super) fn new(ranks: u16, elems: u16, frames: u32) -> Reference {
        let payload_len = 4 * elems as usize;
        let mut bytes = vec![0u8; frames as usize * payload_len];
        let mut inputs = vec![vec![0f32; elems as usize]; ranks as usize];
        for k in 0..frames {
            for (r, v) in inputs.iter_mut().enumerate() {
                fill_pattern(r as u16, k, v);
            }
            let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
            let at = k as usize * payload_len;
            write_f32s(&rank_order_sum(&refs), &mut bytes[at..at + payload_len]);
        }
        Reference { payload_len, bytes }
    }

    fn payload(&self, seq: u32, frames: u32) -> &[u8] {
        let at = (seq % frames) as usize * self.payload_len;
        &self.bytes[at..at + self.payload_len]
    }
}

/// One thread's reply buffer and counters; backends report into it.
pub struct Sink {
    pub(super) backend: &'static str,
    buf: Vec<u8>,
    frames: u32,
    reference: Arc<Reference>,
    pub(super) payload_len: u64,
    pub(super) taken: u64,
    pub(super) refused: u64,
    pub(super) first_refusal: Option<Verdict>,
    pub(super) results: u64,
    pub(super) checked: u64,
    pub(super) unexpected: u64,
    pub(super) first_unexpected: Option<Reply>,
    pub(super) wrong: Option<EngineError>,
    /// Per rank of the job (steered: per seq lane), the window that counts
    /// its RESULTs; and the RESULTs of seq `run_seq` (its place in that
    /// window) for window `run_window` encoded here and not yet counted in
    /// it (`run_len`): one count per run.
    pub(super) windows: Windows,
    /// Steered: the seq lanes, T (a window per lane); otherwise 0.
    lanes: u32,
    run_window: usize,
    run_seq: u32,
    run_len: u32,
}

impl Sink {
    pub(super) fn new(
        backend: &'static str,
        frames: u32,
        reference: Arc<Reference>,
        windows: Windows,
        lanes: u32,
    ) -> Sink {
        Sink {
            backend,
            // A RESULT: header, payload and (auth = mac) its tag.
            buf: vec![0; HEADER_LEN + reference.payload_len + TAG_LEN],
            frames,
            payload_len: reference.payload_len as u64,
            reference,
            taken: 0,
            refused: 0,
            first_refusal: None,
            results: 0,
            checked: 0,
            unexpected: 0,
            first_unexpected: None,
            wrong: None,
            windows,
            lanes,
            run_window: 0,
            run_seq: 0,
            run_len: 0,
        }
    }

    /// Counts the RESULTs encoded here in their ranks' window.
    pub(super) fn flush(&mut self) {
        if self.run_len > 0 {
            if let Some(w) = self.windows.get(self.run_window) {
                w.encoded(self.run_seq, self.run_len);
            }
            self.run_len = 0;
        }
    }

    /// The engine's verdict on one DATA.
    #[inline]
    pub fn data(&mut self, v: Verdict) {
        match v {
            Verdict::Data(DataOutcome::Taken | DataOutcome::Completed { .. }) => self.taken += 1,
            _ => {
                self.refused += 1;
                self.first_refusal.get_or_insert(v);
            }
        }
    }

    /// One reply, which `encode` writes into this thread's buffer (as
    /// `JobTable::encode` does): counted, and checked when it is a sampled
    /// RESULT.
    #[inline]
    pub fn reply(&mut self, r: &Reply, encode: impl FnOnce(&mut [u8]) -> Option<Encoded>) {
        let encoded = encode(&mut self.buf);
        let (ReplyMsg::Result { seq, retx: false }, Some(e)) = (r.msg, encoded) else {
            self.unexpected += 1;
            self.first_unexpected.get_or_insert(*r);
            return;
        };
        self.results += 1;
        let (w, at) = match self.lanes {
            0 => (r.rank as usize, seq),
            l => ((seq % l) as usize, seq / l),
        };
        let same = self
            .windows
            .get(w)
            .zip(self.windows.get(self.run_window))
            .is_some_and(|(a, b)| Arc::ptr_eq(a, b));
        if self.run_len > 0 && (self.run_seq != at || !same) {
            self.flush();
        }
        self.run_window = w;
        self.run_seq = at;
        self.run_len += 1;
        if seq.is_multiple_of(SAMPLE_EVERY) {
            self.check(r, seq, e);
        }
    }

    /// The backend could not hand job `job`'s `seq` to the thread that
    /// sends some of its RESULTs: the run fails.
    pub fn hand_off_refused(&mut self, job: u16, seq: u32) {
        self.wrong.get_or_insert(EngineError::HandOffRefused {
            backend: self.backend,
            job,
            seq,
        });
    }

    /// Compares the encoded RESULT of `seq` with the reference.
    #[cold]
    fn check(&mut self, r: &Reply, seq: u32, e: Encoded) {
        self.checked += 1;
        if self.wrong.is_some() {
            return;
        }
        let want = self.reference.payload(seq, self.frames);
        let h = Header::new_unchecked(&self.buf[..HEADER_LEN]);
        let what = if h.msg_type_raw() != MsgType::Result as u8 || h.seq() != seq {
            Some(format!(
                "header type {} seq {}, not RESULT seq {seq}",
                h.msg_type_raw(),
                h.seq()
            ))
        } else if e.len != HEADER_LEN + want.len() + TAG_LEN {
            // The values, then the RESULT's token.
            Some(format!(
                "{} bytes encoded, not {}",
                e.len,
                HEADER_LEN + want.len() + TAG_LEN
            ))
        } else {
            let got = &self.buf[HEADER_LEN..e.len - TAG_LEN];
            got.chunks_exact(4)
                .zip(want.chunks_exact(4))
                .position(|(g, w)| g != w)
                .map(|i| {
                    let f = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    format!(
                        "element {i} is {:e}, not {:e}",
                        f(&got[4 * i..]),
                        f(&want[4 * i..])
                    )
                })
        };
        if let Some(what) = what {
            self.wrong = Some(EngineError::WrongResult {
                backend: self.backend,
                job: r.job,
                seq,
                rank: r.rank,
                what,
            });
        }
    }
}
