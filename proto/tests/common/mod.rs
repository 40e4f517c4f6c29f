//! What the simulated networks share: a deterministic generator, the
//! faults of a link and the delivery times they give one datagram, the
//! links' queue in virtual time, message framing, and both ends: the switch
//! side (the production entry point, `proto::switch::entry::Switch`, on
//! [`SIM_THREADS`] dataplane threads, and its encoded replies) and the
//! worker side (a rank joined, framed and answered through
//! `proto::member::Member`, as the worker library does). Each test binary
//! uses its own part of it.
#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use proto::elements::{read_le, round_f32, round_to_le};
use proto::handshake::JoinParams;
use proto::member::{Collective, Member, ResultOutcome, Shape, TransportConfig};
use proto::switch::engine::ResultRef;
use proto::switch::entry::{encode_result, Handled, Handoff, Switch, Transmit};
use proto::switch::{
    Encoded, Endpoint, Ipv4Prefix, JobConfig, JobTable, Reply, Source, TableConfig,
};
use proto::tag::{AuthMode, Tag, TAG_LEN};
use proto::wire::{Dtype, Header, HeaderRepr, HEADER_LEN};

/// xorshift64*: a tiny deterministic generator, enough for schedules.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a link does to datagrams: loss, duplication, reordering (each a
/// probability).
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub loss: f64,
    pub dup: f64,
    pub reorder: f64,
}

pub const CLEAN: Faults = Faults {
    loss: 0.0,
    dup: 0.0,
    reorder: 0.0,
};

/// Loss, duplication and reordering at once: the links of the fault tests.
pub const ALL_FAULTS: Faults = Faults {
    loss: 0.05,
    dup: 0.01,
    reorder: 0.25,
};

impl Faults {
    /// When the copies of one datagram sent at `now` arrive: none (lost),
    /// one, or two (duplicated); 100–150 µs, plus up to 3 ms when reordered.
    pub fn deliveries(&self, rng: &mut Rng, now: Duration) -> Vec<Duration> {
        if rng.chance(self.loss) {
            return Vec::new();
        }
        let copies = if rng.chance(self.dup) { 2 } else { 1 };
        (0..copies)
            .map(|_| {
                let mut delay = Duration::from_micros(100 + rng.below(50));
                if rng.chance(self.reorder) {
                    delay += Duration::from_micros(rng.below(3000));
                }
                now + delay
            })
            .collect()
    }
}

/// A message as bytes: `h` then `payload`.
pub fn frame(h: &HeaderRepr, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; HEADER_LEN + payload.len()];
    h.emit_to(&mut b).expect("header fits");
    b[HEADER_LEN..].copy_from_slice(payload);
    b
}

/// Datagrams in flight: each delivery of a message `M` at its virtual time
/// (ties in sending order).
pub struct Links<M> {
    rng: Rng,
    queue: BinaryHeap<Reverse<(Duration, u64)>>,
    msgs: HashMap<u64, M>,
    next_id: u64,
}

impl<M> Links<M> {
    pub fn new(seed: u64) -> Links<M> {
        Links {
            rng: Rng(seed | 1),
            queue: BinaryHeap::new(),
            msgs: HashMap::new(),
            next_id: 0,
        }
    }

    /// Sends one datagram at `now` over a link with `faults`: `make` makes
    /// each copy that arrives.
    pub fn send(&mut self, faults: Faults, now: Duration, make: impl Fn() -> M) {
        for at in faults.deliveries(&mut self.rng, now) {
            self.next_id += 1;
            self.queue.push(Reverse((at, self.next_id)));
            self.msgs.insert(self.next_id, make());
        }
    }

    /// When the next datagram arrives.
    pub fn next_delivery(&self) -> Option<Duration> {
        self.queue.peek().map(|Reverse((t, _))| *t)
    }

    /// The next datagram due by `now`.
    pub fn pop_due(&mut self, now: Duration) -> Option<M> {
        let Reverse((t, id)) = *self.queue.peek()?;
        if t > now {
            return None;
        }
        self.queue.pop();
        Some(self.msgs.remove(&id).expect("a queued datagram"))
    }
}

/// The next event of a run: a delivery or a worker's timer, whichever
/// comes first; panics if neither is pending (a deadlock).
pub fn next_event(delivery: Option<Duration>, timer: Option<Duration>) -> Duration {
    match (delivery, timer) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) => a,
        (None, Some(b)) => b,
        (None, None) => panic!("deadlock: nothing in flight, nothing due"),
    }
}

/// Rank `rank`'s address: 198.18.0.10, port `port_base + rank`.
pub fn endpoint(rank: u16, port_base: u16) -> Endpoint {
    Endpoint {
        source: Source {
            mac: [2, 0, 0, 0, (rank >> 8) as u8, rank as u8],
            ip: [198, 18, 0, 10],
            port: port_base + rank,
        },
        ..Endpoint::default()
    }
}

