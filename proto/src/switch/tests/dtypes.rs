//! Half-precision jobs (bf16, f16): the sum is the float32 rank-order sum
//! rounded once, whatever the arrival order; resends carry the same bits;
//! a payload of another element size is dropped and counted; a JOIN of
//! another dtype is refused, the log naming both.

use half::{bf16, f16};

use super::*;
use crate::reference::{pattern_dtype, rank_order_sum_half};
use crate::wire::Dtype;

const N: u16 = 4;
const ELEMS: usize = 40;

fn half_config(dtype: Dtype) -> JobConfig {
    JobConfig {
        dtype,
        ..config(N, 4, ELEMS as u16)
    }
}

fn to_bits(dtype: Dtype, v: f32) -> u16 {
    match dtype {
        Dtype::Bf16 => bf16::from_f32(v).to_bits(),
        _ => f16::from_f32(v).to_bits(),
    }
}

fn from_bits(dtype: Dtype, b: u16) -> f32 {
    match dtype {
        Dtype::Bf16 => bf16::from_bits(b).to_f32(),
        _ => f16::from_bits(b).to_f32(),
    }
}

/// Rank `r`'s input: the verify pattern, plus values whose sum needs
/// rounding and an infinity and a NaN (from one rank each).
fn input(dtype: Dtype, r: u16) -> Vec<u16> {
    let mut v: Vec<u16> = (0..ELEMS)
        .map(|i| to_bits(dtype, pattern_dtype(dtype, r, 3, i)))
        .collect();
    v[0] = to_bits(dtype, [1000.0, 1.0, 0.5, 0.25][r as usize]);
    v[1] = to_bits(dtype, if r == 2 { f32::INFINITY } else { 1.5 });
    v[2] = to_bits(dtype, if r == 1 { f32::NAN } else { -2.0 });
    v
}

fn half_data(t: &mut JobTable, rank: u16, seq: u32, bits: &[u16]) -> Verdict {
    let mut h = HeaderRepr::new(MsgType::Data, 5);
    h.rank = rank;
    h.seq = seq;
    h.count = bits.len() as u16;
    h.gen = GEN;
    let p: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    t.handle(&frame(&h, &p), endpoint(rank), false, t0())
}

fn permutations(n: u16) -> Vec<Vec<u16>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for p in permutations(n - 1) {
        for i in 0..=p.len() {
            let mut q = p.clone();
            q.insert(i, n - 1);
            out.push(q);
        }
    }
    out
}

fn payload_bits(p: &[u8]) -> Vec<u16> {
    p.chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect()
}

#[test]
fn half_sums_are_bit_exact_in_every_arrival_order() {
    for dtype in [Dtype::Bf16, Dtype::F16] {
        let inputs: Vec<Vec<u16>> = (0..N).map(|r| input(dtype, r)).collect();
        let refs: Vec<&[u16]> = inputs.iter().map(Vec::as_slice).collect();
        let want = rank_order_sum_half(dtype, &refs);
        // Rounding once is not rounding after every addition: the test
        // would not tell them apart otherwise.
        let mut each = inputs[0].clone();
        for r in &inputs[1..] {
            for (a, b) in each.iter_mut().zip(r) {
                *a = to_bits(dtype, from_bits(dtype, *a) + from_bits(dtype, *b));
            }
        }
        assert_ne!(each, want, "{dtype}: the inputs must make rounding show");
        // 1001.75 rounded once: to 1000 in bf16 (spacing 4), to 1002 in
        // f16 (a tie between 1001.5 and 1002, to even).
        let once = if dtype == Dtype::Bf16 { 1000.0 } else { 1002.0 };
        assert_eq!(from_bits(dtype, want[0]), once, "{dtype}: 1000+1+0.5+0.25");
        assert_eq!(from_bits(dtype, want[1]), f32::INFINITY);
        assert!(from_bits(dtype, want[2]).is_nan());
        let orders = permutations(N);
        assert_eq!(orders.len(), 24);
        for order in orders {
            let mut t = active_table_of(half_config(dtype));
            for (i, r) in order.iter().enumerate() {
                let v = half_data(&mut t, *r, 0, &inputs[*r as usize]);
                let want_v = if i + 1 == N as usize {
                    DataOutcome::Completed { seq: 0 }
                } else {
                    DataOutcome::Taken
                };
                assert_eq!(v, Verdict::Data(want_v), "{dtype} order {order:?}");
            }
            let replies = drain(&mut t);
            let results: Vec<_> = replies
                .iter()
                .filter(|(_, h, _)| h.msg_type == MsgType::Result)
                .collect();
            assert_eq!(results.len(), N as usize);
            for (_, h, p) in results {
                assert_eq!(h.count as usize, ELEMS);
                assert_eq!(p.len(), ELEMS * 2, "{dtype}: two bytes per element");
                assert_eq!(payload_bits(p), want, "{dtype} order {order:?}");
            }
        }
    }
}

