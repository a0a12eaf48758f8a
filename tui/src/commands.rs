//! What each subcommand does: build the request, call the daemon, print the result.

use std::io::{BufRead, Write as _};
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use clap::CommandFactory;
use muster_protocol::model::{Backoff, LimitSpec, NewTask, QueuePatch, TaskState};
use muster_protocol::ops::{Claim, DeadSelection, TaskFind};
use muster_sdk::{Client, ConnectArgs, ConnectOptions, WorkerConfig};

use crate::ClaimString;
use crate::cli::{
    AdminCommand, ClaimArgs, Cli, ClusterCommand, Command, ContextCommand, DeadArgs, EnqueueArgs,
    FindArgs, Global, LeaseCommand, LimitCommand, MemberCommand, QueueCommand, QueueOptionArgs,
    ScheduleCommand, ScheduleSetArgs, TaskArgs, TaskCommand, TokenCommand, TokenRole,
};
use crate::context::{Context, Contexts};
use crate::output::{self, Output};
use crate::{bench, console, demo, mcp, work};

/// Enqueues from stdin kept in flight at once: enough to share fsyncs, bounded memory.
const STDIN_IN_FLIGHT: usize = 256;

/// Runs one command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let out = Output::new(cli.global.json, !cli.global.no_headers);
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
                user: args.user,
                output: args.output,
            };
            return work::run(options(&cli.global)?, config, spec).await;
        }
        Command::Demo { rate } => return demo::run(options(&cli.global)?, rate).await,
        Command::Bench(args) => return bench::run(args).await,
        Command::Tui { readonly } => {
            let options = options(&cli.global)?;
            let addr = options.addr.clone();
            return console::run(options, addr, readonly).await;
        }
        Command::Guard { dir } => return work::guard(&dir),
        Command::Mcp(args) => return mcp::run(options(&cli.global)?, args).await,
        Command::Tail { id, follow, from } => {
            return tail(options(&cli.global)?, &out, &id, follow, from).await;
        }
        Command::Admin(AdminCommand::Token(TokenCommand::New { name, roles })) => {
            return new_token(&out, &name, &roles);
        }
        Command::Context(cmd) => return contexts(&out, &cli.global, cmd),
        Command::Completions { shell } => {
            let mut cli = Cli::command();
            let mut stdout = std::io::stdout();
            clap_complete::generate(shell, &mut cli, "muster", &mut stdout);
            return std::io::Write::flush(&mut stdout).context("writing the completions");
        }
        Command::Man { subcommand, dir } => return man(&subcommand, dir.as_deref()),
        other => other,
    };
    let options = options(&cli.global)?;
    // One node's own view of the cluster when one address is given, else the leader's.
    let client = match command {
        Command::Cluster(ClusterCommand::Status)
            if muster_sdk::connect::addresses(&options.addr)?.len() == 1 =>
        {
            Client::connect_node(options).await?
        }
        _ => Client::connect(options).await?,
    };
    let result = one_shot(&client, &out, command).await;
    // The daemon learns at once that this client is gone (not at the idle timeout).
    client.close().await;
    result
}

