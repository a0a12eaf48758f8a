//! Many enqueues in one native call, each its own request: `Client#enqueueEach`.
//!
//! Every promise a native method returns costs a hand-off to the runtime and back (a
//! threadsafe function made and woken); for a producer with hundreds of single-task
//! enqueues in flight that hand-off, not the wire, is the cost. `index.js` therefore
//! gathers the `enqueue` calls made in one turn of the event loop and sends them with
//! one `enqueueEach`: each is still its own request (checked, sent in call order,
//! pipelined, answered or refused on its own), only their promises are settled
//! together.

use napi::Result;
use napi_derive::napi;
use serde_json::{Value, json};

use crate::client::{Client, EnqueueReply, fields, one};
use crate::errors::{PROTOCOL_ERROR, coded, invalid, to_js};
use crate::records::{EnqueueOptions, EnqueuedTask};

/// The most enqueues one `enqueueEach` sends (more are refused; `index.js` sends a
/// turn's enqueues in calls of at most this many).
pub const MAX_ENQUEUE_EACH: usize = 1024;

/// One enqueue of `enqueueEach`: `enqueue`'s arguments, the payload as a value or as
/// JSON text (exactly one).
#[napi(object)]
#[derive(Debug, Clone)]
pub struct EnqueueCall {
    /// The queue.
    pub queue: String,
    /// The payload, any JSON value.
    pub payload: Option<Value>,
    /// The payload as JSON text (one JSON value), sent as it is: what `enqueue` sends
    /// (`JSON.stringify` of its payload), and a producer holding JSON text already
    /// skips a parse.
    pub payload_json: Option<String>,
    /// How it is enqueued.
    pub options: Option<EnqueueOptions>,
}

/// How one enqueue of `enqueueEach` went: its task, or its error (`[code] message`, as
/// the package's error classes read it).
#[napi(object)]
#[derive(Debug, Clone)]
pub struct EnqueueOutcome {
    /// The task enqueued, when it was.
    pub task: Option<EnqueuedTask>,
    /// Why it was not, when it was not.
    pub error: Option<String>,
}

#[napi]
impl Client {
    /// Enqueues each of `calls` (at most 1,024) as its own request, as that many
    /// `enqueue` calls would, in order and pipelined, and resolves once every one is
    /// answered: each outcome is its task or its error. Not atomic: use `enqueueMany`
    /// for all-or-nothing. `enqueue` calls made in one turn of the event loop are sent
    /// this way.
    #[napi]
    pub async fn enqueue_each(&self, calls: Vec<EnqueueCall>) -> Result<Vec<EnqueueOutcome>> {
        if calls.len() > MAX_ENQUEUE_EACH {
            return Err(crate::errors::invalid(format!(
                "enqueue_each: {} calls, over the limit of {MAX_ENQUEUE_EACH}",
                calls.len()
            )));
        }
        let mut sent = Vec::with_capacity(calls.len());
        for call in calls {
            sent.push(self.send_enqueue(call).await);
        }
        let mut outcomes = Vec::with_capacity(sent.len());
        for reply in sent {
            let result = match reply {
                Ok(reply) => match reply.reply().await {
                    Ok(text) => read(&text),
                    Err(e) => Err(to_js(e)),
                },
                Err(e) => Err(e),
            };
            outcomes.push(match result {
                Ok(task) => EnqueueOutcome {
                    task: Some(task),
                    error: None,
                },
                Err(e) => EnqueueOutcome {
                    task: None,
                    error: Some(e.reason),
                },
            });
        }
        Ok(outcomes)
    }
}

impl Client {
    /// Checks and sends one enqueue, its reply to come.
    pub(crate) async fn send_enqueue(&self, call: EnqueueCall) -> Result<muster_sdk::RawReply> {
        let task = fields(&call.options.unwrap_or_default())?;
        let payload = match (call.payload, call.payload_json) {
            (Some(value), None) => value.to_string(),
            (None, Some(text)) => {
                // One JSON value and nothing after it: spliced into the request as it is.
                serde_json::from_str::<&serde_json::value::RawValue>(&text)
                    .map_err(|e| invalid(format!("the payload is not one JSON value: {e}")))?;
                text
            }
            _ => {
                return Err(invalid(
                    "an enqueue holds exactly one of payload and payloadJson",
                ));
            }
        };
        // `{"queue":…,"tasks":[{…options…,"payload":…}]}`, the payload spliced in.
        let mut request = json!({"queue": call.queue}).to_string();
        request.pop();
        request.push_str(",\"tasks\":[");
        let options = Value::Object(task).to_string();
        request.push_str(&options[..options.len() - 1]);
        if options.len() > 2 {
            request.push(',');
        }
        request.push_str("\"payload\":");
        request.push_str(&payload);
        request.push_str("}]}");
        let prepared = self
            .client
            .prepare_raw("enqueue", &request)
            .map_err(to_js)?;
        self.client.send_prepared(prepared).await.map_err(to_js)
    }
}

/// An enqueue's reply: its one task.
pub(crate) fn read(text: &str) -> Result<EnqueuedTask> {
    let reply: EnqueueReply = serde_json::from_str(text).map_err(|e| {
        coded(
            PROTOCOL_ERROR,
            format!("enqueue: the reply does not read: {e}"),
        )
    })?;
    one(reply.tasks, "enqueue")
}
