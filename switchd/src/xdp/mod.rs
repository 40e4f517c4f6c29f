//! Kernel-facing I/O: the XDP steering program (`loader`, its errors in
//! `error`) and the AF_XDP sockets (`xsk`) the dataplane reads and writes.
//!
//! Order of operations the caller follows:
//! 1. [`SteeringProgram::load`] (root; fills own addresses and the port),
//! 2. [`xsk::open`] one socket per (interface, queue) and
//!    [`SteeringProgram::register_socket`] its fd at (port, queue),
//! 3. [`SteeringProgram::attach`] each interface as its port index (with
//!    the fast path on, this first writes the port's bridge facts into
//!    `port_info`, see [`bridge`]),
//! 4. with the fast path on, [`SteeringProgram::refresh_ports`] at least
//!    once a second for as long as the program runs.
//!
//! 2 and 3 may be swapped: until a socket is registered for a queue the
//! program passes that queue's aggregation frames to the stack (counted as
//! `passed`). Registering before attaching means no frame is ever passed.
//! Dropping the `SteeringProgram` detaches it; dropping both socket halves
//! closes the socket, which the kernel also removes from the XSKMAP.

pub mod bridge;
pub mod error;
pub mod loader;
pub mod maps;
pub mod xsk;

pub use bridge::{BridgeView, PORT_REFRESH_EVERY, REFUSAL_NAMES};
pub use error::XdpError;
pub use loader::{
    is_unicast_mac, local_macs, mac_key, parse_mac, xsk_slot, AttachMode, ProgramOptions,
    SteerCounters, SteeringProgram, MAX_PORTS, MAX_QUEUES,
};
pub use maps::FdbEntry;
pub use xsk::{
    huge_pages_for, open as open_xsk, BindMode, XskConfig, XskError, XskRx, XskStats, XskTx,
    HUGE_PAGE, RX_HEADROOM,
};