#[test]
fn a_lost_half_result_is_resent_with_the_same_bits() {
    let dtype = Dtype::Bf16;
    let mut t = active_table_of(half_config(dtype));
    let inputs: Vec<Vec<u16>> = (0..N).map(|r| input(dtype, r)).collect();
    for r in [3, 1, 0, 2] {
        half_data(&mut t, r, 0, &inputs[r as usize]);
    }
    let first = drain(&mut t);
    let first_bits = payload_bits(&first[0].2);
    // Rank 2 lost its RESULT and sends again: served from the shadow.
    assert_eq!(
        half_data(&mut t, 2, 0, &inputs[2]),
        Verdict::Data(DataOutcome::Retransmit { seq: 0 })
    );
    let again = drain(&mut t);
    assert_eq!(again.len(), 1);
    assert!(again[0].1.has_flag(crate::wire::flags::RETX));
    assert_eq!(payload_bits(&again[0].2), first_bits);
    assert_eq!(t.get(5).unwrap().counters().retransmits_served, 1);
}

#[test]
fn a_payload_of_another_element_size_is_dropped_and_counted() {
    let mut t = active_table_of(half_config(Dtype::Bf16));
    // A float32 worker's DATA: count × 4 bytes, which the parser allows.
    assert_eq!(
        data(&mut t, 0, 0, &[1.0, 2.0]),
        Verdict::Data(DataOutcome::Dropped(DropReason::PayloadLength))
    );
    let j = t.get(5).unwrap();
    assert_eq!(j.drops().count(DropReason::PayloadLength), 1);
    assert_eq!(j.counters().contributions, 0);
    // And the other way: a bf16 payload to a float32 job.
    let mut t = active_table(N, 4, 8);
    assert_eq!(
        half_data(&mut t, 0, 0, &[0x3f80, 0x4000]),
        Verdict::Data(DataOutcome::Dropped(DropReason::PayloadLength))
    );
    assert_eq!(
        t.get(5).unwrap().drops().count(DropReason::PayloadLength),
        1
    );
}

#[test]
fn a_join_of_another_dtype_is_refused_naming_both() {
    let mut t = table();
    t.add(half_config(Dtype::Bf16), 1000).unwrap();
    let params = JoinParams {
        job: 5,
        rank: 0,
        n_workers: N,
        dtype: Dtype::F32 as u8,
        op: 0,
        secret: SECRET,
        ip: endpoint(0).source.ip,
        port: endpoint(0).source.port,
        provision: None,
    };
    let mut hs = Handshake::new(params, [9; 16]);
    hello(&mut t, &mut hs, endpoint(0), t0());
    assert_eq!(
        t.handle(&join_bytes(&hs, (0, 0)), endpoint(0), false, t0()),
        Verdict::Join(JoinOutcome::Nack(NackReason::ParametersDiffer))
    );
    let nacks = nacks_in(&drain(&mut t));
    assert_eq!(nacks.len(), 1);
    assert_eq!(nacks[0].reason, NackReason::ParametersDiffer);
    let k = NackReason::ParametersDiffer as usize;
    let why = t.last_refusal(k).unwrap().why;
    assert_eq!(
        why,
        Refusal::DtypeDiffers {
            job: Dtype::Bf16,
            join: 0
        }
    );
    let msg = why.to_string();
    assert!(
        msg.contains("asks for dtype f32") && msg.contains("declared bf16"),
        "{msg}"
    );
}

#[test]
fn half_jobs_carry_twice_the_elements_but_a_leaf_only_float32_many() {
    // 1000 float32 elements of payload less a RESULT's token (16 bytes).
    let max_f32 = 1000;
    let mut c = half_config(Dtype::F16);
    c.elems_per_chunk = 1992;
    assert_eq!(c.validate(max_f32), Ok(()));
    c.elems_per_chunk = 1993;
    assert!(c.validate(max_f32).is_err());
    // A leaf sends float32 partials up: its chunk must fit them.
    c.upstream = Some(Upstream {
        leaf_index: 0,
        n_leaves: 2,
        spines: vec![SpineAddr {
            ip: [198, 19, 0, 1],
            port: 48879,
        }],
        local_ip: [198, 19, 0, 2],
        local_port: 48880,
    });
    assert_eq!(c.chunk_dtype(), Dtype::F32);
    c.elems_per_chunk = 996;
    assert_eq!(c.validate(max_f32), Ok(()));
    c.elems_per_chunk = 997;
    let e = c.validate(max_f32).unwrap_err();
    assert!(
        e.to_string().contains("elems_per_chunk must be 1..=996"),
        "{e}"
    );
}
