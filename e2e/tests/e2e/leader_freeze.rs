//! A leader that loses its lease without knowing it stands down without writing. Two operator
//! processes in each test:
//! - the leader is frozen with SIGSTOP past its lease, until the other has taken the lease and
//!   acted on changes made meanwhile, then resumed: from then on it must write nothing (no
//!   status, no workload, no Event under its name), not undo what the new leader did, leave the
//!   lease alone and report healthy as a standby;
//! - the leader's renewals are refused by the API server (a ValidatingAdmissionPolicy) while
//!   everything else it does succeeds: it must stop leading at its lease's deadline, before the
//!   other can take the lease, so that the two never lead at once.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use e2e::{Result, TestNamespace, http_get, in_namespace, install_crds, operator_binary, poll_until};
use k8s_openapi::api::{apps::v1::Deployment, coordination::v1::Lease, events::v1::Event};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use planner_api::DynamoGraphDeployment;
use serde_json::{Value, json};

use crate::dgd::graph;

/// Lease duration of both processes: short, so that the test is quick.
const LEASE_SECONDS: u64 = 8;
const WAIT: Duration = Duration::from_secs(90);

struct Process {
    child: Child,
    identity: String,
    metrics: SocketAddr,
    log: PathBuf,
}

fn free_addr() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

impl Process {
    /// Starts `planner-operator run` for the namespace.
    fn start(ns: &TestNamespace, identity: &str) -> Result<Self> {
        let metrics = free_addr()?;
        let log = std::env::temp_dir().join(format!("{}-{identity}.log", ns.name));
        let binary = operator_binary();
        let output = std::fs::File::create(&log)?;
        let mut command = Command::new(&binary);
        command
            .args([
                "run",
                "--namespace",
                &ns.name,
                "--webhook-disabled",
                "--metrics-addr",
                &metrics.to_string(),
                "--lease-namespace",
                &ns.name,
                "--lease-duration-seconds",
                &LEASE_SECONDS.to_string(),
                "--identity",
                identity,
            ])
            .env("RUST_LOG", "info")
            .stdout(Stdio::from(output.try_clone()?))
            .stderr(Stdio::from(output));
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e} (make e2e builds it)", binary.display()))?;
        Ok(Self {
            child,
            identity: identity.into(),
            metrics,
            log,
        })
    }

    fn signal(&self, signal: &str) -> Result<()> {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("kill {signal} {} failed", self.child.id()).into())
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.signal("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok { Ok(()) } else { Err(what().into()) }
}