/// Runs a command that needs one connection and nothing else: one arm per command,
/// each a function of its own.
async fn one_shot(client: &Client, out: &Output, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Queue(cmd) => queue(client, out, cmd).await,
        Command::Limit(cmd) => limit(client, out, cmd).await,
        Command::Schedule(cmd) => schedule(client, out, cmd).await,
        Command::Enqueue(args) => enqueue(client, out, args).await,
        Command::Claim(args) => claim(client, out, args).await,
        Command::Ack { claim, result } => ack(client, out, &claim, result).await,
        Command::Nack {
            claim,
            delay,
            error,
        } => nack(client, out, &claim, delay, error).await,
        Command::Renew {
            claim,
            extend,
            progress,
        } => renew(client, out, &claim, extend, progress).await,
        Command::Release { claim } => {
            let reply = client.release(&claim.id, claim.epoch).await?;
            out.item(|| reply.state.to_string(), &reply)
        }
        Command::Throttled {
            claim,
            retry_after,
            limit,
        } => {
            let reply = client
                .throttled(&claim.id, claim.epoch, retry_after.map(ms), limit)
                .await?;
            out.item(|| reply.state.to_string(), &reply)
        }
        Command::Suspend {
            claim,
            reason,
            timeout,
            on_timeout,
        } => {
            let suspension = muster_sdk::Suspension {
                reason,
                timeout,
                on_timeout: Some(on_timeout.into()),
            };
            let reply = client.suspend(&claim.id, claim.epoch, suspension).await?;
            out.item(
                || {
                    reply
                        .resume_token
                        .clone()
                        .unwrap_or_else(|| reply.state.to_string())
                },
                &reply,
            )
        }
        Command::Spawn {
            claim,
            children,
            wait,
            reason,
            timeout,
            on_timeout,
        } => {
            let children = children
                .chunks(3)
                .map(|c| {
                    let payload = json_arg("--child", &c[2])?;
                    Ok(muster_sdk::NewChild::new(&c[0], &c[1], payload))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let wait = wait.then(|| muster_sdk::protocol::ops::SpawnWait {
                reason,
                timeout_ms: timeout.map(|t| t.as_millis() as u64),
                on_timeout: Some(on_timeout.into()),
            });
            let reply = client.spawn(&claim.id, claim.epoch, children, wait).await?;
            out.item(
                || {
                    let mut lines: Vec<String> = reply
                        .children
                        .iter()
                        .map(|c| {
                            let new = if c.duplicate { "duplicate" } else { "new" };
                            format!("child\t{}\t{}\t{}\t{new}", c.child_key, c.id, c.state)
                        })
                        .collect();
                    lines.push(format!("state\t{}", reply.state));
                    if let Some(token) = &reply.resume_token {
                        lines.push(format!("resume_token\t{token}"));
                    }
                    lines.join("\n")
                },
                &reply,
            )
        }
        Command::Resume {
            resume_token,
            task,
            with,
        } => {
            let data = with.map(|d| json_arg("--with", &d)).transpose()?;
            let reply = match (resume_token, task) {
                (Some(token), None) => client.resume(&token, data).await?,
                (None, Some(task)) => client.resume_task(&task, data).await?,
                _ => unreachable!("clap takes a token or --task, not both"),
            };
            out.item(|| format!("{}\t{}", reply.task, reply.state), &reply)
        }
        Command::DeadLetter { claim, error } => {
            let reply = client.dead_letter(&claim.id, claim.epoch, &error).await?;
            out.item(|| reply.state.to_string(), &reply)
        }
        Command::Task(cmd) => task(client, out, cmd).await,
        Command::Wait { ids, timeout } => wait(client, out, ids, timeout).await,
        Command::Cancel { id } => cancel(client, out, &id).await,
        Command::Dead { queue } => list(client, out, &queue, TaskState::Dead, None, u32::MAX).await,
        Command::Redrive(args) => {
            let reply = client.redrive(selection(&args)).await?;
            counted(out, &args, "redriven", &reply)
        }
        Command::Discard {
            selection: args,
            yes,
        } => discard(client, out, &args, yes).await,
        Command::Stats { queue } => stats(client, out, queue.as_deref()).await,
        Command::Members => members(client, out).await,
        Command::Member(cmd) => member(client, out, cmd).await,
        Command::Lease(LeaseCommand::Revoke { id }) => {
            let reply = client.lease_revoke(&id).await?;
            out.item(|| reply.state.to_string(), &reply)
        }
        Command::Admin(AdminCommand::Snapshot { dir }) => snapshot(client, out, &dir).await,
        Command::Cluster(cmd) => cluster(client, out, cmd).await,
        Command::Work(_)
        | Command::Demo { .. }
        | Command::Bench(_)
        | Command::Tui { .. }
        | Command::Admin(AdminCommand::Token(_))
        | Command::Guard { .. }
        | Command::Mcp(_)
        | Command::Tail { .. }
        | Command::Context(_)
        | Command::Completions { .. }
        | Command::Man { .. } => {
            unreachable!("handled before connecting")
        }
    }
}

/// `muster claim`: leases tasks and prints a line per delivery, its claim string first
/// (the JSON form carries it as `claim`).
async fn claim(client: &Client, out: &Output, args: ClaimArgs) -> anyhow::Result<()> {
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
        // The JSON form carries the claim string `ack`, `nack` and `renew` take.
        let mut json = serde_json::to_value(&d)?;
        json["claim"] = claim.to_string().into();
        out.item(
            || {
                format!(
                    "{claim}\t{}\t{}",
                    d.attempt,
                    output::safe_json(d.payload.get())
                )
            },
            &json,
        )?;
    }
    Ok(())
}

/// `muster ack`: settles a claim as done, with the result given; prints the new state.
async fn ack(
    client: &Client,
    out: &Output,
    claim: &ClaimString,
    result: Option<String>,
) -> anyhow::Result<()> {
    let result = result.map(|r| json_arg("--result", &r)).transpose()?;
    let reply = client.ack(&claim.id, claim.epoch, result).await?;
    out.item(|| reply.state.to_string(), &reply)
}

/// `muster nack`: settles a claim as failed, retried after `delay` if given; prints the
/// new state.
async fn nack(
    client: &Client,
    out: &Output,
    claim: &ClaimString,
    delay: Option<Duration>,
    error: Option<String>,
) -> anyhow::Result<()> {
    let reply = client
        .nack(&claim.id, claim.epoch, delay.map(ms), error)
        .await?;
    out.item(|| reply.state.to_string(), &reply)
}

