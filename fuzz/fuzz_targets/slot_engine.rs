//! The switch's job table as a state machine under arbitrary message
//! sequences: one or two small jobs (1..=5 workers, 1..=8 slots, 1..=8
//! elements per chunk), fed JOINs (valid or not), DATA with arbitrary rank,
//! seq, count, collective, generation and values, LEAVEs, HEARTBEATs, window
//! changes, and raw header bytes through `HeaderRepr::parse`.
//!
//! Asserts, besides "never panics":
//! * `Completed { seq }` ⇒ `job.result(seq)` exists and equals, bit for bit,
//!   the rank-order sum (rank 0 + rank 1 + …, f32 additions in that order)
//!   of the first contribution each rank had accepted for `seq` in the
//!   current activation (tracking restarts on `JoinOutcome::Activated`). NaN
//!   elements only need to be NaN on both sides: Rust does not fix NaN
//!   payloads through arithmetic.
//! * DATA is taken (`Taken`/`Completed`) only from the source recorded for
//!   its rank, for a rank below n_workers, while the job is active.
//! * `Retransmit { seq }` ⇒ `job.result(seq)` exists.
//! * A JOIN with a bad secret, wrong parameters, a rank out of range or a
//!   source outside the job's prefixes gets a NACK.
//! * `Activated` ⇒ the job is active with all n ranks joined.
#![no_main]

use std::collections::HashMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use proto::switch::{
    DataOutcome, Endpoint, Ipv4Prefix, JobConfig, JobState, JobTable, JoinOutcome, Source, Verdict,
};
use proto::wire::{
    flags, write_f32s, Header, HeaderRepr, JoinPayload, MsgType, DTYPE_F32, HEADER_LEN,
    MAX_ELEMS_PER_CHUNK, OP_SUM,
};

const JOB_A: u16 = 1;
const JOB_B: u16 = 2;
const JOB_UNKNOWN: u16 = 3;
/// Sources 0..N_SOURCES are inside the jobs' prefix; index N_SOURCES is not.
const N_SOURCES: u8 = 8;
const MAX_OPS: usize = 512;

fn secret(job: u16) -> [u8; 32] {
    let mut s = [0u8; 32];
    for (i, b) in s.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(29) ^ job as u8;
    }
    s
}

/// Source `i`: 10.0.0.(1 + i % 4), port 5000 + i (so 0 and 4 share an
/// address but not a port); `N_SOURCES` and up: 192.168.7.7, outside.
fn source(i: u8) -> Source {
    let i = i % (N_SOURCES + 1);
    if i == N_SOURCES {
        return Source {
            mac: [2, 0, 0, 0, 0, 0xee],
            ip: [192, 168, 7, 7],
            port: 6000,
        };
    }
    Source {
        mac: [2, 0, 0, 0, 0, i],
        ip: [10, 0, 0, 1 + i % 4],
        port: 5000 + i as u16,
    }
}

