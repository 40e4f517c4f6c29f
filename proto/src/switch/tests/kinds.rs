//! Reduce-scatter and all-gather through the job table (docs/PROTOCOL.md,
//! "Collective kinds"): four ranks run whole collectives over a simulated
//! network that loses, duplicates and reorders (seeded), and every rank's
//! output is compared bit for bit with the reference (the rank-order sum of
//! its shard; the owners' bytes, NaN payloads and subnormals included).
//! Also: a seq's kind, owner and count are fixed by its first DATA (the
//! rest is dropped as `kind_mismatch`), a resend is answered from the
//! shadow with the rank's own RESULT, `auth = "mac"` jobs tag NOVAL
//! messages, trees refuse other kinds with NACK 10, and the lock-free data
//! path serves both kinds from several threads.

use std::sync::Arc;

use half::{bf16, f16};

use super::*;
use crate::handshake::{Handshake, JoinAck};
use crate::reference::rank_order_sum_half;
use crate::tag::{AuthMode, PacketKey, TAG_LEN};
use crate::wire::{flags, Dtype, Kind};

const N: u16 = 4;

/// xorshift64*: the seeded schedules.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

fn kind_config(dtype: Dtype, auth: AuthMode, elems: u16) -> JobConfig {
    JobConfig {
        dtype,
        auth,
        ..config(N, 8, elems)
    }
}

/// A table with `cfg` declared and every rank joined; each rank's
/// JOIN_ACK (its keys in an `auth = "mac"` job).
fn active_with_acks(cfg: JobConfig) -> (JobTable, Vec<JoinAck>) {
    let n = cfg.n_workers;
    let mut t = table();
    t.add(cfg, 1000).unwrap();
    let hss: Vec<Handshake> = (0..n).map(|r| joined(&mut t, r, t0())).collect();
    let mut acks: Vec<Option<JoinAck>> = vec![None; n as usize];
    for (r, hdr, payload) in drain(&mut t) {
        if hdr.msg_type == MsgType::JoinAck {
            acks[r.rank as usize] = Some(hss[r.rank as usize].on_join_ack(&hdr, &payload).unwrap());
        }
    }
    (
        t,
        acks.into_iter().map(|a| a.expect("a JOIN_ACK")).collect(),
    )
}

/// One DATA of a collective kind: `values` None is a NOVAL DATA. Tagged
/// with `key` when given.
#[allow(clippy::too_many_arguments)]
fn kind_message(
    rank: u16,
    seq: u32,
    collective: u32,
    kind: Kind,
    owner: u16,
    count: u16,
    values: Option<&[u8]>,
    key: Option<&PacketKey>,
) -> Vec<u8> {
    let mut h = HeaderRepr::new(MsgType::Data, 5);
    h.rank = rank;
    h.seq = seq;
    h.collective = collective;
    h.count = count;
    h.gen = GEN;
    h.flags = kind.flag_bits() | if values.is_none() { flags::NOVAL } else { 0 };
    h.window = owner;
    let mut p = values.unwrap_or(&[]).to_vec();
    if let Some(k) = key {
        let tag = k.tag(&h, &p);
        p.extend_from_slice(&tag);
    }
    frame(&h, &p)
}

/// One chunk of a reduce-scatter or all-gather, as every rank cuts it:
/// `count` elements from element `offset` of the whole (n·m) tensor.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    seq: u32,
    owner: u16,
    offset: usize,
    count: u16,
}

/// Shards of `shards[r]` elements (shard r owned by rank r), each cut into
/// chunks of `e` (its last one shorter), shard 0's chunks first, numbered
/// from `first`. (Workers interleave the shards; the switch takes whatever
/// owner each DATA names, so these tests keep the simpler order.)
fn chunks(first: u32, shards: &[usize], e: usize) -> Vec<Chunk> {
    let mut out = Vec::new();
    for (owner, &m) in shards.iter().enumerate() {
        let start = starts(shards)[owner];
        let mut at = 0;
        while at < m {
            let count = e.min(m - at);
            out.push(Chunk {
                seq: first + out.len() as u32,
                owner: owner as u16,
                offset: start + at,
                count: count as u16,
            });
            at += count;
        }
    }
    out
}

/// Where each shard starts in the whole tensor.
fn starts(shards: &[usize]) -> Vec<usize> {
    shards
        .iter()
        .scan(0, |at, m| {
            let s = *at;
            *at += m;
            Some(s)
        })
        .collect()
}

/// Rank `r`'s reduce-scatter input: n·m finite elements of `dtype` whose
/// magnitudes are far apart, so that another order of summation changes
/// the bits; as wire bytes.
fn rs_input(dtype: Dtype, r: u16, len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed ^ (0x9e37 * (u64::from(r) + 1)));
    let mut out = Vec::new();
    for _ in 0..len {
        let h = rng.next();
        let mant = 1.0 + (h & 0xffff) as f32 / 65536.0;
        let exp = ((h >> 16) % 14) as i32 - 7;
        let sign = if h >> 40 & 1 == 1 { -1.0 } else { 1.0 };
        let v = sign * mant * 2f32.powi(exp);
        match dtype {
            Dtype::F32 => out.extend_from_slice(&v.to_le_bytes()),
            Dtype::Bf16 => out.extend_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes()),
            Dtype::F16 => out.extend_from_slice(&f16::from_f32(v).to_bits().to_le_bytes()),
        }
    }
    out
}

