//! Security and limits: tokens and roles (an authorization matrix), member names bound
//! to principals, unauthenticated and silent connections, a bad-input conformance
//! suite on raw frames, and floods of connections and streams.

use std::time::Duration;

use muster_sdk::protocol::ops::{Claim, DeadSelection, View};
use muster_sdk::{Client, ConnectOptions, ErrorCode, NewTask, QueuePatch};
use muster_tests::Daemon;

pub(crate) const ADMIN: &str = "admin-token-0123456789abcdef";
pub(crate) const PRODUCER: &str = "producer-token-0123456789ab";
pub(crate) const CONSUMER: &str = "consumer-token-0123456789ab";
const CONSUMER_B: &str = "consumer-b-token-0123456789";
const QUEUE_ADMIN: &str = "queue-admin-token-012345678";

/// More producers of `jobs`, for attacks that need several tenants (a token brings at
/// most its share of a queue's label sets).
pub(crate) const MORE_PRODUCERS: [&str; 3] = [
    "producer-2-token-0123456789",
    "producer-3-token-0123456789",
    "producer-4-token-0123456789",
];

fn config() -> String {
    let more: String = MORE_PRODUCERS
        .iter()
        .enumerate()
        .map(|(i, token)| {
            format!(
                "\n[[tokens]]\nname = \"producer-{}\"\ntoken = \"{token}\"\nroles = [\"produce\"]\nqueues = [\"jobs\"]\n",
                i + 2
            )
        })
        .collect();
    more + &format!(
        r#"
[[tokens]]
name = "admin"
token = "{ADMIN}"
roles = ["admin"]

[[tokens]]
name = "producer"
token = "{PRODUCER}"
roles = ["produce"]
queues = ["jobs", "jobs.*"]

[[tokens]]
name = "consumer"
token = "{CONSUMER}"
roles = ["consume"]
queues = ["jobs", "jobs.*"]

[[tokens]]
name = "consumer-b"
token = "{CONSUMER_B}"
roles = ["consume"]
queues = ["jobs", "jobs.*"]

[[tokens]]
name = "queue-admin"
token = "{QUEUE_ADMIN}"
roles = ["admin"]
queues = ["jobs", "jobs.*"]
"#
    )
}

pub(crate) fn secured(extra: &[&str]) -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("config dir");
    let path = dir.path().join("muster.toml");
    std::fs::write(&path, config()).expect("writing config");
    let mut args = vec!["--config", path.to_str().expect("utf-8 path")];
    args.extend_from_slice(extra);
    (Daemon::start_with(&args), dir)
}

/// The code of a call's error, or None if it succeeded.
fn code<T>(r: Result<T, muster_sdk::Error>) -> Option<ErrorCode> {
    r.err().map(|e| {
        e.code()
            .unwrap_or_else(|| panic!("not a daemon error: {e}"))
    })
}

