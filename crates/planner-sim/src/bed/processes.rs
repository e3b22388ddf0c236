//! The bed's processes: one real Dynamo process per Ready pod of the graph (a frontend for a
//! frontend pod, a mocker engine in the pod's disaggregation mode for a prefill or decode pod),
//! started when the pod is Ready, restarted when it exits on its own (as a kubelet restarts a
//! container), and sent SIGTERM when the pod goes (deleted, or no longer Ready), then SIGKILL
//! after a grace period, as a pod's containers are.
//!
//! Each process runs in a process group of its own (the signals reach everything it starts)
//! through a short Python launcher that asks the kernel to send it SIGTERM if the bed dies, so a
//! bed killed without its cleanup leaves no engine running.

use std::{
    collections::BTreeMap,
    net::{SocketAddr, TcpListener},
    path::PathBuf,
    process::Stdio,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};
use planner_api::labels::{FRONTEND_PORT, MAIN_CONTAINER};
use serde::Serialize;
use serde_json::Value;
use tracing::{info, warn};

use super::scrape;

/// What a pod of the graph is to the bed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// `python -m dynamo.frontend`.
    Frontend,
    /// `python -m dynamo.mocker --disaggregation-mode prefill`.
    Prefill,
    /// `python -m dynamo.mocker --disaggregation-mode decode`.
    Decode,
    /// `python -m dynamo.mocker --disaggregation-mode agg`: an aggregated graph's lone
    /// `type: worker` engine, prefilling and decoding alike.
    Worker,
}

impl Role {
    /// The role of a pod of component type `component_type` (label
    /// `nvidia.com/dynamo-component-type`); other types are not played.
    pub fn of(component_type: &str) -> Option<Self> {
        match component_type {
            "frontend" => Some(Self::Frontend),
            "prefill" => Some(Self::Prefill),
            "decode" => Some(Self::Decode),
            "worker" => Some(Self::Worker),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Frontend => "frontend",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
            Self::Worker => "worker",
        }
    }

    /// The mocker's `--disaggregation-mode` for an engine of this role.
    fn mocker_mode(self) -> &'static str {
        match self {
            Self::Worker => "agg",
            other => other.as_str(),
        }
    }
}

/// A Ready pod the bed plays.
#[derive(Clone, Debug)]
pub struct Replica {
    /// The pod's uid (a replaced pod of the same name is another replica).
    pub uid: String,
    /// The pod's name.
    pub name: String,
    /// What it runs.
    pub role: Role,
    /// The pod: labels and ports for the scrape targets, env and args for the process.
    pub pod: Box<Pod>,
}

/// What every process of the bed shares.
#[derive(Clone, Debug)]
pub struct Launcher {
    /// The Python of the Dynamo virtual environment (`make dynamo`).
    pub python: PathBuf,
    /// The model directory the engines serve (config and tokenizer).
    pub model_dir: PathBuf,
    /// The served model name.
    pub model: String,
    /// The mocker-format NPZ file of the profile's latencies.
    pub profile_npz: PathBuf,
    /// KV-cache blocks of one engine (the profile's KV tokens / block size).
    pub kv_blocks: u64,
    /// KV-cache block size in tokens.
    pub block_size: u32,
    /// The mocker's `--speedup-ratio` (1: as fast as the profile).
    pub speedup_ratio: f64,
    /// Seconds from an engine pod being Ready to its process starting.
    pub startup: Duration,
    /// The file-discovery directory all processes share.
    pub discovery_dir: PathBuf,
    /// Where each process logs (`<pod>.log`).
    pub log_dir: PathBuf,
    /// `DYN_LOG` of every process.
    pub dynamo_log: String,
    /// Ports for engine system servers (Dynamo takes them as a signed 16-bit number).
    pub system_ports: (u16, u16),
    /// Seconds between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
}

/// Env variables passed from a pod's main container to its process: the Dynamo namespaces
/// NVIDIA's operator (or this one) sets, the frontend's request-migration limit and a worker's
/// shutdown grace period (what a scale-down does to requests in flight). The rest of a pod's env
/// is for the engine it names (vLLM, topology files on a volume) and has no meaning for a process
/// on this host.
const PASSED_ENV: [&str; 5] = [
    "DYN_NAMESPACE",
    "DYN_NAMESPACE_PREFIX",
    "DYN_NAMESPACE_WORKER_SUFFIX",
    "DYN_MIGRATION_LIMIT",
    "DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS",
];

