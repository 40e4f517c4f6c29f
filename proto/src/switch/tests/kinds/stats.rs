//! Gradient statistics through the job table (docs/PROTOCOL.md, "Gradient
//! statistics"): in a `stats = true` job every RESULT of a summed kind
//! carries a trailer equal, bit for bit, to `proto::stats::chunk_stats` of
//! the ranks' inputs, for f32, bf16 and f16, with or without tags, over a
//! network that loses, duplicates and reorders (resends from the shadow
//! carry the same bytes); a reduce-scatter's NOVAL RESULTs carry it, an
//! all-gather's none; a DATA with a trailer is dropped; a job without
//! stats is unchanged.

use super::*;
use crate::reference::rank_order_sum;
use crate::stats::{chunk_stats, GradStats, STATS_LEN};

fn stats_config(dtype: Dtype, auth: AuthMode, elems: u16) -> JobConfig {
    JobConfig {
        stats: true,
        ..kind_config(dtype, auth, elems)
    }
}

/// Wire bytes of `dtype` widened to float32.
fn widen(dtype: Dtype, b: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; b.len() / dtype.size()];
    crate::elements::read_le(dtype, b, &mut out);
    out
}

/// The reference statistics of `len` elements from element `from` of every
/// rank's input (rank order; the float32 sum before rounding).
fn reference_stats(dtype: Dtype, inputs: &[Vec<u8>], from: usize, len: usize) -> GradStats {
    let size = dtype.size();
    let vals: Vec<Vec<f32>> = inputs
        .iter()
        .map(|i| widen(dtype, &i[from * size..(from + len) * size]))
        .collect();
    let refs: Vec<&[f32]> = vals.iter().map(|v| &v[..]).collect();
    chunk_stats(&refs, &rank_order_sum(&refs))
}

fn assert_stats(got: &Option<GradStats>, want: &GradStats, what: &str) {
    let got = got.unwrap_or_else(|| panic!("{what}: no trailer"));
    assert!(
        got.bits_eq(want),
        "{what}: trailer {got:?}, reference {want:?}"
    );
}

/// An all-reduce of 45 elements (chunks of 8, the last of 5) on a stats
/// job under `faults`: every rank's every chunk has the reference values
/// and the reference trailer.
fn all_reduce_with_stats(dtype: Dtype, auth: AuthMode, faults: Faults, seed: u64) {
    let (e, total) = (8usize, 45usize);
    let (mut t, acks) = active_with_acks(stats_config(dtype, auth, e as u16));
    for a in &acks {
        assert_eq!(a.payload.stats, 1, "JOIN_ACK tells the worker");
    }
    let inputs: Vec<Vec<u8>> = (0..N).map(|r| rs_input(dtype, r, total, seed)).collect();
    // One chunk list, every rank's values summed into every chunk.
    let ar = chunks(0, &[total], e);
    let size = dtype.size();
    let send = |r: u16, c: &Chunk| {
        let at = c.offset * size;
        Some(inputs[r as usize][at..at + c.count as usize * size].to_vec())
    };
    let mut rng = Rng(seed);
    let (got, trailers) = run_collective_with_stats(
        &mut t,
        &acks,
        Kind::AllReduce,
        0,
        &ar,
        send,
        faults,
        &mut rng,
    );
    for r in 0..N as usize {
        for (i, c) in ar.iter().enumerate() {
            let what = format!("{dtype:?} {auth} {faults:?} rank {r} chunk {i}");
            let want = reference_sum(dtype, &inputs, c.offset, c.count as usize);
            assert_eq!(got[r][i].as_deref(), Some(&want[..]), "{what}");
            let s = reference_stats(dtype, &inputs, c.offset, c.count as usize);
            assert_eq!(s.ranks, u32::from(N));
            assert_stats(&trailers[r][i], &s, &what);
        }
    }
}

#[test]
fn every_all_reduce_result_carries_the_reference_statistics() {
    for (k, dtype) in [Dtype::F32, Dtype::Bf16, Dtype::F16]
        .into_iter()
        .enumerate()
    {
        for auth in [AuthMode::Port, AuthMode::Mac] {
            all_reduce_with_stats(dtype, auth, CLEAN, 11 + k as u64);
        }
    }
}

#[test]
fn statistics_survive_loss_duplication_and_reordering() {
    for seed in 0..4u64 {
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            for auth in [AuthMode::Port, AuthMode::Mac] {
                all_reduce_with_stats(dtype, auth, ALL_FAULTS, 100 + seed);
            }
        }
    }
}

