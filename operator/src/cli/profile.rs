//! `planner-operator profile`: reads a profile the way the operator does and says what it holds
//! (`check`), or writes a profile directory as the ConfigMap a PlannerPolicy names
//! (`configmap`).
//!
//! A profile directory is read as Dynamo's profiler writes it
//! (`selected_{prefill,decode}_interpolation/raw_data.npz`) or in the JSON form
//! (`prefill_raw_data.json`, `decode_raw_data.json`), NPZ first, by
//! [`Profile::from_dir`], so errors name the files. Its parts are then packed under the
//! ConfigMap keys the operator reads and loaded again with the operator's own ConfigMap loader
//! ([`PerformanceModel::from_config_map_entries`]): what `check` accepts is what the operator
//! loads from what `configmap` writes.

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap::{ArgGroup, Args, Subcommand, ValueEnum};
use k8s_openapi::{ByteString, api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use planner_core::{
    interpolation::{InterpolationError, ModelError, PerformanceCurves, PerformanceModel},
    profile::{
        ConfigMapEntries, DECODE_JSON, DECODE_NPZ, DECODE_NPZ_KEY, PREFILL_JSON, PREFILL_NPZ,
        PREFILL_NPZ_KEY, PrefillProfile, Profile, ProfileError, builtin_engine_gpus, builtin_names,
    },
};
use serde::Serialize;

use planner_api::ComponentType;

use crate::{
    controller::planner_policy::dereference::config_map_entries,
    target::{GPU_RESOURCE, TargetGraph},
};

/// The `profile` subcommands.
#[derive(Debug, Subcommand)]
pub enum ProfileCommand {
    /// Read a profile as the operator does and print what it says: the prompt lengths and
    /// contexts it covers, the KV capacity, and the throughput per GPU at latency targets. Exits
    /// with 2, naming the file, the entry and what is wrong, when the operator would refuse it.
    Check(CheckArgs),
    /// Print a profile directory as the ConfigMap (YAML) a PlannerPolicy's
    /// `spec.profile.configMapRef` names: NPZ files under `binaryData`, JSON files under `data`.
    /// Pipe it to `kubectl apply -f -`. Exits with 2 when the operator would refuse the profile.
    Configmap(ConfigMapArgs),
}

/// Arguments of `profile check`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["path", "builtin"])))]
pub struct CheckArgs {
    /// A profile directory (Dynamo's profiler output, with
    /// `selected_prefill_interpolation/raw_data.npz` and
    /// `selected_decode_interpolation/raw_data.npz`, or `prefill_raw_data.json` and
    /// `decode_raw_data.json`), or a ConfigMap manifest in YAML or JSON (`-` reads it from
    /// standard input, e.g. from `kubectl get configmap NAME -o yaml`).
    path: Option<PathBuf>,
    /// A built-in profile instead of PATH.
    #[arg(long, value_name = "NAME", value_parser = clap::builder::PossibleValuesParser::new(builtin_names().collect::<Vec<_>>()))]
    builtin: Option<String>,
    /// TTFT target in milliseconds (default: the PlannerPolicy's `sla.ttftMs` default).
    #[arg(long, value_name = "MS", default_value_t = 500.0, value_parser = positive)]
    ttft_ms: f64,
    /// ITL target in milliseconds (default: the PlannerPolicy's `sla.itlMs` default).
    #[arg(long, value_name = "MS", default_value_t = 50.0, value_parser = positive)]
    itl_ms: f64,
    /// Prompt length (tokens) the figures are given at (default: the workload a
    /// DynamoGraphDeploymentRequest profiles for when it names none, in Dynamo 1.6.1).
    #[arg(long, value_name = "TOKENS", default_value_t = 4000.0, value_parser = positive)]
    isl: f64,
    /// Output length (tokens); decode is read at the context ISL + OSL/2, as Dynamo's planner
    /// does (default: as for `--isl`).
    #[arg(long, value_name = "TOKENS", default_value_t = 1000.0, value_parser = positive)]
    osl: f64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
}

/// Arguments of `profile configmap`.
#[derive(Debug, Args)]
pub struct ConfigMapArgs {
    /// A profile directory: Dynamo's profiler output (`selected_prefill_interpolation/raw_data.npz`
    /// and `selected_decode_interpolation/raw_data.npz`) or the JSON form
    /// (`prefill_raw_data.json` and `decode_raw_data.json`).
    path: PathBuf,
    /// The ConfigMap's name, which the PlannerPolicy's `spec.profile.configMapRef.name` gives.
    #[arg(long, value_name = "NAME")]
    name: String,
    /// The ConfigMap's namespace: the PlannerPolicy's (default: none written, so kubectl's
    /// current namespace).
    #[arg(long, value_name = "NAMESPACE")]
    namespace: Option<String>,
}

/// How `check` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Lines for a person.
    Text,
    /// One JSON document.
    Json,
}

/// Largest total of a ConfigMap's values the API server accepts (`data` plus the decoded
/// `binaryData`), in bytes.
pub const MAX_CONFIG_MAP_BYTES: usize = 1024 * 1024;
/// Largest ConfigMap manifest read by `check`: the largest ConfigMap, base64-encoded, with room
/// for its metadata.
const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;
/// Prompt lengths the TTFT curve is sampled at to find the longest prompt meeting the target.
const TTFT_SCAN_POINTS: usize = 1000;

/// Why a profile command failed. Every message names the file, field or flag at fault.
#[derive(Debug, thiserror::Error)]
pub enum ProfileCommandError {
    /// PATH does not exist.
    #[error("{0}: no such file or directory")]
    NotFound(String),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The profile's data is refused by the operator's reader.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// A ConfigMap's profile is refused by the operator's loader.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The profile reads but cannot be interpolated.
    #[error("{profile}: {error}")]
    Interpolation {
        /// Where the profile came from.
        profile: String,
        /// Why.
        error: InterpolationError,
    },
    /// A file given as a ConfigMap manifest is not one.
    #[error("{path}: {reason}")]
    Manifest {
        /// The file (`-` for standard input).
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A name flag is not a valid Kubernetes name.
    #[error("--{flag} {value:?} is invalid: allowed is {allowed}")]
    BadName {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// The ConfigMap would be larger than the API server accepts.
    #[error(
        "the profile in {path} takes {size} bytes, more than the {MAX_CONFIG_MAP_BYTES} bytes a ConfigMap may hold"
    )]
    TooLarge {
        /// The profile directory.
        path: String,
        /// The total of the values.
        size: usize,
    },
    /// The output could not be rendered.
    #[error("cannot render the output: {0}")]
    Render(String),
}

