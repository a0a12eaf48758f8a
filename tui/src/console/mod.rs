//! `muster tui`: the operator's console (README.md, "The console"), in the spirit of k9s.
//!
//! - [`app`]: the state, pure and tested without a terminal; `keys` (what each key
//!   does), [`verbs`] (the verbs a key names), [`changes`] (verbs and drafts as data),
//!   [`screen`] (the screens), [`rows`] (the list screens' rows), [`search`] (the `/`
//!   search language), [`trends`] (rates and trend graphs) and [`meters`] (the limits
//!   screen's bars) hold the rest of it by job; none of them but `keys` and `verbs`
//!   imports `app`.
//! - [`ui`]: drawing, a function of the state.
//! - this module: the loop. It watches the current screen over one connection (the
//!   daemon pushes changes, at most once a second), runs verbs, redraws after every key,
//!   push and result, and reconnects when the daemon goes away. The cluster screen is
//!   not pushed: once a second it asks every node for its `cluster_status`, the others
//!   over connections of their own (`NodeClients`).
//!
//! The terminal is restored on every exit: normal, error (this function's caller prints
//! it after the restore) and panic (ratatui's panic hook).

pub mod app;
pub mod changes;
pub mod detail;
mod keys;
pub mod meters;
pub mod rows;
pub mod screen;
pub mod search;
#[cfg(test)]
mod tests;
pub mod trends;
pub mod ui;
pub mod verbs;

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use crossterm::event::{Event, EventStream};
use futures_util::StreamExt;
use ratatui::DefaultTerminal;
use tokio::sync::mpsc;

use muster_protocol::model::TaskSummary;
use muster_protocol::ops::{
    ClusterStatusReply, DeadSelection, ServerStatsReply, TaskFindReply, TaskUpdate, Watch,
    WatchReply,
};
use muster_sdk::{Client, ConnectOptions, Error, ErrorCode};

use app::{App, Effect};
use changes::{DeadAction, DeadTasks, Requeue, Verb};
use rows::ClusterPoll;

/// How often the screen is redrawn with nothing happening (ages move on).
const REDRAW: Duration = Duration::from_secs(1);

/// Wait between attempts to reach a daemon that went away.
const RECONNECT: Duration = Duration::from_secs(1);

/// How often the title's daemon facts (uptime, members, fsync latency) are read with
/// `server_stats`: often enough to follow, one small request per console.
const STATS_INTERVAL: Duration = Duration::from_secs(5);

/// Longest the cluster screen waits on one node: for a connection, and for its answer.
const NODE_WAIT: Duration = Duration::from_secs(2);

/// Results coming back to the loop from the tasks it started.
enum Msg {
    /// A watch's reply.
    Watched(u64, Box<Result<WatchReply, Error>>),
    /// A verb's outcome, as the footer says it, and whether it removed what it named.
    Done(Result<String, String>, bool),
    /// Something to say in the footer that changed nothing (a copy).
    Said(Result<String, String>),
    /// A search's reply (or why it failed), with the tag of the search.
    Found(u64, Result<TaskFindReply, String>),
    /// The daemon's counters, or why they could not be read.
    Stats(Result<ServerStatsReply, String>),
    /// A round of the cluster screen's questions (or why the connected node did not
    /// answer), with the tag of the screen.
    Cluster(u64, Box<Result<ClusterPoll, String>>),
    /// A new connection after the old one was lost.
    Connected(Client),
    /// An attempt to reconnect failed, for this reason.
    Reconnecting(String),
}

/// What woke the loop.
enum Input {
    Terminal(Option<std::io::Result<Event>>),
    Push(Option<Box<WatchReply>>),
    Msg(Msg),
    Tick,
    Stats,
}

