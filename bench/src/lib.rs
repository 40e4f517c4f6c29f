//! Benchmark harnesses of the aggregation switch that run in one process:
//! [`engine`], the engine scaling benchmark (`engine_scaling`,
//! `scripts/bench scaling`). The packet generator `aggblast` is its own
//! binary (src/main.rs).

pub mod engine;
