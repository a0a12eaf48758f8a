//! `peer-bench`: the enqueue, drain and latency phases of `muster bench`
//! (`tui/src/bench.rs`), with the same sizes, against RabbitMQ (a durable quorum queue,
//! persistent messages, publisher confirms, manual acks) or NATS JetStream (a file
//! stream with WorkQueue retention, PubAcks, a pull consumer with explicit acks).
//!
//! Each run starts a fresh broker with the `--start` command (which prints the broker's
//! PID as its last line of output), measures the three phases, and stops the broker
//! with SIGTERM to that PID. The table (median, min, max of each figure over the runs)
//! goes to stdout, every figure of every run to the `--out` JSON file.
//!
//! - `enqueue`: [`PRODUCERS`] producers, each with up to [`WINDOW`] unconfirmed
//!   publishes in flight, `--tasks` messages of [`PAYLOAD_BYTES`] bytes of JSON in all;
//!   a message counts when its confirm (PubAck) arrives.
//! - `drain`: [`CONSUMERS`] consumers, each holding up to [`PREFETCH`] unacked
//!   messages, ack each message individually until all are done. Neither broker
//!   answers an ack: the phase ends when every ack has been sent and a round trip on
//!   each consumer's channel (connection) has shown the broker has read them.
//! - `latency`: one producer publishing [`LATENCY_RATE`] messages a second for
//!   `--seconds`, with the consumers running; the time from publish to delivery, from a
//!   stamp in the payload (microseconds since the epoch, as `muster bench` writes it).
//!
//! Besides throughput: the broker process's CPU time per message in the enqueue and
//! drain phases (utime + stime of `/proc/PID/stat`, which sums all its threads), and
//! its resident memory.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use clap::{Parser, ValueEnum};
use futures_util::StreamExt;
use serde::Serialize;
use tokio::task::JoinHandle;

/// Producers of the enqueue phase (`muster bench --producers`).
const PRODUCERS: usize = 4;

/// Unconfirmed publishes each producer keeps in flight (`muster bench --window`).
const WINDOW: usize = 256;

/// Consumers of the drain and latency phases (`muster bench --workers`).
const CONSUMERS: usize = 8;

/// Unacked messages each consumer holds at once (`muster bench --prefetch`).
const PREFETCH: u16 = 32;

/// Bytes of every message's JSON payload (`muster bench`'s `PAYLOAD_BYTES`).
const PAYLOAD_BYTES: usize = 256;

/// Publishes per second of the latency phase (`muster bench --rate`).
const LATENCY_RATE: f64 = 2000.0;

/// Unconfirmed publishes the latency phase's producer keeps at most (as `muster bench`).
const LATENCY_WINDOW: usize = 1024;

/// Longest the latency phase waits, after its last publish, for every message to be
/// acked.
const LATENCY_SETTLE: Duration = Duration::from_secs(60);

/// Longest the drain phase may take.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);

/// Longest a started broker may take to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

/// Longest a broker may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Clock ticks per second of `/proc/PID/stat` (USER_HZ, 100 on Linux).
const TICKS_PER_S: f64 = 100.0;

/// Queue (RabbitMQ) or stream and subject (JetStream) of the enqueue and drain phases.
const BENCH_QUEUE: &str = "bench";

/// Queue or stream and subject of the latency phase.
const LATENCY_QUEUE: &str = "latency";

#[derive(Debug, Clone, Copy, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Broker {
    /// RabbitMQ, a durable quorum queue (AMQP 0-9-1).
    Rabbitmq,
    /// NATS JetStream, a file stream with WorkQueue retention.
    Jetstream,
}

#[derive(Debug, Parser, Serialize)]
#[command(about = "muster bench's enqueue, drain and latency phases against another broker")]
struct Args {
    /// The broker.
    #[arg(long, value_enum)]
    broker: Broker,
    /// Its URL (amqp://guest:guest@127.0.0.1:PORT/%2f, nats://127.0.0.1:PORT).
    #[arg(long)]
    url: String,
    /// Shell command that starts a fresh broker (a new data directory) at --url and
    /// prints its PID as its last line of output; run before every run. The broker
    /// is stopped with SIGTERM to that PID after the run.
    #[arg(long)]
    start: String,
    /// Runs, each on a fresh broker; the table shows medians and spread.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Messages enqueued and drained (`muster bench --tasks`).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    tasks: u64,
    /// Length of the latency phase in seconds (`muster bench --seconds`).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Where every figure of every run is written (JSON).
    #[arg(long, default_value = "peer-bench.json")]
    out: PathBuf,
}

