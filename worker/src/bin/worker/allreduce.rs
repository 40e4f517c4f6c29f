//! `worker allreduce`: the config from the flags, the join, the untimed
//! warm-up, the timed collectives (with `--verify`, every output element
//! and gradient statistic checked), the report and the LEAVE.
//!
//! Exit status 2 when an element or a collective's statistics differ from
//! the reference. Nothing is filled or copied between the timed
//! collectives without `--verify`, and `--machine-cpu` reads only around
//! them. A rank whose collective failed LEAVEs before it returns the
//! error.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use proto::reference::{
    expected_kept_sum_dtype, expected_sum_dtype, expected_tree_sum_dtype, pattern, pattern_dtype,
};
use proto::wire::Dtype;
use worker::{GradStats, Kind, Worker, WorkerError};

use crate::args::AllreduceArgs;
use crate::config::{config, job_label};
use crate::cpu::{machine_busy_cpu_seconds, pid_cpu_seconds, process_cpu_seconds};
use crate::report::{Report, StatsLine};
use crate::tree::tree_place;
use crate::verify::{expected_stats, expected_tree_stats, CliElement};

/// What the iterations measured.
struct Outcome {
    busy: Duration,
    mismatches: u64,
    /// With `--machine-cpu`: the machine's busy CPU seconds when the first
    /// all-reduce started and when the last one ended.
    machine_cpu: [f64; 2],
    /// With `--machine-cpu`: this process's CPU seconds at the same points.
    process_cpu: [f64; 2],
    /// With `--switchd-pid`: that process's CPU seconds at the same points.
    switchd_cpu: Option<[f64; 2]>,
    /// In a stats job: each timed collective's statistics.
    grad: Option<Vec<StatsLine>>,
    stats_mismatches: u64,
    /// Each timed iteration's seconds (up to [`MAX_ITERATION_TIMES`]).
    times: Vec<f64>,
}

/// Most per-iteration times a report lists.
const MAX_ITERATION_TIMES: usize = 10_000;

/// Lengths of a rank's input and output for `--collective` over a whole
/// tensor of `elements` (n·m for reduce-scatter and all-gather).
fn io_lengths(kind: Kind, elements: usize, n: u16) -> Result<(usize, usize)> {
    if kind != Kind::AllReduce && !elements.is_multiple_of(n.into()) {
        bail!(
            "--elements {elements} is not a multiple of --workers {n}: {kind} needs n shards of \
             the same length (try --elements {})",
            elements.next_multiple_of(n.into())
        );
    }
    Ok(match kind {
        Kind::AllReduce => (elements, elements),
        Kind::ReduceScatter => (elements, elements / usize::from(n)),
        Kind::AllGather => (elements / usize::from(n), elements),
    })
}

/// One collective of `kind`: an all-reduce in place in `input`, else from
/// `input` into `output`.
fn run_one<T: CliElement>(
    w: &mut Worker,
    kind: Kind,
    input: &mut [T],
    output: &mut [T],
) -> Result<(), WorkerError> {
    match kind {
        Kind::AllReduce => w.all_reduce(input),
        Kind::ReduceScatter => w.reduce_scatter(input, output),
        Kind::AllGather => w.all_gather(input, output),
    }
}

