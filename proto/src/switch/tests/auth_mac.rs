//! `auth = "mac"` jobs through the job table: members learn the job's keys
//! from their authenticated JOIN_ACK, a DATA is summed only with a tag that
//! verifies, and a RESULT carries one tag for every member and every resend.

use super::*;
use crate::handshake::JoinAck;
use crate::tag::{AuthMode, TAG_LEN};

const N: u16 = 3;
const E: u16 = 8;

fn mac_config() -> JobConfig {
    JobConfig {
        auth: AuthMode::Mac,
        ..config(N, 4, E)
    }
}

/// A table with a mac job whose every rank joined; each rank's handshake
/// and its authenticated JOIN_ACK.
fn active_mac_table() -> (JobTable, Vec<JoinAck>) {
    let mut t = table();
    t.add(mac_config(), 1000).unwrap();
    let mut hss = Vec::new();
    for r in 0..N {
        hss.push(joined(&mut t, r, t0()));
    }
    let mut acks: Vec<Option<JoinAck>> = vec![None, None, None];
    for (r, hdr, payload) in drain(&mut t) {
        assert_eq!(hdr.msg_type, MsgType::JoinAck);
        let ack = hss[r.rank as usize].on_join_ack(&hdr, &payload).unwrap();
        assert_eq!(ack.auth, AuthMode::Mac);
        // Another rank's session key does not verify it.
        let other = &hss[(r.rank as usize + 1) % N as usize];
        assert!(other.on_join_ack(&hdr, &payload).is_err());
        acks[r.rank as usize] = Some(ack);
    }
    (t, acks.into_iter().map(Option::unwrap).collect())
}

/// DATA of `rank` for `seq`, tagged with `key` (None: untagged).
fn mac_data(
    t: &mut JobTable,
    rank: u16,
    seq: u32,
    vals: &[f32],
    key: Option<&PacketKey>,
    corrupt: bool,
) -> Verdict {
    let (h, mut p) = data_message(rank, seq, vals, GEN);
    if let Some(k) = key {
        let tag = k.tag(&h, &p);
        p.extend_from_slice(&tag);
    }
    if corrupt {
        p[0] ^= 1;
    }
    t.handle(&frame(&h, &p), endpoint(rank), false, t0())
}

use crate::tag::PacketKey;

fn expected() -> Vec<f32> {
    let all: Vec<Vec<f32>> = (0..N).map(inputs).collect();
    let refs: Vec<&[f32]> = all.iter().map(|v| &v[..]).collect();
    rank_order_sum(&refs)
}

fn inputs(r: u16) -> Vec<f32> {
    (0..E).map(|i| (r as f32 + 1.0) * 0.5 + i as f32).collect()
}

/// Every rank's DATA of seq 0, tagged with its own DATA key; their verdicts.
fn every_rank_sends(t: &mut JobTable, acks: &[JoinAck]) -> Vec<Verdict> {
    (0..N)
        .map(|r| {
            let key = acks[r as usize].data_key.as_ref();
            mac_data(t, r, 0, &inputs(r), key, false)
        })
        .collect()
}

#[test]
fn tagged_data_is_summed_and_the_result_tag_is_one_for_every_member() {
    let (mut t, acks) = active_mac_table();
    for v in every_rank_sends(&mut t, &acks) {
        assert!(matches!(v, Verdict::Data(_)), "{v:?}");
    }
    let results = drain(&mut t);
    assert_eq!(results.len(), N as usize);
    let want = expected();
    let mut tags = Vec::new();
    for (r, hdr, payload) in &results {
        assert_eq!(hdr.msg_type, MsgType::Result);
        let (values, tag) = payload.split_at(payload.len() - TAG_LEN);
        let key = acks[r.rank as usize].result_key.as_ref().unwrap();
        assert!(key.verify(hdr, values, tag), "rank {}", r.rank);
        let got: Vec<f32> = values
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(bits(&got), bits(&want));
        tags.push(tag.to_vec());
    }
    assert!(tags.windows(2).all(|w| w[0] == w[1]), "one tag for all");

    // A member that lost it asks again: the resend (RETX) reuses the tag.
    mac_data(&mut t, 1, 0, &inputs(1), acks[1].data_key.as_ref(), false);
    let again = drain(&mut t);
    assert_eq!(again.len(), 1);
    let (_, hdr, payload) = &again[0];
    assert!(hdr.has_flag(crate::wire::flags::RETX));
    assert_eq!(payload[payload.len() - TAG_LEN..], tags[0][..]);
    let key = acks[1].result_key.as_ref().unwrap();
    let (values, tag) = payload.split_at(payload.len() - TAG_LEN);
    assert!(key.verify(hdr, values, tag));
}

