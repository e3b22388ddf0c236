//! Command line of the `planner-operator` binary.

use std::{path::PathBuf, process::ExitCode};

use clap::{ArgGroup, Args, Parser, Subcommand};

mod profile;

use planner_core::{
    case::{CaseFile, PlanResult},
    interpolation::PerformanceModel,
    profile::{Profile, builtin_names},
};

/// Autoscales NVIDIA Dynamo inference graphs (aggregated or prefill/decode) to latency SLAs at
/// the fewest GPUs.
#[derive(Debug, Parser)]
#[command(name = "planner-operator", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print every CustomResourceDefinition as YAML (pipe to `kubectl apply --server-side -f -`).
    Crd,
    /// Run the operator: reconcile PlannerPolicies and GpuBudgets (and, with the DGD controller,
    /// render DynamoGraphDeployments) until SIGTERM.
    Run(Box<crate::runtime::RunArgs>),
    /// Evaluate upstream Dynamo's SLA-planner formulas (`sla.model: upstream`) on cases read
    /// from a JSON file (one interval each, in the format of the golden cases) and print the
    /// results as JSON. To preview what a PlannerPolicy does with the default (queueing) model
    /// over a trace, use `what-if`.
    Plan(PlanArgs),
    /// Replay a PlannerPolicy's planning loop, the one the operator runs, over a request trace
    /// on the simulator's engine model: what it would set at each check and why, the GPU-hours
    /// and the share of intervals meeting the SLA. Exit status 2 on a policy the admission
    /// webhook would refuse, a bad trace or profile.
    WhatIf(Box<crate::whatif::WhatIfArgs>),
    /// Check a profile (Dynamo's profiler output, the JSON form or a ConfigMap) and print what
    /// it says, or write it as the ConfigMap a PlannerPolicy names.
    #[command(subcommand)]
    Profile(profile::ProfileCommand),
    /// Print the version.
    Version,
}

/// The flags of `planner-operator run` as the Markdown table `docs/planner.md` shows (between
/// its `flags` markers): flag, environment variable, default and help, from the flags
/// themselves, so the docs cannot drift (`operator/tests/docs_flags.rs`).
pub fn run_flags_markdown() -> String {
    use clap::CommandFactory;
    let command = Cli::command();
    let Some(run) = command.find_subcommand("run") else {
        return String::new();
    };
    let mut table = String::from("| Flag (env) | Default | What |\n|---|---|---|\n");
    for arg in run.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" {
            continue;
        }
        let env = arg
            .get_env()
            .map(|e| format!(" (`{}`)", e.to_string_lossy()))
            .unwrap_or_default();
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| format!("`{}`", v.to_string_lossy()))
            .collect();
        let default = if defaults.is_empty() {
            "unset".to_string()
        } else {
            defaults.join(", ")
        };
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(|h| h.to_string().split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
            .replace('|', "\\|");
        table.push_str(&format!("| `--{long}`{env} | {default} | {help} |\n"));
    }
    table
}

/// Arguments of `plan`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["profile_dir", "profile"])))]
struct PlanArgs {
    /// Upstream profile directory: `selected_{prefill,decode}_interpolation/raw_data.npz`, or
    /// `prefill_raw_data.json` and `decode_raw_data.json`.
    #[arg(long, value_name = "DIR")]
    profile_dir: Option<PathBuf>,
    /// A built-in profile instead of a directory.
    #[arg(long, value_name = "NAME", value_parser = clap::builder::PossibleValuesParser::new(builtin_names().collect::<Vec<_>>()))]
    profile: Option<String>,
    /// JSON file `{"cases": [...]}`; `-` reads standard input.
    #[arg(long, value_name = "FILE")]
    cases: PathBuf,
}

/// Exit code for bad input files (profile or cases) and bad flags of the profile commands.
const EXIT_BAD_INPUT: u8 = 2;

