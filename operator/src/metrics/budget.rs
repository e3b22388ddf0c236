//! Per-GpuBudget metrics: the budget's totals, labelled by budget, and each member's grant,
//! labelled by budget, namespace and policy. Their number is bounded by the budgets and their
//! members; a member that left and a deleted budget lose their series.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Mutex,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

/// Labels of a budget.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BudgetLabels {
    /// Name of the GpuBudget (cluster-scoped).
    pub budget: String,
}

/// Labels of a budget's member.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabels {
    /// Name of the GpuBudget.
    pub budget: String,
    /// Namespace of the member PlannerPolicy.
    pub namespace: String,
    /// Name of the member PlannerPolicy.
    pub policy: String,
}

/// A member's GPUs, as the budget's status shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberGpus {
    /// Namespace of the policy.
    pub namespace: String,
    /// Name of the policy.
    pub policy: String,
    /// GPUs it asked for.
    pub asked: i64,
    /// GPUs granted.
    pub granted: i64,
    /// GPUs it holds.
    pub held: i64,
}

/// A budget's GPUs, as its status shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BudgetGpus {
    /// `spec.totalGpus`.
    pub total: i64,
    /// The members' floors.
    pub floor: i64,
    /// What the members asked for.
    pub asked: i64,
    /// What they were granted.
    pub granted: i64,
    /// What they hold.
    pub held: i64,
    /// Each member.
    pub members: Vec<MemberGpus>,
}

const TOTALS: [(&str, &str); 6] = [
    (
        "gpubudget_total_gpus",
        "GPUs the GpuBudget shares (spec.totalGpus)",
    ),
    ("gpubudget_floor_gpus", "GPUs of the members' floors"),
    ("gpubudget_asked_gpus", "GPUs the members asked for"),
    ("gpubudget_granted_gpus", "GPUs granted to the members"),
    ("gpubudget_held_gpus", "GPUs the members hold"),
    ("gpubudget_members", "Members of the GpuBudget"),
];

const MEMBER: [(&str, &str); 3] = [
    (
        "gpubudget_member_asked_gpus",
        "GPUs a member of the GpuBudget asked for",
    ),
    (
        "gpubudget_member_granted_gpus",
        "GPUs granted to a member of the GpuBudget",
    ),
    (
        "gpubudget_member_held_gpus",
        "GPUs a member of the GpuBudget holds",
    ),
];

/// The per-budget families.
#[derive(Debug)]
pub struct BudgetMetrics {
    totals: [Family<BudgetLabels, Gauge>; 6],
    member: [Family<MemberLabels, Gauge>; 3],
    /// The members each budget has series for, so that those gone are removed.
    known: Mutex<BTreeMap<String, BTreeSet<(String, String)>>>,
}

impl BudgetMetrics {
    /// Registers the families (the registry carries the `planner_operator` prefix).
    pub fn register(registry: &mut Registry) -> Self {
        let totals: [Family<BudgetLabels, Gauge>; 6] = Default::default();
        for (family, (name, help)) in totals.iter().zip(TOTALS) {
            registry.register(name, help, family.clone());
        }
        let member: [Family<MemberLabels, Gauge>; 3] = Default::default();
        for (family, (name, help)) in member.iter().zip(MEMBER) {
            registry.register(name, help, family.clone());
        }
        Self {
            totals,
            member,
            known: Mutex::default(),
        }
    }

    /// Records a budget's status; members no longer in it lose their series.
    pub fn record(&self, budget: &str, gpus: &BudgetGpus) {
        let labels = BudgetLabels {
            budget: budget.into(),
        };
        let count = i64::try_from(gpus.members.len()).unwrap_or(i64::MAX);
        for (family, value) in
            self.totals
                .iter()
                .zip([gpus.total, gpus.floor, gpus.asked, gpus.granted, gpus.held, count])
        {
            family.get_or_create(&labels).set(value);
        }
        let now: BTreeSet<(String, String)> = gpus
            .members
            .iter()
            .map(|m| (m.namespace.clone(), m.policy.clone()))
            .collect();
        for m in &gpus.members {
            let labels = member_labels(budget, &m.namespace, &m.policy);
            for (family, value) in self.member.iter().zip([m.asked, m.granted, m.held]) {
                family.get_or_create(&labels).set(value);
            }
        }
        let gone = match self.known.lock() {
            Ok(mut known) => {
                let before = known.insert(budget.to_string(), now.clone()).unwrap_or_default();
                before.difference(&now).cloned().collect::<Vec<_>>()
            }
            Err(_) => Vec::new(),
        };
        for (namespace, policy) in gone {
            self.remove_member(budget, &namespace, &policy);
        }
    }

