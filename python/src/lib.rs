//! `aggswitch._native`: the PyO3 layer over the worker library. Thin on
//! purpose: the protocol, its timers and its errors live in `worker` and
//! `proto`; this file converts arguments, releases the GIL around every
//! blocking call and maps `WorkerError` to the exceptions of
//! `aggswitch/errors.py`.
//!
//! Invariants: the GIL is never held while the worker's mutex is waited for
//! or while a collective runs (so other Python threads, including the DDP
//! hook's caller, keep running); a buffer is only written while its Python
//! buffer view is held; after `close()` every call fails with a clear error.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use proto::member::{reference_grad_stats, Shape};
use proto::provision::{JobName, TenantName};
use proto::wire::{Dtype, NackReason, DEFAULT_AGG_PORT, SECRET_LEN};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyUserWarning, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use worker::loopback::{LoopbackConfig, LoopbackSwitch, ScriptedRestart};
use worker::{
    AuthMode, Element, GradStats, GradStatsError, ProvisionSpec, TransportKind, Worker,
    WorkerConfig, WorkerError, WorkerStats,
};

/// Builds an exception of `aggswitch.errors.NAME` from its constructor args.
fn py_error<'py>(py: Python<'py>, name: &str, args: impl pyo3::call::PyCallArgs<'py>) -> PyErr {
    let made = py
        .import("aggswitch.errors")
        .and_then(|m| m.getattr(name))
        .and_then(|cls| cls.call1(args));
    match made {
        Ok(exc) => PyErr::from_value(exc),
        Err(e) => e,
    }
}

/// A `NackReason` as the short name `RefusedError.reason` carries.
fn reason_name(r: NackReason) -> &'static str {
    match r {
        NackReason::UnknownJob => "unknown_job",
        NackReason::BadSecret => "bad_secret",
        NackReason::SourceNotAllowed => "source_not_allowed",
        NackReason::RankOutOfRange => "rank_out_of_range",
        NackReason::ParametersDiffer => "parameters_differ",
        NackReason::JobNotActive => "job_not_active",
        NackReason::StaleGeneration => "stale_generation",
        NackReason::Malformed => "malformed",
        NackReason::StaleNonce => "stale_nonce",
        NackReason::KindNotSupported => "kind_not_supported",
        NackReason::QuotaExceeded => "quota_exceeded",
        NackReason::UnknownTenant => "unknown_tenant",
    }
}

fn map_err(py: Python<'_>, e: WorkerError) -> PyErr {
    let msg = e.to_string();
    match e {
        WorkerError::Provision { refusal, .. } => match (refusal.quota(), refusal.reason()) {
            (Some(q), _) => py_error(
                py,
                "QuotaError",
                (msg, reason_name(NackReason::QuotaExceeded), q.key()),
            ),
            (None, Some(r)) => py_error(py, "RefusedError", (msg, reason_name(r))),
            (None, None) => py_error(py, "ProtocolError", (msg,)),
        },
        WorkerError::ProvisionedJobVanishes { .. } => py_error(
            py,
            "RefusedError",
            (msg, reason_name(NackReason::UnknownJob)),
        ),
        WorkerError::Io { source, .. } | WorkerError::TransportUnavailable { source, .. } => {
            py_error(py, "TransportError", (msg, source.raw_os_error()))
        }
        WorkerError::Refused { reason, .. } => {
            py_error(py, "RefusedError", (msg, reason_name(reason)))
        }
        WorkerError::KindNotSupported { .. } => py_error(
            py,
            "RefusedError",
            (msg, reason_name(NackReason::KindNotSupported)),
        ),
        WorkerError::JoinTimeout { .. } => py_error(py, "JoinTimeoutError", (msg,)),
        WorkerError::Stalled {
            collective,
            seq,
            missing,
            upstream,
            ..
        } => {
            let spine = upstream.as_ref().map(|w| w.spine.to_string());
            let silent = upstream
                .as_ref()
                .and_then(|w| w.silent_for)
                .map(|d| d.as_secs_f64());
            let leaves = upstream.map(|w| w.leaves);
            py_error(
                py,
                "StalledError",
                (msg, missing, collective, seq, spine, silent, leaves),
            )
        }
        WorkerError::ResumeOutOfReach { .. } => py_error(py, "SwitchRestartedError", (msg,)),
        WorkerError::BadJoinAck { .. }
        | WorkerError::UnknownStats { .. }
        | WorkerError::Handshake { .. }
        | WorkerError::JoinAck { .. }
        | WorkerError::MacNeedsNewJoin { .. } => py_error(py, "ProtocolError", (msg,)),
        WorkerError::TensorTooLong { .. }
        | WorkerError::WrongLength { .. }
        | WorkerError::NotWholeElements { .. }
        | WorkerError::BadRoot { .. } => PyValueError::new_err(msg),
        WorkerError::WrongDtype { .. } => PyTypeError::new_err(msg),
    }
}

/// `GradientStatsError` (aggswitch/errors.py) with its `reason`.
fn grad_stats_err(py: Python<'_>, e: GradStatsError) -> PyErr {
    let reason = match e {
        GradStatsError::NotAStatsJob { .. } => "not_a_stats_job",
        GradStatsError::NoCollective { .. } => "no_collective",
        GradStatsError::NotSummed { .. } => "not_summed",
        GradStatsError::Incomplete { .. } => "incomplete",
    };
    py_error(py, "GradientStatsError", (e.to_string(), reason))
}

/// The dict `gradient_stats()` and `reference_stats()` return.
fn stats_dict(py: Python<'_>, s: GradStats) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("sum_of_squares", s.sum_of_squares)?;
    d.set_item("square_of_sum", s.square_of_sum)?;
    d.set_item("n", s.ranks)?;
    Ok(d)
}

