//! A policy's side of a shared GPU budget: what it asks for in a round (its floor, what its
//! decision wants, its SLA risk) and the decision the budget lets it carry out now. The rounds
//! themselves are [`crate::budget::arbitrate`]'s; a driver runs them (the operator's ledger
//! between policies reconciled one after another, the simulator's over graphs stepped
//! together) and hands the answer back.

use serde::Serialize;

use crate::budget::{self, Grant, GrantReason, PoolAsk};

use super::report::{Decision, GrantReport, LimitReason, Limitation};

/// The budget a policy plans in.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Membership {
    /// The budget's name.
    pub name: String,
    /// The policy's priority in it.
    pub priority: i32,
    /// The policy's weight among equal priorities.
    pub weight: f64,
    /// Replicas of (prefill, decode) it never goes below (their minimum replicas, at least 1;
    /// an aggregated graph's one pool: the decode pool's).
    pub floor: (u32, u32),
    /// GPUs per replica (prefill, decode).
    pub gpus: (u32, u32),
    /// One aggregated worker pool.
    pub aggregated: bool,
}

/// A member's request for a round.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemberAsk {
    /// Its priority.
    pub priority: i32,
    /// Its weight.
    pub weight: f64,
    /// How far it misses its SLA ([`budget::sla_risk`]).
    pub risk: f64,
    /// Per pool (one for an aggregated graph): floor, want, GPUs per replica.
    pub pools: Vec<PoolAsk>,
}

/// What the budget answers a member.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// Its grant this round.
    pub grant: Grant,
    /// Replicas per pool it may ask for now (at most the grant: growth waits for GPUs others
    /// still hold).
    pub allowed: Vec<u32>,
    /// The budget's total.
    pub total: u64,
}

impl Membership {
    /// The request for a round: the floor and what the member wants per pool.
    pub fn ask(&self, want: (u32, u32), risk: f64) -> MemberAsk {
        MemberAsk {
            priority: self.priority,
            weight: self.weight,
            risk,
            pools: budget::graph_request_pools(self.aggregated, self.floor, want, self.gpus),
        }
    }
}

/// Replicas of a pool the budget lets it ask for: what it is allowed, never below its floor
/// unless it already is (a member whose floor the budget cannot fund keeps its minimum
/// replicas, outside the budget, rather than being scaled to zero).
fn clip(allowed: u32, asked: u32, floor: u32) -> u32 {
    allowed.max(asked.min(floor))
}

