//! Arbitrary bytes through the wire parser: `Header::new_checked`,
//! `HeaderRepr::parse`, and the JOIN / JOIN_ACK / NACK payload parsers.
//!
//! Asserts: nothing panics; a header that parses emits back (`emit_to`) to
//! the same 22 bytes; payloads that parse emit back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::wire::{
    emit_nack, parse_nack, read_f32s, write_f32s, Header, HeaderRepr, JoinAckPayload, JoinPayload,
    MsgType, HEADER_LEN, JOIN_ACK_PAYLOAD_LEN, JOIN_PAYLOAD_LEN, NACK_PAYLOAD_LEN,
};

fuzz_target!(|data: &[u8]| {
    // The payload parsers must also cope with any length on their own.
    payloads(data);

    let h = match Header::new_checked(data) {
        Ok(h) => h,
        Err(_) => {
            assert!(
                data.len() < HEADER_LEN,
                "new_checked refused a whole header"
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

    let Ok(repr) = HeaderRepr::parse(&h) else {
        return;
    };
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
        MsgType::Data | MsgType::Result => {
            assert!(repr.count > 0);
            assert_eq!(payload.len(), repr.count as usize * 4);
            let mut vals = vec![0f32; repr.count as usize];
            assert_eq!(read_f32s(payload, &mut vals), repr.count as usize);
            let mut out = vec![0u8; payload.len()];
            assert_eq!(write_f32s(&vals, &mut out), payload.len());
            assert_eq!(out, payload, "f32 payload does not round-trip bit for bit");
        }
        MsgType::Join => {
            assert!(JoinPayload::parse(payload).is_ok());
        }
        MsgType::JoinAck => {
            assert!(JoinAckPayload::parse(payload).is_ok());
        }
        MsgType::Nack => {
            assert_eq!(payload.len(), NACK_PAYLOAD_LEN);
        }
        MsgType::Leave | MsgType::Heartbeat => {}
    }
});

/// Runs every payload parser on `p`; what parses must emit back identically.
fn payloads(p: &[u8]) {
    if let Ok(j) = JoinPayload::parse(p) {
        assert_eq!(p.len(), JOIN_PAYLOAD_LEN);
        let mut b = [0u8; JOIN_PAYLOAD_LEN];
        assert_eq!(j.emit(&mut b), Ok(JOIN_PAYLOAD_LEN));
        assert_eq!(&b[..], p);
        let _ = format!("{j:?}");
    }
    if let Ok(a) = JoinAckPayload::parse(p) {
        assert_eq!(p.len(), JOIN_ACK_PAYLOAD_LEN);
        let mut b = [0u8; JOIN_ACK_PAYLOAD_LEN];
        assert_eq!(a.emit(&mut b), Ok(JOIN_ACK_PAYLOAD_LEN));
        assert_eq!(&b[..], p);
    }
    match parse_nack(p) {
        Ok(reason) => {
            let mut b = [0u8; NACK_PAYLOAD_LEN];
            assert_eq!(emit_nack(reason, &mut b), Ok(NACK_PAYLOAD_LEN));
            assert_eq!(&b[..], p);
            let _ = reason.to_string();
        }
        Err(e) => {
            let _ = (e.kind(), e.to_string());
        }
    }
}
