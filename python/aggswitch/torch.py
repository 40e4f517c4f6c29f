"""A PyTorch DDP communication hook that sums gradients in the switch.

    import aggswitch.torch as agt
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(agt.state_from_env(), agt.allreduce_hook)

``state_from_env()`` reads ``AGGSWITCH_SWITCH`` (address[:port]),
``AGGSWITCH_JOB`` and ``AGGSWITCH_SECRET`` (64 hex digits) or
``AGGSWITCH_SECRET_FILE``, and takes rank and world size from
``torch.distributed``. The first bucket joins the job; every bucket is then
all-reduced on one background thread, in the order DDP hands them over
(the same on every rank), while backward goes on. The result is the mean
over ranks, as DDP's default hook gives, bit-identical on every rank.

``bf16_compress_hook`` (and ``fp16_compress_hook``) send half the bytes: like
PyTorch's hooks of the same names, each bucket is cast to bfloat16 (float16)
and divided by the world size, summed in the switch (in float32, rounded
once), and cast back into the bucket. The job is declared with
``dtype = "bf16"`` (``"f16"``) on the switch and the state made with
``AggSwitchState(..., dtype="bf16")`` (or ``AGGSWITCH_DTYPE=bf16``).

Surviving the switch: with fallback on (the default; ``AGGSWITCH_FALLBACK=off``
or ``fallback=False`` to fail fast), a collective that fails on the switch
is finished on the hosts over the process group, with the switch's bits,
and the job comes back to the switch once every rank sees it answer
(``aggswitch._path``; docs/PYTORCH.md, "When something goes wrong").
``AGGSWITCH_MODE=hosts`` (``mode="hosts"``) runs on the host path alone.

The process group (gloo) stays in charge of everything else DDP does:
parameter broadcast at construction, barriers, ``find_unused_parameters``
bookkeeping.

Gradient noise scale: a job declared ``stats = true`` has the switch measure,
per collective, every rank's squared gradient norm and the squared norm of
their sum. ``GradientNoiseScale(state, batch_per_rank=b)`` collects them from
the DDP hooks and estimates McCandlish et al.'s B_noise once per step (call
its ``step()`` after each ``backward()``); ``AdaptiveBatch`` grows the global
batch from it (docs/PYTORCH.md, "Gradient noise scale").

FSDP2 (``fully_shard``): ``register_fsdp_comms(model, state)`` sends every
FSDPModule's gradient reduce-scatter and parameter all-gather through the
switch; ``register_hsdp_all_reduce(model, state)`` sends HSDP's replica
all-reduce (docs/PYTORCH.md, "Train with FSDP"). The state takes rank and world size
when it first joins (from its ``group``, the collective's process group, or
torch.distributed's), so it may be made before the process group.
"""

# The code lives in private modules, one per concern, each importing only
# from those listed before it (at run time; _gns names AggSwitchState for
# type checking only):
#   _gns.py    GradientNoiseScale, AdaptiveBatch (imports nothing of the package)
#   _state.py  AggSwitchState, state_from_env (on _path, Worker, errors)
#   _ddp.py    the DDP hooks (on _state)
#   _fsdp.py   FSDP2 and HSDP comms, UnsupportedError (on _state, errors)
# This module is the public face: it re-exports them and is imported by
# nothing of the package but lightning.py and transformers.py.

from ._ddp import allreduce_hook, bf16_compress_hook, fp16_compress_hook
from ._fsdp import (
    SwitchAllGather,
    SwitchReduceScatter,
    UnsupportedError,
    register_fsdp_comms,
    register_hsdp_all_reduce,
)
from ._gns import AdaptiveBatch, GradientNoiseScale
from ._state import AggSwitchState, state_from_env

__all__ = [
    "AggSwitchState",
    "state_from_env",
    "allreduce_hook",
    "bf16_compress_hook",
    "fp16_compress_hook",
    "register_fsdp_comms",
    "register_hsdp_all_reduce",
    "SwitchReduceScatter",
    "SwitchAllGather",
    "UnsupportedError",
    "GradientNoiseScale",
    "AdaptiveBatch",
]

# The public names keep the module they had before the split, in reprs,
# tracebacks (aggswitch.torch.UnsupportedError) and pickles.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