/// One cell of the matrix: does `who` get `forbidden` for `op` on `queue`?
async fn attempt(c: &Client, op: &str, queue: &str, task: &str, member: &str) -> Option<ErrorCode> {
    let gone = format!("{queue}.gone");
    let one = || NewTask::new(muster_sdk::json(&1).expect("json"));
    let sel = |q: &str| DeadSelection {
        queue: q.into(),
        ids: vec![],
        all: true,
        dry_run: true,
    };
    match op {
        "queue_create" => code(
            c.queue_create(&format!("{queue}.new-{member}"), QueuePatch::default())
                .await,
        ),
        "queue_list" => code(c.queue_list().await),
        "queue_describe" => code(c.queue_describe(queue).await),
        "queue_update" => code(c.queue_update(&gone, QueuePatch::default()).await),
        "queue_pause" => code(c.queue_pause(&gone).await),
        "queue_resume" => code(c.queue_resume(&gone).await),
        "queue_purge" => code(c.queue_purge(&gone).await),
        "queue_delete" => code(c.queue_delete(&gone).await),
        "enqueue" => code(c.enqueue(queue, one()).await),
        "claim" => code(c.claim(&Claim::new([queue]).member(member)).await),
        "ack" => code(c.ack(task, 999, None).await),
        "nack" => code(c.nack(task, 999, None, None).await),
        "renew" => code(c.renew(task, 999, None, None).await),
        "release" => code(c.release(task, 999).await),
        "dead_letter" => code(c.dead_letter(task, 999, "x").await),
        "task_get" => code(c.task_get(task).await),
        "task_list" => code(
            c.task_list(queue, muster_sdk::TaskState::Ready, None, None)
                .await,
        ),
        "task_find" => code(
            c.task_find(&muster_sdk::protocol::ops::TaskFind {
                queue: Some(queue.into()),
                ..Default::default()
            })
            .await,
        ),
        "task_find_all_queues" => code(c.task_find(&Default::default()).await),
        "wait" => code(c.wait(vec![task.into()], 0).await),
        "cancel" => code(c.cancel(task).await),
        // Ready: an allowed reject (a cancel if suspended) is `invalid_state`.
        "cancel_if_suspended" => code(c.cancel_if(task, muster_sdk::TaskState::Suspended).await),
        // The cell's own paused schedule of the queue ([`cell_schedule`]); a set makes
        // another.
        "schedule_set" => code(
            c.schedule_set(&paused_schedule(
                &format!("{}-new", cell_schedule(member, queue, op)),
                queue,
            ))
            .await,
        ),
        "schedule_get" => code(c.schedule_get(&cell_schedule(member, queue, op)).await),
        "schedule_list" => code(c.schedule_list().await),
        "schedule_pause" => code(c.schedule_pause(&cell_schedule(member, queue, op)).await),
        "schedule_resume" => code(c.schedule_resume(&cell_schedule(member, queue, op)).await),
        "schedule_delete" => code(c.schedule_delete(&cell_schedule(member, queue, op)).await),
        "schedule_run" => code(c.schedule_run(&cell_schedule(member, queue, op)).await),
        "redrive" => code(c.redrive(sel(queue)).await),
        "discard" => code(c.discard(sel(queue)).await),
        "subscribe_without_session" => code(c.subscribe(member, &[queue.into()]).await),
        "session_update_without_session" => code(
            c.session_update(&muster_sdk::protocol::ops::SessionUpdate {
                member: member.into(),
                labels: None,
                capacity: Some(1),
            })
            .await,
        ),
        "unsubscribe_without_session" => code(c.unsubscribe(member).await),
        "session_open" => code(
            c.open_session(&muster_sdk::protocol::ops::SessionOpen {
                member: member.into(),
                labels: vec![],
                capacity: 1,
                reclaim: false,
                resume: false,
                held: None,
                liveness_ms: None,
            })
            .await,
        ),
        "member_list" => code(c.member_list().await),
        "member_describe" => code(c.member_describe(member).await),
        "server_stats" => code(c.server_stats().await),
        // Relative: refused after the role check, so no copy is written.
        "admin_snapshot" => code(c.admin_snapshot("not-absolute").await),
        "member_drain" => code(c.member_drain(member).await),
        "member_undrain" => code(c.member_undrain(member).await),
        "task_update" => code(
            c.task_update(&muster_sdk::protocol::ops::TaskUpdate {
                task: task.into(),
                priority: Some(1),
                run_now: false,
            })
            .await,
        ),
        // A name bound to nobody: an allowed release is `not_found`, and releasing the
        // cell's own member would end this connection's session (and close it).
        "member_release" => code(c.member_release(&format!("{member}-unbound")).await),
        "lease_revoke" => code(c.lease_revoke(task).await),
        "watch_queues" => code(
            c.watch(
                View::Queues {
                    after: None,
                    limit: None,
                },
                1,
            )
            .await,
        ),
        "watch_tasks" => code(
            c.watch(
                View::Tasks {
                    queue: queue.into(),
                    state: muster_sdk::TaskState::Ready,
                    after: None,
                    limit: None,
                },
                1,
            )
            .await,
        ),
        "watch_dead" => code(
            c.watch(
                View::Dead {
                    after: None,
                    limit: None,
                },
                1,
            )
            .await,
        ),
        "watch_task" => code(c.watch(View::Task { task: task.into() }, 1).await),
        "watch_member" => code(
            c.watch(
                View::Member {
                    member: member.into(),
                },
                1,
            )
            .await,
        ),
        "watch_members" => code(
            c.watch(
                View::Members {
                    after: None,
                    limit: None,
                },
                1,
            )
            .await,
        ),
        "watch_limits" => code(
            c.watch(
                View::Limits {
                    after: None,
                    limit: None,
                },
                1,
            )
            .await,
        ),
        "unwatch" => code(c.unwatch().await),
        // Limits span queues: an allowed change is made (a limit of the cell's own),
        // an allowed read or delete of a limit that does not exist is `not_found`.
        "limit_set" => code(
            c.limit_set(
                &format!("l-{member}-{queue}"),
                muster_sdk::protocol::model::LimitSpec {
                    concurrency: Some(1),
                    ..Default::default()
                },
            )
            .await,
        ),
        "limit_get" => code(c.limit_get("nothing").await),
        "limit_list" => code(c.limit_list().await),
        "limit_delete" => code(c.limit_delete("nothing").await),
        // Not leased: an allowed throttle is `lease_lost`.
        "throttled" => code(c.throttled(task, 1, None, None).await),
        // Not leased: an allowed emit is `lease_lost`.
        "emit" => code(
            c.emit(task, 1, 0, vec![muster_sdk::Chunk::text("hi")])
                .await,
        ),
        // No output: an allowed follow answers at once with nothing.
        "follow" => code(c.follow(task, 0, Duration::ZERO).await),
        // Not leased: an allowed suspend is `lease_lost`.
        "suspend" => code(c.suspend(task, 1, muster_sdk::Suspension::new("why")).await),
        // Not leased: an allowed spawn (consume on the task's queue and produce on the
        // child's: only admins here) is `lease_lost`.
        "spawn" => code(
            c.spawn(
                task,
                1,
                vec![muster_sdk::NewChild::new(
                    "k",
                    queue,
                    muster_sdk::json(&1).expect("json"),
                )],
                None,
            )
            .await,
        ),
        // Not suspended: an allowed resume is `stale_token` (a token) or
        // `invalid_state` (by id).
        "resume" => code(
            c.resume(&format!("{task}.1.{}", "0".repeat(32)), None)
                .await,
        ),
        "resume_by_id" => code(c.resume_task(task, None).await),
        // A single daemon answers an admin with invalid_state: not refused.
        "cluster_status" => code(c.cluster_status().await),
        "cluster_add" => code(
            c.cluster_add(9, "127.0.0.1:1", "127.0.0.1:2", true, None)
                .await,
        ),
        "cluster_remove" => code(c.cluster_remove(9).await),
        other => panic!("no op {other}"),
    }
}

