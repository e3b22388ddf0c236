//! One GPU budget shared by several graphs: the arbitration of their requests. Pure: the operator
//! and the simulator call these functions unchanged.
//!
//! Each round, every member asks for replicas per pool (two for a disaggregated graph, one for
//! an aggregated one: [`graph_request_pools`]): its floor (the replicas it never goes below),
//! what meets its SLA (`want`) and the GPUs one replica of the pool takes. [`arbitrate`] grants
//! replicas so that the granted GPUs never exceed the total:
//!
//! 1. **Floors first**, members in [`rank`] order (priority, then name). A member whose whole
//!    floor does not fit in what is left gets none of it ([`GrantReason::FloorUnfunded`]); a
//!    later, smaller floor may still fit. When the floors fit, every member gets its floor.
//! 2. **Then by priority**, the highest first. Within a priority, **shares first**: each member
//!    is granted what it asks for up to its share of the GPUs the priority has (what is left and
//!    its members' floors, split by `weight`), replica by replica; so no member gets less than a
//!    static split of those GPUs would give it, if it asks for that much. **Then whole requests**
//!    with what the shares left, one member after another: the one with the fewest GPUs still
//!    unmet per unit of `weight`, then the highest `risk` ([`sla_risk`], how far it is missing
//!    its SLA), then by name. It is granted all it asks for that fits, replica by replica (within
//!    a member, the pool furthest from what it asked, relatively), before the next is served. A
//!    request is what meets the member's SLA, so a grant short of it tends to miss whatever its
//!    size: filling requests in full meets more SLAs than cutting every member by the same share
//!    of its request; but whole requests alone, smallest first, starve the member whose request
//!    grew while it waited (its backlog), which then stays the largest. Measured in the
//!    simulator's multi-graph run: cutting by share of the request, or by that share times risk,
//!    met fewer intervals than the same GPUs split statically; whole requests alone lost to an
//!    even static split by 39 intervals at one total when one graph was aggregated; granting
//!    every member what its planner sizes without its margins before anyone's margins met fewer
//!    than whole requests.
//!
//! What a member does not ask for is free for the others in the same round: GPUs one graph gives
//! back are granted to another by the same call.
//!
//! [`allowances`] turns grants into what each member may hold *now*, given the replicas each
//! holds: a member shrinks to its grant at once, but grows only into GPUs that nobody holds (in
//! rank order), so the replicas held stay within the total while members act one after another
//! and a cut member has not released its GPUs yet.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

/// One pool of a member's request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolAsk {
    /// Replicas it never goes below (its minimum).
    pub floor: u32,
    /// Replicas that meet its SLA (at least the floor is granted when the floors fit).
    pub want: u32,
    /// GPUs per replica (0 is read as 1).
    pub gpus: u32,
}

impl PoolAsk {
    fn gpus(&self) -> u64 {
        u64::from(self.gpus.max(1))
    }

    /// What is asked: the want, never below the floor.
    fn asked(&self) -> u32 {
        self.want.max(self.floor)
    }
}

/// A graph's pools as a budget request: prefill and decode, or for an aggregated graph its one
/// worker pool (both pools are that pool, whose replicas are the larger of the two; its GPUs
/// per replica are the decode engine's, counted once). `floor`, `want` and `gpus` are per
/// (prefill, decode).
pub fn graph_request_pools(
    aggregated: bool,
    floor: (u32, u32),
    want: (u32, u32),
    gpus: (u32, u32),
) -> Vec<PoolAsk> {
    if aggregated {
        vec![PoolAsk {
            floor: floor.0.max(floor.1),
            want: want.0.max(want.1),
            gpus: gpus.1,
        }]
    } else {
        vec![
            PoolAsk {
                floor: floor.0,
                want: want.0,
                gpus: gpus.0,
            },
            PoolAsk {
                floor: floor.1,
                want: want.1,
                gpus: gpus.1,
            },
        ]
    }
}

/// The (prefill, decode) replicas of the pools [`graph_request_pools`] made (an aggregated
/// graph's one pool is both); `missing` for a pool `replicas` does not hold.
pub fn graph_replicas(aggregated: bool, replicas: &[u32], missing: (u32, u32)) -> (u32, u32) {
    if aggregated {
        let n = replicas.first().copied().unwrap_or(missing.0.max(missing.1));
        (n, n)
    } else {
        (
            replicas.first().copied().unwrap_or(missing.0),
            replicas.get(1).copied().unwrap_or(missing.1),
        )
    }
}

/// One member's request for a round.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The member's name (`namespace/name` in the operator); ties are broken by it, so a round
    /// does not depend on the order of the requests.
    pub member: String,
    /// Higher is served first, after every floor.
    pub priority: i32,
    /// Among members of the same priority, its unmet GPUs are divided by it to choose who is
    /// served next (> 0; anything else counts as 1).
    pub weight: f64,
    /// How far the member misses its SLA ([`sla_risk`]; anything not finite and > 0 counts
    /// as 1): among equal priorities and unmet GPUs per weight, the higher is served first.
    pub risk: f64,
    /// Its pools.
    pub pools: Vec<PoolAsk>,
}

