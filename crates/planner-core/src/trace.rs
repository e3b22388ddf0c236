//! Mooncake JSONL request traces, used to warm the load predictors up before live traffic
//! (upstream `--load-predictor-warmup-trace`).
//!
//! One JSON object per line with `timestamp` (milliseconds), `input_length` and
//! `output_length`; other fields (`hash_ids`) are ignored. Requests are grouped into intervals
//! of the planner's adjustment interval, and each non-empty interval becomes one observation
//! for the three predictors. Empty intervals are skipped rather than zero-filled, as upstream
//! does: a gap in a sampled trace is not evidence of an idle service.
//!
//! Traces may come from users (a ConfigMap), so parsing is bounded: each line is read into
//! the three numbers it needs (other fields are skipped, not kept), a line may be at most
//! [`MAX_LINE_BYTES`] long and a trace at most [`MAX_RECORDS`] requests.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, de::IgnoredAny};

/// Longest line accepted, in bytes (published Mooncake lines, with their `hash_ids`, are at
/// most a few kilobytes).
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// Most requests a trace may hold.
pub const MAX_RECORDS: usize = 10_000_000;

/// One request of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceRecord {
    /// Arrival time in milliseconds (from any origin).
    pub timestamp_ms: f64,
    /// Prompt length in tokens.
    pub input_length: f64,
    /// Generated length in tokens.
    pub output_length: f64,
}

/// The requests of one interval, as the planner would have observed them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceBucket {
    /// Start of the interval in seconds (a multiple of the interval).
    pub start_s: f64,
    /// Requests that arrived in the interval.
    pub request_count: f64,
    /// Mean input length of those requests.
    pub avg_isl: f64,
    /// Mean output length of those requests.
    pub avg_osl: f64,
}

/// Why a trace could not be read. Line numbers start at 1.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TraceError {
    /// The line is not a JSON object.
    #[error("line {line}: not a JSON object: {message}")]
    InvalidJson {
        /// 1-based line number.
        line: usize,
        /// The parser's message.
        message: String,
    },
    /// A required field is absent.
    #[error("line {line}: missing field `{field}`")]
    MissingField {
        /// 1-based line number.
        line: usize,
        /// The field's name.
        field: &'static str,
    },
    /// A field is not a finite, non-negative number.
    #[error("line {line}: field `{field}` must be a finite non-negative number, got {value}")]
    InvalidField {
        /// 1-based line number.
        line: usize,
        /// The field's name.
        field: &'static str,
        /// The offending value as written.
        value: String,
    },
    /// The line is longer than [`MAX_LINE_BYTES`].
    #[error("line {line}: {len} bytes long, more than the limit of {max} bytes per line")]
    LineTooLong {
        /// 1-based line number.
        line: usize,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The trace has more than [`MAX_RECORDS`] requests.
    #[error("line {line}: the trace has more than the limit of {max} requests")]
    TooManyRecords {
        /// 1-based number of the first line past the limit.
        line: usize,
        /// The limit.
        max: usize,
    },
}

/// The fields of a line the parser reads; every other field is skipped without being kept.
#[derive(Deserialize)]
struct Line {
    #[serde(default, deserialize_with = "present")]
    timestamp: Option<Field>,
    #[serde(default, deserialize_with = "present")]
    input_length: Option<Field>,
    #[serde(default, deserialize_with = "present")]
    output_length: Option<Field>,
}

/// A field that is present, `null` included (which is not a number, rather than missing).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Field>, D::Error> {
    Field::deserialize(deserializer).map(Some)
}

/// A field's value: a number, or anything else (shown in the error as its JSON type).
enum Field {
    Number(f64),
    Other(&'static str),
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Field;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("any JSON value")
            }

            fn visit_f64<E>(self, v: f64) -> Result<Field, E> {
                Ok(Field::Number(v))
            }

            fn visit_i64<E>(self, v: i64) -> Result<Field, E> {
                Ok(Field::Number(v as f64))
            }

            fn visit_u64<E>(self, v: u64) -> Result<Field, E> {
                Ok(Field::Number(v as f64))
            }

            fn visit_str<E>(self, _: &str) -> Result<Field, E> {
                Ok(Field::Other("a string"))
            }

            fn visit_bool<E>(self, _: bool) -> Result<Field, E> {
                Ok(Field::Other("a boolean"))
            }

            fn visit_unit<E>(self) -> Result<Field, E> {
                Ok(Field::Other("null"))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Field, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Field::Other("a list"))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Field, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Field::Other("an object"))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

fn number_field(value: Option<Field>, field: &'static str, line: usize) -> Result<f64, TraceError> {
    match value.ok_or(TraceError::MissingField { line, field })? {
        Field::Number(number) if number.is_finite() && number >= 0.0 => Ok(number),
        Field::Number(number) => Err(TraceError::InvalidField {
            line,
            field,
            value: number.to_string(),
        }),
        Field::Other(kind) => Err(TraceError::InvalidField {
            line,
            field,
            value: kind.to_string(),
        }),
    }
}

