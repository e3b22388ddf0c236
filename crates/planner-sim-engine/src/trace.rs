//! Request traces for the replay and the synthetic frontend: the Azure LLM inference trace
//! 2023 (CSV `TIMESTAMP,ContextTokens,GeneratedTokens`, absolute timestamps with 100 ns digits,
//! as Azure publishes it) and Mooncake JSONL (`timestamp` in ms from the start, `input_length`,
//! `output_length`, as the Mooncake traces are published). Arrivals are made relative to the
//! first request, sorted, and can be multiplied by a rate scale `k` with small deterministic
//! jitter.

use std::{cmp::Ordering, collections::BinaryHeap, path::Path};

use planner_core::trace::{TraceError, parse_mooncake_jsonl};

use crate::latency::Job;

/// One request: when it arrives and how long it is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Request {
    /// Arrival time in seconds from the start of the trace.
    pub arrival_s: f64,
    /// Input (prompt) tokens.
    pub isl: f64,
    /// Output (generated) tokens, at least 1.
    pub osl: f64,
}

/// Why a trace could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadTraceError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A Mooncake JSONL line is invalid.
    #[error("{path}: {source}")]
    Mooncake {
        /// The file.
        path: String,
        /// What is wrong.
        source: TraceError,
    },
    /// An Azure CSV line is invalid.
    #[error("{path}: line {line}: {message}")]
    Csv {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The file is neither format.
    #[error(
        "{path}: unknown trace format (expected Azure CSV with a TIMESTAMP,ContextTokens,GeneratedTokens header or Mooncake JSONL)"
    )]
    UnknownFormat {
        /// The file.
        path: String,
    },
}

/// Reads a trace file, detecting its format from the content: a first line starting with `{`
/// is Mooncake JSONL, a `TIMESTAMP,ContextTokens,GeneratedTokens` header is the Azure CSV.
pub fn load(path: &Path) -> Result<Vec<Request>, LoadTraceError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| LoadTraceError::Io {
        path: name.clone(),
        source,
    })?;
    parse(&text, &name)
}

/// Parses trace text (see [`load`]); `name` is used in errors. Empty text is an empty trace.
pub fn parse(text: &str, name: &str) -> Result<Vec<Request>, LoadTraceError> {
    parse_ordered(text, name).map(|(requests, _)| requests)
}

/// [`parse`], with where each request stands in the file: `order[i]` is the position of
/// request `i` among the file's records (its non-blank lines, or rows).
pub fn parse_ordered(text: &str, name: &str) -> Result<(Vec<Request>, Vec<usize>), LoadTraceError> {
    let first = text.lines().map(str::trim).find(|l| !l.is_empty());
    let requests: Vec<Request> = match first {
        None => Vec::new(),
        Some(line) if line.starts_with('{') => parse_mooncake_jsonl(text)
            .map_err(|source| LoadTraceError::Mooncake {
                path: name.to_string(),
                source,
            })?
            .into_iter()
            .map(|r| Request {
                arrival_s: r.timestamp_ms / 1000.0,
                isl: r.input_length,
                osl: r.output_length,
            })
            .collect(),
        Some(line) if line.to_ascii_lowercase().starts_with("timestamp,") => parse_azure_csv(text, name)?,
        Some(_) => {
            return Err(LoadTraceError::UnknownFormat {
                path: name.to_string(),
            });
        }
    };
    let mut order: Vec<usize> = (0..requests.len()).collect();
    // Stable: requests arriving together keep the file's order.
    order.sort_by(|&a, &b| requests[a].arrival_s.total_cmp(&requests[b].arrival_s));
    let mut sorted: Vec<Request> = order.iter().map(|&i| requests[i]).collect();
    normalize(&mut sorted);
    Ok((sorted, order))
}

/// Makes times relative to the first arrival (of requests sorted by arrival), and gives every
/// request at least one output token (a request always yields its first token).
fn normalize(requests: &mut [Request]) {
    let origin = requests.first().map_or(0.0, |r| r.arrival_s);
    for request in requests.iter_mut() {
        request.arrival_s -= origin;
        request.osl = request.osl.max(1.0);
    }
}

