//! Quotas: tasks per queue and stored bytes per principal (each task's payload, result
//! and progress and `TASK_RECORD_BYTES` for its record), refused with `limit` before
//! anything of the batch is stored, counted incrementally and rebuilt at start.

use muster_protocol::model::{NewTask, QueuePatch};
use muster_protocol::ops::{self, Enqueue, QueueName};
use muster_protocol::{ErrorCode, ops::EngineRequest};

use super::{Harness, principal, raw};
use crate::engine::Quotas;
use crate::store::TASK_RECORD_BYTES;

const CONFIG: &str = r#"
[[tokens]]
name = "p"
token = "p-token-0123456789abcdef"
roles = ["produce"]

[[tokens]]
name = "q"
token = "q-token-0123456789abcdef"
roles = ["produce"]
"#;

fn enqueue(payloads: &[&str]) -> EngineRequest {
    EngineRequest::Enqueue(Enqueue {
        queue: "jobs".into(),
        tasks: payloads.iter().map(|p| NewTask::new(raw(p))).collect(),
    })
}

/// Room for two tasks with 10 bytes of payload between them.
const QUOTAS: Quotas = Quotas {
    max_tasks_per_queue: 4,
    max_bytes_per_principal: 2 * TASK_RECORD_BYTES + 10,
};

#[test]
fn quotas_refuse_whole_batches_and_count_across_removal_and_restart() {
    let mut h = Harness::new();
    h.engine().set_quotas(QUOTAS);
    h.create("jobs", QueuePatch::default());
    let (p, q) = (
        principal(CONFIG, "p-token-0123456789abcdef"),
        principal(CONFIG, "q-token-0123456789abcdef"),
    );
    h.principal = Some(p);
    h.call(enqueue(&["1234", "123456"])).unwrap();
    // Two records and 10 bytes stored: one more task is past p's quota; nothing of the
    // batch is kept.
    let refused = h.call(enqueue(&["1"])).unwrap_err();
    assert_eq!(refused.code, ErrorCode::Limit);
    assert!(
        refused.message.starts_with(&format!(
            "token \"p\" has {} bytes stored (its tasks' records, payloads, results and progress); {} more",
            2 * TASK_RECORD_BYTES + 10,
            TASK_RECORD_BYTES + 1
        )),
        "{}",
        refused.message
    );
    assert_eq!(h.counts("jobs")[1], 2);
    // q has its own bytes; the queue holds at most 4 tasks, batch included.
    h.principal = Some(q);
    assert_eq!(h.code(enqueue(&["1", "2", "3"])), ErrorCode::Limit);
    h.call(enqueue(&["1", "2"])).unwrap();
    let full = h.call(enqueue(&["3"])).unwrap_err();
    assert_eq!(full.code, ErrorCode::Limit);
    assert!(full.message.contains("holds 4 tasks"), "{}", full.message);
    assert_eq!(h.counts("jobs")[1], 4);

    // Restored from the records at start.
    h.restart(1_000);
    h.engine().set_quotas(QUOTAS);
    h.principal = Some(p);
    assert_eq!(h.code(enqueue(&["1"])), ErrorCode::Limit);
    // Removed tasks no longer count.
    h.principal = None;
    h.call(EngineRequest::QueuePurge(ops::QueuePurge(QueueName {
        queue: "jobs".into(),
    })))
    .unwrap();
    h.principal = Some(p);
    h.call(enqueue(&["1234567890"])).unwrap();
    assert_eq!(h.code(enqueue(&["1"])), ErrorCode::Limit);
}

/// A task's result and progress checkpoint count against the token that enqueued it,
/// as they are stored and replaced.
#[test]
fn results_and_progress_count_against_the_enqueuing_token() {
    let mut h = Harness::new();
    h.engine().set_quotas(Quotas {
        max_tasks_per_queue: 100,
        max_bytes_per_principal: 2 * TASK_RECORD_BYTES + 250,
    });
    h.create("jobs", QueuePatch::default());
    let p = principal(CONFIG, "p-token-0123456789abcdef");
    h.principal = Some(p);
    h.call(enqueue(&["1"])).unwrap();
    h.principal = None;
    let (id, epoch) = h.claim_one("jobs");
    // A checkpoint of 102 bytes, then one of 52 in its place.
    let checkpoint = |n: usize| Some(raw(&format!("\"{}\"", "c".repeat(n))));
    for n in [100, 50] {
        h.call(EngineRequest::Renew(ops::Renew {
            task: id.clone(),
            epoch,
            extend_ms: None,
            progress: checkpoint(n),
        }))
        .unwrap();
    }
    // A result of 202 bytes: 1 + 52 + 202 of p's task stored with its record.
    h.call(EngineRequest::Ack(ops::Ack {
        task: id.clone(),
        epoch,
        result: Some(raw(&format!("\"{}\"", "r".repeat(200)))),
    }))
    .unwrap();
    h.principal = Some(p);
    let refused = h.call(enqueue(&["2"])).unwrap_err();
    assert_eq!(refused.code, ErrorCode::Limit);
    assert!(
        refused.message.starts_with(&format!(
            "token \"p\" has {} bytes stored",
            TASK_RECORD_BYTES + 255
        )),
        "{}",
        refused.message
    );
    // Counted again from the records at start.
    let before = refused.message;
    h.restart(1_000);
    h.engine().set_quotas(Quotas {
        max_tasks_per_queue: 100,
        max_bytes_per_principal: 2 * TASK_RECORD_BYTES + 250,
    });
    h.principal = Some(p);
    assert_eq!(h.call(enqueue(&["2"])).unwrap_err().message, before);
}