/// `muster renew`: extends a claim's lease, storing the progress given; prints when the
/// lease now expires and whether a cancel was asked for.
async fn renew(
    client: &Client,
    out: &Output,
    claim: &ClaimString,
    extend: Option<Duration>,
    progress: Option<String>,
) -> anyhow::Result<()> {
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

/// `muster task …`: reads, lists, finds or updates tasks.
async fn task(client: &Client, out: &Output, cmd: TaskCommand) -> anyhow::Result<()> {
    match cmd {
        TaskCommand::Get { id } => out.task(&client.task_get(&id).await?),
        TaskCommand::List {
            queue,
            state,
            limit,
            after,
        } => {
            let state = parse_state(&state)?;
            list(client, out, &queue, state, after, limit).await
        }
        TaskCommand::Find(args) => find(client, out, *args).await,
        TaskCommand::Update { id, priority } => {
            let update = muster_protocol::ops::TaskUpdate {
                task: id,
                priority: Some(priority),
                run_now: false,
            };
            out.summary(&client.task_update(&update).await?)
        }
        TaskCommand::RunNow { id } => {
            let update = muster_protocol::ops::TaskUpdate {
                task: id,
                priority: None,
                run_now: true,
            };
            out.summary(&client.task_update(&update).await?)
        }
    }
}

/// `muster wait`: prints each task that finished within `timeout` (removed ones on
/// stderr), and fails naming those that did not.
/// `muster tail`: prints a task's output from chunk `from`; with `follow`, until the
/// task finishes, connecting again (from the next chunk) when the connection is lost.
async fn tail(
    options: ConnectOptions,
    out: &Output,
    id: &str,
    follow: bool,
    from: u64,
) -> anyhow::Result<()> {
    // Following: the SDK's follower, which connects again whenever it must. Without
    // `-f`: what is there, read on one connection.
    let mut follower = follow.then(|| muster_sdk::Follower::new(options.clone(), id, from));
    let client = match follow {
        true => None,
        false => Some(Client::connect(options.clone()).await?),
    };
    let mut next = from;
    loop {
        let reply = match (&mut follower, &client) {
            (Some(f), _) => match f.next().await {
                Ok(Some(reply)) => reply,
                Ok(None) => break,
                Err(e) => bail!("following task {id}: {e}"),
            },
            (None, Some(c)) => c.follow(id, next, Duration::ZERO).await?,
            (None, None) => unreachable!("a follower or a client"),
        };
        if reply.dropped > 0 {
            eprintln!(
                "muster: chunks {next} to {} of task {id} were dropped to keep its output within its limit",
                next + reply.dropped - 1
            );
        }
        let mut stdout = std::io::stdout().lock();
        for c in &reply.chunks {
            if out.is_json() {
                serde_json::to_writer(&mut stdout, c)?;
                stdout.write_all(b"\n")?;
            } else if let Some(text) = &c.text {
                stdout.write_all(text.as_bytes())?;
            } else if let Some(json) = &c.json {
                stdout.write_all(json.get().as_bytes())?;
                stdout.write_all(b"\n")?;
            }
        }
        stdout.flush()?;
        next = reply.next;
        if reply.end || (follower.is_none() && reply.chunks.is_empty()) {
            break;
        }
    }
    if let Some(f) = follower {
        f.close().await;
    }
    if let Some(c) = client {
        c.close().await;
    }
    Ok(())
}

async fn wait(
    client: &Client,
    out: &Output,
    ids: Vec<String>,
    timeout: Duration,
) -> anyhow::Result<()> {
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

/// `muster cancel`: prints `cancel_requested` for a leased task (its holder is told),
/// else the task's new state.
async fn cancel(client: &Client, out: &Output, id: &str) -> anyhow::Result<()> {
    let reply = client.cancel(id).await?;
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

/// `muster discard`: removes the dead tasks selected, after a confirmation when that is
/// all of a queue's (and there are some).
async fn discard(client: &Client, out: &Output, args: &DeadArgs, yes: bool) -> anyhow::Result<()> {
    if args.all && !args.dry_run {
        let dead = client.queue_describe(&args.queue).await?.counts.dead;
        if dead > 0 {
            let queue = &args.queue;
            confirm(
                &format!("discard all {dead} dead tasks of queue {queue:?}"),
                queue,
                yes,
            )
            .await?;
        }
    }
    let reply = client.discard(selection(args)).await?;
    counted(out, args, "discarded", &reply)
}

/// `muster members`: a row per member.
async fn members(client: &Client, out: &Output) -> anyhow::Result<()> {
    let members = client.member_list().await?;
    out.header(output::MEMBER_COLUMNS)?;
    for m in members {
        out.member(&m)?;
    }
    Ok(())
}

/// `muster member …`: describes, drains, undrains or releases a member.
async fn member(client: &Client, out: &Output, cmd: MemberCommand) -> anyhow::Result<()> {
    match cmd {
        MemberCommand::Describe { name } => member_describe(client, out, &name).await,
        MemberCommand::Drain { name } => out.member(&client.member_drain(&name).await?),
        MemberCommand::Undrain { name } => out.member(&client.member_undrain(&name).await?),
        MemberCommand::Release { name } => {
            client.member_release(&name).await?;
            out.item(
                || "released".to_owned(),
                &serde_json::json!({"member": name, "released": true}),
            )
        }
    }
}

/// `muster member describe`: the member's row, then a row per task it holds; with
/// `--json`, the reply as one object.
async fn member_describe(client: &Client, out: &Output, name: &str) -> anyhow::Result<()> {
    let reply = client.member_describe(name).await?;
    if out.is_json() {
        return out.item(String::new, &reply);
    }
    out.header(output::MEMBER_COLUMNS)?;
    out.member(&reply.member)?;
    out.text_line("")?;
    out.header(output::TASK_COLUMNS)?;
    for t in &reply.leases {
        out.summary(t)?;
    }
    Ok(())
}

/// `muster admin snapshot`: has the daemon write a snapshot into `dir`; prints where
/// and what it holds.
async fn snapshot(client: &Client, out: &Output, dir: &str) -> anyhow::Result<()> {
    let reply = client.admin_snapshot(dir).await?;
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

/// `muster cluster …`: shows the cluster's status, or changes its membership and shows
/// the status after.
async fn cluster(client: &Client, out: &Output, cmd: ClusterCommand) -> anyhow::Result<()> {
    match cmd {
        ClusterCommand::Status => print_cluster(out, &client.cluster_status().await?),
        ClusterCommand::Add {
            id,
            node_addr,
            cluster_addr,
            learner,
            catch_up,
        } => {
            let reply = client
                .cluster_add(id, &node_addr, &cluster_addr, learner, Some(catch_up))
                .await?;
            print_cluster(out, &reply)
        }
        ClusterCommand::Remove { id } => print_cluster(out, &client.cluster_remove(id).await?),
    }
}

/// The command line's definition as the man pages show it: built (every subcommand
/// knows its full name, `muster-queue-create`, and the global options), with no `help`
/// subcommand.
pub fn man_command() -> clap::Command {
    let mut command = Cli::command().disable_help_subcommand(true);
    command.build();
    command
}

/// `muster man [SUBCOMMAND...]` prints one page; `muster man --dir DIR` writes the page
/// of muster and of every subcommand (hidden ones aside) into DIR, a file each named
/// after the command (`muster-queue-create.1`), and prints their paths.
fn man(subcommand: &[String], dir: Option<&std::path::Path>) -> anyhow::Result<()> {
    let command = man_command();
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut written = Vec::new();
        write_pages(command, dir, &mut written)?;
        let mut stdout = std::io::stdout().lock();
        for path in written {
            writeln!(stdout, "{}", path.display())?;
        }
        return stdout.flush().context("writing the list of pages");
    }
    let mut page = command;
    let mut path = vec!["muster".to_owned()];
    for name in subcommand {
        let Some(sub) = page
            .find_subcommand(name)
            .filter(|s| !s.is_hide_set())
            .cloned()
        else {
            bail!(
                "{} has no subcommand {name:?} (see `{} --help`)",
                path.join(" "),
                path.join(" ")
            );
        };
        path.push(sub.get_name().to_owned());
        page = sub;
    }
    let mut stdout = std::io::stdout().lock();
    page_of(page)
        .render(&mut stdout)
        .context("writing the man page")?;
    stdout.flush().context("writing the man page")
}

/// The page of a command of [`man_command`], its source muster's version (a
/// subcommand has none of its own).
fn page_of(command: clap::Command) -> clap_mangen::Man {
    let version = Cli::command().get_version().unwrap_or_default().to_owned();
    clap_mangen::Man::new(command).source(format!("muster {version}"))
}

/// Writes the page of `command` and of each of its subcommands (hidden ones aside) into
/// `dir`, adding each file's path to `written`, the command's own first.
fn write_pages(
    command: clap::Command,
    dir: &std::path::Path,
    written: &mut Vec<std::path::PathBuf>,
) -> anyhow::Result<()> {
    let man = page_of(command.clone());
    let path = dir.join(man.get_filename());
    man.generate_to(dir)
        .with_context(|| format!("writing {}", path.display()))?;
    written.push(path);
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub.clone(), dir, written)?;
    }
    Ok(())
}

/// Random bytes in a token `muster admin token new` prints: 256 bits.
const NEW_TOKEN_BYTES: usize = 32;

/// Prints a new token, its SHA-256 and a config entry holding only the SHA-256.
fn new_token(out: &Output, name: &str, roles: &[TokenRole]) -> anyhow::Result<()> {
    let mut bytes = [0u8; NEW_TOKEN_BYTES];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| anyhow::anyhow!("the system's random generator failed"))?;
    let token = hex::encode(bytes);
    let sha256 = hex::encode(ring::digest::digest(
        &ring::digest::SHA256,
        token.as_bytes(),
    ));
    let roles: Vec<String> = roles
        .iter()
        .map(|r| {
            let name = match r {
                TokenRole::Produce => "produce",
                TokenRole::Approve => "approve",
                TokenRole::Consume => "consume",
                TokenRole::Admin => "admin",
            };
            format!("{name:?}")
        })
        .collect();
    let config = format!(
        "[[tokens]]\nname = {}\ntoken_sha256 = \"{sha256}\"\nroles = [{}]\n",
        toml_string(name),
        roles.join(", ")
    );
    out.item(
        || format!("token\t{token}\ntoken_sha256\t{sha256}\n\n{config}"),
        &serde_json::json!({"token": token, "token_sha256": sha256, "config": config}),
    )
}

