//! The cost of one DATA packet through the real engine, next to the cost of
//! only copying its payload (the limit any aggregation can approach), and
//! the float kernels on their own.
//!
//! `data_packet/engine/E`: `Header::new_checked` + `HeaderRepr::parse` +
//! `JobTable::handle` per DATA datagram of E floats, for a job of 4 ranks and
//! 256 slots that was activated by 4 JOINs. The datagrams are built ahead,
//! rank 0..3 of seq s then of s + 1 and so on, so every 4th packet completes
//! a slot and the slots recycle; each lies in its own 4096-byte frame at the
//! offset AF_XDP gives it (the payload at byte 64). When the ring of 256 seqs
//! is used up, the seqs are restamped outside the timed region.
//!
//! `data_packet/copy/E`: `simd::read_le_f32` of the same payloads into one
//! buffer of E floats.
//!
//! `data_packet/sum_only/E`: the arithmetic of the engine without its
//! protocol work: the same payloads copied (rank 0) or added (ranks 1..3)
//! into one of 256 buffers by position in the stream. engine − sum_only is
//! what parsing, the job lookup, membership, window, duplicate and
//! rank-order checks and the counters cost per packet.
//!
//! `add_le_f32/<backend>/362`: one payload of a 1500-byte MTU folded into a
//! sum, by the scalar loop, each vector backend, and the dispatched choice.
//!
//! Run: `cargo bench -p agg-proto --bench data_path` (add `-- --quick` for a
//! short run).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use proto::reference::fill_pattern;
use proto::simd::{self, Backend};
use proto::switch::{
    DataOutcome, Endpoint, Ipv4Prefix, JobConfig, JobTable, JoinOutcome, Source, Verdict,
};
use proto::wire::{
    write_f32s, Header, HeaderRepr, JoinPayload, MsgType, DTYPE_F32, HEADER_LEN, L2_L4_LEN,
    MAX_ELEMS_PER_CHUNK, OP_SUM,
};

const JOB: u16 = 5;
const RANKS: u16 = 4;
const POOL: u16 = 256;
const GEN: u32 = 0x1234_5678;
const SECRET: [u8; 32] = [7; 32];
/// AF_XDP frame size of switchd's UMEM.
const FRAME: usize = 4096;
/// Seqs in the ring of prebuilt datagrams (one pass over the pool).
const RING_SEQS: u32 = POOL as u32;
const ELEMS: [u16; 4] = [64, 256, 362, 870];

fn endpoint(rank: u16) -> Endpoint {
    Endpoint {
        source: Source {
            mac: [2, 0, 0, 0, 0, rank as u8],
            ip: [198, 18, 0, 10 + rank as u8],
            port: 40000 + rank,
        },
        ..Endpoint::default()
    }
}

/// A job of [`RANKS`] ranks, [`POOL`] slots and `elems` floats per chunk,
/// activated by a JOIN from every rank.
fn active_table(elems: u16) -> JobTable {
    let mut t = JobTable::new(GEN);
    let config = JobConfig {
        id: JOB,
        n_workers: RANKS,
        allowed_sources: vec![Ipv4Prefix {
            addr: [198, 18, 0, 0],
            len: 24,
        }],
        secret: SECRET,
        pool_slots: POOL,
        elems_per_chunk: elems,
        window: POOL,
    };
    t.add(config, MAX_ELEMS_PER_CHUNK).expect("job config");
    let join = JoinPayload {
        n_workers: RANKS,
        dtype: DTYPE_F32,
        op: OP_SUM,
        secret: SECRET,
    };
    let mut payload = [0u8; 36];
    join.emit(&mut payload).expect("join payload");
    for rank in 0..RANKS {
        let mut h = HeaderRepr::new(MsgType::Join, JOB);
        h.rank = rank;
        let v = t.handle(&h, &payload, endpoint(rank), false);
        let want = if rank + 1 == RANKS {
            JoinOutcome::Activated
        } else {
            JoinOutcome::Waiting
        };
        assert_eq!(v, Verdict::Join(want));
    }
    t
}

/// The prebuilt DATA datagrams: frame `4 (s - base) + rank` holds rank
/// `rank`'s chunk of seq `s`, starting at byte [`L2_L4_LEN`] of its frame.
struct Stream {
    umem: Vec<u8>,
    elems: usize,
    /// Next datagram to feed.
    pos: usize,
    /// Seq of frame 0..4 in the current pass.
    base: u32,
}

impl Stream {
    fn new(elems: u16) -> Stream {
        let count = RING_SEQS as usize * RANKS as usize;
        let mut s = Stream {
            umem: vec![0; count * FRAME],
            elems: elems as usize,
            pos: 0,
            base: 0,
        };
        let mut values = vec![0f32; elems as usize];
        for i in 0..count {
            let (seq, rank) = ((i / RANKS as usize) as u32, (i % RANKS as usize) as u16);
            let mut h = HeaderRepr::new(MsgType::Data, JOB);
            h.rank = rank;
            h.count = elems;
            h.seq = seq;
            h.gen = GEN;
            let d = s.datagram_mut(i);
            h.emit_to(d).expect("header");
            fill_pattern(rank, seq, &mut values);
            write_f32s(&values, &mut d[HEADER_LEN..]);
        }
        s
    }

    fn len(&self) -> usize {
        RING_SEQS as usize * RANKS as usize
    }

    fn datagram_mut(&mut self, i: usize) -> &mut [u8] {
        let start = i * FRAME + L2_L4_LEN;
        &mut self.umem[start..start + HEADER_LEN + 4 * self.elems]
    }

