//! Reduce-scatter, all-gather and broadcast over a simulated network that
//! loses, duplicates and reorders, in virtual time: workers (a
//! `proto::member::Member` running each kind's `Shape`, joined and
//! framed by the member) against the real switch table. Kinds follow
//! each other in one job (reduce-scatter, all-gather, all-reduce,
//! broadcast, ...), and every output element must be bit-exact: a
//! reduce-scatter's shard of the rank-order sum (rounded once for bf16/f16;
//! when the owner keeps its shard, the others' sum plus its own, rounded
//! again),
//! an all-gather's copy of every rank's shard, a broadcast's copy of the
//! root's tensor. `simulated_network.rs` does the same for all-reduce alone.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proto::elements::round_f32;
use proto::member::{Event, Member, ResultOutcome, Shape};
use proto::reference::{expected_kept_sum_dtype, pattern_dtype, rank_order_sum};
use proto::switch::entry::Switch;
use proto::switch::{Endpoint, JobTable};
use proto::tag::AuthMode;
use proto::wire::Dtype;

mod common;
use common::{join_lossless, join_params, Faults, Links, Worker, ALL_FAULTS, CLEAN};

const GEN: u32 = 77;

fn endpoint(rank: u16) -> Endpoint {
    common::endpoint(rank, 2000)
}

/// Every rank joined through its member (a lossless join: the session's
/// own tests cover a lossy one).
fn join_all(table: &mut JobTable, n: u16, dtype: Dtype, now: Instant) -> Vec<Member> {
    let mut sessions: Vec<Member> = (0..n)
        .map(|rank| {
            let from = endpoint(rank);
            let params = join_params(1, n, dtype, [3; 32], rank, &from);
            join_lossless(table, from, params, [rank as u8; 32], 0, now)
        })
        .collect();
    let mut b = [0u8; 128];
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
    /// Each rank keeps its own shard: the others' sum plus its own.
    ReduceScatter,
    /// Each rank sends its own shard too: the rank-order sum of all.
    ReduceScatterSendingOwn,
    AllGather,
    AllReduce,
    Broadcast(u16),
}

impl Step {
    fn shape(self, rank: u16, n: u16, m: usize) -> Shape {
        match self {
            Step::ReduceScatter => Shape::reduce_scatter(rank, n, m),
            Step::ReduceScatterSendingOwn => Shape::reduce_scatter(rank, n, m).sending_own_shard(),
            Step::AllGather => Shape::all_gather(rank, n, m),
            Step::AllReduce => Shape::all_reduce(usize::from(n) * m),
            Step::Broadcast(root) => Shape::broadcast(rank, root, m),
        }
    }
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
    let switch = Switch::new(common::job_table(GEN, n, elems, slots, (dtype, auth), base));
    let mut workers: Vec<Worker> = join_all(&mut switch.table(), n, dtype, base)
        .into_iter()
        .map(|m| Worker::new(m, dtype))
        .collect();
    // (to the switch?, rank, bytes)
    let mut net: Links<(bool, u16, Vec<u8>)> = Links::new(seed);
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
            w.begin(it, seq, shape);
        }
        let mut rounds = 0u64;
        while !workers.iter().all(|w| w.coll().is_complete()) {
            rounds += 1;
            assert!(rounds < 5_000_000, "hang: step {it} {step:?}");
            for (r, w) in workers.iter_mut().enumerate() {
                while let Some((_, bytes)) = w.poll_data(base + now) {
                    net.send(faults, now, || (true, r as u16, bytes.clone()));
                }
            }
            let next_timer = workers
                .iter()
                .filter_map(|w| w.coll().next_timeout())
                .min()
                .map(|t| t - base);
            now = now.max(common::next_event(net.next_delivery(), next_timer));
            while let Some((to_switch, rank, bytes)) = net.pop_due(now) {
                if to_switch {
                    let from = endpoint(rank);
                    let thread = common::thread_of(rank);
                    common::at_switch(&switch, thread, &bytes, from, base + now, |rank, b| {
                        net.send(faults, now, || (false, rank, b.to_vec()))
                    });
                    continue;
                }
                let w = &mut workers[rank as usize];
                let (h, outcome, v) = match w.m.handle(&bytes, base + now) {
                    Some(Event::Result {
                        header,
                        outcome,
                        values,
                        ..
                    }) => (header, outcome, values),
                    other => panic!("rank {rank}: not a RESULT the member takes: {other:?}"),
                };
                match outcome {
                    // Into the output (a kept shard added as the library
                    // does).
                    ResultOutcome::Fresh { .. } => w.take(&outcome, &bytes[v]),
                    ResultOutcome::Duplicate | ResultOutcome::Foreign => {}
                    // The switch answers each rank as its shape says.
                    other => panic!("rank {rank} step {it} {step:?}: {other:?} for {h:?}"),
                }
            }
        }
        for (r, w) in workers.iter().enumerate() {
            let want: Vec<f32> = match step {
                // The others in rank order, rounded (the RESULT), then the
                // owner's own, rounded again.
                Step::ReduceScatter => (r * m..(r + 1) * m)
                    .map(|i| expected_kept_sum_dtype(dtype, n, r as u16, it, i))
                    .collect(),
                Step::ReduceScatterSendingOwn => sum[r * m..(r + 1) * m].to_vec(),
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
        seq = workers[0].coll().end_seq();
    }
}

const SEQUENCE: [Step; 7] = [
    Step::ReduceScatter,
    Step::AllGather,
    Step::AllReduce,
    Step::Broadcast(2),
    Step::ReduceScatterSendingOwn,
    Step::AllGather,
    // Again on slots whose accumulators hold earlier sums.
    Step::ReduceScatter,
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