    /// Removes the series of every budget not in `live`.
    pub fn retain(&self, live: &BTreeSet<String>) {
        let gone: Vec<(String, BTreeSet<(String, String)>)> = match self.known.lock() {
            Ok(mut known) => {
                let names: Vec<String> = known.keys().filter(|b| !live.contains(*b)).cloned().collect();
                names
                    .into_iter()
                    .filter_map(|name| known.remove(&name).map(|members| (name, members)))
                    .collect()
            }
            Err(_) => Vec::new(),
        };
        for (budget, members) in gone {
            let labels = BudgetLabels {
                budget: budget.clone(),
            };
            for family in &self.totals {
                family.remove(&labels);
            }
            for (namespace, policy) in members {
                self.remove_member(&budget, &namespace, &policy);
            }
        }
    }

    /// Removes every budget's series (a replica that stopped leading).
    pub fn clear(&self) {
        self.retain(&BTreeSet::new());
    }

    fn remove_member(&self, budget: &str, namespace: &str, policy: &str) {
        let labels = member_labels(budget, namespace, policy);
        for family in &self.member {
            family.remove(&labels);
        }
    }
}

fn member_labels(budget: &str, namespace: &str, policy: &str) -> MemberLabels {
    MemberLabels {
        budget: budget.into(),
        namespace: namespace.into(),
        policy: policy.into(),
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    fn text(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text
    }

    fn member(namespace: &str, policy: &str, granted: i64) -> MemberGpus {
        MemberGpus {
            namespace: namespace.into(),
            policy: policy.into(),
            asked: granted + 2,
            granted,
            held: granted,
        }
    }

    #[test]
    fn totals_and_members_are_recorded_and_removed_when_gone() {
        let mut registry = Registry::with_prefix("planner_operator");
        let metrics = BudgetMetrics::register(&mut registry);
        metrics.record(
            "shared",
            &BudgetGpus {
                total: 16,
                floor: 4,
                asked: 20,
                granted: 16,
                held: 14,
                members: vec![member("a", "chat", 10), member("b", "batch", 6)],
            },
        );
        let text = text(&registry);
        for expected in [
            "planner_operator_gpubudget_total_gpus{budget=\"shared\"} 16",
            "planner_operator_gpubudget_floor_gpus{budget=\"shared\"} 4",
            "planner_operator_gpubudget_asked_gpus{budget=\"shared\"} 20",
            "planner_operator_gpubudget_granted_gpus{budget=\"shared\"} 16",
            "planner_operator_gpubudget_held_gpus{budget=\"shared\"} 14",
            "planner_operator_gpubudget_members{budget=\"shared\"} 2",
            "planner_operator_gpubudget_member_granted_gpus{budget=\"shared\",namespace=\"a\",policy=\"chat\"} 10",
            "planner_operator_gpubudget_member_asked_gpus{budget=\"shared\",namespace=\"b\",policy=\"batch\"} 8",
            "planner_operator_gpubudget_member_held_gpus{budget=\"shared\",namespace=\"b\",policy=\"batch\"} 6",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
        // b/batch leaves.
        metrics.record(
            "shared",
            &BudgetGpus {
                total: 16,
                members: vec![member("a", "chat", 16)],
                ..BudgetGpus::default()
            },
        );
        let text = self::text(&registry);
        assert!(!text.contains("batch"), "{text}");
        assert!(text.contains("policy=\"chat\"} 16"), "{text}");
        // The budget is deleted.
        metrics.retain(&BTreeSet::new());
        let text = self::text(&registry);
        assert!(!text.contains("shared"), "{text}");
    }
}
