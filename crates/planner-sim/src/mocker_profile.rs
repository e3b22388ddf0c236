//! `planner-sim mocker-profile`: writes a profile's latencies as the NPZ file Dynamo's mocker
//! engine (`python -m dynamo.mocker --planner-profile-data FILE`) and its offline replay time
//! themselves by, so that real Dynamo engines in the test bed serve as fast as the profile a
//! PlannerPolicy plans with (see [`planner_sim_engine::mocker`]).

use std::path::{Path, PathBuf};

use ndarray::{Array1, Array2};
use ndarray_npy::NpzWriter;
use planner_core::{
    interpolation::PerformanceModel,
    profile::{Profile, builtin_names},
};
use planner_sim_engine::{
    latency::{EngineSpec, LatencyModel},
    mocker::MockerTables,
};

/// Arguments of `planner-sim mocker-profile`.
#[derive(Debug, clap::Args)]
pub struct MockerProfileArgs {
    /// Built-in profile.
    #[arg(long, value_name = "NAME", required_unless_present = "profile_dir",
          value_parser = clap::builder::PossibleValuesParser::new(builtin_names().collect::<Vec<_>>()))]
    profile: Option<String>,
    /// Upstream profile directory instead of a built-in profile.
    #[arg(long, value_name = "DIR", conflicts_with = "profile")]
    profile_dir: Option<PathBuf>,
    /// Longest prompt (tokens) the prefill table covers; longer ones than the profile's take
    /// proportionally longer, as in the simulator. The default covers the bench traces (the
    /// longest Mooncake prompt is 126,527 tokens).
    #[arg(long, value_name = "TOKENS", default_value_t = MAX_ISL)]
    max_isl: f64,
    /// Longest mean context (tokens) the decode table covers (default: the profile's).
    #[arg(long, value_name = "TOKENS")]
    max_context: Option<f64>,
    /// The NPZ file to write.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

/// Longest prompt the prefill table covers by default: the test model's context, past the
/// longest Mooncake prompt (126,527 tokens).
pub const MAX_ISL: f64 = 131_072.0;

/// Why the file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum MockerProfileError {
    /// The profile could not be read or interpolated, or a length is not positive.
    #[error("{0}")]
    Input(String),
    /// The output could not be written.
    #[error("cannot write {path}: {message}")]
    Output {
        /// The file.
        path: String,
        /// What failed.
        message: String,
    },
}

/// Writes the NPZ file; returns a one-line summary.
pub fn mocker_profile(args: &MockerProfileArgs) -> Result<String, MockerProfileError> {
    let profile = match (&args.profile_dir, &args.profile) {
        (Some(dir), _) => Profile::from_dir(dir),
        (None, Some(name)) => Profile::builtin(name),
        (None, None) => {
            return Err(MockerProfileError::Input(
                "give --profile or --profile-dir".into(),
            ));
        }
    }
    .map_err(|e| MockerProfileError::Input(e.to_string()))?;
    write_profile(&profile, args.max_isl, args.max_context, &args.out)
}

/// Writes `profile`'s latencies to `out` as the mocker's NPZ tables, prompts up to `max_isl`
/// tokens and mean contexts up to `max_context` (default: the profile's); returns a one-line
/// summary.
pub fn write_profile(
    profile: &Profile,
    max_isl: f64,
    max_context: Option<f64>,
    out: &Path,
) -> Result<String, MockerProfileError> {
    let curves = PerformanceModel::new(profile).map_err(|e| MockerProfileError::Input(e.to_string()))?;
    let model = LatencyModel::new(&curves, EngineSpec::from_profile(profile));
    let profiled_context = profile.decode.context_length.iter().copied().fold(0.0, f64::max);
    let max_context = max_context.unwrap_or(profiled_context);
    for (flag, value) in [("--max-isl", max_isl), ("--max-context", max_context)] {
        if !(value.is_finite() && value >= 2.0) {
            return Err(MockerProfileError::Input(format!(
                "{flag} must be a number of tokens >= 2, not {value}"
            )));
        }
    }
    let tables = MockerTables::sample(&model, max_context, max_isl);
    write_npz(&tables, out).map_err(|message| MockerProfileError::Output {
        path: out.display().to_string(),
        message,
    })?;
    Ok(format!(
        "wrote {}: prefill {} prompt lengths up to {} tokens, decode {}x{} (KV tokens up to {}, context up to {})",
        out.display(),
        tables.prefill_isl.len(),
        max_isl,
        tables.decode_active_kv_tokens.len(),
        tables.decode_context_length.len(),
        profile.decode.max_kv_tokens,
        max_context,
    ))
}

