"""Gradient statistics (docs/PROTOCOL.md, "Gradient statistics") through the
loopback stand-in with ``stats=True``: every rank's ``gradient_stats()`` is
the same bits, and those are the protocol's float64 order computed here in
plain Python (8 lanes per chunk, ranks in rank order, chunks in seq order)
and by the Rust reference ``aggswitch.reference_stats``; under loss, for
f32, bf16 and f16; and the errors say why there are none."""

import numpy as np
import pytest

import aggswitch
from aggswitch.errors import GradientStatsError
from conftest import SECRET, run_ranks

LANES = 8


def bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    u = x.astype(np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def inputs_for(dtype, rank, n, seed=0):
    """Values across many binades, so that float64 sums round and their
    order shows."""
    rng = np.random.default_rng(1000 * seed + rank)
    span = 8 if dtype == "f16" else 20  # f16 ends at 65504
    x = (rng.standard_normal(n) * np.float32(2.0) ** rng.integers(-span, span, n)).astype(np.float32)
    if dtype == "bf16":
        return f32_to_bf16_bits(x)
    return x.astype(np.float16) if dtype == "f16" else x


def widen(dtype, a):
    return bf16_bits_to_f32(a) if dtype == "bf16" else a.astype(np.float32)


def squared_norm(x):
    """‖x‖² in the protocol's order: float64 squares, element k into lane
    k mod 8 in increasing k, lanes combined ((0+1)+(2+3))+((4+5)+(6+7))."""
    lane = [0.0] * LANES
    for k, v in enumerate(x.astype(np.float64).tolist()):
        lane[k % LANES] += v * v
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]))


def protocol_stats(inputs, chunks):
    """The statistics of a collective whose chunks are the index ranges
    ``chunks`` (seq order) of the ranks' float32 ``inputs``."""
    sos = sqs = 0.0
    for lo, hi in chunks:
        part = [x[lo:hi] for x in inputs]
        chunk_sos = 0.0
        for p in part:
            chunk_sos += squared_norm(p)
        acc = part[0].copy()
        for p in part[1:]:
            acc = acc + p  # float32 adds, rank order
        sos += chunk_sos
        sqs += squared_norm(acc)
    return {"sum_of_squares": sos, "square_of_sum": sqs, "n": len(inputs)}


def all_reduce_chunks(n, e):
    return [(lo, min(lo + e, n)) for lo in range(0, n, e)]


def reduce_scatter_chunks(world, m, e):
    return [(s * m + j, s * m + min(j + e, m)) for s in range(world) for j in range(0, m, e)]


def bits(d):
    return (
        np.float64(d["sum_of_squares"]).view(np.uint64),
        np.float64(d["square_of_sum"]).view(np.uint64),
        d["n"],
    )


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_all_reduce_statistics_are_the_protocols_float64_order_bit_for_bit(switch, dtype):
    world, n, e = 4, 3001, 256
    sw = switch(world, elems_per_chunk=e, dtype=dtype, drop_every=7, stats=True)

    def body(w):
        a = inputs_for(dtype, w.rank, n)
        w.all_reduce(a)
        return w.elems_per_chunk, w.gradient_stats(), w.stats()

    got = run_ranks(sw, world, body, dtype=dtype)
    ins = [widen(dtype, inputs_for(dtype, r, n)) for r in range(world)]
    want = protocol_stats(ins, all_reduce_chunks(n, e))
    assert sum(got[r][2]["chunks_resent"] for r in range(world)) > 0, "no loss exercised"
    for r in range(world):
        assert got[r][0] == e
        assert bits(got[r][1]) == bits(want), f"{dtype} rank {r}: {got[r][1]} != {want}"
    # The Rust reference agrees; a plain float64 sum is close, and in
    # element order other bits: the documented order is what makes every
    # rank and run the same.
    assert bits(aggswitch.reference_stats(ins, e)) == bits(want)
    naive = float(sum(np.sum(x.astype(np.float64) ** 2) for x in ins))
    assert naive == pytest.approx(want["sum_of_squares"], rel=1e-12)
    in_element_order = 0.0
    for x in ins:
        for v in x.astype(np.float64).tolist():
            in_element_order += v * v
    assert in_element_order != want["sum_of_squares"]
    total = ins[0].astype(np.float64)
    for x in ins[1:]:
        total = total + x
    assert float(np.sum(total**2)) == pytest.approx(want["square_of_sum"], rel=1e-6)


def test_reduce_scatter_statistics_cover_every_shard(switch):
    world, m, e = 3, 700, 256
    sw = switch(world, elems_per_chunk=e, stats=True, drop_every=13)

    def body(w):
        x = inputs_for("f32", w.rank, world * m, seed=3)
        out = np.zeros(m, np.float32)
        w.reduce_scatter(x, out)
        return w.gradient_stats()

    got = run_ranks(sw, world, body)
    ins = [inputs_for("f32", r, world * m, seed=3) for r in range(world)]
    want = protocol_stats(ins, reduce_scatter_chunks(world, m, e))
    assert bits(aggswitch.reference_stats(ins, e, kind="reduce_scatter")) == bits(want)
    for r in range(world):
        assert bits(got[r]) == bits(want), f"rank {r}"


