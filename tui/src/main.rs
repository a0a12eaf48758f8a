//! The `muster` binary: parse the command line, run it, print a one-line error on failure.

use clap::Parser;
use tracing_subscriber::EnvFilter;

use muster_tui::cli::{Cli, Command};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Long-running agents log what they do; one-shot commands only warnings.
    let default = match cli.command {
        Command::Work(_) | Command::Demo { .. } => "info",
        // Anything written to the terminal would tear the console's screen.
        Command::Tui { .. } => "off",
        _ => "warn",
    };
    let filter = EnvFilter::try_from_env("MUSTER_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("muster: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(muster_tui::commands::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line, whatever the error carries (a daemon's message can quote text
            // from other clients).
            let message = format!("{e:#}");
            eprintln!("muster: {}", muster_tui::output::safe(&message));
            std::process::ExitCode::FAILURE
        }
    }
}
