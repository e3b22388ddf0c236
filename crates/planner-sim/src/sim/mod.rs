//! The trace-driven simulator's commands and the scaling-quality benchmark. Pure: no
//! Kubernetes, no async runtime. The replay itself is `planner-sim-engine`'s (re-exported here
//! as [`trace`], [`latency`], [`metrics`], [`observe`], [`run`] and [`policy`]), whose SLA and
//! load-based policies run the planning loop the operator runs.
//! - [`report`] and [`plot`]: the comparison table, the Markdown report and the figures.
//! - [`budget`]: several graphs sharing one GPU budget, against the same GPUs split statically.
//! - [`bridge`]: the same policies driven by observations from another engine model, one JSON
//!   line at a time (Dynamo's offline replay); [`replay`]: that replay's traces and report.
//! - [`scenario`]: hand-computable workloads and the overload recovery the queueing planner
//!   must pass.
//! - [`tune`]: the search the queueing planner's defaults come from.

pub mod bridge;
pub mod budget;
pub mod command;
pub mod plot;
pub mod replay;
pub mod report;
pub mod scenario;
pub mod tune;

pub use planner_sim_engine::{latency, metrics, observe, policy, run, trace};

use std::sync::atomic::{AtomicUsize, Ordering};

use planner_core::interpolation::PerformanceCurves;

use self::{
    latency::LatencyModel,
    policy::{Oracle, PolicySpec},
    run::{Policy, RunResult, SimConfig},
    trace::Request,
};

/// Builds the policy for `spec`. `peak` sizes the fixed deployment.
pub fn build_policy<C: PerformanceCurves>(
    spec: PolicySpec,
    config: &SimConfig,
    peak: (u32, u32),
) -> Box<dyn Policy<C>> {
    spec.build(config, peak)
}

/// Runs the oracle (always: it gives the other policies their starting replicas, sizes the
/// fixed deployment and is the reference for GPU cost), then every other policy in `specs`,
/// on up to `jobs` threads. The oracle's result comes first, then the others in `specs` order.
pub fn compare<C: PerformanceCurves + Sync>(
    requests: &[Request],
    model: &LatencyModel<'_, C>,
    config: &SimConfig,
    specs: &[PolicySpec],
    jobs: usize,
) -> Vec<RunResult> {
    let oracle = run::run(requests, model, config, &mut Oracle::default(), None);
    let peak = (oracle.summary.max_prefill, oracle.summary.max_decode);
    let initial = oracle.initial;
    let others: Vec<PolicySpec> = specs
        .iter()
        .copied()
        .filter(|s| *s != PolicySpec::Oracle)
        .collect();
    let mut results = vec![oracle];
    results.extend(parallel_map(&others, jobs, |spec| {
        let mut policy = build_policy::<C>(*spec, config, peak);
        run::run(requests, model, config, policy.as_mut(), Some(initial))
    }));
    results
}

/// Maps `f` over `items` on up to `jobs` scoped threads, keeping the order.
pub fn parallel_map<T: Sync, R: Send>(items: &[T], jobs: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let jobs = jobs.clamp(1, items.len().max(1));
    if jobs == 1 {
        return items.iter().map(&f).collect();
    }
    let next = AtomicUsize::new(0);
    let mut slots: Vec<Option<R>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..jobs)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        done.push((i, f(item)));
                    }
                    done
                })
            })
            .collect();
        let mut slots: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
        for worker in workers {
            // A worker that panicked loses its items; they come back as missing below.
            if let Ok(done) = worker.join() {
                for (i, r) in done {
                    slots[i] = Some(r);
                }
            }
        }
        slots
    });
    slots.iter_mut().filter_map(Option::take).collect()
}

#[cfg(test)]
mod tests;
