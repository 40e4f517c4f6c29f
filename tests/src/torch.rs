//! PyTorch ranks as processes in a testbed's worker namespaces (one switch,
//! or an aggregation tree's leaves), for the torch end-to-end tests
//! (`examples/train_ddp.py`, `train_fsdp.py`): the venv check, the torchrun
//! environment of each rank, and collecting the `--out` reports.
//!
//! Invariants: every rank process still running when its [`Ranks`] drops is
//! killed by PID (also when the test panics); a rank's stdout and stderr go
//! to files in a [`WorkDir`], kept on panic for the failure's diagnosis.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::{repo_root, unavailable, LeafSpine, Netns, Testbed, AGG_PORT, SECRET};

/// The venv python that has torch and `aggswitch.torch` (`AGG_PYTHON`,
/// else the repo's `.venv/bin/python`), or None after [`unavailable`].
pub fn venv_python(test: &str) -> Option<PathBuf> {
    let py = std::env::var_os("AGG_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/python"));
    if !py.exists() {
        unavailable(
            test,
            &format!(
                "needs the project venv's python at {} (run scripts/setup.sh, or set AGG_PYTHON)",
                py.display()
            ),
        );
        return None;
    }
    let out = Command::new(&py)
        .args(["-c", "import aggswitch.torch, sklearn"])
        .output()
        .expect("running the venv python");
    if !out.status.success() {
        unavailable(
            test,
            &format!(
                "`{} -c 'import aggswitch.torch, sklearn'` failed (run scripts/setup.sh, or \
                 build the package into the venv: maturin develop --release in python/):\n{}",
                py.display(),
                tail(&String::from_utf8_lossy(&out.stderr), 10)
            ),
        );
        return None;
    }
    Some(py)
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// A directory for the ranks' outputs; removed on drop unless panicking.
pub struct WorkDir(pub PathBuf);

impl WorkDir {
    pub fn new(prefix: &str) -> WorkDir {
        let d = std::env::temp_dir().join(format!("agg-torch-{prefix}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        WorkDir(d)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("rank outputs kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// One training run: `script ARGS --out DIR/TAG-rankI.json` on every rank.
pub struct Run {
    /// The script, relative to the repo root.
    pub script: &'static str,
    pub args: Vec<String>,
    pub world: u16,
    /// Ranks per worker namespace: rank r runs in worker r / this, whose
    /// eth0 address it shares with the namespace's other ranks.
    pub ranks_per_ns: u16,
    pub master_port: u16,
    /// Also a file-name tag, unique per run in a test.
    pub tag: String,
    /// Added to (and overriding) the ranks' environment; a variable given
    /// an empty value is removed instead (e.g. `AGGSWITCH_JOB` and
    /// `AGGSWITCH_SECRET` for a run that names its job by tenant).
    pub env: Vec<(&'static str, String)>,
}

/// Lines of stderr [`RankProc::tails`] shows for a rank that failed: a
/// Python traceback, or an abort's message with the thread stacks
/// `PYTHONFAULTHANDLER` adds after it.
const FAILED_STDERR_LINES: usize = 30;
/// Lines of stderr shown for a rank that did not fail (it often only says
/// that a peer went away).
const OTHER_STDERR_LINES: usize = 8;
/// Lines of stderr shown for a rank still running when a test gives up on
/// it: the end holds every thread's stack, printed on SIGUSR1 by
/// `faulthandler` (`Ranks::dump_stacks`), which says where it hung.
const RUNNING_STDERR_LINES: usize = 80;

/// One rank's process; its stdout and stderr go to files.
pub struct RankProc {
    pub rank: u16,
    child: Option<Child>,
    /// Python's PID (`ip netns exec` execs the program).
    pub pid: u32,
    stdout: PathBuf,
    stderr: PathBuf,
    out: PathBuf,
    pub status: Option<ExitStatus>,
}

impl RankProc {
    pub fn stdout_text(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }
    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
    /// Whether it has exited unsuccessfully (non-zero status or a signal).
    pub fn failed(&self) -> bool {
        self.status.is_some_and(|s| !s.success())
    }
    /// Its status, and the last lines of its stderr (where an error or an
    /// abort's message is; more of it when it failed) and stdout, for
    /// failure messages. Says when a failed rank had written its `--out`
    /// report: it died after training, on its way out.
    pub fn tails(&self) -> String {
        let status = self
            .status
            .map(|s| s.to_string())
            .unwrap_or_else(|| "running".into());
        let wrote = if self.failed() && self.out.exists() {
            "; it had written its --out report: it died after training, on its way out"
        } else {
            ""
        };
        let stderr_lines = match self.status {
            None => RUNNING_STDERR_LINES,
            Some(_) if self.failed() => FAILED_STDERR_LINES,
            Some(_) => OTHER_STDERR_LINES,
        };
        format!(
            "--- rank {} ({status}{wrote}) stderr tail:\n{}\n--- rank {} stdout tail:\n{}",
            self.rank,
            tail(&self.stderr_text(), stderr_lines),
            self.rank,
            tail(&self.stdout_text(), 5)
        )
    }
    /// The exit status, once it has exited (reaped here).
    pub fn poll(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(s)) = c.try_wait() {
                    self.status = Some(s);
                    self.child = None;
                }
            }
        }
        self.status
    }
    /// SIGKILL by PID and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            if let Ok(s) = c.wait() {
                self.status = Some(s);
            }
        }
    }
    /// The highest N of the "step N ..." lines it printed (rank 0 prints
    /// every 10th step and the last).
    pub fn last_step_printed(&self) -> Option<u64> {
        self.stdout_text()
            .lines()
            .filter_map(|l| l.strip_prefix("step "))
            .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
            .max()
    }
}

