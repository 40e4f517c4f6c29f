//! AF_XDP sockets over xdpilone: one socket per (interface, queue), each with
//! its own UMEM, split into a receive half ([`XskRx`]) and a transmit half
//! ([`XskTx`]) that can live on different threads.
//!
//! Invariants:
//! * UMEM = `frame_count` frames of `frame_size` bytes in one page-aligned
//!   anonymous mmap, unmapped only after both halves (and so all rings and the
//!   socket) are gone. With `XskConfig::huge_pages` the mmap is of 2 MiB
//!   HugeTLB pages, its length rounded up to one, so that reading and
//!   writing frames spread over the UMEM takes a TLB entry per 2 MiB, not
//!   per frame. Without, the mapping is advised `MADV_HUGEPAGE` before
//!   its pages are touched, so that where transparent huge pages are on
//!   (`always` or `madvise`) it gets the same from the kernel's free
//!   memory, with nothing reserved. Frames stay at most one 4 KiB page either way: the kernel
//!   refuses larger UMEM chunks (checked on Linux 6.18), so a jumbo frame is
//!   still several buffers (multi-buffer below). Frames `[0, frame_count/2)` belong to RX (fill ring,
//!   kernel, RX ring, or inside one `recv_batch` call); frames
//!   `[frame_count/2, frame_count)` belong to TX (free list, queued, TX ring or
//!   completion ring). A frame is touched by user space only while it is owned
//!   by user space; the halves never touch each other's frames.
//! * The fill ring is as large as the RX frame set, so every received frame is
//!   recycled in the same `recv_batch` call: nothing leaks, the fill ring is
//!   kept full.
//! * Hot path (`recv_batch`, `send_with`, `flush`): no allocation (the free
//!   list and the queued-descriptor buffer are preallocated to their maximum),
//!   one batched ring operation per direction, and a syscall only to kick the
//!   kernel: when `needs_wakeup` says so, and in copy mode for TX (the kernel
//!   transmits copy-mode frames only inside `sendto`, at most 32 per call).
//! * RX frame data starts `XDP_PACKET_HEADROOM` (256 B) into its frame, so a
//!   received buffer is at most `frame_size - 256` bytes; TX frames are written
//!   from offset 0 of the frame.
//! * Multi-buffer (`XskConfig::multi_buffer`, bound with `XDP_USE_SG`): a
//!   packet larger than one buffer comes as several RX descriptors, all but
//!   the last with `XDP_PKT_CONTD`. [`Gather`] copies them into a buffer of
//!   [`MAX_PACKET`] bytes allocated once per socket and hands the caller one
//!   contiguous packet; a packet that does not fit is dropped and counted.
//!   A packet may span two `recv_batch` calls: the gather state lives in
//!   the socket. On TX, a packet is sent as descriptors chained with
//!   `XDP_PKT_CONTD`: a RESULT by [`XskTx::send_head_tail`], its headers
//!   written into the first frame and its payload copied once from where
//!   the job keeps it across as many frames as it needs; any other packet
//!   by `send_with`, written into a buffer of [`MAX_PACKET`] bytes and
//!   copied across. Without multi-buffer, one packet is one frame, written
//!   in place.

use std::ffi::CString;
use std::num::NonZeroU32;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use xdpilone::xdp::{XdpDesc, XdpStatisticsV2};
use xdpilone::{
    CompletionQueue, Errno, FillQueue, IfInfo, RingRx, RingTx, Socket, SocketConfig, Umem,
    UmemConfig, User,
};

/// Bytes the kernel reserves before RX data in each frame (XDP_PACKET_HEADROOM).
pub const RX_HEADROOM: usize = 256;

/// Largest packet (Ethernet frame without FCS) a multi-buffer socket
/// gathers or sends: a 9000-byte MTU frame with a VLAN tag fits.
pub const MAX_PACKET: usize = 9216;

/// Bytes of one HugeTLB page as switchd maps them (`MAP_HUGE_2MB`).
pub const HUGE_PAGE: usize = 2 << 20;

/// `bind` flag: accept packets in several buffers (linux/if_xdp.h
/// XDP_USE_SG; xdpilone has no name for it).
const XDP_USE_SG: u16 = 1 << 4;
/// Descriptor option: the packet continues in the next descriptor
/// (linux/if_xdp.h XDP_PKT_CONTD).
pub const XDP_PKT_CONTD: u32 = 1;

/// How long `open` retries a bind that fails with EBUSY (a previous socket on
/// the same queue is still being torn down).
const BIND_RETRY_FOR: Duration = Duration::from_secs(1);
const BIND_RETRY_STEP: Duration = Duration::from_millis(50);

/// Socket configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XskConfig {
    /// Frames in this socket's UMEM, half for RX, half for TX. Even, >= 4.
    pub frame_count: u32,
    /// Entries in the RX and TX rings. Power of two.
    pub ring_size: u32,
    /// Ask for zero-copy; falls back to copy mode (with a warning) if the
    /// driver cannot do it.
    pub zero_copy: bool,
    /// Bytes per frame: 2048 or 4096 (default).
    pub frame_size: u32,
    /// Map the UMEM on 2 MiB HugeTLB pages (`MAP_HUGETLB`); `open` fails
    /// with [`XskError::HugePages`] when too few are free.
    pub huge_pages: bool,
    /// Bind with `XDP_USE_SG` so that packets larger than one frame pass
    /// (jumbo frames); `open` fails with a clear error if the kernel or
    /// driver cannot.
    pub multi_buffer: bool,
}

impl Default for XskConfig {
    fn default() -> Self {
        XskConfig {
            frame_count: 4096,
            ring_size: 2048,
            zero_copy: false,
            frame_size: 4096,
            multi_buffer: false,
            huge_pages: false,
        }
    }
}

/// The mode the kernel bound the socket in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindMode {
    Copy,
    ZeroCopy,
}

impl std::fmt::Display for BindMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BindMode::Copy => "copy",
            BindMode::ZeroCopy => "zero-copy",
        })
    }
}

