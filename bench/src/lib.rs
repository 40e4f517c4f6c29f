//! Benchmark harnesses of the aggregation switch that run in one process:
//! [`engine`], the engine scaling benchmark (`engine_scaling`,
//! `scripts/bench_scaling.sh`). The packet generator `aggblast` is its own
//! binary (src/main.rs).

pub mod engine;
