//! The bed's load generator: a request trace replayed as OpenAI chat completions to the real
//! frontend, each request at its trace time (times the rate scale, which may change while it
//! runs), with the trace's prompt length in words (the test model's tokenizer makes one word one
//! token) and its output length as `max_tokens` with `ignore_eos` (the mocker then generates
//! exactly that many tokens). Streaming, as a chat client is, so the frontend measures TTFT and
//! ITL. Open loop: arrivals do not wait for completions; past `max_in_flight` outstanding
//! requests new ones are dropped and counted, so a stalled frontend cannot grow memory without
//! bound.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use planner_sim_engine::latency::Job;
use serde::Serialize;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::sim::trace::{Arrivals, splitmix64};

/// Prompts for the load: slices of a corpus of random words from the test model's vocabulary
/// (`tools/dynamo/make_model.py`: `w0` ... `w31977`), each of one token. The words all have the
/// same width (`w10000` ... `w31977`), so a prompt of `n` words is a slice of the corpus with no
/// text to build: the load generator keeps pace with the trace however long the prompts are.
/// Each request starts at its own pseudo-random word, so no two requests share a first KV-cache
/// block and the engines' prefix cache never shortens a prefill.
#[derive(Debug)]
pub struct Prompts {
    corpus: String,
    words: usize,
}

/// Width of a corpus word and the space after it.
const WORD: usize = 7;
/// Corpus words: twice the test model's context, so that the longest prompt has many starts.
const CORPUS_WORDS: usize = 2 * 131_072;

impl Prompts {
    /// The corpus (about 1.8 MB), from a fixed seed.
    pub fn new() -> Self {
        let mut corpus = String::with_capacity(CORPUS_WORDS * WORD);
        let mut state = 0x5EED_B0D1_u64;
        for _ in 0..CORPUS_WORDS {
            state = splitmix64(state);
            corpus.push('w');
            corpus.push_str(&(10_000 + state % 21_978).to_string());
            corpus.push(' ');
        }
        Self {
            corpus,
            words: CORPUS_WORDS,
        }
    }

    /// The prompt of request `id`: `words` words (at most the corpus's).
    pub fn prompt(&self, id: usize, words: usize) -> &str {
        let words = words.clamp(1, self.words);
        let start = (splitmix64(id as u64 ^ 0x00B0_D1E5) % (self.words - words + 1) as u64) as usize;
        self.corpus
            .get(start * WORD..(start + words) * WORD - 1)
            .unwrap_or_default()
    }

    /// The request body of `job` for `model`: a streaming chat completion of the trace's prompt
    /// length with exactly its output length.
    pub fn body(&self, job: &Job, model: &str) -> String {
        let words = job.isl.round().max(1.0) as usize;
        let max_tokens = job.osl.round().max(1.0) as u64;
        // The prompt is words and spaces only: nothing in it needs escaping.
        format!(
            "{{\"model\":{},\"messages\":[{{\"role\":\"user\",\"content\":\"{}\"}}],\"max_tokens\":{max_tokens},\"ignore_eos\":true,\"stream\":true}}",
            serde_json::Value::from(model),
            self.prompt(job.id, words)
        )
    }
}

impl Default for Prompts {
    fn default() -> Self {
        Self::new()
    }
}

/// What the load generator has done, for `/status`.
#[derive(Debug, Default)]
pub struct LoadStats {
    sent: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
    in_flight: AtomicU64,
    ttft_us_sum: AtomicU64,
    ttft_count: AtomicU64,
    /// Trace seconds reached, as f64 bits; NaN before the trace started.
    trace_s: AtomicU64,
}

