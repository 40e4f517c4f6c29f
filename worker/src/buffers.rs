//! The buffers of the collective in progress as the threads that carry it
//! share them: its output, which every thread writes at its own chunks
//! ([`Output`]); its input, as they read it for their DATA ([`Input`]);
//! which chunks of an in-place all-reduce are kept already
//! ([`KeptBits`]); and the kept inputs themselves ([`KeptInput`]).
//!
//! An all-reduce sums `data` in place: a chunk's RESULT overwrites that
//! chunk's input, which a resend, a restart's resume point and the next
//! collective's catch-up still read. So the worker keeps a copy of it. An
//! in-place input ([`Input::in_place`]) is kept chunk by chunk, when the
//! chunk is first sent, by the thread that sends it: the DATA is then
//! built from bytes just copied, still in cache, instead of from a copy of
//! the whole tensor made before the collective (one pass over the tensor
//! less), and the copying is spread over the threads instead of done by
//! the caller's thread before any of them starts. The other kinds read an
//! input the caller does not change during the call; it is copied whole
//! before the collective ([`Input::Whole`]).
//!
//! Invariants:
//! * No two threads access the same bytes of the output or of the kept
//!   input: each chunk's range is one seq's, each seq one share's (see
//!   `threads`), and a share writes a chunk's output at its first RESULT
//!   only.
//! * In place, a chunk's output bytes are written only after its input is kept
//!   ([`Input::before_output`]). So at any moment a chunk's input is in
//!   `kept` (its bit set) or still in the output (its bit clear).
//! * In place, the bits of 64 chunks share a word, so they are atomics;
//!   a chunk passes to another thread only when the shares change,
//!   between the threads' runs (spawn and join order it).
//! * In place, [`Input::finish`] keeps every chunk still clear, from the output
//!   (still its input, by the first invariant): after it `kept` is the
//!   whole input, as the previous collective's catch-up needs.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use proto::member::DataInput;
use proto::wire::Dtype;

/// The output of a collective, shared by the threads that carry it; `None`
/// of it (a catch-up of the previous collective) writes nothing.
#[derive(Clone, Copy)]
pub struct Output<'a> {
    ptr: *mut u8,
    len: usize,
    _out: PhantomData<&'a mut [u8]>,
}

// SAFETY: an Output is a `&mut [u8]` split by chunk between threads: every
// write goes through `write_chunk`, which touches only one chunk's bytes,
// and each chunk is written by one thread (the module's first invariant),
// so no two threads ever access the same bytes. The lifetime keeps the buffer
// borrowed while any copy lives.
unsafe impl Send for Output<'_> {}
// SAFETY: as above.
unsafe impl Sync for Output<'_> {}

impl<'a> Output<'a> {
    pub fn new(out: &'a mut [u8]) -> Output<'a> {
        Output {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            _out: PhantomData,
        }
    }

    /// The buffer's start: an in-place input reads a chunk's input here
    /// before keeping it.
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// Writes one chunk's values at byte `at`: `got` (the RESULT's values),
    /// or with `mine` (this rank's kept shard) their sum in `dtype`.
    /// Nothing is written outside the output (a chunk past its end is the
    /// caller's bug, and is skipped).
    pub fn write_chunk(&self, dtype: Dtype, at: usize, got: &[u8], mine: Option<&[u8]>) {
        let Some(end) = at.checked_add(got.len()).filter(|e| *e <= self.len) else {
            debug_assert!(
                false,
                "chunk {at}+{} past the output's {}",
                got.len(),
                self.len
            );
            return;
        };
        // SAFETY: `at..end` is inside the buffer (checked above), and this
        // chunk's bytes are this thread's alone (see the impl of Send).
        let to = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), end - at) };
        match mine {
            // The others' sum plus this rank's kept shard.
            Some(mine) => {
                proto::elements::add_own_le(dtype, got, mine, to);
            }
            None => to.copy_from_slice(got),
        }
    }
}

/// One bit per chunk of an in-place input: kept already. Reused across
/// collectives ([`KeptBits::reset`]).
#[derive(Default)]
pub struct KeptBits(Vec<AtomicU64>);

impl KeptBits {
    /// Clears the bits of `chunks` chunks (growing, never shrinking).
    pub fn reset(&mut self, chunks: usize) {
        let words = chunks.div_ceil(64);
        if self.0.len() < words {
            self.0.resize_with(words, AtomicU64::default);
        }
        for w in &mut self.0[..words] {
            *w.get_mut() = 0;
        }
    }
}

