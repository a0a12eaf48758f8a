//! The daemon's log: filter, format and where it goes (stderr).
//!
//! Dependencies that log through the `log` crate (fjall, lsm-tree, rustls) reach us
//! through tracing's bridge, which adds `log.file` (an absolute path on the machine that
//! built them), `log.line`, `log.module_path` and `log.target` to each line. The text
//! format drops those; the JSON format of tracing-subscriber keeps them, so JSON lines
//! of such events are written here with their message and target only.

use std::fmt;
use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{Format, Json, JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent};
use tracing_subscriber::registry::LookupSpan;

use crate::config::LogFormat;

/// Dependencies whose INFO lines are their own business (compactions, connection
/// details): kept at WARN (openraft quieter still: [`OPENRAFT_DIRECTIVES`]) unless
/// `MUSTER_LOG` names them.
pub const QUIET_DEPENDENCIES: [&str; 6] = [
    "fjall",
    "lsm_tree",
    "openraft",
    "quinn",
    "quinn_proto",
    "rustls",
];

/// What [`directives`] holds openraft at unless `MUSTER_LOG` names it. openraft logs
/// every failed RPC to a peer that is down, and every retry of it, at WARN and ERROR
/// (about ten lines a second per dead peer), and a stale answer after a membership
/// change at WARN: expected events, which `cluster::net` logs once itself (WARN when a
/// peer becomes unreachable, INFO when it answers again). So openraft's WARN lines are
/// dropped, and its replication stream, whose ERROR lines are only those retries, is
/// silenced; openraft's other ERROR lines (a storage failure, its core stopping) stay.
pub const OPENRAFT_DIRECTIVES: &str = "openraft=error,openraft::replication=off";

/// The log filter for `MUSTER_LOG`'s value (`info` when empty): what was asked, with
/// each of [`QUIET_DEPENDENCIES`] it does not name held at WARN (openraft at
/// [`OPENRAFT_DIRECTIVES`]).
pub fn directives(asked: &str) -> String {
    let asked = if asked.trim().is_empty() {
        "info"
    } else {
        asked
    };
    let named = |dep: &str| {
        asked.split(',').any(|d| {
            let target = d.split(['=', '[']).next().unwrap_or_default().trim();
            target == dep || target.starts_with(&format!("{dep}::"))
        })
    };
    let mut directives = asked.to_owned();
    for dep in QUIET_DEPENDENCIES.iter().filter(|d| !named(d)) {
        if *dep == "openraft" {
            directives.push_str(&format!(",{OPENRAFT_DIRECTIVES}"));
        } else {
            directives.push_str(&format!(",{dep}=warn"));
        }
    }
    directives
}

/// Installs the log for the process: `asked` is `MUSTER_LOG`'s value. Colour only for
/// a person at a terminal, never in a journal or a file.
pub fn init(format: LogFormat, asked: &str) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(directives(asked))
        .map_err(|e| anyhow::anyhow!("MUSTER_LOG={asked:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(JsonLines(tracing_subscriber::fmt::format().json()))
            .init(),
    }
    Ok(())
}

/// tracing-subscriber's JSON lines, but a bridged `log` record without its build paths.
struct JsonLines(Format<Json>);

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if event.metadata().fields().field("log.target").is_none() {
            return self.0.format_event(ctx, writer, event);
        }
        let mut record = LogRecord::default();
        event.record(&mut record);
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let line = serde_json::json!({
            "timestamp": timestamp,
            "level": event.metadata().level().as_str(),
            "fields": {"message": record.message},
            "target": record.target,
        });
        writeln!(writer, "{line}")
    }
}

/// The message and target of a bridged `log` record.
#[derive(Default)]
struct LogRecord {
    message: String,
    target: String,
}

impl Visit for LogRecord {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => value.clone_into(&mut self.message),
            "log.target" => value.clone_into(&mut self.target),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_stay_at_warn_unless_named() {
        let quiet = ",fjall=warn,lsm_tree=warn,openraft=error,openraft::replication=off,quinn=warn,quinn_proto=warn,rustls=warn";
        assert_eq!(directives(""), format!("info{quiet}"));
        assert_eq!(directives("debug"), format!("debug{quiet}"));
        assert_eq!(
            directives("info,quinn=debug,fjall::compaction=trace"),
            "info,quinn=debug,fjall::compaction=trace,lsm_tree=warn,openraft=error,openraft::replication=off,quinn_proto=warn,rustls=warn"
        );
        // Naming openraft (or one of its modules) takes none of its defaults.
        assert_eq!(
            directives("info,openraft::replication=warn"),
            "info,openraft::replication=warn,fjall=warn,lsm_tree=warn,quinn=warn,quinn_proto=warn,rustls=warn"
        );
        for asked in ["", "debug", "info,openraft=info"] {
            EnvFilter::try_new(directives(asked)).expect("a valid filter");
        }
    }
}
