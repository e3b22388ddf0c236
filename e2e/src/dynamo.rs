//! NVIDIA Dynamo's real frontend and mocker engines as local processes (the ones `make dynamo`
//! installs; `make e2e` names them in `DYNAMO_PYTHON` and `DYNAMO_MODEL_DIR`), with file
//! discovery in a directory of their own and the request plane on loopback: no etcd, no NATS.
//! Workers get the runtime namespaces NVIDIA's operator sets (`DYN_NAMESPACE` plus a worker
//! suffix), and a load generator sends OpenAI chat requests of given prompt and output lengths
//! (the test model's tokenizer makes one word one token).

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::{Result, http_get, poll_until};

/// The Python of Dynamo's virtual environment and the test model it serves.
fn installed() -> Result<(PathBuf, PathBuf)> {
    let get = |name: &str| {
        std::env::var_os(name).map(PathBuf::from).ok_or_else(|| {
            format!("{name} is not set: `make e2e` sets it after `make dynamo` installs Dynamo")
        })
    };
    Ok((get("DYNAMO_PYTHON")?, get("DYNAMO_MODEL_DIR")?))
}

/// The model name the engines register and the frontend serves.
pub const MODEL: &str = "tiny-model";

/// Which half of a disaggregated graph an engine serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Prefill engine.
    Prefill,
    /// Decode engine.
    Decode,
    /// Aggregated engine (an aggregated graph's `type: worker`): prefill and decode alike.
    Aggregated,
}

impl Mode {
    /// `--disaggregation-mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prefill => "prefill",
            Self::Decode => "decode",
            Self::Aggregated => "agg",
        }
    }

    /// The component type of the engine's pods (`nvidia.com/dynamo-component-type`).
    pub fn component_type(self) -> &'static str {
        match self {
            Self::Aggregated => "worker",
            other => other.as_str(),
        }
    }
}

/// One mocker engine to start.
#[derive(Clone, Debug)]
pub struct Engine {
    /// Prefill or decode.
    pub mode: Mode,
    /// `--speedup-ratio`: below 1 the engine is slower than its timing model.
    pub speedup: f64,
    /// `--num-gpu-blocks-override` (16-token blocks).
    pub kv_blocks: u32,
    /// `--planner-profile-data`: a mocker-format NPZ (`planner-sim mocker-profile`), else the
    /// mocker's own timing model.
    pub profile: Option<PathBuf>,
}

impl Engine {
    /// An engine of `mode` with the mocker's timing model at real speed and 1,024 blocks.
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            speedup: 1.0,
            kv_blocks: 1024,
            profile: None,
        }
    }
}

