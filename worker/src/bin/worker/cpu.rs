//! The CPU readings of `--machine-cpu` and `--switchd-pid`, in seconds:
//! the whole machine's busy time (/proc/stat) and a process's user +
//! system time (/proc/PID/stat).
//!
//! They are read at the start of the first timed collective and at the
//! end of the last, never in between; the parsers take the files' text so
//! that tests can feed them lines.

use anyhow::{Context, Result};

/// The machine's busy CPU time so far, in seconds summed over every CPU:
/// user, nice, system, irq, softirq and steal of /proc/stat's "cpu" line
/// (idle and iowait are not busy; guest time is already in user).
pub(crate) fn machine_busy_cpu_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    parse_machine_busy_ticks(&stat)
        .map(|ticks| ticks as f64 / USER_HZ)
        .context("/proc/stat has no well-formed \"cpu\" line")
}

/// This process's CPU time so far (user + system of every thread, from
/// /proc/self/stat), in seconds: the worker's own share of an all-reduce,
/// where the whole machine's also counts the switch and the kernel's other
/// work (docs/BENCHMARKS.md, "How CPU is counted").
pub(crate) fn process_cpu_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat")?;
    parse_process_ticks(&stat)
        .map(|ticks| ticks as f64 / USER_HZ)
        .context("/proc/self/stat has no utime and stime after the command")
}

/// Process `pid`'s CPU time so far (user + system of every thread, from
/// /proc/PID/stat), in seconds: `--switchd-pid`.
pub(crate) fn pid_cpu_seconds(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {path} (--switchd-pid: is process {pid} running?)"))?;
    parse_process_ticks(&stat)
        .map(|ticks| ticks as f64 / USER_HZ)
        .with_context(|| format!("{path} has no utime and stime after the command"))
}

fn parse_process_ticks(stat: &str) -> Option<u64> {
    // Fields after the command's closing parenthesis (it may hold spaces);
    // utime and stime are the 14th and 15th of the whole line.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// /proc/stat counts in USER_HZ ticks, which Linux fixes at 100 for user
/// space whatever the kernel's HZ.
const USER_HZ: f64 = 100.0;

fn parse_machine_busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    let at = |i: usize| f.get(i).copied();
    Some(at(0)? + at(1)? + at(2)? + at(5)? + at(6)? + at(7)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::allreduce_args;

    #[test]
    fn switchd_pid_needs_machine_cpu_and_reads_that_process() {
        assert_eq!(allreduce_args(&[]).unwrap().switchd_pid, None);
        let a = allreduce_args(&["--machine-cpu", "--switchd-pid", "42"]).unwrap();
        assert_eq!(a.switchd_pid, Some(42));
        let e = allreduce_args(&["--switchd-pid", "42"])
            .err()
            .expect("--switchd-pid without --machine-cpu is refused")
            .to_string();
        assert!(e.contains("--machine-cpu"), "{e}");
        assert!(allreduce_args(&["--machine-cpu", "--switchd-pid", "x"]).is_err());
        // This process stands in for switchd: its own CPU, read by PID.
        let own = pid_cpu_seconds(std::process::id()).unwrap();
        assert!(own >= 0.0 && own <= process_cpu_seconds().unwrap() + 1.0 / USER_HZ);
        let e = pid_cpu_seconds(u32::MAX).unwrap_err().to_string();
        assert!(
            e.contains(&format!("/proc/{}/stat", u32::MAX)) && e.contains("--switchd-pid"),
            "{e}"
        );
    }

    #[test]
    fn process_ticks_are_utime_plus_stime_whatever_the_command_name() {
        let stat = "4242 (worker (rank 1)) S 1 2 3 4 5 6 7 8 9 10 300 45 0 0 20 0 1 0 5 6 7";
        assert_eq!(parse_process_ticks(stat), Some(345));
        assert_eq!(parse_process_ticks("4242 (worker) S 1 2"), None);
        assert!(process_cpu_seconds().unwrap() >= 0.0);
    }

    #[test]
    fn machine_busy_ticks_leave_out_idle_and_iowait() {
        let stat = "cpu  10 2 30 4000 50 6 7 8 9 0\ncpu0 5 1 15 2000 25 3 3 4 0 0\nintr 1\n";
        assert_eq!(
            parse_machine_busy_ticks(stat),
            Some(10 + 2 + 30 + 6 + 7 + 8)
        );
        assert_eq!(parse_machine_busy_ticks("cpu0 1 2 3\n"), None);
        assert_eq!(parse_machine_busy_ticks("cpu  1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(parse_machine_busy_ticks("cpu  1 2 3 4 5\n"), None);
    }
}
