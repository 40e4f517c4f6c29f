"""What one rank of test_lightning.py runs: a LightningModule trained with
AggSwitchDDPStrategy on CPU, the process group made by Lightning inside
fit(). Not a test file."""

import hashlib
import os

import torch
import torch.nn as nn
import lightning.pytorch as pl

SECRET = "f8d62ed1d1c316f8e2e3117ac0506fa4cc16a8cbb5810625d69f1dc586d27f3c"


class MLP(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 40), nn.ReLU(), nn.Linear(40, 5))

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Stats(pl.Callback):
    """The switch worker's counters at the end of training (teardown closes
    the state)."""

    def on_train_end(self, trainer, module):
        self.stats = trainer.strategy.aggswitch_state.stats()


def train(rank, world, port, address, steps, q):
    torch.set_num_threads(1)
    # What a launcher (torchrun, a cluster) sets; the state is made before
    # Lightning makes the process group.
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NODE_RANK=str(rank), LOCAL_RANK="0",
        AGGSWITCH_JOB="1",
    )
    if address == "hosts":  # the host path: no switch at all
        os.environ.update(AGGSWITCH_MODE="hosts")
    else:
        os.environ.update(AGGSWITCH_SWITCH=address, AGGSWITCH_SECRET=SECRET)
    from aggswitch.lightning import AggSwitchDDPStrategy

    strategy = AggSwitchDDPStrategy(process_group_backend="gloo")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 12, generator=g)
    y = (x @ torch.randn(12, 5, generator=g)).argmax(1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    model, stats = MLP(), _Stats()
    trainer = pl.Trainer(
        strategy=strategy, accelerator="cpu", devices=1, num_nodes=world, max_steps=steps,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[stats],
    )
    trainer.fit(model, data)
    h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    q.put(dict(rank=rank, digest=h.hexdigest(), stats=stats.stats, world=trainer.world_size))
