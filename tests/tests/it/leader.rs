//! Finding a cluster's leader: stand-in cluster nodes (a QUIC server with a real
//! daemon's certificate that answers `hello` with a `cluster` object and every other
//! request with `not_leader`) next to a real single daemon.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use muster_protocol::ops::ClusterHello;
use muster_sdk::connect::FIND_LEADER_TIMEOUT;
use muster_sdk::{
    Client, ConnectOptions, ErrorCode, NewTask, Outcome, QueuePatch, TaskState, Worker,
    WorkerConfig,
};
use muster_tests::Daemon;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::security::read_frame;

/// A stand-in cluster node on a loopback port; it stops when dropped.
struct Node {
    addr: String,
    /// `hello`s answered so far.
    hellos: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The node's `hello` answer, and the leader address its `not_leader` errors name.
fn hello(node: u64, term: u64, leader: Option<u64>, leader_addr: Option<&str>) -> ClusterHello {
    ClusterHello {
        cluster_id: "test".into(),
        node,
        term,
        leader,
        leader_addr: leader_addr.map(Into::into),
    }
}

/// Starts a stand-in node presenting the certificate and key of `d`'s data directory,
/// so clients that trust `d` trust it too.
fn node(d: &Daemon, cluster: ClusterHello) -> Node {
    node_with(d, move |_| cluster.clone())
}

/// A stand-in node whose view of the cluster changes: `view(n)` is what it says (in its
/// `hello` reply and its `not_leader` errors) after `n` hellos.
fn node_with(d: &Daemon, view: impl Fn(usize) -> ClusterHello + Send + Sync + 'static) -> Node {
    let view = Arc::new(view);
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(d.data().join(muster_protocol::CERT_FILE))
            .expect("cert.pem")
            .collect::<Result<_, _>>()
            .expect("certificates");
    let key =
        PrivateKeyDer::from_pem_file(d.data().join(muster_protocol::KEY_FILE)).expect("key.pem");
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .expect("TLS 1.3")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("the daemon's certificate");
    tls.alpn_protocols = vec![muster_protocol::ALPN.to_vec()];
    let config = quinn::ServerConfig::with_crypto(Arc::new(
        quinn::crypto::rustls::QuicServerConfig::try_from(tls).expect("QUIC TLS"),
    ));
    let endpoint = quinn::Endpoint::server(config, ([127, 0, 0, 1], 0).into()).expect("endpoint");
    let addr = endpoint.local_addr().expect("its address").to_string();
    let hellos = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&hellos);
    let task = tokio::spawn(async move {
        while let Some(incoming) = endpoint.accept().await {
            let (view, counted) = (Arc::clone(&view), Arc::clone(&counted));
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                let Ok((mut send, mut recv)) = conn.accept_bi().await else {
                    return;
                };
                while let Some(req) = read_frame(&mut recv).await {
                    let cluster = view(counted.load(Ordering::SeqCst));
                    let reply = if req["op"] == "hello" {
                        counted.fetch_add(1, Ordering::SeqCst);
                        serde_json::json!({
                            "id": req["id"], "ok": true, "version": 1,
                            "server": "stand-in", "cluster": cluster,
                        })
                    } else {
                        let mut error = serde_json::json!({
                            "code": "not_leader",
                            "message": format!("node {} is not the leader", cluster.node),
                        });
                        if let Some(leader) = &cluster.leader_addr {
                            error["leader"] = leader.as_str().into();
                        }
                        serde_json::json!({"id": req["id"], "ok": false, "error": error})
                    };
                    let body = serde_json::to_vec(&reply).expect("JSON");
                    let mut frame = u32::try_from(body.len())
                        .expect("a small frame")
                        .to_be_bytes()
                        .to_vec();
                    frame.extend(body);
                    if send.write_all(&frame).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Node { addr, hellos, task }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_leads_the_client_to_the_leader_it_names() {
    let d = Daemon::start();
    // Given only a follower's address, the client goes where the follower points: here
    // the single daemon, which names no cluster.
    let follower = node(&d, hello(2, 4, Some(1), Some(&d.addr)));
    let client = Client::connect(ConnectOptions {
        addr: follower.addr.clone(),
        ..d.options()
    })
    .await
    .expect("reaching the leader the follower names");
    assert_eq!(client.cluster(), None);
    assert!(client.queue_list().await.expect("served").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_is_kept_among_the_addresses_and_a_follower_names_it_in_errors() {
    let d = Daemon::start();
    let leader = node(&d, hello(1, 4, Some(1), None));
    let follower = node(&d, hello(2, 4, Some(1), Some(&leader.addr)));
    let electing = node(&d, hello(3, 5, None, None));
    let client = Client::connect(ConnectOptions {
        addr: format!("{},{},{}", electing.addr, follower.addr, leader.addr),
        ..d.options()
    })
    .await
    .expect("the leader");
    assert_eq!(client.cluster(), Some(hello(1, 4, Some(1), None)));
    // One node's own view: the follower, whose refusals name the leader.
    let one = Client::connect_node(ConnectOptions {
        addr: follower.addr.clone(),
        ..d.options()
    })
    .await
    .expect("the follower itself");
    assert_eq!(
        one.cluster(),
        Some(hello(2, 4, Some(1), Some(&leader.addr)))
    );
    match one.queue_list().await {
        Err(muster_sdk::Error::Server(e)) => {
            assert_eq!(e.code, ErrorCode::NotLeader);
            assert_eq!(e.leader.as_deref(), Some(leader.addr.as_str()));
            assert_eq!(e.to_string(), "not_leader: node 2 is not the leader");
        }
        other => panic!("expected not_leader, got {:?}", other.map(|q| q.len())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_leader_the_client_gives_up_naming_what_each_node_said() {
    let d = Daemon::start();
    let a = node(&d, hello(1, 5, None, None));
    let b = node(&d, hello(2, 5, Some(1), None));
    let started = Instant::now();
    let err = Client::connect(ConnectOptions {
        addr: format!("{},{}", a.addr, b.addr),
        ..d.options()
    })
    .await
    .err()
    .expect("no node leads");
    let waited = started.elapsed();
    assert!(
        waited >= FIND_LEADER_TIMEOUT - Duration::from_millis(200)
            && waited < FIND_LEADER_TIMEOUT + Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "connect: no leader found among {a},{b} within 10 s: {a}: node 1 (term 5) knows no leader; {b}: node 2 (term 5) follows node 1, address unknown",
            a = a.addr,
            b = b.addr
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_told_not_leader_goes_to_the_new_leader_and_works_there() {
    let d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("jobs", QueuePatch::default())
        .await
        .expect("queue");
    let id = client
        .enqueue("jobs", NewTask::new(muster_sdk::json(&1).expect("json")))
        .await
        .expect("enqueue")
        .id;
    // The node says it leads at the first hello and refuses the session (not_leader);
    // from then on it names the daemon as the new leader.
    let new_leader = d.addr.clone();
    let deposed = node_with(&d, move |hellos| {
        if hellos == 0 {
            hello(1, 4, Some(1), None)
        } else {
            hello(1, 5, Some(2), Some(&new_leader))
        }
    });
    let worker = Worker::new(
        ConnectOptions {
            addr: deposed.addr.clone(),
            ..d.options()
        },
        WorkerConfig::new("follower-of-leaders", ["jobs"]),
    );
    let handle = worker.handle();
    let running = tokio::spawn(worker.run(|_task| async { Outcome::Ack(None) }));
    let reply = client.wait(vec![id.clone()], 30_000).await.expect("wait");
    assert_eq!(reply.finished.len(), 1, "{:?}", reply.pending);
    assert_eq!(reply.finished[0].state, TaskState::Done);
    assert!(deposed.hellos.load(Ordering::SeqCst) >= 2);
    handle.shutdown();
    running
        .await
        .expect("the worker's task")
        .expect("a clean stop, not the not_leader refusal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_address_refuses_the_client_gives_up_at_once() {
    let (d1, d2) = (Daemon::start(), Daemon::start());
    // One CA file trusting both daemons' certificates.
    let dir = tempfile::tempdir().expect("a directory");
    let both = dir.path().join("both.pem");
    let pem = |d: &Daemon| {
        std::fs::read_to_string(d.data().join(muster_protocol::CERT_FILE)).expect("cert.pem")
    };
    std::fs::write(&both, pem(&d1) + &pem(&d2)).expect("writing the CA file");
    let started = Instant::now();
    let err = Client::connect(ConnectOptions {
        addr: format!("{},{}", d1.addr, d2.addr),
        trust: muster_sdk::Trust::CaFile(both),
        token: Some("wrong-token-0123456789abcdef".into()),
        ..d1.options()
    })
    .await
    .err()
    .expect("a wrong token everywhere");
    assert!(started.elapsed() < Duration::from_secs(5), "{err}");
    let text = err.to_string();
    let prefix = format!(
        "connect: no leader found among {},{} (every address refused): ",
        d1.addr, d2.addr
    );
    assert!(text.starts_with(&prefix), "{text}");
    for d in [&d1, &d2] {
        assert!(
            text.contains(&format!("{}: unauthorized: ", d.addr)),
            "{text}"
        );
    }
    assert_eq!(text.lines().count(), 1, "{text}");
}