impl Request {
    /// GPUs of its floor.
    pub fn floor_gpus(&self) -> u64 {
        self.pools.iter().map(|p| u64::from(p.floor) * p.gpus()).sum()
    }

    /// GPUs it asks for (the want of each pool, never below the floor).
    pub fn asked_gpus(&self) -> u64 {
        self.pools.iter().map(|p| u64::from(p.asked()) * p.gpus()).sum()
    }

    fn gpus_of(&self, replicas: &[u32]) -> u64 {
        self.pools
            .iter()
            .zip(replicas)
            .map(|(p, r)| u64::from(*r) * p.gpus())
            .sum()
    }

    fn weight(&self) -> f64 {
        positive_or_one(self.weight)
    }

    fn risk(&self) -> f64 {
        positive_or_one(self.risk)
    }
}

fn positive_or_one(value: f64) -> f64 {
    if value.is_finite() && value > 0.0 {
        value
    } else {
        1.0
    }
}

/// Highest SLA risk counted: one member far off its target must not take everything.
pub const MAX_RISK: f64 = 10.0;

/// A member's SLA risk from its last interval: the larger of observed TTFT over its target and
/// observed ITL over its target, at least 1 (meeting the SLA by a wide margin earns no less
/// than meeting it exactly, so a member is not cut for having been served well) and at most
/// [`MAX_RISK`]; 1 when nothing was observed.
pub fn sla_risk(ttft_ms: Option<f64>, ttft_target_ms: f64, itl_ms: Option<f64>, itl_target_ms: f64) -> f64 {
    let ratio = |observed: Option<f64>, target: f64| {
        observed
            .filter(|o| o.is_finite() && *o >= 0.0)
            .map(|o| o / target)
            .filter(|r| r.is_finite())
    };
    let worst = [ratio(ttft_ms, ttft_target_ms), ratio(itl_ms, itl_target_ms)]
        .into_iter()
        .flatten()
        .fold(1.0_f64, f64::max);
    worst.min(MAX_RISK)
}

/// Why a member was granted what it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GrantReason {
    /// Everything it asked for.
    Full,
    /// Its floor and part (or none) of what it asked for above it.
    Cut,
    /// Not even its floor: the floors of members ranked before it took the budget.
    FloorUnfunded,
}

impl GrantReason {
    /// CamelCase name, for conditions and status.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "Full",
            Self::Cut => "Cut",
            Self::FloorUnfunded => "FloorUnfunded",
        }
    }
}

/// A member ranked before a cut one, and what it took.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Contender {
    /// Its name.
    pub member: String,
    /// Its priority.
    pub priority: i32,
    /// GPUs granted to it above its floor (or its floor's, for [`GrantReason::FloorUnfunded`]).
    pub gpus: u64,
}

/// What one member is granted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Grant {
    /// The member's name.
    pub member: String,
    /// Replicas per pool, in the request's order.
    pub replicas: Vec<u32>,
    /// Their GPUs.
    pub gpus: u64,
    /// GPUs it asked for.
    pub asked_gpus: u64,
    /// GPUs of its floor.
    pub floor_gpus: u64,
    /// Why.
    pub reason: GrantReason,
    /// For a cut member: those served before it that were granted GPUs above their floors; for
    /// a member whose floor went unfunded: those of its priority or higher whose floors were
    /// funded. Highest priority and most GPUs first.
    pub contenders: Vec<Contender>,
}

impl Grant {
    /// What limited the grant, in words that change only when the grant does (not with what was
    /// asked or what the others hold): for a condition whose changes are Events.
    pub fn limit(&self, total_gpus: u64) -> String {
        let served: Vec<String> = self
            .contenders
            .iter()
            .take(3)
            .map(|c| format!("{} (priority {})", c.member, c.priority))
            .collect();
        match self.reason {
            GrantReason::Full => format!("granted all {} GPUs asked", self.gpus),
            GrantReason::Cut if served.is_empty() => format!(
                "granted {} GPUs (floor {}): the budget's {total_gpus} GPUs are all granted",
                self.gpus, self.floor_gpus
            ),
            GrantReason::Cut => format!(
                "granted {} GPUs (floor {}) of the budget's {total_gpus}: served first {}",
                self.gpus,
                self.floor_gpus,
                served.join(", ")
            ),
            GrantReason::FloorUnfunded => format!(
                "granted {} GPUs, below its floor of {}: the budget's {total_gpus} GPUs hold others' floors",
                self.gpus, self.floor_gpus
            ),
        }
    }

