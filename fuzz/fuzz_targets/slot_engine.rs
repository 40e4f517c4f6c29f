//! The switch (protocol version 3) as a state machine under arbitrary
//! message sequences, driven as switchd drives it: datagram bytes into its
//! one entry point, `Switch::on_datagram` (the lock-free data path, else
//! the job table), on two threads' counter stripes, every reply it sends
//! collected through the fuzzer's `Transmit`.
//! One or two small jobs (1..=5 workers, 1..=8 slots, 1..=8 elements per
//! chunk), removed and declared again at will; workers join through the real
//! handshake (`Handshake`: HELLO, CHALLENGE, JOIN), with faults: a wrong
//! secret or parameters, a flipped MAC bit, a resume point changed under the
//! MAC, another rank's nonce, a JOIN after the nonce lifetime, a JOIN from a
//! spoofed source, a stale generation, a nonce the switch never issued, and
//! replays of earlier JOINs and LEAVEs. Then DATA with arbitrary rank, seq,
//! count, collective, generation, values and source, whole rounds of DATA in
//! a random rank order, LEAVEs (with their MAC, forged or replayed),
//! HEARTBEATs, window changes, version-1 JOINs, version-2 HELLOs,
//! PROVISIONs (asks, claims and other phases, of any job id, 0 included),
//! raw bytes, and time passing.
//! Time is a fixed base `Instant` plus fuzz-chosen whole milliseconds, so a
//! run is deterministic.
//!
//! Asserts, besides "never panics":
//! * A DATA from a rank's bound member of an active job, at the current
//!   generation, with the job's count and payload length, is taken by the
//!   lock-free data path, and nothing else is (so a harness that only
//!   reached the table fails here); every reply the switch sent is the
//!   very bytes `JobTable::encode` writes for it.
//! * Every RESULT the table encodes equals, bit for bit, the rank-order sum
//!   (rank 0 + rank 1 + …, f32 additions in that order) of the first
//!   contribution each rank had accepted for its seq in the current
//!   activation; NaN elements only need to be NaN on both sides (Rust does
//!   not fix NaN payloads through arithmetic). A completed seq's RESULT goes
//!   to every member once, in rank order; a `Retransmit` goes to the sender
//!   alone, flagged RETX.
//! * DATA is taken (`Taken`/`Completed`) only from the source and switch
//!   port recorded for its rank, for a rank below n_workers, while the job
//!   is active. DATA and HEARTBEAT follow the stranger rule: a wrong
//!   generation gets NACK 7 from any source in the prefixes; at the current
//!   generation only the rank's bound member (kept across resets) is
//!   answered (NACK 6 while joining), anyone else is dropped unanswered.
//! * A HELLO or a NACK over its per-source rate is not answered and is
//!   counted once (`hello_rate_limited`, `nack_rate_limited`).
//! * The table has no tenants: every PROVISION, whatever its job id (an
//!   existing job's included), is refused before any job is looked at with
//!   NACK 12 (unknown tenant) echoing its nonce, to the sender, on the HELLO
//!   budget (over it: dropped, counted), counted as a refusal and changing
//!   nothing else.
//! * JOIN verdicts match a model of the handshake (docs/PROTOCOL.md,
//!   "Joining"): every check in order (source, generation, rank, parameters,
//!   nonce issued to that job, rank and address, MAC), then replay (a nonce
//!   older than the rank's accepted one, its accepted one after the rank's
//!   LEAVE, or one issued before the job was declared, is `Replayed`), repeat (a copy of the accepted JOIN), nonce
//!   lifetime. So a flipped MAC bit, a tampered resume point or a wrong
//!   secret is NACK 2, another rank's nonce, a spoofed source, a never-issued
//!   or an expired nonce is NACK 9, a replay of an older nonce is `Replayed`,
//!   and membership, the job state and the resume point follow the model.
//! * A message that is refused (or a repeat, a HELLO, a HEARTBEAT, a dropped
//!   DATA) changes no job's state, members, resume point, floor, results or
//!   partial sums; a refused message gets at most one reply, no larger than
//!   itself (see `reply_size_floor` for the exceptions proto makes); replies
//!   go only to sources inside the job's prefixes (except NACK 3 to a
//!   HELLO or JOIN, and the version-1 refusal).
//! * Every reply drained right after `handle` encodes, is a valid message,
//!   and is the one its verdict calls for (CHALLENGE echoing the HELLO's
//!   nonce and the observed address, NACKs echoing the refused nonce,
//!   JOIN_ACKs with the resume point, HEARTBEAT answers listing the missing
//!   ranks); LEAVE takes effect only with the MAC over the member's nonce.
//! * `Activated` ⇒ the job is active with all n ranks joined, its resume
//!   point is the lowest the members reported, and the log hears of it; a
//!   refused message logs no event (refusals are only counted).
#![no_main]

use std::collections::{BTreeMap, HashMap};
use std::sync::{MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use proto::auth::{self, JoinClaim};
use proto::handshake::{Handshake, JoinParams};
use proto::seq::serial_lt;
use proto::switch::engine::ResultRef;
use proto::switch::entry::{encode_result, Handoff, Switch, Transmit};
use proto::switch::{
    CounterSchema, DataOutcome, DropReason, Encoded, Endpoint, Event, Ipv4Prefix, JobConfig,
    JobCounters, JobLabel, JobState, JobTable, JoinOutcome, Refusal, RefusalSample, Reply,
    ReplyMsg, Source, TableConfig, Verdict, DEFAULT_NONCE_LIFETIME, REFUSAL_KINDS,
};
use proto::tag::Tag;
use proto::wire::{
    self, flags, write_f32s, ChallengePayload, Header, HeaderRepr, HelloPayload, JoinAckPayload,
    JoinPayload, LeavePayload, MsgType, NackPayload, NackReason, Nonce, ProvisionPayload,
    WireError, DTYPE_F32, HEADER_LEN, JOIN_PAYLOAD_LEN, LEAVE_PAYLOAD_LEN, MAC_LEN,
    MAX_ELEMS_PER_CHUNK, NACK_PAYLOAD_LEN, NONCE_LEN, OP_SUM, PROVISION_PAYLOAD_LEN, SECRET_LEN,
};

const JOB_A: u16 = 1;
const JOB_B: u16 = 2;
const JOB_UNKNOWN: u16 = 3;
/// Sources 0..N_SOURCES are inside the jobs' prefix; index N_SOURCES is not.
const N_SOURCES: u8 = 8;
const MAX_OPS: usize = 512;
/// JOINs and LEAVEs kept for replays.
const MAX_HISTORY: usize = 256;
const LIFETIME_MS: u64 = DEFAULT_NONCE_LIFETIME.as_millis() as u64;

/// The clock's origin: one per process; the table sees only offsets from it.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn secret(job: u16) -> [u8; SECRET_LEN] {
    let mut s = [0u8; SECRET_LEN];
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
        result_lanes: 0,
    }
}

fn allowed(c: &JobConfig, ip: [u8; 4]) -> bool {
    c.allowed_sources.iter().any(|p| p.contains(ip))
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
            dtype: Default::default(),
            window: 1 + (self.window as u16 % pool_slots),
            priority: Default::default(),
            // Trees are covered by proto/tests/simulated_tree.rs.
            auth: Default::default(),
            upstream: None,
            stats: false,
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
    /// Where the rank's membership was recorded (its own if not a member).
    Member,
    /// Any of the sources, the outside one included.
    Other(u8),
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
    /// Some time (under the nonce lifetime) passes between CHALLENGE and JOIN.
    Delay(u16),
    /// The worker's secret is not the job's.
    BadSecret,
    BadNWorkers,
    BadDtype,
    BadOp,
    /// One bit of the MAC flipped.
    FlipMac(u8),
    /// One bit of the resume point flipped after the MAC was computed.
    TamperResume(u8),
    /// A JOIN (MAC right) with the nonce of a CHALLENGE to another rank
    /// (sent to that rank's source, or to ours when the high bit is set).
    ForeignNonce(u8),
    /// Sent after the nonce lifetime (plus this many ms).
    Expired(u16),
    /// Sent from another source than the handshake's.
    Spoof(u8),
    /// A header generation other than the CHALLENGE's (MAC over it).
    StaleGen(u32),
    /// No HELLO: a nonce the switch never issued (MAC right).
    NoChallenge([u8; NONCE_LEN]),
    /// After the JOIN, this rank's previous JOIN again, from its source.
    ReplayPrevious,
}