/// Parses the command line and runs the command.
pub fn main() -> ExitCode {
    let Cli { command } = Cli::parse();
    match command {
        Command::Crd => print_crds(),
        Command::Run(args) => run(*args),
        Command::Plan(args) => match plan(&args) {
            Ok(results) => write_stdout(&results),
            Err(message) => {
                eprintln!("planner-operator plan: {message}");
                ExitCode::from(EXIT_BAD_INPUT)
            }
        },
        Command::WhatIf(args) => match crate::whatif::what_if(&args) {
            Ok(text) => write_stdout(&text),
            Err(error) => {
                eprintln!("planner-operator what-if: {error}");
                ExitCode::from(EXIT_BAD_INPUT)
            }
        },
        Command::Profile(command) => profile::main(command),
        Command::Version => write_stdout(concat!("planner-operator ", env!("CARGO_PKG_VERSION"))),
    }
}

fn run(args: crate::runtime::RunArgs) -> ExitCode {
    // One TLS provider for every client and server in the process (kube, reqwest, webhook).
    crate::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("planner-operator: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(crate::runtime::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "planner-operator stopped");
            eprintln!("planner-operator: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Why `plan` could not run; each names what is at fault.
#[derive(Debug, thiserror::Error)]
enum PlanError {
    /// No profile was given.
    #[error("give --profile-dir or --profile")]
    NoProfile,
    /// The profile cannot be read.
    #[error(transparent)]
    Profile(#[from] planner_core::profile::ProfileError),
    /// The profile's curves cannot be interpolated.
    #[error(transparent)]
    Model(#[from] planner_core::interpolation::InterpolationError),
    /// The cases cannot be read.
    #[error("cannot read {file}: {error}")]
    Read {
        /// The file (`-`: standard input).
        file: String,
        /// Why.
        error: std::io::Error,
    },
    /// A case is not valid.
    #[error("{file}: field `{path}`: {error}")]
    Case {
        /// The file.
        file: String,
        /// The field at fault.
        path: String,
        /// What is wrong with it.
        error: serde_json::Error,
    },
    /// The results cannot be written.
    #[error("cannot write the results: {0}")]
    Output(serde_json::Error),
}

/// Runs every case; the error names the file and the field at fault.
fn plan(args: &PlanArgs) -> Result<String, PlanError> {
    let profile = match (&args.profile_dir, &args.profile) {
        (Some(dir), _) => Profile::from_dir(dir)?,
        (None, Some(name)) => Profile::builtin(name)?,
        (None, None) => return Err(PlanError::NoProfile),
    };
    let model = PerformanceModel::new(&profile)?;
    let file = args.cases.display().to_string();
    let read = |error| PlanError::Read {
        file: if file == "-" {
            "standard input".into()
        } else {
            file.clone()
        },
        error,
    };
    let text = if file == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(read)?
    } else {
        std::fs::read_to_string(&args.cases).map_err(read)?
    };
    let deserializer = &mut serde_json::Deserializer::from_str(&text);
    let cases: CaseFile = serde_path_to_error::deserialize(deserializer).map_err(|e| PlanError::Case {
        file: file.clone(),
        path: e.path().to_string(),
        error: e.into_inner(),
    })?;
    let results: Vec<PlanResult> = cases.cases.iter().map(|case| case.evaluate(&model)).collect();
    #[derive(serde::Serialize)]
    struct Output {
        /// Which model the results are of: upstream's formulas.
        model: &'static str,
        results: Vec<PlanResult>,
    }
    serde_json::to_string_pretty(&Output {
        model: "upstream",
        results,
    })
    .map_err(PlanError::Output)
}

/// Prints a document; a closed pipe (`| head`) is not an error.
fn write_stdout(text: &str) -> ExitCode {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("planner-operator: cannot write the output: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_crds() -> ExitCode {
    match planner_api::crd_manifests() {
        Ok(manifests) => {
            let documents: Vec<&str> = manifests.iter().map(|(_, yaml)| yaml.as_str()).collect();
            write_stdout(documents.join("---\n").trim_end())
        }
        Err(error) => {
            eprintln!("planner-operator: cannot render the CRDs: {error}");
            ExitCode::FAILURE
        }
    }
}
