//! The latency model's curves as the lookup tables Dynamo's mocker engine times itself by.
//!
//! Dynamo's mocker (`python -m dynamo.mocker --planner-profile-data FILE`, and the `dynamo_profile`
//! timing model of its offline replay) accepts an NPZ file of five arrays, the layout its
//! `planner_profiler_perf_data_converter` writes:
//!
//! - `prefill_isl`, `prefill_ttft_ms`: the prefill time of a prompt, by its length;
//! - `decode_active_kv_tokens`, `decode_context_length`: the axes of
//! - `decode_itl`: the time of one decode step, by the engine's active KV tokens (rows) and the
//!   mean context length of its batch (columns); the mocker derives the batch size as
//!   active KV tokens / context length.
//!
//! Given such a file the mocker uses it as is (a profile *directory* would be converted at
//! start-up through regression code that needs scikit-learn). The tables here are sampled from
//! [`LatencyModel`], so a mocker engine and this crate's latency model time a request alike:
//! prompts longer than the longest profiled one take proportionally longer here too.

use planner_core::interpolation::PerformanceCurves;

use crate::latency::LatencyModel;

/// Samples per axis: the converter's default resolution.
pub const RESOLUTION: usize = 100;

/// The five arrays of a mocker-format NPZ file.
#[derive(Clone, Debug, PartialEq)]
pub struct MockerTables {
    /// Prompt lengths (tokens), increasing.
    pub prefill_isl: Vec<f64>,
    /// Prefill time (ms) of one prompt of each length.
    pub prefill_ttft_ms: Vec<f64>,
    /// Active KV tokens of one decode engine, increasing from 0 to its capacity.
    pub decode_active_kv_tokens: Vec<f64>,
    /// Mean context length (tokens) of the batch, increasing from 1.
    pub decode_context_length: Vec<f64>,
    /// Decode step time (ms), `[kv row][context column]`, row-major.
    pub decode_itl: Vec<f64>,
}

impl MockerTables {
    /// Samples `model` up to prompts of `max_isl` tokens (past the profiled range when longer).
    pub fn sample<C: PerformanceCurves>(model: &LatencyModel<'_, C>, max_context: f64, max_isl: f64) -> Self {
        let profiled = model.spec.max_profiled_isl;
        // The profiled range at full resolution, then a few points out to the longest prompt,
        // where the model is linear in the prompt length.
        let mut prefill_isl = linspace(1.0, profiled.min(max_isl).max(2.0), RESOLUTION);
        if max_isl > profiled {
            prefill_isl.extend(linspace(profiled, max_isl, 11).into_iter().skip(1));
        }
        let prefill_ttft_ms = prefill_isl
            .iter()
            .map(|&isl| model.prefill_time_s(isl) * 1000.0)
            .collect();
        let decode_active_kv_tokens = linspace(0.0, model.spec.max_kv_tokens, RESOLUTION);
        let decode_context_length = linspace(1.0, max_context.max(2.0), RESOLUTION);
        let decode_itl = decode_active_kv_tokens
            .iter()
            .flat_map(|&kv| {
                decode_context_length.iter().map(move |&context| {
                    // At least one request: an idle engine's step is a one-request step.
                    let concurrency = (kv / context).max(1.0);
                    model.itl_s(concurrency, context) * 1000.0
                })
            })
            .collect();
        Self {
            prefill_isl,
            prefill_ttft_ms,
            decode_active_kv_tokens,
            decode_context_length,
            decode_itl,
        }
    }
}

/// numpy's `linspace(start, stop, n)` (n >= 2).
fn linspace(start: f64, stop: f64, n: usize) -> Vec<f64> {
    let step = (stop - start) / (n - 1) as f64;
    (0..n)
        .map(|i| if i + 1 == n { stop } else { start + i as f64 * step })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner_core::{interpolation::PerformanceModel, profile::Profile};

    use crate::latency::EngineSpec;

    #[test]
    fn the_tables_time_requests_as_the_latency_model_does() {
        let profile = Profile::builtin("h200-llama3.1-8b-tp1").unwrap();
        let curves = PerformanceModel::new(&profile).unwrap();
        let model = LatencyModel::new(&curves, EngineSpec::from_profile(&profile));
        let tables = MockerTables::sample(&model, 16_384.0, 131_072.0);

        assert!(
            tables.prefill_isl.windows(2).all(|w| w[0] < w[1]),
            "prefill_isl increases"
        );
        assert_eq!(tables.prefill_isl.len(), tables.prefill_ttft_ms.len());
        assert_eq!(*tables.prefill_isl.last().unwrap(), 131_072.0);
        for (isl, ttft) in tables.prefill_isl.iter().zip(&tables.prefill_ttft_ms) {
            assert_eq!(*ttft, model.prefill_time_s(*isl) * 1000.0);
        }
        // Past the profile, a prompt twice as long takes twice as long.
        let profiled = model.spec.max_profiled_isl;
        let at = |isl: f64| model.prefill_time_s(isl);
        assert!((at(2.0 * profiled) / at(profiled) - 2.0).abs() < 1e-9);

        let (rows, cols) = (
            tables.decode_active_kv_tokens.len(),
            tables.decode_context_length.len(),
        );
        assert_eq!((rows, cols), (RESOLUTION, RESOLUTION));
        assert_eq!(tables.decode_itl.len(), rows * cols);
        assert_eq!(
            *tables.decode_active_kv_tokens.last().unwrap(),
            profile.decode.max_kv_tokens
        );
        // Row i, column j: kv_i active tokens in requests of context_j each.
        let (i, j) = (60, 30);
        let kv = tables.decode_active_kv_tokens[i];
        let context = tables.decode_context_length[j];
        assert_eq!(
            tables.decode_itl[i * cols + j],
            model.itl_s(kv / context, context) * 1000.0
        );
        // A fuller cache steps no faster.
        let column: Vec<f64> = (0..rows).map(|r| tables.decode_itl[r * cols + j]).collect();
        assert!(column.last().unwrap() >= column.first().unwrap());
    }
}
