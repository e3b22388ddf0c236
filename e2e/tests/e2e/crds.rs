//! The generated CRDs against a real API server: they install (with Grove's own
//! ClusterTopologyBinding CRD, which the tests install beside them), and the server's own schema validation and CEL rules
//! agree with the offline schema tests (`operator/tests/crd_schema.rs`) on every sample and every
//! bad fixture; the sample ClusterTopologyBinding is valid on Grove's own CRD.

use std::time::Duration;

// The offline validator of the schema tests, to compare its messages with the server's.
#[path = "../../../operator/tests/support/mod.rs"]
mod offline;

use e2e::{Result, describe, expectation, in_namespace, install_crds, load_yaml, repo_root, yaml_files};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, runtime::wait::conditions};

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
