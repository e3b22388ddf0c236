//! A PlannerPolicy's side of a shared GPU budget (`spec.budgetRef`): which budget it joins (the
//! webhook's rules, on the cached GpuBudget), its request for a round (its floor, what its
//! decision wants, its SLA risk), and the decision the budget lets it carry out now. Pure except
//! for the cache lookup.

use std::time::{Duration, Instant};

use kube::ResourceExt;
use planner_api::{BudgetGrant, PlannerPolicy, PlannerPolicySpec};
use planner_core::budget::{self, GrantReason};

use super::{
    PlannerContext,
    decide::Decision,
    status::{SCALING_LIMITED, scaling_limited},
};
use crate::{
    controller::{
        conditions::DesiredCondition,
        gpu_budget::{Lookup, broker},
    },
    validation::{
        PolicyError, ValidatedPolicy,
        gpu_budget::{self, BudgetError, BudgetLookup},
    },
};

/// The budget a policy plans in.
#[derive(Clone, Debug, PartialEq)]
pub struct Membership {
    /// The GpuBudget's name.
    pub name: String,
    /// Its total.
    pub total: u64,
    /// The policy's priority in it.
    pub priority: i32,
    /// The policy's weight in it.
    pub weight: i32,
}

/// The budget `policy` joins (`None` without `spec.budgetRef`), or why it cannot: the rules the
/// webhook applies, on the operator's cache of GpuBudgets. A policy that no longer names a
/// budget leaves the one it was in.
pub async fn membership(
    policy: &PlannerPolicy,
    ctx: &PlannerContext,
    validated: &ValidatedPolicy,
    now: Instant,
) -> Result<Option<Membership>, Vec<PolicyError>> {
    let namespace = policy.namespace().unwrap_or_default();
    let name = policy.name_any();
    let Some(reference) = &policy.spec.budget_ref else {
        let key = (namespace, name);
        if ctx.budgets.broker.membership(&key).is_some() {
            ctx.budgets.wake(ctx.budgets.broker.leave(&key, now));
        }
        return Ok(None);
    };
    let found = match ctx.budgets.get(&reference.name).await {
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
    ctx.budgets.restore(&found, now);
    Ok(Some(Membership {
        name: reference.name.clone(),
        total: u64::try_from(found.spec.total_gpus).unwrap_or(0),
        priority: entry.map_or(0, |e| e.priority),
        weight: entry.map_or(1, |e| e.weight),
    }))
}

/// The floor of each pool: `spec.bounds.minReplicas`.
pub fn floor(spec: &PlannerPolicySpec) -> u32 {
    u32::try_from(spec.bounds.min_replicas.max(1)).unwrap_or(1)
}

/// A policy's request for a round: per pool (one for an aggregated graph) its floor, what it
/// wants and its GPUs per replica.
pub fn ask(
    membership: &Membership,
    spec: &PlannerPolicySpec,
    validated: &ValidatedPolicy,
    want: (u32, u32),
    risk: f64,
) -> broker::Ask {
    let floor = floor(spec);
    let target = &validated.target;
    broker::Ask {
        priority: membership.priority,
        weight: membership.weight,
        risk,
        pools: budget::graph_request_pools(
            target.aggregated,
            (floor, floor),
            want,
            (target.prefill.gpus, target.decode.gpus),
        ),
        timeout: broker::member_timeout(validated.interval),
    }
}

/// The SLA risk of the interval a decision observed ([`budget::sla_risk`]); `None` when it
/// observed nothing.
pub fn risk(decision: &Decision, spec: &PlannerPolicySpec) -> Option<f64> {
    decision
        .observed
        .as_ref()
        .map(|o| budget::sla_risk(o.ttft_ms, spec.sla.ttft_ms, o.itl_ms, spec.sla.itl_ms))
}

/// Replicas of a pool the budget lets it ask for: what it is allowed, never below its floor
/// unless it already is (a member whose floor the budget cannot fund keeps its minimum
/// replicas, outside the budget, rather than being scaled to zero).
fn clip(allowed: u32, asked: u32, floor: u32) -> u32 {
    allowed.max(asked.min(floor))
}

/// `decision` as the budget lets it be carried out now, and what the status says about the
/// grant. `asked` is the replicas asked for now; the decision's target (else the replicas it
/// last wanted) was the request.
pub fn granted(
    mut decision: Decision,
    membership: &Membership,
    answer: &broker::Answer,
    asked: (u32, u32),
    floor: u32,
    aggregated: bool,
) -> (Decision, BudgetGrant) {
    let allowed = budget::graph_replicas(aggregated, &answer.allowed, asked);
    let target = (clip(allowed.0, asked.0, floor), clip(allowed.1, asked.1, floor));
    let grant = &answer.grant;
    let mut explanation = grant.explanation(answer.total);
    let granted = budget::graph_replicas(aggregated, &grant.replicas, (0, 0));
    let waiting = allowed.0 < granted.0 || allowed.1 < granted.1;
    let mut limit = grant.limit(answer.total);
    if waiting {
        // An aggregated graph runs its one pool's grant as both halves of the target.
        let note = if aggregated {
            format!(
                "; workers {} now, {} once other members release the GPUs they still hold",
                target.0, granted.0
            )
        } else {
            format!(
                "; prefill {} and decode {} now, {} and {} once other members release the GPUs they still hold",
                target.0, target.1, granted.0, granted.1
            )
        };
        explanation.push_str(&note);
        limit.push_str(&note);
    }
    let wanted = decision.target;
    let changed = match wanted {
        Some(want) => target != want,
        None => target != asked,
    };
    if changed {
        decision.target = Some(target);
        let note = format!("budget {}: {explanation}", membership.name);
        decision.message = if decision.message.is_empty() {
            note
        } else {
            format!("{}; {note}", decision.message)
        };
    }
    if grant.reason != GrantReason::Full || waiting {
        decision.conditions.retain(|c| c.type_ != SCALING_LIMITED);
        // Its changes are Events: say what limits the grant, not the request of the moment.
        decision.conditions.push(DesiredCondition::met(
            SCALING_LIMITED,
            "SharedBudget",
            format!("budget {}: {limit}", membership.name),
        ));
    } else if !decision.conditions.iter().any(|c| c.type_ == SCALING_LIMITED) {
        decision.conditions.push(scaling_limited(&[]));
    }
    let status = BudgetGrant {
        name: membership.name.clone(),
        floor_gpus: i64::try_from(grant.floor_gpus).unwrap_or(i64::MAX),
        asked_gpus: i64::try_from(grant.asked_gpus).unwrap_or(i64::MAX),
        granted_gpus: i64::try_from(grant.gpus).unwrap_or(i64::MAX),
        reason: grant.reason.as_str().into(),
        message: explanation,
    };
    (decision, status)
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
    use planner_core::budget::{Contender, Grant};

    use super::*;

    fn membership() -> Membership {
        Membership {
            name: "gpus".into(),
            total: 32,
            priority: 0,
            weight: 1,
        }
    }

    fn answer(reason: GrantReason, replicas: [u32; 2], allowed: [u32; 2]) -> broker::Answer {
        broker::Answer {
            grant: Grant {
                member: "team/steady".into(),
                replicas: replicas.to_vec(),
                gpus: u64::from(replicas[0] + replicas[1]) * 4,
                asked_gpus: 16,
                floor_gpus: 8,
                reason,
                contenders: vec![Contender {
                    member: "team/burst".into(),
                    priority: 10,
                    gpus: 16,
                }],
            },
            allowed: allowed.to_vec(),
            total: 32,
        }
    }

    fn decision(target: Option<(u32, u32)>) -> Decision {
        Decision {
            target,
            message: if target.is_some() {
                "sized for the forecast".into()
            } else {
                String::new()
            },
            ..Decision::default()
        }
    }

    #[test]
    fn a_cut_decision_is_carried_out_at_the_grant_and_says_why() {
        let (d, status) = granted(
            decision(Some((2, 2))),
            &membership(),
            &answer(GrantReason::Cut, [1, 1], [1, 1]),
            (2, 2),
            1,
            false,
        );
        assert_eq!(d.target, Some((1, 1)));
        assert_eq!(
            d.message,
            "sized for the forecast; budget gpus: granted 8 of the 16 GPUs asked (floor 8): the budget's 32 GPUs went first to team/burst (priority 10, 16 GPUs)"
        );
        let limited = d.conditions.iter().find(|c| c.type_ == SCALING_LIMITED).unwrap();
        assert_eq!(
            (limited.status, limited.reason.as_str()),
            ("True", "SharedBudget")
        );
        assert_eq!(
            (status.reason.as_str(), status.granted_gpus, status.asked_gpus),
            ("Cut", 8, 16)
        );
    }

    #[test]
    fn between_decisions_a_cut_shrinks_and_a_release_grows_towards_the_last_want() {
        // No decision (a wake): cut from 2+2 to the floor.
        let (d, _) = granted(
            decision(None),
            &membership(),
            &answer(GrantReason::Cut, [1, 1], [1, 1]),
            (2, 2),
            1,
            false,
        );
        assert_eq!(d.target, Some((1, 1)));
        assert!(d.message.starts_with("budget gpus: granted 8 of the 16 GPUs"));
        // Granted in full again: back to what it wanted.
        let (d, status) = granted(
            decision(None),
            &membership(),
            &answer(GrantReason::Full, [2, 2], [2, 2]),
            (1, 1),
            1,
            false,
        );
        assert_eq!(d.target, Some((2, 2)));
        assert_eq!(status.reason, "Full");
        // Nothing to change: no target, no message.
        let (d, _) = granted(
            decision(None),
            &membership(),
            &answer(GrantReason::Full, [2, 2], [2, 2]),
            (2, 2),
            1,
            false,
        );
        assert_eq!((d.target, d.message.as_str()), (None, ""));
    }

    #[test]
    fn growth_waiting_for_released_gpus_is_said() {
        let (d, _) = granted(
            decision(Some((4, 2))),
            &membership(),
            &answer(GrantReason::Full, [4, 2], [3, 1]),
            (1, 1),
            1,
            false,
        );
        assert_eq!(d.target, Some((3, 1)));
        assert!(d.message.ends_with(
            "prefill 3 and decode 1 now, 4 and 2 once other members release the GPUs they still hold"
        ));
    }

    #[test]
    fn an_aggregated_graph_asks_for_its_one_pool_and_runs_its_grant_as_both() {
        let dgd: planner_api::DynamoGraphDeployment =
            serde_yaml::from_str(include_str!("../../../../config/samples/dgd-disagg.yaml")).unwrap();
        let graph = crate::target::TargetGraph::try_from(&dgd).unwrap();
        let policy: PlannerPolicy =
            serde_yaml::from_str(include_str!("../../../../config/samples/plannerpolicy-sla.yaml")).unwrap();
        let spec = policy.spec;
        let validated = |aggregated: bool| {
            let mut v = crate::validation::validate(
                &spec,
                "llm",
                Some(&graph),
                &crate::validation::Tenancy::default(),
            )
            .unwrap();
            v.target.aggregated = aggregated;
            v
        };
        let ask = |aggregated| ask(&membership(), &spec, &validated(aggregated), (3, 4), 1.0);
        assert_eq!(ask(false).pools.len(), 2);
        let pools = ask(true).pools;
        assert_eq!(
            (pools.len(), pools[0].floor, pools[0].want, pools[0].gpus),
            (1, 1, 4, validated(true).target.decode.gpus)
        );
        let mut one = answer(GrantReason::Cut, [3, 0], [2, 0]);
        one.grant.replicas.truncate(1);
        one.allowed.truncate(1);
        let (d, _) = granted(decision(Some((4, 4))), &membership(), &one, (1, 1), 1, true);
        assert_eq!(d.target, Some((2, 2)));
        assert!(
            d.message
                .ends_with("workers 2 now, 3 once other members release the GPUs they still hold")
        );
    }

    #[test]
    fn an_unfunded_floor_keeps_the_minimum_replicas() {
        let (d, _) = granted(
            decision(Some((2, 2))),
            &membership(),
            &answer(GrantReason::FloorUnfunded, [0, 0], [0, 0]),
            (2, 2),
            1,
            false,
        );
        assert_eq!(d.target, Some((1, 1)));
    }

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
