//! Arbitrary bytes through the version-2 wire parser: `Header::new_checked`,
//! `HeaderRepr::parse`, every payload parser (HELLO, CHALLENGE, JOIN,
//! JOIN_ACK, NACK, LEAVE), the version-1 helpers `peek_v1` and
//! `emit_v1_refusal`, and a worker's `Handshake::on_challenge`.
//!
//! Asserts: nothing panics; a header that parses emits back (`emit_to`) to
//! the same 22 bytes; a payload that parses emits back to the same bytes,
//! except for the bytes the protocol reserves or pads (which `emit` writes
//! as zero and `parse` ignores), and parses again to the same value;
//! `HeaderRepr::parse` vouches for exactly the payload length each message
//! type needs; MACs never print.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::elements;
use proto::handshake::{ChallengeError, Handshake, JoinParams};
use proto::wire::{
    emit_v1_refusal, flags, peek_v1, read_f32s, write_f32s, ChallengePayload, Dtype, Header,
    HeaderRepr, HelloPayload, JoinAckPayload, JoinPayload, LeavePayload, MsgType, NackPayload,
    NackReason, ProvisionPayload, ProvisionedPayload, UpstreamWaitPayload, WireError,
    CHALLENGE_PAYLOAD_LEN, HEADER_LEN, HELLO_PAYLOAD_LEN, JOIN_ACK_PAYLOAD_LEN, JOIN_PAYLOAD_LEN,
    LEAVE_PAYLOAD_LEN, NACK_PAYLOAD_LEN, NONCE_LEN, PROVISIONED_PAYLOAD_LEN, PROVISION_PAYLOAD_LEN,
    UPSTREAM_WAIT_LEN, V1_NACK_PAYLOAD_LEN,
};

