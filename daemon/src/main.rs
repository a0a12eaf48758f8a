//! The `musterd` binary: parses settings, sets up logging, runs the daemon.

use clap::Parser;

use muster_daemon::config::Config;

// glibc's allocator spends much of a busy daemon's time consolidating and splitting
// chunks (store blocks, frames); mimalloc does not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // Before the daemon's memory grows: 4 KiB pages only.
    let huge_pages = muster_daemon::no_huge_pages();
    // Before any file or thread exists: whatever the daemon creates is its user's alone.
    muster_daemon::data_dir::restrict_umask();
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
    let asked = std::env::var("MUSTER_LOG").unwrap_or_default();
    if let Err(e) = muster_daemon::logging::init(config.log_format, &asked) {
        eprintln!("musterd: {e:#}");
        return std::process::ExitCode::FAILURE;
    }
    if let Err(e) = huge_pages {
        tracing::warn!("transparent huge pages stay on for musterd: {e}");
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
