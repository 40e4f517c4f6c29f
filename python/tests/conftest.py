"""Shared fixtures: a loopback stand-in switch (aggswitch.LoopbackSwitch, the
same proto job table switchd runs) so these tests need no root or XDP."""

import os
import threading

import pytest

import aggswitch

# Not a repeated byte: switchd refuses those (the loopback switch does not check).
SECRET = "f8d62ed1d1c316f8e2e3117ac0506fa4cc16a8cbb5810625d69f1dc586d27f3c"


@pytest.fixture
def switch():
    """A factory: switch(world_size, **options) -> a started LoopbackSwitch."""
    made = []

    def make(world_size, **options):
        sw = aggswitch.LoopbackSwitch(job=1, world_size=world_size, secret=SECRET, **options)
        made.append(sw)
        return sw

    yield make
    for sw in made:
        sw.close()


def run_ranks(sw, world_size, body, **worker_options):
    """Runs body(worker) for every rank on its own thread; returns the
    results by rank and re-raises the first exception."""
    results, errors = {}, {}

    def run(rank):
        try:
            with aggswitch.Worker(sw.address, job=1, rank=rank, world_size=world_size,
                                  secret=SECRET, join_timeout=10.0, **worker_options) as w:
                results[rank] = body(w)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors[rank] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a rank hung"
    if errors:
        raise next(iter(errors.values()))
    return results


def require_torch():
    """torch, or a skip (a failure under CI=true, where setup installs it)."""
    try:
        import torch
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("torch is not installed in the project venv; run scripts/setup.sh")
        pytest.skip("torch is not installed (scripts/setup.sh installs it)")
    return torch
