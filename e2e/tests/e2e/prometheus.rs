//! A real Prometheus for the tests (`PROMETHEUS_BIN`, which `make e2e` sets to the one `make
//! tools` builds from Go modules or an installed one; else `prometheus` on PATH), scraping given
//! targets on loopback (every second unless a test asks otherwise), with the static labels the
//! frontend PodMonitor would add, or with a configuration of the test's (the test bed's).

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use e2e::{Result, poll_until};

/// One scrape job: its targets (`host:port`) and the labels added to their series.
pub struct Job {
    /// `job_name`.
    pub name: String,
    /// `host:port` of each target.
    pub targets: Vec<String>,
    /// The path scraped (`/metrics` for Dynamo's frontends and engines).
    pub path: &'static str,
    /// Labels added to every series of the targets.
    pub labels: Vec<(String, String)>,
}

/// A running Prometheus; stopped and its data removed on drop.
pub struct Prometheus {
    child: Option<Child>,
    dir: std::path::PathBuf,
    /// Base URL, e.g. `http://127.0.0.1:39090`.
    pub url: String,
    port: u16,
    config: std::path::PathBuf,
}

/// Now, in unix seconds (the time Prometheus stamps its samples with).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

impl Prometheus {
    /// Starts Prometheus scraping every job's targets every `scrape_s` seconds, with the job's
    /// labels added to its series and the targets' own labels kept (`honor_labels`), as
    /// NVIDIA's PodMonitors and this chart's scrape Dynamo's pods.
    pub async fn start_jobs(jobs: &[Job], scrape_s: u32) -> Result<Self> {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("e2e-prometheus-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut config = format!(
            "global:\n  scrape_interval: {scrape_s}s\n  evaluation_interval: {scrape_s}s\nscrape_configs:\n"
        );
        for job in jobs {
            let targets: Vec<String> = job.targets.iter().map(|t| format!("\"{t}\"")).collect();
            config.push_str(&format!(
                "  - job_name: {}\n    honor_labels: true\n    metrics_path: {}\n    static_configs:\n      - targets: [{}]\n        labels:\n",
                job.name,
                job.path,
                targets.join(", ")
            ));
            for (k, v) in &job.labels {
                config.push_str(&format!("          {k}: \"{v}\"\n"));
            }
            if job.labels.is_empty() {
                config.push_str("          {}\n");
            }
        }
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config)?;
        let mut prometheus = Self {
            child: None,
            dir,
            url: format!("http://127.0.0.1:{port}"),
            port,
            config: file,
        };
        prometheus.spawn()?;
        prometheus.wait_ready().await?;
        Ok(prometheus)
    }

    /// Starts Prometheus with the configuration file `config` (e.g. the test bed's).
    pub async fn start_with_config(config: &std::path::Path) -> Result<Self> {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("e2e-prometheus-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut prometheus = Self {
            child: None,
            dir,
            url: format!("http://127.0.0.1:{port}"),
            port,
            config: config.to_path_buf(),
        };
        prometheus.spawn()?;
        prometheus.wait_ready().await?;
        Ok(prometheus)
    }

    fn spawn(&mut self) -> Result<()> {
        let binary = std::env::var_os("PROMETHEUS_BIN").unwrap_or_else(|| "prometheus".into());
        let child = Command::new(&binary)
            .args([
                &format!("--config.file={}", self.config.display()),
                &format!("--storage.tsdb.path={}", self.dir.join("data").display()),
                &format!("--web.listen-address=127.0.0.1:{}", self.port),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start {} (`make tools` builds one; set PROMETHEUS_BIN): {e}",
                    binary.to_string_lossy()
                )
            })?;
        self.child = Some(child);
        Ok(())
    }

    async fn wait_ready(&self) -> Result<()> {
        let url = format!("{}/-/ready", self.url);
        poll_until("Prometheus to be ready", Duration::from_secs(60), || {
            let url = url.clone();
            async move { Ok(reqwest_ready(&url).await) }
        })
        .await
    }

    /// The series of an instant query: `[{"metric": {...}, "value": [t, "v"]}, ...]`.
    pub async fn query(&self, promql: &str) -> Result<Vec<serde_json::Value>> {
        let encoded: String = promql
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let addr: std::net::SocketAddr = format!("127.0.0.1:{}", self.port).parse()?;
        let (code, body) = e2e::http_get(addr, &format!("/api/v1/query?query={encoded}")).await?;
        let answer: serde_json::Value = serde_json::from_str(&body)?;
        if code != 200 || answer["status"] != "success" {
            return Err(format!("query {promql} answered {code}: {body}").into());
        }
        Ok(answer["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Waits until each of its `targets` targets has been scraped `scrapes` times since
    /// `since_s` (unix seconds), so that what they exported after that instant is what it
    /// holds: a read judged sooner may see the state before, or no series at all.
    pub async fn scraped_since(&self, targets: usize, since_s: f64, scrapes: u32) -> Result<()> {
        poll_until(
            &format!("{scrapes} scrapes of each of {targets} targets since {since_s:.3}"),
            Duration::from_secs(30),
            || async move {
                let since_ms = ((unix_now() - since_s) * 1000.0).floor().max(1.0);
                let query = format!("count(count_over_time(up[{since_ms}ms]) >= {scrapes})");
                let scraped = self.query(&query).await?;
                let count = scraped
                    .first()
                    .and_then(|s| s["value"][1].as_str()?.parse::<f64>().ok());
                Ok(count.is_some_and(|n| n >= targets as f64))
            },
        )
        .await
    }

    /// Stops Prometheus (as an outage would), keeping its data.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes Prometheus (SIGSTOP): no scrapes until `resume`, so that what happens meanwhile
    /// reaches it in one scrape, whatever the machine's load.
    pub fn pause(&self) -> Result<()> {
        self.signal(rustix::process::Signal::STOP)
    }

    /// Lets a paused Prometheus scrape again (SIGCONT).
    pub fn resume(&self) -> Result<()> {
        self.signal(rustix::process::Signal::CONT)
    }

    fn signal(&self, signal: rustix::process::Signal) -> Result<()> {
        let pid = self
            .child
            .as_ref()
            .and_then(|child| rustix::process::Pid::from_raw(child.id() as i32))
            .ok_or("Prometheus is not running")?;
        rustix::process::kill_process(pid, signal)
            .map_err(|e| format!("cannot signal Prometheus: {e}").into())
    }

    /// Starts it again on the same port and data.
    pub async fn restart(&mut self) -> Result<()> {
        self.spawn()?;
        self.wait_ready().await
    }
}

async fn reqwest_ready(url: &str) -> bool {
    // A plain HTTP GET with the standard library, to keep the test free of another client.
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let Some((host, path)) = rest.split_once('/') else {
        return false;
    };
    let request = format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n");
    let host = host.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let Ok(mut stream) = std::net::TcpStream::connect(host) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        if stream.write_all(request.as_bytes()).is_err() {
            return false;
        }
        let mut response = String::new();
        let _ = stream.read_to_string(&mut response);
        response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200")
    })
    .await
    .unwrap_or(false)
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
