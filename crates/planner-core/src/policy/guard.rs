//! The guards on one decision, applied after the planner and before a shared budget: the step
//! limits and the zero guard of `spec.bounds` (the replica bounds and the policy's own GPU
//! budget are the planners' own), and the ready gate, applied last, which holds a scale-up the
//! target cannot start yet.

use std::time::Duration;

use crate::startup::StartupTracker;

use super::report::{Decision, LimitReason, Limitation};

/// Limits on what one decision may do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Guards {
    /// Most replicas one decision adds to a pool.
    pub max_step_up: Option<u32>,
    /// Most replicas one decision removes from a pool.
    pub max_step_down: Option<u32>,
    /// Whether a decision may take a pool to zero replicas.
    pub allow_zero: bool,
}

/// Applies `guards` to a decision against the replicas asked for now: a decision to zero
/// replicas (the GPU budget below both pools' minimums, as Dynamo's planner computes it) keeps
/// the replicas unless zero is allowed, and every pool stays within the step limits. Each
/// change is said in the message and the limitation.
pub(crate) fn guard(decision: &mut Decision, asked: (u32, u32), guards: &Guards) {
    let Some(target) = decision.target else {
        return;
    };
    if !guards.allow_zero && (target.0 == 0 || target.1 == 0) && (asked.0 > 0 || asked.1 > 0) {
        let why = format!(
            "keeping replicas: the decision was {} prefill and {} decode replicas (the GPU budget cannot fit both pools' minimums); set spec.bounds.allowScaleToZero to allow it, or raise spec.bounds.maxGpuBudget",
            target.0, target.1
        );
        decision.target = None;
        decision.limitation = Some(Limitation {
            reason: LimitReason::BudgetBelowMinimum,
            message: why.clone(),
        });
        decision.message = why;
        return;
    }
    let mut notes = Vec::new();
    let mut bound = |pool: &str, want: u32, now: u32| -> u32 {
        let mut r = want;
        if let Some(up) = guards.max_step_up.filter(|&up| r > now.saturating_add(up)) {
            notes.push(format!("{pool} +{up} per decision (asked {r})"));
            r = now.saturating_add(up);
        }
        if let Some(down) = guards.max_step_down.filter(|&down| r < now.saturating_sub(down)) {
            notes.push(format!("{pool} -{down} per decision (asked {r})"));
            r = now.saturating_sub(down);
        }
        r
    };
    let guarded = (
        bound("prefill", target.0, asked.0),
        bound("decode", target.1, asked.1),
    );
    if !notes.is_empty() {
        let note = notes.join("; ");
        decision.note(&note);
        decision.limitation = Some(Limitation {
            reason: LimitReason::StepLimit,
            message: note,
        });
        decision.target = Some(guarded);
    }
}

/// The message a scale-up held by the ready gate carries.
pub const NOT_READY: &str = "target not Ready, scaling deferred";

/// Whether a change may go through while the target is not Ready (`ready`: `None` when the
/// driver has no notion of it, as the virtual connector). Upstream holds every change until
/// the target is Ready; here a scale-down always goes through (a scale-up that can never
/// schedule must not pin the replicas up), and with the queueing model, which counts the
/// replicas still starting, so does a scale-up, unless the last one has not come up within
/// twice the scale-up delay the planner plans with (`delay`).
pub(crate) fn gate_open(
    ready: Option<bool>,
    counts_starting: bool,
    (startup, delay): (&StartupTracker, Duration),
    asked: (u32, u32),
    wanted: (u32, u32),
    now: Duration,
) -> bool {
    if ready != Some(false) || (wanted.0 <= asked.0 && wanted.1 <= asked.1) {
        return true;
    }
    counts_starting && !startup.stuck(now, 2 * delay)
}