/// A TOML basic string: JSON's escapes are TOML's.
fn toml_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// Where the daemon is and how to trust it: the common options given as flags or
/// environment variables (clap read both), else the context in use (`--context`,
/// `MUSTER_CONTEXT`, the current one), else the local daemon. The resolution is
/// muster-sdk's, shared with the Python SDK.
pub fn options(g: &Global) -> anyhow::Result<ConnectOptions> {
    let given = ConnectArgs {
        context: g.context.clone(),
        addr: g.addr.clone(),
        data: g.data.clone(),
        ca: g.ca.clone(),
        pin: g.pin.clone(),
        token: g.token.clone(),
        token_file: g.token_file.clone(),
        server_name: None,
    };
    Ok(given.resolve()?)
}

/// `muster context …`: edits the contexts file; never connects.
fn contexts(out: &Output, g: &Global, cmd: ContextCommand) -> anyhow::Result<()> {
    let path = Contexts::path()?;
    let mut all = Contexts::load(&path)?;
    match cmd {
        ContextCommand::Add { name } => {
            let addr = g.addr.clone().context(
                "a context needs --addr HOST:PORT (and --pin, --ca or --data to trust it)",
            )?;
            if g.token.is_some() {
                bail!(
                    "a context keeps no token: put it in a file only you can read and give \
                     --token-file FILE instead of --token or MUSTER_TOKEN"
                );
            }
            // Paths as absolute ones: later commands run from other directories.
            let absolute = |p: &Option<std::path::PathBuf>| {
                p.as_deref()
                    .map(|p| std::path::absolute(p).with_context(|| format!("{}", p.display())))
                    .transpose()
            };
            all.add(
                &name,
                Context {
                    addr,
                    pin: g.pin.clone(),
                    ca: absolute(&g.ca)?,
                    data: absolute(&g.data)?,
                    token_file: absolute(&g.token_file)?,
                },
            )?;
        }
        ContextCommand::Use { name } => all.use_context(&name)?,
        ContextCommand::Remove { name } => all.remove(&name)?,
        ContextCommand::List => {
            out.header(output::CONTEXT_COLUMNS)?;
            for (name, c) in &all.contexts {
                let current = all.current.as_deref() == Some(name.as_str());
                let mut trust = match (&c.pin, &c.ca, &c.data) {
                    (Some(pin), _, _) => format!("pin {pin}"),
                    (None, Some(ca), _) => format!("ca {}", ca.display()),
                    (None, None, Some(data)) => format!("data {}", data.display()),
                    (None, None, None) => "local data directory".into(),
                };
                if let Some(file) = &c.token_file {
                    trust.push_str(&format!(", token file {}", file.display()));
                }
                let json = serde_json::json!({
                    "name": name, "current": current, "addr": c.addr,
                    "pin": c.pin, "ca": c.ca, "data": c.data, "token_file": c.token_file,
                });
                out.item(
                    || format!("{name}\t{current}\t{}\t{}", c.addr, output::safe(&trust)),
                    &json,
                )?;
            }
            return Ok(());
        }
    }
    crate::context::save(&all, &path)
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
        fair: o.fair,
        group_weights: (!o.group_weights.is_empty())
            .then(|| o.group_weights.iter().cloned().collect()),
    })
}