#[test]
fn the_result_keeps_its_window_and_tag_when_the_window_changes() {
    let (mut t, acks) = active_mac_table();
    every_rank_sends(&mut t, &acks);
    let first = drain(&mut t);
    t.get_mut(5).unwrap().set_window(1);
    mac_data(&mut t, 2, 0, &inputs(2), acks[2].data_key.as_ref(), false);
    let (_, hdr, payload) = drain(&mut t).pop().unwrap();
    assert_eq!(hdr.window, first[0].1.window, "the window the tag covers");
    let (values, tag) = payload.split_at(payload.len() - TAG_LEN);
    assert!(acks[2]
        .result_key
        .as_ref()
        .unwrap()
        .verify(&hdr, values, tag));
}

#[test]
fn untagged_wrong_key_and_flipped_data_are_dropped_as_bad_tag_never_summed() {
    let (mut t, acks) = active_mac_table();
    // Untagged: the payload is 16 bytes short of what a mac job takes.
    let v = mac_data(&mut t, 0, 0, &inputs(0), None, false);
    assert_eq!(
        v,
        Verdict::Data(DataOutcome::Dropped(DropReason::PayloadLength))
    );
    // Tagged with another rank's key, or a flipped payload byte.
    let v = mac_data(&mut t, 0, 0, &inputs(0), acks[1].data_key.as_ref(), false);
    assert_eq!(v, Verdict::Data(DataOutcome::Dropped(DropReason::BadTag)));
    let v = mac_data(&mut t, 0, 0, &inputs(0), acks[0].data_key.as_ref(), true);
    assert_eq!(v, Verdict::Data(DataOutcome::Dropped(DropReason::BadTag)));
    // A payload of the right length for an untagged job of two more
    // elements (count 12 = 8 + 16/4): the tag is checked, not the count.
    let mut h = HeaderRepr::new(MsgType::Data, 5);
    h.count = 12;
    h.gen = GEN;
    let v = t.handle(&frame(&h, &[0u8; 48]), endpoint(0), false, t0());
    assert!(matches!(v, Verdict::Data(DataOutcome::Dropped(_))), "{v:?}");
    let j = t.get(5).unwrap();
    assert_eq!(j.drops().count(DropReason::BadTag), 2);
    assert_eq!(j.counters().contributions, 0, "nothing was summed");
    // The honest DATA still goes in afterwards: nothing was taken.
    every_rank_sends(&mut t, &acks);
    let (_, _, payload) = drain(&mut t).pop().unwrap();
    let want = expected();
    let got: Vec<f32> = payload[..payload.len() - TAG_LEN]
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(bits(&got), bits(&want));
}

#[test]
fn a_rejoin_makes_new_keys_and_the_old_data_key_fails() {
    let (mut t, acks) = active_mac_table();
    // Rank 0 joins again at the same place (a fresh handshake): the job
    // stays active, rank 0 gets a new JOIN_ACK and a new DATA key.
    let mut hs = handshake(&t, 0, endpoint(0), SECRET);
    hello(
        &mut t,
        &mut hs,
        endpoint(0),
        t0() + Duration::from_millis(5),
    );
    t.handle(
        &join_bytes(&hs, (0, 0)),
        endpoint(0),
        false,
        t0() + Duration::from_millis(5),
    );
    let (_, hdr, payload) = drain(&mut t).pop().unwrap();
    let ack = hs.on_join_ack(&hdr, &payload).unwrap();
    let v = mac_data(&mut t, 0, 0, &inputs(0), acks[0].data_key.as_ref(), false);
    assert_eq!(v, Verdict::Data(DataOutcome::Dropped(DropReason::BadTag)));
    let v = mac_data(&mut t, 0, 0, &inputs(0), ack.data_key.as_ref(), false);
    assert_eq!(v, Verdict::Data(DataOutcome::Taken));
}

#[test]
fn a_new_activation_draws_a_new_epoch() {
    let (mut t, acks) = active_mac_table();
    let first = t.get(5).unwrap().epoch();
    // Everyone leaves, then joins again: a new activation.
    for r in 0..N {
        let mut b = [0u8; 128];
        let hs = joined(&mut t, r, t0() + Duration::from_millis(10));
        let n = hs.emit_leave(&mut b).unwrap();
        t.handle(&b[..n], endpoint(r), false, t0());
    }
    drain(&mut t);
    assert_eq!(t.get(5).unwrap().state(), JobState::Joining);
    for r in 0..N {
        join_full(
            &mut t,
            r,
            endpoint(r),
            SECRET,
            (0, 0),
            t0() + Duration::from_millis(20),
        );
    }
    assert_eq!(t.get(5).unwrap().state(), JobState::Active);
    assert_ne!(t.get(5).unwrap().epoch(), first);
    drop(acks);
}