/// A running process, its log, and (for engines) the port of its system server.
struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    fn stop(&mut self) {
        // SIGTERM first, as Kubernetes stops a pod; SIGKILL if it lingers.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..50 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A frontend and its engines; stopped (and their directory removed) on drop.
pub struct Bed {
    dir: PathBuf,
    frontend: Process,
    engines: Vec<(Engine, Process, u16)>,
    /// The frontend's `host:port` (OpenAI API and `/metrics`).
    pub frontend_addr: String,
    /// The graph's Dynamo namespace (`DYN_NAMESPACE`).
    pub dynamo_namespace: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// The suffix NVIDIA's operator gives a worker generation (eight hex digits of its spec hash).
pub const WORKER_SUFFIX: &str = "a1b2c3d4";

impl Bed {
    /// Starts the frontend (extra `frontend_args`, e.g. `--router-mode kv`) and `engines` for
    /// the graph `dynamo_namespace`, and waits until the frontend serves the model with every
    /// engine registered.
    pub async fn start(dynamo_namespace: &str, frontend_args: &[&str], engines: &[Engine]) -> Result<Self> {
        let (python, model_dir) = installed()?;
        let dir = std::env::temp_dir().join(format!("e2e-dynamo-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(dir.join("discovery"))?;
        let base_env = |command: &mut Command| {
            command
                .env("DYN_DISCOVERY_BACKEND", "file")
                .env("DYN_FILE_KV", dir.join("discovery"))
                .env("DYN_REQUEST_PLANE", "tcp")
                .env("DYN_TCP_RPC_HOST", "127.0.0.1")
                .env("HF_HUB_OFFLINE", "1")
                // Dynamo copies the model card files under $HOME/.cache: keep them in the bed.
                .env("HOME", &dir)
                .env("DYN_NAMESPACE", dynamo_namespace);
        };
        let port = free_port();
        let log = dir.join("frontend.log");
        let mut command = Command::new(&python);
        command
            .args(["-m", "dynamo.frontend", "--http-port", &port.to_string()])
            .args(["--discovery-backend", "file", "--request-plane", "tcp"])
            .args(frontend_args)
            .env("DYN_LOG", "warn")
            .env("DYN_NAMESPACE_PREFIX", dynamo_namespace);
        base_env(&mut command);
        let frontend = spawn(command, &log)?;
        let mut bed = Self {
            dir: dir.clone(),
            frontend: Process { child: frontend, log },
            engines: Vec::new(),
            frontend_addr: format!("127.0.0.1:{port}"),
            dynamo_namespace: dynamo_namespace.to_string(),
        };
        for (i, engine) in engines.iter().enumerate() {
            let log = dir.join(format!("engine-{i}-{}.log", engine.mode.as_str()));
            let mut command = Command::new(&python);
            command
                .args(["-m", "dynamo.mocker", "--model-path"])
                .arg(&model_dir)
                .args([
                    "--model-name",
                    MODEL,
                    "--disaggregation-mode",
                    engine.mode.as_str(),
                ])
                .args(["--speedup-ratio", &engine.speedup.to_string()])
                .args([
                    "--block-size",
                    "16",
                    "--num-gpu-blocks-override",
                    &engine.kv_blocks.to_string(),
                ])
                .args(["--discovery-backend", "file", "--request-plane", "tcp"])
                .env("DYN_NAMESPACE_WORKER_SUFFIX", WORKER_SUFFIX)
                // The system server's port must fit an i16 in Dynamo 1.6.1 (above 32767 it
                // exits): port 0, and the bound port read from the log.
                .env("DYN_SYSTEM_PORT", "0")
                .env("DYN_SYSTEM_HOST", "127.0.0.1")
                .env("DYN_SYSTEM_STARTING_HEALTH_STATUS", "ready")
                .env("DYN_LOG", "info");
            if let Some(profile) = &engine.profile {
                command.arg("--planner-profile-data").arg(profile);
            }
            base_env(&mut command);
            let child = spawn(command, &log)?;
            let mut process = Process { child, log };
            let port = match system_port(&mut process).await {
                Ok(port) => port,
                Err(error) => {
                    process.stop();
                    return Err(error);
                }
            };
            bed.engines.push((engine.clone(), process, port));
        }
        bed.wait_registered().await?;
        Ok(bed)
    }

    /// Waits until the frontend lists the model with every engine as an instance.
    async fn wait_registered(&mut self) -> Result<()> {
        let addr: std::net::SocketAddr = self.frontend_addr.parse()?;
        let engines = self.engines.len();
        let result = poll_until(
            "the frontend to register every engine",
            Duration::from_secs(90),
            || async move {
                let (status, body) = http_get(addr, "/health").await?;
                let health: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                let generate = health["instances"]
                    .as_array()
                    .map(|i| i.iter().filter(|i| i["endpoint"] == "generate").count())
                    .unwrap_or(0);
                let (_, models) = http_get(addr, "/v1/models").await?;
                Ok(status == 200 && generate >= engines && models.contains(MODEL))
            },
        )
        .await;
        result.map_err(|e| format!("{e}; frontend log:\n{}", tail(&self.frontend.log)).into())
    }

    /// `host:port` of each engine's `/metrics`, with its mode.
    pub fn engine_targets(&self) -> Vec<(Mode, String)> {
        self.engines
            .iter()
            .map(|(engine, _, port)| (engine.mode, format!("127.0.0.1:{port}")))
            .collect()
    }

    /// The frontend's `/metrics` text now.
    pub async fn frontend_metrics(&self) -> Result<String> {
        let (status, body) = http_get(self.frontend_addr.parse()?, "/metrics").await?;
        if status != 200 {
            return Err(format!("frontend /metrics answered {status}").into());
        }
        Ok(body)
    }

    /// The `/metrics` text of the first engine of `mode` now.
    pub async fn engine_metrics(&self, mode: Mode) -> Result<String> {
        let (_, target) = self
            .engine_targets()
            .into_iter()
            .find(|(m, _)| *m == mode)
            .ok_or("no such engine")?;
        let (_, body) = http_get(target.parse()?, "/metrics").await?;
        Ok(body)
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for (_, process, _) in &mut self.engines {
            process.stop();
        }
        self.frontend.stop();
        if std::env::var_os("E2E_KEEP_DYNAMO").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn spawn(mut command: Command, log: &std::path::Path) -> Result<Child> {
    let out = std::fs::File::create(log)?;
    Ok(command
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .map_err(|e| format!("cannot start {command:?}: {e}"))?)
}

/// The last lines of a log.
fn tail(log: &std::path::Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// The port an engine's system server bound, from its log (`DYN_SYSTEM_PORT=0`).
async fn system_port(process: &mut Process) -> Result<u16> {
    const MARK: &str = "system status server bound to: ";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(&process.log).unwrap_or_default();
        if let Some(port) = text
            .lines()
            .find_map(|line| line.split_once(MARK))
            .and_then(|(_, addr)| {
                addr.trim()
                    .rsplit(':')
                    .next()?
                    .trim_end_matches(|c: char| !c.is_ascii_digit())
                    .parse()
                    .ok()
            })
        {
            return Ok(port);
        }
        if let Ok(Some(status)) = process.child.try_wait() {
            return Err(format!("the engine exited ({status}):\n{}", tail(&process.log)).into());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "the engine's system server did not start:\n{}",
                tail(&process.log)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One request of a load: prompt and output lengths in tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Request {
    /// Seconds after the load starts.
    pub at_s: f64,
    /// Prompt words (tokens, with the test model's tokenizer).
    pub isl: u32,
    /// `max_tokens`, generated in full (`ignore_eos`).
    pub osl: u32,
}

/// A prompt of `words` words, different for every `seed` (so no two prompts share a prefix).
fn prompt(words: u32, seed: u64) -> String {
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..words)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            format!("w{}", (state >> 33) % 30_000)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Sends one streaming chat completion and reads it to the end; `Ok(true)` on HTTP 200.
pub async fn send(addr: &str, request: Request, seed: u64) -> Result<bool> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt(request.isl, seed)}],
        "max_tokens": request.osl,
        "ignore_eos": true,
        "stream": true,
    })
    .to_string();
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    Ok(response.starts_with(b"HTTP/1.1 200"))
}

/// Sends `requests` at their times (from now); the number that failed.
pub async fn replay(addr: &str, requests: &[Request]) -> usize {
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for (i, request) in requests.iter().copied().enumerate() {
        tokio::time::sleep_until(start + Duration::from_secs_f64(request.at_s.max(0.0))).await;
        let addr = addr.to_string();
        tasks.push(tokio::spawn(async move { send(&addr, request, i as u64).await }));
    }
    let mut failed = 0;
    for task in tasks {
        if !matches!(task.await, Ok(Ok(true))) {
            failed += 1;
        }
    }
    failed
}

/// A sample's value in a Prometheus text exposition: the first line of `name` whose labels
/// include every `labels` pair.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
        (metric == name && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse().ok())
            .flatten()
    })
}