/// A snapshot of [`LoadStats`].
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LoadStatus {
    /// Whether the trace clock runs (it starts once a frontend serves the model).
    pub started: bool,
    /// Trace seconds reached.
    pub trace_s: f64,
    /// Requests sent.
    pub sent: u64,
    /// Requests answered in full.
    pub completed: u64,
    /// Requests that failed (HTTP error, connection error, no frontend, timeout).
    pub failed: u64,
    /// Requests not sent because `max_in_flight` were outstanding.
    pub dropped: u64,
    /// Requests outstanding.
    pub in_flight: u64,
    /// Time to the first streamed chunk, summed over the requests that got one (ms).
    pub ttft_ms_sum: f64,
    /// Requests that got a first chunk.
    pub ttft_count: u64,
}

impl LoadStats {
    /// Nothing sent yet.
    pub fn new() -> Self {
        let stats = Self::default();
        stats.trace_s.store(f64::NAN.to_bits(), Ordering::Relaxed);
        stats
    }

    /// The counts now.
    pub fn status(&self) -> LoadStatus {
        let trace_s = f64::from_bits(self.trace_s.load(Ordering::Relaxed));
        LoadStatus {
            started: !trace_s.is_nan(),
            trace_s: if trace_s.is_nan() { 0.0 } else { trace_s },
            sent: self.sent.load(Ordering::Relaxed),
            completed: self.completed.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            ttft_ms_sum: self.ttft_us_sum.load(Ordering::Relaxed) as f64 / 1000.0,
            ttft_count: self.ttft_count.load(Ordering::Relaxed),
        }
    }
}

/// How the trace is replayed.
#[derive(Clone, Debug)]
pub struct LoadSettings {
    /// The served model name.
    pub model: String,
    /// Trace seconds per wall-clock second.
    pub speedup: f64,
    /// Most requests outstanding at once.
    pub max_in_flight: u64,
    /// A request not finished after this long is abandoned and counted as failed.
    pub timeout: Duration,
}

/// Whether the frontend at `addr` lists `model` in `/v1/models`.
async fn serves(client: &reqwest::Client, addr: SocketAddr, model: &str) -> bool {
    let Ok(response) = client.get(format!("http://{addr}/v1/models")).send().await else {
        return false;
    };
    let Ok(body) = response.json::<serde_json::Value>().await else {
        return false;
    };
    body["data"]
        .as_array()
        .is_some_and(|models| models.iter().any(|m| m["id"] == model))
}

/// Sends one request and records what became of it.
async fn send(client: reqwest::Client, url: String, body: String, stats: Arc<LoadStats>) {
    let start = Instant::now();
    let outcome: Result<Option<Duration>, String> = async {
        let mut response = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            return Err(format!(
                "HTTP {status}: {}",
                text.chars().take(200).collect::<String>()
            ));
        }
        let mut first = None;
        while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
            if first.is_none() && chunk.windows(6).any(|w| w == b"data: ") {
                first = Some(start.elapsed());
            }
        }
        Ok(first)
    }
    .await;
    stats.in_flight.fetch_sub(1, Ordering::Relaxed);
    match outcome {
        Ok(first) => {
            stats.completed.fetch_add(1, Ordering::Relaxed);
            if let Some(ttft) = first {
                stats
                    .ttft_us_sum
                    .fetch_add(ttft.as_micros() as u64, Ordering::Relaxed);
                stats.ttft_count.fetch_add(1, Ordering::Relaxed);
            }
        }
        Err(error) => {
            let failed = stats.failed.fetch_add(1, Ordering::Relaxed);
            // The first failures say why; then one in a hundred.
            if failed < 5 || failed.is_multiple_of(100) {
                warn!(%error, failed = failed + 1, "request failed");
            }
        }
    }
}