/// The dict `stats()` returns: every field of `WorkerStats` under its
/// own name, read from its serde form, so that a counter added to the
/// library reaches Python (and matches the CLI's JSON) without a second
/// list here.
fn worker_stats_dict<'py>(py: Python<'py>, s: &WorkerStats) -> PyResult<Bound<'py, PyDict>> {
    let fields = match serde_json::to_value(s) {
        Ok(serde_json::Value::Object(fields)) => fields,
        Ok(other) => {
            return Err(PyTypeError::new_err(format!(
                "stats: the worker's counters serialised as {other}, not an object"
            )))
        }
        Err(e) => return Err(PyValueError::new_err(format!("stats: {e}"))),
    };
    let d = PyDict::new(py);
    for (name, value) in fields {
        match value {
            serde_json::Value::Number(n) if n.is_u64() => d.set_item(name, n.as_u64())?,
            serde_json::Value::Number(n) if n.is_i64() => d.set_item(name, n.as_i64())?,
            serde_json::Value::Number(n) => d.set_item(name, n.as_f64())?,
            other => {
                return Err(PyTypeError::new_err(format!(
                    "stats: counter {name} is {other}, not a number"
                )))
            }
        }
    }
    Ok(d)
}

/// "198.18.0.1", "198.18.0.1:48879" or "host:port", resolved to IPv4.
fn parse_switch(s: &str) -> PyResult<SocketAddrV4> {
    let with_port = if s.contains(':') {
        s.to_owned()
    } else {
        format!("{s}:{DEFAULT_AGG_PORT}")
    };
    let bad = |why: String| {
        PyValueError::new_err(format!(
            "switch {s:?}: {why} (expected an IPv4 address or host name, optionally \
             with :port, e.g. \"198.18.0.1:{DEFAULT_AGG_PORT}\")"
        ))
    };
    let addrs = with_port
        .to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?;
    addrs
        .into_iter()
        .find_map(|a| match a {
            SocketAddr::V4(v4) => Some(v4),
            SocketAddr::V6(_) => None,
        })
        .ok_or_else(|| bad("no IPv4 address".into()))
}

fn parse_secret(s: &str) -> PyResult<[u8; SECRET_LEN]> {
    let mut out = [0u8; SECRET_LEN];
    hex::decode_to_slice(s.trim(), &mut out).map_err(|e| {
        PyValueError::new_err(format!(
            "secret: expected {} hex digits (the job's 32-byte secret), got {} characters: {e}",
            2 * SECRET_LEN,
            s.trim().len()
        ))
    })?;
    Ok(out)
}

fn secs(name: &str, v: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(v)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| PyValueError::new_err(format!("{name}: expected seconds > 0, got {v}")))
}

fn u16_arg(name: &str, v: i64, min: i64) -> PyResult<u16> {
    u16::try_from(v)
        .ok()
        .filter(|&x| i64::from(x) >= min)
        .ok_or_else(|| PyValueError::new_err(format!("{name}: expected {min}..=65535, got {v}")))
}

/// A joined member of a job on the aggregation switch.
///
/// The constructor joins and returns once every rank has joined; `close()`
/// leaves. Use `aggswitch.Worker`, which adds torch tensors, futures and the
/// context manager on top of this class.
#[pyclass(module = "aggswitch._native", name = "Worker", subclass, frozen)]
struct PyWorker {
    inner: Mutex<Option<Worker>>,
    /// Counters as of the last collective (readable while one runs).
    last_stats: Mutex<WorkerStats>,
    /// The gradient statistics of the last collective (readable while the
    /// next one runs, so an async caller gets each collective's own).
    last_grad: Mutex<Result<GradStats, GradStatsError>>,
    switch: SocketAddrV4,
    job: u16,
    rank: u16,
    world_size: u16,
    elems_per_chunk: u16,
    dtype: Dtype,
    /// The transport the worker settled on: "mmsg" or "udp-gso".
    transport: &'static str,
    /// The job's auth mode from the JOIN_ACK: "port" or "mac".
    auth: &'static str,
    /// The switch's seq lanes at the join (its CHALLENGE's).
    seq_lanes: usize,
    /// Threads that carried the last collective (`Worker::threads`), kept
    /// after each so that it is readable while the next one runs.
    last_threads: AtomicUsize,
    /// Whether the switch granted lane replies at the last join
    /// (`Worker::lane_replies`), kept likewise.
    last_lane_replies: AtomicBool,
}

/// `bind=`: the local IPv4:port to bind, or None for any.
fn parse_bind(bind: Option<&str>) -> PyResult<Option<SocketAddrV4>> {
    bind.map(|b| {
        b.parse::<SocketAddrV4>()
            .map_err(|e| PyValueError::new_err(format!("bind {b:?}: expected IPv4:port ({e})")))
    })
    .transpose()
}

/// The most threads `threads=` takes (the worker CLI's `--threads` bound).
const MAX_THREADS: usize = 64;

/// `threads=`: `"auto"` (or None) is 0, `WorkerConfig::threads`' auto;
/// otherwise a count in 1..=64. A bool is refused, not read as 0 or 1.
fn parse_threads(threads: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
    let Some(t) = threads.filter(|t| !t.is_none()) else {
        return Ok(0);
    };
    let expected = format!("give \"auto\" or a thread count from 1 to {MAX_THREADS}");
    if t.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!("threads={t}: {expected}")));
    }
    if let Ok(s) = t.extract::<&str>() {
        return match s {
            "auto" => Ok(0),
            _ => Err(PyValueError::new_err(format!("threads={s:?}: {expected}"))),
        };
    }
    match t.extract::<i64>() {
        Ok(n) => usize::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_THREADS).contains(n))
            .ok_or_else(|| PyValueError::new_err(format!("threads={n}: {expected}"))),
        Err(_) => Err(PyTypeError::new_err(format!(
            "threads: {expected}, got {}",
            type_name(t)
        ))),
    }
}

/// `dtype=` of a Worker or LoopbackSwitch.
fn parse_dtype(s: &str) -> PyResult<Dtype> {
    s.parse::<Dtype>()
        .map_err(|e| PyValueError::new_err(format!("dtype: {e}")))
}

/// What `all_reduce` takes for a dtype, for error messages.
fn expected_buffer(d: Dtype) -> &'static str {
    match d {
        Dtype::F32 => "a writable C-contiguous float32 buffer (a numpy float32 array or a CPU torch.float32 tensor)",
        Dtype::Bf16 => "a writable C-contiguous uint16 buffer of bf16 bits (a numpy uint16 array, or a CPU torch.bfloat16 tensor through aggswitch.Worker)",
        Dtype::F16 => "a writable C-contiguous uint16 buffer of float16 bits (a numpy float16 array or CPU torch.float16 tensor through aggswitch.Worker)",
    }
}