/// The figures of one run.
#[derive(Debug, Default, Clone, Serialize)]
struct Run {
    enqueue_per_s: f64,
    enqueue_cpu_us_per_task: f64,
    rss_after_enqueue_mib: f64,
    drain_per_s: f64,
    drain_cpu_us_per_task: f64,
    latency_p50_ms: f64,
    latency_p99_ms: f64,
    latency_p999_ms: f64,
    latency_max_ms: f64,
    rss_mib: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(
        args.seconds > 0.0 && args.seconds <= 86_400.0,
        "--seconds must be in (0, 86400]"
    );
    let mut runs = Vec::new();
    for n in 0..args.runs {
        let server = Server::start(&args.start)?;
        let run = run_once(&args, server.pid).await;
        server.stop()?;
        let run = run?;
        eprintln!(
            "{:?} run {} of {}: {}",
            args.broker,
            n + 1,
            args.runs,
            serde_json::to_string(&run)?
        );
        runs.push(run);
    }
    print_table(&args, &runs);
    let json = serde_json::json!({ "broker": args.broker, "args": &args, "runs": runs });
    std::fs::write(&args.out, serde_json::to_vec_pretty(&json)?)
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!("all figures: {}", args.out.display());
    Ok(())
}

/// The three phases against a fresh broker whose process is `pid`.
async fn run_once(args: &Args, pid: u32) -> anyhow::Result<Run> {
    let mut run = Run::default();
    let url = args.url.as_str();
    let tasks = usize::try_from(args.tasks)?;
    match args.broker {
        Broker::Rabbitmq => rabbitmq::declare(url, BENCH_QUEUE).await?,
        Broker::Jetstream => jetstream::declare(url, BENCH_QUEUE).await?,
    }

    let (cpu, started) = (cpu_seconds(pid)?, Instant::now());
    match args.broker {
        Broker::Rabbitmq => rabbitmq::enqueue(url, BENCH_QUEUE, tasks).await?,
        Broker::Jetstream => jetstream::enqueue(url, BENCH_QUEUE, tasks).await?,
    }
    run.enqueue_per_s = tasks as f64 / started.elapsed().as_secs_f64();
    run.enqueue_cpu_us_per_task = (cpu_seconds(pid)? - cpu) * 1e6 / tasks as f64;
    run.rss_after_enqueue_mib = rss_mib(pid)?;

    let (cpu, started) = (cpu_seconds(pid)?, Instant::now());
    let acked = Arc::new(AtomicUsize::new(0));
    let consumers = start_consumers(args.broker, url, BENCH_QUEUE, None, &acked).await?;
    wait_for(&acked, tasks, DRAIN_TIMEOUT, "drain").await?;
    consumers.flush().await?;
    run.drain_per_s = tasks as f64 / started.elapsed().as_secs_f64();
    run.drain_cpu_us_per_task = (cpu_seconds(pid)? - cpu) * 1e6 / tasks as f64;
    consumers.stop();

    latency(args, pid, &mut run).await?;
    run.rss_mib = rss_mib(pid)?;
    Ok(run)
}

/// The latency phase: one producer at [`LATENCY_RATE`] for `--seconds`, the consumers
/// running; the time from publish to delivery.
async fn latency(args: &Args, pid: u32, run: &mut Run) -> anyhow::Result<()> {
    let url = args.url.as_str();
    match args.broker {
        Broker::Rabbitmq => rabbitmq::declare(url, LATENCY_QUEUE).await?,
        Broker::Jetstream => jetstream::declare(url, LATENCY_QUEUE).await?,
    }
    let samples: Arc<Mutex<Vec<f64>>> = Arc::default();
    let acked = Arc::new(AtomicUsize::new(0));
    let consumers =
        start_consumers(args.broker, url, LATENCY_QUEUE, Some(&samples), &acked).await?;
    let total = (LATENCY_RATE * args.seconds) as usize;
    match args.broker {
        Broker::Rabbitmq => rabbitmq::publish_at_rate(url, LATENCY_QUEUE, total).await?,
        Broker::Jetstream => jetstream::publish_at_rate(url, LATENCY_QUEUE, total).await?,
    }
    wait_for(&acked, total, LATENCY_SETTLE, "latency").await?;
    consumers.stop();
    let mut s = samples
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    ensure!(
        s.len() >= total,
        "{} of {total} latency samples (broker PID {pid})",
        s.len()
    );
    s.sort_by(f64::total_cmp);
    run.latency_p50_ms = percentile(&s, 0.5);
    run.latency_p99_ms = percentile(&s, 0.99);
    run.latency_p999_ms = percentile(&s, 0.999);
    run.latency_max_ms = s.last().copied().unwrap_or_default();
    Ok(())
}

