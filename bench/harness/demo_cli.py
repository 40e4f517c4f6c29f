"""demo_cli.py: `scripts/demo [MODE] [options]`, the demos' one command
line: MODE is one of the registry in demos/__init__.py (default `single`);
`scripts/demo --help` documents every mode and its options. As in the bash
demo before it, `scripts/demo --leaves L --spines K ...` runs the tree mode.
SIGTERM becomes SystemExit, so the testbed and every process a demo holds
are cleaned up as on Ctrl-C. Argument parsing (select, parse_args) is pure.
"""

import signal
import sys

import lifecycle
from demos import DEFAULT, EXTRA_ARGS, MODES
from scenario import parser

PROG = "scripts/demo"
# Options only the tree mode has: given to the default mode, they select it.
TREE_ONLY = ("--leaves", "--spines")


def usage():
    width = max(len(m.name) for m in MODES.values())
    lines = [f"usage: sudo {PROG} [{'|'.join(MODES)}] [options] [-- TRAIN_ARGS (ddp)]", "",
             "The demos: install what is missing (scripts/setup.sh), build, make a testbed,",
             "run a verified all-reduce through the switch, print the report and",
             "DEMO PASSED or DEMO FAILED (ddp: train with DDP through it, TRAIN PASSED",
             "or TRAIN FAILED).", "", "modes:"]
    lines += [f"  {m.name:<{width}}  {m.summary}" for m in MODES.values()]
    for m in MODES.values():
        lines += ["", "-" * 72, parser(m, prog=PROG).format_help().rstrip()]
        if m.name in EXTRA_ARGS:
            lines += ["", f"  -- {EXTRA_ARGS[m.name]}"]
    return "\n".join(lines)


def select(argv):
    """(mode, its arguments) for a command line: a leading mode name picks
    that mode, otherwise the default one, or tree when --leaves or
    --spines is given."""
    if argv and argv[0] in MODES:
        return MODES[argv[0]], list(argv[1:])
    if any(a.split("=", 1)[0] in TREE_ONLY for a in argv):
        return MODES["tree"], list(argv)
    return MODES[DEFAULT], list(argv)


def parse_args(argv):
    """(mode, parsed options); argparse exits 2 on a bad option. A mode of
    EXTRA_ARGS gets the arguments after `--` as `extra`; the others refuse them."""
    mode, rest = select(argv)
    p = parser(mode, prog=PROG)
    extra = []
    if "--" in rest:
        rest, extra = rest[:rest.index("--")], rest[rest.index("--") + 1:]
        if mode.name not in EXTRA_ARGS:
            p.error("takes no arguments after --")
    args = p.parse_args(rest)
    args.extra = extra
    return mode, args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    if argv and not argv[0].startswith("-") and argv[0] not in MODES:
        print(f"{PROG}: unknown mode '{argv[0]}'\n\n{usage()}", file=sys.stderr)
        return 2
    mode, args = parse_args(argv)
    lifecycle.set_name(mode.name, prog="demo")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if mode.needs_root:
            lifecycle.require_root(mode.name, select(argv)[1], prog=PROG)
        return mode.run(args) or 0
    except lifecycle.HarnessError as e:
        lifecycle.log(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        lifecycle.log("interrupted")
        return 130
