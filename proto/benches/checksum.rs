//! What the Internet checksums cost the switch per packet, to weigh against
//! the per-packet engine cost (`data_packet/engine/E` in data_path.rs;
//! docs/BENCHMARKS.md, "Checksums").
//!
//! `checksum/verify_data/E`: the checks switchd makes on every DATA frame
//! of E float32 elements: the IPv4 header checksum (20 bytes) and the UDP
//! checksum over pseudo-header, UDP header, aggregation header and payload.
//! The datagram lies at the offset AF_XDP gives it (byte 64 of a 4096-byte
//! frame, the UDP header at 64 + 34).
//!
//! `checksum/result_payload/E`: summing one RESULT payload of E elements,
//! done once per chunk when the slot completes.
//!
//! `checksum/result_head`: the per-destination part of a RESULT's checksum:
//! pseudo-header, UDP header and aggregation header added to the payload's
//! sum, folded and complemented.
//!
//! Run: `cargo bench -p agg-proto --bench checksum` (add `-- --quick`).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use proto::checksum::{self, Sum};
use proto::wire::HEADER_LEN;

/// E values: 64, 256 and 362 (a 1500-byte MTU), 870 (3500), 2234 (9000).
const ELEMS: [usize; 5] = [64, 256, 362, 870, 2234];
/// Where AF_XDP puts a received frame's first byte in its buffer.
const HEADROOM: usize = 64;

/// A frame buffer holding an Ethernet/IPv4/UDP DATA frame of `elems`
/// floats with both checksums right; returns it and the frame's length.
fn data_frame(elems: usize) -> (Vec<u8>, usize) {
    let udp_len = 8 + HEADER_LEN + 4 * elems;
    let len = 14 + 20 + udp_len;
    let mut buf = vec![0u8; HEADROOM + len.next_multiple_of(4096)];
    let f = &mut buf[HEADROOM..HEADROOM + len];
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let (src, dst) = ([198, 18, 0, 10], [198, 18, 0, 1]);
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&dst);
    let c = Sum::ZERO.add_bytes(ip).checksum();
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let udp = &mut f[34..];
    udp[0..2].copy_from_slice(&40000u16.to_be_bytes());
    udp[2..4].copy_from_slice(&48879u16.to_be_bytes());
    udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    for (i, b) in udp[8..].iter_mut().enumerate() {
        *b = ((i * 2654435761usize) >> 7) as u8;
    }
    let c = checksum::udp_pseudo_header(src, dst, udp_len as u16)
        .add_bytes(udp)
        .udp_checksum();
    udp[6..8].copy_from_slice(&c.to_be_bytes());
    (buf, len)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("checksum");
    for elems in ELEMS {
        let (buf, len) = data_frame(elems);
        let f = &buf[HEADROOM..HEADROOM + len];
        assert!(checksum::ipv4_header_verifies(&f[14..34]));
        assert!(checksum::udp_verifies(
            [198, 18, 0, 10],
            [198, 18, 0, 1],
            &f[34..]
        ));
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new("verify_data", elems), &f, |b, f| {
            b.iter(|| {
                let f = black_box(*f);
                let ip = &f[14..34];
                let src = [ip[12], ip[13], ip[14], ip[15]];
                let dst = [ip[16], ip[17], ip[18], ip[19]];
                checksum::ipv4_header_verifies(ip) && checksum::udp_verifies(src, dst, &f[34..])
            })
        });
        let payload = &f[34 + 8 + HEADER_LEN..];
        g.bench_with_input(
            BenchmarkId::new("result_payload", elems),
            &payload,
            |b, p| b.iter(|| Sum::ZERO.add_bytes(black_box(*p)).fold()),
        );
    }
    let (buf, len) = data_frame(362);
    let udp = &buf[HEADROOM + 34..HEADROOM + len];
    let payload_sum = Sum::ZERO.add_bytes(&udp[8 + HEADER_LEN..]).fold();
    g.bench_function("result_head", |b| {
        b.iter(|| {
            let head = black_box(&udp[..8 + HEADER_LEN]);
            checksum::udp_pseudo_header(
                [198, 18, 0, 1],
                black_box([198, 18, 0, 10]),
                udp.len() as u16,
            )
            .add_bytes(head)
            .add_folded_at(black_box(payload_sum), 8 + HEADER_LEN)
            .udp_checksum()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
