//! Task output: numbered chunks, repeats stored once, fencing, follows that wait and
//! end, the per-task limits and rate, and output that outlives restarts and goes with
//! its task.

use muster_protocol::limits::{MAX_CHUNK_BYTES, MAX_OUTPUT_EMITS, OUTPUT_RATE_BYTES};
use muster_protocol::model::{Chunk, QueuePatch, TaskState};
use muster_protocol::ops::{Claim, Emit, EmitReply, EngineRequest, Follow, FollowReply};
use muster_protocol::{ErrorBody, ErrorCode};

use super::{Harness, ack, raw};
use crate::engine::Reply;

fn emit_req(id: &str, epoch: u64, at: u64, chunks: Vec<Chunk>) -> EngineRequest {
    EngineRequest::Emit(Emit {
        task: id.into(),
        epoch,
        at,
        chunks,
    })
}

fn emit(h: &mut Harness, id: &str, epoch: u64, at: u64, chunks: Vec<Chunk>) -> EmitReply {
    match h.call(emit_req(id, epoch, at, chunks)) {
        Ok(Reply::Emit(r)) => r,
        other => panic!("emit {id} at {at}: {other:?}"),
    }
}

fn texts(words: &[&str]) -> Vec<Chunk> {
    words.iter().map(|w| Chunk::text(*w)).collect()
}

fn follow_req(id: &str, from: u64, timeout_ms: Option<u64>) -> EngineRequest {
    EngineRequest::Follow(Follow {
        task: id.into(),
        from,
        timeout_ms,
    })
}

fn follow(h: &mut Harness, id: &str, from: u64) -> FollowReply {
    match h.call(follow_req(id, from, None)) {
        Ok(Reply::Follow(r)) => r,
        other => panic!("follow {id} from {from}: {other:?}"),
    }
}

fn followed(r: Option<Result<Reply, ErrorBody>>) -> FollowReply {
    match r {
        Some(Ok(Reply::Follow(r))) => r,
        other => panic!("a follow's reply: {other:?}"),
    }
}

/// `(n, text)` of each chunk.
fn numbered(r: &FollowReply) -> Vec<(u64, String)> {
    r.chunks
        .iter()
        .map(|c| {
            let text = match (&c.text, &c.json) {
                (Some(t), None) => t.clone(),
                (None, Some(j)) => j.get().to_owned(),
                other => panic!("chunk {}: {other:?}", c.n),
            };
            (c.n, text)
        })
        .collect()
}

fn big(fill: char, bytes: usize) -> Chunk {
    Chunk::text(fill.to_string().repeat(bytes))
}