/// Errors from setting up an AF_XDP socket; each names the call and object.
#[derive(Debug, thiserror::Error)]
pub enum XskError {
    #[error("invalid AF_XDP socket configuration for {ifname} queue {queue}: {reason}")]
    Config {
        ifname: String,
        queue: u32,
        reason: String,
    },
    #[error("no such interface `{0}`")]
    NoSuchInterface(String),
    #[error("creating AF_XDP socket failed: kernel lacks AF_XDP (CONFIG_XDP_SOCKETS): {0}")]
    NoAfXdp(std::io::Error),
    #[error("creating AF_XDP socket for {ifname} failed: {source} (run as root)")]
    NotRoot {
        ifname: String,
        source: std::io::Error,
    },
    #[error("mapping {bytes} B of UMEM for {ifname} queue {queue} failed: {source}")]
    Alloc {
        ifname: String,
        queue: u32,
        bytes: usize,
        source: std::io::Error,
    },
    #[error("{call} for AF_XDP socket on {ifname} queue {queue} failed: {source}")]
    Setup {
        call: &'static str,
        ifname: String,
        queue: u32,
        source: std::io::Error,
    },
    #[error(
        "binding AF_XDP socket to {ifname} queue {queue} with XDP_USE_SG (multi-buffer, needed \
         for packets larger than one {frame_size}-byte frame) failed: {source}: the kernel \
         (copy mode needs Linux 6.6 or later) or the driver (zero-copy) lacks AF_XDP \
         multi-buffer; set the ports' MTU to 3500 or less"
    )]
    MultiBuffer {
        ifname: String,
        queue: u32,
        frame_size: u32,
        source: std::io::Error,
    },
    #[error(
        "mapping {bytes} B of UMEM on 2 MiB HugeTLB pages ({pages} pages) for {ifname} queue \
         {queue} failed: {source}"
    )]
    HugePages {
        ifname: String,
        queue: u32,
        bytes: usize,
        pages: usize,
        source: std::io::Error,
    },
    #[error("binding AF_XDP socket to {ifname} queue {queue} failed: {source} ({hint})")]
    Bind {
        ifname: String,
        queue: u32,
        source: std::io::Error,
        hint: String,
    },
}

fn io_err(e: Errno) -> std::io::Error {
    // xdpilone reports some errors as negative errno.
    std::io::Error::from_raw_os_error(e.get_raw().abs())
}

/// Page-aligned anonymous mapping holding a UMEM; unmapped on drop.
struct UmemArea {
    ptr: NonNull<u8>,
    /// Bytes of the UMEM (what is registered).
    len: usize,
    /// Bytes mapped: `len`, rounded up to [`HUGE_PAGE`] on HugeTLB pages.
    mapped: usize,
}

// SAFETY: the mapping is plain memory owned by this value; which thread may
// touch which frame is governed by the frame-ownership invariant in the
// module docs (RX frames only by `XskRx`, TX frames only by `XskTx`).
unsafe impl Send for UmemArea {}
// SAFETY: as above; `UmemArea` itself hands out no references.
unsafe impl Sync for UmemArea {}

/// HugeTLB pages a UMEM of `bytes` bytes takes.
pub fn huge_pages_for(bytes: usize) -> usize {
    bytes.div_ceil(HUGE_PAGE)
}

impl UmemArea {
    /// Maps `len` bytes, on 2 MiB HugeTLB pages if `huge` (ENOMEM when
    /// too few are free: the mmap reserves them), else advised to be on
    /// transparent huge pages; every page touched.
    fn new(len: usize, huge: bool) -> std::io::Result<Self> {
        // Without HugeTLB, transparent huge pages are asked for before the
        // pages are touched: no MAP_POPULATE then, populated after the
        // advice. Measured: docs/BENCHMARKS.md, "What was tried".
        let (mapped, flags) = if huge {
            (
                huge_pages_for(len) * HUGE_PAGE,
                libc::MAP_HUGETLB | libc::MAP_HUGE_2MB | libc::MAP_POPULATE,
            )
        } else {
            (len, 0)
        };
        // SAFETY: anonymous private mapping with no address hint: no existing
        // memory is affected. The result is checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        if !huge {
            // SAFETY: advice and population over exactly the mapping just
            // made; neither changes what it holds (zeros). The advice may
            // be refused (THP off): then 4 KiB pages, as before.
            unsafe {
                libc::madvise(p, mapped, libc::MADV_HUGEPAGE);
                // MADV_POPULATE_WRITE (Linux 5.14), else a write per page.
                if libc::madvise(p, mapped, libc::MADV_POPULATE_WRITE) != 0 {
                    for off in (0..mapped).step_by(4096) {
                        p.cast::<u8>().add(off).write_volatile(0);
                    }
                }
            }
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned NULL"))?;
        Ok(UmemArea { ptr, len, mapped })
    }

    fn as_slice_ptr(&self) -> NonNull<[u8]> {
        NonNull::slice_from_raw_parts(self.ptr, self.len)
    }

    /// Pointer to byte `offset`; the caller checked `offset + len <= self.len`.
    #[inline]
    fn at(&self, offset: u64) -> *mut u8 {
        debug_assert!((offset as usize) < self.len);
        self.ptr.as_ptr().wrapping_add(offset as usize)
    }
}

impl Drop for UmemArea {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping made in `new`; the last
        // owner is being dropped, after all rings and the socket (see field
        // order in `XskRx`/`XskTx`), so nothing refers to it anymore. The
        // kernel keeps its own pin on the pages until the socket is released.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
    }
}

/// What both halves share: the memory and names for logs.
struct Shared {
    ifname: String,
    queue: u32,
    mode: BindMode,
    // Last: dropped after everything else in this struct.
    area: UmemArea,
}

/// Frame layout arithmetic (pure; unit-tested).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    frame_size: u64,
    frame_count: u32,
    rx_frames: u32,
    tx_frames: u32,
    fill_size: u32,
    comp_size: u32,
    ring_size: u32,
}

impl Layout {
    fn new(cfg: &XskConfig) -> Result<Layout, String> {
        if cfg.frame_size != 2048 && cfg.frame_size != 4096 {
            return Err(format!(
                "frame_size {} must be 2048 or 4096",
                cfg.frame_size
            ));
        }
        if cfg.frame_count < 4 || !cfg.frame_count.is_multiple_of(2) {
            return Err(format!(
                "frame_count {} must be even and >= 4",
                cfg.frame_count
            ));
        }
        if cfg.frame_count > (1 << 20) {
            return Err(format!(
                "frame_count {} is larger than 2^20",
                cfg.frame_count
            ));
        }
        if !cfg.ring_size.is_power_of_two() || cfg.ring_size > (1 << 16) {
            return Err(format!(
                "ring_size {} must be a power of two <= 65536",
                cfg.ring_size
            ));
        }
        let rx_frames = cfg.frame_count / 2;
        let tx_frames = cfg.frame_count - rx_frames;
        Ok(Layout {
            frame_size: u64::from(cfg.frame_size),
            frame_count: cfg.frame_count,
            rx_frames,
            tx_frames,
            // Fill ring holds every RX frame, completion ring every TX frame:
            // recycling can then never find the ring full.
            fill_size: cfg.ring_size.max(rx_frames.next_power_of_two()),
            comp_size: cfg.ring_size.max(tx_frames.next_power_of_two()),
            ring_size: cfg.ring_size,
        })
    }