async fn queue(client: &Client, out: &Output, cmd: QueueCommand) -> anyhow::Result<()> {
    match cmd {
        QueueCommand::Create { name, options } => {
            out.queue(&client.queue_create(&name, patch(&options)?).await?)
        }
        QueueCommand::List => {
            let queues = client.queue_list().await?;
            out.header(output::QUEUE_COLUMNS)?;
            for q in queues {
                out.item(
                    || {
                        let c = &q.counts;
                        format!(
                            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                            q.name,
                            c.ready,
                            c.scheduled,
                            c.leased,
                            c.suspended,
                            c.done,
                            c.dead,
                            c.cancelled,
                            q.options.paused
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
        QueueCommand::Purge { name, yes } => {
            let c = client.queue_describe(&name).await?.counts;
            let held = c.ready + c.scheduled;
            if held > 0 {
                confirm(
                    &format!("purge {held} ready and scheduled tasks of queue {name:?}"),
                    &name,
                    yes,
                )
                .await?;
            }
            let n = client.queue_purge(&name).await?;
            out.item(|| format!("purged {n}"), &serde_json::json!({ "count": n }))
        }
        QueueCommand::Delete { name, yes } => {
            let c = client.queue_describe(&name).await?.counts;
            let held: u64 = TaskState::ALL.iter().map(|s| c.get(*s)).sum();
            if held > 0 {
                confirm(
                    &format!("delete queue {name:?} and its {held} tasks"),
                    &name,
                    yes,
                )
                .await?;
            }
            let n = client.queue_delete(&name).await?;
            out.item(
                || format!("deleted {name} with {n} tasks"),
                &serde_json::json!({ "count": n }),
            )
        }
    }
}

async fn limit(client: &Client, out: &Output, cmd: LimitCommand) -> anyhow::Result<()> {
    match cmd {
        LimitCommand::Set { name, spec } => {
            let spec = LimitSpec {
                rate: spec.rate,
                burst: spec.burst,
                concurrency: spec.concurrency,
                per_key: spec.per_key,
            };
            out.limit(&client.limit_set(&name, spec).await?)
        }
        LimitCommand::Get { name } => out.limit(&client.limit_get(&name).await?),
        LimitCommand::List => {
            let limits = client.limit_list().await?;
            out.header(output::LIMIT_COLUMNS)?;
            for l in limits {
                out.item(|| output::limit_row(&l), &l)?;
            }
            Ok(())
        }
        LimitCommand::Delete { name } => {
            let n = client.limit_delete(&name).await?;
            out.item(
                || format!("deleted {name}; {n} tasks were waiting on it"),
                &serde_json::json!({ "count": n }),
            )
        }
    }
}

/// `muster schedule …`: sets, shows, lists, pauses, resumes, deletes or runs schedules.
async fn schedule(client: &Client, out: &Output, cmd: ScheduleCommand) -> anyhow::Result<()> {
    match cmd {
        ScheduleCommand::Set(args) => {
            out.schedule(&client.schedule_set(&schedule_set(*args)?).await?)
        }
        ScheduleCommand::Get { name } => out.schedule(&client.schedule_get(&name).await?),
        ScheduleCommand::List => {
            let schedules = client.schedule_list().await?;
            let now = output::now_ms();
            out.header(output::SCHEDULE_COLUMNS)?;
            for s in schedules {
                out.item(|| output::schedule_row(&s, now), &s)?;
            }
            Ok(())
        }
        ScheduleCommand::Pause { name } => out.schedule(&client.schedule_pause(&name).await?),
        ScheduleCommand::Resume { name } => out.schedule(&client.schedule_resume(&name).await?),
        ScheduleCommand::Delete { name } => {
            client.schedule_delete(&name).await?;
            out.item(
                || format!("deleted schedule {name}; the tasks it enqueued stay"),
                &serde_json::json!({"schedule": name, "deleted": true}),
            )
        }
        ScheduleCommand::RunNow { name } => {
            let reply = muster_protocol::ops::ScheduleRunReply {
                task: client.schedule_run(&name).await?,
            };
            out.item(|| reply.task.id.clone(), &reply)
        }
    }
}

/// The request of `muster schedule set`.
fn schedule_set(args: ScheduleSetArgs) -> anyhow::Result<muster_protocol::ops::ScheduleSet> {
    let payload = json_arg("--payload", &args.payload)?;
    Ok(muster_protocol::ops::ScheduleSet {
        task: new_task(&args.task, payload),
        name: args.name,
        cron: args.cron,
        tz: args.tz,
        queue: args.queue,
        catch_up: args.catch_up.map(Into::into),
        paused: args.paused.then_some(true),
    })
}

/// A task with `payload` and the options given, without a time or idempotency key.
fn new_task(options: &TaskArgs, payload: muster_sdk::RawJson) -> NewTask {
    NewTask {
        payload,
        priority: options.priority,
        key: options.key.clone(),
        requires: options.requires.clone(),
        delay_ms: options.delay.map(ms),
        not_before_ms: None,
        idempotency_key: None,
        limits: options.limits.clone(),
        group: options.group.clone(),
        traceparent: None,
        tracestate: None,
    }
}

/// The task `muster enqueue` enqueues with `payload`: its options, its time and its
/// idempotency key.
fn enqueued_task(args: &EnqueueArgs, payload: muster_sdk::RawJson) -> NewTask {
    let traceparent = std::env::var("TRACEPARENT").ok().filter(|t| !t.is_empty());
    NewTask {
        not_before_ms: args.at.map(|t| t.duration_since(UNIX_EPOCH).map_or(0, ms)),
        idempotency_key: args.idempotency_key.clone(),
        // The trace the command runs in (OpenTelemetry's environment carrier; `muster
        // work` sets it for its programs): the task continues it.
        traceparent: traceparent.clone(),
        tracestate: traceparent
            .and(std::env::var("TRACESTATE").ok())
            .filter(|t| !t.is_empty()),
        ..new_task(&args.task, payload)
    }
}

async fn enqueue(client: &Client, out: &Output, args: EnqueueArgs) -> anyhow::Result<()> {
    if args.payload == "-" {
        return enqueue_lines(client, out, args).await;
    }
    let payload = json_arg("PAYLOAD", &args.payload)?;
    let task = client
        .enqueue(&args.queue, enqueued_task(&args, payload))
        .await?;
    print_enqueued(out, &task)
}

/// Prints an enqueued task's id (in JSON mode the whole reply); a task that already
/// existed under its idempotency key is said so on stderr, so stdout holds only ids.
fn print_enqueued(out: &Output, task: &muster_sdk::EnqueuedTask) -> anyhow::Result<()> {
    out.item(|| task.id.clone(), task)?;
    if task.duplicate && !out.is_json() {
        eprintln!(
            "muster: {}: already enqueued under this idempotency key (nothing new stored)",
            task.id
        );
    }
    Ok(())
}

/// `enqueue QUEUE -`: one task per stdin line. Each enqueue is sent in stdin order, up
/// to [`STDIN_IN_FLIGHT`] at a time, and its id printed (and flushed) as soon as its
/// reply arrives, in input order. On any failure the ids of every acknowledged line are
/// printed before the command fails, naming the lines whose outcome is unknown (sent,
/// never answered: they may have been stored) and the lines refused.
async fn enqueue_lines(client: &Client, out: &Output, args: EnqueueArgs) -> anyhow::Result<()> {
    use futures_util::StreamExt;

    let keys = args
        .idempotency_key
        .as_deref()
        .map(KeyTemplate::parse)
        .transpose()?;
    // Lines are read on a blocking thread.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<String>>(STDIN_IN_FLIGHT);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            if tx.blocking_send(line).is_err() {
                return;
            }
        }
    });
    let mut in_flight = futures_util::stream::FuturesOrdered::new();
    let mut tally = LineTally::default();
    let mut line_no = 0usize;
    let mut reading = true;
    while reading || !in_flight.is_empty() {
        tokio::select! {
            Some((line, reply)) = in_flight.next(), if !in_flight.is_empty() => {
                match reply {
                    Ok(reply) => {
                        let reply: muster_protocol::ops::EnqueueReply = reply;
                        for task in &reply.tasks {
                            print_enqueued(out, task)?;
                        }
                        tally.acknowledged += 1;
                    }
                    Err(e) => {
                        tally.failed(line, e);
                        reading = false;
                    }
                }
            }
            line = rx.recv(), if reading && in_flight.len() < STDIN_IN_FLIGHT => {
                let Some(line) = line else {
                    reading = false;
                    continue;
                };
                line_no += 1;
                let task = match line
                    .context("reading stdin")
                    .and_then(|line| line_task(&args, keys.as_ref(), &line))
                {
                    Ok(Some(task)) => task,
                    Ok(None) => continue,
                    Err(e) => {
                        tally.stop = Some(format!("line {line_no}: {e:#}"));
                        reading = false;
                        continue;
                    }
                };
                match client.send_enqueue(&args.queue, vec![task]).await {
                    Ok(pending) => in_flight.push_back(async move { (line_no, pending.reply().await) }),
                    Err(e) => {
                        // Not sent at all: nothing of this line can have been stored.
                        tally.stop = Some(format!("line {line_no} not sent: {e}"));
                        reading = false;
                    }
                }
            }
        }
    }
    tally.finish(line_no)
}

/// What became of the lines of `enqueue QUEUE -`.
#[derive(Default)]
struct LineTally {
    acknowledged: usize,
    /// Lines sent and never answered (the connection was lost): maybe stored.
    unknown: Vec<usize>,
    /// Lines the daemon refused (nothing stored), with the first refusal.
    refused: Vec<usize>,
    first_error: Option<String>,
    /// Why reading stopped before stdin ended (an unreadable line, a line not sent).
    stop: Option<String>,
}

impl LineTally {
    fn failed(&mut self, line: usize, e: muster_sdk::Error) {
        let unknown = match &e {
            muster_sdk::Error::Server(body) => body.code == muster_sdk::ErrorCode::OutcomeUnknown,
            muster_sdk::Error::Closed(_) => true,
            _ => false,
        };
        if unknown {
            self.unknown.push(line);
        } else {
            self.refused.push(line);
        }
        self.first_error
            .get_or_insert_with(|| format!("line {line}: {e}"));
    }

    /// Ok if every line was acknowledged, else one line naming what failed and which
    /// lines to look at; `read` lines of stdin were read.
    fn finish(self, read: usize) -> anyhow::Result<()> {
        let mut parts = Vec::new();
        if let Some(stop) = self.stop {
            parts.push(stop);
        }
        if let Some(first) = self.first_error {
            parts.push(first);
        }
        if parts.is_empty() {
            return Ok(());
        }
        let lines = |n: usize| {
            if n == 1 {
                "1 line".to_owned()
            } else {
                format!("{n} lines")
            }
        };
        parts.push(format!(
            "{} enqueued (their ids printed)",
            lines(self.acknowledged)
        ));
        if !self.unknown.is_empty() {
            parts.push(format!(
                "{} sent without an answer (outcome_unknown: they may be stored; enqueue them again with idempotency keys): {}",
                self.unknown.len(),
                line_ranges(&self.unknown)
            ));
        }
        if !self.refused.is_empty() {
            parts.push(format!(
                "{} refused (not stored): {}",
                self.refused.len(),
                line_ranges(&self.refused)
            ));
        }
        bail!("{}; stdin was not read past line {read}", parts.join("; "))
    }
}

/// Line numbers as ranges: `lines 3, 5-9`.
fn line_ranges(lines: &[usize]) -> String {
    let mut sorted = lines.to_vec();
    sorted.sort_unstable();
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for n in sorted {
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == n => *end = n,
            _ => ranges.push((n, n)),
        }
    }
    let text: Vec<String> = ranges
        .iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    let noun = if lines.len() == 1 { "line" } else { "lines" };
    format!("{noun} {}", text.join(", "))
}

