//! The `muster` binary: parse the command line, run it, print a one-line error on failure.

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use muster_tui::cli::{Cli, Command};
use muster_tui::failure;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return failure::usage(&e),
    };
    let json = cli.global.json;
    // Long-running agents log what they do; one-shot commands only warnings.
    let default = match cli.command {
        Command::Work(_) | Command::Demo { .. } => "info",
        // Anything written to the terminal would tear the console's screen.
        Command::Tui { .. } => "off",
        _ => "warn",
    };
    let filter = EnvFilter::try_from_env("MUSTER_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    // Colours only for a terminal: a log written to a file or a pipe stays plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let e = anyhow::Error::new(e).context("starting the runtime");
            return failure::report(&e, json);
        }
    };
    match runtime.block_on(muster_tui::commands::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => failure::report(&e, json),
    }
}
