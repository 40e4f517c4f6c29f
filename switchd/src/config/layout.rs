//! Warnings about a layout of dataplane threads, sockets, CPUs, NIC queues
//! and seq lanes that runs but wastes cores or loses traffic
//! ([`LayoutWarning`]); `switchd check-config` prints them and `switchd
//! run` logs them.
//!
//! Invariant: these never refuse a configuration (what cannot run is an
//! error of `Config::parse`); each warning names the fix.

use super::file::{Config, DataplaneMode};

/// A layout of dataplane threads, sockets, CPUs and NIC queues that runs but
/// wastes cores or loses traffic. `switchd check-config` prints these and
/// `switchd run` logs them; neither refuses the configuration (threads
/// beyond the sockets are already an error of [`Config::parse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutWarning {
    /// More dataplane threads than CPUs switchd may run on.
    ThreadsOverCores { threads: u32, cores: usize },
    /// The sockets (ports × queues) do not divide evenly among the threads.
    UnevenSockets {
        ports: usize,
        queues: u32,
        threads: u32,
    },
    /// `queues` asks for queues the port does not have.
    QueuesOverNic { port: String, queues: u32, nic: u32 },
    /// The port has receive queues without a socket.
    QueuesUnderNic { port: String, queues: u32, nic: u32 },
    /// Seq lanes that do not spread evenly over the dataplane threads, each
    /// lane on one thread (its ntuple rule steers lane l to queue l mod
    /// queues; queue q is thread q mod threads's when threads ≤ queues).
    LanesNotQueues {
        lanes: u16,
        queues: u32,
        threads: u32,
    },
}

impl std::fmt::Display for LayoutWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayoutWarning::ThreadsOverCores { threads, cores } => write!(
                f,
                "switch.dataplane_threads = {threads} but switchd may run on only {cores} CPUs \
                 here (its CPU affinity and cgroup quota): the threads share CPUs and each spins \
                 before it sleeps, so they slow one another down; set dataplane_threads to \
                 {cores} or fewer"
            ),
            LayoutWarning::UnevenSockets {
                ports,
                queues,
                threads,
            } => {
                let sockets = *ports as u32 * queues;
                let (base, extra) = (sockets / threads, sockets % threads);
                let divisor = (1..=*threads)
                    .rev()
                    .find(|t| sockets.is_multiple_of(*t))
                    .unwrap_or(1);
                // The smallest queue count at or above `queues` that deals
                // evenly (there is always one: queues = threads).
                let even_queues =
                    (*queues..=64).find(|q| (*ports as u32 * q).is_multiple_of(*threads));
                write!(
                    f,
                    "{sockets} AF_XDP sockets ({ports} ports × {queues} queues) dealt among \
                     {threads} dataplane threads: {extra} of them serve {} sockets and {} serve \
                     {base}, so under even traffic the busier ones limit the switch; set \
                     dataplane_threads = {divisor}",
                    base + 1,
                    threads - extra,
                )?;
                if let Some(q) = even_queues {
                    write!(f, ", or queues = {q} (and the NICs' queues to match)")?;
                }
                Ok(())
            }
            LayoutWarning::QueuesOverNic { port, queues, nic } => write!(
                f,
                "switch.queues = {queues} but {port} has {}: its AF_XDP socket for {} cannot \
                 bind and switchd does not start (or, where the NIC has more transmit queues, \
                 it receives nothing); give it {queues} queues (ethtool -L {port} combined \
                 {queues}) or set queues = {nic}",
                receive_queues(*nic),
                queue_range(*nic, queues - 1),
            ),
            LayoutWarning::QueuesUnderNic { port, queues, nic } => write!(
                f,
                "{port} has {} but switch.queues = {queues}: RSS hashes some workers' flows to \
                 its {}, which no AF_XDP socket serves, so the XDP program passes their frames \
                 to the kernel and they are never aggregated; set its queues to {queues} \
                 (ethtool -L {port} combined {queues}) or queues = {nic}",
                receive_queues(*nic),
                queue_range(*queues, nic - 1),
            ),
            LayoutWarning::LanesNotQueues {
                lanes,
                queues,
                threads,
            } => write!(
                f,
                "switch.seq_lanes = {lanes} with queues = {queues} and dataplane_threads = \
                 {threads}: the lanes do not spread evenly over the threads, one thread per \
                 lane (lane l's ntuple rule steers it to queue l mod queues, and thread t \
                 serves queues t, t + threads, … of every port only when threads ≤ queues), so \
                 a chunk's DATA reach more than one thread or some threads take no lane; set \
                 seq_lanes to a multiple of dataplane_threads, with dataplane_threads ≤ queues \
                 (more lanes than threads is fine: workers with several threads use them), or \
                 seq_lanes = 1"
            ),
        }
    }
}