    fn bytes(&self) -> usize {
        (self.frame_size * u64::from(self.frame_count)) as usize
    }

    /// Byte range of the RX frames.
    fn rx_range(&self) -> (u64, u64) {
        (0, self.frame_size * u64::from(self.rx_frames))
    }

    /// Byte range of the TX frames.
    fn tx_range(&self) -> (u64, u64) {
        let lo = self.rx_range().1;
        (lo, lo + self.frame_size * u64::from(self.tx_frames))
    }

    /// Start of the frame that holds UMEM address `addr`.
    #[inline]
    fn frame_base(&self, addr: u64) -> u64 {
        addr & !(self.frame_size - 1)
    }

    /// Whether `[addr, addr+len)` lies inside one frame of `[lo, hi)`.
    #[inline]
    fn in_frame(&self, addr: u64, len: u64, lo: u64, hi: u64) -> bool {
        let base = self.frame_base(addr);
        addr >= lo && addr < hi && addr.saturating_add(len) <= base + self.frame_size
    }
}

/// Receive half: RX ring + fill ring.
pub struct XskRx {
    rx: RingRx,
    fill: FillQueue,
    user: User,
    layout: Layout,
    fill_kicks: u64,
    gather: Gather,
    // Last: the memory outlives the rings above.
    shared: Arc<Shared>,
}

/// Transmit half: TX ring + completion ring + the TX frame free list.
pub struct XskTx {
    tx: RingTx,
    comp: CompletionQueue,
    /// Free TX frames (UMEM offsets); capacity = all TX frames, never grows.
    free: Vec<u64>,
    /// Descriptors written by `send_with`, not yet in the TX ring;
    /// capacity = ring size, never grows.
    queued: Vec<XdpDesc>,
    /// Multi-buffer: where `send_with` has a packet written before it is
    /// copied across TX frames ([`MAX_PACKET`] bytes, allocated once).
    scatter: Option<Box<[u8]>>,
    /// Packets sent in more than one TX frame.
    tx_multi_buffer: u64,
    layout: Layout,
    kicks: u64,
    kick_errors: u64,
    last_kick_errno: i32,
    // Last: the memory outlives the rings above.
    shared: Arc<Shared>,
}

/// Counters a caller may export; cheap to read (no syscall except `kernel`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XskStats {
    /// Kernel statistics (drops for full RX ring, empty fill ring, invalid descriptors).
    pub rx_dropped: u64,
    pub rx_invalid_descs: u64,
    pub tx_invalid_descs: u64,
    pub rx_ring_full: u64,
    pub rx_fill_ring_empty_descs: u64,
    pub tx_ring_empty_descs: u64,
}

struct Built {
    fill: FillQueue,
    comp: CompletionQueue,
    user: User,
    rx: RingRx,
    tx: RingTx,
}

