//! The budgets' ledgers: what each member of each GpuBudget asks for and holds, and what it was
//! last granted. The ledger is this module's alone: PlannerPolicy reconciles reach it through
//! [`Broker::ask`] (their request, answered with what they may hold now), [`Broker::settle`]
//! (what they hold after acting) and [`Broker::leave`]; the GpuBudget reconciler reads it
//! ([`Broker::view`]) to write the budget's status. Every call runs one round of planner-core's
//! arbitration over every live member, so a grant follows the latest requests of all.
//!
//! The ledger lives in the leader's memory. A new leader starts empty and restores what each
//! member held from the budget's status ([`Broker::restore`]), so that nobody grows into GPUs a
//! member that has not reported yet still holds; members report at their first reconcile.
//! A member that stops reporting (its policy deleted, made invalid, or moved to another budget)
//! gives its grant back after [`member_timeout`] of its interval.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Mutex,
    time::{Duration, Instant},
};

use planner_api::GpuBudgetStatus;
use planner_core::budget::{self, Grant, PoolAsk, Request};

/// A member: the policy's namespace and name.
pub type MemberKey = (String, String);

/// How long a member that stopped reporting keeps its place: three of its intervals (one late
/// interval is lateness, three is a policy that stopped), and never under a minute.
pub fn member_timeout(interval: Duration) -> Duration {
    (interval * 3).max(Duration::from_secs(60))
}

/// How long a member restored from the budget's status keeps what it held without reporting:
/// at start every policy reconciles within seconds.
pub const RESTORED_TIMEOUT: Duration = Duration::from_secs(300);

/// A member's request for a round.
#[derive(Clone, Debug, PartialEq)]
pub struct Ask {
    /// From its `spec.members` entry.
    pub priority: i32,
    /// From its `spec.members` entry.
    pub weight: i32,
    /// Its SLA risk ([`budget::sla_risk`]).
    pub risk: f64,
    /// Per pool (prefill, decode): floor, want, GPUs per replica.
    pub pools: Vec<PoolAsk>,
    /// How long it keeps its place without reporting.
    pub timeout: Duration,
}

/// What a member is told: its grant and what it may hold now (the planning loop's type).
pub use planner_core::policy::Answer;

#[derive(Clone, Debug)]
struct Member {
    ask: Ask,
    /// Replicas per pool it asks for now, or has been allowed and not settled yet.
    held: Vec<u32>,
    last_seen: Instant,
    grant: Option<Grant>,
    allowed: Vec<u32>,
    /// Restored from the budget's status, not reported since.
    restored: bool,
}

#[derive(Clone, Debug, Default)]
struct Ledger {
    total: u64,
    members: BTreeMap<MemberKey, Member>,
}

/// One member as the budget's status shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberView {
    /// Who.
    pub key: MemberKey,
    /// Its priority and weight.
    pub priority: i32,
    /// Its weight.
    pub weight: i32,
    /// Its grant (reason, GPUs, explanation).
    pub grant: Grant,
    /// GPUs it holds now.
    pub held_gpus: u64,
    /// Restored from the status, not reported since.
    pub restored: bool,
}

/// A budget's ledger, for its status.
#[derive(Clone, Debug, PartialEq)]
pub struct LedgerView {
    /// The total it arbitrates.
    pub total: u64,
    /// Members, in rank order (priority, then name).
    pub members: Vec<MemberView>,
}

/// Who must look at the budget again after a call: members whose allowance changed (so a
/// released GPU is taken, or a cut is applied, at once rather than at their next interval), and
/// whether the budget's status may have changed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Wakes {
    /// Members to reconcile.
    pub members: Vec<MemberKey>,
    /// Budgets whose status to rewrite.
    pub budgets: Vec<String>,
}

/// Every budget's ledger.
#[derive(Debug, Default)]
pub struct Broker {
    ledgers: Mutex<HashMap<String, Ledger>>,
}

