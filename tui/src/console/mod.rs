//! `muster tui`: the operator's console (DESIGN §7), in the spirit of k9s.
//!
//! - [`app`]: the state and the key handling, pure and tested without a terminal.
//! - [`ui`]: drawing, a function of the state.
//! - this module: the loop. It watches the current screen over one connection (the
//!   daemon pushes changes, at most once a second), runs verbs, redraws after every key,
//!   push and result, and reconnects when the daemon goes away.
//!
//! The terminal is restored on every exit: normal, error (this function's caller prints
//! it after the restore) and panic (ratatui's panic hook).

pub mod app;
#[cfg(test)]
mod tests;
pub mod ui;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use crossterm::event::{Event, EventStream};
use futures_util::StreamExt;
use ratatui::DefaultTerminal;
use tokio::sync::mpsc;

use muster_protocol::ops::{DeadSelection, WatchReply};
use muster_sdk::{Client, ConnectOptions, Error};

use app::{App, DeadAction, Effect, Verb};

/// How often the screen is redrawn with nothing happening (ages move on).
const REDRAW: Duration = Duration::from_secs(1);

/// Wait between attempts to reach a daemon that went away.
const RECONNECT: Duration = Duration::from_secs(1);

/// Results coming back to the loop from the tasks it started.
enum Msg {
    /// A watch's reply.
    Watched(u64, Box<Result<WatchReply, Error>>),
    /// A verb's outcome, as the footer says it.
    Done(Result<String, String>),
    /// A new connection after the old one was lost.
    Connected(Client),
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

async fn event_loop(
    terminal: &mut DefaultTerminal,
    client: Client,
    options: ConnectOptions,
    addr: String,
    readonly: bool,
) -> anyhow::Result<()> {
    let (mut app, first) = App::new(addr, readonly, now_ms());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut pushes = client.watch_pushes();
    let mut client = Some(client);
    let mut events = EventStream::new();
    let mut redraw = tokio::time::interval(REDRAW);
    let mut effects = vec![first];
    loop {
        if let Some(c) = &client {
            for effect in effects.drain(..) {
                perform(c, &tx, effect);
            }
        }
        app.now_ms = now_ms();
        terminal.draw(|f| ui::render(&app, f)).context("drawing")?;
        if app.quit {
            return Ok(());
        }
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(Event::Key(key))) if key.is_press() => effects.extend(app.on_key(key)),
                // Resizes and everything else just redraw.
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e).context("reading the terminal"),
                None => return Ok(()),
            },
            push = pushes.recv(), if client.is_some() => match push {
                Some(reply) => effects.extend(app.on_watch(reply)),
                None => {
                    // The connection is gone: say so, and keep trying to get it back.
                    client = None;
                    app.message = Some((app::Level::Error, "connection to musterd lost; reconnecting…".into()));
                    reconnect(options.clone(), tx.clone());
                }
            },
            Some(msg) = rx.recv() => match msg {
                Msg::Watched(tag, result) => match *result {
                    Ok(reply) => effects.extend(app.on_watch(reply)),
                    // A lost connection is reported once, by the end of the pushes.
                    Err(Error::Closed(_) | Error::Connect(_)) => {}
                    Err(e) => effects.extend(app.on_watch_failed(tag, e.to_string())),
                },
                Msg::Done(result) => effects.push(app.on_done(result)),
                Msg::Connected(c) => {
                    pushes = c.watch_pushes();
                    client = Some(c);
                    app.message = Some((app::Level::Info, "reconnected".into()));
                    effects.push(app.rewatch());
                }
            },
            _ = redraw.tick() => {}
        }
        if client.is_none() {
            // Verbs asked while disconnected are refused rather than queued.
            if effects.iter().any(|e| matches!(e, Effect::Run(_))) {
                app.message = Some((app::Level::Error, "not connected to musterd".into()));
            }
            // The screen is watched again once reconnected.
            effects.clear();
        }
    }
}

fn reconnect(options: ConnectOptions, tx: mpsc::UnboundedSender<Msg>) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(RECONNECT).await;
            if tx.is_closed() {
                return;
            }
            if let Ok(c) = Client::connect(options.clone()).await {
                let _ = tx.send(Msg::Connected(c));
                return;
            }
        }
    });
}

/// Starts an effect on its own task; its result comes back as a [`Msg`].
fn perform(client: &Client, tx: &mpsc::UnboundedSender<Msg>, effect: Effect) {
    let client = client.clone();
    let tx = tx.clone();
    tokio::spawn(async move {
        let msg = match effect {
            Effect::Watch { view, tag } => {
                Msg::Watched(tag, Box::new(client.watch(view, tag).await))
            }
            Effect::Run(verb) => {
                Msg::Done(run_verb(&client, verb).await.map_err(|e| e.to_string()))
            }
        };
        // The loop may have ended; the result is then moot.
        let _ = tx.send(msg);
    });
}

/// Runs a verb and says what happened, as the footer shows it.
pub async fn run_verb(client: &Client, verb: Verb) -> Result<String, Error> {
    fn tasks(n: u64) -> String {
        if n == 1 {
            "1 task".into()
        } else {
            format!("{n} tasks")
        }
    }
    Ok(match verb {
        Verb::Dead(action, t) => {
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
            format!("{done} {} of {}", tasks(reply.count), t.queue)
        }
        Verb::Cancel(id) => {
            let r = client.cancel(&id).await?;
            if r.cancel_requested {
                format!("cancel of {id} requested: its holder was told to stop")
            } else {
                format!("cancelled {id}")
            }
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
    })
}
