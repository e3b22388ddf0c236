//! The Helm chart, rendered without a cluster: `helm lint` and `helm template` for the default
//! values, each certificate mode and namespace-scoped mode (`charts/planner-operator/ci/*.yaml`,
//! plus a few `--set` variants); the rendered ClusterRole and Roles grant exactly the API calls
//! the code makes (`planner_operator::rbac::PERMISSIONS`), nothing more and nothing missing;
//! the Deployment's flags parse with the operator's own parser and agree with the Services, the
//! webhook configuration (compared with the operator's own) and the certificate objects; bad
//! values are rejected with messages that say what to fix; the optional PrometheusRule's alerts
//! pass their promtool unit tests (`e2e/tests/rules/`). Needs helm and promtool, not a cluster.

use std::collections::{BTreeMap, BTreeSet};

use e2e::{
    Result,
    chart::{chart_dir, helm, of_kind, one_of_kind, template},
    yaml_files,
};
use planner_operator::{
    rbac::{self, Features, Scope},
    runtime::RunArgs,
    webhook::configuration::{Target, validating_webhook_configuration_for},
};
use serde_json::{Value, json};

use crate::operator::parse_run_args;

const RELEASE: &str = "po";
const NAMESPACE: &str = "ops";

/// A way to install the chart: a name and the helm arguments that select it.
struct Mode {
    name: String,
    args: Vec<String>,
}

/// Every `ci/*.yaml` values file, and variants that only need `--set`.
fn modes() -> Result<Vec<Mode>> {
    let mut modes = Vec::new();
    for path in yaml_files(&chart_dir().join("ci"))? {
        modes.push(Mode {
            name: path
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default(),
            args: vec!["--values".into(), path.to_string_lossy().to_string()],
        });
    }
    let set = |name: &str, sets: &[&str]| Mode {
        name: name.into(),
        args: sets
            .iter()
            .flat_map(|s| ["--set".to_string(), s.to_string()])
            .collect(),
    };
    modes.push(set(
        "cluster-topology-elsewhere",
        &["clusterTopologyApiVersion=topology.example.com/v1beta2"],
    ));
    modes.push(set(
        "full-namespace-scoped-cert-manager",
        &[
            "dgdController.enabled=true",
            "watchNamespace=team-a",
            "webhook.certificate.mode=certManager",
        ],
    ));
    modes.push(set(
        "out-of-cluster-webhook",
        &[
            "webhook.url=https://127.0.0.1:9443",
            "webhook.extraHosts={127.0.0.1}",
        ],
    ));
    modes.push(set(
        "full-out-of-cluster-webhook",
        &[
            "dgdController.enabled=true",
            "webhook.url=https://127.0.0.1:9443",
            "webhook.extraHosts={127.0.0.1}",
        ],
    ));
    modes.push(set(
        "planner-only-namespace-scoped-cert-manager",
        &[
            "dgdController.enabled=false",
            "watchNamespace=team-a",
            "webhook.certificate.mode=certManager",
        ],
    ));
    modes.push(set(
        "dynamo-pod-monitors",
        &[
            "dynamoPodMonitors.enabled=true",
            "dynamoPodMonitors.labels.release=kube-prometheus",
        ],
    ));
    modes.push(set(
        "prometheus-rule",
        &[
            "prometheusRule.enabled=true",
            "prometheusRule.additionalLabels.release=kube-prometheus",
            "prometheusRule.alertLabels.team=inference",
        ],
    ));
    modes.push(set(
        "names-overridden",
        &[
            "fullnameOverride=dynamo-planner",
            "leaderElection.leaseName=planner-lock",
            "webhook.certificate.generated.secretName=planner-tls",
        ],
    ));
    Ok(modes)
}

async fn render(mode: &Mode) -> Result<Vec<Value>> {
    let args: Vec<&str> = mode.args.iter().map(String::as_str).collect();
    template(RELEASE, NAMESPACE, &args)
        .await
        .map_err(|e| format!("mode {}: {e}", mode.name).into())
}

fn deployment(objects: &[Value]) -> Result<&Value> {
    one_of_kind(objects, "Deployment")
}

fn container(deployment: &Value) -> Result<&Value> {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "operator"))
        .ok_or_else(|| "the Deployment has no container named operator".into())
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

/// The Deployment's `planner-operator run` flags, parsed by the operator's own parser.
fn run_args(objects: &[Value]) -> Result<RunArgs> {
    let args = strings(&container(deployment(objects)?)?["args"]);
    if args.first().map(String::as_str) != Some("run") {
        return Err(format!("the container's args do not start with `run`: {args:?}").into());
    }
    let argv = std::iter::once("planner-operator".to_string()).chain(args.into_iter().skip(1));
    parse_run_args(argv)
}

fn port_of(addr: &std::net::SocketAddr) -> i64 {
    i64::from(addr.port())
}

/// The container port a Service's `targetPort` (a name) points at.
fn container_port(container: &Value, target: &Value) -> Option<i64> {
    if let Some(number) = target.as_i64() {
        return Some(number);
    }
    container["ports"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == *target)
        .and_then(|p| p["containerPort"].as_i64())
}

/// One (group, resource, verb, resourceName) a rule grants.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Grant {
    group: String,
    resource: String,
    verb: String,
    name: Option<String>,
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{group} {} {}", self.resource, self.verb)?;
        if let Some(name) = &self.name {
            write!(f, " (only {name})")?;
        }
        Ok(())
    }
}

fn grants(rules: &Value) -> Result<BTreeSet<Grant>> {
    let mut grants = BTreeSet::new();
    for rule in rules.as_array().ok_or("rules is not a list")? {
        let names = strings(&rule["resourceNames"]);
        let names: Vec<Option<String>> = if names.is_empty() {
            vec![None]
        } else {
            names.into_iter().map(Some).collect()
        };
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    if verb == "*" || resource == "*" || group == "*" {
                        return Err(format!("wildcard in rule {rule}").into());
                    }
                    for name in &names {
                        grants.insert(Grant {
                            group: group.clone(),
                            resource: resource.clone(),
                            verb: verb.clone(),
                            name: name.clone(),
                        });
                    }
                }
            }
        }
    }
    Ok(grants)
}