impl Broker {
    /// Records `key`'s request and what it holds, runs a round and answers with its grant.
    /// `None` when the ledger's lock is poisoned (a panic elsewhere): the caller keeps its
    /// replicas.
    pub fn ask(
        &self,
        budget: &str,
        total: u64,
        key: &MemberKey,
        ask: Ask,
        held: Vec<u32>,
        now: Instant,
    ) -> Option<(Answer, Wakes)> {
        let mut ledgers = self.ledgers.lock().ok()?;
        // A member belongs to one budget: asking here leaves any other.
        let mut wakes = Wakes::default();
        for (name, ledger) in ledgers.iter_mut().filter(|(name, _)| name.as_str() != budget) {
            if ledger.members.remove(key).is_some() {
                wakes.budgets.push(name.clone());
                wakes.members.extend(round(ledger, now, Some(key)));
            }
        }
        let ledger = ledgers.entry(budget.to_string()).or_default();
        ledger.total = total;
        let member = ledger.members.entry(key.clone()).or_insert_with(|| Member {
            ask: ask.clone(),
            held: held.clone(),
            last_seen: now,
            grant: None,
            allowed: held.clone(),
            restored: false,
        });
        member.ask = ask;
        member.held = held;
        member.last_seen = now;
        member.restored = false;
        wakes.members.extend(round(ledger, now, Some(key)));
        wakes.budgets.push(budget.to_string());
        let member = ledger.members.get_mut(key)?;
        let answer = Answer {
            grant: member.grant.clone()?,
            allowed: member.allowed.clone(),
            total,
        };
        // What it may grow to is reserved until it settles, so that no other member is allowed
        // the same GPUs in the meantime.
        for (held, allowed) in member.held.iter_mut().zip(&answer.allowed) {
            *held = (*held).max(*allowed);
        }
        Some((answer, wakes))
    }

    /// Records what `key` holds after acting on its answer (the replicas it now asks for),
    /// releasing a reservation it did not use; others may grow into what it released.
    pub fn settle(&self, budget: &str, key: &MemberKey, held: Vec<u32>, now: Instant) -> Wakes {
        let Ok(mut ledgers) = self.ledgers.lock() else {
            return Wakes::default();
        };
        let Some(ledger) = ledgers.get_mut(budget) else {
            return Wakes::default();
        };
        let Some(member) = ledger.members.get_mut(key) else {
            return Wakes::default();
        };
        if member.held == held {
            member.last_seen = now;
            return Wakes::default();
        }
        member.held = held;
        member.last_seen = now;
        Wakes {
            members: round(ledger, now, Some(key)),
            budgets: vec![budget.to_string()],
        }
    }

    /// Removes `key` from every budget (its policy was deleted or left); its GPUs go to the
    /// others at once.
    pub fn leave(&self, key: &MemberKey, now: Instant) -> Wakes {
        let Ok(mut ledgers) = self.ledgers.lock() else {
            return Wakes::default();
        };
        let mut wakes = Wakes::default();
        for (name, ledger) in ledgers.iter_mut() {
            if ledger.members.remove(key).is_some() {
                wakes.budgets.push(name.clone());
                wakes.members.extend(round(ledger, now, None));
            }
        }
        wakes
    }

    /// The budget `key` is a member of, if any.
    pub fn membership(&self, key: &MemberKey) -> Option<String> {
        let ledgers = self.ledgers.lock().ok()?;
        ledgers
            .iter()
            .find(|(_, ledger)| ledger.members.contains_key(key))
            .map(|(name, _)| name.clone())
    }