fuzz_target!(|data: &[u8]| {
    // The payload parsers must also cope with any length on their own.
    payloads(data);
    version_1(data);

    let h = match Header::new_checked(data) {
        Ok(h) => h,
        Err(e) => {
            assert!(
                data.len() < HEADER_LEN,
                "new_checked refused a whole header"
            );
            assert_eq!(
                e,
                WireError::Truncated {
                    len: data.len(),
                    need: HEADER_LEN
                }
            );
            return;
        }
    };
    // Every accessor of a checked header is safe.
    let _ = (
        h.version(),
        h.msg_type_raw(),
        h.flags(),
        h.job(),
        h.rank(),
        h.count(),
        h.seq(),
        h.collective(),
        h.window(),
        h.gen(),
    );
    let payload = h.payload();
    assert_eq!(payload.len(), data.len() - HEADER_LEN);
    payloads(payload);

    let repr = match HeaderRepr::parse(&h) {
        Ok(r) => r,
        Err(e) => {
            let _ = (e.kind(), e.to_string());
            return;
        }
    };
    assert_eq!(h.version(), proto::wire::VERSION);
    // What parse accepted, emit reproduces byte for byte.
    let mut buf = [0u8; HEADER_LEN];
    assert_eq!(repr.emit_to(&mut buf), Ok(HEADER_LEN));
    assert_eq!(
        &buf[..],
        &data[..HEADER_LEN],
        "emit_to does not reproduce the parsed header {repr:?}"
    );
    // emit_to into a longer buffer touches only the header.
    let mut long = data.to_vec();
    long[..HEADER_LEN].fill(0);
    assert_eq!(repr.emit_to(&mut long), Ok(HEADER_LEN));
    assert_eq!(long, data);
    // And the emitted header parses to the same fields.
    let again = HeaderRepr::parse(&Header::new_checked(&long[..]).unwrap()).unwrap();
    assert_eq!(again, repr);
    // A short buffer is an error, not a panic.
    assert!(repr.emit_to(&mut buf[..HEADER_LEN - 1]).is_err());

    // The payload length parse() vouched for is what the type needs.
    match repr.msg_type {
        // A NOVAL DATA/RESULT (reduce-scatter, all-gather) carries no
        // values: nothing, or a stats job's trailer and/or the tag of an
        // `auth = "mac"` job.
        MsgType::Data | MsgType::Result if repr.no_values() => {
            assert!(repr.count > 0);
            assert!(
                [0, 16, 24, 40].contains(&payload.len()),
                "{} bytes",
                payload.len()
            );
            assert_ne!(repr.kind(), proto::wire::Kind::AllReduce);
        }
        MsgType::Data | MsgType::Result => {
            assert!(repr.count > 0);
            // Either element size, followed by nothing, a 16-byte tag, a
            // 24-byte statistics trailer or both; the job's dtype, auth
            // mode and statistics pick one.
            let n = repr.count as usize;
            let extra = [0usize, 16, 24, 40]
                .into_iter()
                .find(|e| payload.len() >= *e && [n * 4, n * 2].contains(&(payload.len() - e)))
                .expect("parse vouched for a DATA/RESULT length");
            if extra >= 24 {
                // A trailer's codec never panics, whatever the bytes.
                let t = &payload[payload.len() - extra..payload.len() - extra + 24];
                if let Ok(st) = proto::stats::GradStats::parse(t) {
                    let mut b = [0u8; 24];
                    assert_eq!(st.emit(&mut b), Ok(24));
                    assert_eq!(&b[..], t);
                }
            }
            let payload = &payload[..payload.len() - extra];
            if payload.len() == n * 4 {
                let mut vals = vec![0f32; n];
                assert_eq!(read_f32s(payload, &mut vals), n);
                let mut out = vec![0u8; payload.len()];
                assert_eq!(write_f32s(&vals, &mut out), payload.len());
                assert_eq!(out, payload, "f32 payload does not round-trip bit for bit");
            } else {
                assert_eq!(payload.len(), n * 2);
                // Widening is exact, so rounding back gives every non-NaN
                // element's bits again.
                for dtype in [Dtype::Bf16, Dtype::F16] {
                    let mut vals = vec![0f32; n];
                    elements::read_le(dtype, payload, &mut vals);
                    let mut out = vec![0u8; payload.len()];
                    assert_eq!(elements::round_to_le(dtype, &vals, &mut out), payload.len());
                    for (i, v) in vals.iter().enumerate() {
                        if !v.is_nan() {
                            assert_eq!(
                                out[2 * i..2 * i + 2],
                                payload[2 * i..2 * i + 2],
                                "{dtype} element {i} does not round-trip"
                            );
                        }
                    }
                }
            }
        }
        MsgType::Join => {
            assert_eq!(payload.len(), JOIN_PAYLOAD_LEN);
            assert!(JoinPayload::parse(payload).is_ok());
        }
        MsgType::JoinAck => {
            assert_eq!(payload.len(), JOIN_ACK_PAYLOAD_LEN);
            assert!(JoinAckPayload::parse(payload).is_ok());
        }
        MsgType::Nack => {
            // The header vouches for the length; the reason is the payload
            // parser's to check.
            assert_eq!(payload.len(), NACK_PAYLOAD_LEN);
            match NackPayload::parse(payload) {
                Ok(_) | Err(WireError::UnknownNackReason(_)) => {}
                Err(e) => panic!("a NACK payload of the right length refused: {e}"),
            }
        }
        MsgType::Leave => {
            assert_eq!(payload.len(), LEAVE_PAYLOAD_LEN);
            assert!(LeavePayload::parse(payload).is_ok());
        }
        MsgType::Heartbeat if repr.has_flag(flags::UPSTREAM) => {
            // A leaf's answer: the spine block, then `count` u16 leaves; the
            // block parses whatever its bytes, and re-emits them exactly
            // when its state/reason codes are canonical.
            assert_eq!(payload.len(), UPSTREAM_WAIT_LEN + repr.count as usize * 2);
            let w = UpstreamWaitPayload::parse(payload).expect("the header vouched for the block");
            let mut out = [0u8; UPSTREAM_WAIT_LEN];
            w.emit(&mut out).unwrap();
            assert_eq!(
                out[..12],
                payload[..12],
                "spine address, tree and silence round-trip"
            );
            assert_eq!(UpstreamWaitPayload::parse(&out).unwrap(), w);
        }
        MsgType::Heartbeat => {
            // Worker → switch: empty; switch → worker: `count` u16 ranks.
            assert_eq!(payload.len(), repr.count as usize * 2);
        }
        MsgType::Hello => {
            assert_eq!(payload.len(), HELLO_PAYLOAD_LEN);
            assert!(HelloPayload::parse(payload).is_ok());
        }
        MsgType::Challenge => {
            assert_eq!(payload.len(), CHALLENGE_PAYLOAD_LEN);
            assert!(ChallengePayload::parse(payload).is_ok());
            // Job 0: the answer to a PROVISION that left the id to the
            // switch, not a JOIN handshake's.
            if repr.job != 0 {
                challenge(&repr, payload);
            }
        }
        MsgType::Provision => {
            // Whatever its bytes (names are the receiver's to check), a
            // PROVISION re-emits exactly.
            assert_eq!(payload.len(), PROVISION_PAYLOAD_LEN);
            let p = ProvisionPayload::parse(payload).expect("the header vouched for it");
            let mut out = [0u8; PROVISION_PAYLOAD_LEN];
            p.emit(&mut out).unwrap();
            assert_eq!(out[..103], payload[..103]);
            assert_eq!(out[104..], payload[104..]);
            let _ = proto::provision::TenantName::from_wire(&p.tenant);
            let _ = proto::provision::JobName::from_wire(&p.job_name);
        }
        MsgType::Provisioned => {
            assert_eq!(payload.len(), PROVISIONED_PAYLOAD_LEN);
            let p = ProvisionedPayload::parse(payload).expect("the header vouched for it");
            let mut out = [0u8; PROVISIONED_PAYLOAD_LEN];
            p.emit(&mut out).unwrap();
            assert_eq!(&out[..], payload);
        }
    }
});

