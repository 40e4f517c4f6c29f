"""demos: the registry of `scripts/demo` modes, one module each (a
Scenario of scenario.py: name, summary, --help text, typed options, run);
`single` is the default mode and the order here is the order
`scripts/demo --help` lists them."""

from demos import ddp, single, tree

MODES = {m.name: m for m in (
    single.MODE,
    tree.MODE,
    ddp.MODE,
)}
DEFAULT = single.MODE.name
# Modes that pass the arguments after `--` on (as the namespace's `extra`),
# and what those are, for --help.
EXTRA_ARGS = {ddp.MODE.name: "TRAIN_ARGS: options for examples/train_ddp.py (--hidden, --batch, ...)"}
