//! Round trips and fixtures of the wire format: every message type's
//! parse and emit against known bytes, and what version 4 refuses.

use super::*;

// A DATA header: job 7, rank 3, count 2, seq 0x01020304, collective 9,
// window 0, gen 0xdeadbeef, flags RETX|LAST, then 1.0f32 and -2.5f32.
const DATA_FIXTURE: [u8; 30] = [
    0x41, 0x06, 0x00, 0x07, 0x00, 0x03, 0x00, 0x02, 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00, 0x09,
    0x00, 0x00, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0,
];

#[test]
fn parse_data_fixture() {
    let h = Header::new_checked(&DATA_FIXTURE[..]).unwrap();
    let r = HeaderRepr::parse(&h).unwrap();
    assert_eq!(r.msg_type, MsgType::Data);
    assert_eq!(r.flags, flags::RETX | flags::LAST);
    assert_eq!((r.job, r.rank, r.count), (7, 3, 2));
    assert_eq!(r.seq, 0x0102_0304);
    assert_eq!(r.collective, 9);
    assert_eq!(r.gen, 0xdead_beef);
    let mut vals = [0f32; 2];
    assert_eq!(read_f32s(h.payload(), &mut vals), 2);
    assert_eq!(vals, [1.0, -2.5]);
}

// The same DATA from a bf16 job: 1.0 and -2.5 as little-endian bf16
// (0x3f80, 0xc020); an f16 job's would be 0x3c00, 0xc100.
const BF16_DATA_FIXTURE: [u8; 26] = [
    0x41, 0x06, 0x00, 0x07, 0x00, 0x03, 0x00, 0x02, 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00, 0x09,
    0x00, 0x00, 0xde, 0xad, 0xbe, 0xef, 0x80, 0x3f, 0x20, 0xc0,
];

#[test]
fn half_precision_payloads_are_two_bytes_per_element() {
    let h = Header::new_checked(&BF16_DATA_FIXTURE[..]).unwrap();
    let r = HeaderRepr::parse(&h).unwrap();
    assert_eq!(r.count, 2);
    assert_eq!(h.payload().len(), Dtype::Bf16.payload_len(r.count));
    assert_ne!(h.payload().len(), Dtype::F32.payload_len(r.count));
    let mut vals = [0f32; 2];
    crate::elements::read_le(Dtype::Bf16, h.payload(), &mut vals);
    assert_eq!(vals, [1.0, -2.5]);
    let mut f16_bytes = [0u8; 4];
    crate::elements::round_to_le(Dtype::F16, &[1.0, -2.5], &mut f16_bytes);
    assert_eq!(f16_bytes, [0x00, 0x3c, 0x00, 0xc1]);
    // Three bytes for two elements fit no element size.
    let h = Header::new_checked(&BF16_DATA_FIXTURE[..25]).unwrap();
    assert!(matches!(
        HeaderRepr::parse(&h),
        Err(WireError::PayloadLength { len: 3, .. })
    ));
    // Dtype codes, names and chunk sizes.
    assert_eq!(Dtype::from_u8(1), Some(Dtype::Bf16));
    assert_eq!(Dtype::from_u8(2), Some(Dtype::F16));
    assert_eq!(Dtype::from_u8(3), None);
    assert_eq!("bf16".parse::<Dtype>(), Ok(Dtype::Bf16));
    assert!("float16"
        .parse::<Dtype>()
        .unwrap_err()
        .to_string()
        .contains("f32, bf16 or f16"));
    assert_eq!(elems_per_chunk_for(1500, Dtype::Bf16), 724);
    assert_eq!(elems_per_chunk_for(1500, Dtype::F32), 362);
    assert_eq!(Dtype::Bf16.scale_f32_elems(MAX_ELEMS_PER_CHUNK), 4474);
}

#[test]
fn emit_reproduces_fixture() {
    let h = Header::new_checked(&DATA_FIXTURE[..]).unwrap();
    let r = HeaderRepr::parse(&h).unwrap();
    let mut buf = [0u8; 30];
    r.emit_to(&mut buf).unwrap();
    write_f32s(&[1.0, -2.5], &mut buf[HEADER_LEN..]);
    assert_eq!(buf, DATA_FIXTURE);
}