/// Which collective a native call runs on its buffers.
#[derive(Clone, Copy)]
enum Call {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast(u16),
}

impl Call {
    fn name(self) -> &'static str {
        match self {
            Call::AllReduce => "all_reduce",
            Call::ReduceScatter => "reduce_scatter",
            Call::AllGather => "all_gather",
            Call::Broadcast(_) => "broadcast",
        }
    }
}

/// The byte range a buffer view covers, to refuse overlapping input and
/// output (the library reads one while it writes the other).
fn byte_range<B: pyo3::buffer::Element>(v: &PyBuffer<B>) -> std::ops::Range<usize> {
    let start = v.buf_ptr() as usize;
    start..start + v.len_bytes()
}

/// `buf`'s buffer view of items `B`, checked for what `call` needs of its
/// `role`: C-contiguous, and writable when `writable`; `expected` says
/// what it should have been when `buf` exports no such view.
fn checked_view<B: pyo3::buffer::Element>(
    call: &str,
    expected: impl FnOnce() -> String,
    role: &str,
    buf: &Bound<'_, PyAny>,
    writable: bool,
) -> PyResult<PyBuffer<B>> {
    let view = PyBuffer::<B>::get(buf).map_err(|e| {
        PyTypeError::new_err(format!(
            "{call}: {} as the {role}, got {}: {e}",
            expected(),
            type_name(buf)
        ))
    })?;
    if writable && view.readonly() {
        return Err(PyValueError::new_err(format!(
            "{call}: the {role} ({}) is read-only; the result is written into it, \
             pass a writable buffer",
            type_name(buf)
        )));
    }
    if !view.is_c_contiguous() {
        return Err(PyValueError::new_err(format!(
            "{call}: the {role} ({}) is not C-contiguous; pass a contiguous copy \
             (numpy.ascontiguousarray or tensor.contiguous()) and copy the result back",
            type_name(buf)
        )));
    }
    Ok(view)
}

/// Refuses an input and an output that share memory (the library reads
/// one while it writes the other).
fn refuse_overlap(
    call: &str,
    a: std::ops::Range<usize>,
    b: std::ops::Range<usize>,
) -> PyResult<()> {
    if !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end {
        return Err(PyValueError::new_err(format!(
            "{call}: the input and the output share memory; pass separate buffers"
        )));
    }
    Ok(())
}

impl PyWorker {
    /// A buffer view of items `B` (what Python exports: float32, or uint16
    /// for half-precision bits), checked for what `call` needs of its
    /// `role` ("buffer", "input" or "output"): C-contiguous, and writable
    /// when `writable`.
    fn view<B: pyo3::buffer::Element>(
        &self,
        call: Call,
        role: &str,
        buf: &Bound<'_, PyAny>,
        writable: bool,
    ) -> PyResult<PyBuffer<B>> {
        let expected = || {
            format!(
                "this worker's job is {}: expected {}",
                self.dtype,
                expected_buffer(self.dtype)
            )
        };
        checked_view(call.name(), expected, role, buf, writable)
    }

    /// The memory of `view` as `T`s.
    ///
    /// # Safety
    /// `view` is C-contiguous (checked by [`PyWorker::view`]) and, for a
    /// mutable use, writable; the slice must not outlive it (the lifetime
    /// ties them) nor alias another slice made here.
    unsafe fn elems<'v, B: pyo3::buffer::Element, T: Element>(
        &self,
        call: Call,
        view: &'v mut PyBuffer<B>,
    ) -> PyResult<&'v mut [T]> {
        let len = view.len_bytes();
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: per the contract, `len` bytes from buf_ptr() are one
        // initialised block the exporter keeps while the view lives.
        let bytes = unsafe { std::slice::from_raw_parts_mut(view.buf_ptr().cast::<u8>(), len) };
        // PyBuffer::get already checked the format, item size and
        // alignment; bytemuck checks size and alignment again for the cast
        // instead of trusting that.
        bytemuck::try_cast_slice_mut(bytes).map_err(|e| {
            PyValueError::new_err(format!(
                "{}: the buffer's memory is not {} ({e}); pass a contiguous copy",
                call.name(),
                expected_buffer(self.dtype)
            ))
        })
    }

    /// Runs `call` with the GIL released on a buffer whose items are `B`,
    /// reduced as `T`: `buf` in place (all_reduce, broadcast), or from
    /// `buf` into `out` (reduce_scatter, all_gather).
    fn run_as<B: pyo3::buffer::Element, T: Element + Send>(
        &self,
        py: Python<'_>,
        call: Call,
        buf: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let in_place = out.is_none();
        let role = if in_place { "buffer" } else { "input" };
        // A broadcast's root only reads its buffer; every other in-place
        // call writes it.
        let writes_buf = in_place && !matches!(call, Call::Broadcast(r) if r == self.rank);
        let mut in_view = self.view::<B>(call, role, buf, writes_buf)?;
        let mut out_view = match out {
            Some(o) => Some(self.view::<B>(call, "output", o, true)?),
            None => None,
        };
        if let Some(ov) = &out_view {
            refuse_overlap(call.name(), byte_range(&in_view), byte_range(ov))?;
        }
        // SAFETY: both views were checked by `view` (the one written is
        // writable), live until this function returns (after the
        // collective), and do not overlap (checked above).
        let data: &mut [T] = unsafe { self.elems(call, &mut in_view)? };
        let output: Option<&mut [T]> = match &mut out_view {
            // SAFETY: as above.
            Some(ov) => Some(unsafe { self.elems(call, ov)? }),
            None => None,
        };
        let r = self.with_worker(py, |w| match (call, output) {
            (Call::AllReduce, _) => w.all_reduce(data),
            (Call::Broadcast(root), _) => w.broadcast(root, data),
            (Call::ReduceScatter, Some(o)) => w.reduce_scatter(data, o),
            (Call::AllGather, Some(o)) => w.all_gather(data, o),
            (_, None) => unreachable!("reduce_scatter and all_gather pass an output"),
        });
        drop(in_view);
        drop(out_view);
        r
    }

    /// A C-contiguous buffer of bytes (format "B") for `all_gather_bytes`.
    fn byte_view(
        &self,
        role: &str,
        buf: &Bound<'_, PyAny>,
        writable: bool,
    ) -> PyResult<PyBuffer<u8>> {
        let expected =
            || "expected a buffer of bytes (format \"B\", e.g. memoryview(x).cast(\"B\"))".into();
        checked_view("all_gather_bytes", expected, role, buf, writable)
    }

    /// Runs `f` on the worker with the GIL released, then keeps its
    /// counters for `stats`; a closed worker's error otherwise.
    fn with_worker(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Worker) -> Result<(), WorkerError> + Send,
    ) -> PyResult<()> {
        let r = py.detach(|| {
            let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let w = guard.as_mut()?;
            let r = f(w);
            *self.last_stats.lock().unwrap_or_else(|p| p.into_inner()) = w.stats();
            *self.last_grad.lock().unwrap_or_else(|p| p.into_inner()) = w.gradient_stats();
            self.last_threads.store(w.threads(), Ordering::Relaxed);
            self.last_lane_replies
                .store(w.lane_replies(), Ordering::Relaxed);
            Some(r)
        });
        match r {
            None => Err(self.closed_error(py)),
            Some(r) => r.map_err(|e| map_err(py, e)),
        }
    }

    /// [`PyWorker::run_as`] with the job's buffer item and element types.
    fn run(
        &self,
        py: Python<'_>,
        call: Call,
        buf: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        match self.dtype {
            Dtype::F32 => self.run_as::<f32, f32>(py, call, buf, out),
            Dtype::Bf16 => self.run_as::<u16, half::bf16>(py, call, buf, out),
            Dtype::F16 => self.run_as::<u16, half::f16>(py, call, buf, out),
        }
    }

    fn closed_error(&self, py: Python<'_>) -> PyErr {
        py_error(
            py,
            "AggSwitchError",
            (format!(
                "job {} rank {}: this Worker is closed; make a new one to rejoin",
                self.job, self.rank
            ),),
        )
    }
}