/// Runs the collectives on tensors of `T`: the input is `pattern_rank`'s
/// pattern (rounded to `T`), every output element checked against
/// `expected` with `--verify`.
/// In a stats job, `expected_grad` gives iteration `it`'s reference
/// statistics (None: not checked).
fn iterate<T: CliElement>(
    w: &mut Worker,
    a: &AllreduceArgs,
    pattern_rank: u16,
    expected: &dyn Fn(u32, usize) -> f32,
    expected_grad: &dyn Fn(&Worker, u32) -> Option<GradStats>,
    what: &str,
) -> Result<Outcome> {
    let kind = a.collective.kind();
    let (in_len, out_len) = io_lengths(kind, a.elements, a.job.target.workers)?;
    let fill = |it: u32, out: &mut [T]| {
        for (i, v) in out.iter_mut().enumerate() {
            *v = T::from_f32(pattern(pattern_rank, it, i));
        }
    };
    let mut data = vec![T::from_f32(0.0); in_len];
    let mut output = if kind == Kind::AllReduce {
        Vec::new()
    } else {
        vec![T::from_f32(0.0); out_len]
    };
    fill(0, &mut data);
    // Untimed, as MPI benchmarks warm up: the first all-reduces pay for
    // page faults on the library's buffers and the window's slow start.
    for it in 0..a.warmup {
        run_one(w, kind, &mut data, &mut output)
            .with_context(|| format!("warm-up {kind} {it} of {what}"))?;
    }
    let mut busy = Duration::ZERO;
    let mut times = Vec::with_capacity((a.iterations as usize).min(MAX_ITERATION_TIMES));
    let mut mismatches = 0u64;
    let mut machine_cpu = [0.0f64; 2];
    let mut process_cpu = [0.0f64; 2];
    let mut switchd_cpu = a.switchd_pid.map(|_| [0.0f64; 2]);
    let summed = kind != Kind::AllGather;
    let mut grad = (w.has_gradient_stats() && summed).then(Vec::new);
    let mut stats_mismatches = 0u64;
    for it in 0..a.iterations {
        // Without --verify every iteration reduces the previous result:
        // nothing is generated or copied between the timed all-reduces,
        // which on a shared machine would slow the other ranks' and count
        // in --machine-cpu.
        if a.verify {
            fill(it, &mut data);
        }
        if a.machine_cpu && it == 0 {
            machine_cpu[0] = machine_busy_cpu_seconds()?;
            process_cpu[0] = process_cpu_seconds()?;
            if let (Some(pid), Some(s)) = (a.switchd_pid, &mut switchd_cpu) {
                s[0] = pid_cpu_seconds(pid)?;
            }
        }
        let t = Instant::now();
        run_one(w, kind, &mut data, &mut output)
            .with_context(|| format!("{kind} {it} of {what}"))?;
        let took = t.elapsed();
        busy += took;
        if times.len() < MAX_ITERATION_TIMES {
            times.push(took.as_secs_f64());
        }
        if a.machine_cpu && it + 1 == a.iterations {
            machine_cpu[1] = machine_busy_cpu_seconds()?;
            process_cpu[1] = process_cpu_seconds()?;
            if let (Some(pid), Some(s)) = (a.switchd_pid, &mut switchd_cpu) {
                s[1] = pid_cpu_seconds(pid)?;
            }
        }
        if let Some(lines) = &mut grad {
            let got = w
                .gradient_stats()
                .with_context(|| format!("{kind} {it} of {what}"))?;
            let verified = a
                .verify
                .then(|| expected_grad(w, it))
                .flatten()
                .map(|want| {
                    let ok = got.bits_eq(&want);
                    if !ok {
                        stats_mismatches += 1;
                        if stats_mismatches <= 10 {
                            eprintln!(
                                "MISMATCH {what} iteration {it} gradient statistics: got \
                                 {got:?}, expected {want:?}"
                            );
                        }
                    }
                    ok
                });
            lines.push(StatsLine {
                iteration: it,
                sum_of_squares: got.sum_of_squares,
                square_of_sum: got.square_of_sum,
                ranks: got.ranks,
                verified,
            });
        }
        if a.verify {
            let got = if kind == Kind::AllReduce {
                &data
            } else {
                &output
            };
            for (i, v) in got.iter().enumerate() {
                let (got, want) = (v.to_f32(), expected(it, i));
                if got.to_bits() != want.to_bits() {
                    if mismatches < 10 {
                        eprintln!(
                            "MISMATCH {what} iteration {it} element {i}: got {got:e} ({:#010x}), expected {want:e} ({:#010x})",
                            got.to_bits(),
                            want.to_bits()
                        );
                    }
                    mismatches += 1;
                }
            }
        }
    }
    Ok(Outcome {
        busy,
        mismatches,
        machine_cpu,
        process_cpu,
        switchd_cpu,
        grad,
        stats_mismatches,
        times,
    })
}

