"""scenarios: the registry of benchmark scenarios, one module each; the
order here is the order `scripts/bench --help` lists them."""

from scenarios import forward, per_packet, priority, scaling, transports, tree

SCENARIOS = {s.name: s for s in (
    forward.SCENARIO,
    per_packet.SCENARIO,
    priority.SCENARIO,
    scaling.SCENARIO,
    transports.SCENARIO,
    tree.SCENARIO,
)}