impl JoinFault {
    /// Faults that must leave the JOIN refused.
    fn is_bad(self) -> bool {
        !matches!(
            self,
            JoinFault::None | JoinFault::Delay(_) | JoinFault::ReplayPrevious
        )
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum LeaveFault {
    None,
    FlipMac(u8),
    /// A MAC under another secret.
    BadSecret,
    /// A LEAVE sent before, again, from the source it came from.
    Replay(u16),
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// A worker joins through the handshake; `unbound` workers learn their
    /// address from the CHALLENGE.
    Join {
        job: JobSel,
        rank: u8,
        src: SrcSel,
        unbound: bool,
        fault: JoinFault,
        collective: u8,
        seq: ResumeSeq,
    },
    /// A JOIN sent before, again: from the source it came from, or another.
    Replay {
        pick: u16,
        from: Option<u8>,
    },
    /// A HELLO whose JOIN never comes.
    Hello {
        job: JobSel,
        rank: u8,
        src: SrcSel,
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
    /// from `order`, from its recorded source: reaches completions quickly.
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
        fault: LeaveFault,
    },
    Heartbeat {
        job: JobSel,
        rank: u8,
        src: SrcSel,
        seq: SeqSel,
        gen: Option<u32>,
    },
    SetWindow {
        job: JobSel,
        window: u8,
    },
    /// Time passes.
    Advance {
        ms: u16,
    },
    /// More than the nonce lifetime passes.
    Expire {
        extra_ms: u16,
    },
    /// The job is removed, and declared again with `spec` if given.
    Redeclare {
        job: JobSel,
        spec: Option<JobSpec>,
    },
    /// A version-1 JOIN.
    V1Join {
        job: u16,
        rank: u16,
        src: u8,
        payload_len: u8,
    },
    /// A version-2 HELLO (40-byte payload when `payload_len` % 64 is 40).
    V2Hello {
        job: u16,
        rank: u16,
        src: u8,
        payload_len: u8,
        nonce: [u8; 16],
    },
    /// A PROVISION (the table has no tenants): `count` 0 an ask, 1 a
    /// claim, else another phase.
    Provision {
        job: u16,
        rank: u16,
        src: u8,
        count: u8,
        tenant: [u8; 4],
        nonce: [u8; 16],
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
    nonce_key: [u8; 4],
    a: JobSpec,
    b: Option<JobSpec>,
    ops: Vec<Op>,
}

/// A nonce the table issued (seen in a CHALLENGE), and to whom.
#[derive(Debug, Clone, Copy)]
struct Issued {
    job: u16,
    rank: u16,
    ip: [u8; 4],
    port: u16,
    at_ms: u64,
    /// Issue order (the nonce serials' order).
    index: u64,
}

#[derive(Debug, Clone)]
struct MemberModel {
    src: u8,
    resume: (u32, u32),
    nonce: Nonce,
    left: bool,
}

/// What the switch should know of one job.
#[derive(Debug, Clone)]
struct JobModel {
    config: JobConfig,
    /// Nonces issued before the job was declared are replays.
    declared_at: u64,
    /// How many times this id was declared (JOINs of an older declaration
    /// may meet other parameters).
    epoch: u32,
    active: bool,
    members: Vec<Option<MemberModel>>,
    /// Per rank, the issue index of the newest nonce accepted.
    accepted: Vec<Option<u64>>,
    /// Per rank, the source its last accepted JOIN bound it to, and whether
    /// its LEAVE spent that JOIN's nonce (kept across resets).
    bound: Vec<Option<(u8, bool)>>,
}

impl JobModel {
    fn new(config: JobConfig, declared_at: u64, epoch: u32) -> JobModel {
        let n = config.n_workers as usize;
        JobModel {
            config,
            declared_at,
            epoch,
            active: false,
            members: vec![None; n],
            accepted: vec![None; n],
            bound: vec![None; n],
        }
    }

    fn n(&self) -> u16 {
        self.config.n_workers
    }

    fn member_src(&self, rank: u16) -> Option<u8> {
        self.members.get(rank as usize)?.as_ref().map(|m| m.src)
    }

    fn reset(&mut self) {
        self.active = false;
        self.members.iter_mut().for_each(|m| *m = None);
    }
}

/// How a message should change the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// Counters only.
    None,
    /// A JOIN with a fresh nonce accepted (`reset`: an active job goes back
    /// to joining).
    Fresh { reset: bool },
    /// A LEAVE taken.
    Leave,
    /// DATA past the membership checks: the slots decide.
    Data,
}

/// The verdict a message should get (`None`: not predicted, DATA in the
/// slots), and how it changes the table.
#[derive(Debug, Clone, Copy)]
struct Expect {
    verdict: Option<Verdict>,
    change: Change,
    /// For a JOIN refused with NACK 9: whether the nonce was unknown (true)
    /// or expired (false).
    nonce_unknown: bool,
}

impl Expect {
    fn exact(v: Verdict) -> Expect {
        Expect {
            verdict: Some(v),
            change: Change::None,
            nonce_unknown: false,
        }
    }
}

/// A seq's slot: (seq, (collective, ece, result bits), missing ranks).
type SlotSnap = (u32, Option<(u32, bool, Vec<u32>)>, Vec<u8>);

/// One job's observable state: what a refused message must not change.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snap {
    state: JobState,
    joined: u16,
    members: Vec<Option<Endpoint>>,
    resume: (u32, u32),
    floor: u32,
    window: u16,
    /// Around the floor: (seq, result, missing ranks).
    slots: Vec<SlotSnap>,
    contributions: u64,
    chunks_completed: u64,
}

/// A reply as sent: the reply, its header (None: the version-1 refusal),
/// payload and length.
#[derive(Debug)]
struct Out {
    reply: Reply,
    hdr: Option<HeaderRepr>,
    bytes: Vec<u8>,
    ce: bool,
}

impl Out {
    fn payload(&self) -> &[u8] {
        &self.bytes[HEADER_LEN..]
    }
}

#[derive(Debug)]
struct SentJoin {
    job: u16,
    rank: u16,
    epoch: u32,
    bytes: Vec<u8>,
    src: u8,
    /// Accepted with a fresh nonce when sent.
    accepted: bool,
}

/// The fuzzer's shell: every reply the switch sends, encoded whole as a
/// socket sends it, in order. One thread owns every socket.
struct Collect {
    thread: usize,
    sent: Vec<(Reply, Vec<u8>, bool)>,
}

impl Transmit for Collect {
    fn route(&mut self, _: &mut Reply) -> Option<usize> {
        Some(self.thread)
    }

    fn send_result(&mut self, r: &Reply, hdr: &HeaderRepr, res: &ResultRef<'_>, token: &Tag) {
        let mut buf = [0u8; 2048];
        let e = encode_result(hdr, res, token, &mut buf)
            .unwrap_or_else(|| panic!("{r:?} does not encode"));
        self.sent.push((*r, buf[..e.len].to_vec(), e.ce));
    }

    fn send_reply(&mut self, r: &Reply, encode: impl FnOnce(&mut [u8]) -> Option<Encoded>) {
        let mut buf = [0u8; 2048];
        let e = encode(&mut buf).unwrap_or_else(|| panic!("{r:?}, sent at once, does not encode"));
        self.sent.push((*r, buf[..e.len].to_vec(), e.ce));
    }

    fn hand_off(&mut self, thread: usize, h: Handoff) {
        panic!("{h:?} handed to thread {thread}: this thread owns every socket");
    }

    fn unsent(&mut self, r: &Reply) {
        panic!("{r:?}, decided at once, could not be made");
    }
}

/// Per job: seq → per-rank first accepted contribution (f32 bit patterns).
type Contributions = HashMap<u32, Vec<Option<Vec<u32>>>>;

struct Harness {
    /// The switch, fed through its one entry point as switchd feeds it.
    switch: Switch,
    clock_ms: u64,
    issued: HashMap<Nonce, Issued>,
    n_issued: u64,
    models: BTreeMap<u16, JobModel>,
    epochs: HashMap<u16, u32>,
    /// Removed jobs and their configs (NACK 1 goes only to their prefixes).
    removed: HashMap<u16, JobConfig>,
    contrib: HashMap<u16, Contributions>,
    /// The RESULT payload (f32 bits) each completed (job, seq) must carry.
    results: HashMap<(u16, u32), Vec<u32>>,
    /// The handshake that wrote the JOIN with each nonce (for its LEAVE).
    handshakes: HashMap<Nonce, Handshake>,
    joins: Vec<SentJoin>,
    leaves: Vec<(Vec<u8>, u8)>,
    hellos: u64,
}

fn parse(bytes: &[u8]) -> Result<HeaderRepr, WireError> {
    Header::new_checked(bytes).and_then(|h| HeaderRepr::parse(&h))
}

/// f32 bits equal, or both NaN.
fn same_f32(a: u32, b: u32) -> bool {
    a == b || (f32::from_bits(a).is_nan() && f32::from_bits(b).is_nan())
}

/// The largest reply a refused message of `len` bytes may get beyond its
/// own size. Handshake messages (HELLO, JOIN, LEAVE) and version-1 JOINs
/// get nothing larger than themselves. Proto makes one exception, to the
/// job's prefixes only: a DATA with fewer than 5 elements or a HEARTBEAT
/// refused with NACK 6/7 (or NACK 1 for a removed job) gets a 58-byte NACK.
fn reply_size_floor(req: Option<&HeaderRepr>) -> usize {
    match req.map(|h| h.msg_type) {
        Some(MsgType::Hello | MsgType::Join | MsgType::Leave) | None => 0,
        Some(_) => HEADER_LEN + NACK_PAYLOAD_LEN,
    }
}

#[allow(clippy::too_many_arguments)]
fn forge_join(
    job: u16,
    rank: u16,
    gen: u32,
    resume: (u32, u32),
    params: (u16, u8, u8),
    nonce: Nonce,
    secret: &[u8; SECRET_LEN],
    src: Source,
) -> Vec<u8> {
    let mut h = HeaderRepr::new(MsgType::Join, job);
    h.rank = rank;
    h.gen = gen;
    h.collective = resume.0;
    h.seq = resume.1;
    let claim = JoinClaim {
        job,
        rank,
        gen,
        collective: resume.0,
        seq: resume.1,
        n_workers: params.0,
        dtype: params.1,
        op: params.2,
        ip: src.ip,
        port: src.port,
    };
    let p = JoinPayload {
        n_workers: params.0,
        dtype: params.1,
        op: params.2,
        nonce,
        mac: auth::join_mac(secret, &claim, &nonce),
    };
    let mut b = vec![0u8; HEADER_LEN + JOIN_PAYLOAD_LEN];
    h.emit_to(&mut b).unwrap();
    p.emit(&mut b[HEADER_LEN..]).unwrap();
    b
}

fn forge_leave(job: u16, rank: u16, gen: u32, nonce: &Nonce, secret: &[u8; SECRET_LEN]) -> Vec<u8> {
    let mut h = HeaderRepr::new(MsgType::Leave, job);
    h.rank = rank;
    h.gen = gen;
    let mut b = vec![0u8; HEADER_LEN + LEAVE_PAYLOAD_LEN];
    h.emit_to(&mut b).unwrap();
    let mac = auth::leave_mac(secret, job, rank, gen, nonce);
    LeavePayload { mac }.emit(&mut b[HEADER_LEN..]).unwrap();
    b
}

fn join_nonce(join_bytes: &[u8]) -> Nonce {
    JoinPayload::parse(&join_bytes[HEADER_LEN..]).unwrap().nonce
}

fn f32_payload(values: &[u32], count: u16, mix: u32) -> Vec<u8> {
    let vals: Vec<f32> = (0..count as usize)
        .map(|i| f32::from_bits(values[i % values.len()].rotate_left(mix.wrapping_mul(7)) ^ mix))
        .collect();
    let mut out = vec![0u8; vals.len() * 4];
    write_f32s(&vals, &mut out);
    out
}

impl Harness {
    /// The job table, locked until the guard is dropped.
    fn table(&self) -> MutexGuard<'_, JobTable> {
        self.switch.table()
    }

    fn now(&self) -> Instant {
        base() + Duration::from_millis(self.clock_ms)
    }