    fn datagram(&self, i: usize) -> &[u8] {
        let start = i * FRAME + L2_L4_LEN;
        &self.umem[start..start + HEADER_LEN + 4 * self.elems]
    }

    /// Moves the ring to the next [`RING_SEQS`] seqs.
    fn restamp(&mut self) {
        self.base = self.base.wrapping_add(RING_SEQS);
        for i in 0..self.len() {
            let seq = self.base.wrapping_add((i / RANKS as usize) as u32);
            Header::new_unchecked(self.datagram_mut(i)).set_seq(seq);
        }
        self.pos = 0;
    }

    /// Calls `f` on the next `iters` datagrams, timing only `f`.
    fn run(&mut self, iters: u64, mut f: impl FnMut(&[u8])) -> Duration {
        let mut total = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            if self.pos == self.len() {
                self.restamp();
            }
            let k = ((self.len() - self.pos) as u64).min(left) as usize;
            let start = Instant::now();
            for i in self.pos..self.pos + k {
                f(black_box(self.datagram(i)));
            }
            total += start.elapsed();
            self.pos += k;
            left -= k as u64;
        }
        total
    }
}

/// What the switch does with one received datagram, up to the verdict.
#[inline]
fn engine(table: &mut JobTable, from: &[Endpoint; RANKS as usize], dgram: &[u8]) -> Verdict {
    let Ok(h) = Header::new_checked(dgram) else {
        return Verdict::Dropped(None);
    };
    let Ok(repr) = HeaderRepr::parse(&h) else {
        return Verdict::Dropped(None);
    };
    let from = from[repr.rank as usize % from.len()];
    table.handle(&repr, h.payload(), from, false)
}

fn data_packet(c: &mut Criterion) {
    let mut g = c.benchmark_group("data_packet");
    g.throughput(Throughput::Elements(1));
    let from: [Endpoint; RANKS as usize] = std::array::from_fn(|r| endpoint(r as u16));
    for elems in ELEMS {
        let mut table = active_table(elems);
        let mut stream = Stream::new(elems);
        // Check that the stream takes the path being measured: every 4th
        // packet completes a slot, none is dropped.
        for i in 0..2 * stream.len() {
            if stream.pos == stream.len() {
                stream.restamp();
            }
            let v = engine(&mut table, &from, stream.datagram(stream.pos));
            stream.pos += 1;
            match v {
                Verdict::Data(DataOutcome::Taken) if i % 4 != 3 => {}
                Verdict::Data(DataOutcome::Completed { .. }) if i % 4 == 3 => {}
                v => panic!("packet {i}: {v:?}"),
            }
        }
        g.bench_with_input(BenchmarkId::new("engine", elems), &elems, |b, _| {
            b.iter_custom(|iters| {
                stream.run(iters, |d| {
                    black_box(engine(&mut table, &from, d));
                })
            })
        });
        let job = table.get(JOB).expect("job");
        assert_eq!(job.counters.total_drops(), 0, "{:?}", job.counters);
        assert_eq!(job.counters.retransmits_served, 0);

        let mut out = vec![0f32; elems as usize];
        g.bench_with_input(BenchmarkId::new("copy", elems), &elems, |b, _| {
            b.iter_custom(|iters| {
                stream.run(iters, |d| {
                    simd::read_le_f32(&d[HEADER_LEN..], &mut out);
                    black_box(&mut out);
                })
            })
        });

        // The arithmetic alone, with no protocol: the slot is seq mod the
        // pool size, rank 0 copies, the others add (the stream's order).
        let mut sums = vec![vec![0f32; elems as usize]; POOL as usize];
        let mut next = 0usize;
        g.bench_with_input(BenchmarkId::new("sum_only", elems), &elems, |b, _| {
            b.iter_custom(|iters| {
                stream.run(iters, |d| {
                    let (rank, slot) = (
                        next % RANKS as usize,
                        (next / RANKS as usize) % POOL as usize,
                    );
                    next += 1;
                    let acc = &mut sums[slot];
                    if rank == 0 {
                        simd::read_le_f32(&d[HEADER_LEN..], acc);
                    } else {
                        simd::add_le_f32(acc, &d[HEADER_LEN..]);
                    }
                    black_box(&mut *acc);
                })
            })
        });
    }
    g.finish();
}

fn add_le_f32(c: &mut Criterion) {
    const E: usize = 362;
    let mut g = c.benchmark_group("add_le_f32");
    g.throughput(Throughput::Elements(E as u64));
    let mut values = vec![0f32; E];
    fill_pattern(1, 0, &mut values);
    let mut bytes = vec![0u8; 4 * E];
    write_f32s(&values, &mut bytes);
    let mut acc = vec![0f32; E];
    fill_pattern(0, 0, &mut acc);
    for be in Backend::available() {
        g.bench_with_input(BenchmarkId::new(be.name(), E), &E, |b, _| {
            b.iter(|| be.add_le_f32(black_box(&mut acc), black_box(&bytes)))
        });
    }
    g.bench_with_input(BenchmarkId::new("dispatched", E), &E, |b, _| {
        b.iter(|| simd::add_le_f32(black_box(&mut acc), black_box(&bytes)))
    });
    // The engine's loop as it is written in switch.rs today, inlined.
    g.bench_with_input(BenchmarkId::new("inline_loop", E), &E, |b, _| {
        b.iter(|| simd::scalar::add_le_f32(black_box(&mut acc), black_box(&bytes)))
    });
    g.finish();
}

criterion_group!(benches, data_packet, add_le_f32);
criterion_main!(benches);
