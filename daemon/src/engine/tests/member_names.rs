//! Member names bound to principals, with a driven clock: an empty claim binds nothing,
//! member patterns, the cap per principal, `member_release`, and expiry of names with
//! no session and no lease (also across a restart).

use std::time::Duration;

use muster_protocol::model::QueuePatch;
use muster_protocol::ops::{self, Claim};
use muster_protocol::{ErrorCode, Push, ops::EngineRequest};

use super::{Harness, open, principal};
use crate::auth::Principal;
use crate::engine::{MAX_MEMBER_NAMES_PER_PRINCIPAL, Reply};

const CONFIG: &str = r#"
[[tokens]]
name = "a"
token = "a-token-0123456789abcdef"
roles = ["consume"]
members = ["a/*"]

[[tokens]]
name = "b"
token = "b-token-0123456789abcdef"
roles = ["consume"]
"#;

fn release(member: &str) -> EngineRequest {
    EngineRequest::MemberRelease(ops::MemberRelease(ops::MemberName {
        member: member.into(),
    }))
}

fn claim(member: &str) -> EngineRequest {
    EngineRequest::Claim(Claim::new(["jobs"]).member(member))
}

fn setup() -> (Harness, &'static Principal, &'static Principal) {
    let mut h = Harness::new();
    h.create("jobs", QueuePatch::default());
    (
        h,
        principal(CONFIG, "a-token-0123456789abcdef"),
        principal(CONFIG, "b-token-0123456789abcdef"),
    )
}

#[test]
fn an_empty_claim_binds_nothing_and_patterns_limit_names() {
    let (mut h, a, b) = setup();
    h.principal = Some(a);
    match h.call(claim("a/1")) {
        Ok(Reply::Claim(r)) => assert!(r.tasks.is_empty()),
        other => panic!("claim: {other:?}"),
    }
    assert_eq!(h.code(claim("b/1")), ErrorCode::Forbidden);
    assert_eq!(h.code(open("b/1", 1, false, false)), ErrorCode::Forbidden);
    // Not bound: b takes it with a session.
    h.principal = Some(b);
    h.call_on(1, open("a/1", 1, false, false)).unwrap();
    h.principal = Some(a);
    assert_eq!(h.code(claim("a/1")), ErrorCode::Forbidden);
    // A claim that gets a task binds.
    h.principal = None;
    h.enqueue("jobs", "1");
    h.principal = Some(a);
    assert_eq!(h.claim_as("jobs", 1, "a/2").len(), 1);
    h.principal = Some(b);
    assert_eq!(h.code(claim("a/2")), ErrorCode::Forbidden);
}

#[test]
fn names_without_session_or_lease_expire_and_an_admin_releases_them() {
    let (mut h, a, b) = setup();
    h.engine().set_member_name_expiry(Duration::from_secs(10));
    h.principal = Some(b);
    h.call_on(1, open("a/1", 1, false, false)).unwrap();
    h.principal = None;
    assert_eq!(h.code(release("nobody")), ErrorCode::NotFound);
    // The session stays ten minutes: the name stays bound all along.
    h.advance(600_000);
    h.principal = Some(a);
    assert_eq!(h.code(open("a/1", 1, false, false)), ErrorCode::Forbidden);
    h.engine().disconnected(1);
    h.advance(9_000);
    assert_eq!(h.code(open("a/1", 1, false, false)), ErrorCode::Forbidden);
    // Expired by 10 s after the session ended, late by at most a sweep (1.25 s).
    h.advance(2_300);
    h.call_on(2, open("a/1", 1, false, false)).unwrap();
    h.engine().disconnected(2);
    h.round();
    h.principal = None;
    h.call(release("a/1")).unwrap();
    assert_eq!(h.code(release("a/1")), ErrorCode::NotFound);
    h.principal = Some(b);
    h.call_on(3, open("a/1", 1, false, false)).unwrap();
    h.engine().disconnected(3);

    // Bindings are stored; after a restart they count as used at the start.
    h.restart(86_400_000);
    h.engine().set_member_name_expiry(Duration::from_secs(10));
    h.principal = Some(a);
    assert_eq!(h.code(open("a/1", 1, false, false)), ErrorCode::Forbidden);
    h.advance(11_300);
    h.call_on(4, open("a/1", 1, false, false)).unwrap();
}