    fn advance(&mut self, ms: u64) {
        self.clock_ms += ms;
    }

    fn gen(&self) -> u32 {
        self.switch.gen()
    }

    fn declare(&mut self, id: u16, spec: JobSpec) {
        let config = spec.config(id);
        self.table()
            .add(config.clone(), MAX_ELEMS_PER_CHUNK)
            .expect("a valid job");
        let epoch = self.epochs.entry(id).or_default();
        *epoch += 1;
        let model = JobModel::new(config, self.n_issued, *epoch);
        self.models.insert(id, model);
        self.removed.remove(&id);
        self.forget_sums(id);
    }

    fn forget_sums(&mut self, id: u16) {
        self.contrib.insert(id, HashMap::new());
        self.results.retain(|&(j, _), _| j != id);
    }

    fn src_index(&self, job: u16, rank: u16, sel: SrcSel) -> u8 {
        let own = (rank % N_SOURCES as u16) as u8;
        match sel {
            SrcSel::Own => own,
            SrcSel::Member => self
                .models
                .get(&job)
                .and_then(|m| m.member_src(rank))
                .unwrap_or(own),
            SrcSel::Other(i) => i % (N_SOURCES + 1),
        }
    }

    fn floor(&self, job: u16) -> u32 {
        self.table().get(job).map_or(0, |j| j.floor())
    }

    fn snapshot(&self) -> BTreeMap<u16, Snap> {
        let mut out = BTreeMap::new();
        for job in self.table().jobs() {
            let s = job.config.pool_slots as u32;
            let f = job.floor();
            let slots = (0..4 * s)
                .map(|i| {
                    let seq = f.wrapping_sub(2 * s).wrapping_add(i);
                    let res = job.result(seq).map(|r| {
                        let bits = r.values().iter().map(|v| v.to_bits()).collect();
                        (r.collective, r.ece, bits)
                    });
                    let mut missing = [0u8; 16];
                    let k = job.write_missing_ranks(seq, &mut missing);
                    (seq, res, missing[..2 * k].to_vec())
                })
                .collect();
            out.insert(
                job.id(),
                Snap {
                    state: job.state(),
                    joined: job.joined_ranks(),
                    members: (0..job.n_workers())
                        .map(|r| job.member(r).copied())
                        .collect(),
                    resume: job.resume_point(),
                    floor: f,
                    window: job.window(),
                    slots,
                    contributions: job.counters().contributions,
                    chunks_completed: job.counters().chunks_completed,
                },
            );
        }
        out
    }

    /// What a JOIN to a declared job should get.
    fn expect_join(&self, hdr: &HeaderRepr, join: &JoinPayload, from: &Endpoint) -> Expect {
        let m = &self.models[&hdr.job];
        let c = &m.config;
        let src = from.source;
        let nack = |r| Expect::exact(Verdict::Join(JoinOutcome::Nack(r)));
        if !allowed(c, src.ip) {
            return nack(NackReason::SourceNotAllowed);
        }
        if hdr.gen != self.gen() {
            return nack(NackReason::StaleGeneration);
        }
        if hdr.rank >= c.n_workers {
            return nack(NackReason::RankOutOfRange);
        }
        if join.n_workers != c.n_workers || join.dtype != DTYPE_F32 || join.op != OP_SUM {
            return nack(NackReason::ParametersDiffer);
        }
        let Some(iss) = self
            .issued
            .get(&join.nonce)
            .filter(|i| (i.job, i.rank, i.ip, i.port) == (hdr.job, hdr.rank, src.ip, src.port))
        else {
            let mut e = nack(NackReason::StaleNonce);
            e.nonce_unknown = true;
            return e;
        };
        let claim = JoinClaim {
            job: hdr.job,
            rank: hdr.rank,
            gen: hdr.gen,
            collective: hdr.collective,
            seq: hdr.seq,
            n_workers: join.n_workers,
            dtype: join.dtype,
            op: join.op,
            ip: src.ip,
            port: src.port,
        };
        if !auth::verify_join(&c.secret, &claim, &join.nonce, &join.mac) {
            return nack(NackReason::BadSecret);
        }
        let r = hdr.rank as usize;
        let spent = m.accepted[r] == Some(iss.index) && m.bound[r].is_some_and(|b| b.1);
        if m.accepted[r].is_some_and(|a| iss.index < a) || iss.index < m.declared_at || spent {
            return Expect::exact(Verdict::Join(JoinOutcome::Replayed));
        }
        let recorded = m.members[r]
            .as_ref()
            .is_some_and(|mm| mm.nonce == join.nonce);
        if m.accepted[r] == Some(iss.index) && recorded {
            let out = if m.active {
                JoinOutcome::AckAgain
            } else {
                JoinOutcome::Waiting
            };
            return Expect::exact(Verdict::Join(out));
        }
        if self.clock_ms.saturating_sub(iss.at_ms) > LIFETIME_MS {
            return nack(NackReason::StaleNonce);
        }
        let fresh = |out, reset| Expect {
            verdict: Some(Verdict::Join(out)),
            change: Change::Fresh { reset },
            nonce_unknown: false,
        };
        if m.active {
            if let Some(mm) = &m.members[r] {
                if source(mm.src) == src && mm.resume == (hdr.collective, hdr.seq) && !mm.left {
                    return fresh(JoinOutcome::AckAgain, false);
                }
            }
            let out = if c.n_workers == 1 {
                JoinOutcome::Activated
            } else {
                JoinOutcome::Waiting
            };
            return fresh(out, true);
        }
        let joined = m.members.iter().flatten().count() + m.members[r].is_none() as usize;
        let out = if joined == c.n_workers as usize {
            JoinOutcome::Activated
        } else {
            JoinOutcome::Waiting
        };
        fresh(out, false)
    }

    /// Whether `bytes` is a version-1 JOIN the switch answers: a whole one
    /// (36-byte payload), for a declared job, from inside its prefixes.
    fn v1_join_answered(&self, bytes: &[u8], from: &Endpoint) -> bool {
        bytes.len() == HEADER_LEN + 36
            && wire::peek_v1(bytes).is_some_and(|(ty, job, _)| {
                ty == MsgType::Join as u8
                    && self
                        .models
                        .get(&job)
                        .is_some_and(|m| allowed(&m.config, from.source.ip))
            })
    }

    /// Whether `bytes` is a whole version-2 HELLO the switch answers (for a
    /// declared job, from inside its prefixes).
    fn v2_hello_answered(&self, bytes: &[u8], from: &Endpoint) -> bool {
        wire::peek_old_hello(bytes).is_some_and(|(_, job, _, _)| {
            self.models
                .get(&job)
                .is_some_and(|m| allowed(&m.config, from.source.ip))
        })
    }

    /// The stranger rule for DATA and HEARTBEAT: `None` when the message
    /// is from the rank's bound member at the switch's generation and the
    /// job is active; else its NACK (7 to any source in the prefixes, 6
    /// only to the bound member) or its drop.
    fn admit(&self, m: &JobModel, hdr: &HeaderRepr, from: &Endpoint) -> Option<DataOutcome> {
        let ok = allowed(&m.config, from.source.ip);
        if hdr.gen != self.gen() {
            return Some(if ok {
                DataOutcome::Nack(NackReason::StaleGeneration)
            } else {
                DataOutcome::Dropped(DropReason::SourceNotAllowed)
            });
        }
        let Some(bound) = m.bound.get(hdr.rank as usize) else {
            return Some(DataOutcome::Dropped(DropReason::RankOutOfRange));
        };
        let mismatch = match bound {
            Some((b, _)) if source(*b) != from.source => Some(DropReason::SourceMismatch),
            Some((b, _)) if endpoint(*b).port_idx != from.port_idx => Some(DropReason::WrongPort),
            Some(_) => None,
            None if !ok => Some(DropReason::SourceNotAllowed),
            None if m.active => Some(DropReason::SourceMismatch),
            None => Some(DropReason::NotActive),
        };
        if let Some(d) = mismatch {
            return Some(DataOutcome::Dropped(d));
        }
        (!m.active).then_some(DataOutcome::Nack(NackReason::JobNotActive))
    }

    /// What a parsed message should get.
    fn expect(&self, hdr: &HeaderRepr, payload: &[u8], from: &Endpoint) -> Expect {
        let src = from.source;
        // Before any job is looked at; no tenant exists here.
        if hdr.msg_type == MsgType::Provision {
            return Expect::exact(Verdict::ProvisionRefused(NackReason::UnknownTenant));
        }
        let Some(m) = self.models.get(&hdr.job) else {
            let v = match hdr.msg_type {
                MsgType::Hello | MsgType::Join => Verdict::NackUnknownJob,
                MsgType::Data | MsgType::Heartbeat
                    if self
                        .removed
                        .get(&hdr.job)
                        .is_some_and(|c| allowed(c, src.ip)) =>
                {
                    Verdict::NackUnknownJob
                }
                _ => Verdict::Dropped(None),
            };
            return Expect::exact(v);
        };
        let c = &m.config;
        let rank = hdr.rank as usize;
        let member = m.members.get(rank).and_then(|x| x.as_ref());
        match hdr.msg_type {
            MsgType::Hello => Expect::exact(if !allowed(c, src.ip) {
                Verdict::Join(JoinOutcome::Nack(NackReason::SourceNotAllowed))
            } else if hdr.rank >= c.n_workers {
                Verdict::Join(JoinOutcome::Nack(NackReason::RankOutOfRange))
            } else {
                Verdict::Challenged
            }),
            MsgType::Join => self.expect_join(hdr, &JoinPayload::parse(payload).unwrap(), from),
            MsgType::Leave => {
                let leave = LeavePayload::parse(payload).unwrap();
                let why = match member {
                    None => Some(DropReason::RankOutOfRange),
                    Some(mm) if source(mm.src) != src => Some(DropReason::SourceMismatch),
                    Some(mm) => {
                        let (job, r, gen) = (hdr.job, hdr.rank, self.gen());
                        if auth::verify_leave(&c.secret, job, r, gen, &mm.nonce, &leave.mac) {
                            None
                        } else {
                            Some(DropReason::Unauthenticated)
                        }
                    }
                };
                match why {
                    Some(r) => Expect::exact(Verdict::Dropped(Some(r))),
                    None => Expect {
                        verdict: Some(Verdict::Noted),
                        change: Change::Leave,
                        nonce_unknown: false,
                    },
                }
            }
            MsgType::Heartbeat => Expect::exact(match self.admit(m, hdr, from) {
                None => Verdict::Heartbeat { seq: hdr.seq },
                Some(DataOutcome::Dropped(d)) => Verdict::Dropped(Some(d)),
                Some(out) => Verdict::Data(out),
            }),
            MsgType::Data => {
                let drop = |d| Verdict::Data(DataOutcome::Dropped(d));
                let v = if let Some(out) = self.admit(m, hdr, from) {
                    Verdict::Data(out)
                } else if hdr.count > c.elems_per_chunk {
                    drop(DropReason::CountMismatch)
                } else {
                    return Expect {
                        verdict: None,
                        change: Change::Data,
                        nonce_unknown: false,
                    };
                };
                Expect::exact(v)
            }
            MsgType::Result
            | MsgType::JoinAck
            | MsgType::Nack
            | MsgType::Challenge
            | MsgType::Provision
            | MsgType::Provisioned => {
                Expect::exact(Verdict::Dropped(Some(DropReason::UnexpectedType)))
            }
        }
    }

