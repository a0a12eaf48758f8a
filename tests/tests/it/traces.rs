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

/// An OTLP/HTTP receiver on a loopback port, as a collector would be: it keeps every
/// span posted to `/v1/traces` (protobuf) and answers each export with success.
struct Collector {
    endpoint: String,
    spans: std::sync::Arc<std::sync::Mutex<Vec<otlp::trace::v1::Span>>>,
    task: tokio::task::JoinHandle<()>,
}

use opentelemetry_proto::tonic as otlp;

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn collector() -> Collector {
    use http_body_util::BodyExt;
    use prost::Message;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let endpoint = format!("http://{}", listener.local_addr().expect("its address"));
    let spans = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = std::sync::Arc::clone(&spans);
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let kept = std::sync::Arc::clone(&kept);
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let kept = std::sync::Arc::clone(&kept);
                    async move {
                        assert_eq!(req.uri().path(), "/v1/traces");
                        assert_eq!(
                            req.headers().get("content-type").map(|v| v.as_bytes()),
                            Some(&b"application/x-protobuf"[..])
                        );
                        let body = req.into_body().collect().await?.to_bytes();
                        let export =
                            otlp::collector::trace::v1::ExportTraceServiceRequest::decode(body)
                                .expect("an OTLP trace export");
                        for resource in export.resource_spans {
                            let service = resource
                                .resource
                                .iter()
                                .flat_map(|r| &r.attributes)
                                .find(|a| a.key == "service.name")
                                .and_then(|a| text(a.value.as_ref()));
                            assert_eq!(service.as_deref(), Some("musterd-test"));
                            for scope in resource.scope_spans {
                                kept.lock().expect("spans").extend(scope.spans);
                            }
                        }
                        let reply =
                            otlp::collector::trace::v1::ExportTraceServiceResponse::default();
                        Ok::<_, hyper::Error>(
                            hyper::Response::builder()
                                .header("content-type", "application/x-protobuf")
                                .body(http_body_util::Full::new(bytes::Bytes::from(
                                    reply.encode_to_vec(),
                                )))
                                .expect("a response"),
                        )
                    }
                });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Collector {
        endpoint,
        spans,
        task,
    }
}

/// A string or integer attribute's value as text.
fn text(value: Option<&otlp::common::v1::AnyValue>) -> Option<String> {
    use otlp::common::v1::any_value::Value;
    match value?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        _ => None,
    }
}