async fn holder(ns: &TestNamespace) -> Result<Option<String>> {
    let leases: Api<Lease> = ns.api();
    Ok(leases
        .get_opt("planner-operator-leader")
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

async fn decode_replicas(ns: &TestNamespace) -> Result<Option<i32>> {
    let api: Api<Deployment> = ns.api();
    Ok(api
        .get_opt("llama-decode")
        .await?
        .and_then(|d| d.spec)
        .and_then(|s| s.replicas))
}

/// The Events a process published (by its reporting instance).
async fn events_from(ns: &TestNamespace, identity: &str) -> Result<Vec<Event>> {
    Ok(ns
        .events()
        .await?
        .into_iter()
        .filter(|e| e.reporting_instance.as_deref() == Some(identity))
        .collect())
}

/// `old` leads, is frozen, `new` takes over and acts, `old` is resumed and must not write.
async fn freeze_the_leader(ns: &TestNamespace, old: &Process, new: &Process) -> Result<()> {
    let dgds: Api<DynamoGraphDeployment> = ns.api();
    dgds.create(&PostParams::default(), &graph("llama")?).await?;
    poll_until("the leader to render the graph", WAIT, || async {
        Ok(decode_replicas(ns).await? == Some(1))
    })
    .await?;
    ticking_policy(ns, old).await?;

    // Take the leader out past its lease; the other takes over.
    old.signal("-STOP")?;
    let out = Instant::now();
    poll_until(
        "the other replica to take the Lease",
        Duration::from_secs(LEASE_SECONDS * 6),
        || async { Ok(holder(ns).await?.as_deref() == Some(new.identity.as_str())) },
    )
    .await?;
    eprintln!("lease taken over {:?} after the freeze", out.elapsed());

    // Changes the old leader will hear about when it is back: a scale-up, and a DGD it has
    // never seen.
    let patch = json!([{"op": "replace", "path": "/spec/components/2/replicas", "value": 3}]);
    dgds.patch(
        "llama",
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(patch)?),
    )
    .await?;
    let mut broken = graph("broken")?;
    broken.spec.components[0]
        .pod_template
        .as_mut()
        .ok_or("template")?
        .spec
        .as_mut()
        .ok_or("spec")?
        .containers[0]
        .name = "x".into();
    dgds.create(&PostParams::default(), &broken).await?;
    poll_until("the new leader to scale decode to 3", WAIT, || async {
        Ok(decode_replicas(ns).await? == Some(3))
    })
    .await?;
    poll_until("the new leader's InvalidSpec Event", WAIT, || async {
        Ok(events_from(ns, &new.identity)
            .await?
            .iter()
            .any(|e| e.reason.as_deref() == Some("InvalidSpec")))
    })
    .await?;
    // Out for at least two lease durations, so that its own deadlines have long passed.
    let minimum = Duration::from_secs(LEASE_SECONDS * 2);
    if out.elapsed() < minimum {
        tokio::time::sleep(minimum - out.elapsed()).await;
    }
    let events_before = events_from(ns, &old.identity).await?.len();

    // Resume it. For three lease durations it must not write: the lease stays with the
    // new leader, decode stays at 3, and no Event carries its name.
    old.signal("-CONT")?;
    let watch_until = Instant::now() + Duration::from_secs(LEASE_SECONDS * 3);
    while Instant::now() < watch_until {
        let now_holder = holder(ns).await?;
        ensure(now_holder.as_deref() == Some(new.identity.as_str()), || {
            format!("the lease changed hands after the old leader came back: {now_holder:?}")
        })?;
        let replicas = decode_replicas(ns).await?;
        ensure(replicas == Some(3), || {
            format!("the old leader undid the new leader's scaling: decode has {replicas:?}")
        })?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let events_after = events_from(ns, &old.identity).await?;
    ensure(events_after.len() == events_before, || {
        format!(
            "the old leader published Events after it came back: {:?}",
            events_after
                .iter()
                .map(|e| (e.reason.clone(), e.note.clone()))
                .collect::<Vec<_>>()
        )
    })?;

    // It stood down and stands by: not the leader, healthy, still running.
    let (_, metrics) = http_get(old.metrics, "/metrics").await?;
    ensure(
        metrics
            .lines()
            .any(|l| l.starts_with("planner_operator_leader ") && l.ends_with(" 0")),
        || {
            format!(
                "the old leader still reports leading:\n{}",
                metrics
                    .lines()
                    .filter(|l| l.contains("leader"))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        },
    )?;
    poll_until("the old leader to report healthy", WAIT, || async {
        Ok(http_get(old.metrics, "/healthz").await?.0 == 200)
    })
    .await?;
    let log = old.log_text();
    ensure(
        log.contains("stepped down") || log.contains("lost the leader lease"),
        || "the old leader did not say it stood down".into(),
    )?;
    eprintln!(
        "old leader: {} writes refused; what it said about leading:\n{}",
        log.matches("write refused").count(),
        log.lines()
            .filter(|l| ["leader lease", "stepped", "refused", "leader;"]
                .iter()
                .any(|w| l.contains(w)))
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

/// A policy of `leader`'s that writes every 10 s (status, and a MetricsUnavailable Event, since
/// its Prometheus refuses connections); returns once the first Event is out.
async fn ticking_policy(ns: &TestNamespace, leader: &Process) -> Result<()> {
    ns.accepts(&json!({
        "apiVersion": "planner.dynamo.io/v1alpha1",
        "kind": "PlannerPolicy",
        "metadata": {"name": "tick"},
        "spec": {
            "targetRef": {"name": "llama"},
            "mode": "observe",
            "adjustmentInterval": "10s",
            "sla": {"ttftMs": 500, "itlMs": 50},
            "predictor": {"type": "constant"},
            "profile": {"builtin": "h200-llama3.1-8b-tp1"},
            "metrics": {"prometheus": {"url": "http://127.0.0.1:1"}, "modelName": "llama-3.1-8b"}
        }
    }))
    .await?;
    poll_until("the leader's first MetricsUnavailable Event", WAIT, || async {
        Ok(events_from(ns, &leader.identity)
            .await?
            .iter()
            .any(|e| e.reason.as_deref() == Some("MetricsUnavailable")))
    })
    .await?;

    Ok(())
}

/// Runs `scenario` on two processes, `replica-a` started alone so that it leads.
async fn with_two_processes(
    ns: &TestNamespace,
    scenario: impl AsyncFnOnce(&Process, &Process) -> Result<()>,
) -> Result<()> {
    install_crds(&ns.client).await?;
    let first = Process::start(ns, "replica-a")?;
    poll_until("the first replica to hold the Lease", WAIT, || async {
        Ok(holder(ns).await?.as_deref() == Some("replica-a"))
    })
    .await?;
    let second = Process::start(ns, "replica-b")?;
    let outcome = scenario(&first, &second).await;
    if outcome.is_err() {
        for process in [&first, &second] {
            eprintln!("--- log of {} ---\n{}", process.identity, process.log_text());
        }
    }
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_frozen_past_its_lease_stands_down_without_writing() -> Result<()> {
    in_namespace("leader-freeze", |ns| async move {
        with_two_processes(&ns, async |old, new| freeze_the_leader(&ns, old, new).await).await
    })
    .await
}

/// A ValidatingAdmissionPolicy (CEL in the API server) that refuses every write of the Lease
/// that keeps `identity` its holder, in `namespace` only: that replica's renewals fail while
/// everything else it does succeeds.
fn refuse_renewals(namespace: &str, identity: &str) -> Result<(Value, Value)> {
    let name = format!("refuse-renewals-{namespace}");
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"],
                "operations": ["UPDATE"], "resources": ["leases"]
            }]},
            "validations": [{
                "expression": format!("!has(object.spec.holderIdentity) || object.spec.holderIdentity != '{identity}'"),
                "message": format!("renewals by {identity} are refused by the test")
            }]
        }
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
        }
    });
    Ok((policy, binding))
}