/// Bit patterns no conversion would keep: signalling and quiet NaNs with
/// payloads and either sign, subnormals, −0, infinities.
const F32_ODD: [u32; 8] = [
    0x7f80_0001, // sNaN
    0xffa0_0005, // negative sNaN with a payload
    0x7fc1_2345, // qNaN with a payload
    0x0000_0001, // smallest subnormal
    0x807f_ffff, // largest negative subnormal
    0x8000_0000, // −0
    0xff80_0000, // −∞
    0x7f7f_ffff, // largest finite
];
const HALF_ODD: [u16; 8] = [
    0x7f81, 0xff85, 0x7fc3, 0x0001, 0x807f, 0x8000, 0x7c01, 0xfc05,
];

/// Rank `r`'s all-gather input: `m` elements of arbitrary bits, the odd
/// patterns first; as wire bytes.
fn ag_input(dtype: Dtype, r: u16, m: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed ^ (0x51ed * (u64::from(r) + 3)));
    let mut out = Vec::new();
    for i in 0..m {
        let x = rng.next();
        match dtype {
            Dtype::F32 => {
                let v = F32_ODD.get(i).copied().unwrap_or(x as u32);
                out.extend_from_slice(&v.to_le_bytes());
            }
            _ => {
                let v = HALF_ODD.get(i).copied().unwrap_or(x as u16);
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    out
}

/// The rank-order sum of `inputs[..][range]` in `dtype`, as wire bytes.
fn reference_sum(dtype: Dtype, inputs: &[Vec<u8>], from: usize, len: usize) -> Vec<u8> {
    let size = dtype.size();
    let slices: Vec<&[u8]> = inputs
        .iter()
        .map(|i| &i[from * size..(from + len) * size])
        .collect();
    if dtype == Dtype::F32 {
        let vals: Vec<Vec<f32>> = slices
            .iter()
            .map(|s| {
                s.chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect()
            })
            .collect();
        let refs: Vec<&[f32]> = vals.iter().map(|v| &v[..]).collect();
        return rank_order_sum(&refs)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
    }
    let vals: Vec<Vec<u16>> = slices
        .iter()
        .map(|s| {
            s.chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect()
        })
        .collect();
    let refs: Vec<&[u16]> = vals.iter().map(|v| &v[..]).collect();
    rank_order_sum_half(dtype, &refs)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

/// Loss, duplication and reordering, in percent.
#[derive(Debug, Clone, Copy)]
struct Faults {
    loss: u64,
    dup: u64,
    /// Deliver in a random order (else in the order sent).
    reorder: bool,
}

const CLEAN: Faults = Faults {
    loss: 0,
    dup: 0,
    reorder: false,
};
const ALL_FAULTS: Faults = Faults {
    loss: 10,
    dup: 10,
    reorder: true,
};

/// What one rank does in a collective of `kind`: per chunk, what it
/// sends (None: NOVAL) and what it got back (Some(None): a NOVAL RESULT).
struct Rank {
    sends: Vec<Option<Vec<u8>>>,
    got: Vec<Option<Option<Vec<u8>>>>,
}

/// Runs one collective of `kind` over `chunks` through `t` on a network
/// with `faults`: each round, every rank sends each chunk in its window
/// without a RESULT (a first send or a resend), then the network delivers
/// everything in flight. Checks every RESULT's header as a worker would
/// (kind, count, NOVAL exactly for the ranks that get no values, tags in
/// a mac job, a resend's bytes equal to the first's) and returns each
/// rank's RESULTs by chunk.
#[allow(clippy::too_many_arguments)]
fn run_collective(
    t: &mut JobTable,
    acks: &[JoinAck],
    kind: Kind,
    collective: u32,
    chunks: &[Chunk],
    sends: impl Fn(u16, &Chunk) -> Option<Vec<u8>>,
    faults: Faults,
    rng: &mut Rng,
) -> Vec<Vec<Option<Vec<u8>>>> {
    let (got, _) = run_collective_with_stats(t, acks, kind, collective, chunks, sends, faults, rng);
    got
}

/// [`run_collective`], also returning each rank's statistics trailer by
/// chunk (checked present exactly in a `stats` job's summed kinds, NOVAL
/// RESULTs included, and covered by the tag).
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn run_collective_with_stats(
    t: &mut JobTable,
    acks: &[JoinAck],
    kind: Kind,
    collective: u32,
    chunks: &[Chunk],
    sends: impl Fn(u16, &Chunk) -> Option<Vec<u8>>,
    faults: Faults,
    rng: &mut Rng,
) -> (
    Vec<Vec<Option<Vec<u8>>>>,
    Vec<Vec<Option<crate::stats::GradStats>>>,
) {
    let dtype = t.get(5).unwrap().config.dtype;
    let stats_len = if t.get(5).unwrap().config.stats && kind != Kind::AllGather {
        crate::stats::STATS_LEN
    } else {
        0
    };
    let mut trailers = vec![vec![None; chunks.len()]; N as usize];
    let window = 6usize;
    let first = chunks[0].seq;
    let mut ranks: Vec<Rank> = (0..N)
        .map(|r| Rank {
            sends: chunks.iter().map(|c| sends(r, c)).collect(),
            got: vec![None; chunks.len()],
        })
        .collect();
    let mut rounds = 0;
    while ranks.iter().any(|r| r.got.iter().any(Option::is_none)) {
        rounds += 1;
        assert!(rounds < 500, "{kind} did not finish: {faults:?}");
        // (to the switch?, rank, datagram)
        let mut net: Vec<(bool, u16, Vec<u8>)> = Vec::new();
        for (r, rank) in ranks.iter().enumerate() {
            let Some(oldest) = rank.got.iter().position(Option::is_none) else {
                continue;
            };
            let in_window = chunks.iter().zip(&rank.got).zip(&rank.sends);
            for ((c, got), send) in in_window.skip(oldest).take(window) {
                if got.is_none() {
                    let key = acks[r].data_key.as_ref();
                    let v = send.as_deref();
                    let m =
                        kind_message(r as u16, c.seq, collective, kind, c.owner, c.count, v, key);
                    net.push((true, r as u16, m));
                }
            }
        }
        while !net.is_empty() {
            let at = if faults.reorder {
                rng.below(net.len())
            } else {
                0
            };
            let (up, r, bytes) = net.remove(at);
            if rng.chance(faults.loss) {
                continue;
            }
            if rng.chance(faults.dup) {
                net.push((up, r, bytes.clone()));
            }
            if up {
                t.handle(&bytes, endpoint(r), false, t0());
                // Whole datagrams, the RESULT's tag or token included.
                while let Some(reply) = t.poll_reply() {
                    let mut b = vec![0u8; 4096];
                    let Some(e) = t.encode(&reply, &mut b) else {
                        continue;
                    };
                    b.truncate(e.len);
                    net.push((false, reply.rank, b));
                }
                continue;
            }
            let h =
                HeaderRepr::parse(&crate::wire::Header::new_checked(&bytes[..]).unwrap()).unwrap();
            assert_eq!(h.msg_type, MsgType::Result, "{h:?}");
            let i = h.seq.wrapping_sub(first) as usize;
            let c = &chunks[i];
            assert_eq!((h.kind(), h.count, h.rank), (kind, c.count, r));
            let noval = !kind.receives_values(r, c.owner);
            assert_eq!(h.no_values(), noval, "rank {r} chunk {c:?}");
            let body = &bytes[HEADER_LEN..];
            let auth = t.get(5).unwrap().auth();
            let tag_len = auth.result_tag_len();
            let len = if noval { 0 } else { dtype.payload_len(c.count) };
            assert_eq!(
                body.len(),
                len + stats_len + tag_len,
                "rank {r} chunk {c:?}"
            );
            let (covered, tag) = body.split_at(len + stats_len);
            let k = acks[r as usize].result_key.as_ref().unwrap();
            let ok = match auth {
                AuthMode::Mac => k.verify(&h, covered, tag),
                AuthMode::Port => k.verify_token(&h, tag),
            };
            assert!(ok, "the RESULT's tag or token, rank {r} {c:?}");
            let (values, trailer) = covered.split_at(len);
            let got = (!noval).then(|| values.to_vec());
            let slot = &mut ranks[r as usize].got[i];
            if let Some(before) = slot {
                assert_eq!(*before, got, "a resent RESULT carries the same bytes");
            }
            *slot = Some(got);
            if stats_len > 0 {
                let s = crate::stats::GradStats::parse(trailer).unwrap();
                let slot = &mut trailers[r as usize][i];
                if let Some(before) = slot {
                    assert!(
                        s.bits_eq(before),
                        "a resent RESULT carries the same trailer"
                    );
                }
                *slot = Some(s);
            }
        }
    }
    let got = ranks
        .into_iter()
        .map(|r| r.got.into_iter().map(Option::unwrap).collect())
        .collect();
    (got, trailers)
}

/// How a reduce-scatter's owner takes part in its own chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// It sends its values: the RESULT is the rank-order sum of all n.
    Sends,
    /// It keeps them (NOVAL DATA): the RESULT is the other ranks'
    /// rank-order sum, and the owner adds its own.
    Keeps,
}

/// A reduce-scatter of n·m elements, then an all-gather of m per rank, on
/// one job, under `faults`: each rank's shard is the reference's rank-order
/// sum (with `Owner::Keeps`: the other ranks' sum, to which the owner
/// adds its own), each rank's gathered tensor is every rank's input byte for byte.
fn reduce_scatter_then_all_gather(
    dtype: Dtype,
    auth: AuthMode,
    faults: Faults,
    seed: u64,
    owner: Owner,
) {
    // E = 8; shards of 19 elements (three chunks, the last of 3) and a
    // short last shard of 13 (8 + 5).
    let e = 8usize;
    let shards = [19usize, 19, 19, 13];
    let start = starts(&shards);
    let total: usize = shards.iter().sum();
    let (mut t, acks) = active_with_acks(kind_config(dtype, auth, e as u16));
    let mut rng = Rng(seed);
    let size = dtype.size();

    let inputs: Vec<Vec<u8>> = (0..N).map(|r| rs_input(dtype, r, total, seed)).collect();
    let rs = chunks(0, &shards, e);
    assert_eq!(rs.len(), 11);
    let send = |r: u16, c: &Chunk| {
        let at = c.offset * size;
        (owner == Owner::Sends || c.owner != r)
            .then(|| inputs[r as usize][at..at + c.count as usize * size].to_vec())
    };
    let got = run_collective(
        &mut t,
        &acks,
        Kind::ReduceScatter,
        0,
        &rs,
        send,
        faults,
        &mut rng,
    );
    for r in 0..N {
        let mut shard = Vec::new();
        for (i, c) in rs.iter().enumerate() {
            match &got[r as usize][i] {
                Some(v) => {
                    assert_eq!(c.owner, r, "values only to the owner");
                    shard.extend_from_slice(v);
                }
                None => assert_ne!(c.owner, r),
            }
        }
        let r_ = r as usize;
        let (from, len) = (start[r_], shards[r_]);
        // The RESULTs carry the rank-order sum of the ranks that sent
        // values: all of them, or the others when the owner keeps its shard
        // (it adds its own; the worker's tests check that step).
        let want = match owner {
            Owner::Sends => reference_sum(dtype, &inputs, from, len),
            Owner::Keeps => {
                let others: Vec<Vec<u8>> = (0..N)
                    .filter(|&o| o != r)
                    .map(|o| inputs[o as usize].clone())
                    .collect();
                reference_sum(dtype, &others, from, len)
            }
        };
        assert_eq!(
            shard, want,
            "{dtype:?} {auth} {owner:?}: rank {r}'s reduce-scatter RESULTs"
        );
    }

    // The all-gather follows on the next seqs (slots that held the
    // reduce-scatter's shadows).
    let own: Vec<Vec<u8>> = (0..N)
        .map(|r| ag_input(dtype, r, shards[r as usize], seed))
        .collect();
    let ag = chunks(rs.len() as u32, &shards, e);
    let send = |r: u16, c: &Chunk| {
        (c.owner == r).then(|| {
            let at = (c.offset - start[r as usize]) * size;
            own[r as usize][at..at + c.count as usize * size].to_vec()
        })
    };
    let got = run_collective(
        &mut t,
        &acks,
        Kind::AllGather,
        1,
        &ag,
        send,
        faults,
        &mut rng,
    );
    let whole: Vec<u8> = own.concat();
    for r in 0..N {
        let mut out = Vec::new();
        for (i, c) in ag.iter().enumerate() {
            match &got[r as usize][i] {
                Some(v) => {
                    assert_ne!(c.owner, r, "no values back to the owner");
                    out.extend_from_slice(v);
                }
                None => {
                    assert_eq!(c.owner, r);
                    let at = (c.offset - start[r as usize]) * size;
                    out.extend_from_slice(&own[r as usize][at..at + c.count as usize * size]);
                }
            }
        }
        assert_eq!(
            out, whole,
            "{dtype:?} {auth}: rank {r}'s all-gather, every byte"
        );
    }
    let j = t.get(5).unwrap();
    assert_eq!(j.counters().chunks_completed, 22);
    assert_eq!(j.drops().count(DropReason::KindMismatch), 0);
    if faults.loss > 0 || faults.dup > 0 {
        assert!(j.counters().retransmits_served > 0, "resends were answered");
    }
}

#[test]
fn reduce_scatter_and_all_gather_on_a_clean_network() {
    for owner in [Owner::Sends, Owner::Keeps] {
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            reduce_scatter_then_all_gather(dtype, AuthMode::Port, CLEAN, 1, owner);
        }
    }
}

#[test]
fn reduce_scatter_and_all_gather_under_loss_duplication_and_reordering() {
    for seed in 1..=6 {
        for owner in [Owner::Sends, Owner::Keeps] {
            for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
                let seed = seed * 7919;
                reduce_scatter_then_all_gather(dtype, AuthMode::Port, ALL_FAULTS, seed, owner);
            }
        }
    }
}