pub(crate) fn allreduce(a: AllreduceArgs) -> Result<ExitCode> {
    let tree = tree_place(
        a.tree_leaves.as_deref(),
        a.leaf,
        a.job.rank,
        a.job.target.workers,
    )?;
    let dtype = a.job.target.dtype;
    let mut cfg = config(&a.job)?;
    cfg.transport.congestion_control = !a.no_congestion_control;
    cfg.transport.delay_target =
        (a.delay_target > 0.0).then(|| Duration::from_secs_f64(a.delay_target / 1e3));
    cfg.transport.window_override = a.window_override;
    cfg.transport_kind = a.transport;
    cfg.threads = a.threads;
    let (rank, n) = (cfg.rank, cfg.n_workers);
    let label = job_label(&a.job.target);
    let kind = a.collective.kind();
    // Refuse a bad --elements before joining (the other ranks would wait).
    let (_, out_len) = io_lengths(kind, a.elements, n)?;
    // In a tree the pattern is the global rank's, and the reference the
    // tree-order sum over every leaf; otherwise the rank-order sum. A
    // reduce-scatter's output is this rank's shard of that sum; an
    // all-gather's, shard r is rank r's pattern (in a tree the switch
    // refuses both: NACK 10).
    let pattern_rank = tree.as_ref().map_or(rank, |t| t.global_rank);
    let mut w = Worker::join(cfg).with_context(|| format!("joining {label} as rank {rank}"))?;
    // A self-provisioned job's id is the switch's.
    let job = w.job();
    // A reduce-scatter rank keeps its own shard (the others' sum plus its
    // own), as the library decides.
    let keeps = kind == Kind::ReduceScatter && w.reduce_scatter_shape(out_len).owner_keeps();
    let expected = |it: u32, i: usize| match (kind, &tree) {
        (Kind::ReduceScatter, _) if keeps => {
            expected_kept_sum_dtype(dtype, n, rank, it, usize::from(rank) * out_len + i)
        }
        (Kind::ReduceScatter, _) => {
            expected_sum_dtype(dtype, n, it, usize::from(rank) * out_len + i)
        }
        (Kind::AllGather, _) => {
            let m = out_len / usize::from(n);
            pattern_dtype(dtype, (i / m) as u16, it, i % m)
        }
        (Kind::AllReduce, Some(t)) => expected_tree_sum_dtype(dtype, &t.sizes, it, i),
        (Kind::AllReduce, None) => expected_sum_dtype(dtype, n, it, i),
    };
    let (who, reference) = match &tree {
        Some(t) => (
            format!(
                "leaf {} rank {rank} (global rank {})",
                t.leaf, t.global_rank
            ),
            "tree-order sum",
        ),
        None => (format!("rank {rank}"), "rank-order sum"),
    };
    let reference = match kind {
        Kind::AllReduce => reference,
        Kind::ReduceScatter if keeps => "others' rank-order sum plus the rank's own shard",
        Kind::ReduceScatter => "rank's shard of the rank-order sum",
        Kind::AllGather => "ranks' inputs",
    };
    let what = format!("job {job} ({who})");
    // In a tree the spine adds the leaves' parts in leaf order.
    let expected_grad = |w: &Worker, it: u32| match &tree {
        Some(t) => expected_tree_stats(dtype, &t.sizes, a.elements, w.elems_per_chunk(), it),
        None => expected_stats(kind, dtype, n, a.elements, w.elems_per_chunk(), it),
    };
    let outcome = match dtype {
        Dtype::F32 => iterate::<f32>(&mut w, &a, pattern_rank, &expected, &expected_grad, &what),
        Dtype::Bf16 => {
            iterate::<half::bf16>(&mut w, &a, pattern_rank, &expected, &expected_grad, &what)
        }
        Dtype::F16 => {
            iterate::<half::f16>(&mut w, &a, pattern_rank, &expected, &expected_grad, &what)
        }
    };
    let Outcome {
        busy,
        mismatches,
        machine_cpu,
        process_cpu,
        switchd_cpu,
        grad,
        stats_mismatches,
        times,
    } = match outcome {
        Ok(o) => o,
        Err(e) => {
            // This process is done with the job: say so, so that the
            // switch does not keep its membership. Otherwise the next
            // process of this rank, if the kernel gives it the same UDP
            // port, is taken for this one asking again and goes on alone,
            // while the other ranks' JOINs reset the job it thinks active.
            let _ = w.leave();
            return Err(e);
        }
    };
    let stats = w.stats();
    // Reduce-scatter and all-gather cut each of the n shards into chunks.
    let shards = if kind == Kind::AllReduce { 1 } else { n };
    let shard = a.elements / usize::from(shards);
    let chunks_per_coll =
        (usize::from(shards) * shard.div_ceil(w.elems_per_chunk() as usize)) as f64;
    let secs = busy.as_secs_f64().max(1e-9);
    let report = Report {
        job,
        rank,
        workers: n,
        dtype: dtype.name(),
        collective: kind.name(),
        elements: a.elements,
        iterations: a.iterations,
        seconds: secs,
        gbit_per_s: (a.elements as f64 * dtype.size() as f64 * 8.0 * a.iterations as f64)
            / secs
            / 1e9,
        chunks_per_s: chunks_per_coll * a.iterations as f64 / secs,
        verified: a.verify && mismatches == 0 && stats_mismatches == 0,
        mismatches,
        tree_leaves: tree.as_ref().map(|t| t.sizes.clone()),
        leaf: tree.as_ref().map(|t| t.leaf),
        global_rank: tree.as_ref().map(|t| t.global_rank),
        elems_per_chunk: w.elems_per_chunk(),
        pool_slots: w.pool_slots(),
        seq_lanes: w.seq_lanes(),
        transport: w.transport().name(),
        threads: w.threads(),
        lane_replies: w.lane_replies(),
        auth: w.auth().name(),
        stats,
        gradient_stats: grad,
        stats_mismatches,
        machine_busy_cpu_s: a.machine_cpu.then_some(machine_cpu),
        process_cpu_s: a.machine_cpu.then_some(process_cpu),
        switchd_cpu_s: switchd_cpu,
        iteration_seconds: times,
    };
    let _ = w.leave();
    report.print(a.json, &who, kind, a.verify)?;
    if mismatches > 0 {
        eprintln!("FAILED: {mismatches} elements differ from the {reference}");
        return Ok(ExitCode::from(2));
    }
    if stats_mismatches > 0 {
        eprintln!(
            "FAILED: the gradient statistics of {stats_mismatches} collectives differ from the \
             reference (proto::member::reference_grad_stats of every rank's pattern)"
        );
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharded_collectives_split_elements_into_n_shards() {
        assert_eq!(io_lengths(Kind::AllReduce, 10, 3).unwrap(), (10, 10));
        assert_eq!(io_lengths(Kind::ReduceScatter, 12, 3).unwrap(), (12, 4));
        assert_eq!(io_lengths(Kind::AllGather, 12, 3).unwrap(), (4, 12));
        let e = format!("{:#}", io_lengths(Kind::AllGather, 10, 4).unwrap_err());
        assert_eq!(
            e,
            "--elements 10 is not a multiple of --workers 4: all-gather needs n shards of \
             the same length (try --elements 12)"
        );
    }
}
