//! Reduce-scatter, all-gather and broadcast through the worker library
//! against `worker::loopback` (the same `proto` job table switchd runs):
//! every output element checked bit for bit, with loss, across kinds in a
//! row, under `auth = "mac"`, and after a switch restart; wrong lengths are
//! errors that send nothing.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use proto::reference::{expected_kept_sum_dtype, expected_sum_dtype, pattern};
use proto::wire::Dtype;
use worker::loopback::{LoopbackConfig, LoopbackSwitch};
use worker::{AuthMode, Element, Worker, WorkerConfig, WorkerError};

const SECRET: [u8; 32] = [0x5a; 32];

fn stand_in(n: u16, dtype: Dtype, drop_every: u64, auth: AuthMode) -> LoopbackSwitch {
    let mut cfg = LoopbackConfig::new(1, n, SECRET);
    cfg.elems_per_chunk = 100;
    cfg.dtype = dtype;
    cfg.drop_every = drop_every;
    cfg.auth = auth;
    LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap()
}

fn join(sw: &LoopbackSwitch, rank: u16, n: u16, dtype: Dtype) -> Worker {
    let mut cfg = WorkerConfig::new(sw.addr(), 1, rank, n, SECRET);
    cfg.dtype = dtype;
    cfg.join_timeout = Duration::from_secs(20);
    Worker::join(cfg).expect("join")
}

/// Runs `body` on every rank of an `n`-rank `dtype` job at `sw`, each in
/// its own thread with its worker joined; a panic in any fails the test.
fn on_every_rank(sw: &LoopbackSwitch, n: u16, dtype: Dtype, body: impl Fn(u16, Worker) + Sync) {
    std::thread::scope(|s| {
        for rank in 0..n {
            let body = &body;
            s.spawn(move || body(rank, join(sw, rank, n, dtype)));
        }
    });
}

/// An element type with its conversions from and to float32.
#[derive(Clone, Copy)]
struct Ty<T> {
    dtype: Dtype,
    conv: fn(f32) -> T,
    widen: fn(T) -> f32,
}

const F32: Ty<f32> = Ty {
    dtype: Dtype::F32,
    conv: |v| v,
    widen: |v| v,
};
const BF16: Ty<half::bf16> = Ty {
    dtype: Dtype::Bf16,
    conv: half::bf16::from_f32,
    widen: half::bf16::to_f32,
};
const F16: Ty<half::f16> = Ty {
    dtype: Dtype::F16,
    conv: half::f16::from_f32,
    widen: half::f16::to_f32,
};

/// Rank `rank` runs, per iteration, a reduce-scatter, an all-gather, an
/// all-reduce and a broadcast (root = iteration mod n), shards of `m`
/// elements, checking every output element bit for bit.
fn run_rank<T: Element>(w: &mut Worker, ty: Ty<T>, n: u16, m: usize, iterations: u32) {
    let rank = w.rank();
    let bits = |v: T| (ty.widen)(v).to_bits();
    let nm = usize::from(n) * m;
    for it in 0..iterations {
        // Reduce-scatter: this rank's shard of the sum, the others' in rank
        // order plus its own kept shard.
        let input: Vec<T> = (0..nm).map(|i| (ty.conv)(pattern(rank, it, i))).collect();
        let mut out = vec![(ty.conv)(-7.0); m];
        w.reduce_scatter(&input, &mut out).expect("reduce_scatter");
        for (j, v) in out.iter().enumerate() {
            let i = usize::from(rank) * m + j;
            let want = expected_kept_sum_dtype(ty.dtype, n, rank, it, i);
            assert_eq!(
                bits(*v),
                want.to_bits(),
                "RS {} rank {rank} it {it} elem {j}",
                ty.dtype
            );
        }
        // All-gather: every rank's shard, copied bit for bit.
        let shard: Vec<T> = (0..m).map(|j| (ty.conv)(pattern(rank, it, j))).collect();
        let mut all = vec![(ty.conv)(-7.0); nm];
        w.all_gather(&shard, &mut all).expect("all_gather");
        for (i, v) in all.iter().enumerate() {
            let (r, j) = ((i / m) as u16, i % m);
            let want = (ty.conv)(pattern(r, it, j));
            assert_eq!(
                bits(*v),
                bits(want),
                "AG {} rank {rank} it {it} elem {i}",
                ty.dtype
            );
        }
        // The all-reduce between them is unchanged.
        let mut ar: Vec<T> = (0..m + 3)
            .map(|i| (ty.conv)(pattern(rank, it, i)))
            .collect();
        w.all_reduce(&mut ar).expect("all_reduce");
        for (i, v) in ar.iter().enumerate() {
            let want = expected_sum_dtype(ty.dtype, n, it, i);
            assert_eq!(
                bits(*v),
                want.to_bits(),
                "AR {} rank {rank} it {it}",
                ty.dtype
            );
        }
        // Broadcast from a root that changes per iteration.
        let root = (it % u32::from(n)) as u16;
        let mut b: Vec<T> = (0..m)
            .map(|j| (ty.conv)(pattern(rank, it + 1, j)))
            .collect();
        w.broadcast(root, &mut b).expect("broadcast");
        for (j, v) in b.iter().enumerate() {
            let want = (ty.conv)(pattern(root, it + 1, j));
            assert_eq!(
                bits(*v),
                bits(want),
                "BC {} rank {rank} it {it} elem {j}",
                ty.dtype
            );
        }
    }
}

