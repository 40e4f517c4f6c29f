"""Hugging Face ``transformers.Trainer``: DDP with the gradients summed in
the switch.

    from aggswitch.transformers import AggSwitchCallback
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.add_callback(AggSwitchCallback(trainer))
    trainer.train()

The Trainer wraps the model in DDP itself (through Accelerate) when it runs
on more than one process, and takes no communication hook: the callback
registers ours on that wrapper (``trainer.model_wrapped``) when training
begins, before the first backward. The state defaults to
``aggswitch.torch.state_from_env()`` and the hook to the one of its dtype
(``AGGSWITCH_DTYPE=bf16``: ``bf16_compress_hook``). Fallback to the hosts
and ``AGGSWITCH_MODE=hosts`` work as everywhere (docs/PYTORCH.md, "When
something goes wrong"). FSDP through the Trainer is not covered here: call
``aggswitch.torch.register_fsdp_comms`` on the prepared model instead.
Needs ``transformers``.
"""

from typing import Any, Callable

import torch
from transformers import TrainerCallback

from . import torch as agt

__all__ = ["AggSwitchCallback"]

_HOOKS = {"f32": agt.allreduce_hook, "bf16": agt.bf16_compress_hook, "f16": agt.fp16_compress_hook}


class AggSwitchCallback(TrainerCallback):
    """Registers the switch's DDP hook on ``trainer``'s DDP wrapper when
    training begins. ``state``: an ``AggSwitchState`` (default: made from
    the environment when training begins, closed when it ends); ``hook``:
    default the state's dtype's. ``state`` is the one in use (None before
    the first ``train()``)."""

    def __init__(
        self,
        trainer: Any,
        state: "agt.AggSwitchState | None" = None,
        hook: Callable | None = None,
    ) -> None:
        self._trainer = trainer
        self._own_state = state is None
        self.state = state
        self._hook = hook
        self._registered: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ddp = self._trainer.model_wrapped
        if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            if args.world_size > 1:
                raise agt.UnsupportedError(
                    f"AggSwitchCallback: the Trainer runs {args.world_size} processes but did not wrap the "
                    f"model in DistributedDataParallel ({type(ddp).__name__}); with FSDP call "
                    "aggswitch.torch.register_fsdp_comms on the prepared model instead"
                )
            return  # one process: nothing to all-reduce
        if self._registered is ddp:
            return  # a second train() on the same wrapper: the hook is in place
        if self.state is None:
            self.state = agt.state_from_env()
        hook = self._hook if self._hook is not None else _HOOKS[self.state.dtype]
        ddp.register_comm_hook(self.state, hook)
        self._registered = ddp

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._own_state and self.state is not None:
            self.state.close()
