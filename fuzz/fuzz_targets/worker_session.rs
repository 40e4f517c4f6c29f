//! A worker's `proto::session::WorkerSession` against a real `JobTable`
//! (one job, two ranks: the session's and one the target plays), fed the
//! table's replies, copies and byte-flipped versions of them, and arbitrary
//! datagrams, with time advancing by fuzz-chosen steps, the switch
//! restarting (a new generation) and collectives tracked.
//!
//! Asserts: nothing panics; a datagram that did not come from the table
//! (arbitrary bytes, a flipped copy) never joins the session, and it ends,
//! resets or refuses it (SessionLost, Failed) only if it echoes a nonce the
//! session sent (which an off-path stranger cannot know); a RESULT event's
//! values lie inside the datagram and are exactly `count` elements (none
//! with NOVAL), under the session's generation; after `handle_timeout(now)`
//! and draining `poll_transmit(now)`, `poll_timeout()` is never at or
//! before `now` (the shell cannot spin); a failed session sends nothing.
#![no_main]

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use proto::handshake::JoinParams;
use proto::session::{Event, SessionConfig, WorkerSession};
use proto::switch::{Endpoint, Ipv4Prefix, JobConfig, JobTable, Source, TableConfig};
use proto::tag::AuthMode;
use proto::wire::{
    Dtype, Header, HeaderRepr, HelloPayload, MsgType, Nonce, HEADER_LEN, NONCE_LEN, OP_SUM,
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
    /// The session sends DATA for `seq` of collective 0 (with values).
    Data { seq: u8, retx: bool },
    /// The last reply, one byte XORed.
    Flip { at: u8, with: u8 },
    /// Arbitrary bytes.
    Raw(Vec<u8>),
    /// A collective in progress (or none).
    Track { seq: u8, progress: bool },
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
    }
}

struct World {
    table: JobTable,
    gen: u32,
    auth: AuthMode,
    s: WorkerSession,
    /// Every nonce the session sent (HELLOs and probes).
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
        while let Some(t) = self.s.poll_transmit(self.now) {
            assert!(!self.s.is_failed(), "a failed session sent {t:?}");
            if t.msg_type == MsgType::Hello {
                let p = HelloPayload::parse(&t.bytes()[HEADER_LEN..]).unwrap();
                self.sent.push(p.nonce);
            }
            self.table.handle(t.bytes(), endpoint(0), false, self.now);
        }
    }

    /// Feeds a datagram; `trusted` when it is the table's own reply.
    fn deliver(&mut self, d: &[u8], trusted: bool) {
        let joined_before = self.s.is_joined();
        let gen_before = self.s.gen();
        let ev = self.s.handle(d, self.now);
        let echoes_ours = || {
            self.sent
                .iter()
                .any(|n| d.windows(NONCE_LEN).any(|w| w == &n[..]))
        };
        match &ev {
            None | Some(Event::Waiting { .. }) => {}
            Some(Event::Result { header, values, .. }) => {
                assert!(joined_before);
                assert_eq!(header.gen, gen_before);
                assert!(values.end <= d.len() && values.start == HEADER_LEN);
                let want = if header.no_values() {
                    0
                } else {
                    header.count as usize * 4
                };
                assert_eq!(values.len(), want);
            }
            Some(Event::Joined(j)) => {
                assert!(trusted, "joined by a datagram not from the switch: {j:?}");
                assert_eq!(j.gen, self.gen);
            }
            Some(Event::SessionLost(_) | Event::Failed(_)) => {
                assert!(
                    trusted || echoes_ours(),
                    "a stranger's datagram ended or reset the session: {ev:?}"
                );
            }
            Some(Event::Stalled { .. }) => panic!("handle() reported a stall"),
        }
    }

    fn check_timeout(&mut self) {
        let ev = self.s.handle_timeout(self.now);
        if let Some(Event::Failed(_)) = ev {
            assert!(self.s.is_failed());
        }
        self.send_all();
        if let Some(t) = self.s.poll_timeout() {
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
        s: WorkerSession::new(params(0), cfg, [7; 32]),
        sent: Vec::new(),
        last_reply: Vec::new(),
        now: base,
    };
    w.s.start_join(0, 0, base);
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
            Op::Data { seq, retx } => {
                let t = proto::worker::Transmit {
                    seq: seq.into(),
                    chunk: seq.into(),
                    offset: 0,
                    count: 2,
                    last: false,
                    retx,
                    kind: proto::wire::Kind::AllReduce,
                    owner: 0,
                    values: Some(0),
                };
                let h = w.s.data_header(&t, 0);
                let mut b = vec![0u8; HEADER_LEN];
                if h.emit_to(&mut b).is_ok() {
                    let values = [0u8, 0, 128, 63, 0, 0, 0, 64];
                    b.extend_from_slice(&values);
                    b.extend(w.s.data_tag(&h, &values).into_iter().flatten());
                    w.table.handle(&b, endpoint(0), false, w.now);
                }
            }
            Op::Flip { at, with } => {
                let mut d = w.last_reply.clone();
                if !d.is_empty() && with != 0 {
                    let i = at as usize % d.len();
                    d[i] ^= with;
                    w.deliver(&d, false);
                }
            }
            Op::Raw(d) => w.deliver(&d, false),
            Op::Track { seq, progress } => {
                w.s.track(0, seq.into(), progress.then_some(w.now));
                w.check_timeout();
            }
            Op::Restart => {
                w.gen += 1;
                w.table = table(w.gen, w.auth, w.now);
            }
            Op::Rejoin => {
                if !w.s.is_joined() {
                    w.s.start_join(0, 0, w.now);
                }
            }
        }
    }
});
