use super::*;
use crate::frame::encode_json;

fn code(body: &str) -> (Option<u64>, ErrorCode) {
    let e = decode_request(body.as_bytes()).unwrap_err();
    (e.id, e.error.code)
}

#[test]
fn decodes_every_documented_example() {
    let cases = [
        (r#"{"id":1,"op":"hello","version":1}"#, "hello"),
        (
            r#"{"id":2,"op":"queue_create","queue":"jobs","options":{"lease_ms":60000}}"#,
            "queue_create",
        ),
        (r#"{"id":3,"op":"queue_list"}"#, "queue_list"),
        (
            r#"{"id":4,"op":"queue_describe","queue":"jobs"}"#,
            "queue_describe",
        ),
        (
            r#"{"id":5,"op":"enqueue","queue":"jobs","tasks":[{"payload":{"order":42}}]}"#,
            "enqueue",
        ),
        (
            r#"{"id":6,"op":"claim","queues":["jobs"],"max":1,"wait_ms":5000}"#,
            "claim",
        ),
        (
            r#"{"id":7,"op":"redrive","queue":"jobs","all":true}"#,
            "redrive",
        ),
        (
            r#"{"id":43,"op":"member_release","member":"gpu-3/agent-7"}"#,
            "member_release",
        ),
    ];
    for (body, op) in cases {
        let (_, req) = decode_request(body.as_bytes()).unwrap_or_else(|e| panic!("{body}: {e:?}"));
        assert_eq!(req.name(), op);
    }
}

#[test]
fn enqueue_keeps_payload_bytes_verbatim() {
    let body = r#"{"id":9,"op":"enqueue","queue":"q","tasks":[{"payload":{"b": [1, 2],"a":"x"}}]}"#;
    let (id, req) = decode_request(body.as_bytes()).unwrap();
    assert_eq!(id, 9);
    let Request::Enqueue(e) = req else {
        panic!("not an enqueue: {req:?}")
    };
    assert_eq!(e.tasks[0].payload.get(), r#"{"b": [1, 2],"a":"x"}"#);
}

#[test]
fn bad_frames_get_their_codes() {
    assert_eq!(code("not json"), (None, ErrorCode::BadRequest));
    assert_eq!(
        code(r#"{"op":"queue_list"}"#),
        (None, ErrorCode::BadRequest)
    );
    assert_eq!(code(r#"{"id":3}"#), (Some(3), ErrorCode::BadRequest));
    assert_eq!(
        code(r#"{"id":4,"op":"fly"}"#),
        (Some(4), ErrorCode::UnknownOp)
    );
    assert_eq!(
        code(r#"{"id":5,"op":"nack","task":"x","epoch":-1}"#),
        (Some(5), ErrorCode::BadRequest)
    );
    assert_eq!(
        code(r#"{"id":6,"op":"enqueue","queue":"q","tasks":[{"payload":1,"priority":300}]}"#),
        (Some(6), ErrorCode::BadRequest)
    );
    assert_eq!(
        code(r#"{"id":7,"op":"claim","queues":"jobs"}"#),
        (Some(7), ErrorCode::BadRequest)
    );
    assert_eq!(
        code(r#"{"id":-1,"op":"queue_list"}"#),
        (None, ErrorCode::BadRequest)
    );
}

#[test]
fn request_frames_carry_id_op_and_fields() {
    let req = QueueDescribe(QueueName {
        queue: "jobs".into(),
    });
    let framed = encode_json(&RequestFrame::new(12, &req)).unwrap();
    assert_eq!(
        &framed[4..],
        br#"{"id":12,"op":"queue_describe","queue":"jobs"}"#
    );
    let (id, back) = decode_request(&framed[4..]).unwrap();
    assert_eq!(id, 12);
    assert_eq!(back.name(), "queue_describe");
}

#[test]
fn replies_flatten_their_fields() {
    let ok = encode_json(&OkFrame {
        id: 3,
        ok: true,
        body: &CountReply {
            count: 2,
            ids: vec![],
        },
    })
    .unwrap();
    assert_eq!(&ok[4..], br#"{"id":3,"ok":true,"count":2}"#);
    let err = ErrorBody::new(ErrorCode::LeaseLost, "stale epoch");
    let e = encode_json(&ErrFrame {
        id: Some(4),
        ok: false,
        error: &err,
    })
    .unwrap();
    assert_eq!(
        &e[4..],
        br#"{"id":4,"ok":false,"error":{"code":"lease_lost","message":"stale epoch"}}"#
    );
}

#[test]
fn watch_requests_and_pushes_round_trip() {
    let (id, req) = decode_request(
        br#"{"id":9,"op":"watch","tag":3,"view":{"screen":"tasks","queue":"jobs","state":"dead","limit":50}}"#,
    )
    .unwrap();
    assert_eq!(id, 9);
    match req {
        Request::Watch(w) => {
            assert_eq!(w.tag, 3);
            assert_eq!(
                w.view,
                View::Tasks {
                    queue: "jobs".into(),
                    state: crate::model::TaskState::Dead,
                    after: None,
                    limit: Some(50)
                }
            );
        }
        other => panic!("{other:?}"),
    }
    let push = Push::Watch(Box::new(WatchReply {
        tag: 3,
        disk_alarm: false,
        update: WatchUpdate::Dead {
            tasks: vec![],
            total: 4,
            next: None,
        },
    }));
    let mut frame = Vec::new();
    push.append_to(&mut frame).unwrap();
    let body = &frame[crate::frame::HEADER_LEN..];
    assert_eq!(
        std::str::from_utf8(body).unwrap(),
        r#"{"push":"watch","tag":3,"update":{"screen":"dead","data":{"tasks":[],"total":4,"next":null}}}"#
    );
    match Push::decode("watch", body).unwrap() {
        Push::Watch(w) => match w.update {
            WatchUpdate::Dead { total, .. } => assert_eq!((w.tag, total), (3, 4)),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_limits_view_and_its_update_have_their_documented_shape() {
    let view = View::Limits {
        after: Some("api".into()),
        limit: Some(2),
    };
    let text = serde_json::to_string(&view).unwrap();
    assert_eq!(text, r#"{"screen":"limits","after":"api","limit":2}"#);
    assert_eq!(serde_json::from_str::<View>(&text).unwrap(), view);
    assert_eq!(
        serde_json::from_str::<View>(r#"{"screen":"limits"}"#).unwrap(),
        View::Limits {
            after: None,
            limit: None
        }
    );
    let update = WatchUpdate::Limits {
        limits: Vec::new(),
        next: Some("b".into()),
    };
    let text = serde_json::to_string(&update).unwrap();
    assert_eq!(
        text,
        r#"{"screen":"limits","data":{"limits":[],"next":"b"}}"#
    );
    match serde_json::from_str::<WatchUpdate>(&text).unwrap() {
        WatchUpdate::Limits { limits, next } => {
            assert_eq!((limits, next), (Vec::new(), Some("b".to_owned())))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_watched_task_keeps_its_payload_verbatim() {
    let body = r#"{"id":1,"ok":true,"tag":2,"update":{"screen":"task","data":{"task":{"id":"01J","queue":"q","state":"ready","payload":{"b":1,"a":[2]},"priority":0,"key":null,"requires":[],"not_before_ms":null,"idempotency_key":null,"deliveries":0,"failures":0,"lease":null,"cancel_requested":false,"progress":null,"result":null,"last_error":null,"dead_reason":null,"created_ms":1,"updated_ms":1,"history":[]}}}}"#;
    let reply: WatchReply = serde_json::from_str(body).unwrap();
    match reply.update {
        WatchUpdate::Task { task, .. } => assert_eq!(task.payload.get(), r#"{"b":1,"a":[2]}"#),
        other => panic!("{other:?}"),
    }
}

#[test]
fn task_find_round_trips_and_omits_what_is_unset() {
    let documented = br#"{"id":43,"op":"task_find","queue":"jobs","state":"dead","error":"timed out","limit":1}"#;
    let (id, req) = decode_request(documented).unwrap();
    assert_eq!(id, 43);
    let Request::TaskFind(find) = req else {
        panic!("not a task_find: {req:?}")
    };
    assert_eq!(
        *find,
        TaskFind {
            queue: Some("jobs".into()),
            state: Some(TaskState::Dead),
            error: Some("timed out".into()),
            limit: Some(1),
            ..TaskFind::default()
        }
    );
    let full = TaskFind {
        id_prefix: Some("01jh".into()),
        field: Some(FieldMatch {
            path: "order.id".into(),
            value: serde_json::json!(42),
        }),
        newest_first: true,
        after: Some(FindCursor {
            queue: "jobs".into(),
            id: "01JHMPFNMXH4QX4FR84G98PBSK".into(),
        }),
        ..TaskFind::default()
    };
    let framed = encode_json(&RequestFrame::new(5, &full)).unwrap();
    assert_eq!(
        &framed[4..],
        br#"{"id":5,"op":"task_find","id_prefix":"01jh","field":{"path":"order.id","value":42},"newest_first":true,"after":{"queue":"jobs","id":"01JHMPFNMXH4QX4FR84G98PBSK"}}"#
    );
    let Request::TaskFind(back) = decode_request(&framed[4..]).unwrap().1 else {
        panic!("not a task_find")
    };
    assert_eq!(*back, full);
    assert_eq!(
        code(r#"{"id":6,"op":"task_find","field":{"path":"a"}}"#),
        (Some(6), ErrorCode::BadRequest)
    );
    let reply: TaskFindReply = serde_json::from_str(
        r#"{"tasks":[],"next":{"queue":"jobs","id":"01JHMPFNMXH4QX4FR84G98PBSK"},"scanned":3}"#,
    )
    .unwrap();
    assert_eq!(reply.scanned, 3);
    assert_eq!(reply.next.map(|c| c.queue), Some("jobs".into()));
}

#[test]
fn the_leading_id_and_op_are_read_up_front_only_where_the_general_way_agrees() {
    // As the SDKs write them, compact or spaced.
    let ack = br#"{"id":7,"op":"ack","task":"t","epoch":1}"#;
    assert_eq!(leading_id_and_op(ack), Some((7, "ack")));
    let spaced = br#"{ "id": 7 , "op" : "ack", "task": "t", "epoch": 1}"#;
    assert_eq!(leading_id_and_op(spaced), Some((7, "ack")));
    // Anything else is left to the general way.
    for body in [
        r#"{"op":"ack","id":7,"task":"t","epoch":1}"#,
        r#"{"id":07,"op":"ack","task":"t","epoch":1}"#,
        r#"{"id":18446744073709551616,"op":"ack","task":"t","epoch":1}"#,
        r#"{"id":7.0,"op":"ack","task":"t","epoch":1}"#,
        r#"{"id":7,"op":"a\u0063k","task":"t","epoch":1}"#,
        r#"{"id":7,"op":"ack","task":"t","epoch":1,"id":8}"#,
        r#"{"id":7,"op":"ack","task":"t","epoch":1,"\u0069d":8}"#,
        r#"{"id":7,"op":"ack","task":"t","epoch":1,"result":{"op":1}}"#,
    ] {
        assert_eq!(leading_id_and_op(body.as_bytes()), None, "{body}");
    }
    // Which answers them exactly as it answers frames it reads from the start.
    let (id, req) = decode_request(br#"{"id":7,"op":"a\u0063k","task":"t","epoch":1}"#).unwrap();
    assert_eq!((id, req.name()), (7, "ack"));
    let nested = br#"{"id":7,"op":"ack","task":"t","epoch":1,"result":{"op":1}}"#;
    assert_eq!(decode_request(nested).unwrap().0, 7);
    for (body, expected) in [
        // A second top-level id, plain or escaped: refused, its id unreadable.
        (r#"{"id":7,"op":"ack","task":"t","epoch":1,"id":8}"#, None),
        (
            r#"{"id":7,"op":"ack","task":"t","epoch":1,"\u0069d":8}"#,
            None,
        ),
        // Not JSON after a readable start: no id either.
        (r#"{"id":7,"op":"ack","task":"t","epoch":1"#, None),
        (r#"{"id":7,"op":"ack","task":"t","epoch":1} x"#, None),
        // A readable frame whose fields are wrong: refused with its id.
        (r#"{"id":7,"op":"ack","epoch":1}"#, Some(7)),
    ] {
        assert_eq!(code(body), (expected, ErrorCode::BadRequest), "{body}");
    }
    let missing = decode_request(br#"{"id":7,"op":"ack","epoch":1}"#).unwrap_err();
    assert!(
        missing
            .error
            .message
            .starts_with("invalid request: missing field `task`"),
        "{}",
        missing.error.message
    );
}

#[test]
fn cluster_error_codes_and_the_leader_field_have_their_wire_form() {
    assert_eq!(ErrorCode::NotLeader.as_str(), "not_leader");
    assert_eq!(ErrorCode::OutcomeUnknown.as_str(), "outcome_unknown");
    let named = ErrorBody::not_leader("node 2 leads", Some("10.0.0.2:7420".into()));
    let e = encode_json(&ErrFrame {
        id: Some(4),
        ok: false,
        error: &named,
    })
    .unwrap();
    assert_eq!(
        &e[4..],
        br#"{"id":4,"ok":false,"error":{"code":"not_leader","message":"node 2 leads","leader":"10.0.0.2:7420"}}"#
    );
    let unknown = ErrorBody::not_leader("an election is under way", None);
    assert_eq!(
        serde_json::to_string(&unknown).unwrap(),
        r#"{"code":"not_leader","message":"an election is under way"}"#
    );
    let lost = ErrorBody::new(ErrorCode::OutcomeUnknown, "leadership lost");
    assert_eq!(lost.leader, None);
    assert_eq!(
        serde_json::to_string(&lost).unwrap(),
        r#"{"code":"outcome_unknown","message":"leadership lost"}"#
    );
    let back: ErrorBody = serde_json::from_str(
        r#"{"code":"not_leader","message":"node 2 leads","leader":"10.0.0.2:7420"}"#,
    )
    .unwrap();
    assert_eq!(back, named);
    // Errors of daemons before clusters carry no leader.
    let old: ErrorBody = serde_json::from_str(r#"{"code":"limit","message":"m"}"#).unwrap();
    assert_eq!(old, ErrorBody::new(ErrorCode::Limit, "m"));
    assert_eq!(
        named.to_string(),
        "not_leader: node 2 leads",
        "the leader is not part of the one-line text"
    );
}

#[test]
fn hello_replies_carry_the_cluster_only_from_a_cluster_node() {
    let single = HelloReply {
        version: 1,
        server: "musterd 0.1.0".into(),
        cluster: None,
        principal: None,
    };
    assert_eq!(
        serde_json::to_string(&single).unwrap(),
        r#"{"version":1,"server":"musterd 0.1.0"}"#
    );
    let node = HelloReply {
        cluster: Some(ClusterHello {
            cluster_id: "prod".into(),
            node: 2,
            term: 7,
            leader: Some(1),
            leader_addr: Some("10.0.0.1:7420".into()),
        }),
        ..single.clone()
    };
    let text = serde_json::to_string(&node).unwrap();
    assert_eq!(
        text,
        r#"{"version":1,"server":"musterd 0.1.0","cluster":{"cluster_id":"prod","node":2,"term":7,"leader":1,"leader_addr":"10.0.0.1:7420"}}"#
    );
    let back: HelloReply = serde_json::from_str(&text).unwrap();
    assert_eq!(back.cluster, node.cluster);
    let electing: HelloReply = serde_json::from_str(
        r#"{"version":1,"server":"s","cluster":{"cluster_id":"prod","node":3,"term":8}}"#,
    )
    .unwrap();
    assert_eq!(
        electing.cluster,
        Some(ClusterHello {
            cluster_id: "prod".into(),
            node: 3,
            term: 8,
            leader: None,
            leader_addr: None,
        })
    );
}

#[test]
fn hello_replies_name_the_principal_with_its_roles_and_patterns() {
    let reply = HelloReply {
        version: 1,
        server: "musterd 0.1.0".into(),
        cluster: None,
        principal: Some(PrincipalInfo {
            name: "ci".into(),
            roles: vec![Role::Produce, Role::Approve],
            queues: vec!["jobs".into(), "ml.*".into()],
            members: Vec::new(),
        }),
    };
    let text = serde_json::to_string(&reply).unwrap();
    assert_eq!(
        text,
        r#"{"version":1,"server":"musterd 0.1.0","principal":{"name":"ci","roles":["produce","approve"],"queues":["jobs","ml.*"],"members":[]}}"#
    );
    let back: HelloReply = serde_json::from_str(&text).unwrap();
    assert_eq!(back.principal, reply.principal);
    let p = back.principal.unwrap();
    assert_eq!(
        [Role::Produce, Role::Consume, Role::Approve, Role::Admin].map(|r| p.holds(r)),
        [true, false, true, false]
    );
    assert!(!p.covers_all());
    let admin = PrincipalInfo {
        name: "ops".into(),
        roles: vec![Role::Admin],
        queues: Vec::new(),
        members: Vec::new(),
    };
    assert!(
        [Role::Produce, Role::Consume, Role::Approve, Role::Admin]
            .iter()
            .all(|r| admin.holds(*r))
    );
    assert!(admin.covers_all());
    // A reply without one (an --open daemon, or one older than the field) reads as None.
    let open: HelloReply = serde_json::from_str(r#"{"version":1,"server":"s"}"#).unwrap();
    assert_eq!(open.principal, None);
}

#[test]
fn a_cancel_names_the_state_it_wants_or_none() {
    let task = "01JHMPFNMW1HEAD8X4A1JH69RE";
    let plain = Cancel {
        task: task.into(),
        if_state: None,
    };
    assert_eq!(
        serde_json::to_string(&plain).unwrap(),
        format!(r#"{{"task":"{task}"}}"#)
    );
    for (body, want) in [
        (format!(r#"{{"id":1,"op":"cancel","task":"{task}"}}"#), None),
        (
            format!(r#"{{"id":1,"op":"cancel","task":"{task}","if_state":null}}"#),
            None,
        ),
        (
            format!(r#"{{"id":1,"op":"cancel","task":"{task}","if_state":"suspended"}}"#),
            Some(TaskState::Suspended),
        ),
    ] {
        match decode_request(body.as_bytes()) {
            Ok((1, Request::Cancel(c))) => {
                assert_eq!((c.task.as_str(), c.if_state), (task, want), "{body}")
            }
            other => panic!("{body}: {other:?}"),
        }
    }
    let bad = format!(r#"{{"id":1,"op":"cancel","task":"{task}","if_state":"waiting"}}"#);
    assert_eq!(code(&bad), (Some(1), ErrorCode::BadRequest));
}

#[test]
fn cluster_requests_and_their_reply_round_trip() {
    let framed = encode_json(&RequestFrame::new(1, &ClusterStatus {})).unwrap();
    assert_eq!(&framed[4..], br#"{"id":1,"op":"cluster_status"}"#);
    assert_eq!(
        decode_request(&framed[4..]).unwrap().1.name(),
        "cluster_status"
    );

    let add = ClusterAdd {
        node: 3,
        addr: "10.0.0.3:7420".into(),
        cluster_addr: "10.0.0.3:7421".into(),
        learner: false,
        catch_up_ms: None,
    };
    let framed = encode_json(&RequestFrame::new(2, &add)).unwrap();
    assert_eq!(
        &framed[4..],
        br#"{"id":2,"op":"cluster_add","node":3,"addr":"10.0.0.3:7420","cluster_addr":"10.0.0.3:7421","learner":false}"#
    );
    let (_, req) = decode_request(
        br#"{"id":2,"op":"cluster_add","node":3,"addr":"10.0.0.3:7420","cluster_addr":"10.0.0.3:7421"}"#,
    )
    .unwrap();
    let Request::ClusterAdd(back) = req else {
        panic!("not a cluster_add: {req:?}")
    };
    assert_eq!(
        (
            back.node,
            back.addr.as_str(),
            back.cluster_addr.as_str(),
            back.learner,
            back.catch_up_ms
        ),
        (3, "10.0.0.3:7420", "10.0.0.3:7421", false, None)
    );
    let (_, req) = decode_request(
        br#"{"id":2,"op":"cluster_add","node":3,"addr":"a:1","cluster_addr":"a:2","catch_up_ms":5000}"#,
    )
    .unwrap();
    let Request::ClusterAdd(back) = req else {
        panic!("not a cluster_add: {req:?}")
    };
    assert_eq!(back.catch_up_ms, Some(5000));

    let framed = encode_json(&RequestFrame::new(3, &ClusterRemove { node: 2 })).unwrap();
    assert_eq!(&framed[4..], br#"{"id":3,"op":"cluster_remove","node":2}"#);
    let Request::ClusterRemove(back) = decode_request(&framed[4..]).unwrap().1 else {
        panic!("not a cluster_remove")
    };
    assert_eq!(back.node, 2);
    assert_eq!(
        code(r#"{"id":4,"op":"cluster_add","node":3,"addr":"a:1"}"#),
        (Some(4), ErrorCode::BadRequest)
    );
    assert_eq!(
        code(r#"{"id":5,"op":"cluster_remove","node":-1}"#),
        (Some(5), ErrorCode::BadRequest)
    );

    let reply = ClusterStatusReply {
        cluster_id: "prod".into(),
        node: 1,
        role: "leader".into(),
        term: 4,
        leader: Some(1),
        last_log_index: Some(120),
        last_applied: Some(119),
        snapshot_index: None,
        members: vec![
            ClusterMember {
                node: 1,
                addr: "10.0.0.1:7420".into(),
                cluster_addr: "10.0.0.1:7421".into(),
                voter: true,
                matched: Some(120),
            },
            ClusterMember {
                node: 2,
                addr: "10.0.0.2:7420".into(),
                cluster_addr: "10.0.0.2:7421".into(),
                voter: false,
                matched: None,
            },
        ],
    };
    let ok = encode_json(&OkFrame {
        id: 6,
        ok: true,
        body: &reply,
    })
    .unwrap();
    let text = std::str::from_utf8(&ok[4..]).unwrap();
    assert_eq!(
        text,
        r#"{"id":6,"ok":true,"cluster_id":"prod","node":1,"role":"leader","term":4,"leader":1,"last_log_index":120,"last_applied":119,"members":[{"node":1,"addr":"10.0.0.1:7420","cluster_addr":"10.0.0.1:7421","voter":true,"matched":120},{"node":2,"addr":"10.0.0.2:7420","cluster_addr":"10.0.0.2:7421","voter":false}]}"#
    );
    let back: ClusterStatusReply = serde_json::from_str(text).unwrap();
    assert_eq!(back, reply);
    for op in ["cluster_status", "cluster_add", "cluster_remove"] {
        assert!(OP_NAMES.contains(&op), "{op}");
    }
}

#[test]
fn every_op_is_routed_to_the_handshake_the_edge_or_the_engine_by_name() {
    // One frame with every field some op requires; each op reads the fields it knows.
    // (`schedule_set` alone takes a whole task under `task`.)
    let frame = |op: &str| {
        let task = match op {
            "schedule_set" => r#"{"payload":1},"cron":"* * * * *""#,
            _ => r#""t""#,
        };
        format!(
            r#"{{"id":1,"op":"{op}","version":1,"node":2,"queue":"q","tasks":[],"task":{task},"epoch":1,"token":"x","member":"m","addr":"a:1","cluster_addr":"a:2","dir":"d","tag":1,"name":"n","view":{{"screen":"queues"}},"capacity":1,"state":"ready","error":"e","reason":"r","queues":["q"],"children":[],"at":0,"chunks":[],"options":{{}}}}"#
        )
    };
    let mut routed = Vec::new();
    for op in OP_NAMES {
        let (_, req) = match decode_request(frame(op).as_bytes()) {
            Ok(decoded) => decoded,
            Err(e) => panic!("{op}: {e:?}"),
        };
        let name = req.name();
        let (route, routed_name) = match req.route() {
            Route::Hello(_) => ("hello", "hello"),
            Route::Edge(edge) => ("edge", edge.name()),
            Route::Engine(engine) => ("engine", engine.name()),
        };
        assert_eq!(routed_name, name, "{op}");
        routed.push((name, route));
    }
    let by = |route: &str| -> Vec<&str> {
        routed
            .iter()
            .filter(|(_, r)| *r == route)
            .map(|(name, _)| *name)
            .collect()
    };
    assert_eq!(by("hello"), ["hello"]);
    assert_eq!(
        by("edge"),
        [
            "server_stats",
            "cluster_status",
            "cluster_add",
            "cluster_remove"
        ]
    );
    let engine: Vec<&str> = OP_NAMES
        .iter()
        .copied()
        .filter(|op| !["hello", "server_stats"].contains(op) && !op.starts_with("cluster_"))
        .collect();
    assert_eq!(by("engine"), engine);
    assert_eq!(engine.len(), 53);
}

#[test]
fn a_request_nested_too_deep_is_refused_with_its_id_so_its_client_hears_of_it() {
    let deep = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    // The payload's nesting plus the request object, its tasks and the task: 65.
    let frame = format!(
        r#"{{"id":9,"op":"enqueue","queue":"q","tasks":[{{"payload":{}}}]}}"#,
        deep(62)
    );
    let err = decode_request(frame.as_bytes()).unwrap_err();
    assert_eq!(err.id, Some(9));
    assert_eq!(err.error.code, ErrorCode::BadRequest);
    assert_eq!(
        err.error.message,
        "JSON nested 65 deep exceeds the limit of 64"
    );
    // Written the general way (the id after the op), the id is read all the same.
    let general = format!(
        r#"{{"op":"enqueue","queue":"q","tasks":[{{"payload":{}}}],"id":10}}"#,
        deep(62)
    );
    assert_eq!(decode_request(general.as_bytes()).unwrap_err().id, Some(10));
    // One level less is a request like any other.
    let fits = frame.replacen("[1]", "1", 1);
    assert_eq!(decode_request(fits.as_bytes()).unwrap().0, 9);
}

#[test]
fn an_emit_and_a_follow_read_and_answer_as_protocol_md_shows() {
    let (_, req) = decode_request(
        br#"{"id":50,"op":"emit","task":"01JHMPFNMW1HEAD8X4A1JH69RE","epoch":1,"at":0,"chunks":[{"text":"Reading\n"},{"json":{"tokens":412}},{"json":null}]}"#,
    )
    .unwrap();
    let Request::Emit(emit) = req else {
        panic!("{req:?}")
    };
    assert_eq!((emit.epoch, emit.at, emit.chunks.len()), (1, 0, 3));
    assert_eq!(emit.chunks[0].text.as_deref(), Some("Reading\n"));
    assert_eq!(
        emit.chunks[1].json.as_ref().map(|j| j.get()),
        Some(r#"{"tokens":412}"#)
    );
    // A JSON null reads as no JSON: the daemon refuses such a chunk.
    assert!(emit.chunks[2].text.is_none() && emit.chunks[2].json.is_none());
    // As stored: `{"text":"Reading\n"}` with its escape, and a comma.
    assert_eq!(emit.chunks[0].stored_bytes(), 21);
    let (_, req) = decode_request(
        br#"{"id":51,"op":"follow","task":"01JHMPFNMW1HEAD8X4A1JH69RE","from":2,"timeout_ms":30000}"#,
    )
    .unwrap();
    assert!(req.may_wait());
    let reply = FollowReply {
        chunks: vec![crate::model::OutputChunk {
            n: 2,
            at_ms: 7,
            text: Some("hi".into()),
            json: None,
        }],
        dropped: 0,
        next: 3,
        state: crate::model::TaskState::Leased,
        end: false,
    };
    assert_eq!(
        serde_json::to_string(&reply).unwrap(),
        r#"{"chunks":[{"n":2,"at_ms":7,"text":"hi"}],"dropped":0,"next":3,"state":"leased","end":false}"#
    );
}