enum BuildError {
    Step(&'static str, Errno),
    Bind(Errno),
}

fn build(
    info: &IfInfo,
    area: &UmemArea,
    layout: &Layout,
    bind_flags: u16,
) -> Result<Built, BuildError> {
    let umem_cfg = UmemConfig {
        fill_size: layout.fill_size,
        complete_size: layout.comp_size,
        frame_size: layout.frame_size as u32,
        headroom: 0,
        flags: 0,
    };
    // SAFETY: `area` is a page-aligned mapping of at least `layout.bytes()`
    // bytes (checked by `UmemArea::new`'s mmap), and it is kept alive by the
    // `Shared` that outlives every ring and the socket built here.
    let umem = unsafe { Umem::new(umem_cfg, area.as_slice_ptr()) }
        .map_err(|e| BuildError::Step("registering UMEM (socket/XDP_UMEM_REG)", e))?;
    let sock =
        Socket::with_shared(info, &umem).map_err(|e| BuildError::Step("creating socket", e))?;
    let device = umem
        .fq_cq(&sock)
        .map_err(|e| BuildError::Step("setting up fill/completion rings", e))?;
    let ring = NonZeroU32::new(layout.ring_size);
    let user = umem
        .rx_tx(
            &sock,
            &SocketConfig {
                rx_size: ring,
                tx_size: ring,
                bind_flags,
            },
        )
        .map_err(|e| BuildError::Step("setting up RX/TX rings", e))?;
    let rx = user
        .map_rx()
        .map_err(|e| BuildError::Step("mapping RX ring", e))?;
    let tx = user
        .map_tx()
        .map_err(|e| BuildError::Step("mapping TX ring", e))?;
    umem.bind(&user).map_err(BuildError::Bind)?;
    let (fill, comp) = device.into_parts();
    // `umem` only holds another reference to the socket fd; the rings keep it open.
    drop(umem);
    Ok(Built {
        fill,
        comp,
        user,
        rx,
        tx,
    })
}

fn queue_count(ifname: &str) -> Option<usize> {
    let dir = std::fs::read_dir(format!("/sys/class/net/{ifname}/queues")).ok()?;
    Some(
        dir.filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
            .count(),
    )
}

/// Opens an AF_XDP socket bound to `ifname` queue `queue` with its own UMEM.
///
/// Binds in copy mode with `XDP_USE_NEED_WAKEUP` unless `cfg.zero_copy`; a
/// zero-copy bind that fails with EOPNOTSUPP falls back to copy mode. Retries
/// for ~1 s while the queue is busy (EBUSY). The fill ring is filled before
/// this returns. Register the socket in the XSKMAP (`SteeringProgram::register_socket`
/// with [`XskRx::fd`]) to start receiving.
pub fn open(ifname: &str, queue: u32, cfg: &XskConfig) -> Result<(XskRx, XskTx), XskError> {
    let layout = Layout::new(cfg).map_err(|reason| XskError::Config {
        ifname: ifname.to_string(),
        queue,
        reason,
    })?;
    let cname = CString::new(ifname).map_err(|_| XskError::NoSuchInterface(ifname.to_string()))?;
    let mut info = IfInfo::invalid();
    info.from_name(&cname)
        .map_err(|_| XskError::NoSuchInterface(ifname.to_string()))?;
    info.set_queue(queue);

    let area = UmemArea::new(layout.bytes(), cfg.huge_pages).map_err(|source| {
        let (ifname, bytes) = (ifname.to_string(), layout.bytes());
        if cfg.huge_pages {
            let pages = huge_pages_for(bytes);
            XskError::HugePages {
                ifname,
                queue,
                bytes,
                pages,
                source,
            }
        } else {
            XskError::Alloc {
                ifname,
                queue,
                bytes,
                source,
            }
        }
    })?;

    let mut mode = if cfg.zero_copy {
        BindMode::ZeroCopy
    } else {
        BindMode::Copy
    };
    let started = Instant::now();
    let built = loop {
        let sg = if cfg.multi_buffer { XDP_USE_SG } else { 0 };
        let flags = SocketConfig::XDP_BIND_NEED_WAKEUP
            | sg
            | match mode {
                BindMode::Copy => SocketConfig::XDP_BIND_COPY,
                BindMode::ZeroCopy => SocketConfig::XDP_BIND_ZEROCOPY,
            };
        match build(&info, &area, &layout, flags) {
            Ok(b) => break b,
            Err(BuildError::Step(call, e)) => {
                let code = e.get_raw().abs();
                return Err(match code {
                    libc::EAFNOSUPPORT => XskError::NoAfXdp(io_err(e)),
                    libc::EPERM | libc::EACCES => XskError::NotRoot {
                        ifname: ifname.to_string(),
                        source: io_err(e),
                    },
                    _ => XskError::Setup {
                        call,
                        ifname: ifname.to_string(),
                        queue,
                        source: io_err(e),
                    },
                });
            }
            Err(BuildError::Bind(e)) => {
                let code = e.get_raw().abs();
                if code == libc::EOPNOTSUPP && mode == BindMode::ZeroCopy {
                    tracing::warn!(
                        ifname,
                        queue,
                        "zero-copy AF_XDP not supported by the driver; falling back to copy mode"
                    );
                    mode = BindMode::Copy;
                    continue;
                }
                if code == libc::EBUSY && started.elapsed() < BIND_RETRY_FOR {
                    std::thread::sleep(BIND_RETRY_STEP);
                    continue;
                }
                if cfg.multi_buffer && matches!(code, libc::EINVAL | libc::EOPNOTSUPP) {
                    return Err(XskError::MultiBuffer {
                        ifname: ifname.to_string(),
                        queue,
                        frame_size: cfg.frame_size,
                        source: io_err(e),
                    });
                }
                let queues = queue_count(ifname).map_or_else(
                    || "queue count unknown".to_string(),
                    |n| format!("interface {ifname} has {n} queues"),
                );
                let hint = match code {
                    libc::EBUSY => format!("another AF_XDP socket is still bound to this queue after {BIND_RETRY_FOR:?}; {queues}"),
                    libc::EPERM => format!("run as root; {queues}"),
                    _ => queues,
                };
                return Err(XskError::Bind {
                    ifname: ifname.to_string(),
                    queue,
                    source: io_err(e),
                    hint,
                });
            }
        }
    };

    let shared = Arc::new(Shared {
        ifname: ifname.to_string(),
        queue,
        mode,
        area,
    });
    let Built {
        fill,
        comp,
        user,
        rx,
        tx,
    } = built;
    tracing::info!(
        ifname,
        queue,
        mode = %mode,
        multi_buffer = cfg.multi_buffer,
        huge_pages = cfg.huge_pages,
        frames = layout.frame_count,
        frame_size = layout.frame_size,
        ring = layout.ring_size,
        tx_needs_wakeup = tx.needs_wakeup(),
        "AF_XDP socket bound"
    );

    let mut rxh = XskRx {
        rx,
        fill,
        user,
        layout,
        fill_kicks: 0,
        gather: Gather::new(if cfg.multi_buffer { MAX_PACKET } else { 0 }),
        shared: shared.clone(),
    };
    // Give the kernel every RX frame.
    let (lo, _) = layout.rx_range();
    let mut w = rxh.fill.fill(layout.rx_frames);
    let n = w.insert((0..u64::from(layout.rx_frames)).map(|i| lo + i * layout.frame_size));
    w.commit();
    drop(w);
    debug_assert_eq!(n, layout.rx_frames);
    if rxh.fill.needs_wakeup() {
        rxh.fill.wake();
    }

    let (tlo, _) = layout.tx_range();
    let mut free = Vec::with_capacity(layout.tx_frames as usize);
    // Reverse so that `pop` hands out the lowest frame first.
    free.extend(
        (0..u64::from(layout.tx_frames))
            .rev()
            .map(|i| tlo + i * layout.frame_size),
    );
    let txh = XskTx {
        tx,
        comp,
        free,
        queued: Vec::with_capacity(layout.ring_size as usize),
        scatter: cfg
            .multi_buffer
            .then(|| vec![0u8; MAX_PACKET].into_boxed_slice()),
        tx_multi_buffer: 0,
        layout,
        kicks: 0,
        kick_errors: 0,
        last_kick_errno: 0,
        shared,
    };
    Ok((rxh, txh))
}

impl XskRx {
    /// The socket's fd, for the XSKMAP and for `poll`.
    pub fn fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }

    /// Copy or zero-copy.
    pub fn mode(&self) -> BindMode {
        self.shared.mode
    }

    pub fn ifname(&self) -> &str {
        &self.shared.ifname
    }

    pub fn queue(&self) -> u32 {
        self.shared.queue
    }

    /// Reads up to `max` received descriptors, calls `f(packet_bytes)` for
    /// each complete packet (a multi-buffer packet gathered into one slice,
    /// possibly finished by a later call), then recycles every descriptor's
    /// frame into the fill ring (one batched ring op each way), kicking only
    /// if `needs_wakeup`. Returns the number of descriptors received.
    pub fn recv_batch(&mut self, max: u32, mut f: impl FnMut(&[u8])) -> u32 {
        let XskRx {
            rx,
            fill,
            layout,
            shared,
            fill_kicks,
            gather,
            ..
        } = self;
        let layout = *layout;
        let (lo, hi) = layout.rx_range();
        let area = &shared.area;

        let mut reader = rx.receive(max);
        let got = reader.capacity();
        let mut n = 0;
        if got > 0 {
            let mut writer = fill.fill(got);
            // The fill ring holds all RX frames, so `room == got` in practice;
            // if it were ever short, the rest stays in the RX ring for next time.
            let room = writer.capacity();
            n = writer.insert(reader.by_ref().take(room as usize).map(|desc| {
                let (addr, len) = (desc.addr, u64::from(desc.len));
                if layout.in_frame(addr, len, lo, hi) {
                    // SAFETY: the kernel handed this frame to user space via
                    // the RX ring; it stays ours until it is put back in the
                    // fill ring below, after `f` returns. The range lies
                    // inside one RX frame of the live mapping (checked above),
                    // and the TX half never touches RX frames.
                    let bytes = unsafe { std::slice::from_raw_parts(area.at(addr), len as usize) };
                    let more = desc.options & XDP_PKT_CONTD != 0;
                    if !more && !gather.in_packet() {
                        f(bytes); // one buffer: read in place
                    } else if let GatherStep::Complete(n) = gather.push(bytes, more) {
                        f(gather.packet(n));
                    }
                } else {
                    debug_assert!(
                        false,
                        "kernel returned RX descriptor {addr:#x}+{len} outside the RX frames"
                    );
                }
                layout.frame_base(addr)
            }));
            reader.release();
            writer.commit();
        }
        drop(reader);
        if fill.needs_wakeup() {
            fill.wake();
            *fill_kicks += 1;
        }
        n
    }