/// Frontend flags the bed sets itself (with their value): where to listen and how to discover
/// the engines.
const BED_FRONTEND_FLAGS: [&str; 5] = [
    "--http-port",
    "--http-host",
    "--discovery-backend",
    "--request-plane",
    "--event-plane",
];

/// Makes the process ask for SIGTERM when its parent (the bed) dies, checks the parent is still
/// the bed, then runs `python -m <module> <args>` in its place. argv: bed pid, module, args.
const LAUNCHER: &str = "import ctypes, os, signal, sys\n\
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n\
if os.getppid() != int(sys.argv[1]):\n    sys.exit(0)\n\
os.execv(sys.executable, [sys.executable, '-m'] + sys.argv[2:])\n";

/// How a process is started.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandLine {
    /// `python -m` module.
    pub module: &'static str,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its environment (nothing else is inherited but PATH, HOME and the locale).
    pub env: Vec<(String, String)>,
    /// The container port number the process plays (the frontend's HTTP port, an engine's
    /// system port), if the pod has one.
    pub pod_port: Option<i32>,
}

fn main_container(pod: &Pod) -> Option<&Container> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == MAIN_CONTAINER)
}

fn literal_env<'a>(container: Option<&'a Container>, name: &str) -> Option<&'a str> {
    container?
        .env
        .iter()
        .flatten()
        .find(|e: &&EnvVar| e.name == name)
        .and_then(|e| e.value.as_deref())
}

/// The frontend's pod args without the flags the bed sets, and the HTTP port they name
/// (Dynamo's default when they name none).
fn frontend_args(args: &[String]) -> (Vec<String>, i32) {
    let mut kept = Vec::new();
    let mut port = FRONTEND_PORT;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag, Some(value.to_string())),
            None => (arg.as_str(), None),
        };
        if BED_FRONTEND_FLAGS.contains(&flag) {
            let value = inline.or_else(|| iter.next().cloned());
            if flag == "--http-port"
                && let Some(p) = value.and_then(|v| v.parse().ok())
            {
                port = p;
            }
        } else {
            kept.push(arg.clone());
        }
    }
    (kept, port)
}

impl Launcher {
    /// How `replica` is started, its system or HTTP server on `host_port`.
    pub fn command_line(&self, replica: &Replica, host_port: u16) -> CommandLine {
        let container = main_container(&replica.pod);
        let mut env: Vec<(String, String)> = PASSED_ENV
            .iter()
            .filter_map(|name| Some((name.to_string(), literal_env(container, name)?.to_string())))
            .collect();
        env.extend(
            [
                ("DYN_DISCOVERY_BACKEND", "file".into()),
                ("DYN_FILE_KV", self.discovery_dir.display().to_string()),
                ("DYN_REQUEST_PLANE", "tcp".into()),
                ("DYN_TCP_RPC_HOST", "127.0.0.1".into()),
                ("DYN_LOG", self.dynamo_log.clone()),
                ("HF_HUB_OFFLINE", "1".into()),
            ]
            .map(|(k, v)| (k.to_string(), v)),
        );
        match replica.role {
            Role::Frontend => {
                let pod_args = container.and_then(|c| c.args.clone()).unwrap_or_default();
                let (mut args, pod_port) = frontend_args(&pod_args);
                args.extend(
                    [
                        "--http-host",
                        "127.0.0.1",
                        "--http-port",
                        &host_port.to_string(),
                        "--discovery-backend",
                        "file",
                        "--request-plane",
                        "tcp",
                    ]
                    .map(String::from),
                );
                CommandLine {
                    module: "dynamo.frontend",
                    args,
                    env,
                    pod_port: Some(pod_port),
                }
            }
            Role::Prefill | Role::Decode | Role::Worker => {
                // The engine serves its system port (metrics, health) only where the pod asks
                // for one, as a real engine does.
                let pod_port = literal_env(container, "DYN_SYSTEM_PORT").and_then(|p| p.parse().ok());
                if pod_port.is_some() {
                    env.extend([
                        ("DYN_SYSTEM_PORT".into(), host_port.to_string()),
                        ("DYN_SYSTEM_HOST".into(), "127.0.0.1".into()),
                    ]);
                }
                let args: Vec<String> = [
                    "--model-path",
                    &self.model_dir.display().to_string(),
                    "--model-name",
                    &self.model,
                    "--disaggregation-mode",
                    replica.role.mocker_mode(),
                    "--speedup-ratio",
                    &self.speedup_ratio.to_string(),
                    "--block-size",
                    &self.block_size.to_string(),
                    "--num-gpu-blocks-override",
                    &self.kv_blocks.to_string(),
                    "--planner-profile-data",
                    &self.profile_npz.display().to_string(),
                    "--discovery-backend",
                    "file",
                    "--request-plane",
                    "tcp",
                ]
                .map(String::from)
                .to_vec();
                CommandLine {
                    module: "dynamo.mocker",
                    args,
                    env,
                    pod_port,
                }
            }
        }
    }

