//! The synthetic frontend (`planner-sim synthetic-frontend`, used where real engines are too
//! slow to run: fast tests, the 1,000-policy benchmark) against NVIDIA Dynamo 1.6.1's own
//! frontend and mocker engines, both timed by the same profile and given the same requests,
//! both scraped by one real Prometheus: the synthetic one must export what the planner reads
//! under the real names, types, label names and bucket bounds, create its series when the real
//! one does, and give the operator's queries the same answers. Needs no cluster.

use std::{
    collections::{BTreeMap, BTreeSet},
    process::{Child, Command, Stdio},
    time::Duration,
};

use e2e::{
    Result,
    dynamo::{self, Bed, Engine, MODEL, Mode, Request},
    poll_until, sim_binary,
};
use planner_core::profile::Profile;
use planner_operator::sources::prometheus::{
    KvUsageSource, PrometheusClient, Reading, SeriesFilter, served_models_query,
};
use planner_sim_engine::latency::EngineSpec;
use serde_json::Value;

use crate::prometheus::{Job, Prometheus, unix_now};

const PROFILE: &str = "h200-llama3.1-8b-tp1";
const REAL: &str = "conformance-real";
const SYNTHETIC: &str = "conformance-synthetic";
const IDLE: &str = "conformance-idle";

/// Labels a scrape adds, not the exporter.
const SCRAPE_LABELS: [&str; 5] = [
    "__name__",
    "job",
    "instance",
    "dynamo_namespace",
    "dynamo_component_type",
];

/// What the operator reads of a frontend (series names).
const READ: [&str; 14] = [
    "dynamo_frontend_requests_total",
    "dynamo_frontend_requests_started_total",
    "dynamo_frontend_time_to_first_token_seconds_count",
    "dynamo_frontend_inter_token_latency_seconds_count",
    "dynamo_frontend_request_duration_seconds_count",
    "dynamo_frontend_input_sequence_tokens_count",
    "dynamo_frontend_output_sequence_tokens_count",
    "dynamo_frontend_inflight_requests",
    "dynamo_frontend_active_requests",
    "dynamo_frontend_queued_requests",
    "dynamo_frontend_stage_requests",
    "dynamo_frontend_model_total_kv_blocks",
    "dynamo_frontend_model_ready",
    "dynamo_frontend_worker_active_decode_blocks",
];

/// The synthetic frontend, stopped on drop.
struct Synthetic {
    child: Child,
    addr: String,
}

