//! Reduce-scatter, all-gather and broadcast over a simulated network that
//! loses, duplicates and reorders, in virtual time: workers (a
//! `proto::worker::Collective` of each kind's `Shape`, joined and framed
//! through `proto::session`) against the real switch table. Kinds follow
//! each other in one job (reduce-scatter, all-gather, all-reduce,
//! broadcast, ...), and every output element must be bit-exact: a
//! reduce-scatter's shard of the rank-order sum (rounded once for bf16/f16),
//! an all-gather's copy of every rank's shard, a broadcast's copy of the
//! root's tensor. `simulated_network.rs` does the same for all-reduce alone.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proto::elements::{read_le, round_f32, round_to_le};
use proto::handshake::JoinParams;
use proto::reference::{pattern_dtype, rank_order_sum};
use proto::session::{Event, SessionConfig, WorkerSession};
use proto::switch::{Endpoint, Ipv4Prefix, JobConfig, JobTable, Source, TableConfig};
use proto::tag::AuthMode;
use proto::wire::Dtype;
use proto::worker::{Collective, Dctcp, ResultOutcome, RttEstimator, Shape, TransportConfig};

mod common;
use common::{frame, Faults, Rng, CLEAN};

const GEN: u32 = 77;

fn endpoint(rank: u16) -> Endpoint {
    Endpoint {
        source: Source {
            mac: [2, 0, 0, 0, (rank >> 8) as u8, rank as u8],
            ip: [198, 18, 0, 10],
            port: 2000 + rank,
        },
        ..Endpoint::default()
    }
}

/// Every rank joined through its session (a lossless join: the session's
/// own tests cover a lossy one).
fn join_all(table: &mut JobTable, n: u16, dtype: Dtype, now: Instant) -> Vec<WorkerSession> {
    let mut b = [0u8; 128];
    let mut sessions: Vec<WorkerSession> = (0..n)
        .map(|rank| {
            let from = endpoint(rank);
            let params = JoinParams {
                job: 1,
                rank,
                n_workers: n,
                dtype: dtype as u8,
                op: 0,
                secret: [3; 32],
                ip: from.source.ip,
                port: from.source.port,
            };
            let mut s = WorkerSession::new(params, SessionConfig::default(), [rank as u8; 32]);
            s.start_join(0, 0, now);
            let hello = s.poll_transmit(now).expect("a HELLO");
            table.handle(hello.bytes(), from, false, now);
            let r = table.poll_reply().expect("a CHALLENGE");
            let e = table.encode(&r, &mut b).unwrap();
            assert!(s.handle(&b[..e.len], now).is_none());
            let join = s.poll_transmit(now).expect("a JOIN");
            table.handle(join.bytes(), from, false, now);
            s
        })
        .collect();
    while let Some(r) = table.poll_reply() {
        let e = table.encode(&r, &mut b).unwrap();
        let ev = sessions[r.rank as usize].handle(&b[..e.len], now);
        assert!(
            matches!(ev, Some(Event::Joined(_))),
            "rank {}: {ev:?}",
            r.rank
        );
    }
    sessions
}

/// What one collective of the sequence is.
#[derive(Debug, Clone, Copy)]
enum Step {
    ReduceScatter,
    AllGather,
    AllReduce,
    Broadcast(u16),
}

impl Step {
    fn shape(self, rank: u16, n: u16, m: usize) -> Shape {
        match self {
            Step::ReduceScatter => Shape::reduce_scatter(rank, n, m),
            Step::AllGather => Shape::all_gather(rank, n, m),
            Step::AllReduce => Shape::all_reduce(usize::from(n) * m),
            Step::Broadcast(root) => Shape::broadcast(rank, root, m),
        }
    }
}

struct Worker {
    session: WorkerSession,
    input: Vec<f32>,
    output: Vec<f32>,
    coll: Collective,
    rtt: RttEstimator,
    cc: Dctcp,
}

