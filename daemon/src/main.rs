//! The `musterd` binary: parses settings, sets up logging, runs the daemon.

use clap::Parser;
use tracing_subscriber::EnvFilter;

use muster_daemon::config::{Config, LogFormat};

// glibc's allocator spends much of a busy daemon's time consolidating and splitting
// chunks (store blocks, frames); mimalloc does not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let config = Config::parse();
    if config.check_config {
        return match muster_daemon::check_config(&config) {
            Ok(summary) => {
                println!("musterd: {summary}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("musterd: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let filter = EnvFilter::try_from_env("MUSTER_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("musterd: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(muster_daemon::run(config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("musterd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