#[pymethods]
impl PyWorker {
    #[new]
    #[pyo3(signature = (switch, job, rank, world_size, secret, *, join_timeout = 30.0,
                        stall_timeout = 5.0, congestion_control = true, delay_target = Some(0.002),
                        bind = None, dtype = "f32", transport = "auto", tenant = None,
                        tenant_key_file = None, job_name = None, auth = None, stats = None,
                        priority = None, threads = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        switch: &str,
        job: i64,
        rank: i64,
        world_size: i64,
        secret: &str,
        join_timeout: f64,
        stall_timeout: f64,
        congestion_control: bool,
        delay_target: Option<f64>,
        bind: Option<&str>,
        dtype: &str,
        transport: &str,
        tenant: Option<&str>,
        tenant_key_file: Option<&str>,
        job_name: Option<&str>,
        auth: Option<&str>,
        stats: Option<bool>,
        priority: Option<&str>,
        threads: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let threads = parse_threads(threads)?;
        let kind = transport
            .parse::<TransportKind>()
            .map_err(|e| PyValueError::new_err(format!("transport: {e}")))?;
        let mut prov = provision_spec(py, tenant, tenant_key_file, job_name)?;
        match prov.as_mut() {
            Some(spec) => shape_provisioned(spec, auth, stats, priority)?,
            None if auth.is_some() || stats.is_some() || priority.is_some() => {
                return Err(PyValueError::new_err(
                    "auth=, stats= and priority= shape a self-provisioned job (tenant=...); a \
                     declared job's come from its declaration on the switch",
                ))
            }
            None => {}
        }
        let mut cfg = worker_config(switch, job, rank, world_size, secret, dtype, bind, prov)?;
        let (sw, rank, world, dtype) = (cfg.switch, cfg.rank, cfg.n_workers, cfg.dtype);
        cfg.join_timeout = secs("join_timeout", join_timeout)?;
        cfg.stall_timeout = secs("stall_timeout", stall_timeout)?;
        cfg.transport.congestion_control = congestion_control;
        cfg.transport.delay_target = match delay_target {
            None => None,
            Some(t) if t.is_finite() && (0.0..=1.0).contains(&t) => {
                (t > 0.0).then(|| Duration::from_secs_f64(t))
            }
            Some(t) => {
                return Err(PyValueError::new_err(format!(
                    "delay_target {t}: seconds in 0..=1 (None or 0 for ECE alone)"
                )))
            }
        };
        cfg.transport_kind = kind;
        cfg.threads = threads;
        let w = py
            .detach(|| Worker::join(cfg))
            .map_err(|e| map_err(py, e))?;
        Ok(PyWorker {
            last_stats: Mutex::new(w.stats()),
            last_grad: Mutex::new(w.gradient_stats()),
            switch: sw,
            // A self-provisioned job's id is the switch's.
            job: w.job(),
            rank,
            world_size: world,
            elems_per_chunk: w.elems_per_chunk(),
            dtype,
            transport: w.transport().name(),
            seq_lanes: w.seq_lanes(),
            last_threads: AtomicUsize::new(w.threads()),
            last_lane_replies: AtomicBool::new(w.lane_replies()),
            auth: w.auth().name(),
            inner: Mutex::new(Some(w)),
        })
    }

    /// Sums `buf` element-wise over every rank of the job, in place.
    ///
    /// `buf` must support the buffer protocol, be writable and C-contiguous,
    /// and hold float32 for an f32 job, uint16 (the elements' bits) for a
    /// bf16 or f16 job. Blocks (with the GIL released) until the result is in.
    fn all_reduce(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<()> {
        self.run(py, Call::AllReduce, buf, None)
    }

    /// Reduce-scatter: `input` holds world_size shards of m elements;
    /// `output` (m elements) gets this rank's shard of the sum over every
    /// rank. The sum only: divide by world_size for an average. Buffers as
    /// for `all_reduce` (`input` may be read-only), not overlapping.
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.run(py, Call::ReduceScatter, input, Some(output))
    }

    /// All-gather: `output` (world_size × m elements) gets every rank's
    /// `input` (m elements), rank r's at r × m, bit for bit.
    fn all_gather(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.run(py, Call::AllGather, input, Some(output))
    }

    /// All-gather of raw bytes (`input` this rank's shard, `output`
    /// world_size times as long): whole elements of the job's size are
    /// copied without looking at them, so e.g. float32 parameters go
    /// through a bf16 job.
    fn all_gather_bytes(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let mut iv = self.byte_view("input", input, false)?;
        let mut ov = self.byte_view("output", output, true)?;
        refuse_overlap("all_gather_bytes", byte_range(&iv), byte_range(&ov))?;
        let bytes = |v: &mut PyBuffer<u8>| -> &mut [u8] {
            match v.len_bytes() {
                0 => &mut [],
                // SAFETY: checked C-contiguous (and the output writable) by
                // byte_view; the views live until this function returns,
                // after the collective, and do not overlap (checked above).
                n => unsafe { std::slice::from_raw_parts_mut(v.buf_ptr().cast::<u8>(), n) },
            }
        };
        let (src, dst) = (bytes(&mut iv), bytes(&mut ov));
        let r = self.with_worker(py, |w| w.all_gather_bytes(src, dst));
        drop((iv, ov));
        r
    }

    /// Copies the input of this worker's last collective (completed or
    /// failed; `worker::Worker::last_input`) into `out`, a writable byte
    /// buffer of exactly its length: what a host path redoes a failed
    /// in-place all-reduce from.
    fn restore_input(&self, py: Python<'_>, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let ov = self.byte_view("output", out, true)?;
        let len = ov.len_bytes();
        let dst: &mut [u8] = match len {
            0 => &mut [],
            // SAFETY: checked C-contiguous and writable by byte_view; the
            // view lives until this function returns.
            n => unsafe { std::slice::from_raw_parts_mut(ov.buf_ptr().cast::<u8>(), n) },
        };
        let copied = py.detach(|| {
            let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let w = guard.as_ref()?;
            let last = w.last_input();
            Some(if last.len() == dst.len() {
                dst.copy_from_slice(last);
                Ok(())
            } else {
                Err(last.len())
            })
        });
        drop(ov);
        match copied {
            None => Err(self.closed_error(py)),
            Some(Ok(())) => Ok(()),
            Some(Err(have)) => Err(PyValueError::new_err(format!(
                "restore_input: the last collective's input is {have} bytes, the buffer {len}"
            ))),
        }
    }

    /// Broadcast: every rank's `buf` becomes rank `root`'s, bit for bit.
    fn broadcast(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, root: i64) -> PyResult<()> {
        let root = u16::try_from(root).map_err(|_| {
            PyValueError::new_err(format!(
                "broadcast: root {root} out of range: ranks are 0..{}",
                self.world_size
            ))
        })?;
        self.run(py, Call::Broadcast(root), buf, None)
    }

    /// The worker library's counters as of the last completed collective.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = *self.last_stats.lock().unwrap_or_else(|p| p.into_inner());
        worker_stats_dict(py, &s)
    }

    /// The gradient statistics of the last collective, an all-reduce or
    /// reduce-scatter of a `stats = true` job: `{"sum_of_squares": Σᵢ‖gᵢ‖²,
    /// "square_of_sum": ‖Σᵢ gᵢ‖², "n": ranks}`, the same bits on every rank
    /// (float64 in the protocol's order, of the raw sum). Raises
    /// `GradientStatsError` saying why there are none (reason
    /// "not_a_stats_job", "no_collective" or "not_summed"). Does not wait
    /// for a collective in progress.
    fn gradient_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let g = *self.last_grad.lock().unwrap_or_else(|p| p.into_inner());
        match g {
            Ok(s) => stats_dict(py, s),
            Err(e) => Err(grad_stats_err(py, e)),
        }
    }

    /// Keeps a self-provisioned job's lease while idle between collectives:
    /// takes what the switch sent and sends the keepalive HEARTBEAT when one
    /// is due (never blocks on the network). Call it at least every
    /// `keepalive_interval` seconds while idle; a job lost meanwhile is
    /// joined again by the next collective.
    fn keepalive(&self, py: Python<'_>) -> PyResult<()> {
        self.with_worker(py, |w| w.keepalive())
    }

    /// Seconds between keepalives of an idle self-provisioned job (a third
    /// of its lease, at most 20); None for a declared job.
    #[getter]
    fn keepalive_interval(&self, py: Python<'_>) -> Option<f64> {
        py.detach(|| {
            let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            guard
                .as_ref()
                .and_then(|w| w.keepalive_interval())
                .map(|d| d.as_secs_f64())
        })
    }

    /// Whether the job is `stats = true` (the switch's JOIN_ACK says).
    #[getter]
    fn has_gradient_stats(&self) -> bool {
        let g = *self.last_grad.lock().unwrap_or_else(|p| p.into_inner());
        !matches!(g, Err(GradStatsError::NotAStatsJob { .. }))
    }

    /// Leaves the job (best effort: one LEAVE datagram). Idempotent; waits
    /// for a collective in progress to end first.
    #[pyo3(signature = (*, for_hosts = false))]
    fn close(&self, py: Python<'_>, for_hosts: bool) -> PyResult<()> {
        let w = py.detach(|| self.inner.lock().unwrap_or_else(|p| p.into_inner()).take());
        match w {
            Some(w) if for_hosts => w.leave_for_hosts().map_err(|e| map_err(py, e)),
            Some(w) => w.leave().map_err(|e| map_err(py, e)),
            None => Ok(()),
        }
    }

    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        py.detach(|| {
            self.inner
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_none()
        })
    }
    #[getter]
    fn switch(&self) -> String {
        self.switch.to_string()
    }
    #[getter]
    fn job(&self) -> u16 {
        self.job
    }
    #[getter]
    fn rank(&self) -> u16 {
        self.rank
    }
    #[getter]
    fn world_size(&self) -> u16 {
        self.world_size
    }
    /// Elements per chunk, as the switch's JOIN_ACK set it.
    #[getter]
    fn elems_per_chunk(&self) -> u16 {
        self.elems_per_chunk
    }
    /// The UDP data path in use: "mmsg" or "udp-gso" (never "auto").
    #[getter]
    fn transport(&self) -> &'static str {
        self.transport
    }
    /// How the job authenticates DATA and RESULT: "port" or "mac" (the
    /// switch's authenticated JOIN_ACK says).
    #[getter]
    fn auth(&self) -> &'static str {
        self.auth
    }

    /// The switch's seq lanes as its CHALLENGE said at the join: DATA of
    /// chunk seq s goes to its port + s mod seq_lanes (1: one port).
    #[getter]
    fn seq_lanes(&self) -> usize {
        self.seq_lanes
    }

    /// Threads that carried the last collective (1 before the first): at
    /// most `threads=`, and 1 where the switch granted no lane replies.
    /// Readable while a collective runs (it then says the one before).
    #[getter]
    fn threads(&self) -> usize {
        self.last_threads.load(Ordering::Relaxed)
    }

    /// Whether the switch granted lane replies at the last join: its
    /// RESULTs come from its lane ports, so more than one thread may carry
    /// a collective (a switch of one seq lane never grants them).
    #[getter]
    fn lane_replies(&self) -> bool {
        self.last_lane_replies.load(Ordering::Relaxed)
    }

    /// The job's element type: "f32", "bf16" or "f16".
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    fn __repr__(&self) -> String {
        format!(
            "Worker(switch=\"{}\", job={}, rank={}, world_size={}, dtype=\"{}\")",
            self.switch, self.job, self.rank, self.world_size, self.dtype
        )
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}