    /// Received frames waiting in the RX ring (approximate).
    pub fn rx_ring_occupancy(&self) -> u32 {
        self.rx.available()
    }

    /// Waits until a frame is waiting or `timeout` passes (`None` = forever);
    /// returns whether the socket is readable. For idle waits, not the hot path.
    pub fn wait_readable(&self, timeout: Option<Duration>) -> std::io::Result<bool> {
        if self.rx.available() > 0 {
            return Ok(true);
        }
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is a valid pollfd for the duration of the call, count 1.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        match r {
            -1 => {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
            0 => Ok(false),
            _ => Ok(pfd.revents & libc::POLLIN != 0),
        }
    }

    /// Packets gathered from several descriptors, and packets dropped
    /// because they did not fit [`MAX_PACKET`] (or came on a socket bound
    /// without multi-buffer).
    pub fn gather_stats(&self) -> (u64, u64) {
        (self.gather.gathered, self.gather.dropped)
    }

    /// How often `recv_batch` had to kick the fill ring.
    pub fn fill_kicks(&self) -> u64 {
        self.fill_kicks
    }

    /// Kernel-side statistics of this socket (one getsockopt).
    pub fn stats(&self) -> std::io::Result<XskStats> {
        let s: XdpStatisticsV2 = self.user.statistics_v2().map_err(io_err)?;
        Ok(XskStats {
            rx_dropped: s.rx_dropped,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
            rx_ring_full: s.rx_ring_full,
            rx_fill_ring_empty_descs: s.rx_fill_ring_empty_descs,
            tx_ring_empty_descs: s.tx_ring_empty_descs,
        })
    }
}

impl XskTx {
    /// The socket's fd (same socket as the RX half).
    pub fn fd(&self) -> RawFd {
        self.tx.as_raw_fd()
    }

    pub fn mode(&self) -> BindMode {
        self.shared.mode
    }

    /// Bytes `send_with` offers per frame.
    pub fn frame_size(&self) -> usize {
        self.layout.frame_size as usize
    }

    /// Takes a free TX frame and lets `f` write a frame into it (the slice is
    /// the whole frame, starting at byte 0); `f` returns the length written,
    /// 0 cancels. Queued, not yet committed: call [`flush`](Self::flush).
    /// Returns false if there is no free frame or the TX ring is full (the
    /// caller counts a drop) and also when `f` cancelled.
    ///
    /// Multi-buffer: the slice is [`MAX_PACKET`] bytes of a scratch buffer,
    /// copied across as many TX frames as the packet needs.
    pub fn send_with(&mut self, f: impl FnOnce(&mut [u8]) -> usize) -> bool {
        if self.queued.len() == self.queued.capacity() {
            return false;
        }
        if self.scatter.is_some() {
            return self.send_scattered(f);
        }
        if self.free.is_empty() {
            self.reap();
        }
        let Some(addr) = self.free.pop() else {
            return false;
        };
        let size = self.layout.frame_size as usize;
        // SAFETY: `addr` came from the free list, so this TX frame is owned by
        // user space (not in the TX or completion ring) until it is queued
        // below; the frame lies inside the live mapping and no other slice to
        // it exists (RX half never touches TX frames).
        let frame = unsafe { std::slice::from_raw_parts_mut(self.shared.area.at(addr), size) };
        let len = f(frame);
        if len == 0 || len > size {
            debug_assert!(
                len <= size,
                "send_with closure returned {len} > frame size {size}"
            );
            self.free.push(addr);
            return false;
        }
        self.queued.push(XdpDesc {
            addr,
            len: len as u32,
            options: 0,
        });
        true
    }

    fn send_scattered(&mut self, f: impl FnOnce(&mut [u8]) -> usize) -> bool {
        // Taken out for the call (a move, no allocation) so that `reap` and
        // the free list can be used while it is read.
        let Some(mut buf) = self.scatter.take() else {
            return false;
        };
        let len = f(&mut buf);
        let sent = self.queue_scattered(&buf, len);
        self.scatter = Some(buf);
        sent
    }

    /// Copies `buf[..len]` across free TX frames and queues their chained
    /// descriptors; false (nothing queued) if frames or queue room lack.
    fn queue_scattered(&mut self, buf: &[u8], len: usize) -> bool {
        if len == 0 || len > buf.len() {
            debug_assert!(
                len <= buf.len(),
                "send_with closure returned {len} > {MAX_PACKET}"
            );
            return false;
        }
        if self.free.is_empty() {
            self.reap();
        }
        let Some(first) = self.free.pop() else {
            return false;
        };
        self.queue_chained(first, 0, [&buf[..len], &[]])
    }