/// A kept input: the first `len` bytes of a buffer that never shrinks.
/// DDP's buckets differ in size from one collective to the next, and the
/// two kept inputs swap every collective; a `Vec` resized to each length
/// would zero-fill the difference every time a larger bucket follows a
/// smaller one, a pass over up to a bucket that nothing reads. This
/// zero-fills only beyond the largest length it has held.
#[derive(Default)]
pub struct KeptInput {
    buf: Vec<u8>,
    len: usize,
}

impl KeptInput {
    /// The bytes held.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The bytes held, to write.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }

    /// Holds `len` bytes, for the caller to write: what they were before
    /// (bytes of an earlier input, or zeros where it never reached) is
    /// left as it was.
    pub fn set_len(&mut self, len: usize) -> &mut [u8] {
        self.reserve(len);
        self.len = len;
        &mut self.buf[..len]
    }

    /// Holds a copy of `values`.
    pub fn copy_from(&mut self, values: &[u8]) {
        self.set_len(values.len()).copy_from_slice(values);
    }

    /// Makes room for `len` bytes now, its pages touched, keeping the
    /// bytes held: a collective that then writes it faults in nothing.
    pub fn reserve(&mut self, len: usize) {
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
    }
}

/// The collective's input as wire bytes, for every thread's DATA.
#[derive(Clone, Copy)]
pub enum Input<'a> {
    /// Copied whole before the collective (or a catch-up's kept input).
    Whole(&'a [u8]),
    /// An all-reduce's, in its output until each chunk is kept.
    InPlace(InPlace<'a>),
}

/// An in-place all-reduce's input: the output holds it until a chunk's
/// first DATA copies it to `kept`.
#[derive(Clone, Copy)]
pub struct InPlace<'a> {
    data: Output<'a>,
    kept: *mut u8,
    len: usize,
    /// Bytes per chunk: chunk c is `c·chunk .. min((c+1)·chunk, len)`.
    chunk: usize,
    bits: &'a [AtomicU64],
    _kept: PhantomData<&'a mut [u8]>,
}

// SAFETY: `kept` is a `&mut [u8]` split by chunk between threads like the
// output: each chunk's bytes are written (once) and read by the one
// thread that holds the chunk (the module's invariants), and the lifetime
// keeps the buffer borrowed while any copy lives.
unsafe impl Send for InPlace<'_> {}
// SAFETY: as above.
unsafe impl Sync for InPlace<'_> {}

impl<'a> Input<'a> {
    /// The input of an all-reduce of `data` in place, to be kept in
    /// `kept` (as long as `data`) by chunks of `chunk` bytes, `bits`
    /// reset for its chunks; and the output the RESULTs write into.
    pub fn in_place(
        data: &'a mut [u8],
        kept: &'a mut [u8],
        chunk: usize,
        bits: &'a KeptBits,
    ) -> (Input<'a>, Output<'a>) {
        assert_eq!(
            kept.len(),
            data.len(),
            "the kept input is as long as the data"
        );
        let (len, chunk) = (data.len(), chunk.max(1));
        let out = Output::new(data);
        let input = Input::InPlace(InPlace {
            data: out,
            kept: kept.as_mut_ptr(),
            len,
            chunk,
            bits: bits
                .0
                .get(..len.div_ceil(chunk).div_ceil(64))
                .expect("KeptBits reset for these chunks"),
            _kept: PhantomData,
        });
        (input, out)
    }

    /// Call before a RESULT writes output byte `at` onwards (one chunk):
    /// keeps that chunk's input first.
    pub fn before_output(&self, at: usize) {
        if let Input::InPlace(p) = self {
            p.keep(at / p.chunk);
        }
    }

    /// Keeps every chunk not kept yet; after it the kept buffer holds the
    /// whole input. Call once the threads have ended.
    pub fn finish(&self) {
        if let Input::InPlace(p) = self {
            for c in 0..p.len.div_ceil(p.chunk) {
                p.keep(c);
            }
        }
    }
}

impl InPlace<'_> {
    /// Chunk `c`'s bytes.
    fn range(&self, c: usize) -> Range<usize> {
        let start = c.saturating_mul(self.chunk).min(self.len);
        start..start.saturating_add(self.chunk).min(self.len)
    }

    /// Copies chunk `c`'s input from the data to `kept`, unless done.
    fn keep(&self, c: usize) {
        let (Some(word), bit) = (self.bits.get(c / 64), 1u64 << (c % 64)) else {
            return;
        };
        // Relaxed: only this chunk's thread reads or sets its bit (see
        // the module's invariants).
        if word.load(Ordering::Relaxed) & bit != 0 {
            return;
        }
        let r = self.range(c);
        // SAFETY: `r` lies inside both buffers (`range` clamps to `len`,
        // their common length); the chunk's bytes are this thread's alone,
        // and the data's still hold its input (bit clear).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.data.as_ptr().add(r.start),
                self.kept.add(r.start),
                r.len(),
            );
        }
        word.fetch_or(bit, Ordering::Relaxed);
    }
}

