//! Faults under a running operator: Prometheus servers that misbehave (slow, garbage, a huge
//! body, a redirect) next to a healthy one, a Prometheus that wants a bearer token, and a
//! kube-apiserver restart.

use std::{
    io::Write,
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Body,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use e2e::{Result, TestNamespace, in_namespace, install_crds, poll_until};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Secret, events::v1::Event};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use planner_api::{DynamoGraphDeployment, PlannerPolicy};
use serde_json::{Value, json};

use crate::{dgd::graph, fake_prometheus::FakePrometheus, operator::start};

const MODEL: &str = "llama-3.1-8b";
const WAIT: Duration = Duration::from_secs(120);

fn policy(name: &str, graph: &str, prometheus: &str) -> Result<PlannerPolicy> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "planner.dynamo.io/v1alpha1",
        "kind": "PlannerPolicy",
        "metadata": {"name": name},
        "spec": {
            "targetRef": {"name": graph},
            "adjustmentInterval": "10s",
            "sla": {"ttftMs": 500, "itlMs": 50},
            "bounds": {"minReplicas": 1, "maxReplicas": 6, "maxGpuBudget": -1},
            "predictor": {"type": "constant"},
            "profile": {"builtin": "h200-llama3.1-8b-tp1"},
            "metrics": {"prometheus": {"url": prometheus}, "modelName": MODEL}
        }
    }))?)
}

/// A graph whose prefill and decode pools run `replicas` each.
async fn create_graph(ns: &TestNamespace, name: &str, replicas: i32) -> Result<()> {
    let mut dgd = graph(name)?;
    for component in &mut dgd.spec.components {
        if component.name == "prefill" || component.name == "decode" {
            component.replicas = Some(replicas);
        }
    }
    let dgds: Api<DynamoGraphDeployment> = ns.api();
    dgds.create(&PostParams::default(), &dgd).await?;
    Ok(())
}

fn replicas(dgd: &DynamoGraphDeployment) -> (Option<i32>, Option<i32>) {
    let of = |name: &str| {
        dgd.spec
            .components
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.replicas)
    };
    (of("prefill"), of("decode"))
}

/// The policy's condition `type_`: status and message.
pub(crate) fn condition(policy: &PlannerPolicy, type_: &str) -> Option<(String, String)> {
    policy
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.message.clone()))
}

fn last_tick(policy: &PlannerPolicy) -> Option<String> {
    policy
        .status
        .as_ref()?
        .last_tick_time
        .as_ref()
        .map(|t| t.0.to_string())
}

/// A Prometheus HTTP API that misbehaves in one way per path prefix.
async fn misbehaving_prometheus() -> Result<(String, tokio::task::JoinHandle<()>)> {
    let app = Router::new()
        .route(
            "/slow/api/v1/{*query}",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(600)).await;
                "{}"
            }),
        )
        .route(
            "/garbage/api/v1/{*query}",
            get(|| async { "<html>GARBAGE-MARKER not Prometheus</html>" }),
        )
        .route(
            "/huge/api/v1/{*query}",
            get(|| async {
                // 256 MiB streamed without a Content-Length: far past any sane response.
                let chunk = vec![b' '; 1 << 20];
                let chunks = (0..256).map(move |_| Ok::<_, std::io::Error>(chunk.clone()));
                Response::new(Body::from_stream(futures::stream::iter(chunks)))
            }),
        )
        .route(
            "/redirect/api/v1/{*query}",
            get(|| async {
                (StatusCode::FOUND, [(header::LOCATION, "http://169.254.169.254/")]).into_response()
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, task))
}