    /// Sends one packet from its parts with no scratch copy: `f` writes
    /// the head (the link to aggregation headers) into a free TX frame and
    /// returns its length and the tail that follows it, in two pieces (a
    /// RESULT's payload, read where the job keeps it, and its token), or
    /// None to cancel. The tail is copied once, after the head and, on a
    /// multi-buffer socket, on into as many chained frames as it needs.
    /// False, with nothing queued, if frames or ring room lack, if the
    /// packet needs several frames on a socket without multi-buffer, or if
    /// `f` cancelled.
    pub fn send_head_tail<'t>(
        &mut self,
        f: impl FnOnce(&mut [u8]) -> Option<(usize, [&'t [u8]; 2])>,
    ) -> bool {
        if self.queued.len() == self.queued.capacity() {
            return false;
        }
        if self.free.is_empty() {
            self.reap();
        }
        let Some(first) = self.free.pop() else {
            return false;
        };
        let size = self.layout.frame_size as usize;
        // SAFETY: as in `send_with`: a free TX frame, owned by user space
        // until queued, inside the live mapping, with no other slice to it.
        let frame = unsafe { std::slice::from_raw_parts_mut(self.shared.area.at(first), size) };
        match f(frame).filter(|(head, _)| (1..=size).contains(head)) {
            Some((head, tail)) => self.queue_chained(first, head, tail),
            None => {
                self.free.push(first);
                false
            }
        }
    }

    /// Queues one packet: `head` bytes already in the free TX frame `first`,
    /// then `tail` (its two pieces one after the other), copied after the
    /// head and on across as many further free frames as it needs, chained
    /// with `XDP_PKT_CONTD` (several frames only on a multi-buffer socket).
    /// False, with `first` back on the free list and nothing queued, if
    /// frames or queue room lack.
    fn queue_chained(&mut self, first: u64, head: usize, tail: [&[u8]; 2]) -> bool {
        let size = self.layout.frame_size as usize;
        let len = head + tail[0].len() + tail[1].len();
        let frames = len.div_ceil(size);
        let mut room = (frames == 1 || self.scatter.is_some())
            && frames <= self.queued.capacity() - self.queued.len();
        if room && self.free.len() < frames - 1 {
            self.reap();
            room = self.free.len() >= frames - 1;
        }
        if !room {
            self.free.push(first);
            return false;
        }
        for (i, piece) in scatter_pieces(len, size).enumerate() {
            let addr = if i == 0 { Some(first) } else { self.free.pop() };
            let Some(addr) = addr else {
                return false; // checked above: cannot happen
            };
            // SAFETY: as in `send_with`: a free TX frame, owned by user space
            // until queued, inside the live mapping; `piece.len <= size`.
            let frame = unsafe { std::slice::from_raw_parts_mut(self.shared.area.at(addr), size) };
            let (at, part) = tail_part(&piece, head);
            copy_split(&mut frame[at..piece.len], tail, part.start);
            self.queued.push(XdpDesc {
                addr,
                len: piece.len as u32,
                options: piece.options,
            });
        }
        if frames > 1 {
            self.tx_multi_buffer += 1;
        }
        true
    }

    /// Packets sent in more than one TX frame.
    pub fn multi_buffer_sent(&self) -> u64 {
        self.tx_multi_buffer
    }

    /// Commits queued descriptors to the TX ring in one batch, kicks the
    /// kernel if it needs it (always in copy mode while frames are pending,
    /// else when `needs_wakeup`), and reaps the completion ring back into the
    /// free list. Descriptors that did not fit the TX ring stay queued.
    pub fn flush(&mut self) {
        if !self.queued.is_empty() {
            // A multi-buffer packet may be split over two commits: the
            // kernel keeps the part it has read until the rest comes. (The
            // ring's free count is refreshed only when it reads 0, so
            // waiting for room for a whole packet could wait forever.)
            let mut w = self.tx.transmit(self.queued.len() as u32);
            let n = w.insert(self.queued.iter().copied());
            w.commit();
            drop(w);
            if n as usize == self.queued.len() {
                self.queued.clear();
            } else {
                self.queued.drain(..n as usize);
            }
        }
        self.kick();
        self.reap();
    }

    fn kick(&mut self) {
        let copy = self.shared.mode == BindMode::Copy;
        // Copy mode transmits only inside sendto and at most 32 descriptors
        // per call, so keep kicking while it makes progress. Zero-copy drivers
        // transmit asynchronously: one kick when asked for.
        let mut pending = self.tx.pending();
        let max_kicks = if copy { pending / 32 + 2 } else { 1 };
        for _ in 0..max_kicks {
            if pending == 0 || !(copy || self.tx.needs_wakeup()) {
                return;
            }
            // SAFETY: plain sendto on our own socket fd with no buffer
            // (NULL/0) and no address; MSG_DONTWAIT never blocks.
            let r = unsafe {
                libc::sendto(
                    self.tx.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            self.kicks += 1;
            if r < 0 {
                let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                // EAGAIN: batch limit or completion ring full; EBUSY/ENOBUFS:
                // device busy. All transient: retry after reaping.
                if !matches!(errno, libc::EAGAIN | libc::EBUSY | libc::ENOBUFS) {
                    self.kick_errors += 1;
                    self.last_kick_errno = errno;
                    return;
                }
            }
            if !copy {
                return;
            }
            self.reap();
            let now = self.tx.pending();
            if now >= pending {
                return; // no progress; try again on the next flush
            }
            pending = now;
        }
    }

    /// Moves completed TX frames back to the free list (one ring op, no syscall).
    fn reap(&mut self) {
        let outstanding = (self.free.capacity() - self.free.len()) as u32;
        if outstanding == 0 {
            return;
        }
        let (lo, hi) = self.layout.tx_range();
        let layout = self.layout;
        let mut r = self.comp.complete(outstanding);
        while let Some(addr) = r.read() {
            let base = layout.frame_base(addr);
            if base >= lo && base < hi && self.free.len() < self.free.capacity() {
                self.free.push(base);
            } else {
                debug_assert!(false, "unexpected completion address {addr:#x}");
            }
        }
        r.release();
    }

    /// Descriptors queued or in the TX ring, not yet taken by the kernel.
    pub fn tx_ring_occupancy(&self) -> u32 {
        self.queued.len() as u32 + self.tx.pending()
    }

    /// TX frames ready for `send_with` (completions not yet reaped excluded).
    pub fn free_frames(&self) -> u32 {
        self.free.len() as u32
    }

    /// `sendto` kicks made, and those that failed with an unexpected errno
    /// (with the last such errno, 0 if none).
    pub fn kick_stats(&self) -> (u64, u64, i32) {
        (self.kicks, self.kick_errors, self.last_kick_errno)
    }
}

/// One TX descriptor of a packet written across frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    offset: usize,
    len: usize,
    options: u32,
}

/// How a packet of `len` bytes is split over frames of `frame_size` bytes:
/// full frames, the rest in the last, every piece but the last marked
/// `XDP_PKT_CONTD`.
fn scatter_pieces(len: usize, frame_size: usize) -> impl Iterator<Item = Piece> {
    (0..len).step_by(frame_size).map(move |offset| {
        let piece = frame_size.min(len - offset);
        Piece {
            offset,
            len: piece,
            options: if offset + piece < len {
                XDP_PKT_CONTD
            } else {
                0
            },
        }
    })
}

/// Where in a piece's frame the tail's bytes go and which of them: the
/// packet is a head of `head` bytes (already in the first frame) and then
/// the tail, split as [`scatter_pieces`] splits it.
fn tail_part(piece: &Piece, head: usize) -> (usize, std::ops::Range<usize>) {
    let start = piece.offset.max(head);
    (
        start - piece.offset,
        start - head..piece.offset + piece.len - head,
    )
}

/// Copies the bytes of `tail` (its two pieces one after the other) from
/// offset `from` into `dst`, as many as `dst` holds.
fn copy_split(dst: &mut [u8], tail: [&[u8]; 2], from: usize) {
    let [a, b] = tail;
    let n = dst.len();
    let in_a = a.len().saturating_sub(from).min(n);
    if in_a > 0 {
        dst[..in_a].copy_from_slice(&a[from..from + in_a]);
    }
    let b_from = from.saturating_sub(a.len());
    let rest = n - in_a;
    dst[in_a..].copy_from_slice(&b[b_from..b_from + rest]);
}

/// What [`Gather::push`] made of one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GatherStep {
    /// More buffers of this packet follow.
    Incomplete,
    /// The packet is complete: its first `n` bytes are in [`Gather::packet`].
    Complete(usize),
    /// The packet's last buffer came but the packet did not fit: dropped.
    Dropped,
}

/// Reassembles a packet the kernel split over several RX descriptors into
/// one buffer allocated once; counts gathered and dropped packets.
struct Gather {
    buf: Box<[u8]>,
    len: usize,
    /// A buffer of the current packet came that did not fit: skip its rest.
    overflow: bool,
    active: bool,
    gathered: u64,
    dropped: u64,
}

impl Gather {
    fn new(capacity: usize) -> Gather {
        Gather {
            buf: vec![0u8; capacity].into_boxed_slice(),
            len: 0,
            overflow: false,
            active: false,
            gathered: 0,
            dropped: 0,
        }
    }