#[test]
fn chunks_are_numbered_in_order_and_a_repeated_emit_stores_nothing_twice() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let id = h.enqueue("q", "{}");
    let (_, epoch) = h.claim_one("q");
    let r = emit(&mut h, &id, epoch, 0, texts(&["thinking", "..."]));
    assert_eq!((r.next, r.repeated, r.wait_ms), (2, 0, 0));
    // The same emit again (its reply lost): nothing stored twice.
    let r = emit(&mut h, &id, epoch, 0, texts(&["thinking", "..."]));
    assert_eq!((r.next, r.repeated), (2, 2));
    // Overlapping: only the new tail is stored.
    let mut chunks = texts(&["...", "done"]);
    chunks.push(Chunk::json(raw(r#"{"tokens":12}"#)));
    let r = emit(&mut h, &id, epoch, 1, chunks);
    assert_eq!((r.next, r.repeated), (4, 1));
    // A gap is refused and changes nothing.
    let e = h.call(emit_req(&id, epoch, 9, texts(&["x"]))).unwrap_err();
    assert_eq!(e.code, ErrorCode::BadRequest, "{e:?}");
    assert_eq!(
        e.message,
        format!("emit at chunk 9: task {id}'s next chunk is numbered 4")
    );
    let f = follow(&mut h, &id, 0);
    assert_eq!(
        numbered(&f),
        [
            (0, "thinking".to_owned()),
            (1, "...".to_owned()),
            (2, "done".to_owned()),
            (3, r#"{"tokens":12}"#.to_owned())
        ]
    );
    assert_eq!(
        (f.next, f.dropped, f.state, f.end),
        (4, 0, TaskState::Leased, false)
    );
    assert!(f.chunks.iter().all(|c| c.at_ms == h.now.wall_ms));
    assert_eq!(
        numbered(&follow(&mut h, &id, 3)),
        [(3, r#"{"tokens":12}"#.to_owned())]
    );
    let out = h.task(&id).output.expect("an output summary");
    // Two emits stored, each a 16-byte header and its JSON array:
    // [{"text":"thinking"},{"text":"..."}] and [{"text":"done"},{"json":{"tokens":12}}].
    assert_eq!(
        (out.first, out.next, out.bytes),
        (0, 4, (16 + 36) + (16 + 40))
    );
    // A follow past the end is refused.
    let e = h.call(follow_req(&id, 5, None)).unwrap_err();
    assert_eq!(e.code, ErrorCode::BadRequest);
    assert_eq!(
        e.message,
        format!("follow from chunk 5: task {id} has emitted 4 chunks")
    );
}

#[test]
fn malformed_emits_are_refused_and_change_nothing() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let id = h.enqueue("q", "{}");
    let (_, epoch) = h.claim_one("q");
    let both = Chunk {
        text: Some("a".into()),
        json: Some(raw("1")),
    };
    for (chunks, code, message) in [
        (
            Vec::new(),
            ErrorCode::BadRequest,
            "an emit carries 1 to 1000 chunks, not 0",
        ),
        (
            vec![both],
            ErrorCode::BadRequest,
            "chunk 0 must hold exactly one of text and json",
        ),
        (
            vec![Chunk::default()],
            ErrorCode::BadRequest,
            "chunk 0 must hold exactly one of text and json",
        ),
        (
            vec![Chunk::text("ok"), big('x', MAX_CHUNK_BYTES + 1)],
            ErrorCode::TooLarge,
            "chunk 1 holds 65537 bytes, more than 65536",
        ),
        (
            // Nine chunks of 60 KiB: each {"text":"…"} and a comma, the header, "[".
            (0..9).map(|_| big('x', 60 * 1024)).collect(),
            ErrorCode::TooLarge,
            "an emit of 553085 bytes as stored exceeds 524288",
        ),
    ] {
        let e = h.call(emit_req(&id, epoch, 0, chunks)).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (code, message));
    }
    assert_eq!(h.task(&id).output, None);
}

#[test]
fn an_emit_is_fenced_by_its_lease_and_the_next_holder_continues_the_numbers() {
    let mut h = Harness::new();
    h.create(
        "q",
        QueuePatch {
            lease_ms: Some(1_000),
            ..QueuePatch::default()
        },
    );
    let id = h.enqueue("q", "{}");
    let (_, epoch) = h.claim_one("q");
    emit(&mut h, &id, epoch, 0, texts(&["a", "b"]));
    let e = h
        .call(emit_req(&id, epoch + 1, 2, texts(&["c"])))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::LeaseLost);
    // The lease lapses; the stale holder is refused, the next one starts at 2.
    h.advance(1_001);
    let e = h.call(emit_req(&id, epoch, 2, texts(&["c"]))).unwrap_err();
    assert_eq!(e.code, ErrorCode::LeaseLost);
    let d = match h.call(EngineRequest::Claim(Claim::new(["q"]).member("m2"))) {
        Ok(Reply::Claim(mut r)) => r.tasks.remove(0),
        other => panic!("claim: {other:?}"),
    };
    assert_eq!((d.epoch, d.output), (epoch + 1, 2));
    let r = emit(&mut h, &id, d.epoch, d.output, texts(&["c"]));
    assert_eq!((r.next, r.repeated), (3, 0));
    assert_eq!(
        numbered(&follow(&mut h, &id, 0))
            .into_iter()
            .map(|(_, t)| t)
            .collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
}

#[test]
fn a_follow_waits_for_output_and_ends_with_its_task() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let id = h.enqueue("q", "{}");
    let (_, epoch) = h.claim_one("q");
    // Nothing yet: the follow waits.
    let tag = h.send_on(2, follow_req(&id, 0, Some(10_000)));
    assert!(h.reply_for(tag).is_none(), "parked until output comes");
    emit(&mut h, &id, epoch, 0, texts(&["hello"]));
    let f = followed(h.reply_for(tag));
    assert_eq!(numbered(&f), [(0, "hello".to_owned())]);
    assert_eq!((f.next, f.end), (1, false));
    // From the next number: waits again, and its timeout answers with nothing.
    let tag = h.send_on(2, follow_req(&id, 1, Some(2_000)));
    h.advance(1_999);
    assert!(h.reply_for(tag).is_none());
    h.advance(1);
    let f = followed(h.reply_for(tag));
    assert_eq!((f.chunks.len(), f.next, f.end), (0, 1, false));
    // The task's end ends the follow.
    let tag = h.send_on(2, follow_req(&id, 1, Some(10_000)));
    assert!(h.reply_for(tag).is_none());
    h.call(ack(&id, epoch)).unwrap();
    let f = followed(h.reply_for(tag));
    assert_eq!(
        (f.chunks.len(), f.next, f.state, f.end),
        (0, 1, TaskState::Done, true)
    );
    // A follow of a finished task gets everything and the end at once.
    let f = match h.call(follow_req(&id, 0, Some(10_000))) {
        Ok(Reply::Follow(f)) => f,
        other => panic!("{other:?}"),
    };
    assert_eq!((numbered(&f).len(), f.end), (1, true));
}

#[test]
fn output_past_its_limits_drops_the_oldest_emits_and_a_follower_is_told_how_many() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let id = h.enqueue("q", "{}");
    let (_, epoch) = h.claim_one("q");
    // Five emits of 240 KiB (four chunks of 60 KiB): 1,200 KiB, past the 1 MiB kept.
    let mut at = 0;
    for (i, fill) in ['a', 'b', 'c', 'd', 'e'].into_iter().enumerate() {
        let r = emit(&mut h, &id, epoch, at, vec![big(fill, 60 * 1024); 4]);
        at = r.next;
        assert_eq!(at, 4 * (i as u64 + 1));
        // Within the rate: a second's refill covers each.
        h.advance(1_000);
    }
    let out = h.task(&id).output.unwrap();
    // Four emits kept, each stored as its header, "[" and four {"text":"…"}, commas.
    let page = 16 + 1 + 4 * (60 * 1024 + 12);
    assert_eq!((out.first, out.next, out.bytes), (4, 20, 4 * page));
    let f = follow(&mut h, &id, 0);
    assert_eq!(f.dropped, 4);
    assert_eq!(f.chunks[0].n, 4);
    assert_eq!(f.chunks[0].text.as_deref().map(|t| &t[..1]), Some("b"));
    // A reply holds at most 256 KiB as sent: four chunks of 60 KiB, then the rest.
    assert_eq!(f.chunks.len(), 4);
    assert_eq!(f.next, 8);
    let f = follow(&mut h, &id, f.next);
    assert_eq!((f.dropped, f.chunks[0].n, f.next), (0, 8, 12));

    // The count of emits kept is bounded too: small emits past it drop the oldest.
    let id = h.enqueue("q", "{}");
    let (_, epoch) = h.claim_one("q");
    for n in 0..=MAX_OUTPUT_EMITS as u64 {
        emit(&mut h, &id, epoch, n, texts(&["."]));
    }
    let out = h.task(&id).output.unwrap();
    assert_eq!((out.first, out.next), (1, MAX_OUTPUT_EMITS as u64 + 1));
}

#[test]
fn a_fast_emitter_is_told_to_wait_and_refused_until_it_has() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let id = h.enqueue("q", "{}");
    let (_, epoch) = h.claim_one("q");
    // Chunks whose emit is stored in exactly 256 KiB: a second's worth of the rate.
    let quarter = || {
        let mut chunks = vec![big('x', 65_520); 3];
        chunks.push(big('x', 65_519));
        assert_eq!(
            16 + 1 + chunks.iter().map(Chunk::stored_bytes).sum::<usize>(),
            256 * 1024
        );
        chunks
    };
    // The burst, 1 MiB, goes at once; the emit that empties it further must wait.
    let mut at = 0;
    for _ in 0..4 {
        let r = emit(&mut h, &id, epoch, at, quarter());
        assert_eq!(r.wait_ms, 0);
        at = r.next;
    }
    let r = emit(&mut h, &id, epoch, at, quarter());
    assert_eq!(
        r.wait_ms, 1_000,
        "256 KiB owed at {OUTPUT_RATE_BYTES} bytes/s"
    );
    at = r.next;
    let e = h.call(emit_req(&id, epoch, at, quarter())).unwrap_err();
    assert_eq!(e.code, ErrorCode::Limit);
    assert_eq!(
        e.message,
        format!("task {id} emitted faster than 262144 bytes/s: wait 1000 ms")
    );
    h.advance(1_000);
    let r = emit(&mut h, &id, epoch, at, quarter());
    assert_eq!((r.next, r.wait_ms), (at + 4, 1_000));
}