/// A reduce-scatter gives the owner values and trailer, every other rank a
/// NOVAL RESULT whose payload is the same trailer; the all-gather after it
/// carries none (run_collective_with_stats checks the lengths).
#[test]
fn reduce_scatter_noval_results_carry_the_statistics_and_all_gather_none() {
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        for auth in [AuthMode::Port, AuthMode::Mac] {
            let e = 8usize;
            let shards = [19usize, 19, 19, 13];
            let total: usize = shards.iter().sum();
            let (mut t, acks) = active_with_acks(stats_config(dtype, auth, e as u16));
            let mut rng = Rng(7);
            let size = dtype.size();
            let inputs: Vec<Vec<u8>> = (0..N).map(|r| rs_input(dtype, r, total, 3)).collect();
            let rs = chunks(0, &shards, e);
            let send = |r: u16, c: &Chunk| {
                let at = c.offset * size;
                Some(inputs[r as usize][at..at + c.count as usize * size].to_vec())
            };
            let (got, trailers) = run_collective_with_stats(
                &mut t,
                &acks,
                Kind::ReduceScatter,
                0,
                &rs,
                send,
                ALL_FAULTS,
                &mut rng,
            );
            for r in 0..N {
                for (i, c) in rs.iter().enumerate() {
                    let what = format!("{dtype:?} {auth} rank {r} chunk {i}");
                    assert_eq!(got[r as usize][i].is_some(), c.owner == r, "{what}");
                    let s = reference_stats(dtype, &inputs, c.offset, c.count as usize);
                    assert_stats(&trailers[r as usize][i], &s, &what);
                }
            }
            // The all-gather on the next seqs: no trailer.
            let m = 11usize;
            let ag = chunks(rs.len() as u32, &[m; N as usize], e);
            let own: Vec<Vec<u8>> = (0..N).map(|r| ag_input(dtype, r, m, 5)).collect();
            let send = |r: u16, c: &Chunk| {
                (r == c.owner).then(|| {
                    let at = (c.offset - c.owner as usize * m) * size;
                    own[r as usize][at..at + c.count as usize * size].to_vec()
                })
            };
            let (_, trailers) = run_collective_with_stats(
                &mut t,
                &acks,
                Kind::AllGather,
                1,
                &ag,
                send,
                CLEAN,
                &mut rng,
            );
            assert!(trailers.iter().flatten().all(Option::is_none));
        }
    }
}

/// The encoders agree: the head-only form's payload is the whole RESULT's,
/// trailer included (a NOVAL RESULT's payload is the trailer alone), and
/// its checksum sum, made once per result, is that payload's.
#[test]
fn the_result_head_carries_the_trailer_and_its_checksum() {
    let (mut t, _) = active_with_acks(stats_config(Dtype::Bf16, AuthMode::Port, 8));
    let vals: Vec<Vec<u8>> = (0..N).map(|r| rs_input(Dtype::Bf16, r, 5, 9)).collect();
    for r in 0..N {
        let m = kind_message(
            r,
            0,
            0,
            Kind::ReduceScatter,
            2,
            5,
            Some(&vals[r as usize]),
            None,
        );
        t.handle(&m, endpoint(r), false, t0());
    }
    let want = reference_stats(Dtype::Bf16, &vals, 0, 5);
    let mut seen = 0;
    while let Some(r) = t.poll_reply() {
        let mut whole = [0u8; 256];
        let e = t.encode(&r, &mut whole).unwrap();
        let mut head = [0u8; HEADER_LEN];
        let rh = t.encode_result_head(&r, &mut head).unwrap();
        let payload = rh.payload();
        assert_eq!(rh.encoded.len, e.len);
        // The payload (values and trailer), then the token.
        let end = e.len - crate::tag::TAG_LEN;
        assert_eq!(&whole[HEADER_LEN..end], payload);
        assert_eq!(&whole[end..e.len], &rh.token[..]);
        let values = if r.rank == 2 { 10 } else { 0 };
        assert_eq!(payload.len(), values + STATS_LEN, "rank {}", r.rank);
        let s = GradStats::parse(&payload[values..]).unwrap();
        assert!(s.bits_eq(&want), "rank {}: {s:?}", r.rank);
        assert_eq!(
            rh.payload_sum,
            crate::checksum::Sum::ZERO.add_bytes(payload).fold(),
            "rank {}",
            r.rank
        );
        seen += 1;
    }
    assert_eq!(seen, N);
}

/// Workers never send a trailer: a DATA with one is dropped and counted,
/// and changes no sum.
#[test]
fn a_data_with_a_trailer_is_dropped_payload_length() {
    let (mut t, _) = active_with_acks(stats_config(Dtype::F32, AuthMode::Port, 8));
    let (h, mut p) = data_message(0, 0, &[1.0, 2.0], GEN);
    p.extend_from_slice(&[0u8; STATS_LEN]);
    assert_eq!(
        t.handle(&frame(&h, &p), endpoint(0), false, t0()),
        Verdict::Data(DataOutcome::Dropped(DropReason::PayloadLength))
    );
    let j = t.get(5).unwrap();
    assert_eq!(j.drops().count(DropReason::PayloadLength), 1);
    assert_eq!(j.counters().contributions, 0);
}