/// `emit` into a buffer one byte short fails; into a longer one it writes
/// only its own bytes.
fn emit_bounds(len: usize, emit: impl Fn(&mut [u8]) -> Result<usize, WireError>) {
    let mut short = vec![0u8; len - 1];
    assert!(emit(&mut short).is_err(), "emit into {} bytes", len - 1);
    let mut long = vec![0xa5u8; len + 3];
    assert_eq!(emit(&mut long), Ok(len));
    assert_eq!(&long[len..], &[0xa5; 3], "emit wrote past its payload");
}

/// `p` with the byte ranges in `zero` cleared: what `emit` writes for a
/// payload that parsed from `p` (reserved and padding bytes are zero on the
/// wire and ignored on receipt).
fn canonical(p: &[u8], zero: core::ops::Range<usize>) -> Vec<u8> {
    let mut c = p.to_vec();
    c[zero].fill(0);
    c
}

/// Runs every payload parser on `p`; what parses must emit back identically
/// (up to reserved bytes) and parse again to the same value.
fn payloads(p: &[u8]) {
    match HelloPayload::parse(p) {
        Ok(v) => {
            assert_eq!(p.len(), HELLO_PAYLOAD_LEN);
            let mut b = [0xffu8; HELLO_PAYLOAD_LEN];
            assert_eq!(v.emit(&mut b), Ok(HELLO_PAYLOAD_LEN));
            assert_eq!(&b[..], &canonical(p, NONCE_LEN..HELLO_PAYLOAD_LEN)[..]);
            assert_eq!(HelloPayload::parse(&b), Ok(v));
            emit_bounds(HELLO_PAYLOAD_LEN, |b| v.emit(b));
        }
        Err(e) => assert_ne!(p.len(), HELLO_PAYLOAD_LEN, "HELLO refused: {e}"),
    }
    match ChallengePayload::parse(p) {
        Ok(v) => {
            assert_eq!(p.len(), CHALLENGE_PAYLOAD_LEN);
            let mut b = [0xffu8; CHALLENGE_PAYLOAD_LEN];
            assert_eq!(v.emit(&mut b), Ok(CHALLENGE_PAYLOAD_LEN));
            // No reserved bytes: the last two are the seq lanes.
            assert_eq!(&b[..], p);
            assert_eq!(ChallengePayload::parse(&b), Ok(v));
            emit_bounds(CHALLENGE_PAYLOAD_LEN, |b| v.emit(b));
        }
        Err(e) => assert_ne!(p.len(), CHALLENGE_PAYLOAD_LEN, "CHALLENGE refused: {e}"),
    }
    match JoinPayload::parse(p) {
        Ok(j) => {
            assert_eq!(p.len(), JOIN_PAYLOAD_LEN);
            let mut b = [0u8; JOIN_PAYLOAD_LEN];
            assert_eq!(j.emit(&mut b), Ok(JOIN_PAYLOAD_LEN));
            assert_eq!(&b[..], p);
            assert_eq!(JoinPayload::parse(&b), Ok(j));
            emit_bounds(JOIN_PAYLOAD_LEN, |b| j.emit(b));
            let shown = format!("{j:?}");
            assert!(
                shown.contains("<redacted>"),
                "a JOIN's MAC printed: {shown}"
            );
        }
        Err(e) => assert_ne!(p.len(), JOIN_PAYLOAD_LEN, "JOIN refused: {e}"),
    }
    match JoinAckPayload::parse(p) {
        Ok(a) => {
            assert_eq!(p.len(), JOIN_ACK_PAYLOAD_LEN);
            let mut b = [0u8; JOIN_ACK_PAYLOAD_LEN];
            assert_eq!(a.emit(&mut b), Ok(JOIN_ACK_PAYLOAD_LEN));
            // Every byte round-trips (byte 7 is `stats`; its value is the
            // receiver's to check).
            assert_eq!(&b[..], p);
            assert_eq!(JoinAckPayload::parse(&b), Ok(a));
            emit_bounds(JOIN_ACK_PAYLOAD_LEN, |b| a.emit(b));
        }
        Err(e) => assert_ne!(p.len(), JOIN_ACK_PAYLOAD_LEN, "JOIN_ACK refused: {e}"),
    }
    match NackPayload::parse(p) {
        Ok(n) => {
            assert_eq!(p.len(), NACK_PAYLOAD_LEN);
            let mut b = [0xffu8; NACK_PAYLOAD_LEN];
            assert_eq!(n.emit(&mut b), Ok(NACK_PAYLOAD_LEN));
            // Every byte round-trips: bytes 2-3 are `detail` since
            // version 4 (the quota of a NACK 11).
            assert_eq!(&b[..], p);
            assert_eq!(NackPayload::parse(&b), Ok(n));
            assert_eq!(NackReason::from_u16(n.reason as u16), Some(n.reason));
            emit_bounds(NACK_PAYLOAD_LEN, |b| n.emit(b));
            let _ = n.reason.to_string();
        }
        Err(e) => {
            match e {
                WireError::UnknownNackReason(v) => {
                    assert_eq!(p.len(), NACK_PAYLOAD_LEN);
                    assert_eq!(NackReason::from_u16(v), None);
                }
                _ => assert_ne!(p.len(), NACK_PAYLOAD_LEN, "NACK refused: {e}"),
            }
            let _ = (e.kind(), e.to_string());
        }
    }
    match LeavePayload::parse(p) {
        Ok(l) => {
            assert_eq!(p.len(), LEAVE_PAYLOAD_LEN);
            let mut b = [0u8; LEAVE_PAYLOAD_LEN];
            assert_eq!(l.emit(&mut b), Ok(LEAVE_PAYLOAD_LEN));
            assert_eq!(&b[..], p);
            assert_eq!(LeavePayload::parse(&b), Ok(l));
            emit_bounds(LEAVE_PAYLOAD_LEN, |b| l.emit(b));
            let shown = format!("{l:?}");
            assert!(
                shown.contains("<redacted>"),
                "a LEAVE's MAC printed: {shown}"
            );
        }
        Err(e) => assert_ne!(p.len(), LEAVE_PAYLOAD_LEN, "LEAVE refused: {e}"),
    }
}