/// A table of generation `gen` with job 1: `n` ranks from 198.18.0.0/24,
/// secret `[3; 32]`, `slots` slots of `elems` elements of `dtype`.
pub fn job_table(
    gen: u32,
    n: u16,
    elems: u16,
    slots: u16,
    (dtype, auth): (Dtype, AuthMode),
    now: Instant,
) -> JobTable {
    let mut table = JobTable::new(TableConfig::new(gen, [5; 32]), now);
    table
        .add(job_config(n, elems, slots, (dtype, auth)), elems + 8)
        .unwrap();
    table
}

/// [`job_table`]'s job 1, for a test that changes a field before adding
/// it (e.g. `stats`).
pub fn job_config(n: u16, elems: u16, slots: u16, (dtype, auth): (Dtype, AuthMode)) -> JobConfig {
    JobConfig {
        id: 1,
        n_workers: n,
        allowed_sources: vec![Ipv4Prefix {
            addr: [198, 18, 0, 0],
            len: 24,
        }],
        secret: [3; 32],
        pool_slots: slots,
        elems_per_chunk: elems,
        dtype,
        window: slots,
        priority: Default::default(),
        auth,
        upstream: None,
        stats: false,
    }
}

/// Dataplane threads of the simulated switch: rank r's socket belongs to
/// thread `r mod SIM_THREADS` (switchd deals a port per worker so), so a
/// completion fans out across threads through hand-offs.
pub const SIM_THREADS: usize = 2;

/// The thread that receives rank `rank`'s datagrams and owns its socket.
pub fn thread_of(rank: u16) -> usize {
    usize::from(rank) % SIM_THREADS
}

/// The simulated shell of one thread: routes a reply to the thread that
/// owns its rank's socket, encodes what it sends whole (as the loopback
/// stand-in does) and queues hand-offs for the other threads.
struct SimShell<'a, F: FnMut(&Reply, &[u8])> {
    send: &'a mut F,
    handoffs: Vec<(usize, Handoff)>,
    buf: Vec<u8>,
}

impl<F: FnMut(&Reply, &[u8])> Transmit for SimShell<'_, F> {
    fn route(&mut self, r: &mut Reply) -> Option<usize> {
        Some(thread_of(r.rank))
    }

    fn send_result(&mut self, r: &Reply, hdr: &HeaderRepr, res: &ResultRef<'_>, token: &Tag) {
        if let Some(e) = encode_result(hdr, res, token, &mut self.buf) {
            (self.send)(r, &self.buf[..e.len]);
        }
    }

    fn send_reply(&mut self, r: &Reply, encode: impl FnOnce(&mut [u8]) -> Option<Encoded>) {
        if let Some(e) = encode(&mut self.buf) {
            (self.send)(r, &self.buf[..e.len]);
        }
    }

    fn hand_off(&mut self, thread: usize, h: Handoff) {
        self.handoffs.push((thread, h));
    }

    fn unsent(&mut self, _: &Reply) {}
}

/// The switch side of a delivery: `bytes` from `from` reach `switch` on
/// dataplane thread `thread` at `at`, through the entry point switchd
/// runs; every reply it causes goes, encoded as the shells send them, to
/// `send` with the rank it is for, hand-offs to other threads included
/// (taken by their thread right after, in order).
pub fn at_switch(
    switch: &Switch,
    thread: usize,
    bytes: &[u8],
    from: Endpoint,
    at: Instant,
    mut send: impl FnMut(u16, &[u8]),
) -> Handled {
    at_switch_replies(switch, thread, bytes, from, at, |r, b| send(r.rank, b))
}

/// [`at_switch`], with each reply's whole [`Reply`] (where it goes and the
/// switch port it leaves from: `to.local_port`).
pub fn at_switch_replies(
    switch: &Switch,
    thread: usize,
    bytes: &[u8],
    from: Endpoint,
    at: Instant,
    mut send: impl FnMut(&Reply, &[u8]),
) -> Handled {
    let mut shell = SimShell {
        send: &mut send,
        handoffs: Vec::new(),
        buf: vec![0u8; 2048],
    };
    let handled = switch.on_datagram(thread, bytes, from, false, at, &mut shell);
    let mut handoffs = std::mem::take(&mut shell.handoffs);
    while !handoffs.is_empty() {
        for (t, h) in handoffs {
            switch.batch(t, at).on_handoff(h, &mut shell);
        }
        handoffs = std::mem::take(&mut shell.handoffs);
    }
    handled
}

/// How the DATA a simulated switch received was taken: on the lock-free
/// path, or by the table under its lock.
#[derive(Debug, Default, Clone, Copy)]
pub struct Paths {
    pub lock_free: u64,
    pub table: u64,
}

impl Paths {
    /// Counts `h`, what the switch did with datagram `bytes`, if it is a
    /// DATA.
    pub fn count(&mut self, bytes: &[u8], h: Handled) {
        let data = proto::wire::Header::new_checked(bytes)
            .is_ok_and(|hd| hd.msg_type_raw() == proto::wire::MsgType::Data as u8);
        match (data, h.lock_free) {
            (true, true) => self.lock_free += 1,
            (true, false) => self.table += 1,
            _ => {}
        }
    }
}

