//! The `TopologyResolved` condition of a DGD with a usable topology: where its worker pods are,
//! per domain of the configured level.

use std::collections::{BTreeMap, BTreeSet};

use super::ResolvedTopology;
#[cfg(test)]
use planner_api::MismatchPolicy;
use planner_api::{ComponentType, Enforcement};

/// What the report needs of one worker pod (the caller filters out terminating pods).
#[derive(Debug, Clone, Copy)]
pub struct WorkerPod<'a> {
    /// `prefill`, `decode` or `worker`.
    pub kind: ComponentType,
    /// Whether `spec.nodeName` is set.
    pub scheduled: bool,
    /// The pod's labels.
    pub labels: &'a BTreeMap<String, String>,
}

/// The condition, before timestamps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyReport {
    /// `True` when every scheduled worker pod has its topology labels.
    pub resolved: bool,
    /// CamelCase reason: `Resolved` or `LabelsPending`.
    pub reason: &'static str,
    /// Per-domain counts and what is pending.
    pub message: String,
}

/// Summarises the worker pods of a DGD: counts per domain of the level (and per pool), pods
/// still missing labels, pods not scheduled yet, and domains whose prefill workers have no
/// decode worker to transfer to.
pub fn report(topology: &ResolvedTopology, pods: &[WorkerPod<'_>]) -> TopologyReport {
    let level_label = topology
        .level_label()
        .map(|l| l.pod_label.as_str())
        .unwrap_or_default();
    let mut per_domain: BTreeMap<&str, BTreeMap<&'static str, usize>> = BTreeMap::new();
    let mut unscheduled = 0;
    let mut unlabelled = 0;
    let mut missing: BTreeSet<&str> = BTreeSet::new();
    let mut scheduled = 0;
    for pod in pods {
        if !pod.scheduled {
            unscheduled += 1;
            continue;
        }
        scheduled += 1;
        let absent: Vec<&str> = topology
            .labels
            .iter()
            .filter(|l| pod.labels.get(&l.pod_label).is_none_or(String::is_empty))
            .map(|l| l.pod_label.as_str())
            .collect();
        if !absent.is_empty() {
            unlabelled += 1;
            missing.extend(absent);
            continue;
        }
        if let Some(domain) = pod.labels.get(level_label) {
            *per_domain
                .entry(domain.as_str())
                .or_default()
                .entry(pod.kind.as_str())
                .or_default() += 1;
        }
    }

    let counts = if per_domain.is_empty() {
        format!("no labelled worker pods per {} yet", topology.level)
    } else {
        let domains: Vec<String> = per_domain
            .iter()
            .map(|(domain, kinds)| {
                let total: usize = kinds.values().sum();
                let pools: Vec<String> = ["prefill", "decode", "worker"]
                    .iter()
                    .filter_map(|k| kinds.get(k).map(|n| format!("{k} {n}")))
                    .collect();
                format!("{domain} {total} ({})", pools.join(", "))
            })
            .collect();
        format!("worker pods per {}: {}", topology.level, domains.join(", "))
    };
    let mut notes = Vec::new();
    if unscheduled > 0 {
        notes.push(format!("{unscheduled} worker pods not scheduled yet"));
    }
    if topology.enforcement == Enforcement::Required {
        let stranded: Vec<&str> = per_domain
            .iter()
            .filter(|(_, kinds)| kinds.contains_key("prefill") && !kinds.contains_key("decode"))
            .map(|(domain, _)| *domain)
            .collect();
        if !stranded.is_empty() {
            let (strict, lenient) = if topology.frontend.is_some() {
                ("mismatchPolicy fail", "mismatchPolicy fallback")
            } else {
                ("enforcement required", "enforcement preferred")
            };
            notes.push(format!(
                "{} {} prefill but no decode workers, so requests prefilled there fail ({strict}); add decode capacity there or use {lenient}",
                stranded.join(", "),
                if stranded.len() == 1 { "has" } else { "have" }
            ));
        }
    }
    let suffix = if notes.is_empty() {
        String::new()
    } else {
        format!("; {}", notes.join("; "))
    };
    if unlabelled > 0 {
        let node_labels: Vec<&str> = topology
            .labels
            .iter()
            .filter(|l| missing.contains(l.pod_label.as_str()))
            .map(|l| l.node_label.as_str())
            .collect();
        TopologyReport {
            resolved: false,
            reason: "LabelsPending",
            message: format!(
                "{unlabelled} of {scheduled} scheduled worker pods lack topology labels ({}); their nodes need the labels {} (see TopologyLabelMissing events on the pods); {counts}{suffix}",
                missing.into_iter().collect::<Vec<_>>().join(", "),
                node_labels.join(", ")
            ),
        }
    } else {
        TopologyReport {
            resolved: true,
            reason: "Resolved",
            message: format!("{}; {counts}{suffix}", topology.describe()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{LabelSource, TopologyLabel};

    fn topology(policy: MismatchPolicy) -> ResolvedTopology {
        ResolvedTopology {
            frontend: Some("frontend".into()),
            level: "zone".into(),
            enforcement: policy.into(),
            weight: None,
            source: LabelSource::ClusterTopology("gpu".into()),
            labels: vec![
                TopologyLabel {
                    domain: "zone".into(),
                    pod_label: "nvidia.com/dynamo-topology.zone".into(),
                    node_label: "topology.kubernetes.io/zone".into(),
                },
                TopologyLabel {
                    domain: "rack".into(),
                    pod_label: "nvidia.com/dynamo-topology.rack".into(),
                    node_label: "nvidia.com/rack".into(),
                },
            ],
            contract: crate::topology::EnvContract::Planner,
        }
    }

    fn labels(zone: Option<&str>, rack: Option<&str>) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::new();
        if let Some(zone) = zone {
            labels.insert("nvidia.com/dynamo-topology.zone".into(), zone.into());
        }
        if let Some(rack) = rack {
            labels.insert("nvidia.com/dynamo-topology.rack".into(), rack.into());
        }
        labels
    }

    #[test]
    fn counts_per_domain_and_pool() {
        let (a1, a2, b1, b2) = (
            labels(Some("zone-a"), Some("a1")),
            labels(Some("zone-a"), Some("a2")),
            labels(Some("zone-b"), Some("b1")),
            labels(Some("zone-b"), Some("b1")),
        );
        let pods = [
            WorkerPod {
                kind: ComponentType::Prefill,
                scheduled: true,
                labels: &a1,
            },
            WorkerPod {
                kind: ComponentType::Decode,
                scheduled: true,
                labels: &a2,
            },
            WorkerPod {
                kind: ComponentType::Prefill,
                scheduled: true,
                labels: &b1,
            },
            WorkerPod {
                kind: ComponentType::Decode,
                scheduled: true,
                labels: &b2,
            },
        ];
        let report = report(&topology(MismatchPolicy::Fail), &pods);
        assert_eq!(
            report,
            TopologyReport {
                resolved: true,
                reason: "Resolved",
                message: "level zone of ClusterTopology gpu (levels zone, rack); worker pods per zone: zone-a 2 (prefill 1, decode 1), zone-b 2 (prefill 1, decode 1)".into(),
            }
        );
    }

    #[test]
    fn pending_labels_unscheduled_pods_and_stranded_prefill() {
        let (a, b, none) = (
            labels(Some("zone-a"), Some("a1")),
            labels(Some("zone-b"), None),
            BTreeMap::new(),
        );
        let pods = [
            WorkerPod {
                kind: ComponentType::Prefill,
                scheduled: true,
                labels: &a,
            },
            WorkerPod {
                kind: ComponentType::Decode,
                scheduled: true,
                labels: &b,
            },
            WorkerPod {
                kind: ComponentType::Decode,
                scheduled: false,
                labels: &none,
            },
        ];
        let report = report(&topology(MismatchPolicy::Fail), &pods);
        assert!(!report.resolved);
        assert_eq!(report.reason, "LabelsPending");
        assert_eq!(
            report.message,
            "1 of 2 scheduled worker pods lack topology labels (nvidia.com/dynamo-topology.rack); their nodes need the labels nvidia.com/rack (see TopologyLabelMissing events on the pods); worker pods per zone: zone-a 1 (prefill 1); 1 worker pods not scheduled yet; zone-a has prefill but no decode workers, so requests prefilled there fail (mismatchPolicy fail); add decode capacity there or use mismatchPolicy fallback"
        );
    }

    #[test]
    fn no_pods_yet_and_fallback_does_not_warn() {
        let report_empty = report(&topology(MismatchPolicy::Fallback), &[]);
        assert!(report_empty.resolved);
        assert!(
            report_empty
                .message
                .ends_with("no labelled worker pods per zone yet"),
            "{}",
            report_empty.message
        );
        let a = labels(Some("zone-a"), Some("a1"));
        let pods = [WorkerPod {
            kind: ComponentType::Prefill,
            scheduled: true,
            labels: &a,
        }];
        assert!(
            !report(&topology(MismatchPolicy::Fallback), &pods)
                .message
                .contains("no decode")
        );
    }
}