/// `peek_v1` on anything, and `emit_v1_refusal` with fields and a buffer
/// length taken from the input: no panic, and a refusal reads back.
fn version_1(data: &[u8]) {
    match peek_v1(data) {
        Some((ty, job, rank)) => {
            assert!(data.len() >= HEADER_LEN);
            assert_eq!(
                data[0] >> 4,
                1,
                "peek_v1 took a version {} header",
                data[0] >> 4
            );
            assert_eq!(ty, data[0] & 0x0f);
            assert_eq!(job, u16::from_be_bytes([data[2], data[3]]));
            assert_eq!(rank, u16::from_be_bytes([data[4], data[5]]));
        }
        None => assert!(data.len() < HEADER_LEN || data[0] >> 4 != 1),
    }
    let byte = |i: usize| data.get(i).copied().unwrap_or(0);
    let job = u16::from_be_bytes([byte(2), byte(3)]);
    let rank = u16::from_be_bytes([byte(4), byte(5)]);
    let len = data.len() % 64;
    let mut b = vec![0xeeu8; len];
    let want = HEADER_LEN + V1_NACK_PAYLOAD_LEN;
    match emit_v1_refusal(job, rank, &mut b) {
        Ok(n) => {
            assert_eq!(n, want);
            assert!(len >= want);
            assert_eq!(peek_v1(&b[..n]), Some((MsgType::Nack as u8, job, rank)));
            assert_eq!(
                &b[HEADER_LEN..n],
                &(NackReason::Malformed as u16).to_be_bytes()
            );
            assert!(b[n..].iter().all(|&x| x == 0xee), "wrote past the refusal");
            // Not a version-2 message.
            let h = Header::new_checked(&b[..n]).unwrap();
            assert_eq!(HeaderRepr::parse(&h), Err(WireError::BadVersion(1)));
        }
        Err(_) => assert!(len < want, "refusal into {len} bytes failed"),
    }
}

