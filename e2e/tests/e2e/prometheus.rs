//! A real Prometheus for the tests (`PROMETHEUS_BIN`, which `make e2e` sets to the one `make
//! tools` builds from Go modules or an installed one; else `prometheus` on PATH), scraping given
//! targets on loopback (every second unless a test asks otherwise), with the static labels the
//! frontend PodMonitor would add.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use e2e::{Result, poll_until};

/// A running Prometheus; stopped and its data removed on drop.
pub struct Prometheus {
    child: Option<Child>,
    dir: std::path::PathBuf,
    /// Base URL, e.g. `http://127.0.0.1:39090`.
    pub url: String,
    port: u16,
    config: std::path::PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

impl Prometheus {
    /// Starts Prometheus scraping `target` (host:port) every second with `labels` added.
    pub async fn start(target: &str, labels: &[(&str, &str)]) -> Result<Self> {
        Self::start_every(target, labels, 1).await
    }

    /// Starts Prometheus scraping `target` every `scrape_s` seconds with `labels` added.
    pub async fn start_every(target: &str, labels: &[(&str, &str)], scrape_s: u32) -> Result<Self> {
        Self::start_targets(&[(target, labels)], scrape_s).await
    }

    /// Starts Prometheus scraping each target every `scrape_s` seconds with its labels added (one
    /// frontend per graph, each with its own `dynamo_namespace`).
    pub async fn start_targets(targets: &[(&str, &[(&str, &str)])], scrape_s: u32) -> Result<Self> {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("e2e-prometheus-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let static_configs: String = targets
            .iter()
            .map(|(target, labels)| {
                let label_lines: String = labels
                    .iter()
                    .map(|(k, v)| format!("          {k}: \"{v}\"\n"))
                    .collect();
                format!("      - targets: [\"{target}\"]\n        labels:\n{label_lines}")
            })
            .collect();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: {scrape_s}s\n  evaluation_interval: {scrape_s}s\nscrape_configs:\n  - job_name: dynamo-frontend\n    honor_labels: true\n    static_configs:\n{static_configs}"
            ),
        )?;
        let mut prometheus = Self {
            child: None,
            dir,
            url: format!("http://127.0.0.1:{port}"),
            port,
            config,
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

    /// Stops Prometheus (as an outage would), keeping its data.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
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
