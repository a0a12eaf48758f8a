//! `muster bench`: the workload BENCHMARKS.md describes, against a daemon it starts.
//!
//! Phases (each run starts a fresh `musterd` on a temporary data directory):
//! - `enqueue`: producers, each with up to `window` unconfirmed enqueues in flight, put
//!   `tasks` 256-byte JSON payloads on a queue; a task counts when its reply arrives.
//! - `drain`: workers, each a member session holding up to `prefetch` pushed tasks,
//!   ack every task individually until all are done.
//! - `latency`: one producer at a steady `rate` for `seconds`, with the workers
//!   running; the time from enqueue to delivery.
//! - `roundtrip`: one producer and one worker, strictly sequential: enqueue, receive
//!   the push, ack.
//! - `startup`: `stored` tasks in the store, then the daemon is restarted: time from
//!   start to serving, and resident memory.
//! - `members`: `members` connected members each renewing a lease every second: the
//!   daemon's CPU use, and its resident memory with them connected (in all and per
//!   member).
//! - `limited`, `fair`, `limit-cost`: flow control ([`flow`]).
//! - `burndown`: `burn_tasks` no-op tasks enqueued, then worked by `workers`
//!   ([`burndown`]).
//! - `suspend`: suspend, resume and the next lease, sequentially ([`wait`]).
//! - `fanout`: a parent spawns children and waits for them ([`wait`]).
//! - `output`: tasks emitting live output with a follower each ([`output`]).
//!
//! Every run first times the machine's CPU (`cpu_probe_ms`: a fixed piece of
//! single-threaded work) and measures the disk it runs on: `FSYNC_SAMPLES` 4 KiB writes each
//! followed by an fdatasync, in the run's data directory (p50 and p99), so that every
//! latency can be read against the disk; during the latency phase a thread of the
//! benchmark goes on timing one such fdatasync every `DISK_PROBE_INTERVAL`, to read the
//! latency's tail against the disk's under the same load. Besides throughput and
//! latency it reports the group-commit batch factor (requests per fsync), the daemon's
//! CPU seconds per 1,000 tasks and its resident memory, and the share of the machine's
//! CPU the hypervisor stole during the run. The table goes to stdout, every
//! figure of every run to the JSON file.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::ValueEnum;
use muster_protocol::model::{NewTask, QueuePatch};
use muster_protocol::ops::{Ack, Claim, SessionOpen};
use muster_sdk::{Client, ConnectOptions, Push, Trust};
use serde::Serialize;

use crate::cli::{BenchArgs, BenchPhase};

mod burndown;
mod flow;
mod output;
mod wait;

/// Payload bytes of every benchmark task.
const PAYLOAD_BYTES: usize = 256;

/// Timings of the CPU probe at the start of each run.
const CPU_PROBE_SAMPLES: usize = 5;

/// Keys of the CPU probe's work (about 12 ms of it on the 2-core machines of
/// BENCHMARKS.md).
const CPU_PROBE_VALUES: usize = 1 << 16;

/// fdatasyncs timed at the start of each run.
const FSYNC_SAMPLES: usize = 200;

/// How often the disk is timed while the latency phase runs (about 1,000 samples in
/// its 10 s, so that its p99.9 and maximum mean something).
const DISK_PROBE_INTERVAL: Duration = Duration::from_millis(10);

/// Longest the latency phase waits, after its last enqueue, for every task to be acked.
const LATENCY_SETTLE: Duration = Duration::from_secs(60);

/// Longest a phase waits for its tasks to be acked: a drain by the workers (the drain,
/// burn-down and flow-control phases), the limited and fair phases' agents.
const PHASE_DEADLINE: Duration = Duration::from_secs(600);

/// How often a phase waiting for its tasks to be acked looks at the count.
const ACKED_POLL: Duration = Duration::from_millis(2);

/// Members of the members phase sharing one client endpoint.
const MEMBERS_PER_ENDPOINT: usize = 500;

/// Longest a started daemon may take to serve.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Connections the started daemon admits besides the members phase's members: every
/// other phase's producers, workers and agents (at most a few dozen), on one token.
const BENCH_CONNECTIONS: usize = 256;

/// A daemon started for the benchmark, stopped on drop.
struct Daemon {
    child: Child,
    addr: String,
    data: PathBuf,
}

