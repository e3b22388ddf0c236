//! The generated CRDs against a real API server: they install (with Grove's own
//! ClusterTopologyBinding CRD, which the tests install beside them), and the server's own schema validation and CEL rules
//! agree with the offline schema tests (`operator/tests/crd_schema.rs`) on every sample and every
//! bad fixture; the sample ClusterTopologyBinding is valid on Grove's own CRD.

use std::time::Duration;

// The offline validator of the schema tests, to compare its messages with the server's.
#[path = "../../../operator/tests/support/mod.rs"]
mod offline;

use e2e::{
    Result, apply_crds, describe, expectation, in_namespace, in_namespace_exclusive, install_crds, load_yaml,
    repo_root, yaml_files,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api,
    api::{Patch, PatchParams},
    runtime::wait::conditions,
};
use planner_api::{PlannerPolicy, StabilizationKeeps};
use planner_operator::validation::validate_spec;
use serde_json::json;

/// Under the shared lock (hence a namespace of its own): it re-applies the shared CRDs, which must
/// not happen while a test that replaces them (with NVIDIA's or an earlier Grove's) runs.
#[tokio::test]
async fn crds_install_and_become_established() -> Result<()> {
    in_namespace("crds", |ns| async move {
        let client = ns.client.clone();
        let names = install_crds(&client).await?;
        let mut expected = vec![
            // Grove's own (../shared/upstream/grove/), not this project's.
            "clustertopologybindings.grove.io",
            "dynamographdeployments.nvidia.com",
            "gpubudgets.planner.dynamo.io",
            "plannerpolicies.planner.dynamo.io",
        ];
        expected.sort_unstable();
        let mut installed: Vec<&str> = names.iter().map(String::as_str).collect();
        installed.sort_unstable();
        assert_eq!(installed, expected);

        // Established, and the names were accepted (no conflict with another CRD).
        let api: Api<CustomResourceDefinition> = Api::all(client);
        for name in &names {
            let crd = e2e::wait_for(
                &api,
                name,
                conditions::is_crd_established(),
                Duration::from_secs(10),
            )
            .await?
            .expect("CRD exists");
            let status = crd.status.expect("CRD has a status");
            let condition = |kind: &str| {
                status
                    .conditions
                    .iter()
                    .flatten()
                    .find(|c| c.type_ == kind)
                    .map(|c| c.status.clone())
            };
            assert_eq!(condition("Established").as_deref(), Some("True"), "{name}");
            assert_eq!(condition("NamesAccepted").as_deref(), Some("True"), "{name}");
        }
        Ok(())
    })
    .await
}

#[tokio::test]
async fn every_sample_is_accepted_by_the_api_server() -> Result<()> {
    in_namespace("samples", |ns| async move {
        install_crds(&ns.client).await?;
        let samples = yaml_files(&repo_root().join("config/samples"))?;
        assert!(
            samples.len() >= 6,
            "expected the samples of every kind and mode, found {samples:?}"
        );
        for path in samples {
            for object in load_yaml(&path)? {
                let created = ns
                    .accepts(&object)
                    .await
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                eprintln!("accepted {} ({})", describe(&object), path.display());
                assert_eq!(
                    created.metadata.name.as_deref(),
                    object["metadata"]["name"].as_str()
                );
            }
        }
        Ok(())
    })
    .await
}

