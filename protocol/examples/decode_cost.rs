//! What decoding one request frame costs, for the frames the daemon decodes most.
//!
//! ```sh
//! cargo run --release -p muster-protocol --example decode_cost
//! ```
//! Builds each frame as the Rust SDK writes it (an enqueue of one 256-byte JSON payload
//! with an idempotency key, as `muster bench` sends; an ack; a renewal), then times
//! `decode_request` on it: 20 batches of 20,000 decodes each. It prints the median and
//! the spread (min–max) of the batches' nanoseconds per decode.

use std::time::Instant;

use muster_protocol::frame;
use muster_protocol::model::NewTask;
use muster_protocol::ops::{Ack, Enqueue, Renew, RequestFrame, decode_request};

const BATCHES: usize = 20;
const PER_BATCH: u32 = 20_000;

fn frame_of<T: muster_protocol::ops::Op>(body: &T) -> Vec<u8> {
    let framed = frame::encode_json(&RequestFrame::new(123_456, body)).expect("encodes");
    framed[frame::HEADER_LEN..].to_vec()
}

fn time(name: &str, body: &[u8]) {
    let mut per_decode = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let started = Instant::now();
        for _ in 0..PER_BATCH {
            let decoded = decode_request(std::hint::black_box(body)).expect("decodes");
            std::hint::black_box(decoded);
        }
        per_decode.push(started.elapsed().as_nanos() as f64 / f64::from(PER_BATCH));
    }
    per_decode.sort_by(f64::total_cmp);
    println!(
        "{name:<8} {:>4} bytes  {:>7.0} ns per decode ({:.0}–{:.0})",
        body.len(),
        per_decode[BATCHES / 2],
        per_decode[0],
        per_decode[BATCHES - 1]
    );
}

fn main() {
    // The payload `muster bench` enqueues: 256 bytes of JSON, mostly one string.
    let head = "{\"t\":1733140000000,\"pad\":\"";
    let payload = format!("{head}{}\"}}", "x".repeat(256 - head.len() - 2));
    let mut task = NewTask::new(serde_json::value::RawValue::from_string(payload).expect("JSON"));
    task.idempotency_key = Some("01JDZ3QW4X5Y6Z7A8B9C0D1E2F".into());
    let enqueue = Enqueue {
        queue: "bench".into(),
        tasks: vec![task],
    };
    time("enqueue", &frame_of(&enqueue));
    let ack = Ack {
        task: "01JDZ3QW4X5Y6Z7A8B9C0D1E2F".into(),
        epoch: 1,
        result: None,
    };
    time("ack", &frame_of(&ack));
    let renew = Renew {
        task: "01JDZ3QW4X5Y6Z7A8B9C0D1E2F".into(),
        epoch: 1,
        extend_ms: None,
        progress: None,
    };
    time("renew", &frame_of(&renew));
}
