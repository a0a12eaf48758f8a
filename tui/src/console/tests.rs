//! The console driven through [`App::on_key`], as the real loop drives it, with the
//! effects it asks for checked exactly and each screen rendered at 80×24 into ratatui's
//! `TestBackend` and compared with its insta snapshot. Time is fixed: nothing volatile.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

use muster_protocol::model::{
    CatchUp, ChildSummary, LeaseInfo, LimitInfo, LimitKeyInfo, LimitSpec, LimitUse, MemberInfo,
    MemberState, NewTask, OnTimeout, QueueInfo, QueueOptions, QueuePatch, QueueTotals, Rate,
    ScheduleInfo, StateCounts, SuspensionInfo, TaskInfo, TaskState, TaskSummary, TimelineEvent,
};
use muster_protocol::ops::{
    ClusterHello, ClusterMember, ClusterStatusReply, FindCursor, ServerStatsReply, TaskFind,
    TaskFindReply, View, WatchReply, WatchUpdate, raw,
};
use muster_protocol::{ErrorBody, ErrorCode};

use super::app::{App, DaemonFacts, Effect, Level, Mode, PAGE_ROWS, Screen, TABS};
use super::changes::{DeadAction, DeadTasks, Draft, NEW_PAYLOAD, QueueChange, Requeue, Verb};
use super::rows::ClusterPoll;
use super::search::{search_query, search_words};
use super::trends::TREND_SECONDS;
use super::{detail, ui};

const NOW: u64 = 1_800_000_000_000;
const SEC: u64 = 1000;

fn press(app: &mut App, code: KeyCode) -> Vec<Effect> {
    app.on_key(KeyEvent::new(code, KeyModifiers::NONE))
}

fn chars(app: &mut App, text: &str) -> Vec<Effect> {
    text.chars()
        .flat_map(|c| match c {
            '\n' => press(app, KeyCode::Enter),
            c => press(app, KeyCode::Char(c)),
        })
        .collect()
}

fn screen(app: &App, width: u16, height: u16) -> Terminal<TestBackend> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("a test terminal");
    terminal
        .draw(|f| ui::render(app, f))
        .expect("drawing into a TestBackend");
    terminal
}

fn text(app: &App) -> String {
    screen(app, 80, 24).backend().to_string()
}

/// The tag of the one watch the effects ask for, checking its view.
fn watched(effects: &[Effect], view: View) -> u64 {
    match effects {
        [Effect::Watch { view: v, tag }] => {
            assert_eq!(*v, view);
            *tag
        }
        other => panic!("expected one watch of {view:?}, got {other:?}"),
    }
}

/// The queues screen's view, as the console watches it.
fn queues_view() -> View {
    View::Queues {
        after: None,
        limit: Some(PAGE_ROWS),
    }
}

/// Watches the current screen again and returns the tag its updates must carry.
fn current_tag(app: &mut App) -> u64 {
    match app.rewatch() {
        Some(Effect::Watch { tag, .. }) => tag,
        other => panic!("{other:?}"),
    }
}

fn deliver(app: &mut App, tag: u64, update: WatchUpdate) {
    assert_eq!(
        app.on_watch(WatchReply {
            tag,
            update,
            disk_alarm: false
        }),
        None
    );
}

fn queue(name: &str, counts: [u64; 6], paused: bool) -> QueueInfo {
    let [scheduled, ready, leased, done, dead, cancelled] = counts;
    QueueInfo {
        name: name.into(),
        options: QueueOptions {
            paused,
            ..QueueOptions::default()
        },
        counts: StateCounts {
            scheduled,
            ready,
            leased,
            done,
            dead,
            cancelled,
            suspended: 0,
        },
        held_back: 0,
        waiting_on_limits: 0,
        unclaimable: 0,
        unclaimable_requires: Vec::new(),
        unclaimable_sets: 0,
        consumers: if name == "inference" { 2 } else { 0 },
        totals: QueueTotals {
            enqueued: 100,
            acked: 40,
            nacked: 3,
            lapsed: 1,
        },
        oldest_ready_ms: (ready > 0).then_some(NOW - 95 * SEC),
        created_ms: NOW - 3_600 * SEC,
    }
}

fn id(n: u32) -> String {
    format!("01KA0000000000000000000{n:03}")
}

fn task(n: u32, queue: &str, state: TaskState) -> TaskSummary {
    TaskSummary {
        id: id(n),
        queue: queue.into(),
        state,
        priority: (n % 3) as u8,
        key: n.is_multiple_of(2).then(|| format!("user-{n}")),
        deliveries: 3,
        failures: if state == TaskState::Dead { 3 } else { 0 },
        not_before_ms: None,
        lease: (state == TaskState::Leased).then(|| LeaseInfo {
            member: format!("gpu-{n}"),
            epoch: 4,
            expires_ms: NOW + 25 * SEC,
        }),
        last_error: (state == TaskState::Dead).then(|| "CUDA out of memory\ntraceback…".into()),
        dead_reason: (state == TaskState::Dead).then(|| "max_attempts".into()),
        suspension: (state == TaskState::Suspended).then(|| {
            Box::new(SuspensionInfo {
                reason: format!("may I merge PR {n}?"),
                member: format!("coder-{n}"),
                epoch: 3,
                since_ms: NOW - 42 * SEC,
                timeout_at_ms: NOW + 3600 * SEC,
                on_timeout: OnTimeout::Fail,
                children: false,
            })
        }),
        created_ms: NOW - 600 * SEC,
        updated_ms: NOW - 42 * SEC,
        progress: (state == TaskState::Leased).then(|| format!("{{\"step\":{n},\"of\":10}}")),
    }
}

fn queues_update() -> WatchUpdate {
    WatchUpdate::Queues {
        queues: vec![
            queue("emails", [0, 12, 3, 880, 0, 0], false),
            queue("inference", [2, 100_000, 200, 51_234, 7, 1], false),
            queue("reports", [0, 0, 0, 15, 0, 0], true),
        ],
        next: None,
    }
}

/// A console on the queues screen with data.
fn started(readonly: bool) -> App {
    let (mut app, first) = App::new("127.0.0.1:7420".into(), readonly, NOW);
    let tag = watched(&[first], queues_view());
    deliver(&mut app, tag, queues_update());
    app
}

fn tasks_view(state: TaskState, after: Option<String>) -> View {
    View::Tasks {
        queue: "inference".into(),
        state,
        after,
        limit: Some(PAGE_ROWS),
    }
}

fn tasks_update(state: TaskState, ids: std::ops::Range<u32>, next: Option<String>) -> WatchUpdate {
    WatchUpdate::Tasks {
        queue: queue("inference", [2, 100_000, 200, 51_234, 7, 1], false),
        state,
        tasks: ids.map(|n| task(n, "inference", state)).collect(),
        next,
    }
}

/// The console on the inference queue's tab `state`, data delivered.
fn on_queue_tab(app: &mut App, tabs: usize, state: TaskState, ids: std::ops::Range<u32>) {
    let mut effects = press(app, KeyCode::Char('j'));
    assert_eq!(effects, vec![]);
    effects = press(app, KeyCode::Enter);
    let mut tag = watched(&effects, tasks_view(TaskState::Ready, None));
    for tab in &TABS[1..=tabs] {
        tag = watched(&press(app, KeyCode::Tab), tasks_view(*tab, None));
    }
    assert_eq!(TABS[tabs], state);
    deliver(app, tag, tasks_update(state, ids, None));
}

#[test]
fn queues_screen() {
    let app = started(false);
    insta::assert_snapshot!("queues", screen(&app, 80, 24).backend());
}

#[test]
fn queues_screen_read_only_has_no_verbs() {
    let mut app = started(true);
    for key in ['p', 'R', 'x', 'r', 'c', 'v', 'd'] {
        assert_eq!(press(&mut app, KeyCode::Char(key)), vec![]);
        assert_eq!(app.mode, Mode::Normal, "{key} must do nothing read-only");
    }
    insta::assert_snapshot!("queues_readonly", screen(&app, 80, 24).backend());
    assert!(!app.keys().iter().any(|(k, _)| matches!(*k, "p" | "R")));
}

/// At `at`, the queues screen with only `emails`, its totals moved on by `enqueued`
/// and `acked` since the first screen.
fn emails_at(app: &mut App, at: u64, enqueued: u64, acked: u64) {
    app.now_ms = at;
    let mut q = queue("emails", [0, 12, 3, 880, 0, 0], false);
    q.totals.enqueued += enqueued;
    q.totals.acked += acked;
    let update = WatchUpdate::Queues {
        queues: vec![q],
        next: None,
    };
    deliver(app, 1, update);
}

#[test]
fn rates_come_from_the_totals_of_successive_updates() {
    let mut app = started(false);
    emails_at(&mut app, NOW + 2 * SEC, 10, 4);
    assert_eq!(app.rate("emails"), (5.0, 2.0));
    assert_eq!(app.rate("inference"), (0.0, 0.0));
    // Averaged over the last 10 s: a quiet second after a busy one halves the rate…
    emails_at(&mut app, NOW + 4 * SEC, 10, 4);
    assert_eq!(app.rate("emails"), (2.5, 1.0));
    // …and what happened more than 10 s ago drops out.
    emails_at(&mut app, NOW + 30 * SEC, 10, 4);
    assert_eq!(app.rate("emails"), (0.0, 0.0));
}

#[test]
fn queue_ready_tab_and_paging() {
    let mut app = started(false);
    on_queue_tab(&mut app, 0, TaskState::Ready, 1..4);
    insta::assert_snapshot!("queue_ready", screen(&app, 80, 24).backend());
    // Moving past the last row follows the page's cursor…
    let mut app = started(false);
    let effects = press(&mut app, KeyCode::Char('j'));
    assert_eq!(effects, vec![]);
    let tag = watched(
        &press(&mut app, KeyCode::Enter),
        tasks_view(TaskState::Ready, None),
    );
    deliver(
        &mut app,
        tag,
        tasks_update(TaskState::Ready, 1..3, Some(id(2))),
    );
    assert_eq!(press(&mut app, KeyCode::Char('j')), vec![]);
    let tag = watched(
        &press(&mut app, KeyCode::Char('j')),
        tasks_view(TaskState::Ready, Some(id(2))),
    );
    deliver(&mut app, tag, tasks_update(TaskState::Ready, 3..5, None));
    assert_eq!(app.page().number(), 2);
    assert!(text(&app).contains("page 2"));
    // …on the last page there is nowhere further to go…
    assert_eq!(press(&mut app, KeyCode::Char('j')), vec![]);
    assert_eq!(press(&mut app, KeyCode::Char('j')), vec![]);
    // …and moving above the first row goes back a page, selecting its last row.
    assert_eq!(press(&mut app, KeyCode::Char('k')), vec![]);
    let tag = watched(
        &press(&mut app, KeyCode::Char('k')),
        tasks_view(TaskState::Ready, None),
    );
    deliver(
        &mut app,
        tag,
        tasks_update(TaskState::Ready, 1..3, Some(id(2))),
    );
    assert_eq!(app.page().selected, 1);
}

#[test]
fn queue_leased_tab_revokes_with_confirm() {
    let mut app = started(false);
    on_queue_tab(&mut app, 2, TaskState::Leased, 1..3);
    insta::assert_snapshot!("queue_leased", screen(&app, 80, 24).backend());
    assert_eq!(press(&mut app, KeyCode::Char('v')), vec![]);
    assert_eq!(app.mode, Mode::Confirm(Verb::Revoke(id(1))));
    assert_eq!(
        press(&mut app, KeyCode::Char('y')),
        vec![Effect::Run(Verb::Revoke(id(1)))]
    );
    // A key other than y cancels a confirm.
    assert_eq!(press(&mut app, KeyCode::Char('c')), vec![]);
    assert_eq!(app.mode, Mode::Confirm(Verb::Cancel(id(1))));
    assert_eq!(press(&mut app, KeyCode::Char('n')), vec![]);
    assert_eq!(app.message, Some((Level::Info, "nothing done".into())));
}

#[test]
fn dead_tab_redrives_the_marked_tasks_with_their_count() {
    let mut app = started(false);
    on_queue_tab(&mut app, 4, TaskState::Dead, 1..4);
    insta::assert_snapshot!("queue_dead", screen(&app, 80, 24).backend());
    press(&mut app, KeyCode::Char(' '));
    press(&mut app, KeyCode::Char('j'));
    press(&mut app, KeyCode::Char('j'));
    press(&mut app, KeyCode::Char(' '));
    assert_eq!(press(&mut app, KeyCode::Char('r')), vec![]);
    let verb = Verb::Dead(
        DeadAction::Redrive,
        DeadTasks {
            queue: "inference".into(),
            ids: vec![id(1), id(3)],
            all: false,
            count: 2,
        },
    );
    assert_eq!(app.mode, Mode::Confirm(verb.clone()));
    insta::assert_snapshot!("confirm_redrive", screen(&app, 80, 24).backend());
    assert_eq!(press(&mut app, KeyCode::Char('y')), vec![Effect::Run(verb)]);
    // The result lands in the footer, the marks go and the screen is watched afresh.
    let effect = app.on_done(Ok("redriven 2 tasks of inference".into()), false);
    watched(effect.as_slice(), tasks_view(TaskState::Dead, None));
    assert!(app.page().marked.is_empty());
    assert!(text(&app).contains("redriven 2 tasks of inference"));
    // Redrive all asks with the queue's dead count; discard asks for the selected one.
    press(&mut app, KeyCode::Char('R'));
    assert_eq!(
        app.mode,
        Mode::Confirm(Verb::Dead(
            DeadAction::Redrive,
            DeadTasks {
                queue: "inference".into(),
                ids: vec![],
                all: true,
                count: 7
            }
        ))
    );
    press(&mut app, KeyCode::Esc);
    press(&mut app, KeyCode::Char('x'));
    assert_eq!(
        app.mode,
        Mode::Confirm(Verb::Dead(
            DeadAction::Discard,
            DeadTasks {
                queue: "inference".into(),
                ids: vec![id(3)],
                all: false,
                count: 1
            }
        ))
    );
}

#[test]
fn daemon_errors_show_in_the_footer() {
    let mut app = started(false);
    let effect = app.on_done(
        Err("forbidden: token \"ops\" lacks the role admin".into()),
        false,
    );
    watched(effect.as_slice(), queues_view());
    insta::assert_snapshot!("error_footer", screen(&app, 80, 24).backend());
}

/// The watched screen of `task`, with no output and no tree beyond its children.
fn task_screen(task: TaskInfo) -> WatchUpdate {
    WatchUpdate::Task {
        task,
        output: Vec::new(),
        tree: Vec::new(),
        tree_truncated: false,
    }
}

