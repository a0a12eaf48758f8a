//! A producer: enqueues N jobs on a queue and waits for their results.
//!
//! ```sh
//! cargo run -p muster-sdk --example producer -- jobs 10
//! ```
//! The daemon is found as the CLI finds it (`ConnectOptions::from_env`): `MUSTER_ADDR`,
//! `MUSTER_DATA`, `MUSTER_CA`, `MUSTER_PIN`, `MUSTER_TOKEN`, `MUSTER_TOKEN_FILE`.

use muster_sdk::{Client, ConnectOptions, ErrorCode, NewTask, QueuePatch};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let queue = args.next().unwrap_or_else(|| "jobs".into());
    let count: u64 = args.next().map_or(Ok(10), |n| n.parse())?;
    let client = Client::connect(ConnectOptions::from_env()).await?;
    match client.queue_create(&queue, QueuePatch::default()).await {
        Ok(_) => {}
        Err(e) if e.code() == Some(ErrorCode::AlreadyExists) => {}
        Err(e) => return Err(e.into()),
    }
    let tasks = (0..count)
        .map(|n| {
            muster_sdk::json(&serde_json::json!({"job": n, "steps": 20, "step_ms": 100}))
                .map(NewTask::new)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let ids: Vec<String> = client
        .enqueue_batch(&queue, tasks)
        .await?
        .into_iter()
        .map(|t| t.id)
        .collect();
    println!("enqueued {} tasks on {queue}", ids.len());
    let reply = client.wait(ids, 300_000).await?;
    for t in reply.finished {
        println!(
            "{}\t{}\t{}",
            t.id,
            t.state,
            t.result.as_ref().map_or("-", |r| r.get())
        );
    }
    if !reply.pending.is_empty() {
        println!("{} tasks still unfinished", reply.pending.len());
    }
    Ok(())
}