/// Azure 2023 CSV: `TIMESTAMP,ContextTokens,GeneratedTokens` with timestamps like
/// `2023-11-16 18:17:03.9799600` (no time zone; only differences matter).
fn parse_azure_csv(text: &str, name: &str) -> Result<Vec<Request>, LoadTraceError> {
    let mut requests = Vec::new();
    for (index, raw) in text.lines().enumerate().skip(1) {
        let line = index + 1;
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let error = |message: String| LoadTraceError::Csv {
            path: name.to_string(),
            line,
            message,
        };
        let mut fields = raw.split(',');
        let (Some(timestamp), Some(context), Some(generated)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(error(format!("expected 3 fields, got `{raw}`")));
        };
        let number = |field: &str, what: &str| -> Result<f64, LoadTraceError> {
            match field.trim().parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
                _ => Err(error(format!(
                    "{what} must be a non-negative number, got `{field}`"
                ))),
            }
        };
        requests.push(Request {
            arrival_s: parse_timestamp(timestamp.trim())
                .ok_or_else(|| error(format!("invalid TIMESTAMP `{timestamp}`")))?,
            isl: number(context, "ContextTokens")?,
            osl: number(generated, "GeneratedTokens")?,
        });
    }
    Ok(requests)
}

/// `YYYY-MM-DD HH:MM:SS[.fraction]` to seconds since 1970-01-01 (proleptic Gregorian, no zone).
fn parse_timestamp(text: &str) -> Option<f64> {
    let (date, time) = text.split_once([' ', 'T'])?;
    let mut date_parts = date.split('-');
    let year: i64 = date_parts.next()?.parse().ok()?;
    let month: i64 = date_parts.next()?.parse().ok()?;
    let day: i64 = date_parts.next()?.parse().ok()?;
    let time = time.trim_end_matches('Z');
    let mut time_parts = time.split(':');
    let hour: i64 = time_parts.next()?.parse().ok()?;
    let minute: i64 = time_parts.next()?.parse().ok()?;
    let second: f64 = time_parts.next()?.parse().ok()?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || !(0.0..61.0).contains(&second) {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hour * 3600 + minute * 60) as f64 + second)
}

/// SplitMix64: a deterministic, well-mixed hash of a counter.
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A deterministic number in `[0, 1)` for a request index and copy.
fn unit(index: usize, copy: u64, salt: u64) -> f64 {
    let h = splitmix64((index as u64).wrapping_mul(0x1000_0000_01B3) ^ copy.wrapping_mul(0x9E37) ^ salt);
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// How many copies request `index` becomes at rate scale `k`: `floor(k)`, plus one with
/// probability `frac(k)` (decided by a hash of the index, so deterministic).
pub fn copies(index: usize, k: f64) -> u64 {
    if !(k.is_finite() && k > 0.0) {
        return 0;
    }
    let fraction = k - k.floor();
    k.floor() as u64 + u64::from(unit(index, u64::MAX, 0xF2AC) < fraction)
}

/// Arrival offset of copy `copy` of request `index`: uniform in `[0, jitter_s)`, from a hash.
pub fn jitter(index: usize, copy: u64, jitter_s: f64) -> f64 {
    let jitter = if jitter_s.is_finite() {
        jitter_s.max(0.0)
    } else {
        0.0
    };
    unit(index, copy, 0x7177) * jitter
}

/// Multiplies the request rate by `k`: request `i` becomes [`copies`]`(i, k)` requests, each
/// arriving [`jitter`] after the original, so copies do not arrive in lockstep. `k = 1`
/// returns the trace unchanged; `k <= 0` gives an empty trace.
pub fn scale(requests: &[Request], k: f64, jitter_s: f64) -> Vec<Request> {
    scale_indexed(requests, k, jitter_s)
        .into_iter()
        .map(|scaled| scaled.request)
        .collect()
}

/// A request of a rate-scaled trace and where it came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scaled {
    /// The request.
    pub request: Request,
    /// Index of the request it copies in the trace given to [`scale_indexed`].
    pub source: usize,
    /// Which copy of it (0 for the first).
    pub copy: u64,
}