/// A userspace stand-in for the switch on 127.0.0.1, one job, for trying
/// the package (and the DDP hook) on one machine without root or XDP.
/// Not a switch: one thread, no forwarding, not for production.
#[pyclass(module = "aggswitch._native", name = "LoopbackSwitch", frozen)]
struct PyLoopbackSwitch {
    inner: Mutex<Option<LoopbackSwitch>>,
    address: String,
}

#[pymethods]
impl PyLoopbackSwitch {
    #[new]
    #[pyo3(signature = (job, world_size, secret, *, port = 0, pool_slots = 64,
                        elems_per_chunk = 362, drop_every = 0, dtype = "f32",
                        stats = false, seq_lanes = 1, tenant = None, tenant_key = None,
                        max_jobs = 4, lease = 60.0, restart_at = None,
                        stats_after_restart = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        job: i64,
        world_size: i64,
        secret: &str,
        port: u16,
        pool_slots: i64,
        elems_per_chunk: i64,
        drop_every: u64,
        dtype: &str,
        stats: bool,
        seq_lanes: u16,
        tenant: Option<&str>,
        tenant_key: Option<&str>,
        max_jobs: u16,
        lease: f64,
        restart_at: Option<(u32, u32)>,
        stats_after_restart: Option<bool>,
    ) -> PyResult<Self> {
        let mut cfg = LoopbackConfig::new(
            u16_arg("job", job, 1)?,
            u16_arg("world_size", world_size, 1)?,
            parse_secret(secret)?,
        );
        cfg.pool_slots = u16_arg("pool_slots", pool_slots, 1)?;
        cfg.elems_per_chunk = u16_arg("elems_per_chunk", elems_per_chunk, 1)?;
        cfg.drop_every = drop_every;
        cfg.dtype = parse_dtype(dtype)?;
        cfg.stats = stats;
        cfg.seq_lanes = seq_lanes;
        cfg.script = match (restart_at, stats_after_restart) {
            (Some(at), stats) => Some(ScriptedRestart {
                at,
                lanes: None,
                stats,
                starve: None,
            }),
            (None, None) => None,
            (None, Some(_)) => {
                return Err(PyValueError::new_err(
                    "LoopbackSwitch: stats_after_restart= needs restart_at=(collective, seq)",
                ))
            }
        };
        match (tenant, tenant_key) {
            (None, None) => {}
            (Some(name), Some(key)) => {
                let name =
                    TenantName::new(name).map_err(|e| PyValueError::new_err(e.to_string()))?;
                let mut t = LoopbackConfig::tenant(name, parse_secret(key)?, max_jobs);
                t.lease = secs("lease", lease)?;
                cfg.tenants = vec![t];
            }
            _ => {
                return Err(PyValueError::new_err(
                    "LoopbackSwitch: tenant= and tenant_key= (64 hex digits) go together",
                ))
            }
        }
        let sw = LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PyLoopbackSwitch {
            address: sw.addr().to_string(),
            inner: Mutex::new(Some(sw)),
        })
    }

    /// "127.0.0.1:PORT": pass it as `switch=` to `Worker`.
    #[getter]
    fn address(&self) -> &str {
        &self.address
    }

    /// Loses all job state and starts a new generation, as a switchd
    /// restart does; workers re-join and resend by themselves.
    fn restart(&self) -> PyResult<()> {
        match self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            Some(sw) => {
                sw.restart();
                Ok(())
            }
            None => Err(PyValueError::new_err("LoopbackSwitch is closed")),
        }
    }

    /// Stops serving. Idempotent.
    fn close(&self, py: Python<'_>) {
        let sw = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.detach(move || drop(sw));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) {
        self.close(py);
    }

    fn __repr__(&self) -> String {
        format!("LoopbackSwitch(address=\"{}\")", self.address)
    }
}

