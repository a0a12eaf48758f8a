//! How a failed command ends: one line on stderr (or one JSON object with `--json`) and
//! exit status 1; a closed stdout (`muster members | head -1`) ends quietly with 0.

use std::process::ExitCode;

use crate::output::safe;

/// Ends a run that failed with `e`: quietly with success if stdout was closed by its
/// reader, else one line on stderr (`muster: what failed`, a daemon's refusal as
/// `muster: CODE: message`), or with `json` one object `{"error":{"code","message"}}`
/// (with the wire's `leader` too on a `not_leader` that names one), and exit status 1.
pub fn report(e: &anyhow::Error, json: bool) -> ExitCode {
    if closed_pipe(e) {
        return ExitCode::SUCCESS;
    }
    if json {
        let (code, message) = code_and_message(e);
        print_error(code, &message, leader(e), true);
    } else {
        // The whole chain on one line; a daemon's error reads `CODE: message`.
        print_error("failed", &format!("{e:#}"), None, false);
    }
    ExitCode::FAILURE
}

/// Ends a run whose command line did not parse: help and version are printed as asked
/// (status 0); anything else is one line naming the problem, with the usage of the
/// command to look up, and status 1.
pub fn usage(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            // Printing help can meet a closed pipe too (`muster --help | head`).
            let _ = e.print();
            ExitCode::SUCCESS
        }
        _ => {
            let json = std::env::args().any(|a| a == "--json");
            print_error("usage", &usage_line(e), None, json);
            ExitCode::FAILURE
        }
    }
}

/// Clap's message (its first paragraph on one line, without the `error: ` prefix), and
/// the command whose help to read.
fn usage_line(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let paragraph: Vec<&str> = rendered
        .lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let first = match paragraph.join(" ") {
        _ if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            "a command is required".to_owned()
        }
        text if text.is_empty() => "invalid command line".to_owned(),
        text => text.strip_prefix("error: ").unwrap_or(&text).to_owned(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("{first} (see `{} --help`)", command_path(&args))
}

/// The subcommand the arguments name (`muster queue create`), as far as they name one.
fn command_path(args: &[String]) -> String {
    let mut command = <crate::cli::Cli as clap::CommandFactory>::command();
    let mut path = vec!["muster".to_owned()];
    for arg in args.iter().filter(|a| !a.starts_with('-')) {
        let Some(sub) = command.find_subcommand(arg).cloned() else {
            break;
        };
        path.push(sub.get_name().to_owned());
        command = sub;
    }
    path.join(" ")
}

fn print_error(code: &str, message: &str, leader: Option<&str>, json: bool) {
    use std::io::Write;
    let line = if json {
        let mut error = serde_json::json!({ "code": code, "message": message });
        if let Some(leader) = leader {
            error["leader"] = leader.into();
        }
        serde_json::json!({ "error": error }).to_string()
    } else {
        format!("muster: {}", safe(message))
    };
    // Nothing is left to do if stderr is gone too.
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The error's code (the daemon's, or the kind of local failure) and its message.
fn code_and_message(e: &anyhow::Error) -> (&'static str, String) {
    let Some(sdk) = e
        .chain()
        .find_map(|c| c.downcast_ref::<muster_sdk::Error>())
    else {
        return ("failed", format!("{e:#}"));
    };
    // Context added around the SDK's error (what the CLI was doing) stays in front.
    let context: Vec<String> = e
        .chain()
        .take_while(|c| c.downcast_ref::<muster_sdk::Error>().is_none())
        .map(ToString::to_string)
        .collect();
    let own = match sdk {
        muster_sdk::Error::Server(body) => body.message.clone(),
        muster_sdk::Error::Connect(m)
        | muster_sdk::Error::Closed(m)
        | muster_sdk::Error::Protocol(m)
        | muster_sdk::Error::InvalidInput(m) => m.clone(),
        other => other.to_string(),
    };
    let message = context
        .into_iter()
        .chain(std::iter::once(own))
        .collect::<Vec<_>>()
        .join(": ");
    let code = match sdk {
        muster_sdk::Error::Server(body) => body.code.as_str(),
        muster_sdk::Error::Connect(_) => "connect",
        muster_sdk::Error::Closed(_) => "connection_lost",
        muster_sdk::Error::Protocol(_) => "protocol",
        muster_sdk::Error::InvalidInput(_) => "invalid_input",
        _ => "failed",
    };
    (code, message)
}

/// The cluster leader's address a daemon's `not_leader` refusal named, if any.
fn leader(e: &anyhow::Error) -> Option<&str> {
    e.chain()
        .find_map(|c| match c.downcast_ref::<muster_sdk::Error>() {
            Some(muster_sdk::Error::Server(body)) => body.leader.as_deref(),
            _ => None,
        })
}

/// Whether the failure is stdout closed by its reader (EPIPE).
fn closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::{closed_pipe, code_and_message, leader};

    #[test]
    fn a_not_leader_refusal_keeps_the_leader_it_names() {
        let named = anyhow::Error::new(muster_sdk::Error::Server(
            muster_sdk::protocol::ErrorBody::not_leader(
                "node 2 is not the leader",
                Some("10.0.0.1:7420".into()),
            ),
        ));
        assert_eq!(
            code_and_message(&named),
            ("not_leader", "node 2 is not the leader".to_owned())
        );
        assert_eq!(leader(&named), Some("10.0.0.1:7420"));
        let other = anyhow::Error::new(muster_sdk::Error::Connect("no route".into()));
        assert_eq!(leader(&other), None);
    }

    #[test]
    fn daemon_errors_keep_their_code_and_local_ones_say_what_they_are() {
        let refused = anyhow::Error::new(muster_sdk::Error::Server(
            muster_sdk::protocol::ErrorBody::new(
                muster_sdk::ErrorCode::LeaseLost,
                "task X epoch 1 is not held",
            ),
        ));
        assert_eq!(
            code_and_message(&refused),
            ("lease_lost", "task X epoch 1 is not held".to_owned())
        );
        let connect = anyhow::Error::new(muster_sdk::Error::Connect("no route".into()))
            .context("reaching 10.0.0.1:7420");
        assert_eq!(
            code_and_message(&connect),
            ("connect", "reaching 10.0.0.1:7420: no route".to_owned())
        );
        let local = anyhow::anyhow!("PAYLOAD is not JSON");
        assert_eq!(
            code_and_message(&local),
            ("failed", "PAYLOAD is not JSON".to_owned())
        );
    }

    #[test]
    fn only_a_closed_stdout_is_quiet() {
        let pipe = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("printing");
        assert!(closed_pipe(&pipe));
        let other = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::NotFound));
        assert!(!closed_pipe(&other));
    }
}