    /// A free port for `role`: any for a frontend, one in the system-port range for an engine.
    fn free_port(&self, role: Role, hint: u64) -> Option<u16> {
        let bind = |port: u16| TcpListener::bind(("127.0.0.1", port)).and_then(|l| l.local_addr());
        match role {
            Role::Frontend => bind(0).ok().map(|a| a.port()),
            Role::Prefill | Role::Decode | Role::Worker => {
                let (low, high) = self.system_ports;
                let span = u64::from(high.saturating_sub(low)) + 1;
                (0..span)
                    .map(|i| low + ((hint + i) % span) as u16)
                    .find(|&port| bind(port).is_ok())
            }
        }
    }
}

/// One process and the pod it plays.
#[derive(Debug)]
struct Process {
    replica: Replica,
    child: tokio::process::Child,
    pid: u32,
    host_port: u16,
    pod_port: Option<i32>,
    started: Instant,
    restarts: u32,
    /// CPU seconds and resident bytes at the last sample.
    cpu_s: f64,
    rss_bytes: u64,
}

/// A replica waiting for its process: a new engine pod for its start-up time, or a replica
/// whose process exited for its back-off.
#[derive(Debug)]
struct Backoff {
    replica: Replica,
    restarts: u32,
    until: Instant,
}

#[derive(Debug)]
enum Slot {
    Running(Box<Process>),
    Waiting(Backoff),
}

/// A process sent SIGTERM, until it exits.
#[derive(Debug)]
struct Stopping {
    process: Process,
    since: Instant,
    killed: bool,
}

/// One process, as `/status` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessStatus {
    /// The pod it plays.
    pub pod: String,
    /// What it runs.
    pub role: Role,
    /// `starting` (a new engine pod, for its start-up time), `running`, `restarting` (exited,
    /// to be started again after a back-off) or `stopping` (sent SIGTERM).
    pub state: &'static str,
    /// Its pid (0 while restarting).
    pub pid: u32,
    /// Its HTTP (frontend) or system (engine) address on this host, if it serves one.
    pub address: Option<String>,
    /// Times it was started again after exiting on its own.
    pub restarts: u32,
    /// Seconds since it started.
    pub uptime_s: f64,
    /// CPU seconds it has used (sampled each reconcile).
    pub cpu_s: f64,
    /// Resident memory (bytes).
    pub rss_bytes: u64,
}

/// The processes of the bed, by pod uid.
#[derive(Debug)]
pub struct Supervisor {
    launcher: Launcher,
    slots: BTreeMap<String, Slot>,
    stopping: Vec<Stopping>,
    /// CPU seconds of processes that have exited (their last sample).
    exited_cpu_s: f64,
    /// Most engine processes alive at once.
    peak_engines: usize,
    /// Most resident memory of all processes at once.
    peak_rss_bytes: u64,
    started: u64,
}

/// CPU seconds and resident bytes of a running process, from `/proc` (Linux).
fn sample(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    let cpu = (fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?) / ticks;
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some((cpu, pages * rustix::param::page_size() as u64))
}

/// Sends `signal` to the process group `pid` leads.
fn signal_group(pid: u32, signal: rustix::process::Signal) {
    // Never pid 0 or 1: kill(-1) would signal every process.
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .filter(|p| *p > 1)
        .and_then(rustix::process::Pid::from_raw)
        && let Err(error) = rustix::process::kill_process_group(pid, signal)
        && error != rustix::io::Errno::SRCH
    {
        warn!(pid = pid.as_raw_nonzero().get(), %error, "cannot signal the process group");
    }
}

impl Supervisor {
    /// No processes yet.
    pub fn new(launcher: Launcher) -> Self {
        Self {
            launcher,
            slots: BTreeMap::new(),
            stopping: Vec::new(),
            exited_cpu_s: 0.0,
            peak_engines: 0,
            peak_rss_bytes: 0,
            started: 0,
        }
    }