/// Four policies read Prometheus servers that hang, answer garbage, stream 256 MiB or redirect;
/// each says so in `MetricsAvailable`, keeps its graph's replicas and keeps ticking, while a
/// fifth policy next to them observes, scales and ticks every interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_prometheus_servers_stall_no_one_and_scale_nothing_down() -> Result<()> {
    in_namespace("bad-prometheus", |ns| async move {
        install_crds(&ns.client).await?;
        let healthy = FakePrometheus::start(MODEL).await?;
        let (bad, server) = misbehaving_prometheus().await?;
        let policies: Api<PlannerPolicy> = ns.api();
        let dgds: Api<DynamoGraphDeployment> = ns.api();
        // Each bad case, and what its MetricsAvailable message must say.
        let cases = [
            ("slow", "timed out"),
            ("garbage", "unreadable response"),
            ("huge", "larger than"),
            ("redirect", "redirects are not followed"),
        ];
        create_graph(&ns, "healthy", 1).await?;
        for (case, _) in cases {
            create_graph(&ns, case, 2).await?;
        }
        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let outcome = async {
            policies
                .create(
                    &PostParams::default(),
                    &policy("healthy", "healthy", &healthy.url)?,
                )
                .await?;
            for (case, _) in cases {
                policies
                    .create(
                        &PostParams::default(),
                        &policy(case, case, &format!("{bad}/{case}"))?,
                    )
                    .await?;
            }
            for (case, expected) in cases {
                let message = Mutex::new(String::new());
                poll_until(&format!("{case}: MetricsAvailable=False"), WAIT, || async {
                    let current = condition(&policies.get(case).await?, "MetricsAvailable");
                    let unavailable = current.as_ref().is_some_and(|(status, _)| status == "False");
                    if let (Some((_, text)), Ok(mut message)) = (current, message.lock()) {
                        *message = text;
                    }
                    Ok(unavailable)
                })
                .await?;
                let message = message.lock().map(|m| m.clone()).unwrap_or_default();
                eprintln!("{case}: {message}");
                assert!(message.contains(expected), "{case}: {message}");
                assert!(
                    !message.contains("GARBAGE-MARKER"),
                    "{case}: the body is echoed: {message}"
                );
                assert!(message.len() <= 1024 + 3, "{case}: {} bytes", message.len());
            }

            // Three more intervals of every policy: the healthy one scales, the bad ones hold.
            let ticks = Mutex::new(std::collections::BTreeMap::<String, Vec<String>>::new());
            let started = Instant::now();
            poll_until(
                "three more ticks of every policy",
                Duration::from_secs(90),
                || async {
                    let mut observed = Vec::new();
                    for name in std::iter::once("healthy").chain(cases.iter().map(|(case, _)| *case)) {
                        let policy = policies.get(name).await?;
                        if name != "healthy" {
                            let held = replicas(&dgds.get(name).await?);
                            assert_eq!(held, (Some(2), Some(2)), "{name} scaled on unusable metrics");
                        }
                        observed.push((name, policy));
                    }
                    let mut ticks = ticks.lock().map_err(|_| "lock")?;
                    for (name, policy) in observed {
                        let seen = ticks.entry(name.to_string()).or_default();
                        if let Some(tick) = last_tick(&policy).filter(|t| !seen.contains(t)) {
                            seen.push(tick);
                        }
                    }
                    // The first tick seen may be one from before.
                    Ok(ticks.values().all(|seen| seen.len() >= 4))
                },
            )
            .await?;
            eprintln!("every policy ticked three more times in {:?}", started.elapsed());
            let policy = policies.get("healthy").await?;
            assert_eq!(
                condition(&policy, "MetricsAvailable").map(|c| c.0).as_deref(),
                Some("True")
            );
            let desired = policy
                .status
                .as_ref()
                .and_then(|s| s.desired.as_ref())
                .ok_or("no decision")?;
            let scaled = replicas(&dgds.get("healthy").await?);
            eprintln!("healthy: desired {desired:?}, DGD {scaled:?}");
            assert_ne!(
                scaled,
                (Some(1), Some(1)),
                "the healthy policy never scaled its graph"
            );
            operator.check_running()
        }
        .await;
        let stopped = operator.stop().await;
        server.abort();
        outcome.and(stopped)
    })
    .await
}

/// The notes of the Scaled Events in `ns`, oldest first.
async fn scaled_notes(ns: &TestNamespace) -> Result<Vec<String>> {
    let events: Api<Event> = ns.api();
    let mut scaled: Vec<Event> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Scaled"))
        .collect();
    scaled.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    Ok(scaled
        .into_iter()
        .map(|e| {
            format!(
                "{:?} x{:?}: {}",
                e.event_time.map(|t| t.0),
                e.series.map(|s| s.count),
                e.note.unwrap_or_default()
            )
        })
        .collect())
}