    /// Feeds one datagram as the shell does, checks the verdict against the
    /// model, drains and checks the replies. Returns the verdict and replies.
    fn feed(&mut self, bytes: &[u8], src: u8, ce: bool) -> (Verdict, Vec<Out>) {
        let from = endpoint(src);
        let parsed = parse(bytes);
        let before = self.snapshot();
        let counters_before: HashMap<u16, JobCounters> = self
            .table()
            .jobs()
            .map(|j| (j.id(), j.counters().clone()))
            .collect();
        let mut expect = match &parsed {
            Ok(h) => self.expect(h, &bytes[HEADER_LEN..], &from),
            Err(e) => Expect::exact(Verdict::Malformed(*e)),
        };
        let now = self.now();
        let refusals_before = *self.table().refusals();
        let limited_before = {
            let c = &self.table().counters;
            (c.hello_rate_limited, c.nack_rate_limited)
        };
        // DATA the lock-free path must take: from the rank's bound member
        // of an active job at this generation, with the job's count and
        // length (the model's view; a port-auth job, not a leaf).
        let must_be_lock_free = parsed.as_ref().is_ok_and(|h| {
            let Some(m) = self.models.get(&h.job) else {
                return false;
            };
            let c = &m.config;
            let len = if h.no_values() {
                0
            } else {
                c.dtype.payload_len(h.count)
            };
            h.msg_type == MsgType::Data
                && m.active
                && self.admit(m, h, &from).is_none()
                && h.count <= c.elems_per_chunk
                && bytes.len() == HEADER_LEN + len
        });
        // Thread by source: the data path's counter stripes of two threads;
        // every socket is this thread's (no hand-offs, replies in order).
        let mut shell = Collect {
            thread: usize::from(src) % 2,
            sent: Vec::new(),
        };
        let handled = self
            .switch
            .on_datagram(shell.thread, bytes, from, ce, now, &mut shell);
        let v = handled.verdict;
        assert_eq!(
            handled.lock_free, must_be_lock_free,
            "{parsed:?} from source {src}: {v:?} took the wrong path"
        );
        // Rate limits (per address and switch port, keyed buckets the
        // model cannot see): a HELLO of a declared job may be dropped, and
        // any NACK may go unsent, each counted once.
        let hello_limited = self.table().counters.hello_rate_limited - limited_before.0;
        let nack_limited = self.table().counters.nack_rate_limited - limited_before.1;
        assert!(hello_limited <= 1 && nack_limited <= 1);
        if v == Verdict::RateLimited {
            assert_eq!(hello_limited, 1, "RateLimited not counted");
            assert!(
                matches!(&parsed, Ok(h) if (h.msg_type == MsgType::Hello && self.models.contains_key(&h.job))
                    || h.msg_type == MsgType::Provision),
                "{parsed:?} rate-limited"
            );
            expect = Expect::exact(Verdict::RateLimited);
        } else {
            assert_eq!(hello_limited, 0, "{v:?} counted as a rate-limited HELLO");
        }
        if let Some(want) = expect.verdict {
            assert_eq!(
                v, want,
                "verdict differs from the model for {parsed:?} from source {src}"
            );
        }
        let hdr = parsed.ok();
        self.check_verdict(hdr.as_ref(), bytes, &from, v, expect, &before);
        if let (Some(h), Some(cb)) = (&hdr, hdr.as_ref().and_then(|h| counters_before.get(&h.job)))
        {
            self.check_counters(h, v, expect, cb);
        }
        let outs = self.drain(shell.sent);
        self.check_replies(hdr.as_ref(), bytes, &from, v, &outs, nack_limited == 1);
        self.check_log(hdr.as_ref(), bytes, &from, v, &refusals_before);
        self.check_model();
        (v, outs)
    }

    fn check_verdict(
        &mut self,
        hdr: Option<&HeaderRepr>,
        bytes: &[u8],
        from: &Endpoint,
        v: Verdict,
        expect: Expect,
        before: &BTreeMap<u16, Snap>,
    ) {
        let src = from.source;
        let mut changed = expect.change != Change::None;
        match (expect.change, v) {
            (Change::Fresh { reset }, Verdict::Join(out)) => {
                let h = hdr.unwrap();
                let join = JoinPayload::parse(&bytes[HEADER_LEN..]).unwrap();
                let index = self.issued[&join.nonce].index;
                let src_idx = from.port_idx as u8;
                let m = self.models.get_mut(&h.job).unwrap();
                let r = h.rank as usize;
                m.accepted[r] = Some(index);
                m.bound[r] = Some((src_idx, false));
                if out == JoinOutcome::AckAgain {
                    // Same source and resume point: only the nonce changes.
                    m.members[r].as_mut().unwrap().nonce = join.nonce;
                    changed = false;
                } else {
                    if reset {
                        m.reset();
                    }
                    m.members[r] = Some(MemberModel {
                        src: src_idx,
                        resume: (h.collective, h.seq),
                        nonce: join.nonce,
                        left: false,
                    });
                }
                if out == JoinOutcome::Activated {
                    m.active = true;
                    let want = lowest_resume(m);
                    let table = self.table();
                    let job = table.get(h.job).unwrap();
                    assert_eq!(job.state(), JobState::Active);
                    assert_eq!(job.joined_ranks(), job.n_workers());
                    for r in 0..job.n_workers() {
                        assert!(job.member(r).is_some(), "active without rank {r}");
                    }
                    assert_eq!(job.resume_point(), want, "not the lowest resume point");
                    assert_eq!(job.floor(), want.1);
                    drop(table);
                    // A new activation: slots start afresh.
                    self.forget_sums(h.job);
                }
            }
            (Change::Leave, Verdict::Noted) => {
                let h = hdr.unwrap();
                let m = self.models.get_mut(&h.job).unwrap();
                m.members[h.rank as usize].as_mut().unwrap().left = true;
                if let Some(b) = &mut m.bound[h.rank as usize] {
                    b.1 = true;
                }
                if m.members.iter().flatten().all(|mm| mm.left) {
                    m.reset();
                } else {
                    changed = false;
                }
            }
            (
                Change::Data,
                Verdict::Data(out @ (DataOutcome::Taken | DataOutcome::Completed { .. })),
            ) => {
                let h = hdr.unwrap();
                let snap = before.get(&h.job).expect("DATA taken by an unknown job");
                assert_eq!(
                    snap.state,
                    JobState::Active,
                    "DATA taken by an inactive job"
                );
                assert!(
                    (h.rank as usize) < snap.members.len(),
                    "DATA taken for rank {}",
                    h.rank
                );
                assert_eq!(
                    snap.members[h.rank as usize].map(|e| (e.source, e.port_idx)),
                    Some((src, from.port_idx)),
                    "DATA for rank {} taken from a source or switch port that is not its recorded one",
                    h.rank
                );
                let table = self.table();
                let job = table.get(h.job).unwrap();
                let n = job.n_workers() as usize;
                assert!(h.count <= job.config.elems_per_chunk);
                drop(table);
                let payload = &bytes[HEADER_LEN..];
                assert_eq!(payload.len(), h.count as usize * 4);
                let per_seq = self
                    .contrib
                    .entry(h.job)
                    .or_default()
                    .entry(h.seq)
                    .or_insert_with(|| vec![None; n]);
                let mine = &mut per_seq[h.rank as usize];
                if mine.is_none() {
                    *mine = Some(
                        payload
                            .chunks_exact(4)
                            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                            .collect(),
                    );
                }
                if let DataOutcome::Completed { seq } = out {
                    assert_eq!(seq, h.seq, "completed another seq than the DATA's");
                    self.check_completed(h.job, seq, h.count);
                }
            }
            (Change::Data, Verdict::Data(DataOutcome::Retransmit { seq })) => {
                let h = hdr.unwrap();
                assert_eq!(seq, h.seq);
                let table = self.table();
                let job = table.get(h.job).unwrap();
                assert!(
                    job.result(seq).is_some(),
                    "Retransmit of seq {seq} with no result"
                );
                assert!(job.result_header(seq, h.rank, true, self.gen()).is_some());
                changed = false;
            }
            (Change::Data, Verdict::Data(DataOutcome::Dropped(_))) => changed = false,
            (Change::None, _) => {}
            (c, v) => panic!("{c:?} expected, verdict {v:?}"),
        }
        if !changed {
            assert_eq!(
                &self.snapshot(),
                before,
                "{v:?} for {hdr:?} changed a job's state, members or sums"
            );
        }
    }

