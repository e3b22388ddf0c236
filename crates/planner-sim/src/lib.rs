//! Test tools of planner-operator, kept out of the operator's binary and image:
//!
//! - [`sim`]: the trace-driven simulator and the scaling-quality benchmark (`make bench`). It
//!   runs the planner core the operator runs, against the latency model of `planner_core`.
//! - [`frontend`]: a synthetic Dynamo frontend that replays a trace in real time against the
//!   Ready prefill and decode pods and serves Dynamo's frontend metrics, for closed-loop tests.
//! - [`mocker_profile`]: a profile as the timing tables of Dynamo's mocker engine.
//! - [`bed`]: NVIDIA Dynamo's real frontend and mocker engines playing a graph's pods, with a
//!   load generator and Prometheus scraping them as NVIDIA's PodMonitors do, for the demo and
//!   the closed-loop tests.

pub mod bed;
pub mod frontend;
pub mod mocker_profile;
mod signal;
pub mod sim;

/// How a trace is replayed as load; `dynamo-bed` and `synthetic-frontend` take the same flags.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Initial rate scale (each request becomes k requests).
    #[arg(long, default_value_t = 1.0)]
    pub rate_scale: f64,
    /// Trace seconds per wall-clock second.
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Arrival jitter of rate-scaled copies (trace seconds).
    #[arg(long, default_value_t = 1.0)]
    pub jitter_s: f64,
    /// Start the trace again when it ends.
    #[arg(long = "loop")]
    pub looping: bool,
}