async fn leads(process: &Process) -> Result<bool> {
    let (_, metrics) = http_get(process.metrics, "/metrics").await?;
    Ok(metrics
        .lines()
        .any(|l| l.starts_with("planner_operator_leader ") && l.ends_with(" 1")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_renew_its_lease_steps_down_before_another_takes_over() -> Result<()> {
    use kube::{
        api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind},
        discovery,
    };
    in_namespace("leader-renewal", |ns| async move {
        with_two_processes(&ns, async |old, new| {
            let dgds: Api<DynamoGraphDeployment> = ns.api();
            dgds.create(&PostParams::default(), &graph("llama")?).await?;
            ticking_policy(&ns, old).await?;
            ensure(leads(old).await?, || "the first replica does not report leading".into())?;
            // From now on the leader's renewals are refused; all its other calls succeed.
            let (policy, binding) = refuse_renewals(&ns.name, &old.identity)?;
            let mut created = Vec::new();
            for object in [&policy, &binding] {
                let kind = object["kind"].as_str().ok_or("kind")?;
                let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
                let (resource, _): (ApiResource, _) = discovery::pinned_kind(&ns.client, &gvk).await?;
                let api: Api<DynamicObject> = Api::all_with(ns.client.clone(), &resource);
                api.create(&PostParams::default(), &serde_json::from_value(object.clone())?)
                    .await?;
                created.push((api, object["metadata"]["name"].as_str().unwrap_or_default().to_string()));
            }
            let outcome = async {
                // Until the other holds the lease and a few seconds more, the two must never
                // both lead: the old leader stops at its own deadline, before the lease can
                // change hands.
                let started = Instant::now();
                let mut both = Vec::new();
                let mut taken_at = None;
                while taken_at.is_none_or(|at: Instant| at.elapsed() < Duration::from_secs(LEASE_SECONDS)) {
                    ensure(started.elapsed() < Duration::from_secs(LEASE_SECONDS * 8), || {
                        "the other replica never took the lease".into()
                    })?;
                    let holder = holder(&ns).await?;
                    if holder.as_deref() == Some(new.identity.as_str()) {
                        taken_at.get_or_insert_with(Instant::now);
                        if leads(old).await? {
                            both.push(started.elapsed());
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                eprintln!(
                    "renewals refused at 0 s; lease taken over after {:?}",
                    taken_at.map(|at| at.duration_since(started))
                );
                ensure(both.is_empty(), || {
                    format!(
                        "two leaders at once: the old one still led while the new one held the lease at {both:?}"
                    )
                })?;
                // And it wrote nothing since: no Event under its name after the new leader's term
                // began (a tick every 10 s would publish one).
                let leases: Api<Lease> = ns.api();
                let acquired = leases
                    .get("planner-operator-leader")
                    .await?
                    .spec
                    .and_then(|s| s.acquire_time)
                    .ok_or("the lease has no acquireTime")?
                    .0;
                let late: Vec<_> = events_from(&ns, &old.identity)
                    .await?
                    .into_iter()
                    .filter(|e| {
                        let last = e
                            .series
                            .as_ref()
                            .map(|s| s.last_observed_time.0)
                            .or(e.event_time.as_ref().map(|t| t.0));
                        last.is_some_and(|t| t > acquired)
                    })
                    .map(|e| e.reason)
                    .collect();
                ensure(late.is_empty(), || {
                    format!("the old leader published Events after the new leader's term began: {late:?}")
                })?;
                let log = old.log_text();
                ensure(log.contains("stepped down"), || {
                    "the old leader did not say it stepped down".into()
                })?;
                Ok(())
            }
            .await;
            for (api, name) in created {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            }
            outcome
        })
        .await
    })
    .await
}
