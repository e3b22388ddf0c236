//! The test bed (`planner-sim dynamo-bed`) for the closed-loop tests: NVIDIA Dynamo's real
//! frontend and one real mocker engine per Ready prefill and decode pod of the test's graph, a
//! load generator replaying a request trace against the frontend, and the Prometheus
//! configuration that scrapes them as the chart's `dynamoPodMonitors` scrape the pods. `make
//! e2e` installs Dynamo (`make dynamo`) and names its Python and model directory in
//! `DYNAMO_PYTHON` and `DYNAMO_MODEL_DIR`, which the bed reads.
//!
//! The bed's processes take CPU, and the closed-loop tests measure latency: one bed runs at a
//! time ([`Bed::start`] waits for the previous one to stop).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use e2e::{Result, TestNamespace, repo_root, sim_binary};
use serde_json::{Value, json};
use tokio::sync::{Mutex, MutexGuard};

use crate::{operator::Operator, prometheus::Prometheus};

/// The served model name and the profile that times the engines and that the policies plan with
/// (as `make demo`: config/demo/).
pub(crate) const MODEL: &str = "llama-3.1-8b";
pub(crate) const PROFILE: &str = "h200-llama3.1-8b-tp1";

static ONE_BED: Mutex<()> = Mutex::const_new(());

/// A running bed; SIGTERM on drop (it stops its processes), SIGKILL if it outstays 30 s.
pub(crate) struct Bed {
    child: Child,
    dir: PathBuf,
    /// Its status and control address, host:port.
    pub(crate) control: String,
    /// The Prometheus configuration it wrote.
    pub(crate) prometheus_config: PathBuf,
    /// Keep its work directory (logs of every process) when it stops.
    keep: bool,
    _turn: MutexGuard<'static, ()>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// A Mooncake trace of `seconds` seconds at `rate` requests per second (evenly spaced with a
/// deterministic jitter), prompts of 8,000-16,000 tokens and 100-200 output tokens, as the demo's.
pub(crate) fn write_trace(path: &Path, rate: f64, seconds: f64) -> Result<()> {
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut unit = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut lines = String::new();
    let mut t = 0.0;
    while t < seconds {
        let arrival = t + unit() / rate;
        lines.push_str(&format!(
            "{{\"timestamp\": {:.0}, \"input_length\": {:.0}, \"output_length\": {:.0}}}\n",
            arrival * 1000.0,
            8000.0 + 8000.0 * unit(),
            100.0 + 100.0 * unit()
        ));
        t += 1.0 / rate;
    }
    std::fs::write(path, lines)?;
    Ok(())
}

/// The demo's graph (config/demo/dgd-demo.yaml) as `name`: it sets nothing for metrics, so the
/// bed scrapes what the operator renders.
pub(crate) fn graph(name: &str) -> Result<Value> {
    let mut value: Value = serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join("config/demo/dgd-demo.yaml"),
    )?)?;
    value["metadata"]["name"] = json!(name);
    Ok(value)
}

/// The release name of the chart whose PodMonitors the bed scrapes as.
pub(crate) const RELEASE: &str = "e2e";

/// Starts the bed for graph `dgd` (as [`Bed::start`], scraped every second) and a Prometheus
/// with its configuration, beside `operator`, which renders the pods the bed plays. When either
/// fails to start, stops the operator and returns the error.
pub(crate) async fn start_with_prometheus(
    ns: &TestNamespace,
    dgd: &str,
    trace: &Path,
    extra: &[&str],
    operator: Operator,
) -> Result<(Operator, Bed, Prometheus)> {
    let started = async {
        let bed = Bed::start(ns, dgd, trace, 1, extra).await?;
        let prometheus = Prometheus::start_with_config(&bed.prometheus_config).await?;
        Ok::<_, e2e::Error>((bed, prometheus))
    }
    .await;
    match started {
        Ok((bed, prometheus)) => Ok((operator, bed, prometheus)),
        Err(error) => {
            let _ = operator.stop().await;
            Err(error)
        }
    }
}

