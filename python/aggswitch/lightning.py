"""PyTorch Lightning: DDP with the gradients summed in the switch.

    from aggswitch.lightning import AggSwitchDDPStrategy
    trainer = lightning.Trainer(strategy=AggSwitchDDPStrategy(), accelerator="cpu", devices=4)

``AggSwitchDDPStrategy`` is Lightning's ``DDPStrategy`` (same arguments) with
two differences: the hook state defaults to ``aggswitch.torch.state_from_env()``
and the hook to the one that matches its dtype, and the hook is registered on
any device. Lightning's own ``DDPStrategy`` registers a comm hook only when
the root device is CUDA, so on CPU ``ddp_comm_hook=`` is ignored without a
word and the run silently trains on gloo. The state may be made before the
process group (Lightning makes it inside ``fit()``): it takes rank and world
size when it first joins. Needs ``lightning`` (the ``lightning.pytorch``
namespace).
"""

from typing import Any, Callable

from lightning.pytorch.strategies import DDPStrategy

from . import torch as agt

__all__ = ["AggSwitchDDPStrategy"]

_HOOKS = {"f32": agt.allreduce_hook, "bf16": agt.bf16_compress_hook, "f16": agt.fp16_compress_hook}


class AggSwitchDDPStrategy(DDPStrategy):
    """``DDPStrategy`` whose gradient all-reduce goes through the switch, on
    CPU as on CUDA. ``ddp_comm_state`` defaults to ``state_from_env()``,
    ``ddp_comm_hook`` to the hook of the state's dtype; other arguments are
    ``DDPStrategy``'s. ``ddp_comm_wrapper`` is refused (use
    ``aggswitch.torch.bf16_compress_hook`` to send bf16)."""

    strategy_name = "aggswitch_ddp"

    def __init__(
        self,
        *args: Any,
        ddp_comm_state: "agt.AggSwitchState | None" = None,
        ddp_comm_hook: Callable | None = None,
        ddp_comm_wrapper: Callable | None = None,
        **kwargs: Any,
    ) -> None:
        if ddp_comm_wrapper is not None:
            raise ValueError(
                "AggSwitchDDPStrategy: ddp_comm_wrapper is not supported; to send bfloat16, "
                "declare the job with dtype = \"bf16\" and set AGGSWITCH_DTYPE=bf16 (the strategy "
                "then picks aggswitch.torch.bf16_compress_hook)"
            )
        state = ddp_comm_state if ddp_comm_state is not None else agt.state_from_env()
        hook = ddp_comm_hook if ddp_comm_hook is not None else _HOOKS[state.dtype]
        self._aggswitch_state = state
        self._aggswitch_hook = hook
        super().__init__(*args, ddp_comm_state=state, ddp_comm_hook=hook, **kwargs)

    @property
    def aggswitch_state(self) -> "agt.AggSwitchState":
        """The hook's state: its ``stats()`` are the switch worker's counters."""
        return self._aggswitch_state

    def configure_ddp(self) -> None:
        super().configure_ddp()
        # DDPStrategy registered the hook itself only on CUDA (its
        # _register_ddp_hooks); register it through DDP's public API elsewhere.
        if self.root_device.type != "cuda":
            self.model.register_comm_hook(self._aggswitch_state, self._aggswitch_hook)

    def teardown(self) -> None:
        super().teardown()
        self._aggswitch_state.close()
