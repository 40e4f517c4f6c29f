"""aggswitch.torch's FSDP comms with CUDA tensors (staged through host
memory): 4 ranks sharing one GPU, gloo process group, the loopback stand-in
switch. Skipped without a GPU (CI has none)."""

import pytest

from conftest import SECRET, launch, require_torch

torch = require_torch()
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import aggswitch  # noqa: E402
import fsdp_ranks  # noqa: E402

WORLD, STEPS = 4, 100


def test_fsdp_and_hsdp_on_cuda_through_the_switch():
    switches = [aggswitch.LoopbackSwitch(job=1, world_size=w, secret=SECRET, elems_per_chunk=64)
                for w in (WORLD, WORLD, 2, 2)]
    try:
        got = launch(fsdp_ranks.cuda_runs, WORLD, [s.address for s in switches], STEPS, timeout=300.0)
    finally:
        for s in switches:
            s.close()
    by = {g["rank"]: g for g in got}
    print({r: {k: by[r][k]["loss"] for k in ("cpu", "cuda", "hsdp")} for r in by})
    for name in ("cpu", "cuda", "hsdp"):
        assert len({g[name]["full"] for g in got}) == 1, f"{name}: ranks gathered different parameters"
        assert len({g[name]["loss"] for g in got}) == 1, name
    assert by[0]["cuda"]["on"].startswith("cuda") and by[0]["cpu"]["on"] == "cpu"
    assert by[0]["cuda"]["collectives"] >= STEPS * 9
    # CUDA's float32 kernels round differently from the CPU's (TF32 off):
    # the same training, not the same bits.
    c, g = by[0]["cpu"]["loss"], by[0]["cuda"]["loss"]
    assert abs(c - g) <= 1e-3 * c, (c, g)
    assert by[0]["hsdp"]["local"] == by[2]["hsdp"]["local"] and by[1]["hsdp"]["local"] == by[3]["hsdp"]["local"]
    assert by[0]["hsdp"]["collectives"] >= STEPS * 3