    /// One line on what was granted and why, naming up to three contenders.
    pub fn explanation(&self, total_gpus: u64) -> String {
        let names = |limit: usize| {
            let mut named: Vec<String> = self
                .contenders
                .iter()
                .take(limit)
                .map(|c| format!("{} (priority {}, {} GPUs)", c.member, c.priority, c.gpus))
                .collect();
            if self.contenders.len() > limit {
                named.push(format!("{} more", self.contenders.len() - limit));
            }
            named.join(", ")
        };
        match self.reason {
            GrantReason::Full => format!(
                "granted all {} GPUs asked (floor {}) of the budget's {total_gpus}",
                self.asked_gpus, self.floor_gpus
            ),
            GrantReason::Cut if self.contenders.is_empty() => format!(
                "granted {} of the {} GPUs asked (floor {}): the budget's {total_gpus} GPUs are all granted",
                self.gpus, self.asked_gpus, self.floor_gpus
            ),
            GrantReason::Cut => format!(
                "granted {} of the {} GPUs asked (floor {}): the budget's {total_gpus} GPUs went first to {}",
                self.gpus,
                self.asked_gpus,
                self.floor_gpus,
                names(3)
            ),
            GrantReason::FloorUnfunded => format!(
                "granted {} GPUs, below its floor of {}: the budget's {total_gpus} GPUs hold the floors of {} first",
                self.gpus,
                self.floor_gpus,
                if self.contenders.is_empty() {
                    "no other member; the floor is larger than the budget".to_string()
                } else {
                    names(3)
                }
            ),
        }
    }
}

/// The order members are served in, floors first and then replica by replica: higher priority
/// first, then by name.
pub fn rank(requests: &[Request]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| {
        requests[b]
            .priority
            .cmp(&requests[a].priority)
            .then_with(|| requests[a].member.cmp(&requests[b].member))
    });
    order
}

/// The pool of `request` to grant a replica next, given `granted` and at most `left` GPUs: the
/// one furthest below what it asked for (`target`), relatively, that fits.
fn next_pool(request: &Request, granted: &[u32], target: &[u32], left: u64) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (p, pool) in request.pools.iter().enumerate() {
        let (have, want) = (granted[p], target[p]);
        if have >= want || pool.gpus() > left {
            continue;
        }
        let short = f64::from(want - have) / f64::from(want);
        if best.is_none_or(|(_, s)| short > s) {
            best = Some((p, short));
        }
    }
    best.map(|(p, _)| p)
}

/// The member of `pending` (indices in [`rank`] order) to serve next above the floors: the
/// highest priority; among equal priorities the smallest request still unmet per unit of
/// weight, then the highest SLA risk, then the first in rank order (by name). Its position in
/// `pending`.
fn next_member(requests: &[Request], pending: &[usize], granted: &[Vec<u32>]) -> Option<usize> {
    let unmet = |i: usize| {
        let r = &requests[i];
        r.asked_gpus().saturating_sub(r.gpus_of(&granted[i])) as f64 / r.weight()
    };
    let mut best: Option<usize> = None;
    for (at, &i) in pending.iter().enumerate() {
        let better = best.is_none_or(|b| {
            let (candidate, current) = (&requests[i], &requests[pending[b]]);
            candidate
                .priority
                .cmp(&current.priority)
                .then_with(|| unmet(pending[b]).total_cmp(&unmet(i)))
                .then_with(|| candidate.risk().total_cmp(&current.risk()))
                == Ordering::Greater
        });
        if better {
            best = Some(at);
        }
    }
    best
}

