//! The SLA planner core: pure computations shared by the reconciler, the simulator and the benches.

pub mod predictor;
pub mod trace;