/// Without `stats`, JOIN_ACK says 0 and a RESULT is its values alone.
#[test]
fn a_job_without_stats_is_unchanged() {
    let (mut t, acks) = active_with_acks(kind_config(Dtype::F32, AuthMode::Port, 8));
    assert!(acks.iter().all(|a| a.payload.stats == 0));
    for r in 0..N {
        data(&mut t, r, 0, &[1.0, 2.0]);
    }
    let results = drain(&mut t);
    assert_eq!(results.len(), N as usize);
    for (_, h, p) in results {
        assert_eq!(h.msg_type, MsgType::Result);
        assert_eq!(p, bytemuck::cast_slice::<f32, u8>(&[4.0, 8.0]));
    }
}

/// A stats job's default chunk leaves room for the trailer (and a mac
/// job's for both), so its RESULT fits the frame a job without stats fills.
#[test]
fn a_stats_job_s_chunk_leaves_room_for_the_trailer() {
    use crate::switch::config::max_elems_for;
    // 1448 payload bytes, less the trailer (24) and the RESULT's token
    // (port) or tag (mac), 16 bytes either way.
    assert_eq!(max_elems_for(362, Dtype::F32, AuthMode::Port, true), 352);
    assert_eq!(max_elems_for(362, Dtype::Bf16, AuthMode::Port, true), 704);
    assert_eq!(max_elems_for(362, Dtype::F32, AuthMode::Mac, true), 352);
    assert_eq!(max_elems_for(362, Dtype::F32, AuthMode::Port, false), 358);
    let mut c = stats_config(Dtype::F32, AuthMode::Port, 353);
    assert!(c.validate(362).is_err());
    c.elems_per_chunk = 352;
    c.validate(362).unwrap();
}

/// The lock-free data path, two threads each driving two ranks of a stats
/// job (all-reduce and reduce-scatter chunks in turn): every RESULT holds
/// the reference values and trailer, a NOVAL RESULT the trailer alone.
#[test]
fn two_threads_on_the_fast_path_get_the_reference_statistics() {
    let seqs = 400u32;
    let e = 16u16;
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        let mut t = active_table_of(stats_config(dtype, AuthMode::Port, e));
        drain(&mut t);
        let dp = t.data_path();
        let kind = |s: u32| {
            if s.is_multiple_of(2) {
                Kind::AllReduce
            } else {
                Kind::ReduceScatter
            }
        };
        let count = move |s: u32| 1 + (s % u32::from(e)) as u16;
        let input = move |r: u16, s: u32| rs_input(dtype, r, count(s) as usize, u64::from(s));
        let results = Arc::new(std::sync::Mutex::new(Vec::new()));
        let handles: Vec<_> = (0..2u16)
            .map(|th| {
                let (dp, results) = (dp.clone(), results.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(31 + u64::from(th));
                    let ranks = [th, th + 2];
                    let mut next = [0u32; 2];
                    let mut spins = 0u64;
                    while next.iter().any(|s| *s < seqs) {
                        spins += 1;
                        assert!(spins < 50_000_000, "stuck at {next:?}");
                        let i = rng.below(2);
                        let s = next[i];
                        if s >= seqs {
                            continue;
                        }
                        if s >= dp.job(5).unwrap().engine.floor() + 4 {
                            std::thread::yield_now();
                            continue;
                        }
                        let (r, owner) = (ranks[i], (s % u32::from(N)) as u16);
                        let v = input(r, s);
                        let m = kind_message(r, s, 0, kind(s), owner, count(s), Some(&v), None);
                        match dp.on_datagram(th as usize, &m, &endpoint(r), false) {
                            Fast::Done(DataOutcome::Taken) => {}
                            Fast::Completed { seq, .. } => {
                                let core = dp.job(5).unwrap();
                                let other = (owner + 1) % N;
                                let (_, a) = core.result_for(seq, owner, false, GEN, 8).unwrap();
                                let own = a.bytes().to_vec();
                                drop(a);
                                let (_, b) = core.result_for(seq, other, false, GEN, 8).unwrap();
                                let theirs = b.bytes().to_vec();
                                results.lock().unwrap().push((seq, own, theirs));
                            }
                            other => panic!("seq {s} rank {r}: {other:?}"),
                        }
                        next[i] += 1;
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let results = results.lock().unwrap();
        assert_eq!(results.len(), seqs as usize, "each seq completed once");
        for (s, own, theirs) in results.iter() {
            let inputs: Vec<Vec<u8>> = (0..N).map(|r| input(r, *s)).collect();
            let n = count(*s) as usize;
            let mut trailer = [0u8; STATS_LEN];
            reference_stats(dtype, &inputs, 0, n)
                .emit(&mut trailer)
                .unwrap();
            let mut want = reference_sum(dtype, &inputs, 0, n);
            want.extend_from_slice(&trailer);
            assert_eq!(*own, want, "{dtype:?} seq {s}: values and trailer");
            if kind(*s) == Kind::ReduceScatter {
                assert_eq!(theirs[..], trailer[..], "{dtype:?} seq {s}: NOVAL");
            } else {
                assert_eq!(*theirs, want, "{dtype:?} seq {s}");
            }
        }
    }
}
