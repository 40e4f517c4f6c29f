"""Type stubs of the PyO3 extension (python/src/lib.rs)."""

from typing import Any, Literal

DEFAULT_PORT: int

class Worker:
    """A joined member of a job; see aggswitch.Worker."""

    def __new__(
        cls,
        switch: str,
        job: int,
        rank: int,
        world_size: int,
        secret: str,
        *,
        join_timeout: float = 30.0,
        stall_timeout: float = 5.0,
        congestion_control: bool = True,
        delay_target: float | None = 0.002,
        bind: str | None = None,
        dtype: Literal["f32", "bf16", "f16"] = "f32",
        transport: Literal["auto", "mmsg", "udp-gso"] = "auto",
        tenant: str | None = None,
        tenant_key_file: str | None = None,
        job_name: str | None = None,
        auth: Literal["port", "mac"] | None = None,
        stats: bool | None = None,
        priority: Literal["low", "normal", "high"] | None = None,
        threads: int | Literal["auto"] = "auto",
    ) -> "Worker":
        """With ``tenant``, ``tenant_key_file`` (or AGGSWITCH_TENANT_KEY) and
        ``job_name`` the job is self-provisioned: ``job`` and ``secret`` are
        not used; ``auth``, ``stats`` and ``priority`` shape it (default
        port, off, normal). A tenant at its quota raises
        aggswitch.errors.QuotaError. ``threads``: ``"auto"`` or 1..64, the
        threads that carry each collective (more than one needs a switch
        with that many seq lanes; else one runs); another value raises
        ValueError (TypeError for a bool or another type)."""
    def all_reduce(self, buf: Any) -> None:
        """Sums a writable C-contiguous buffer over all ranks, in place:
        float32 items for an f32 job, uint16 (the elements' bits) for bf16
        and f16 jobs. Another item type raises TypeError."""
    def reduce_scatter(self, input: Any, output: Any) -> None:
        """Reduce-scatter: ``input`` holds world_size shards of m elements,
        ``output`` (m elements, writable) gets this rank's shard of the sum
        over every rank (the sum only: divide for an average). The rank's own
        shard never leaves it: the switch sums the others in rank order and
        the rank adds its own (reproducible bits, not all_reduce's). Buffers
        as for all_reduce; they must not overlap. A wrong length raises
        ValueError."""
    def all_gather(self, input: Any, output: Any) -> None:
        """All-gather: ``output`` (world_size × m elements, writable) gets
        every rank's ``input`` (m elements), rank r's at r × m, bit for bit."""
    def all_gather_bytes(self, input: Any, output: Any) -> None:
        """All-gather of raw bytes (format "B" buffers): ``output`` is
        world_size times ``input``, which must be a whole number of the job's
        elements; the switch copies them without looking."""
    def broadcast(self, buf: Any, root: int) -> None:
        """Every rank's ``buf`` becomes rank ``root``'s, bit for bit (the
        root's may be read-only)."""
    def restore_input(self, out: Any) -> None:
        """Copies the input of this worker's last collective (completed or
        failed) into ``out``, a writable byte buffer of exactly its length:
        what the host path redoes a failed in-place all-reduce from."""
    def stats(self) -> dict[str, int | float]:
        """The worker library's counters as of the last completed collective,
        every one under its Rust name (``WorkerStats``: the same keys as
        the ``stats`` object of ``worker allreduce --json``), e.g. ``chunks_resent``,
        ``held_timeouts``, ``heartbeats_sent``, ``window``, ``srtt_us``."""
    def gradient_stats(self) -> dict[str, int | float]:
        """The last all-reduce's or reduce-scatter's gradient statistics in a
        ``stats = true`` job: ``{"sum_of_squares": float, "square_of_sum":
        float, "n": int}``; raises aggswitch.errors.GradientStatsError
        (``.reason``) when there are none."""
    @property
    def has_gradient_stats(self) -> bool:
        """Whether the job is ``stats = true`` (from the switch's JOIN_ACK)."""
    def keepalive(self) -> None:
        """Keeps a self-provisioned job's lease while idle between
        collectives (sends the keepalive HEARTBEAT when due; never blocks on
        the network). Call it every `keepalive_interval` seconds while idle."""
    @property
    def keepalive_interval(self) -> float | None:
        """Seconds between keepalives of a self-provisioned job (a third of
        its lease, at most 20); None for a declared job."""
    def close(self, *, for_hosts: bool = False) -> None:
        """Leaves the job; idempotent. ``for_hosts``: the LEAVE says the job
        goes on on the host path (a live switch counts it)."""
    @property
    def closed(self) -> bool: ...
    @property
    def switch(self) -> str: ...
    @property
    def job(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def elems_per_chunk(self) -> int: ...
    @property
    def transport(self) -> Literal["mmsg", "udp-gso"]:
        """The UDP data path the worker settled on."""
    @property
    def seq_lanes(self) -> int:
        """The switch's seq lanes at the join: DATA of chunk seq s goes to
        its port + s mod seq_lanes (1: one port)."""
    @property
    def threads(self) -> int:
        """Threads that carried the last collective (1 before the first):
        at most ``threads=``, 1 where the switch granted no lane replies."""
    @property
    def lane_replies(self) -> bool:
        """Whether the switch granted lane replies at the last join (its
        RESULTs come from its lane ports; needs ``seq_lanes`` > 1)."""
    @property
    def auth(self) -> Literal["port", "mac"]:
        """How the job authenticates DATA and RESULT (from the switch's JOIN_ACK)."""
    @property
    def dtype(self) -> Literal["f32", "bf16", "f16"]: ...

class LoopbackSwitch:
    """A userspace stand-in for the switch on 127.0.0.1 (one job), for trying
    the package without root or XDP. Not for production."""

    def __new__(
        cls,
        job: int,
        world_size: int,
        secret: str,
        *,
        port: int = 0,
        pool_slots: int = 64,
        elems_per_chunk: int = 362,
        drop_every: int = 0,
        dtype: Literal["f32", "bf16", "f16"] = "f32",
        stats: bool = False,
        seq_lanes: int = 1,
        tenant: str | None = None,
        tenant_key: str | None = None,
        max_jobs: int = 4,
        lease: float = 60.0,
        restart_at: tuple[int, int] | None = None,
        stats_after_restart: bool | None = None,
    ) -> "LoopbackSwitch":
        """`seq_lanes`: DATA of chunk seq s is also taken on port + s mod
        seq_lanes (a power of two, 1..=64), as switchd's `seq_lanes`.
        `tenant` with `tenant_key` (64 hex digits): a tenant whose workers
        provision jobs of their own, at most `max_jobs` at once, each ended
        after `lease` seconds without traffic. `restart_at=(collective,
        seq)` (tests): the stand-in restarts by itself, once, when the first
        DATA of that collective with that seq arrives, the job then
        `stats = stats_after_restart` when that is given."""
    @property
    def address(self) -> str:
        """"127.0.0.1:PORT", to pass as Worker(switch=...)."""
    def restart(self) -> None:
        """Loses all job state (a new generation), as a switchd restart does."""
    def close(self) -> None: ...
    def __enter__(self) -> "LoopbackSwitch": ...
    def __exit__(self, *exc: object) -> None: ...

def reference_stats(
    inputs: list[Any],
    elems_per_chunk: int,
    kind: Literal["all_reduce", "reduce_scatter"] = "all_reduce",
) -> dict[str, int | float]:
    """The gradient statistics a single switch's ``stats = true`` job gives
    for the ranks' ``inputs`` (float32 buffers in rank order, half precision
    widened), chunks of ``elems_per_chunk``: the Rust reference
    (proto::member::reference_grad_stats), bit for bit."""

def host_sum(
    inputs: Any,
    out: Any,
    n: int,
    dtype: Literal["f32", "bf16", "f16"],
    *,
    leaf_sizes: list[int] | None = None,
    owner: int | None = None,
    stats_chunk: int | None = None,
) -> list[tuple[float, float, int]]:
    """The switch's sum computed on this host (proto::host_sum): ``inputs``
    holds the ``n`` ranks' little-endian ``dtype`` bytes back to back (rank
    r's at ``r * len(out)``), ``out`` gets their sum in rank order (or a
    tree's order with ``leaf_sizes``), rounded once; ``owner``: a
    reduce-scatter owner that keeps its own values. With ``stats_chunk``,
    returns each chunk's (sum_of_squares, square_of_sum, ranks). Raises
    ValueError naming a bad shape."""

def probe_switch(
    switch: str,
    job: int,
    rank: int,
    world_size: int,
    secret: str,
    *,
    timeout: float = 1.0,
    dtype: Literal["f32", "bf16", "f16"] = "f32",
    bind: str | None = None,
    tenant: str | None = None,
    tenant_key_file: str | None = None,
    job_name: str | None = None,
) -> tuple[Literal["alive", "refused", "silent"], int | None, str | None]:
    """One HELLO for (job, rank), resent every 200 ms, answered within
    ``timeout`` seconds or not: ``("alive", generation, None)``,
    ``("refused", None, reason)`` or ``("silent", None, None)``. Joins
    nothing; a HELLO changes nothing at the switch. For a self-provisioned
    job (``tenant``...) a PROVISION ask instead: "alive" means the switch
    runs and knows the tenant; it creates nothing."""

def default_stats_chunk(dtype: Literal["f32", "bf16", "f16"], mtu: int = 1500) -> int:
    """Elements per chunk of a ``stats = true`` job of ``dtype`` on a switch
    whose ports have ``mtu``, with the switch's defaults (352 float32 at
    1500): how the host path cuts a collective's statistics when this rank
    never saw a JOIN_ACK. Raises ValueError for an MTU too small."""