#[test]
fn tagged_jobs_tag_noval_messages_and_survive_faults() {
    for (seed, dtype) in [(3u64, Dtype::F32), (5, Dtype::Bf16), (9, Dtype::F16)] {
        for owner in [Owner::Sends, Owner::Keeps] {
            reduce_scatter_then_all_gather(dtype, AuthMode::Mac, CLEAN, seed, owner);
            reduce_scatter_then_all_gather(dtype, AuthMode::Mac, ALL_FAULTS, seed, owner);
        }
    }
}

/// An owner that keeps its shard: whoever of the others comes first (rank
/// 0 included, when it is not the owner) starts the sum, in any arrival
/// order. A job of one rank cannot keep (it would sum nothing).
#[test]
fn an_owner_that_keeps_its_shard_gets_the_others_rank_order_sum() {
    let f = |v: f32| v.to_le_bytes();
    // Magnitudes far apart, so that another order gives other bits.
    let vals = [1e8f32, 1.0, 1.0, -1e8];
    for owner in 0..N {
        for order in [[0u16, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2]] {
            let (mut t, acks) = active_with_acks(kind_config(Dtype::F32, AuthMode::Port, 8));
            let mut got = None;
            for &r in &order {
                let v = f(vals[r as usize]);
                let vals = (r != owner).then_some(&v[..]);
                let m = kind_message(r, 0, 0, Kind::ReduceScatter, owner, 1, vals, None);
                t.handle(&m, endpoint(r), false, t0());
                for (reply, hdr, payload) in drain(&mut t) {
                    assert_eq!(hdr.msg_type, MsgType::Result);
                    assert_eq!(hdr.no_values(), reply.rank != owner);
                    if reply.rank == owner {
                        got = Some(f32::from_le_bytes(payload[..4].try_into().unwrap()));
                    }
                }
            }
            let others: Vec<f32> = (0..N)
                .filter(|&r| r != owner)
                .map(|r| vals[r as usize])
                .collect();
            let want = others.iter().skip(1).fold(others[0], |a, v| a + v);
            let got = got.expect("the owner's RESULT");
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "owner {owner} order {order:?}"
            );
            let j = t.get(5).unwrap();
            assert_eq!(j.drops().count(DropReason::KindMismatch), 0);
            drop(acks);
        }
    }
    // n = 1: a NOVAL from the only rank is refused.
    let mut t = table();
    t.add(config(1, 8, 8), 1000).unwrap();
    joined(&mut t, 0, t0());
    drain(&mut t);
    let m = kind_message(0, 0, 0, Kind::ReduceScatter, 0, 1, None, None);
    t.handle(&m, endpoint(0), false, t0());
    assert!(drain(&mut t).is_empty(), "no RESULT");
    assert_eq!(t.get(5).unwrap().drops().count(DropReason::KindMismatch), 1);
}

