//! What each subcommand does: build the request, call the daemon, print the result.

use std::collections::VecDeque;
use std::io::BufRead;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, bail};
use muster_protocol::model::{Backoff, NewTask, QueuePatch, TaskState};
use muster_protocol::ops::{Claim, DeadSelection};
use muster_sdk::{Client, ConnectOptions, Trust, WorkerConfig};

use crate::ClaimString;
use crate::cli::{
    AdminCommand, Cli, Command, DeadArgs, EnqueueArgs, Global, LeaseCommand, MemberCommand,
    QueueCommand, QueueOptionArgs, TaskCommand,
};
use crate::output::{self, Output};
use crate::{bench, console, demo, work};

/// Enqueues from stdin kept in flight at once: enough to share fsyncs, bounded memory.
const STDIN_IN_FLIGHT: usize = 256;

/// Runs one command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let out = Output::new(cli.global.json);
    let command = match cli.command {
        Command::Work(args) => {
            let config = WorkerConfig {
                member: args.member,
                queues: vec![args.queue],
                capacity: args.capacity,
                labels: args.labels,
                grace: args.grace,
                reclaim_on_start: true,
                liveness: args.liveness,
            };
            let spec = work::WorkSpec {
                command: args.command,
                grace: args.grace,
            };
            return work::run(options(&cli.global), config, spec).await;
        }
        Command::Demo { rate } => return demo::run(options(&cli.global), rate).await,
        Command::Bench(args) => return bench::run(args).await,
        Command::Tui { readonly } => {
            let addr = cli.global.addr.clone();
            return console::run(options(&cli.global), addr, readonly).await;
        }
        Command::Guard { dir } => return work::guard(&dir),
        other => other,
    };
    let client = Client::connect(options(&cli.global)).await?;
    let result = one_shot(&client, &out, command).await;
    // The daemon learns at once that this client is gone (not at the idle timeout).
    client.close().await;
    result
}