/// Grants replicas to every member of one round within `total_gpus` (see the module docs).
/// The grants are in the order of `requests`.
pub fn arbitrate(total_gpus: u64, requests: &[Request]) -> Vec<Grant> {
    let order = rank(requests);
    let asked: Vec<Vec<u32>> = requests
        .iter()
        .map(|r| r.pools.iter().map(PoolAsk::asked).collect())
        .collect();
    let mut granted: Vec<Vec<u32>> = requests.iter().map(|r| vec![0; r.pools.len()]).collect();
    let mut funded = vec![false; requests.len()];
    let mut left = total_gpus;

    // 1. Floors.
    for &i in &order {
        let floor = requests[i].floor_gpus();
        if floor <= left {
            left -= floor;
            granted[i] = requests[i].pools.iter().map(|p| p.floor).collect();
            funded[i] = true;
        }
    }

    // 2. Above the floors, by priority: each member up to its share of the priority's GPUs
    // (what is left and its members' floors, by weight), then whole requests: the next member
    // takes all it asks for that fits. When each member was served for its whole request: a
    // cut member names those served before it.
    let mut served = vec![usize::MAX; requests.len()];
    let mut turn = 0;
    let mut priorities: Vec<i32> = order.iter().map(|&i| requests[i].priority).collect();
    priorities.dedup();
    for priority in priorities {
        let group: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&i| funded[i] && requests[i].priority == priority)
            .collect();
        let weights: f64 = group.iter().map(|&i| requests[i].weight()).sum();
        let pool_gpus = left
            + group
                .iter()
                .map(|&i| requests[i].gpus_of(&granted[i]))
                .sum::<u64>();
        for &i in &group {
            let cap = (pool_gpus as f64 * requests[i].weight() / weights).floor() as u64;
            loop {
                let room = cap.saturating_sub(requests[i].gpus_of(&granted[i])).min(left);
                let Some(pool) = next_pool(&requests[i], &granted[i], &asked[i], room) else {
                    break;
                };
                granted[i][pool] += 1;
                left -= requests[i].pools[pool].gpus();
            }
        }
        let mut pending = group;
        while let Some(at) = next_member(requests, &pending, &granted) {
            let i = pending.remove(at);
            served[i] = turn;
            turn += 1;
            while let Some(pool) = next_pool(&requests[i], &granted[i], &asked[i], left) {
                granted[i][pool] += 1;
                left -= requests[i].pools[pool].gpus();
            }
        }
    }

    let above_floor = |i: usize| {
        requests[i]
            .gpus_of(&granted[i])
            .saturating_sub(requests[i].floor_gpus())
    };
    requests
        .iter()
        .enumerate()
        .map(|(i, request)| {
            let gpus = request.gpus_of(&granted[i]);
            let reason = if !funded[i] && request.floor_gpus() > 0 {
                GrantReason::FloorUnfunded
            } else if granted[i] == asked[i] {
                GrantReason::Full
            } else {
                GrantReason::Cut
            };
            let mut contenders: Vec<Contender> = match reason {
                GrantReason::Full => Vec::new(),
                GrantReason::Cut => (0..requests.len())
                    .filter(|&j| j != i && served[j] < served[i] && above_floor(j) > 0)
                    .map(|j| Contender {
                        member: requests[j].member.clone(),
                        priority: requests[j].priority,
                        gpus: above_floor(j),
                    })
                    .collect(),
                GrantReason::FloorUnfunded => (0..requests.len())
                    .filter(|&j| j != i && funded[j] && requests[j].priority >= request.priority)
                    .map(|j| Contender {
                        member: requests[j].member.clone(),
                        priority: requests[j].priority,
                        gpus: requests[j].floor_gpus(),
                    })
                    .collect(),
            };
            contenders.sort_by(|a, b| {
                b.priority
                    .cmp(&a.priority)
                    .then(b.gpus.cmp(&a.gpus))
                    .then_with(|| a.member.cmp(&b.member))
            });
            Grant {
                member: request.member.clone(),
                replicas: granted[i].clone(),
                gpus,
                asked_gpus: request.asked_gpus(),
                floor_gpus: request.floor_gpus(),
                reason,
                contenders,
            }
        })
        .collect()
}

