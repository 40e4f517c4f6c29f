//! Gradient statistics end to end in virtual time: workers and the real
//! switch table of a `stats = true` job over a simulated network that loses,
//! duplicates and reorders. Every worker's RESULTs go through
//! `proto::member::Member` (its session checks and parses the trailer, its
//! collective folds the trailers in seq order), as the worker library's
//! do; every rank must end each collective with the same bits as
//! `proto::member::reference_grad_stats` of the inputs, for
//! f32, bf16 and f16, with and without tags, all-reduce and reduce-scatter.

use std::time::{Duration, Instant};

use proto::member::{reference_grad_stats, Event, Member, ResultOutcome, Shape};
use proto::switch::entry::Switch;
use proto::switch::{Endpoint, JobConfig, JobTable, TableConfig};
use proto::tag::AuthMode;
use proto::wire::Dtype;

mod common;
use common::{join_lossless, join_params, Links, Worker, ALL_FAULTS};

const GEN: u32 = 7;

enum Msg {
    ToSwitch { rank: u16, bytes: Vec<u8> },
    ToWorker { rank: u16, bytes: Vec<u8> },
}

fn endpoint(rank: u16) -> Endpoint {
    common::endpoint(rank, 2000)
}

/// Job 1, `stats = true`.
fn stats_table(n: u16, elems: u16, slots: u16, dtype: Dtype, auth: AuthMode) -> JobTable {
    let mut t = JobTable::new(TableConfig::new(GEN, [5; 32]), Instant::now());
    t.add(
        JobConfig {
            stats: true,
            ..common::job_config(n, elems, slots, (dtype, auth))
        },
        // Room for the trailer at any dtype.
        elems + 16,
    )
    .unwrap();
    t
}

/// Runs `iterations` collectives of `shape(rank)` over `n` ranks of a
/// stats job; panics unless every rank's statistics (and every RESULT
/// value) are the reference's bits.
#[allow(clippy::too_many_arguments)]
fn run(
    n: u16,
    layout: usize,
    shape: impl Fn(u16) -> Shape,
    elems: u16,
    dtype: Dtype,
    auth: AuthMode,
    iterations: u32,
    seed: u64,
) {
    let base = Instant::now();
    let switch = Switch::new(stats_table(n, elems, 16, dtype, auth));
    let mut table = switch.table();
    let mut sessions: Vec<Member> = (0..n)
        .map(|r| {
            let from = endpoint(r);
            let params = join_params(1, n, dtype, [3; 32], r, &from);
            join_lossless(&mut table, from, params, [r as u8 + 1; 32], 0, base)
        })
        .collect();
    while let Some(r) = table.poll_reply() {
        let mut b = [0u8; 128];
        let e = table.encode(&r, &mut b).unwrap();
        match sessions[r.rank as usize].handle(&b[..e.len], base) {
            Some(Event::Joined(j)) => assert!(j.stats, "the JOIN_ACK says stats"),
            other => panic!("rank {}: no JOIN_ACK: {other:?}", r.rank),
        }
    }
    drop(table);
    let mut net: Links<Msg> = Links::new(seed);
    let mut now = Duration::ZERO;
    let mut seq = 0;
    let mut workers: Vec<Worker> = sessions.drain(..).map(|s| Worker::new(s, dtype)).collect();
    let mut trailers = 0u64;
    for it in 0..iterations {
        for (r, w) in workers.iter_mut().enumerate() {
            // The whole layout: what a reduce-scatter sends from.
            w.input = (0..layout)
                .map(|i| proto::reference::pattern_dtype(dtype, r as u16, it, i))
                .collect();
            w.begin(it, seq, shape(r as u16));
        }
        let inputs: Vec<&[f32]> = workers.iter().map(|w| &w.input[..]).collect();
        let want = reference_grad_stats(shape(0), elems, &inputs).unwrap();
        let mut steps = 0u64;
        while !workers.iter().all(|w| w.coll().is_complete()) {
            steps += 1;
            assert!(steps < 5_000_000, "hang: iteration {it}");
            for (r, w) in workers.iter_mut().enumerate() {
                while let Some((_, bytes)) = w.poll_data(base + now) {
                    net.send(ALL_FAULTS, now, || Msg::ToSwitch {
                        rank: r as u16,
                        bytes: bytes.clone(),
                    });
                }
            }
            let next_timer = workers
                .iter()
                .filter_map(|w| w.coll().next_timeout())
                .min()
                .map(|t| t - base);
            now = now.max(common::next_event(net.next_delivery(), next_timer));
            while let Some(m) = net.pop_due(now) {
                match m {
                    Msg::ToSwitch { rank, bytes } => {
                        let (from, thread) = (endpoint(rank), common::thread_of(rank));
                        common::at_switch(&switch, thread, &bytes, from, base + now, |r, b| {
                            net.send(ALL_FAULTS, now, || Msg::ToWorker {
                                rank: r,
                                bytes: b.to_vec(),
                            })
                        });
                    }
                    Msg::ToWorker { rank, bytes } => {
                        let w = &mut workers[rank as usize];
                        let Some(Event::Result {
                            outcome: out,
                            values,
                            stats,
                            ..
                        }) = w.m.handle(&bytes, base + now)
                        else {
                            panic!("rank {rank}: not a RESULT the member takes");
                        };
                        assert!(stats.is_some(), "every summed RESULT has a trailer");
                        trailers += 1;
                        // Values are simulated_network.rs's to check.
                        // Foreign: a late copy of the previous collective's.
                        assert!(
                            !matches!(out, ResultOutcome::CountMismatch { .. }),
                            "rank {rank}: {out:?} ({} value bytes)",
                            values.len()
                        );
                    }
                }
            }
        }
        for (r, w) in workers.iter().enumerate() {
            let got = w.coll().grad_stats().expect("every chunk's trailer");
            assert!(
                got.bits_eq(&want),
                "{dtype:?} {auth:?} rank {r} iteration {it}: {got:?} != {want:?}"
            );
        }
        seq = workers[0].coll().end_seq();
    }
    assert!(trailers > 0);
}

#[test]
fn all_reduce_statistics_under_all_faults_are_the_reference_bits() {
    for (dtype, auth, seed) in [
        (Dtype::F32, AuthMode::Port, 21),
        (Dtype::Bf16, AuthMode::Port, 22),
        (Dtype::F16, AuthMode::Port, 23),
        (Dtype::F32, AuthMode::Mac, 24),
    ] {
        let len = 1001;
        run(4, len, |_| Shape::all_reduce(len), 16, dtype, auth, 2, seed);
    }
}

#[test]
fn reduce_scatter_statistics_under_all_faults_cover_every_shard() {
    let (n, m) = (3u16, 101usize);
    run(
        n,
        n as usize * m,
        // A stats job's ranks send their own shard too (the worker library
        // does so when the JOIN_ACK says stats): the switch must see every
        // rank's gradient.
        |r| Shape::reduce_scatter(r, n, m).sending_own_shard(),
        16,
        Dtype::F32,
        AuthMode::Port,
        2,
        31,
    );
}
