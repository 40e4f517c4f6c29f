"""aggswitch.lightning: a Lightning Trainer on CPU, 2 ranks as processes,
DDP's gradients summed in the loopback stand-in switch."""

import importlib.util
import os

import pytest

from conftest import require_torch

require_torch()
if importlib.util.find_spec("lightning") is None:
    if os.environ.get("CI") == "true":
        pytest.fail("lightning is not installed in the project venv; run scripts/setup.sh", pytrace=False)
    pytest.skip("lightning is not installed (pip install lightning)", allow_module_level=True)

import lightning_ranks  # noqa: E402
from conftest import SECRET, launch  # noqa: E402

WORLD, STEPS = 2, 20


def test_trainer_on_cpu_sums_in_the_switch(switch):
    sw = switch(WORLD)
    got = launch(lightning_ranks.train, WORLD, sw.address, STEPS, timeout=120.0)
    assert {g["world"] for g in got} == {WORLD}
    # DDPStrategy alone would leave the hook unregistered on CPU: 0 collectives
    for g in got:
        assert g["stats"]["collectives"] == STEPS, g["stats"]  # one bucket per step
    assert len({g["digest"] for g in got}) == 1, "ranks hold different weights"
    # The same training on the host path (AGGSWITCH_MODE=hosts): the same bits.
    hosts = launch(lightning_ranks.train, WORLD, "hosts", STEPS, timeout=120.0)
    assert {g["digest"] for g in hosts} == {got[0]["digest"]}, "the host path ended with other weights"
    assert all(g["stats"]["host_collectives"] == STEPS for g in hosts)


def test_a_comm_wrapper_is_refused_with_what_to_do():
    from aggswitch.lightning import AggSwitchDDPStrategy
    import aggswitch.torch as agt

    state = agt.AggSwitchState("127.0.0.1:9", job=1, secret=SECRET)
    with pytest.raises(ValueError, match="AGGSWITCH_DTYPE=bf16"):
        AggSwitchDDPStrategy(ddp_comm_state=state, ddp_comm_wrapper=lambda h: h)
    state.close()
