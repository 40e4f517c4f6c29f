"""Shared fixtures: a loopback stand-in switch (aggswitch.LoopbackSwitch, the
same proto job table switchd runs) so these tests need no root or XDP."""

import importlib.util
import multiprocessing
import os
import queue
import socket
import threading
import time

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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_CTX = multiprocessing.get_context("forkserver")
# Ranks are forks of a forkserver that imported torch (and Lightning) once:
# about 4 s of imports saved per rank.
_CTX.set_forkserver_preload(
    ["torch", "torch.distributed.fsdp", "aggswitch.torch"]
    + (["lightning.pytorch"] if importlib.util.find_spec("lightning") else [])
)


def launch(target, world, *args, timeout=120.0):
    """Starts target(rank, world, port, *args, q) in `world` processes (a
    gloo rendezvous on 127.0.0.1:port) and returns the `world` dicts they
    put on the queue q, in arrival order. Fails at once when a rank dies
    with an error (its traceback is in the captured stderr)."""
    q = _CTX.Queue()
    port = free_port()
    procs = [_CTX.Process(target=target, args=(r, world, port, *args, q)) for r in range(world)]
    for p in procs:
        p.start()
    got, deadline = [], time.monotonic() + timeout
    try:
        while len(got) < world:
            try:
                got.append(q.get(timeout=0.5))
                continue
            except queue.Empty:
                pass
            codes = [p.exitcode for p in procs]
            if any(c not in (None, 0) for c in codes):
                pytest.fail(f"a rank failed (exit codes {codes}; its traceback is in the captured stderr)")
            if time.monotonic() > deadline:
                pytest.fail(f"ranks did not report within {timeout} s (exit codes {codes})")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return got