/// What the table says an operator started with `args` needs, by where it is granted: the
/// ClusterRole, the Role in the watched namespace (namespace-scoped mode), the Role(s) in the
/// release namespace.
fn expected_grants(args: &RunArgs) -> Result<BTreeMap<String, BTreeSet<Grant>>> {
    let features = Features {
        dgd_controller: args.dgd_controller,
        leader_election: args.leader_election,
        webhook: !args.webhook_disabled,
        ca_bundle: !args.webhook_config_name.is_empty(),
        generated_certificates: args.webhook_cert_dir.is_none(),
        token_secrets: args.prometheus_token_secrets,
    };
    let own = args
        .webhook_namespace
        .clone()
        .or_else(|| args.lease_namespace.clone())
        .unwrap_or_else(|| NAMESPACE.into());
    let mut expected: BTreeMap<String, BTreeSet<Grant>> = BTreeMap::new();
    for permission in rbac::required(features) {
        let group = match permission.group_set_by {
            Some("--cluster-topology-api-version") => args.cluster_topology_api_version.group.clone(),
            Some(flag) => return Err(format!("the test does not know flag {flag}").into()),
            None => permission.group.to_string(),
        };
        let name = match permission.named_by {
            Some("--webhook-config-name") => Some(args.webhook_config_name.clone()),
            Some("--webhook-secret") => Some(args.webhook_secret.clone()),
            Some("--lease-name") => Some(args.lease_name.clone()),
            Some(flag) => return Err(format!("the test does not know flag {flag}").into()),
            None => None,
        };
        let place = match (permission.scope, &args.namespace) {
            (Scope::Cluster, _) | (Scope::Watched, None) => "ClusterRole".to_string(),
            (Scope::Watched, Some(watched)) => format!("Role in {watched}"),
            (Scope::OwnNamespace, _) => format!("Role in {own}"),
        };
        for verb in permission.verbs {
            expected.entry(place.clone()).or_default().insert(Grant {
                group: group.clone(),
                resource: permission.resource.to_string(),
                verb: verb.to_string(),
                name: name.clone(),
            });
        }
    }
    Ok(expected)
}

/// What the rendered ClusterRoles and Roles bound to the Deployment's ServiceAccount grant, by
/// the same places as [`expected_grants`]. Bindings to other subjects or to missing roles fail.
fn rendered_grants(objects: &[Value]) -> Result<BTreeMap<String, BTreeSet<Grant>>> {
    let deployment = deployment(objects)?;
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .ok_or("the Deployment names no ServiceAccount")?;
    let account_namespace = deployment["metadata"]["namespace"].as_str().unwrap_or(NAMESPACE);
    let mut rendered: BTreeMap<String, BTreeSet<Grant>> = BTreeMap::new();
    for (binding_kind, role_kind) in [("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")] {
        for binding in of_kind(objects, binding_kind) {
            let subjects = binding["subjects"]
                .as_array()
                .ok_or("a binding without subjects")?;
            let to_account = subjects.iter().all(|s| {
                s["kind"] == "ServiceAccount" && s["name"] == account && s["namespace"] == account_namespace
            });
            if !to_account || subjects.len() != 1 {
                return Err(format!(
                    "{binding_kind} {} binds {subjects:?}, not only ServiceAccount {account_namespace}/{account}",
                    binding["metadata"]["name"]
                )
                .into());
            }
            if binding["roleRef"]["kind"] != role_kind {
                return Err(format!("{binding_kind} refers to a {}", binding["roleRef"]["kind"]).into());
            }
            let namespace = binding["metadata"]["namespace"].as_str();
            let role = of_kind(objects, role_kind)
                .into_iter()
                .find(|r| {
                    r["metadata"]["name"] == binding["roleRef"]["name"]
                        && r["metadata"]["namespace"].as_str() == namespace
                })
                .ok_or_else(|| format!("{binding_kind} refers to a {role_kind} the chart does not render"))?;
            let place = match namespace {
                Some(namespace) => format!("Role in {namespace}"),
                None => "ClusterRole".to_string(),
            };
            rendered.entry(place).or_default().extend(grants(&role["rules"])?);
        }
    }
    let roles = of_kind(objects, "Role").len() + of_kind(objects, "ClusterRole").len();
    let bindings = of_kind(objects, "RoleBinding").len() + of_kind(objects, "ClusterRoleBinding").len();
    if roles != bindings {
        return Err(format!("{roles} roles but {bindings} bindings: a role is not bound").into());
    }
    Ok(rendered)
}

#[tokio::test]
async fn helm_lint_passes_for_every_mode() -> Result<()> {
    let chart = chart_dir().to_string_lossy().to_string();
    let mut failures = Vec::new();
    for mode in modes()? {
        let mut args = vec!["lint", chart.as_str(), "--strict", "--namespace", NAMESPACE];
        args.extend(mode.args.iter().map(String::as_str));
        if let Err(e) = helm(&args).await {
            failures.push(format!("{}: {e}", mode.name));
        }
    }
    assert!(failures.is_empty(), "helm lint failed:\n{}", failures.join("\n"));
    Ok(())
}