/// One job of `n` ranks running `steps` (shards of `m` elements) in a row
/// over `faults`; panics on a wrong bit or a hang.
#[allow(clippy::too_many_arguments)]
fn run(
    n: u16,
    m: usize,
    elems: u16,
    slots: u16,
    steps: &[Step],
    faults: Faults,
    seed: u64,
    dtype: Dtype,
    auth: AuthMode,
) {
    let base = Instant::now();
    let mut table = JobTable::new(TableConfig::new(GEN, [5; 32]), base);
    table
        .add(
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
                auth,
                upstream: None,
            },
            elems + 8,
        )
        .unwrap();
    let cfg = TransportConfig {
        initial_rto: Duration::from_millis(2),
        min_rto: Duration::from_micros(500),
        ..TransportConfig::default()
    };
    let mut workers: Vec<Worker> = join_all(&mut table, n, dtype, base)
        .into_iter()
        .map(|session| Worker {
            session,
            input: vec![],
            output: vec![],
            coll: Collective::new(0, 0, 0, elems),
            rtt: RttEstimator::new(&cfg),
            cc: Dctcp::new(&cfg, slots),
        })
        .collect();
    let mut rng = Rng(seed | 1);
    let mut queue: BinaryHeap<Reverse<(Duration, u64)>> = BinaryHeap::new();
    // (to the switch?, rank, bytes)
    let mut msgs: HashMap<u64, (bool, u16, Vec<u8>)> = HashMap::new();
    let mut next_id = 0u64;
    let mut now = Duration::ZERO;
    let mut seq = 0u32;
    for (it, &step) in steps.iter().enumerate() {
        let it = it as u32;
        // Inputs already in the dtype (they widen exactly): every rank's
        // whole n·m tensor; a shard-sized input is its first m.
        let full: Vec<Vec<f32>> = (0..n)
            .map(|r| {
                (0..usize::from(n) * m)
                    .map(|i| pattern_dtype(dtype, r, it, i))
                    .collect()
            })
            .collect();
        let refs: Vec<&[f32]> = full.iter().map(|v| &v[..]).collect();
        let sum: Vec<f32> = rank_order_sum(&refs)
            .into_iter()
            .map(|v| round_f32(dtype, v))
            .collect();
        for (r, w) in workers.iter_mut().enumerate() {
            let shape = step.shape(r as u16, n, m);
            w.input = full[r][..shape.input_len()].to_vec();
            w.output = vec![f32::NAN; shape.output_len()];
            if let Step::AllGather = step {
                // The rank's own shard is copied locally, as the library does.
                w.output[r * m..(r + 1) * m].copy_from_slice(&w.input);
            }
            w.coll = Collective::with_shape(it, seq, shape, elems);
        }
        let mut rounds = 0u64;
        while !workers.iter().all(|w| w.coll.is_complete()) {
            rounds += 1;
            assert!(rounds < 5_000_000, "hang: step {it} {step:?}");
            for (r, w) in workers.iter_mut().enumerate() {
                while let Some(t) = w
                    .coll
                    .poll_transmit(base + now, w.cc.window(), &w.rtt, &cfg)
                {
                    let h = w.session.data_header(&t, w.coll.collective());
                    let mut p = match t.values {
                        Some(at) => {
                            let mut p = vec![0u8; dtype.payload_len(t.count)];
                            round_to_le(dtype, &w.input[at..at + t.count as usize], &mut p);
                            p
                        }
                        None => Vec::new(),
                    };
                    if let Some(tag) = w.session.data_tag(&h, &p) {
                        p.extend_from_slice(&tag);
                    }
                    let bytes = frame(&h, &p);
                    for at in faults.deliveries(&mut rng, now) {
                        next_id += 1;
                        queue.push(Reverse((at, next_id)));
                        msgs.insert(next_id, (true, r as u16, bytes.clone()));
                    }
                }
            }
            let next_delivery = queue.peek().map(|Reverse((t, _))| *t);
            let next_timer = workers
                .iter()
                .filter_map(|w| w.coll.next_timeout())
                .min()
                .map(|t| t - base);
            now = now.max(match (next_delivery, next_timer) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (None, None) => panic!("deadlock: nothing in flight, nothing due"),
            });
            while let Some(Reverse((t, id))) = queue.peek().copied() {
                if t > now {
                    break;
                }
                queue.pop();
                let (to_switch, rank, bytes) = msgs.remove(&id).unwrap();
                if to_switch {
                    table.handle(&bytes, endpoint(rank), false, base + now);
                    while let Some(r) = table.poll_reply() {
                        let mut buf = vec![0u8; 2048];
                        let Some(e) = table.encode(&r, &mut buf) else {
                            continue;
                        };
                        buf.truncate(e.len);
                        for at in faults.deliveries(&mut rng, now) {
                            next_id += 1;
                            queue.push(Reverse((at, next_id)));
                            msgs.insert(next_id, (false, r.rank, buf.clone()));
                        }
                    }
                    continue;
                }
                let w = &mut workers[rank as usize];
                let (h, v) = match w.session.handle(&bytes, base + now) {
                    Some(Event::Result { header, values }) => (header, values),
                    other => panic!("rank {rank}: not a RESULT the session takes: {other:?}"),
                };
                match w
                    .coll
                    .on_result_header(&h, base + now, &mut w.rtt, &mut w.cc)
                {
                    ResultOutcome::Fresh {
                        into: Some(at),
                        count,
                        ..
                    } => read_le(dtype, &bytes[v], &mut w.output[at..at + count as usize]),
                    ResultOutcome::Fresh { into: None, .. }
                    | ResultOutcome::Duplicate
                    | ResultOutcome::Foreign => {}
                    // The switch answers each rank as its shape says.
                    other => panic!("rank {rank} step {it} {step:?}: {other:?} for {h:?}"),
                }
            }
        }
        for (r, w) in workers.iter().enumerate() {
            let want: Vec<f32> = match step {
                Step::ReduceScatter => sum[r * m..(r + 1) * m].to_vec(),
                Step::AllGather => full.iter().flat_map(|f| f[..m].to_vec()).collect(),
                Step::AllReduce => sum.clone(),
                Step::Broadcast(root) if usize::from(root) == r => vec![],
                Step::Broadcast(root) => full[usize::from(root)][..m].to_vec(),
            };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&w.output),
                bits(&want),
                "{dtype} rank {r} step {it} {step:?}"
            );
        }
        seq = workers[0].coll.end_seq();
    }
}

