//! DGD status from its Deployments (pure).

use std::collections::BTreeMap;

use k8s_openapi::{api::apps::v1::Deployment, jiff::Timestamp};

use crate::controller::conditions::{self, DesiredCondition};
use planner_api::labels::{LABEL_COMPONENT, workload_name};
use planner_api::{ComponentReplicaStatus, DynamoGraphDeploymentStatus};

/// The `Ready` condition type.
pub const READY: &str = "Ready";
/// The `TopologyResolved` condition type: whether `kvCacheTransferTopology` is usable, and where
/// the worker pods are. Absent on DGDs without the field.
pub const TOPOLOGY_RESOLVED: &str = "TopologyResolved";

/// Computes the status a DGD should have, from the Deployments it owns.
///
/// `Ready` is true when every component's Deployment has seen its latest spec and has the
/// desired replicas available.
pub fn compute(
    name: &str,
    generation: Option<i64>,
    components: &[(String, i32)],
    deployments: &[&Deployment],
    existing: Option<&DynamoGraphDeploymentStatus>,
    extra_conditions: &[DesiredCondition],
    now: Timestamp,
) -> DynamoGraphDeploymentStatus {
    let mut statuses = BTreeMap::new();
    let mut not_ready = Vec::new();
    for (component, desired) in components {
        let workload = workload_name(name, component);
        let deployment = deployments.iter().find(|d| {
            d.metadata.name.as_deref() == Some(workload.as_str())
                && d.metadata.labels.as_ref().and_then(|l| l.get(LABEL_COMPONENT)) == Some(component)
        });
        let status = deployment.and_then(|d| d.status.as_ref());
        let counts = ComponentReplicaStatus {
            replicas: status.and_then(|s| s.replicas).unwrap_or(0),
            ready_replicas: status.and_then(|s| s.ready_replicas).unwrap_or(0),
            available_replicas: status.and_then(|s| s.available_replicas).unwrap_or(0),
            updated_replicas: status.and_then(|s| s.updated_replicas).unwrap_or(0),
            other: existing
                .and_then(|s| s.components.get(component))
                .map(|c| c.other.clone())
                .unwrap_or_default(),
        };
        let observed_latest = deployment.is_some_and(|d| {
            d.status.as_ref().and_then(|s| s.observed_generation) >= d.metadata.generation
                && d.metadata.generation.is_some()
        });
        if deployment.is_none() {
            not_ready.push(format!("{component}: workload not created yet"));
        } else if !observed_latest
            || counts.available_replicas < *desired
            || counts.updated_replicas < *desired
        {
            not_ready.push(format!(
                "{component}: {}/{desired} available",
                counts.available_replicas
            ));
        }
        statuses.insert(component.clone(), counts);
    }
    let ready = if not_ready.is_empty() {
        DesiredCondition::met(
            READY,
            "AllComponentsAvailable",
            "every component has its desired replicas available",
        )
    } else {
        DesiredCondition::unmet(
            READY,
            "ComponentsNotAvailable",
            format!("waiting for {}", not_ready.join("; ")),
        )
    };
    let mut desired_conditions = vec![ready];
    desired_conditions.extend(extra_conditions.iter().cloned());
    let existing_conditions = existing.map(|s| s.conditions.as_slice()).unwrap_or_default();
    DynamoGraphDeploymentStatus {
        observed_generation: generation,
        conditions: conditions::merge(existing_conditions, &desired_conditions, generation, now),
        components: statuses,
        other: existing.map(|s| s.other.clone()).unwrap_or_default(),
    }
}