/// The task one stdin line stands for (`None` for a blank line).
fn line_task(
    args: &EnqueueArgs,
    keys: Option<&KeyTemplate>,
    line: &str,
) -> anyhow::Result<Option<NewTask>> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(None);
    }
    let payload = muster_sdk::raw_json(line)?;
    let mut task = enqueued_task(args, payload);
    task.idempotency_key = keys.map(|k| k.key_for(line)).transpose()?;
    Ok(Some(task))
}

/// `--idempotency-key` with `enqueue QUEUE -`: a template giving each line its own key,
/// in which `{/json/pointer}` stands for the string or number at that JSON pointer
/// (RFC 6901) in the line's payload, e.g. `order-{/order_id}`.
#[derive(Debug)]
struct KeyTemplate {
    parts: Vec<KeyPart>,
}

#[derive(Debug)]
enum KeyPart {
    Text(String),
    Pointer(String),
}

impl KeyTemplate {
    fn parse(template: &str) -> anyhow::Result<KeyTemplate> {
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            let close = rest[open..]
                .find('}')
                .map(|c| open + c)
                .with_context(|| format!("--idempotency-key {template:?}: an unclosed `{{`"))?;
            if open > 0 {
                parts.push(KeyPart::Text(rest[..open].to_owned()));
            }
            let pointer = &rest[open + 1..close];
            if !pointer.starts_with('/') {
                bail!(
                    "--idempotency-key {template:?}: `{{{pointer}}}` is not a JSON pointer (one starts with `/`, e.g. `{{/id}}`)"
                );
            }
            parts.push(KeyPart::Pointer(pointer.to_owned()));
            rest = &rest[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(KeyPart::Text(rest.to_owned()));
        }
        if !parts.iter().any(|p| matches!(p, KeyPart::Pointer(_))) {
            bail!(
                "with PAYLOAD -, --idempotency-key is a template that gives each line its own key and must name a field of the payload, e.g. 'order-{{/order_id}}'"
            );
        }
        Ok(KeyTemplate { parts })
    }