fn kinds_over_lossy_stand_in<T: Element>(ty: Ty<T>, auth: AuthMode) {
    let n = 4;
    let sw = stand_in(n, ty.dtype, 13, auth);
    on_every_rank(&sw, n, ty.dtype, |_, mut w| {
        // 1_001 elements a shard: ten chunks of 100 and a short
        // one each, so shards end mid-chunk-size.
        run_rank(&mut w, ty, n, 1_001, 2);
        let st = w.stats();
        assert!(
            st.chunks_resent > 0,
            "the stand-in's losses were resent: {st:?}"
        );
        assert_eq!(st.mismatched_results, 0, "{st:?}");
        assert_eq!(st.bad_tag_results, 0, "{st:?}");
        assert_eq!(st.collectives, 8);
    });
}

#[test]
fn f32_kinds_bit_exact_over_a_lossy_stand_in() {
    kinds_over_lossy_stand_in(F32, AuthMode::Port);
}

#[test]
fn bf16_kinds_bit_exact_over_a_lossy_stand_in() {
    kinds_over_lossy_stand_in(BF16, AuthMode::Port);
}

#[test]
fn f16_kinds_bit_exact_over_a_lossy_stand_in() {
    kinds_over_lossy_stand_in(F16, AuthMode::Port);
}

#[test]
fn tagged_kinds_bit_exact_over_a_lossy_stand_in() {
    // NOVAL DATA and RESULTs carry only the tag, which still verifies.
    kinds_over_lossy_stand_in(F32, AuthMode::Mac);
}

#[test]
fn every_rank_sends_and_is_answered_every_chunk_of_the_layout() {
    // Every rank sends every chunk of the n·m layout (values or NOVAL) and
    // gets a RESULT for each, whoever owns it.
    let n = 3;
    let sw = stand_in(n, Dtype::F32, 0, AuthMode::Port);
    on_every_rank(&sw, n, Dtype::F32, |_, mut w| {
        let m = 250;
        let input = vec![1.0f32; usize::from(n) * m];
        let mut out = vec![0f32; m];
        w.reduce_scatter(&input, &mut out).unwrap();
        assert_eq!(out, vec![f32::from(n); m]);
        // 3 chunks per shard, every one sent, every one answered; the
        // rank's own shard stays home (NOVAL): (n−1)/n of the input goes.
        assert_eq!(w.stats().chunks_sent, 9);
        assert_eq!(w.stats().values_sent, 6);
        assert_eq!(w.stats().results, 9);
    });
}

#[test]
fn a_switch_restart_between_kinds_rejoins_and_stays_exact() {
    // The restart comes between collectives of different kinds: a rank
    // may have to resend the previous one (an all-gather) from its kept
    // input before the next (a reduce-scatter) can go.
    let n = 3;
    let sw = stand_in(n, Dtype::F32, 0, AuthMode::Port);
    let restart = sw.restarter();
    let barrier = std::sync::Barrier::new(usize::from(n));
    on_every_rank(&sw, n, Dtype::F32, |_, mut w| {
        run_rank(&mut w, F32, n, 333, 1);
        if barrier.wait().is_leader() {
            restart();
        }
        barrier.wait();
        run_rank(&mut w, F32, n, 333, 2);
        assert!(w.stats().rejoins >= 1, "{:?}", w.stats());
    });
}

