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