    /// Whether earlier buffers of an unfinished packet are held.
    #[inline]
    fn in_packet(&self) -> bool {
        self.active
    }

    /// Adds one buffer; `more` is its `XDP_PKT_CONTD`.
    fn push(&mut self, bytes: &[u8], more: bool) -> GatherStep {
        self.active = more;
        if !self.overflow {
            match self.buf.get_mut(self.len..self.len + bytes.len()) {
                Some(dst) => {
                    dst.copy_from_slice(bytes);
                    self.len += bytes.len();
                }
                None => self.overflow = true,
            }
        }
        if more {
            return GatherStep::Incomplete;
        }
        let n = std::mem::take(&mut self.len);
        if std::mem::take(&mut self.overflow) {
            self.dropped += 1;
            GatherStep::Dropped
        } else {
            self.gathered += 1;
            GatherStep::Complete(n)
        }
    }

    /// The packet `push` reported complete with `n` bytes.
    fn packet(&self, n: usize) -> &[u8] {
        &self.buf[..n]
    }
}

impl std::fmt::Debug for XskRx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskRx")
            .field("ifname", &self.shared.ifname)
            .field("queue", &self.shared.queue)
            .field("mode", &self.shared.mode)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for XskTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskTx")
            .field("ifname", &self.shared.ifname)
            .field("queue", &self.shared.queue)
            .field("mode", &self.shared.mode)
            .field("free", &self.free.len())
            .field("queued", &self.queued.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes of one RX buffer with 4 KiB frames.
    const RX_FRAME: usize = 4096 - RX_HEADROOM;

    /// The `/proc/self/smaps` block of the mapping that holds `addr`.
    fn smaps_of(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut block = String::new();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'));
            let header = range.and_then(|(a, b)| {
                Some((
                    usize::from_str_radix(a, 16).ok()?,
                    usize::from_str_radix(b, 16).ok()?,
                ))
            });
            if let Some((start, end)) = header {
                if inside {
                    break;
                }
                inside = (start..end).contains(&addr);
            }
            if inside {
                block.push_str(line);
                block.push('\n');
            }
        }
        block
    }

