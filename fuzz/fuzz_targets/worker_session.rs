//! A worker's `proto::member::Member` (its session, collective, window)
//! against a real `JobTable` (one job, two ranks: the member's and one the
//! target plays), fed the table's replies, copies and byte-flipped versions
//! of them, and arbitrary datagrams, with time advancing by fuzz-chosen
//! steps, the switch restarting (a new generation) and all-reduces begun
//! and sent as the worker library does.
//!
//! Asserts: nothing panics; a datagram that did not come from the table
//! (arbitrary bytes, a flipped copy) never joins the member, and it ends,
//! resets or refuses it (Rejoining, Failed) only if it echoes a nonce the
//! member sent, its HELLO's or its JOIN's (which an off-path stranger
//! cannot know); a RESULT event's
//! values lie inside the datagram and are exactly `count` elements (none
//! with NOVAL), under the session's generation, and a fresh chunk's go
//! inside the collective's output; the window is within 1..=S and never
//! above the advertised window; every DATA frame is a header, `count`
//! values or none, and a tag where the job has one; after
//! `handle_timeout(now)` and draining `poll_control(now)` and
//! `poll_data(now)`, `poll_timeout()` is never at or before `now` (the
//! shell cannot spin); a failed member sends nothing.
#![no_main]

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use proto::handshake::JoinParams;
use proto::member::{Event, Member, ResultOutcome, Shape, TransportConfig};
use proto::session::SessionConfig;
use proto::switch::{Endpoint, Ipv4Prefix, JobConfig, JobTable, Source, TableConfig};
use proto::tag::{AuthMode, TAG_LEN};
use proto::wire::{
    Dtype, Header, HeaderRepr, HelloPayload, JoinPayload, MsgType, Nonce, HEADER_LEN, NONCE_LEN,
    OP_SUM,
};

const JOB: u16 = 1;
const SECRET: [u8; 32] = [3; 32];

#[derive(Arbitrary, Debug)]
enum Op {
    /// Time passes (milliseconds).
    Advance(u16),
    /// What the session has to send goes to the table; its replies come
    /// back (each delivered `copies` times, 0 = lost).
    Exchange { copies: u8 },
    /// The other rank joins (HELLO, then JOIN): the job activates.
    Peer,
    /// The member begins an all-reduce of `len` elements (if joined).
    Begin { len: u8 },
    /// The member sends the DATA its window and timers allow.
    Send,
    /// The last reply, one byte XORed.
    Flip { at: u8, with: u8 },
    /// Arbitrary bytes.
    Raw(Vec<u8>),
    /// The switch restarts: a new generation, nobody joined.
    Restart,
    /// Join again (after SessionLost).
    Rejoin,
}

#[derive(Arbitrary, Debug)]
struct Input {
    auth_mac: bool,
    ops: Vec<Op>,
}

fn endpoint(rank: u16) -> Endpoint {
    Endpoint {
        source: Source {
            mac: [2, 0, 0, 0, 0, rank as u8],
            ip: [198, 18, 0, 10],
            port: 1000 + rank,
        },
        ..Endpoint::default()
    }
}

fn table(gen: u32, auth: AuthMode, now: Instant) -> JobTable {
    let mut t = JobTable::new(TableConfig::new(gen, [5; 32]), now);
    t.add(
        JobConfig {
            id: JOB,
            n_workers: 2,
            allowed_sources: vec![Ipv4Prefix {
                addr: [198, 18, 0, 0],
                len: 24,
            }],
            secret: SECRET,
            pool_slots: 4,
            elems_per_chunk: 2,
            dtype: Dtype::F32,
            window: 4,
            priority: Default::default(),
            auth,
            upstream: None,
            stats: false,
        },
        64,
    )
    .unwrap();
    t
}

fn params(rank: u16) -> JoinParams {
    let e = endpoint(rank);
    JoinParams {
        job: JOB,
        rank,
        n_workers: 2,
        dtype: Dtype::F32 as u8,
        op: OP_SUM,
        secret: SECRET,
        ip: e.source.ip,
        port: e.source.port,
        provision: None,
    }
}

