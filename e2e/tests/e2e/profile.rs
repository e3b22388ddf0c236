//! Bringing a profile: Dynamo's profiler output (`selected_{prefill,decode}_interpolation/
//! raw_data.npz`, written by Dynamo 1.6.1's own profiler code) is read by
//! `planner-operator profile check` as written, turned into a ConfigMap by `profile configmap`,
//! applied to the API server, and, named by the observe sample's PlannerPolicy, loaded by the
//! operator (`ProfileLoaded=True`); a ConfigMap with a truncated NPZ is refused with the message
//! `profile check` prints for it.

use std::{process::Command, sync::Mutex, time::Duration};

use e2e::{
    FIELD_MANAGER, Result, dynamo_runtime, in_namespace, install_crds, load_yaml, operator_binary,
    poll_until, repo_root,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use planner_api::{DynamoGraphDeployment, PlannerPolicy};
use serde_json::json;

use crate::{closed_loop::tempfile_dir, operator::start};

const WAIT: Duration = Duration::from_secs(90);

/// Writes a profile into `sys.argv[1]` with Dynamo 1.6.1's profiler code, the functions that
/// turn its measurements into `selected_{prefill,decode}_interpolation/raw_data.npz`, fed with
/// measurements of a 2-GPU engine with a 200,000-token KV cache instead of AIPerf runs. Only the
/// plots are left out (matplotlib is not in the environment).
const DYNAMO_PROFILER: &str = r#"
import os, sys, types
plot = types.ModuleType("dynamo.profiler.utils.plot")
plot.plot_prefill_interpolation = lambda *args, **kwargs: None
plot.plot_decode_3d_surface = lambda *args, **kwargs: None
sys.modules["dynamo.profiler.utils.plot"] = plot
from dynamo.profiler.utils.profile_decode import _profile_decode_helper
from dynamo.profiler.utils.profile_prefill import _profile_prefill_helper

out = sys.argv[1]
for pool in ("prefill", "decode"):
    os.makedirs(f"{out}/selected_{pool}_interpolation", exist_ok=True)
# num_gpus 2, max_context_length 8192, granularity 16; TTFT in ms.
_profile_prefill_helper(f"{out}/selected_prefill_interpolation", 2, 8192, 16, lambda isl: 10 + 0.02 * isl)
# num_gpus 2, max_kv_tokens 200000, max_context_length 8192, granularity 6, attention DP 1;
# (ITL ms, throughput per GPU) at isl, osl and n requests.
_profile_decode_helper(
    f"{out}/selected_decode_interpolation", 2, 200000, 8192, 6,
    lambda isl, osl, n: (5 + 0.1 * n + isl / 1000, 50.0 * n), 1,
)
"#;

/// Runs the `planner-operator` binary; its exit code, standard output and standard error.
fn planner_operator(args: &[&str]) -> Result<(Option<i32>, String, String)> {
    let output = Command::new(operator_binary()).args(args).output().map_err(|e| {
        format!(
            "cannot run {} (`make e2e` builds it): {e}",
            operator_binary().display()
        )
    })?;
    Ok((
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// The `ProfileLoaded` condition of a policy once it has one: (status, reason, message).
async fn profile_loaded(policies: &Api<PlannerPolicy>, name: &str) -> Result<(String, String, String)> {
    let found = Mutex::new(None);
    poll_until(&format!("{name} to report ProfileLoaded"), WAIT, || async {
        let policy = policies.get(name).await?;
        let condition = policy
            .status
            .iter()
            .flat_map(|status| &status.conditions)
            .find(|c| c.type_ == "ProfileLoaded")
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
        let seen = condition.is_some();
        if let Ok(mut found) = found.lock() {
            *found = condition;
        }
        Ok(seen)
    })
    .await?;
    found
        .into_inner()
        .ok()
        .flatten()
        .ok_or_else(|| "no ProfileLoaded condition".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_configmap_from_dynamos_profiler_output_is_loaded() -> Result<()> {
    in_namespace("profile-configmap", |ns| async move {
        install_crds(&ns.client).await?;
        // Dynamo's profiler output, written by its own code.
        let output = tempfile_dir(&ns.name)?;
        let dir = output.to_string_lossy().into_owned();
        let written = Command::new(dynamo_runtime::python()?)
            .args(["-c", DYNAMO_PROFILER, &dir])
            .output()?;
        if !written.status.success() {
            return Err(format!(
                "Dynamo's profiler code failed: {}",
                String::from_utf8_lossy(&written.stderr)
            )
            .into());
        }
        // `check` reads it as written: Dynamo's KV capacity, and prefill throughputs per GPU of
        // its 2-GPU engine.
        let (code, report, stderr) = planner_operator(&["profile", "check", &dir, "--output", "json"])?;
        if code != Some(0) {
            return Err(format!("profile check exited with {code:?}: {stderr}").into());
        }
        let report: serde_json::Value = serde_json::from_str(&report)?;
        if report["decode"]["max_kv_tokens"] != json!(200000.0)
            || report["prefill_gpus_implied"] != json!(2.0)
            || report["prefill"]["samples"].as_u64() < Some(4)
        {
            return Err(format!("profile check read Dynamo's files as {report}").into());
        }
        let (code, yaml, stderr) = planner_operator(&[
            "profile",
            "configmap",
            &dir,
            "--name",
            "llama-profile",
            "--namespace",
            &ns.name,
        ])?;
        if code != Some(0) {
            return Err(format!("profile configmap exited with {code:?}: {stderr}").into());
        }
        // Applied as `kubectl apply --server-side -f -` would.
        let config_map: ConfigMap = serde_yaml::from_str(&yaml)?;
        let config_maps: Api<ConfigMap> = ns.api();
        config_maps
            .patch(
                "llama-profile",
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(&config_map),
            )
            .await?;

        // A truncated NPZ in a ConfigMap of its own: refused, with `profile check`'s message.
        let mut broken = config_map.clone();
        broken.metadata.name = Some("broken-profile".into());
        if let Some(decode) = broken
            .binary_data
            .as_mut()
            .and_then(|data| data.get_mut("decode_raw_data.npz"))
        {
            let half = decode.0.len() / 2;
            decode.0.truncate(half);
        }
        config_maps.create(&PostParams::default(), &broken).await?;

        // The observe sample names ConfigMap llama-profile and the sample DGD llama-disagg.
        let [dgd] = load_yaml(&repo_root().join("config/samples/dgd-disagg.yaml"))?
            .try_into()
            .map_err(|_| "one DGD in the sample")?;
        let dgds: Api<DynamoGraphDeployment> = ns.api();
        dgds.create(&PostParams::default(), &serde_json::from_value(dgd)?)
            .await?;
        let [mut policy] = load_yaml(&repo_root().join("config/samples/plannerpolicy-observe.yaml"))?
            .try_into()
            .map_err(|_| "one PlannerPolicy in the sample")?;
        let policies: Api<PlannerPolicy> = ns.api();
        policies
            .create(&PostParams::default(), &serde_json::from_value(policy.clone())?)
            .await?;
        policy["metadata"]["name"] = json!("llama-broken");
        policy["spec"]["profile"]["configMapRef"]["name"] = json!("broken-profile");
        policies
            .create(&PostParams::default(), &serde_json::from_value(policy)?)
            .await?;

        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let outcome = async {
            let (status, reason, message) = profile_loaded(&policies, "llama-observe").await?;
            if (status.as_str(), reason.as_str(), message.as_str())
                != ("True", "Loaded", "profile ConfigMap llama-profile")
            {
                return Err(format!("llama-observe: ProfileLoaded {status} {reason}: {message}").into());
            }

            let (status, reason, message) = profile_loaded(&policies, "llama-broken").await?;
            let manifest = output.join("broken.yaml");
            std::fs::write(&manifest, serde_yaml::to_string(&broken)?)?;
            let (code, _, stderr) =
                planner_operator(&["profile", "check", &manifest.to_string_lossy()])?;
            let expected = "ConfigMap broken-profile/decode_raw_data.npz is not valid NPZ";
            if status != "False"
                || reason != "ProfileInvalid"
                || !message.contains(expected)
                || code != Some(2)
                || !stderr.contains(&message)
            {
                return Err(format!(
                    "llama-broken: ProfileLoaded {status} {reason}: {message:?}; profile check exited {code:?}: {stderr:?}"
                )
                .into());
            }
            operator.check_running()
        }
        .await;
        let stopped = operator.stop().await;
        let _ = std::fs::remove_dir_all(&output);
        outcome.and(stopped)
    })
    .await
}
