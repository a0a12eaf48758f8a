//! W3C trace context across tasks, on a real daemon: a producer's span reaches the task
//! and every holder; the SDK's worker runs each handler in a child span of it; children
//! a handler spawns are in the handler's trace (and a child spawned with none is in its
//! parent's); `muster work` hands it to programs as `TRACEPARENT`, and `muster enqueue`
//! continues the trace named there. Spans are recorded by OpenTelemetry's in-memory
//! exporter, through tracing-opentelemetry, as an application would install them.

use std::time::Duration;

use muster_sdk::protocol::ops::{Claim, NewChild};
use muster_sdk::{ErrorCode, NewTask, Outcome, QueuePatch, TaskState, Worker, WorkerConfig};
use muster_tests::{Daemon, until};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

/// A traceparent's trace id and span id.
fn ids(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    (parts[1].to_owned(), parts[2].to_owned())
}

// One thread: the subscriber installed for this test is the thread's, and the worker's
// tasks run on it too.
#[tokio::test(flavor = "current_thread")]
async fn a_producers_trace_runs_through_every_holder_and_the_children_they_spawn() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let _guard = tracing::subscriber::set_default(subscriber);

    let d = Daemon::start();
    let client = d.client().await;
    for q in ["plan", "leaf"] {
        client
            .queue_create(q, QueuePatch::default())
            .await
            .expect("queue_create");
    }
    let producer = tracing::info_span!("producer");
    let producer_cx = producer.context().span().span_context().clone();
    let plan = client
        .enqueue(
            "plan",
            NewTask::new(muster_sdk::json(&serde_json::json!({"plan": 1})).expect("json")),
        )
        .instrument(producer.clone())
        .await
        .expect("enqueue")
        .id;
    drop(producer);
    let stored = client.task_get(&plan).await.expect("task_get");
    let (trace, parent) = ids(stored.traceparent.as_deref().expect("a traceparent"));
    assert_eq!(trace, producer_cx.trace_id().to_string());
    assert_eq!(parent, producer_cx.span_id().to_string());

    // A handler spawns two children: one in its own trace (the SDK fills it in), one
    // spawned through the client with none, which the daemon puts in the parent's.
    let mut config = WorkerConfig::new("tracer", ["plan"]);
    config.capacity = 1;
    let worker = Worker::new(d.options(), config);
    let handle = worker.handle();
    let run = tokio::spawn(worker.run(|task| async move {
        let handler_cx = tracing::Span::current()
            .context()
            .span()
            .span_context()
            .clone();
        let spawned = task
            .spawn(vec![NewChild::new(
                "a",
                "leaf",
                muster_sdk::json(&serde_json::json!(1)).expect("json"),
            )])
            .await
            .expect("spawn");
        assert_eq!(spawned.len(), 1);
        Outcome::Ack(Some(
            muster_sdk::json(&serde_json::json!({
                "trace": handler_cx.trace_id().to_string(),
                "span": handler_cx.span_id().to_string(),
            }))
            .expect("json"),
        ))
    }));
    until(Duration::from_secs(20), "the plan done", || async {
        client.task_get(&plan).await.expect("task_get").state == TaskState::Done
    })
    .await;
    handle.shutdown();
    run.await.expect("the worker's task").expect("the worker");
    let done = client.task_get(&plan).await.expect("task_get");
    let seen: serde_json::Value =
        serde_json::from_str(done.result.expect("a result").get()).expect("json");
    assert_eq!(
        seen["trace"],
        trace.as_str(),
        "the handler ran in the task's trace"
    );
    // The handler's span, exported with the producer's span as its parent.
    let spans = exporter.get_finished_spans().expect("spans");
    let handler = spans
        .iter()
        .find(|s| s.name == "muster.task")
        .expect("the handler's span");
    assert_eq!(handler.span_context.trace_id().to_string(), trace);
    assert_eq!(handler.parent_span_id.to_string(), parent);
    assert_eq!(
        handler.span_context.span_id().to_string(),
        seen["span"].as_str().expect("a span id")
    );
    // The child spawned by the handler is in the handler's span.
    let leaf = client
        .claim(&Claim::new(["leaf"]).max(1))
        .await
        .expect("claim")
        .pop()
        .expect("the child");
    assert_eq!(leaf.parent.as_deref(), Some(plan.as_str()));
    assert_eq!(
        ids(leaf.traceparent.as_deref().expect("a traceparent")),
        (
            trace.clone(),
            seen["span"].as_str().expect("a span").to_owned()
        )
    );

    // A child spawned with no trace of its own is in its parent's.
    let other = client
        .enqueue(
            "plan",
            NewTask {
                traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
                tracestate: Some("congo=t61rcWkgMzE".into()),
                ..NewTask::new(muster_sdk::json(&2).expect("json"))
            },
        )
        .await
        .expect("enqueue")
        .id;
    let d2 = client
        .claim(&Claim::new(["plan"]).max(1))
        .await
        .expect("claim")
        .pop()
        .expect("the task");
    assert_eq!(d2.id, other);
    assert_eq!(d2.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
    let raw = client
        .spawn(
            &other,
            d2.epoch,
            vec![NewChild::new(
                "b",
                "leaf",
                muster_sdk::json(&3).expect("json"),
            )],
            None,
        )
        .await
        .expect("spawn");
    let child = client
        .task_get(&raw.children[0].id)
        .await
        .expect("task_get");
    assert_eq!(
        child.traceparent.as_deref(),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
    assert_eq!(child.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));

    // Bad trace contexts are refused, and store nothing.
    for (traceparent, tracestate, message) in [
        (
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            None,
            "invalid traceparent",
        ),
        (
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            None,
            "invalid traceparent",
        ),
        (
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            None,
            "invalid traceparent",
        ),
        (
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            Some("x".repeat(513)),
            "a tracestate is at most 512 bytes",
        ),
    ] {
        let err = client
            .enqueue(
                "leaf",
                NewTask {
                    traceparent: Some(traceparent.into()),
                    tracestate,
                    ..NewTask::new(muster_sdk::json(&0).expect("json"))
                },
            )
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Some(ErrorCode::BadRequest), "{err}");
        assert!(err.to_string().contains(message), "{err}");
    }
    assert_eq!(
        client
            .queue_describe("leaf")
            .await
            .expect("describe")
            .counts
            .ready,
        1,
        "the leaf claimed above and the raw spawn's child only"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn muster_work_hands_the_trace_to_its_program_and_muster_enqueue_continues_one() {
    let d = Daemon::start();
    let client = d.client().await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    assert!(d.cli(&["queue", "create", "t"]).status.success());
    let enqueued = std::process::Command::new(muster_tests::muster_bin())
        .args(["enqueue", "t", r#"{"n":1}"#])
        .env("MUSTER_ADDR", &d.addr)
        .env("MUSTER_DATA", d.data())
        .env("TRACEPARENT", traceparent)
        .env("TRACESTATE", "rojo=00f067aa0ba902b7")
        .output()
        .expect("muster enqueue");
    assert!(enqueued.status.success(), "{enqueued:?}");
    let id = String::from_utf8(enqueued.stdout)
        .expect("utf-8")
        .trim()
        .to_owned();
    let stored = client.task_get(&id).await.expect("task_get");
    assert_eq!(stored.traceparent.as_deref(), Some(traceparent));
    assert_eq!(stored.tracestate.as_deref(), Some("rojo=00f067aa0ba902b7"));
    // The program prints what it was handed as its result; the runner's own trace
    // (its environment's) is not the program's.
    let _work = d.spawn_cli_env(
        &[
            "work",
            "t",
            "--member",
            "w1",
            "--",
            "sh",
            "-c",
            r#"printf '{"tp":"%s","ts":"%s"}' "$TRACEPARENT" "$TRACESTATE""#,
        ],
        &[(
            "TRACEPARENT",
            "00-11111111111111111111111111111111-2222222222222222-01",
        )],
    );
    let reply = client.wait(vec![id.clone()], 20_000).await.expect("wait");
    assert_eq!(reply.finished.len(), 1, "{reply:?}");
    assert_eq!(
        reply.finished[0].result.as_ref().expect("a result").get(),
        format!(r#"{{"tp":"{traceparent}","ts":"rojo=00f067aa0ba902b7"}}"#)
    );
}