/// Consumers that record each delivery's latency in `samples` (if any), ack it, and
/// count it in `acked`.
async fn start_consumers(
    broker: Broker,
    url: &str,
    queue: &str,
    samples: Option<&Arc<Mutex<Vec<f64>>>>,
    acked: &Arc<AtomicUsize>,
) -> anyhow::Result<Consumers> {
    let on_message = Delivered {
        samples: samples.cloned(),
        acked: Arc::clone(acked),
    };
    match broker {
        Broker::Rabbitmq => rabbitmq::consumers(url, queue, on_message).await,
        Broker::Jetstream => jetstream::consumers(url, queue, on_message).await,
    }
}

/// What each consumer does with a delivered message besides acking it.
#[derive(Clone)]
struct Delivered {
    samples: Option<Arc<Mutex<Vec<f64>>>>,
    acked: Arc<AtomicUsize>,
}

impl Delivered {
    /// On delivery, before the ack: the latency from the payload's stamp `t`.
    fn received(&self, payload: &[u8]) {
        let Some(samples) = &self.samples else {
            return;
        };
        let v: serde_json::Value = serde_json::from_slice(payload).unwrap_or_default();
        if let Some(t) = v["t"].as_u64() {
            let ms = now_us().saturating_sub(t) as f64 / 1000.0;
            samples
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(ms);
        }
    }

    /// Once the ack is sent.
    fn acked(&self) {
        self.acked.fetch_add(1, Ordering::Relaxed);
    }
}

/// Running consumers: their tasks and, to show the broker has read every ack sent, a
/// handle for a round trip on each one's channel or connection.
struct Consumers {
    tasks: Vec<JoinHandle<anyhow::Result<()>>>,
    channels: Vec<AckChannel>,
}

enum AckChannel {
    Amqp(lapin::Channel),
    Nats(async_nats::Client),
}

impl Consumers {
    /// A round trip on every consumer's channel (basic.qos, answered in order after
    /// the acks before it) or connection (PING/PONG).
    async fn flush(&self) -> anyhow::Result<()> {
        for channel in &self.channels {
            match channel {
                AckChannel::Amqp(c) => {
                    c.basic_qos(PREFETCH, lapin::options::BasicQosOptions::default())
                        .await?;
                }
                AckChannel::Nats(c) => c.flush().await?,
            }
        }
        Ok(())
    }

    fn stop(self) {
        for t in self.tasks {
            t.abort();
        }
    }
}

