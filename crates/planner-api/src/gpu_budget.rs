//! `GpuBudget` (`planner.dynamo.io/v1alpha1`, cluster-scoped): GPUs that several PlannerPolicies
//! share. Every interval the operator grants each member replicas so that, together, they stay
//! within `spec.totalGpus`: every member's floor first, then by priority: each member up to its
//! share of the GPUs (by weight), then whole requests, the smallest (per weight) first, then by
//! SLA risk.
//!
//! Cluster-scoped, and only the members it lists may join: GPUs are a cluster's, the graphs that
//! share them are usually different teams' namespaces, and creating a cluster-scoped object takes
//! the cluster admin's permission, so a tenant can neither join another team's budget uninvited
//! nor give itself a higher priority (priorities and weights are set here, not in the policy).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::schema;

/// GPUs shared by the PlannerPolicies it admits.
// clippy reads the repeated `type_ = ...` of separate printer columns as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "planner.dynamo.io",
    version = "v1alpha1",
    kind = "GpuBudget",
    plural = "gpubudgets",
    singular = "gpubudget",
    shortname = "gpub",
    category = "dynamo",
    status = "GpuBudgetStatus",
    derive = "PartialEq",
    doc = "GPUs shared by the PlannerPolicies it admits, granted every interval: floors first, then by priority each member up to its share (by weight), then whole requests, the smallest (per weight) first, then by SLA risk.",
    printcolumn(
        name = "Total",
        type_ = "integer",
        json_path = ".spec.totalGpus",
        description = "GPUs the members share"
    ),
    printcolumn(
        name = "Asked",
        type_ = "integer",
        json_path = ".status.askedGpus",
        description = "GPUs the members ask for"
    ),
    printcolumn(
        name = "Granted",
        type_ = "integer",
        json_path = ".status.grantedGpus",
        description = "GPUs granted to the members"
    ),
    printcolumn(
        name = "Held",
        type_ = "integer",
        json_path = ".status.heldGpus",
        description = "GPUs the members' pools ask for now"
    ),
    printcolumn(
        name = "Members",
        type_ = "integer",
        json_path = ".status.memberCount",
        description = "PlannerPolicies planning in the budget"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct GpuBudgetSpec {
    /// GPUs the members' prefill and decode pools may ask for together (GPUs per replica from
    /// each pool's `nvidia.com/gpu` limit, as for `spec.bounds.maxGpuBudget`).
    #[schemars(range(min = 1, max = 1_000_000))]
    pub total_gpus: i64,

    /// Which PlannerPolicies may join (with `spec.budgetRef`), and their priority and weight,
    /// one entry per namespace and policy. A policy takes the most specific entry that names it:
    /// its namespace and name, then `*` and its name, then its namespace, then `*`. A policy no
    /// entry names cannot join.
    #[schemars(length(min = 1, max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["namespace", "policy"]))]
    pub members: Vec<BudgetMember>,
}

/// Who may join a budget, and how it is served.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BudgetMember {
    /// Namespace of the PlannerPolicies this entry admits, or `*` for every namespace.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$")
    )]
    pub namespace: String,

    /// One PlannerPolicy of that namespace, or `*` (the default) for every PlannerPolicy of it.
    #[serde(default = "every_policy")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)$")
    )]
    pub policy: String,

    /// Members of a higher priority are granted what they ask for first, once every member has
    /// its floor. 0 to 1000.
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000))]
    pub priority: i32,

    /// Among members of the same priority, each is first granted what it asks for up to its
    /// share of their GPUs, in proportion to its weight; the rest is granted in whole requests,
    /// the smallest first: a member's GPUs still to grant are divided by its weight (then the
    /// higher SLA risk, how far a member misses its latency targets, goes first). 1 to 100.
    #[serde(default = "default_weight")]
    #[schemars(range(min = 1, max = 100))]
    pub weight: i32,
}

fn default_weight() -> i32 {
    1
}

/// `*`: every policy (of a namespace) or every namespace.
pub const EVERY: &str = "*";

fn every_policy() -> String {
    EVERY.into()
}

