//! The `planner-operator crd` command prints every CRD, ready for `kubectl apply`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::Command;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Deserialize;

#[test]
fn crd_command_prints_every_crd() {
    let output = Command::new(env!("CARGO_BIN_EXE_planner-operator"))
        .arg("crd")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let names: Vec<String> = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            CustomResourceDefinition::deserialize(doc)
                .unwrap()
                .metadata
                .name
                .unwrap()
        })
        .collect();
    assert_eq!(
        names,
        [
            "plannerpolicies.planner.dynamo.io",
            "dynamographdeployments.nvidia.com",
            "clustertopologies.grove.io"
        ]
    );
}