struct World {
    table: JobTable,
    gen: u32,
    auth: AuthMode,
    m: Member,
    /// The collectives' input, as wire bytes (float32 ones).
    input: Vec<u8>,
    next_collective: u32,
    /// Every nonce the member sent (HELLOs and probes).
    sent: Vec<Nonce>,
    last_reply: Vec<u8>,
    now: Instant,
}

impl World {
    fn drain(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(r) = self.table.poll_reply() {
            let mut b = vec![0u8; 2048];
            if let Some(e) = self.table.encode(&r, &mut b) {
                b.truncate(e.len);
                // Only what goes to the session's rank.
                if r.rank == 0 {
                    out.push(b);
                }
            }
        }
        out
    }

    fn send_all(&mut self) {
        while let Some(t) = self.m.poll_control(self.now) {
            assert!(!self.m.session().is_failed(), "a failed member sent {t:?}");
            // The nonces a refusal may echo: a HELLO's own, and the switch
            // nonce a JOIN carries (docs/PROTOCOL.md: a NACK echoes the
            // nonce of the HELLO or JOIN it refuses).
            if t.msg_type == MsgType::Hello {
                let p = HelloPayload::parse(&t.bytes()[HEADER_LEN..]).unwrap();
                self.sent.push(p.nonce);
            }
            if t.msg_type == MsgType::Join {
                let p = JoinPayload::parse(&t.bytes()[HEADER_LEN..]).unwrap();
                self.sent.push(p.nonce);
            }
            self.table.handle(t.bytes(), endpoint(0), false, self.now);
        }
    }

    /// Sends the DATA the member has now.
    fn send_data(&mut self) {
        let mut buf = [0u8; 256];
        while let Some(f) = self.m.poll_data(self.now, &self.input, &mut buf) {
            assert!(self.m.is_joined(), "DATA from a member not joined");
            let h = HeaderRepr::parse(&Header::new_checked(&buf[..f.len]).unwrap()).unwrap();
            assert_eq!(h.msg_type, MsgType::Data);
            let tag = if self.auth == AuthMode::Mac {
                TAG_LEN
            } else {
                0
            };
            let values = if f.values { h.count as usize * 4 } else { 0 };
            assert_eq!(f.len, HEADER_LEN + values + tag);
            self.table
                .handle(&buf[..f.len], endpoint(0), false, self.now);
        }
    }

    /// The window is within 1..=S and never above what the switch
    /// advertised.
    fn check_window(&self) {
        let w = self.m.window();
        assert!(w >= 1 && w <= self.m.pool_slots().max(1), "window {w}");
        assert!(
            w <= self.m.advertised_window(),
            "window {w} above advertised"
        );
    }

    /// Feeds a datagram; `trusted` when it is the table's own reply.
    fn deliver(&mut self, d: &[u8], trusted: bool) {
        let joined_before = self.m.is_joined();
        let gen_before = self.m.session().gen();
        let ev = self.m.handle(d, self.now);
        let echoes_ours = || {
            self.sent
                .iter()
                .any(|n| d.windows(NONCE_LEN).any(|w| w == &n[..]))
        };
        match &ev {
            None => {}
            Some(Event::Result {
                header,
                values,
                outcome,
                ..
            }) => {
                assert!(joined_before);
                assert_eq!(header.gen, gen_before);
                assert!(values.end <= d.len() && values.start == HEADER_LEN);
                let want = if header.no_values() {
                    0
                } else {
                    header.count as usize * 4
                };
                assert_eq!(values.len(), want);
                if let ResultOutcome::Fresh {
                    into: Some(at),
                    count,
                    ..
                } = *outcome
                {
                    let out = self.m.collective().shape().output_len();
                    assert!(at + count as usize <= out, "{outcome:?} outside {out}");
                    assert_eq!(count, header.count);
                }
            }
            Some(Event::Joined(j)) => {
                assert!(trusted, "joined by a datagram not from the switch: {j:?}");
                assert_eq!(j.gen, self.gen);
                // As the worker library: resend the collective from the
                // job's resume point.
                if j.collective == self.m.collective().collective() {
                    self.m.restart_from(j.seq);
                }
            }
            Some(Event::Rejoining(_) | Event::Failed(_)) => {
                assert!(
                    trusted || echoes_ours(),
                    "a stranger's datagram ended or reset the session: {ev:?}"
                );
            }
            Some(Event::Stalled { .. }) => panic!("handle() reported a stall"),
            // This member carries every seq (one share): no answer is
            // another share's.
            Some(Event::ShareProbeAnswer { .. }) => {
                panic!("a member of one share was handed another share's probe answer: {ev:?}")
            }
            // A declared job's member never provisions.
            Some(Event::Provisioned { .. }) => {
                panic!("a declared job's member provisioned: {ev:?}")
            }
        }
        self.check_window();
    }