/// [`scale`], with each request's source and copy number (for a converter that carries fields
/// the simulator does not read, such as Mooncake's prefix hashes).
pub fn scale_indexed(requests: &[Request], k: f64, jitter_s: f64) -> Vec<Scaled> {
    if !(k.is_finite() && k > 0.0) {
        return Vec::new();
    }
    if k == 1.0 {
        return requests
            .iter()
            .enumerate()
            .map(|(source, request)| Scaled {
                request: *request,
                source,
                copy: 0,
            })
            .collect();
    }
    let mut scaled = Vec::with_capacity((requests.len() as f64 * k.ceil()) as usize);
    for (index, request) in requests.iter().enumerate() {
        for copy in 0..copies(index, k) {
            scaled.push(Scaled {
                request: Request {
                    arrival_s: request.arrival_s + jitter(index, copy, jitter_s),
                    ..*request
                },
                source: index,
                copy,
            });
        }
    }
    scaled.sort_by(|a, b| a.request.arrival_s.total_cmp(&b.request.arrival_s));
    scaled
}

/// A rate-scaled copy waiting for its arrival time.
#[derive(Clone, Copy, Debug)]
struct Pending(Job);

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    /// Earliest arrival first (`BinaryHeap` is a max-heap).
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .0
            .arrival_s
            .total_cmp(&self.0.arrival_s)
            .then_with(|| other.0.id.cmp(&self.0.id))
    }
}

/// The arrivals of a trace as (trace) time passes, at a rate scale that may change meanwhile:
/// each base request becomes [`copies`] copies at the rate scale in force when its time comes,
/// each [`jitter`]ed (except at `k = 1`), and the trace starts again when `looping`. The
/// synthetic frontend feeds them to its latency model, the test bed sends them to Dynamo.
#[derive(Debug)]
pub struct Arrivals {
    base: Vec<Request>,
    next: usize,
    /// Added to trace times: grows by the trace's span at each loop.
    offset_s: f64,
    looping: bool,
    jitter_s: f64,
    pending: BinaryHeap<Pending>,
    next_id: usize,
    cycle: usize,
}

impl Arrivals {
    /// The arrivals of `base` (sorted, relative times) from time 0.
    pub fn new(base: Vec<Request>, jitter_s: f64, looping: bool) -> Self {
        Self {
            base,
            next: 0,
            offset_s: 0.0,
            looping,
            jitter_s,
            pending: BinaryHeap::new(),
            next_id: 0,
            cycle: 0,
        }
    }

    /// Whether every arrival has been taken (never, when looping over a non-empty trace).
    pub fn exhausted(&self) -> bool {
        (!self.looping || self.base.is_empty()) && self.next >= self.base.len() && self.pending.is_empty()
    }

    /// The next copy arriving before `until` (trace seconds), earliest first, expanding base
    /// requests up to `until` at rate scale `k`; `None` when none is due yet.
    pub fn next_before(&mut self, until: f64, k: f64) -> Option<Job> {
        self.expand(until, k);
        let Pending(job) = *self.pending.peek()?;
        if job.arrival_s >= until {
            return None;
        }
        self.pending.pop();
        Some(job)
    }