    /// Starts a budget's ledger from its status when this process has none (a new leader): each
    /// member listed holds what the status says until it reports or [`RESTORED_TIMEOUT`] passes.
    pub fn restore(&self, budget: &str, total: u64, status: &GpuBudgetStatus, now: Instant) {
        let Ok(mut ledgers) = self.ledgers.lock() else {
            return;
        };
        // Nothing to restore makes no ledger: a budget none of this process's policies joined
        // is not this process's to write (an operator scoped to another namespace).
        if ledgers.contains_key(budget) || status.members.is_empty() {
            return;
        }
        let mut ledger = Ledger {
            total,
            members: BTreeMap::new(),
        };
        for row in &status.members {
            let held = u32::try_from(row.held_gpus.max(0)).unwrap_or(u32::MAX);
            // What it holds is all that is known: one pool of one-GPU replicas, floor and want
            // at what it holds, so it keeps it while the budget has room.
            let ask = Ask {
                priority: row.priority,
                weight: row.weight,
                risk: 1.0,
                pools: vec![PoolAsk {
                    floor: held,
                    want: held,
                    gpus: 1,
                }],
                timeout: RESTORED_TIMEOUT,
            };
            ledger.members.insert(
                (row.namespace.clone(), row.name.clone()),
                Member {
                    ask,
                    held: vec![held],
                    last_seen: now,
                    grant: None,
                    allowed: vec![held],
                    restored: true,
                },
            );
        }
        round(&mut ledger, now, None);
        ledgers.insert(budget.to_string(), ledger);
    }

    /// Updates a budget's total (its spec changed) and runs a round; members whose allowance
    /// changed are woken.
    pub fn set_total(&self, budget: &str, total: u64, now: Instant) -> Wakes {
        let Ok(mut ledgers) = self.ledgers.lock() else {
            return Wakes::default();
        };
        match ledgers.get_mut(budget) {
            Some(ledger) if ledger.total != total => {
                ledger.total = total;
                Wakes {
                    members: round(ledger, now, None),
                    budgets: vec![budget.to_string()],
                }
            }
            _ => Wakes::default(),
        }
    }

    /// A budget's ledger after dropping members that stopped reporting (`None`: this process
    /// has none). The wakes are for members whose allowance an expiry changed.
    pub fn view(&self, budget: &str, now: Instant) -> Option<(LedgerView, Wakes)> {
        let mut ledgers = self.ledgers.lock().ok()?;
        let ledger = ledgers.get_mut(budget)?;
        let before = ledger.members.len();
        let mut wakes = Wakes::default();
        expire(ledger, now);
        if ledger.members.len() != before {
            wakes.members = round(ledger, now, None);
        }
        let members = ledger
            .members
            .iter()
            .filter_map(|(key, m)| {
                let grant = m.grant.clone()?;
                let held_gpus = m
                    .held
                    .iter()
                    .zip(&m.ask.pools)
                    .map(|(r, p)| u64::from(*r) * u64::from(p.gpus.max(1)))
                    .sum();
                Some(MemberView {
                    key: key.clone(),
                    priority: m.ask.priority,
                    weight: m.ask.weight,
                    grant,
                    held_gpus,
                    restored: m.restored,
                })
            })
            .collect::<Vec<_>>();
        let mut members = members;
        members.sort_by(|a, b| b.priority.cmp(&a.priority).then_with(|| a.key.cmp(&b.key)));
        Some((
            LedgerView {
                total: ledger.total,
                members,
            },
            wakes,
        ))
    }

    /// Drops the ledgers of budgets that no longer exist.
    pub fn retain_budgets(&self, live: impl Fn(&str) -> bool) {
        if let Ok(mut ledgers) = self.ledgers.lock() {
            ledgers.retain(|name, _| live(name));
        }
    }
}

/// Drops members that have not reported within their timeout.
fn expire(ledger: &mut Ledger, now: Instant) {
    ledger
        .members
        .retain(|_, m| now.saturating_duration_since(m.last_seen) <= m.ask.timeout);
}

/// One round over a ledger: expiries, the grants and what each member may hold now. Returns
/// the members (other than `caller`) whose allowance changed.
fn round(ledger: &mut Ledger, now: Instant, caller: Option<&MemberKey>) -> Vec<MemberKey> {
    expire(ledger, now);
    let keys: Vec<MemberKey> = ledger.members.keys().cloned().collect();
    let requests: Vec<Request> = ledger
        .members
        .iter()
        .map(|((namespace, name), m)| Request {
            member: format!("{namespace}/{name}"),
            priority: m.ask.priority,
            weight: f64::from(m.ask.weight),
            risk: m.ask.risk,
            pools: m.ask.pools.clone(),
        })
        .collect();
    let held: Vec<Vec<u32>> = ledger.members.values().map(|m| m.held.clone()).collect();
    let grants = budget::arbitrate(ledger.total, &requests);
    let allowed = budget::allowances(ledger.total, &requests, &grants, &held);
    let mut changed = Vec::new();
    for ((key, grant), allowed) in keys.into_iter().zip(grants).zip(allowed) {
        let Some(member) = ledger.members.get_mut(&key) else {
            continue;
        };
        if member.allowed != allowed && caller != Some(&key) && !member.restored {
            changed.push(key);
        }
        member.grant = Some(grant);
        member.allowed = allowed;
    }
    changed
}