/// What a training script's `--out` holds (train_ddp.py and train_fsdp.py
/// write the same keys).
#[derive(Debug)]
pub struct Report {
    pub rank: u16,
    /// The full-dataset loss after training.
    pub loss: f64,
    /// sha256 of the full (gathered) parameters.
    pub digest: String,
    pub params: u64,
    pub step_ms_median: f64,
    /// The whole `--out` JSON (e.g. `path`: where the collectives ran, the
    /// state's counters; null for `--comm gloo`).
    pub json: serde_json::Value,
}

/// The ranks of one run; every process still running is killed (by PID) on
/// drop, also on panic.
pub struct Ranks {
    pub procs: Vec<RankProc>,
    pub started: Instant,
    world: u16,
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for p in &mut self.procs {
            p.kill();
        }
    }
}

impl Ranks {
    /// Starts every rank of `run` with the torchrun environment (RANK,
    /// LOCAL_RANK, WORLD_SIZE, MASTER_ADDR = worker 0, MASTER_PORT),
    /// `GLOO_SOCKET_IFNAME=eth0` (gloo otherwise binds the hostname's
    /// address, which is not in the testbed), one thread, `AGGSWITCH_*` for
    /// job 1 on the testbed's switch, and `PYTHONFAULTHANDLER=1`.
    pub fn spawn(tb: &Testbed, py: &Path, dir: &Path, run: &Run) -> Ranks {
        let switch = tb.switch_endpoint().to_string();
        Ranks::spawn_placed(dir, run, tb.worker_addr(0), |rank| {
            let cmd = tb.cmd_in(&tb.worker_ns(rank / run.ranks_per_ns), py);
            (cmd, vec![("AGGSWITCH_SWITCH", switch.clone())])
        })
    }

    /// As [`Ranks::spawn`], on an aggregation tree: rank r (one per worker
    /// namespace, leaf 0's first: r = i * W + k for worker k of leaf i, as
    /// the host path's tree order needs) joins its leaf's gateway as rank k
    /// of the leaf's W (`AGGSWITCH_RANK`, `AGGSWITCH_WORLD_SIZE`, read by
    /// `examples/train_ddp.py`), with `AGGSWITCH_TREE` the workers per leaf.
    pub fn spawn_tree(fabric: &LeafSpine, py: &Path, dir: &Path, run: &Run) -> Ranks {
        let wpl = fabric.workers_per_leaf;
        assert_eq!(
            run.ranks_per_ns, 1,
            "a tree's ranks: one per worker namespace"
        );
        assert_eq!(
            run.world,
            fabric.leaves * wpl,
            "a tree's ranks: every worker"
        );
        let tree = vec![wpl.to_string(); usize::from(fabric.leaves)].join(",");
        Ranks::spawn_placed(dir, run, fabric.worker_addr(0, 0), |rank| {
            let (i, k) = (rank / wpl, rank % wpl);
            let cmd = fabric.cmd_in(&fabric.worker_ns(i, k), py);
            let switch = SocketAddrV4::new(fabric.leaf_gateway(i), AGG_PORT);
            let env = vec![
                ("AGGSWITCH_SWITCH", switch.to_string()),
                ("AGGSWITCH_RANK", k.to_string()),
                ("AGGSWITCH_WORLD_SIZE", wpl.to_string()),
                ("AGGSWITCH_TREE", tree.clone()),
            ];
            (cmd, env)
        })
    }