/// Runs the console until `q`.
pub async fn run(options: ConnectOptions, addr: String, readonly: bool) -> anyhow::Result<()> {
    let client = Client::connect(options.clone()).await?;
    let mut terminal = ratatui::try_init().context("setting up the terminal")?;
    let result = event_loop(&mut terminal, client, options, addr, readonly).await;
    ratatui::restore();
    result
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Draws, waits for what comes next (a key, a push, a result, a tick) and hands it to
/// the state, whose effects it starts, until `q`, Ctrl-C or the end of the terminal.
async fn event_loop(
    terminal: &mut DefaultTerminal,
    client: Client,
    options: ConnectOptions,
    addr: String,
    readonly: bool,
) -> anyhow::Result<()> {
    let (app, first) = App::new(addr, readonly, now_ms());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut console = Console::new(app, client, options, tx);
    let mut events = EventStream::new();
    let mut redraw = tokio::time::interval(REDRAW);
    let mut stats = tokio::time::interval(STATS_INTERVAL);
    let mut effects = vec![first];
    loop {
        assert_eq!(
            console.app.connected,
            console.client.is_some(),
            "the state says connected exactly while the loop holds a connection"
        );
        console.start(terminal, &mut effects).await;
        console.app.now_ms = now_ms();
        terminal
            .draw(|f| ui::render(&console.app, f))
            .context("drawing")?;
        if console.app.quit {
            return Ok(());
        }
        let connected = console.client.is_some();
        let input = tokio::select! {
            event = events.next() => Input::Terminal(event),
            push = console.pushes.recv(), if connected => Input::Push(push.map(Box::new)),
            Some(msg) = rx.recv() => Input::Msg(msg),
            _ = redraw.tick() => Input::Tick,
            _ = stats.tick(), if connected => Input::Stats,
        };
        // Ages and rates are of this moment, not of the last draw.
        console.app.now_ms = now_ms();
        if console.on_input(input, &mut effects)?.is_break() {
            return Ok(());
        }
        console.drop_while_disconnected(&mut effects);
    }
}

/// What the loop holds from one wake to the next: the state, the connection (none
/// while it is being made again) with its watch pushes, and the sender the tasks it
/// starts answer on.
struct Console {
    app: App,
    /// The connection to the daemon; `None` exactly while `app.connected` is false.
    client: Option<Client>,
    /// The watch pushes that arrive over `client`.
    pushes: mpsc::UnboundedReceiver<WatchReply>,
    /// How to connect again.
    options: ConnectOptions,
    /// The cluster screen's connections to the other nodes.
    nodes: NodeClients,
    /// Where the tasks the loop starts send their results.
    tx: mpsc::UnboundedSender<Msg>,
}

impl Console {
    /// The loop's state for a console just connected over `client`.
    fn new(
        mut app: App,
        client: Client,
        options: ConnectOptions,
        tx: mpsc::UnboundedSender<Msg>,
    ) -> Console {
        app.on_connection(client.server().to_owned(), client.cluster());
        Console {
            app,
            pushes: client.watch_pushes(),
            client: Some(client),
            nodes: NodeClients::new(options.clone()),
            options,
            tx,
        }
    }

    /// Starts the effects: an edit here, as the loop owns the terminal; the rest over
    /// the connection, with a round of the cluster screen's questions if one is due.
    /// Without a connection the rest are left for [`Console::drop_while_disconnected`].
    async fn start(&mut self, terminal: &mut DefaultTerminal, effects: &mut Vec<Effect>) {
        // Editing takes the terminal: it is handed to the editor and back, here.
        for effect in std::mem::take(effects) {
            match effect {
                Effect::Edit(draft) => {
                    let edited = edit_in_editor(terminal, &draft.text());
                    self.app.on_edited(draft, edited);
                }
                other => effects.push(other),
            }
        }
        if let Some(c) = &self.client {
            for effect in effects.drain(..) {
                perform(c, &self.nodes, &self.tx, effect).await;
            }
            if let Some(tag) = self.app.cluster_request() {
                ask_the_nodes(c, &self.nodes, &self.tx, tag);
            }
        }
    }

    /// Hands what woke the loop to the state, adding the effects it asks for;
    /// `Break` when the terminal's events end.
    fn on_input(
        &mut self,
        input: Input,
        effects: &mut Vec<Effect>,
    ) -> anyhow::Result<ControlFlow<()>> {
        match input {
            Input::Terminal(event) => match event {
                Some(Ok(Event::Key(key))) if key.is_press() => effects.extend(self.app.on_key(key)),
                // Resizes and everything else just redraw.
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e).context("reading the terminal"),
                None => return Ok(ControlFlow::Break(())),
            },
            Input::Push(Some(reply)) => effects.extend(self.app.on_watch(*reply)),
            // The connection is gone: say so, and keep trying to get it back.
            Input::Push(None) => self.lose_connection("connection to musterd lost; reconnecting…"),
            Input::Msg(msg) => self.on_msg(msg, effects),
            Input::Tick => self.app.on_tick(),
            Input::Stats => self.ask_stats(),
        }
        Ok(ControlFlow::Continue(()))
    }

    /// Hands a result of a task the loop started to the state, adding the effects it
    /// asks for.
    fn on_msg(&mut self, msg: Msg, effects: &mut Vec<Effect>) {
        match msg {
            Msg::Watched(tag, result) => self.on_watched(tag, *result, effects),
            Msg::Done(result, removed) => effects.extend(self.app.on_done(result, removed)),
            Msg::Found(tag, reply) => effects.extend(self.app.on_found(tag, reply)),
            Msg::Said(result) => self.app.say(result),
            Msg::Stats(result) => self.app.on_stats(result),
            Msg::Cluster(tag, poll) => self.app.on_cluster(tag, *poll),
            Msg::Connected(c) => {
                // A restart may have brought another version.
                effects.extend(self.app.on_reconnected(c.server().to_owned(), c.cluster()));
                self.pushes = c.watch_pushes();
                self.client = Some(c);
            }
            Msg::Reconnecting(why) => self.app.on_reconnecting(&why),
        }
    }

    /// A watch's reply: the screen's data, or why it failed. A node that no longer
    /// leads is left for the new leader.
    fn on_watched(
        &mut self,
        tag: u64,
        result: Result<WatchReply, Error>,
        effects: &mut Vec<Effect>,
    ) {
        match result {
            Ok(reply) => effects.extend(self.app.on_watch(reply)),
            // A lost connection is reported once, by the end of the pushes.
            Err(Error::Closed(_) | Error::Connect(_)) => {}
            // A cluster's leader changed: find the new one, as after a lost
            // connection (once, however many watches were refused).
            Err(Error::Server(e))
                if matches!(e.code, ErrorCode::NotLeader | ErrorCode::OutcomeUnknown) =>
            {
                self.lose_connection("the musterd node no longer leads; reconnecting…");
            }
            Err(e) => effects.extend(self.app.on_watch_failed(tag, e.to_string())),
        }
    }

    /// Drops the connection, says why, and keeps trying to get one back; nothing if it
    /// is already lost (a reconnection is then under way).
    fn lose_connection(&mut self, why: &str) {
        if self.client.take().is_some() {
            self.app.on_disconnected(why);
            reconnect(self.options.clone(), self.tx.clone());
        }
    }

    /// Reads the daemon's counters on a task of its own; they come back as a
    /// [`Msg::Stats`].
    fn ask_stats(&self) {
        if let Some(c) = &self.client {
            let (c, tx) = (c.clone(), self.tx.clone());
            tokio::spawn(async move {
                let reply = c.server_stats().await.map_err(|e| e.to_string());
                let _ = tx.send(Msg::Stats(reply));
            });
        }
    }

    /// Without a connection the effects are dropped: verbs are refused rather than
    /// queued, and the screen is watched again once reconnected.
    fn drop_while_disconnected(&mut self, effects: &mut Vec<Effect>) {
        if self.client.is_some() {
            return;
        }
        if effects.iter().any(|e| matches!(e, Effect::Run(_))) {
            self.app.say(Err("not connected to musterd".into()));
        }
        effects.clear();
    }
}