/// In a mac job a NOVAL DATA is only its tag; one whose tag fails (or that
/// has none) is dropped as any DATA, and the NOVAL RESULT's tag covers the
/// NOVAL flag: with the flag cleared, it no longer verifies.
#[test]
fn a_mac_jobs_noval_data_needs_its_tag() {
    let (mut t, acks) = active_with_acks(kind_config(Dtype::F32, AuthMode::Mac, 8));
    let v = 1f32.to_le_bytes();
    let send = |t: &mut JobTable, r: u16, vals: Option<&[u8]>, key: Option<&PacketKey>| {
        let m = kind_message(r, 0, 0, Kind::AllGather, 2, 1, vals, key);
        t.handle(&m, endpoint(r), false, t0())
    };
    // No tag, or another rank's key.
    assert_eq!(
        send(&mut t, 0, None, None),
        Verdict::Data(DataOutcome::Dropped(DropReason::PayloadLength))
    );
    assert_eq!(
        send(&mut t, 0, None, acks[1].data_key.as_ref()),
        Verdict::Data(DataOutcome::Dropped(DropReason::BadTag))
    );
    for r in [0, 1, 3] {
        let out = send(&mut t, r, None, acks[r as usize].data_key.as_ref());
        assert_eq!(out, Verdict::Data(DataOutcome::Taken));
    }
    let out = send(&mut t, 2, Some(&v), acks[2].data_key.as_ref());
    assert_eq!(out, Verdict::Data(DataOutcome::Completed { seq: 0 }));
    let replies = drain(&mut t);
    assert_eq!(replies.len(), N as usize);
    for (r, h, p) in replies {
        let key = acks[r.rank as usize].result_key.as_ref().unwrap();
        let noval = r.rank == 2;
        assert_eq!(h.no_values(), noval);
        assert_eq!(p.len(), if noval { TAG_LEN } else { 4 + TAG_LEN });
        let (vals, tag) = p.split_at(p.len() - TAG_LEN);
        assert!(key.verify(&h, vals, tag));
        let mut flipped = h;
        flipped.flags ^= flags::NOVAL;
        assert!(!key.verify(&flipped, vals, tag), "NOVAL is covered");
        if !noval {
            assert_eq!(vals, v);
        }
    }
}

