//! A PlannerPolicy's side of a shared GPU budget (`spec.budgetRef`): which budget it joins (the
//! webhook's rules, on the cached GpuBudget), its request as the budget's ledger takes it, and
//! its grant as its status and Events show it. What it asks for and how a grant cuts its
//! decision are the planning loop's ([`planner_core::policy::member`]).

use std::time::{Duration, Instant};

use kube::ResourceExt;
use planner_api::{BudgetGrant, PlannerPolicy, PlannerPolicySpec};
use planner_core::{
    budget::GrantReason,
    policy::{GrantReport, MemberAsk, Membership},
};

use crate::{
    controller::gpu_budget::{Budgets, Lookup, broker},
    validation::{
        PolicyError, ValidatedPolicy,
        gpu_budget::{self, BudgetError, BudgetLookup},
    },
};

/// The budget a policy plans in, as its loop and the ledger know it.
#[derive(Clone, Debug, PartialEq)]
pub struct Joined {
    /// The member's side, for the planning loop.
    pub membership: Membership,
    /// The budget's total.
    pub total: u64,
}

/// The budget `policy` joins (`None` without `spec.budgetRef`), or why it cannot: the rules the
/// webhook applies, on the operator's cache of GpuBudgets. A policy that no longer names a
/// budget leaves the one it was in.
pub async fn membership(
    policy: &PlannerPolicy,
    budgets: &Budgets,
    validated: &ValidatedPolicy,
    now: Instant,
) -> Result<Option<Joined>, Vec<PolicyError>> {
    let namespace = policy.namespace().unwrap_or_default();
    let name = policy.name_any();
    let Some(reference) = &policy.spec.budget_ref else {
        let key = (namespace, name);
        if budgets.broker.membership(&key).is_some() {
            budgets.wake(budgets.broker.leave(&key, now));
        }
        return Ok(None);
    };
    let found = match budgets.get(&reference.name).await {
        Lookup::Found(budget) => budget,
        Lookup::NotFound => {
            let errors = gpu_budget::check(
                &policy.spec,
                &namespace,
                &name,
                &validated.target,
                BudgetLookup::NotFound,
            );
            return Err(errors.into_iter().map(PolicyError::from).collect());
        }
        Lookup::Unreadable(error) => {
            return Err(vec![PolicyError::from(BudgetError::Unreadable {
                name: reference.name.clone(),
                error,
            })]);
        }
    };
    let errors = gpu_budget::check(
        &policy.spec,
        &namespace,
        &name,
        &validated.target,
        BudgetLookup::Found(&found),
    );
    if !errors.is_empty() {
        return Err(errors.into_iter().map(PolicyError::from).collect());
    }
    // check() found the entry.
    let entry = found.spec.member(&namespace, &name);
    budgets.restore(&found, now);
    let target = &validated.target;
    Ok(Some(Joined {
        membership: Membership {
            name: reference.name.clone(),
            priority: entry.map_or(0, |e| e.priority),
            weight: f64::from(entry.map_or(1, |e| e.weight)),
            floor: floor(&policy.spec),
            gpus: (target.prefill.gpus, target.decode.gpus),
            aggregated: target.aggregated,
        },
        total: u64::try_from(found.spec.total_gpus).unwrap_or(0),
    }))
}

/// The floor of each pool: `spec.bounds.minReplicas`.
pub fn floor(spec: &PlannerPolicySpec) -> (u32, u32) {
    crate::validation::planner_policy::min_replicas(spec)
}

/// The loop's request as the ledger takes it: a member's place lasts [`timeout`] of its interval
/// without a report.
pub fn ledger_ask(ask: MemberAsk, interval: Duration) -> broker::Ask {
    broker::Ask {
        priority: ask.priority,
        // Weights come from the GpuBudget's integer field.
        weight: ask.weight.round() as i32,
        risk: ask.risk,
        pools: ask.pools,
        timeout: broker::member_timeout(interval),
    }
}

/// A grant as the policy's status shows it.
pub fn grant_status(grant: &GrantReport) -> BudgetGrant {
    BudgetGrant {
        name: grant.name.clone(),
        floor_gpus: i64::try_from(grant.floor_gpus).unwrap_or(i64::MAX),
        asked_gpus: i64::try_from(grant.asked_gpus).unwrap_or(i64::MAX),
        granted_gpus: i64::try_from(grant.granted_gpus).unwrap_or(i64::MAX),
        reason: grant.reason.as_str().into(),
        message: grant.message.clone(),
    }
}

/// The member-side Event a new grant calls for, against the status's last one: `GrantCut`
/// (Warning) when it is now short of what it asks for and was not, or is shorter; `GrantRestored`
/// (Normal) when it is granted in full again.
pub fn grant_event(previous: Option<&BudgetGrant>, now: &BudgetGrant) -> Option<(&'static str, bool)> {
    let full = GrantReason::Full.as_str();
    match previous {
        _ if now.reason != full
            && previous.is_none_or(|p| {
                p.reason == full || p.granted_gpus > now.granted_gpus || p.name != now.name
            }) =>
        {
            Some(("GrantCut", true))
        }
        Some(p) if now.reason == full && p.reason != full && p.name == now.name => {
            Some(("GrantRestored", false))
        }
        _ => None,
    }
}

/// How long a member's place lasts without reporting (for tests and docs).
pub fn timeout(interval: Duration) -> Duration {
    broker::member_timeout(interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_mark_a_cut_once_and_the_return_to_full() {
        let grant = |reason: &str, granted: i64| BudgetGrant {
            name: "gpus".into(),
            granted_gpus: granted,
            reason: reason.into(),
            ..BudgetGrant::default()
        };
        assert_eq!(grant_event(None, &grant("Full", 16)), None);
        assert_eq!(grant_event(None, &grant("Cut", 8)), Some(("GrantCut", true)));
        assert_eq!(
            grant_event(Some(&grant("Full", 16)), &grant("Cut", 8)),
            Some(("GrantCut", true))
        );
        assert_eq!(grant_event(Some(&grant("Cut", 8)), &grant("Cut", 8)), None);
        assert_eq!(
            grant_event(Some(&grant("Cut", 12)), &grant("Cut", 8)),
            Some(("GrantCut", true))
        );
        assert_eq!(
            grant_event(Some(&grant("Cut", 8)), &grant("Full", 16)),
            Some(("GrantRestored", false))
        );
        assert_eq!(timeout(Duration::from_secs(10)), Duration::from_secs(60));
    }
}