fn endpoint(i: u8) -> Endpoint {
    Endpoint {
        source: source(i),
        local_mac: [2, 0, 0, 0, 1, 1],
        local_ip: [10, 0, 0, 254],
        local_port: 48879,
        port_idx: (i % (N_SOURCES + 1)) as u32,
        queue: 0,
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct JobSpec {
    n_workers: u8,
    slots_log2: u8,
    elems: u8,
    window: u8,
}

impl JobSpec {
    fn config(self, id: u16) -> JobConfig {
        let pool_slots = 1u16 << (self.slots_log2 % 4);
        JobConfig {
            id,
            n_workers: 1 + (self.n_workers % 5) as u16,
            allowed_sources: vec![Ipv4Prefix {
                addr: [10, 0, 0, 0],
                len: 24,
            }],
            secret: secret(id),
            pool_slots,
            elems_per_chunk: 1 + (self.elems % 8) as u16,
            window: 1 + (self.window as u16 % pool_slots),
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum JobSel {
    A,
    B,
    Unknown,
}

impl JobSel {
    fn id(self) -> u16 {
        match self {
            JobSel::A => JOB_A,
            JobSel::B => JOB_B,
            JobSel::Unknown => JOB_UNKNOWN,
        }
    }
}

/// Where a message comes from.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum SrcSel {
    /// The canonical source of the rank (source index = rank).
    Own,
    /// Any of the sources, the outside one included.
    Other(u8),
}

impl SrcSel {
    fn index(self, rank: u16) -> u8 {
        match self {
            SrcSel::Own => (rank % N_SOURCES as u16) as u8,
            SrcSel::Other(i) => i,
        }
    }
}

/// A DATA seq, relative to the job's current floor or absolute.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum SeqSel {
    Ahead(u8),
    Behind(u8),
    Abs(u32),
}

impl SeqSel {
    fn resolve(self, floor: u32) -> u32 {
        match self {
            SeqSel::Ahead(d) => floor.wrapping_add((d % 20) as u32),
            SeqSel::Behind(d) => floor.wrapping_sub(1 + (d % 20) as u32),
            SeqSel::Abs(v) => v,
        }
    }
}

/// A JOIN's resume seq.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum ResumeSeq {
    Small(u8),
    /// Just below the wrap: u32::MAX − v.
    NearWrap(u8),
    Abs(u32),
}

impl ResumeSeq {
    fn value(self) -> u32 {
        match self {
            ResumeSeq::Small(v) => v as u32,
            ResumeSeq::NearWrap(v) => u32::MAX - v as u32,
            ResumeSeq::Abs(v) => v,
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum JoinFault {
    None,
    BadSecret,
    BadNWorkers,
    BadDtype,
    BadOp,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Join {
        job: JobSel,
        rank: u8,
        src: SrcSel,
        fault: JoinFault,
        collective: u8,
        seq: ResumeSeq,
    },
    Data {
        job: JobSel,
        rank: u8,
        src: SrcSel,
        seq: SeqSel,
        count: u8,
        collective: u8,
        /// Some: this gen (likely stale); None: the switch's.
        gen: Option<u32>,
        flags: u8,
        ce: bool,
        values: [u32; 8],
    },
    /// Every rank (minus `skip`) sends DATA for one seq, in an order drawn
    /// from `order`, from its own source: reaches completions quickly.
    Round {
        job: JobSel,
        seq: SeqSel,
        count: u8,
        collective: u8,
        order: u32,
        skip: u8,
        values: [u32; 8],
    },
    Leave {
        job: JobSel,
        rank: u8,
        src: SrcSel,
    },
    Heartbeat {
        job: JobSel,
        rank: u8,
        src: SrcSel,
    },
    SetWindow {
        job: JobSel,
        window: u8,
    },
    Raw {
        src: u8,
        ce: bool,
        bytes: Vec<u8>,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    gen: u32,
    a: JobSpec,
    b: Option<JobSpec>,
    ops: Vec<Op>,
}

/// Per job: seq → per-rank first accepted contribution (f32 bit patterns).
type Contributions = HashMap<u32, Vec<Option<Vec<u32>>>>;

struct Harness {
    table: JobTable,
    contrib: HashMap<u16, Contributions>,
}

impl Harness {
    /// Emits `repr` + `payload` as bytes, parses them back and feeds them.
    fn send(&mut self, repr: HeaderRepr, payload: &[u8], src: u8, ce: bool) -> Verdict {
        let mut buf = vec![0u8; HEADER_LEN + payload.len()];
        repr.emit_to(&mut buf).unwrap();
        buf[HEADER_LEN..].copy_from_slice(payload);
        let h = Header::new_checked(&buf[..]).unwrap();
        let parsed = HeaderRepr::parse(&h)
            .unwrap_or_else(|e| panic!("harness built an invalid message {repr:?}: {e}"));
        assert_eq!(parsed, repr);
        self.feed(&parsed, h.payload(), endpoint(src), ce)
    }

    /// Feeds one parsed message and checks the invariants on the verdict.
    fn feed(&mut self, hdr: &HeaderRepr, payload: &[u8], from: Endpoint, ce: bool) -> Verdict {
        let before = self
            .table
            .get(hdr.job)
            .map(|j| (j.state(), j.member(hdr.rank).map(|e| e.source)));
        let verdict = self.table.handle(hdr, payload, from, ce);
        match verdict {
            Verdict::Join(JoinOutcome::Activated) => {
                let job = self.table.get(hdr.job).expect("activated an unknown job");
                assert_eq!(job.state(), JobState::Active);
                assert_eq!(job.joined_ranks(), job.n_workers());
                for r in 0..job.n_workers() {
                    assert!(job.member(r).is_some(), "active without rank {r}");
                }
                // A new activation: slots start afresh.
                self.contrib.insert(hdr.job, HashMap::new());
            }
            Verdict::Data(out @ (DataOutcome::Taken | DataOutcome::Completed { .. })) => {
                assert_eq!(hdr.msg_type, MsgType::Data);
                let (state, recorded) = before.expect("DATA taken by an unknown job");
                assert_eq!(state, JobState::Active, "DATA taken by an inactive job");
                assert_eq!(
                    recorded,
                    Some(from.source),
                    "DATA for rank {} taken from a source that is not its recorded one",
                    hdr.rank
                );
                let job = self.table.get(hdr.job).unwrap();
                let n = job.n_workers() as usize;
                assert!((hdr.rank as usize) < n, "DATA taken for rank {}", hdr.rank);
                assert!(hdr.count <= job.config.elems_per_chunk);
                assert_eq!(payload.len(), hdr.count as usize * 4);
                let per_seq = self
                    .contrib
                    .entry(hdr.job)
                    .or_default()
                    .entry(hdr.seq)
                    .or_insert_with(|| vec![None; n]);
                let mine = &mut per_seq[hdr.rank as usize];
                if mine.is_none() {
                    *mine = Some(
                        payload
                            .chunks_exact(4)
                            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                            .collect(),
                    );
                }
                if let DataOutcome::Completed { seq } = out {
                    assert_eq!(seq, hdr.seq, "completed another seq than the DATA's");
                    self.check_completed(hdr.job, seq, hdr.count);
                }
            }
            Verdict::Data(DataOutcome::Retransmit { seq }) => {
                assert_eq!(seq, hdr.seq);
                let job = self.table.get(hdr.job).unwrap();
                assert!(
                    job.result(seq).is_some(),
                    "Retransmit of seq {seq} with no result"
                );
                assert!(job
                    .result_header(seq, hdr.rank, true, self.table.gen())
                    .is_some());
            }
            _ => {}
        }
        verdict
    }

    fn check_completed(&mut self, job_id: u16, seq: u32, count: u16) {
        let contribs = self
            .contrib
            .get_mut(&job_id)
            .and_then(|m| m.remove(&seq))
            .expect("completed a seq nobody contributed to");
        let job = self.table.get(job_id).unwrap();
        let mut expected: Vec<f32> = Vec::new();
        for (r, c) in contribs.iter().enumerate() {
            let c = c
                .as_ref()
                .unwrap_or_else(|| panic!("seq {seq} completed without rank {r}'s contribution"));
            assert_eq!(
                c.len(),
                count as usize,
                "rank {r} contributed another count"
            );
            if r == 0 {
                expected = c.iter().map(|&b| f32::from_bits(b)).collect();
            } else {
                for (a, &b) in expected.iter_mut().zip(c) {
                    *a += f32::from_bits(b);
                }
            }
        }
        let result = job
            .result(seq)
            .unwrap_or_else(|| panic!("seq {seq} completed but job.result(seq) is None"));
        assert_eq!(result.seq, seq);
        let got = result.values;
        assert_eq!(
            got.len(),
            count as usize,
            "result of seq {seq} has another count"
        );
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            let same = g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan());
            assert!(
                same,
                "seq {seq} element {i}: switch {g:?} ({:#010x}) != rank-order sum {e:?} ({:#010x})",
                g.to_bits(),
                e.to_bits()
            );
        }
        let rh = job
            .result_header(seq, 0, false, self.table.gen())
            .expect("result_header of a completed seq");
        assert_eq!(rh.count, count);
        assert_eq!(rh.seq, seq);
    }

    fn floor(&self, job: u16) -> u32 {
        self.table.get(job).map_or(0, |j| j.floor())
    }

    fn n_workers(&self, job: u16) -> u16 {
        self.table.get(job).map_or(1, |j| j.n_workers())
    }

    /// Read-only accessors must not panic in any state.
    fn poke(&self) {
        let gen = self.table.gen();
        for job in self.table.jobs() {
            let _ = job.missing_on_floor();
            let _ = job.members().count();
            let _ = (job.resume_point(), job.window(), job.counters.total_drops());
            let _ = job.join_ack_header(0, gen);
            let _ = job.join_ack_payload();
            let f = job.floor();
            for s in [f.wrapping_sub(1), f, f.wrapping_add(1)] {
                let _ = job.result_header(s, 0, false, gen);
            }
        }
    }
}

fn f32_payload(values: &[u32], count: u16, mix: u32) -> Vec<u8> {
    let vals: Vec<f32> = (0..count as usize)
        .map(|i| f32::from_bits(values[i % values.len()].rotate_left(mix.wrapping_mul(7)) ^ mix))
        .collect();
    let mut out = vec![0u8; vals.len() * 4];
    write_f32s(&vals, &mut out);
    out
}

fn run(input: Input) {
    let mut h = Harness {
        table: JobTable::new(input.gen),
        contrib: HashMap::new(),
    };
    h.table
        .add(input.a.config(JOB_A), MAX_ELEMS_PER_CHUNK)
        .expect("job A is valid");
    if let Some(b) = input.b {
        h.table
            .add(b.config(JOB_B), MAX_ELEMS_PER_CHUNK)
            .expect("job B is valid");
    }

    for op in input.ops.into_iter().take(MAX_OPS) {
        match op {
            Op::Join {
                job,
                rank,
                src,
                fault,
                collective,
                seq,
            } => {
                let id = job.id();
                let rank = (rank % 8) as u16;
                let n = h.n_workers(id);
                let mut payload = [0u8; proto::wire::JOIN_PAYLOAD_LEN];
                let mut j = JoinPayload {
                    n_workers: n,
                    dtype: DTYPE_F32,
                    op: OP_SUM,
                    secret: secret(id),
                };
                match fault {
                    JoinFault::None => {}
                    JoinFault::BadSecret => j.secret[rank as usize % 32] ^= 0x80,
                    JoinFault::BadNWorkers => j.n_workers = n.wrapping_add(1 + rank),
                    JoinFault::BadDtype => j.dtype = DTYPE_F32 + 1,
                    JoinFault::BadOp => j.op = OP_SUM + 1,
                }
                j.emit(&mut payload).unwrap();
                let mut repr = HeaderRepr::new(MsgType::Join, id);
                repr.rank = rank;
                repr.collective = collective as u32;
                repr.seq = seq.value();
                let si = src.index(rank);
                let v = h.send(repr, &payload, si, false);
                let known = h.table.get(id).is_some();
                let allowed = (si % (N_SOURCES + 1)) != N_SOURCES;
                let valid = fault == JoinFault::None && rank < n && allowed;
                if known && !valid {
                    assert!(
                        matches!(v, Verdict::Join(JoinOutcome::Nack(_))),
                        "invalid JOIN ({fault:?}, rank {rank} of {n}, source allowed {allowed}) got {v:?}"
                    );
                }
                if !known {
                    assert_eq!(v, Verdict::NackUnknownJob);
                }
            }
            Op::Data {
                job,
                rank,
                src,
                seq,
                count,
                collective,
                gen,
                flags: fl,
                ce,
                values,
            } => {
                let id = job.id();
                let rank = (rank % 8) as u16;
                let count = 1 + (count % 10) as u16;
                let mut repr = HeaderRepr::new(MsgType::Data, id);
                repr.rank = rank;
                repr.count = count;
                repr.seq = seq.resolve(h.floor(id));
                repr.collective = collective as u32;
                repr.gen = gen.unwrap_or(h.table.gen());
                repr.flags = fl & flags::DEFINED;
                let payload = f32_payload(&values, count, rank as u32);
                h.send(repr, &payload, src.index(rank), ce);
            }
            Op::Round {
                job,
                seq,
                count,
                collective,
                order,
                skip,
                values,
            } => {
                let id = job.id();
                let n = h.n_workers(id);
                let count = 1 + (count % 8) as u16;
                let seq = seq.resolve(h.floor(id));
                // A permutation of 0..n from `order` (Lehmer-code style).
                let mut ranks: Vec<u16> = (0..n).collect();
                let mut o = order;
                let mut perm = Vec::with_capacity(n as usize);
                while !ranks.is_empty() {
                    let k = (o as usize) % ranks.len();
                    o /= ranks.len() as u32;
                    perm.push(ranks.remove(k));
                }
                for r in perm {
                    if skip != 0 && r == (skip % 8) as u16 {
                        continue;
                    }
                    let mut repr = HeaderRepr::new(MsgType::Data, id);
                    repr.rank = r;
                    repr.count = count;
                    repr.seq = seq;
                    repr.collective = collective as u32;
                    repr.gen = h.table.gen();
                    let payload = f32_payload(&values, count, r as u32);
                    h.send(repr, &payload, SrcSel::Own.index(r), false);
                }
            }
            Op::Leave { job, rank, src } | Op::Heartbeat { job, rank, src } => {
                let ty = if matches!(op, Op::Leave { .. }) {
                    MsgType::Leave
                } else {
                    MsgType::Heartbeat
                };
                let rank = (rank % 8) as u16;
                let mut repr = HeaderRepr::new(ty, job.id());
                repr.rank = rank;
                repr.gen = h.table.gen();
                h.send(repr, &[], src.index(rank), false);
            }
            Op::SetWindow { job, window } => {
                if let Some(j) = h.table.get_mut(job.id()) {
                    j.set_window(window as u16);
                    assert!(j.window() >= 1 && j.window() <= j.config.pool_slots);
                }
            }
            Op::Raw { src, ce, bytes } => {
                if let Ok(hd) = Header::new_checked(&bytes[..]) {
                    if let Ok(repr) = HeaderRepr::parse(&hd) {
                        h.feed(&repr, hd.payload(), endpoint(src), ce);
                    }
                }
            }
        }
        h.poke();
    }
}

fuzz_target!(|input: Input| {
    run(input);
});
