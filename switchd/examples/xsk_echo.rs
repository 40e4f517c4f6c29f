//! xsk_echo: end-to-end demo and test of the XDP steering program plus one
//! AF_XDP socket. Loads the program, attaches it to `--iface` as port 0,
//! opens one socket on `--queue` (default 0) and echoes every steered UDP
//! frame back (MACs, IPs and UDP ports swapped, UDP checksum 0). Everything
//! else (ping, other ports) still reaches the kernel stack.
//!
//! Idle waits use poll(); SIGINT/SIGTERM stop the loop and detach cleanly.
//!
//!     xsk_echo --iface xt-sw0 --addr 198.18.99.1 --port 4791

use std::io::IsTerminal;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use switchd::xdp::{self, AttachMode, SteeringProgram, XskConfig};

#[derive(Parser, Debug)]
#[command(about = "Echo aggregation-port UDP frames through AF_XDP")]
struct Args {
    /// Interface to attach to.
    #[arg(long)]
    iface: String,
    /// The switch's own IPv4 address (frames to it on --port are steered).
    #[arg(long)]
    addr: Ipv4Addr,
    /// Aggregation UDP port.
    #[arg(long)]
    port: u16,
    /// Receive queue to bind the socket to.
    #[arg(long, default_value_t = 0)]
    queue: u32,
    /// XDP attach mode: auto, driver or skb.
    #[arg(long, default_value = "auto")]
    mode: String,
    /// Ask for zero-copy (falls back to copy mode if unsupported).
    #[arg(long)]
    zero_copy: bool,
    /// Exit after this many seconds (0 = run until SIGINT/SIGTERM).
    #[arg(long, default_value_t = 0)]
    seconds: u64,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn install_signal_handlers() -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is a valid starting point; the handler
        // only stores to an atomic, which is async-signal-safe. No SA_RESTART,
        // so a blocking poll() returns EINTR and the loop sees STOP promptly.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

const ETH_HLEN: usize = 14;
const IP_HLEN: usize = 20;
const UDP_HLEN: usize = 8;

/// Writes the echo of `frame` into `out`: MACs, IPv4 addresses and UDP ports
/// swapped, UDP checksum 0. Returns the length, or 0 (cancel) if `frame` is
/// not Ethernet/IPv4 (IHL 5)/UDP or does not fit. Swapping the addresses
/// leaves the IPv4 header checksum valid, so it is kept.
fn echo_frame(frame: &[u8], out: &mut [u8]) -> usize {
    let len = frame.len();
    if len < ETH_HLEN + IP_HLEN + UDP_HLEN || len > out.len() {
        return 0;
    }
    if frame[12..14] != [0x08, 0x00] || frame[ETH_HLEN] != 0x45 || frame[ETH_HLEN + 9] != 17 {
        return 0;
    }
    let out = &mut out[..len];
    out.copy_from_slice(frame);
    // Ethernet: dst <-> src.
    out[0..6].copy_from_slice(&frame[6..12]);
    out[6..12].copy_from_slice(&frame[0..6]);
    // IPv4: src (12..16) <-> dst (16..20).
    let ip = ETH_HLEN;
    out[ip + 12..ip + 16].copy_from_slice(&frame[ip + 16..ip + 20]);
    out[ip + 16..ip + 20].copy_from_slice(&frame[ip + 12..ip + 16]);
    // UDP: ports swapped, checksum 0 (allowed for IPv4).
    let udp = ip + IP_HLEN;
    out[udp..udp + 2].copy_from_slice(&frame[udp + 2..udp + 4]);
    out[udp + 2..udp + 4].copy_from_slice(&frame[udp..udp + 2]);
    out[udp + 6..udp + 8].copy_from_slice(&[0, 0]);
    len
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();
    let mode = match args.mode.as_str() {
        "auto" => AttachMode::Auto,
        "driver" => AttachMode::Driver,
        "skb" => AttachMode::Skb,
        other => anyhow::bail!("--mode must be auto, driver or skb, not `{other}`"),
    };
    install_signal_handlers().context("installing SIGINT/SIGTERM handlers")?;

    let port_idx = 0;
    let mut prog = SteeringProgram::load(&[args.addr], args.port)?;
    let cfg = XskConfig {
        zero_copy: args.zero_copy,
        ..XskConfig::default()
    };
    let (mut rx, mut tx) = xdp::xsk::open(&args.iface, args.queue, &cfg)?;
    // Register first, then attach: no aggregation frame slips to the stack.
    prog.register_socket(port_idx, args.queue, rx.fd())?;
    prog.attach(&args.iface, port_idx, mode)?;
    eprintln!(
        "xsk_echo: echoing UDP to {}:{} on {} queue {} ({} mode); Ctrl-C to stop",
        args.addr,
        args.port,
        args.iface,
        args.queue,
        rx.mode()
    );

    let deadline =
        (args.seconds > 0).then(|| std::time::Instant::now() + Duration::from_secs(args.seconds));
    let (mut echoed, mut dropped, mut received) = (0u64, 0u64, 0u64);
    while !STOP.load(Ordering::Relaxed) {
        let n = rx.recv_batch(64, |frame| {
            if tx.send_with(|buf| echo_frame(frame, buf)) {
                echoed += 1;
            } else {
                dropped += 1;
            }
        });
        received += u64::from(n);
        tx.flush();
        if n == 0 {
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                break;
            }
            // Idle: sleep in poll() until a frame arrives (or 100 ms pass, so
            // pending completions are reaped and the deadline is checked).
            rx.wait_readable(Some(Duration::from_millis(100)))
                .context("poll on AF_XDP socket")?;
        }
    }