def test_each_async_all_reduce_gets_its_own_statistics(switch):
    world, n, e = 2, 2000, 300
    sw = switch(world, elems_per_chunk=e, stats=True)

    def body(w):
        bufs = [inputs_for("f32", w.rank, n, seed=s) for s in (1, 2, 3)]
        futs = [w.all_reduce_async(b) for b in bufs]
        return [f.gradient_stats() for f in futs], w.gradient_stats()

    got = run_ranks(sw, world, body)
    wants = [
        protocol_stats([inputs_for("f32", r, n, seed=s) for r in range(world)], all_reduce_chunks(n, e))
        for s in (1, 2, 3)
    ]
    assert len({bits(w)[0] for w in wants}) == 3
    for r in range(world):
        per_future, last = got[r]
        assert [bits(s) for s in per_future] == [bits(w) for w in wants], f"rank {r}"
        assert bits(last) == bits(wants[-1])


def test_no_statistics_raise_and_say_why(switch):
    sw = switch(1, stats=True)
    with aggswitch.Worker(sw.address, job=1, rank=0, world_size=1, secret=SECRET) as w:
        assert w.has_gradient_stats
        with pytest.raises(GradientStatsError, match="no collective has completed") as e:
            w.gradient_stats()
        assert e.value.reason == "no_collective"
        x = np.arange(10, dtype=np.float32)
        w.all_reduce(x)
        assert w.gradient_stats() == {
            "sum_of_squares": float(np.sum(np.arange(10.0) ** 2)),
            "square_of_sum": float(np.sum(np.arange(10.0) ** 2)),
            "n": 1,
        }
        out = np.zeros(10, np.float32)
        w.all_gather(x, out)
        with pytest.raises(GradientStatsError, match="all-gather or broadcast") as e:
            w.gradient_stats()
        assert e.value.reason == "not_summed"
    plain = switch(1)
    with aggswitch.Worker(plain.address, job=1, rank=0, world_size=1, secret=SECRET) as w:
        assert not w.has_gradient_stats
        w.all_reduce(np.ones(4, np.float32))
        with pytest.raises(GradientStatsError, match="stats = true") as e:
            w.gradient_stats()
        assert e.value.reason == "not_a_stats_job"
        with pytest.raises(GradientStatsError):
            w.all_reduce_async(np.ones(4, np.float32)).gradient_stats()


def test_reference_stats_refuses_inputs_it_cannot_sum():
    a = np.ones(6, np.float32)
    with pytest.raises(ValueError, match="same length"):
        aggswitch.reference_stats([a, np.ones(5, np.float32)], 4)
    with pytest.raises(ValueError, match="not a multiple of 4 inputs"):
        aggswitch.reference_stats([a] * 4, 4, kind="reduce_scatter")
    with pytest.raises(ValueError, match="all_gather"):
        aggswitch.reference_stats([a], 4, kind="all_gather")
    with pytest.raises(TypeError, match="float32"):
        aggswitch.reference_stats([np.ones(6, np.float64)], 4)


def test_statistics_turned_on_by_a_restart_mid_collective_are_incomplete(switch):
    """A job declared ``stats = true`` at a switch restart in the middle of
    its second collective (the stand-in restarts itself at that
    collective's DATA of chunk 120, ``restart_at``): the first has no
    statistics (``not_a_stats_job``), the second was summed but its chunks
    before the restart were never measured (``incomplete``, not
    ``not_summed``), the third's are whole, the protocol's bits."""
    world, e, chunks = 2, 100, 200
    n = chunks * e  # collective k: seqs k·chunks .. (k+1)·chunks − 1
    sw = switch(world, elems_per_chunk=e, restart_at=(1, chunks + 120), stats_after_restart=True)

    def body(w):
        got = []
        for seed in range(3):
            w.all_reduce(inputs_for("f32", w.rank, n, seed=seed))
            try:
                got.append(w.gradient_stats())
            except GradientStatsError as err:
                got.append((err.reason, str(err)))
        return got, w.stats()["rejoins"]

    got = run_ranks(sw, world, body)
    want = protocol_stats([inputs_for("f32", r, n, seed=2) for r in range(world)], all_reduce_chunks(n, e))
    for r in range(world):
        per_collective, rejoins = got[r]
        assert rejoins >= 1, f"rank {r}: the scripted restart made it rejoin"
        assert per_collective[0][0] == "not_a_stats_job"
        reason, msg = per_collective[1]
        assert reason == "incomplete", msg
        assert "collective 1 was summed" in msg and "switch restarted" in msg, msg
        assert bits(per_collective[2]) == bits(want), f"rank {r}"
    with pytest.raises(ValueError, match="needs restart_at"):
        aggswitch.LoopbackSwitch(job=1, world_size=1, secret=SECRET, stats_after_restart=True)