fn reconnect(options: ConnectOptions, tx: mpsc::UnboundedSender<Msg>) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(RECONNECT).await;
            if tx.is_closed() {
                return;
            }
            match Client::connect(options.clone()).await {
                Ok(c) => {
                    let _ = tx.send(Msg::Connected(c));
                    return;
                }
                // Say why (a daemon still down, a token now refused), and try again.
                Err(e) => {
                    let _ = tx.send(Msg::Reconnecting(e.to_string()));
                }
            }
        }
    });
}

/// The console's own connections to the cluster's other nodes, for the cluster screen:
/// each node answers `cluster_status` with its own view, as `muster --addr NODE cluster
/// status` reads it. Made on the screen's first round, kept while it is shown, closed
/// when another screen is watched or searched (or a node does not answer).
#[derive(Clone)]
struct NodeClients {
    /// The console's connection options: each node is reached at its client address
    /// with the same trust and token.
    options: ConnectOptions,
    /// By node id: the address connected to, and the connection.
    clients: Arc<Mutex<HashMap<u64, (String, Client)>>>,
}

impl NodeClients {
    fn new(options: ConnectOptions) -> NodeClients {
        NodeClients {
            options,
            clients: Arc::default(),
        }
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (String, Client)>> {
        self.clients.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes every connection (dropping the last clone of a client closes it).
    fn clear(&self) {
        self.clients().clear();
    }

    /// One round: the connected node's answer, then every other member's at once,
    /// each bounded by [`NODE_WAIT`].
    async fn poll(&self, client: &Client) -> Result<ClusterPoll, String> {
        let local = within(client.cluster_status()).await?;
        let others: Vec<(u64, String)> = local
            .members
            .iter()
            .filter(|m| m.node != local.node)
            .map(|m| (m.node, m.addr.clone()))
            .collect();
        self.clients()
            .retain(|node, _| others.iter().any(|(other, _)| other == node));
        let asked = others
            .into_iter()
            .map(|(node, addr)| async move { (node, self.ask(node, addr).await) });
        let others = futures_util::future::join_all(asked).await;
        Ok(ClusterPoll { local, others })
    }

    /// One node's own answer, over the connection to it (made if there is none).
    async fn ask(&self, node: u64, addr: String) -> Result<ClusterStatusReply, String> {
        let kept = self
            .clients()
            .get(&node)
            .filter(|(at, _)| *at == addr)
            .map(|(_, c)| c.clone());
        let client = match kept {
            Some(client) => client,
            None => {
                let options = ConnectOptions {
                    addr: addr.clone(),
                    ..self.options.clone()
                };
                let client = within(Client::connect_node(options)).await?;
                self.clients().insert(node, (addr, client.clone()));
                client
            }
        };
        let answer = within(client.cluster_status()).await;
        if answer.is_err() {
            // Connected afresh next round.
            self.clients().remove(&node);
        }
        answer
    }
}

/// A call's result, or that it took longer than [`NODE_WAIT`].
async fn within<T>(call: impl Future<Output = Result<T, Error>>) -> Result<T, String> {
    match tokio::time::timeout(NODE_WAIT, call).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {} s", NODE_WAIT.as_secs())),
    }
}

/// Starts a round of the cluster screen's questions; the answers come back as a
/// [`Msg::Cluster`].
fn ask_the_nodes(client: &Client, nodes: &NodeClients, tx: &mpsc::UnboundedSender<Msg>, tag: u64) {
    let (client, nodes, tx) = (client.clone(), nodes.clone(), tx.clone());
    tokio::spawn(async move {
        let poll = nodes.poll(&client).await;
        let _ = tx.send(Msg::Cluster(tag, Box::new(poll)));
    });
}

/// Starts an effect; its result comes back as a [`Msg`]. A watch is sent here, in
/// order (a later watch must reach the daemon after an earlier one, or the daemon would
/// keep the older screen); only its reply is awaited on a task of its own.
async fn perform(
    client: &Client,
    nodes: &NodeClients,
    tx: &mpsc::UnboundedSender<Msg>,
    effect: Effect,
) {
    let tx = tx.clone();
    if matches!(effect, Effect::Watch { .. } | Effect::Find { .. }) {
        // Another screen: the cluster screen's connections are not needed.
        nodes.clear();
    }
    match effect {
        Effect::Watch { view, tag } => match client.send(&Watch { view, tag }).await {
            Ok(pending) => {
                tokio::spawn(async move {
                    // The loop may have ended; the result is then moot.
                    let _ = tx.send(Msg::Watched(tag, Box::new(pending.reply().await)));
                });
            }
            Err(e) => {
                let _ = tx.send(Msg::Watched(tag, Box::new(Err(e))));
            }
        },
        Effect::Edit(_) => unreachable!("the loop, which owns the terminal, runs the editor"),
        Effect::Copy { text, what } => {
            let copied = copy_to_clipboard(&text)
                .map(|()| format!("copied {what} (OSC 52: the terminal puts it on the clipboard)"))
                .map_err(|e| format!("copying: {e}"));
            let _ = tx.send(Msg::Said(copied));
        }
        Effect::Find { search, tag } => {
            let client = client.clone();
            tokio::spawn(async move {
                let reply = client.task_find(&search).await.map_err(|e| e.to_string());
                let _ = tx.send(Msg::Found(tag, reply));
            });
        }
        Effect::Run(verb) => {
            let client = client.clone();
            let removes = matches!(verb, Verb::Dead(DeadAction::Discard, _) | Verb::Requeue(_));
            tokio::spawn(async move {
                let result = run_verb(&client, verb).await.map_err(|e| e.to_string());
                let _ = tx.send(Msg::Done(result, removes));
            });
        }
    }
}

/// Hands the terminal to `$VISUAL` or `$EDITOR` (the first set and not empty, else `vi`) on a private temporary
/// file holding `text`, and takes it back when the editor exits; the file's text then.
fn edit_in_editor(terminal: &mut DefaultTerminal, text: &str) -> Result<String, String> {
    use std::io::Write;
    let set = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let editor = set("VISUAL")
        .or_else(|| set("EDITOR"))
        .unwrap_or_else(|| "vi".into());
    let mut file = tempfile::Builder::new()
        .prefix("muster-payload-")
        .suffix(".json")
        .tempfile()
        .map_err(|e| format!("creating a temporary file: {e}"))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.flush())
        .map_err(|e| format!("writing the temporary file: {e}"))?;
    ratatui::restore();
    // The editor command may carry arguments (`code --wait`): split as a shell would.
    let mut words = editor.split_whitespace();
    let status = match words.next() {
        Some(program) => std::process::Command::new(program)
            .args(words)
            .arg(file.path())
            .status()
            .map_err(|e| format!("starting {editor:?}: {e}")),
        None => Err("$EDITOR is empty".into()),
    };
    *terminal = ratatui::init();
    let status = status?;
    if !status.success() {
        return Err(format!("{editor:?} exited with {status}: nothing done"));
    }
    std::fs::read_to_string(file.path()).map_err(|e| format!("reading the edited file: {e}"))
}