/// Waits until `count` reaches `total`; an error after `timeout`, or if a consumer
/// ended.
async fn wait_for(
    count: &AtomicUsize,
    total: usize,
    timeout: Duration,
    phase: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while count.load(Ordering::Relaxed) < total {
        if Instant::now() > deadline {
            bail!(
                "{phase}: {} of {total} acked within {} s",
                count.load(Ordering::Relaxed),
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// A publish's confirmation (RabbitMQ's confirm, JetStream's PubAck), to await.
type Confirm = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// A publish being sent: its confirmation once it is.
type Sent = Pin<Box<dyn Future<Output = anyhow::Result<Confirm>> + Send>>;

/// Publishes `total` stamped messages through `publish` at [`LATENCY_RATE`] (late ticks
/// catch up in a burst), at most [`LATENCY_WINDOW`] unconfirmed; returns once every one
/// is confirmed. `publish` sends one and returns its confirmation to await.
async fn at_rate(total: usize, mut publish: impl FnMut(Vec<u8>) -> Sent) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / LATENCY_RATE));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut pending = VecDeque::new();
    for _ in 0..total {
        tick.tick().await;
        pending.push_back(publish(payload(now_us())).await?);
        while pending.len() > LATENCY_WINDOW {
            if let Some(p) = pending.pop_front() {
                p.await?;
            }
        }
    }
    for p in pending {
        p.await?;
    }
    Ok(())
}

/// Publishes `count` messages through `publish` with at most [`WINDOW`] unconfirmed.
async fn windowed(count: usize, mut publish: impl FnMut(Vec<u8>) -> Sent) -> anyhow::Result<()> {
    let mut in_flight = VecDeque::with_capacity(WINDOW);
    for _ in 0..count {
        if in_flight.len() >= WINDOW
            && let Some(oldest) = in_flight.pop_front()
        {
            oldest.await?;
        }
        in_flight.push_back(publish(payload(0)).await?);
    }
    for c in in_flight {
        c.await?;
    }
    Ok(())
}

/// How many of `total` messages producer `p` of [`PRODUCERS`] sends (the first takes
/// the remainder, as in `muster bench`).
fn share(total: usize, p: usize) -> usize {
    let per = total / PRODUCERS;
    if p == 0 {
        total - per * (PRODUCERS - 1)
    } else {
        per
    }
}

mod rabbitmq {
    //! A durable quorum queue; persistent messages with publisher confirms; consumers
    //! with basic.qos [`PREFETCH`] and manual acks. One connection per producer and
    //! consumer, as `muster bench` has one per producer and worker.

    use super::*;
    use lapin::options::{
        BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
        ConfirmSelectOptions, QueueDeclareOptions,
    };
    use lapin::types::{AMQPValue, FieldTable};
    use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

    /// AMQP delivery mode of a persistent message.
    const PERSISTENT: u8 = 2;

    /// A channel on a new connection, retried until [`CONNECT_TIMEOUT`] (the broker
    /// may still be booting).
    async fn channel(url: &str) -> anyhow::Result<Channel> {
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        let connection = loop {
            match Connection::connect(url, ConnectionProperties::default()).await {
                Ok(c) => break c,
                Err(e) if Instant::now() > deadline => {
                    return Err(e).with_context(|| format!("connecting to {url}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        Ok(connection.create_channel().await?)
    }

    pub async fn declare(url: &str, queue: &str) -> anyhow::Result<()> {
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel(url)
            .await?
            .queue_declare(queue.into(), options, arguments)
            .await?;
        Ok(())
    }

    /// A producer's channel, in confirm mode, and its publish: returns the confirm to
    /// await.
    async fn producer(
        url: &str,
        queue: &str,
    ) -> anyhow::Result<impl FnMut(Vec<u8>) -> Sent + Send + use<>> {
        let channel = channel(url).await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let queue = queue.to_owned();
        Ok(move |payload: Vec<u8>| {
            let (channel, queue) = (channel.clone(), queue.clone());
            let sent = async move {
                let confirm = channel
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        BasicPublishOptions::default(),
                        &payload,
                        BasicProperties::default().with_delivery_mode(PERSISTENT),
                    )
                    .await?;
                let confirmed = async move {
                    let confirmation = confirm.await?;
                    ensure!(confirmation.is_ack(), "publish nacked");
                    Ok(())
                };
                anyhow::Ok(Box::pin(confirmed) as Confirm)
            };
            Box::pin(sent) as Sent
        })
    }

    pub async fn enqueue(url: &str, queue: &str, tasks: usize) -> anyhow::Result<()> {
        let mut producers = Vec::new();
        for p in 0..PRODUCERS {
            let publish = producer(url, queue).await?;
            producers.push(tokio::spawn(windowed(share(tasks, p), publish)));
        }
        for p in producers {
            p.await??;
        }
        Ok(())
    }

    pub async fn publish_at_rate(url: &str, queue: &str, total: usize) -> anyhow::Result<()> {
        at_rate(total, producer(url, queue).await?).await
    }

    pub async fn consumers(
        url: &str,
        queue: &str,
        on_message: Delivered,
    ) -> anyhow::Result<Consumers> {
        let mut consumers = Consumers {
            tasks: Vec::new(),
            channels: Vec::new(),
        };
        for c in 0..CONSUMERS {
            let channel = channel(url).await?;
            channel
                .basic_qos(PREFETCH, BasicQosOptions::default())
                .await?;
            let mut deliveries = channel
                .basic_consume(
                    queue.into(),
                    format!("consumer-{c}").as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            let on_message = on_message.clone();
            consumers.tasks.push(tokio::spawn(async move {
                while let Some(delivery) = deliveries.next().await {
                    let delivery = delivery?;
                    on_message.received(&delivery.data);
                    delivery.ack(BasicAckOptions::default()).await?;
                    on_message.acked();
                }
                anyhow::Ok(())
            }));
            consumers.channels.push(AckChannel::Amqp(channel));
        }
        Ok(consumers)
    }
}

mod jetstream {
    //! A stream on file storage with WorkQueue retention (the server's defaults
    //! otherwise: it does not fsync each message); PubAcks; one durable pull consumer
    //! with explicit acks, max_ack_pending [`CONSUMERS`] × [`PREFETCH`], shared by
    //! the consumers, each pulling batches of [`PREFETCH`]. One connection per producer
    //! and consumer.

    use super::*;
    use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
    use async_nats::jetstream::stream::{Config, RetentionPolicy, StorageType};
    use async_nats::jetstream::{self as js, Context as Js};

    /// A JetStream context on a new connection, retried until [`CONNECT_TIMEOUT`].
    async fn context(url: &str) -> anyhow::Result<(async_nats::Client, Js)> {
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        loop {
            match async_nats::connect(url).await {
                Ok(c) => return Ok((c.clone(), js::new(c))),
                Err(e) if Instant::now() > deadline => {
                    return Err(e).with_context(|| format!("connecting to {url}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// The stream `name` (subject `name`) and its durable consumer `name`.
    pub async fn declare(url: &str, name: &str) -> anyhow::Result<()> {
        let (_, js) = context(url).await?;
        let stream = js
            .create_stream(Config {
                name: name.to_owned(),
                subjects: vec![name.to_owned()],
                retention: RetentionPolicy::WorkQueue,
                storage: StorageType::File,
                ..Config::default()
            })
            .await?;
        stream
            .create_consumer(pull::Config {
                durable_name: Some(name.to_owned()),
                ack_policy: AckPolicy::Explicit,
                max_ack_pending: (CONSUMERS * usize::from(PREFETCH)) as i64,
                ..pull::Config::default()
            })
            .await?;
        Ok(())
    }

    /// A producer's publish on a connection of its own: returns the PubAck to await.
    async fn producer(
        url: &str,
        subject: &str,
    ) -> anyhow::Result<impl FnMut(Vec<u8>) -> Sent + Send + use<>> {
        let (_, js) = context(url).await?;
        let subject = subject.to_owned();
        Ok(move |payload: Vec<u8>| {
            let (js, subject) = (js.clone(), subject.clone());
            let sent = async move {
                let ack = js.publish(subject, payload.into()).await?;
                let confirmed = async move {
                    ack.await?;
                    Ok(())
                };
                anyhow::Ok(Box::pin(confirmed) as Confirm)
            };
            Box::pin(sent) as Sent
        })
    }

    pub async fn enqueue(url: &str, subject: &str, tasks: usize) -> anyhow::Result<()> {
        let mut producers = Vec::new();
        for p in 0..PRODUCERS {
            let publish = producer(url, subject).await?;
            producers.push(tokio::spawn(windowed(share(tasks, p), publish)));
        }
        for p in producers {
            p.await??;
        }
        Ok(())
    }

    pub async fn publish_at_rate(url: &str, subject: &str, total: usize) -> anyhow::Result<()> {
        at_rate(total, producer(url, subject).await?).await
    }

    pub async fn consumers(
        url: &str,
        name: &str,
        on_message: Delivered,
    ) -> anyhow::Result<Consumers> {
        let mut consumers = Consumers {
            tasks: Vec::new(),
            channels: Vec::new(),
        };
        for _ in 0..CONSUMERS {
            let (client, js) = context(url).await?;
            let consumer: PullConsumer = js
                .get_stream(name)
                .await?
                .get_consumer(name)
                .await
                .map_err(|e| anyhow::anyhow!(e))?;
            let mut messages = consumer
                .stream()
                .max_messages_per_batch(usize::from(PREFETCH))
                .messages()
                .await?;
            let on_message = on_message.clone();
            consumers.tasks.push(tokio::spawn(async move {
                while let Some(message) = messages.next().await {
                    let message = message.map_err(|e| anyhow::anyhow!(e))?;
                    on_message.received(&message.payload);
                    message.ack().await.map_err(|e| anyhow::anyhow!(e))?;
                    on_message.acked();
                }
                anyhow::Ok(())
            }));
            consumers.channels.push(AckChannel::Nats(client));
        }
        Ok(consumers)
    }
}

/// A broker started by the `--start` command, stopped by its PID.
struct Server {
    pid: u32,
}

impl Server {
    fn start(command: &str) -> anyhow::Result<Server> {
        let output = Command::new("sh")
            .args(["-c", command])
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .with_context(|| format!("running {command:?}"))?;
        ensure!(output.status.success(), "{command:?}: {}", output.status);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let pid = stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| l.trim().parse().ok())
            .with_context(|| format!("{command:?} printed no PID as its last line"))?;
        Ok(Server { pid })
    }

    /// SIGTERM, then wait for the process to go (SIGKILL after [`STOP_TIMEOUT`]).
    fn stop(self) -> anyhow::Result<()> {
        let signal = |name: &str| {
            Command::new("kill")
                .args([name, &self.pid.to_string()])
                .status()
        };
        signal("-TERM")?;
        let deadline = Instant::now() + STOP_TIMEOUT;
        while running(self.pid) {
            if Instant::now() > deadline {
                signal("-KILL")?;
                bail!("broker {} did not exit on SIGTERM: killed", self.pid);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

/// Whether a process exists and has not exited (a zombie has).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// CPU seconds (user + system, all threads) a process has used.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The fields after the command name (which may hold spaces) start after ")":
    // utime and stime, fields 14 and 15 of stat, are the 12th and 13th there.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields
            .get(i)
            .context("short /proc/PID/stat")?
            .parse::<f64>()?)
    };
    Ok((ticks(11)? + ticks(12)?) / TICKS_PER_S)
}

/// Resident memory of a process, in MiB.
fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("VmRSS in /proc/PID/status")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib / 1024.0)
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// `{"t":STAMP,"pad":"xx…"}` of [`PAYLOAD_BYTES`] bytes, as `muster bench` sends.
fn payload(stamp: u64) -> Vec<u8> {
    let head = format!("{{\"t\":{stamp},\"pad\":\"");
    let pad = "x".repeat(PAYLOAD_BYTES.saturating_sub(head.len() + 2));
    format!("{head}{pad}\"}}").into_bytes()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The median as `muster bench` takes it (the upper one of an even count).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn print_table(args: &Args, runs: &[Run]) {
    type Figure = fn(&Run) -> f64;
    let rows: [(&str, Figure); 10] = [
        ("enqueue tasks/s", |r| r.enqueue_per_s),
        ("enqueue server CPU us / task", |r| {
            r.enqueue_cpu_us_per_task
        }),
        ("server RSS after enqueue MiB", |r| r.rss_after_enqueue_mib),
        ("drain tasks/s", |r| r.drain_per_s),
        ("drain server CPU us / task", |r| r.drain_cpu_us_per_task),
        ("latency p50 ms", |r| r.latency_p50_ms),
        ("latency p99 ms", |r| r.latency_p99_ms),
        ("latency p99.9 ms", |r| r.latency_p999_ms),
        ("latency max ms", |r| r.latency_max_ms),
        ("server RSS after the run MiB", |r| r.rss_mib),
    ];
    println!(
        "{:<32} {:>12} {:>12} {:>12}   {:?}, runs: {}",
        "figure",
        "median",
        "min",
        "max",
        args.broker,
        runs.len()
    );
    for (name, get) in rows {
        let mut values: Vec<f64> = runs.iter().map(get).collect();
        let (min, max) = values
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(*v), b.max(*v)));
        println!(
            "{name:<32} {:>12.3} {min:>12.3} {max:>12.3}",
            median(&mut values)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_is_256_bytes_of_json_with_its_stamp() {
        let p = payload(1_765_000_000_000_000);
        assert_eq!(p.len(), PAYLOAD_BYTES);
        let v: serde_json::Value = serde_json::from_slice(&p).expect("JSON");
        assert_eq!(v["t"].as_u64(), Some(1_765_000_000_000_000));
    }

    #[test]
    fn producers_share_every_task() {
        let total: usize = (0..PRODUCERS).map(|p| share(100_003, p)).sum();
        assert_eq!(total, 100_003);
    }
}