/// Runs a `profile` subcommand: the document on standard output, or the error on standard
/// error with exit code 2.
pub fn main(command: ProfileCommand) -> ExitCode {
    let (name, result) = match command {
        ProfileCommand::Check(args) => ("check", check(&args)),
        ProfileCommand::Configmap(args) => ("configmap", configmap(&args)),
    };
    match result {
        Ok(document) => super::write_stdout(document.trim_end()),
        Err(error) => {
            eprintln!("planner-operator profile {name}: {error}");
            ExitCode::from(super::EXIT_BAD_INPUT)
        }
    }
}

/// `profile check`: load, then report at the targets.
pub fn check(args: &CheckArgs) -> Result<String, ProfileCommandError> {
    let loaded = match (&args.path, &args.builtin) {
        (_, Some(name)) => load_builtin(name)?,
        (Some(path), None) if path.as_os_str() == "-" => load_manifest(path)?,
        (Some(path), None) if path.is_dir() => load_dir(path)?.0,
        (Some(path), None) if path.is_file() => load_manifest(path)?,
        (Some(path), None) => return Err(ProfileCommandError::NotFound(path.display().to_string())),
        (None, None) => return Err(ProfileCommandError::NotFound("no PATH and no --builtin".into())),
    };
    let targets = Targets {
        isl: args.isl,
        osl: args.osl,
        context_length: args.isl + args.osl / 2.0,
        ttft_ms: args.ttft_ms,
        itl_ms: args.itl_ms,
    };
    let report = report(&loaded, targets);
    match args.output {
        Output::Text => Ok(render_text(&report)),
        Output::Json => {
            serde_json::to_string_pretty(&report).map_err(|e| ProfileCommandError::Render(e.to_string()))
        }
    }
}

/// `profile configmap`: check the names, load the directory, then print its ConfigMap.
pub fn configmap(args: &ConfigMapArgs) -> Result<String, ProfileCommandError> {
    check_name(
        "name",
        &args.name,
        253,
        "a DNS subdomain: at most 253 lower-case letters, digits, '-' and '.', starting and ending with a letter or digit",
    )?;
    if let Some(namespace) = &args.namespace {
        check_name(
            "namespace",
            namespace,
            63,
            "a DNS label: at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit",
        )?;
    }
    if !args.path.is_dir() {
        return Err(ProfileCommandError::NotFound(format!(
            "{} (a profile directory)",
            args.path.display()
        )));
    }
    let (_, parts) = load_dir(&args.path)?;
    let size: usize = parts.iter().map(|part| part.bytes.len()).sum();
    if size > MAX_CONFIG_MAP_BYTES {
        return Err(ProfileCommandError::TooLarge {
            path: args.path.display().to_string(),
            size,
        });
    }
    let mut config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(args.name.clone()),
            namespace: args.namespace.clone(),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    for part in parts {
        if part.binary {
            config_map
                .binary_data
                .get_or_insert_default()
                .insert(part.key.to_string(), ByteString(part.bytes));
        } else {
            // The JSON reader took these bytes, so they are UTF-8.
            let text =
                String::from_utf8(part.bytes).map_err(|e| ProfileCommandError::Render(e.to_string()))?;
            config_map
                .data
                .get_or_insert_default()
                .insert(part.key.to_string(), text);
        }
    }
    serde_yaml::to_string(&config_map).map_err(|e| ProfileCommandError::Render(e.to_string()))
}

// === Loading ===

/// A profile loaded as the operator loads it, and what is known about where it came from.
struct Loaded {
    /// What was read, for the report.
    source: String,
    /// The file (or ConfigMap key) each part came from.
    prefill_file: String,
    decode_file: String,
    /// GPUs of one engine of each pool, when the source records them.
    engine_gpus: EngineGpus,
    /// What could not be read beside the profile itself.
    warnings: Vec<String>,
    profile: Profile,
    model: PerformanceModel,
}

/// One part of a profile directory as a ConfigMap entry.
struct Part {
    /// The ConfigMap key the operator reads it under.
    key: &'static str,
    /// NPZ (`binaryData`) or JSON (`data`).
    binary: bool,
    bytes: Vec<u8>,
}