/// Parses a Mooncake JSONL trace. Blank lines are skipped; any other line must be an object
/// with numeric `timestamp`, `input_length` and `output_length`.
pub fn parse_mooncake_jsonl(text: &str) -> Result<Vec<TraceRecord>, TraceError> {
    let mut records = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        if raw.len() > MAX_LINE_BYTES {
            return Err(TraceError::LineTooLong {
                line,
                len: raw.len(),
                max: MAX_LINE_BYTES,
            });
        }
        if records.len() >= MAX_RECORDS {
            return Err(TraceError::TooManyRecords {
                line,
                max: MAX_RECORDS,
            });
        }
        if !raw.starts_with('{') {
            return Err(TraceError::InvalidJson {
                line,
                message: format!(
                    "expected an object, got {}",
                    raw.chars().take(40).collect::<String>()
                ),
            });
        }
        let fields: Line = serde_json::from_str(raw).map_err(|e| TraceError::InvalidJson {
            line,
            message: e.to_string(),
        })?;
        records.push(TraceRecord {
            timestamp_ms: number_field(fields.timestamp, "timestamp", line)?,
            input_length: number_field(fields.input_length, "input_length", line)?,
            output_length: number_field(fields.output_length, "output_length", line)?,
        });
    }
    Ok(records)
}

/// Groups records into `interval_seconds` intervals (interval `k` starts at `k * interval`,
/// `k = floor(timestamp_s / interval)`), oldest first, skipping empty intervals. A non-positive
/// or non-finite interval gives no buckets.
pub fn bucketize(records: &[TraceRecord], interval_seconds: f64) -> Vec<TraceBucket> {
    if interval_seconds.is_nan() || interval_seconds <= 0.0 || !interval_seconds.is_finite() {
        return Vec::new();
    }
    // (count, sum of input lengths, sum of output lengths) per interval index.
    let mut sums: BTreeMap<i64, (f64, f64, f64)> = BTreeMap::new();
    for record in records {
        let index = (record.timestamp_ms / 1000.0 / interval_seconds).floor();
        if !index.is_finite() {
            continue;
        }
        let entry = sums.entry(index as i64).or_insert((0.0, 0.0, 0.0));
        entry.0 += 1.0;
        entry.1 += record.input_length;
        entry.2 += record.output_length;
    }
    sums.into_iter()
        .map(|(index, (count, isl, osl))| TraceBucket {
            start_s: index as f64 * interval_seconds,
            request_count: count,
            avg_isl: isl / count,
            avg_osl: osl / count,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_buckets() {
        let text = concat!(
            "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [1]}\n",
            "\n",
            "{\"timestamp\": 1500, \"input_length\": 30, \"output_length\": 4}\n",
            "{\"timestamp\": 7000, \"input_length\": 5, \"output_length\": 1}\n",
        );
        let records = parse_mooncake_jsonl(text).unwrap();
        assert_eq!(records.len(), 3);
        let buckets = bucketize(&records, 2.0);
        assert_eq!(
            buckets,
            vec![
                TraceBucket {
                    start_s: 0.0,
                    request_count: 2.0,
                    avg_isl: 20.0,
                    avg_osl: 3.0
                },
                // 2-4 s and 4-6 s are empty and skipped.
                TraceBucket {
                    start_s: 6.0,
                    request_count: 1.0,
                    avg_isl: 5.0,
                    avg_osl: 1.0
                },
            ]
        );
    }

    #[test]
    fn errors_name_line_and_field() {
        let missing = "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n{\"timestamp\": 5, \"input_length\": 1}\n";
        let err = parse_mooncake_jsonl(missing).unwrap_err();
        assert_eq!(
            err,
            TraceError::MissingField {
                line: 2,
                field: "output_length"
            }
        );
        assert_eq!(err.to_string(), "line 2: missing field `output_length`");

        let wrong = "{\"timestamp\": \"soon\", \"input_length\": 1, \"output_length\": 1}";
        let err = parse_mooncake_jsonl(wrong).unwrap_err();
        assert!(
            matches!(
                err,
                TraceError::InvalidField {
                    line: 1,
                    field: "timestamp",
                    ..
                }
            ),
            "{err}"
        );

        let negative = "{\"timestamp\": 1, \"input_length\": -3, \"output_length\": 1}";
        assert!(matches!(
            parse_mooncake_jsonl(negative).unwrap_err(),
            TraceError::InvalidField {
                line: 1,
                field: "input_length",
                ..
            }
        ));

        let broken = "{\"timestamp\": 1, \"input_length\": 3, \"output_length\": 1}\nnot json";
        assert!(matches!(
            parse_mooncake_jsonl(broken).unwrap_err(),
            TraceError::InvalidJson { line: 2, .. }
        ));
        assert!(matches!(
            parse_mooncake_jsonl("[1, 2]").unwrap_err(),
            TraceError::InvalidJson { line: 1, .. }
        ));
    }

    #[test]
    fn degenerate_interval_gives_no_buckets() {
        let records = [TraceRecord {
            timestamp_ms: 0.0,
            input_length: 1.0,
            output_length: 1.0,
        }];
        assert!(bucketize(&records, 0.0).is_empty());
        assert!(bucketize(&records, f64::NAN).is_empty());
        assert!(bucketize(&[], 60.0).is_empty());
    }
}