impl DataInput for Input<'_> {
    /// The values of the chunk at `range`, kept first if in place.
    fn values(&self, range: Range<usize>) -> &[u8] {
        match self {
            Input::Whole(b) => &b[range],
            Input::InPlace(p) => {
                assert!(
                    range.start <= range.end && range.end <= p.len,
                    "values {range:?} past an input of {} bytes",
                    p.len
                );
                p.keep(range.start / p.chunk);
                // SAFETY: inside `kept` (checked above), and kept: no thread
                // writes these bytes again during the collective.
                unsafe { std::slice::from_raw_parts(p.kept.add(range.start), range.len()) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept input shrinks and grows back without losing what a larger
    /// collective left past the smaller one's end: nothing zero-fills it
    /// again (the bytes past the length are the earlier input's).
    #[test]
    fn a_kept_input_regrows_without_filling_again() {
        let mut k = KeptInput::default();
        k.copy_from(&[7u8; 64]);
        assert_eq!(k.bytes(), &[7u8; 64]);
        k.copy_from(&[1u8; 16]);
        assert_eq!(k.bytes(), &[1u8; 16]);
        let held = k.set_len(64);
        assert_eq!(&held[..16], &[1u8; 16]);
        assert_eq!(&held[16..], &[7u8; 48], "regrowing filled the buffer again");
        // Beyond the largest length so far: zeros, and what was held stays.
        k.reserve(80);
        assert_eq!(k.bytes().len(), 64);
        assert_eq!(&k.set_len(80)[64..], &[0u8; 16]);
    }

    /// Two threads write their own chunks of one buffer at once; every
    /// byte ends up written once, by its chunk's thread.
    #[test]
    fn threads_write_their_own_chunks_of_one_output() {
        let mut buf = vec![0u8; 4 * 8 * 16];
        let out = Output::new(&mut buf);
        std::thread::scope(|s| {
            for t in 0..2u8 {
                s.spawn(move || {
                    for chunk in (t as usize..16).step_by(2) {
                        let vals = [t + 1; 32];
                        out.write_chunk(Dtype::F32, chunk * 32, &vals, None);
                    }
                });
            }
        });
        for (chunk, bytes) in buf.chunks(32).enumerate() {
            let want = (chunk % 2) as u8 + 1;
            assert!(bytes.iter().all(|b| *b == want), "chunk {chunk}: {bytes:?}");
        }
    }

    /// Chunks are kept on first use, the output is written after, and
    /// `finish` completes the rest from the data.
    #[test]
    fn an_in_place_input_keeps_each_chunk_before_its_output_is_written() {
        // 5 chunks of 8 bytes, the last one 4.
        let mut data: Vec<u8> = (0..36).collect();
        let want = data.clone();
        let mut kept = vec![0xeeu8; 36];
        let mut bits = KeptBits::default();
        bits.reset(5);
        {
            let (input, out) = Input::in_place(&mut data, &mut kept, 8, &bits);
            assert_eq!(input.values(8..16), &want[8..16]);
            // A RESULT of chunk 3 before its DATA (never in practice).
            input.before_output(24);
            out.write_chunk(Dtype::F32, 24, &[0xaa; 8], None);
            out.write_chunk(Dtype::F32, 8, &[0xbb; 8], None);
            assert_eq!(input.values(8..16), &want[8..16], "kept, not the output");
            assert_eq!(input.values(24..32), &want[24..32]);
            input.finish();
        }
        assert_eq!(kept, want, "the whole input after finish");
        assert_eq!(&data[8..16], &[0xbb; 8]);
        assert_eq!(&data[24..32], &[0xaa; 8]);
        // The bits reset for the next collective.
        bits.reset(5);
        let mut kept2 = vec![0u8; 36];
        let (input, _) = Input::in_place(&mut data, &mut kept2, 8, &bits);
        assert_eq!(input.values(32..36), &want[32..36]);
    }

    #[test]
    fn values_past_the_input_panic_with_a_message() {
        let mut data = vec![0u8; 16];
        let mut kept = vec![0u8; 16];
        let mut bits = KeptBits::default();
        bits.reset(2);
        let (input, _) = Input::in_place(&mut data, &mut kept, 8, &bits);
        let r =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| input.values(8..24).len()));
        assert!(r.is_err());
    }
}
