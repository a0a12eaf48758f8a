//! Quotas: tasks per queue and payload bytes per principal, refused with `limit`
//! before anything of the batch is stored, counted incrementally and rebuilt at start.

use muster_protocol::model::{NewTask, QueuePatch};
use muster_protocol::ops::{self, Enqueue, QueueName};
use muster_protocol::{ErrorCode, Request};

use super::{Harness, principal, raw};
use crate::engine::Quotas;

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

fn enqueue(payloads: &[&str]) -> Request {
    Request::Enqueue(Enqueue {
        queue: "jobs".into(),
        tasks: payloads.iter().map(|p| NewTask::new(raw(p))).collect(),
    })
}

const QUOTAS: Quotas = Quotas {
    max_tasks_per_queue: 4,
    max_bytes_per_principal: 10,
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
    // 10 bytes stored: one more byte is past p's quota; nothing of the batch is kept.
    let refused = h.call(enqueue(&["1"])).unwrap_err();
    assert_eq!(refused.code, ErrorCode::Limit);
    assert!(
        refused.message.contains("token \"p\" has 10 payload bytes"),
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
    h.call(Request::QueuePurge(ops::QueuePurge(QueueName {
        queue: "jobs".into(),
    })))
    .unwrap();
    h.principal = Some(p);
    h.call(enqueue(&["1234567890"])).unwrap();
    assert_eq!(h.code(enqueue(&["1"])), ErrorCode::Limit);
}