/// Reads a directory with the planner core's reader (errors name the files), packs its parts
/// under the ConfigMap keys, and loads those with the operator's ConfigMap loader.
fn load_dir(dir: &Path) -> Result<(Loaded, Vec<Part>), ProfileCommandError> {
    let profile = Profile::from_dir(dir)?;
    // Which file holds each part: the NPZ when present, else the JSON (the reader's order).
    let part = |npz: &str, npz_key: &'static str, json: &'static str| {
        let (relative, key, binary) = if dir.join(npz).is_file() {
            (npz, npz_key, true)
        } else {
            (json, json, false)
        };
        let path = dir.join(relative);
        let bytes = std::fs::read(&path).map_err(|source| ProfileCommandError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Ok::<_, ProfileCommandError>((path.display().to_string(), Part { key, binary, bytes }))
    };
    let (prefill_file, prefill) = part(PREFILL_NPZ, PREFILL_NPZ_KEY, PREFILL_JSON)?;
    let (decode_file, decode) = part(DECODE_NPZ, DECODE_NPZ_KEY, DECODE_JSON)?;
    let parts = vec![prefill, decode];
    let source = format!("directory {}", dir.display());
    let entries = ConfigMapEntries {
        data: parts
            .iter()
            .filter(|part| !part.binary)
            .map(|part| (part.key, std::str::from_utf8(&part.bytes).unwrap_or_default()))
            .collect(),
        binary_data: parts
            .iter()
            .filter(|part| part.binary)
            .map(|part| (part.key, part.bytes.as_slice()))
            .collect(),
    };
    let model = PerformanceModel::from_config_map_entries(&format!("ConfigMap of {source}"), &entries)?;
    let layout = if parts.iter().all(|part| part.binary) {
        "Dynamo's profiler layout"
    } else {
        "JSON form"
    };
    let mut warnings = Vec::new();
    let mut engine_gpus = |pool: &str| match engine_gpus(dir, pool) {
        Ok(gpus) => gpus,
        Err(warning) => {
            warnings.push(warning);
            None
        }
    };
    let engine_gpus = EngineGpus {
        prefill: engine_gpus("prefill"),
        decode: engine_gpus("decode"),
    };
    let loaded = Loaded {
        source: format!("{source} ({layout})"),
        prefill_file,
        decode_file,
        engine_gpus,
        warnings,
        profile,
        model,
    };
    Ok((loaded, parts))
}

/// Reads a ConfigMap manifest and loads it with the operator's ConfigMap loader.
fn load_manifest(path: &Path) -> Result<Loaded, ProfileCommandError> {
    let shown = path.display().to_string();
    let manifest = |reason: String| ProfileCommandError::Manifest {
        path: shown.clone(),
        reason,
    };
    let mut text = String::new();
    let read = if shown == "-" {
        std::io::stdin()
            .take(MAX_MANIFEST_BYTES + 1)
            .read_to_string(&mut text)
    } else {
        std::fs::File::open(path).and_then(|file| file.take(MAX_MANIFEST_BYTES + 1).read_to_string(&mut text))
    };
    read.map_err(|source| ProfileCommandError::Read {
        path: shown.clone(),
        source,
    })?;
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(manifest(format!(
            "longer than {MAX_MANIFEST_BYTES} bytes; a ConfigMap holds at most {MAX_CONFIG_MAP_BYTES}"
        )));
    }
    let value: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|e| manifest(format!("not a YAML or JSON document: {e}")))?;
    let kind = value.get("kind").and_then(serde_yaml::Value::as_str);
    if kind != Some("ConfigMap") {
        return Err(manifest(format!(
            "kind is {kind:?}; expected a profile directory or a ConfigMap manifest"
        )));
    }
    let config_map: ConfigMap =
        serde_yaml::from_value(value).map_err(|e| manifest(format!("not a valid ConfigMap: {e}")))?;
    let name = config_map.metadata.name.clone().unwrap_or_default();
    // Named as the operator names it in `ProfileLoaded`.
    let source = format!("ConfigMap {name}");
    let entries = config_map_entries(&config_map);
    // The operator's load (the model), and the profile's figures for the report.
    let model = PerformanceModel::from_config_map_entries(&source, &entries)
        .map_err(|error| manifest(error.to_string()))?;
    let profile =
        Profile::from_config_map_entries(&source, &entries).map_err(|error| manifest(error.to_string()))?;
    let key = |npz: &str, json: &str| {
        if entries.binary_data.contains_key(npz) {
            format!("{source}/{npz}")
        } else {
            format!("{source}/{json}")
        }
    };
    Ok(Loaded {
        source: format!("{source} from {shown}"),
        prefill_file: key(PREFILL_NPZ_KEY, PREFILL_JSON),
        decode_file: key(DECODE_NPZ_KEY, DECODE_JSON),
        engine_gpus: EngineGpus::default(),
        warnings: Vec::new(),
        profile,
        model,
    })
}

/// Loads a built-in profile as the operator does.
fn load_builtin(name: &str) -> Result<Loaded, ProfileCommandError> {
    let profile = Profile::builtin(name)?;
    let model = PerformanceModel::new(&profile).map_err(|error| ProfileCommandError::Interpolation {
        profile: format!("built-in profile {name}"),
        error,
    })?;
    Ok(Loaded {
        source: format!("built-in profile {name}"),
        prefill_file: format!("builtin:{name}/{PREFILL_NPZ}"),
        decode_file: format!("builtin:{name}/{DECODE_NPZ}"),
        engine_gpus: EngineGpus {
            prefill: builtin_engine_gpus(name),
            decode: builtin_engine_gpus(name),
        },
        warnings: Vec::new(),
        profile,
        model,
    })
}

/// GPUs of one engine of each pool.
#[derive(Clone, Copy, Debug, Default, Serialize)]
struct EngineGpus {
    prefill: Option<u32>,
    decode: Option<u32>,
}

/// GPUs of the engine Dynamo's profiler measured for `pool`, from the graph it deployed to do so
/// (`selected_<pool>_interpolation/config.yaml`: a DynamoGraphDeployment whose one worker, of
/// type `decode`, is that engine), counted as the operator counts a replica's GPUs, times the
/// nodes of a multinode engine. `Ok(None)`: no such file; `Err`: a warning, the file unreadable.
fn engine_gpus(dir: &Path, pool: &str) -> Result<Option<u32>, String> {
    let path = dir.join(format!("selected_{pool}_interpolation/config.yaml"));
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(format!("cannot read {}: {error}", path.display())),
    };
    let unreadable = |reason: String| {
        format!(
            "{}: {reason}; the {pool} engine's GPUs are not reported",
            path.display()
        )
    };
    let graph: serde_json::Value =
        serde_yaml::from_str(&text).map_err(|e| unreadable(format!("not YAML: {e}")))?;
    let target = TargetGraph::from_value(&graph).map_err(|e| unreadable(e.to_string()))?;
    let workers: Vec<_> = target
        .components
        .iter()
        .filter(|c| {
            matches!(
                c.kind,
                Some(ComponentType::Decode | ComponentType::Prefill | ComponentType::Worker)
            )
        })
        .collect();
    let [worker] = workers.as_slice() else {
        return Err(unreadable(format!(
            "{} worker components, expected the one engine profiled",
            workers.len()
        )));
    };
    let gpus = worker.gpus.clone().map_err(|quantity| {
        unreadable(format!(
            "component {:?} asks for {quantity:?} {GPU_RESOURCE}",
            worker.name
        ))
    })?;
    let nodes = graph
        .pointer(&format!("/spec/components/{}/multinode/nodeCount", worker.index))
        .and_then(serde_json::Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(1);
    Ok(Some(gpus.saturating_mul(nodes.max(1))))
}

fn check_name(
    flag: &'static str,
    value: &str,
    max: usize,
    allowed: &'static str,
) -> Result<(), ProfileCommandError> {
    let label = |part: &str| {
        let bytes = part.as_bytes();
        !bytes.is_empty()
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
            && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
            && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
    };
    let parts_ok = if max == 63 {
        label(value)
    } else {
        value.split('.').all(label)
    };
    if value.len() <= max && parts_ok {
        return Ok(());
    }
    Err(ProfileCommandError::BadName {
        flag,
        value: value.to_string(),
        allowed,
    })
}