/// The first DATA of a seq fixes its kind, owner and count; a later DATA
/// naming another (or values where none are due, or none where they are)
/// is dropped and counted `kind_mismatch`, never summed, and the seq still
/// completes with the right bits.
#[test]
fn a_seqs_first_data_fixes_kind_owner_and_count() {
    let (mut t, _) = active_with_acks(kind_config(Dtype::F32, AuthMode::Port, 8));
    let vals = |r: u16| -> Vec<u8> {
        [r as f32 + 0.5, -1.25]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    };
    let send = |t: &mut JobTable, r: u16, kind: Kind, owner: u16, count: u16, v: Option<&[u8]>| {
        t.handle(
            &kind_message(r, 0, 0, kind, owner, count, v, None),
            endpoint(r),
            false,
            t0(),
        )
    };
    let mismatch = Verdict::Data(DataOutcome::Dropped(DropReason::KindMismatch));
    let taken = Verdict::Data(DataOutcome::Taken);
    assert_eq!(
        send(&mut t, 0, Kind::ReduceScatter, 1, 2, Some(&vals(0))),
        taken
    );
    // Another owner, another kind, another count.
    assert_eq!(
        send(&mut t, 1, Kind::ReduceScatter, 2, 2, Some(&vals(1))),
        mismatch
    );
    assert_eq!(
        send(&mut t, 1, Kind::AllReduce, 0, 2, Some(&vals(1))),
        mismatch
    );
    assert_eq!(
        send(&mut t, 1, Kind::ReduceScatter, 1, 1, Some(&vals(1)[..4])),
        mismatch
    );
    // NOVAL from a reduce-scatter rank that does not own the chunk (only
    // the owner may keep its values), an owner out of range.
    assert_eq!(send(&mut t, 2, Kind::ReduceScatter, 1, 2, None), mismatch);
    assert_eq!(
        send(&mut t, 1, Kind::ReduceScatter, N, 2, Some(&vals(1))),
        mismatch
    );
    let j = t.get(5).unwrap();
    assert_eq!(j.drops().count(DropReason::KindMismatch), 5);
    assert_eq!(j.counters().contributions, 1, "nothing else was taken");
    for r in 1..N {
        let want = if r + 1 == N {
            Verdict::Data(DataOutcome::Completed { seq: 0 })
        } else {
            taken
        };
        assert_eq!(
            send(&mut t, r, Kind::ReduceScatter, 1, 2, Some(&vals(r))),
            want
        );
    }
    let inputs: Vec<Vec<u8>> = (0..N).map(vals).collect();
    let want = reference_sum(Dtype::F32, &inputs, 0, 2);
    let replies = drain(&mut t);
    for (r, h, p) in &replies {
        assert_eq!(h.kind(), Kind::ReduceScatter);
        if r.rank == 1 {
            assert_eq!(*p, want, "the owner gets the sum of the right DATA only");
        } else {
            assert!(h.no_values() && p.is_empty(), "rank {}: NOVAL", r.rank);
        }
    }

    // All-gather: the owner must send values, the others NOVAL.
    let ag = |t: &mut JobTable, r: u16, v: Option<&[u8]>| {
        t.handle(
            &kind_message(r, 1, 0, Kind::AllGather, 3, 2, v, None),
            endpoint(r),
            false,
            t0(),
        )
    };
    assert_eq!(ag(&mut t, 3, None), mismatch, "the owner sent no values");
    assert_eq!(
        ag(&mut t, 0, Some(&vals(0))),
        mismatch,
        "values from a non-owner"
    );
    assert_eq!(ag(&mut t, 0, None), taken);
    // A NOVAL naming another count.
    let m = kind_message(1, 1, 0, Kind::AllGather, 3, 5, None, None);
    assert_eq!(t.handle(&m, endpoint(1), false, t0()), mismatch);
    // All-reduce keeps its own reason for a count that differs.
    let (h, p) = data_message(0, 2, &[1.0, 2.0], GEN);
    t.handle(&frame(&h, &p), endpoint(0), false, t0());
    let (h, p) = data_message(1, 2, &[1.0], GEN);
    assert_eq!(
        t.handle(&frame(&h, &p), endpoint(1), false, t0()),
        Verdict::Data(DataOutcome::Dropped(DropReason::CountMismatch))
    );
    assert_eq!(t.get(5).unwrap().drops().count(DropReason::KindMismatch), 8);
}