#[test]
fn a_principal_binds_at_most_its_cap_of_names() {
    let (mut h, a, b) = setup();
    for i in 0..=MAX_MEMBER_NAMES_PER_PRINCIPAL {
        h.principal = None;
        h.enqueue("jobs", &i.to_string());
        h.principal = Some(b);
        let member = format!("b/{i}");
        if i < MAX_MEMBER_NAMES_PER_PRINCIPAL {
            assert_eq!(h.claim_as("jobs", 1, &member).len(), 1);
        } else {
            let refused = h.call(claim(&member)).unwrap_err();
            assert_eq!(refused.code, ErrorCode::Limit);
            assert!(
                refused.message.contains("4096 member names"),
                "{}",
                refused.message
            );
            assert_eq!(h.code(open(&member, 1, false, false)), ErrorCode::Limit);
            // A name it holds already is still its own to use.
            h.call_on(9, open("b/0", 1, true, false)).unwrap();
        }
    }
    // Another principal is not affected.
    h.principal = Some(a);
    assert_eq!(h.claim_as("jobs", 1, "a/1").len(), 1);
}

#[test]
fn an_admin_ends_a_squatters_session_and_frees_the_name_but_not_one_with_leases() {
    let (mut h, a, b) = setup();
    // b squats a/1 with a session it keeps open.
    h.principal = Some(b);
    h.call_on(1, open("a/1", 1, false, false)).unwrap();
    h.principal = Some(a);
    assert_eq!(h.code(open("a/1", 1, false, false)), ErrorCode::Forbidden);
    // The admin's release ends b's session (b is told, and must not come back under
    // the name) and frees the name for a.
    h.principal = None;
    h.call(release("a/1")).unwrap();
    match h.pushed(1).as_slice() {
        [Push::Closed(e)] => {
            assert_eq!(e.code, ErrorCode::Replaced);
            assert_eq!(
                e.message,
                "an operator released member name \"a/1\": this session has ended"
            );
        }
        other => panic!("expected the session's end, got {other:?}"),
    }
    h.principal = Some(a);
    h.call_on(2, open("a/1", 1, false, false)).unwrap();
    // A member holding leases keeps its name: its work is not taken from it.
    h.principal = None;
    h.enqueue("jobs", "1");
    h.principal = Some(a);
    match h.call_on(2, claim("a/1")) {
        Ok(Reply::Claim(r)) => assert_eq!(r.tasks.len(), 1),
        other => panic!("claim: {other:?}"),
    }
    h.principal = None;
    let refused = h.call(release("a/1")).unwrap_err();
    assert_eq!(refused.code, ErrorCode::InvalidState);
    assert_eq!(
        refused.message,
        "member \"a/1\" holds 1 leases: drain it (its agent finishes or hands them back) or revoke them first"
    );
    assert!(h.pushed(2).iter().all(|p| !matches!(p, Push::Closed(_))));
}

/// Without tokens no name is bound: releasing a member with a session is refused with
/// `not_found` and changes nothing (its agent is not told to stop, it is not forgotten).
#[test]
fn releasing_a_name_bound_to_nobody_leaves_its_session_alone() {
    let (mut h, _, _) = setup();
    h.call_on(1, open("m", 1, false, false)).unwrap();
    let refused = h.call(release("m")).unwrap_err();
    assert_eq!(refused.code, ErrorCode::NotFound);
    assert_eq!(
        refused.message,
        "member name \"m\" is bound to no principal"
    );
    assert!(h.pushed(1).is_empty(), "the session was not ended");
    match h.call(EngineRequest::MemberDescribe(ops::MemberDescribe(
        ops::MemberName { member: "m".into() },
    ))) {
        Ok(Reply::MemberDescribe(d)) => assert!(d.member.connected),
        other => panic!("member_describe: {other:?}"),
    }
    // Its session is still on its connection: it takes pushes there.
    h.call_on(1, super::subscribe("m", &["jobs"])).unwrap();
    let id = h.enqueue("jobs", "1");
    match h.pushed(1).as_slice() {
        [Push::Deliver(d)] => assert_eq!(d.id, id),
        other => panic!("expected a delivery, got {other:?}"),
    }
}
