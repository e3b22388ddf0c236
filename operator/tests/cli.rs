//! The `planner-operator` commands: `crd` prints every CRD, ready for `kubectl apply`; `plan`
//! runs the golden cases; `profile` checks a profile and writes its ConfigMap.

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
            "gpubudgets.planner.dynamo.io",
            "dynamographdeployments.nvidia.com"
        ]
    );
}

fn plan(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_planner-operator"))
        .arg("plan")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn plan_command_prints_results_in_the_golden_format() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let cases = root.join("../crates/planner-core/tests/fixtures/golden/planner-h200-llama3.1-8b-tp1.json");
    let profile_dir = root.join("../config/profiles/h200-llama3.1-8b-tp1");
    for source in [
        ["--profile-dir", profile_dir.to_str().unwrap()],
        ["--profile", "h200-llama3.1-8b-tp1"],
    ] {
        let output = plan(&[source[0], source[1], "--cases", cases.to_str().unwrap()]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let results = doc["results"].as_array().unwrap();
        assert_eq!(results.len(), 60);
        let first = &results[0];
        assert_eq!(first["id"], "h200-llama3.1-8b-tp1-0000");
        assert_eq!(
            (
                first["prefill_replicas"].as_u64(),
                first["decode_replicas"].as_u64()
            ),
            (Some(2), Some(6))
        );
        for key in [
            "prefill_thpt_per_gpu",
            "decode_thpt_per_gpu",
            "prefill_replicas_unbudgeted",
            "decode_replicas_unbudgeted",
        ] {
            assert!(first.get(key).is_some(), "missing {key}");
        }
        // Corrections appear only where they were computed from observations.
        assert!(first.get("prefill_correction").is_none());
        assert!(results.iter().any(|r| r.get("prefill_correction").is_some()));
    }
}

#[test]
fn plan_command_names_the_bad_file_and_field_and_exits_2() {
    let dir = std::env::temp_dir().join(format!("plan-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = dir.join("cases.json");
    std::fs::write(&cases, r#"{"cases": [{"id": "a", "interval_s": "sixty"}]}"#).unwrap();
    let output = plan(&[
        "--profile",
        "h200-llama3.1-8b-tp1",
        "--cases",
        cases.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cases.json") && stderr.contains("cases[0].interval_s"),
        "{stderr}"
    );

    let profile_dir = dir.join("profile");
    std::fs::create_dir_all(&profile_dir).unwrap();
    std::fs::write(
        profile_dir.join("prefill_raw_data.json"),
        r#"{"prefill_isl": [1, 2, 3, 4], "prefill_ttft": [1, 2, 3]}"#,
    )
    .unwrap();
    std::fs::write(profile_dir.join("decode_raw_data.json"), "{}").unwrap();
    let output = plan(&[
        "--profile-dir",
        profile_dir.to_str().unwrap(),
        "--cases",
        cases.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("prefill_raw_data.json") && stderr.contains("prefill_thpt_per_gpu"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn profile(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_planner-operator"))
        .arg("profile")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn profile_check_accepts_dynamos_layout_and_names_a_truncated_npz() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    for pool in ["prefill", "decode"] {
        let relative = format!("selected_{pool}_interpolation/raw_data.npz");
        std::fs::create_dir_all(dir.path().join(format!("selected_{pool}_interpolation"))).unwrap();
        std::fs::copy(
            root.join("../config/profiles/h200-llama3.1-8b-tp1")
                .join(&relative),
            dir.path().join(&relative),
        )
        .unwrap();
    }
    let path = dir.path().to_str().unwrap();
    let output = profile(&["check", path, "--output", "json"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["decode"]["max_kv_tokens"], 945029.0);

    let output = profile(&["configmap", path, "--name", "llama-profile"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let config_map: k8s_openapi::api::core::v1::ConfigMap = serde_yaml::from_slice(&output.stdout).unwrap();
    assert_eq!(config_map.binary_data.unwrap().len(), 2);

    let npz = dir.path().join("selected_prefill_interpolation/raw_data.npz");
    let bytes = std::fs::read(&npz).unwrap();
    std::fs::write(&npz, &bytes[..100]).unwrap();
    for command in [vec!["check", path], vec!["configmap", path, "--name", "p"]] {
        let output = profile(&command);
        assert_eq!(output.status.code(), Some(2), "{command:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("{} is not valid NPZ", npz.display())),
            "{command:?}: {stderr}"
        );
        assert!(output.stdout.is_empty(), "{command:?}");
    }
}