#[cfg(test)]
mod tests {
    use planner_api::BudgetMemberStatus;
    use planner_core::budget::GrantReason;

    use super::*;

    fn key(name: &str) -> MemberKey {
        ("team".into(), name.into())
    }

    fn ask(priority: i32, want: (u32, u32)) -> Ask {
        Ask {
            priority,
            weight: 1,
            risk: 1.0,
            pools: vec![
                PoolAsk {
                    floor: 1,
                    want: want.0,
                    gpus: 4,
                },
                PoolAsk {
                    floor: 1,
                    want: want.1,
                    gpus: 4,
                },
            ],
            timeout: Duration::from_secs(60),
        }
    }

    #[test]
    fn a_burst_waits_for_the_gpus_the_cut_member_holds_and_takes_them_once_released() {
        let broker = Broker::default();
        let t0 = Instant::now();
        // The steady member holds 2+2 replicas (16 GPUs) of a 32-GPU budget.
        let (answer, _) = broker
            .ask("gpus", 32, &key("steady"), ask(0, (2, 2)), vec![2, 2], t0)
            .unwrap();
        assert_eq!(
            (answer.allowed.clone(), answer.grant.reason),
            (vec![2, 2], GrantReason::Full)
        );
        // The burst (priority 10) asks for 6+4: granted 4+2; it may grow now only into the 12
        // free GPUs, and the steady member must be woken to shrink.
        let (answer, wakes) = broker
            .ask("gpus", 32, &key("burst"), ask(10, (6, 4)), vec![1, 1], t0)
            .unwrap();
        assert_eq!(answer.grant.replicas, [4, 2]);
        assert_eq!(answer.allowed, [3, 1]);
        assert_eq!(wakes.members, [key("steady")]);
        // Its reservation counts: the steady member is allowed its grant, the floor.
        let (steady, _) = broker
            .ask("gpus", 32, &key("steady"), ask(0, (2, 2)), vec![2, 2], t0)
            .unwrap();
        assert_eq!(steady.allowed, [1, 1]);
        assert_eq!(steady.grant.reason, GrantReason::Cut);
        assert!(steady.grant.explanation(32).contains("team/burst (priority 10"));
        // Once it has shrunk, the burst is woken and may take its whole grant.
        let wakes = broker.settle("gpus", &key("steady"), vec![1, 1], t0);
        assert_eq!(wakes.members, [key("burst")]);
        let (answer, _) = broker
            .ask("gpus", 32, &key("burst"), ask(10, (6, 4)), vec![3, 1], t0)
            .unwrap();
        assert_eq!(answer.allowed, [4, 2]);
        // The burst ends: the steady member gets its GPUs back in the same round.
        broker.settle("gpus", &key("burst"), vec![4, 2], t0);
        let (_, wakes) = broker
            .ask("gpus", 32, &key("burst"), ask(10, (1, 1)), vec![4, 2], t0)
            .unwrap();
        let _ = wakes;
        broker.settle("gpus", &key("burst"), vec![1, 1], t0);
        let (steady, _) = broker
            .ask("gpus", 32, &key("steady"), ask(0, (2, 2)), vec![1, 1], t0)
            .unwrap();
        assert_eq!(
            (steady.allowed, steady.grant.reason),
            (vec![2, 2], GrantReason::Full)
        );
    }

