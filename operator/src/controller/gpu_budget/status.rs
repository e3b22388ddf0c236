//! A GpuBudget's status from its ledger (pure): what each member asked for, was granted and
//! holds, the totals, the two conditions, and which grants were cut since the last status (one
//! Event each).

use k8s_openapi::jiff::Timestamp;

use planner_api::{BudgetMemberStatus, GpuBudgetStatus};
use planner_core::budget::GrantReason;

use super::broker::LedgerView;
use crate::{
    controller::conditions::{self, DesiredCondition},
    metrics::budget::{BudgetGpus, MemberGpus},
};

/// Every member's floor fits the total.
pub const FLOORS_FUNDED: &str = "FloorsFunded";
/// The GPUs the members hold fit the total.
pub const WITHIN_TOTAL: &str = "WithinTotal";

/// Longest member message kept in the status (each row is read by people, and a budget may
/// have many members).
const MAX_MEMBER_MESSAGE: usize = 512;

fn gpus(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The status for `view` (members not known to this process are left out), keeping the
/// previous status's condition times.
pub fn next(
    previous: Option<&GpuBudgetStatus>,
    generation: Option<i64>,
    total: u64,
    view: Option<&LedgerView>,
    now: Timestamp,
) -> GpuBudgetStatus {
    let members: Vec<BudgetMemberStatus> = view
        .map(|v| {
            v.members
                .iter()
                .map(|m| BudgetMemberStatus {
                    namespace: m.key.0.clone(),
                    name: m.key.1.clone(),
                    priority: m.priority,
                    weight: m.weight,
                    floor_gpus: gpus(m.grant.floor_gpus),
                    asked_gpus: gpus(m.grant.asked_gpus),
                    granted_gpus: gpus(m.grant.gpus),
                    held_gpus: gpus(m.held_gpus),
                    reason: m.grant.reason.as_str().into(),
                    message: crate::controller::common::truncate(
                        &if m.restored {
                            format!(
                                "restored from the last status: holds {} GPUs until its policy reports",
                                m.held_gpus
                            )
                        } else {
                            m.grant.explanation(total)
                        },
                        MAX_MEMBER_MESSAGE,
                    ),
                })
                .collect()
        })
        .unwrap_or_default();
    let sum = |f: fn(&BudgetMemberStatus) -> i64| members.iter().map(f).sum::<i64>();
    let (floor, asked, granted, held) = (
        sum(|m| m.floor_gpus),
        sum(|m| m.asked_gpus),
        sum(|m| m.granted_gpus),
        sum(|m| m.held_gpus),
    );
    let total_gpus = gpus(total);
    let unfunded: Vec<String> = members
        .iter()
        .filter(|m| m.reason == GrantReason::FloorUnfunded.as_str())
        .map(|m| format!("{}/{}", m.namespace, m.name))
        .collect();
    let floors = if unfunded.is_empty() {
        DesiredCondition::met(
            FLOORS_FUNDED,
            "Funded",
            format!(
                "the floors of {} members need {floor} of the {total_gpus} GPUs",
                members.len()
            ),
        )
    } else {
        DesiredCondition::unmet(
            FLOORS_FUNDED,
            "FloorsExceedTotal",
            format!(
                "the floors of {} members need {floor} GPUs, more than the {total_gpus}: no GPUs for {} (they keep their minimum replicas outside the budget)",
                members.len(),
                unfunded.join(", ")
            ),
        )
    };
    let within = if held <= total_gpus {
        DesiredCondition::met(
            WITHIN_TOTAL,
            "Within",
            format!("the members hold {held} of the {total_gpus} GPUs"),
        )
    } else {
        DesiredCondition::unmet(
            WITHIN_TOTAL,
            "Overcommitted",
            format!(
                "the members hold {held} GPUs, more than the {total_gpus}: nothing grows until the members cut have released theirs"
            ),
        )
    };
    let existing = previous.map(|s| s.conditions.as_slice()).unwrap_or_default();
    GpuBudgetStatus {
        observed_generation: generation,
        conditions: conditions::merge(existing, &[floors, within], generation, now),
        member_count: i32::try_from(members.len()).unwrap_or(i32::MAX),
        floor_gpus: floor,
        asked_gpus: asked,
        granted_gpus: granted,
        held_gpus: held,
        members,
    }
}

/// A budget's status as its metrics show it.
pub fn budget_gpus(total: u64, status: &GpuBudgetStatus) -> BudgetGpus {
    BudgetGpus {
        total: gpus(total),
        floor: status.floor_gpus,
        asked: status.asked_gpus,
        granted: status.granted_gpus,
        held: status.held_gpus,
        members: status
            .members
            .iter()
            .map(|m| MemberGpus {
                namespace: m.namespace.clone(),
                policy: m.name.clone(),
                asked: m.asked_gpus,
                granted: m.granted_gpus,
                held: m.held_gpus,
            })
            .collect(),
    }
}

/// Whether writing `new` changes what `old` says (condition transition times aside).
pub fn differs(old: Option<&GpuBudgetStatus>, new: &GpuBudgetStatus) -> bool {
    match old {
        None => true,
        Some(old) => {
            let strip = |s: &GpuBudgetStatus| GpuBudgetStatus {
                conditions: Vec::new(),
                ..s.clone()
            };
            strip(old) != strip(new) || !conditions::same(&old.conditions, &new.conditions)
        }
    }
}

/// The members whose grant was cut since `old`: now short of what they ask for, and before
/// either granted in full, not listed, or granted more.
pub fn cuts<'a>(old: Option<&GpuBudgetStatus>, new: &'a GpuBudgetStatus) -> Vec<&'a BudgetMemberStatus> {
    new.members
        .iter()
        .filter(|m| m.reason != GrantReason::Full.as_str())
        .filter(|m| {
            let before = old.and_then(|o| {
                o.members
                    .iter()
                    .find(|p| p.namespace == m.namespace && p.name == m.name)
            });
            before.is_none_or(|p| p.reason == GrantReason::Full.as_str() || p.granted_gpus > m.granted_gpus)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use planner_core::budget::{Contender, Grant};

    use super::*;
    use crate::controller::gpu_budget::broker::MemberView;

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    fn member(name: &str, reason: GrantReason, granted: u64, held: u64) -> MemberView {
        MemberView {
            key: ("team".into(), name.into()),
            priority: 0,
            weight: 1,
            grant: Grant {
                member: format!("team/{name}"),
                replicas: vec![],
                gpus: granted,
                asked_gpus: 16,
                floor_gpus: 8,
                reason,
                contenders: vec![Contender {
                    member: "team/other".into(),
                    priority: 5,
                    gpus: 8,
                }],
            },
            held_gpus: held,
            restored: false,
        }
    }

    #[test]
    fn totals_conditions_and_rows_follow_the_ledger() {
        let view = LedgerView {
            total: 32,
            members: vec![
                member("a", GrantReason::Full, 16, 16),
                member("b", GrantReason::Cut, 8, 16),
            ],
        };
        let status = next(None, Some(3), 32, Some(&view), now());
        assert_eq!(
            (
                status.member_count,
                status.floor_gpus,
                status.asked_gpus,
                status.granted_gpus,
                status.held_gpus
            ),
            (2, 16, 32, 24, 32)
        );
        let within = conditions::find(&status.conditions, WITHIN_TOTAL).unwrap();
        assert_eq!(
            (within.status.as_str(), within.reason.as_str()),
            ("True", "Within")
        );
        assert_eq!(
            status.members[1].message,
            "granted 8 of the 16 GPUs asked (floor 8): the budget's 32 GPUs went first to team/other (priority 5, 8 GPUs)"
        );
        // Held over the total: overcommitted, said once.
        let over = LedgerView {
            total: 24,
            members: view.members.clone(),
        };
        let status2 = next(Some(&status), Some(3), 24, Some(&over), now());
        let within = conditions::find(&status2.conditions, WITHIN_TOTAL).unwrap();
        assert_eq!(
            (within.status.as_str(), within.reason.as_str()),
            ("False", "Overcommitted")
        );
        assert!(differs(Some(&status), &status2));
        assert!(!differs(
            Some(&status2),
            &next(Some(&status2), Some(3), 24, Some(&over), now())
        ));
        // No ledger: an empty status, floors trivially funded.
        let empty = next(None, None, 8, None, now());
        assert_eq!((empty.member_count, empty.held_gpus), (0, 0));
    }

    #[test]
    fn a_cut_is_reported_once_and_again_when_it_deepens() {
        let full = LedgerView {
            total: 32,
            members: vec![member("a", GrantReason::Full, 16, 16)],
        };
        let cut = LedgerView {
            total: 32,
            members: vec![member("a", GrantReason::Cut, 12, 16)],
        };
        let deeper = LedgerView {
            total: 32,
            members: vec![member("a", GrantReason::Cut, 8, 12)],
        };
        let s0 = next(None, None, 32, Some(&full), now());
        let s1 = next(Some(&s0), None, 32, Some(&cut), now());
        let s2 = next(Some(&s1), None, 32, Some(&cut), now());
        let s3 = next(Some(&s2), None, 32, Some(&deeper), now());
        assert!(cuts(None, &s0).is_empty());
        assert_eq!(cuts(Some(&s0), &s1).len(), 1);
        assert!(cuts(Some(&s1), &s2).is_empty());
        assert_eq!(cuts(Some(&s2), &s3).len(), 1);
    }
}