    // Let the last echoes leave before the socket closes.
    for _ in 0..100 {
        tx.flush();
        if tx.tx_ring_occupancy() == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let c = prog.counters(port_idx)?;
    let stats = rx.stats().ok();
    let (kicks, kick_errors, last_errno) = tx.kick_stats();
    prog.detach_all()?;
    eprintln!(
        "xsk_echo: received {received}, echoed {echoed}, dropped {dropped}; \
         xdp steered {} passed {} malformed {}; tx kicks {kicks} (errors {kick_errors}, last errno {last_errno}); \
         fill kicks {}; socket stats {stats:?}",
        c.steered,
        c.passed,
        c.malformed,
        rx.fill_kicks()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const FRAME: [u8; 46] = [
        // eth: dst, src, type
        0x02, 0, 0, 0, 0, 0x01,  0x02, 0, 0, 0, 0, 0x02,  0x08, 0x00,
        // ipv4: ver/ihl, tos, len=32, id, frag, ttl, proto=17, csum, src, dst
        0x45, 0, 0, 32, 0, 1, 0x40, 0, 64, 17, 0xab, 0xcd,  198, 18, 99, 2,  198, 18, 99, 1,
        // udp: sport=5000, dport=4791, len=12, csum
        0x13, 0x88, 0x12, 0xb7, 0, 12, 0x55, 0x66,
        // payload
        b'p', b'i', b'n', b'g',
    ];

    #[test]
    fn echo_swaps_addresses_and_ports() {
        let mut out = [0u8; 4096];
        let n = echo_frame(&FRAME, &mut out);
        assert_eq!(n, FRAME.len());
        let e = &out[..n];
        assert_eq!(&e[0..6], &FRAME[6..12]);
        assert_eq!(&e[6..12], &FRAME[0..6]);
        assert_eq!(&e[26..30], &[198, 18, 99, 1]);
        assert_eq!(&e[30..34], &[198, 18, 99, 2]);
        assert_eq!(&e[34..36], &[0x12, 0xb7]);
        assert_eq!(&e[36..38], &[0x13, 0x88]);
        assert_eq!(&e[40..42], &[0, 0]);
        assert_eq!(
            &e[24..26],
            &[0xab, 0xcd],
            "IP checksum unchanged by the swap"
        );
        assert_eq!(&e[42..], b"ping");
    }

    #[test]
    fn echo_refuses_non_udp_and_short() {
        let mut out = [0u8; 4096];
        let mut tcp = FRAME;
        tcp[23] = 6;
        assert_eq!(echo_frame(&tcp, &mut out), 0);
        assert_eq!(echo_frame(&FRAME[..30], &mut out), 0);
        let mut small = [0u8; 10];
        assert_eq!(echo_frame(&FRAME, &mut small), 0);
    }
}