    fn check_counters(&self, h: &HeaderRepr, v: Verdict, expect: Expect, cb: &JobCounters) {
        let table = self.table();
        let Some(job) = table.get(h.job) else {
            return;
        };
        let c = job.counters();
        if h.msg_type == MsgType::Join {
            assert_eq!(c.joins, cb.joins + 1, "JOIN not counted");
            let d = |a: u64, b: u64| a - b;
            let bumped = (
                d(c.join_replays, cb.join_replays),
                d(c.join_repeats, cb.join_repeats),
                d(c.join_bad_mac, cb.join_bad_mac),
                d(c.join_bad_nonce, cb.join_bad_nonce),
                d(c.join_stale_nonce, cb.join_stale_nonce),
            );
            let want = match v {
                Verdict::Join(JoinOutcome::Replayed) => (1, 0, 0, 0, 0),
                Verdict::Join(JoinOutcome::Nack(NackReason::BadSecret)) => (0, 0, 1, 0, 0),
                Verdict::Join(JoinOutcome::Nack(NackReason::StaleNonce))
                    if expect.nonce_unknown =>
                {
                    (0, 0, 0, 1, 0)
                }
                Verdict::Join(JoinOutcome::Nack(NackReason::StaleNonce)) => (0, 0, 0, 0, 1),
                Verdict::Join(JoinOutcome::Waiting | JoinOutcome::AckAgain)
                    if expect.change == Change::None =>
                {
                    (0, 1, 0, 0, 0)
                }
                _ => (0, 0, 0, 0, 0),
            };
            assert_eq!(bumped, want, "JOIN counters for {v:?}");
        }
        if let Verdict::Join(JoinOutcome::Nack(_)) | Verdict::Data(DataOutcome::Nack(_)) = v {
            assert_eq!(c.nacks, cb.nacks + 1, "NACK not counted");
        }
    }

    fn check_completed(&mut self, job_id: u16, seq: u32, count: u16) {
        let contribs = self
            .contrib
            .get_mut(&job_id)
            .and_then(|m| m.remove(&seq))
            .expect("completed a seq nobody contributed to");
        let table = self.table();
        let job = table.get(job_id).unwrap();
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
        let expected: Vec<u32> = expected.iter().map(|v| v.to_bits()).collect();
        let result = job
            .result(seq)
            .unwrap_or_else(|| panic!("seq {seq} completed but job.result(seq) is None"));
        assert_eq!(result.seq, seq);
        check_sum(seq, result.values().iter().map(|v| v.to_bits()), &expected);
        let rh = job
            .result_header(seq, 0, false, self.gen())
            .expect("result_header of a completed seq");
        assert_eq!(rh.count, count);
        assert_eq!(rh.seq, seq);
        drop(result);
        drop(table);
        self.results.insert((job_id, seq), expected);
    }

    /// Every reply the switch sent for one datagram, checked as encoded
    /// again by the table: a buffer too short is refused, never overrun,
    /// and the table writes the very bytes the entry point sent (the data
    /// path's RESULT encoding is the table's).
    fn drain(&mut self, sent: Vec<(Reply, Vec<u8>, bool)>) -> Vec<Out> {
        let mut outs = Vec::new();
        let table = self.table();
        for (r, bytes, ce) in sent {
            let mut buf = [0u8; 2048];
            let e = table
                .encode(&r, &mut buf)
                .unwrap_or_else(|| panic!("{r:?}, sent at once, does not encode again"));
            assert_eq!(
                (&buf[..e.len], e.ce),
                (&bytes[..], ce),
                "{r:?}: the table encodes other bytes than were sent"
            );
            assert!(table.encode(&r, &mut [0u8; HEADER_LEN - 1]).is_none());
            let mut short = vec![0u8; e.len - 1];
            if let Some(s) = table.encode(&r, &mut short) {
                assert!(s.len < e.len);
            }
            let hdr = match r.msg {
                ReplyMsg::VersionRefusal | ReplyMsg::OldRefusal { .. } => None,
                _ => Some(parse(&bytes).unwrap_or_else(|err| {
                    panic!("the switch sent an invalid message ({err}) for {r:?}: {bytes:?}")
                })),
            };
            outs.push(Out {
                reply: r,
                hdr,
                bytes,
                ce,
            });
        }
        assert!(!table.has_replies());
        outs
    }

    /// Each reply alone: well-formed, addressed right, carrying what it should.
    fn check_reply(&mut self, o: &Out) {
        let r = &o.reply;
        let Some(h) = o.hdr else {
            let mut want = [0u8; 64];
            let n = match r.msg {
                ReplyMsg::OldRefusal { version, echo } => {
                    wire::emit_old_refusal(version, r.job, r.rank, &echo, &mut want).unwrap()
                }
                _ => wire::emit_v1_refusal(r.job, r.rank, &mut want).unwrap(),
            };
            assert_eq!(&o.bytes[..], &want[..n], "version-1, -2 or -3 refusal");
            return;
        };
        assert_eq!((h.job, h.rank, h.gen), (r.job, r.rank, self.gen()), "{r:?}");
        let model = self.models.get(&r.job);
        let member_ep = model.and_then(|m| m.member_src(r.rank)).map(endpoint);
        match r.msg {
            ReplyMsg::Result { seq, retx } => {
                assert_eq!(h.msg_type, MsgType::Result);
                assert_eq!(h.seq, seq);
                assert_eq!(h.has_flag(flags::RETX), retx);
                assert_eq!(h.has_flag(flags::ECE), o.ce, "ECE flag and CE mark differ");
                assert_eq!(Some(r.to), member_ep, "RESULT to someone not the member");
                let want = self
                    .results
                    .get(&(r.job, seq))
                    .unwrap_or_else(|| panic!("a RESULT for seq {seq} that did not complete"));
                assert_eq!(h.count as usize, want.len());
                // The values, then the token of the job's activation
                // (docs/PROTOCOL.md, "RESULT tokens").
                let (values, token) = o
                    .payload()
                    .split_at(o.payload().len().saturating_sub(proto::tag::TAG_LEN));
                let table = self.table();
                let job = table.get(r.job).unwrap();
                let key =
                    proto::tag::PacketKey::result(&secret(r.job), r.job, self.gen(), &job.epoch());
                assert!(
                    key.verify_token(&h, token),
                    "a RESULT without its token: {h:?}"
                );
                let got = values
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                check_sum(seq, got, want);
            }
            ReplyMsg::JoinAck => {
                assert_eq!(h.msg_type, MsgType::JoinAck);
                assert_eq!(Some(r.to), member_ep, "JOIN_ACK to someone not the member");
                let table = self.table();
                let job = table.get(r.job).unwrap();
                assert_eq!((h.collective, h.seq), job.resume_point());
                assert_eq!(
                    JoinAckPayload::parse(o.payload()).ok(),
                    job.join_ack_payload(r.rank, &h)
                );
            }
            ReplyMsg::Nack { reason, echo } => {
                assert_eq!(h.msg_type, MsgType::Nack);
                let n = NackPayload::parse(o.payload()).unwrap();
                assert_eq!((n.reason, n.echo), (reason, echo));
                // Tagged exactly when the switch has a session with that
                // rank at that source (always for a current member), and
                // then the tag verifies under it (docs/PROTOCOL.md,
                // "Sessions").
                let table = self.table();
                let key = table
                    .get(r.job)
                    .and_then(|j| j.session_key_for(r.rank, &r.to));
                let head = o.bytes.first_chunk::<HEADER_LEN>().unwrap();
                match key {
                    Some(k) => assert!(
                        proto::auth::verify_nack(k, head, reason as u16, &echo, &n.tag),
                        "a NACK to a session's source whose tag does not verify"
                    ),
                    None => assert_eq!(n.tag, [0; 16], "a tag without a session"),
                }
                if Some(r.to) == member_ep {
                    assert!(key.is_some(), "a NACK to a member without its session");
                }
            }
            ReplyMsg::ProvisionRefusal {
                reason,
                detail,
                echo,
            } => {
                // Untagged: there is no session before a job exists.
                assert_eq!(h.msg_type, MsgType::Nack);
                let n = NackPayload::parse(o.payload()).unwrap();
                assert_eq!((n.reason, n.detail, n.echo), (reason, detail, echo));
                assert_eq!(n.tag, [0; 16], "a PROVISION's NACK with a tag");
            }
            ReplyMsg::ProvisionChallenge { .. } | ReplyMsg::Provisioned { .. } => {
                panic!("{r:?} from a table without tenants")
            }
            ReplyMsg::Challenge { hello_nonce, nonce } => {
                assert_eq!(h.msg_type, MsgType::Challenge);
                let c = ChallengePayload::parse(o.payload()).unwrap();
                assert_eq!((c.hello_nonce, c.nonce), (hello_nonce, nonce));
                assert_eq!(
                    (c.observed_ip, c.observed_port),
                    (r.to.source.ip, r.to.source.port)
                );
                let fresh = Issued {
                    job: r.job,
                    rank: r.rank,
                    ip: r.to.source.ip,
                    port: r.to.source.port,
                    at_ms: self.clock_ms,
                    index: self.n_issued,
                };
                self.n_issued += 1;
                let old = self.issued.insert(nonce, fresh);
                assert!(old.is_none(), "a nonce issued twice");
            }
            ReplyMsg::Missing { seq } => {
                assert_eq!(h.msg_type, MsgType::Heartbeat);
                assert_eq!(h.seq, seq);
                let table = self.table();
                let job = table.get(r.job).unwrap();
                assert_eq!(h.window, job.window());
                let mut want = [0u8; 16];
                let k = job.write_missing_ranks(seq, &mut want);
                assert_eq!(h.count as usize, k);
                assert_eq!(o.payload(), &want[..2 * k]);
                let ranks: Vec<u16> = o
                    .payload()
                    .chunks_exact(2)
                    .map(|b| u16::from_be_bytes([b[0], b[1]]))
                    .collect();
                assert!(ranks.windows(2).all(|w| w[0] < w[1]), "{ranks:?}");
                assert!(ranks.iter().all(|&x| x < job.n_workers()), "{ranks:?}");
            }
            ReplyMsg::VersionRefusal | ReplyMsg::OldRefusal { .. } => unreachable!(),
            ReplyMsg::UpHello { .. }
            | ReplyMsg::UpProbe { .. }
            | ReplyMsg::UpJoin { .. }
            | ReplyMsg::UpData { .. }
            | ReplyMsg::UpLeave { .. }
            | ReplyMsg::UpHeartbeat { .. }
            | ReplyMsg::UpProvision { .. }
            | ReplyMsg::UpstreamWait { .. } => {
                unreachable!("no job of this target has an upstream: {r:?}")
            }
        }
    }