#[tokio::test]
async fn every_bad_fixture_is_rejected_with_its_message() -> Result<()> {
    in_namespace("bad-fixtures", |ns| async move {
        install_crds(&ns.client).await?;
        let fixtures = yaml_files(&repo_root().join("operator/tests/fixtures/invalid"))?;
        assert!(
            fixtures.len() >= 10,
            "expected at least ten bad fixtures, found {}",
            fixtures.len()
        );
        let mut failures = Vec::new();
        for path in &fixtures {
            let file = path.file_name().unwrap_or_default().to_string_lossy().to_string();
            let expected = expectation(path)?;
            let [object] = load_yaml(path)?.try_into().expect("one object per fixture");
            match ns.rejects(&object, &expected.reason).await {
                Err(e) => failures.push(format!("{file}: {e}")),
                Ok(status) => {
                    // The message names the field, and the rejection has one cause, at that
                    // field: each fixture proves one rule, as in the offline schema test. The
                    // server adds a note without a field ("some validation rules were not
                    // checked ...") when an enum, type or required error kept it from evaluating
                    // the CEL rules; that note is not a second violation.
                    let causes: Vec<_> = status
                        .details
                        .as_ref()
                        .map(|d| d.causes.clone())
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|c| !c.message.contains("some validation rules were not checked"))
                        .collect();
                    if !status.message.contains(&expected.field) {
                        failures.push(format!(
                            "{file}: message does not name {:?}: {}",
                            expected.field, status.message
                        ));
                    } else if causes.len() > 1 {
                        failures.push(format!(
                            "{file}: {} causes, expected one: {}",
                            causes.len(),
                            status.message
                        ));
                    } else if let Some(cause) = causes.first().filter(|c| c.field != expected.field) {
                        failures.push(format!(
                            "{file}: the cause is at {:?}, expected {:?}: {}",
                            cause.field, expected.field, status.message
                        ));
                    } else {
                        eprintln!("{file}: {}", status.message);
                    }
                }
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} fixtures:\n{}",
            failures.len(),
            fixtures.len(),
            failures.join("\n")
        );
        Ok(())
    })
    .await
}