/// Cuts `decision` to what the budget lets it be now, and says what the grant is. `asked` is
/// the replicas asked for now; the decision's target (else the replicas it last wanted) was the
/// request.
pub(crate) fn granted(decision: &mut Decision, membership: &Membership, answer: &Answer, asked: (u32, u32)) {
    let aggregated = membership.aggregated;
    let floor = membership.floor;
    let allowed = budget::graph_replicas(aggregated, &answer.allowed, asked);
    let target = (
        clip(allowed.0, asked.0, floor.0),
        clip(allowed.1, asked.1, floor.1),
    );
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
    let changed = match decision.target {
        Some(want) => target != want,
        None => target != asked,
    };
    if changed {
        decision.target = Some(target);
        decision.note(&format!("budget {}: {explanation}", membership.name));
    }
    if grant.reason != GrantReason::Full || waiting {
        // Its changes are Events: say what limits the grant, not the request of the moment.
        decision.limitation = Some(Limitation {
            reason: LimitReason::SharedBudget,
            message: format!("budget {}: {limit}", membership.name),
        });
    } else if decision.limitation.is_none() {
        decision.limitation = Some(Limitation::within_bounds());
    }
    decision.grant = Some(GrantReport {
        name: membership.name.clone(),
        floor_gpus: grant.floor_gpus,
        asked_gpus: grant.asked_gpus,
        granted_gpus: grant.gpus,
        reason: grant.reason,
        message: explanation,
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{
        budget::Contender,
        policy::report::{Check, LimitReason},
    };

    fn membership(aggregated: bool) -> Membership {
        Membership {
            name: "gpus".into(),
            priority: 0,
            weight: 1.0,
            floor: (1, 1),
            gpus: (4, 4),
            aggregated,
        }
    }

    fn answer(reason: GrantReason, replicas: [u32; 2], allowed: [u32; 2]) -> Answer {
        Answer {
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
        let mut decision = Decision::keep(Check::Interval);
        decision.target = target;
        if target.is_some() {
            decision.message = "sized for the forecast".into();
        }
        decision
    }

    fn granted_to(
        target: Option<(u32, u32)>,
        answer: &Answer,
        asked: (u32, u32),
        aggregated: bool,
    ) -> Decision {
        let mut d = decision(target);
        granted(&mut d, &membership(aggregated), answer, asked);
        d
    }

    #[test]
    fn a_cut_decision_is_carried_out_at_the_grant_and_says_why() {
        let d = granted_to(
            Some((2, 2)),
            &answer(GrantReason::Cut, [1, 1], [1, 1]),
            (2, 2),
            false,
        );
        assert_eq!(d.target, Some((1, 1)));
        assert_eq!(
            d.message,
            "sized for the forecast; budget gpus: granted 8 of the 16 GPUs asked (floor 8): the budget's 32 GPUs went first to team/burst (priority 10, 16 GPUs)"
        );
        assert_eq!(d.limitation.unwrap().reason, LimitReason::SharedBudget);
        let grant = d.grant.unwrap();
        assert_eq!(
            (grant.reason, grant.granted_gpus, grant.asked_gpus),
            (GrantReason::Cut, 8, 16)
        );
    }

    #[test]
    fn between_decisions_a_cut_shrinks_and_a_release_grows_towards_the_last_want() {
        // No decision (a wake): cut from 2+2 to the floor.
        let d = granted_to(None, &answer(GrantReason::Cut, [1, 1], [1, 1]), (2, 2), false);
        assert_eq!(d.target, Some((1, 1)));
        assert!(d.message.starts_with("budget gpus: granted 8 of the 16 GPUs"));
        // Granted in full again: back to what it wanted.
        let d = granted_to(None, &answer(GrantReason::Full, [2, 2], [2, 2]), (1, 1), false);
        assert_eq!(d.target, Some((2, 2)));
        assert_eq!(d.grant.unwrap().reason, GrantReason::Full);
        // Nothing to change: no target, no message.
        let d = granted_to(None, &answer(GrantReason::Full, [2, 2], [2, 2]), (2, 2), false);
        assert_eq!((d.target, d.message.as_str()), (None, ""));
    }

    #[test]
    fn growth_waiting_for_released_gpus_is_said() {
        let d = granted_to(
            Some((4, 2)),
            &answer(GrantReason::Full, [4, 2], [3, 1]),
            (1, 1),
            false,
        );
        assert_eq!(d.target, Some((3, 1)));
        assert!(d.message.ends_with(
            "prefill 3 and decode 1 now, 4 and 2 once other members release the GPUs they still hold"
        ));
    }

    #[test]
    fn an_aggregated_graph_asks_for_its_one_pool_and_runs_its_grant_as_both() {
        assert_eq!(membership(false).ask((3, 4), 1.0).pools.len(), 2);
        let pools = membership(true).ask((3, 4), 1.0).pools;
        assert_eq!(
            (pools.len(), pools[0].floor, pools[0].want, pools[0].gpus),
            (1, 1, 4, 4)
        );
        let mut one = answer(GrantReason::Cut, [3, 0], [2, 0]);
        one.grant.replicas.truncate(1);
        one.allowed.truncate(1);
        let d = granted_to(Some((4, 4)), &one, (1, 1), true);
        assert_eq!(d.target, Some((2, 2)));
        assert!(
            d.message
                .ends_with("workers 2 now, 3 once other members release the GPUs they still hold")
        );
    }

    #[test]
    fn an_unfunded_floor_keeps_the_minimum_replicas() {
        let d = granted_to(
            Some((2, 2)),
            &answer(GrantReason::FloorUnfunded, [0, 0], [0, 0]),
            (2, 2),
            false,
        );
        assert_eq!(d.target, Some((1, 1)));
    }
}