/// The statistics a single switch's `stats = true` job gives every rank
/// (`proto::member::reference_grad_stats`): `inputs` are the ranks' inputs
/// in rank order as float32 buffers (half-precision values widened), each
/// the collective's whole layout; chunks of `elems_per_chunk` (the
/// worker's `elems_per_chunk`); `kind` "all_reduce" or "reduce_scatter".
#[pyfunction]
#[pyo3(signature = (inputs, elems_per_chunk, kind = "all_reduce"))]
fn reference_stats<'py>(
    py: Python<'py>,
    inputs: Vec<Bound<'py, PyAny>>,
    elems_per_chunk: i64,
    kind: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let e = u16_arg("elems_per_chunk", elems_per_chunk, 1)?;
    let mut vals: Vec<Vec<f32>> = Vec::with_capacity(inputs.len());
    for (r, x) in inputs.iter().enumerate() {
        let expected = || format!("a C-contiguous float32 buffer for rank {r}");
        let v = checked_view::<f32>("reference_stats", expected, "input", x, false)?;
        vals.push(v.to_vec(py)?);
    }
    let len = vals.first().map_or(0, Vec::len);
    let n = u16::try_from(vals.len())
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "reference_stats: expected 1..=65535 inputs, got {}",
                vals.len()
            ))
        })?;
    let shape = match kind {
        "all_reduce" => Shape::all_reduce(len),
        "reduce_scatter" if len.is_multiple_of(usize::from(n)) => {
            Shape::reduce_scatter(0, n, len / usize::from(n))
        }
        "reduce_scatter" => {
            return Err(PyValueError::new_err(format!(
                "reference_stats: a reduce-scatter's inputs are n shards: {len} elements is                  not a multiple of {n} inputs"
            )))
        }
        other => {
            return Err(PyValueError::new_err(format!(
                "reference_stats: kind {other:?}: expected \"all_reduce\" or \"reduce_scatter\""
            )))
        }
    };
    let refs: Vec<&[f32]> = vals.iter().map(Vec::as_slice).collect();
    let s = reference_grad_stats(shape, e, &refs).ok_or_else(|| {
        let lens: Vec<usize> = vals.iter().map(Vec::len).collect();
        PyValueError::new_err(format!(
            "reference_stats: every input must have the same length, got {lens:?}"
        ))
    })?;
    stats_dict(py, s)
}