/// The schedule a matrix cell acts on: one of its own, so that a delete or a pause
/// changes no other cell's.
fn cell_schedule(member: &str, queue: &str, op: &str) -> String {
    format!("{member}-{queue}-{op}")
}

/// A schedule of `queue` that fires every second but is paused (it enqueues nothing).
fn paused_schedule(name: &str, queue: &str) -> muster_sdk::protocol::ops::ScheduleSet {
    muster_sdk::protocol::ops::ScheduleSet {
        name: name.into(),
        cron: "* * * * * *".into(),
        tz: None,
        queue: queue.into(),
        task: NewTask::new(muster_sdk::json(&1).expect("json")),
        catch_up: None,
        paused: Some(true),
    }
}

const OPS: &[&str] = &[
    "queue_create",
    "queue_list",
    "queue_describe",
    "queue_update",
    "queue_pause",
    "queue_resume",
    "queue_purge",
    "queue_delete",
    "enqueue",
    "claim",
    "ack",
    "nack",
    "renew",
    "release",
    "dead_letter",
    "task_get",
    "task_list",
    "task_find",
    "task_find_all_queues",
    "wait",
    "cancel",
    "cancel_if_suspended",
    "task_update",
    "redrive",
    "discard",
    "subscribe_without_session",
    "session_update_without_session",
    "unsubscribe_without_session",
    "session_open",
    "member_list",
    "member_describe",
    "server_stats",
    "admin_snapshot",
    "member_drain",
    "member_undrain",
    "member_release",
    "lease_revoke",
    "watch_queues",
    "watch_tasks",
    "watch_dead",
    "watch_task",
    "watch_member",
    "watch_members",
    "watch_limits",
    "unwatch",
    "limit_set",
    "limit_get",
    "limit_list",
    "limit_delete",
    "throttled",
    "suspend",
    "spawn",
    "emit",
    "follow",
    "resume",
    "resume_by_id",
    "cluster_status",
    "cluster_add",
    "cluster_remove",
    "schedule_set",
    "schedule_get",
    "schedule_list",
    "schedule_pause",
    "schedule_resume",
    "schedule_delete",
    "schedule_run",
];

/// The wire op a cell of the matrix exercises.
fn wire_op(cell: &str) -> &str {
    let op = cell
        .strip_suffix("_without_session")
        .or_else(|| cell.strip_suffix("_all_queues"))
        .or_else(|| cell.strip_suffix("_by_id"))
        .or_else(|| cell.strip_suffix("_if_suspended"))
        .unwrap_or(cell);
    if op.starts_with("watch_") {
        "watch"
    } else {
        op
    }
}

#[test]
fn the_authorization_matrix_covers_every_op() {
    // `hello` is how a token is presented: it is never refused for its role.
    let missing: Vec<&str> = muster_sdk::protocol::ops::OP_NAMES
        .iter()
        .copied()
        .filter(|op| *op != "hello" && !OPS.iter().any(|cell| wire_op(cell) == *op))
        .collect();
    assert!(
        missing.is_empty(),
        "ops missing from the matrix: {missing:?}"
    );
}

