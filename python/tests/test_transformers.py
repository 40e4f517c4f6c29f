"""aggswitch.transformers: Hugging Face Trainer (DDP over gloo, 2 CPU
ranks) with the gradients summed by the loopback switch, and the same on
the host path: the same weights on every rank and in both runs."""

import os

import pytest

from conftest import SECRET, launch, require_torch

require_torch()
try:
    import transformers  # noqa: F401
except ImportError:
    if os.environ.get("CI") == "true":
        pytest.fail("transformers is not installed in the project venv; run scripts/setup.sh")
    pytest.skip("transformers is not installed (scripts/setup.sh installs it)", allow_module_level=True)

import hf_ranks  # noqa: E402

WORLD = 2


def test_trainer_through_the_switch_and_on_the_hosts_ends_bit_identical(switch):
    sw = switch(WORLD)
    env = dict(AGGSWITCH_SWITCH=sw.address, AGGSWITCH_JOB="1", AGGSWITCH_SECRET=SECRET)
    got = launch(hf_ranks.trainer_run, WORLD, env, timeout=300)
    assert {r["wrapped"] for r in got} == {"DistributedDataParallel"}
    assert len({r["digest"] for r in got}) == 1, "ranks ended with different weights"
    for r in got:
        assert r["stats"]["switch_collectives"] >= 6 and r["stats"]["host_collectives"] == 0, r["stats"]
    hosts = launch(hf_ranks.trainer_run, WORLD, dict(AGGSWITCH_MODE="hosts"), timeout=300)
    assert {r["digest"] for r in hosts} == {got[0]["digest"]}, "the host path ended with other weights"
    assert all(r["stats"]["host_collectives"] >= 6 for r in hosts)