/// What rank `from` joins job `job` with.
pub fn join_params(
    job: u16,
    n: u16,
    dtype: Dtype,
    secret: [u8; 32],
    rank: u16,
    from: &Endpoint,
) -> JoinParams {
    JoinParams {
        job,
        rank,
        n_workers: n,
        dtype: dtype as u8,
        op: 0,
        secret,
        ip: from.source.ip,
        port: from.source.port,
        provision: None,
    }
}

/// A member started at resume point `start_seq` that has sent `table` its
/// HELLO and the JOIN the CHALLENGE allows, on a lossless path (loss while
/// joining is the session's own tests'); the JOIN_ACKs stay queued at the
/// table until every rank has joined.
pub fn join_lossless(
    table: &mut JobTable,
    from: Endpoint,
    params: JoinParams,
    key: [u8; 32],
    start_seq: u32,
    now: Instant,
) -> Member {
    join_lossless_as(
        table,
        from,
        params,
        key,
        start_seq,
        now,
        transport(),
        |_| {},
    )
}

/// [`join_lossless`] for a member with transport `cfg`, `prepare` done to
/// it before it starts joining (e.g. asking lane replies).
#[allow(clippy::too_many_arguments)]
pub fn join_lossless_as(
    table: &mut JobTable,
    from: Endpoint,
    params: JoinParams,
    key: [u8; 32],
    start_seq: u32,
    now: Instant,
    cfg: TransportConfig,
    prepare: impl FnOnce(&mut Member),
) -> Member {
    let mut m = Member::new(params, Default::default(), cfg, key);
    prepare(&mut m);
    m.start_join(0, start_seq, now);
    let mut b = [0u8; 128];
    let hello = m.poll_control(now).expect("a HELLO");
    table.handle(hello.bytes(), from, false, now);
    let r = table.poll_reply().expect("a CHALLENGE");
    let e = table.encode(&r, &mut b).unwrap();
    assert!(m.handle(&b[..e.len], now).is_none());
    let join = m.poll_control(now).expect("a JOIN");
    table.handle(join.bytes(), from, false, now);
    m
}

/// The workers' transport: timers short enough for runs in virtual time.
pub fn transport() -> TransportConfig {
    TransportConfig {
        initial_rto: Duration::from_millis(2),
        min_rto: Duration::from_micros(500),
        ..TransportConfig::default()
    }
}

/// One rank: its member (membership, collective, window) and the
/// collective's input and output as the test sees them (float32).
pub struct Worker {
    pub m: Member,
    pub input: Vec<f32>,
    pub output: Vec<f32>,
    dtype: Dtype,
    /// `input` as wire bytes of the dtype (what DATA carry).
    wire: Vec<u8>,
    buf: Vec<u8>,
}

impl Worker {
    /// A rank whose member has joined (or is joining), with no collective
    /// yet.
    pub fn new(m: Member, dtype: Dtype) -> Worker {
        Worker {
            m,
            input: vec![],
            output: vec![],
            dtype,
            wire: vec![],
            buf: vec![0u8; 9216],
        }
    }

    /// Starts collective `collective` of `shape` at `seq` over `self.input`.
    pub fn begin(&mut self, collective: u32, seq: u32, shape: Shape) {
        self.wire = vec![0u8; self.dtype.size() * self.input.len()];
        round_to_le(self.dtype, &self.input, &mut self.wire);
        self.m.begin(collective, seq, shape);
    }

    /// The collective in progress.
    pub fn coll(&self) -> &Collective {
        self.m.collective()
    }

    /// The next DATA the member sends at `at`: its header and the framed
    /// message (values in the dtype, or none for a NOVAL chunk, then the
    /// session's tag where the job has one), as `Member::poll_data` wrote it.
    pub fn poll_data(&mut self, at: Instant) -> Option<(HeaderRepr, Vec<u8>)> {
        let f = self.m.poll_data(at, &self.wire, &mut self.buf)?;
        assert!(f.len <= HEADER_LEN + self.dtype.size() * 9000 + TAG_LEN);
        let bytes = self.buf[..f.len].to_vec();
        let h = HeaderRepr::parse(&Header::new_checked(&bytes[..]).expect("a header"))
            .expect("a DATA header");
        Some((h, bytes))
    }

    /// What a RESULT meant, its `values` in the dtype: a fresh chunk's go
    /// into the output where the outcome says (plus the rank's own kept
    /// values, rounded again, as the library adds them).
    pub fn take(&mut self, outcome: &ResultOutcome, values: &[u8]) {
        if let ResultOutcome::Fresh {
            into: Some(at),
            count,
            own,
            ..
        } = *outcome
        {
            let out = &mut self.output[at..at + count as usize];
            read_le(self.dtype, values, out);
            if let Some(o) = own {
                for (x, mine) in out.iter_mut().zip(&self.input[o..]) {
                    *x = round_f32(self.dtype, *x + mine);
                }
            }
        }
    }
}