impl Daemon {
    fn start(musterd: &Path, data: &Path, args: &BenchArgs) -> anyhow::Result<(Daemon, Duration)> {
        let durability = args
            .durability
            .to_possible_value()
            .expect("every durability has a name");
        let durability = durability.get_name();
        let mut log = daemon_log(args)?;
        let connections = (args.members + BENCH_CONNECTIONS).to_string();
        let started = Instant::now();
        let mut child = Command::new(musterd)
            .arg("--data")
            .arg(data)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--log-format",
                "json",
                "--durability",
                durability,
            ])
            // The members phase's members and the other phases' clients, all on one
            // token: the daemon admits every connection the run makes.
            .args([
                "--max-connections",
                &connections,
                "--max-connections-per-token",
            ])
            .arg(&connections)
            .env("MUSTER_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", musterd.display()))?;
        let stderr = child.stderr.take().context("musterd stderr")?;
        let (tx, rx) = std::sync::mpsc::channel();
        // Drains the daemon's stderr for its whole life (a full pipe would stop it),
        // keeps each line in the log if one was asked for, and hands the lines on until
        // the listening line has been found.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(file) = &mut log {
                    // A log that cannot be written loses lines, not the benchmark.
                    let _ = writeln!(file, "{line}");
                }
                let _ = tx.send(line);
            }
        });
        let addr = listening_addr(&rx)?;
        let serving = started.elapsed();
        Ok((
            Daemon {
                child,
                addr,
                data: data.to_path_buf(),
            },
            serving,
        ))
    }

    fn options(&self) -> ConnectOptions {
        ConnectOptions {
            addr: self.addr.clone(),
            trust: Trust::DataDir(self.data.clone()),
            ..ConnectOptions::default()
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then wait for the clean exit.
    fn stop(mut self) -> anyhow::Result<()> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id())?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        self.child.wait()?;
        Ok(())
    }
}