/// The local cluster's run directory (`make cluster-up`), from the kubeconfig it wrote there.
fn local_cluster_dir() -> Result<PathBuf> {
    let kubeconfig = PathBuf::from(std::env::var_os("KUBECONFIG").ok_or("KUBECONFIG is not set")?);
    let dir = kubeconfig
        .parent()
        .ok_or("KUBECONFIG has no directory")?
        .to_path_buf();
    if !dir.join("pids/kube-apiserver.pid").is_file() {
        return Err(format!(
            "{} is not a local cluster of `make cluster-up` (no pids/kube-apiserver.pid): this test restarts its kube-apiserver",
            dir.display()
        )
        .into());
    }
    Ok(dir)
}

/// Kills the local cluster's kube-apiserver and starts it again with the same command
/// line and environment, recording the new pid where `make cluster-down` finds it.
async fn restart_apiserver(dir: &std::path::Path) -> Result<Duration> {
    let pid_file = dir.join("pids/kube-apiserver.pid");
    let record = std::fs::read_to_string(&pid_file)?;
    let pid: i32 = record
        .split_whitespace()
        .next()
        .ok_or("empty pid file")?
        .parse()?;
    let split = |bytes: Vec<u8>| -> Vec<String> {
        bytes
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    };
    let argv = split(std::fs::read(format!("/proc/{pid}/cmdline"))?);
    let environ = split(std::fs::read(format!("/proc/{pid}/environ"))?);
    let (program, args) = argv.split_first().ok_or("empty command line")?;
    let stopped = Instant::now();
    // SIGKILL: a crash, every watch cut at once (SIGTERM drains them for up to a minute).
    Command::new("kill").args(["-KILL", &pid.to_string()]).status()?;
    // Gone, or a zombie nobody reaps yet whose threads are all gone: a thread-group leader shows
    // Z as soon as it exits, while its other threads may still hold the listening socket (a
    // restart then fails with "address already in use").
    poll_until("kube-apiserver to exit", Duration::from_secs(60), || async {
        let proc = format!("/proc/{pid}");
        if !std::path::Path::new(&proc).exists() {
            return Ok(true);
        }
        let zombie = std::fs::read_to_string(format!("{proc}/stat")).is_ok_and(|s| s.contains(") Z "));
        let threads = std::fs::read_dir(format!("{proc}/task")).map_or(0, |d| d.count());
        Ok(zombie && threads <= 1)
    })
    .await?;
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("logs/kube-apiserver.log"))?;
    let child = Command::new(program)
        .args(args)
        .env_clear()
        .envs(environ.iter().filter_map(|kv| kv.split_once('=')))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()?;
    let mut file = std::fs::File::create(&pid_file)?;
    writeln!(file, "{} {program}", child.id())?;
    Ok(stopped.elapsed())
}

