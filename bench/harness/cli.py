"""cli.py: `scripts/bench <scenario> [options]`, the one command line of
the benchmarks. `scripts/bench --help` lists the scenarios (the registry in
scenarios/__init__.py); `scripts/bench <scenario> --help` their options.
SIGTERM becomes SystemExit, so every testbed and process a scenario holds
is cleaned up as on Ctrl-C.
"""

import signal
import sys

import lifecycle
from scenario import parse
from scenarios import SCENARIOS


def usage():
    width = max(len(s.name) for s in SCENARIOS.values())
    lines = ["usage: scripts/bench <scenario> [options]", "",
             "Benchmarks, one scenario each; results in bench/results/.", "", "scenarios:"]
    lines += [f"  {s.name:<{width}}  {s.summary}" for s in SCENARIOS.values()]
    lines += ["", "scripts/bench <scenario> --help lists a scenario's options."]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    scenario = SCENARIOS.get(name)
    if scenario is None:
        print(f"scripts/bench: unknown scenario '{name}'\n\n{usage()}", file=sys.stderr)
        return 2
    args = parse(scenario, rest)
    lifecycle.set_name(name)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if scenario.needs_root:
            lifecycle.require_root(name, rest)
        return scenario.run(args) or 0
    except lifecycle.HarnessError as e:
        lifecycle.log(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        lifecycle.log("interrupted")
        return 130