impl BudgetMember {
    /// Whether this entry names the policy `name` in `namespace`, and how specifically: 2 for
    /// its namespace and name, 1 for its namespace, 0 for `*`.
    pub fn matches(&self, namespace: &str, name: &str) -> Option<u8> {
        let namespace_match = if self.namespace == namespace {
            1
        } else if self.namespace == EVERY {
            0
        } else {
            return None;
        };
        if self.policy == EVERY {
            Some(namespace_match)
        } else if self.policy == name {
            Some(namespace_match + 2)
        } else {
            None
        }
    }
}

impl GpuBudgetSpec {
    /// The entry that admits the policy `name` in `namespace`: the most specific one.
    pub fn member(&self, namespace: &str, name: &str) -> Option<&BudgetMember> {
        self.members
            .iter()
            .filter_map(|m| m.matches(namespace, name).map(|rank| (rank, m)))
            .max_by_key(|(rank, _)| *rank)
            .map(|(_, m)| m)
    }
}

/// What the operator last granted, per member and in total.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuBudgetStatus {
    /// `metadata.generation` of the spec this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `FloorsFunded` (every member's floor fits the total) and `WithinTotal` (the GPUs the
    /// members ask for now fit it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
    /// PlannerPolicies planning in the budget.
    #[serde(default)]
    pub member_count: i32,
    /// GPUs of the members' floors.
    #[serde(default)]
    pub floor_gpus: i64,
    /// GPUs the members ask for (what meets their SLAs, never below their floors).
    #[serde(default)]
    pub asked_gpus: i64,
    /// GPUs granted.
    #[serde(default)]
    pub granted_gpus: i64,
    /// GPUs the members' pools ask for now (their replicas as last set).
    #[serde(default)]
    pub held_gpus: i64,
    /// Each member's request and grant, in order of priority, then namespace and name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<BudgetMemberStatus>,
}

/// One member's request and grant.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BudgetMemberStatus {
    /// The PlannerPolicy's namespace.
    pub namespace: String,
    /// The PlannerPolicy's name.
    pub name: String,
    /// Its priority (from its `spec.members` entry).
    pub priority: i32,
    /// Its weight (from its `spec.members` entry).
    pub weight: i32,
    /// GPUs of its floor (minimum replicas).
    pub floor_gpus: i64,
    /// GPUs it asks for.
    pub asked_gpus: i64,
    /// GPUs granted.
    pub granted_gpus: i64,
    /// GPUs its pools ask for now.
    pub held_gpus: i64,
    /// `Full`, `Cut` (its floor and part of the rest) or `FloorUnfunded`.
    pub reason: String,
    /// Why, naming the members served before it.
    pub message: String,
}

/// A PlannerPolicy's reference to the GpuBudget it joins.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BudgetRef {
    /// Name of the GpuBudget (cluster-scoped).
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"))]
    pub name: String,
}

/// What the shared budget granted a PlannerPolicy at its last decision.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BudgetGrant {
    /// The GpuBudget.
    pub name: String,
    /// GPUs of its floor.
    pub floor_gpus: i64,
    /// GPUs it asked for (what meets its SLA, never below its floor).
    pub asked_gpus: i64,
    /// GPUs granted.
    pub granted_gpus: i64,
    /// `Full`, `Cut` or `FloorUnfunded`.
    pub reason: String,
    /// Why, naming the members served before it.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(namespace: &str, policy: Option<&str>, priority: i32) -> BudgetMember {
        BudgetMember {
            namespace: namespace.into(),
            policy: policy.unwrap_or(EVERY).into(),
            priority,
            weight: 1,
        }
    }

    #[test]
    fn the_most_specific_entry_admits_a_policy() {
        let spec = GpuBudgetSpec {
            total_gpus: 64,
            members: vec![
                member("*", None, 0),
                member("team-a", None, 5),
                member("team-a", Some("llama"), 9),
            ],
        };
        assert_eq!(spec.member("team-a", "llama").map(|m| m.priority), Some(9));
        assert_eq!(spec.member("team-a", "qwen").map(|m| m.priority), Some(5));
        assert_eq!(spec.member("team-b", "qwen").map(|m| m.priority), Some(0));
        let only_a = GpuBudgetSpec {
            total_gpus: 64,
            members: vec![member("team-a", Some("llama"), 1)],
        };
        assert_eq!(only_a.member("team-a", "qwen"), None);
        assert_eq!(only_a.member("team-b", "llama"), None);
    }
}