/// Warnings about seq lanes (more than one) that do not spread evenly over
/// the dataplane threads: lane l's rule steers it to queue l mod queues,
/// served by thread (l mod queues) mod threads on every port when there
/// are no more threads than queues ([`crate::dataplane::deal`]), so the
/// lanes must be a multiple of the threads. Lanes are a placement: more
/// lanes than threads (or queues) is fine, and is what a worker with
/// several threads needs (docs/PROTOCOL.md, "Seq lanes").
pub fn lane_warnings(lanes: u16, queues: u32, threads: u32) -> Vec<LayoutWarning> {
    if lanes > 1 && (!u32::from(lanes).is_multiple_of(threads.max(1)) || threads > queues) {
        vec![LayoutWarning::LanesNotQueues {
            lanes,
            queues,
            threads,
        }]
    } else {
        Vec::new()
    }
}

fn receive_queues(n: u32) -> String {
    if n == 1 {
        "1 receive queue".into()
    } else {
        format!("{n} receive queues")
    }
}

/// "queue 3" or "queues 3..7".
fn queue_range(first: u32, last: u32) -> String {
    if first == last {
        format!("queue {first}")
    } else {
        format!("queues {first}..{last}")
    }
}

/// Warnings about threads, CPUs and sockets: more threads than `cores`
/// (None: unknown, no warning), or `ports × queues` sockets that the
/// threads cannot share evenly.
pub fn layout_warnings(
    cores: Option<usize>,
    ports: usize,
    queues: u32,
    threads: u32,
) -> Vec<LayoutWarning> {
    let mut w = Vec::new();
    if let Some(cores) = cores {
        if threads as usize > cores {
            w.push(LayoutWarning::ThreadsOverCores { threads, cores });
        }
    }
    let sockets = ports as u32 * queues;
    if threads > 0 && threads <= sockets && !sockets.is_multiple_of(threads) {
        w.push(LayoutWarning::UnevenSockets {
            ports,
            queues,
            threads,
        });
    }
    w
}

/// Warnings about each port whose receive queue count (`rx_queues_of`,
/// None: unknown, no warning) differs from `queues`.
pub fn nic_queue_warnings(
    ports: &[String],
    queues: u32,
    rx_queues_of: impl Fn(&str) -> Option<u32>,
) -> Vec<LayoutWarning> {
    ports
        .iter()
        .filter_map(|p| {
            let nic = rx_queues_of(p)?;
            let (port, queues) = (p.clone(), queues);
            match queues.cmp(&nic) {
                std::cmp::Ordering::Greater => {
                    Some(LayoutWarning::QueuesOverNic { port, queues, nic })
                }
                std::cmp::Ordering::Less => {
                    Some(LayoutWarning::QueuesUnderNic { port, queues, nic })
                }
                std::cmp::Ordering::Equal => None,
            }
        })
        .collect()
}

/// An interface's active receive queues: the `rx-N` entries of
/// `/sys/class/net/IF/queues` (what `ethtool -L` sets). None when the
/// interface is not in this network namespace.
pub fn sysfs_rx_queues(ifname: &str) -> Option<u32> {
    let dir = std::fs::read_dir(format!("/sys/class/net/{ifname}/queues")).ok()?;
    let n = dir
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        .count();
    (n > 0).then_some(n as u32)
}

impl Config {
    /// [`layout_warnings`] and [`nic_queue_warnings`] for this machine:
    /// its CPUs (`std::thread::available_parallelism`) and the ports'
    /// queues in sysfs. In xdp-drop mode there are no sockets to check.
    pub fn layout_warnings(&self) -> Vec<LayoutWarning> {
        let sw = &self.switch;
        let cores = std::thread::available_parallelism().ok().map(|n| n.get());
        if sw.mode == DataplaneMode::XdpDrop {
            return layout_warnings(cores, 1, 1, sw.dataplane_threads);
        }
        let mut w = layout_warnings(cores, sw.ports.len(), sw.queues, sw.dataplane_threads);
        w.extend(lane_warnings(sw.seq_lanes, sw.queues, sw.dataplane_threads));
        w.extend(nic_queue_warnings(&sw.ports, sw.queues, sysfs_rx_queues));
        w
    }
}