/// A rank that lost its RESULT of a completed seq gets its own answer
/// again, flagged RETX: the values to a rank that receives them, a NOVAL
/// RESULT to one that does not. A resend that names another owner or kind
/// gets nothing.
#[test]
fn a_resend_gets_the_ranks_own_result_from_the_shadow() {
    for dtype in [Dtype::F32, Dtype::Bf16] {
        let (mut t, _) = active_with_acks(kind_config(dtype, AuthMode::Port, 8));
        let shard = ag_input(dtype, 2, 5, 77);
        let send = |t: &mut JobTable, r: u16, seq: u32, kind: Kind, owner: u16| {
            let v = kind.sends_values(r, owner).then_some(&shard[..]);
            t.handle(
                &kind_message(r, seq, 0, kind, owner, 5, v, None),
                endpoint(r),
                false,
                t0(),
            )
        };
        for r in 0..N {
            send(&mut t, r, 0, Kind::AllGather, 2);
        }
        drain(&mut t);
        for r in 0..N {
            let out = send(&mut t, r, 0, Kind::AllGather, 2);
            assert_eq!(out, Verdict::Data(DataOutcome::Retransmit { seq: 0 }));
            let replies = drain(&mut t);
            assert_eq!(replies.len(), 1);
            let (to, h, p) = &replies[0];
            assert_eq!(to.rank, r);
            assert!(h.has_flag(flags::RETX));
            assert_eq!(h.kind(), Kind::AllGather);
            if r == 2 {
                assert!(h.no_values() && p.is_empty(), "the owner: NOVAL again");
            } else {
                assert!(!h.no_values());
                assert_eq!(*p, shard, "rank {r}: the owner's bytes again");
            }
        }
        // Another owner or kind for the completed seq: dropped, unanswered.
        let mismatch = Verdict::Data(DataOutcome::Dropped(DropReason::KindMismatch));
        assert_eq!(send(&mut t, 0, 0, Kind::AllGather, 1), mismatch);
        assert_eq!(send(&mut t, 0, 0, Kind::ReduceScatter, 2), mismatch);
        assert!(drain(&mut t).is_empty());
        // The shadow's RESULT seen by the tools: the full values.
        let view = t.get(5).unwrap().result(0).unwrap();
        assert_eq!(
            (view.kind, view.owner, view.payload()),
            (Kind::AllGather, 2, &shard[..])
        );
        // A rank's own view.
        let own = t.get(5).unwrap().result_to(0, 2).unwrap();
        assert!(own.no_values && own.payload().is_empty() && own.values().is_empty());
    }
}

