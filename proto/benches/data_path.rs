//! The cost of one DATA packet through the real engine, next to the cost of
//! only copying its payload (the limit any aggregation can approach), and
//! the float kernels on their own.
//!
//! `data_packet/engine/E`: `JobTable::handle` (which parses) per DATA
//! datagram of E floats, then draining and encoding its replies (every 4th
//! packet completes a slot: 4 RESULTs), for a job of 4 ranks and 256 slots
//! that was activated by 4 handshakes. The datagrams are built ahead,
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
//! `data_packet/engine_no_encode/E`: the same without encoding the
//! replies (drained only): the table's own work, comparable with the
//! engine before the table queued replies.
//!
//! `data_packet/hmac_tag/E`: HMAC-SHA256 over the same datagram, what an
//! optional per-packet tag on DATA would add at the switch (and again at
//! the worker), to weigh against `engine` (docs/PROTOCOL.md, "DATA
//! authentication").
//!
//! `auth/result_token` and `auth/result_token_verify`: the token of one
//! `auth = "port"` RESULT (the RESULT key's GMAC over an empty payload),
//! made by the switch once per fan-out, and checked by a worker once per
//! RESULT; `engine` above includes the switch's share.
//!
//! `auth/engine_port/870` and `auth/engine_mac/870`: `engine` (as above)
//! for DATA of 870 float32 elements in a job of `auth = "port"` and one of
//! `auth = "mac"` (each DATA's AES-GMAC tag checked before summing, each
//! completed slot's RESULT tagged once): the ratio is what per-packet
//! authentication costs the switch. `auth/gmac_tag/870`,
//! `auth/poly1305_tag/870` and `auth/hmac_sha256/870`: one tag over the
//! same payload, alone (a worker pays one per DATA and one per RESULT).
//!
//! `handshake/switch_side`: the switch's work for one join, a HELLO (one
//! nonce issued) and a JOIN (nonce tag and MAC checked), for the handshake
//! cost per worker.
//!
//! `nack/switch_tag`: what an authenticated NACK costs the switch: the
//! NACK 6 to a member (its session key looked up, the header written, the
//! tag computed) encoded from the reply queue. `nack/switch_untagged`: the
//! same NACK to an address without a session (zero tag), the encode without
//! the HMAC. `nack/worker_verify`: the member's check of the tag
//! (`SessionGuard::nack_is_authentic`); `nack/worker_reject`: the same on a
//! forged, non-zero tag (what a spoofer makes a worker spend).
//!
//! `add_le_f32/<backend>/362`: one payload of a 1500-byte MTU folded into a
//! sum, by the scalar loop, each vector backend, and the dispatched choice.
//!
//! `stats/<dtype>_off/E` and `stats/<dtype>_on/E`: `engine` (as above) in a
//! job of 4 ranks without and with gradient statistics (`stats = true`:
//! each rank's squared norm folded, the sum's taken and the trailer written
//! at completion, and carried by every RESULT), for f32 and bf16 DATA of
//! full chunks at a 1500-byte MTU with the trailer's room (356 and 712
//! elements): the difference is what the statistics cost per packet.
//! `stats/<dtype>_norm/E`: `proto::stats::squared_norm_le_blocked` of one
//! such payload alone (widened 64 elements at a time, the 8-lane float64
//! sum): the engine's per-packet kernel.
//!
//! Run: `cargo bench -p agg-proto --bench data_path` (add `-- --quick` for a
//! short run).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use hmac::{Hmac, Mac};
use proto::handshake::{Handshake, JoinParams};
use proto::reference::fill_pattern;
use proto::simd::{self, Backend};
use proto::switch::{
    DataOutcome, Endpoint, Ipv4Prefix, JobConfig, JobTable, JoinOutcome, Source, TableConfig,
    Verdict,
};
use proto::tag::{AuthMode, PacketKey, TAG_LEN};
use proto::wire::{
    write_f32s, Dtype, Header, HeaderRepr, MsgType, DTYPE_F32, HEADER_LEN, L2_L4_LEN,
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

fn config(elems: u16) -> JobConfig {
    JobConfig {
        id: JOB,
        n_workers: RANKS,
        allowed_sources: vec![Ipv4Prefix {
            addr: [198, 18, 0, 0],
            len: 24,
        }],
        secret: SECRET,
        pool_slots: POOL,
        elems_per_chunk: elems,
        dtype: Default::default(),
        window: POOL,
        priority: Default::default(),
        auth: Default::default(),
        upstream: None,
        stats: false,
    }
}

fn handshake(rank: u16) -> Handshake {
    handshake_of(rank, DTYPE_F32)
}

/// `rank`'s handshake naming wire dtype `dtype`.
fn handshake_of(rank: u16, dtype: u8) -> Handshake {
    let ep = endpoint(rank);
    let params = JoinParams {
        job: JOB,
        rank,
        n_workers: RANKS,
        dtype,
        op: OP_SUM,
        secret: SECRET,
        ip: ep.source.ip,
        port: ep.source.port,
        provision: None,
    };
    Handshake::new(params, [rank as u8 + 1; 16])
}

/// HELLO, CHALLENGE and JOIN of `rank`'s `hs` at `now`, built in `b`;
/// returns the JOIN's verdict and leaves the table's replies to it queued.
fn handshake_join(
    t: &mut JobTable,
    hs: &mut Handshake,
    rank: u16,
    now: Instant,
    b: &mut [u8; 256],
) -> Verdict {
    let n = hs.emit_hello(b).expect("hello");
    t.handle(&b[..n], endpoint(rank), false, now);
    let r = t.poll_reply().expect("challenge");
    let e = t.encode(&r, b).expect("encode");
    let h = HeaderRepr::parse(&Header::new_checked(&b[..e.len]).expect("hdr")).expect("hdr");
    hs.on_challenge(&h, &b[HEADER_LEN..e.len])
        .expect("challenge");
    let n = hs.emit_join(0, 0, b).expect("join");
    t.handle(&b[..n], endpoint(rank), false, now)
}

/// HELLO, CHALLENGE and JOIN of `rank` at `now`; returns the JOIN's verdict.
fn join(t: &mut JobTable, rank: u16, now: Instant) -> Verdict {
    let v = handshake_join(t, &mut handshake(rank), rank, now, &mut [0u8; 256]);
    while t.poll_reply().is_some() {}
    v
}

/// A job of [`RANKS`] ranks, [`POOL`] slots and `elems` floats per chunk,
/// activated by a handshake from every rank.
fn active_table(elems: u16) -> JobTable {
    let now = Instant::now();
    let mut t = JobTable::new(TableConfig::new(GEN, [9; 32]), now);
    t.add(config(elems), MAX_ELEMS_PER_CHUNK)
        .expect("job config");
    for rank in 0..RANKS {
        let want = if rank + 1 == RANKS {
            JoinOutcome::Activated
        } else {
            JoinOutcome::Waiting
        };
        assert_eq!(join(&mut t, rank, now), Verdict::Join(want));
    }
    t
}

/// The prebuilt DATA datagrams: frame `4 (s - base) + rank` holds rank
/// `rank`'s chunk of seq `s`, starting at byte [`L2_L4_LEN`] of its frame.
struct Stream {
    umem: Vec<u8>,
    elems: usize,
    /// Per rank, the DATA key of an `auth = "mac"` job (empty: untagged).
    keys: Vec<PacketKey>,
    /// Next datagram to feed.
    pos: usize,
    /// Seq of frame 0..4 in the current pass.
    base: u32,
    /// The payload's element type.
    dtype: Dtype,
}

impl Stream {
    fn new(elems: u16) -> Stream {
        Stream::tagged(elems, Vec::new())
    }

    /// DATA tagged with rank r's key `keys[r]` (none if `keys` is empty).
    fn tagged(elems: u16, keys: Vec<PacketKey>) -> Stream {
        Stream::build(elems, keys, Dtype::F32)
    }

    /// Untagged DATA of `dtype` (the float32 pattern rounded to it).
    fn of_dtype(elems: u16, dtype: Dtype) -> Stream {
        Stream::build(elems, Vec::new(), dtype)
    }

    fn build(elems: u16, keys: Vec<PacketKey>, dtype: Dtype) -> Stream {
        let count = RING_SEQS as usize * RANKS as usize;
        let mut s = Stream {
            umem: vec![0; count * FRAME],
            elems: elems as usize,
            keys,
            pos: 0,
            base: 0,
            dtype,
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
            if dtype == Dtype::F32 {
                write_f32s(&values, &mut d[HEADER_LEN..]);
            } else {
                proto::elements::round_to_le(dtype, &values, &mut d[HEADER_LEN..]);
            }
            s.tag(i);
        }
        s
    }

    fn tag_len(&self) -> usize {
        if self.keys.is_empty() {
            0
        } else {
            TAG_LEN
        }
    }

    /// Writes datagram `i`'s tag after its payload (mac streams only).
    fn tag(&mut self, i: usize) {
        if self.keys.is_empty() {
            return;
        }
        let n = self.dtype.size() * self.elems;
        let d = self.datagram(i);
        let h = HeaderRepr::parse(&Header::new_checked(d).expect("hdr")).expect("hdr");
        let t = self.keys[h.rank as usize].tag(&h, &d[HEADER_LEN..HEADER_LEN + n]);
        self.datagram_mut(i)[HEADER_LEN + n..].copy_from_slice(&t);
    }

    fn len(&self) -> usize {
        RING_SEQS as usize * RANKS as usize
    }

    fn datagram_mut(&mut self, i: usize) -> &mut [u8] {
        let start = i * FRAME + L2_L4_LEN;
        let len = HEADER_LEN + self.dtype.size() * self.elems + self.tag_len();
        &mut self.umem[start..start + len]
    }

    fn datagram(&self, i: usize) -> &[u8] {
        let start = i * FRAME + L2_L4_LEN;
        let len = HEADER_LEN + self.dtype.size() * self.elems + self.tag_len();
        &self.umem[start..start + len]
    }

    /// Moves the ring to the next [`RING_SEQS`] seqs.
    fn restamp(&mut self) {
        self.base = self.base.wrapping_add(RING_SEQS);
        for i in 0..self.len() {
            let seq = self.base.wrapping_add((i / RANKS as usize) as u32);
            Header::new_unchecked(self.datagram_mut(i)).set_seq(seq);
            self.tag(i);
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

/// What the switch does with one received datagram: the verdict, and its
/// replies encoded into a transmit buffer.
#[inline]
fn engine(
    table: &mut JobTable,
    from: &[Endpoint; RANKS as usize],
    dgram: &[u8],
    now: Instant,
    tx: &mut [u8],
) -> Verdict {
    let rank = Header::new_checked(dgram).map_or(0, |h| h.rank());
    let from = from[rank as usize % from.len()];
    let v = table.handle(dgram, from, false, now);
    while let Some(r) = table.poll_reply() {
        black_box(table.encode(&r, tx));
    }
    v
}

/// Checks that `stream` takes the path being measured: every 4th packet
/// completes a slot, none is dropped. `what` names the case in a panic.
fn check_path(
    table: &mut JobTable,
    from: &[Endpoint; RANKS as usize],
    stream: &mut Stream,
    now: Instant,
    tx: &mut [u8],
    what: &str,
) {
    for i in 0..2 * stream.len() {
        if stream.pos == stream.len() {
            stream.restamp();
        }
        let v = engine(table, from, stream.datagram(stream.pos), now, tx);
        stream.pos += 1;
        match v {
            Verdict::Data(DataOutcome::Taken) if i % 4 != 3 => {}
            Verdict::Data(DataOutcome::Completed { .. }) if i % 4 == 3 => {}
            v => panic!("{what}packet {i}: {v:?}"),
        }
    }
}

/// Benchmarks [`engine`] over `stream` as `id`.
fn bench_engine(
    g: &mut BenchmarkGroup<'_, WallTime>,
    id: BenchmarkId,
    table: &mut JobTable,
    from: &[Endpoint; RANKS as usize],
    stream: &mut Stream,
    now: Instant,
    tx: &mut [u8],
) {
    g.bench_function(id, |b| {
        b.iter_custom(|iters| {
            stream.run(iters, |d| {
                black_box(engine(table, from, d, now, tx));
            })
        })
    });
}

fn data_packet(c: &mut Criterion) {
    let mut g = c.benchmark_group("data_packet");
    g.throughput(Throughput::Elements(1));
    let from: [Endpoint; RANKS as usize] = std::array::from_fn(|r| endpoint(r as u16));
    let now = Instant::now();
    let mut tx = vec![0u8; FRAME];
    for elems in ELEMS {
        let mut table = active_table(elems);
        let mut stream = Stream::new(elems);
        check_path(&mut table, &from, &mut stream, now, &mut tx, "");
        bench_engine(
            &mut g,
            BenchmarkId::new("engine", elems),
            &mut table,
            &from,
            &mut stream,
            now,
            &mut tx,
        );
        // The table's work alone: replies drained but not encoded (what the
        // engine measured before replies were queued by the table).
        g.bench_with_input(
            BenchmarkId::new("engine_no_encode", elems),
            &elems,
            |b, _| {
                b.iter_custom(|iters| {
                    stream.run(iters, |d| {
                        let rank = Header::new_checked(d).map_or(0, |h| h.rank());
                        let from = from[rank as usize % from.len()];
                        black_box(table.handle(d, from, false, now));
                        while let Some(r) = table.poll_reply() {
                            black_box(r);
                        }
                    })
                })
            },
        );
        let job = table.get(JOB).expect("job");
        assert_eq!(job.drops().total(), 0, "{:?}", job.drops());
        assert_eq!(job.counters().retransmits_served, 0);

        // An optional per-packet tag: HMAC-SHA256 of the whole datagram.
        g.bench_with_input(BenchmarkId::new("hmac_tag", elems), &elems, |b, _| {
            b.iter_custom(|iters| {
                stream.run(iters, |d| {
                    let mut m = <Hmac<sha2::Sha256>>::new_from_slice(&SECRET).expect("key");
                    m.update(d);
                    black_box(m.finalize().into_bytes());
                })
            })
        });

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

fn handshake_cost(c: &mut Criterion) {
    let mut g = c.benchmark_group("handshake");
    g.throughput(Throughput::Elements(1));
    let now = Instant::now();
    let mut t = JobTable::new(TableConfig::new(GEN, [9; 32]), now);
    let mut cfg = config(362);
    cfg.n_workers = 1;
    t.add(cfg, MAX_ELEMS_PER_CHUNK).expect("job config");
    let mut hs = handshake(0);
    let mut params = hs.params().clone();
    params.n_workers = 1;
    hs = Handshake::new(params, [1; 16]);
    let mut b = [0u8; 256];
    g.bench_function("switch_side", |bch| {
        bch.iter(|| {
            // The worker's half (one MAC) is inside the loop too; it is
            // measured separately below and subtracted in the docs.
            let v = handshake_join(&mut t, &mut hs, 0, now, &mut b);
            while t.poll_reply().is_some() {}
            black_box(v)
        })
    });
    g.bench_function("worker_mac", |bch| {
        bch.iter(|| black_box(hs.emit_join(0, 0, &mut b)))
    });
    g.finish();
}

fn nack_cost(c: &mut Criterion) {
    use proto::wire::{NackPayload, NACK_PAYLOAD_LEN};
    let mut g = c.benchmark_group("nack");
    g.throughput(Throughput::Elements(1));
    let now = Instant::now();
    let mut t = JobTable::new(TableConfig::new(GEN, [9; 32]), now);
    let mut cfg = config(362);
    cfg.n_workers = 2;
    t.add(cfg, MAX_ELEMS_PER_CHUNK).expect("job config");
    // Rank 0 joins (the job stays joining, waiting for rank 1): its DATA
    // gets NACK 6, tagged under its session.
    let mut params = handshake(0).params().clone();
    params.n_workers = 2;
    let mut hs = Handshake::new(params, [1; 16]);
    handshake_join(&mut t, &mut hs, 0, now, &mut [0u8; 256]);
    while t.poll_reply().is_some() {}
    let guard = hs.session().expect("session");
    let mut d = HeaderRepr::new(MsgType::Data, JOB);
    d.gen = GEN;
    d.count = 1;
    let mut data = [0u8; HEADER_LEN + 4];
    d.emit_to(&mut data).expect("data");
    t.handle(&data, endpoint(0), false, now);
    let member = t.poll_reply().expect("NACK 6");
    let mut stranger = member;
    stranger.to.source.port ^= 1;
    let mut out = [0u8; 256];
    g.bench_function("switch_tag", |bch| {
        bch.iter(|| black_box(t.encode(black_box(&member), &mut out)))
    });
    g.bench_function("switch_untagged", |bch| {
        bch.iter(|| black_box(t.encode(black_box(&stranger), &mut out)))
    });
    let e = t.encode(&member, &mut out).expect("encode");
    assert_eq!(e.len, HEADER_LEN + NACK_PAYLOAD_LEN);
    let head = *out.first_chunk::<HEADER_LEN>().expect("header");
    let nack = NackPayload::parse(&out[HEADER_LEN..e.len]).expect("nack");
    assert!(guard.nack_is_authentic(&head, &nack), "the tag verifies");
    g.bench_function("worker_verify", |bch| {
        bch.iter(|| black_box(guard.nack_is_authentic(black_box(&head), black_box(&nack))))
    });
    let forged = NackPayload {
        tag: [0x3c; 16],
        ..nack
    };
    g.bench_function("worker_reject", |bch| {
        bch.iter(|| black_box(guard.nack_is_authentic(black_box(&head), black_box(&forged))))
    });
    g.finish();
}

/// A job like [`active_table`]'s of `auth`, and each rank's DATA key (from
/// its authenticated JOIN_ACK) when it is `mac`.
fn active_table_auth(elems: u16, auth: AuthMode) -> (JobTable, Vec<PacketKey>) {
    let now = Instant::now();
    let mut t = JobTable::new(TableConfig::new(GEN, [9; 32]), now);
    let mut cfg = config(elems);
    cfg.auth = auth;
    t.add(cfg, MAX_ELEMS_PER_CHUNK).expect("job config");
    let mut b = [0u8; 256];
    let mut hss = Vec::new();
    for rank in 0..RANKS {
        let mut hs = handshake(rank);
        handshake_join(&mut t, &mut hs, rank, now, &mut b);
        hss.push(hs);
    }
    let mut keys: Vec<Option<PacketKey>> = vec![None; RANKS as usize];
    while let Some(r) = t.poll_reply() {
        let e = t.encode(&r, &mut b).expect("encode");
        let h = HeaderRepr::parse(&Header::new_checked(&b[..e.len]).expect("hdr")).expect("hdr");
        let ack = hss[r.rank as usize]
            .on_join_ack(&h, &b[HEADER_LEN..e.len])
            .expect("join ack");
        assert_eq!(ack.auth, auth);
        keys[r.rank as usize] = ack.data_key;
    }
    let keys = match auth {
        AuthMode::Port => Vec::new(),
        AuthMode::Mac => keys.into_iter().map(|k| k.expect("mac key")).collect(),
    };
    (t, keys)
}

fn auth_cost(c: &mut Criterion) {
    const E: u16 = 870;
    let mut g = c.benchmark_group("auth");
    g.throughput(Throughput::Elements(1));
    let from: [Endpoint; RANKS as usize] = std::array::from_fn(|r| endpoint(r as u16));
    let now = Instant::now();
    let mut tx = vec![0u8; FRAME];
    for auth in [AuthMode::Port, AuthMode::Mac] {
        let (mut table, keys) = active_table_auth(E, auth);
        let mut stream = Stream::tagged(E, keys);
        check_path(
            &mut table,
            &from,
            &mut stream,
            now,
            &mut tx,
            &format!("{auth} "),
        );
        bench_engine(
            &mut g,
            BenchmarkId::new(format!("engine_{auth}"), E),
            &mut table,
            &from,
            &mut stream,
            now,
            &mut tx,
        );
        let job = table.get(JOB).expect("job");
        assert_eq!(job.drops().total(), 0, "{:?}", job.drops());
    }
    // One tag over the same 870-float payload, by each candidate MAC.
    let stream = Stream::new(E);
    let d = stream.datagram(0);
    let h = HeaderRepr::parse(&Header::new_checked(d).expect("hdr")).expect("hdr");
    let payload = &d[HEADER_LEN..];
    let gmac = PacketKey::data(&[3; 32]);
    g.bench_with_input(BenchmarkId::new("gmac_tag", E), &E, |b, _| {
        b.iter(|| black_box(gmac.tag(black_box(&h), black_box(payload))))
    });
    // A port job's RESULT token (docs/PROTOCOL.md, "RESULT tokens"): what
    // the switch adds once per fan-out (not per member) and the worker
    // once per RESULT, whatever the payload's size.
    let result_key = PacketKey::result(&SECRET, JOB, GEN, &[5; 8]);
    let token = result_key.token(&h);
    g.bench_function("result_token", |b| {
        b.iter(|| black_box(result_key.token(black_box(&h))))
    });
    g.bench_function("result_token_verify", |b| {
        b.iter(|| black_box(result_key.verify_token(black_box(&h), black_box(&token))))
    });
    {
        use chacha20poly1305::aead::{AeadInPlace, KeyInit};
        let c = chacha20poly1305::ChaCha20Poly1305::new(&[3u8; 32].into());
        let nonce = [1u8; 12];
        g.bench_with_input(BenchmarkId::new("poly1305_tag", E), &E, |b, _| {
            b.iter(|| {
                black_box(
                    c.encrypt_in_place_detached(&nonce.into(), black_box(payload), &mut [])
                        .expect("tag"),
                )
            })
        });
    }
    g.bench_with_input(BenchmarkId::new("hmac_sha256", E), &E, |b, _| {
        b.iter(|| {
            let mut m = <Hmac<sha2::Sha256>>::new_from_slice(&SECRET).expect("key");
            m.update(black_box(payload));
            black_box(m.finalize().into_bytes())
        })
    });
    g.finish();
}

/// A job of `cfg` activated by every rank's handshake (naming its dtype).
fn active_table_of(cfg: JobConfig) -> JobTable {
    let now = Instant::now();
    let dtype = cfg.dtype as u8;
    let mut t = JobTable::new(TableConfig::new(GEN, [9; 32]), now);
    t.add(cfg, MAX_ELEMS_PER_CHUNK).expect("job config");
    let mut b = [0u8; 256];
    for rank in 0..RANKS {
        let v = handshake_join(&mut t, &mut handshake_of(rank, dtype), rank, now, &mut b);
        let want = if rank + 1 == RANKS {
            JoinOutcome::Activated
        } else {
            JoinOutcome::Waiting
        };
        assert_eq!(v, Verdict::Join(want));
    }
    while t.poll_reply().is_some() {}
    t
}

fn stats_cost(c: &mut Criterion) {
    let mut g = c.benchmark_group("stats");
    g.throughput(Throughput::Elements(1));
    let from: [Endpoint; RANKS as usize] = std::array::from_fn(|r| endpoint(r as u16));
    let now = Instant::now();
    let mut tx = vec![0u8; FRAME];
    for (dtype, elems) in [(Dtype::F32, 356u16), (Dtype::Bf16, 712)] {
        for stats in [false, true] {
            let mut table = active_table_of(JobConfig {
                dtype,
                stats,
                ..config(elems)
            });
            let mut stream = Stream::of_dtype(elems, dtype);
            let what = format!("{dtype:?} stats {stats} ");
            check_path(&mut table, &from, &mut stream, now, &mut tx, &what);
            // The path measured is the one with the trailer.
            let last = stream.base.wrapping_add(RING_SEQS - 1);
            let has = table
                .get(JOB)
                .and_then(|j| j.result(last))
                .map(|r| r.payload().len());
            let values = dtype.payload_len(elems);
            let trailer = if stats { proto::stats::STATS_LEN } else { 0 };
            assert_eq!(has, Some(values + trailer), "{what}");
            let name = format!("{}_{}", dtype.name(), if stats { "on" } else { "off" });
            bench_engine(
                &mut g,
                BenchmarkId::new(name, elems),
                &mut table,
                &from,
                &mut stream,
                now,
                &mut tx,
            );
            let job = table.get(JOB).expect("job");
            assert_eq!(job.drops().total(), 0, "{:?}", job.drops());
        }
        // The kernel alone: one payload's squared norm, as the engine takes
        // it on arrival.
        let stream = Stream::of_dtype(elems, dtype);
        let payload = &stream.datagram(0)[HEADER_LEN..];
        let name = format!("{}_norm", dtype.name());
        g.bench_with_input(BenchmarkId::new(name, elems), &elems, |b, _| {
            b.iter(|| {
                black_box(proto::stats::squared_norm_le_blocked(
                    dtype,
                    black_box(payload),
                ))
            })
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    data_packet,
    add_le_f32,
    handshake_cost,
    nack_cost,
    auth_cost,
    stats_cost
);
criterion_main!(benches);
