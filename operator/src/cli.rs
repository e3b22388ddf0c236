//! Command line of the `planner-operator` binary.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::api;

/// Autoscales NVIDIA Dynamo disaggregated inference to latency SLAs.
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
}

/// Parses the command line and runs the command.
pub fn main() -> ExitCode {
    let Cli { command } = Cli::parse();
    match command {
        Command::Crd => print_crds(),
    }
}

fn print_crds() -> ExitCode {
    match api::crd_manifests() {
        Ok(manifests) => {
            let documents: Vec<&str> = manifests.iter().map(|(_, yaml)| yaml.as_str()).collect();
            print!("{}", documents.join("---\n"));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("planner-operator: cannot render the CRDs: {error}");
            ExitCode::FAILURE
        }
    }
}
