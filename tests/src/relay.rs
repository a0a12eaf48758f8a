//! A UDP relay between one agent and the daemon, with a switch that partitions them.
//!
//! The agent connects to the relay's address instead of the daemon's. Every client
//! source address (one per QUIC endpoint, so one per agent process) gets an upstream
//! socket of its own, so the daemon sees one peer per client, as without the relay.
//! [`Relay::partition`] blackholes both directions until [`Relay::heal`]: QUIC sees a
//! cut cable, not a closed port. [`Relay::cut`] blackholes one direction only. The relay runs on the caller's tokio runtime and stops
//! when dropped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio::task::AbortHandle;

/// Largest UDP datagram relayed.
const MAX_DATAGRAM: usize = 65_535;

/// A client heard from in neither direction for this long is forgotten (longer than
/// QUIC's idle timeout, so only dead connections go).
const CLIENT_IDLE: Duration = Duration::from_secs(60);

/// Most clients one relay keeps; the least recently heard from goes first.
const MAX_CLIENTS: usize = 64;

/// Pause after a socket error before reading again, so a persistent error cannot spin.
const ERROR_PAUSE: Duration = Duration::from_millis(10);

/// A running relay; dropping it stops it.
pub struct Relay {
    addr: SocketAddr,
    shared: Arc<Shared>,
    front_task: AbortHandle,
}

/// What the relay's tasks share.
struct Shared {
    /// The socket agents send to.
    front: UdpSocket,
    /// The daemon.
    upstream: SocketAddr,
    /// True while datagrams from the clients to the daemon are dropped.
    cut_forward: AtomicBool,
    /// True while datagrams from the daemon to the clients are dropped.
    cut_back: AtomicBool,
    clients: Mutex<HashMap<SocketAddr, Client>>,
}

/// One client's upstream socket and the task copying the daemon's answers back.
struct Client {
    back: Arc<UdpSocket>,
    task: AbortHandle,
    last: Instant,
}

impl Relay {
    /// Starts a relay on `127.0.0.1:0` forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Relay> {
        let front = UdpSocket::bind("127.0.0.1:0").await?;
        let addr = front.local_addr()?;
        let shared = Arc::new(Shared {
            front,
            upstream,
            cut_forward: AtomicBool::new(false),
            cut_back: AtomicBool::new(false),
            clients: Mutex::new(HashMap::new()),
        });
        let front_task = tokio::spawn(forward_front(Arc::clone(&shared))).abort_handle();
        Ok(Relay {
            addr,
            shared,
            front_task,
        })
    }

    /// The address agents connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every datagram in both directions from now on.
    pub fn partition(&self) {
        self.cut(Direction::Forward);
        self.cut(Direction::Back);
    }

    /// Drops every datagram going `direction` from now on (the other direction is
    /// unchanged).
    pub fn cut(&self, direction: Direction) {
        self.shared.switch(direction).store(true, Ordering::SeqCst);
    }

    /// Forwards datagrams both ways again.
    pub fn heal(&self) {
        self.shared.cut_forward.store(false, Ordering::SeqCst);
        self.shared.cut_back.store(false, Ordering::SeqCst);
    }

    /// True while partitioned (both directions cut).
    pub fn is_partitioned(&self) -> bool {
        self.shared.cut_forward.load(Ordering::SeqCst)
            && self.shared.cut_back.load(Ordering::SeqCst)
    }
}

/// One direction through a relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the clients to the daemon.
    Forward,
    /// From the daemon back to the clients.
    Back,
}

impl Shared {
    fn switch(&self, direction: Direction) -> &AtomicBool {
        match direction {
            Direction::Forward => &self.cut_forward,
            Direction::Back => &self.cut_back,
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.front_task.abort();
        for (_, client) in lock(&self.shared.clients).drain() {
            client.task.abort();
        }
    }
}

/// Copies datagrams from agents to the daemon, each client on its own upstream socket.
async fn forward_front(shared: Arc<Shared>) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, from) = match shared.front.recv_from(&mut buf).await {
            Ok(got) => got,
            Err(_) => {
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
        };
        if shared.cut_forward.load(Ordering::SeqCst) {
            continue;
        }
        let Some(back) = upstream_for(&shared, from).await else {
            continue;
        };
        // A lost datagram is what UDP allows; QUIC retransmits.
        let _ = back.send(&buf[..n]).await;
    }
}