#[test]
fn collective_kinds_and_novalues() {
    // The DATA fixture as a reduce-scatter chunk owned by rank 3.
    let mut b = DATA_FIXTURE;
    b[1] |= Kind::ReduceScatter.flag_bits();
    b[16..18].copy_from_slice(&3u16.to_be_bytes());
    let r = HeaderRepr::parse(&Header::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(
        (r.kind(), r.owner(), r.no_values()),
        (Kind::ReduceScatter, 3, false)
    );

    // A NOVAL all-gather DATA: header only (or only a tag), count kept.
    let mut h = HeaderRepr::new(MsgType::Data, 7);
    h.flags = Kind::AllGather.flag_bits() | flags::NOVAL;
    h.count = 362;
    h.window = 1;
    for extra in [0, TAG_LEN] {
        let mut buf = vec![0u8; HEADER_LEN + extra];
        h.emit_to(&mut buf).unwrap();
        let p = HeaderRepr::parse(&Header::new_checked(&buf[..]).unwrap()).unwrap();
        assert_eq!(
            (p.kind(), p.count, p.owner(), p.no_values()),
            (Kind::AllGather, 362, 1, true)
        );
    }
    // ... but not with values, nor with count 0.
    let mut buf = vec![0u8; HEADER_LEN + 362 * 4];
    h.emit_to(&mut buf).unwrap();
    assert!(matches!(
        HeaderRepr::parse(&Header::new_checked(&buf[..]).unwrap()),
        Err(WireError::PayloadLength { .. })
    ));
    h.count = 0;
    let mut buf = vec![0u8; HEADER_LEN];
    h.emit_to(&mut buf).unwrap();
    assert!(HeaderRepr::parse(&Header::new_checked(&buf[..]).unwrap()).is_err());

    // Kind 3 is reserved; an all-reduce always has values; kinds and
    // NOVAL belong to DATA/RESULT alone.
    for bad in [0x30, flags::NOVAL] {
        let mut b = DATA_FIXTURE;
        b[1] |= bad;
        let p = HeaderRepr::parse(&Header::new_checked(&b[..]).unwrap());
        assert!(
            matches!(p, Err(WireError::ReservedFlags(_))),
            "{bad:#x}: {p:?}"
        );
    }
    let mut hb = HeaderRepr::new(MsgType::Heartbeat, 7);
    hb.flags = Kind::ReduceScatter.flag_bits();
    let mut buf = vec![0u8; HEADER_LEN];
    hb.emit_to(&mut buf).unwrap();
    assert!(matches!(
        HeaderRepr::parse(&Header::new_checked(&buf[..]).unwrap()),
        Err(WireError::ReservedFlags(_))
    ));

    // Who sends and who gets values.
    assert!(Kind::AllGather.sends_values(2, 2) && !Kind::AllGather.sends_values(1, 2));
    assert!(!Kind::AllGather.receives_values(2, 2) && Kind::AllGather.receives_values(1, 2));
    assert!(Kind::ReduceScatter.sends_values(1, 2) && !Kind::ReduceScatter.receives_values(1, 2));
    assert!(Kind::ReduceScatter.receives_values(2, 2) && Kind::AllReduce.receives_values(1, 2));
}

#[test]
fn rejects_what_version_4_forbids() {
    for (v, b0) in [(1, 0x11), (2, 0x21), (3, 0x31)] {
        let mut b = DATA_FIXTURE;
        b[0] = b0;
        let h = Header::new_checked(&b[..]).unwrap();
        assert_eq!(HeaderRepr::parse(&h), Err(WireError::BadVersion(v)));
    }

    let mut b = DATA_FIXTURE;
    b[0] = 0x4c;
    let h = Header::new_checked(&b[..]).unwrap();
    assert_eq!(HeaderRepr::parse(&h), Err(WireError::UnknownType(12)));

    let mut b = DATA_FIXTURE;
    b[1] = 0x80;
    let h = Header::new_checked(&b[..]).unwrap();
    assert_eq!(HeaderRepr::parse(&h), Err(WireError::ReservedFlags(0x80)));

    let mut b = DATA_FIXTURE;
    b[2] = 0;
    b[3] = 0;
    let h = Header::new_checked(&b[..]).unwrap();
    assert_eq!(HeaderRepr::parse(&h), Err(WireError::ZeroJob));

    // count larger than the payload
    let mut b = DATA_FIXTURE;
    b[7] = 3;
    let h = Header::new_checked(&b[..]).unwrap();
    assert!(matches!(
        HeaderRepr::parse(&h),
        Err(WireError::PayloadLength { len: 8, .. })
    ));

    assert_eq!(
        Header::new_checked(&DATA_FIXTURE[..21]).err(),
        Some(WireError::Truncated { len: 21, need: 22 })
    );
}

#[test]
fn join_and_ack_round_trip() {
    let j = JoinPayload {
        n_workers: 64,
        dtype: DTYPE_F32,
        op: OP_SUM,
        nonce: [0x11; NONCE_LEN],
        mac: [0xab; MAC_LEN],
    };
    let mut b = [0u8; JOIN_PAYLOAD_LEN];
    j.emit(&mut b).unwrap();
    assert_eq!(&b[..6], &[0, 64, 0, 0, 0x11, 0x11]);
    assert_eq!(&b[20..22], &[0xab, 0xab]);
    assert_eq!(JoinPayload::parse(&b).unwrap(), j);
    assert!(!format!("{j:?}").contains("171"), "the MAC must not print");
    assert!(JoinPayload::parse(&b[..51]).is_err());

    let a = JoinAckPayload {
        pool_slots: 256,
        elems_per_chunk: 362,
        n_workers: 4,
        auth: 1,
        stats: 1,
        epoch: [0x5e; 8],
        tag: [0x7a; 16],
    };
    let mut b = [0u8; JOIN_ACK_PAYLOAD_LEN];
    a.emit(&mut b).unwrap();
    assert_eq!(b[..8], [0x01, 0x00, 0x01, 0x6a, 0x00, 0x04, 1, 1]);
    assert_eq!(b[8..16], [0x5e; 8]);
    assert_eq!(b[16..], [0x7a; 16]);
    assert_eq!(JoinAckPayload::parse(&b).unwrap(), a);
    assert!(JoinAckPayload::parse(&b[..31]).is_err());
}

// A CHALLENGE payload: hello nonce 0x01.., switch nonce 0x02..,
// observed 198.18.0.2:40000, 4 seq lanes; and one of a switch before
// seq lanes (zero bytes there): one lane.
#[test]
fn challenge_fixture() {
    let mut f = [0u8; CHALLENGE_PAYLOAD_LEN];
    f[..16].fill(1);
    f[16..32].fill(2);
    f[32..40].copy_from_slice(&[198, 18, 0, 2, 0x9c, 0x40, 0, 4]);
    let c = ChallengePayload::parse(&f).unwrap();
    assert_eq!(c.hello_nonce, [1; 16]);
    assert_eq!(c.nonce, [2; 16]);
    assert_eq!((c.observed_ip, c.observed_port), ([198, 18, 0, 2], 40000));
    assert_eq!(c.seq_lanes, 4);
    let mut out = [0xffu8; CHALLENGE_PAYLOAD_LEN];
    c.emit(&mut out).unwrap();
    assert_eq!(out, f);
    f[38..40].fill(0);
    assert_eq!(ChallengePayload::parse(&f).unwrap().seq_lanes, 0);
    let mut h = [0xffu8; HELLO_PAYLOAD_LEN];
    HelloPayload { nonce: [1; 16] }.emit(&mut h).unwrap();
    assert_eq!(&h[..16], &[1; 16]);
    assert_eq!(&h[16..], &[0; 24], "padding is zero");
}

#[test]
fn seq_lanes_on_the_wire() {
    for (v, lanes) in [
        (0, 1),
        (1, 1),
        (2, 2),
        (3, 2),
        (8, 8),
        (100, 64),
        (u16::MAX, 64),
    ] {
        assert_eq!(seq_lanes_from_wire(v), lanes, "{v}");
    }
    assert_eq!(seq_lane_port(48879, 6, 4), 48881);
    assert_eq!(seq_lane_port(48879, 6, 1), 48879);
    assert_eq!(seq_lane_port(u16::MAX, 1, 2), 0, "wraps like a port");
}

#[test]
fn nack_round_trip() {
    let mut b = [0u8; NACK_PAYLOAD_LEN];
    let n = NackPayload {
        reason: NackReason::StaleNonce,
        detail: 0,
        echo: [5; 16],
        tag: [7; 16],
    };
    n.emit(&mut b).unwrap();
    assert_eq!(&b[..4], &[0, 9, 0, 0]);
    assert_eq!(&b[4..20], &[5; 16]);
    assert_eq!(&b[20..36], &[7; 16]);
    assert_eq!(NackPayload::parse(&b), Ok(n));
    b[1] = 99;
    assert_eq!(
        NackPayload::parse(&b),
        Err(WireError::UnknownNackReason(99))
    );
    assert!(NackPayload::parse(&b[..2]).is_err(), "a version-1 NACK");
    assert!(NackPayload::parse(&b[..20]).is_err(), "a version-2 NACK");
}

#[test]
fn v1_refusal_is_a_version_1_nack_8() {
    let mut b = [0u8; 32];
    let n = emit_v1_refusal(5, 3, &mut b).unwrap();
    assert_eq!(n, 24);
    assert_eq!(&b[..6], &[0x16, 0, 0, 5, 0, 3]);
    assert_eq!(&b[22..24], &[0, 8]);
    assert_eq!(peek_v1(&b[..n]), Some((6, 5, 3)));
    assert_eq!(peek_v1(&DATA_FIXTURE), None);
}

#[test]
fn v2_hello_gets_a_version_2_nack_8_echoing_it() {
    let mut hello = [0u8; HEADER_LEN + HELLO_PAYLOAD_LEN];
    let mut h = HeaderRepr::new(MsgType::Hello, 5);
    h.rank = 3;
    h.emit_to(&mut hello).unwrap();
    hello[0] = 0x28;
    hello[HEADER_LEN..HEADER_LEN + 16].copy_from_slice(&[7; 16]);
    assert_eq!(peek_old_hello(&hello), Some((2, 5, 3, [7; 16])));
    assert_eq!(peek_old_hello(&hello[..50]), None, "only a whole HELLO");
    let mut b = [0u8; 64];
    let n = emit_v2_refusal(5, 3, &[7; 16], &mut b).unwrap();
    assert_eq!(n, 42);
    assert!(n < hello.len(), "smaller than the HELLO it answers");
    assert_eq!(&b[..6], &[0x26, 0, 0, 5, 0, 3]);
    assert_eq!(&b[22..26], &[0, 8, 0, 0]);
    assert_eq!(&b[26..42], &[7; 16]);
    hello[0] = 0x48;
    assert_eq!(peek_old_hello(&hello), None, "a version-4 HELLO");
}

#[test]
fn v3_hello_gets_a_version_3_nack_8_echoing_it() {
    let mut hello = [0u8; HEADER_LEN + HELLO_PAYLOAD_LEN];
    let mut h = HeaderRepr::new(MsgType::Hello, 5);
    h.rank = 3;
    h.emit_to(&mut hello).unwrap();
    hello[0] = 0x38;
    hello[HEADER_LEN..HEADER_LEN + 16].copy_from_slice(&[7; 16]);
    assert_eq!(peek_old_hello(&hello), Some((3, 5, 3, [7; 16])));
    let mut b = [0u8; 64];
    let n = emit_old_refusal(3, 5, 3, &[7; 16], &mut b).unwrap();
    assert_eq!(n, 58);
    assert!(n < hello.len(), "smaller than the HELLO it answers");
    assert_eq!(&b[..6], &[0x36, 0, 0, 5, 0, 3]);
    assert_eq!(&b[22..26], &[0, 8, 0, 0]);
    assert_eq!(&b[26..42], &[7; 16]);
    assert_eq!(&b[42..58], &[0; 16], "no session: a zero tag");
    assert!(emit_old_refusal(4, 5, 3, &[7; 16], &mut b).is_err());
}

#[test]
fn provision_payloads_round_trip_and_check_their_lengths() {
    let p = ProvisionPayload {
        tenant: crate::provision::TenantName::new("vision")
            .unwrap()
            .to_wire(),
        job_name: crate::provision::JobName::new("run-1").unwrap().to_wire(),
        n_workers: 4,
        dtype: 1,
        op: 0,
        auth: 2,
        stats: 1,
        priority: 2,
        nonce: [9; 16],
        mac: [8; 32],
    };
    let mut f = [0u8; HEADER_LEN + PROVISION_PAYLOAD_LEN];
    let mut h = HeaderRepr::new(MsgType::Provision, 1);
    h.job = 0;
    h.count = PROVISION_CLAIM;
    h.emit_to(&mut f).unwrap();
    assert_eq!(p.emit(&mut f[HEADER_LEN..]).unwrap(), 152);
    let parsed = HeaderRepr::parse(&Header::new_checked(&f[..]).unwrap()).unwrap();
    assert_eq!(
        (parsed.msg_type, parsed.job),
        (MsgType::Provision, 0),
        "job 0 is allowed"
    );
    assert_eq!(ProvisionPayload::parse(&f[HEADER_LEN..]).unwrap(), p);
    assert_eq!(
        &p.covered()[..],
        &f[HEADER_LEN..HEADER_LEN + PROVISION_MAC_OFFSET]
    );
    assert!(HeaderRepr::parse(&Header::new_checked(&f[..f.len() - 1]).unwrap()).is_err());
    assert!(!format!("{p:?}").contains("8, 8"), "the MAC never prints");

    let a = ProvisionedPayload {
        nonce: [1; 16],
        lease_secs: 60,
        flags: PROVISIONED_CREATED,
        tag: [2; 16],
    };
    let mut b = [0u8; 40];
    assert_eq!(a.emit(&mut b).unwrap(), 40);
    assert_eq!(ProvisionedPayload::parse(&b).unwrap(), a);
    // Any other type with job 0 is still malformed.
    let mut g = [0u8; HEADER_LEN + PROVISIONED_PAYLOAD_LEN];
    let mut h = HeaderRepr::new(MsgType::Provisioned, 1);
    h.job = 0;
    h.emit_to(&mut g).unwrap();
    assert_eq!(
        HeaderRepr::parse(&Header::new_checked(&g[..]).unwrap()),
        Err(WireError::ZeroJob)
    );
    // The switch's CHALLENGE and NACK answering a PROVISION with job 0
    // carry its job: they parse.
    for (ty, len) in [
        (MsgType::Challenge, CHALLENGE_PAYLOAD_LEN),
        (MsgType::Nack, NACK_PAYLOAD_LEN),
    ] {
        let mut g = vec![0u8; HEADER_LEN + len];
        let mut h = HeaderRepr::new(ty, 1);
        h.job = 0;
        h.emit_to(&mut g).unwrap();
        let parsed = HeaderRepr::parse(&Header::new_checked(&g[..]).unwrap()).unwrap();
        assert_eq!((parsed.msg_type, parsed.job), (ty, 0));
    }
}

#[test]
fn a_nack_11_names_its_quota_in_detail() {
    let mut n = NackPayload::echoing(NackReason::QuotaExceeded, [3; 16]);
    n.detail = Quota::MaxJobs as u16;
    let mut b = [0u8; NACK_PAYLOAD_LEN];
    n.emit(&mut b).unwrap();
    assert_eq!(&b[..4], &[0, 11, 0, 1]);
    let back = NackPayload::parse(&b).unwrap();
    assert_eq!(Quota::from_u16(back.detail), Some(Quota::MaxJobs));
    assert_eq!(NackReason::from_u16(12), Some(NackReason::UnknownTenant));
    for q in Quota::ALL {
        assert_eq!(Quota::from_u16(q as u16), Some(q));
    }
    assert_eq!(Quota::from_u16(0), None);
}

#[test]
fn elems_per_chunk_matches_protocol() {
    assert_eq!(elems_per_chunk_for_mtu(1500), 362);
    assert_eq!(FRAME_PAYLOAD_OFFSET, 64);
}

// A leaf's HEARTBEAT answer: job 7 to rank 1, seq 5, window 64, gen 9,
// UPSTREAM; spine 198.19.255.2:48879, tree 1, silent 4200 ms, session
// refused with reason 2 (bad secret); waiting for leaf 3.
const UPSTREAM_WAIT_FIXTURE: [u8; 40] = [
    0x47, 0x08, 0x00, 0x07, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x40, 0x00, 0x00, 0x00, 0x09, 198, 19, 255, 2, 0xbe, 0xef, 0x00, 0x01, 0x00, 0x00, 0x10,
    0x68, 0x00, 0x02, 0x00, 0x02, 0x00, 0x03,
];

#[test]
fn upstream_wait_fixture_round_trips() {
    let h = Header::new_checked(&UPSTREAM_WAIT_FIXTURE[..]).unwrap();
    let r = HeaderRepr::parse(&h).unwrap();
    assert_eq!(r.msg_type, MsgType::Heartbeat);
    assert!(r.has_flag(flags::UPSTREAM));
    assert_eq!((r.seq, r.count, r.window, r.gen), (5, 1, 64, 9));
    let w = UpstreamWaitPayload::parse(h.payload()).unwrap();
    let want = UpstreamWaitPayload {
        spine_ip: [198, 19, 255, 2],
        spine_port: 48879,
        tree: 1,
        silent_ms: 4200,
        session: SpineSessionState::Refused(SpineRefusal::Nack(NackReason::BadSecret)),
    };
    assert_eq!(w, want);
    assert_eq!(&h.payload()[UPSTREAM_WAIT_LEN..], &[0, 3]);
    let mut buf = [0u8; 40];
    r.emit_to(&mut buf).unwrap();
    want.emit(&mut buf[HEADER_LEN..]).unwrap();
    buf[38..].copy_from_slice(&3u16.to_be_bytes());
    // Every state survives the round trip.
    for st in [
        SpineSessionState::Joined,
        SpineSessionState::Joining,
        SpineSessionState::Refused(SpineRefusal::ElemsDiffer { spine: 362 }),
        SpineSessionState::Refused(SpineRefusal::AuthDiffers),
        SpineSessionState::Refused(SpineRefusal::StatsDiffer { spine: 0 }),
        SpineSessionState::Refused(SpineRefusal::StatsDiffer { spine: 1 }),
        SpineSessionState::Refused(SpineRefusal::ProvisionRefused(NackReason::UnknownTenant)),
        SpineSessionState::Refused(SpineRefusal::ProvisionRefused(NackReason::BadSecret)),
        SpineSessionState::Refused(SpineRefusal::ProvisionQuota(Quota::MaxWorkersPerJob)),
        SpineSessionState::Refused(SpineRefusal::ProvisionQuota(Quota::SwitchPoolMemory)),
    ] {
        let mut b = [0u8; UPSTREAM_WAIT_LEN];
        UpstreamWaitPayload {
            session: st,
            ..want
        }
        .emit(&mut b)
        .unwrap();
        assert_eq!(UpstreamWaitPayload::parse(&b).unwrap().session, st);
    }
    assert_eq!(buf, UPSTREAM_WAIT_FIXTURE);
    // Without its spine block, the length is wrong.
    let mut short = UPSTREAM_WAIT_FIXTURE;
    short[7] = 7;
    let h = Header::new_checked(&short[..]).unwrap();
    assert!(matches!(
        HeaderRepr::parse(&h),
        Err(WireError::PayloadLength {
            what: "16 + count × 2",
            ..
        })
    ));
    assert!(UpstreamWaitPayload::parse(&[0; 15]).is_err());
}

/// A spine's refusal to provision a tree's job (docs/PROTOCOL.md,
/// "Aggregation trees", Stalls): reason 0x4200 | its NACK reason, 0x4300 |
/// the quota of a NACK 11; an unknown NACK reason or quota reads as
/// joining, never as another refusal.
#[test]
fn provisioning_refusal_codes_of_a_spine_block() {
    let block = |state: u16, reason: u16| {
        let mut b = [0u8; UPSTREAM_WAIT_LEN];
        b[12..14].copy_from_slice(&state.to_be_bytes());
        b[14..16].copy_from_slice(&reason.to_be_bytes());
        UpstreamWaitPayload::parse(&b).unwrap().session
    };
    assert_eq!(
        block(2, 0x420c),
        SpineSessionState::Refused(SpineRefusal::ProvisionRefused(NackReason::UnknownTenant))
    );
    assert_eq!(
        block(2, 0x4302),
        SpineSessionState::Refused(SpineRefusal::ProvisionQuota(Quota::MaxWorkersPerJob))
    );
    for unknown in [0x4200, 0x42ff, 0x4300, 0x4309, 0x43ff] {
        assert_eq!(
            block(2, unknown),
            SpineSessionState::Joining,
            "{unknown:#x}"
        );
    }
    let q = SpineRefusal::ProvisionQuota(Quota::MaxWorkersPerJob).to_string();
    assert!(
        q.contains("max_workers_per_job") && q.contains("n_leaves"),
        "{q}"
    );
    let t = SpineRefusal::ProvisionRefused(NackReason::UnknownTenant).to_string();
    assert!(t.contains("tenant"), "{t}");
}