impl Drop for Synthetic {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

fn synthetic(trace: &std::path::Path, rate_scale: f64) -> Result<Synthetic> {
    let addr = format!("127.0.0.1:{}", free_port());
    let child = Command::new(sim_binary())
        .args(["synthetic-frontend", "--trace"])
        .arg(trace)
        .args(["--profile", PROFILE, "--model", MODEL, "--listen", &addr])
        .args([
            "--prefill",
            "1",
            "--decode",
            "1",
            "--step-s",
            "0.05",
            "--jitter-s",
            "0",
        ])
        .args(["--rate-scale", &rate_scale.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the synthetic frontend (make e2e builds it): {e}"))?;
    Ok(Synthetic { child, addr })
}

/// Thirty requests over fifteen seconds, of 200 to 1,900 prompt and 20 to 110 output tokens.
fn requests() -> Vec<Request> {
    (0..30u32)
        .map(|i| Request {
            at_s: f64::from(i) * 0.5,
            isl: 200 + (i * 617) % 1700,
            osl: 20 + (i * 37) % 90,
        })
        .collect()
}

/// The same requests as an Azure 2023 CSV trace.
fn trace(requests: &[Request]) -> String {
    let mut text = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
    for r in requests {
        let ms = (r.at_s * 1000.0).round() as u64;
        text.push_str(&format!(
            "2023-11-16 18:00:{:02}.{:03}0000,{},{}\n",
            ms / 1000,
            ms % 1000,
            r.isl,
            r.osl
        ));
    }
    text
}

/// Every series of a job: name and label names (those the exporter sets), and label values.
async fn series(prometheus: &Prometheus, job: &str) -> Result<Vec<BTreeMap<String, String>>> {
    let addr = prometheus.url.trim_start_matches("http://").parse()?;
    let (_, body) = e2e::http_get(addr, &format!("/api/v1/series?match[]=%7Bjob%3D%22{job}%22%7D")).await?;
    let answer: Value = serde_json::from_str(&body)?;
    Ok(answer["data"]
        .as_array()
        .ok_or_else(|| format!("no series for {job}: {body}"))?
        .iter()
        .map(|s| {
            s.as_object()
                .map(|o| {
                    o.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect())
}

/// Series name -> the label names the exporter sets.
fn label_names(series: &[BTreeMap<String, String>]) -> BTreeMap<String, BTreeSet<String>> {
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in series {
        let entry = names.entry(s["__name__"].clone()).or_default();
        entry.extend(s.keys().filter(|k| !SCRAPE_LABELS.contains(&k.as_str())).cloned());
    }
    names
}

/// Histogram series name -> its `le` bounds.
fn bounds(series: &[BTreeMap<String, String>]) -> BTreeMap<String, BTreeSet<String>> {
    let mut bounds: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in series {
        if let Some(le) = s.get("le") {
            let value: f64 = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::NAN)
            };
            bounds
                .entry(s["__name__"].clone())
                .or_default()
                .insert(format!("{value}"));
        }
    }
    bounds
}

/// Metric name -> type, from Prometheus's metadata of a job's targets (a counter's family name
/// may be written with or without `_total`).
async fn types(prometheus: &Prometheus, job: &str) -> Result<BTreeMap<String, String>> {
    let addr = prometheus.url.trim_start_matches("http://").parse()?;
    let (_, body) = e2e::http_get(
        addr,
        &format!("/api/v1/targets/metadata?match_target=%7Bjob%3D%22{job}%22%7D"),
    )
    .await?;
    let answer: Value = serde_json::from_str(&body)?;
    Ok(answer["data"]
        .as_array()
        .ok_or_else(|| format!("no metadata for {job}: {body}"))?
        .iter()
        .filter_map(|m| {
            let name = m["metric"].as_str()?.trim_end_matches("_total").to_string();
            Some((name, m["type"].as_str()?.to_string()))
        })
        .collect())
}

/// The interval's observation of a graph.
async fn observe(
    client: &PrometheusClient,
    ns: &str,
    window_s: u64,
) -> Result<planner_core::sla::Observation> {
    let filter = SeriesFilter {
        dynamo_namespace: ns.into(),
        model: MODEL.into(),
    };
    match client.observe(&filter, window_s, 0.9).await? {
        Reading::Observed { observation, kv } => {
            assert_eq!(kv.map(|kv| kv.source), Some(KvUsageSource::Engines), "{ns}");
            Ok(*observation)
        }
        other => Err(format!("{ns}: expected an observation, got {other:?}").into()),
    }
}

/// The `READ` series a job has.
fn read(series: &[BTreeMap<String, String>]) -> BTreeSet<&'static str> {
    READ.into_iter()
        .filter(|name| series.iter().any(|s| s["__name__"] == *name))
        .collect()
}

#[tokio::test]
async fn the_synthetic_frontend_exports_what_the_real_one_does() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("e2e-conformance-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // The engines timed by the profile the synthetic frontend uses, with its KV cache.
    let npz = dir.join("profile.npz");
    let status = Command::new(sim_binary())
        .args(["mocker-profile", "--profile", PROFILE, "--out"])
        .arg(&npz)
        .stdout(Stdio::null())
        .status()?;
    assert!(status.success(), "planner-sim mocker-profile failed");
    let spec = EngineSpec::from_profile(&Profile::builtin(PROFILE)?);
    let engine = |mode| Engine {
        profile: Some(npz.clone()),
        kv_blocks: (spec.max_kv_tokens / 16.0).floor() as u32,
        ..Engine::new(mode)
    };
    let bed = Bed::start(REAL, &[], &[engine(Mode::Prefill), engine(Mode::Decode)]).await?;
    let trace_file = dir.join("trace.csv");
    std::fs::write(&trace_file, trace(&requests()))?;
    let idle = synthetic(&trace_file, 0.0)?;

    let ns = |graph: &str| ("dynamo_namespace".to_string(), graph.to_string());
    let decode = ("dynamo_component_type".to_string(), "decode".to_string());
    let mut jobs = vec![
        Job {
            name: "real-frontend".into(),
            targets: vec![bed.frontend_addr.clone()],
            path: "/metrics",
            labels: vec![ns(REAL)],
        },
        Job {
            name: "idle-frontend".into(),
            targets: vec![idle.addr.clone()],
            path: "/metrics",
            labels: vec![ns(IDLE)],
        },
    ];
    for (mode, target) in bed.engine_targets() {
        jobs.push(Job {
            name: format!("real-{}", mode.as_str()),
            targets: vec![target],
            path: "/metrics",
            labels: vec![ns(REAL), ("dynamo_component_type".into(), mode.as_str().into())],
        });
    }
    // The synthetic frontend starts replaying at once: it is scraped from a second Prometheus
    // job list started with it, below.
    let prometheus = Prometheus::start_jobs(&jobs, 1).await?;
    let client = PrometheusClient::new(&prometheus.url, Duration::from_secs(10))?;
    for graph in [REAL, IDLE] {
        poll_until(
            &format!("{graph}'s model gauges"),
            Duration::from_secs(60),
            || {
                let (client, query) = (&client, served_models_query(graph));
                async move { Ok(!client.query(&query).await?.is_empty()) }
            },
        )
        .await?;
    }
    // Every target scraped since (the engines' too): an absence below is then judged.
    prometheus.scraped_since(jobs.len(), unix_now(), 1).await?;

    // Before any request: the same of what the planner reads (the model's gauges only), and
    // no engine KV usage yet.
    let real_idle = series(&prometheus, "real-frontend").await?;
    let synthetic_idle = series(&prometheus, "idle-frontend").await?;
    assert_eq!(read(&synthetic_idle), read(&real_idle));
    assert_eq!(
        read(&real_idle),
        BTreeSet::from([
            "dynamo_frontend_model_total_kv_blocks",
            "dynamo_frontend_model_ready"
        ])
    );
    assert!(
        !series(&prometheus, "real-decode")
            .await?
            .iter()
            .any(|s| s["__name__"] == "vllm:kv_cache_usage_perc")
    );

    // The same requests to both.
    let loaded = synthetic(&trace_file, 1.0)?;
    let synthetic_prometheus = Prometheus::start_jobs(
        &[
            Job {
                name: "synthetic-frontend".into(),
                targets: vec![loaded.addr.clone()],
                path: "/metrics",
                labels: vec![ns(SYNTHETIC)],
            },
            Job {
                name: "synthetic-decode".into(),
                targets: vec![loaded.addr.clone()],
                path: "/engine/metrics",
                labels: vec![ns(SYNTHETIC), decode],
            },
        ],
        1,
    )
    .await?;
    assert_eq!(
        dynamo::replay(&bed.frontend_addr, &requests()).await,
        0,
        "requests failed"
    );
    // Both done (the synthetic frontend replays on its own clock), and scraped since.
    for (prometheus, graph) in [(&prometheus, REAL), (&synthetic_prometheus, SYNTHETIC)] {
        let query = format!("sum(dynamo_frontend_requests_total{{dynamo_namespace=\"{graph}\"}})");
        poll_until(
            &format!("{graph}'s requests done"),
            Duration::from_secs(60),
            || {
                let query = &query;
                async move {
                    let done = prometheus.query(query).await?;
                    Ok(done
                        .first()
                        .and_then(|s| s["value"][1].as_str()?.parse::<f64>().ok())
                        .is_some_and(|n| n >= requests().len() as f64))
                }
            },
        )
        .await?;
    }
    let done = unix_now();
    prometheus.scraped_since(jobs.len(), done, 1).await?;
    synthetic_prometheus.scraped_since(2, done, 1).await?;

    let real = series(&prometheus, "real-frontend").await?;
    let synthetic_series = series(&synthetic_prometheus, "synthetic-frontend").await?;
    let (real_labels, synthetic_labels) = (label_names(&real), label_names(&synthetic_series));
    // Every series the synthetic frontend exports, the real one does, with the same labels.
    for (name, labels) in &synthetic_labels {
        assert_eq!(real_labels.get(name), Some(labels), "{name}");
    }
    assert_eq!(read(&synthetic_series), read(&real));
    let real_bounds = bounds(&real);
    let synthetic_bounds = bounds(&synthetic_series);
    assert_eq!(synthetic_bounds.len(), 5, "{synthetic_bounds:?}");
    for (name, les) in &synthetic_bounds {
        assert_eq!(real_bounds.get(name), Some(les), "{name}");
    }
    let (real_types, synthetic_types) = (
        types(&prometheus, "real-frontend").await?,
        types(&synthetic_prometheus, "synthetic-frontend").await?,
    );
    for (name, kind) in &synthetic_types {
        assert_eq!(real_types.get(name), Some(kind), "{name}");
    }
    // The decode engines' KV usage: vLLM's gauge, with the mocker's labels (and the worker).
    let engine_labels = label_names(&series(&synthetic_prometheus, "synthetic-decode").await?);
    let real_engine = label_names(&series(&prometheus, "real-decode").await?);
    let kv = "vllm:kv_cache_usage_perc";
    let extra: BTreeSet<String> = engine_labels[kv].difference(&real_engine[kv]).cloned().collect();
    assert_eq!(extra, BTreeSet::from(["worker_id".to_string()]));
    assert_eq!(
        types(&synthetic_prometheus, "synthetic-decode").await?.get(kv),
        types(&prometheus, "real-decode").await?.get(kv)
    );

    // The operator's reads give the same load, and latencies of one profile.
    let real_read = observe(&client, REAL, 60).await?;
    let synthetic_client = PrometheusClient::new(&synthetic_prometheus.url, Duration::from_secs(10))?;
    let synthetic_read = observe(&synthetic_client, SYNTHETIC, 60).await?;
    println!("real:      {real_read:?}\nsynthetic: {synthetic_read:?}");
    for (what, real, synthetic) in [
        ("requests", real_read.num_req, synthetic_read.num_req),
        (
            "arrivals",
            real_read.arrivals.unwrap_or(f64::NAN),
            synthetic_read.arrivals.unwrap_or(f64::NAN),
        ),
        ("ISL", real_read.isl, synthetic_read.isl),
        ("OSL", real_read.osl, synthetic_read.osl),
    ] {
        assert!(
            (real - synthetic).abs() < 1e-6,
            "{what}: real {real}, synthetic {synthetic}"
        );
    }
    for (what, real, synthetic) in [
        ("TTFT", real_read.ttft_ms, synthetic_read.ttft_ms),
        ("ITL", real_read.itl_ms, synthetic_read.itl_ms),
    ] {
        let ratio = synthetic / real;
        assert!(
            (0.5..=2.0).contains(&ratio),
            "{what}: real {real} ms, synthetic {synthetic} ms"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
