//! `planner-sim`: the simulator and the synthetic Dynamo frontend, for benchmarks and tests.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use planner_sim::{bed, frontend, mocker_profile, sim};

/// Test tools of planner-operator: the trace-driven simulator and a synthetic Dynamo frontend.
#[derive(Debug, Parser)]
#[command(name = "planner-sim", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay request traces through the SLA planner and the other policies in the trace-driven
    /// simulator; print a comparison table per trace and rate scale and draw the figures.
    Simulate(Box<sim::command::SimulateArgs>),
    /// Search the queueing planner's tuned settings on the benchmark's runs, as its defaults were
    /// chosen: print what each stage found and what every value of every setting scores around
    /// the winner.
    Tune(Box<sim::tune::TuneArgs>),
    /// Serve the metrics of a synthetic Dynamo frontend for tests: replay a request trace in
    /// real time against the prefill and decode pods that are Ready (or fixed counts), with
    /// TTFT and ITL from a profile.
    SyntheticFrontend(Box<frontend::SyntheticFrontendArgs>),
    /// Write a profile's latencies as the NPZ file Dynamo's mocker engine times itself by
    /// (`python -m dynamo.mocker --planner-profile-data FILE`, and its offline replay).
    MockerProfile(mocker_profile::MockerProfileArgs),
    /// Replay several traces, one graph each, sharing one GPU budget arbitrated by the
    /// operator's rules, against the same GPUs split statically per graph; print the table.
    Budget(sim::budget::BudgetArgs),
    /// Run NVIDIA Dynamo's real frontend and mocker engines for the Ready pods of a
    /// DynamoGraphDeployment on fake nodes, send a request trace to the frontend, and write the
    /// targets with which Prometheus scrapes them as PodMonitors scrape the pods.
    DynamoBed(Box<bed::DynamoBedArgs>),
    /// Answer replicas for observations from another engine model: one JSON sample per line on
    /// standard input, one JSON answer per line on standard output (the replay harness's
    /// bridge into Dynamo's offline replay).
    Bridge(Box<sim::bridge::BridgeArgs>),
    /// Write the bench's runs as the traces, timing tables and manifest Dynamo's offline replay
    /// reads (`make bench-replay`).
    ReplayTraces(Box<sim::replay::ReplayTracesArgs>),
    /// Score the replays `tools/replay/bench_replay.py` ran into a report in `make bench`'s
    /// format (`make bench-replay`).
    ReplayReport(Box<sim::replay::ReplayReportArgs>),
}

/// Exit code for bad input files (profile, trace or suite).
const EXIT_BAD_INPUT: u8 = 2;

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Simulate(args) => match sim::command::simulate(&args) {
            Ok(text) => write_stdout(text.trim_end()),
            Err(error) => {
                eprintln!("planner-sim simulate: {error}");
                match error {
                    sim::command::SimulateError::Input(_) => ExitCode::from(EXIT_BAD_INPUT),
                    sim::command::SimulateError::Output(_) => ExitCode::FAILURE,
                }
            }
        },
        Command::Tune(args) => match sim::tune::tune(&args) {
            Ok(text) => write_stdout(text.trim_end()),
            Err(error) => {
                eprintln!("planner-sim tune: {error}");
                match error {
                    sim::command::SimulateError::Input(_) => ExitCode::from(EXIT_BAD_INPUT),
                    sim::command::SimulateError::Output(_) => ExitCode::FAILURE,
                }
            }
        },
        Command::SyntheticFrontend(args) => synthetic_frontend(*args),
        Command::Budget(args) => match sim::budget::run_command(&args) {
            Ok(text) => write_stdout(text.trim_end()),
            Err(error) => {
                eprintln!("planner-sim budget: {error}");
                match error {
                    sim::budget::BudgetError::Input(_) => ExitCode::from(EXIT_BAD_INPUT),
                    _ => ExitCode::FAILURE,
                }
            }
        },
        Command::DynamoBed(args) => dynamo_bed(*args),
        Command::ReplayTraces(args) => replay_outcome("replay-traces", sim::replay::replay_traces(&args)),
        Command::ReplayReport(args) => replay_outcome("replay-report", sim::replay::replay_report(&args)),
        Command::Bridge(args) => {
            let stdin = std::io::stdin().lock();
            let stdout = std::io::stdout().lock();
            match sim::bridge::bridge(&args, stdin, stdout) {
                Ok(_) => ExitCode::SUCCESS,
                Err(error @ sim::bridge::BridgeError::Input(_)) => {
                    eprintln!("planner-sim bridge: {error}");
                    ExitCode::from(EXIT_BAD_INPUT)
                }
                Err(error) => {
                    eprintln!("planner-sim bridge: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::MockerProfile(args) => match mocker_profile::mocker_profile(&args) {
            Ok(summary) => write_stdout(&summary),
            Err(error) => {
                eprintln!("planner-sim mocker-profile: {error}");
                match error {
                    mocker_profile::MockerProfileError::Input(_) => ExitCode::from(EXIT_BAD_INPUT),
                    mocker_profile::MockerProfileError::Output { .. } => ExitCode::FAILURE,
                }
            }
        },
    }
}

fn replay_outcome(command: &str, outcome: Result<String, sim::replay::ReplayError>) -> ExitCode {
    match outcome {
        Ok(text) => write_stdout(text.trim_end()),
        Err(error) => {
            eprintln!("planner-sim {command}: {error}");
            match error {
                sim::replay::ReplayError::Input(_) => ExitCode::from(EXIT_BAD_INPUT),
                sim::replay::ReplayError::Output(_) => ExitCode::FAILURE,
            }
        }
    }
}

/// One TLS provider for the process (the kube client), logging, and the async runtime.
fn runtime() -> Option<tokio::runtime::Runtime> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    init_logging();
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => Some(runtime),
        Err(error) => {
            eprintln!("planner-sim: cannot start the async runtime: {error}");
            None
        }
    }
}

fn dynamo_bed(args: bed::DynamoBedArgs) -> ExitCode {
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(bed::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error @ bed::BedError::Input(_)) => {
            eprintln!("planner-sim dynamo-bed: {error}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
        Err(error) => {
            eprintln!("planner-sim dynamo-bed: {error}");
            ExitCode::FAILURE
        }
    }
}

fn synthetic_frontend(args: frontend::SyntheticFrontendArgs) -> ExitCode {
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(frontend::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error @ frontend::FrontendError::Input(_)) => {
            eprintln!("planner-sim synthetic-frontend: {error}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
        Err(error) => {
            eprintln!("planner-sim synthetic-frontend: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Human-readable logs on stderr, filtered by `RUST_LOG`.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("planner_sim=info,kube=warn,warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Plain text when the logs go to a file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Prints a document; a closed pipe (`| head`) is not an error.
fn write_stdout(text: &str) -> ExitCode {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("planner-sim: cannot write the output: {e}");
            ExitCode::FAILURE
        }
    }
}