/// The RESULT heads the dataplane sends (header, then the shadow's payload
/// with its precomputed checksum sum) are the whole encoded RESULT, for a
/// NOVAL RESULT (no payload, sum 0) too.
#[test]
fn result_heads_match_the_encoded_result_for_every_rank() {
    let (mut t, _) = active_with_acks(kind_config(Dtype::F32, AuthMode::Port, 8));
    let v: Vec<u8> = [3.5f32, -0.0, 1e-40]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    for r in 0..N {
        let vals = (r == 1).then_some(&v[..]);
        let m = kind_message(r, 0, 0, Kind::AllGather, 1, 3, vals, None);
        t.handle(&m, endpoint(r), false, t0());
    }
    let mut seen = 0;
    while let Some(r) = t.poll_reply() {
        let mut whole = [0u8; 256];
        let e = t.encode(&r, &mut whole).unwrap();
        let mut head = [0u8; HEADER_LEN];
        let rh = t.encode_result_head(&r, &mut head).unwrap();
        assert_eq!(rh.encoded, e);
        let mut joined = head.to_vec();
        joined.extend_from_slice(rh.payload());
        joined.extend_from_slice(&rh.token);
        assert_eq!(joined, whole[..e.len]);
        let sum = crate::checksum::Sum::ZERO.add_bytes(rh.payload()).fold();
        assert_eq!(rh.payload_sum, sum);
        assert_eq!(rh.payload().is_empty(), r.rank == 1);
        seen += 1;
    }
    assert_eq!(seen, N);
}

/// A spine (its members joined with `UPSTREAM`: leaves) serves all-reduce
/// alone: a reduce-scatter or all-gather DATA from a member gets NACK 10,
/// tagged under the member's session, rate-limited as every NACK, counted
/// `kind_not_supported`; the lock-free path hands it to the table.
#[test]
fn a_spine_refuses_other_kinds_with_nack_10() {
    let mut t = table();
    t.add(config(2, 4, 8), 1000).unwrap();
    let mut keys = Vec::new();
    for r in 0..2 {
        let from = endpoint(r);
        let mut hs = handshake(&t, r, from, SECRET).as_leaf();
        hello(&mut t, &mut hs, from, t0());
        t.handle(&join_bytes(&hs, (0, 0)), from, false, t0());
        keys.push(hs);
    }
    drain(&mut t);
    assert!(!t.get(5).unwrap().serves_kinds());
    let v = 1f32.to_le_bytes();
    let m = kind_message(0, 0, 0, Kind::ReduceScatter, 1, 1, Some(&v), None);
    assert_eq!(
        t.data_path().on_datagram(0, &m, &endpoint(0), false),
        Fast::Slow
    );
    assert_eq!(
        t.handle(&m, endpoint(0), false, t0()),
        Verdict::Data(DataOutcome::Nack(NackReason::KindNotSupported))
    );
    let replies = drain_encoded(&mut t);
    assert_eq!(replies.len(), 1);
    let (_, head, h, p) = &replies[0];
    assert_eq!(h.msg_type, MsgType::Nack);
    let nack = NackPayload::parse(p).unwrap();
    assert_eq!(nack.reason, NackReason::KindNotSupported);
    let key = t.get(5).unwrap().session_key(0).unwrap();
    let want = crate::auth::nack_tag(key, head, nack.reason as u16, &nack.echo);
    assert_eq!(nack.tag, want, "tagged under the member's session");
    // A flood is rate-limited like any NACK.
    let m = kind_message(1, 0, 0, Kind::AllGather, 1, 1, Some(&v), None);
    for _ in 0..200 {
        t.handle(&m, endpoint(1), false, t0());
    }
    let sent = drain(&mut t).len() as u64;
    assert!(sent < 200, "{sent} NACKs for 200 DATA");
    assert_eq!(t.table_counters().nack_rate_limited, 200 - sent);
    assert_eq!(
        t.get(5)
            .unwrap()
            .drops()
            .count(DropReason::KindNotSupported),
        201
    );
    // All-reduce is served as ever.
    data(&mut t, 0, 0, &[1.0]);
    assert_eq!(
        data(&mut t, 1, 0, &[2.0]),
        Verdict::Data(DataOutcome::Completed { seq: 0 })
    );
}