/// Runs a command that needs one connection and nothing else.
async fn one_shot(client: &Client, out: &Output, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Queue(cmd) => queue(client, out, cmd).await,
        Command::Enqueue(args) => enqueue(client, out, args).await,
        Command::Claim(args) => {
            let claim = Claim {
                queues: args.queues,
                max: Some(args.max),
                wait_ms: Some(ms(args.wait)),
                lease_ms: args.lease.map(ms),
                member: args.member,
                labels: args.labels,
            };
            for d in client.claim(&claim).await? {
                let claim = ClaimString {
                    id: d.id.clone(),
                    epoch: d.epoch,
                };
                out.item(
                    || {
                        format!(
                            "{claim}\t{}\t{}",
                            d.attempt,
                            output::safe_json(d.payload.get())
                        )
                    },
                    &d,
                )?;
            }
            Ok(())
        }
        Command::Ack { claim, result } => {
            let result = result.map(|r| json_arg("--result", &r)).transpose()?;
            let reply = client.ack(&claim.id, claim.epoch, result).await?;
            out.item(|| reply.state.to_string(), &reply)
        }
        Command::Nack {
            claim,
            delay,
            error,
        } => {
            let reply = client
                .nack(&claim.id, claim.epoch, delay.map(ms), error)
                .await?;
            out.item(|| reply.state.to_string(), &reply)
        }
        Command::Renew {
            claim,
            extend,
            progress,
        } => {
            let progress = progress.map(|p| json_arg("--progress", &p)).transpose()?;
            let reply = client
                .renew(&claim.id, claim.epoch, extend.map(ms), progress)
                .await?;
            out.item(
                || {
                    format!(
                        "{}\tcancel_requested={}",
                        output::time(reply.lease_expires_ms),
                        reply.cancel_requested
                    )
                },
                &reply,
            )
        }
        Command::Release { claim } => {
            let reply = client.release(&claim.id, claim.epoch).await?;
            out.item(|| reply.state.to_string(), &reply)
        }
        Command::DeadLetter { claim, error } => {
            let reply = client.dead_letter(&claim.id, claim.epoch, &error).await?;
            out.item(|| reply.state.to_string(), &reply)
        }
        Command::Task(TaskCommand::Get { id }) => out.task(&client.task_get(&id).await?),
        Command::Task(TaskCommand::List {
            queue,
            state,
            limit,
            after,
        }) => {
            let state = TaskState::parse(&state).with_context(|| {
                format!("invalid state {state:?}: want scheduled, ready, leased, done, dead or cancelled")
            })?;
            list(client, out, &queue, state, after, limit).await
        }
        Command::Wait { ids, timeout } => {
            let reply = client.wait(ids, ms(timeout)).await?;
            for t in &reply.finished {
                out.item(
                    || {
                        format!(
                            "{}\t{}\t{}",
                            t.id,
                            t.state,
                            t.result.as_ref().map_or("-", |r| r.get())
                        )
                    },
                    t,
                )?;
            }
            for id in &reply.removed {
                eprintln!("muster: task {id} was removed while waiting");
            }
            if !reply.pending.is_empty() {
                bail!(
                    "timed out: {} of the tasks did not finish: {}",
                    reply.pending.len(),
                    reply.pending.join(" ")
                );
            }
            Ok(())
        }
        Command::Cancel { id } => {
            let reply = client.cancel(&id).await?;
            out.item(
                || {
                    if reply.cancel_requested {
                        "cancel_requested".into()
                    } else {
                        reply.state.to_string()
                    }
                },
                &reply,
            )
        }
        Command::Dead { queue } => list(client, out, &queue, TaskState::Dead, None, u32::MAX).await,
        Command::Redrive(args) => {
            let reply = client.redrive(selection(&args)).await?;
            counted(out, &args, "redriven", &reply)
        }
        Command::Discard(args) => {
            let reply = client.discard(selection(&args)).await?;
            counted(out, &args, "discarded", &reply)
        }
        Command::Stats { queue } => stats(client, out, queue.as_deref()).await,
        Command::Members => {
            for m in client.member_list().await? {
                out.member(&m)?;
            }
            Ok(())
        }
        Command::Member(MemberCommand::Describe { name }) => {
            let reply = client.member_describe(&name).await?;
            if out.is_json() {
                return out.item(String::new, &reply);
            }
            out.member(&reply.member)?;
            for t in &reply.leases {
                out.summary(t)?;
            }
            Ok(())
        }
        Command::Member(MemberCommand::Drain { name }) => {
            out.member(&client.member_drain(&name).await?)
        }
        Command::Lease(LeaseCommand::Revoke { id }) => {
            let reply = client.lease_revoke(&id).await?;
            out.item(|| reply.state.to_string(), &reply)
        }
        Command::Admin(AdminCommand::Snapshot { dir }) => {
            let reply = client.admin_snapshot(&dir).await?;
            out.item(
                || {
                    format!(
                        "{}\ttasks={} queues={}",
                        reply.dir, reply.tasks, reply.queues
                    )
                },
                &reply,
            )
        }
        Command::Work(_)
        | Command::Demo { .. }
        | Command::Bench(_)
        | Command::Tui { .. }
        | Command::Guard { .. } => {
            unreachable!("handled before connecting")
        }
    }
}