/// The status of a DGD whose spec cannot be rendered.
pub fn invalid(
    generation: Option<i64>,
    existing: Option<&DynamoGraphDeploymentStatus>,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> DynamoGraphDeploymentStatus {
    let mut status = existing.cloned().unwrap_or_default();
    status.observed_generation = generation;
    status.conditions = conditions::merge(
        &status.conditions,
        &[DesiredCondition::unmet(READY, reason, message)],
        generation,
        now,
    );
    status
}

/// Whether the status says `Ready=True`.
pub fn is_ready(status: &DynamoGraphDeploymentStatus) -> bool {
    conditions::find(&status.conditions, READY).is_some_and(|c| c.status == "True")
}

/// Whether writing `new` would change what `old` says (transition times aside).
pub fn differs(old: Option<&DynamoGraphDeploymentStatus>, new: &DynamoGraphDeploymentStatus) -> bool {
    match old {
        None => true,
        Some(old) => {
            old.observed_generation != new.observed_generation
                || old.components != new.components
                || !conditions::same(&old.conditions, &new.conditions)
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{api::apps::v1::DeploymentStatus, apimachinery::pkg::apis::meta::v1::ObjectMeta};

    use super::*;

    fn deployment(
        component: &str,
        generation: i64,
        observed: i64,
        available: i32,
        updated: i32,
    ) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some(workload_name("g", component)),
                generation: Some(generation),
                labels: Some(BTreeMap::from([(
                    LABEL_COMPONENT.to_string(),
                    component.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(DeploymentStatus {
                observed_generation: Some(observed),
                replicas: Some(available),
                ready_replicas: Some(available),
                available_replicas: Some(available),
                updated_replicas: Some(updated),
                ..DeploymentStatus::default()
            }),
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    #[test]
    fn ready_when_every_component_is_available() {
        let components = [("prefill".to_string(), 2), ("decode".to_string(), 1)];
        let (p, d) = (
            deployment("prefill", 1, 1, 2, 2),
            deployment("decode", 3, 3, 1, 1),
        );
        let status = compute("g", Some(4), &components, &[&p, &d], None, &[], now());
        let ready = conditions::find(&status.conditions, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "AllComponentsAvailable")
        );
        assert_eq!(status.components["prefill"].available_replicas, 2);
        assert_eq!(status.observed_generation, Some(4));
    }

    #[test]
    fn not_ready_names_what_it_waits_for() {
        let components = [
            ("prefill".to_string(), 3),
            ("decode".to_string(), 1),
            ("frontend".to_string(), 1),
        ];
        let (p, d) = (
            deployment("prefill", 1, 1, 1, 3),
            deployment("decode", 2, 1, 1, 1),
        );
        let status = compute("g", Some(1), &components, &[&p, &d], None, &[], now());
        let ready = conditions::find(&status.conditions, READY).unwrap();
        assert_eq!(ready.status, "False");
        assert_eq!(
            ready.message,
            "waiting for prefill: 1/3 available; decode: 1/1 available; frontend: workload not created yet"
        );
        assert_eq!(status.components["frontend"].replicas, 0);
    }

    #[test]
    fn unchanged_status_is_not_rewritten() {
        let components = [("decode".to_string(), 1)];
        let d = deployment("decode", 1, 1, 1, 1);
        let first = compute("g", Some(1), &components, &[&d], None, &[], now());
        let later = Timestamp::from_second(1_800_000_600).unwrap();
        let second = compute("g", Some(1), &components, &[&d], Some(&first), &[], later);
        assert!(!differs(Some(&first), &second));
        assert_eq!(first.conditions, second.conditions, "transition time kept");
        let scaled = deployment("decode", 2, 2, 1, 1);
        let third = compute(
            "g",
            Some(2),
            &[("decode".to_string(), 2)],
            &[&scaled],
            Some(&second),
            &[],
            later,
        );
        assert!(differs(Some(&second), &third));
    }

    #[test]
    fn invalid_spec_sets_ready_false_with_the_reason() {
        let status = invalid(Some(3), None, "InvalidSpec", "spec.components[0]: bad", now());
        let ready = conditions::find(&status.conditions, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSpec")
        );
        assert_eq!(status.observed_generation, Some(3));
    }
}