/// Ends a test of [`start_with_prometheus`]: stops the operator, keeps the bed's logs when the
/// test failed and removes its scratch directory `dir` when it passed, stops Prometheus, then
/// the bed. The test's result first, then the operator's stop.
pub(crate) async fn finish(
    operator: Operator,
    mut bed: Bed,
    prometheus: Prometheus,
    dir: &Path,
    outcome: Result<()>,
) -> Result<()> {
    let stopped = operator.stop().await;
    if outcome.is_err() {
        bed.keep_logs();
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
    drop(prometheus);
    drop(bed);
    outcome.and(stopped)
}

impl Bed {
    /// Starts the bed for graph `dgd` in the test's namespace, replaying `trace` in a loop from
    /// the moment the frontend serves the model; Prometheus scrapes every `scrape_s` seconds.
    /// `extra` are more `dynamo-bed` flags. Returns once the trace runs.
    pub(crate) async fn start(
        ns: &TestNamespace,
        dgd: &str,
        trace: &Path,
        scrape_s: u32,
        extra: &[&str],
    ) -> Result<Self> {
        let turn = ONE_BED.lock().await;
        for var in ["DYNAMO_PYTHON", "DYNAMO_MODEL_DIR"] {
            if std::env::var_os(var).is_none() {
                return Err(format!(
                    "{var} is not set: run the closed-loop tests through `make e2e`, which installs Dynamo (`make dynamo`) and sets it"
                )
                .into());
            }
        }
        let dir = std::env::temp_dir().join(format!("e2e-bed-{}-{}", ns.name, free_port()));
        std::fs::create_dir_all(&dir)?;
        let control = format!("127.0.0.1:{}", free_port());
        let prometheus_config = dir.join("prometheus.yml");
        // The chart's dynamoPodMonitors, installed in the test's namespace for its pods: what a
        // cluster without NVIDIA's Dynamo operator scrapes the operator's pods with.
        let pod_monitors = dir.join("podmonitors.yaml");
        let rendered = e2e::chart::helm(&[
            "template",
            RELEASE,
            e2e::chart::chart_dir().to_str().ok_or("chart path")?,
            "--namespace",
            &ns.name,
            "--set",
            "dynamoPodMonitors.enabled=true",
            "--set",
            &format!("dynamoPodMonitors.namespaces={{{}}}", ns.name),
            "--show-only",
            "templates/dynamo-podmonitors.yaml",
        ])
        .await?;
        std::fs::write(&pod_monitors, rendered)?;
        let log = std::fs::File::create(dir.join("bed.log"))?;
        let child = Command::new(sim_binary())
            .args([
                "dynamo-bed",
                "--dgd",
                dgd,
                "--namespace",
                &ns.name,
                "--model",
                MODEL,
                "--profile",
                PROFILE,
            ])
            .arg("--workdir")
            .arg(&dir)
            .arg("--trace")
            .arg(trace)
            .args(["--loop", "--listen", &control, "--stop-grace-s", "10"])
            .arg("--prometheus-config")
            .arg(&prometheus_config)
            .arg("--pod-monitors")
            .arg(&pod_monitors)
            .args(["--scrape-interval-s", &scrape_s.to_string()])
            .args(extra)
            .env("RUST_LOG", "planner_sim=info,warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start the test bed (make e2e builds planner-sim): {e}"))?;
        let mut bed = Self {
            child,
            dir,
            control,
            prometheus_config,
            keep: false,
            _turn: turn,
        };
        let started = Instant::now();
        loop {
            if let Some(status) = bed.child.try_wait()? {
                return Err(format!("the test bed exited ({status})\n{}", bed.log_tail()).into());
            }
            if bed.status().await.is_ok_and(|s| s["load"]["started"] == true) {
                break;
            }
            if started.elapsed() > Duration::from_secs(120) {
                return Err(format!(
                    "the bed's frontend did not serve the model within 120 s\n{}",
                    bed.log_tail()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!(
            "test bed serving after {:?} ({})",
            started.elapsed(),
            bed.dir.display()
        );
        Ok(bed)
    }

    /// Prints the end of its log and keeps its work directory (the log of every Dynamo
    /// process), for a failed test.
    pub(crate) fn keep_logs(&mut self) {
        eprintln!(
            "{}\nthe test bed's work directory is kept: {}",
            self.log_tail(),
            self.dir.display()
        );
        self.keep = true;
    }

    /// The end of its log, for failures.
    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("bed.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "--- last lines of {}/bed.log ---\n{}",
            self.dir.display(),
            lines[lines.len().saturating_sub(30)..].join("\n")
        )
    }

    /// Its `/status`.
    pub(crate) async fn status(&self) -> Result<Value> {
        let (code, body) = e2e::http_get(self.control.parse()?, "/status").await?;
        if code != 200 {
            return Err(format!("/status answered {code}").into());
        }
        Ok(serde_json::from_str(&body)?)
    }

    /// The address of the (first) running frontend.
    pub(crate) async fn frontend(&self) -> Result<SocketAddr> {
        let status = self.status().await?;
        let address = status["processes"]
            .as_array()
            .and_then(|list| {
                list.iter()
                    .find(|p| p["role"] == "frontend" && p["state"] == "running")
            })
            .and_then(|p| p["address"].as_str())
            .ok_or("no running frontend")?;
        Ok(address.parse()?)
    }

    /// Sets the load's rate scale.
    pub(crate) async fn rate_scale(&self, k: f64) -> Result<()> {
        let addr = self.control.clone();
        let request =
            format!("POST /control/rate-scale/{k} HTTP/1.0\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
        let response = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
            use std::io::{Read, Write};
            let mut stream = std::net::TcpStream::connect(addr)?;
            stream.write_all(request.as_bytes())?;
            let mut response = String::new();
            stream.read_to_string(&mut response)?;
            Ok(response)
        })
        .await??;
        if response.starts_with("HTTP/1.0 2") || response.starts_with("HTTP/1.1 2") {
            Ok(())
        } else {
            Err(format!(
                "rate-scale request failed: {}",
                response.lines().next().unwrap_or_default()
            )
            .into())
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        // SIGTERM: the bed stops its Dynamo processes (SIGTERM, then SIGKILL) before it exits.
        if let Some(pid) = i32::try_from(self.child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                if self.keep || std::thread::panicking() {
                    eprintln!("the test bed's work directory is kept: {}", self.dir.display());
                } else {
                    let _ = std::fs::remove_dir_all(&self.dir);
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "the test bed did not stop within 30 s: killing it\n{}",
            self.log_tail()
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