/// Where the daemon is and how to trust it, from the common options.
pub fn options(g: &Global) -> ConnectOptions {
    let trust = match (&g.pin, &g.ca) {
        (Some(pin), _) => Trust::Pin(pin.clone()),
        (None, Some(ca)) => Trust::CaFile(ca.clone()),
        (None, None) => Trust::DataDir(
            g.data
                .clone()
                .unwrap_or_else(muster_sdk::connect::default_data_dir),
        ),
    };
    ConnectOptions {
        addr: g.addr.clone(),
        trust,
        token: g.token.clone(),
        server_name: None,
        bind: None,
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn json_arg(flag: &str, text: &str) -> anyhow::Result<muster_sdk::RawJson> {
    muster_sdk::raw_json(text).with_context(|| format!("{flag} is not JSON"))
}

fn patch(o: &QueueOptionArgs) -> anyhow::Result<QueuePatch> {
    let backoff_given = o.backoff_base.is_some()
        || o.backoff_cap.is_some()
        || o.backoff_factor.is_some()
        || o.backoff_jitter.is_some();
    let retry_backoff = backoff_given.then(|| {
        let d = Backoff::default();
        Backoff {
            base_ms: o.backoff_base.map_or(d.base_ms, ms),
            cap_ms: o.backoff_cap.map_or(d.cap_ms, ms),
            factor: o.backoff_factor.unwrap_or(d.factor),
            jitter: o.backoff_jitter.unwrap_or(d.jitter),
        }
    });
    Ok(QueuePatch {
        lease_ms: o.lease.map(ms),
        max_attempts: o.max_attempts,
        retry_backoff,
        key_concurrency: o.key_concurrency,
        retention_ms: o.retention.map(ms),
        max_runtime_ms: o.max_runtime.map(ms),
        paused: None,
    })
}

async fn queue(client: &Client, out: &Output, cmd: QueueCommand) -> anyhow::Result<()> {
    match cmd {
        QueueCommand::Create { name, options } => {
            out.queue(&client.queue_create(&name, patch(&options)?).await?)
        }
        QueueCommand::List => {
            for q in client.queue_list().await? {
                out.item(
                    || {
                        let c = &q.counts;
                        format!(
                            "{}\tready={} scheduled={} leased={} done={} dead={} cancelled={}{}",
                            q.name,
                            c.ready,
                            c.scheduled,
                            c.leased,
                            c.done,
                            c.dead,
                            c.cancelled,
                            if q.options.paused { " paused" } else { "" }
                        )
                    },
                    &q,
                )?;
            }
            Ok(())
        }
        QueueCommand::Describe { name } => out.queue(&client.queue_describe(&name).await?),
        QueueCommand::Update { name, options } => {
            out.queue(&client.queue_update(&name, patch(&options)?).await?)
        }
        QueueCommand::Pause { name } => out.queue(&client.queue_pause(&name).await?),
        QueueCommand::Resume { name } => out.queue(&client.queue_resume(&name).await?),
        QueueCommand::Purge { name } => {
            let n = client.queue_purge(&name).await?;
            out.item(|| format!("purged {n}"), &serde_json::json!({ "count": n }))
        }
        QueueCommand::Delete { name } => {
            let n = client.queue_delete(&name).await?;
            out.item(
                || format!("deleted {name} with {n} tasks"),
                &serde_json::json!({ "count": n }),
            )
        }
    }
}

fn new_task(args: &EnqueueArgs, payload: muster_sdk::RawJson) -> NewTask {
    NewTask {
        payload,
        priority: args.priority,
        key: args.key.clone(),
        requires: args.requires.clone(),
        delay_ms: args.delay.map(ms),
        not_before_ms: args.at.map(|t| t.duration_since(UNIX_EPOCH).map_or(0, ms)),
        idempotency_key: args.idempotency_key.clone(),
    }
}

async fn enqueue(client: &Client, out: &Output, args: EnqueueArgs) -> anyhow::Result<()> {
    let print = |t: &muster_sdk::EnqueuedTask| {
        out.item(
            || {
                if t.duplicate {
                    format!("{}\tduplicate", t.id)
                } else {
                    t.id.clone()
                }
            },
            t,
        )
    };
    if args.payload != "-" {
        let payload = json_arg("PAYLOAD", &args.payload)?;
        let task = client
            .enqueue(&args.queue, new_task(&args, payload))
            .await?;
        return print(&task);
    }
    if args.idempotency_key.is_some() {
        bail!("--idempotency-key names one task; it cannot apply to every line of stdin");
    }
    // Lines are read on a blocking thread. Each enqueue is sent in stdin order and its
    // reply awaited later, with up to STDIN_IN_FLIGHT in flight; ids print in input order.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<String>>(STDIN_IN_FLIGHT);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            if tx.blocking_send(line).is_err() {
                return;
            }
        }
    });
    let mut in_flight = VecDeque::new();
    let mut line_no = 0usize;
    let mut failure = None;
    while let Some(line) = rx.recv().await {
        line_no += 1;
        let line = line.context("reading stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        let payload = match muster_sdk::raw_json(line.trim()) {
            Ok(p) => p,
            Err(e) => {
                failure = Some(format!("line {line_no}: {e}"));
                break;
            }
        };
        in_flight.push_back(
            client
                .send_enqueue(&args.queue, vec![new_task(&args, payload)])
                .await?,
        );
        if in_flight.len() >= STDIN_IN_FLIGHT
            && let Some(oldest) = in_flight.pop_front()
        {
            print_enqueued(&print, oldest).await?;
        }
    }
    for pending in in_flight {
        print_enqueued(&print, pending).await?;
    }
    match failure {
        Some(f) => bail!("{f}; the lines before it were enqueued"),
        None => Ok(()),
    }
}