/// What each member may hold now, per pool, given its grant and the replicas every member holds
/// (`held`, in the order of `requests`; a missing pool holds 0): a pool above its grant comes
/// down to it at once; a pool below grows towards it only into GPUs nobody holds, members in
/// [`rank`] order. A member's own release may pay for its own growth (it applies both), never
/// for another's, which must wait until the release has happened. When the replicas held already
/// exceed the total, nothing grows until enough is released.
pub fn allowances(
    total_gpus: u64,
    requests: &[Request],
    grants: &[Grant],
    held: &[Vec<u32>],
) -> Vec<Vec<u32>> {
    let holding = |i: usize, p: usize| held.get(i).and_then(|h| h.get(p)).copied().unwrap_or(0);
    let granted = |i: usize, p: usize| {
        grants
            .get(i)
            .and_then(|g| g.replicas.get(p))
            .copied()
            .unwrap_or(0)
    };
    let held_gpus: u64 = requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            r.pools
                .iter()
                .enumerate()
                .map(|(p, pool)| u64::from(holding(i, p)) * pool.gpus())
                .sum::<u64>()
        })
        .sum();
    let mut free = total_gpus.saturating_sub(held_gpus);
    let mut out: Vec<Vec<u32>> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            (0..r.pools.len())
                .map(|p| holding(i, p).min(granted(i, p)))
                .collect()
        })
        .collect();
    for i in rank(requests) {
        let request = &requests[i];
        let release: u64 = request
            .pools
            .iter()
            .enumerate()
            .map(|(p, pool)| u64::from(holding(i, p).saturating_sub(granted(i, p))) * pool.gpus())
            .sum();
        let target: Vec<u32> = (0..request.pools.len()).map(|p| granted(i, p)).collect();
        let mut available = free + release;
        while let Some(p) = next_pool(request, &out[i], &target, available) {
            out[i][p] += 1;
            available -= request.pools[p].gpus();
        }
        free = free.min(available);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn member(name: &str, priority: i32, pools: &[(u32, u32, u32)]) -> Request {
        Request {
            member: name.into(),
            priority,
            weight: 1.0,
            risk: 1.0,
            pools: pools
                .iter()
                .map(|&(floor, want, gpus)| PoolAsk { floor, want, gpus })
                .collect(),
        }
    }

    fn replicas(grants: &[Grant]) -> Vec<Vec<u32>> {
        grants.iter().map(|g| g.replicas.clone()).collect()
    }

    #[test]
    fn everyone_is_granted_in_full_when_the_budget_holds_every_request() {
        let requests = [
            member("a/llama", 0, &[(1, 3, 4), (1, 2, 4)]),
            member("b/qwen", 0, &[(1, 4, 1), (1, 1, 1)]),
        ];
        let grants = arbitrate(64, &requests);
        assert_eq!(replicas(&grants), [vec![3, 2], vec![4, 1]]);
        assert!(grants.iter().all(|g| g.reason == GrantReason::Full));
        assert_eq!(
            (grants[0].gpus, grants[0].asked_gpus, grants[0].floor_gpus),
            (20, 20, 8)
        );
        assert_eq!(
            grants[0].explanation(64),
            "granted all 20 GPUs asked (floor 8) of the budget's 64"
        );
    }

    #[test]
    fn a_higher_priority_burst_takes_everything_above_the_others_floor() {
        // 32 GPUs; the bursting graph (priority 10) asks for 40, the other (priority 0) for 16.
        let requests = [
            member("team-b/steady", 0, &[(1, 2, 4), (1, 2, 4)]),
            member("team-a/burst", 10, &[(1, 6, 4), (1, 4, 4)]),
        ];
        let grants = arbitrate(32, &requests);
        // The steady graph keeps its floor (8 GPUs); the burst gets the remaining 24.
        assert_eq!(replicas(&grants), [vec![1, 1], vec![4, 2]]);
        assert_eq!(grants[0].reason, GrantReason::Cut);
        assert_eq!(grants[1].reason, GrantReason::Cut);
        assert_eq!(
            grants[0].explanation(32),
            "granted 8 of the 16 GPUs asked (floor 8): the budget's 32 GPUs went first to team-a/burst (priority 10, 16 GPUs)"
        );
        assert_eq!(
            grants[0].limit(32),
            "granted 8 GPUs (floor 8) of the budget's 32: served first team-a/burst (priority 10)"
        );
        // The burst itself is cut by the total, not by anyone ahead of it.
        assert!(grants[1].contenders.is_empty());
        assert_eq!(
            grants[1].explanation(32),
            "granted 24 of the 40 GPUs asked (floor 8): the budget's 32 GPUs are all granted"
        );
        // When the burst ends, the steady graph gets its GPUs back in the same round.
        let calm = [
            requests[0].clone(),
            member("team-a/burst", 10, &[(1, 1, 4), (1, 1, 4)]),
        ];
        let grants = arbitrate(32, &calm);
        assert_eq!(replicas(&grants), [vec![2, 2], vec![1, 1]]);
        assert!(grants.iter().all(|g| g.reason == GrantReason::Full));
    }

    #[test]
    fn equal_priorities_get_their_shares_then_whole_requests_smallest_first() {
        let a = member("a", 0, &[(1, 10, 1)]);
        let b = member("b", 0, &[(1, 10, 1)]);
        // Equal: each its half of the budget, neither whole.
        let grants = arbitrate(12, &[a.clone(), b.clone()]);
        assert_eq!(replicas(&grants), [vec![6], vec![6]]);
        assert_eq!(
            (grants[0].reason, grants[1].reason),
            (GrantReason::Cut, GrantReason::Cut)
        );
        assert_eq!(grants[1].contenders[0].member, "a");
        // What a smaller request leaves of its share goes to the other, whatever the names.
        let small = member("z", 0, &[(1, 4, 1)]);
        assert_eq!(
            replicas(&arbitrate(12, &[a.clone(), small.clone()])),
            [vec![8], vec![4]]
        );
        // Above the shares, the first by name; twice the risk breaks that tie.
        assert_eq!(
            replicas(&arbitrate(13, &[a.clone(), b.clone()])),
            [vec![7], vec![6]]
        );
        let mut risky = b.clone();
        risky.risk = 2.0;
        assert_eq!(replicas(&arbitrate(13, &[a.clone(), risky])), [vec![6], vec![7]]);
        // Weight sizes the shares (3 and 9 of 12) and divides the unmet GPUs.
        let mut heavy = b.clone();
        heavy.weight = 3.0;
        let c = member("c", 0, &[(1, 4, 1)]);
        let grants = arbitrate(12, &[c, heavy]);
        assert_eq!(replicas(&grants), [vec![3], vec![9]]);
        assert_eq!(grants[0].contenders[0].member, "b");
        // Shares are in whole replicas: 7 GPUs of 14 hold one 4-GPU replica, and the rest goes
        // to the other member; a cut member names only those served before it.
        let four = member("four", 0, &[(1, 4, 4)]);
        let ones = member("ones", 0, &[(1, 14, 1)]);
        let grants = arbitrate(14, &[four, ones]);
        assert_eq!(replicas(&grants), [vec![1], vec![10]]);
        assert_eq!(grants[0].contenders[0].member, "ones");
        assert!(grants[1].contenders.is_empty(), "{:?}", grants[1].contenders);
    }

    #[test]
    fn a_member_whose_request_grows_while_it_waits_keeps_its_share() {
        // Two small requests and a large one (a graph whose backlog grew while it was cut):
        // whole requests alone, smallest first, would fill the small ones and leave it 4 of 24.
        let small = |name: &str| member(name, 0, &[(1, 10, 1)]);
        let large = member("large", 0, &[(1, 40, 1)]);
        let grants = arbitrate(24, &[small("a"), small("b"), large]);
        assert_eq!(replicas(&grants), [vec![8], vec![8], vec![8]]);
    }

    #[test]
    fn an_aggregated_member_asks_for_its_one_pool_counted_once() {
        // One pool of 4-GPU aggregated workers (floor 1, wants 4) beside a disaggregated graph
        // of 2-GPU engines (floor 1 + 1, wants 3 + 3).
        let aggregated = Request {
            pools: graph_request_pools(true, (1, 1), (4, 3), (4, 4)),
            ..member("ns/agg", 0, &[])
        };
        assert_eq!(
            aggregated.pools,
            [PoolAsk {
                floor: 1,
                want: 4,
                gpus: 4
            }]
        );
        assert_eq!((aggregated.floor_gpus(), aggregated.asked_gpus()), (4, 16));
        let disaggregated = Request {
            pools: graph_request_pools(false, (1, 1), (3, 3), (2, 2)),
            ..member("ns/disagg", 0, &[])
        };
        assert_eq!((disaggregated.floor_gpus(), disaggregated.asked_gpus()), (4, 12));
        // 24 GPUs: both floors (8), then the smaller request whole (the disaggregated graph's 8
        // more), then what is left to the aggregated pool, in whole 4-GPU replicas.
        let grants = arbitrate(24, &[aggregated, disaggregated]);
        assert_eq!(replicas(&grants), [vec![3], vec![3, 3]]);
        assert_eq!(grants.iter().map(|g| g.gpus).sum::<u64>(), 24);
        assert_eq!(
            (grants[0].reason, grants[0].gpus, grants[0].asked_gpus),
            (GrantReason::Cut, 12, 16)
        );
        // Back to both pools: the one pool is both.
        assert_eq!(graph_replicas(true, &grants[0].replicas, (1, 1)), (3, 3));
        assert_eq!(graph_replicas(false, &grants[1].replicas, (1, 1)), (3, 3));
        assert_eq!(graph_replicas(true, &[], (1, 2)), (2, 2));
        assert_eq!(graph_replicas(false, &[5], (1, 2)), (5, 2));
    }

    #[test]
    fn pools_of_one_member_grow_together() {
        let grants = arbitrate(10, &[member("a", 0, &[(1, 8, 1), (1, 4, 1)])]);
        // Relative shortfalls are evened out (a tie goes to the first pool).
        assert_eq!(replicas(&grants), [vec![7, 3]]);
        let grants = arbitrate(6, &[member("a", 0, &[(1, 8, 1), (1, 4, 1)])]);
        assert_eq!(replicas(&grants), [vec![4, 2]]);
    }

    #[test]
    fn a_floor_that_does_not_fit_is_unfunded_and_a_smaller_one_may_still_fit() {
        let requests = [
            member("a", 5, &[(2, 2, 4), (2, 2, 4)]), // 16-GPU floor
            member("b", 1, &[(1, 1, 8), (1, 1, 8)]), // 16-GPU floor
            member("c", 0, &[(1, 3, 1)]),            // 1-GPU floor
        ];
        let grants = arbitrate(20, &requests);
        assert_eq!(grants[0].reason, GrantReason::Full);
        assert_eq!(grants[1].reason, GrantReason::FloorUnfunded);
        assert_eq!(grants[1].replicas, [0, 0]);
        // c's floor fits after a's, and it takes what is left.
        assert_eq!(
            (grants[2].replicas.clone(), grants[2].reason),
            (vec![3], GrantReason::Full)
        );
        assert_eq!(
            grants[1].explanation(20),
            "granted 0 GPUs, below its floor of 16: the budget's 20 GPUs hold the floors of a (priority 5, 16 GPUs) first"
        );
    }

    #[test]
    fn a_member_with_no_request_above_its_floor_leaves_the_rest_to_others() {
        let grants = arbitrate(
            16,
            &[
                member("idle", 9, &[(1, 0, 4), (1, 0, 4)]),
                member("busy", 0, &[(1, 9, 1)]),
            ],
        );
        assert_eq!(replicas(&grants), [vec![1, 1], vec![8]]);
        assert_eq!(grants[0].reason, GrantReason::Full);
    }

    #[test]
    fn risk_is_the_worst_latency_ratio_between_one_and_the_cap() {
        assert_eq!(sla_risk(Some(1000.0), 500.0, Some(10.0), 50.0), 2.0);
        assert_eq!(sla_risk(Some(100.0), 500.0, Some(75.0), 50.0), 1.5);
        assert_eq!(sla_risk(Some(100.0), 500.0, Some(10.0), 50.0), 1.0);
        assert_eq!(sla_risk(None, 500.0, None, 50.0), 1.0);
        assert_eq!(sla_risk(Some(f64::NAN), 500.0, Some(f64::INFINITY), 50.0), 1.0);
        assert_eq!(sla_risk(Some(1e9), 500.0, None, 50.0), MAX_RISK);
    }

    #[test]
    fn growth_waits_for_the_gpus_a_cut_member_still_holds() {
        // The burst is granted 24 GPUs that the steady graph holds 16 of until it shrinks.
        let requests = [
            member("steady", 0, &[(1, 2, 4), (1, 2, 4)]),
            member("burst", 10, &[(1, 6, 4), (1, 4, 4)]),
        ];
        let grants = arbitrate(32, &requests);
        let held = [vec![2, 2], vec![1, 1]];
        // Before the steady graph releases: it may drop to its grant; the burst may grow only
        // into the 8 free GPUs.
        let now = allowances(32, &requests, &grants, &held);
        assert_eq!(now, [vec![1, 1], vec![3, 1]]);
        let total = |h: &[Vec<u32>]| -> u32 { h.iter().flatten().map(|r| r * 4).sum() };
        assert!(total(&now) <= 32);
        // Once it has: the burst may take its whole grant.
        let later = allowances(32, &requests, &grants, &[vec![1, 1], vec![2, 2]]);
        assert_eq!(later, [vec![1, 1], vec![4, 2]]);
    }

    #[test]
    fn a_member_may_pay_for_its_own_growth_with_its_own_release() {
        let requests = [member("a", 0, &[(1, 1, 2), (1, 3, 2)])];
        let grants = arbitrate(8, &requests);
        assert_eq!(grants[0].replicas, [1, 3]);
        // It holds 3 prefill and 1 decode (8 GPUs, the whole budget): it swaps two replicas.
        assert_eq!(allowances(8, &requests, &grants, &[vec![3, 1]]), [vec![1, 3]]);
    }

    #[test]
    fn nothing_grows_while_the_budget_is_overcommitted() {
        let requests = [member("a", 0, &[(1, 4, 1)]), member("b", 0, &[(1, 4, 1)])];
        let grants = arbitrate(4, &requests);
        assert_eq!(replicas(&grants), [vec![2], vec![2]]);
        // 5 held in a budget of 4: a releases 3 (to its grant); b, granted 2 and holding none,
        // cannot grow into them before they are released.
        assert_eq!(
            allowances(4, &requests, &grants, &[vec![5], vec![0]]),
            [vec![2], vec![0]]
        );
        // Once a has released them, b grows.
        assert_eq!(
            allowances(4, &requests, &grants, &[vec![2], vec![0]]),
            [vec![2], vec![2]]
        );
    }

    fn requests_strategy() -> impl Strategy<Value = Vec<Request>> {
        let pool = (0u32..3, 0u32..12, 1u32..9).prop_map(|(floor, want, gpus)| PoolAsk { floor, want, gpus });
        let request = (
            -2i32..3,
            prop_oneof![Just(1.0), 0.5f64..4.0],
            prop_oneof![Just(1.0), 1.0f64..10.0],
            prop::collection::vec(pool, 1..3),
        );
        prop::collection::vec(request, 1..6).prop_map(|members| {
            members
                .into_iter()
                .enumerate()
                .map(|(i, (priority, weight, risk, pools))| Request {
                    member: format!("ns/m{i}"),
                    priority,
                    weight,
                    risk,
                    pools,
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn grants_never_exceed_the_total_or_what_was_asked(requests in requests_strategy(), total in 0u64..120) {
            let grants = arbitrate(total, &requests);
            let granted: u64 = grants.iter().map(|g| g.gpus).sum();
            prop_assert!(granted <= total, "{} GPUs granted of {}", granted, total);
            for (g, r) in grants.iter().zip(&requests) {
                for (replicas, pool) in g.replicas.iter().zip(&r.pools) {
                    prop_assert!(*replicas <= pool.want.max(pool.floor));
                }
            }
        }

        #[test]
        fn no_member_is_below_its_floor_when_the_floors_fit(requests in requests_strategy(), total in 0u64..120) {
            let floors: u64 = requests.iter().map(Request::floor_gpus).sum();
            prop_assume!(floors <= total);
            for (g, r) in arbitrate(total, &requests).iter().zip(&requests) {
                prop_assert_ne!(g.reason, GrantReason::FloorUnfunded);
                for (replicas, pool) in g.replicas.iter().zip(&r.pools) {
                    prop_assert!(*replicas >= pool.floor);
                }
            }
        }

        #[test]
        fn nothing_asked_for_is_left_over_if_it_fits(requests in requests_strategy(), total in 0u64..120) {
            let grants = arbitrate(total, &requests);
            let left = total - grants.iter().map(|g| g.gpus).sum::<u64>();
            for (g, r) in grants.iter().zip(&requests) {
                if g.reason == GrantReason::FloorUnfunded {
                    prop_assert!(r.floor_gpus() > left, "{}'s floor of {} fits in {} left", r.member, r.floor_gpus(), left);
                    continue;
                }
                for (replicas, pool) in g.replicas.iter().zip(&r.pools) {
                    if *replicas < pool.want.max(pool.floor) {
                        prop_assert!(u64::from(pool.gpus) > left, "{} waits for a {}-GPU replica with {} left", r.member, pool.gpus, left);
                    }
                }
            }
        }

        #[test]
        fn what_one_member_gives_back_goes_to_the_others_in_the_same_round(
            requests in requests_strategy(),
            total in 0u64..120,
            who in 0usize..6,
        ) {
            let who = who % requests.len();
            let before = arbitrate(total, &requests);
            let mut fewer = requests.clone();
            for pool in &mut fewer[who].pools {
                pool.want = pool.floor;
            }
            let after = arbitrate(total, &fewer);
            let freed = before[who].gpus - after[who].gpus;
            let others = |grants: &[Grant]| -> u64 {
                grants.iter().enumerate().filter(|(i, _)| *i != who).map(|(_, g)| g.gpus).sum()
            };
            let unmet_before: u64 = before.iter().zip(&requests).enumerate()
                .filter(|(i, _)| *i != who)
                .map(|(_, (g, r))| r.asked_gpus().saturating_sub(g.gpus))
                .sum();
            // The others take what was given back, as far as they asked for it and it fits.
            prop_assert!(others(&after) >= others(&before));
            if freed > 0 && unmet_before > 0 {
                let left_before = total - before.iter().map(|g| g.gpus).sum::<u64>();
                let smallest_unmet = requests.iter().enumerate()
                    .filter(|(i, _)| *i != who)
                    .flat_map(|(i, r)| r.pools.iter().zip(&before[i].replicas)
                        .filter(|(p, g)| **g < p.want.max(p.floor))
                        .map(|(p, _)| u64::from(p.gpus.max(1))))
                    .min();
                if let Some(g) = smallest_unmet && before.iter().all(|b| b.reason != GrantReason::FloorUnfunded)
                    && g <= freed + left_before {
                    prop_assert!(others(&after) > others(&before), "{} GPUs freed, a {}-GPU replica unmet", freed, g);
                }
            }
        }

        #[test]
        fn higher_priorities_are_served_first(requests in requests_strategy(), total in 0u64..120) {
            let floors: u64 = requests.iter().map(Request::floor_gpus).sum();
            prop_assume!(floors <= total);
            let grants = arbitrate(total, &requests);
            for (h, hr) in grants.iter().zip(&requests) {
                let unmet = hr.pools.iter().zip(&h.replicas)
                    .filter(|(p, g)| **g < p.want.max(p.floor))
                    .map(|(p, _)| u64::from(p.gpus.max(1)))
                    .min();
                let Some(unmet) = unmet else { continue };
                // What lower priorities got above their floors would not have bought the
                // replica the higher one still waits for.
                let lower: u64 = grants.iter().zip(&requests)
                    .filter(|(_, r)| r.priority < hr.priority)
                    .map(|(g, r)| g.gpus - r.floor_gpus())
                    .sum();
                prop_assert!(lower < unmet, "{} GPUs above floors went to lower priorities while {} waits for {}", lower, hr.member, unmet);
            }
        }

        #[test]
        fn a_round_does_not_depend_on_the_order_of_requests(requests in requests_strategy(), total in 0u64..120, seed in 0usize..720) {
            let grants = arbitrate(total, &requests);
            let mut shuffled: Vec<Request> = requests.clone();
            // A deterministic permutation from the seed.
            let n = shuffled.len();
            for i in 0..n {
                shuffled.swap(i, (seed / (i + 1)) % n);
            }
            let again = arbitrate(total, &shuffled);
            for g in &grants {
                let other = again.iter().find(|a| a.member == g.member).unwrap();
                prop_assert_eq!(g, other);
            }
        }

        #[test]
        fn allowances_keep_what_is_held_within_the_total(
            requests in requests_strategy(),
            total in 0u64..120,
            held_seed in prop::collection::vec(prop::collection::vec(0u32..10, 2), 6),
        ) {
            let grants = arbitrate(total, &requests);
            let held: Vec<Vec<u32>> = requests.iter().enumerate()
                .map(|(i, r)| held_seed[i].iter().take(r.pools.len()).copied().collect())
                .collect();
            let gpus = |h: &[Vec<u32>]| -> u64 {
                h.iter().zip(&requests).map(|(h, r)| r.gpus_of(h)).sum()
            };
            let now = allowances(total, &requests, &grants, &held);
            // Never above the grant; never more than was held or the total, whichever is more.
            for (i, a) in now.iter().enumerate() {
                for (p, r) in a.iter().enumerate() {
                    prop_assert!(*r <= grants[i].replicas[p]);
                }
            }
            // Members act one after another: every intermediate state stays within the bound.
            let bound = total.max(gpus(&held));
            let mut state = held.clone();
            for i in rank(&requests) {
                state[i] = now[i].clone();
                prop_assert!(gpus(&state) <= bound, "{} GPUs held of {}", gpus(&state), bound);
            }
            // Once everyone has released, the grants themselves fit.
            let released: Vec<Vec<u32>> = held.iter().zip(&grants)
                .map(|(h, g)| h.iter().zip(&g.replicas).map(|(h, g)| (*h).min(*g)).collect())
                .collect();
            prop_assert_eq!(allowances(total, &requests, &grants, &released), replicas(&grants));
        }
    }
}
