//! `planner-operator`: see `planner_operator::cli` for the commands.

use std::process::ExitCode;

fn main() -> ExitCode {
    planner_operator::cli::main()
}