    /// The replies as a whole: the ones the verdict calls for, small when
    /// the message was refused, and only to sources inside the job's prefixes.
    fn check_replies(
        &mut self,
        req: Option<&HeaderRepr>,
        bytes: &[u8],
        from: &Endpoint,
        v: Verdict,
        outs: &[Out],
        nack_limited: bool,
    ) {
        for o in outs {
            self.check_reply(o);
        }
        if nack_limited {
            // The NACK its verdict calls for was over its rate: nothing sent.
            assert!(
                matches!(
                    v,
                    Verdict::Malformed(_)
                        | Verdict::NackUnknownJob
                        | Verdict::Join(JoinOutcome::Nack(_))
                        | Verdict::Data(DataOutcome::Nack(_))
                ),
                "{v:?} counted a rate-limited NACK"
            );
            assert!(outs.is_empty(), "a rate-limited NACK was sent");
            return;
        }
        let kinds: Vec<ReplyMsg> = outs.iter().map(|o| o.reply.msg).collect();
        let one_to_sender = |what: &str| {
            assert_eq!(outs.len(), 1, "{v:?} wants one {what}, got {kinds:?}");
            assert_eq!(outs[0].reply.to, *from, "{what} not to the sender");
            assert_eq!(
                (outs[0].reply.job, outs[0].reply.rank),
                (req.unwrap().job, req.unwrap().rank)
            );
        };
        // The nonce a NACK to this message echoes.
        let echo = || -> Nonce {
            let h = req.unwrap();
            let p = &bytes[HEADER_LEN..];
            match h.msg_type {
                MsgType::Hello => HelloPayload::parse(p).unwrap().nonce,
                MsgType::Join => JoinPayload::parse(p).unwrap().nonce,
                MsgType::Provision => ProvisionPayload::parse(p).unwrap().nonce,
                _ => [0; NONCE_LEN],
            }
        };
        let to_every_member = |job: u16, want: ReplyMsg| {
            let n = self.models[&job].n();
            let ranks: Vec<u16> = outs.iter().map(|o| o.reply.rank).collect();
            assert_eq!(
                ranks,
                (0..n).collect::<Vec<_>>(),
                "{want:?} not to every member once"
            );
            assert!(kinds.iter().all(|k| *k == want), "{kinds:?}");
        };
        match v {
            Verdict::Malformed(_) => {
                if self.v1_join_answered(bytes, from) {
                    assert_eq!(kinds, [ReplyMsg::VersionRefusal]);
                    assert_eq!(outs[0].reply.to, *from);
                } else if self.v2_hello_answered(bytes, from) {
                    let (version, _, _, echo) = wire::peek_old_hello(bytes).unwrap();
                    assert_eq!(kinds, [ReplyMsg::OldRefusal { version, echo }]);
                    assert_eq!(outs[0].reply.to, *from);
                } else {
                    assert!(outs.is_empty(), "{kinds:?}");
                }
            }
            Verdict::NackUnknownJob => {
                one_to_sender("NACK 1");
                let msg = ReplyMsg::Nack {
                    reason: NackReason::UnknownJob,
                    echo: echo(),
                };
                assert_eq!(kinds, [msg]);
            }
            Verdict::ProvisionRefused(reason) => {
                one_to_sender("NACK to a PROVISION");
                let msg = ReplyMsg::ProvisionRefusal {
                    reason,
                    detail: 0,
                    echo: echo(),
                };
                assert_eq!(kinds, [msg]);
            }
            Verdict::Provisioned { .. } => panic!("{v:?} from a table without tenants"),
            Verdict::Challenged => {
                one_to_sender("CHALLENGE");
                assert!(
                    matches!(kinds[0], ReplyMsg::Challenge { hello_nonce, .. } if hello_nonce == echo())
                );
            }
            Verdict::Join(JoinOutcome::Nack(reason)) | Verdict::Data(DataOutcome::Nack(reason)) => {
                one_to_sender("NACK");
                assert_eq!(
                    kinds,
                    [ReplyMsg::Nack {
                        reason,
                        echo: echo()
                    }]
                );
            }
            Verdict::Join(JoinOutcome::AckAgain) => {
                let h = req.unwrap();
                assert_eq!(kinds, [ReplyMsg::JoinAck]);
                assert_eq!(outs[0].reply.rank, h.rank);
            }
            Verdict::Join(JoinOutcome::Activated) => {
                to_every_member(req.unwrap().job, ReplyMsg::JoinAck)
            }
            Verdict::Data(DataOutcome::Completed { seq }) => {
                to_every_member(req.unwrap().job, ReplyMsg::Result { seq, retx: false })
            }
            Verdict::Data(DataOutcome::Retransmit { seq }) => {
                one_to_sender("RESULT");
                assert_eq!(kinds, [ReplyMsg::Result { seq, retx: true }]);
            }
            Verdict::Heartbeat { seq } => {
                one_to_sender("HEARTBEAT answer");
                assert_eq!(kinds, [ReplyMsg::Missing { seq }]);
            }
            Verdict::Join(JoinOutcome::Waiting | JoinOutcome::Replayed)
            | Verdict::Data(DataOutcome::Taken | DataOutcome::Dropped(_))
            | Verdict::Data(DataOutcome::PartialReady { .. })
            | Verdict::Dropped(_)
            | Verdict::RateLimited
            | Verdict::Noted => assert!(outs.is_empty(), "{v:?} answered with {kinds:?}"),
        }
        let refused = matches!(
            v,
            Verdict::Malformed(_)
                | Verdict::Dropped(_)
                | Verdict::RateLimited
                | Verdict::NackUnknownJob
                | Verdict::ProvisionRefused(_)
                | Verdict::Join(JoinOutcome::Nack(_) | JoinOutcome::Replayed)
                | Verdict::Data(DataOutcome::Nack(_) | DataOutcome::Dropped(_))
        );
        if refused {
            assert!(outs.len() <= 1);
            let limit = bytes.len().max(reply_size_floor(req));
            for o in outs {
                assert!(
                    o.bytes.len() <= limit,
                    "{v:?}: a {}-byte message answered with {} bytes ({:?})",
                    bytes.len(),
                    o.bytes.len(),
                    o.reply.msg
                );
            }
        }
        for o in outs {
            let Some(m) = self.models.get(&o.reply.job) else {
                continue;
            };
            // The exceptions: a HELLO's or JOIN's NACK 3 goes to the refused
            // source (smaller than what it sent), and a version-1 JOIN is
            // refused whoever sent it.
            let join_nack_3 = req
                .is_some_and(|h| matches!(h.msg_type, MsgType::Hello | MsgType::Join))
                && matches!(
                    o.reply.msg,
                    ReplyMsg::Nack {
                        reason: NackReason::SourceNotAllowed,
                        ..
                    }
                );
            let v1 = matches!(
                o.reply.msg,
                ReplyMsg::VersionRefusal | ReplyMsg::OldRefusal { .. }
            );
            // A PROVISION's refusal names the job id it asked for, which
            // may be a declared job's: it goes to the sender, whoever it is.
            let provision = matches!(o.reply.msg, ReplyMsg::ProvisionRefusal { .. });
            assert!(
                allowed(&m.config, o.reply.to.source.ip) || join_nack_3 || v1 || provision,
                "{:?} sent outside the job's prefixes",
                o.reply
            );
        }
    }

    /// Events: an activation is logged with its resume point; a refused
    /// message logs nothing (strangers must not flood the queue). A refused
    /// join attempt is counted under its kind, with itself as the sample.
    fn check_log(
        &mut self,
        req: Option<&HeaderRepr>,
        bytes: &[u8],
        from: &Endpoint,
        v: Verdict,
        refusals_before: &[u64; REFUSAL_KINDS],
    ) {
        let refusal = match v {
            Verdict::Join(JoinOutcome::Nack(r)) => {
                let h = req.unwrap();
                // A JOIN whose dtype (payload byte 2) is not the job's (every
                // job here is f32) is logged as that, not as NACK 5 alone.
                let join_dtype = (h.msg_type == MsgType::Join)
                    .then(|| bytes.get(HEADER_LEN + 2).copied())
                    .flatten();
                // Else one whose n_workers (payload bytes 0..2) is not the
                // job's is logged naming both counts.
                let join_n = (h.msg_type == MsgType::Join)
                    .then(|| bytes.get(HEADER_LEN..HEADER_LEN + 2))
                    .flatten()
                    .map(|b| u16::from_be_bytes([b[0], b[1]]));
                let job_n = self.models.get(&h.job).map(|m| m.n());
                let why = match (join_dtype, join_n, job_n) {
                    (Some(d), _, _) if r == NackReason::ParametersDiffer && d != DTYPE_F32 => {
                        Refusal::DtypeDiffers {
                            job: wire::Dtype::F32,
                            join: d,
                        }
                    }
                    (_, Some(join), Some(job))
                        if r == NackReason::ParametersDiffer && join != job =>
                    {
                        Refusal::WorkersDiffer { job, join }
                    }
                    _ => Refusal::Nack(r),
                };
                Some((h.job, h.rank, why))
            }
            Verdict::Join(JoinOutcome::Replayed) => {
                let h = req.unwrap();
                Some((h.job, h.rank, Refusal::Replayed))
            }
            Verdict::ProvisionRefused(r) => {
                let h = req.unwrap();
                let p = ProvisionPayload::parse(&bytes[HEADER_LEN..]).unwrap();
                let label = JobLabel {
                    tenant: p.tenant,
                    job: p.job_name,
                };
                Some((h.job, h.rank, Refusal::Provision(label, r)))
            }
            Verdict::Malformed(_) if self.v1_join_answered(bytes, from) => {
                wire::peek_v1(bytes).map(|(_, job, rank)| (job, rank, Refusal::Version(1)))
            }
            Verdict::Malformed(_) if self.v2_hello_answered(bytes, from) => {
                wire::peek_old_hello(bytes)
                    .map(|(v, job, rank, _)| (job, rank, Refusal::Version(v)))
            }
            _ => None,
        };
        let mut want = *refusals_before;
        if let Some((job, rank, why)) = refusal {
            let k = why.index();
            want[k] += 1;
            let sample = RefusalSample {
                job,
                rank,
                ip: from.source.ip,
                why,
            };
            assert_eq!(self.table().last_refusal(k), Some(sample));
        }
        assert_eq!(self.table().refusals(), &want, "refusals counted for {v:?}");

        let mut events = Vec::new();
        while let Some(e) = self.table().poll_event() {
            events.push(e);
        }
        match v {
            Verdict::Join(JoinOutcome::Activated) => {
                let h = req.unwrap();
                let table = self.table();
                let job = table.get(h.job).unwrap();
                let want = Event::JobActive {
                    job: h.job,
                    ranks: job.n_workers(),
                    resume: job.resume_point(),
                };
                assert!(events.contains(&want), "{events:?}");
            }
            Verdict::Malformed(_)
            | Verdict::Dropped(_)
            | Verdict::NackUnknownJob
            | Verdict::ProvisionRefused(_)
            | Verdict::Join(JoinOutcome::Nack(_) | JoinOutcome::Replayed)
            | Verdict::Data(DataOutcome::Nack(_) | DataOutcome::Dropped(_)) => {
                assert!(events.is_empty(), "{v:?} logged {events:?}")
            }
            _ => {}
        }
    }