    #[test]
    fn a_member_that_stops_reporting_gives_its_grant_back_after_its_timeout() {
        let broker = Broker::default();
        let t0 = Instant::now();
        broker.ask("gpus", 16, &key("gone"), ask(5, (3, 1)), vec![3, 1], t0);
        // What the member that stays is allowed when it asks at `at`.
        let stays_allowed = |at| {
            broker
                .ask("gpus", 16, &key("stays"), ask(0, (3, 1)), vec![1, 1], at)
                .unwrap()
                .0
                .allowed
        };
        assert_eq!(stays_allowed(t0), [1, 1]);
        // Within its timeout it keeps its place.
        assert_eq!(stays_allowed(t0 + Duration::from_secs(59)), [1, 1]);
        // After it, its GPUs go to the other.
        assert_eq!(stays_allowed(t0 + Duration::from_secs(61)), [3, 1]);
        let (view, _) = broker.view("gpus", t0 + Duration::from_secs(61)).unwrap();
        assert_eq!(view.members.len(), 1);
    }

    #[test]
    fn a_deleted_member_leaves_at_once_and_the_others_are_woken() {
        let broker = Broker::default();
        let t0 = Instant::now();
        broker.ask("gpus", 16, &key("a"), ask(5, (3, 1)), vec![3, 1], t0);
        broker.ask("gpus", 16, &key("b"), ask(0, (3, 1)), vec![1, 1], t0);
        assert_eq!(broker.membership(&key("a")).as_deref(), Some("gpus"));
        let wakes = broker.leave(&key("a"), t0);
        assert_eq!(wakes.members, [key("b")]);
        assert_eq!(wakes.budgets, ["gpus"]);
        assert_eq!(broker.membership(&key("a")), None);
    }

    #[test]
    fn asking_another_budget_leaves_the_first() {
        let broker = Broker::default();
        let t0 = Instant::now();
        broker.ask("one", 16, &key("a"), ask(0, (1, 1)), vec![1, 1], t0);
        let (_, wakes) = broker
            .ask("two", 16, &key("a"), ask(0, (1, 1)), vec![1, 1], t0)
            .unwrap();
        assert!(wakes.budgets.contains(&"one".to_string()));
        assert!(broker.view("one", t0).unwrap().0.members.is_empty());
        assert_eq!(broker.membership(&key("a")).as_deref(), Some("two"));
    }

    #[test]
    fn a_new_leader_restores_what_members_held_until_they_report() {
        let broker = Broker::default();
        let t0 = Instant::now();
        let status = GpuBudgetStatus {
            members: vec![BudgetMemberStatus {
                namespace: "team".into(),
                name: "held".into(),
                priority: 0,
                weight: 1,
                held_gpus: 24,
                ..BudgetMemberStatus::default()
            }],
            ..GpuBudgetStatus::default()
        };
        broker.restore("gpus", 32, &status, t0);
        // A higher-priority member cannot grow into the 24 GPUs the unreported member holds.
        let (answer, _) = broker
            .ask("gpus", 32, &key("new"), ask(9, (6, 2)), vec![1, 1], t0)
            .unwrap();
        assert_eq!(
            answer.grant.replicas,
            [1, 1],
            "what it held is the restored member's floor"
        );
        assert_eq!(answer.allowed, [1, 1]);
        // It reports with its real pools: it is cut to its floor, the new member grows.
        let (held, _) = broker
            .ask("gpus", 32, &key("held"), ask(0, (3, 3)), vec![3, 3], t0)
            .unwrap();
        assert_eq!(held.allowed, [1, 1]);
        let wakes = broker.settle("gpus", &key("held"), vec![1, 1], t0);
        assert_eq!(wakes.members, [key("new")]);
        let (answer, _) = broker
            .ask("gpus", 32, &key("new"), ask(9, (6, 2)), vec![1, 1], t0)
            .unwrap();
        assert_eq!(answer.allowed, [4, 2]);
        // Restoring again does not overwrite a live ledger.
        broker.restore("gpus", 32, &status, t0);
        assert!(
            !broker
                .view("gpus", t0)
                .unwrap()
                .0
                .members
                .iter()
                .any(|m| m.restored)
        );
    }
}