/// The kube-apiserver of the local cluster restarts under a running operator: its watches
/// resume (a DGD edited afterwards is rendered, a policy keeps ticking) and nothing is done
/// twice (the graph's generation and the Scaled Events stay as they were while the decision
/// is unchanged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the local cluster's kube-apiserver: tools/e2e.sh runs it alone, on that cluster only"]
async fn an_apiserver_restart_resumes_the_watches_and_repeats_nothing() -> Result<()> {
    let dir = local_cluster_dir()?;
    in_namespace("apiserver-restart", |ns| async move {
        install_crds(&ns.client).await?;
        let prometheus = FakePrometheus::start(MODEL).await?;
        let policies: Api<PlannerPolicy> = ns.api();
        let dgds: Api<DynamoGraphDeployment> = ns.api();
        let deployments: Api<Deployment> = ns.api();
        create_graph(&ns, "llama", 1).await?;
        let operator = start(&ns, &["--webhook-disabled"]).await?;
        let outcome = async {
            policies
                .create(
                    &PostParams::default(),
                    &policy("llama", "llama", &prometheus.url)?,
                )
                .await?;
            let desired = |policy: &PlannerPolicy| {
                let desired = policy.status.as_ref()?.desired.as_ref()?;
                Some((desired.prefill, desired.decode))
            };
            // Settled: the same decision over three ticks, applied to the graph (the first ticks
            // plan with a cold-start margin).
            let history = Mutex::new(Vec::<(String, (i32, i32))>::new());
            poll_until(
                "the same decision three ticks running, applied",
                Duration::from_secs(180),
                || async {
                    let policy = policies.get("llama").await?;
                    let (Some(tick), Some(decision)) = (last_tick(&policy), desired(&policy)) else {
                        return Ok(false);
                    };
                    let (prefill, decode) = replicas(&dgds.get("llama").await?);
                    let mut history = history.lock().map_err(|_| "lock")?;
                    if history.last().is_none_or(|(last, _)| *last != tick) {
                        history.push((tick, decision));
                    }
                    let recent: Vec<_> = history.iter().rev().take(3).map(|(_, d)| *d).collect();
                    Ok(recent.len() == 3
                        && recent.iter().all(|d| *d == decision)
                        && (prefill, decode) == (Some(decision.0), Some(decision.1)))
                },
            )
            .await?;
            let decision = desired(&policies.get("llama").await?).ok_or("no decision")?;
            assert_ne!(
                decision,
                (1, 1),
                "the fake load should need more than one replica per pool"
            );
            // The latest Scaled Event says what the graph runs now.
            let notes = scaled_notes(&ns).await?;
            let latest = notes.last().ok_or("no Scaled Event")?;
            assert!(
                latest.contains(&format!("-> {}, decode", decision.0))
                    && latest.contains(&format!("-> {}:", decision.1)),
                "the latest Scaled Event does not name the decision {decision:?}: {notes:#?}"
            );
            let scaled_events = || async {
                let events: Api<Event> = ns.api();
                Ok::<_, e2e::Error>(
                    events
                        .list(&ListParams::default())
                        .await?
                        .items
                        .iter()
                        .filter(|e| e.reason.as_deref() == Some("Scaled"))
                        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
                        .sum::<i32>(),
                )
            };
            let generation = dgds.get("llama").await?.metadata.generation;
            let scaled = scaled_events().await?;
            let tick_before = last_tick(&policies.get("llama").await?);

            let down = restart_apiserver(&dir).await?;
            let answering = poll_until(
                "the kube-apiserver to answer again",
                Duration::from_secs(120),
                || async {
                    Ok(ns.client.apiserver_version().await.is_ok() && dgds.get("llama").await.is_ok())
                },
            )
            .await;
            if let Err(error) = answering {
                // Say why: the end of the restarted apiserver's log.
                let log = std::fs::read_to_string(dir.join("logs/kube-apiserver.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                return Err(format!("{error}; the end of its log:\n{}", tail.join("\n")).into());
            }
            eprintln!("kube-apiserver stopped and answering again; it took {down:?} to stop");

            // The policy keeps ticking: two intervals after the restart, with the graph as it was.
            let ticks = Mutex::new(Vec::new());
            poll_until("two ticks after the restart", WAIT, || async {
                let policy = policies.get("llama").await?;
                let mut ticks = ticks.lock().map_err(|_| "lock")?;
                if let Some(tick) =
                    last_tick(&policy).filter(|t| Some(t) != tick_before.as_ref() && !ticks.contains(t))
                {
                    ticks.push(tick);
                }
                Ok(ticks.len() >= 2)
            })
            .await?;
            let dgd = dgds.get("llama").await?;
            let writers: Vec<String> = dgd
                .metadata
                .managed_fields
                .iter()
                .flatten()
                .map(|m| format!("{:?} {:?} {:?}", m.manager, m.operation, m.time))
                .collect();
            assert_eq!(
                dgd.metadata.generation,
                generation,
                "the graph's spec was written again: {writers:#?}; events {:#?}",
                scaled_notes(&ns).await?
            );
            assert_eq!(replicas(&dgd), (Some(decision.0), Some(decision.1)));
            assert_eq!(scaled_events().await?, scaled, "a Scaled Event after the restart");

            // The DGD watch resumed: a new frontend replica count (a pool the planner leaves
            // alone) is rendered into its Deployment.
            let index = dgd
                .spec
                .components
                .iter()
                .position(|c| c.name == "frontend")
                .ok_or("no frontend component")?;
            let patch =
                json!([{"op": "replace", "path": format!("/spec/components/{index}/replicas"), "value": 3}]);
            dgds.patch(
                "llama",
                &PatchParams::default(),
                &Patch::<Value>::Json(serde_json::from_value(patch)?),
            )
            .await?;
            poll_until("three replicas in the frontend Deployment", WAIT, || async {
                let deployment = deployments.get_opt("llama-frontend").await?;
                Ok(deployment.and_then(|d| d.spec?.replicas) == Some(3))
            })
            .await?;
            operator.check_running()
        }
        .await;
        let stopped = operator.stop().await;
        outcome.and(stopped)
    })
    .await
}

/// A Prometheus that wants a bearer token: the policy whose Secret holds it observes and scales,
/// follows a rotation of the token, and a policy whose Secret is missing says so and keeps its
/// replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_token_from_a_secret_reaches_prometheus_and_a_rotation_is_followed() -> Result<()> {
    in_namespace("prometheus-token", |ns| async move {
        install_crds(&ns.client).await?;
        let prometheus = FakePrometheus::start_with_token(MODEL, Some("first-token")).await?;
        let secrets: Api<Secret> = ns.api();
        let secret = |token: &str| -> Result<Secret> {
            Ok(serde_json::from_value(json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "prometheus-token"},
                "stringData": {"token": format!("{token}\n")}
            }))?)
        };
        secrets
            .create(&PostParams::default(), &secret("first-token")?)
            .await?;
        create_graph(&ns, "with-token", 1).await?;
        create_graph(&ns, "missing-secret", 2).await?;
        let operator = start(&ns, &["--webhook-disabled", "--prometheus-token-secrets"]).await?;
        let policies: Api<PlannerPolicy> = ns.api();
        let dgds: Api<DynamoGraphDeployment> = ns.api();
        let outcome = async {
            let with_secret = |name: &str, graph: &str, secret: &str| -> Result<PlannerPolicy> {
                let mut policy = policy(name, graph, &prometheus.url)?;
                policy.spec.metrics.prometheus.bearer_token_secret = Some(planner_api::SecretKeyRef {
                    name: secret.into(),
                    key: "token".into(),
                });
                Ok(policy)
            };
            let create = PostParams::default();
            policies
                .create(
                    &create,
                    &with_secret("with-token", "with-token", "prometheus-token")?,
                )
                .await?;
            policies
                .create(&create, &with_secret("missing-secret", "missing-secret", "nope")?)
                .await?;
            poll_until("the policy with the token scales out", WAIT, || async {
                let policy = policies.get("with-token").await?;
                let available = condition(&policy, "MetricsAvailable").is_some_and(|(s, _)| s == "True");
                let (prefill, _) = replicas(&dgds.get("with-token").await?);
                Ok(available && prefill.is_some_and(|p| p > 1))
            })
            .await?;
            assert!(prometheus.queries_with("first-token") > 0);
            poll_until("the missing Secret is reported", WAIT, || async {
                let policy = policies.get("missing-secret").await?;
                Ok(
                    condition(&policy, "MetricsAvailable").is_some_and(|(status, message)| {
                        status == "False"
                            && message.contains(
                                "spec.metrics.prometheus.bearerTokenSecret: Secret \"nope\" not found",
                            )
                    }),
                )
            })
            .await?;
            assert_eq!(
                replicas(&dgds.get("missing-secret").await?),
                (Some(2), Some(2)),
                "scaled without metrics"
            );
            // Rotation: Prometheus wants the new token at once; the next interval sends it.
            prometheus.require_token("second-token");
            secrets
                .replace(
                    "prometheus-token",
                    &PostParams::default(),
                    &secret("second-token")?,
                )
                .await?;
            poll_until("queries with the rotated token", WAIT, || async {
                Ok(prometheus.queries_with("second-token") > 0)
            })
            .await?;
            let before = last_tick(&policies.get("with-token").await?);
            poll_until("a tick with metrics after the rotation", WAIT, || async {
                let policy = policies.get("with-token").await?;
                Ok(last_tick(&policy) != before
                    && condition(&policy, "MetricsAvailable").is_some_and(|(s, _)| s == "True"))
            })
            .await?;
            operator.check_running()
        }
        .await;
        let stopped = operator.stop().await;
        outcome.and(stopped)
    })
    .await
}