/// A worker given a parsed CHALLENGE: an answer to its own HELLO (and its
/// address) is taken, and then it can write a JOIN that parses; anything
/// else is an error, never a panic.
fn challenge(hdr: &HeaderRepr, payload: &[u8]) {
    let c = ChallengePayload::parse(payload).unwrap();
    let params = JoinParams {
        job: hdr.job,
        rank: hdr.rank,
        n_workers: hdr.count.max(1),
        dtype: 0,
        op: 0,
        secret: [0x5a; 32],
        // Bound to the observed address on odd ports, unbound otherwise.
        ip: if c.observed_port % 2 == 1 {
            c.observed_ip
        } else {
            [0; 4]
        },
        port: c.observed_port,
        provision: None,
    };
    // Ours: the HELLO nonce it echoes.
    let mut hs = Handshake::new(params.clone(), c.hello_nonce);
    assert!(!hs.challenged());
    assert_eq!(hs.on_challenge(hdr, payload), Ok(()));
    assert!(hs.challenged());
    assert_eq!(hs.gen(), Some(hdr.gen));
    let mut b = [0u8; 128];
    let n = hs
        .emit_join(hdr.collective, hdr.seq, &mut b)
        .expect("JOIN after a CHALLENGE");
    let j = HeaderRepr::parse(&Header::new_checked(&b[..n]).unwrap()).expect("a JOIN that parses");
    assert_eq!(
        (j.msg_type, j.job, j.rank, j.gen),
        (MsgType::Join, hdr.job, hdr.rank, hdr.gen)
    );
    let jp = JoinPayload::parse(&b[HEADER_LEN..n]).unwrap();
    assert_eq!(jp.nonce, c.nonce);
    let n = hs.emit_leave(&mut b).expect("LEAVE after a CHALLENGE");
    assert!(HeaderRepr::parse(&Header::new_checked(&b[..n]).unwrap()).is_ok());
    // Not ours: another HELLO nonce.
    let mut other = c.hello_nonce;
    other[0] ^= 1;
    let mut hs = Handshake::new(params.clone(), other);
    assert_eq!(hs.on_challenge(hdr, payload), Err(ChallengeError::NotOurs));
    assert!(!hs.challenged());
    assert!(hs.emit_join(0, 0, &mut b).is_none());
    // Bound elsewhere: an address mismatch.
    let mut moved = params;
    moved.port = moved.port.wrapping_add(1);
    let mut hs = Handshake::new(moved, c.hello_nonce);
    let e = hs.on_challenge(hdr, payload).unwrap_err();
    assert!(matches!(e, ChallengeError::AddressMismatch { .. }), "{e:?}");
    let _ = e.to_string();
}