#[tokio::test]
async fn offline_schema_emulation_phrases_errors_as_the_api_server() -> Result<()> {
    // operator/tests/crd_schema.rs checks the bad fixtures without a cluster, through an
    // emulation that claims to phrase errors as the API server does; hold it to that.
    in_namespace("emulation", |ns| async move {
        install_crds(&ns.client).await?;
        let mut failures = Vec::new();
        for path in yaml_files(&repo_root().join("operator/tests/fixtures/invalid"))? {
            let file = path.file_name().unwrap_or_default().to_string_lossy().to_string();
            let [object] = load_yaml(&path)?.try_into().expect("one object per fixture");
            let [offline] = offline::validate(&object)
                .try_into()
                .expect("one offline error per fixture");
            let status = ns.rejects(&object, "").await?;
            let causes: Vec<_> = status
                .details
                .map(|d| d.causes)
                .unwrap_or_default()
                .into_iter()
                .filter(|c| !c.message.contains("some validation rules were not checked"))
                .collect();
            let agrees = match causes.as_slice() {
                [cause] => cause.field == offline.field && cause.message == offline.message,
                // A strict-decoding error (unknown field) fails the whole request, without causes.
                [] => status.message.contains(&offline.message),
                _ => false,
            };
            if !agrees {
                failures.push(format!(
                    "{file}:\n  offline: {offline}\n  server:  {}",
                    status.message
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        Ok(())
    })
    .await
}

/// A minimal `mode: sla` policy, applied with no webhook, reads back with the blocks its mode
/// uses and none it does not: the schema gives no default to the `load`, `correction`,
/// `connector` and `metrics` blocks, Kalman's and Prophet's settings or upstream's prefill
/// utilisation, so the API server writes none of them.
#[tokio::test]
async fn a_minimal_policy_reads_back_without_the_blocks_its_mode_does_not_use() -> Result<()> {
    in_namespace("minimal-policy", |ns| async move {
        install_crds(&ns.client).await?;
        let minimal = json!({
            "apiVersion": "planner.dynamo.io/v1alpha1",
            "kind": "PlannerPolicy",
            "metadata": {"name": "minimal"},
            "spec": {
                "targetRef": {"name": "llama"},
                "profile": {"builtin": "h200-llama3.1-8b-tp1"},
            },
        });
        let stored = ns.accepts(&minimal).await?;
        let spec = &stored.data["spec"];
        let unused: Vec<&str> = ["load", "correction", "connector", "metrics"]
            .into_iter()
            .filter(|block| spec.get(*block).is_some())
            .collect();
        assert!(
            unused.is_empty(),
            "written though sla mode never reads them: {unused:?} in {spec:#}"
        );
        assert!(
            spec["predictor"].get("kalman").is_none() && spec["predictor"].get("prophet").is_none(),
            "{spec:#}"
        );
        assert!(spec["sla"].get("prefillUtilization").is_none(), "{spec:#}");
        // What sla mode uses is there, with its defaults.
        assert_eq!(spec["sla"]["ttftMs"].as_f64(), Some(500.0), "{spec:#}");
        assert_eq!(spec["predictor"]["type"], json!("arima"), "{spec:#}");
        assert_eq!(spec["bounds"]["minReplicas"], json!(1), "{spec:#}");
        assert_eq!(
            spec["behavior"]["scaleDownStabilizationKeeps"],
            json!("quantile"),
            "{spec:#}"
        );
        // A block written by the user gets its fields' defaults.
        let mut load = minimal.clone();
        load["metadata"]["name"] = json!("load");
        load["spec"] = json!({"targetRef": {"name": "llama"}, "mode": "load", "load": {}});
        let stored = ns.accepts(&load).await?;
        assert_eq!(
            stored.data["spec"]["load"]["decodeKvScaleUpThreshold"],
            json!(0.9)
        );
        assert_eq!(stored.data["spec"]["load"]["metricPullingInterval"], json!("1s"));
        // And the limits are the schema's as well as the webhook's.
        let mut two_days = minimal.clone();
        two_days["metadata"]["name"] = json!("two-days");
        two_days["spec"]["adjustmentInterval"] = json!("48h");
        ns.rejects(&two_days, "spec.adjustmentInterval must be 10s to 24h")
            .await?;
        Ok(())
    })
    .await
}

/// A policy stored by the previous version of the CRD (every block defaulted into it, and a
/// 48h interval that schema allowed) still loads once today's CRD replaces it: it reads back
/// into today's types with its values, and the reconciler's rules (the webhook's) say what is
/// wrong with it rather than failing to read it.
#[tokio::test]
async fn a_policy_stored_by_the_previous_crd_still_loads() -> Result<()> {
    in_namespace_exclusive("previous-crd", |ns| async move {
        let previous =
            repo_root().join("e2e/tests/fixtures/previous-crds/plannerpolicies.planner.dynamo.io.yaml");
        let outcome = async {
            apply_crds(&ns.client, &[previous]).await?;
            let old = json!({
                "apiVersion": "planner.dynamo.io/v1alpha1",
                "kind": "PlannerPolicy",
                "metadata": {"name": "old"},
                "spec": {
                    "targetRef": {"name": "llama"},
                    "adjustmentInterval": "48h",
                    "profile": {"builtin": "h200-llama3.1-8b-tp1"},
                    "bounds": {"minReplicas": 2, "maxReplicas": 6},
                },
            });
            let stored = ns.accepts(&old).await?;
            if stored.data["spec"].get("load").is_none() || stored.data["spec"].get("correction").is_none() {
                return Err(format!(
                    "the previous CRD no longer defaults every block: {:#}",
                    stored.data
                )
                .into());
            }
            install_crds(&ns.client).await?;
            let policies: Api<PlannerPolicy> = ns.api();
            let policy = policies.get("old").await?;
            let spec = &policy.spec;
            assert_eq!(spec.adjustment_interval, "48h");
            assert_eq!(spec.bounds.prefill_range(), (2, Some(6)));
            assert_eq!(spec.bounds.decode_range(), (2, Some(6)));
            assert_eq!(spec.load.decode_kv_scale_up_threshold, 0.9);
            assert!(spec.correction.enabled);
            assert_eq!(
                spec.behavior.scale_down_stabilization_keeps,
                StabilizationKeeps::Quantile
            );
            let errors: Vec<String> = validate_spec(spec).iter().map(ToString::to_string).collect();
            assert_eq!(
                errors,
                ["spec.adjustmentInterval: \"48h\" is out of range for mode sla; allowed: 10s to 24h"]
            );
            // Its labels can still be changed: the unchanged interval is not checked again.
            let patch = json!({"metadata": {"labels": {"touched": "yes"}}});
            policies
                .patch("old", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| {
                    format!("a metadata change to an object stored under the previous CRD was refused: {e}")
                })?;
            Ok(())
        }
        .await;
        // Today's CRDs for the tests that follow, whatever happened.
        let restored = install_crds(&ns.client).await.map(|_| ());
        outcome.and(restored)
    })
    .await
}