    fn key_for(&self, line: &str) -> anyhow::Result<String> {
        let payload: serde_json::Value = serde_json::from_str(line)?;
        let mut key = String::new();
        for part in &self.parts {
            match part {
                KeyPart::Text(text) => key.push_str(text),
                KeyPart::Pointer(pointer) => match payload.pointer(pointer) {
                    Some(serde_json::Value::String(s)) => key.push_str(s),
                    Some(serde_json::Value::Number(n)) => key.push_str(&n.to_string()),
                    Some(other) => {
                        bail!("the idempotency key's {pointer} is {other}, not a string or number")
                    }
                    None => bail!("the payload has no {pointer} for the idempotency key"),
                },
            }
        }
        Ok(key)
    }
}

async fn list(
    client: &Client,
    out: &Output,
    queue: &str,
    state: TaskState,
    mut after: Option<String>,
    limit: u32,
) -> anyhow::Result<()> {
    out.header(output::TASK_COLUMNS)?;
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

/// Pages through a search until `limit` matches are printed or nothing is left.
async fn find(client: &Client, out: &Output, args: FindArgs) -> anyhow::Result<()> {
    let state = args.state.as_deref().map(parse_state).transpose()?;
    let mut search = TaskFind {
        queue: args.queue,
        state,
        id_prefix: args.id_prefix,
        key: args.key,
        idempotency_key: args.idempotency_key,
        label: args.label,
        error: args.error,
        payload: args.payload,
        field: args.field,
        newest_first: args.newest,
        after: None,
        limit: None,
    };
    out.header(output::TASK_COLUMNS)?;
    let mut left = args.limit;
    while left > 0 {
        search.limit = Some(left.min(muster_protocol::limits::MAX_PAGE));
        let page = client.task_find(&search).await?;
        for t in &page.tasks {
            out.summary(t)?;
        }
        left = left.saturating_sub(page.tasks.len() as u32);
        match page.next {
            Some(next) => search.after = Some(next),
            None => break,
        }
    }
    Ok(())
}

fn parse_state(state: &str) -> anyhow::Result<TaskState> {
    TaskState::parse(state).with_context(|| {
        format!("invalid state {state:?}: want scheduled, ready, leased, suspended, done, dead or cancelled")
    })
}

/// A line of `stats --json`: the item's fields after `kind` (`queue` or `daemon`), so
/// every line is one object a reader tells apart by one field.
#[derive(serde::Serialize)]
struct Kind<'a, T> {
    kind: &'static str,
    #[serde(flatten)]
    item: &'a T,
}

