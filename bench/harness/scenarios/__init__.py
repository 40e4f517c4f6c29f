"""scenarios: the registry of benchmark scenarios, one module each; the
order here is the order `scripts/bench --help` lists them."""

from scenarios import allreduce, builds, efficiency, fairness, forward, fsdp, per_packet, priority, scaling, soak, train, transports, tree

SCENARIOS = {s.name: s for s in (
    allreduce.SCENARIO,
    builds.SCENARIO,
    efficiency.SCENARIO,
    fairness.SCENARIO,
    forward.SCENARIO,
    fsdp.SCENARIO,
    per_packet.SCENARIO,
    priority.SCENARIO,
    scaling.SCENARIO,
    soak.SCENARIO,
    train.SCENARIO,
    transports.SCENARIO,
    tree.SCENARIO,
)}