async fn print_enqueued(
    print: &impl Fn(&muster_sdk::EnqueuedTask) -> anyhow::Result<()>,
    pending: muster_sdk::PendingReply<muster_protocol::ops::Enqueue>,
) -> anyhow::Result<()> {
    for task in pending.reply().await?.tasks {
        print(&task)?;
    }
    Ok(())
}

async fn list(
    client: &Client,
    out: &Output,
    queue: &str,
    state: TaskState,
    mut after: Option<String>,
    limit: u32,
) -> anyhow::Result<()> {
    let mut left = limit;
    while left > 0 {
        let page = client
            .task_list(
                queue,
                state,
                after.take(),
                Some(left.min(muster_protocol::limits::MAX_PAGE)),
            )
            .await?;
        for t in &page.tasks {
            out.summary(t)?;
        }
        left = left.saturating_sub(page.tasks.len() as u32);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    Ok(())
}

async fn stats(client: &Client, out: &Output, queue: Option<&str>) -> anyhow::Result<()> {
    let queues = match queue {
        Some(q) => vec![client.queue_describe(q).await?],
        None => client.queue_list().await?,
    };
    let now = output::now_ms();
    for q in &queues {
        out.item(
            || {
                let (c, t) = (&q.counts, &q.totals);
                format!(
                    "{}\tready={} scheduled={} leased={} done={} dead={} cancelled={} held_back={} unclaimable={} oldest_ready_age={} enqueued={} acked={} nacked={} lapsed={}{}",
                    q.name, c.ready, c.scheduled, c.leased, c.done, c.dead, c.cancelled, q.held_back, q.unclaimable,
                    q.oldest_ready_ms.map_or("-".into(), |at| output::span(now.saturating_sub(at))),
                    t.enqueued, t.acked, t.nacked, t.lapsed,
                    if q.options.paused { " paused" } else { "" }
                )
            },
            q,
        )?;
    }
    if queue.is_none() {
        let daemon = client.server_stats().await?;
        let connected = client
            .member_list()
            .await?
            .iter()
            .filter(|m| m.connected)
            .count();
        let factor = daemon.synced_requests as f64 / daemon.syncs.max(1) as f64;
        let json = serde_json::json!({
            "syncs": daemon.syncs,
            "synced_requests": daemon.synced_requests,
            "batch_factor": factor,
            "members_connected": connected,
            "disk_alarm": daemon.disk_alarm,
        });
        // Said only when on: the line of a healthy daemon stays as it was.
        let alarm = if daemon.disk_alarm {
            " disk_alarm=on (enqueues refused)"
        } else {
            ""
        };
        out.item(
            || {
                format!(
                    "daemon\tfsyncs={} requests={} batch_factor={factor:.1} members_connected={connected}{alarm}",
                    daemon.syncs, daemon.synced_requests
                )
            },
            &json,
        )?;
    }
    Ok(())
}

fn selection(args: &DeadArgs) -> DeadSelection {
    DeadSelection {
        queue: args.queue.clone(),
        ids: args.ids.clone(),
        all: args.all,
        dry_run: args.dry_run,
    }
}

fn counted(
    out: &Output,
    args: &DeadArgs,
    verb: &str,
    reply: &muster_protocol::ops::CountReply,
) -> anyhow::Result<()> {
    if args.dry_run && !out.is_json() {
        for id in &reply.ids {
            println!("{id}");
        }
    }
    out.item(
        || {
            if args.dry_run {
                format!("would be {verb}: {}", reply.count)
            } else {
                format!("{verb} {}", reply.count)
            }
        },
        reply,
    )
}