const ALL_FAULTS: Faults = Faults {
    loss: 0.05,
    dup: 0.01,
    reorder: 0.25,
};

const SEQUENCE: [Step; 6] = [
    Step::ReduceScatter,
    Step::AllGather,
    Step::AllReduce,
    Step::Broadcast(2),
    Step::ReduceScatter,
    Step::AllGather,
];

#[test]
fn kinds_in_a_row_on_a_clean_network_with_short_shards() {
    for m in [1usize, 7, 8, 9, 50] {
        run(4, m, 8, 4, &SEQUENCE, CLEAN, 1, Dtype::F32, AuthMode::Port);
    }
}

#[test]
fn kinds_in_a_row_under_all_faults_in_every_dtype() {
    for (dtype, seed) in [(Dtype::F32, 21), (Dtype::Bf16, 22), (Dtype::F16, 23)] {
        run(
            4,
            500,
            16,
            16,
            &SEQUENCE,
            ALL_FAULTS,
            seed,
            dtype,
            AuthMode::Port,
        );
    }
}

#[test]
fn tagged_kinds_under_all_faults() {
    // NOVAL DATA and RESULTs carry only their tag; it still verifies.
    for (dtype, seed) in [(Dtype::F32, 31), (Dtype::Bf16, 32)] {
        run(
            4,
            300,
            16,
            16,
            &SEQUENCE,
            ALL_FAULTS,
            seed,
            dtype,
            AuthMode::Mac,
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]
    #[test]
    fn any_schedule_yields_the_reference_outputs(
        seed in any::<u64>(),
        n in 1u16..6,
        m in 1usize..120,
        elems in 1u16..20,
        slots_log in 0u32..5,
        loss in 0.0f64..0.2,
        dup in 0.0f64..0.1,
        reorder in 0.0f64..0.5,
        dtype in 0u8..3,
        kinds in proptest::collection::vec(0u8..4, 1..5),
    ) {
        let dtype = Dtype::from_u8(dtype).unwrap();
        let steps: Vec<Step> = kinds
            .iter()
            .enumerate()
            .map(|(i, k)| match k {
                0 => Step::ReduceScatter,
                1 => Step::AllGather,
                2 => Step::AllReduce,
                _ => Step::Broadcast((i as u16) % n),
            })
            .collect();
        let faults = Faults { loss, dup, reorder };
        run(n, m, elems, 1 << slots_log, &steps, faults, seed, dtype, AuthMode::Port);
    }
}