fn positive(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && value > 0.0 => Ok(value),
        _ => Err(format!("{text:?} is not a positive number")),
    }
}

// === The report ===

/// Where the figures are read.
#[derive(Clone, Copy, Debug, Serialize)]
struct Targets {
    isl: f64,
    osl: f64,
    /// ISL + OSL/2, where decode is read.
    context_length: f64,
    ttft_ms: f64,
    itl_ms: f64,
}

/// Smallest and largest value of a field.
#[derive(Clone, Copy, Debug, Serialize)]
struct Span {
    min: f64,
    max: f64,
}

impl Span {
    fn of(values: &[f64]) -> Self {
        Self {
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }

    fn contains(&self, value: f64) -> bool {
        (self.min..=self.max).contains(&value)
    }
}

#[derive(Debug, Serialize)]
struct PrefillCoverage {
    samples: usize,
    isl: Span,
    ttft_ms: Span,
    thpt_per_gpu: Span,
}

#[derive(Debug, Serialize)]
struct DecodeCoverage {
    samples: usize,
    context_length: Span,
    kv_usage: Span,
    itl_ms: Span,
    thpt_per_gpu: Span,
    /// KV-cache capacity of one decode engine, in tokens.
    max_kv_tokens: f64,
}

/// Prefill at the targets.
#[derive(Debug, Serialize)]
struct PrefillAtTargets {
    /// Profiled TTFT at the ISL.
    ttft_ms: f64,
    meets_ttft: bool,
    /// Profiled throughput per GPU at the ISL.
    thpt_per_gpu: f64,
    /// That times the engine's GPUs, when known.
    thpt_per_engine: Option<f64>,
    /// The longest profiled prompt whose TTFT meets the target (`None`: no prompt does).
    longest_isl_meeting_ttft: Option<f64>,
}

/// Decode at the targets: the best operating point meeting the ITL target at the context, as the
/// planner picks it.
#[derive(Debug, Serialize)]
struct DecodeAtTargets {
    /// ITL at the point (above the target when no point meets it).
    itl_ms: f64,
    meets_itl: bool,
    thpt_per_gpu: f64,
    /// That times the engine's GPUs, when known.
    thpt_per_engine: Option<f64>,
    /// KV-cache usage of the point.
    kv_usage: f64,
    /// Requests in flight per engine there: KV usage x KV capacity / context.
    requests_per_engine: f64,
}

/// What `check` prints.
#[derive(Debug, Serialize)]
struct Report {
    profile: String,
    prefill_file: String,
    decode_file: String,
    /// GPUs of one engine of each pool, when the source records them; throughputs are per GPU
    /// either way.
    gpus_per_engine: EngineGpus,
    /// The GPUs the prefill throughputs were divided by: Dynamo's profiler writes an engine's
    /// throughput (ISL / TTFT) over its GPUs (times its attention data-parallel size), so
    /// ISL / TTFT / throughput per GPU gives them back. `None` when the samples disagree (the
    /// figures were not computed that way).
    prefill_gpus_implied: Option<f64>,
    prefill: PrefillCoverage,
    decode: DecodeCoverage,
    targets: Targets,
    prefill_at_targets: PrefillAtTargets,
    decode_at_targets: DecodeAtTargets,
    /// Things the profile does that the planner follows but a reader may not expect.
    warnings: Vec<String>,
}

fn report(loaded: &Loaded, targets: Targets) -> Report {
    let Profile { prefill, decode } = &loaded.profile;
    let model = &loaded.model;
    let prefill_coverage = PrefillCoverage {
        samples: prefill.isl.len(),
        isl: Span::of(&prefill.isl),
        ttft_ms: Span::of(&prefill.ttft_ms),
        thpt_per_gpu: Span::of(&prefill.thpt_per_gpu),
    };
    let decode_coverage = DecodeCoverage {
        samples: decode.kv_usage.len(),
        context_length: Span::of(&decode.context_length),
        kv_usage: Span::of(&decode.kv_usage),
        itl_ms: Span::of(&decode.itl_ms),
        thpt_per_gpu: Span::of(&decode.thpt_per_gpu),
        max_kv_tokens: decode.max_kv_tokens,
    };

    let ttft_ms = model.prefill_ttft_ms(targets.isl);
    let isl = prefill_coverage.isl;
    let longest_isl_meeting_ttft = (0..=TTFT_SCAN_POINTS)
        .rev()
        .map(|i| isl.min + (isl.max - isl.min) * i as f64 / TTFT_SCAN_POINTS as f64)
        .find(|&x| model.prefill_ttft_ms(x) <= targets.ttft_ms);
    let prefill_at_targets = PrefillAtTargets {
        ttft_ms,
        meets_ttft: ttft_ms <= targets.ttft_ms,
        thpt_per_gpu: model.prefill_thpt_per_gpu(targets.isl),
        thpt_per_engine: loaded
            .engine_gpus
            .prefill
            .map(|gpus| model.prefill_thpt_per_gpu(targets.isl) * f64::from(gpus)),
        longest_isl_meeting_ttft,
    };
    let point = model.decode_best_point(targets.itl_ms, targets.context_length);
    let decode_at_targets = DecodeAtTargets {
        itl_ms: point.itl_ms,
        meets_itl: point.itl_ms <= targets.itl_ms,
        thpt_per_gpu: point.thpt_per_gpu,
        thpt_per_engine: loaded
            .engine_gpus
            .decode
            .map(|gpus| point.thpt_per_gpu * f64::from(gpus)),
        kv_usage: point.kv_usage,
        requests_per_engine: point.kv_usage * decode.max_kv_tokens / targets.context_length,
    };

    let mut warnings = loaded.warnings.clone();
    let prefill_gpus_implied = implied_gpus(prefill);
    if let (Some(implied), Some(gpus)) = (prefill_gpus_implied, loaded.engine_gpus.prefill)
        && (implied / f64::from(gpus) - 1.0).abs() > IMPLIED_GPUS_TOLERANCE
    {
        warnings.push(format!(
            "the prefill engine has {gpus} GPUs, but its throughput per GPU is ISL / TTFT / {implied}, the figure of a {implied}-GPU engine: the planner's prefill sizing is off by the same factor"
        ));
    }
    if !isl.contains(targets.isl) {
        warnings.push(format!(
            "ISL {} is outside the profiled prompt lengths ({} to {} tokens): prefill is read at the nearest end",
            targets.isl, isl.min, isl.max
        ));
    }
    let contexts = decode_coverage.context_length;
    if !contexts.contains(targets.context_length) {
        warnings.push(format!(
            "the decode context {} (ISL + OSL/2) is outside the profiled contexts ({} to {} tokens): decode is read from the nearest samples",
            targets.context_length, contexts.min, contexts.max
        ));
    }
    if point.kv_usage > decode_coverage.kv_usage.max {
        warnings.push(format!(
            "the decode point is at KV usage {:.2}, above the highest profiled ({:.2}): its figures are filled in from the nearest samples, as the planner reads them",
            point.kv_usage, decode_coverage.kv_usage.max
        ));
    }
    // Sorted by ISL: a falling TTFT is a measurement the spline follows.
    for (i, pair) in prefill.ttft_ms.windows(2).enumerate() {
        if pair[1] < pair[0] {
            warnings.push(format!(
                "prefill_ttft falls from {:.1} ms at ISL {} to {:.1} ms at ISL {}: the interpolation follows it (a measurement outlier?)",
                pair[0],
                prefill.isl[i],
                pair[1],
                prefill.isl[i + 1]
            ));
        }
    }

    Report {
        profile: loaded.source.clone(),
        prefill_file: loaded.prefill_file.clone(),
        decode_file: loaded.decode_file.clone(),
        gpus_per_engine: loaded.engine_gpus,
        prefill_gpus_implied,
        prefill: prefill_coverage,
        decode: decode_coverage,
        targets,
        prefill_at_targets,
        decode_at_targets,
        warnings,
    }
}

/// How far (relative) the samples' implied GPUs may be from their median, and a recorded GPU
/// count from the implied one: Dynamo's profiler computes the throughput from the same ISL and
/// TTFT, so only rounding separates them.
const IMPLIED_GPUS_TOLERANCE: f64 = 0.01;

/// ISL / TTFT / throughput per GPU (in tokens/s), when every sample gives the same, rounded to
/// two decimals.
fn implied_gpus(prefill: &PrefillProfile) -> Option<f64> {
    let mut ratios: Vec<f64> = prefill
        .isl
        .iter()
        .zip(&prefill.ttft_ms)
        .zip(&prefill.thpt_per_gpu)
        .map(|((isl, ttft_ms), thpt)| isl / ttft_ms * 1000.0 / thpt)
        .collect();
    if ratios.iter().any(|r| !r.is_finite() || *r <= 0.0) {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    let median = *ratios.get(ratios.len() / 2)?;
    let agree = ratios
        .iter()
        .all(|r| (r / median - 1.0).abs() <= IMPLIED_GPUS_TOLERANCE);
    agree.then(|| (median * 100.0).round() / 100.0)
}

fn meets(met: bool) -> &'static str {
    if met {
        "meets the target"
    } else {
        "MISSES the target"
    }
}

fn render_text(report: &Report) -> String {
    let Report {
        prefill: p,
        decode: d,
        targets: t,
        prefill_at_targets: pt,
        decode_at_targets: dt,
        ..
    } = report;
    let gpus = match (report.gpus_per_engine.prefill, report.gpus_per_engine.decode) {
        (None, None) => match report.prefill_gpus_implied {
            Some(implied) => format!(
                "not recorded with the profile; the prefill figures are those of a {implied}-GPU engine (throughput per GPU = ISL / TTFT / {implied}, as Dynamo's profiler computes it)"
            ),
            None => "not recorded with the profile, and the prefill throughput per GPU is not ISL / TTFT over one GPU count (not computed as Dynamo's profiler computes it)".into(),
        },
        (prefill, decode) => {
            let shown = |gpus: Option<u32>| gpus.map_or("unknown".to_string(), |g| g.to_string());
            format!("prefill {}, decode {}", shown(prefill), shown(decode))
        }
    };
    let per_engine = |thpt: Option<f64>| thpt.map_or(String::new(), |t| format!(" ({t:.0} per engine)"));
    let longest = match pt.longest_isl_meeting_ttft {
        Some(isl) => format!("prompts up to {isl:.0} tokens meet it"),
        None => "no profiled prompt length meets it".into(),
    };
    let mut lines = vec![
        format!("profile: {}", report.profile),
        format!("  prefill: {} ({} samples)", report.prefill_file, p.samples),
        format!("  decode:  {} ({} samples)", report.decode_file, d.samples),
        format!(
            "covers: prompt lengths {:.0} to {:.0} tokens; decode contexts {:.0} to {:.0} tokens at KV usage {:.2} to {:.2}",
            p.isl.min, p.isl.max, d.context_length.min, d.context_length.max, d.kv_usage.min, d.kv_usage.max
        ),
        format!("KV capacity: {:.0} tokens per decode engine", d.max_kv_tokens),
        format!("GPUs per engine: {gpus}"),
        format!(
            "at ISL {:.0}, OSL {:.0} (decode context {:.0}), TTFT target {} ms, ITL target {} ms:",
            t.isl, t.osl, t.context_length, t.ttft_ms, t.itl_ms
        ),
        format!(
            "  prefill: {:.0} tokens/s per GPU{}; TTFT {:.1} ms ({}); {longest}",
            pt.thpt_per_gpu,
            per_engine(pt.thpt_per_engine),
            pt.ttft_ms,
            meets(pt.meets_ttft)
        ),
        format!(
            "  decode:  {:.0} tokens/s per GPU{} at ITL {:.1} ms ({}), KV usage {:.2}, {:.1} requests per engine",
            dt.thpt_per_gpu,
            per_engine(dt.thpt_per_engine),
            dt.itl_ms,
            meets(dt.meets_itl),
            dt.kv_usage,
            dt.requests_per_engine
        ),
    ];
    if !report.warnings.is_empty() {
        lines.push("warnings:".into());
        lines.extend(report.warnings.iter().map(|w| format!("  {w}")));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

    use clap::Parser;
    use serde_json::Value;

    use super::*;

    #[derive(Parser)]
    struct Profiles {
        #[command(subcommand)]
        command: ProfileCommand,
    }

    /// Runs `planner-operator profile ARGS` as the command line parses it.
    fn run(args: &[&str]) -> Result<String, ProfileCommandError> {
        let parsed = Profiles::try_parse_from(std::iter::once("profile").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        match parsed.command {
            ProfileCommand::Check(args) => check(&args),
            ProfileCommand::Configmap(args) => configmap(&args),
        }
    }

    fn json(args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["--output", "json"]);
        serde_json::from_str(&run(&args).unwrap()).unwrap()
    }

    fn repo(relative: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(relative)
    }

    fn path_str(path: &Path) -> &str {
        path.to_str().unwrap()
    }

    /// A copy of a built-in profile's files in Dynamo's profiler layout, in a temporary directory
    /// (with the other files a profiler run leaves there).
    fn dynamo_layout_copy(name: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for relative in [PREFILL_NPZ, DECODE_NPZ] {
            let to = dir.path().join(relative);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(repo("config/profiles").join(name).join(relative), to).unwrap();
        }
        std::fs::write(dir.path().join("selected_prefill_interpolation/ttft.png"), b"png").unwrap();
        dir
    }

    #[test]
    fn check_reads_every_builtin_profile_and_its_dynamo_layout_copy() {
        for name in builtin_names() {
            let builtin = json(&["check", "--builtin", name]);
            let copy = dynamo_layout_copy(name);
            let dir = json(&["check", path_str(copy.path())]);
            for report in [&builtin, &dir] {
                assert_eq!(report["targets"]["isl"], 4000.0, "{name}");
                assert_eq!(report["targets"]["context_length"], 4500.0, "{name}");
                assert!(report["prefill"]["samples"].as_u64().unwrap() >= 9, "{name}");
                assert!(report["decode_at_targets"]["thpt_per_gpu"].as_f64().unwrap() > 0.0);
            }
            let gpus = builtin_engine_gpus(name).unwrap();
            assert_eq!(
                builtin["gpus_per_engine"],
                serde_json::json!({"prefill": gpus, "decode": gpus})
            );
            assert_eq!(
                dir["gpus_per_engine"],
                serde_json::json!({"prefill": null, "decode": null})
            );
            // The corrected built-in throughputs are per GPU of the engine; the published H100
            // files divided every row by the sweep's 8 GPUs.
            assert_eq!(builtin["prefill_gpus_implied"], f64::from(gpus), "{name}");
            let published = if name.starts_with("h100") { 8.0 } else { 1.0 };
            assert_eq!(dir["prefill_gpus_implied"], published, "{name}");
            assert_eq!(builtin["prefill"]["isl"], dir["prefill"]["isl"], "{name}");
            assert_eq!(builtin["decode"]["max_kv_tokens"], dir["decode"]["max_kv_tokens"]);
            assert!(
                dir["prefill_file"]
                    .as_str()
                    .unwrap()
                    .ends_with("selected_prefill_interpolation/raw_data.npz")
            );
            assert!(
                dir["profile"]
                    .as_str()
                    .unwrap()
                    .contains("Dynamo's profiler layout"),
                "{dir}"
            );
        }
    }

    #[test]
    fn the_figures_are_the_planners() {
        // The H200 profile's files are upstream's as published: the planner's own interpolation
        // at the targets gives the figures.
        let profile = Profile::builtin("h200-llama3.1-8b-tp1").unwrap();
        let model = PerformanceModel::new(&profile).unwrap();
        let report = json(&[
            "check",
            path_str(&repo("config/profiles/h200-llama3.1-8b-tp1")),
            "--isl",
            "3000",
            "--osl",
            "150",
            "--ttft-ms",
            "80",
            "--itl-ms",
            "10",
        ]);
        let point = model.decode_best_point(10.0, 3075.0);
        assert_eq!(
            report["prefill_at_targets"]["thpt_per_gpu"],
            model.prefill_thpt_per_gpu(3000.0)
        );
        assert_eq!(
            report["prefill_at_targets"]["ttft_ms"],
            model.prefill_ttft_ms(3000.0)
        );
        assert_eq!(report["decode_at_targets"]["thpt_per_gpu"], point.thpt_per_gpu);
        assert_eq!(report["decode_at_targets"]["itl_ms"], point.itl_ms);
        assert_eq!(report["decode_at_targets"]["meets_itl"], true);
        assert_eq!(report["decode"]["max_kv_tokens"], 945029.0);
        assert_eq!(report["decode"]["context_length"]["min"], 350.0);
        assert_eq!(report["decode"]["context_length"]["max"], 13585.0);
        assert_eq!(report["prefill"]["isl"]["min"], 100.0);
        assert_eq!(report["prefill"]["isl"]["max"], 16372.0);
        // TTFT grows with the prompt: the longest prompt meeting 80 ms is between two samples.
        let longest = report["prefill_at_targets"]["longest_isl_meeting_ttft"]
            .as_f64()
            .unwrap();
        assert!(model.prefill_ttft_ms(longest) <= 80.0 && model.prefill_ttft_ms(longest + 20.0) > 80.0);
        // Tight targets are reported as missed, not refused.
        let tight = json(&[
            "check",
            "--builtin",
            "h200-llama3.1-8b-tp1",
            "--ttft-ms",
            "1",
            "--itl-ms",
            "1",
        ]);
        assert_eq!(tight["prefill_at_targets"]["meets_ttft"], false);
        assert_eq!(
            tight["prefill_at_targets"]["longest_isl_meeting_ttft"],
            Value::Null
        );
        assert_eq!(tight["decode_at_targets"]["meets_itl"], false);
        let text = run(&["check", "--builtin", "h200-llama3.1-8b-tp1", "--ttft-ms", "1"]).unwrap();
        assert!(
            text.contains("MISSES the target") && text.contains("no profiled prompt length"),
            "{text}"
        );
    }

    #[test]
    fn the_text_report_says_what_the_profile_covers() {
        let text = run(&["check", "--builtin", "h100-llama3.3-70b-tp8"]).unwrap();
        for expected in [
            "built-in profile h100-llama3.3-70b-tp8",
            "prompt lengths 100 to 16380 tokens",
            "KV capacity: 224133 tokens per decode engine",
            "GPUs per engine: prefill 8, decode 8",
            "TTFT target 500 ms, ITL target 50 ms",
            // The outlier of the published TP8 row.
            "prefill_ttft falls from 498.2 ms at ISL 6205 to 321.0 ms at ISL 8240",
        ] {
            assert!(text.contains(expected), "{expected:?} not in\n{text}");
        }
        let outside = run(&["check", "--builtin", "h200-llama3.1-8b-tp1", "--isl", "50000"]).unwrap();
        assert!(
            outside.contains("ISL 50000 is outside the profiled prompt lengths"),
            "{outside}"
        );
    }

    #[test]
    fn the_json_form_is_read_and_written_as_data() {
        let dir = repo("crates/planner-core/tests/fixtures/profiles/qwen3-0.6b");
        let report = json(&["check", path_str(&dir)]);
        assert!(
            report["profile"].as_str().unwrap().contains("JSON form"),
            "{report}"
        );
        // Upstream's placeholder figures are not ISL / TTFT over any one GPU count.
        assert_eq!(report["prefill_gpus_implied"], Value::Null);
        let text = run(&["check", path_str(&dir)]).unwrap();
        assert!(text.contains("is not ISL / TTFT over one GPU count"), "{text}");
        assert!(report["prefill_file"].as_str().unwrap().ends_with(PREFILL_JSON));
        let yaml = run(&["configmap", path_str(&dir), "--name", "qwen3-profile"]).unwrap();
        let config_map: ConfigMap = serde_yaml::from_str(&yaml).unwrap();
        let data = config_map.data.as_ref().unwrap();
        assert_eq!(
            data[PREFILL_JSON],
            std::fs::read_to_string(dir.join(PREFILL_JSON)).unwrap()
        );
        assert!(data.contains_key(DECODE_JSON) && config_map.binary_data.is_none());
        assert_eq!(config_map.metadata.namespace, None);
    }

    #[test]
    fn configmap_holds_the_npz_files_under_the_operators_keys() {
        let copy = dynamo_layout_copy("h200-llama3.1-8b-tp1");
        let yaml = run(&[
            "configmap",
            path_str(copy.path()),
            "--name",
            "llama-8b-profile",
            "--namespace",
            "inference",
        ])
        .unwrap();
        assert!(yaml.starts_with("apiVersion: v1\nkind: ConfigMap\n"), "{yaml}");
        let config_map: ConfigMap = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(config_map.metadata.name.as_deref(), Some("llama-8b-profile"));
        assert_eq!(config_map.metadata.namespace.as_deref(), Some("inference"));
        let binary = config_map.binary_data.as_ref().unwrap();
        assert_eq!(
            binary.keys().collect::<Vec<_>>(),
            [DECODE_NPZ_KEY, PREFILL_NPZ_KEY]
        );
        assert_eq!(
            binary[PREFILL_NPZ_KEY].0,
            std::fs::read(copy.path().join(PREFILL_NPZ)).unwrap()
        );
        assert!(config_map.data.is_none());
        // The operator loads it into the same profile the directory holds.
        let loaded =
            Profile::from_config_map_entries("ConfigMap llama-8b-profile", &config_map_entries(&config_map))
                .unwrap();
        assert_eq!(loaded, Profile::from_dir(copy.path()).unwrap());
        // And `check` reads the manifest as the operator would, with the same figures.
        let manifest = copy.path().join("configmap.yaml");
        std::fs::write(&manifest, &yaml).unwrap();
        let from_manifest = json(&["check", path_str(&manifest)]);
        let from_dir = json(&["check", path_str(copy.path())]);
        assert_eq!(from_manifest["decode_at_targets"], from_dir["decode_at_targets"]);
        assert_eq!(
            from_manifest["prefill_at_targets"],
            from_dir["prefill_at_targets"]
        );
        assert_eq!(
            from_manifest["prefill_file"],
            "ConfigMap llama-8b-profile/prefill_raw_data.npz"
        );
    }

    /// The graph Dynamo's profiler deploys to measure one engine (`convert_config`'s output):
    /// a frontend and the engine as a `decode` worker.
    fn interpolation_graph(gpus: &str, multinode: &str) -> String {
        format!(
            r#"apiVersion: nvidia.com/v1beta1
kind: DynamoGraphDeployment
metadata: {{name: vllm-agg-1a2b3c4d}}
spec:
  components:
  - name: Frontend
    type: frontend
    podTemplate: {{spec: {{containers: [{{name: main, image: frontend}}]}}}}
  - name: decode
    type: decode
    {multinode}
    podTemplate:
      spec:
        containers:
        - name: main
          args: [--model, Qwen/Qwen3-0.6B, --tensor-parallel-size, "{gpus}"]
          resources: {{limits: {{nvidia.com/gpu: "{gpus}"}}}}
"#
        )
    }

    #[test]
    fn gpus_per_engine_come_from_the_graphs_the_profiler_measured() {
        let copy = dynamo_layout_copy("h200-llama3.1-8b-tp1");
        let config = |pool: &str| {
            copy.path()
                .join(format!("selected_{pool}_interpolation/config.yaml"))
        };
        std::fs::write(config("prefill"), interpolation_graph("2", "")).unwrap();
        std::fs::write(
            config("decode"),
            interpolation_graph("8", "multinode: {nodeCount: 2}"),
        )
        .unwrap();
        let report = json(&["check", path_str(copy.path())]);
        assert_eq!(
            report["gpus_per_engine"],
            serde_json::json!({"prefill": 2, "decode": 16})
        );
        let per_gpu = report["prefill_at_targets"]["thpt_per_gpu"].as_f64().unwrap();
        assert_eq!(report["prefill_at_targets"]["thpt_per_engine"], per_gpu * 2.0);
        let per_gpu = report["decode_at_targets"]["thpt_per_gpu"].as_f64().unwrap();
        assert_eq!(report["decode_at_targets"]["thpt_per_engine"], per_gpu * 16.0);
        let text = run(&["check", path_str(copy.path())]).unwrap();
        assert!(text.contains("GPUs per engine: prefill 2, decode 16"), "{text}");
        // The H200 figures are per GPU of a 1-GPU engine, not of the 2 GPUs this graph gives it.
        assert!(
            text.contains("the prefill engine has 2 GPUs, but its throughput per GPU is ISL / TTFT / 1"),
            "{text}"
        );

        // An unreadable graph costs the GPU count, not the profile.
        std::fs::write(config("decode"), "spec: {components: 3}").unwrap();
        let report = json(&["check", path_str(copy.path())]);
        assert_eq!(
            report["gpus_per_engine"],
            serde_json::json!({"prefill": 2, "decode": null})
        );
        let warnings = report["warnings"].to_string();
        assert!(
            warnings.contains("selected_decode_interpolation/config.yaml")
                && warnings.contains("the decode engine's GPUs are not reported"),
            "{warnings}"
        );
    }

    #[test]
    fn a_truncated_npz_is_named_by_its_path() {
        let copy = dynamo_layout_copy("h200-llama3.1-8b-tp1");
        let file = copy.path().join(DECODE_NPZ);
        let bytes = std::fs::read(&file).unwrap();
        std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
        for args in [
            vec!["check", path_str(copy.path())],
            vec!["configmap", path_str(copy.path()), "--name", "p"],
        ] {
            let error = run(&args).unwrap_err().to_string();
            assert!(
                error.contains(&format!("{} is not valid NPZ", file.display())),
                "{args:?}: {error}"
            );
        }
    }

    /// A directory in the JSON form with the given documents.
    fn json_dir(prefill: &str, decode: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(PREFILL_JSON), prefill).unwrap();
        std::fs::write(dir.path().join(DECODE_JSON), decode).unwrap();
        dir
    }

    const DECODE: &str = r#"{"x_kv_usage": [0.1, 0.5, 0.9, 0.2], "y_context_length": [100, 100, 900, 900],
        "z_itl": [5, 6, 9, 6], "z_thpt_per_gpu": [100, 400, 700, 200], "max_kv_tokens": 10000}"#;