#[test]
fn a_forged_join_ack_is_refused_by_the_worker() {
    let mut t = table();
    t.add(mac_config(), 1000).unwrap();
    let mut hs = handshake(&t, 0, endpoint(0), SECRET);
    hello(&mut t, &mut hs, endpoint(0), t0());
    // What a stranger would send: a well-formed JOIN_ACK with its own epoch
    // and auth = port, tagged with a key it made up.
    let mut h = HeaderRepr::new(MsgType::JoinAck, 5);
    h.gen = hs.gen().unwrap();
    let mut p = crate::wire::JoinAckPayload {
        pool_slots: 4,
        elems_per_chunk: E,
        n_workers: N,
        auth: 0,
        stats: 0,
        epoch: [1; 8],
        tag: [0; TAG_LEN],
    };
    let mut body = [0u8; crate::wire::JOIN_ACK_PAYLOAD_LEN];
    p.emit(&mut body).unwrap();
    p.tag = crate::tag::join_ack_tag(&[9; 32], &h, &body[..crate::wire::JOIN_ACK_TAGGED_LEN]);
    p.emit(&mut body).unwrap();
    assert_eq!(
        hs.on_join_ack(&h, &body).unwrap_err(),
        crate::handshake::JoinAckError::BadTag
    );
}

#[test]
fn mac_jobs_leave_room_for_the_tag_and_are_refused_on_leaves() {
    // 944 float32 elements fill a frame: a mac job's f32 chunk is 4 fewer.
    let mut c = mac_config();
    c.elems_per_chunk = 941;
    assert!(matches!(
        c.validate(944),
        Err(JobConfigError::ElemsPerChunk(5, 941, 940))
    ));
    c.elems_per_chunk = 940;
    c.validate(944).unwrap();
    c.dtype = crate::wire::Dtype::Bf16;
    c.elems_per_chunk = 1881;
    assert!(c.validate(944).is_err());
    c.elems_per_chunk = 1880;
    c.validate(944).unwrap();
    let leaf = JobConfig {
        upstream: Some(Upstream {
            leaf_index: 0,
            n_leaves: 2,
            spines: vec![SpineAddr {
                ip: [198, 18, 1, 1],
                port: 48879,
            }],
            local_ip: [198, 18, 1, 2],
            local_port: 48879,
        }),
        ..mac_config()
    };
    let e = leaf.validate(944).unwrap_err().to_string();
    assert!(
        e.contains("auth = \"mac\" is not supported on a leaf"),
        "{e}"
    );
}

/// One session key per membership: the guard that a member's verified
/// JOIN_ACK hands it authenticates the switch's NACK 6 (nack's rule), as
/// the DATA key from that JOIN_ACK is the one the switch checks (mac's);
/// and a frame with the member's source on another switch port is dropped
/// by the port binding before its tag is looked at.
#[test]
fn the_join_acks_guard_and_data_key_share_one_session_and_binding_goes_first() {
    let (mut t, acks) = active_mac_table();
    // The member's exact source on another switch port, tag corrupted:
    // wrong_port, not bad_tag.
    let (h, mut p) = data_message(0, 0, &inputs(0), GEN);
    let tag = acks[0].data_key.as_ref().unwrap().tag(&h, &p);
    p.extend_from_slice(&tag);
    p[0] ^= 1;
    let mut other_port = endpoint(0);
    other_port.port_idx += 1;
    let v = t.handle(&frame(&h, &p), other_port, false, t0());
    assert_eq!(
        v,
        Verdict::Data(DataOutcome::Dropped(DropReason::WrongPort))
    );
    let j = t.get(5).unwrap();
    assert_eq!(j.drops().count(DropReason::WrongPort), 1);
    assert_eq!(j.drops().count(DropReason::BadTag), 0);
    restart_rank_1(&mut t);
    // Rank 0's tagged DATA gets NACK 6, tagged under the session its
    // JOIN_ACK's guard holds.
    let v = mac_data(&mut t, 0, 0, &inputs(0), acks[0].data_key.as_ref(), false);
    assert!(matches!(v, Verdict::Data(_)), "{v:?}");
    let (head, nack) = the_nack_6(&mut t);
    assert!(acks[0].session.nack_is_authentic(&head, &nack));
    assert!(!acks[1].session.nack_is_authentic(&head, &nack));
}