fn attribute(span: &otlp::trace::v1::Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| text(a.value.as_ref()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_exports_each_lease_and_wait_as_spans_of_the_tasks_trace() {
    let collector = collector().await;
    let d = Daemon::start_with(&[
        "--otlp-endpoint",
        &collector.endpoint,
        "--otlp-service-name",
        "musterd-test",
    ]);
    let client = d.client().await;
    client
        .queue_create(
            "q",
            QueuePatch {
                lease_ms: Some(300),
                ..QueuePatch::default()
            },
        )
        .await
        .expect("queue_create");
    let (trace, producer) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let traced = |n: u64| NewTask {
        traceparent: Some(format!("00-{trace}-{producer}-01")),
        ..NewTask::new(muster_sdk::json(&n).expect("json"))
    };
    let claim = |client: &muster_sdk::Client| {
        let client = client.clone();
        async move {
            client
                .claim(&Claim::new(["q"]).max(1).member("m1"))
                .await
                .expect("claim")
                .pop()
                .expect("a task")
        }
    };
    // Acked at once; nacked then acked; left to lapse then acked; a parent whose child
    // (spawned with no trace of its own) is in its trace; and one in no trace at all.
    let acked = client.enqueue("q", traced(1)).await.expect("enqueue").id;
    let d1 = claim(&client).await;
    assert_eq!(d1.id, acked);
    let holder = d1.traceparent.clone().expect("a trace for the holder");
    let (holder_trace, lease_span) = ids(&holder);
    assert_eq!(holder_trace, trace);
    assert_ne!(
        lease_span, producer,
        "the holder's parent is its lease's span"
    );
    client.ack(&d1.id, d1.epoch, None).await.expect("ack");

    let retried = client.enqueue("q", traced(2)).await.expect("enqueue").id;
    let d2 = claim(&client).await;
    client
        .nack(&d2.id, d2.epoch, Some(0), Some("flaky".into()))
        .await
        .expect("nack");
    let d3 = claim(&client).await;
    assert_eq!((d3.id.as_str(), d3.attempt), (retried.as_str(), 2));
    client.ack(&d3.id, d3.epoch, None).await.expect("ack");

    let lapsed = client.enqueue("q", traced(3)).await.expect("enqueue").id;
    let d4 = claim(&client).await;
    let d5 = {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let got = client
                .claim(&Claim::new(["q"]).max(1).member("m2").wait_ms(1_000))
                .await
                .expect("claim");
            if let Some(d) = got.into_iter().next() {
                break d;
            }
            assert!(std::time::Instant::now() < deadline, "the lease lapsed");
        }
    };
    assert_eq!((d5.id.as_str(), d4.epoch + 1), (lapsed.as_str(), d5.epoch));
    client.ack(&d5.id, d5.epoch, None).await.expect("ack");

    let parent = client.enqueue("q", traced(4)).await.expect("enqueue").id;
    let d6 = claim(&client).await;
    let spawned = client
        .spawn(
            &d6.id,
            d6.epoch,
            vec![NewChild::new("c", "q", muster_sdk::json(&5).expect("json"))],
            None,
        )
        .await
        .expect("spawn");
    let child = spawned.children[0].id.clone();
    client.ack(&d6.id, d6.epoch, None).await.expect("ack");
    let d7 = claim(&client).await;
    assert_eq!(d7.id, child);
    client.ack(&d7.id, d7.epoch, None).await.expect("ack");

    let untraced = client
        .enqueue("q", NewTask::new(muster_sdk::json(&6).expect("json")))
        .await
        .expect("enqueue")
        .id;
    let d8 = claim(&client).await;
    assert_eq!(d8.traceparent, None);
    client.ack(&d8.id, d8.epoch, None).await.expect("ack");

    // Two spans per lease: 1 + 2 + 2 + 1 + 1 leases of traced tasks.
    until(Duration::from_secs(20), "every span exported", || async {
        collector.spans.lock().expect("spans").len() >= 14
    })
    .await;
    let spans = collector.spans.lock().expect("spans").clone();
    assert_eq!(spans.len(), 14, "no span twice, none of the untraced task");
    let mut leases = Vec::new();
    for s in &spans {
        assert_eq!(hex(&s.trace_id), trace, "{}", s.name);
        assert_eq!(hex(&s.parent_span_id), producer, "{}", s.name);
        assert!(s.end_time_unix_nano >= s.start_time_unix_nano, "{}", s.name);
        let task = attribute(s, "muster.task").expect("muster.task");
        assert_ne!(task, untraced);
        if s.name == "muster.lease" {
            leases.push((
                task,
                attribute(s, "muster.epoch").expect("epoch"),
                attribute(s, "muster.outcome").expect("outcome"),
                attribute(s, "muster.member").expect("member"),
                attribute(s, "muster.parent"),
                hex(&s.span_id),
            ));
        } else {
            assert_eq!(s.name, "muster.queued");
        }
    }
    leases.sort();
    let mut expected = vec![
        (acked.clone(), "1", "acked", "m1", None),
        (retried.clone(), "1", "nacked", "m1", None),
        (retried.clone(), "2", "acked", "m1", None),
        (lapsed.clone(), "1", "lapsed", "m1", None),
        (lapsed.clone(), "2", "acked", "m2", None),
        (parent.clone(), "1", "acked", "m1", None),
        (child.clone(), "1", "acked", "m1", Some(parent.clone())),
    ];
    expected.sort();
    assert_eq!(
        leases
            .iter()
            .map(|(t, e, o, m, p, _)| (t.clone(), e.as_str(), o.as_str(), m.as_str(), p.clone()))
            .collect::<Vec<_>>(),
        expected
    );
    let first = leases
        .iter()
        .find(|l| l.0 == acked)
        .expect("the first lease");
    assert_eq!(
        first.5, lease_span,
        "the holder was handed its lease's span"
    );
}