    /// A UMEM off HugeTLB is advised onto transparent huge pages before
    /// it is touched (the mapping's `hg` flag: deterministic, where the
    /// huge pages the kernel then gives depend on its free memory), and is
    /// populated: every page resident.
    #[test]
    fn a_umem_off_hugetlb_asks_for_transparent_huge_pages_and_is_populated() {
        let len = 16 << 20;
        let area = UmemArea::new(len, false).unwrap();
        let block = smaps_of(area.ptr.as_ptr() as usize);
        let flags = block
            .lines()
            .find_map(|l| l.strip_prefix("VmFlags:"))
            .unwrap_or_else(|| panic!("no VmFlags for the UMEM:\n{block}"));
        assert!(
            flags.split_whitespace().any(|f| f == "hg"),
            "UMEM not advised MADV_HUGEPAGE: {flags}"
        );
        let kb = |key: &str| -> usize {
            block
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        assert!(kb("Rss:") >= len / 1024, "not populated:\n{block}");
        eprintln!(
            "UMEM of 16 MiB: {} kB on transparent huge pages",
            kb("AnonHugePages:")
        );
    }

    #[test]
    fn default_layout() {
        let l = Layout::new(&XskConfig::default()).unwrap();
        assert_eq!(l.rx_frames, 2048);
        assert_eq!(l.tx_frames, 2048);
        assert_eq!(l.fill_size, 2048);
        assert_eq!(l.comp_size, 2048);
        assert_eq!(l.rx_range(), (0, 2048 * 4096));
        assert_eq!(l.tx_range(), (2048 * 4096, 4096 * 4096));
        assert_eq!(l.bytes(), 4096 * 4096);
    }

    #[test]
    fn fill_ring_covers_all_rx_frames() {
        let cfg = XskConfig {
            frame_count: 6000,
            ring_size: 512,
            ..Default::default()
        };
        let l = Layout::new(&cfg).unwrap();
        assert_eq!(l.rx_frames, 3000);
        assert_eq!(l.fill_size, 4096);
        assert_eq!(l.comp_size, 4096);
        assert_eq!(l.ring_size, 512);
    }

    #[test]
    fn rejects_bad_configs() {
        for cfg in [
            XskConfig {
                frame_size: 1000,
                ..Default::default()
            },
            XskConfig {
                frame_count: 3,
                ..Default::default()
            },
            XskConfig {
                frame_count: 7,
                ..Default::default()
            },
            XskConfig {
                ring_size: 1000,
                ..Default::default()
            },
            XskConfig {
                ring_size: 0,
                ..Default::default()
            },
        ] {
            assert!(Layout::new(&cfg).is_err(), "{cfg:?}");
        }
    }

    #[test]
    fn frame_arithmetic() {
        let l = Layout::new(&XskConfig {
            frame_size: 2048,
            frame_count: 8,
            ..Default::default()
        })
        .unwrap();
        let (lo, hi) = l.rx_range();
        assert_eq!((lo, hi), (0, 4 * 2048));
        assert_eq!(l.frame_base(2048 + 256), 2048);
        assert!(l.in_frame(2048 + 256, 2048 - 256, lo, hi));
        assert!(
            !l.in_frame(2048 + 256, 2048 - 255, lo, hi),
            "crosses into next frame"
        );
        assert!(!l.in_frame(hi, 10, lo, hi), "outside RX half");
        let (tlo, thi) = l.tx_range();
        assert_eq!((tlo, thi), (4 * 2048, 8 * 2048));
    }

    #[test]
    fn scatter_splits_into_full_frames_chained_with_contd() {
        let p: Vec<Piece> = scatter_pieces(9012, 4096).collect();
        assert_eq!(
            p,
            [
                Piece {
                    offset: 0,
                    len: 4096,
                    options: XDP_PKT_CONTD
                },
                Piece {
                    offset: 4096,
                    len: 4096,
                    options: XDP_PKT_CONTD
                },
                Piece {
                    offset: 8192,
                    len: 820,
                    options: 0
                },
            ]
        );
        let one: Vec<Piece> = scatter_pieces(4096, 4096).collect();
        assert_eq!(
            one,
            [Piece {
                offset: 0,
                len: 4096,
                options: 0
            }]
        );
        let small: Vec<Piece> = scatter_pieces(60, 4096).collect();
        assert_eq!(
            small,
            [Piece {
                offset: 0,
                len: 60,
                options: 0
            }]
        );
    }

    #[test]
    fn a_head_and_tail_fill_the_frames_in_order_without_gaps() {
        // A 9012-byte RESULT: 64 bytes of headers, 8948 of payload.
        let parts: Vec<_> = scatter_pieces(64 + 8948, 4096)
            .map(|p| tail_part(&p, 64))
            .collect();
        assert_eq!(parts, [(64, 0..4032), (0, 4032..8128), (0, 8128..8948)]);
        // One frame: the tail right after the head.
        let one: Vec<_> = scatter_pieces(64 + 100, 4096)
            .map(|p| tail_part(&p, 64))
            .collect();
        assert_eq!(one, [(64, 0..100)]);
        // Nothing but a head.
        let bare: Vec<_> = scatter_pieces(64, 4096)
            .map(|p| tail_part(&p, 64))
            .collect();
        assert_eq!(bare, [(64, 0..0)]);
    }

    /// A head, then a tail in two pieces (a RESULT's payload and its
    /// token), laid across chained frames as the transmit path does: the
    /// frames hold exactly head ‖ payload ‖ token, the token split across a
    /// frame boundary too.
    #[test]
    fn a_tail_in_two_pieces_fills_the_frames_as_one() {
        for (payload_len, size) in [(8932usize, 4096usize), (100, 4096), (4032 - 8, 4096)] {
            let head = 64;
            let payload: Vec<u8> = (0..payload_len).map(|i| (i % 251) as u8).collect();
            let token = [0xa5u8; 16];
            let mut want = vec![0xeeu8; head];
            want.extend_from_slice(&payload);
            want.extend_from_slice(&token);
            let mut got = Vec::new();
            for piece in scatter_pieces(want.len(), size) {
                let mut frame = vec![0u8; piece.len];
                if piece.offset == 0 {
                    frame[..head].fill(0xee);
                }
                let (at, part) = tail_part(&piece, head);
                copy_split(&mut frame[at..piece.len], [&payload, &token], part.start);
                got.extend_from_slice(&frame);
            }
            assert_eq!(got, want, "payload {payload_len}");
        }
    }

    /// A packet split like `scatter_pieces` splits it comes back whole and
    /// unchanged, also across pushes of two recv batches.
    #[test]
    fn gather_reassembles_what_scatter_split() {
        let packet: Vec<u8> = (0..9012u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut g = Gather::new(MAX_PACKET);
        let mut out = None;
        for p in scatter_pieces(packet.len(), RX_FRAME) {
            let more = p.options & XDP_PKT_CONTD != 0;
            assert!(out.is_none(), "completed before the last buffer");
            match g.push(&packet[p.offset..p.offset + p.len], more) {
                GatherStep::Incomplete => assert!(more && g.in_packet()),
                GatherStep::Complete(n) => out = Some(g.packet(n).to_vec()),
                GatherStep::Dropped => panic!("dropped a packet that fits"),
            }
        }
        assert_eq!(out.as_deref(), Some(&packet[..]));
        assert!(!g.in_packet());
        assert_eq!(g.gathered, 1);
        // The next packet starts from an empty buffer.
        assert_eq!(g.push(&[1, 2], true), GatherStep::Incomplete);
        assert_eq!(g.push(&[3], false), GatherStep::Complete(3));
        assert_eq!(g.packet(3), &[1, 2, 3]);
    }

    #[test]
    fn gather_drops_a_packet_that_does_not_fit_and_recovers() {
        let mut g = Gather::new(MAX_PACKET);
        let buf = [0xabu8; RX_FRAME];
        // Three full RX buffers fit (3 × 3840 > 9216 does not).
        assert_eq!(g.push(&buf, true), GatherStep::Incomplete);
        assert_eq!(g.push(&buf, true), GatherStep::Incomplete);
        assert_eq!(g.push(&buf, true), GatherStep::Incomplete);
        assert_eq!(g.push(&buf, false), GatherStep::Dropped);
        assert_eq!((g.gathered, g.dropped), (0, 1));
        assert!(!g.in_packet());
        assert_eq!(g.push(&[9; 10], true), GatherStep::Incomplete);
        assert_eq!(g.push(&[8; 5], false), GatherStep::Complete(15));
        assert_eq!(&g.packet(15)[9..11], &[9, 8]);
        assert_eq!((g.gathered, g.dropped), (1, 1));
        // A socket without multi-buffer has no room: every split packet drops.
        let mut none = Gather::new(0);
        assert_eq!(none.push(&[1], true), GatherStep::Incomplete);
        assert_eq!(none.push(&[1], false), GatherStep::Dropped);
        assert_eq!(none.dropped, 1);
    }

    #[test]
    fn a_umem_takes_whole_huge_pages() {
        assert_eq!(huge_pages_for(4096 * 4096), 8);
        assert_eq!(huge_pages_for(HUGE_PAGE + 1), 2);
        assert_eq!(huge_pages_for(64 * 2048), 1);
    }

    #[test]
    fn halves_are_send() {
        fn send<T: Send>() {}
        send::<XskRx>();
        send::<XskTx>();
    }

    #[test]
    fn bind_error_names_call_and_object() {
        let e = XskError::Bind {
            ifname: "sw-w0".into(),
            queue: 3,
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
            hint: "interface sw-w0 has 1 queues".into(),
        };
        let m = e.to_string();
        assert!(
            m.starts_with("binding AF_XDP socket to sw-w0 queue 3 failed"),
            "{m}"
        );
        assert!(m.contains("has 1 queues"), "{m}");
    }

    #[test]
    fn multi_buffer_error_says_what_the_kernel_lacks_and_what_to_do() {
        let e = XskError::MultiBuffer {
            ifname: "sw-w0".into(),
            queue: 0,
            frame_size: 4096,
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        };
        let m = e.to_string();
        for want in ["sw-w0 queue 0", "XDP_USE_SG", "4096", "6.6", "MTU to 3500"] {
            assert!(m.contains(want), "{want} missing from: {m}");
        }
    }
}