    #[test]
    fn bad_entries_are_named_with_the_file() {
        let cases = [
            (
                r#"{"prefill_isl": [1, 2, 3, 4], "prefill_ttfts": [1, 2, 3, 4], "prefill_thpt_per_gpu": [1, 2, 3, 4]}"#,
                "missing field `prefill_ttft`; it has: prefill_isl, prefill_thpt_per_gpu, prefill_ttfts",
            ),
            (
                r#"{"prefill_isl": [100, 200, 200, 400], "prefill_ttft": [1, 2, 3, 4], "prefill_thpt_per_gpu": [1, 2, 3, 4]}"#,
                "`prefill_isl`[2] = 200 is invalid: distinct input lengths",
            ),
            (
                r#"{"prefill_isl": [100, 200, 300, 400], "prefill_ttft": [1, 2, -3, 4], "prefill_thpt_per_gpu": [1, 2, 3, 4]}"#,
                "`prefill_ttft`[2] = -3 is invalid",
            ),
            (
                r#"{"prefill_isl": [100, 200, 300, 400], "prefill_ttft": [1, 2, 3, "NaN"], "prefill_thpt_per_gpu": [1, 2, 3, 4]}"#,
                "`prefill_ttft` item 3 is \"NaN\", not a number",
            ),
        ];
        for (prefill, expected) in cases {
            let dir = json_dir(prefill, DECODE);
            let error = run(&["check", path_str(dir.path())]).unwrap_err().to_string();
            let file = dir.path().join(PREFILL_JSON).display().to_string();
            assert!(error.contains(expected) && error.contains(&file), "{error}");
        }
        let empty = tempfile::tempdir().unwrap();
        let error = run(&["check", path_str(empty.path())]).unwrap_err().to_string();
        assert!(
            error.contains(PREFILL_NPZ) && error.contains(PREFILL_JSON),
            "{error}"
        );
        let error = run(&["check", "/nonexistent/profile"]).unwrap_err().to_string();
        assert!(
            error.contains("/nonexistent/profile: no such file or directory"),
            "{error}"
        );
    }