/// Replays `arrivals` until `stop`: waits for a frontend that serves the model, then sends
/// each arrival when its trace time comes, round-robin over the running `frontends`.
pub async fn run(
    mut arrivals: Arrivals,
    settings: LoadSettings,
    rate_scale: Arc<AtomicU64>,
    mut frontends: watch::Receiver<Vec<SocketAddr>>,
    stats: Arc<LoadStats>,
    mut stop: watch::Receiver<bool>,
) {
    let client = match reqwest::Client::builder()
        .timeout(settings.timeout)
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
    {
        Ok(client) => client,
        Err(error) => {
            warn!(%error, "cannot build the HTTP client; no load");
            return;
        }
    };
    // The trace starts once a frontend serves the model (prefill and decode engines are
    // registered): requests before that could only fail.
    loop {
        let addrs = frontends.borrow_and_update().clone();
        let mut ready = false;
        for addr in addrs {
            if serves(&client, addr, &settings.model).await {
                ready = true;
                break;
            }
        }
        if ready {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
    info!(model = %settings.model, "a frontend serves the model: the trace starts");
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_millis(20));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let prompts = Prompts::new();
    let mut next_frontend = 0usize;
    let mut announced_end = false;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let now_s = started.elapsed().as_secs_f64() * settings.speedup;
        stats.trace_s.store(now_s.to_bits(), Ordering::Relaxed);
        let k = f64::from_bits(rate_scale.load(Ordering::Relaxed));
        let addrs = frontends.borrow().clone();
        while let Some(job) = arrivals.next_before(now_s, k) {
            if stats.in_flight.load(Ordering::Relaxed) >= settings.max_in_flight {
                let dropped = stats.dropped.fetch_add(1, Ordering::Relaxed);
                if dropped.is_multiple_of(100) {
                    warn!(
                        in_flight = settings.max_in_flight,
                        dropped = dropped + 1,
                        "too many requests outstanding: dropping"
                    );
                }
                continue;
            }
            stats.sent.fetch_add(1, Ordering::Relaxed);
            let Some(addr) = addrs.get(next_frontend % addrs.len().max(1)).copied() else {
                let failed = stats.failed.fetch_add(1, Ordering::Relaxed);
                if failed.is_multiple_of(100) {
                    warn!("no frontend runs: request failed");
                }
                continue;
            };
            next_frontend = next_frontend.wrapping_add(1);
            stats.in_flight.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(send(
                client.clone(),
                format!("http://{addr}/v1/chat/completions"),
                prompts.body(&job, &settings.model),
                stats.clone(),
            ));
        }
        if !announced_end && arrivals.exhausted() {
            announced_end = true;
            info!(trace_s = now_s, "trace replayed");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_prompt_has_the_requested_words_and_differs_between_requests() {
        let prompts = Prompts::new();
        let a = prompts.prompt(1, 500);
        assert_eq!(a.split(' ').count(), 500);
        assert!(
            a.split(' ')
                .all(|w| w.len() == 6 && w.starts_with('w') && w[1..].parse::<u64>().unwrap() <= 31_977)
        );
        assert_eq!(a, prompts.prompt(1, 500));
        let b = prompts.prompt(2, 500);
        // No shared first KV block (16 tokens).
        assert_ne!(
            a.split(' ').take(16).collect::<Vec<_>>(),
            b.split(' ').take(16).collect::<Vec<_>>()
        );
        // The longest prompt fits; longer ones are cut to the corpus.
        assert_eq!(prompts.prompt(3, 131_072).split(' ').count(), 131_072);
        assert_eq!(prompts.prompt(4, usize::MAX).split(' ').count(), CORPUS_WORDS);
        assert_eq!(prompts.prompt(5, 0).split(' ').count(), 1);
    }

    #[test]
    fn the_body_asks_for_exactly_the_traces_output_length() {
        let job = Job {
            id: 3,
            arrival_s: 0.0,
            isl: 12.4,
            osl: 7.0,
        };
        let body: serde_json::Value = serde_json::from_str(&Prompts::new().body(&job, "m\"x")).unwrap();
        assert_eq!(body["model"], "m\"x");
        assert_eq!(body["max_tokens"], 7);
        assert_eq!(body["ignore_eos"], true);
        assert_eq!(body["stream"], true);
        assert_eq!(body["messages"][0]["role"], "user");
        assert_eq!(
            body["messages"][0]["content"]
                .as_str()
                .unwrap()
                .split(' ')
                .count(),
            12
        );
    }
}