/// Largest text put on the clipboard: terminals drop longer OSC 52 sequences (xterm's
/// default limit is about 100 KB of base64).
const MAX_COPY_BYTES: usize = 64 * 1024;

/// Writes `text` to the terminal as an OSC 52 clipboard sequence.
fn copy_to_clipboard(text: &str) -> std::io::Result<()> {
    use base64::Engine as _;
    use std::io::Write;
    if text.len() > MAX_COPY_BYTES {
        return Err(std::io::Error::other(format!(
            "{} bytes exceed the {MAX_COPY_BYTES} a terminal takes",
            text.len()
        )));
    }
    let encoded = base64::engine::general_purpose::STANDARD.encode(text);
    let mut out = std::io::stdout();
    write!(out, "\x1b]52;c;{encoded}\x07")?;
    out.flush()
}

/// Runs a verb and says what happened, as the footer shows it.
async fn run_verb(client: &Client, verb: Verb) -> Result<String, Error> {
    Ok(match verb {
        Verb::Dead(action, t) => dead(client, action, t).await?,
        Verb::Cancel(id) => cancel(client, &id).await?,
        Verb::ResumeTask { id, data } => {
            let data = data.map(|d| muster_sdk::raw_json(&d)).transpose()?;
            let r = client.resume_task(&id, data).await?;
            format!("resumed task {id}: now {}", r.state.as_str())
        }
        Verb::Revoke(id) => {
            let r = client.lease_revoke(&id).await?;
            format!("revoked the lease of {id}: now {}", r.state.as_str())
        }
        Verb::Pause(q) => {
            client.queue_pause(&q).await?;
            format!("paused {q}")
        }
        Verb::Resume(q) => {
            client.queue_resume(&q).await?;
            format!("resumed {q}")
        }
        Verb::Drain(m) => {
            client.member_drain(&m).await?;
            format!("draining {m}")
        }
        Verb::Purge(q, _) => {
            let n = client.queue_purge(&q).await?;
            format!("purged {} of {q}", tasks(n))
        }
        Verb::DeleteQueue(q, _) => {
            let n = client.queue_delete(&q).await?;
            format!("deleted queue {q} with {}", tasks(n))
        }
        Verb::Requeue(r) => requeue(client, r).await?,
        Verb::Enqueue { queue, payload } => {
            let task = muster_sdk::NewTask::new(muster_sdk::raw_json(&payload)?);
            let new = client.enqueue(&queue, task).await?;
            format!("enqueued {} on {queue}", new.id)
        }
        Verb::Priority { id, to, .. } => {
            let t = update_task(client, &id, Some(to), false).await?;
            format!("task {id} now has priority {}", t.priority)
        }
        Verb::RunNow(id) => {
            let t = update_task(client, &id, None, true).await?;
            format!("task {id} is {} now", t.state.as_str())
        }
        Verb::Undrain(m) => {
            client.member_undrain(&m).await?;
            format!("undrained {m}: it gets work again")
        }
        Verb::UpdateQueue(change) => {
            client.queue_update(&change.queue, change.patch).await?;
            format!(
                "updated queue {}: {}",
                change.queue,
                change.changes.join(", ")
            )
        }
        Verb::PauseSchedule(name) => {
            client.schedule_pause(&name).await?;
            format!("paused schedule {name}")
        }
        Verb::ResumeSchedule(name) => {
            let s = client.schedule_resume(&name).await?;
            match s.next_fire_ms {
                Some(at) => format!(
                    "resumed schedule {name}: it fires next at {}",
                    crate::output::time(at)
                ),
                None => format!("resumed schedule {name}: its pattern names no time to come"),
            }
        }
        Verb::RunSchedule { name, .. } => {
            let task = client.schedule_run(&name).await?;
            format!("ran schedule {name} now: enqueued {}", task.id)
        }
        Verb::DeleteSchedule(name) => {
            client.schedule_delete(&name).await?;
            format!("deleted schedule {name}; the tasks it enqueued stay")
        }
    })
}