/// The file `--daemon-log` names, opened to append the daemon's log to; `None` without
/// one.
fn daemon_log(args: &BenchArgs) -> anyhow::Result<Option<std::fs::File>> {
    let Some(path) = &args.daemon_log else {
        return Ok(None);
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    Ok(Some(file))
}

/// The address a starting daemon listens on, from its JSON log's lines as `lines`
/// hands them on; an error if none says so within [`START_TIMEOUT`] of the last line.
fn listening_addr(lines: &std::sync::mpsc::Receiver<String>) -> anyhow::Result<String> {
    loop {
        let line = lines
            .recv_timeout(START_TIMEOUT)
            .context("musterd did not report listening")?;
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if v["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("musterd listening"))
        {
            return Ok(v["fields"]["addr"]
                .as_str()
                .context("addr in the log")?
                .to_owned());
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU seconds (user + system) a process has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after ")".
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after ")".
    (ticks(11) + ticks(12)) / 100.0
}

/// Times the machine's CPU: the median of [`CPU_PROBE_SAMPLES`] timings of
/// [`cpu_probe_work`], in milliseconds. On a shared machine the same build's CPU per
/// task moves with the hour (2× has been seen); a figure is read against this one,
/// measured in the same run, the way a latency is read against the disk's fdatasync.
fn cpu_probe_ms() -> f64 {
    let mut times: Vec<f64> = (0..CPU_PROBE_SAMPLES)
        .map(|_| {
            let started = Instant::now();
            std::hint::black_box(cpu_probe_work());
            started.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    median(&mut times)
}

/// A fixed piece of single-threaded work: [`CPU_PROBE_VALUES`] pseudo-random keys, each
/// with a small allocation, hashed into a map, then sorted and looked up; its result.
fn cpu_probe_work() -> u64 {
    let mut x: u64 = std::hint::black_box(0x9e37_79b9_7f4a_7c15);
    let mut keys: Vec<u64> = (0..CPU_PROBE_VALUES)
        .map(|_| {
            // xorshift64: the same keys on every machine.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        })
        .collect();
    let map: std::collections::HashMap<u64, Vec<u8>> = keys
        .iter()
        .map(|k| (*k, k.to_le_bytes().to_vec()))
        .collect();
    keys.sort_unstable();
    keys.iter()
        .fold(0u64, |acc, k| acc.wrapping_add(u64::from(map[k][0])))
}

/// The machine's CPU time in all and stolen by the hypervisor (`/proc/stat`), in ticks.
struct MachineTicks {
    total: u64,
    steal: u64,
}

impl MachineTicks {
    /// None where `/proc/stat` has no `cpu` line with a steal column.
    fn read() -> Option<MachineTicks> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        // user nice system idle iowait irq softirq steal (guest time is within user).
        let ticks: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        (ticks.len() == 8).then(|| MachineTicks {
            total: ticks.iter().sum(),
            steal: ticks[7],
        })
    }

    /// The share of the machine's CPU time stolen since `before`, in percent.
    fn steal_percent_since(&self, before: &MachineTicks) -> f64 {
        let total = self.total.saturating_sub(before.total).max(1);
        self.steal.saturating_sub(before.steal) as f64 * 100.0 / total as f64
    }
}

/// Resident memory of a process, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn payload(stamp: u64) -> anyhow::Result<muster_sdk::RawJson> {
    let head = format!("{{\"t\":{stamp},\"pad\":\"");
    let pad = "x".repeat(PAYLOAD_BYTES.saturating_sub(head.len() + 2));
    Ok(muster_sdk::raw_json(&format!("{head}{pad}\"}}"))?)
}

/// The figures of one run.
#[derive(Debug, Default, Clone, Serialize)]
struct Run {
    cpu_probe_ms: Option<f64>,
    steal_percent: Option<f64>,
    fdatasync_p50_ms: Option<f64>,
    fdatasync_p99_ms: Option<f64>,
    enqueue_per_s: Option<f64>,
    enqueue_batch_factor: Option<f64>,
    enqueue_cpu_s_per_1000: Option<f64>,
    drain_per_s: Option<f64>,
    drain_batch_factor: Option<f64>,
    drain_cpu_s_per_1000: Option<f64>,
    latency_p50_ms: Option<f64>,
    latency_p99_ms: Option<f64>,
    latency_p999_ms: Option<f64>,
    latency_max_ms: Option<f64>,
    latency_disk_p99_ms: Option<f64>,
    latency_disk_p999_ms: Option<f64>,
    latency_disk_max_ms: Option<f64>,
    roundtrip_mean_ms: Option<f64>,
    suspend_p50_ms: Option<f64>,
    suspend_p99_ms: Option<f64>,
    resume_to_lease_p50_ms: Option<f64>,
    resume_to_lease_p99_ms: Option<f64>,
    fanout_spawn_ms: Option<f64>,
    fanout_children_per_s: Option<f64>,
    fanout_total_ms: Option<f64>,
    fanin_ms: Option<f64>,
    output_chunks_per_s: Option<f64>,
    output_delay_p50_ms: Option<f64>,
    output_delay_p99_ms: Option<f64>,
    output_cpu_us_per_chunk: Option<f64>,
    output_disk_bytes_per_chunk: Option<f64>,
    startup_s: Option<f64>,
    startup_rss_mib: Option<f64>,
    members_cpu_percent: Option<f64>,
    members_rss_mib: Option<f64>,
    members_kib_per_member: Option<f64>,
    limited_per_s: Option<f64>,
    limited_steady_per_s: Option<f64>,
    limited_most_in_1s: Option<f64>,
    fair_b_wait_p50_ms: Option<f64>,
    fair_b_wait_p99_ms: Option<f64>,
    fair_b_wait_max_ms: Option<f64>,
    fair_groups_drain_per_s: Option<f64>,
    fair_groups_vs_plain: Option<f64>,
    fair_groups_cpu_s_per_1000: Option<f64>,
    fair_groups_cpu_vs_plain: Option<f64>,
    limit_cost_drain_per_s: Option<f64>,
    limit_cost_vs_plain: Option<f64>,
    limit_cost_cpu_s_per_1000: Option<f64>,
    limit_cost_cpu_vs_plain: Option<f64>,
    burndown_enqueue_per_s: Option<f64>,
    burndown_per_s: Option<f64>,
    burndown_cpu_s_per_1000: Option<f64>,
    burndown_rss_mib: Option<f64>,
    rss_mib: Option<f64>,
}

/// Runs the benchmark.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let musterd = match &args.musterd {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("the muster binary's directory")?
            .join("musterd"),
    };
    let want = |p: BenchPhase| args.phase.contains(&BenchPhase::All) || args.phase.contains(&p);
    let mut runs = Vec::new();
    for n in 0..args.runs {
        let dir = tempfile::tempdir()?;
        let machine_before = MachineTicks::read();
        let mut run = Run {
            cpu_probe_ms: Some(cpu_probe_ms()),
            ..Run::default()
        };
        let (p50, p99) = fdatasync_ms(dir.path())?;
        run.fdatasync_p50_ms = Some(p50);
        run.fdatasync_p99_ms = Some(p99);
        let (daemon, _) = Daemon::start(&musterd, dir.path(), &args)?;
        let options = daemon.options();
        if want(BenchPhase::Enqueue) || want(BenchPhase::Drain) {
            enqueue(&args, &options, daemon.pid(), &mut run).await?;
        }
        if want(BenchPhase::Drain) {
            drain(&args, &options, daemon.pid(), &mut run).await?;
        }
        if want(BenchPhase::LimitCost) {
            flow::limit_cost(&args, &options, daemon.pid(), &mut run).await?;
        }
        if want(BenchPhase::Latency) {
            latency(&args, &options, dir.path(), &mut run).await?;
        }
        if want(BenchPhase::Roundtrip) {
            roundtrip(&args, &options, &mut run).await?;
        }
        if want(BenchPhase::Suspend) {
            wait::suspend(&args, &options, &mut run).await?;
        }
        if want(BenchPhase::Fanout) {
            wait::fanout(&args, &options, &mut run).await?;
        }
        if want(BenchPhase::Output) {
            output::output(&args, &options, daemon.pid(), &mut run).await?;
        }
        if want(BenchPhase::Members) {
            members(&args, &options, daemon.pid(), &mut run).await?;
        }
        if want(BenchPhase::Limited) {
            flow::limited(&args, &options, &mut run).await?;
        }
        if want(BenchPhase::Fair) {
            flow::fair(&args, &options, daemon.pid(), &mut run).await?;
        }
        if want(BenchPhase::Burndown) {
            burndown::burndown(&args, &options, daemon.pid(), &mut run).await?;
        }
        run.rss_mib = Some(rss_mib(daemon.pid()));
        daemon.stop()?;
        if want(BenchPhase::Startup) {
            startup(&args, &musterd, &mut run).await?;
        }
        run.steal_percent = machine_before
            .zip(MachineTicks::read())
            .map(|(before, after)| after.steal_percent_since(&before));
        eprintln!(
            "run {} of {}: {}",
            n + 1,
            args.runs,
            serde_json::to_string(&run)?
        );
        runs.push(run);
    }
    print_table(&runs)?;
    let json = serde_json::json!({ "args": args, "runs": runs });
    std::fs::write(&args.out, serde_json::to_vec_pretty(&json)?)
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!("all figures: {}", args.out.display());
    Ok(())
}

async fn batch_factor(
    client: &Client,
    before: &muster_protocol::ops::ServerStatsReply,
) -> anyhow::Result<f64> {
    let after = client.server_stats().await?;
    let syncs = after.syncs.saturating_sub(before.syncs).max(1);
    Ok(after.synced_requests.saturating_sub(before.synced_requests) as f64 / syncs as f64)
}

async fn enqueue(
    args: &BenchArgs,
    options: &ConnectOptions,
    pid: u32,
    run: &mut Run,
) -> anyhow::Result<()> {
    let admin = Client::connect(options.clone()).await?;
    admin.queue_create("bench", QueuePatch::default()).await?;
    let stats = admin.server_stats().await?;
    let cpu = cpu_seconds(pid);
    let started = Instant::now();
    let mut producers = Vec::new();
    let per = args.tasks / args.producers;
    for p in 0..args.producers {
        let count = if p == 0 {
            args.tasks - per * (args.producers - 1)
        } else {
            per
        };
        let client = Client::connect(options.clone()).await?;
        let window = args.window;
        producers.push(tokio::spawn(async move {
            let mut in_flight = VecDeque::with_capacity(window);
            for _ in 0..count {
                if in_flight.len() >= window
                    && let Some(oldest) = in_flight.pop_front()
                {
                    let oldest: muster_sdk::PendingReply<_> = oldest;
                    oldest.reply().await?;
                }
                in_flight.push_back(
                    client
                        .send_enqueue("bench", vec![NewTask::new(payload(0)?)])
                        .await?,
                );
            }
            for pending in in_flight {
                pending.reply().await?;
            }
            anyhow::Ok(())
        }));
    }
    for p in producers {
        p.await??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    run.enqueue_per_s = Some(args.tasks as f64 / elapsed);
    run.enqueue_cpu_s_per_1000 = Some((cpu_seconds(pid) - cpu) / (args.tasks as f64 / 1000.0));
    run.enqueue_batch_factor = Some(batch_factor(&admin, &stats).await?);
    Ok(())
}

/// Starts `workers` member sessions of capacity `prefetch` on `queues`; each delivered
/// task goes to `on_task` and is acked at once. Returns the sessions' tasks.
async fn start_workers(
    options: &ConnectOptions,
    queues: &[&str],
    workers: usize,
    prefetch: u32,
    on_task: Arc<dyn Fn(&muster_sdk::Delivery) + Send + Sync>,
    acked: Arc<AtomicUsize>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<anyhow::Result<()>>>> {
    let mut handles = Vec::new();
    for w in 0..workers {
        let client = Client::connect(options.clone()).await?;
        let open = SessionOpen {
            member: format!("bench/worker-{w}"),
            labels: Vec::new(),
            capacity: prefetch,
            reclaim: false,
            resume: false,
            held: None,
            liveness_ms: None,
        };
        let (_, mut pushes) = client.open_session(&open).await?;
        let queues: Vec<String> = queues.iter().map(|q| (*q).to_owned()).collect();
        client.subscribe(&open.member, &queues).await?;
        let (on_task, acked) = (Arc::clone(&on_task), Arc::clone(&acked));
        handles.push(tokio::spawn(async move {
            while let Some(push) = pushes.recv().await {
                if let Push::Deliver(d) = push {
                    on_task(&d);
                    let pending = client
                        .send(&Ack {
                            task: d.id,
                            epoch: d.epoch,
                            result: None,
                        })
                        .await?;
                    let acked = Arc::clone(&acked);
                    tokio::spawn(async move {
                        if pending.reply().await.is_ok() {
                            acked.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            }
            anyhow::Ok(())
        }));
    }
    Ok(handles)
}

async fn drain(
    args: &BenchArgs,
    options: &ConnectOptions,
    pid: u32,
    run: &mut Run,
) -> anyhow::Result<()> {
    let admin = Client::connect(options.clone()).await?;
    let stats = admin.server_stats().await?;
    let (secs, cpu) = drain_queue(args, options, pid, "bench", args.tasks).await?;
    run.drain_per_s = Some(args.tasks as f64 / secs);
    run.drain_cpu_s_per_1000 = Some(cpu / (args.tasks as f64 / 1000.0));
    run.drain_batch_factor = Some(batch_factor(&admin, &stats).await?);
    Ok(())
}

/// Drains the `n` tasks of `queue` with the workers: the seconds it took and the
/// daemon's CPU seconds meanwhile.
async fn drain_queue(
    args: &BenchArgs,
    options: &ConnectOptions,
    pid: u32,
    queue: &str,
    n: usize,
) -> anyhow::Result<(f64, f64)> {
    let cpu = cpu_seconds(pid);
    let acked = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers = start_workers(
        options,
        &[queue],
        args.workers,
        args.prefetch,
        Arc::new(|_| {}),
        Arc::clone(&acked),
    )
    .await?;
    all_acked(&acked, n, PHASE_DEADLINE, &format!("{queue}: tasks acked")).await?;
    let secs = started.elapsed().as_secs_f64();
    for w in workers {
        w.abort();
    }
    Ok((secs, cpu_seconds(pid) - cpu))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The latency phase: one producer at a steady `rate` for `seconds`, with the workers
/// running; the time from enqueue to delivery, and the disk's fdatasync meanwhile.
async fn latency(
    args: &BenchArgs,
    options: &ConnectOptions,
    dir: &Path,
    run: &mut Run,
) -> anyhow::Result<()> {
    let producer = Client::connect(options.clone()).await?;
    producer
        .queue_create("latency", QueuePatch::default())
        .await?;
    let samples: Arc<Mutex<Vec<f64>>> = Arc::default();
    let acked = Arc::new(AtomicUsize::new(0));
    let workers = start_workers(
        options,
        &["latency"],
        args.workers,
        args.prefetch,
        latency_recorder(&samples),
        Arc::clone(&acked),
    )
    .await?;
    let total = (args.rate * args.seconds) as usize;
    let disk = LoadedDisk::start(dir)?;
    enqueue_at_rate(&producer, total, args.rate).await?;
    let disk = disk.finish()?;
    run.latency_disk_p99_ms = Some(percentile(&disk, 0.99));
    run.latency_disk_p999_ms = Some(percentile(&disk, 0.999));
    run.latency_disk_max_ms = disk.last().copied();
    all_acked(&acked, total, LATENCY_SETTLE, "latency: tasks acked").await?;
    for w in workers {
        w.abort();
    }
    let mut s = samples
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    s.sort_by(f64::total_cmp);
    run.latency_p50_ms = Some(percentile(&s, 0.5));
    run.latency_p99_ms = Some(percentile(&s, 0.99));
    run.latency_p999_ms = Some(percentile(&s, 0.999));
    run.latency_max_ms = s.last().copied();
    Ok(())
}

/// What the latency phase's workers do with each delivery: add the milliseconds since
/// its payload's stamp `t` (microseconds since the epoch) to `samples`.
fn latency_recorder(
    samples: &Arc<Mutex<Vec<f64>>>,
) -> Arc<dyn Fn(&muster_sdk::Delivery) + Send + Sync> {
    let samples = Arc::clone(samples);
    Arc::new(move |d: &muster_sdk::Delivery| {
        let v: serde_json::Value = serde_json::from_str(d.payload.get()).unwrap_or_default();
        if let Some(t) = v["t"].as_u64() {
            let ms = now_us().saturating_sub(t) as f64 / 1000.0;
            samples
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(ms);
        }
    })
}

/// Enqueues `total` tasks stamped with their send time on queue `latency`, `rate` a
/// second (late ticks catch up in a burst), at most 1,024 unconfirmed at a time;
/// returns once every one is confirmed.
async fn enqueue_at_rate(producer: &Client, total: usize, rate: f64) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut pending = VecDeque::new();
    for _ in 0..total {
        tick.tick().await;
        pending.push_back(
            producer
                .send_enqueue("latency", vec![NewTask::new(payload(now_us())?)])
                .await?,
        );
        while pending.len() > 1024 {
            if let Some(p) = pending.pop_front() {
                p.reply().await?;
            }
        }
    }
    for p in pending {
        p.reply().await?;
    }
    Ok(())
}

/// Waits until `counter` reaches `n`; an error naming `what` if that takes longer than
/// `within`.
async fn all_acked(
    counter: &AtomicUsize,
    n: usize,
    within: Duration,
    what: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while counter.load(Ordering::Relaxed) < n {
        if Instant::now() > deadline {
            bail!(
                "{what}: {} of {n} within {} s",
                counter.load(Ordering::Relaxed),
                within.as_secs()
            );
        }
        tokio::time::sleep(ACKED_POLL).await;
    }
    Ok(())
}

async fn roundtrip(
    args: &BenchArgs,
    options: &ConnectOptions,
    run: &mut Run,
) -> anyhow::Result<()> {
    let producer = Client::connect(options.clone()).await?;
    producer
        .queue_create("roundtrip", QueuePatch::default())
        .await?;
    let (worker, mut pushes) = one_at_a_time(options, "bench/roundtrip", "roundtrip").await?;
    let started = Instant::now();
    for _ in 0..args.roundtrips {
        producer
            .enqueue("roundtrip", NewTask::new(payload(0)?))
            .await?;
        let delivery = next_delivery(&mut pushes).await?;
        worker.ack(&delivery.id, delivery.epoch, None).await?;
    }
    run.roundtrip_mean_ms = Some(started.elapsed().as_secs_f64() * 1000.0 / args.roundtrips as f64);
    Ok(())
}

/// A worker taking one task at a time: `member`'s session of capacity 1, subscribed to
/// `queue`, and the pushes it gets.
async fn one_at_a_time(
    options: &ConnectOptions,
    member: &str,
    queue: &str,
) -> anyhow::Result<(Client, tokio::sync::mpsc::UnboundedReceiver<Push>)> {
    let worker = Client::connect(options.clone()).await?;
    let open = SessionOpen {
        member: member.into(),
        labels: Vec::new(),
        capacity: 1,
        reclaim: false,
        resume: false,
        held: None,
        liveness_ms: None,
    };
    let (_, pushes) = worker.open_session(&open).await?;
    worker.subscribe(member, &[queue.to_owned()]).await?;
    Ok((worker, pushes))
}

/// The next task pushed to a worker's session.
async fn next_delivery(
    pushes: &mut tokio::sync::mpsc::UnboundedReceiver<Push>,
) -> anyhow::Result<muster_protocol::model::Delivery> {
    loop {
        match pushes.recv().await {
            Some(Push::Deliver(d)) => return Ok(d),
            Some(_) => {}
            None => bail!("the worker's session ended"),
        }
    }
}

async fn startup(args: &BenchArgs, musterd: &Path, run: &mut Run) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (daemon, _) = Daemon::start(musterd, dir.path(), args)?;
    let client = Client::connect(daemon.options()).await?;
    client.queue_create("stored", QueuePatch::default()).await?;
    let mut pending = VecDeque::new();
    let mut n = 0;
    while n < args.stored {
        let batch = (args.stored - n).min(1000);
        let tasks = (0..batch)
            .map(|_| payload(0).map(NewTask::new))
            .collect::<anyhow::Result<Vec<_>>>()?;
        pending.push_back(client.send_enqueue("stored", tasks).await?);
        n += batch;
        if pending.len() >= 8
            && let Some(p) = pending.pop_front()
        {
            p.reply().await?;
        }
    }
    for p in pending {
        p.reply().await?;
    }
    drop(client);
    daemon.stop()?;
    let (daemon, serving) = Daemon::start(musterd, dir.path(), args)?;
    let client = Client::connect(daemon.options()).await?;
    let q = client.queue_describe("stored").await?;
    if q.counts.ready != args.stored as u64 {
        bail!(
            "{} of {} stored tasks after the restart",
            q.counts.ready,
            args.stored
        );
    }
    run.startup_s = Some(serving.as_secs_f64());
    run.startup_rss_mib = Some(rss_mib(daemon.pid()));
    drop(client);
    daemon.stop()
}

/// The members phase: `members` connected members each renewing a lease every second;
/// the daemon's CPU use, and its resident memory with them connected.
async fn members(
    args: &BenchArgs,
    options: &ConnectOptions,
    pid: u32,
    run: &mut Run,
) -> anyhow::Result<()> {
    let admin = Client::connect(options.clone()).await?;
    admin
        .queue_create(
            "members",
            QueuePatch {
                lease_ms: Some(10_000),
                ..QueuePatch::default()
            },
        )
        .await?;
    let tasks = (0..args.members)
        .map(|_| payload(0).map(NewTask::new))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for chunk in tasks.chunks(1000) {
        admin.enqueue_batch("members", chunk.to_vec()).await?;
    }
    let addr = tokio::net::lookup_host(&options.addr)
        .await?
        .next()
        .context("daemon address")?;
    // Several client endpoints (each a UDP socket and a driver task of its own), so the
    // benchmark's side of thousands of connections spreads over the runtime's threads.
    let endpoints = (0..args.members.div_ceil(MEMBERS_PER_ENDPOINT))
        .map(|_| muster_sdk::connect::endpoint_for(addr))
        .collect::<Result<Vec<_>, _>>()?;
    let before_mib = rss_mib(pid);
    let stop = Arc::new(tokio::sync::Notify::new());
    // Every member connects and opens its session before any renews: handshakes then
    // never queue behind thousands of renewals on a saturated machine.
    let mut sessions = Vec::with_capacity(args.members);
    for m in 0..args.members {
        let endpoint = &endpoints[m / MEMBERS_PER_ENDPOINT];
        let client = Client::connect_on(endpoint, options.clone()).await?;
        let member = format!("bench/member-{m}");
        let open = SessionOpen {
            member: member.clone(),
            labels: Vec::new(),
            capacity: 1,
            reclaim: false,
            resume: false,
            held: None,
            liveness_ms: None,
        };
        let (_, pushes) = client.open_session(&open).await?;
        sessions.push((client, member, pushes));
    }
    let agents = renew_leases(sessions, &stop).await?;
    // Measure once every member renews on its own rhythm.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (cpu, started) = (cpu_seconds(pid), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    run.members_cpu_percent =
        Some((cpu_seconds(pid) - cpu) / started.elapsed().as_secs_f64() * 100.0);
    let rss = rss_mib(pid);
    run.members_rss_mib = Some(rss);
    run.members_kib_per_member = Some((rss - before_mib) * 1024.0 / args.members as f64);
    stop.notify_waiters();
    for a in agents {
        a.abort();
    }
    Ok(())
}

/// Each member of `sessions` (its client, name and pushes) claims a task of queue
/// `members`, then renews its lease every second on a task of its own until `stop`.
async fn renew_leases(
    sessions: Vec<(Client, String, tokio::sync::mpsc::UnboundedReceiver<Push>)>,
    stop: &Arc<tokio::sync::Notify>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<anyhow::Result<()>>>> {
    let mut agents = Vec::new();
    for (client, member, pushes) in sessions {
        let got = client
            .claim(&Claim::new(["members"]).member(member))
            .await?;
        let lease = got.into_iter().next().context("a task for every member")?;
        let stop = Arc::clone(stop);
        agents.push(tokio::spawn(async move {
            let _pushes = pushes;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => { client.renew(&lease.id, lease.epoch, None, None).await?; }
                    () = stop.notified() => return anyhow::Ok(()),
                }
            }
        }));
    }
    Ok(agents)
}

/// A file in a run's data directory that times 4 KiB appends, each made durable with
/// fdatasync, the way the daemon's journal is; removed on drop.
struct DiskProbe {
    file: std::fs::File,
    path: PathBuf,
}

impl DiskProbe {
    fn create(dir: &Path, name: &str) -> anyhow::Result<DiskProbe> {
        let path = dir.join(name);
        let file =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(DiskProbe { file, path })
    }

    /// One append made durable, in milliseconds.
    fn sample_ms(&mut self) -> std::io::Result<f64> {
        use std::io::Write;
        self.file.write_all(&[0x5a; 4096])?;
        let started = Instant::now();
        self.file.sync_data()?;
        Ok(started.elapsed().as_secs_f64() * 1000.0)
    }
}

impl Drop for DiskProbe {
    fn drop(&mut self) {
        // In the run's temporary directory, removed with it if this fails.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The p50 and p99 of [`FSYNC_SAMPLES`] fdatasyncs of a [`DiskProbe`] in `dir`, in
/// milliseconds.
fn fdatasync_ms(dir: &Path) -> anyhow::Result<(f64, f64)> {
    let mut probe = DiskProbe::create(dir, "fdatasync-probe")?;
    let mut times = (0..FSYNC_SAMPLES)
        .map(|_| probe.sample_ms())
        .collect::<std::io::Result<Vec<f64>>>()?;
    times.sort_by(f64::total_cmp);
    Ok((percentile(&times, 0.5), percentile(&times, 0.99)))
}

/// Times the disk on a thread of its own while the latency phase runs: every
/// [`DISK_PROBE_INTERVAL`] one [`DiskProbe`] sample in `dir`, until the phase ends.
/// What the daemon's persists could have cost under the same load, from outside it.
struct LoadedDisk {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<std::io::Result<Vec<f64>>>,
}

impl LoadedDisk {
    fn start(dir: &Path) -> anyhow::Result<LoadedDisk> {
        let mut probe = DiskProbe::create(dir, "fdatasync-probe-under-load")?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("bench-disk-probe".into())
            .spawn(move || {
                let mut times = Vec::new();
                while !stopped.load(Ordering::Relaxed) {
                    times.push(probe.sample_ms()?);
                    std::thread::sleep(DISK_PROBE_INTERVAL);
                }
                Ok(times)
            })?;
        Ok(LoadedDisk { stop, thread })
    }

    /// Stops the probe: its samples, sorted.
    fn finish(self) -> anyhow::Result<Vec<f64>> {
        self.stop.store(true, Ordering::Relaxed);
        let mut times = self
            .thread
            .join()
            .map_err(|_| anyhow::anyhow!("the disk probe panicked"))??;
        times.sort_by(f64::total_cmp);
        Ok(times)
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Reads one figure of a run.
type Figure = fn(&Run) -> Option<f64>;

fn print_table(runs: &[Run]) -> anyhow::Result<()> {
    let rows: Vec<(&str, Figure)> = vec![
        ("machine: CPU probe ms", |r| r.cpu_probe_ms),
        ("machine: CPU stolen during the run %", |r| r.steal_percent),
        ("disk fdatasync p50 ms", |r| r.fdatasync_p50_ms),
        ("disk fdatasync p99 ms", |r| r.fdatasync_p99_ms),
        ("enqueue tasks/s", |r| r.enqueue_per_s),
        ("enqueue fsync batch factor", |r| r.enqueue_batch_factor),
        ("enqueue daemon CPU s / 1000 tasks", |r| {
            r.enqueue_cpu_s_per_1000
        }),
        ("drain tasks/s", |r| r.drain_per_s),
        ("drain fsync batch factor", |r| r.drain_batch_factor),
        ("drain daemon CPU s / 1000 tasks", |r| {
            r.drain_cpu_s_per_1000
        }),
        ("latency p50 ms", |r| r.latency_p50_ms),
        ("latency p99 ms", |r| r.latency_p99_ms),
        ("latency p99.9 ms", |r| r.latency_p999_ms),
        ("latency max ms", |r| r.latency_max_ms),
        ("disk fdatasync meanwhile p99 ms", |r| r.latency_disk_p99_ms),
        ("disk fdatasync meanwhile p99.9 ms", |r| {
            r.latency_disk_p999_ms
        }),
        ("disk fdatasync meanwhile max ms", |r| r.latency_disk_max_ms),
        ("round trip mean ms", |r| r.roundtrip_mean_ms),
        ("suspend: reply p50 ms", |r| r.suspend_p50_ms),
        ("suspend: reply p99 ms", |r| r.suspend_p99_ms),
        ("suspend: resume to next lease p50 ms", |r| {
            r.resume_to_lease_p50_ms
        }),
        ("suspend: resume to next lease p99 ms", |r| {
            r.resume_to_lease_p99_ms
        }),
        ("fanout: spawn reply ms", |r| r.fanout_spawn_ms),
        ("fanout: children run/s", |r| r.fanout_children_per_s),
        ("fanout: spawn to parent's next lease ms", |r| {
            r.fanout_total_ms
        }),
        ("fanout: last child's ack to parent's next lease ms", |r| {
            r.fanin_ms
        }),
        ("output: chunks followed/s", |r| r.output_chunks_per_s),
        ("output: follower delay p50 ms", |r| r.output_delay_p50_ms),
        ("output: follower delay p99 ms", |r| r.output_delay_p99_ms),
        ("output: daemon CPU us / chunk", |r| {
            r.output_cpu_us_per_chunk
        }),
        ("output: daemon disk bytes / chunk", |r| {
            r.output_disk_bytes_per_chunk
        }),
        ("startup to serving s", |r| r.startup_s),
        ("startup RSS MiB", |r| r.startup_rss_mib),
        ("members: daemon CPU %", |r| r.members_cpu_percent),
        ("members: daemon RSS MiB", |r| r.members_rss_mib),
        ("members: daemon KiB per member", |r| {
            r.members_kib_per_member
        }),
        ("limited: tasks/s", |r| r.limited_per_s),
        ("limited: tasks/s past the first s", |r| {
            r.limited_steady_per_s
        }),
        ("limited: most in any 1 s", |r| r.limited_most_in_1s),
        ("fair: other group's wait p50 ms", |r| r.fair_b_wait_p50_ms),
        ("fair: other group's wait p99 ms", |r| r.fair_b_wait_p99_ms),
        ("fair: other group's wait max ms", |r| r.fair_b_wait_max_ms),
        ("fair: groups' drain tasks/s", |r| r.fair_groups_drain_per_s),
        ("fair: groups' tasks/s vs plain", |r| r.fair_groups_vs_plain),
        ("fair: groups' daemon CPU s / 1000 tasks", |r| {
            r.fair_groups_cpu_s_per_1000
        }),
        ("fair: groups' CPU vs plain", |r| r.fair_groups_cpu_vs_plain),
        ("limit-cost: drain tasks/s", |r| r.limit_cost_drain_per_s),
        ("limit-cost: tasks/s vs plain", |r| r.limit_cost_vs_plain),
        ("limit-cost: daemon CPU s / 1000 tasks", |r| {
            r.limit_cost_cpu_s_per_1000
        }),
        ("limit-cost: CPU vs plain", |r| r.limit_cost_cpu_vs_plain),
        ("burndown: enqueue tasks/s", |r| r.burndown_enqueue_per_s),
        ("burndown: tasks worked/s", |r| r.burndown_per_s),
        ("burndown: daemon CPU s / 1000 tasks", |r| {
            r.burndown_cpu_s_per_1000
        }),
        ("burndown: daemon RSS at the end MiB", |r| {
            r.burndown_rss_mib
        }),
        ("daemon RSS after the run MiB", |r| r.rss_mib),
    ];
    println!(
        "{:<36} {:>12} {:>12} {:>12}   runs: {}",
        "figure",
        "median",
        "min",
        "max",
        runs.len()
    );
    for (name, get) in rows {
        let mut values: Vec<f64> = runs.iter().filter_map(get).collect();
        if values.is_empty() {
            continue;
        }
        let (min, max) = values
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(*v), b.max(*v)));
        println!(
            "{name:<36} {:>12.3} {min:>12.3} {max:>12.3}",
            median(&mut values)
        );
    }
    Ok(())
}