    /// Starts every rank of `run`: `place(rank)` is the command (python in
    /// the rank's namespace) and the rank's own environment; the rest is
    /// what [`Ranks::spawn`] says, with MASTER_ADDR `master`.
    fn spawn_placed(
        dir: &Path,
        run: &Run,
        master: Ipv4Addr,
        place: impl Fn(u16) -> (Command, Vec<(&'static str, String)>),
    ) -> Ranks {
        let script = repo_root().join(run.script);
        let procs = (0..run.world)
            .map(|rank| {
                let f = |ext: &str| dir.join(format!("{}-rank{rank}.{ext}", run.tag));
                let (stdout, stderr, out) = (f("stdout"), f("stderr"), f("json"));
                let (mut cmd, env) = place(rank);
                cmd.arg(&script)
                    .args(&run.args)
                    .arg("--out")
                    .arg(&out)
                    .current_dir(repo_root())
                    .env("RANK", rank.to_string())
                    .env("LOCAL_RANK", (rank % run.ranks_per_ns).to_string())
                    .env("WORLD_SIZE", run.world.to_string())
                    .env("LOCAL_WORLD_SIZE", run.ranks_per_ns.to_string())
                    .env("MASTER_ADDR", master.to_string())
                    .env("MASTER_PORT", run.master_port.to_string())
                    .env("GLOO_SOCKET_IFNAME", "eth0")
                    .env("OMP_NUM_THREADS", "1")
                    .env("PYTHONUNBUFFERED", "1")
                    // A rank killed by a signal (SIGABRT, SIGSEGV) writes
                    // every thread's Python stack to stderr.
                    .env("PYTHONFAULTHANDLER", "1")
                    .env("AGGSWITCH_JOB", "1")
                    .env("AGGSWITCH_SECRET", SECRET)
                    .envs(env)
                    .envs(
                        run.env
                            .iter()
                            .filter(|(_, v)| !v.is_empty())
                            .map(|(k, v)| (k, v)),
                    )
                    .stdin(Stdio::null())
                    .stdout(std::fs::File::create(&stdout).unwrap())
                    .stderr(std::fs::File::create(&stderr).unwrap());
                for (k, _) in run.env.iter().filter(|(_, v)| v.is_empty()) {
                    cmd.env_remove(k);
                }
                let child = cmd
                    .spawn()
                    .unwrap_or_else(|e| panic!("starting {}: {e}", run.script));
                RankProc {
                    rank,
                    pid: child.id(),
                    child: Some(child),
                    stdout,
                    stderr,
                    out,
                    status: None,
                }
            })
            .collect();
        Ranks {
            procs,
            started: Instant::now(),
            world: run.world,
        }
    }

    /// Waits until rank 0 has printed "step `step`" (every rank joined and
    /// has run that many steps' collectives); panics when a rank exits
    /// first or after `limit`.
    pub fn wait_for_step(&mut self, step: u64, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.procs[0].last_step_printed().unwrap_or(0) < step {
            let exited: Vec<u16> = (self.procs.iter_mut())
                .filter_map(|p| p.poll().map(|_| p.rank))
                .collect();
            assert!(
                exited.is_empty(),
                "ranks {exited:?} exited before training got going\n{}",
                self.all_tails()
            );
            assert!(
                Instant::now() < deadline,
                "rank 0 did not reach step {step} in {} s\n{}",
                limit.as_secs(),
                self.all_tails()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the last rank (checking first that its PID is python running
    /// `script`: `ip netns exec` execs it), then waits up to `limit` for the
    /// others; each must exit non-zero with a `StalledError` that names the
    /// dead rank. Returns each survivor's seconds from the kill to its exit.
    pub fn kill_last_and_expect_stalls(&mut self, script: &str, limit: Duration) -> Vec<f64> {
        let last = self.procs.len() - 1;
        let victim = &mut self.procs[last];
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", victim.pid)).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            cmdline.contains(script),
            "PID {} is not rank {last}'s python but `{cmdline}`",
            victim.pid
        );
        victim.kill();
        let killed = Instant::now();
        assert_eq!(
            victim.status.and_then(|s| s.signal()),
            Some(libc::SIGKILL),
            "rank {last}: {:?}",
            victim.status
        );
        let mut exited_after = vec![None::<f64>; last];
        while exited_after.iter().any(Option::is_none) && killed.elapsed() < limit {
            for (i, p) in self.procs[..last].iter_mut().enumerate() {
                if exited_after[i].is_none() && p.poll().is_some() {
                    exited_after[i] = Some(killed.elapsed().as_secs_f64());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "rank {last} killed after rank 0 printed step {:?}; the others exited after {:?} s; \
             rank 0's error:\n{}",
            self.procs[0].last_step_printed(),
            exited_after,
            (self.procs[0].stderr_text().lines())
                .filter(|l| l.contains("Error"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        // The dead rank is among the ones the switch waits for. It may not
        // be alone: with the fallback on (the default) the ranks vote after
        // every collective, and a survivor that is still in the vote the
        // dead rank broke (each hears the dead rank's closed connection at
        // its own moment) has not sent the next collective's DATA yet.
        let names_dead = |err: &str| {
            err.split("waiting for ranks [").skip(1).any(|rest| {
                let list = rest.split(']').next().unwrap_or("");
                list.split(',').any(|r| r.trim() == last.to_string())
            })
        };
        self.dump_stacks(); // of any rank still running, for the assertion below
        for (i, p) in self.procs[..last].iter().enumerate() {
            assert!(
                exited_after[i].is_some(),
                "rank {i} still running {} s after rank {last} was killed (hung instead of \
                 failing)\n{}",
                limit.as_secs(),
                self.all_tails()
            );
            assert!(
                !p.status.is_some_and(|s| s.success()),
                "rank {i} exited 0 although rank {last} died\n{}",
                p.tails()
            );
            let err = p.stderr_text();
            for want in ["StalledError", "stalled"] {
                assert!(
                    err.contains(want),
                    "rank {i}'s stderr does not say `{want}`: the error does not name the \
                     problem\n{}",
                    p.tails()
                );
            }
            assert!(
                names_dead(&err),
                "rank {i}'s stderr does not say `waiting for ranks [...]` with the dead rank \
                 {last} among them: the error does not name the problem\n{}",
                p.tails()
            );
        }
        exited_after.into_iter().flatten().collect()
    }

    /// Asks every rank still running for its threads' stacks (SIGUSR1:
    /// the example scripts register `faulthandler` on it) and gives them a
    /// second to print, so a failure message shows where a rank hung.
    pub fn dump_stacks(&mut self) {
        let mut asked = false;
        for p in &mut self.procs {
            if p.poll().is_none() {
                // SAFETY: kill(2) on the PID of a child this harness started
                // and has not reaped (poll said it is running).
                unsafe { libc::kill(p.pid as libc::pid_t, libc::SIGUSR1) };
                asked = true;
            }
        }
        if asked {
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Every rank's [`RankProc::tails`], the failed ranks first.
    pub fn all_tails(&self) -> String {
        let (failed, others): (Vec<&RankProc>, Vec<&RankProc>) =
            self.procs.iter().partition(|p| p.failed());
        (failed.into_iter().chain(others))
            .map(RankProc::tails)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits up to `limit` for every rank; all must exit 0. Returns their
    /// reports and the wall time.
    pub fn finish(mut self, what: &str, limit: Duration) -> (Vec<Report>, f64) {
        let deadline = self.started + limit;
        loop {
            let mut running = 0;
            let mut failed = false;
            for p in &mut self.procs {
                match p.poll() {
                    None => running += 1,
                    Some(s) if !s.success() => failed = true,
                    Some(_) => {}
                }
            }
            if failed {
                // One rank failing leaves the others waiting for it: give
                // them a moment to report their side, then show everything.
                std::thread::sleep(Duration::from_secs(2));
                for p in &mut self.procs {
                    p.poll();
                }
                let failed: Vec<u16> = (self.procs.iter())
                    .filter(|p| p.failed())
                    .map(|p| p.rank)
                    .collect();
                panic!("{what}: ranks {failed:?} failed\n{}", self.all_tails());
            }
            if running == 0 {
                break;
            }
            if Instant::now() > deadline {
                self.dump_stacks();
                panic!(
                    "{what}: ranks still running after {} s (hung?)\n{}",
                    limit.as_secs(),
                    self.all_tails()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let wall = self.started.elapsed().as_secs_f64();
        let reports = self
            .procs
            .iter()
            .map(|p| {
                let text = std::fs::read_to_string(&p.out).unwrap_or_else(|e| {
                    panic!(
                        "{what}: rank {} exited 0 but wrote no {}: {e}\n{}",
                        p.rank,
                        p.out.display(),
                        p.tails()
                    )
                });
                let v: serde_json::Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{what}: rank {}: bad JSON ({e}): {text}", p.rank));
                assert_eq!(v["rank"], p.rank, "{what}: {v}");
                assert_eq!(v["world"], self.world, "{what}: rank {}: {v}", p.rank);
                let mut times: Vec<f64> = v["step_times"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|t| t.as_f64()).collect())
                    .unwrap_or_default();
                times.sort_by(f64::total_cmp);
                Report {
                    rank: p.rank,
                    loss: v["loss"].as_f64().expect("loss"),
                    digest: v["digest"].as_str().expect("digest").to_owned(),
                    params: v["params"].as_u64().expect("params"),
                    step_ms_median: times.get(times.len() / 2).copied().unwrap_or(0.0) * 1e3,
                    json: v,
                }
            })
            .collect();
        (reports, wall)
    }
}