#[test]
fn wrong_lengths_are_errors_naming_both_lengths_and_n() {
    let n = 1;
    let sw = stand_in(n, Dtype::F32, 0, AuthMode::Port);
    let mut w = join(&sw, 0, n, Dtype::F32);
    let msg = |e: WorkerError| e.to_string();
    let e = msg(w.reduce_scatter(&[0f32; 6], &mut [0f32; 4]).unwrap_err());
    for want in [
        "reduce_scatter with an input of 6 and an output of 4 elements",
        "n = 1 ranks",
        "pass an output of 6 elements",
    ] {
        assert!(e.contains(want), "{want:?} missing from: {e}");
    }
    let e = msg(w.all_gather(&[0f32; 3], &mut [0f32; 2]).unwrap_err());
    for want in [
        "all_gather with an input of 3 and an output of 2 elements",
        "pass an output of 3 elements",
    ] {
        assert!(e.contains(want), "{want:?} missing from: {e}");
    }
    let e = msg(w.broadcast(1, &mut [0f32; 3]).unwrap_err());
    assert!(
        e.contains("broadcast from root 1, but the job's ranks are 0..1"),
        "{e}"
    );
    let e = msg(w
        .all_gather(&[half::bf16::ONE; 2], &mut [half::bf16::ONE; 2])
        .unwrap_err());
    assert!(
        e.contains("all_gather of bf16 elements") && e.contains("joined the job as f32"),
        "{e}"
    );
    assert_eq!(w.stats().chunks_sent, 0, "nothing went on the wire");
    // The worker still works.
    let mut out = [0f32; 2];
    w.all_gather(&[4.0f32, 5.0], &mut out).unwrap();
    assert_eq!(out, [4.0, 5.0]);
}

#[test]
fn a_reduce_scatter_length_that_n_does_not_divide_says_so() {
    let n = 2;
    let sw = stand_in(n, Dtype::F32, 0, AuthMode::Port);
    on_every_rank(&sw, n, Dtype::F32, |_, mut w| {
        let e = w
            .reduce_scatter(&[0f32; 5], &mut [0f32; 2])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "the input must be n × m elements (n = 2 ranks), and 5 is not a \
                        multiple of 2"
            ),
            "{e}"
        );
    });
}

#[test]
fn all_gather_bytes_carries_float32_through_a_bf16_job_bit_for_bit() {
    // FSDP's mixed precision with one job: gradients reduced in bf16,
    // float32 parameters gathered as pairs of bf16 elements (never
    // converted: NaN payloads and subnormals come back as sent).
    let n = 3;
    let sw = stand_in(n, Dtype::Bf16, 7, AuthMode::Port);
    let shard = |rank: u16| -> Vec<f32> {
        let mut v: Vec<f32> = (0..257).map(|j| pattern(rank, 0, j)).collect();
        v[0] = f32::from_bits(0x7fc0_0000 | (u32::from(rank) + 1));
        v[1] = f32::from_bits(1 + u32::from(rank));
        v
    };
    on_every_rank(&sw, n, Dtype::Bf16, |rank, mut w| {
        let mine = shard(rank);
        let mut out = vec![0f32; mine.len() * usize::from(n)];
        w.all_gather_bytes(
            bytemuck::cast_slice(&mine),
            bytemuck::cast_slice_mut(&mut out),
        )
        .expect("all_gather_bytes");
        let want: Vec<u32> = (0..n).flat_map(shard).map(f32::to_bits).collect();
        assert_eq!(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
        let e = w
            .all_gather_bytes(&[0u8; 3], &mut [0u8; 9])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "3 bytes, which is not a whole number of the job's bf16 elements (2 bytes each)"
            ),
            "{e}"
        );
    });
}

/// Every kind (reduce-scatter, all-gather, all-reduce, broadcast) carried
/// by 2 threads per rank on a switch of 4 seq lanes with lane replies
/// (docs/design/worker-threads.md), lossy: the shapes' chunks split by seq
/// like an all-reduce's, and every output is bit-exact.
#[test]
fn kinds_on_two_threads_bit_exact_over_a_lossy_stand_in() {
    let n = 4;
    let mut cfg = LoopbackConfig::new(1, n, SECRET);
    cfg.elems_per_chunk = 100;
    cfg.dtype = Dtype::Bf16;
    cfg.drop_every = 13;
    cfg.seq_lanes = 4;
    let sw = LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    std::thread::scope(|s| {
        for rank in 0..n {
            let sw = &sw;
            s.spawn(move || {
                let mut cfg = WorkerConfig::new(sw.addr(), 1, rank, n, SECRET);
                cfg.dtype = Dtype::Bf16;
                cfg.join_timeout = Duration::from_secs(20);
                cfg.threads = 2;
                let mut w = Worker::join(cfg).expect("join");
                run_rank(&mut w, BF16, n, 1_001, 2);
                assert_eq!(w.threads(), 2);
                assert_eq!(w.stats().mismatched_results, 0, "{:?}", w.stats());
            });
        }
    });
}
