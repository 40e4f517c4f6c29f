"""aggswitch.Worker against the loopback stand-in: sums, futures, the
buffer rules and the mapping of the library's errors to exceptions."""

import threading
import time

import numpy as np
import pytest

import aggswitch
from conftest import SECRET, require_torch, run_ranks


def pattern(rank, it, n):
    """Per-rank inputs whose float32 sums depend on the summation order."""
    i = np.arange(n, dtype=np.float32)
    return (np.float32(0.1) * (rank + 1) + i * np.float32(1e-3) * (it + 1) + np.float32(1e7) * (rank % 2)).astype(np.float32)


def rank_order_sum(world, it, n):
    acc = np.zeros(n, dtype=np.float32)
    for r in range(world):
        acc = acc + pattern(r, it, n)  # float32 adds, rank 0 first
    return acc


def test_sum_is_rank_order_sum_bit_for_bit(switch):
    sw = switch(3, elems_per_chunk=100)
    n = 1001  # eleven chunks, the last one short

    def body(w):
        outs = []
        for it in range(3):
            a = pattern(w.rank, it, n)
            assert w.all_reduce(a) is a
            outs.append(a.copy())
        return outs

    results = run_ranks(sw, 3, body)
    for it in range(3):
        want = rank_order_sum(3, it, n)
        for rank in range(3):
            assert results[rank][it].tobytes() == want.tobytes(), f"rank {rank} iteration {it}"


def test_survives_loss_at_the_switch(switch):
    sw = switch(2, elems_per_chunk=50, drop_every=7)
    n = 2000
    results = run_ranks(sw, 2, lambda w: (w.all_reduce(a := pattern(w.rank, 0, n)), a, w.stats())[1:])
    for rank in range(2):
        out, stats = results[rank]
        assert out.tobytes() == rank_order_sum(2, 0, n).tobytes()
    assert sum(results[r][1]["chunks_resent"] for r in range(2)) > 0, "drop_every=7 must force resends"
    # Every counter of the library, numbers only: the hold's probes go out
    # as HEARTBEATs, so those count at least as many.
    for rank in range(2):
        stats = results[rank][1]
        assert {"chunks_resent", "hold_probes", "held_timeouts", "heartbeats_sent", "window", "alpha", "srtt_us"} <= stats.keys()
        assert all(isinstance(v, (int, float)) for v in stats.values()), stats
        assert stats["heartbeats_sent"] >= stats["hold_probes"], stats


def test_async_collectives_complete_in_issue_order(switch):
    sw = switch(2)
    sizes = [10, 5000, 1, 3000]

    def body(w):
        bufs = [pattern(w.rank, it, n) for it, n in enumerate(sizes)]
        futs = [w.all_reduce_async(b) for b in bufs]  # all in flight at once
        done_order = []
        for i, f in enumerate(futs):
            f.add_done_callback(lambda _f, i=i: done_order.append(i))
        assert [f.result(timeout=30) is b for f, b in zip(futs, bufs)] == [True] * 4
        return bufs, done_order, w.stats()["collectives"]

    results = run_ranks(sw, 2, body)
    for rank in range(2):
        bufs, order, collectives = results[rank]
        assert order == [0, 1, 2, 3]
        assert collectives == 4
        for it, n in enumerate(sizes):
            assert bufs[it].tobytes() == rank_order_sum(2, it, n).tobytes()


def test_cpu_torch_tensor_in_place(switch):
    torch = require_torch()
    sw = switch(2)

    def body(w):
        t = torch.full((777,), float(w.rank + 1), dtype=torch.float32)
        w.all_reduce(t)
        return t

    results = run_ranks(sw, 2, body)
    assert torch.equal(results[0], torch.full((777,), 3.0))
    assert torch.equal(results[1], results[0])


def test_switch_restart_is_transparent(switch):
    sw = switch(2)
    barrier = threading.Barrier(2)

    def body(w):
        outs = []
        for it in range(4):
            if it == 2:
                barrier.wait()
                if w.rank == 0:
                    sw.restart()
                barrier.wait()
            a = pattern(w.rank, it, 3000)
            w.all_reduce(a)
            outs.append(a)
        return outs, w.stats()["rejoins"]

    results = run_ranks(sw, 2, body)
    for rank in range(2):
        outs, rejoins = results[rank]
        assert rejoins >= 1, "the restart must have been seen"
        for it in range(4):
            assert outs[it].tobytes() == rank_order_sum(2, it, 3000).tobytes()


def test_stats_has_the_library_counters(switch):
    sw = switch(1)
    with aggswitch.Worker(sw.address, job=1, rank=0, world_size=1, secret=SECRET) as w:
        w.all_reduce(np.ones(1000, dtype=np.float32))
        s = w.stats()
    assert s["collectives"] == 1
    assert s["chunks_sent"] >= 1 and s["results"] == s["chunks_sent"] - s["chunks_resent"] or s["results"] >= 1
    assert {"chunks_resent", "rejoins", "nacks", "window", "alpha", "srtt_us", "rto_us"} <= s.keys()
    # Nothing forged reached this worker: nothing ignored, nothing probed.
    assert (s["unauthenticated_dropped"], s["probes_sent"], s["spoofed_triggers"]) == (0, 0, 0)


# --- buffer rules ------------------------------------------------------------

@pytest.fixture
def worker(switch):
    sw = switch(1)
    with aggswitch.Worker(sw.address, job=1, rank=0, world_size=1, secret=SECRET) as w:
        yield w


