//! The `muster` binary: parse the command line, run it, print a one-line error on failure.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = muster_tui::cli::Cli::parse();
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
            let message = format!("{e:#}").replace('\n', " ");
            eprintln!("muster: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}