    fn check_timeout(&mut self) {
        let ev = self.m.handle_timeout(self.now);
        if let Some(Event::Failed(_)) = ev {
            assert!(self.m.session().is_failed());
        }
        self.send_all();
        self.send_data();
        if let Some(t) = self.m.poll_timeout() {
            assert!(
                t > self.now,
                "poll_timeout {t:?} not after now {:?}",
                self.now
            );
        }
    }
}

fuzz_target!(|input: Input| {
    let base = Instant::now();
    let auth = if input.auth_mac {
        AuthMode::Mac
    } else {
        AuthMode::Port
    };
    let cfg = SessionConfig {
        join_timeout: Duration::from_secs(3),
        stall_timeout: Duration::from_secs(2),
    };
    let mut w = World {
        table: table(1, auth, base),
        gen: 1,
        auth,
        m: Member::new(params(0), cfg, TransportConfig::default(), [7; 32]),
        input: (0..255u32 * 2)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect(),
        next_collective: 0,
        sent: Vec::new(),
        last_reply: Vec::new(),
        now: base,
    };
    w.m.start_join(0, 0, base);
    for op in input.ops.into_iter().take(64) {
        match op {
            Op::Advance(ms) => {
                w.now += Duration::from_millis(ms.into());
                w.check_timeout();
            }
            Op::Exchange { copies } => {
                w.send_all();
                for r in w.drain() {
                    for _ in 0..copies % 3 {
                        w.deliver(&r, true);
                    }
                    w.last_reply = r;
                }
            }
            Op::Peer => {
                let mut hs = proto::handshake::Handshake::new(params(1), [1; NONCE_LEN]);
                let mut b = [0u8; 128];
                let n = hs.emit_hello(&mut b).unwrap();
                w.table.handle(&b[..n], endpoint(1), false, w.now);
                while let Some(r) = w.table.poll_reply() {
                    if r.rank != 1 {
                        continue;
                    }
                    let Some(e) = w.table.encode(&r, &mut b) else {
                        continue;
                    };
                    let Ok(h) = Header::new_checked(&b[..e.len]) else {
                        continue;
                    };
                    let Ok(hr) = HeaderRepr::parse(&h) else {
                        continue;
                    };
                    if hr.msg_type == MsgType::Challenge {
                        let _ = hs.on_challenge(&hr, &b[HEADER_LEN..e.len]);
                    }
                }
                if let Some(n) = hs.emit_join(0, 0, &mut b) {
                    w.table.handle(&b[..n], endpoint(1), false, w.now);
                }
            }
            Op::Begin { len } => {
                if w.m.is_joined() {
                    let c = w.m.collective();
                    let (id, seq) = (w.next_collective, c.end_seq());
                    w.m.begin(id, seq, Shape::all_reduce(len.into()));
                    w.next_collective += 1;
                }
            }
            Op::Send => w.send_data(),
            Op::Flip { at, with } => {
                let mut d = w.last_reply.clone();
                if !d.is_empty() && with != 0 {
                    let i = at as usize % d.len();
                    d[i] ^= with;
                    w.deliver(&d, false);
                }
            }
            Op::Raw(d) => w.deliver(&d, false),
            Op::Restart => {
                w.gen += 1;
                w.table = table(w.gen, w.auth, w.now);
            }
            Op::Rejoin => {
                if !w.m.is_joined() {
                    let c = w.m.collective();
                    let (id, seq) = (c.collective(), c.oldest_unacked_seq());
                    w.m.start_join(id, seq, w.now);
                }
            }
        }
    }
});