@pytest.mark.parametrize("bad, exc, words", [
    (np.zeros(4, dtype=np.float64), TypeError, "float32"),
    (np.zeros(4, dtype=np.int32), TypeError, "float32"),
    ([1.0, 2.0], TypeError, "list"),
    (b"\0" * 16, TypeError, "float32"),
])
def test_wrong_kind_of_buffer_is_a_type_error(worker, bad, exc, words):
    with pytest.raises(exc, match=words):
        worker.all_reduce(bad)


def test_read_only_buffer_is_refused(worker):
    a = np.zeros(8, dtype=np.float32)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        worker.all_reduce(a)


def test_non_contiguous_buffer_is_refused(worker):
    a = np.zeros((4, 4), dtype=np.float32)[:, 1]
    with pytest.raises(ValueError, match="C-contiguous"):
        worker.all_reduce(a)


def test_unaligned_buffer_is_refused(worker):
    raw = np.zeros(4 * 8 + 1, dtype=np.uint8)
    a = raw[1:].view(np.float32)  # writable, C-contiguous, 1 byte off
    assert a.ctypes.data % 4 != 0 and a.flags.writeable and not a.flags.aligned
    # Refused by PyBuffer's checks (TypeError) or else by the bytemuck cast
    # (ValueError); never summed through an unaligned &mut [f32].
    with pytest.raises((TypeError, ValueError), match="(?i)aligned"):
        worker.all_reduce(a)


def test_torch_tensors_of_the_wrong_kind_are_refused(worker):
    torch = require_torch()
    with pytest.raises(TypeError, match="torch.float64"):
        worker.all_reduce(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="not contiguous"):
        worker.all_reduce(torch.zeros(4, 4)[:, 0])
    # A tensor that requires grad is still summed in place (its data).
    t = torch.ones(4, requires_grad=True)
    worker.all_reduce(t)
    assert t.detach().tolist() == [1.0] * 4


def test_bad_buffers_are_refused_before_async_starts(worker):
    with pytest.raises(TypeError):
        worker.all_reduce_async(np.zeros(4))
    assert worker.stats()["collectives"] == 0


def test_empty_buffer_is_fine(worker):
    a = np.zeros(0, dtype=np.float32)
    worker.all_reduce(a)


def test_closed_worker_says_so(switch):
    sw = switch(1)
    w = aggswitch.Worker(sw.address, job=1, rank=0, world_size=1, secret=SECRET)
    w.close()
    w.close()  # idempotent
    assert w.closed
    with pytest.raises(aggswitch.AggSwitchError, match="closed"):
        w.all_reduce(np.zeros(4, dtype=np.float32))


# --- arguments and errors ------------------------------------------------------

@pytest.mark.parametrize("kwargs, words", [
    (dict(secret="xyz"), "64 hex digits"),
    (dict(rank=2, world_size=2), "rank 2 out of range"),
    (dict(switch="not an address!"), "switch"),
    (dict(job=0), "job"),
    (dict(stall_timeout=-1.0), "stall_timeout"),
])
def test_bad_arguments_are_value_errors(switch, kwargs, words):
    sw = switch(2)
    args = dict(switch=sw.address, job=1, rank=0, world_size=2, secret=SECRET)
    args.update(kwargs)
    with pytest.raises(ValueError, match=words):
        aggswitch.Worker(args.pop("switch"), **args)


def test_bad_secret_is_refused_with_its_reason(switch):
    sw = switch(2)
    with pytest.raises(aggswitch.RefusedError, match="bad secret") as e:
        aggswitch.Worker(sw.address, job=1, rank=0, world_size=2, secret="00" * 32)
    assert e.value.reason == "bad_secret"


def test_unknown_job_is_refused_with_its_reason(switch):
    sw = switch(2)
    with pytest.raises(aggswitch.RefusedError, match="unknown job") as e:
        aggswitch.Worker(sw.address, job=9, rank=0, world_size=2, secret=SECRET)
    assert e.value.reason == "unknown_job"


def test_join_timeout_when_a_rank_never_starts(switch):
    sw = switch(2)
    t0 = time.monotonic()
    with pytest.raises(aggswitch.JoinTimeoutError, match="have all 2 ranks started") as e:
        aggswitch.Worker(sw.address, job=1, rank=0, world_size=2, secret=SECRET, join_timeout=0.5)
    assert isinstance(e.value, TimeoutError)
    assert time.monotonic() - t0 < 5


def test_stall_names_the_rank_the_switch_waits_for(switch):
    sw = switch(2)
    joined = threading.Barrier(2)
    done = threading.Event()

    def body(w):
        joined.wait()
        if w.rank == 1:  # joins, then never contributes
            done.wait(timeout=30)
            return None
        try:
            with pytest.raises(aggswitch.StalledError) as e:
                w.all_reduce(np.ones(5000, dtype=np.float32))
            return e.value
        finally:
            done.set()

    err = run_ranks(sw, 2, body, stall_timeout=1.5)[0]
    assert isinstance(err, TimeoutError)
    assert err.missing_ranks == [1]
    assert "waiting for ranks [1]" in str(err)
    # Not a tree: nothing about spines.
    assert (err.spine, err.spine_silent_for, err.missing_leaves) == (None, None, None)


def test_unreachable_switch_times_out_with_advice():
    # Nothing listens on this loopback port: the JOINs get ICMP errors.
    with pytest.raises(aggswitch.JoinTimeoutError, match="is switchd running"):
        aggswitch.Worker("127.0.0.1:9", job=1, rank=0, world_size=1, secret=SECRET, join_timeout=0.5)