/// `muster stats [QUEUE]`: a row per queue, then (without QUEUE) the daemon's row after
/// a blank line; with `--json`, one object per line, each with its `kind`.
async fn stats(client: &Client, out: &Output, queue: Option<&str>) -> anyhow::Result<()> {
    let queues = match queue {
        Some(q) => vec![client.queue_describe(q).await?],
        None => client.queue_list().await?,
    };
    let now = output::now_ms();
    out.header(output::STATS_COLUMNS)?;
    for q in &queues {
        out.item(
            || {
                let (c, t) = (&q.counts, &q.totals);
                format!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    q.name,
                    c.ready,
                    c.scheduled,
                    c.leased,
                    c.suspended,
                    c.done,
                    c.dead,
                    c.cancelled,
                    q.held_back,
                    q.unclaimable,
                    q.oldest_ready_ms
                        .map_or("-".into(), |at| output::span(now.saturating_sub(at))
                            .replace(' ', "")),
                    t.enqueued,
                    t.acked,
                    t.nacked,
                    t.lapsed,
                    q.options.paused
                )
            },
            &Kind {
                kind: "queue",
                item: q,
            },
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
            "kind": "daemon",
            "syncs": daemon.syncs,
            "synced_requests": daemon.synced_requests,
            "batch_factor": factor,
            "members_connected": connected,
            "disk_alarm": daemon.disk_alarm,
        });
        out.text_line("")?;
        out.header(output::DAEMON_COLUMNS)?;
        let alarm = if daemon.disk_alarm { "on" } else { "off" };
        out.item(
            || {
                format!(
                    "{}\t{}\t{factor:.1}\t{connected}\t{alarm}",
                    daemon.syncs, daemon.synced_requests
                )
            },
            &json,
        )?;
    }
    Ok(())
}

/// Prints a cluster's status: a row of [`output::CLUSTER_COLUMNS`] for the node that
/// answered, then a row of [`output::CLUSTER_MEMBER_COLUMNS`] per member; with `--json`,
/// the reply as one object.
fn print_cluster(
    out: &Output,
    reply: &muster_protocol::ops::ClusterStatusReply,
) -> anyhow::Result<()> {
    if out.is_json() {
        return out.item(String::new, reply);
    }
    out.header(output::CLUSTER_COLUMNS)?;
    out.text_line(&output::cluster_row(reply))?;
    out.text_line("")?;
    out.header(output::CLUSTER_MEMBER_COLUMNS)?;
    for m in &reply.members {
        out.text_line(&output::cluster_member_row(m))?;
    }
    Ok(())
}

/// Asks before a destructive command: with `yes`, go on; on a terminal, the operator
/// types the target's name to go on; without one, refuse and say how to go on.
async fn confirm(what: &str, name: &str, yes: bool) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    if yes {
        return Ok(());
    }
    if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        bail!("refusing to {what} without confirmation: pass --yes");
    }
    eprint!("muster: {what}? Type {name:?} to confirm: ");
    let typed = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await
    .context("reading the confirmation")?
    .context("reading the confirmation")?;
    if typed.trim() != name {
        bail!("not confirmed: nothing was changed");
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
    if args.dry_run {
        for id in &reply.ids {
            out.text_line(id)?;
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::{Cli, Command, ScheduleCommand, ScheduleSetArgs};

    fn set_args(args: &[&str]) -> ScheduleSetArgs {
        let cli = Cli::try_parse_from(["muster", "schedule", "set"].iter().chain(args)).unwrap();
        match cli.command {
            Command::Schedule(ScheduleCommand::Set(args)) => *args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn schedule_set_sends_the_task_and_only_the_settings_given() {
        let full = set_args(&[
            "nightly",
            "--cron",
            "0 2 * * *",
            "--tz",
            "Europe/Berlin",
            "--queue",
            "reports",
            "--payload",
            r#"{"report": "daily"}"#,
            "--priority",
            "7",
            "--limit",
            "openai::3",
            "--delay",
            "30s",
            "--catch-up",
            "once",
            "--paused",
        ]);
        let request = super::schedule_set(full).unwrap();
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            serde_json::json!({
                "name": "nightly",
                "cron": "0 2 * * *",
                "tz": "Europe/Berlin",
                "queue": "reports",
                "task": {
                    "payload": {"report": "daily"},
                    "priority": 7,
                    "delay_ms": 30_000,
                    "limits": [{"limit": "openai", "cost": 3}],
                },
                "catch_up": "once",
                "paused": true,
            })
        );
        // Left out, a replaced schedule keeps its pause and the daemon picks UTC and skip.
        let bare = set_args(&["n", "--cron", "@hourly", "--queue", "q", "--payload", "{}"]);
        assert_eq!(
            serde_json::to_value(super::schedule_set(bare).unwrap()).unwrap(),
            serde_json::json!({"name": "n", "cron": "@hourly", "queue": "q", "task": {"payload": {}}})
        );
        let bad = set_args(&["n", "--cron", "@hourly", "--queue", "q", "--payload", "{"]);
        let e = super::schedule_set(bad).expect_err("not JSON");
        assert!(
            format!("{e:#}").starts_with("--payload is not JSON: "),
            "{e:#}"
        );
    }
}
