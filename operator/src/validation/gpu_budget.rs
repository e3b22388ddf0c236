//! A PlannerPolicy's `spec.budgetRef`: the GpuBudget exists, admits the policy (one of its
//! `spec.members` entries names the policy's namespace, the policy, or `*`), the policy's mode
//! scales, and its floor fits the budget's total. The webhook and the PlannerPolicy reconciler
//! call [`check`] with the budget they looked up. A GpuBudget itself is checked by its schema
//! (ranges, patterns, one entry per namespace and policy); what a smaller total does to the
//! members it has is said by its status conditions.

use planner_api::{GpuBudget, GpuBudgetSpec, PlannerMode, PlannerPolicySpec};

pub use super::error::BudgetError;
use super::pools::TargetPools;

/// What a budget lookup found.
#[derive(Debug, Clone, Copy)]
pub enum BudgetLookup<'a> {
    /// The budget.
    Found(&'a GpuBudget),
    /// No budget of that name.
    NotFound,
}

/// The rules of `spec.budgetRef` for the policy `name` in `namespace` whose pools are `target`
/// (none without a budgetRef).
pub fn check(
    spec: &PlannerPolicySpec,
    namespace: &str,
    name: &str,
    target: &TargetPools,
    budget: BudgetLookup<'_>,
) -> Vec<BudgetError> {
    let Some(reference) = &spec.budget_ref else {
        return Vec::new();
    };
    let mut errors = Vec::new();
    if spec.mode == PlannerMode::Observe {
        errors.push(BudgetError::ObserveMode);
    }
    let budget = match budget {
        BudgetLookup::Found(budget) => budget,
        BudgetLookup::NotFound => {
            errors.push(BudgetError::NotFound {
                name: reference.name.clone(),
            });
            return errors;
        }
    };
    if budget.spec.member(namespace, name).is_none() {
        errors.push(BudgetError::NotAdmitted {
            name: reference.name.clone(),
            namespace: namespace.to_string(),
            policy: name.to_string(),
            entries: entries(&budget.spec),
        });
    }
    let (min_prefill, min_decode) = super::planner_policy::min_replicas(spec);
    let floor = floor_gpus(spec, target);
    if i64::try_from(floor).unwrap_or(i64::MAX) > budget.spec.total_gpus {
        let pools = if target.aggregated {
            format!(
                "its one aggregated pool ({min_decode} x {} GPUs of {:?}",
                target.decode.gpus, target.decode.component
            )
        } else {
            format!(
                "both pools ({min_prefill} x {} GPUs of {:?} + {min_decode} x {} GPUs of {:?}",
                target.prefill.gpus, target.prefill.component, target.decode.gpus, target.decode.component
            )
        };
        errors.push(BudgetError::FloorAboveTotal {
            name: reference.name.clone(),
            total: budget.spec.total_gpus,
            pools,
            floor,
        });
    }
    errors
}

/// GPUs of a policy's floor: its minimum replicas of both pools, or of the one pool of an
/// aggregated graph (both pools are that pool: counted once).
pub fn floor_gpus(spec: &PlannerPolicySpec, target: &TargetPools) -> u64 {
    let min = super::planner_policy::min_replicas(spec);
    planner_core::budget::graph_request_pools(
        target.aggregated,
        min,
        min,
        (target.prefill.gpus, target.decode.gpus),
    )
    .iter()
    .map(|p| u64::from(p.floor) * u64::from(p.gpus.max(1)))
    .sum()
}

/// The members entries as `namespace` or `namespace/policy`, at most eight.
fn entries(spec: &GpuBudgetSpec) -> String {
    let mut named: Vec<String> = spec
        .members
        .iter()
        .take(8)
        .map(|m| {
            if m.policy == planner_api::EVERY_POLICY {
                m.namespace.clone()
            } else {
                format!("{}/{}", m.namespace, m.policy)
            }
        })
        .collect();
    if spec.members.len() > 8 {
        named.push(format!("{} more", spec.members.len() - 8));
    }
    named.join(", ")
}

#[cfg(test)]
mod tests {
    use planner_api::BudgetMember;

    use super::*;
    use crate::validation::PoolTarget;

    fn budget(total: i64, members: &[(&str, Option<&str>)]) -> GpuBudget {
        GpuBudget::new(
            "gpus",
            GpuBudgetSpec {
                total_gpus: total,
                members: members
                    .iter()
                    .map(|(namespace, policy)| BudgetMember {
                        namespace: (*namespace).into(),
                        policy: policy.unwrap_or("*").into(),
                        priority: 0,
                        weight: 1,
                    })
                    .collect(),
            },
        )
    }