#[test]
fn output_outlives_a_restart_and_goes_with_its_task() {
    let mut h = Harness::new();
    h.create(
        "q",
        QueuePatch {
            retention_ms: Some(1_000),
            ..QueuePatch::default()
        },
    );
    let id = h.enqueue("q", "{}");
    let (_, epoch) = h.claim_one("q");
    emit(&mut h, &id, epoch, 0, texts(&["one", "two"]));
    h.restart(10);
    let f = follow(&mut h, &id, 0);
    assert_eq!(numbered(&f).len(), 2);
    // The holder goes on where it was (its lease kept over the restart).
    assert_eq!(emit(&mut h, &id, epoch, 2, texts(&["three"])).next, 3);
    h.call(ack(&id, epoch)).unwrap();
    h.advance(1_001);
    assert_eq!(
        h.code(follow_req(&id, 0, None)),
        ErrorCode::NotFound,
        "removed with its task"
    );
    h.advance(1);
    let store = h.engine().store().clone();
    assert!(store.load_output_metas().unwrap().is_empty());
    let mut pages = 0;
    store
        .output_pages(ulid::Ulid::from_string(&id).unwrap(), 0, |_, _| {
            pages += 1;
            false
        })
        .unwrap();
    assert_eq!(pages, 0, "no page left behind");
}