fn task_info() -> TaskInfo {
    let event =
        |at: u64, event: &str, member: Option<&str>, epoch: Option<u64>, error: Option<&str>| {
            TimelineEvent {
                at_ms: NOW - at * SEC,
                event: event.into(),
                member: member.map(Into::into),
                epoch,
                error: error.map(Into::into),
            }
        };
    TaskInfo {
        id: id(1),
        queue: "inference".into(),
        state: TaskState::Leased,
        payload: raw(r#"{"model":"llama-70b","prompt":"summarise the quarterly report"}"#)
            .expect("valid JSON"),
        priority: 5,
        key: Some("user-7".into()),
        requires: vec!["gpu".into()],
        limits: Vec::new(),
        group: None,
        waiting_on: None,
        not_before_ms: None,
        idempotency_key: None,
        deliveries: 2,
        failures: 1,
        lease: Some(LeaseInfo {
            member: "gpu-3".into(),
            epoch: 2,
            expires_ms: NOW + 28 * SEC,
        }),
        cancel_requested: false,
        progress: Some(raw(r#"{"step":3,"of":10}"#).expect("valid JSON")),
        result: None,
        last_error: Some("lease lapsed".into()),
        dead_reason: None,
        suspension: None,
        resumed: None,
        parent: Some(id(9)),
        child_key: Some("report-q3".into()),
        children: vec![
            ChildSummary {
                id: id(10),
                child_key: "page-1".into(),
                queue: "ocr".into(),
                state: TaskState::Done,
                children: 0,
            },
            ChildSummary {
                id: id(11),
                child_key: "page-2".into(),
                queue: "ocr".into(),
                state: TaskState::Leased,
                children: 2,
            },
        ],
        output: None,
        traceparent: None,
        tracestate: None,
        created_ms: NOW - 900 * SEC,
        updated_ms: NOW - 60 * SEC,
        history: vec![
            event(900, "enqueued", None, None, None),
            event(800, "leased", Some("gpu-1"), Some(1), None),
            event(120, "lapsed", Some("gpu-1"), Some(1), Some("lease lapsed")),
            event(60, "leased", Some("gpu-3"), Some(2), None),
        ],
    }
}

#[test]
fn task_screen_shows_the_last_lines_of_its_output_made_safe() {
    let mut app = started(false);
    on_queue_tab(&mut app, 2, TaskState::Leased, 1..3);
    let tag = watched(&press(&mut app, KeyCode::Enter), View::Task { task: id(1) });
    let mut t = task_info();
    t.children.clear();
    t.output = Some(muster_protocol::model::OutputSummary {
        first: 3,
        next: 20,
        bytes: 300,
    });
    let text = |n: u64, s: &str| muster_protocol::model::OutputChunk {
        n,
        at_ms: NOW,
        text: Some(s.into()),
        json: None,
    };
    let mut output: Vec<_> = (5..18).map(|n| text(n, &format!("step {n}\n"))).collect();
    // A cut line goes on in the next chunk; an escape is shown, not obeyed.
    output.push(text(18, "thinking \u{1b}]52;c;cGF3bmVk\u{7}"));
    output.push(muster_protocol::model::OutputChunk {
        n: 19,
        at_ms: NOW,
        text: None,
        json: Some(serde_json::value::RawValue::from_string(r#"{"tokens":412}"#.into()).unwrap()),
    });
    let lines = detail::output_text(&output);
    assert_eq!(lines.len(), detail::OUTPUT_LINES);
    assert_eq!(lines[0], "step 8");
    assert_eq!(
        lines[10..],
        [
            "thinking \\u{1b}]52;c;cGF3bmVk\\u{7}".to_owned(),
            r#"{"tokens":412}"#.to_owned()
        ]
    );
    deliver(
        &mut app,
        tag,
        WatchUpdate::Task {
            task: t,
            output,
            tree: Vec::new(),
            tree_truncated: false,
        },
    );
    insta::assert_snapshot!("task_output", screen(&app, 100, 40).backend());
}

#[test]
fn task_screen_shows_its_family_tree_and_says_when_it_was_cut() {
    use muster_protocol::model::{ChildSummary, TreeNode};
    let mut app = started(false);
    on_queue_tab(&mut app, 2, TaskState::Leased, 1..3);
    let tag = watched(&press(&mut app, KeyCode::Enter), View::Task { task: id(1) });
    let node = |depth: u8, n: u32, key: &str, state: TaskState, children: u32| TreeNode {
        depth,
        child: ChildSummary {
            id: id(n),
            child_key: key.into(),
            queue: "ocr".into(),
            state,
            children,
        },
    };
    // page-2's children follow it; page-2b's one child was cut off with the tree.
    let tree = vec![
        node(1, 10, "page-1", TaskState::Done, 0),
        node(1, 11, "page-2", TaskState::Leased, 2),
        node(2, 12, "page-2a", TaskState::Done, 0),
        node(2, 13, "page-2b", TaskState::Suspended, 1),
    ];
    deliver(
        &mut app,
        tag,
        WatchUpdate::Task {
            task: task_info(),
            output: Vec::new(),
            tree,
            tree_truncated: true,
        },
    );
    insta::assert_snapshot!("task_tree", screen(&app, 100, 22).backend());
}

#[test]
fn task_screen_shows_lease_progress_payload_and_timeline() {
    let mut app = started(false);
    on_queue_tab(&mut app, 2, TaskState::Leased, 1..3);
    let tag = watched(&press(&mut app, KeyCode::Enter), View::Task { task: id(1) });
    deliver(&mut app, tag, task_screen(task_info()));
    insta::assert_snapshot!("task", screen(&app, 80, 24).backend());
    assert_eq!(press(&mut app, KeyCode::Char('r')), vec![]);
    assert_eq!(
        app.message,
        Some((Level::Error, "the task is not dead".into()))
    );
    press(&mut app, KeyCode::Char('c'));
    assert_eq!(app.mode, Mode::Confirm(Verb::Cancel(id(1))));
    press(&mut app, KeyCode::Esc);
    // Esc goes back to the tab it came from.
    let tag = watched(
        &press(&mut app, KeyCode::Esc),
        tasks_view(TaskState::Leased, None),
    );
    assert!(tag > 0);
}

#[test]
fn members_screen_and_drain() {
    let mut app = started(false);
    let tag = watched(
        &chars(&mut app, ":members\n"),
        View::Members {
            after: None,
            limit: Some(PAGE_ROWS),
        },
    );
    let member =
        |name: &str, labels: &[&str], leased: u64, state: MemberState, draining: bool| MemberInfo {
            name: name.into(),
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            capacity: 4,
            leased,
            connected: state == MemberState::Connected,
            state,
            liveness_ms: 5_000,
            draining,
            subscribed: vec!["inference".into()],
            last_seen_ms: Some(NOW - 3 * SEC),
        };
    deliver(
        &mut app,
        tag,
        WatchUpdate::Members {
            members: vec![
                member("gpu-1", &["gpu", "a100"], 4, MemberState::Connected, false),
                member("gpu-2", &["gpu"], 2, MemberState::Connected, true),
                member("cpu-9", &[], 1, MemberState::Gone, true),
                member("cpu-4", &[], 2, MemberState::Unreachable, false),
            ],
            connected: 2,
            next: None,
        },
    );
    insta::assert_snapshot!("members", screen(&app, 80, 24).backend());
    press(&mut app, KeyCode::Char('d'));
    assert_eq!(app.mode, Mode::Confirm(Verb::Drain("gpu-1".into())));
    assert_eq!(
        press(&mut app, KeyCode::Char('y')),
        vec![Effect::Run(Verb::Drain("gpu-1".into()))]
    );
    // The filter narrows the rows to those that match.
    chars(&mut app, "fa100");
    assert_eq!(app.rows().len(), 1);
    press(&mut app, KeyCode::Enter);
    assert_eq!(app.rows().len(), 1);
    press(&mut app, KeyCode::Esc);
    assert_eq!(app.rows().len(), 4);
    // Enter opens a member with the tasks it holds: revoke one, or drain the member.
    let tag = watched(
        &press(&mut app, KeyCode::Enter),
        View::Member {
            member: "gpu-1".into(),
        },
    );
    deliver(
        &mut app,
        tag,
        WatchUpdate::Member {
            member: member("gpu-1", &["gpu", "a100"], 2, MemberState::Connected, false),
            leases: vec![
                task(4, "inference", TaskState::Leased),
                task(5, "emails", TaskState::Leased),
            ],
        },
    );
    insta::assert_snapshot!("member", screen(&app, 80, 24).backend());
    press(&mut app, KeyCode::Char('j'));
    press(&mut app, KeyCode::Char('v'));
    assert_eq!(app.mode, Mode::Confirm(Verb::Revoke(id(5))));
    press(&mut app, KeyCode::Esc);
    press(&mut app, KeyCode::Char('d'));
    assert_eq!(app.mode, Mode::Confirm(Verb::Drain("gpu-1".into())));
    press(&mut app, KeyCode::Esc);
    watched(&press(&mut app, KeyCode::Enter), View::Task { task: id(5) });
}

#[test]
fn dead_letters_screen() {
    let mut app = started(false);
    let tag = watched(
        &chars(&mut app, ":dead\n"),
        View::Dead {
            after: None,
            limit: Some(PAGE_ROWS),
        },
    );
    deliver(
        &mut app,
        tag,
        WatchUpdate::Dead {
            tasks: vec![
                task(1, "emails", TaskState::Dead),
                task(2, "inference", TaskState::Dead),
                task(3, "inference", TaskState::Dead),
            ],
            total: 3,
            next: None,
        },
    );
    insta::assert_snapshot!("dead", screen(&app, 80, 24).backend());
    // Marks across queues are refused: a redrive names one queue.
    press(&mut app, KeyCode::Char(' '));
    press(&mut app, KeyCode::Char('j'));
    press(&mut app, KeyCode::Char(' '));
    assert_eq!(press(&mut app, KeyCode::Char('r')), vec![]);
    assert_eq!(app.mode, Mode::Normal);
    assert_eq!(
        app.message,
        Some((
            Level::Error,
            "marked tasks are in several queues: mark one queue's at a time".into()
        ))
    );
    // Enter opens the task; Esc comes back to the dead letters.
    let tag = watched(&press(&mut app, KeyCode::Enter), View::Task { task: id(2) });
    assert!(tag > 0);
}

#[test]
fn help_lists_every_key_of_the_screen() {
    let mut app = started(false);
    press(&mut app, KeyCode::Char('?'));
    assert_eq!(app.mode, Mode::Help);
    insta::assert_snapshot!("help", screen(&app, 80, 24).backend());
    // Any key closes help and does nothing else.
    assert_eq!(press(&mut app, KeyCode::Char('q')), vec![]);
    assert_eq!((app.mode.clone(), app.quit), (Mode::Normal, false));
    press(&mut app, KeyCode::Char('q'));
    assert!(app.quit);
}

#[test]
fn commands_and_their_errors() {
    let mut app = started(false);
    assert_eq!(chars(&mut app, ":frobnicate\n"), vec![]);
    assert_eq!(
        app.message,
        Some((
            Level::Error,
            "unknown command \"frobnicate\": try :queues, :members, :dead, :limits, :schedules, :cluster, :queue NAME [STATE], :task ID, :q".into()
        ))
    );
    watched(
        &chars(&mut app, ":queue emails\n"),
        View::Tasks {
            queue: "emails".into(),
            state: TaskState::Ready,
            after: None,
            limit: Some(PAGE_ROWS),
        },
    );
    // Esc from a jumped-to screen returns to the queues.
    watched(&press(&mut app, KeyCode::Esc), queues_view());
    assert_eq!(
        press(&mut app, KeyCode::Esc),
        vec![],
        "nowhere further back"
    );
    chars(&mut app, ":q\n");
    assert!(app.quit);
}

#[test]
fn stale_and_gone_updates() {
    let mut app = started(false);
    on_queue_tab(&mut app, 0, TaskState::Ready, 1..3);
    let before = text(&app);
    // A push of a replaced watch is dropped.
    deliver(&mut app, 1, queues_update());
    assert_eq!(text(&app), before);
    // The queue was deleted: back to the queues, saying why.
    let current = current_tag(&mut app);
    let back = app.on_watch(WatchReply {
        tag: current,
        disk_alarm: false,
        update: WatchUpdate::Gone {
            error: ErrorBody::new(ErrorCode::NotFound, "no queue \"inference\""),
        },
    });
    watched(&back.into_iter().collect::<Vec<_>>(), queues_view());
    assert_eq!(
        app.message,
        Some((Level::Error, "gone: no queue \"inference\"".into()))
    );
}

#[test]
fn small_and_resized_terminals_render() {
    let mut app = started(false);
    on_queue_tab(&mut app, 4, TaskState::Dead, 1..4);
    insta::assert_snapshot!("queue_dead_60x16", screen(&app, 60, 16).backend());
    let mut terminal = screen(&app, 80, 24);
    terminal.backend_mut().resize(120, 30);
    terminal
        .draw(|f| ui::render(&app, f))
        .expect("drawing after a resize");
    let area = terminal.backend().buffer().area;
    assert_eq!((area.width, area.height), (120, 30));
    let wide = terminal.backend().to_string();
    assert_eq!(wide.lines().count(), 30);
    // The error column takes the room a wide terminal gives: the traceback mark shows.
    assert!(wide.contains("CUDA out of memory …"));
}

#[test]
fn rates_fall_to_zero_when_nothing_happens() {
    let mut app = started(false);
    emails_at(&mut app, NOW + 2 * SEC, 10, 0);
    assert_eq!(app.rate("emails").0, 5.0);
    // No push means no change: the rate decays as the window moves on, to nothing.
    app.now_ms = NOW + 10 * SEC;
    assert_eq!(app.rate("emails").0, 1.0);
    app.now_ms = NOW + 13 * SEC;
    assert_eq!(app.rate("emails").0, 0.0);
}

#[test]
fn the_selection_and_the_marks_follow_the_tasks_as_rows_move() {
    let mut app = started(false);
    on_queue_tab(&mut app, 4, TaskState::Dead, 2..5);
    press(&mut app, KeyCode::Char('j'));
    press(&mut app, KeyCode::Char(' '));
    assert_eq!(app.page().selected, 1);
    // An older task died (it sorts first) and task 4 was redriven elsewhere.
    let tag = current_tag(&mut app);
    deliver(&mut app, tag, tasks_update(TaskState::Dead, 1..4, None));
    assert_eq!(app.page().selected, 2, "still on task 3");
    assert_eq!(app.page().marked.iter().collect::<Vec<_>>(), [&id(3)]);
    // The one task is named in the confirm.
    press(&mut app, KeyCode::Char('r'));
    match &app.mode {
        Mode::Confirm(verb) => assert_eq!(
            verb.question(),
            format!("Redrive dead task {} of inference?", id(3))
        ),
        other => panic!("{other:?}"),
    }
    press(&mut app, KeyCode::Esc);
    // Task 3 goes too: its mark goes, and r falls back to the selected row.
    deliver(&mut app, tag, tasks_update(TaskState::Dead, 1..3, None));
    assert!(app.page().marked.is_empty());
    assert_eq!(app.page().selected, 1);
    press(&mut app, KeyCode::Char('x'));
    match &app.mode {
        Mode::Confirm(verb) => assert_eq!(
            verb.question(),
            format!("Discard dead task {} of inference for good?", id(2))
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_page_on_its_way_takes_no_keys_and_is_not_followed_twice() {
    let mut app = started(false);
    press(&mut app, KeyCode::Char('j'));
    let tag = watched(
        &press(&mut app, KeyCode::Enter),
        tasks_view(TaskState::Ready, None),
    );
    deliver(
        &mut app,
        tag,
        tasks_update(TaskState::Ready, 1..3, Some(id(2))),
    );
    watched(
        &press(&mut app, KeyCode::Char(']')),
        tasks_view(TaskState::Ready, Some(id(2))),
    );
    // Until page 2 arrives: no second `]`, no moves, no verbs on rows that are gone.
    assert_eq!(press(&mut app, KeyCode::Char(']')), vec![]);
    assert_eq!(press(&mut app, KeyCode::Char('j')), vec![]);
    assert_eq!(press(&mut app, KeyCode::Char('c')), vec![]);
    assert_eq!(app.mode, Mode::Normal);
    assert_eq!(app.page().number(), 2);
    assert!(text(&app).contains("loading"));
}

#[test]
fn the_task_screen_scrolls_within_its_lines() {
    let mut app = started(false);
    let tag = watched(
        &chars(&mut app, &format!(":task {}\n", id(1))),
        View::Task { task: id(1) },
    );
    deliver(&mut app, tag, task_screen(task_info()));
    let lines = detail::task_lines(&task_info(), detail::TaskExtras::default(), NOW, false).len();
    for _ in 0..500 {
        press(&mut app, KeyCode::Char('j'));
    }
    assert_eq!(app.page().selected, lines - 1);
    press(&mut app, KeyCode::Char('k'));
    assert_eq!(app.page().selected, lines - 2);
}

#[test]
fn a_first_screen_the_token_may_not_watch_says_why() {
    let (mut app, first) = App::new("127.0.0.1:7420".into(), false, NOW);
    let tag = watched(&[first], queues_view());
    let error = "forbidden: token \"ci\" lacks the role admin".to_owned();
    assert_eq!(app.on_watch_failed(tag, error.clone()), None);
    assert_eq!(app.load_error, Some(error));
    assert!(text(&app).contains("cannot show this screen: forbidden: token \"ci\" lacks"));
}

#[test]
fn a_task_discarded_from_its_own_screen_goes_back_saying_so() {
    let mut app = started(false);
    on_queue_tab(&mut app, 4, TaskState::Dead, 1..3);
    let tag = watched(&press(&mut app, KeyCode::Enter), View::Task { task: id(1) });
    let mut dead = task_info();
    dead.state = TaskState::Dead;
    dead.lease = None;
    dead.dead_reason = Some("max_attempts".into());
    deliver(&mut app, tag, task_screen(dead));
    assert_eq!(app.keys()[..2], [("r", "redrive"), ("x", "discard")]);
    press(&mut app, KeyCode::Char('x'));
    match press(&mut app, KeyCode::Char('y')).as_slice() {
        [Effect::Run(Verb::Dead(DeadAction::Discard, t))] => assert_eq!(t.ids, [id(1)]),
        other => panic!("{other:?}"),
    }
    let effect = app.on_done(Ok("discarded 1 task of inference".into()), true);
    watched(effect.as_slice(), tasks_view(TaskState::Dead, None));
    assert_eq!(
        app.message,
        Some((Level::Info, "discarded 1 task of inference".into()))
    );
}

#[test]
fn a_queue_opens_on_the_tab_its_command_names() {
    let mut app = started(false);
    watched(
        &chars(&mut app, ":queue inference dead\n"),
        tasks_view(TaskState::Dead, None),
    );
    assert_eq!(chars(&mut app, ":queue inference stuck\n"), vec![]);
    assert_eq!(
        app.message,
        Some((
            Level::Error,
            "unknown state in \"queue inference stuck\": ready, scheduled, leased, dead, done or cancelled".into()
        ))
    );
}

#[test]
fn marks_are_for_dead_tasks_and_survive_a_filter() {
    let mut app = started(false);
    on_queue_tab(&mut app, 0, TaskState::Ready, 1..3);
    press(&mut app, KeyCode::Char(' '));
    assert!(
        app.page().marked.is_empty(),
        "nothing to mark for on the ready tab"
    );
    let mut app = started(false);
    on_queue_tab(&mut app, 4, TaskState::Dead, 1..3);
    press(&mut app, KeyCode::Char(' '));
    chars(&mut app, "fzzz\n");
    let tag = current_tag(&mut app);
    deliver(&mut app, tag, tasks_update(TaskState::Dead, 1..3, None));
    assert_eq!(app.page().marked.iter().collect::<Vec<_>>(), [&id(1)]);
    assert!(text(&app).contains("no row of this page matches /zzz"));
}

#[test]
fn the_disk_alarm_is_flagged_in_the_title_while_the_daemon_says_so() {
    let mut app = started(false);
    let tag = current_tag(&mut app);
    let alarm = |on| WatchReply {
        tag,
        update: queues_update(),
        disk_alarm: on,
    };
    assert_eq!(app.on_watch(alarm(true)), None);
    assert!(text(&app).contains("disk alarm: enqueues refused"));
    assert_eq!(app.on_watch(alarm(false)), None);
    assert!(!text(&app).contains("disk alarm"));
}

#[test]
fn a_lost_connection_is_flagged_in_the_title() {
    let mut app = started(false);
    app.connected = false;
    assert!(text(&app).contains("disconnected: what is shown may be stale"));
}

/// The one search the effects ask for, and its tag.
fn searched(effects: &[Effect]) -> (TaskFind, u64) {
    match effects {
        [Effect::Find { search, tag }] => (*search.clone(), *tag),
        other => panic!("expected one search, got {other:?}"),
    }
}

fn cursor(n: u32) -> FindCursor {
    FindCursor {
        queue: "inference".into(),
        id: id(n),
    }
}

#[test]
fn slash_searches_the_whole_queue_and_goes_on_until_a_page_is_full() {
    let mut app = started(false);
    on_queue_tab(&mut app, 2, TaskState::Leased, 1..3);
    // Typing shows in the footer; enter searches the queue, newest first.
    chars(&mut app, "/error:timeout key:user-4");
    assert_eq!(app.mode, Mode::Search("error:timeout key:user-4".into()));
    insta::assert_snapshot!("search_typing", screen(&app, 80, 24).backend());
    let (search, tag) = searched(&press(&mut app, KeyCode::Enter));
    assert_eq!(
        search,
        TaskFind {
            queue: Some("inference".into()),
            error: Some("timeout".into()),
            key: Some("user-4".into()),
            newest_first: true,
            limit: Some(PAGE_ROWS),
            ..TaskFind::default()
        }
    );
    insta::assert_snapshot!("search_waiting", screen(&app, 80, 24).backend());
    // A reply that stopped at the daemon's bound: the console asks for more at once.
    let more = app.on_found(
        tag,
        Ok(TaskFindReply {
            tasks: vec![task(4, "inference", TaskState::Dead)],
            next: Some(cursor(4)),
            scanned: 20_000,
        }),
    );
    let (next, next_tag) = searched(&more.into_iter().collect::<Vec<_>>());
    assert_eq!(next_tag, tag);
    assert_eq!(next.after, Some(cursor(4)));
    assert_eq!(next.limit, Some(PAGE_ROWS - 1));
    // A stale reply (an older search) is dropped.
    assert_eq!(
        app.on_found(
            tag - 1,
            Ok(TaskFindReply {
                tasks: vec![],
                next: None,
                scanned: 1
            })
        ),
        None
    );
    let done = app.on_found(
        tag,
        Ok(TaskFindReply {
            tasks: vec![task(2, "inference", TaskState::Leased)],
            next: None,
            scanned: 7_000,
        }),
    );
    assert_eq!(done, None);
    assert_eq!(app.rows().len(), 2);
    insta::assert_snapshot!("search_found", screen(&app, 80, 24).backend());
    insta::assert_snapshot!("search_found_200x50", screen(&app, 200, 50).backend());
    // The results act like a list: move, open a task, revoke a leased one.
    press(&mut app, KeyCode::Char('j'));
    press(&mut app, KeyCode::Char('v'));
    assert_eq!(app.mode, Mode::Confirm(Verb::Revoke(id(2))));
    press(&mut app, KeyCode::Esc);
    let opened = press(&mut app, KeyCode::Enter);
    watched(&opened, View::Task { task: id(2) });
    // Back on the results, the search runs again from where its page began.
    let (again, _) = searched(&press(&mut app, KeyCode::Esc));
    assert_eq!(again.after, None);
    assert!(app.keys().contains(&("/", "search queue")));
}

#[test]
fn search_words_and_their_errors() {
    let q = || Some("jobs".to_owned());
    let ok = |text: &str| search_query(q(), text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(ok("01kA").id_prefix.as_deref(), Some("01kA"));
    assert_eq!(ok("timeout").payload.as_deref(), Some("timeout"));
    assert_eq!(ok("state:dead").state, Some(TaskState::Dead));
    assert_eq!(
        ok("idem:o-1 label:gpu").idempotency_key.as_deref(),
        Some("o-1")
    );
    assert_eq!(
        ok("field:order.id=42").field.map(|f| (f.path, f.value)),
        Some(("order.id".to_owned(), serde_json::json!(42)))
    );
    assert_eq!(
        ok("field:who=ann").field.map(|f| f.value),
        Some(serde_json::json!("ann"))
    );
    for bad in ["", "state:sleepy", "colour:red", "key:", "field:nopath"] {
        assert!(search_query(q(), bad).is_err(), "{bad:?}");
    }
    // A bad search says why in the footer and changes nothing.
    let mut app = started(false);
    assert_eq!(chars(&mut app, "/state:sleepy\n"), vec![]);
    assert_eq!(
        app.message,
        Some((Level::Error, "unknown state \"sleepy\"".into()))
    );
    assert_eq!(app.stack.len(), 1);
    // Every queue from the queues screen; a page of results pages on with ].
    let (search, tag) = searched(&chars(&mut app, "/payload:x\n"));
    assert_eq!(search.queue, None);
    let full: Vec<TaskSummary> = (0..PAGE_ROWS)
        .map(|n| task(n, "inference", TaskState::Ready))
        .collect();
    assert_eq!(
        app.on_found(
            tag,
            Ok(TaskFindReply {
                tasks: full,
                next: Some(cursor(0)),
                scanned: 5
            })
        ),
        None
    );
    let (page2, _) = searched(&press(&mut app, KeyCode::Char(']')));
    assert_eq!(page2.after, Some(cursor(0)));
    assert_eq!(app.page().number(), 2);
    let (page1, _) = searched(&press(&mut app, KeyCode::Char('[')));
    assert_eq!(page1.after, None);
}

#[test]
fn a_search_words_text_runs_to_the_next_word_spaces_and_all() {
    // The parts: bare text is one phrase, each word's text runs to the next word.
    assert_eq!(search_words("timed out"), Ok(vec![("", "timed out")]));
    assert_eq!(
        search_words("  error:timed  out   state:dead "),
        Ok(vec![("error", "timed  out"), ("state", "dead")])
    );
    assert_eq!(
        search_words("no reply error: refused by host:443 key:a b"),
        Ok(vec![
            ("", "no reply"),
            ("error", "refused by host:443"),
            ("key", "a b")
        ])
    );
    assert_eq!(
        search_words("error:a error:b"),
        Err("error: is given twice".into())
    );
    assert_eq!(
        search_words("error: state:dead"),
        Err("nothing after error:".into())
    );
    assert_eq!(
        search_words("colour:red car"),
        Err("unknown search word colour: (? lists them)".into())
    );
    // The searches they make.
    let q = || Some("jobs".to_owned());
    let ok = |text: &str| search_query(q(), text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(
        ok("error:timed out"),
        TaskFind {
            queue: q(),
            error: Some("timed out".into()),
            newest_first: true,
            limit: Some(PAGE_ROWS),
            ..TaskFind::default()
        }
    );
    assert_eq!(
        ok("timed out state:dead"),
        TaskFind {
            queue: q(),
            payload: Some("timed out".into()),
            state: Some(TaskState::Dead),
            newest_first: true,
            limit: Some(PAGE_ROWS),
            ..TaskFind::default()
        }
    );
    assert_eq!(
        ok("field:user.name = Ann Lee")
            .field
            .map(|f| (f.path, f.value)),
        Some(("user.name".to_owned(), serde_json::json!("Ann Lee")))
    );
    assert_eq!(ok("01KA").id_prefix.as_deref(), Some("01KA"));
    assert_eq!(ok("01KA 02").payload.as_deref(), Some("01KA 02"));
    for (bad, why) in [
        ("state:dead now", "unknown state \"dead now\""),
        ("id:01 02", "an id prefix has no spaces: \"01 02\""),
        (
            "big payload:x",
            "payload text is given twice (bare text is payload text)",
        ),
    ] {
        assert_eq!(search_query(q(), bad), Err(why.to_owned()), "{bad:?}");
    }
    // Typed after `/`: the search and its title hold the whole text.
    let mut app = started(false);
    on_queue_tab(&mut app, 4, TaskState::Dead, 1..3);
    let (search, _) = searched(&chars(&mut app, "/error:timed out\n"));
    assert_eq!(search.error.as_deref(), Some("timed out"));
    assert_eq!(search.payload, None);
    assert!(
        text(&app).contains("Search inference for error:timed out "),
        "{}",
        text(&app)
    );
}

#[test]
fn a_quick_filter_is_one_phrase_or_the_search_words_of_the_rows() {
    let mut app = started(false);
    on_queue_tab(&mut app, 4, TaskState::Dead, 1..1);
    let tag = current_tag(&mut app);
    let errors = [
        "Timed out after 30s",
        "timed out again",
        "connection refused: timed out",
        "timed\nout",
    ];
    let mut update = tasks_update(TaskState::Dead, 1..5, None);
    if let WatchUpdate::Tasks { tasks, .. } = &mut update {
        for (t, e) in tasks.iter_mut().zip(errors) {
            t.last_error = Some(e.into());
        }
    }
    deliver(&mut app, tag, update);
    let shown = |app: &App| -> Vec<String> {
        app.rows()
            .iter()
            .map(|r| match r {
                super::rows::Row::Task(t) => t.id.clone(),
                _ => panic!("a task row"),
            })
            .collect()
    };
    chars(&mut app, "ftimed out\n");
    assert_eq!(shown(&app), [id(1), id(2), id(3)]);
    assert!(text(&app).contains("filter timed out "));
    press(&mut app, KeyCode::Esc);
    chars(&mut app, "ferror:timed out key:user-\n");
    assert_eq!(shown(&app), [id(2)]);
    press(&mut app, KeyCode::Esc);
    chars(&mut app, "ferror:TIMED OUT\n");
    assert_eq!(shown(&app), [id(1), id(2), id(3)]);
    press(&mut app, KeyCode::Esc);
    chars(&mut app, "fkey:user-4 error:out\n");
    assert_eq!(shown(&app), [id(4)]);
    press(&mut app, KeyCode::Esc);
    // Words no row carries are text, as typed.
    chars(&mut app, "fpayload:x\n");
    assert_eq!(shown(&app), Vec::<String>::new());
}

#[test]
fn capital_g_reaches_the_real_end_and_n_shows_the_newest_first() {
    let mut app = started(false);
    on_queue_tab(&mut app, 0, TaskState::Ready, 0..2);
    // One page and no more: G is its last row.
    assert_eq!(press(&mut app, KeyCode::Char('G')), vec![]);
    assert_eq!(app.page().selected, 1);
    // With more pages, G asks where the last page starts…
    let tag = current_tag(&mut app);
    deliver(
        &mut app,
        tag,
        tasks_update(TaskState::Ready, 0..100, Some(id(99))),
    );
    let (search, end_tag) = searched(&press(&mut app, KeyCode::Char('G')));
    assert_eq!(
        search,
        TaskFind {
            queue: Some("inference".into()),
            state: Some(TaskState::Ready),
            newest_first: true,
            limit: Some(PAGE_ROWS + 1),
            ..TaskFind::default()
        }
    );
    // …the newest 101 tasks: the oldest of them is the cursor of the last page.
    let newest: Vec<TaskSummary> = (0..=PAGE_ROWS)
        .rev()
        .map(|n| task(100_000 + n, "inference", TaskState::Ready))
        .collect();
    let effect = app.on_found(
        end_tag,
        Ok(TaskFindReply {
            tasks: newest,
            next: Some(cursor(100_000)),
            scanned: 101,
        }),
    );
    let tag = watched(
        &effect.into_iter().collect::<Vec<_>>(),
        tasks_view(TaskState::Ready, Some(id(100_000))),
    );
    deliver(
        &mut app,
        tag,
        tasks_update(TaskState::Ready, 100_001..100_101, None),
    );
    assert_eq!(app.page().selected, 99, "the last row of the last page");
    assert_eq!(app.page().number(), 2);
    // n: the same tab, newest first; n again goes back.
    let (search, _) = searched(&press(&mut app, KeyCode::Char('n')));
    assert_eq!(
        (search.state, search.newest_first, search.queue.as_deref()),
        (Some(TaskState::Ready), true, Some("inference"))
    );
    let back = press(&mut app, KeyCode::Char('n'));
    watched(&back, tasks_view(TaskState::Ready, Some(id(100_000))));
}

#[test]
fn numbers_are_abbreviated_and_text_is_cut_with_an_ellipsis() {
    let cases = [
        (0, "0"),
        (2002, "2002"),
        (9_999, "9999"),
        (10_000, "10.0k"),
        (51_234, "51.2k"),
        (99_960, "100k"),
        (100_000, "100k"),
        (1_260_000, "1.3M"),
        (u64::MAX, "18446744074G"),
    ];
    for (n, want) in cases {
        assert_eq!(ui::count(n), want, "{n}");
    }
    assert_eq!(ui::fit("inference", 9), "inference");
    assert_eq!(ui::fit("inference", 6), "infer…");
    assert_eq!(ui::fit("日本語のキュー", 7), "日本語…");
    assert_eq!(ui::fit("x", 0), "…");
}

#[test]
fn a_queue_with_ready_work_and_no_consumer_is_stuck_and_says_why() {
    let mut app = started(false);
    // emails: 12 ready, no consumer; inference: 2 consumers.
    let queues = text(&app);
    let row = |name: &str| {
        queues
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no {name} row:\n{queues}"))
            .to_owned()
    };
    assert!(row("emails").contains("stuck"), "{queues}");
    assert!(
        row("inference").contains("100k") && row("inference").contains("active"),
        "{queues}"
    );
    insta::assert_snapshot!("queues_200x50", screen(&app, 200, 50).backend());
    press(&mut app, KeyCode::Enter);
    let tag = current_tag(&mut app);
    deliver(
        &mut app,
        tag,
        WatchUpdate::Tasks {
            queue: queue("emails", [0, 12, 3, 880, 0, 0], false),
            state: TaskState::Ready,
            tasks: (0..3)
                .map(|n| task(n, "emails", TaskState::Ready))
                .collect(),
            next: None,
        },
    );
    let screen_text = text(&app);
    assert!(
        screen_text.contains("0 consumers · stuck: ready work and no consumer"),
        "{screen_text}"
    );
    // Tasks waiting for a limit's room are counted apart from those held back.
    let mut limited = queue("emails", [0, 12, 3, 880, 0, 0], false);
    (limited.held_back, limited.waiting_on_limits) = (2, 5);
    deliver(
        &mut app,
        tag,
        WatchUpdate::Tasks {
            queue: limited,
            state: TaskState::Ready,
            tasks: (0..3)
                .map(|n| task(n, "emails", TaskState::Ready))
                .collect(),
            next: None,
        },
    );
    let wide = screen(&app, 200, 50).backend().to_string();
    assert!(
        wide.contains(" · held back 2 · waiting on limits 5"),
        "{wide}"
    );
}

#[test]
fn purge_delete_and_copy_name_their_target() {
    let mut app = started(false);
    // The selected queue is emails: 12 ready, 0 scheduled, 895 tasks in all.
    press(&mut app, KeyCode::Char('P'));
    assert_eq!(app.mode, Mode::Confirm(Verb::Purge("emails".into(), 12)));
    insta::assert_snapshot!("confirm_purge", screen(&app, 80, 24).backend());
    assert_eq!(
        press(&mut app, KeyCode::Char('y')),
        vec![Effect::Run(Verb::Purge("emails".into(), 12))]
    );
    press(&mut app, KeyCode::Char('D'));
    assert_eq!(
        app.mode,
        Mode::Confirm(Verb::DeleteQueue("emails".into(), 895))
    );
    assert_eq!(
        Verb::DeleteQueue("emails".into(), 895).question(),
        "Delete queue emails and its 895 tasks for good?"
    );
    // Any other key: nothing done.
    assert_eq!(press(&mut app, KeyCode::Char('n')), vec![]);
    assert_eq!(app.message, Some((Level::Info, "nothing done".into())));
    // reports has nothing to purge: said, not asked.
    press(&mut app, KeyCode::Char('j'));
    press(&mut app, KeyCode::Char('j'));
    assert_eq!(press(&mut app, KeyCode::Char('P')), vec![]);
    assert_eq!(app.mode, Mode::Normal);
    assert_eq!(
        app.message,
        Some((
            Level::Error,
            "queue reports has no ready or scheduled tasks".into()
        ))
    );
    // y copies what is selected; read-only consoles copy too, but never purge.
    let mut ro = started(true);
    assert_eq!(
        press(&mut ro, KeyCode::Char('y')),
        vec![Effect::Copy {
            text: "emails".into(),
            what: "emails".into()
        }]
    );
    assert_eq!(press(&mut ro, KeyCode::Char('P')), vec![]);
    assert_eq!(ro.mode, Mode::Normal);
    ro.say(Ok("copied emails".into()));
    assert_eq!(ro.message, Some((Level::Info, "copied emails".into())));
}

#[test]
fn tab_completes_commands_queue_names_and_states() {
    let mut app = started(false);
    let typed = |app: &mut App, text: &str| {
        press(app, KeyCode::Char(':'));
        chars(app, text);
        press(app, KeyCode::Tab);
        let Mode::Command(now) = app.mode.clone() else {
            panic!("still typing a command: {:?}", app.mode)
        };
        press(app, KeyCode::Esc);
        now
    };
    assert_eq!(typed(&mut app, "mem"), "members ");
    assert_eq!(typed(&mut app, "cl"), "cluster ");
    assert_eq!(typed(&mut app, "qu"), "qu", "queue, queues and quit");
    assert_eq!(typed(&mut app, "que"), "queue", "queue and queues share it");
    assert_eq!(typed(&mut app, "queue inf"), "queue inference ");
    assert_eq!(typed(&mut app, "queue e"), "queue emails ");
    assert_eq!(typed(&mut app, "queue emails de"), "queue emails dead ");
    assert_eq!(
        typed(&mut app, "queue emails d"),
        "queue emails d",
        "dead and done"
    );
    assert_eq!(typed(&mut app, "frob"), "frob");
    assert_eq!(typed(&mut app, "task 01"), "task 01");
    // Completed, then entered: the command runs.
    press(&mut app, KeyCode::Char(':'));
    chars(&mut app, "queue inf");
    press(&mut app, KeyCode::Tab);
    let effects = press(&mut app, KeyCode::Enter);
    watched(&effects, tasks_view(TaskState::Ready, None));
}

#[test]
fn e_edits_a_dead_tasks_payload_and_requeues_it_after_a_confirm() {
    let mut app = started(false);
    on_queue_tab(&mut app, 4, TaskState::Dead, 1..3);
    let tag = watched(&press(&mut app, KeyCode::Enter), View::Task { task: id(1) });
    // Before the task arrives there is nothing to edit, and the footer says so.
    assert_eq!(press(&mut app, KeyCode::Char('e')), vec![]);
    assert_eq!(
        app.message,
        Some((
            Level::Error,
            "the task has not arrived yet; try again in a moment".to_owned()
        ))
    );
    let mut dead = task_info();
    dead.state = TaskState::Dead;
    dead.lease = None;
    deliver(&mut app, tag, task_screen(dead.clone()));
    let requeue = match press(&mut app, KeyCode::Char('e')).as_slice() {
        [Effect::Edit(Draft::Requeue(r))] => r.clone(),
        other => panic!("expected an edit, got {other:?}"),
    };
    assert_eq!(
        (
            requeue.id.as_str(),
            requeue.queue.as_str(),
            requeue.priority,
            requeue.key.clone()
        ),
        (
            dead.id.as_str(),
            dead.queue.as_str(),
            dead.priority,
            dead.key.clone()
        )
    );
    let shown: serde_json::Value = serde_json::from_str(&requeue.payload).unwrap();
    let stored: serde_json::Value = serde_json::from_str(dead.payload.get()).unwrap();
    assert_eq!(shown, stored, "the editor gets the payload, laid out");
    assert_eq!(Draft::Requeue(requeue.clone()).text(), requeue.payload);
    // Unchanged, not JSON, or a failed editor: nothing happens, and the footer says so.
    let draft = || Draft::Requeue(requeue.clone());
    app.on_edited(draft(), Ok(requeue.payload.clone()));
    assert_eq!(app.mode, Mode::Normal);
    assert_eq!(
        app.message,
        Some((Level::Info, "payload unchanged: nothing done".into()))
    );
    app.on_edited(draft(), Ok("{oops".into()));
    assert_eq!(app.mode, Mode::Normal);
    assert!(
        matches!(&app.message, Some((Level::Error, m)) if m.contains("is not JSON")),
        "{:?}",
        app.message
    );
    app.on_edited(draft(), Err("\"false\" exited with exit status: 1".into()));
    assert_eq!(app.mode, Mode::Normal);
    // Edited: the confirm names the queue and the dead task; y runs it.
    app.on_edited(draft(), Ok("{\"prompt\":\"fixed\"}\n".into()));
    let want = Verb::Requeue(Requeue {
        payload: "{\"prompt\":\"fixed\"}".into(),
        ..requeue
    });
    assert_eq!(app.mode, Mode::Confirm(want.clone()));
    insta::assert_snapshot!("confirm_requeue", screen(&app, 80, 24).backend());
    assert_eq!(press(&mut app, KeyCode::Char('y')), vec![Effect::Run(want)]);
    // Only dead tasks, and never read-only.
    let mut ro = started(true);
    assert_eq!(press(&mut ro, KeyCode::Char('e')), vec![]);
}

#[test]
fn the_timeline_shows_each_attempts_length_and_times_of_day_on_t() {
    let mut app = started(false);
    on_queue_tab(&mut app, 2, TaskState::Leased, 1..3);
    let tag = watched(&press(&mut app, KeyCode::Enter), View::Task { task: id(1) });
    deliver(&mut app, tag, task_screen(task_info()));
    let ages = text(&app);
    assert!(ages.contains("gpu-3 #2 running 1m"), "{ages}");
    press(&mut app, KeyCode::Char('t'));
    assert!(app.absolute_times);
    let times = screen(&app, 200, 50).backend().to_string();
    assert!(
        times.contains("2027-01-15T07:46:40.000Z  leased           gpu-1 #1 ran 11m"),
        "{times}"
    );
    insta::assert_snapshot!("task_times_200x50", screen(&app, 200, 50).backend());
    press(&mut app, KeyCode::Char('t'));
    assert!(!app.absolute_times);
}

#[test]
fn s_sorts_the_pages_rows_by_each_column_and_capital_s_reverses() {
    let mut app = started(false);
    let names = |app: &App| -> Vec<String> {
        app.rows()
            .iter()
            .map(|r| match r {
                super::rows::Row::Queue(q) => q.name.clone(),
                _ => panic!("a queue row"),
            })
            .collect()
    };
    press(&mut app, KeyCode::Char('s'));
    assert_eq!(app.sorted_by(), Some(("name", false)));
    press(&mut app, KeyCode::Char('S'));
    assert_eq!(names(&app), ["reports", "inference", "emails"]);
    press(&mut app, KeyCode::Char('s'));
    assert_eq!(app.sorted_by(), Some(("ready", false)));
    assert_eq!(names(&app), ["reports", "emails", "inference"]);
    press(&mut app, KeyCode::Char('S'));
    assert_eq!(names(&app), ["inference", "emails", "reports"]);
    insta::assert_snapshot!("queues_sorted", screen(&app, 80, 24).backend());
    // The selection acts on the row shown where it is: the first is inference now.
    press(&mut app, KeyCode::Char('p'));
    assert_eq!(app.mode, Mode::Confirm(Verb::Pause("inference".into())));
    press(&mut app, KeyCode::Esc);
    // Past the last column, back to the daemon's order.
    for _ in 0..7 {
        press(&mut app, KeyCode::Char('s'));
    }
    assert_eq!(app.sorted_by(), None);
    assert_eq!(names(&app), ["emails", "inference", "reports"]);
}

#[test]
fn the_leased_tab_sorts_by_holder_running_time_and_expiry() {
    let mut app = started(false);
    on_queue_tab(&mut app, 2, TaskState::Leased, 1..1);
    let tag = current_tag(&mut app);
    // (holder, running since, expires)
    let leases = [
        ("gpu-b", NOW - 30 * SEC, NOW + 5 * SEC),
        ("gpu-c", NOW - 90 * SEC, NOW + 50 * SEC),
        ("gpu-a", NOW - 10 * SEC, NOW + 20 * SEC),
    ];
    let mut update = tasks_update(TaskState::Leased, 1..4, None);
    if let WatchUpdate::Tasks { tasks, .. } = &mut update {
        for (t, (member, since, expires)) in tasks.iter_mut().zip(leases) {
            t.updated_ms = since;
            t.lease = Some(LeaseInfo {
                member: member.into(),
                epoch: 1,
                expires_ms: expires,
            });
        }
    }
    deliver(&mut app, tag, update);
    let order = |app: &App| -> Vec<String> {
        app.rows()
            .iter()
            .map(|r| match r {
                super::rows::Row::Task(t) => t.lease.as_ref().expect("leased").member.clone(),
                _ => panic!("a task row"),
            })
            .collect()
    };
    // `s` steps through the columns shown, left to right; `S` reverses.
    let mut steps = Vec::new();
    loop {
        press(&mut app, KeyCode::Char('s'));
        let Some((column, false)) = app.sorted_by() else {
            break;
        };
        steps.push((column, order(&app)));
        if column == "holder" {
            assert!(text(&app).contains("· by holder ↑"), "{}", text(&app));
            press(&mut app, KeyCode::Char('S'));
            assert_eq!(app.sorted_by(), Some(("holder", true)));
            assert_eq!(order(&app), ["gpu-c", "gpu-b", "gpu-a"]);
        }
    }
    let by = |names: [&str; 3]| names.map(String::from).to_vec();
    assert_eq!(
        steps,
        [
            ("id", by(["gpu-b", "gpu-c", "gpu-a"])),
            ("holder", by(["gpu-a", "gpu-b", "gpu-c"])),
            ("attempts", by(["gpu-b", "gpu-c", "gpu-a"])),
            // The longest running first, then the soonest to expire.
            ("running", by(["gpu-c", "gpu-b", "gpu-a"])),
            ("expires", by(["gpu-b", "gpu-a", "gpu-c"])),
            ("progress", by(["gpu-b", "gpu-c", "gpu-a"])),
        ]
    );
    // Every task table sorts by the columns it shows.
    let names = |app: &App| {
        let rows = app.rows();
        rows.first()
            .map(|r| r.sort_columns(&app.page().screen))
            .unwrap_or_default()
    };
    let shown = [
        (
            TaskState::Ready,
            "ID PRI KEY ATT FAIL AGE",
            "id priority key attempts failures age",
        ),
        (
            TaskState::Scheduled,
            "ID PRI KEY FAIL DUE",
            "id priority key failures due",
        ),
        (
            TaskState::Leased,
            "ID HOLDER ATT RUNNING EXPIRES PROGRESS",
            "id holder attempts running expires progress",
        ),
        (
            TaskState::Dead,
            "ID ATT DIED REASON ERROR",
            "id attempts died reason error",
        ),
    ];
    for (state, header, columns) in shown {
        let mut app = started(false);
        let tab = TABS.iter().position(|s| *s == state).expect("a tab");
        on_queue_tab(&mut app, tab, state, 1..3);
        let screen = text(&app);
        let words: Vec<&str> = header.split(' ').collect();
        let line = screen
            .lines()
            .find(|l| l.contains(" ID "))
            .unwrap_or_else(|| panic!("{state:?}: no header in {screen}"));
        assert_eq!(
            line.split(|c: char| c.is_whitespace() || c == '│' || c == '"')
                .filter(|w| !w.is_empty())
                .collect::<Vec<_>>(),
            words,
            "{state:?}"
        );
        assert_eq!(names(&app).join(" "), columns, "{state:?}");
    }
}

#[test]
fn the_title_names_the_daemons_version() {
    let mut app = started(false);
    app.server = "musterd 1.2.3".into();
    let title = text(&app).lines().next().unwrap_or_default().to_owned();
    assert!(title.contains("127.0.0.1:7420  musterd 1.2.3"), "{title}");
}

#[test]
fn the_title_names_a_clusters_leader_and_term() {
    let mut app = started(false);
    app.server = "musterd 1.2.3".into();
    let title = |app: &App| text(app).lines().next().unwrap_or_default().to_owned();
    assert!(!title(&app).contains("leader"), "{}", title(&app));
    let mut cluster = muster_protocol::ops::ClusterHello {
        cluster_id: "prod".into(),
        node: 2,
        term: 7,
        leader: Some(1),
        leader_addr: Some("10.0.0.1:7420".into()),
    };
    app.cluster = Some(cluster.clone());
    assert!(
        title(&app).contains("musterd 1.2.3  leader: node 1, term 7 "),
        "{}",
        title(&app)
    );
    cluster.leader = None;
    app.cluster = Some(cluster);
    assert!(
        title(&app).contains(" no leader, term 7 "),
        "{}",
        title(&app)
    );
}

/// The screen at 80×24 and at 200×50, each against its snapshot (`NAME`, `NAME_200x50`).
fn snapshots(name: &str, app: &App) {
    insta::assert_snapshot!(name.to_owned(), screen(app, 80, 24).backend());
    insta::assert_snapshot!(format!("{name}_200x50"), screen(app, 200, 50).backend());
}

/// A member as the members screen shows it.
fn member(
    name: &str,
    labels: &[&str],
    leased: u64,
    state: MemberState,
    draining: bool,
) -> MemberInfo {
    MemberInfo {
        name: name.into(),
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        capacity: 4,
        leased,
        connected: state == MemberState::Connected,
        state,
        liveness_ms: 5_000,
        draining,
        subscribed: vec!["inference".into()],
        last_seen_ms: Some(NOW - u64::from(name.len() as u32) * SEC),
    }
}

/// The console on the members screen: gpu-1 connected, gpu-2 draining.
fn on_members(readonly: bool) -> App {
    let mut app = started(readonly);
    let tag = watched(
        &chars(&mut app, ":members\n"),
        View::Members {
            after: None,
            limit: Some(PAGE_ROWS),
        },
    );
    deliver(
        &mut app,
        tag,
        WatchUpdate::Members {
            members: vec![
                member("gpu-1", &["gpu"], 4, MemberState::Connected, false),
                member("gpu-2", &["gpu"], 2, MemberState::Connected, true),
                member("cpu-long-9", &[], 0, MemberState::Gone, true),
            ],
            connected: 2,
            next: None,
        },
    );
    app
}

#[test]
fn a_enqueues_a_payload_written_in_the_editor_after_a_confirm() {
    let mut app = started(false);
    let draft = match press(&mut app, KeyCode::Char('a')).as_slice() {
        [Effect::Edit(d)] => d.clone(),
        other => panic!("expected an edit, got {other:?}"),
    };
    assert_eq!(
        draft,
        Draft::Enqueue {
            queue: "emails".into()
        }
    );
    assert_eq!(draft.text(), NEW_PAYLOAD);
    // Empty, not JSON, or a failed editor: nothing is enqueued, and the footer says why.
    app.on_edited(draft.clone(), Ok("  \n".into()));
    assert_eq!(app.mode, Mode::Normal);
    assert_eq!(
        app.message,
        Some((Level::Error, "the payload is empty: nothing done".into()))
    );
    app.on_edited(draft.clone(), Ok("{\"to\":".into()));
    assert_eq!(app.mode, Mode::Normal);
    assert!(
        matches!(&app.message, Some((Level::Error, m)) if m.starts_with("the payload is not JSON (")),
        "{:?}",
        app.message
    );
    app.on_edited(
        draft.clone(),
        Err("\"vi\" exited with exit status: 1".into()),
    );
    assert_eq!(
        app.message,
        Some((
            Level::Error,
            "editing: \"vi\" exited with exit status: 1".into()
        ))
    );
    // The template as it is is a payload too: `{}`.
    app.on_edited(draft.clone(), Ok(NEW_PAYLOAD.into()));
    assert_eq!(
        app.mode,
        Mode::Confirm(Verb::Enqueue {
            queue: "emails".into(),
            payload: "{}".into()
        })
    );
    app.mode = Mode::Normal;
    app.on_edited(draft, Ok("{\"to\":\"ops@example.com\"}\n".into()));
    let want = Verb::Enqueue {
        queue: "emails".into(),
        payload: "{\"to\":\"ops@example.com\"}".into(),
    };
    assert_eq!(app.mode, Mode::Confirm(want.clone()));
    snapshots("confirm_enqueue", &app);
    assert_eq!(press(&mut app, KeyCode::Char('y')), vec![Effect::Run(want)]);
    // From a queue's screen, its queue; never read-only, never elsewhere.
    on_queue_tab(&mut app, 0, TaskState::Ready, 1..3);
    assert_eq!(
        press(&mut app, KeyCode::Char('a')),
        vec![Effect::Edit(Draft::Enqueue {
            queue: "inference".into()
        })]
    );
    let mut ro = started(true);
    assert_eq!(press(&mut ro, KeyCode::Char('a')), vec![]);
    let mut members = on_members(false);
    assert_eq!(press(&mut members, KeyCode::Char('a')), vec![]);
}

#[test]
fn o_edits_a_queues_options_and_confirms_only_what_changed() {
    let mut app = started(false);
    on_queue_tab(&mut app, 0, TaskState::Ready, 1..3);
    let draft = match press(&mut app, KeyCode::Char('o')).as_slice() {
        [Effect::Edit(d)] => d.clone(),
        other => panic!("expected an edit, got {other:?}"),
    };
    let options = QueueOptions::default();
    assert_eq!(
        draft,
        Draft::Options {
            queue: "inference".into(),
            options: options.clone()
        }
    );
    let text = draft.text();
    assert!(text.contains("\"lease_ms\": 30000,"), "{text}");
    assert!(text.contains("\"max_runtime_ms\": null,"), "{text}");
    // Unchanged, unreadable, or naming an unknown option: nothing done.
    app.on_edited(draft.clone(), Ok(text.clone()));
    assert_eq!(
        app.message,
        Some((Level::Info, "options unchanged: nothing done".into()))
    );
    app.on_edited(draft.clone(), Ok("{\"lease\": 5}".into()));
    assert_eq!(app.mode, Mode::Normal);
    assert!(
        matches!(&app.message, Some((Level::Error, m)) if m.starts_with("the edited options are not valid (unknown field `lease`")),
        "{:?}",
        app.message
    );
    let edited = text
        .replace("\"lease_ms\": 30000", "\"lease_ms\": 60000")
        .replace("\"max_runtime_ms\": null", "\"max_runtime_ms\": 600000");
    app.on_edited(draft, Ok(edited));
    let want = Verb::UpdateQueue(QueueChange {
        queue: "inference".into(),
        patch: QueuePatch {
            lease_ms: Some(60_000),
            max_runtime_ms: Some(600_000),
            ..QueuePatch::default()
        },
        changes: vec![
            "lease_ms 30000 → 60000".into(),
            "max_runtime_ms none → 600000".into(),
        ],
    });
    assert_eq!(app.mode, Mode::Confirm(want.clone()));
    snapshots("confirm_queue_options", &app);
    assert_eq!(press(&mut app, KeyCode::Char('y')), vec![Effect::Run(want)]);
}

#[test]
fn queue_changes_remove_a_runtime_bound_and_keep_what_is_left_out() {
    let shown = QueueOptions {
        max_runtime_ms: Some(5_000),
        ..QueueOptions::default()
    };
    let edited = QueuePatch {
        max_attempts: Some(5),
        paused: Some(true),
        ..QueuePatch::default()
    };
    let (patch, changes) = super::changes::queue_changes(&shown, &edited);
    assert_eq!(
        patch,
        QueuePatch {
            max_runtime_ms: Some(0),
            paused: Some(true),
            ..QueuePatch::default()
        }
    );
    assert_eq!(
        changes,
        ["max_runtime_ms 5000 → none", "paused false → true"]
    );
}

#[test]
fn plus_minus_and_capital_n_change_priority_and_run_now_after_a_confirm() {
    let mut app = started(false);
    on_queue_tab(&mut app, 0, TaskState::Ready, 1..4);
    // Task 1 has priority 1.
    press(&mut app, KeyCode::Char('+'));
    let raise = Verb::Priority {
        id: id(1),
        from: 1,
        to: 2,
    };
    assert_eq!(app.mode, Mode::Confirm(raise.clone()));
    snapshots("confirm_priority", &app);
    assert_eq!(
        press(&mut app, KeyCode::Char('y')),
        vec![Effect::Run(raise)]
    );
    press(&mut app, KeyCode::Char('-'));
    assert_eq!(
        app.mode,
        Mode::Confirm(Verb::Priority {
            id: id(1),
            from: 1,
            to: 0
        })
    );
    press(&mut app, KeyCode::Esc);
    // Task 3 has priority 0: nothing lower.
    press(&mut app, KeyCode::Char('j'));
    press(&mut app, KeyCode::Char('j'));
    assert_eq!(press(&mut app, KeyCode::Char('-')), vec![]);
    assert_eq!(app.mode, Mode::Normal);
    assert_eq!(
        app.message,
        Some((
            Level::Error,
            format!("task {} has priority 0, the lowest", id(3))
        ))
    );
    // A ready task does not wait for its time.
    press(&mut app, KeyCode::Char('N'));
    assert_eq!(
        app.message,
        Some((Level::Error, "only a scheduled task waits to run".into()))
    );
    // A scheduled one runs now, after a confirm naming it.
    let mut app = started(false);
    on_queue_tab(&mut app, 1, TaskState::Scheduled, 1..3);
    press(&mut app, KeyCode::Char('N'));
    assert_eq!(app.mode, Mode::Confirm(Verb::RunNow(id(1))));
    snapshots("confirm_run_now", &app);
    // A leased task keeps its priority.
    let mut app = started(false);
    on_queue_tab(&mut app, 2, TaskState::Leased, 1..3);
    press(&mut app, KeyCode::Char('+'));
    assert_eq!(app.mode, Mode::Normal);
    assert_eq!(
        app.message,
        Some((
            Level::Error,
            "only a ready or scheduled task gets a new priority or runs now".into()
        ))
    );
    // The task screen acts on its task; the highest priority goes no higher.
    let tag = watched(&press(&mut app, KeyCode::Enter), View::Task { task: id(1) });
    let mut t = task_info();
    t.state = TaskState::Scheduled;
    t.lease = None;
    t.priority = 9;
    deliver(&mut app, tag, task_screen(t));
    press(&mut app, KeyCode::Char('+'));
    assert_eq!(
        app.message,
        Some((
            Level::Error,
            format!("task {} has priority 9, the highest", id(1))
        ))
    );
    press(&mut app, KeyCode::Char('-'));
    assert_eq!(
        app.mode,
        Mode::Confirm(Verb::Priority {
            id: id(1),
            from: 9,
            to: 8
        })
    );
    press(&mut app, KeyCode::Esc);
    press(&mut app, KeyCode::Char('N'));
    assert_eq!(app.mode, Mode::Confirm(Verb::RunNow(id(1))));
    // Read-only: none of it.
    let mut ro = started(true);
    on_queue_tab(&mut ro, 0, TaskState::Ready, 1..4);
    for key in ['+', '-', 'N', 'o'] {
        assert_eq!(press(&mut ro, KeyCode::Char(key)), vec![]);
        assert_eq!(ro.mode, Mode::Normal);
    }
}

#[test]
fn u_undrains_a_draining_member_after_a_confirm() {
    let mut app = on_members(false);
    snapshots("members_undrain", &app);
    press(&mut app, KeyCode::Char('u'));
    assert_eq!(app.mode, Mode::Normal);
    assert_eq!(
        app.message,
        Some((Level::Error, "member gpu-1 is not draining".into()))
    );
    press(&mut app, KeyCode::Char('j'));
    press(&mut app, KeyCode::Char('u'));
    assert_eq!(app.mode, Mode::Confirm(Verb::Undrain("gpu-2".into())));
    snapshots("confirm_undrain", &app);
    assert_eq!(
        press(&mut app, KeyCode::Char('y')),
        vec![Effect::Run(Verb::Undrain("gpu-2".into()))]
    );
    // On a member's own screen, that member.
    let tag = watched(
        &press(&mut app, KeyCode::Enter),
        View::Member {
            member: "gpu-2".into(),
        },
    );
    deliver(
        &mut app,
        tag,
        WatchUpdate::Member {
            member: member("gpu-2", &["gpu"], 0, MemberState::Connected, true),
            leases: vec![],
        },
    );
    press(&mut app, KeyCode::Char('u'));
    assert_eq!(app.mode, Mode::Confirm(Verb::Undrain("gpu-2".into())));
    let mut ro = on_members(true);
    press(&mut ro, KeyCode::Char('j'));
    assert_eq!(press(&mut ro, KeyCode::Char('u')), vec![]);
    assert_eq!(ro.mode, Mode::Normal);
}

#[test]
fn n_on_the_members_puts_the_last_seen_first() {
    let mut app = on_members(false);
    let names = |app: &App| -> Vec<String> {
        app.rows()
            .iter()
            .map(|r| match r {
                super::rows::Row::Member(m) => m.name.clone(),
                _ => panic!("a member row"),
            })
            .collect()
    };
    assert_eq!(names(&app), ["gpu-1", "gpu-2", "cpu-long-9"]);
    press(&mut app, KeyCode::Char('n'));
    assert_eq!(app.sorted_by(), Some(("last seen", true)));
    // Seen 5 s, 5 s and 10 s ago: the most recent first, ties in the daemon's order.
    assert_eq!(names(&app), ["gpu-1", "gpu-2", "cpu-long-9"]);
    press(&mut app, KeyCode::Char('S'));
    assert_eq!(names(&app), ["cpu-long-9", "gpu-1", "gpu-2"]);
    press(&mut app, KeyCode::Char('n'));
    assert_eq!(app.sorted_by(), Some(("last seen", true)));
    press(&mut app, KeyCode::Char('n'));
    assert_eq!(app.sorted_by(), None);
}

/// The dead letters with two errors in two queues.
fn dead_by_error(app: &mut App) {
    let tag = watched(
        &chars(app, ":dead\n"),
        View::Dead {
            after: None,
            limit: Some(PAGE_ROWS),
        },
    );
    let mut tasks: Vec<TaskSummary> = (1..=5)
        .map(|n| {
            task(
                n,
                if n == 5 { "emails" } else { "inference" },
                TaskState::Dead,
            )
        })
        .collect();
    tasks[1].last_error = Some("HTTP 502 from upstream".into());
    tasks[1].updated_ms = NOW - 7 * SEC;
    tasks[4].last_error = Some("HTTP 502 from upstream".into());
    deliver(
        app,
        tag,
        WatchUpdate::Dead {
            tasks,
            total: 5,
            next: None,
        },
    );
}

#[test]
fn capital_e_groups_dead_letters_by_error_and_acts_on_a_group() {
    let mut app = started(false);
    dead_by_error(&mut app);
    press(&mut app, KeyCode::Char('E'));
    assert!(app.page().grouped);
    let groups: Vec<(String, usize, Vec<String>)> = app
        .rows()
        .into_iter()
        .map(|r| match r {
            super::rows::Row::Group(g) => (g.error, g.ids.len(), g.queues),
            _ => panic!("a group row"),
        })
        .collect();
    assert_eq!(
        groups,
        [
            (
                "CUDA out of memory".to_owned(),
                3,
                vec!["inference".to_owned()]
            ),
            (
                "HTTP 502 from upstream".to_owned(),
                2,
                vec!["emails".to_owned(), "inference".to_owned()]
            ),
        ]
    );
    snapshots("dead_grouped", &app);
    // A group of one queue is redriven or discarded whole, by its ids.
    press(&mut app, KeyCode::Char('x'));
    let verb = Verb::Dead(
        DeadAction::Discard,
        DeadTasks {
            queue: "inference".into(),
            ids: vec![id(1), id(3), id(4)],
            all: false,
            count: 3,
        },
    );
    assert_eq!(app.mode, Mode::Confirm(verb.clone()));
    assert_eq!(press(&mut app, KeyCode::Char('y')), vec![Effect::Run(verb)]);
    // One across queues is opened first.
    press(&mut app, KeyCode::Char('j'));
    assert_eq!(press(&mut app, KeyCode::Char('r')), vec![]);
    assert_eq!(
        app.message,
        Some((
            Level::Error,
            "the error's tasks are in several queues: open it (enter) and mark one queue's".into()
        ))
    );
    // Enter lists the group's tasks: the page filtered by its error.
    assert_eq!(press(&mut app, KeyCode::Enter), vec![]);
    assert!(!app.page().grouped);
    assert_eq!(app.page().filter, "HTTP 502 from upstream");
    let ids: Vec<String> = app
        .rows()
        .iter()
        .map(|r| match r {
            super::rows::Row::Task(t) => t.id.clone(),
            _ => panic!("a task row"),
        })
        .collect();
    assert_eq!(ids, [id(2), id(5)]);
    // Esc clears the filter; E and esc group and ungroup.
    press(&mut app, KeyCode::Esc);
    assert_eq!(app.rows().len(), 5);
    press(&mut app, KeyCode::Char('E'));
    assert_eq!(app.rows().len(), 2);
    press(&mut app, KeyCode::Esc);
    assert!(!app.page().grouped);
    assert_eq!(app.rows().len(), 5);
    // Only dead lists group.
    let mut other = started(false);
    press(&mut other, KeyCode::Char('E'));
    assert!(!other.page().grouped);
}

#[test]
fn n_on_the_dead_letters_searches_them_newest_first() {
    let mut app = started(false);
    dead_by_error(&mut app);
    let (search, _) = searched(&press(&mut app, KeyCode::Char('n')));
    assert_eq!(
        (search.queue, search.state, search.newest_first),
        (None, Some(TaskState::Dead), true)
    );
    watched(
        &press(&mut app, KeyCode::Char('n')),
        View::Dead {
            after: None,
            limit: Some(PAGE_ROWS),
        },
    );
}

/// `emails` at `at` with its ready count, totals moved on by `enqueued` and `acked`.
fn emails_ready_at(app: &mut App, at: u64, enqueued: u64, acked: u64, ready: u64) {
    app.now_ms = at;
    let mut q = queue("emails", [0, ready, 3, 880, 0, 0], false);
    q.totals.enqueued += enqueued;
    q.totals.acked += acked;
    deliver(
        app,
        1,
        WatchUpdate::Queues {
            queues: vec![q],
            next: None,
        },
    );
}

#[test]
fn trends_follow_the_totals_second_by_second() {
    let mut app = started(false);
    emails_ready_at(&mut app, NOW + SEC, 5, 2, 15);
    // Two pushes in one second: the later stands for it.
    emails_ready_at(&mut app, NOW + 3 * SEC, 8, 3, 16);
    emails_ready_at(&mut app, NOW + 3 * SEC + 500, 10, 4, 18);
    let t = app.trend("emails");
    assert_eq!(t.enqueued.len(), TREND_SECONDS);
    let tail = |v: &[Option<u64>]| v[TREND_SECONDS - 4..].to_vec();
    // The first sample (at NOW) has nothing before it to count from.
    assert_eq!(tail(&t.enqueued), [None, Some(5), Some(0), Some(5)]);
    assert_eq!(tail(&t.acked), [None, Some(2), Some(0), Some(2)]);
    assert_eq!(tail(&t.ready), [Some(12), Some(15), Some(15), Some(18)]);
    // Before it, nothing is known.
    assert!(t.ready[..TREND_SECONDS - 4].iter().all(Option::is_none));
    // A quiet second repeats the ready count; two minutes on, the burst is gone.
    app.now_ms = NOW + 4 * SEC;
    assert_eq!(
        tail(&app.trend("emails").ready),
        [Some(15), Some(15), Some(18), Some(18)]
    );
    emails_ready_at(&mut app, NOW + 200 * SEC, 10, 4, 1);
    let t = app.trend("emails");
    assert!(t.enqueued.iter().all(|v| *v == Some(0)), "{t:?}");
    assert_eq!(t.ready[0], Some(18));
    assert_eq!(t.ready[TREND_SECONDS - 1], Some(1));
    // A queue never seen has no trend.
    assert_eq!(app.trend("nowhere").ready, vec![None; TREND_SECONDS]);
}

#[test]
fn text_sparklines_scale_to_their_highest_and_keep_the_newest() {
    let known = |v: &[u64]| v.iter().map(|v| Some(*v)).collect::<Vec<_>>();
    assert_eq!(ui::spark(&known(&[0, 1, 2, 3, 4, 5, 6, 7]), 8), "▁▂▃▄▅▆▇█");
    assert_eq!(ui::spark(&[Some(0); TREND_SECONDS], 15), "▁".repeat(15));
    // 120 seconds in 15 bars: each the highest of its 8 seconds; unknown ones blank.
    let mut values = vec![Some(0); TREND_SECONDS];
    values[TREND_SECONDS - 1] = Some(40);
    values[10] = Some(20);
    values[..8].fill(None);
    assert_eq!(ui::spark(&values, 15), " ▅▁▁▁▁▁▁▁▁▁▁▁▁█");
    assert_eq!(ui::spark(&values, 0), "");
}

#[test]
fn wide_screens_show_trends_and_narrow_ones_leave_them_out() {
    let mut app = started(false);
    emails_ready_at(&mut app, NOW + SEC, 5, 2, 15);
    emails_ready_at(&mut app, NOW + 3 * SEC, 10, 4, 18);
    let queues = app.rows().len();
    assert_eq!(queues, 1);
    snapshots("queues_trends", &app);
    let wide = screen(&app, 200, 50).backend().to_string();
    assert!(wide.contains("IN 2m"), "{wide}");
    // The thresholds README gives are the terminal's columns, borders included.
    for (columns, ready, in_out) in [
        (119, false, false),
        (120, true, false),
        (159, true, false),
        (160, true, true),
    ] {
        let shown = screen(&app, columns, 30).backend().to_string();
        assert_eq!(
            (shown.contains("READY 2m"), shown.contains("IN 2m")),
            (ready, in_out),
            "at {columns} columns: {shown}"
        );
    }
    assert!(!text(&app).contains("2m"));
    // The queue screen draws its sparklines when tall enough.
    press(&mut app, KeyCode::Enter);
    let tag = current_tag(&mut app);
    app.now_ms = NOW + 4 * SEC;
    let mut q = queue("emails", [0, 18, 3, 880, 0, 0], false);
    q.totals.enqueued += 10;
    q.totals.acked += 4;
    deliver(
        &mut app,
        tag,
        WatchUpdate::Tasks {
            queue: q,
            state: TaskState::Ready,
            tasks: (1..3)
                .map(|n| task(n, "emails", TaskState::Ready))
                .collect(),
            next: None,
        },
    );
    snapshots("queue_trends", &app);
    assert!(
        screen(&app, 200, 50)
            .backend()
            .to_string()
            .contains("in/s   max     5")
    );
    assert!(!text(&app).contains("in/s   max"));
}

#[test]
fn the_title_shows_uptime_members_and_fsync_latency() {
    let mut app = started(false);
    app.server = "musterd 1.2.3".into();
    let stats = |syncs: u64, total_us: u64| ServerStatsReply {
        syncs,
        synced_requests: syncs * 3,
        durability: "sync".into(),
        disk_alarm: false,
        uptime_ms: 2 * 3600 * SEC + 5 * SEC,
        members_connected: 3,
        fsync_last_us: 900,
        fsync_total_us: total_us,
    };
    app.on_stats(Ok(stats(10, 8_000)));
    assert_eq!(
        app.facts,
        Some(DaemonFacts {
            uptime_ms: 2 * 3600 * SEC + 5 * SEC,
            members: 3,
            fsync_us: 900
        })
    );
    // The mean over the span since the last reading: 10 persists in 12 ms.
    app.on_stats(Ok(stats(20, 20_000)));
    assert_eq!(app.facts.map(|f| f.fsync_us), Some(1_200));
    snapshots("title_facts", &app);
    let title = text(&app).lines().next().unwrap_or_default().to_owned();
    assert!(title.contains("up 2h · 3 members · fsync 1.2ms"), "{title}");
    // Nothing persisted since: the latest persist's time.
    app.on_stats(Ok(stats(20, 20_000)));
    assert_eq!(app.facts.map(|f| f.fsync_us), Some(900));
    // A token that may not read them: the title goes without.
    app.on_stats(Err("forbidden: token \"jobs\" lacks the role admin".into()));
    assert_eq!(app.facts, None);
    assert!(!text(&app).contains("members ·"));
}

#[test]
fn help_lists_the_new_verbs_of_each_screen() {
    let has = |app: &App, key: &str| app.keys().iter().any(|(k, _)| *k == key);
    let app = started(false);
    assert!(has(&app, "a") && has(&app, "o"));
    let mut app = started(false);
    on_queue_tab(&mut app, 1, TaskState::Scheduled, 1..3);
    assert!(has(&app, "+ -") && has(&app, "N") && has(&app, "a") && has(&app, "o"));
    press(&mut app, KeyCode::Char('?'));
    snapshots("help_scheduled", &app);
    let mut app = started(false);
    on_queue_tab(&mut app, 4, TaskState::Dead, 1..3);
    assert!(has(&app, "E") && !has(&app, "N"));
    let app = on_members(false);
    assert!(has(&app, "u") && has(&app, "n"));
    let app = on_members(true);
    assert!(!has(&app, "u"));
}

/// What node `node` of cluster `prod` says of itself: nodes 1 to 3 vote, node 4 learns;
/// `matched` is what it knows of each (the leader's knowledge), `None` for a follower.
fn node_status(
    node: u64,
    role: &str,
    log: u64,
    applied: u64,
    snapshot: Option<u64>,
    matched: [Option<u64>; 4],
) -> ClusterStatusReply {
    ClusterStatusReply {
        cluster_id: "prod".into(),
        node,
        role: role.into(),
        term: 7,
        leader: Some(1),
        last_log_index: Some(log),
        last_applied: Some(applied),
        snapshot_index: snapshot,
        members: (1..=4)
            .zip(matched)
            .map(|(n, matched)| ClusterMember {
                node: n,
                addr: format!("10.0.0.{n}:7420"),
                cluster_addr: format!("10.0.0.{n}:7421"),
                voter: n != 4,
                matched,
            })
            .collect(),
    }
}

/// The leader's answer: node 2 holds its whole log, node 3 is 14 entries behind, of
/// node 4 it knows nothing yet.
fn leader_status() -> ClusterStatusReply {
    node_status(
        1,
        "leader",
        1204,
        1204,
        Some(1000),
        [Some(1204), Some(1204), Some(1190), None],
    )
}

/// A console on a cluster node, led by node 1 in term 7.
fn clustered() -> App {
    let mut app = started(false);
    app.cluster = Some(ClusterHello {
        cluster_id: "prod".into(),
        node: 1,
        term: 7,
        leader: Some(1),
        leader_addr: Some("10.0.0.1:7420".into()),
    });
    app
}

/// Opens the cluster screen with `:cluster`: no watch, a round of questions instead;
/// its tag.
fn open_cluster(app: &mut App) -> u64 {
    assert_eq!(chars(app, ":cluster\n"), vec![]);
    assert_eq!(app.page().screen, Screen::Cluster);
    let tag = app.cluster_request().expect("a round of questions");
    // One round at a time: none while the first is out, ticks or not.
    app.on_tick();
    assert_eq!(app.cluster_request(), None);
    tag
}

/// The cluster screen's rows as tuples: node, role, term, log, applied, lag, when last
/// heard from, snapshot, and whether the latest round failed.
type NodeFacts = (
    u64,
    String,
    Option<u64>,
    Option<u64>,
    Option<u64>,
    Option<u64>,
    Option<u64>,
    Option<u64>,
    bool,
);

fn node_facts(app: &App) -> Vec<NodeFacts> {
    app.nodes
        .as_ref()
        .expect("the cluster screen has its nodes")
        .rows()
        .into_iter()
        .map(|n| {
            (
                n.node,
                n.role,
                n.term,
                n.last_log,
                n.applied,
                n.lag,
                n.heard_ms,
                n.snapshot,
                n.error.is_some(),
            )
        })
        .collect()
}

/// The ids of the cluster screen's rows as shown (filtered and sorted).
fn node_ids(app: &App) -> Vec<String> {
    app.rows()
        .into_iter()
        .map(|r| match r {
            super::rows::Row::Node(n) => n.id,
            _ => panic!("a row of another screen"),
        })
        .collect()
}

#[test]
fn the_cluster_screen_shows_every_node_as_it_answers_itself() {
    let mut app = clustered();
    let tag = open_cluster(&mut app);
    assert!(text(&app).contains("asking every node…"), "{}", text(&app));
    app.on_cluster(
        tag,
        Ok(ClusterPoll {
            local: leader_status(),
            others: vec![
                (
                    2,
                    Ok(node_status(
                        2,
                        "follower",
                        1204,
                        1203,
                        Some(1000),
                        [None; 4],
                    )),
                ),
                (
                    3,
                    Ok(node_status(3, "follower", 1190, 1190, None, [None; 4])),
                ),
                (4, Err("no answer within 2 s".into())),
            ],
        }),
    );
    let f = |s: &str| s.to_owned();
    let at = Some(NOW);
    assert_eq!(
        node_facts(&app),
        vec![
            (
                1,
                f("leader"),
                Some(7),
                Some(1204),
                Some(1204),
                Some(0),
                at,
                Some(1000),
                false
            ),
            (
                2,
                f("follower"),
                Some(7),
                Some(1204),
                Some(1203),
                Some(0),
                at,
                Some(1000),
                false
            ),
            (
                3,
                f("follower"),
                Some(7),
                Some(1190),
                Some(1190),
                Some(14),
                at,
                None,
                false
            ),
            // Never heard from: the role its membership gives it, nothing else known.
            (4, f("learner"), None, None, None, None, None, None, true),
        ]
    );
    app.now_ms = NOW + 3 * SEC;
    snapshots("cluster", &app);
    // The tick during the round asks again once it came back, under the same tag.
    assert_eq!(app.cluster_request(), Some(tag));
    assert_eq!(app.cluster_request(), None);
    // Node 2 goes silent: it keeps what it said last, in red, with why; node 4 answers.
    app.now_ms = NOW + 4 * SEC;
    app.on_cluster(
        tag,
        Ok(ClusterPoll {
            local: node_status(
                1,
                "leader",
                1210,
                1210,
                Some(1000),
                [Some(1210), Some(1204), Some(1210), Some(1210)],
            ),
            others: vec![
                (2, Err("connection lost".into())),
                (
                    3,
                    Ok(node_status(3, "follower", 1210, 1210, None, [None; 4])),
                ),
                (
                    4,
                    Ok(node_status(4, "learner", 1210, 1209, None, [None; 4])),
                ),
            ],
        }),
    );
    // Nothing is asked before the next tick.
    assert_eq!(app.cluster_request(), None);
    let (then, now) = (Some(NOW), Some(NOW + 4 * SEC));
    assert_eq!(
        node_facts(&app),
        vec![
            (
                1,
                f("leader"),
                Some(7),
                Some(1210),
                Some(1210),
                Some(0),
                now,
                Some(1000),
                false
            ),
            (
                2,
                f("follower"),
                Some(7),
                Some(1204),
                Some(1203),
                Some(6),
                then,
                Some(1000),
                true
            ),
            (
                3,
                f("follower"),
                Some(7),
                Some(1210),
                Some(1210),
                Some(0),
                now,
                None,
                false
            ),
            (
                4,
                f("learner"),
                Some(7),
                Some(1210),
                Some(1209),
                Some(0),
                now,
                None,
                false
            ),
        ]
    );
    app.now_ms = NOW + 9 * SEC;
    let screen = text(&app);
    assert!(
        screen.contains("node 2 (10.0.0.2:7420) did not answer: connection lost"),
        "{screen}"
    );
    assert!(screen.contains("3 of 4 nodes answered"), "{screen}");
    assert!(
        screen.contains("│ 2    10.0.0.2:7420     follower  7     1204    1203    6     9s "),
        "{screen}"
    );
    // y copies the selected node's address; f filters by id, address or role.
    assert_eq!(
        press(&mut app, KeyCode::Char('y')),
        vec![Effect::Copy {
            text: "10.0.0.1:7420".into(),
            what: "the address of node 1".into()
        }]
    );
    chars(&mut app, "flearner\n");
    assert_eq!(node_ids(&app), ["4"]);
    press(&mut app, KeyCode::Esc);
    // s sorts by the columns shown: by contact, the longest silent first.
    for _ in 0..8 {
        press(&mut app, KeyCode::Char('s'));
    }
    assert_eq!(app.sorted_by(), Some(("contact", false)));
    assert_eq!(node_ids(&app), ["2", "1", "3", "4"]);
    // Only looking: no verbs, nothing to open or search.
    for key in ['p', 'd', 'u', 'c', 'v', 'x', 'r'] {
        assert_eq!(press(&mut app, KeyCode::Char(key)), vec![]);
        assert_eq!(app.mode, Mode::Normal, "{key} does nothing here");
    }
    assert_eq!(press(&mut app, KeyCode::Enter), vec![]);
    assert_eq!(press(&mut app, KeyCode::Char('/')), vec![]);
    assert_eq!(app.mode, Mode::Normal);
    let keys: Vec<&str> = app.keys().iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        [
            "↑↓ j/k",
            "g G",
            "f",
            "s S",
            "y",
            "L",
            "C",
            ":",
            "esc",
            "?",
            "q"
        ]
    );
    // Leaving: the queues again, and a round still out is dropped when it comes.
    app.on_tick();
    assert_eq!(app.cluster_request(), Some(tag));
    watched(&press(&mut app, KeyCode::Esc), queues_view());
    app.on_tick();
    assert_eq!(app.cluster_request(), None);
    app.on_cluster(
        tag,
        Ok(ClusterPoll {
            local: leader_status(),
            others: Vec::new(),
        }),
    );
    assert_eq!(app.nodes, None);
}

#[test]
fn the_cluster_screen_seen_from_a_follower_leaves_the_lag_to_the_leader() {
    let mut app = clustered();
    let tag = open_cluster(&mut app);
    app.on_cluster(
        tag,
        Ok(ClusterPoll {
            local: node_status(2, "follower", 1204, 1204, Some(1000), [None; 4]),
            others: vec![
                (1, Ok(leader_status())),
                (
                    3,
                    Ok(node_status(3, "follower", 1190, 1190, None, [None; 4])),
                ),
                (
                    4,
                    Ok(node_status(4, "learner", 1204, 1204, None, [None; 4])),
                ),
            ],
        }),
    );
    let lags: Vec<Option<u64>> = node_facts(&app).into_iter().map(|n| n.5).collect();
    assert_eq!(lags, [None; 4]);
    let screen = text(&app);
    assert!(
        screen.contains("as node 2 (follower) sees it: the lag is the leader's to know"),
        "{screen}"
    );
}

#[test]
fn the_cluster_screen_says_why_it_cannot_show_the_cluster() {
    // A token that may not read the cluster's status.
    let mut app = clustered();
    let tag = open_cluster(&mut app);
    app.on_cluster(
        tag,
        Err("forbidden: token \"jobs\" lacks the role admin".into()),
    );
    let screen = text(&app);
    assert!(
        screen.contains("cannot show this screen: forbidden: token \"jobs\" lacks the role"),
        "{screen}"
    );
    // Once shown, a failed round leaves the nodes as they were and says why below.
    assert_eq!(app.cluster_request(), Some(tag));
    app.on_cluster(
        tag,
        Ok(ClusterPoll {
            local: leader_status(),
            others: Vec::new(),
        }),
    );
    app.on_tick();
    assert_eq!(app.cluster_request(), Some(tag));
    app.on_cluster(tag, Err("connection lost".into()));
    assert_eq!(node_facts(&app).len(), 4);
    assert_eq!(
        app.message,
        Some((Level::Error, "cluster status: connection lost".into()))
    );
    // Disconnected: no questions until the connection is back, then at once (every
    // screen is watched again), under a new tag.
    app.connected = false;
    app.on_tick();
    assert_eq!(app.cluster_request(), None);
    app.connected = true;
    assert_eq!(app.rewatch(), None);
    assert_eq!(app.cluster_request(), Some(tag + 1));
}

#[test]
fn the_cluster_screen_of_a_single_daemon_says_it_is_not_clustered() {
    let mut app = started(false);
    let tag = open_cluster(&mut app);
    app.on_cluster(
        tag,
        Err("invalid_state: this daemon is not a cluster node (start it with --cluster-id to run a cluster)".into()),
    );
    // Asked once; a single daemon is not asked again every second.
    app.on_tick();
    assert_eq!(app.cluster_request(), None);
    insta::assert_snapshot!("cluster_single", screen(&app, 80, 24).backend());
    assert!(text(&app).contains("not clustered"));
}

/// The limits screen's view, as the console watches it.
fn limits_view(after: Option<&str>) -> View {
    View::Limits {
        after: after.map(str::to_owned),
        limit: Some(PAGE_ROWS),
    }
}

/// A key of a limit in use.
fn limit_key(
    key: &str,
    tokens: Option<u64>,
    held: u64,
    waiting: u64,
    full_in: Option<u64>,
    throttled_for: Option<u64>,
) -> LimitKeyInfo {
    LimitKeyInfo {
        key: key.into(),
        tokens,
        held,
        waiting,
        full_ms: full_in.map(|ms| NOW + ms),
        throttled_until_ms: throttled_for.map(|ms| NOW + ms),
    }
}

/// `openai`, 500 tokens a minute with its bucket half full and 3 of its 50 leases held;
/// `tenant-api`, per key, a token every second (at most 10) and two leases a key, with
/// three keys in use (`acme` empty, full and throttled).
fn limits_update(openai_tokens: u64) -> WatchUpdate {
    let openai = LimitInfo {
        name: "openai".into(),
        spec: LimitSpec {
            rate: Some(Rate {
                count: 500,
                per_ms: 60_000,
            }),
            burst: Some(500),
            concurrency: Some(50),
            per_key: false,
        },
        held: 3,
        waiting: 0,
        granted: 12_345,
        throttled: 2,
        keys_in_use: 1,
        keys: vec![limit_key(
            "",
            Some(openai_tokens),
            3,
            0,
            (openai_tokens < 500).then_some((500 - openai_tokens) * 120),
            None,
        )],
        created_ms: NOW - 3_600 * SEC,
        updated_ms: NOW - 3_600 * SEC,
    };
    let tenant = LimitInfo {
        name: "tenant-api".into(),
        spec: LimitSpec {
            rate: Some(Rate {
                count: 1,
                per_ms: 1_000,
            }),
            burst: Some(10),
            concurrency: Some(2),
            per_key: true,
        },
        held: 4,
        waiting: 5,
        granted: 880,
        throttled: 1,
        keys_in_use: 3,
        keys: vec![
            limit_key("acme", Some(0), 2, 5, Some(10 * SEC), Some(12 * SEC)),
            limit_key("globex", Some(7), 2, 0, Some(3 * SEC), None),
            limit_key("initech", Some(9), 0, 0, Some(SEC), None),
        ],
        created_ms: NOW - 600 * SEC,
        updated_ms: NOW - 60 * SEC,
    };
    WatchUpdate::Limits {
        limits: vec![openai, tenant],
        next: None,
    }
}

/// The console on the limits screen (opened with `L` from the queues), data delivered.
fn on_limits(readonly: bool) -> (App, u64) {
    let mut app = started(readonly);
    let tag = watched(&press(&mut app, KeyCode::Char('L')), limits_view(None));
    assert_eq!(app.page().screen, Screen::Limits);
    assert!(text(&app).contains("loading…"));
    deliver(&mut app, tag, limits_update(250));
    (app, tag)
}

/// The line of the 80×24 screen that holds `what`.
fn line_with(app: &App, what: &str) -> String {
    let text = text(app);
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(what)).collect();
    match lines.as_slice() {
        [one] => (*one).to_owned(),
        other => panic!("{} lines hold {what:?}: {other:?}", other.len()),
    }
}

#[test]
fn the_limits_screen_shows_every_limit_with_bars_and_the_busiest_keys_of_the_selected() {
    let (mut app, tag) = on_limits(false);
    insta::assert_snapshot!("limits", screen(&app, 80, 24).backend());
    // Tokens half the burst, leases 3 of 50; the one bucket below.
    assert_eq!(
        line_with(&app, "│›openai"),
        "\"│›openai     500/1m  no    3     0     1     12.3k 2     ██░ 250/500 █░░░░ 3/50│\""
    );
    assert_eq!(
        line_with(&app, "(all)"),
        "\"│ (all)    █████░░░░ 250/500 █░░░░░░░░░░ 3/50 0     full in 30s                │\""
    );
    press(&mut app, KeyCode::Char('j'));
    snapshots("limits_keys", &app);
    assert_eq!(
        line_with(&app, "acme"),
        "\"│ acme     ░░░░░░░░░░░░ 0/10 ████████████ 2/2 5     throttled 12s · full in 10s│\""
    );
    // A push a second later: the bucket refilled, nothing else moved; the selection
    // stays on its limit.
    deliver(&mut app, tag, limits_update(500));
    assert_eq!(app.page().selected, 1);
    press(&mut app, KeyCode::Char('k'));
    assert_eq!(
        line_with(&app, "│›openai"),
        "\"│›openai     500/1m  no    3     0     1     12.3k 2     ███ 500/500 █░░░░ 3/50│\""
    );
    assert!(
        !text(&app).contains("full in"),
        "a full bucket says nothing"
    );
    // `s` steps through the columns; the ninth sorts by tokens, the emptiest first.
    for _ in 0..9 {
        press(&mut app, KeyCode::Char('s'));
    }
    assert_eq!(app.sorted_by(), Some(("tokens", false)));
    let names: Vec<String> = app.rows().iter().map(|r| r.id().to_owned()).collect();
    assert_eq!(names, ["tenant-api", "openai"]);
    // The filter finds the limit a key is busy in, by any text or by `key:`.
    for filter in ["fglobex\n", "fkey:acme\n"] {
        chars(&mut app, filter);
        let names: Vec<String> = app.rows().iter().map(|r| r.id().to_owned()).collect();
        assert_eq!(names, ["tenant-api"], "{filter}");
        press(&mut app, KeyCode::Esc);
    }
    chars(&mut app, "fkey:openai\n");
    assert_eq!(app.rows().len(), 0, "a limit's name is not one of its keys");
    assert!(text(&app).contains("no row of this page matches /key:openai"));
    press(&mut app, KeyCode::Esc);
    // `y` copies the selected limit's name; no verb applies here.
    assert_eq!(
        press(&mut app, KeyCode::Char('y')),
        vec![Effect::Copy {
            text: "tenant-api".into(),
            what: "tenant-api".into(),
        }]
    );
    for key in ['p', 'D', 'P', 'R', 'a', 'd'] {
        assert_eq!(press(&mut app, KeyCode::Char(key)), vec![]);
        assert_eq!(app.mode, Mode::Normal, "{key} names no verb on the limits");
    }
    // An empty page says how to make a limit.
    deliver(
        &mut app,
        tag,
        WatchUpdate::Limits {
            limits: Vec::new(),
            next: None,
        },
    );
    assert!(text(&app).contains("no limits (muster limit set NAME …)"));
    // `]` asks for the page after the last limit shown.
    let (mut paged, tag) = on_limits(false);
    let WatchUpdate::Limits { limits, .. } = limits_update(250) else {
        unreachable!("limits_update is a limits page")
    };
    deliver(
        &mut paged,
        tag,
        WatchUpdate::Limits {
            limits,
            next: Some("tenant-api".into()),
        },
    );
    watched(
        &press(&mut paged, KeyCode::Char(']')),
        limits_view(Some("tenant-api")),
    );
}

#[test]
fn l_opens_the_limits_from_any_screen_and_esc_goes_back() {
    let mut app = started(false);
    assert!(app.keys().contains(&("L", "limits")));
    watched(&press(&mut app, KeyCode::Char('L')), limits_view(None));
    assert_eq!(app.stack.len(), 2);
    // Already there: `L` does nothing, and the help does not offer it.
    assert_eq!(press(&mut app, KeyCode::Char('L')), vec![]);
    assert!(!app.keys().iter().any(|(k, _)| *k == "L"));
    assert_eq!(app.stack.len(), 2);
    watched(&press(&mut app, KeyCode::Esc), queues_view());
    assert_eq!(app.page().screen, Screen::Queues);
    // From the members, and back to them.
    let members = View::Members {
        after: None,
        limit: Some(PAGE_ROWS),
    };
    watched(&chars(&mut app, ":members\n"), members.clone());
    watched(&press(&mut app, KeyCode::Char('L')), limits_view(None));
    watched(&press(&mut app, KeyCode::Esc), members);
    // `:limits` jumps there, and completes.
    watched(&chars(&mut app, ":limits\n"), limits_view(None));
    assert_eq!(app.stack.len(), 2);
    press(&mut app, KeyCode::Char(':'));
    chars(&mut app, "li");
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.mode, Mode::Command("limits ".into()));
    press(&mut app, KeyCode::Esc);
    // A read-only console looks at the limits too.
    let mut ro = started(true);
    watched(&press(&mut ro, KeyCode::Char('L')), limits_view(None));
    watched(&press(&mut ro, KeyCode::Esc), queues_view());
}

#[test]
fn the_suspended_tab_shows_what_each_task_asks_and_approves_with_data_or_rejects() {
    let mut app = started(false);
    on_queue_tab(&mut app, 3, TaskState::Suspended, 1..3);
    insta::assert_snapshot!("queue_suspended_tab", screen(&app, 80, 24).backend());
    let text = text(&app);
    assert!(text.contains("may I merge PR 1?"), "{text}");
    // `A` opens the editor with an approval; what is written is the resume's data.
    let draft = match press(&mut app, KeyCode::Char('A')).as_slice() {
        [Effect::Edit(d @ Draft::Resume { .. })] => d.clone(),
        other => panic!("expected an edit, got {other:?}"),
    };
    assert_eq!(draft, Draft::Resume { id: id(1) });
    assert_eq!(draft.text(), "{\"approved\": true}\n");
    app.on_edited(draft.clone(), Ok("{\"approved\": tru".into()));
    assert_eq!(app.mode, Mode::Normal);
    assert!(
        matches!(&app.message, Some((Level::Error, m)) if m.starts_with("the data is not JSON")),
        "{:?}",
        app.message
    );
    app.on_edited(
        draft.clone(),
        Ok("{\"approved\": true, \"note\": \"ok\"}\n".into()),
    );
    let verb = Verb::ResumeTask {
        id: id(1),
        data: Some("{\"approved\": true, \"note\": \"ok\"}".into()),
    };
    assert_eq!(app.mode, Mode::Confirm(verb.clone()));
    assert_eq!(
        verb.question(),
        format!(
            "Resume task {} with {{\"approved\": true, \"note\": \"ok\"}}?",
            id(1)
        )
    );
    assert_eq!(press(&mut app, KeyCode::Char('y')), vec![Effect::Run(verb)]);
    // Emptied, it resumes with no data.
    app.on_edited(draft, Ok("  \n".into()));
    assert_eq!(
        app.mode,
        Mode::Confirm(Verb::ResumeTask {
            id: id(1),
            data: None
        })
    );
    press(&mut app, KeyCode::Esc);
    // `c` rejects: a cancel, confirmed.
    press(&mut app, KeyCode::Char('c'));
    assert_eq!(app.mode, Mode::Confirm(Verb::Cancel(id(1))));
}

#[test]
fn a_ready_task_is_not_approved_and_the_footer_says_why() {
    let mut app = started(false);
    on_queue_tab(&mut app, 0, TaskState::Ready, 1..3);
    assert_eq!(press(&mut app, KeyCode::Char('A')), vec![]);
    assert_eq!(
        app.message,
        Some((
            Level::Error,
            "only a suspended task is approved (resumed)".to_owned()
        ))
    );
}

/// The schedules screen's view, as the console watches it.
fn schedules_view(after: Option<&str>) -> View {
    View::Schedules {
        after: after.map(str::to_owned),
        limit: Some(PAGE_ROWS),
    }
}

/// A schedule of queue `queue` firing on `cron` in UTC, next in a minute, that never
/// fired yet.
fn schedule(name: &str, queue: &str, cron: &str) -> ScheduleInfo {
    ScheduleInfo {
        name: name.into(),
        cron: cron.into(),
        tz: "UTC".into(),
        queue: queue.into(),
        task: NewTask::new(raw(r#"{"report":"daily"}"#).expect("valid JSON")),
        catch_up: CatchUp::Skip,
        paused: false,
        next_fire_ms: Some(NOW + 60 * SEC),
        last_fire_ms: None,
        last_task: None,
        fires: 0,
        runs: 0,
        missed: 0,
        failures: 0,
        last_error: None,
        created_ms: NOW - 86_400 * SEC,
        updated_ms: NOW - 3_600 * SEC,
    }
}

/// `digest`, every five minutes, next in 42 s, last 4 min 18 s ago; `nightly`, 02:00
/// Berlin time, paused, with a key, a priority and a limit; `reports-sync`, hourly on
/// a queue that was deleted: its last two fires failed, and one was missed.
fn schedules_update() -> WatchUpdate {
    let mut digest = schedule("digest", "emails", "*/5 * * * *");
    digest.next_fire_ms = Some(NOW + 42 * SEC);
    digest.last_fire_ms = Some(NOW - 258 * SEC);
    digest.last_task = Some(id(7));
    (digest.fires, digest.runs) = (1_204, 2);
    let mut nightly = schedule("nightly", "inference", "0 2 * * *");
    nightly.tz = "Europe/Berlin".into();
    nightly.catch_up = CatchUp::Once;
    nightly.paused = true;
    nightly.next_fire_ms = None;
    nightly.last_fire_ms = Some(NOW - 20 * 3_600 * SEC);
    nightly.last_task = Some(id(8));
    nightly.fires = 30;
    nightly.task.priority = Some(7);
    nightly.task.key = Some("nightly".into());
    nightly.task.limits = vec![LimitUse {
        limit: "openai".into(),
        key: None,
        cost: Some(3),
    }];
    let mut sync = schedule("reports-sync", "reports-old", "@hourly");
    sync.next_fire_ms = Some(NOW + 1_500 * SEC);
    sync.last_fire_ms = Some(NOW - 2 * 3_600 * SEC - 300 * SEC);
    sync.last_task = Some(id(9));
    (sync.fires, sync.missed, sync.failures) = (5, 1, 2);
    sync.last_error = Some("not_found: queue \"reports-old\" does not exist\nsecond line".into());
    WatchUpdate::Schedules {
        schedules: vec![digest, nightly, sync],
        next: None,
    }
}

/// The console on the schedules screen (opened with `C` from the queues), data
/// delivered.
fn on_schedules(readonly: bool) -> (App, u64) {
    let mut app = started(readonly);
    let tag = watched(&press(&mut app, KeyCode::Char('C')), schedules_view(None));
    assert_eq!(app.page().screen, Screen::Schedules);
    assert!(text(&app).contains("loading…"));
    deliver(&mut app, tag, schedules_update());
    (app, tag)
}

/// The names of the rows shown, in order.
fn row_ids(app: &App) -> Vec<String> {
    app.rows().iter().map(|r| r.id().to_owned()).collect()
}

#[test]
fn the_schedules_screen_shows_every_schedule_with_its_next_fire_and_the_selected_ones_task() {
    let (mut app, tag) = on_schedules(false);
    insta::assert_snapshot!("schedules", screen(&app, 80, 24).backend());
    assert_eq!(
        line_with(&app, "│›digest"),
        "\"│›digest       emails      */5 * * * *     in 42s   4m ago   1204  0      0    │\""
    );
    assert!(text(&app).contains(&format!("last task {} · runs 2", id(7))));
    // The paused one: no next fire, its zone beside its pattern, its task's options.
    press(&mut app, KeyCode::Char('j'));
    assert_eq!(
        line_with(&app, "│›nightly"),
        "\"│›nightly      inference   0 2 * * * Euro… paused   20h ago  30    0      0    │\""
    );
    let shown = text(&app);
    assert!(
        shown.contains("0 2 * * * in Europe/Berlin · catch-up once · paused"),
        "{shown}"
    );
    assert!(
        shown.contains(r#"task {"report":"daily"} · priority 7 · key nightly · limits openai ×3"#),
        "{shown}"
    );
    // The failing one: its counts, and the first line of its last error in red.
    press(&mut app, KeyCode::Char('j'));
    snapshots("schedules_failures", &app);
    assert!(text(&app).contains(r#"last error not_found: queue "reports-old" does not exist …"#));
    // A push: the selection stays on its schedule.
    deliver(&mut app, tag, schedules_update());
    assert_eq!(app.page().selected, 2);
    // `s` steps through the columns: the fourth sorts by the next fire, the soonest
    // first and a paused one last; `S` reverses.
    for _ in 0..4 {
        press(&mut app, KeyCode::Char('s'));
    }
    assert_eq!(app.sorted_by(), Some(("next", false)));
    assert_eq!(row_ids(&app), ["digest", "reports-sync", "nightly"]);
    press(&mut app, KeyCode::Char('S'));
    assert_eq!(row_ids(&app), ["nightly", "reports-sync", "digest"]);
    for _ in 0..4 {
        press(&mut app, KeyCode::Char('s'));
    }
    assert_eq!(app.sorted_by(), Some(("failures", false)));
    press(&mut app, KeyCode::Char('s'));
    assert_eq!(
        app.sorted_by(),
        None,
        "after the last column, the daemon's order"
    );
    // The filter: by any text (a queue, a zone), by state, by error.
    for (filter, names) in [
        ("finference\n", &["nightly"][..]),
        ("fberlin\n", &["nightly"]),
        ("fstate:paused\n", &["nightly"]),
        ("fstate:active\n", &["digest", "reports-sync"]),
        ("ferror:does not exist\n", &["reports-sync"]),
    ] {
        chars(&mut app, filter);
        assert_eq!(row_ids(&app), names, "{filter}");
        press(&mut app, KeyCode::Esc);
    }
    // `y` copies the selected schedule's name.
    press(&mut app, KeyCode::Char('g'));
    assert_eq!(
        press(&mut app, KeyCode::Char('y')),
        vec![Effect::Copy {
            text: "digest".into(),
            what: "digest".into(),
        }]
    );
    // Enter opens the last task it enqueued; one that never fired says so.
    watched(&press(&mut app, KeyCode::Enter), View::Task { task: id(7) });
    let tag = watched(&press(&mut app, KeyCode::Esc), schedules_view(None));
    deliver(
        &mut app,
        tag,
        WatchUpdate::Schedules {
            schedules: vec![schedule("fresh", "emails", "0 * * * *")],
            next: None,
        },
    );
    assert_eq!(press(&mut app, KeyCode::Enter), vec![]);
    assert_eq!(
        app.message,
        Some((
            Level::Error,
            "schedule fresh has enqueued no task yet".into()
        ))
    );
    assert!(text(&app).contains("last task none yet · runs 0"));
    // An empty page says how to make a schedule.
    let (mut empty, tag) = on_schedules(false);
    deliver(
        &mut empty,
        tag,
        WatchUpdate::Schedules {
            schedules: Vec::new(),
            next: None,
        },
    );
    insta::assert_snapshot!("schedules_empty", screen(&empty, 80, 24).backend());
    assert!(text(&empty).contains("no schedules (muster schedule set NAME --cron … --queue …)"));
    // `]` asks for the page after the last schedule shown.
    let (mut paged, tag) = on_schedules(false);
    let WatchUpdate::Schedules { schedules, .. } = schedules_update() else {
        unreachable!("schedules_update is a schedules page")
    };
    deliver(
        &mut paged,
        tag,
        WatchUpdate::Schedules {
            schedules,
            next: Some("reports-sync".into()),
        },
    );
    watched(
        &press(&mut paged, KeyCode::Char(']')),
        schedules_view(Some("reports-sync")),
    );
}

#[test]
fn schedules_pause_resume_run_and_delete_after_a_confirm() {
    let (mut app, _) = on_schedules(false);
    let has = |app: &App, key: &str| app.keys().iter().any(|(k, _)| *k == key);
    assert!(has(&app, "p") && has(&app, "N") && has(&app, "D"));
    // `p` on an active schedule pauses it.
    press(&mut app, KeyCode::Char('p'));
    let pause = Verb::PauseSchedule("digest".into());
    assert_eq!(app.mode, Mode::Confirm(pause.clone()));
    assert_eq!(
        pause.question(),
        "Pause schedule digest? It does not fire until resumed."
    );
    snapshots("confirm_schedule_pause", &app);
    assert_eq!(
        press(&mut app, KeyCode::Char('y')),
        vec![Effect::Run(pause)]
    );
    // On a paused one, it resumes it.
    press(&mut app, KeyCode::Char('j'));
    press(&mut app, KeyCode::Char('p'));
    let resume = Verb::ResumeSchedule("nightly".into());
    assert_eq!(app.mode, Mode::Confirm(resume.clone()));
    assert_eq!(
        resume.question(),
        "Resume schedule nightly? It fires from its next time after now."
    );
    assert_eq!(
        press(&mut app, KeyCode::Char('y')),
        vec![Effect::Run(resume)]
    );
    // `N` enqueues its task now, paused or not, naming the queue.
    press(&mut app, KeyCode::Char('N'));
    let run = Verb::RunSchedule {
        name: "nightly".into(),
        queue: "inference".into(),
    };
    assert_eq!(app.mode, Mode::Confirm(run.clone()));
    assert_eq!(
        run.question(),
        "Run schedule nightly now: enqueue its task on queue inference once?"
    );
    assert_eq!(press(&mut app, KeyCode::Char('y')), vec![Effect::Run(run)]);
    // `D` deletes it; any other key than `y` does nothing.
    press(&mut app, KeyCode::Char('D'));
    let delete = Verb::DeleteSchedule("nightly".into());
    assert_eq!(app.mode, Mode::Confirm(delete.clone()));
    assert_eq!(
        delete.question(),
        "Delete schedule nightly? The tasks it enqueued stay."
    );
    assert_eq!(press(&mut app, KeyCode::Char('n')), vec![]);
    assert_eq!(app.message, Some((Level::Info, "nothing done".into())));
    press(&mut app, KeyCode::Char('D'));
    assert_eq!(
        press(&mut app, KeyCode::Char('y')),
        vec![Effect::Run(delete)]
    );
    // The verb's outcome shows in the footer, and the screen is watched again.
    let effect = app.on_done(
        Ok("deleted schedule nightly; the tasks it enqueued stay".into()),
        false,
    );
    assert!(matches!(effect, Some(Effect::Watch { view, .. }) if view == schedules_view(None)));
    assert_eq!(
        app.message,
        Some((
            Level::Info,
            "deleted schedule nightly; the tasks it enqueued stay".into()
        ))
    );
    // Other verb keys name nothing here.
    for key in ['x', 'r', 'c', 'v', 'P', 'R', 'd', 'u', '+'] {
        assert_eq!(press(&mut app, KeyCode::Char(key)), vec![]);
        assert_eq!(
            app.mode,
            Mode::Normal,
            "{key} names no verb on the schedules"
        );
    }
    // A read-only console looks, copies and opens, but changes nothing.
    let (mut ro, _) = on_schedules(true);
    for key in ['p', 'N', 'D'] {
        assert_eq!(press(&mut ro, KeyCode::Char(key)), vec![]);
        assert_eq!(ro.mode, Mode::Normal, "{key} must do nothing read-only");
        assert!(!has(&ro, &key.to_string()));
    }
    insta::assert_snapshot!("schedules_readonly", screen(&ro, 80, 24).backend());
}

#[test]
fn capital_c_opens_the_schedules_from_any_screen_and_esc_goes_back() {
    let mut app = started(false);
    assert!(app.keys().contains(&("C", "schedules")));
    watched(&press(&mut app, KeyCode::Char('C')), schedules_view(None));
    assert_eq!(app.stack.len(), 2);
    // Already there: `C` does nothing, and the help does not offer it.
    assert_eq!(press(&mut app, KeyCode::Char('C')), vec![]);
    assert!(!app.keys().iter().any(|(k, _)| *k == "C"));
    press(&mut app, KeyCode::Char('?'));
    insta::assert_snapshot!("help_schedules", screen(&app, 80, 24).backend());
    press(&mut app, KeyCode::Esc);
    watched(&press(&mut app, KeyCode::Esc), queues_view());
    // From the limits, and back to them.
    watched(&press(&mut app, KeyCode::Char('L')), limits_view(None));
    watched(&press(&mut app, KeyCode::Char('C')), schedules_view(None));
    watched(&press(&mut app, KeyCode::Esc), limits_view(None));
    // `:schedules` jumps there, and completes.
    watched(&chars(&mut app, ":schedules\n"), schedules_view(None));
    assert_eq!(app.stack.len(), 2);
    press(&mut app, KeyCode::Char(':'));
    chars(&mut app, "sc");
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.mode, Mode::Command("schedules ".into()));
    press(&mut app, KeyCode::Esc);
    // A read-only console looks at the schedules too.
    let mut ro = started(true);
    watched(&press(&mut ro, KeyCode::Char('C')), schedules_view(None));
    watched(&press(&mut ro, KeyCode::Esc), queues_view());
}