/// `helm install --dry-run=client` renders the manifests and NOTES.txt (which `helm template`
/// leaves out) without a cluster: the notes say what to apply next, and no value is missing.
#[tokio::test]
async fn notes_say_what_to_apply_next_in_every_mode() -> Result<()> {
    let chart = chart_dir().to_string_lossy().to_string();
    let mut failures = Vec::new();
    for mode in modes()? {
        let mut args = vec![
            "install",
            RELEASE,
            chart.as_str(),
            "--namespace",
            NAMESPACE,
            "--dry-run=client",
        ];
        args.extend(mode.args.iter().map(String::as_str));
        let output = helm(&args).await?;
        let notes = output
            .split_once("\nNOTES:\n")
            .map(|(_, notes)| notes)
            .unwrap_or_default();
        if output.contains("<no value>") {
            failures.push(format!("{}: a template printed <no value>", mode.name));
        }
        for wanted in ["rollout status", "kubectl apply", "kubectl get ppol"] {
            if !notes.contains(wanted) {
                failures.push(format!(
                    "{}: NOTES.txt does not say {wanted:?}:\n{notes}",
                    mode.name
                ));
            }
        }
        // A packaged chart's user has no checkout: nothing may point into the repository.
        for unwanted in ["config/samples", "config/crd", "llama-sla"] {
            if notes.contains(unwanted) {
                failures.push(format!(
                    "{}: NOTES.txt points at {unwanted:?}, which a packaged chart's user lacks:\n{notes}",
                    mode.name
                ));
            }
        }
        // The PlannerPolicy it shows is one the CRD's schema takes, with the fields a first
        // policy needs.
        if let Err(e) = notes_policy_is_valid(notes) {
            failures.push(format!("{}: {e}:\n{notes}", mode.name));
        }
        // Which mode it is in: planner only, or the full operator.
        let mode_line = if output.contains("--dgd-controller=false") {
            "Mode: planner only"
        } else {
            "Mode: full operator"
        };
        if !notes.contains(mode_line) {
            failures.push(format!(
                "{}: NOTES.txt does not say {mode_line:?}:\n{notes}",
                mode.name
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// The PlannerPolicy NOTES.txt shows (from its `apiVersion:` line to the next blank line):
/// every field it sets is one the PlannerPolicy type has (so a misspelt field fails), the
/// admission checks pass, and it carries what a first policy needs: a target, a percentile TTFT
/// target, a profile and the expected scale-up delay.
fn notes_policy_is_valid(notes: &str) -> Result<()> {
    let start = notes
        .find("apiVersion: planner.dynamo.io/")
        .ok_or("NOTES.txt shows no PlannerPolicy")?;
    let block = &notes[start..];
    let block = &block[..block.find("\n\n").unwrap_or(block.len())];
    // NOTES.txt indents it; the first line's indentation is cut by `find`.
    let indent = notes[..start].len() - notes[..start].trim_end_matches(' ').len();
    let text: String = block
        .lines()
        .enumerate()
        .map(|(i, line)| {
            if i == 0 {
                line
            } else {
                line.get(indent..).unwrap_or(line)
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let shown: Value =
        serde_yaml::from_str(&text).map_err(|e| format!("the policy is not YAML ({e}):\n{text}"))?;
    let policy: planner_api::PlannerPolicy =
        serde_yaml::from_str(&text).map_err(|e| format!("not a PlannerPolicy ({e})"))?;
    let typed = serde_json::to_value(&policy)?;
    let mut unknown = Vec::new();
    unknown_fields(&shown, &typed, String::new(), &mut unknown);
    check(unknown.is_empty(), || {
        format!("fields the PlannerPolicy type does not have: {unknown:?}")
    })?;
    let errors = planner_operator::validation::planner_policy::validate_spec(&policy.spec);
    check(errors.is_empty(), || {
        format!(
            "the webhook rejects it: {}",
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        )
    })?;
    let spec = &shown["spec"];
    for (field, value) in [
        ("targetRef.name", &spec["targetRef"]["name"]),
        ("sla.ttftMs", &spec["sla"]["ttftMs"]),
        ("sla.itlMs", &spec["sla"]["itlMs"]),
        ("sla.ttftPercentile", &spec["sla"]["ttftPercentile"]),
        ("profile.builtin", &spec["profile"]["builtin"]),
        (
            "behavior.expectedScaleUpDelay",
            &spec["behavior"]["expectedScaleUpDelay"],
        ),
    ] {
        check(!value.is_null(), || {
            format!("the policy does not set spec.{field}")
        })?;
    }
    check(policy.spec.sla.ttft_percentile == Some(90.0), || {
        "not a p90 TTFT target".into()
    })
}

/// Paths of `shown` (a YAML document) that `typed` (its typed round trip) lacks.
fn unknown_fields(shown: &Value, typed: &Value, path: String, out: &mut Vec<String>) {
    if let (Value::Object(shown), Value::Object(typed)) = (shown, typed) {
        for (key, value) in shown {
            let at = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            match typed.get(key) {
                Some(child) => unknown_fields(value, child, at, out),
                None => out.push(at),
            }
        }
    }
}

/// The CRDs Helm installs (`crds/` and the templates, `--include-crds`) are this project's only:
/// none in Grove's group, whose CRDs Grove installs (an invented `clustertopologies.grove.io`
/// would shadow a real Grove's, or be one Grove never had).
#[tokio::test]
async fn the_chart_installs_no_crd_in_groves_group() -> Result<()> {
    for mode in modes()? {
        let mut args: Vec<&str> = mode.args.iter().map(String::as_str).collect();
        args.extend(["--include-crds", "--set", "dgdCrd.install=true"]);
        let objects = template(RELEASE, NAMESPACE, &args).await?;
        let names: Vec<String> = of_kind(&objects, "CustomResourceDefinition")
            .iter()
            .map(|crd| crd["metadata"]["name"].as_str().unwrap_or_default().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "gpubudgets.planner.dynamo.io",
                "plannerpolicies.planner.dynamo.io",
                "dynamographdeployments.nvidia.com"
            ],
            "{}",
            mode.name
        );
    }
    Ok(())
}

/// Planner only is the default: `--dgd-controller=false`, no DGD CRD, the PlannerPolicy webhook
/// alone. The DGD CRD is installed only when asked (`dgdCrd.install`), kept on uninstall, and is
/// the generated one; the full operator (`dgdController.enabled=true`) passes
/// `--dgd-controller=true` and registers the DGD webhook too.
#[tokio::test]
async fn planner_only_is_the_default_and_the_dgd_crd_and_controller_are_there_only_when_asked() -> Result<()>
{
    use planner_operator::webhook::configuration::{DGD_WEBHOOK, PLANNER_POLICY_WEBHOOK};
    let crds = |objects: &[Value]| -> Vec<Value> {
        of_kind(objects, "CustomResourceDefinition")
            .into_iter()
            .cloned()
            .collect()
    };
    let webhook_names = |objects: &[Value]| -> Result<Vec<String>> {
        Ok(
            one_of_kind(objects, "ValidatingWebhookConfiguration")?["webhooks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|w| w["name"].as_str().map(String::from))
                .collect(),
        )
    };
    let defaults = template(RELEASE, NAMESPACE, &[]).await?;
    assert!(
        !run_args(&defaults)?.dgd_controller,
        "the default is not planner only"
    );
    assert!(crds(&defaults).is_empty());
    assert_eq!(webhook_names(&defaults)?, [PLANNER_POLICY_WEBHOOK]);

    let installed = template(RELEASE, NAMESPACE, &["--set", "dgdCrd.install=true"]).await?;
    let [crd] = crds(&installed).try_into().map_err(|_| "expected one CRD")?;
    assert_eq!(crd["metadata"]["name"], "dynamographdeployments.nvidia.com");
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
        "helm uninstall must not delete the DGDs"
    );
    let generated =
        e2e::load_yaml(&e2e::repo_root().join("config/crd/dynamographdeployments.nvidia.com.yaml"))?;
    // Helm's YAML turns 0.0 into 0: compare the numbers as numbers.
    check(
        numbers_as_f64(&crd["spec"]) == numbers_as_f64(&generated[0]["spec"]),
        || "the chart's DGD CRD is not the generated one".into(),
    )?;

    let full = template(
        RELEASE,
        NAMESPACE,
        &[
            "--set",
            "dgdController.enabled=true",
            "--set",
            "dgdCrd.install=true",
        ],
    )
    .await?;
    assert!(run_args(&full)?.dgd_controller);
    assert_eq!(crds(&full).len(), 1, "the full operator with its DGD CRD");
    assert_eq!(webhook_names(&full)?, [DGD_WEBHOOK, PLANNER_POLICY_WEBHOOK]);
    Ok(())
}

#[tokio::test]
async fn the_rendered_rbac_grants_exactly_the_api_calls_of_the_code() -> Result<()> {
    let mut failures = Vec::new();
    for mode in modes()? {
        let objects = render(&mode).await?;
        let args = run_args(&objects)?;
        let expected = expected_grants(&args)?;
        let rendered = rendered_grants(&objects)?;
        let places: BTreeSet<&String> = expected.keys().chain(rendered.keys()).collect();
        for place in places {
            let empty = BTreeSet::new();
            let want = expected.get(place).unwrap_or(&empty);
            let have = rendered.get(place).unwrap_or(&empty);
            for extra in have.difference(want) {
                failures.push(format!(
                    "{}: {place} grants {extra}, which no API call in operator/src/rbac.rs needs",
                    mode.name
                ));
            }
            for missing in want.difference(have) {
                failures.push(format!(
                    "{}: {place} lacks {missing}, which operator/src/rbac.rs says the code calls",
                    mode.name
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[tokio::test]
async fn tenancy_values_reach_the_operators_flags() -> Result<()> {
    let defaults = run_args(&template(RELEASE, NAMESPACE, &[]).await?)?.tenancy();
    assert_eq!(
        defaults,
        planner_operator::validation::Tenancy {
            default_prometheus_url: "http://prometheus-operated.monitoring.svc:9090".into(),
            ..planner_operator::validation::Tenancy::default()
        }
    );
    let values = chart_dir().join("ci/tenancy-values.yaml");
    let args = ["--values", values.to_str().ok_or("path")?];
    let tenancy = run_args(&template(RELEASE, NAMESPACE, &args).await?)?.tenancy();
    assert_eq!(tenancy.dynamo_namespaces, ["serving/dynamo", "*/shared"]);
    assert_eq!(
        tenancy.prometheus,
        planner_operator::validation::PrometheusUrlPolicy::AllowList
    );
    assert_eq!(
        tenancy.prometheus_urls,
        ["https://thanos-query.monitoring.svc:10902"]
    );
    assert_eq!(tenancy.etcd_endpoints, ["http://etcd.dynamo-system:2379"]);
    assert!(tenancy.token_secrets);
    // A malformed allowance is refused by the template's schema, before any pod starts.
    let bad = template(
        RELEASE,
        NAMESPACE,
        &["--set", "tenancy.allowedDynamoNamespaces={team-b-llama}"],
    )
    .await;
    assert!(bad.is_err(), "an allowance without a namespace rendered");
    Ok(())
}

#[tokio::test]
async fn without_rbac_create_no_role_is_rendered() -> Result<()> {
    let objects = template(RELEASE, NAMESPACE, &["--set", "rbac.create=false"]).await?;
    for kind in ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"] {
        assert!(of_kind(&objects, kind).is_empty(), "a {kind} is rendered");
    }
    Ok(())
}

/// The Deployment, Services and webhook objects agree with the flags the operator is started
/// with, and the Deployment is locked down.
#[tokio::test]
async fn every_mode_renders_objects_that_agree_with_the_operator_flags() -> Result<()> {
    let mut failures = Vec::new();
    for mode in modes()? {
        let objects = render(&mode).await?;
        if let Err(e) = check_mode(&objects) {
            failures.push(format!("{}: {e}", mode.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// `value` with every number as a float, so that `0` and `0.0` compare equal.
fn numbers_as_f64(value: &Value) -> Value {
    match value {
        Value::Number(n) => json!(n.as_f64()),
        Value::Array(items) => Value::Array(items.iter().map(numbers_as_f64).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), numbers_as_f64(v))).collect())
        }
        other => other.clone(),
    }
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok { Ok(()) } else { Err(what().into()) }
}

fn check_mode(objects: &[Value]) -> Result<()> {
    let deployment = deployment(objects)?;
    let pod = &deployment["spec"]["template"]["spec"];
    let container = container(deployment)?;
    let args = run_args(objects)?;
    let namespace = deployment["metadata"]["namespace"].as_str().unwrap_or_default();

    // Locked down: non-root, read-only root filesystem, no privilege escalation, seccomp.
    check(pod["securityContext"]["runAsNonRoot"] == true, || {
        "pod runAsNonRoot".into()
    })?;
    check(
        pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault",
        || "pod seccomp".into(),
    )?;
    let security = &container["securityContext"];
    check(security["allowPrivilegeEscalation"] == false, || {
        "allowPrivilegeEscalation".into()
    })?;
    check(security["readOnlyRootFilesystem"] == true, || {
        "readOnlyRootFilesystem".into()
    })?;
    check(security["runAsNonRoot"] == true, || {
        "container runAsNonRoot".into()
    })?;
    check(strings(&security["capabilities"]["drop"]) == ["ALL"], || {
        "capabilities".into()
    })?;
    check(
        container["resources"]["requests"].is_object() && container["resources"]["limits"].is_object(),
        || "resources".into(),
    )?;
    // Probes on the health server's port.
    let health = port_of(&args.metrics_addr);
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        check(get["path"] == path, || format!("{probe} path {}", get["path"]))?;
        check(container_port(container, &get["port"]) == Some(health), || {
            format!("{probe} port {} is not the health port {health}", get["port"])
        })?;
    }
    // The Downward API gives the Lease identity and namespace.
    let env = container["env"].as_array().cloned().unwrap_or_default();
    for (name, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        check(
            env.iter()
                .any(|e| e["name"] == name && e["valueFrom"]["fieldRef"]["fieldPath"] == field),
            || format!("env {name} from {field}"),
        )?;
    }
    let replicas = deployment["spec"]["replicas"].as_i64().unwrap_or(1);
    check(replicas == 1 || args.leader_election, || {
        "several replicas without leader election".into()
    })?;
    check(
        (replicas > 1) != of_kind(objects, "PodDisruptionBudget").is_empty(),
        || "a PodDisruptionBudget exactly when there are several replicas".into(),
    )?;
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let selects_pods = |service: &Value| {
        service["spec"]["selector"]
            .as_object()
            .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| pod_labels[k] == *v))
    };

    // The metrics Service reaches /metrics.
    for service in of_kind(objects, "Service") {
        if service["metadata"]["labels"]["app.kubernetes.io/component"] == "metrics" {
            check(selects_pods(service), || {
                "the metrics Service selects no operator pod".into()
            })?;
            let target = &service["spec"]["ports"][0]["targetPort"];
            check(container_port(container, target) == Some(health), || {
                "the metrics Service does not reach the health port".into()
            })?;
        }
    }
    // A ServiceMonitor scrapes that Service.
    for monitor in of_kind(objects, "ServiceMonitor") {
        check(monitor["spec"]["endpoints"][0]["port"] == "http-metrics", || {
            "the ServiceMonitor port".into()
        })?;
        check(monitor["spec"]["endpoints"][0]["honorLabels"] == true, || {
            "honorLabels keeps the policies' namespace label".into()
        })?;
    }

    let configs = of_kind(objects, "ValidatingWebhookConfiguration");
    if args.webhook_disabled {
        check(configs.is_empty(), || {
            "a webhook configuration without the webhook".into()
        })?;
        check(
            !of_kind(objects, "Service")
                .iter()
                .any(|s| s["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook"),
            || "a webhook Service without the webhook".into(),
        )?;
        return Ok(());
    }
    let [config] = configs.as_slice() else {
        return Err(format!("{} webhook configurations", configs.len()).into());
    };
    let config_name = config["metadata"]["name"].as_str().unwrap_or_default();
    let webhooks = config["webhooks"].as_array().cloned().unwrap_or_default();

    // The operator patches the caBundle of this configuration, or leaves it to cert-manager or
    // to the install-time caBundle.
    let cert_manager = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].as_str();
    let install_time_ca = webhooks.iter().all(|w| w["clientConfig"]["caBundle"].is_string());
    if args.webhook_config_name.is_empty() {
        check(cert_manager.is_some() || install_time_ca, || {
            "nobody keeps the caBundle: not the operator, not cert-manager, not the install".into()
        })?;
    } else {
        check(args.webhook_config_name == config_name, || {
            format!(
                "--webhook-config-name {} but the configuration is {config_name}",
                args.webhook_config_name
            )
        })?;
        check(cert_manager.is_none(), || {
            "the operator and cert-manager both patch the caBundle".into()
        })?;
    }

    // Certificates: generated into a Secret, or mounted from one at --webhook-cert-dir.
    let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
    match &args.webhook_cert_dir {
        None => check(volumes.is_empty(), || {
            "generated certificates but a volume".into()
        })?,
        Some(dir) => {
            let mount = container["volumeMounts"]
                .as_array()
                .and_then(|m| {
                    m.iter()
                        .find(|m| m["mountPath"] == dir.to_string_lossy().as_ref())
                })
                .ok_or("nothing is mounted at --webhook-cert-dir")?;
            let volume = volumes
                .iter()
                .find(|v| v["name"] == mount["name"])
                .ok_or("the mount has no volume")?;
            let secret = volume["secret"]["secretName"]
                .as_str()
                .ok_or("not a Secret volume")?;
            if let Some(from) = cert_manager {
                let certificate = of_kind(objects, "Certificate")
                    .into_iter()
                    .find(|c| {
                        format!(
                            "{}/{}",
                            c["metadata"]["namespace"].as_str().unwrap_or_default(),
                            c["metadata"]["name"].as_str().unwrap_or_default()
                        ) == from
                    })
                    .ok_or_else(|| format!("inject-ca-from {from} names no rendered Certificate"))?;
                check(certificate["spec"]["secretName"] == secret, || {
                    "the Certificate's Secret is not the one mounted".into()
                })?;
                let service_name = format!(
                    "{}.{}.svc",
                    args.webhook_service,
                    args.webhook_namespace.as_deref().unwrap_or_default()
                );
                check(
                    strings(&certificate["spec"]["dnsNames"]).contains(&service_name),
                    || format!("the Certificate is not valid for {service_name}"),
                )?;
            }
        }
    }

    // Each webhook is the operator's own (names, paths, rules, fail closed, 10s) and reaches it.
    let service = of_kind(objects, "Service")
        .into_iter()
        .find(|s| s["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook")
        .cloned();
    let target = match (&service, webhooks.first().map(|w| &w["clientConfig"]["url"])) {
        (Some(service), _) => {
            check(
                service["metadata"]["name"] == args.webhook_service.as_str(),
                || "the webhook Service is not --webhook-service".into(),
            )?;
            check(
                service["metadata"]["namespace"] == args.webhook_namespace.as_deref().unwrap_or_default(),
                || "the webhook Service is not in --webhook-namespace".into(),
            )?;
            check(selects_pods(service), || {
                "the webhook Service selects no operator pod".into()
            })?;
            let port = &service["spec"]["ports"][0];
            check(
                container_port(container, &port["targetPort"]) == Some(port_of(&args.webhook_addr)),
                || "the webhook Service does not reach --webhook-addr".into(),
            )?;
            Target::Service {
                name: args.webhook_service.clone(),
                namespace: namespace.to_string(),
                port: i32::try_from(port["port"].as_i64().unwrap_or_default())?,
            }
        }
        (None, Some(Value::String(url))) => {
            // The first webhook is the DGD's with the DGD controller, else the PlannerPolicy's.
            use planner_operator::webhook::admission::{DGD_PATH, PLANNER_POLICY_PATH};
            let path = if args.dgd_controller {
                DGD_PATH
            } else {
                PLANNER_POLICY_PATH
            };
            Target::Url(
                url.strip_suffix(path)
                    .ok_or("a webhook URL without the path")?
                    .to_string(),
            )
        }
        _ => return Err("neither a webhook Service nor a URL".into()),
    };
    let selector = args.namespace.as_ref().map(|watched| {
        serde_json::from_value(json!({"matchLabels": {"kubernetes.io/metadata.name": watched}}))
    });
    let selector = selector.transpose()?;
    // The operator's own DGD writes are not sent to the webhook.
    let operator_user = format!(
        "system:serviceaccount:{}:{}",
        deployment["metadata"]["namespace"].as_str().unwrap_or_default(),
        pod["serviceAccountName"].as_str().unwrap_or_default()
    );
    let ours = serde_json::to_value(validating_webhook_configuration_for(
        config_name,
        &target,
        selector,
        None,
        Some(&operator_user),
    ))?;
    let mut ours = ours["webhooks"].as_array().cloned().unwrap_or_default();
    // DGDs are validated only where this operator renders them.
    if !args.dgd_controller {
        ours.retain(|w| w["name"] != planner_operator::webhook::configuration::DGD_WEBHOOK);
    }
    check(ours.len() == webhooks.len(), || {
        "not the operator's two webhooks".into()
    })?;
    for (rendered, ours) in webhooks.iter().zip(&ours) {
        let mut rendered = rendered.clone();
        if let Some(client) = rendered["clientConfig"].as_object_mut() {
            client.remove("caBundle");
        }
        check(rendered == *ours, || {
            format!(
                "webhook {} differs from the operator's own:\n  chart: {rendered}\n  ours:  {ours}",
                ours["name"]
            )
        })?;
    }
    Ok(())
}

#[tokio::test]
async fn the_dashboard_plots_every_planner_metric() -> Result<()> {
    let objects = template(RELEASE, NAMESPACE, &[]).await?;
    let dashboard = of_kind(&objects, "ConfigMap")
        .into_iter()
        .find(|c| c["metadata"]["labels"]["grafana_dashboard"] == "1")
        .ok_or("no dashboard ConfigMap labelled for Grafana's sidecar")?;
    let json = dashboard["data"]["planner-operator.json"]
        .as_str()
        .ok_or("no planner-operator.json in the ConfigMap")?;
    let parsed: Value = serde_json::from_str(json)?;
    check(parsed["uid"] == "planner-operator", || "dashboard uid".into())?;
    // The operator's metric names (crate::metrics).
    for metric in [
        "planner_operator_desired_replicas",
        "planner_operator_current_replicas",
        "planner_operator_observed_requests",
        "planner_operator_observed_isl",
        "planner_operator_observed_osl",
        "planner_operator_observed_ttft_seconds",
        "planner_operator_observed_itl_seconds",
        "planner_operator_predicted_requests",
        "planner_operator_predicted_isl",
        "planner_operator_predicted_osl",
        "planner_operator_correction_factor",
        "planner_operator_scaling_decisions_total",
        "planner_operator_interval_lateness_seconds",
        "planner_operator_reconcile_total",
        "planner_operator_reconcile_duration_seconds",
        "planner_operator_ttft_target_seconds",
        "planner_operator_itl_target_seconds",
        "planner_operator_observed_ttft_percentile_seconds",
        "planner_operator_sla_attainment_ratio",
        "planner_operator_interval_seconds",
        "planner_operator_desired_gpus",
        "planner_operator_gpus_in_use",
        "planner_operator_observed_decode_kv_usage_ratio",
        "planner_operator_observed_prefill_queue_requests",
        "planner_operator_scaling_limited",
        "planner_operator_metrics_unavailable_total",
        "planner_operator_consecutive_intervals_metrics_unavailable",
        "planner_operator_gpubudget_total_gpus",
        "planner_operator_gpubudget_granted_gpus",
        "planner_operator_gpubudget_held_gpus",
        "planner_operator_gpubudget_member_granted_gpus",
        "planner_operator_build_info",
    ] {
        assert!(json.contains(metric), "the dashboard does not plot {metric}");
    }
    Ok(())
}

#[tokio::test]
async fn bad_values_are_rejected_with_messages_that_say_what_to_fix() -> Result<()> {
    let cases: [(&[&str], &str); 14] = [
        (
            &["webhook.certificate.mode=vault"],
            "'generated', 'certManager', 'secret'",
        ),
        (
            &["webhook.certificate.mode=secret"],
            "webhook.certificate.secret.name is required",
        ),
        (&["replicaCount=0"], "/replicaCount"),
        (&["replicaCount=two"], "want integer"),
        (
            &["leaderElection.enabled=false"],
            "set replicaCount to 1 or enable leader election",
        ),
        (&["webhook.failurePolicy=fail"], "'Fail', 'Ignore'"),
        (&["webhook.timeoutSeconds=60"], "/webhook/timeoutSeconds"),
        (
            &["prometheus.url=prometheus:9090"],
            "is not an http:// or https:// URL",
        ),
        (&["webhook.url=http://127.0.0.1:9443"], "is not an https:// URL"),
        (&["watchNamespace=Team_A"], "is not a namespace name"),
        (&["image.pullPolicy=always"], "'Always', 'IfNotPresent', 'Never'"),
        (&["imageTag=1.0"], "additional properties 'imageTag' not allowed"),
        (
            &["prometheusRule.alerts.slaMissed.for=ten"],
            "at '/prometheusRule/alerts/slaMissed/for'",
        ),
        (
            &["prometheusRule.alerts.noleader.for=1m"],
            "additional properties 'noleader' not allowed",
        ),
    ];
    let mut failures = Vec::new();
    for (sets, message) in cases {
        let args: Vec<&str> = sets.iter().flat_map(|s| ["--set", *s]).collect();
        match template(RELEASE, NAMESPACE, &args).await {
            Ok(_) => failures.push(format!("{sets:?} was accepted")),
            Err(e) if e.to_string().contains(message) => {}
            Err(e) => failures.push(format!("{sets:?}: expected {message:?} in: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// Whether a PodMonitor's `selector` and `namespaceSelector` select a pod.
fn selects(monitor: &Value, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
    let spec = &monitor["spec"];
    let namespaces = &spec["namespaceSelector"];
    let in_namespace =
        namespaces["any"] == true || strings(&namespaces["matchNames"]).iter().any(|n| n == namespace);
    let selector = &spec["selector"];
    let match_labels = selector["matchLabels"].as_object().is_none_or(|m| {
        m.iter()
            .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str())
    });
    let match_expressions = selector["matchExpressions"].as_array().is_none_or(|expressions| {
        expressions.iter().all(|e| {
            e["operator"] == "In"
                && labels
                    .get(e["key"].as_str().unwrap_or_default())
                    .is_some_and(|v| strings(&e["values"]).contains(v))
        })
    });
    in_namespace && match_labels && match_expressions
}

#[tokio::test]
async fn dynamo_pod_monitors_scrape_the_pods_the_dgd_controller_renders() -> Result<()> {
    assert!(
        of_kind(&template(RELEASE, NAMESPACE, &[]).await?, "PodMonitor").is_empty(),
        "off by default"
    );
    let objects = template(
        RELEASE,
        NAMESPACE,
        &[
            "--set",
            "dynamoPodMonitors.enabled=true",
            "--set",
            "dynamoPodMonitors.namespaces={llm}",
        ],
    )
    .await?;
    let monitors = of_kind(&objects, "PodMonitor");
    assert_eq!(monitors.len(), 2);

    // The pods this operator renders for the sample graph.
    let mut dgd: planner_api::DynamoGraphDeployment = serde_yaml::from_str(&std::fs::read_to_string(
        e2e::repo_root().join("config/samples/dgd-disagg.yaml"),
    )?)?;
    dgd.metadata.namespace = Some("llm".into());
    dgd.metadata.uid = Some("0f3c2a".into());
    let graph_namespace =
        planner_api::labels::dynamo_namespace("llm", dgd.metadata.name.as_deref().unwrap_or_default());
    let rendered = planner_operator::controller::dgd::render::render(&dgd, None)?;
    let pods: Vec<(String, BTreeMap<String, String>, Vec<String>)> = rendered
        .deployments
        .iter()
        .map(|d| {
            let template =
                serde_json::to_value(d.spec.as_ref().map(|s| s.template.clone())).unwrap_or_default();
            let labels: BTreeMap<String, String> =
                serde_json::from_value(template["metadata"]["labels"].clone()).unwrap_or_default();
            let ports = template["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
                .filter_map(|p| p["name"].as_str().map(String::from))
                .collect();
            (labels["nvidia.com/dynamo-component-type"].clone(), labels, ports)
        })
        .collect();

    for (monitor, expected) in [
        ("dynamo-frontend", vec!["frontend"]),
        ("dynamo-worker", vec!["prefill", "decode"]),
    ] {
        let monitor = monitors
            .iter()
            .find(|m| {
                m["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with(monitor))
            })
            .ok_or(format!("no PodMonitor {monitor}"))?;
        let selected: Vec<&(String, BTreeMap<String, String>, Vec<String>)> = pods
            .iter()
            .filter(|(_, labels, _)| selects(monitor, "llm", labels))
            .collect();
        assert_eq!(
            selected
                .iter()
                .map(|(kind, _, _)| kind.as_str())
                .collect::<Vec<_>>(),
            expected,
            "{monitor}"
        );
        assert!(
            pods.iter()
                .all(|(_, labels, _)| !selects(monitor, "other", labels)),
            "only the namespaces asked for"
        );
        let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
        for (kind, labels, ports) in selected {
            // The port scraped is a named port of the pod.
            assert!(
                ports.iter().any(|p| endpoint["port"] == p.as_str()),
                "{kind}: {ports:?} {endpoint}"
            );
            // The relabelling copies the pod's Dynamo namespace (Prometheus's meta label of a
            // pod label: every character other than letters, digits and `_` made `_`) into
            // `dynamo_namespace`, the graph's, which a PlannerPolicy selects series by.
            let relabel = endpoint["relabelings"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["targetLabel"] == "dynamo_namespace")
                .ok_or(format!("{kind}: no dynamo_namespace relabelling"))?;
            let source = strings(&relabel["sourceLabels"]).join(",");
            let value = labels
                .iter()
                .find(|(key, _)| {
                    let meta: String = key
                        .chars()
                        .map(|c| {
                            if c.is_ascii_alphanumeric() || c == '_' {
                                c
                            } else {
                                '_'
                            }
                        })
                        .collect();
                    source == format!("__meta_kubernetes_pod_label_{meta}")
                })
                .map(|(_, value)| value.clone());
            assert_eq!(value, Some(graph_namespace.clone()), "{kind}: {source}");
            assert_eq!(endpoint["honorLabels"], true);
        }
    }
    Ok(())
}

/// `tools/docs.sh check <chart>` (what `make check-docs` runs on the chart) on a copy of the
/// chart: it passes on the committed README, fails once a `# --` comment of values.yaml changes
/// (naming the README and `make docs`), and passes again after `tools/docs.sh generate`.
#[tokio::test]
async fn check_docs_fails_when_a_value_comment_changes_until_make_docs() -> Result<()> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("chart-docs-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let outcome = async {
        let copied = tokio::process::Command::new("cp")
            .arg("-r")
            .arg(chart_dir())
            .arg(&dir)
            .status()
            .await?;
        check(copied.success(), || "cp -r of the chart failed".into())?;
        let chart = dir.join("planner-operator");
        let docs = |mode: &'static str| {
            let chart = chart.clone();
            async move {
                tokio::process::Command::new("bash")
                    .arg(e2e::repo_root().join("tools/docs.sh"))
                    .arg(mode)
                    .arg(&chart)
                    .output()
                    .await
            }
        };
        let fresh = docs("check").await?;
        check(fresh.status.success(), || {
            format!(
                "check fails on the committed chart: {}",
                String::from_utf8_lossy(&fresh.stderr)
            )
        })?;
        let values = chart.join("values.yaml");
        let text = std::fs::read_to_string(&values)?;
        let comment = "# -- Operator replicas.";
        check(text.contains(comment), || {
            format!("values.yaml has no {comment:?}")
        })?;
        std::fs::write(
            &values,
            text.replace(comment, "# -- How many operator replicas run."),
        )?;
        let stale = docs("check").await?;
        let stderr = String::from_utf8_lossy(&stale.stderr);
        check(!stale.status.success(), || {
            "check passes with a changed value comment".into()
        })?;
        check(
            stderr.contains("stale:") && stderr.contains("README.md") && stderr.contains("make docs"),
            || format!("the failure does not name the file and the fix: {stderr}"),
        )?;
        check(stderr.contains("How many operator replicas run."), || {
            format!("the failure does not show the changed line: {stderr}")
        })?;
        let generated = docs("generate").await?;
        check(generated.status.success(), || {
            String::from_utf8_lossy(&generated.stderr).into()
        })?;
        let again = docs("check").await?;
        check(again.status.success(), || {
            format!(
                "check fails after generate: {}",
                String::from_utf8_lossy(&again.stderr)
            )
        })
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

/// Set to the promtool binary to use instead of `promtool` from PATH (`make chart-test` and
/// `make e2e` set it to the one `make tools` builds).
const PROMTOOL_ENV: &str = "PROMTOOL";

/// Runs promtool with `args` in `dir`; a failure is an error with what it printed.
async fn promtool(dir: &std::path::Path, args: &[&str]) -> Result<String> {
    let binary = std::env::var(PROMTOOL_ENV).unwrap_or_else(|_| "promtool".into());
    let output = tokio::process::Command::new(&binary)
        .args(args)
        .current_dir(dir)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("cannot run {binary} ({e}): `make tools` builds it; set {PROMTOOL_ENV}"))?;
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        return Err(format!("promtool {} failed:\n{printed}", args.join(" ")).into());
    }
    Ok(printed)
}

/// The rendered PrometheusRule's alerts, by name.
fn rule_alerts(rule: &Value) -> BTreeMap<String, Value> {
    rule["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|group| group["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|rule| Some((rule["alert"].as_str()?.to_string(), rule)))
        .collect()
}

#[tokio::test]
async fn the_prometheus_rule_is_rendered_only_when_asked_with_its_values() -> Result<()> {
    let default = template(RELEASE, NAMESPACE, &[]).await?;
    check(of_kind(&default, "PrometheusRule").is_empty(), || {
        "a PrometheusRule is rendered by default".into()
    })?;
    let objects = template(
        RELEASE,
        NAMESPACE,
        &[
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "prometheusRule.namespace=monitoring",
            "--set",
            "prometheusRule.additionalLabels.release=kube-prometheus",
            "--set",
            "prometheusRule.alertLabels.team=inference",
            "--set",
            "prometheusRule.alerts.slaMissed.intervals=7",
            "--set",
            "prometheusRule.alerts.slaMissed.for=10m",
            "--set",
            "prometheusRule.alerts.slaMissed.severity=critical",
            "--set",
            "prometheusRule.alerts.scalingLimited.enabled=false",
            "--set",
            "prometheusRule.selector=service=\"planner\"",
        ],
    )
    .await?;
    let rule = one_of_kind(&objects, "PrometheusRule")?;
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["namespace"], "monitoring");
    assert_eq!(rule["metadata"]["labels"]["release"], "kube-prometheus");
    let alerts = rule_alerts(rule);
    let names: BTreeSet<&str> = alerts.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "PlannerOperatorNoLeader",
            "PlannerOperatorWebhookCertificateExpiring",
            "PlannerPolicyMetricsUnavailable",
            "PlannerPolicySlaAttainmentLow",
            "PlannerPolicySlaMissed",
        ])
    );
    let missed = &alerts["PlannerPolicySlaMissed"];
    let expr = missed["expr"].as_str().unwrap_or_default();
    assert!(
        expr.ends_with(">= 7") && expr.contains("{service=\"planner\"}"),
        "{expr}"
    );
    assert_eq!(missed["for"], "10m");
    assert_eq!(missed["labels"]["severity"], "critical");
    for (name, alert) in &alerts {
        assert_eq!(alert["labels"]["team"], "inference", "{name}");
        for annotation in ["summary", "description"] {
            assert!(
                alert["annotations"][annotation]
                    .as_str()
                    .is_some_and(|a| !a.is_empty()),
                "{name} has no {annotation}"
            );
        }
        assert!(
            !alert["expr"].as_str().unwrap_or_default().contains("job="),
            "{name} ignores the selector"
        );
    }
    // Without the webhook, no certificate to watch.
    let no_webhook = template(
        RELEASE,
        NAMESPACE,
        &[
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "webhook.enabled=false",
        ],
    )
    .await?;
    let alerts = rule_alerts(one_of_kind(&no_webhook, "PrometheusRule")?);
    assert!(!alerts.contains_key("PlannerOperatorWebhookCertificateExpiring"));
    assert!(alerts.contains_key("PlannerOperatorNoLeader"));
    Ok(())
}

/// Renders the chart's alerts with the default values and runs `promtool check rules` and the
/// unit tests of `e2e/tests/rules/` on them: the rules promtool tests are the ones the chart
/// installs.
#[tokio::test]
async fn the_alerts_fire_and_stay_quiet_as_their_promtool_tests_say() -> Result<()> {
    let objects = template(RELEASE, NAMESPACE, &["--set", "prometheusRule.enabled=true"]).await?;
    let rule = one_of_kind(&objects, "PrometheusRule")?;
    let rendered = rule_alerts(rule);
    // The alerts select the job the ServiceMonitor scrapes: the metrics Service's name.
    let service = of_kind(&objects, "Service")
        .into_iter()
        .find(|s| s["metadata"]["labels"]["app.kubernetes.io/component"] == "metrics")
        .ok_or("no metrics Service")?;
    let job = format!(
        "job=\"{}\"",
        service["metadata"]["name"].as_str().unwrap_or_default()
    );
    for (name, alert) in &rendered {
        let expr = alert["expr"].as_str().unwrap_or_default();
        assert!(expr.contains(&job), "{name} does not select {job}: {expr}");
    }
    let dir = std::env::temp_dir().join(format!("e2e-alerts-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("alerts.rules.yaml"),
        serde_yaml::to_string(&rule["spec"])?,
    )?;
    let tests_dir = e2e::repo_root().join("e2e/tests/rules");
    let mut tests = Vec::new();
    let mut fired = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for path in yaml_files(&tests_dir)? {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&path)?;
        let parsed: Value = serde_yaml::from_str(&text)?;
        for case in parsed["tests"].as_array().into_iter().flatten() {
            for test in case["alert_rule_test"].as_array().into_iter().flatten() {
                let alert = test["alertname"].as_str().unwrap_or_default().to_string();
                if test["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                    fired.insert(alert);
                } else {
                    quiet.insert(alert);
                }
            }
        }
        std::fs::write(dir.join(&name), text)?;
        tests.push(name);
    }
    // Every alert the chart renders is tested both ways.
    for alert in rendered.keys() {
        assert!(fired.contains(alert), "no test fires {alert}");
        assert!(quiet.contains(alert), "no test keeps {alert} quiet");
    }
    let checked = promtool(&dir, &["check", "rules", "alerts.rules.yaml"]).await;
    let mut args = vec!["test", "rules"];
    args.extend(tests.iter().map(String::as_str));
    let tested = promtool(&dir, &args).await;
    let _ = std::fs::remove_dir_all(&dir);
    println!("{}", checked?);
    println!("{}", tested?);
    Ok(())
}