/// Whether `role` may do `op` on a queue its token covers (`own`) or not.
fn allowed(role: &str, op: &str, own: bool) -> bool {
    // A queue-scoped admin never acts on every member or name, nor on the cluster's
    // membership; and it sees a member only through a lease or a subscription in its
    // queues, which the matrix's member (`{role}-m`, whose session_open released its
    // claim) no longer has by then.
    if role == "queue-admin"
        && matches!(
            op,
            "member_describe"
                | "member_drain"
                | "member_undrain"
                | "member_release"
                | "admin_snapshot"
                | "watch_member"
                | "watch_members"
                | "cluster_add"
                | "cluster_remove"
                | "limit_set"
                | "limit_delete"
        )
    {
        return false;
    }
    // Ops without a queue, or that filter by queue rather than refuse.
    let any_queue = matches!(
        op,
        "queue_list"
            | "session_open"
            | "session_update_without_session"
            | "unsubscribe_without_session"
            | "member_list"
            | "server_stats"
            | "watch_queues"
            | "watch_dead"
            | "watch_limits"
            | "limit_set"
            | "limit_get"
            | "limit_list"
            | "limit_delete"
            | "unwatch"
            | "task_find_all_queues"
            | "cluster_status"
            | "cluster_add"
            | "cluster_remove"
            | "schedule_list"
    );
    let by_role = match role {
        "admin" | "queue-admin" => true,
        "producer" => matches!(
            op,
            "queue_list"
                | "queue_describe"
                | "enqueue"
                | "task_get"
                | "follow"
                | "wait"
                | "cancel"
                | "cancel_if_suspended"
                | "schedule_get"
                | "schedule_list"
                | "schedule_run"
                | "limit_get"
                | "limit_list"
                | "watch_limits"
                | "unwatch"
        ),
        "consumer" => matches!(
            op,
            "queue_list"
                | "queue_describe"
                | "claim"
                | "ack"
                | "nack"
                | "renew"
                | "release"
                | "dead_letter"
                | "task_get"
                | "follow"
                | "emit"
                | "subscribe_without_session"
                | "session_update_without_session"
                | "unsubscribe_without_session"
                | "session_open"
                | "throttled"
                | "suspend"
                | "resume"
                | "schedule_get"
                | "schedule_list"
                | "limit_get"
                | "limit_list"
                | "watch_limits"
                | "unwatch"
        ),
        other => panic!("no role {other}"),
    };
    // The admin token covers every queue; the others only jobs and jobs.*.
    by_role && (own || any_queue || role == "admin")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authorization_matrix_has_no_unauthorized_success() {
    let (d, _config) = secured(&[]);
    let admin = d.client_as(ADMIN).await;
    for q in ["jobs", "other"] {
        admin
            .queue_create(q, QueuePatch::default())
            .await
            .expect("queue");
    }
    let mut cells = 0;
    let mut wrong = Vec::new();
    for (role, token) in [
        ("admin", ADMIN),
        ("producer", PRODUCER),
        ("consumer", CONSUMER),
        ("queue-admin", QUEUE_ADMIN),
    ] {
        let client = d.client_as(token).await;
        for own in [true, false] {
            let queue = if own { "jobs" } else { "other" };
            for op in OPS {
                // A task of the queue for task ops, fresh for each cell.
                let task = admin
                    .enqueue(queue, NewTask::new(muster_sdk::json(&op).expect("json")))
                    .await
                    .expect("enqueue")
                    .id;
                let member = format!("{role}-m");
                if op.starts_with("schedule_") {
                    admin
                        .schedule_set(&paused_schedule(&cell_schedule(&member, queue, op), queue))
                        .await
                        .expect("a cell's schedule");
                }
                let got = attempt(&client, op, queue, &task, &member).await;
                let denied = matches!(
                    got,
                    Some(ErrorCode::Forbidden) | Some(ErrorCode::Unauthorized)
                );
                if denied == allowed(role, op, own) {
                    wrong.push(format!("{role} {op} on {queue}: {got:?}"));
                }
                cells += 1;
            }
        }
    }
    assert_eq!(cells, 4 * 2 * OPS.len());
    assert!(
        wrong.is_empty(),
        "{} of {cells} cells wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    // queue_list only shows what a token covers.
    let producer = d.client_as(PRODUCER).await;
    let names: Vec<String> = producer
        .queue_list()
        .await
        .expect("list")
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert!(
        names.iter().all(|n| n == "jobs" || n.starts_with("jobs.")),
        "{names:?}"
    );
    // A search over every queue only examines what a token covers.
    let jobs_admin = d.client_as(QUEUE_ADMIN).await;
    let everything = muster_sdk::protocol::ops::TaskFind {
        limit: Some(1000),
        ..Default::default()
    };
    let found = jobs_admin.task_find(&everything).await.expect("find");
    assert_eq!(found.next, None);
    let c = admin.queue_describe("jobs").await.expect("jobs").counts;
    let in_jobs = c.scheduled + c.ready + c.leased + c.done + c.dead + c.cancelled;
    assert_eq!(found.tasks.len() as u64, in_jobs);
    assert!(found.tasks.iter().all(|t| t.queue == "jobs"), "{found:?}");
    let all = admin.task_find(&everything).await.expect("find");
    assert!(all.tasks.iter().any(|t| t.queue == "other"));
    eprintln!("authorization matrix: {cells} cells, 0 unauthorized successes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_name_belongs_to_the_principal_that_first_used_it() {
    let (d, _config) = secured(&[]);
    let admin = d.client_as(ADMIN).await;
    admin
        .queue_create("jobs", QueuePatch::default())
        .await
        .expect("queue");
    admin
        .enqueue("jobs", NewTask::new(muster_sdk::json(&1).expect("json")))
        .await
        .expect("enqueue");
    let a = d.client_as(CONSUMER).await;
    let open = muster_sdk::protocol::ops::SessionOpen {
        member: "shared-name".into(),
        labels: vec![],
        capacity: 1,
        reclaim: true,
        resume: false,
        held: None,
        liveness_ms: None,
    };
    a.open_session(&open)
        .await
        .expect("first use takes the name");
    let got = a
        .claim(&Claim::new(["jobs"]).member("shared-name"))
        .await
        .expect("claim");
    let b = d.client_as(CONSUMER_B).await;
    assert_eq!(
        code(b.open_session(&open).await),
        Some(ErrorCode::Forbidden)
    );
    assert_eq!(
        code(b.claim(&Claim::new(["jobs"]).member("shared-name")).await),
        Some(ErrorCode::Forbidden)
    );
    assert_eq!(
        code(b.ack(&got[0].id, got[0].epoch, None).await),
        Some(ErrorCode::Forbidden)
    );
    assert_eq!(
        code(b.renew(&got[0].id, got[0].epoch, None, None).await),
        Some(ErrorCode::Forbidden)
    );
    assert_eq!(
        a.ack(&got[0].id, got[0].epoch, None)
            .await
            .expect("own ack")
            .state,
        muster_sdk::TaskState::Done
    );
    // The binding is stored: it survives a restart.
    drop((a, b));
    let mut d = d;
    assert_eq!(d.terminate(), Some(0));
    d.restart();
    let b = d.client_as(CONSUMER_B).await;
    assert_eq!(
        code(b.open_session(&open).await),
        Some(ErrorCode::Forbidden)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_served_before_a_valid_token_and_silent_connections_are_closed() {
    let (d, _config) = secured(&["--hello-timeout", "500ms"]);
    // No token, or a wrong one: the SDK's hello is refused.
    for token in [None, Some("wrong-token-0123456789")] {
        let options = ConnectOptions {
            token: token.map(str::to_owned),
            ..d.options()
        };
        let err = Client::connect(options).await.err().expect("refused");
        assert_eq!(err.code(), Some(ErrorCode::Unauthorized), "{err}");
    }
    // A request before hello is refused, and nothing is done.
    let conn = muster_sdk::connect::open(&d.options())
        .await
        .expect("raw connection");
    let reply = exchange(
        &conn,
        &frame(r#"{"id":1,"op":"queue_create","queue":"sneaky"}"#),
    )
    .await;
    assert_eq!(reply["error"]["code"], "unauthorized", "{reply}");
    // A connection that stays silent is closed after the hello timeout (code 4).
    let silent = muster_sdk::connect::open(&d.options())
        .await
        .expect("raw connection");
    let closed = tokio::time::timeout(Duration::from_secs(10), silent.closed())
        .await
        .expect("closed in time");
    assert!(
        closed.to_string().contains("no token presented in time"),
        "{closed}"
    );
    let admin = d.client_as(ADMIN).await;
    assert!(admin.queue_list().await.expect("list").is_empty());
}

/// The `hello` reply to `token` on a new raw connection, its `server` checked and left
/// out (the daemon's version).
async fn hello_reply(d: &Daemon, token: Option<&str>) -> serde_json::Value {
    let conn = muster_sdk::connect::open(&d.options())
        .await
        .expect("raw connection");
    let hello = match token {
        Some(t) => format!(r#"{{"id":1,"op":"hello","version":1,"token":"{t}"}}"#),
        None => r#"{"id":1,"op":"hello","version":1}"#.to_owned(),
    };
    let mut reply = exchange(&conn, &frame(&hello)).await;
    let server = reply
        .as_object_mut()
        .and_then(|o| o.remove("server"))
        .unwrap_or_default();
    assert!(
        server.as_str().is_some_and(|s| s.starts_with("musterd ")),
        "{server}"
    );
    conn.close(0u32.into(), b"done");
    reply
}

/// `hello` names the principal the token is, exactly as configured: an admin of every
/// queue, a producer and an admin limited to some queues; the local-only daemon's own
/// token is `local`, an admin of every queue; an `--open` daemon names none. The SDK
/// keeps it (`Client::principal`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_names_the_tokens_principal_with_its_roles_and_queues() {
    use muster_sdk::protocol::ops::{PrincipalInfo, Role};
    let (d, _config) = secured(&[]);
    assert_eq!(
        hello_reply(&d, Some(ADMIN)).await,
        serde_json::json!({"id": 1, "ok": true, "version": 1, "principal": {
            "name": "admin", "roles": ["admin"], "queues": [], "members": []
        }})
    );
    assert_eq!(
        hello_reply(&d, Some(PRODUCER)).await,
        serde_json::json!({"id": 1, "ok": true, "version": 1, "principal": {
            "name": "producer", "roles": ["produce"], "queues": ["jobs", "jobs.*"], "members": []
        }})
    );
    assert_eq!(
        hello_reply(&d, Some(QUEUE_ADMIN)).await,
        serde_json::json!({"id": 1, "ok": true, "version": 1, "principal": {
            "name": "queue-admin", "roles": ["admin"], "queues": ["jobs", "jobs.*"], "members": []
        }})
    );
    let producer = d.client_as(PRODUCER).await;
    assert_eq!(
        producer.principal(),
        Some(&PrincipalInfo {
            name: "producer".into(),
            roles: vec![Role::Produce],
            queues: vec!["jobs".into(), "jobs.*".into()],
            members: Vec::new(),
        })
    );
    producer.close().await;

    // Local-only: the data directory's token is the principal `local`.
    let local = Daemon::start();
    let token = std::fs::read_to_string(local.data().join("local.token")).expect("local.token");
    assert_eq!(
        hello_reply(&local, Some(token.trim())).await,
        serde_json::json!({"id": 1, "ok": true, "version": 1, "principal": {
            "name": "local", "roles": ["admin"], "queues": [], "members": []
        }})
    );
    let client = local.client().await;
    assert_eq!(
        client
            .principal()
            .map(|p| (p.name.as_str(), p.roles.as_slice())),
        Some(("local", [Role::Admin].as_slice()))
    );
    client.close().await;

    // --open: no principal, with or without a token.
    let open = Daemon::start_with(&["--open"]);
    let bare = serde_json::json!({"id": 1, "ok": true, "version": 1});
    assert_eq!(hello_reply(&open, None).await, bare);
    assert_eq!(hello_reply(&open, Some(ADMIN)).await, bare);
    let client = open.client().await;
    assert_eq!(client.principal(), None);
    client.close().await;
}

pub(crate) fn frame(body: &str) -> Vec<u8> {
    frame_bytes(body.as_bytes())
}

fn frame_bytes(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

/// Sends bytes on a new stream, finishes it, and reads one reply frame.
async fn exchange(conn: &quinn::Connection, bytes: &[u8]) -> serde_json::Value {
    let (mut send, mut recv) = conn.open_bi().await.expect("stream");
    send.write_all(bytes).await.expect("write");
    send.finish().expect("finish");
    read_frame(&mut recv).await.expect("a reply frame")
}

pub(crate) async fn read_frame(recv: &mut quinn::RecvStream) -> Option<serde_json::Value> {
    let mut header = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(10), recv.read_exact(&mut header))
        .await
        .ok()?
        .ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(header) as usize];
    recv.read_exact(&mut body).await.ok()?;
    Some(serde_json::from_slice(&body).expect("reply is JSON"))
}

pub(crate) fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_class_of_bad_input_gets_its_code_and_changes_nothing() {
    // Raw frames without `hello`: an --open daemon answers them.
    let d = Daemon::start_with(&["--open"]);
    let client = d.client().await;
    client
        .queue_create("jobs", QueuePatch::default())
        .await
        .expect("queue");
    let task = client
        .enqueue("jobs", NewTask::new(muster_sdk::json(&1).expect("json")))
        .await
        .expect("enqueue")
        .id;
    let conn = muster_sdk::connect::open(&d.options())
        .await
        .expect("raw connection");
    let deep = format!(
        r#"{{"id":2,"op":"enqueue","queue":"jobs","tasks":[{{"payload":{}{}}}]}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    let cases: Vec<(&str, Vec<u8>, serde_json::Value, &str)> = vec![
        (
            "malformed JSON",
            frame(r#"{"id":1,"op":"#),
            serde_json::Value::Null,
            "bad_request",
        ),
        (
            // Refused by its depth before it is parsed, with its id, read from the
            // frame's start, so that its client hears of it.
            "nesting over the limit",
            frame(&deep),
            2.into(),
            "bad_request",
        ),
        (
            "invalid UTF-8",
            frame_bytes(b"{\"id\":3,\"op\":\"queue_list\",\"x\":\"\xff\xfe\"}"),
            serde_json::Value::Null,
            "bad_request",
        ),
        (
            "unknown op",
            frame(r#"{"id":4,"op":"fly"}"#),
            4.into(),
            "unknown_op",
        ),
        (
            "wrong type",
            frame(r#"{"id":5,"op":"claim","queues":"jobs"}"#),
            5.into(),
            "bad_request",
        ),
        (
            "negative number",
            frame(&format!(
                r#"{{"id":6,"op":"ack","task":"{task}","epoch":-1}}"#
            )),
            6.into(),
            "bad_request",
        ),
        (
            "overflowing number",
            frame(&format!(
                r#"{{"id":7,"op":"ack","task":"{task}","epoch":99999999999999999999999}}"#
            )),
            7.into(),
            "bad_request",
        ),
        (
            "bad name",
            frame(r#"{"id":8,"op":"queue_create","queue":"Bad Name"}"#),
            8.into(),
            "bad_request",
        ),
        (
            "stale claim",
            frame(&format!(
                r#"{{"id":9,"op":"ack","task":"{task}","epoch":7}}"#
            )),
            9.into(),
            "lease_lost",
        ),
        (
            "forged claim",
            frame(r#"{"id":10,"op":"ack","task":"01JDQ8Z9M4X6K2V7N3B5C8D1EF","epoch":1}"#),
            10.into(),
            "not_found",
        ),
        (
            "empty frame",
            0u32.to_be_bytes().to_vec(),
            serde_json::Value::Null,
            "bad_request",
        ),
        (
            "length over the limit",
            u32::MAX.to_be_bytes().to_vec(),
            serde_json::Value::Null,
            "too_large",
        ),
        (
            "too large payload",
            frame(&format!(
                r#"{{"id":11,"op":"enqueue","queue":"jobs","tasks":[{{"payload":"{}"}}]}}"#,
                "x".repeat(1024 * 1024 + 1)
            )),
            11.into(),
            "too_large",
        ),
    ];
    for (name, bytes, id, want) in &cases {
        let reply = exchange(&conn, bytes).await;
        assert_eq!(
            (
                &reply["id"],
                reply["ok"].as_bool(),
                reply["error"]["code"].as_str()
            ),
            (id, Some(false), Some(*want)),
            "{name}: {reply}"
        );
    }
    // Truncated frames: a header promising more than follows, and a torn header. The
    // stream just ends; the connection and the daemon go on.
    for bytes in [
        [&100u32.to_be_bytes()[..], b"{\"id\":"].concat(),
        vec![0, 0],
    ] {
        let (mut send, mut recv) = conn.open_bi().await.expect("stream");
        send.write_all(&bytes).await.expect("write");
        send.finish().expect("finish");
        assert!(read_frame(&mut recv).await.is_none());
    }
    let ok = exchange(
        &conn,
        &frame(r#"{"id":12,"op":"queue_describe","queue":"jobs"}"#),
    )
    .await;
    assert_eq!(
        (ok["ok"].as_bool(), ok["queue"]["ready"].as_u64()),
        (Some(true), Some(1)),
        "{ok}"
    );
    let t = client.task_get(&task).await.expect("task");
    assert_eq!((t.state, t.deliveries), (muster_sdk::TaskState::Ready, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_bad_frames_do_not_disturb_a_working_client() {
    // Raw frames without `hello`: an --open daemon answers them.
    let d = Daemon::start_with(&["--open"]);
    let client = d.client().await;
    client
        .queue_create("jobs", QueuePatch::default())
        .await
        .expect("queue");
    // Warm up: the first bad frames and requests size the daemon's buffers.
    let warm = muster_sdk::connect::open(&d.options())
        .await
        .expect("raw connection");
    for i in 0..200 {
        let reply = exchange(&warm, &frame(&format!(r#"{{"id":{i},"op":"fly"}}"#))).await;
        assert_eq!(reply["error"]["code"], "unknown_op");
    }
    let before = rss_kib(d.pid());
    let worker = {
        let client = client.clone();
        tokio::spawn(async move {
            for n in 0..300u32 {
                let id = client
                    .enqueue("jobs", NewTask::new(muster_sdk::json(&n).expect("json")))
                    .await
                    .expect("enqueue")
                    .id;
                let got = client.claim(&Claim::new(["jobs"])).await.expect("claim");
                assert_eq!(got.len(), 1);
                client
                    .ack(&got[0].id, got[0].epoch, None)
                    .await
                    .expect("ack");
                let _ = id;
            }
        })
    };
    let conn = muster_sdk::connect::open(&d.options())
        .await
        .expect("raw connection");
    let bad: [&[u8]; 6] = [
        br#"{"id":1,"op":"#,
        br#"{"id":2,"op":"fly"}"#,
        br#"{"id":3,"op":"claim","queues":7}"#,
        br#"{"id":4,"op":"ack","task":"zz","epoch":-3}"#,
        b"\xff\xff\xff",
        br#"{"id":5,"op":"enqueue","queue":"NO","tasks":[]}"#,
    ];
    let (mut send, mut recv) = conn.open_bi().await.expect("stream");
    let mut sent = 0;
    let reader = tokio::spawn(async move {
        let mut replies = 0;
        while let Some(reply) = read_frame(&mut recv).await {
            assert_eq!(reply["ok"], false);
            replies += 1;
            if replies == 10_000 {
                break;
            }
        }
        replies
    });
    let mut buf = Vec::new();
    for i in 0..10_000 {
        let body = bad[i % bad.len()];
        buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
        buf.extend_from_slice(body);
        sent += 1;
        if buf.len() > 16 * 1024 {
            send.write_all(&buf).await.expect("write");
            buf.clear();
        }
    }
    send.write_all(&buf).await.expect("write");
    assert_eq!(reader.await.expect("reader"), 10_000);
    worker.await.expect("the working client was disturbed");
    let after = rss_kib(d.pid());
    let growth = after.saturating_sub(before);
    eprintln!("bad frames: {sent} sent, daemon RSS {before} KiB -> {after} KiB (+{growth} KiB)");
    assert!(growth < 16 * 1024, "daemon grew by {growth} KiB");
    let q = client.queue_describe("jobs").await.expect("describe");
    assert_eq!((q.counts.done, q.counts.ready), (300, 0));
}

/// One flood: twice the connection limit, then twice the stream limit on one connection.
async fn flood(d: &Daemon) {
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..16 {
        match Client::connect(d.options()).await {
            Ok(c) => held.push(c),
            Err(e) => {
                assert!(e.to_string().contains("connection limit reached"), "{e}");
                refused += 1;
            }
        }
    }
    assert_eq!((held.len(), refused), (8, 8));
    drop(held);
    // Slots come back when connections close.
    let mut again = None;
    for _ in 0..100 {
        if let Ok(c) = Client::connect(d.options()).await {
            again = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let client = again.expect("a connection after the others closed");
    assert!(client.queue_list().await.expect("list").is_empty());
    drop(client);

    // 64 streams at once per connection: the 65th waits for credit, it is not served.
    let conn = muster_sdk::connect::open(&d.options())
        .await
        .expect("raw connection");
    let mut streams = Vec::new();
    for i in 0..64 {
        let (mut send, recv) = conn.open_bi().await.expect("stream");
        send.write_all(&frame(&format!(r#"{{"id":{i},"op":"queue_list"}}"#)))
            .await
            .expect("write");
        streams.push((send, recv));
    }
    for (_, recv) in &mut streams {
        assert_eq!(read_frame(recv).await.expect("reply")["ok"], true);
    }
    let extra = tokio::time::timeout(Duration::from_millis(500), async {
        let (mut send, mut recv) = conn.open_bi().await.expect("stream");
        send.write_all(&frame(r#"{"id":99,"op":"queue_list"}"#))
            .await
            .expect("write");
        read_frame(&mut recv).await
    })
    .await;
    assert!(extra.is_err(), "a 65th concurrent stream was served");
    drop(streams);
    conn.close(0u32.into(), b"done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_and_streams_past_their_limits_are_refused_cleanly() {
    let d = Daemon::start_with(&["--max-connections", "8", "--open"]);
    // Memory must stay bounded: under a cap, and with no upward trend from flood to flood
    // (the allocator keeps freed memory per thread, so single readings wobble).
    let mut rss = Vec::new();
    for _ in 0..6 {
        flood(&d).await;
        rss.push(rss_kib(d.pid()));
    }
    eprintln!("floods: daemon RSS after each of 6 floods: {rss:?} KiB");
    assert!(rss.iter().all(|&r| r < 128 * 1024), "{rss:?}");
    let (early, late) = (
        rss[..3].iter().sum::<u64>() / 3,
        rss[3..].iter().sum::<u64>() / 3,
    );
    assert!(late < early + 16 * 1024, "RSS trends upward: {rss:?}");
}
