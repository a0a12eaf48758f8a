//! Integration tests: real `musterd` processes on loopback, driven through the CLI and the SDK.
//!
//! # Layout
//! - `agents`: member sessions, reclaim, takeover, drain, capacity and cancels.
//! - `bench`: `muster bench` on a small workload (every figure, only the phases asked
//!   for) and its refusals of bad values.
//! - `cli`: the CLI as a new user types it, with exact output.
//! - `fencing`: stale claims after a lapse and a new claim, across a kill -9.
//! - `fixture`: a store written by an earlier version opens with everything intact.
//! - `lapse`: leases that run out, max_attempts, dead letters and redrive.
//! - `liveness`: agents that die and are not restarted, clean exits, `muster work`'s
//!   supervision of its programs (signals, orphans, checkpoints), broken runners,
//!   revoke and cancel.
//! - `logs`: INFO lines of a member's life, lapses, dead letters and operator actions.
//! - `maintenance`: one daemon per data directory, `--version`, `--check-config`,
//!   `admin snapshot` and a restore.
//! - `mcp`: `muster mcp` through the official Python MCP client (stdio and streamable
//!   HTTP): every tool, the tools each token's roles allow, refusals as tool errors;
//!   a server whose daemon is restarted under it.
//! - `metrics`: the Prometheus endpoint.
//! - `operate`: `task_update` (priority, run now) and `member_undrain`, with their
//!   refusals, through the SDK and the CLI; `server_stats`'s uptime, members and fsync.
//! - `private`: local users and tenants: the private data directory and local-only
//!   mode, token files, principals, member names, start-up warnings.
//! - `scripting`: `task find`, header lines, JSON errors, closed pipes, confirmations,
//!   contexts, completions and the man page.
//! - `security`: tokens and roles, member ownership, bad input, floods.
//! - `suspend`: suspended tasks: an agent that asks a person and is resumed through
//!   the CLI across a kill -9, `muster work`'s suspend file, the CLI's suspend with a
//!   timeout that resumes.
//! - `spec`: the daemon as PROTOCOL.md describes it (subscriptions, waits, `null`,
//!   paging, member records, `max_runtime_ms` across restarts and queue updates).
//! - `checker`: the Jepsen-style checker under kill -9 and simulated power loss.
//! - `agent_chaos`: the Jepsen-style agent checker: agents killed, drained, frozen and
//!   partitioned while they work one queue, on one daemon and on a cluster whose leader
//!   is killed, isolated and deafened meanwhile.
//! - `crash`: kill -9 during a burst of enqueues, and leases held across restarts.
//! - `traces`: W3C trace context from a producer's span through the daemon to the SDK's
//!   handlers, the children they spawn, and `muster work`'s programs.
//! - `schedules`: a cron schedule firing every second, once per second, across a kill -9
//!   and restart of a daemon and across the kill -9 of a cluster's leader.
//! - `cluster`: three nodes: forming, `not_leader`, a kill -9 of the leader with tasks
//!   and leases kept, the checker under kills, partitions and one-way loss (with each
//!   failover measured), a snapshot for a new node.
//! - `deploy`: the systemd unit's flags start a daemon; the dashboard and alerts query
//!   what it exports.
//! - `disk`: a full disk during a burst of enqueues, and recovery once space is freed.
//! - `demo`: `muster demo` across a daemon restart, drained by SIGTERM.
//! - `dispatch`: priorities, delays, keys, labels, fairness and retention.
//! - `connect`: trust (pins, CA files), refusals at start-up, pipelining, lists of
//!   addresses.
//! - `leader`: the SDK finding a cluster's leader among stand-in cluster nodes.
//! - `tui`: `muster tui` in tmux: redrive with confirm, read-only, no daemon.
//! - `work_attacks`: `muster work`'s programs get none of its `MUSTER_*` settings (no
//!   token) and cannot read the runner's environment or memory, `--user` runs them as
//!   another user away from its token file, their stderr reaches the runner's log
//!   escaped, and a FIFO, oversized or linked progress file neither stalls, bloats nor
//!   misleads the runner.

mod agent_chaos;
mod agents;
mod bench;
mod checker;
mod children;
mod cli;
mod cluster;
mod connect;
mod crash;
mod demo;
mod deploy;
mod disk;
mod dispatch;
mod exhaustion;
mod fencing;
mod fixture;
mod lapse;
mod leader;
mod limits;
mod liveness;
mod logs;
mod maintenance;
mod mcp;
mod metrics;
mod operate;
mod output;
mod private;
mod schedules;
mod scripting;
mod security;
mod spec;
mod suspend;
mod traces;
mod tui;
mod work_attacks;