    /// The table's membership is the model's.
    fn check_model(&self) {
        let table = self.table();
        let ids: Vec<u16> = table.jobs().map(|j| j.id()).collect();
        assert_eq!(ids.len(), self.models.len());
        for (&id, m) in &self.models {
            let job = table.get(id).expect("a declared job is gone");
            let state = if m.active {
                JobState::Active
            } else {
                JobState::Joining
            };
            assert_eq!(job.state(), state, "job {id}");
            assert_eq!(
                job.joined_ranks() as usize,
                m.members.iter().flatten().count()
            );
            for r in 0..m.n() {
                assert_eq!(
                    job.member(r).copied(),
                    m.member_src(r).map(endpoint),
                    "job {id} rank {r}"
                );
            }
        }
    }

    /// Read-only accessors must not panic in any state.
    fn poke(&self) {
        let gen = self.gen();
        let mut sink = 0u64;
        let mut visit = |_: &'static str, _: &'static str, v: u64| sink = sink.wrapping_add(v);
        self.table().counters.visit(&mut visit);
        let _ = self.table().pool_memory();
        for job in self.table().jobs() {
            job.counters().visit(&mut visit);
            let _ = job.missing_on_floor();
            let _ = job.members().count();
            let _ = (job.resume_point(), job.window(), job.drops().total());
            let _ = job.join_ack_header(0, gen);
            let _ = job.join_ack_payload(0, &job.join_ack_header(0, gen));
            let f = job.floor();
            for s in [f.wrapping_sub(1), f, f.wrapping_add(1)] {
                let _ = job.result_header(s, 0, false, gen);
            }
        }
    }

    fn hello_nonce(&mut self) -> Nonce {
        self.hellos += 1;
        let mut n = [0x4e; NONCE_LEN];
        n[..8].copy_from_slice(&self.hellos.to_be_bytes());
        n
    }

    /// A HELLO from `params`' worker at source `src`; the CHALLENGE (if any)
    /// is taken by the returned handshake.
    fn hello(&mut self, params: JoinParams, src: u8) -> Handshake {
        let nonce = self.hello_nonce();
        let mut hs = Handshake::new(params, nonce);
        let mut b = [0u8; 128];
        let n = hs.emit_hello(&mut b).unwrap();
        let (v, outs) = self.feed(&b[..n], src, false);
        for o in &outs {
            let h = o.hdr.unwrap();
            match h.msg_type {
                MsgType::Challenge => hs
                    .on_challenge(&h, o.payload())
                    .expect("the worker refused the CHALLENGE to its HELLO"),
                MsgType::Nack => {
                    let nack = NackPayload::parse(o.payload()).unwrap();
                    assert!(hs.nack_is_ours(&nack), "a NACK to our HELLO not ours");
                }
                t => panic!("{t:?} answered a HELLO"),
            }
        }
        assert_eq!(hs.challenged(), v == Verdict::Challenged);
        hs
    }

    /// The switch nonce of a CHALLENGE to `rank` of `job` at source `src`.
    fn foreign_nonce(&mut self, job: u16, rank: u16, src: u8) -> Option<Nonce> {
        let s = source(src);
        let params = JoinParams {
            job,
            rank,
            n_workers: self.models.get(&job).map_or(1, |m| m.n()),
            dtype: DTYPE_F32,
            op: OP_SUM,
            secret: secret(job),
            ip: s.ip,
            port: s.port,
            provision: None,
        };
        let hs = self.hello(params, src);
        let mut b = [0u8; 128];
        let n = hs.emit_join(0, 0, &mut b)?;
        Some(join_nonce(&b[..n]))
    }

    #[allow(clippy::too_many_arguments)]
    fn op_join(
        &mut self,
        job: JobSel,
        rank: u8,
        src: SrcSel,
        unbound: bool,
        fault: JoinFault,
        collective: u8,
        seq: ResumeSeq,
    ) {
        let id = job.id();
        let rank = (rank % 8) as u16;
        let si = self.src_index(id, rank, src);
        let known = self.models.get(&id).map(|m| m.config.clone());
        let n = known.as_ref().map_or(1, |c| c.n_workers);
        let s = source(si);
        let mut params = JoinParams {
            job: id,
            rank,
            n_workers: n,
            dtype: DTYPE_F32,
            op: OP_SUM,
            secret: secret(id),
            ip: if unbound { [0; 4] } else { s.ip },
            port: s.port,
            provision: None,
        };
        match fault {
            JoinFault::BadSecret => params.secret[rank as usize % SECRET_LEN] ^= 0x80,
            JoinFault::BadNWorkers => params.n_workers = n.wrapping_add(1 + rank),
            JoinFault::BadDtype => params.dtype = DTYPE_F32 + 1,
            JoinFault::BadOp => params.op = OP_SUM + 1,
            _ => {}
        }
        let resume = (collective as u32, seq.value());
        let hs = match fault {
            JoinFault::NoChallenge(_) => None,
            _ => Some(self.hello(params.clone(), si)),
        };
        let challenged = hs.as_ref().is_some_and(|h| h.challenged());
        match fault {
            JoinFault::Expired(extra) => self.advance(LIFETIME_MS + 1 + extra as u64 % 60_000),
            JoinFault::Delay(ms) => self.advance(ms as u64 % LIFETIME_MS),
            _ => {}
        }
        let foreign = match fault {
            JoinFault::ForeignNonce(k) => {
                let other = (rank + 1 + (k % 7) as u16) % 8;
                let at = if k & 0x80 != 0 {
                    si
                } else {
                    (other % N_SOURCES as u16) as u8
                };
                Some(
                    self.foreign_nonce(id, other, at)
                        .unwrap_or([0xab; NONCE_LEN]),
                )
            }
            _ => None,
        };
        let gen = hs.as_ref().and_then(|h| h.gen()).unwrap_or(self.gen());
        let forge = |nonce, gen| {
            let p = (params.n_workers, params.dtype, params.op);
            forge_join(id, rank, gen, resume, p, nonce, &params.secret, s)
        };
        let mut bytes = match (&hs, fault) {
            (_, JoinFault::NoChallenge(nonce)) => forge(nonce, gen),
            (_, JoinFault::ForeignNonce(_)) => forge(foreign.unwrap(), gen),
            (Some(h), _) if challenged => {
                let mut b = [0u8; 128];
                let len = h.emit_join(resume.0, resume.1, &mut b).unwrap();
                let b = b[..len].to_vec();
                self.handshakes.insert(join_nonce(&b), h.clone());
                match fault {
                    JoinFault::StaleGen(g) => forge(join_nonce(&b), gen ^ (g | 1)),
                    _ => b,
                }
            }
            // Not challenged (refused HELLO): a JOIN anyway, with a nonce
            // the switch never issued.
            _ => forge([0; NONCE_LEN], gen),
        };
        match fault {
            JoinFault::FlipMac(bit) => {
                let i = HEADER_LEN + 4 + NONCE_LEN + (bit as usize / 8) % MAC_LEN;
                bytes[i] ^= 1 << (bit % 8);
            }
            JoinFault::TamperResume(bit) => bytes[8 + (bit as usize % 8)] ^= 1 << ((bit >> 3) % 8),
            _ => {}
        }
        let send_from = match fault {
            JoinFault::Spoof(j) => (si + 1 + j % N_SOURCES) % (N_SOURCES + 1),
            _ => si,
        };
        let (v, _) = self.feed(&bytes, send_from, false);

        // What the fault must come to.
        let Some(c) = known else {
            assert_eq!(v, Verdict::NackUnknownJob);
            return;
        };
        let outside = !allowed(&c, source(send_from).ip);
        if rank >= n || outside || fault.is_bad() {
            assert!(
                matches!(v, Verdict::Join(JoinOutcome::Nack(_))),
                "invalid JOIN ({fault:?}, rank {rank} of {n}, outside {outside}) got {v:?}"
            );
        }
        let base_valid = rank < n && allowed(&c, s.ip);
        if base_valid {
            let want = match fault {
                JoinFault::BadSecret | JoinFault::FlipMac(_) | JoinFault::TamperResume(_) => {
                    Some(NackReason::BadSecret)
                }
                JoinFault::BadNWorkers | JoinFault::BadDtype | JoinFault::BadOp => {
                    Some(NackReason::ParametersDiffer)
                }
                JoinFault::ForeignNonce(_) | JoinFault::Expired(_) | JoinFault::NoChallenge(_) => {
                    Some(NackReason::StaleNonce)
                }
                JoinFault::Spoof(_) if outside => Some(NackReason::SourceNotAllowed),
                JoinFault::Spoof(_) => Some(NackReason::StaleNonce),
                JoinFault::StaleGen(_) => Some(NackReason::StaleGeneration),
                JoinFault::None | JoinFault::Delay(_) | JoinFault::ReplayPrevious => None,
            };
            match want {
                Some(r) => assert_eq!(v, Verdict::Join(JoinOutcome::Nack(r)), "{fault:?}"),
                None => assert!(
                    matches!(
                        v,
                        Verdict::Join(
                            JoinOutcome::Waiting | JoinOutcome::Activated | JoinOutcome::AckAgain
                        )
                    ),
                    "a valid JOIN got {v:?}"
                ),
            }
        }
        let accepted = matches!(
            v,
            Verdict::Join(JoinOutcome::Waiting | JoinOutcome::Activated | JoinOutcome::AckAgain)
        );
        let epoch = self.models[&id].epoch;
        self.remember_join(SentJoin {
            job: id,
            rank,
            epoch,
            bytes,
            src: send_from,
            accepted,
        });
        if fault == JoinFault::ReplayPrevious {
            let earlier = &self.joins[..self.joins.len() - 1];
            let Some(p) = earlier.iter().rposition(|j| (j.job, j.rank) == (id, rank)) else {
                return;
            };
            let (bytes, src) = (self.joins[p].bytes.clone(), self.joins[p].src);
            let older = self.joins[p].accepted && self.joins[p].epoch == epoch;
            let (rv, _) = self.feed(&bytes, src, false);
            if accepted && older {
                assert_eq!(
                    rv,
                    Verdict::Join(JoinOutcome::Replayed),
                    "an older JOIN again"
                );
            }
        }
    }