pub(crate) fn write_npz(tables: &MockerTables, path: &Path) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| e.to_string())?;
    let mut npz = NpzWriter::new(file);
    let vector = |values: &[f64]| Array1::from(values.to_vec());
    let itl = Array2::from_shape_vec(
        (
            tables.decode_active_kv_tokens.len(),
            tables.decode_context_length.len(),
        ),
        tables.decode_itl.clone(),
    )
    .map_err(|e| e.to_string())?;
    let add = |name: &str, result: Result<(), ndarray_npy::WriteNpzError>| {
        result.map_err(|e| format!("{name}: {e}"))
    };
    add(
        "prefill_isl",
        npz.add_array("prefill_isl", &vector(&tables.prefill_isl)),
    )?;
    add(
        "prefill_ttft_ms",
        npz.add_array("prefill_ttft_ms", &vector(&tables.prefill_ttft_ms)),
    )?;
    add(
        "decode_active_kv_tokens",
        npz.add_array(
            "decode_active_kv_tokens",
            &vector(&tables.decode_active_kv_tokens),
        ),
    )?;
    add(
        "decode_context_length",
        npz.add_array("decode_context_length", &vector(&tables.decode_context_length)),
    )?;
    add("decode_itl", npz.add_array("decode_itl", &itl))?;
    npz.finish().map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use ndarray::{Array1, Array2};
    use ndarray_npy::NpzReader;

    use super::*;

    fn args(out: &Path) -> MockerProfileArgs {
        MockerProfileArgs {
            profile: Some("h200-llama3.1-8b-tp1".into()),
            profile_dir: None,
            max_isl: 65_536.0,
            max_context: None,
            out: out.to_path_buf(),
        }
    }

    #[test]
    fn writes_the_five_arrays_the_mocker_reads() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("perf_data.npz");
        mocker_profile(&args(&out)).unwrap();

        let mut npz = NpzReader::new(std::fs::File::open(&out).unwrap()).unwrap();
        let mut names = npz.names().unwrap();
        names.sort();
        assert_eq!(
            names,
            [
                "decode_active_kv_tokens",
                "decode_context_length",
                "decode_itl",
                "prefill_isl",
                "prefill_ttft_ms"
            ]
        );
        let isl: Array1<f64> = npz.by_name("prefill_isl").unwrap();
        let ttft: Array1<f64> = npz.by_name("prefill_ttft_ms").unwrap();
        let kv: Array1<f64> = npz.by_name("decode_active_kv_tokens").unwrap();
        let context: Array1<f64> = npz.by_name("decode_context_length").unwrap();
        let itl: Array2<f64> = npz.by_name("decode_itl").unwrap();
        assert_eq!(isl.len(), ttft.len());
        assert_eq!(isl[isl.len() - 1], 65_536.0);
        assert_eq!(itl.dim(), (kv.len(), context.len()));
        assert!(ttft.iter().chain(itl.iter()).all(|v| v.is_finite() && *v > 0.0));
    }

    #[test]
    fn a_length_that_is_not_a_token_count_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut bad = args(&dir.path().join("x.npz"));
        bad.max_isl = f64::NAN;
        let error = mocker_profile(&bad).unwrap_err().to_string();
        assert!(error.contains("--max-isl"), "{error}");
        bad.max_isl = 1000.0;
        bad.max_context = Some(0.0);
        let error = mocker_profile(&bad).unwrap_err().to_string();
        assert!(error.contains("--max-context"), "{error}");
    }
}
