"""scenario.py: what a benchmark scenario is, and its command line.

A Scenario is a name, a one-line summary, a description (its --help), a
typed list of Options and the function that runs it. `parser(scenario)`
builds the scenario's argparse parser from that list, so every scenario
parses, validates and documents its options the same way; the scenario's
run function gets the parsed namespace and returns an exit status. Pure:
building a parser touches nothing outside this process.
"""

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence


@dataclass(frozen=True)
class Option:
    """One option: --flag VALUE parsed by `type` (options.py), a switch
    (type None: store_true), or an optional positional argument (a flag
    without a leading '-')."""

    flag: str
    help: str
    type: Optional[Callable[[str], Any]] = None
    default: Any = None
    metavar: Optional[str] = None

    @property
    def dest(self):
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    description: str
    run: Callable[[argparse.Namespace], int]
    options: Sequence[Option] = field(default_factory=tuple)
    needs_root: bool = False


def parser(scenario, prog="scripts/bench"):
    """The argparse parser of `scenario`'s options."""
    p = argparse.ArgumentParser(
        prog=f"{prog} {scenario.name}",
        description=f"{scenario.summary}\n\n{scenario.description}".strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for o in scenario.options:
        shown = "" if o.default is None else f" (default {_shown(o.default)})"
        if not o.flag.startswith("-"):
            p.add_argument(o.flag, nargs="?", type=o.type, default=o.default, metavar=o.metavar or o.flag.upper(),
                           help=o.help + shown)
        elif o.type is None:
            p.add_argument(o.flag, dest=o.dest, action="store_true", help=o.help)
        else:
            p.add_argument(o.flag, dest=o.dest, type=o.type, default=o.default,
                           metavar=o.metavar or o.dest.upper(), help=o.help + shown)
    return p


def _shown(value):
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def parse(scenario, argv):
    """`scenario`'s options parsed from argv (argparse exits 2 on a bad one)."""
    return parser(scenario).parse_args(argv)