    fn remember_join(&mut self, j: SentJoin) {
        if self.joins.len() >= MAX_HISTORY {
            self.joins.remove(0);
        }
        self.joins.push(j);
    }

    fn op_leave(&mut self, job: JobSel, rank: u8, src: SrcSel, fault: LeaveFault) {
        let id = job.id();
        let rank = (rank % 8) as u16;
        let si = self.src_index(id, rank, src);
        let gen = self.gen();
        let nonce = self
            .models
            .get(&id)
            .and_then(|m| m.members.get(rank as usize)?.as_ref().map(|mm| mm.nonce));
        let (mut bytes, from) = match fault {
            LeaveFault::Replay(k) => {
                if self.leaves.is_empty() {
                    return;
                }
                self.leaves[k as usize % self.leaves.len()].clone()
            }
            LeaveFault::BadSecret => {
                let mut wrong = secret(id);
                wrong[0] ^= 1;
                (
                    forge_leave(id, rank, gen, &nonce.unwrap_or_default(), &wrong),
                    si,
                )
            }
            LeaveFault::None | LeaveFault::FlipMac(_) => {
                let hs = nonce.and_then(|n| self.handshakes.get(&n));
                let b = match hs {
                    Some(hs) => {
                        let mut b = [0u8; 128];
                        let len = hs.emit_leave(&mut b).unwrap();
                        b[..len].to_vec()
                    }
                    None => forge_leave(id, rank, gen, &[0; NONCE_LEN], &secret(id)),
                };
                (b, si)
            }
        };
        if let LeaveFault::FlipMac(bit) = fault {
            bytes[HEADER_LEN + (bit as usize / 8) % MAC_LEN] ^= 1 << (bit % 8);
        }
        let (v, _) = self.feed(&bytes, from, false);
        if matches!(fault, LeaveFault::FlipMac(_) | LeaveFault::BadSecret) {
            assert!(matches!(v, Verdict::Dropped(_)), "a forged LEAVE got {v:?}");
        }
        if self.leaves.len() >= MAX_HISTORY {
            self.leaves.remove(0);
        }
        self.leaves.push((bytes, from));
    }
}

fn check_sum(seq: u32, got: impl ExactSizeIterator<Item = u32>, want: &[u32]) {
    assert_eq!(
        got.len(),
        want.len(),
        "result of seq {seq} has another count"
    );
    for (i, (g, e)) in got.zip(want).enumerate() {
        assert!(
            same_f32(g, *e),
            "seq {seq} element {i}: switch {:?} ({g:#010x}) != rank-order sum {:?} ({e:#010x})",
            f32::from_bits(g),
            f32::from_bits(*e),
        );
    }
}

/// The resume point of an activation: the lowest (collective, seq) any
/// member reported, in serial order, scanning ranks in order.
fn lowest_resume(m: &JobModel) -> (u32, u32) {
    let mut lowest: Option<(u32, u32)> = None;
    for p in m.members.iter().flatten().map(|mm| mm.resume) {
        lowest = Some(match lowest {
            None => p,
            Some(l) if serial_lt(p.0, l.0) || (p.0 == l.0 && serial_lt(p.1, l.1)) => p,
            Some(l) => l,
        });
    }
    lowest.unwrap_or((0, 0))
}

fn run(input: Input) {
    let mut key = [0x42u8; 32];
    key[..4].copy_from_slice(&input.nonce_key);
    let mut h = Harness {
        switch: Switch::new(JobTable::new(TableConfig::new(input.gen, key), base())),
        clock_ms: 0,
        issued: HashMap::new(),
        n_issued: 0,
        models: BTreeMap::new(),
        epochs: HashMap::new(),
        removed: HashMap::new(),
        contrib: HashMap::new(),
        results: HashMap::new(),
        handshakes: HashMap::new(),
        joins: Vec::new(),
        leaves: Vec::new(),
        hellos: 0,
    };
    assert_ne!(h.gen(), 0, "generation 0 is never used");
    h.declare(JOB_A, input.a);
    if let Some(b) = input.b {
        h.declare(JOB_B, b);
    }

    for op in input.ops.into_iter().take(MAX_OPS) {
        match op {
            Op::Join {
                job,
                rank,
                src,
                unbound,
                fault,
                collective,
                seq,
            } => h.op_join(job, rank, src, unbound, fault, collective, seq),
            Op::Replay { pick, from } => {
                if h.joins.is_empty() {
                    continue;
                }
                let j = &h.joins[pick as usize % h.joins.len()];
                let (bytes, src) = (j.bytes.clone(), from.unwrap_or(j.src) % (N_SOURCES + 1));
                h.feed(&bytes, src, false);
            }
            Op::Hello { job, rank, src } => {
                let id = job.id();
                let rank = (rank % 8) as u16;
                let si = h.src_index(id, rank, src);
                let s = source(si);
                let params = JoinParams {
                    job: id,
                    rank,
                    n_workers: h.models.get(&id).map_or(1, |m| m.n()),
                    dtype: DTYPE_F32,
                    op: OP_SUM,
                    secret: secret(id),
                    ip: s.ip,
                    port: s.port,
                    provision: None,
                };
                h.hello(params, si);
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
                repr.gen = gen.unwrap_or(h.gen());
                // All-reduce flags only: this model sums every DATA. The
                // other kinds (NOVAL, owners, per-rank RESULTs) are
                // proto::switch::tests::kinds's.
                repr.flags = fl & flags::DEFINED & !(flags::KIND_MASK | flags::NOVAL);
                let payload = f32_payload(&values, count, rank as u32);
                let si = h.src_index(id, rank, src);
                h.feed(&frame(&repr, &payload), si, ce);
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
                let n = h.models.get(&id).map_or(1, |m| m.n());
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
                    repr.gen = h.gen();
                    let payload = f32_payload(&values, count, r as u32);
                    let si = h.src_index(id, r, SrcSel::Member);
                    h.feed(&frame(&repr, &payload), si, false);
                }
            }
            Op::Leave {
                job,
                rank,
                src,
                fault,
            } => h.op_leave(job, rank, src, fault),
            Op::Heartbeat {
                job,
                rank,
                src,
                seq,
                gen,
            } => {
                let id = job.id();
                let rank = (rank % 8) as u16;
                let mut repr = HeaderRepr::new(MsgType::Heartbeat, id);
                repr.rank = rank;
                repr.seq = seq.resolve(h.floor(id));
                repr.gen = gen.unwrap_or(h.gen());
                let si = h.src_index(id, rank, src);
                h.feed(&frame(&repr, &[]), si, false);
            }
            Op::SetWindow { job, window } => {
                if let Some(j) = h.table().get_mut(job.id()) {
                    j.set_window(window as u16);
                    assert!(j.window() >= 1 && j.window() <= j.config.pool_slots);
                }
            }
            Op::Advance { ms } => h.advance(ms as u64),
            Op::Expire { extra_ms } => h.advance(LIFETIME_MS + 1 + extra_ms as u64),
            Op::Redeclare { job, spec } => {
                let id = job.id();
                if h.table().remove(id).is_some() {
                    if let Some(m) = h.models.remove(&id) {
                        h.removed.insert(id, m.config.clone());
                    }
                    h.forget_sums(id);
                }
                if let Some(spec) = spec {
                    h.declare(id, spec);
                }
                h.check_model();
            }
            Op::V1Join {
                job,
                rank,
                src,
                payload_len,
            } => {
                let mut b = vec![0u8; HEADER_LEN + payload_len as usize % 64];
                b[0] = 0x10 | MsgType::Join as u8;
                b[2..4].copy_from_slice(&job.to_be_bytes());
                b[4..6].copy_from_slice(&rank.to_be_bytes());
                let (v, _) = h.feed(&b, src % (N_SOURCES + 1), false);
                assert_eq!(v, Verdict::Malformed(WireError::BadVersion(1)));
            }
            Op::V2Hello {
                job,
                rank,
                src,
                payload_len,
                nonce,
            } => {
                let len = payload_len as usize % 64;
                let mut b = vec![0u8; HEADER_LEN + len];
                b[0] = 0x20 | MsgType::Hello as u8;
                b[2..4].copy_from_slice(&job.to_be_bytes());
                b[4..6].copy_from_slice(&rank.to_be_bytes());
                let n = len.min(16);
                b[HEADER_LEN..HEADER_LEN + n].copy_from_slice(&nonce[..n]);
                let (v, _) = h.feed(&b, src % (N_SOURCES + 1), false);
                assert_eq!(v, Verdict::Malformed(WireError::BadVersion(2)));
            }
            Op::Provision {
                job,
                rank,
                src,
                count,
                tenant,
                nonce,
            } => {
                let mut hdr = HeaderRepr::new(MsgType::Provision, 1);
                hdr.job = job;
                hdr.rank = rank;
                hdr.count = u16::from(count % 3);
                hdr.gen = h.gen();
                let mut p = [0u8; PROVISION_PAYLOAD_LEN];
                p[..4].copy_from_slice(&tenant);
                p[32..35].copy_from_slice(b"job");
                p[96..98].copy_from_slice(&1u16.to_be_bytes());
                p[104..120].copy_from_slice(&nonce);
                let (v, _) = h.feed(&frame(&hdr, &p), src % (N_SOURCES + 1), false);
                assert!(
                    matches!(
                        v,
                        Verdict::ProvisionRefused(NackReason::UnknownTenant) | Verdict::RateLimited
                    ),
                    "{v:?}"
                );
            }
            Op::Raw { src, ce, bytes } => {
                h.feed(&bytes, src % (N_SOURCES + 1), ce);
            }
        }
        h.poke();
    }
}

/// A message as bytes: `h` then `payload`.
fn frame(h: &HeaderRepr, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; HEADER_LEN + payload.len()];
    h.emit_to(&mut b).unwrap();
    b[HEADER_LEN..].copy_from_slice(payload);
    b
}

fuzz_target!(|input: Input| {
    run(input);
});
