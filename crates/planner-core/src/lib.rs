//! The planner core: profiling data, performance interpolation, correction factors, load
//! prediction and replica decisions. Pure: no Kubernetes, no I/O beyond parsing what it is
//! given, so the operator, the simulator and the benchmarks run the same code.

pub mod aggregated;
pub mod budget;
pub mod case;
pub mod clough_tocher;
pub mod decision;
pub mod erlang;
pub mod interpolation;
pub mod load;
pub mod policy;
pub mod predictor;
pub mod profile;
pub mod queueing;
pub mod sizing;
pub mod sla;
pub mod startup;
pub mod state;
pub mod trace;
pub mod upstream;