    fn spawn(&mut self, replica: Replica, restarts: u32) -> Slot {
        self.started += 1;
        let Some(host_port) = self.launcher.free_port(replica.role, self.started * 7919) else {
            warn!(pod = %replica.name, "no free port; trying again shortly");
            return Slot::Waiting(Backoff {
                replica,
                restarts,
                until: Instant::now() + Duration::from_secs(1),
            });
        };
        let line = self.launcher.command_line(&replica, host_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.launcher.log_dir.join(format!("{}.log", replica.name)));
        let spawned = log.and_then(|log| {
            let mut command = tokio::process::Command::new(&self.launcher.python);
            command
                .arg("-c")
                .arg(LAUNCHER)
                .arg(std::process::id().to_string())
                .arg(line.module)
                .args(&line.args)
                .env_clear()
                .envs(
                    ["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"]
                        .iter()
                        .filter_map(|k| Some((*k, std::env::var_os(k)?))),
                )
                .envs(line.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .process_group(0)
                .kill_on_drop(true);
            command.spawn()
        });
        match spawned.and_then(|child| {
            child
                .id()
                .map(|pid| (child, pid))
                .ok_or_else(|| std::io::Error::other("exited at once"))
        }) {
            Ok((child, pid)) => {
                info!(pod = %replica.name, role = replica.role.as_str(), pid, port = host_port, "started");
                Slot::Running(Box::new(Process {
                    replica,
                    child,
                    pid,
                    host_port,
                    pod_port: line.pod_port,
                    started: Instant::now(),
                    restarts,
                    cpu_s: 0.0,
                    rss_bytes: 0,
                }))
            }
            Err(error) => {
                warn!(pod = %replica.name, %error, "cannot start its process; trying again");
                Slot::Waiting(Backoff {
                    until: Instant::now() + backoff(restarts),
                    replica,
                    restarts: restarts + 1,
                })
            }
        }
    }

    fn stop(&mut self, mut process: Process) {
        info!(pod = %process.replica.name, pid = process.pid, "pod gone: SIGTERM");
        signal_group(process.pid, rustix::process::Signal::TERM);
        if let Some((cpu, _)) = sample(process.pid) {
            process.cpu_s = cpu;
        }
        self.stopping.push(Stopping {
            process,
            since: Instant::now(),
            killed: false,
        });
    }

    /// Brings the processes in line with the Ready pods `desired`: starts the new, stops the
    /// gone, restarts the exited (with a back-off), kills what outlives its grace period, and
    /// samples CPU and memory.
    pub fn reconcile(&mut self, desired: Vec<Replica>) {
        let wanted: BTreeMap<String, Replica> = desired.into_iter().map(|r| (r.uid.clone(), r)).collect();
        let gone: Vec<String> = self
            .slots
            .keys()
            .filter(|uid| !wanted.contains_key(*uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(Slot::Running(process)) = self.slots.remove(&uid) {
                self.stop(*process);
            }
        }
        let now = Instant::now();
        for (uid, replica) in wanted {
            let next = match self.slots.remove(&uid) {
                None if replica.role != Role::Frontend && !self.launcher.startup.is_zero() => {
                    info!(pod = %replica.name, after_s = self.launcher.startup.as_secs_f64(), "pod Ready: starting its engine");
                    Slot::Waiting(Backoff {
                        replica,
                        restarts: 0,
                        until: now + self.launcher.startup,
                    })
                }
                None => self.spawn(replica, 0),
                Some(Slot::Running(mut process)) => match process.child.try_wait() {
                    Ok(None) => {
                        process.replica = replica;
                        Slot::Running(process)
                    }
                    Ok(Some(status)) => {
                        warn!(pod = %process.replica.name, %status, restarts = process.restarts,
                              log = %self.launcher.log_dir.join(format!("{}.log", process.replica.name)).display(),
                              "process exited; starting it again");
                        self.exited_cpu_s += process.cpu_s;
                        Slot::Waiting(Backoff {
                            replica,
                            restarts: process.restarts + 1,
                            until: now + backoff(process.restarts),
                        })
                    }
                    Err(error) => {
                        warn!(pod = %process.replica.name, %error, "cannot check the process");
                        Slot::Running(process)
                    }
                },
                Some(Slot::Waiting(backoff)) if now >= backoff.until => self.spawn(replica, backoff.restarts),
                Some(Slot::Waiting(backoff)) => Slot::Waiting(Backoff { replica, ..backoff }),
            };
            self.slots.insert(uid, next);
        }
        self.reap();
        self.sample_all();
    }

    /// Tends the processes of the replicas it has (restarts, reaping, samples) when the pods
    /// cannot be listed.
    pub fn keep(&mut self) {
        let replicas = self
            .slots
            .values()
            .map(|slot| match slot {
                Slot::Running(p) => p.replica.clone(),
                Slot::Waiting(b) => b.replica.clone(),
            })
            .collect();
        self.reconcile(replicas);
    }

    /// Forgets stopped processes; SIGKILLs those past their grace period.
    fn reap(&mut self) {
        let grace = self.launcher.stop_grace;
        let mut exited = 0.0;
        self.stopping.retain_mut(|s| match s.process.child.try_wait() {
            Ok(Some(status)) => {
                info!(pod = %s.process.replica.name, %status, after_s = s.since.elapsed().as_secs_f64(), "stopped");
                exited += s.process.cpu_s;
                false
            }
            Ok(None) | Err(_) => {
                if !s.killed && s.since.elapsed() >= grace {
                    warn!(pod = %s.process.replica.name, "still running after the grace period: SIGKILL");
                    signal_group(s.process.pid, rustix::process::Signal::KILL);
                    s.killed = true;
                }
                true
            }
        });
        self.exited_cpu_s += exited;
    }

    fn sample_all(&mut self) {
        let mut rss = 0;
        for slot in self.slots.values_mut() {
            if let Slot::Running(process) = slot
                && let Some((cpu, bytes)) = sample(process.pid)
            {
                process.cpu_s = cpu;
                process.rss_bytes = bytes;
            }
        }
        for process in self.processes() {
            rss += process.rss_bytes;
        }
        self.peak_rss_bytes = self.peak_rss_bytes.max(rss);
        self.peak_engines = self.peak_engines.max(self.engines());
    }

    fn running(&self) -> impl Iterator<Item = &Process> {
        self.slots.values().filter_map(|s| match s {
            Slot::Running(p) => Some(p.as_ref()),
            Slot::Waiting(_) => None,
        })
    }

    fn processes(&self) -> impl Iterator<Item = &Process> {
        self.running().chain(self.stopping.iter().map(|s| &s.process))
    }

    /// Engine processes alive (running or stopping).
    pub fn engines(&self) -> usize {
        self.processes()
            .filter(|p| p.replica.role != Role::Frontend)
            .count()
    }

    /// Running prefill, decode and aggregated worker processes (not starting, restarting or
    /// stopping).
    pub fn running_engines(&self) -> (usize, usize, usize) {
        let count = |role| self.running().filter(|p| p.replica.role == role).count();
        (count(Role::Prefill), count(Role::Decode), count(Role::Worker))
    }

    /// Most engine processes alive at once so far.
    pub fn peak_engines(&self) -> usize {
        self.peak_engines
    }

    /// CPU seconds used by every process so far (sampled) and the most resident memory all
    /// processes held at once.
    pub fn cost(&self) -> (f64, u64) {
        let live: f64 = self.processes().map(|p| p.cpu_s).sum();
        (self.exited_cpu_s + live, self.peak_rss_bytes)
    }

    /// HTTP addresses of the running frontends.
    pub fn frontends(&self) -> Vec<SocketAddr> {
        self.running()
            .filter(|p| p.replica.role == Role::Frontend)
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p.host_port)))
            .collect()
    }

    /// The `file_sd` target groups of the running processes: one per container port of the
    /// pod that the process plays (its HTTP or system port).
    pub fn targets(&self) -> Vec<Value> {
        let mut groups = Vec::new();
        for process in self.running() {
            let Some(container) = main_container(&process.replica.pod) else {
                continue;
            };
            for port in container.ports.iter().flatten() {
                if Some(port.container_port) == process.pod_port {
                    let address = format!("127.0.0.1:{}", process.host_port);
                    groups.push(scrape::target_group(
                        &process.replica.pod,
                        container,
                        port,
                        &address,
                    ));
                }
            }
        }
        groups
    }

    /// Every process, for `/status`.
    pub fn status(&self) -> Vec<ProcessStatus> {
        let mut list = Vec::new();
        for slot in self.slots.values() {
            list.push(match slot {
                Slot::Running(p) => ProcessStatus {
                    pod: p.replica.name.clone(),
                    role: p.replica.role,
                    state: "running",
                    pid: p.pid,
                    address: Some(format!("127.0.0.1:{}", p.host_port)),
                    restarts: p.restarts,
                    uptime_s: p.started.elapsed().as_secs_f64(),
                    cpu_s: p.cpu_s,
                    rss_bytes: p.rss_bytes,
                },
                Slot::Waiting(b) => ProcessStatus {
                    pod: b.replica.name.clone(),
                    role: b.replica.role,
                    state: if b.restarts == 0 { "starting" } else { "restarting" },
                    pid: 0,
                    address: None,
                    restarts: b.restarts,
                    uptime_s: 0.0,
                    cpu_s: 0.0,
                    rss_bytes: 0,
                },
            });
        }
        list.extend(self.stopping.iter().map(|s| ProcessStatus {
            pod: s.process.replica.name.clone(),
            role: s.process.replica.role,
            state: "stopping",
            pid: s.process.pid,
            address: None,
            restarts: s.process.restarts,
            uptime_s: s.process.started.elapsed().as_secs_f64(),
            cpu_s: s.process.cpu_s,
            rss_bytes: s.process.rss_bytes,
        }));
        list
    }

    /// Stops every process: SIGTERM, then SIGKILL after the grace period.
    pub async fn shutdown(&mut self) {
        let running: Vec<String> = self.slots.keys().cloned().collect();
        for uid in running {
            if let Some(Slot::Running(process)) = self.slots.remove(&uid) {
                self.stop(*process);
            }
        }
        while !self.stopping.is_empty() {
            self.reap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Seconds before a process that exited on its own is started again: 1, 2, 4 ... 30.
fn backoff(restarts: u32) -> Duration {
    Duration::from_secs(1u64 << restarts.min(5)).min(Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn launcher() -> Launcher {
        Launcher {
            python: "/venv/bin/python".into(),
            model_dir: "/model".into(),
            model: "llama".into(),
            profile_npz: "/bed/profile.npz".into(),
            kv_blocks: 14008,
            block_size: 16,
            speedup_ratio: 1.0,
            startup: Duration::ZERO,
            discovery_dir: "/bed/discovery".into(),
            log_dir: "/bed/logs".into(),
            dynamo_log: "warn".into(),
            system_ports: (30000, 30009),
            stop_grace: Duration::from_secs(10),
        }
    }

    fn replica(role: Role, container: Value) -> Replica {
        Replica {
            uid: "u".into(),
            name: "p".into(),
            role,
            pod: Box::new(
                serde_json::from_value(
                    json!({"metadata": {"name": "p"}, "spec": {"containers": [container]}}),
                )
                .unwrap(),
            ),
        }
    }

    fn env(line: &CommandLine, name: &str) -> Option<String> {
        line.env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn a_frontend_keeps_the_pods_flags_but_listens_and_discovers_where_the_bed_says() {
        let pod = replica(
            Role::Frontend,
            json!({"name": "main", "args": ["--router-mode", "kv", "--http-port", "8080", "--request-plane=nats"],
                   "env": [{"name": "DYN_NAMESPACE", "value": "ns-llama"}, {"name": "DYN_LOG", "value": "debug"},
                           {"name": "DYN_TOPOLOGY_ENABLED", "value": "true"},
                           {"name": "DYN_MIGRATION_LIMIT", "value": "3"}]}),
        );
        let line = launcher().command_line(&pod, 41000);
        assert_eq!(line.module, "dynamo.frontend");
        assert_eq!(
            line.args,
            [
                "--router-mode",
                "kv",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                "41000",
                "--discovery-backend",
                "file",
                "--request-plane",
                "tcp"
            ]
        );
        assert_eq!(line.pod_port, Some(8080));
        assert_eq!(env(&line, "DYN_NAMESPACE").as_deref(), Some("ns-llama"));
        assert_eq!(env(&line, "DYN_LOG").as_deref(), Some("warn"));
        assert_eq!(env(&line, "DYN_DISCOVERY_BACKEND").as_deref(), Some("file"));
        assert_eq!(env(&line, "DYN_FILE_KV").as_deref(), Some("/bed/discovery"));
        assert_eq!(env(&line, "DYN_TOPOLOGY_ENABLED"), None);
        // What the frontend does with requests in flight on a worker that goes.
        assert_eq!(env(&line, "DYN_MIGRATION_LIMIT").as_deref(), Some("3"));
        // No --http-port in the pod: Dynamo's default.
        let bare = replica(Role::Frontend, json!({"name": "main"}));
        assert_eq!(launcher().command_line(&bare, 1).pod_port, Some(8000));
    }

    #[test]
    fn an_engine_is_a_mocker_in_the_pods_mode_with_a_system_port_only_where_the_pod_has_one() {
        let with_port = replica(
            Role::Prefill,
            json!({"name": "main", "env": [{"name": "DYN_SYSTEM_PORT", "value": "9090"},
                                          {"name": "DYN_NAMESPACE", "value": "ns-llama"}]}),
        );
        let line = launcher().command_line(&with_port, 30001);
        assert_eq!(line.module, "dynamo.mocker");
        let args = line.args.join(" ");
        for expected in [
            "--model-path /model --model-name llama --disaggregation-mode prefill",
            "--block-size 16 --num-gpu-blocks-override 14008 --planner-profile-data /bed/profile.npz",
        ] {
            assert!(args.contains(expected), "{args}");
        }
        assert_eq!(line.pod_port, Some(9090));
        assert_eq!(env(&line, "DYN_SYSTEM_PORT").as_deref(), Some("30001"));
        assert_eq!(env(&line, "DYN_NAMESPACE").as_deref(), Some("ns-llama"));

        let without = replica(Role::Decode, json!({"name": "main"}));
        let line = launcher().command_line(&without, 30002);
        assert!(line.args.join(" ").contains("--disaggregation-mode decode"));
        assert_eq!(line.pod_port, None);
        assert_eq!(env(&line, "DYN_SYSTEM_PORT"), None);

        let worker = replica(
            Role::Worker,
            json!({"name": "main", "env": [{"name": "DYN_SYSTEM_PORT", "value": "9090"}]}),
        );
        let line = launcher().command_line(&worker, 30003);
        assert_eq!(line.module, "dynamo.mocker");
        assert!(
            line.args.join(" ").contains("--disaggregation-mode agg"),
            "{:?}",
            line.args
        );
        assert_eq!(env(&line, "DYN_SYSTEM_PORT").as_deref(), Some("30003"));
    }

    #[test]
    fn engine_ports_stay_in_their_range_and_restarts_back_off() {
        let port = launcher().free_port(Role::Decode, 3).unwrap();
        assert!((30000..=30009).contains(&port), "{port}");
        assert_eq!(backoff(0), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(8));
        assert_eq!(backoff(40), Duration::from_secs(30));
        assert_eq!(Role::of("decode"), Some(Role::Decode));
        assert_eq!(Role::of("planner"), None);
        // An aggregated graph's lone worker runs the mocker in aggregated mode.
        assert_eq!(Role::of("worker"), Some(Role::Worker));
        assert_eq!(Role::Worker.mocker_mode(), "agg");
        assert_eq!(Role::Decode.mocker_mode(), "decode");
    }

    /// A stand-in for Python that runs as the launcher would run a module: it logs its
    /// arguments, then behaves as its pod's `DYN_NAMESPACE` says: `serve` (exit 0 on SIGTERM),
    /// `stubborn` (ignore SIGTERM) or `crash` (exit 1 at once).
    const FAKE_PYTHON: &str = r#"#!/bin/sh
echo "args: $*"
case "$DYN_NAMESPACE" in
  crash) exit 1 ;;
  stubborn) trap '' TERM ;;
  *) trap 'echo TERM; exit 0' TERM ;;
esac
echo ready
while :; do sleep 0.05; done
"#;

    struct Bed {
        dir: tempfile::TempDir,
        supervisor: Supervisor,
    }

    fn bed(grace: Duration) -> Bed {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let python = dir.path().join("python");
        std::fs::write(&python, FAKE_PYTHON).unwrap();
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(dir.path().join("logs")).unwrap();
        let launcher = Launcher {
            python,
            log_dir: dir.path().join("logs"),
            stop_grace: grace,
            ..launcher()
        };
        Bed {
            dir,
            supervisor: Supervisor::new(launcher),
        }
    }

    fn pod(name: &str, role: Role, behaviour: &str) -> Replica {
        Replica {
            uid: format!("uid-{name}"),
            name: name.into(),
            role,
            pod: Box::new(
                serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "ns", "labels": {"nvidia.com/dynamo-component-type": "decode"}},
                    "spec": {"containers": [{"name": "main",
                        "env": [{"name": "DYN_NAMESPACE", "value": behaviour}, {"name": "DYN_SYSTEM_PORT", "value": "9090"}],
                        "ports": [{"name": "system", "containerPort": 9090}, {"name": "other", "containerPort": 7}]}]}
                }))
                .unwrap(),
            ),
        }
    }

    fn state(supervisor: &Supervisor, pod: &str) -> Option<(&'static str, u32)> {
        supervisor
            .status()
            .into_iter()
            .find(|p| p.pod == pod)
            .map(|p| (p.state, p.restarts))
    }

    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn a_pod_that_goes_is_sent_sigterm_and_its_targets_go_with_it() {
        let mut bed = bed(Duration::from_secs(20));
        let decode = pod("decode-1", Role::Decode, "serve");
        bed.supervisor.reconcile(vec![decode.clone()]);
        assert_eq!(state(&bed.supervisor, "decode-1"), Some(("running", 0)));
        assert_eq!(bed.supervisor.engines(), 1);
        // One target, for the port the process plays, at its address.
        let targets = bed.supervisor.targets();
        assert_eq!(targets.len(), 1);
        assert_eq!(
            targets[0]["labels"]["__meta_kubernetes_pod_container_port_name"],
            "system"
        );
        let address = targets[0]["targets"][0].as_str().unwrap().to_string();
        let port: u16 = address.rsplit(':').next().unwrap().parse().unwrap();
        assert!((30000..=30009).contains(&port), "{address}");
        let log = bed.dir.path().join("logs/decode-1.log");
        until("the process to start", || {
            std::fs::read_to_string(&log).is_ok_and(|t| t.contains("ready"))
        })
        .await;
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.contains("dynamo.mocker") && text.contains("--disaggregation-mode decode"),
            "{text}"
        );

        bed.supervisor.reconcile(Vec::new());
        assert!(bed.supervisor.targets().is_empty());
        // Sent SIGTERM: stopping, or already gone.
        assert!(state(&bed.supervisor, "decode-1").is_none_or(|(s, _)| s == "stopping"));
        let supervisor = &mut bed.supervisor;
        until("the process to exit on SIGTERM", || {
            supervisor.reconcile(Vec::new());
            supervisor.status().is_empty()
        })
        .await;
        assert!(std::fs::read_to_string(&log).unwrap().contains("TERM"));
        assert_eq!(bed.supervisor.peak_engines(), 1);
        assert_eq!(bed.supervisor.engines(), 0);
    }

    #[tokio::test]
    async fn a_process_that_exits_is_started_again_and_one_that_ignores_sigterm_is_killed() {
        let mut bed = bed(Duration::from_millis(500));
        let crash = pod("crash-1", Role::Prefill, "crash");
        let supervisor = &mut bed.supervisor;
        supervisor.reconcile(vec![crash.clone()]);
        until("a restart after the crash", || {
            supervisor.reconcile(vec![crash.clone()]);
            state(supervisor, "crash-1").is_some_and(|(_, restarts)| restarts >= 1)
        })
        .await;
        supervisor.reconcile(Vec::new());
        assert!(state(supervisor, "crash-1").is_none_or(|(s, _)| s == "stopping"));

        let stubborn = pod("stubborn-1", Role::Decode, "stubborn");
        supervisor.reconcile(vec![stubborn]);
        let log = bed.dir.path().join("logs/stubborn-1.log");
        until("the stubborn process to ignore SIGTERM", || {
            std::fs::read_to_string(&log).is_ok_and(|t| t.contains("ready"))
        })
        .await;
        let started = Instant::now();
        until("the stubborn process to be killed after its grace period", || {
            supervisor.reconcile(Vec::new());
            supervisor.status().is_empty()
        })
        .await;
        assert!(started.elapsed() >= Duration::from_millis(500));
    }

    #[tokio::test]
    async fn an_engine_starts_its_start_up_time_after_its_pod_is_ready_a_frontend_at_once() {
        let mut bed = bed(Duration::from_secs(5));
        bed.supervisor.launcher.startup = Duration::from_millis(400);
        let engine = pod("prefill-1", Role::Prefill, "serve");
        let frontend = pod("frontend-1", Role::Frontend, "serve");
        let pods = vec![engine, frontend];
        let supervisor = &mut bed.supervisor;
        supervisor.reconcile(pods.clone());
        assert_eq!(state(supervisor, "prefill-1"), Some(("starting", 0)));
        assert_eq!(state(supervisor, "frontend-1"), Some(("running", 0)));
        assert_eq!(supervisor.engines(), 0);
        let ready = Instant::now();
        until("the engine to start", || {
            supervisor.reconcile(pods.clone());
            state(supervisor, "prefill-1") == Some(("running", 0))
        })
        .await;
        assert!(ready.elapsed() >= Duration::from_millis(350));
        assert_eq!(supervisor.engines(), 1);
        supervisor.shutdown().await;
        assert!(supervisor.status().is_empty());
    }
}