/// The upstream socket of client `from`, made (with its return task) on first use.
async fn upstream_for(shared: &Arc<Shared>, from: SocketAddr) -> Option<Arc<UdpSocket>> {
    if let Some(c) = lock(&shared.clients).get_mut(&from) {
        c.last = Instant::now();
        return Some(Arc::clone(&c.back));
    }
    let back = UdpSocket::bind("127.0.0.1:0").await.ok()?;
    back.connect(shared.upstream).await.ok()?;
    let back = Arc::new(back);
    let task = tokio::spawn(forward_back(Arc::clone(shared), Arc::clone(&back), from));
    let mut clients = lock(&shared.clients);
    let now = Instant::now();
    clients.retain(|_, c| {
        let keep = now.duration_since(c.last) < CLIENT_IDLE;
        if !keep {
            c.task.abort();
        }
        keep
    });
    while clients.len() >= MAX_CLIENTS {
        let Some(oldest) = clients.iter().min_by_key(|(_, c)| c.last).map(|(a, _)| *a) else {
            break;
        };
        if let Some(c) = clients.remove(&oldest) {
            c.task.abort();
        }
    }
    clients.insert(
        from,
        Client {
            back: Arc::clone(&back),
            task: task.abort_handle(),
            last: now,
        },
    );
    Some(back)
}

/// Copies the daemon's datagrams for one client back to it.
async fn forward_back(shared: Arc<Shared>, back: Arc<UdpSocket>, client: SocketAddr) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let n = match back.recv(&mut buf).await {
            Ok(n) => n,
            Err(_) => {
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
        };
        if shared.cut_back.load(Ordering::SeqCst) {
            continue;
        }
        if let Some(c) = lock(&shared.clients).get_mut(&client) {
            c.last = Instant::now();
        }
        let _ = shared.front.send_to(&buf[..n], client).await;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn datagrams_pass_both_ways_until_partitioned_and_again_once_healed() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let relay = Relay::start(server.local_addr().unwrap()).await.unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        client.connect(relay.addr()).await.unwrap();
        let mut buf = [0u8; 16];
        let wait = Duration::from_secs(5);

        client.send(b"ping").await.unwrap();
        let (n, peer) = tokio::time::timeout(wait, server.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"ping");
        server.send_to(b"pong", peer).await.unwrap();
        let n = tokio::time::timeout(wait, client.recv(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"pong");

        relay.partition();
        assert!(relay.is_partitioned());
        client.send(b"lost").await.unwrap();
        server.send_to(b"lost", peer).await.unwrap();
        // Nothing can arrive: wait a moment for what would.
        let quiet = Duration::from_millis(200);
        assert!(
            tokio::time::timeout(quiet, server.recv_from(&mut buf))
                .await
                .is_err()
        );
        assert!(
            tokio::time::timeout(quiet, client.recv(&mut buf))
                .await
                .is_err()
        );

        relay.heal();
        client.send(b"back").await.unwrap();
        // A relay slower than the quiet period may still read "lost" after the heal and
        // pass it on; what matters is that nothing passed while partitioned.
        loop {
            let (n, again) = tokio::time::timeout(wait, server.recv_from(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(again, peer, "one upstream socket per client");
            if &buf[..n] == b"back" {
                break;
            }
        }
    }

    #[tokio::test]
    async fn a_one_way_cut_drops_only_its_direction() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let relay = Relay::start(server.local_addr().unwrap()).await.unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        client.connect(relay.addr()).await.unwrap();
        let mut buf = [0u8; 16];
        let wait = Duration::from_secs(5);

        relay.cut(Direction::Back);
        assert!(!relay.is_partitioned());
        client.send(b"up").await.unwrap();
        let (n, peer) = tokio::time::timeout(wait, server.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"up");
        server.send_to(b"down", peer).await.unwrap();
        // Nothing can arrive: wait a moment for what would.
        assert!(
            tokio::time::timeout(Duration::from_millis(200), client.recv(&mut buf))
                .await
                .is_err()
        );

        relay.heal();
        server.send_to(b"again", peer).await.unwrap();
        let n = tokio::time::timeout(wait, client.recv(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"again");
    }
}
