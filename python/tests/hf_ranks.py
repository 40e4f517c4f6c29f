"""What one rank of test_transformers.py runs: a tiny model trained by
transformers.Trainer on CPU under DDP (gloo), with AggSwitchCallback.
Not a test file."""

import hashlib
import os
import tempfile

import torch


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))

    def forward(self, x, labels=None):
        logits = self.net(x)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


def trainer_run(rank, world, port, env, q):
    os.environ.update(env)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import transformers

    from aggswitch.transformers import AggSwitchCallback

    torch.manual_seed(0)
    model = _Model()
    g = torch.Generator().manual_seed(7)
    data = [{"x": torch.randn(10, generator=g), "labels": int(torch.randint(3, (1,), generator=g))} for _ in range(256)]
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, per_device_train_batch_size=8, max_steps=6, use_cpu=True, report_to=[],
            save_strategy="no", logging_strategy="no", ddp_backend="gloo", seed=0, data_seed=0,
            dataloader_num_workers=0, learning_rate=0.05,
        )
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
        cb = AggSwitchCallback(trainer)
        trainer.add_callback(cb)
        trainer.train()
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
    q.put(dict(rank=rank, digest=h.hexdigest(), stats=cb.state.stats(), wrapped=type(trainer.model_wrapped).__name__))
