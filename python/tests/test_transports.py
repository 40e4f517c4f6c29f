"""The worker's UDP data paths through the loopback stand-in: every
transport sums bit for bit and says which one ran; loopback keeps checksum
offload on, so "udp-gso" works there and "auto" picks it."""

import numpy as np
import pytest

import aggswitch
from conftest import SECRET, run_ranks
from test_worker import pattern, rank_order_sum


@pytest.mark.parametrize("transport, runs", [
    ("mmsg", "mmsg"),
    ("udp-gso", "udp-gso"),
    ("auto", "udp-gso"),
])
def test_each_transport_sums_bit_for_bit_and_reports_itself(switch, transport, runs):
    sw = switch(3, elems_per_chunk=100)
    n = 20_001  # 201 chunks, the last one short

    def body(w):
        outs = []
        for it in range(2):
            a = pattern(w.rank, it, n)
            w.all_reduce(a)
            outs.append(a.copy())
        return w.transport, w.stats(), outs

    results = run_ranks(sw, 3, body, transport=transport)
    for rank, (ran, stats, outs) in results.items():
        assert ran == runs, f"rank {rank}"
        # Only udp-gso sends DATA in super-datagrams.
        assert (stats["tx_coalesced"] > 0) == (runs == "udp-gso"), stats
        for it, got in enumerate(outs):
            want = rank_order_sum(3, it, n)
            assert got.tobytes() == want.tobytes(), f"{transport} rank {rank} iteration {it}"


def test_unknown_transport_is_a_value_error_naming_the_choices(switch):
    sw = switch(1)
    with pytest.raises(ValueError, match='"udp-gso"'):
        aggswitch.Worker(sw.address, job=1, rank=0, world_size=1, secret=SECRET, transport="gso")


@pytest.mark.parametrize("delay_target", [None, 0.0, 0.0005])
def test_the_delay_signal_setting_leaves_the_sum_bit_for_bit(switch, delay_target):
    # None and 0 turn the signal off; a tight 0.5 ms target marks whatever
    # queueing loopback shows: the window may move, the sum may not.
    sw = switch(2, elems_per_chunk=100)
    n = 30_001

    def body(w):
        a = pattern(w.rank, 0, n)
        w.all_reduce(a)
        return a

    for rank, got in run_ranks(sw, 2, body, delay_target=delay_target).items():
        assert got.tobytes() == rank_order_sum(2, 0, n).tobytes(), f"rank {rank}"


@pytest.mark.parametrize("bad", [-0.001, 2.0, float("nan")])
def test_a_delay_target_out_of_range_is_a_value_error_saying_the_unit(switch, bad):
    sw = switch(1)
    with pytest.raises(ValueError, match=r"delay_target .*seconds in 0\.\.=1"):
        aggswitch.Worker(sw.address, job=1, rank=0, world_size=1, secret=SECRET, delay_target=bad)


@pytest.mark.parametrize("transport", ["mmsg", "udp-gso"])
def test_a_switch_with_seq_lanes_sums_bit_for_bit_and_workers_learn_the_lanes(switch, transport):
    sw = switch(3, elems_per_chunk=100, seq_lanes=4)
    n = 20_001

    def body(w):
        a = pattern(w.rank, 0, n)
        w.all_reduce(a)
        return w.seq_lanes, a

    for rank, (lanes, got) in run_ranks(sw, 3, body, transport=transport).items():
        assert lanes == 4, f"rank {rank}"
        assert got.tobytes() == rank_order_sum(3, 0, n).tobytes(), f"rank {rank}"


def test_seq_lanes_that_are_not_a_power_of_two_are_a_value_error(switch):
    with pytest.raises(ValueError, match="seq_lanes 3 is not a power of two"):
        switch(2, seq_lanes=3)