/// A C-contiguous byte view of `buf` for a module function.
fn bytes_of(view: &mut PyBuffer<u8>) -> &mut [u8] {
    match view.len_bytes() {
        0 => &mut [],
        // SAFETY: callers pass views checked C-contiguous (and writable when
        // written) by `checked_view`; the slice lives no longer than the view.
        n => unsafe { std::slice::from_raw_parts_mut(view.buf_ptr().cast::<u8>(), n) },
    }
}

/// The switch's sum computed here (`proto::host_sum`): `inputs` holds the
/// n ranks' wire bytes (little-endian `dtype` elements) back to back, rank
/// r's at `r * len(out)`; `out` gets their sum. `leaf_sizes`: a tree's
/// order; `owner`: a reduce-scatter owner that keeps its values
/// (`kept_sum`); `stats_chunk`: also return each chunk's statistics, as
/// (sum_of_squares, square_of_sum, ranks) per chunk of that many elements.
/// Releases the GIL while it sums.
#[pyfunction]
#[pyo3(signature = (inputs, out, n, dtype, *, leaf_sizes = None, owner = None, stats_chunk = None))]
#[allow(clippy::too_many_arguments)]
fn host_sum(
    py: Python<'_>,
    inputs: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    n: i64,
    dtype: &str,
    leaf_sizes: Option<Vec<u16>>,
    owner: Option<i64>,
    stats_chunk: Option<i64>,
) -> PyResult<Vec<(f64, f64, u32)>> {
    use proto::host_sum::{kept_sum, sum, SumOrder};
    let dtype = parse_dtype(dtype)?;
    let n = usize::from(u16_arg("n", n, 1)?);
    let expected = || "expected a C-contiguous buffer of bytes (format \"B\")".to_string();
    let mut iv = checked_view::<u8>("host_sum", expected, "inputs", inputs, false)?;
    let mut ov = checked_view::<u8>("host_sum", expected, "out", out, true)?;
    refuse_overlap("host_sum", byte_range(&iv), byte_range(&ov))?;
    let (src, dst) = (bytes_of(&mut iv), bytes_of(&mut ov));
    if src.len() != n * dst.len() {
        return Err(PyValueError::new_err(format!(
            "host_sum: inputs of {} bytes are not {n} ranks of the output's {} bytes",
            src.len(),
            dst.len()
        )));
    }
    let owner = owner
        .map(|o| {
            usize::try_from(o)
                .map_err(|_| PyValueError::new_err(format!("host_sum: owner {o} < 0")))
        })
        .transpose()?;
    let stats_chunk = stats_chunk
        .map(|e| {
            usize::try_from(e)
                .map_err(|_| PyValueError::new_err(format!("host_sum: stats_chunk {e} < 0")))
        })
        .transpose()?;
    let r = py.detach(|| {
        let ranks: Vec<&[u8]> = if dst.is_empty() {
            vec![&[][..]; n]
        } else {
            src.chunks(dst.len()).collect()
        };
        match (owner, &leaf_sizes) {
            (Some(o), _) => kept_sum(dtype, &ranks, o, dst).map(|()| Vec::new()),
            (None, Some(sizes)) => sum(dtype, SumOrder::Tree(sizes), &ranks, dst, stats_chunk),
            (None, None) => sum(dtype, SumOrder::Rank, &ranks, dst, stats_chunk),
        }
    });
    drop((iv, ov));
    let stats = r.map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(stats
        .into_iter()
        .map(|s| (s.sum_of_squares, s.square_of_sum, s.ranks))
        .collect())
}

/// One HELLO to the switch for (job, rank), resent every 200 ms, waiting up
/// to `timeout` seconds (`worker::probe::probe_switch`): `("alive", gen,
/// None)`, `("refused", None, reason)` or `("silent", None, None)`. Joins
/// nothing.
#[pyfunction]
#[pyo3(signature = (switch, job, rank, world_size, secret, *, timeout = 1.0, dtype = "f32", bind = None,
                    tenant = None, tenant_key_file = None, job_name = None))]