    /// Expands base requests arriving before `until` into rate-scaled copies.
    fn expand(&mut self, until: f64, k: f64) {
        loop {
            if self.next >= self.base.len() {
                let span = self.base.last().map_or(0.0, |r| r.arrival_s) + 1.0;
                if !self.looping || self.base.is_empty() {
                    return;
                }
                self.next = 0;
                self.offset_s += span;
                self.cycle += 1;
            }
            let Some(request) = self.base.get(self.next) else {
                return;
            };
            let arrival = request.arrival_s + self.offset_s;
            if arrival >= until {
                return;
            }
            // Copies differ between loops: the hash index includes the cycle.
            let index = self.next + self.cycle * self.base.len();
            for copy in 0..copies(index, k) {
                let job = Job {
                    id: self.next_id,
                    arrival_s: arrival
                        + if k == 1.0 {
                            0.0
                        } else {
                            jitter(index, copy, self.jitter_s)
                        },
                    isl: request.isl,
                    osl: request.osl.max(1.0),
                };
                self.next_id += 1;
                self.pending.push(Pending(job));
            }
            self.next += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn azure_csv_is_relative_sorted_and_tolerates_no_final_newline() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:50.9951690,396,109\n2023-11-16 18:15:46.6805900,374,44\n2023-11-17 00:00:00.0000000,10,0";
        let requests = parse(text, "t.csv").unwrap();
        assert_eq!(requests.len(), 3);
        assert_eq!(requests[0].arrival_s, 0.0);
        assert_eq!(requests[0].isl, 374.0);
        assert!(
            (requests[1].arrival_s - 4.314579).abs() < 1e-6,
            "{}",
            requests[1].arrival_s
        );
        // Across midnight: 18:15:46.68 -> 00:00:00 is 20,653.32 s.
        assert!((requests[2].arrival_s - 20_653.319_41).abs() < 1e-4);
        assert_eq!(
            requests[2].osl, 1.0,
            "zero output tokens still yield the first token"
        );
    }

    #[test]
    fn mooncake_is_in_seconds_and_errors_name_the_file() {
        let text = "{\"timestamp\": 3000, \"input_length\": 10, \"output_length\": 5}\n{\"timestamp\": 1000, \"input_length\": 7, \"output_length\": 2, \"hash_ids\": []}\n";
        let requests = parse(text, "m.jsonl").unwrap();
        assert_eq!(
            requests,
            vec![
                Request {
                    arrival_s: 0.0,
                    isl: 7.0,
                    osl: 2.0
                },
                Request {
                    arrival_s: 2.0,
                    isl: 10.0,
                    osl: 5.0
                }
            ]
        );
        let err = parse("{\"timestamp\": 1}", "m.jsonl").unwrap_err();
        assert!(err.to_string().starts_with("m.jsonl: line 1"), "{err}");
        let err = parse("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1", "a.csv").unwrap_err();
        assert_eq!(err.to_string(), "a.csv: line 2: invalid TIMESTAMP `yesterday`");
        assert!(matches!(
            parse("a,b\n", "x").unwrap_err(),
            LoadTraceError::UnknownFormat { .. }
        ));
        assert!(parse("\n\n", "empty").unwrap().is_empty());
    }

    #[test]
    fn rate_scale_copies_with_bounded_deterministic_jitter() {
        let base: Vec<Request> = (0..100)
            .map(|i| Request {
                arrival_s: f64::from(i) * 10.0,
                isl: 100.0,
                osl: 10.0,
            })
            .collect();
        assert_eq!(scale(&base, 1.0, 1.0), base);
        let four = scale(&base, 4.0, 1.0);
        assert_eq!(four.len(), 400);
        assert_eq!(four, scale(&base, 4.0, 1.0), "deterministic");
        for window in four.windows(2) {
            assert!(window[0].arrival_s <= window[1].arrival_s);
        }
        // Every copy stays within the jitter of its original.
        for r in &four {
            let offset = r.arrival_s - (r.arrival_s / 10.0).floor() * 10.0;
            assert!((0.0..1.0).contains(&offset), "{offset}");
        }
        let half = scale(&base, 1.5, 0.5);
        assert!((130..=170).contains(&half.len()), "{}", half.len());
        assert!(scale(&base, 0.0, 1.0).is_empty());
    }

    #[test]
    fn arrivals_follow_the_rate_scale_in_force_and_loop() {
        let base: Vec<Request> = (0..10)
            .map(|i| Request {
                arrival_s: f64::from(i),
                isl: 100.0,
                osl: 0.0,
            })
            .collect();
        let mut arrivals = Arrivals::new(base.clone(), 0.5, false);
        let mut take = |until: f64, k: f64| {
            let mut jobs = Vec::new();
            while let Some(job) = arrivals.next_before(until, k) {
                jobs.push(job);
            }
            jobs
        };
        let first = take(5.0, 1.0);
        assert_eq!(
            first.iter().map(|j| j.arrival_s).collect::<Vec<_>>(),
            [0.0, 1.0, 2.0, 3.0, 4.0]
        );
        assert!(first.iter().all(|j| j.osl == 1.0), "at least one output token");
        // A step to three times the rate: three jittered copies of each later request.
        let stepped = take(8.0, 3.0);
        assert!((8..=9).contains(&stepped.len()), "{}", stepped.len());
        assert!(stepped.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s));
        let rest = take(100.0, 0.0);
        assert!(rest.len() <= 3, "copies jittered past 8 s only: {}", rest.len());
        assert!(arrivals.exhausted());

        let mut looping = Arrivals::new(base, 0.0, true);
        let mut count = 0;
        // A loop lasts 10 s (last arrival at 9 s, plus 1 s): before 25 s, 25 arrivals.
        while looping.next_before(25.0, 1.0).is_some() {
            count += 1;
        }
        assert_eq!(count, 25);
        assert!(!looping.exhausted());
    }
}