/// A leaf (a job with an uplink) refuses other kinds the same way, before
/// anything reaches its slots.
#[test]
fn a_leaf_refuses_other_kinds_with_nack_10() {
    let mut cfg = config(2, 4, 8);
    cfg.upstream = Some(Upstream {
        leaf_index: 0,
        n_leaves: 2,
        spines: vec![SpineAddr {
            ip: [198, 18, 1, 1],
            port: 48879,
        }],
        local_ip: [198, 18, 0, 1],
        local_port: 48879,
    });
    let mut t = active_table_of(cfg);
    drain(&mut t);
    assert!(!t.get(5).unwrap().serves_kinds());
    for (r, kind) in [(0, Kind::ReduceScatter), (1, Kind::AllGather)] {
        let v = 1f32.to_le_bytes();
        let vals = kind.sends_values(r, 1).then_some(&v[..]);
        let m = kind_message(r, 0, 0, kind, 1, 1, vals, None);
        assert_eq!(
            t.handle(&m, endpoint(r), false, t0()),
            Verdict::Data(DataOutcome::Nack(NackReason::KindNotSupported))
        );
        let nacks = nacks_in(&drain(&mut t));
        assert_eq!(nacks.len(), 1);
        assert_eq!(nacks[0].reason, NackReason::KindNotSupported);
    }
    let j = t.get(5).unwrap();
    assert_eq!(j.drops().count(DropReason::KindNotSupported), 2);
    assert_eq!(j.counters().contributions, 0);
}

/// The lock-free data path serves both kinds from two threads at once
/// (each thread drives two ranks; each reduce-scatter chunk is followed by
/// an all-gather chunk): every RESULT the fast path completes holds the
/// reference's bits, and every rank sees every seq complete.
#[test]
fn two_threads_on_the_fast_path_get_the_reference_bits() {
    let seqs = 600u32;
    let e = 16u16;
    for dtype in [Dtype::F32, Dtype::Bf16] {
        let mut t = active_table_of(kind_config(dtype, AuthMode::Port, e));
        drain(&mut t);
        let dp = t.data_path();
        // Seq s: even a reduce-scatter chunk, odd an all-gather chunk;
        // owner s mod N, count 1 + s mod E.
        let kind = |s: u32| {
            if s.is_multiple_of(2) {
                Kind::ReduceScatter
            } else {
                Kind::AllGather
            }
        };
        let count = move |s: u32| 1 + (s % u32::from(e)) as u16;
        let input = move |r: u16, s: u32| -> Vec<u8> {
            match kind(s) {
                Kind::AllGather => ag_input(dtype, r, count(s) as usize, u64::from(s)),
                _ => rs_input(dtype, r, count(s) as usize, u64::from(s)),
            }
        };
        let results = Arc::new(std::sync::Mutex::new(Vec::new()));
        let handles: Vec<_> = (0..2u16)
            .map(|th| {
                let (dp, results) = (dp.clone(), results.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(11 + u64::from(th));
                    // The window is 8 slots: each thread keeps its ranks
                    // within 4 seqs of the completed floor.
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
                        let floor = dp.job(5).unwrap().engine.floor();
                        if s >= floor + 4 {
                            std::thread::yield_now();
                            continue;
                        }
                        let r = ranks[i];
                        let owner = (s % u32::from(N)) as u16;
                        let v = input(r, s);
                        let vals = kind(s).sends_values(r, owner).then_some(&v[..]);
                        let m = kind_message(r, s, 0, kind(s), owner, count(s), vals, None);
                        match dp.on_datagram(th as usize, &m, &endpoint(r), false) {
                            Fast::Done(DataOutcome::Taken) => {}
                            Fast::Completed { seq, .. } => {
                                let core = dp.job(5).unwrap();
                                let (h, res) = core.result_for(seq, owner, false, GEN, 8).unwrap();
                                let own = res.bytes().to_vec();
                                drop(res);
                                let (h2, res2) = core
                                    .result_for(seq, (owner + 1) % N, false, GEN, 8)
                                    .unwrap();
                                let other = res2.bytes().to_vec();
                                results.lock().unwrap().push((seq, h, own, h2, other));
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
        for (seq, h_owner, own, h_other, other) in results.iter() {
            let s = *seq;
            let inputs: Vec<Vec<u8>> = (0..N).map(|r| input(r, s)).collect();
            match kind(s) {
                Kind::ReduceScatter => {
                    assert!(!h_owner.no_values() && h_other.no_values() && other.is_empty());
                    let want = reference_sum(dtype, &inputs, 0, count(s) as usize);
                    assert_eq!(*own, want, "{dtype:?} seq {s}: the owner's sum");
                }
                _ => {
                    let owner = (s % u32::from(N)) as usize;
                    assert!(h_owner.no_values() && own.is_empty() && !h_other.no_values());
                    assert_eq!(
                        *other, inputs[owner],
                        "{dtype:?} seq {s}: the owner's bytes"
                    );
                }
            }
        }
        let c = t.get(5).unwrap().counters();
        assert_eq!(c.chunks_completed, u64::from(seqs));
        assert_eq!(c.contributions, u64::from(seqs) * u64::from(N));
    }
}

mod stats;