#[allow(clippy::too_many_arguments)]
fn probe_switch(
    py: Python<'_>,
    switch: &str,
    job: i64,
    rank: i64,
    world_size: i64,
    secret: &str,
    timeout: f64,
    dtype: &str,
    bind: Option<&str>,
    tenant: Option<&str>,
    tenant_key_file: Option<&str>,
    job_name: Option<&str>,
) -> PyResult<(&'static str, Option<u32>, Option<&'static str>)> {
    use worker::probe::SwitchAnswer;
    let prov = provision_spec(py, tenant, tenant_key_file, job_name)?;
    let cfg = worker_config(switch, job, rank, world_size, secret, dtype, bind, prov)?;
    let timeout = secs("timeout", timeout)?;
    let a = py
        .detach(|| worker::probe::probe_switch(&cfg, timeout))
        .map_err(|e| map_err(py, e))?;
    Ok(match a {
        SwitchAnswer::Alive { gen } => ("alive", Some(gen), None),
        SwitchAnswer::Refused(r) => ("refused", None, Some(reason_name(r))),
        SwitchAnswer::Silent => ("silent", None, None),
    })
}

/// A self-provisioned job's spec from `tenant=`, `tenant_key_file=` (or
/// the AGGSWITCH_TENANT_KEY environment variable) and `job_name=`: all or
/// none (`None`: a declared job). The key file is read by the rules of a
/// job secret (proto::secret); one that others can read is warned about.
fn provision_spec(
    py: Python<'_>,
    tenant: Option<&str>,
    key_file: Option<&str>,
    job_name: Option<&str>,
) -> PyResult<Option<ProvisionSpec>> {
    let (tenant, job_name) = match (tenant, job_name) {
        (None, None) if key_file.is_none() => return Ok(None),
        (Some(t), Some(j)) => (t, j),
        _ => {
            return Err(PyValueError::new_err(
                "a self-provisioned job needs tenant=, job_name= and the tenant key \
                 (tenant_key_file=, or AGGSWITCH_TENANT_KEY): give all of them, or none for a \
                 declared job (job= and secret=)",
            ))
        }
    };
    let tenant = TenantName::new(tenant).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let job_name = JobName::new(job_name).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let file = key_file.map(|p| {
        let path = std::path::PathBuf::from(p);
        let read = read_key_file(&path);
        (path, read)
    });
    let r =
        proto::secret::resolve_tenant_key(file, std::env::var(proto::secret::TENANT_KEY_ENV).ok())
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
    for w in &r.warnings {
        let cat = py.get_type::<PyUserWarning>();
        let msg = std::ffi::CString::new(w.as_str()).unwrap_or_default();
        PyErr::warn(py, &cat, &msg, 1)?;
    }
    Ok(Some(ProvisionSpec {
        tenant,
        key: r.key,
        job_name,
        auth: AuthMode::Port,
        stats: false,
        priority: 1,
    }))
}

/// A self-provisioned job's shape beyond the join's: `auth` ("port" or
/// "mac"), `stats` and `priority` ("low", "normal", "high").
fn shape_provisioned(
    spec: &mut ProvisionSpec,
    auth: Option<&str>,
    stats: Option<bool>,
    priority: Option<&str>,
) -> PyResult<()> {
    spec.auth = match auth {
        None | Some("port") => AuthMode::Port,
        Some("mac") => AuthMode::Mac,
        Some(o) => {
            return Err(PyValueError::new_err(format!(
                "auth {o:?}: expected \"port\" or \"mac\""
            )))
        }
    };
    spec.stats = stats.unwrap_or(false);
    spec.priority = match priority {
        Some("low") => 0,
        None | Some("normal") => 1,
        Some("high") => 2,
        Some(o) => {
            return Err(PyValueError::new_err(format!(
                "priority {o:?}: expected \"low\", \"normal\" or \"high\""
            )))
        }
    };
    Ok(())
}

/// A key file's text and permission bits.
fn read_key_file(path: &std::path::Path) -> std::io::Result<(String, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let f = std::fs::File::open(path)?;
    let mode = f.metadata()?.permissions().mode();
    Ok((std::io::read_to_string(f)?, mode))
}

/// What `Worker(...)` and `probe_switch` share: the switch, the job, this
/// rank, the job's secret, dtype and source address, checked. With `prov`
/// (a self-provisioned job) `job` and `secret` are not used.
#[allow(clippy::too_many_arguments)]
fn worker_config(
    switch: &str,
    job: i64,
    rank: i64,
    world_size: i64,
    secret: &str,
    dtype: &str,
    bind: Option<&str>,
    prov: Option<ProvisionSpec>,
) -> PyResult<WorkerConfig> {
    let world = u16_arg("world_size", world_size, 1)?;
    let rank = u16_arg("rank", rank, 0)?;
    if rank >= world {
        return Err(PyValueError::new_err(format!(
            "rank {rank} out of range: ranks are 0..{world} for world_size {world}"
        )));
    }
    let mut cfg = match prov {
        Some(spec) => WorkerConfig::provisioned(parse_switch(switch)?, spec, rank, world),
        None => WorkerConfig::new(
            parse_switch(switch)?,
            u16_arg("job", job, 1)?,
            rank,
            world,
            parse_secret(secret)?,
        ),
    };
    cfg.dtype = parse_dtype(dtype)?;
    cfg.bind = parse_bind(bind)?;
    Ok(cfg)
}

/// Elements per chunk of a `stats = true` job of `dtype` on a switch whose
/// ports have `mtu`, with the switch's defaults: how the host path cuts a
/// collective's statistics when this rank never saw a JOIN_ACK.
#[pyfunction]
#[pyo3(signature = (dtype, mtu = 1500))]
fn default_stats_chunk(dtype: &str, mtu: u16) -> PyResult<u16> {
    let dtype = parse_dtype(dtype)?;
    let f32_elems = proto::wire::elems_per_chunk_for_mtu(mtu);
    match proto::switch::config::max_elems_for(f32_elems, dtype, proto::tag::AuthMode::Port, true) {
        0 => Err(PyValueError::new_err(format!(
            "mtu {mtu}: too small for a chunk with statistics"
        ))),
        n => Ok(n),
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyWorker>()?;
    m.add_class::<PyLoopbackSwitch>()?;
    m.add_function(wrap_pyfunction!(reference_stats, m)?)?;
    m.add_function(wrap_pyfunction!(host_sum, m)?)?;
    m.add_function(wrap_pyfunction!(probe_switch, m)?)?;
    m.add_function(wrap_pyfunction!(default_stats_chunk, m)?)?;
    m.add("DEFAULT_PORT", DEFAULT_AGG_PORT)?;
    Ok(())
}