    fn target(gpus: u32) -> TargetPools {
        let pool = |component: &str| PoolTarget {
            component: component.into(),
            gpus,
            replicas: 1,
        };
        TargetPools {
            prefill: pool("prefill"),
            decode: pool("decode"),
            model_name: None,
            aggregated: false,
            chunk_tokens: None,
        }
    }

    fn spec(extra: serde_json::Value) -> PlannerPolicySpec {
        let mut value = serde_json::json!({"targetRef": {"name": "llama"}, "budgetRef": {"name": "gpus"}});
        if let (Some(base), Some(extra)) = (value.as_object_mut(), extra.as_object()) {
            base.extend(extra.clone());
        }
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_policy_joins_a_budget_that_admits_it_and_holds_its_floor() {
        let b = budget(32, &[("team-a", None)]);
        assert_eq!(
            check(
                &spec(serde_json::json!({})),
                "team-a",
                "llama",
                &target(4),
                BudgetLookup::Found(&b)
            ),
            []
        );
        let no_ref: PlannerPolicySpec =
            serde_json::from_value(serde_json::json!({"targetRef": {"name": "x"}})).unwrap();
        assert_eq!(
            check(&no_ref, "team-a", "x", &target(4), BudgetLookup::NotFound),
            []
        );
    }

    #[test]
    fn each_rule_names_the_field_and_what_is_allowed() {
        let b = budget(12, &[("team-a", Some("qwen")), ("team-c", None)]);
        let errors = check(
            &spec(serde_json::json!({"mode": "observe", "bounds": {"minReplicas": 2}})),
            "team-b",
            "llama",
            &target(4),
            BudgetLookup::Found(&b),
        );
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "spec.budgetRef: mode observe never scales, so it cannot share a GPU budget; allowed: mode sla or load with spec.budgetRef, or no spec.budgetRef",
                "spec.budgetRef.name: GpuBudget \"gpus\" does not admit PlannerPolicy team-b/llama (its spec.members name team-a/qwen, team-c); allowed: a GpuBudget whose spec.members names namespace \"team-b\", this policy, or \"*\" (ask the cluster admin)",
                "spec.budgetRef.name: the floor of this policy, the minimum replicas of both pools (2 x 4 GPUs of \"prefill\" + 2 x 4 GPUs of \"decode\" = 16 GPUs), is more than GpuBudget \"gpus\"'s total of 12 GPUs; allowed: a budget of at least 16 GPUs, or lower minimums (spec.bounds.minReplicas, spec.bounds.prefill.minReplicas, spec.bounds.decode.minReplicas)",
            ]
        );
        assert_eq!(
            errors.iter().map(BudgetError::reason).collect::<Vec<_>>(),
            ["InvalidSpec", "NotPermitted", "InvalidSpec"]
        );
        // An aggregated graph's one pool is both pools: its floor is counted once.
        let worker = PoolTarget {
            component: "worker".into(),
            gpus: 4,
            replicas: 1,
        };
        let aggregated = TargetPools {
            prefill: worker.clone(),
            decode: worker,
            aggregated: true,
            ..target(4)
        };
        let min_two = spec(serde_json::json!({"bounds": {"minReplicas": 2}}));
        assert_eq!(floor_gpus(&min_two, &aggregated), 8);
        assert_eq!(floor_gpus(&min_two, &target(4)), 16);
        let b = budget(8, &[("team-a", None)]);
        assert_eq!(
            check(&min_two, "team-a", "llama", &aggregated, BudgetLookup::Found(&b)),
            []
        );
        let b = budget(6, &[("team-a", None)]);
        let text: Vec<String> = check(&min_two, "team-a", "llama", &aggregated, BudgetLookup::Found(&b))
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            text,
            [
                "spec.budgetRef.name: the floor of this policy, the minimum replicas of its one aggregated pool (2 x 4 GPUs of \"worker\" = 8 GPUs), is more than GpuBudget \"gpus\"'s total of 6 GPUs; allowed: a budget of at least 8 GPUs, or lower minimums (spec.bounds.minReplicas, spec.bounds.prefill.minReplicas, spec.bounds.decode.minReplicas)"
            ]
        );
        let missing = check(
            &spec(serde_json::json!({})),
            "team-a",
            "llama",
            &target(1),
            BudgetLookup::NotFound,
        );
        assert_eq!(missing[0].reason(), "BudgetNotFound");
        assert!(
            missing[0]
                .to_string()
                .starts_with("spec.budgetRef.name: GpuBudget \"gpus\" not found")
        );
    }
}