#[test]
fn output_left_by_a_crash_during_its_sweep_is_swept_at_the_next_start() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let gone = ulid::Ulid::from_parts(1, 7);
    // A task removed, its output half swept when the daemon died: its meta and a page.
    let store = h.engine().store().clone();
    let mut batch = store.batch();
    batch.put_output_page(
        gone,
        5,
        crate::store::OutputPage::encode(&texts(&["left"]), 1),
    );
    batch.put_output_meta(
        gone,
        &crate::store::OutputMeta {
            first: 5,
            next: 6,
            bytes: 4,
            pages: 1,
        },
    );
    batch.commit().unwrap();
    drop(store);
    h.restart(0);
    h.advance(1);
    let store = h.engine().store().clone();
    assert!(store.load_output_metas().unwrap().is_empty());
    let mut pages = 0;
    store
        .output_pages(gone, 0, |_, _| {
            pages += 1;
            false
        })
        .unwrap();
    assert_eq!(pages, 0);
}

#[test]
fn a_watched_task_screen_carries_the_last_chunks_of_its_output() {
    use muster_protocol::limits::WATCH_OUTPUT_BYTES;
    use muster_protocol::ops::{View, Watch, WatchUpdate};
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let id = h.enqueue("q", "{}");
    let (_, epoch) = h.claim_one("q");
    let watch = |h: &mut Harness| match h.call_on(
        9,
        EngineRequest::Watch(Watch {
            view: View::Task { task: id.clone() },
            tag: 1,
        }),
    ) {
        Ok(Reply::Watch(r)) => match r.update {
            WatchUpdate::Task { output, .. } => output,
            other => panic!("{other:?}"),
        },
        other => panic!("watch: {other:?}"),
    };
    assert!(watch(&mut h).is_empty(), "no output yet");
    // Emits of 2 KiB chunks, of 1 KiB chunks, and a small one: the screen gets the
    // last chunks that fit 8 KiB, over the pages they are in.
    let mut at = emit(&mut h, &id, epoch, 0, vec![big('a', 2048); 3]).next;
    at = emit(&mut h, &id, epoch, at, vec![big('b', 1024); 4]).next;
    emit(&mut h, &id, epoch, at, texts(&["end"]));
    let tail = watch(&mut h);
    let ns: Vec<u64> = tail.iter().map(|c| c.n).collect();
    // As JSON a chunk is its text and some 40 bytes: one 2 KiB chunk, the four of
    // 1 KiB and the last fit, a second 2 KiB one would not.
    assert_eq!(ns, [2, 3, 4, 5, 6, 7]);
    let bytes: usize = tail.iter().map(crate::engine::listing::json_len).sum();
    assert!(bytes <= WATCH_OUTPUT_BYTES, "{bytes}");
    assert_eq!(tail.last().and_then(|c| c.text.as_deref()), Some("end"));
}

#[test]
fn the_disk_alarm_refuses_emits_and_serves_follows() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let id = h.enqueue("q", "{}");
    let (_, epoch) = h.claim_one("q");
    emit(&mut h, &id, epoch, 0, texts(&["before"]));
    h.engine().set_disk_alarm(true);
    let e = h
        .call(emit_req(&id, epoch, 1, texts(&["during"])))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::DiskFull, "{e:?}");
    // A repeat of what is stored is answered: it stores nothing.
    assert_eq!(emit(&mut h, &id, epoch, 0, texts(&["before"])).repeated, 1);
    assert_eq!(
        numbered(&follow(&mut h, &id, 0)),
        [(0, "before".to_owned())]
    );
    h.engine().set_disk_alarm(false);
    assert_eq!(emit(&mut h, &id, epoch, 1, texts(&["after"])).next, 2);
}