    #[test]
    fn a_config_map_manifest_without_the_keys_lists_those_it_has() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("cm.yaml");
        std::fs::write(
            &manifest,
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: p}\ndata: {prefill.json: '{}'}\nbinaryData: {decode_raw_data.npz: UEsFBg==}\n",
        )
        .unwrap();
        let error = run(&["check", path_str(&manifest)]).unwrap_err().to_string();
        assert!(
            error.contains("cm.yaml: ConfigMap p: no binaryData key `prefill_raw_data.npz` and no data key `prefill_raw_data.json`; it has: data.prefill.json, binaryData.decode_raw_data.npz"),
            "{error}"
        );
        std::fs::write(&manifest, "apiVersion: v1\nkind: Secret\nmetadata: {name: p}\n").unwrap();
        let error = run(&["check", path_str(&manifest)]).unwrap_err().to_string();
        assert!(error.contains("kind is Some(\"Secret\")"), "{error}");
    }

    #[test]
    fn configmap_refuses_bad_names_and_oversized_profiles() {
        let dir = repo("crates/planner-core/tests/fixtures/profiles/qwen3-0.6b");
        let error = run(&["configmap", path_str(&dir), "--name", "Qwen_Profile"])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--name \"Qwen_Profile\" is invalid: allowed is a DNS subdomain"),
            "{error}"
        );
        let error = run(&["configmap", path_str(&dir), "--name", "p", "--namespace", "a.b"])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--namespace \"a.b\" is invalid: allowed is a DNS label"),
            "{error}"
        );
        assert!(run(&["configmap", path_str(&dir), "--name", "qwen.profile-1"]).is_ok());

        // Valid, but padded past what a ConfigMap holds.
        let prefill = std::fs::read_to_string(dir.join(PREFILL_JSON)).unwrap();
        let padded = format!("{DECODE}{}", " ".repeat(MAX_CONFIG_MAP_BYTES));
        let big = json_dir(&prefill, &padded);
        assert!(run(&["check", path_str(big.path())]).is_ok());
        let error = run(&["configmap", path_str(big.path()), "--name", "p"])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("more than the 1048576 bytes a ConfigMap may hold"),
            "{error}"
        );
    }

    #[test]
    fn targets_must_be_positive() {
        for bad in ["0", "-5", "NaN", "inf", "fast"] {
            let flag = format!("--ttft-ms={bad}");
            let parsed =
                Profiles::try_parse_from(["profile", "check", "--builtin", "h200-llama3.1-8b-tp1", &flag]);
            let error = parsed.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.contains("is not a positive number"), "{bad}: {error}");
        }
    }
}