/// `1 task`, or `n tasks`.
fn tasks(n: u64) -> String {
    if n == 1 {
        "1 task".into()
    } else {
        format!("{n} tasks")
    }
}

/// Redrives or discards dead tasks of one queue: those named, or all of them.
async fn dead(client: &Client, action: DeadAction, t: DeadTasks) -> Result<String, Error> {
    let selection = DeadSelection {
        queue: t.queue.clone(),
        ids: t.ids,
        all: t.all,
        dry_run: false,
    };
    let (reply, done) = match action {
        DeadAction::Redrive => (client.redrive(selection).await?, "redriven"),
        DeadAction::Discard => (client.discard(selection).await?, "discarded"),
    };
    Ok(format!("{done} {} of {}", tasks(reply.count), t.queue))
}

/// Cancels a task: at once if it waits, else its holder is told to stop.
async fn cancel(client: &Client, id: &str) -> Result<String, Error> {
    let r = client.cancel(id).await?;
    Ok(if r.cancel_requested {
        format!("cancel of {id} requested: its holder was told to stop")
    } else {
        format!("cancelled {id}")
    })
}

/// Enqueues an edited copy of a dead task, then discards the dead one.
async fn requeue(client: &Client, r: Requeue) -> Result<String, Error> {
    let payload = muster_sdk::raw_json(&r.payload)?;
    let mut task = muster_sdk::NewTask::new(payload);
    task.priority = Some(r.priority);
    task.key = r.key;
    task.requires = r.requires;
    let new = client.enqueue(&r.queue, task).await?;
    // Discarded only once the copy is durable: nothing is lost if either fails.
    client
        .discard(DeadSelection {
            queue: r.queue.clone(),
            ids: vec![r.id.clone()],
            all: false,
            dry_run: false,
        })
        .await?;
    Ok(format!("requeued {} as {} on {}", r.id, new.id, r.queue))
}

/// Gives a waiting task a new priority, or has a scheduled one run now; the task after.
async fn update_task(
    client: &Client,
    id: &str,
    priority: Option<u8>,
    run_now: bool,
) -> Result<TaskSummary, Error> {
    let update = TaskUpdate {
        task: id.to_owned(),
        priority,
        run_now,
    };
    client.task_update(&update).await
}
