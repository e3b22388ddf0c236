//! The trace replay engine: one graph's engines replaying a request trace while a policy scales
//! them. Pure: no Kubernetes, no async runtime, no clock; the simulator's commands (`planner-sim
//! simulate`, `tune`, `budget`, `bridge`) and `planner-operator what-if` run it.
//!
//! - [`latency`]: the latency model of prefill and decode engines (queueing prefill, KV-limited
//!   decode at the profiled ITL), also behind the synthetic Dynamo frontend.
//! - [`trace`]: Azure CSV and Mooncake JSONL request traces, rate scaling with jitter.
//! - [`metrics`]: the frontend's histograms as the planner reads them from Prometheus.
//! - [`observe`]: what a replayed frontend shows a policy, as Prometheus would answer it.
//! - [`run`]: the replay: scale-up delay, GPU accounting, SLA attainment, and what a policy
//!   may read when it wakes ([`run::View`]).
//! - [`policy`]: the policies a replay compares: the planning loop the operator runs
//!   ([`policy::LoopPolicy`]) and the baselines and bounds (HPA, a fixed pool, perfect
//!   prediction, the oracle).
//! - [`mocker`]: a profile as the timing tables of Dynamo's mocker engine.

pub mod latency;
pub mod metrics;
pub mod mocker;
pub mod observe;
pub mod policy;
pub mod run;
pub mod trace;
