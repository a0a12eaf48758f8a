//! A cluster of real `musterd` nodes on loopback, and the total-queue checker against
//! one under a nemesis of kills and partitions.
//!
//! [`Cluster::start`] starts node 1 with `--bootstrap`, waits until it leads, then
//! starts every other node and adds it with `muster cluster add` (which waits until
//! the node caught up and promotes it to voter). Every node has its own data
//! directory; all share one cluster secret and one identity (node 1's certificate, key
//! and local token are copied into every other data directory before its first start,
//! and into a client directory), so one [`ConnectOptions`] trusts and authenticates
//! against every node, as a single [`crate::Daemon`]'s does.
//!
//! [`Cluster::start_relayed`] puts a [`Relay`] on every path: one per ordered pair of
//! nodes (node i reaches node j through `--route j=RELAY`; the advertised cluster
//! addresses stay the real ones) and one in front of each node's client port (its
//! `--advertise` address, so `not_leader` and `hello` name the relay). The relays then
//! partition a node from the others, or cut it off from its clients.
//!
//! Ports are picked once, below the kernel's ephemeral range before the first start
//! (every address must be known before any node starts, to set up the relays and
//! routes), held by the harness's own sockets until each node's first start, and kept
//! across restarts. The harness itself finds the leader through each node's real client
//! address, so cutting clients off does not blind it.
//!
//! - `seam`: the wire and CLI shapes the cluster branches add (hello's `cluster`,
//!   `not_leader`'s `leader`, `cluster status --json`), read in one place.
//! - `check`: the checker against a relayed cluster, with its nemesis.

mod check;
mod seam;

pub use check::{Config, Fault, check};
pub use seam::{
    ClusterHello, NodeStatus, PROBE_TIMEOUT, Probe, Served, cluster_hello, connect_leader,
    error_leader, node_status, reply_error_code, reply_error_leader,
};

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use muster_sdk::{Client, ConnectOptions, Trust};
use rand::Rng;

use crate::free_port_below_ephemeral;
use crate::relay::Relay;

/// The cluster id of every test cluster.
pub const CLUSTER_ID: &str = "muster-test";

/// A node's id (`--node-id`): 1 to the cluster's size.
pub type NodeId = u64;

/// Random bytes in the shared cluster secret (the daemon requires at least 32).
const SECRET_BYTES: usize = 48;

/// Longest a node may take to start serving.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest the cluster may go without a leader that a majority follows.
pub const LEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause between two rounds of probes while waiting for a leader or a status.
const POLL_PAUSE: Duration = Duration::from_millis(50);

/// Longest a node's start waits for its ports to be free. A child process another test
/// is starting holds a copy of every socket this process has open until it executes its
/// program (sockets close on exec, not on fork), so a port just let go of can still be
/// bound for a few milliseconds; one taken for longer is taken by someone else.
const PORT_WAIT: Duration = Duration::from_secs(2);

/// Longest one CLI command may run (`cluster add` waits until the node caught up).
const CLI_TIMEOUT: Duration = Duration::from_secs(120);

/// Longest [`Cluster::client`] keeps trying to connect through the address list.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Most of a node's warning lines printed when a test fails.
const LOG_LINES_ON_FAILURE: usize = 200;

/// A log line containing any of these is printed when a test fails.
const FAILURE_MARKERS: [&str; 3] = ["WARN", "ERROR", "panicked"];

/// Nodes on loopback; dropping it kill -9s every node it started.
pub struct Cluster {
    /// Holds the secret, the client directory and every node's data directory.
    root: tempfile::TempDir,
    /// Every node started, in id order (`nodes[i].id == i + 1`).
    nodes: Vec<Node>,
    /// The relays, for a cluster made by [`Cluster::start_relayed`].
    relays: Option<Relays>,
    /// Flags every node gets (e.g. `--cluster-snapshot-every 100`).
    extra: Vec<String>,
    /// With tokens configured ([`Cluster::start_secured`]): the token every client of
    /// the harness presents (an admin of every queue).
    token: Option<String>,
}

/// The tokens of a cluster started by [`Cluster::start_secured`]: an admin of every
/// queue (the harness's own clients) and an admin confined to queues `jobs*`.
pub const SECURED_CONFIG: &str = r#"
[[tokens]]
name = "admin"
token = "cluster-admin-token-0123456789"
roles = ["admin"]

[[tokens]]
name = "jobs-admin"
token = "jobs-admin-token-0123456789ab"
roles = ["admin"]
queues = ["jobs", "jobs.*"]
"#;

/// The admin of every queue of [`SECURED_CONFIG`].
pub const SECURED_ADMIN: &str = "cluster-admin-token-0123456789";

/// The admin confined to queues `jobs*` of [`SECURED_CONFIG`].
pub const QUEUE_ADMIN: &str = "jobs-admin-token-0123456789ab";

/// One node: where it lives and listens, and its process while it runs.
struct Node {
    id: NodeId,
    data: PathBuf,
    /// The client port it binds.
    listen: SocketAddr,
    /// The node-to-node port it binds (and advertises).
    cluster_listen: SocketAddr,
    /// The client address clients are given: `listen`, or its relay.
    advertise: SocketAddr,
    /// `--route` flags: the relay through which it reaches each other node.
    routes: Vec<(NodeId, SocketAddr)>,
    /// True once `cluster add` made it a voter (node 1: once it bootstrapped).
    member: bool,
    /// The musterd it runs when not this build's (a previous release, for a rolling
    /// upgrade: see [`UPGRADE_FROM_VAR`]).
    binary: Option<PathBuf>,
    process: Option<Running>,
    /// Until its first start, the two sockets that keep its ports from anyone else
    /// since they were chosen (see [`pick_ports`]).
    reserved: Option<Reserved>,
}

/// Set to the path of another build's `musterd` (a previous release), every node of
/// a cluster starts on it, until [`Cluster::upgrade`] moves it to this build.
pub const UPGRADE_FROM_VAR: &str = "MUSTER_TEST_UPGRADE_FROM";

/// Set to a directory, every node's whole log is copied there (`node-ID.log`, the last
/// cluster of the test process wins) when its cluster is dropped, for reading a run's
/// elections afterwards.
pub const KEEP_LOGS_VAR: &str = "MUSTER_TEST_KEEP_LOGS";

/// Longest a node may take to exit after SIGTERM ([`Cluster::stop`]).
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A running node's process and the thread copying its log.
struct Running {
    child: Child,
    log_thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// kill -9, reap, and wait until its log is complete on disk.
    fn kill9(&mut self) {
        // An error means it exited already; reaping below tells.
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(t) = self.log_thread.take() {
            // The thread ends at the log's EOF; a panic in it only lost log lines.
            let _ = t.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Every relay of a relayed cluster.
struct Relays {
    /// In front of each node's client port, by node id − 1.
    clients: Vec<Relay>,
    /// `(from, to, relay)`: the path from node `from` to node `to`'s cluster port.
    paths: Vec<(NodeId, NodeId, Relay)>,
}

/// The ports a node will bind, chosen before any node starts.
#[derive(Debug, Clone, Copy)]
struct Ports {
    listen: SocketAddr,
    cluster_listen: SocketAddr,
}

/// A node's client and cluster sockets, bound by the harness from when its ports are
/// chosen until just before its process starts.
#[derive(Debug)]
struct Reserved {
    _listen: UdpSocket,
    _cluster_listen: UdpSocket,
}

/// The node a majority follows, as [`Cluster::leader`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// Its id.
    pub node: NodeId,
    /// Its term.
    pub term: u64,
    /// The client address clients are given for it (its relay's, in a relayed cluster).
    pub addr: String,
}

impl Cluster {
    /// Starts `nodes` nodes connected directly.
    pub async fn start(nodes: usize) -> Cluster {
        Cluster::start_with(nodes, &[]).await
    }

    /// [`Cluster::start`] with extra flags on every node.
    pub async fn start_with(nodes: usize, extra: &[&str]) -> Cluster {
        Cluster::start_on(nodes, false, extra).await
    }

    /// Starts `nodes` nodes with a [`Relay`] on every node-to-node path and in front of
    /// every node's client port.
    pub async fn start_relayed(nodes: usize) -> Cluster {
        Cluster::start_on(nodes, true, &[]).await
    }

    /// [`Cluster::start_relayed`] with the tokens of [`SECURED_CONFIG`]: the harness's
    /// clients present [`SECURED_ADMIN`].
    pub async fn start_secured(nodes: usize) -> Cluster {
        Cluster::start_with_tokens(nodes, true, &[], true).await
    }

    async fn start_on(count: usize, relayed: bool, extra: &[&str]) -> Cluster {
        Cluster::start_with_tokens(count, relayed, extra, false).await
    }

    async fn start_with_tokens(
        count: usize,
        relayed: bool,
        extra: &[&str],
        secured: bool,
    ) -> Cluster {
        assert!(count >= 1, "a cluster has at least one node");
        let root = tempfile::tempdir().expect("temporary cluster directory");
        make_private_dir(root.path());
        write_secret(&root.path().join("cluster.secret"));
        make_private_dir(&root.path().join("client"));
        let mut extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        if secured {
            let config = root.path().join("muster.toml");
            std::fs::write(&config, SECURED_CONFIG).expect("writing the tokens");
            extra.extend(["--config".to_owned(), config.display().to_string()]);
        }
        let (ports, reserved) = pick_ports(count);
        let relays = if relayed {
            Some(Relays::start(&ports).await)
        } else {
            None
        };
        let mut cluster = Cluster {
            root,
            nodes: Vec::new(),
            relays,
            extra,
            token: secured.then(|| SECURED_ADMIN.to_owned()),
        };
        for (i, (p, reserved)) in ports.iter().zip(reserved).enumerate() {
            let id = i as NodeId + 1;
            let (advertise, routes) = match &cluster.relays {
                Some(r) => (r.clients[i].addr(), r.routes_from(id)),
                None => (p.listen, Vec::new()),
            };
            let data = cluster.root.path().join(format!("node-{id}"));
            make_private_dir(&data);
            cluster.nodes.push(Node {
                id,
                data,
                listen: p.listen,
                cluster_listen: p.cluster_listen,
                advertise,
                routes,
                member: false,
                binary: std::env::var_os(UPGRADE_FROM_VAR).map(PathBuf::from),
                process: None,
                reserved: Some(reserved),
            });
        }
        cluster.spawn(1, &["--bootstrap"]).await;
        cluster.nodes[0].member = true;
        // Every node and every client (the harness's probes too) shares node 1's
        // identity, made at its first start.
        let first = cluster.nodes[0].data.clone();
        copy_identity(&first, &cluster.client_dir(), false, !secured);
        cluster.leader().await;
        for id in 2..=count as NodeId {
            copy_identity(&first, &cluster.node(id).data, true, !secured);
            cluster.spawn(id, &[]).await;
            cluster.join(id).await;
        }
        cluster
    }

    /// Starts one more node and adds it (only to a cluster that is not relayed: the
    /// routes of running nodes are fixed at their start). Returns its id.
    pub async fn add_node(&mut self) -> NodeId {
        assert!(
            self.relays.is_none(),
            "add_node works on a cluster without relays only"
        );
        let id = self.nodes.len() as NodeId + 1;
        let (ports, mut reserved) = pick_ports(1);
        let p = ports[0];
        let data = self.root.path().join(format!("node-{id}"));
        make_private_dir(&data);
        copy_identity(&self.node(1).data, &data, true, self.token.is_none());
        self.nodes.push(Node {
            id,
            data,
            listen: p.listen,
            cluster_listen: p.cluster_listen,
            advertise: p.listen,
            routes: Vec::new(),
            member: false,
            binary: None,
            process: None,
            reserved: reserved.pop(),
        });
        self.spawn(id, &[]).await;
        self.join(id).await;
        id
    }

    /// Adds a started node with `muster cluster add` through the members' addresses,
    /// then waits until a majority of the new membership follows one leader.
    async fn join(&mut self, id: NodeId) {
        let node = self.node(id);
        let (advertise, cluster_listen) =
            (node.advertise.to_string(), node.cluster_listen.to_string());
        let members = self.addrs();
        let out = self
            .cli_addr(
                &members,
                &[
                    "cluster",
                    "add",
                    &id.to_string(),
                    "--node-addr",
                    &advertise,
                    "--cluster-addr",
                    &cluster_listen,
                ],
            )
            .await;
        assert!(
            out.status.success(),
            "muster cluster add {id} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        self.node_mut(id).member = true;
        self.leader().await;
    }

    /// The ids of the cluster's members (every node added so far).
    pub fn node_ids(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|n| n.member)
            .map(|n| n.id)
            .collect()
    }

    /// True while the node's process runs.
    pub fn is_running(&self, id: NodeId) -> bool {
        self.node(id).process.is_some()
    }

    /// kill -9 of one node; it stays down until [`Cluster::restart`].
    pub fn kill9(&mut self, id: NodeId) {
        let mut running = self
            .node_mut(id)
            .process
            .take()
            .unwrap_or_else(|| panic!("node {id} is not running"));
        running.kill9();
    }

    /// Stops one node as its service manager would (SIGTERM, then waiting for it to
    /// exit); it stays down until [`Cluster::restart`]. Returns its exit code.
    pub fn stop(&mut self, id: NodeId) -> Option<i32> {
        let mut running = self
            .node_mut(id)
            .process
            .take()
            .unwrap_or_else(|| panic!("node {id} is not running"));
        crate::signal_pid(running.child.id(), "-TERM");
        let deadline = Instant::now() + STOP_TIMEOUT;
        let code = loop {
            if let Some(status) = running.child.try_wait().expect("try_wait on a node") {
                break status.code();
            }
            assert!(
                Instant::now() < deadline,
                "node {id} still running {STOP_TIMEOUT:?} after SIGTERM"
            );
            std::thread::sleep(POLL_PAUSE);
        };
        // Reaped already: this only waits for the log to be complete.
        running.kill9();
        code
    }

    /// Whether the node runs another build's musterd ([`UPGRADE_FROM_VAR`]).
    pub fn runs_previous(&self, id: NodeId) -> bool {
        self.node(id).binary.is_some()
    }

    /// From its next start on, the (stopped) node runs this build's musterd.
    pub fn upgrade(&mut self, id: NodeId) {
        assert!(!self.is_running(id), "node {id} is running: stop it first");
        self.node_mut(id).binary = None;
    }

    /// Starts a killed node again on its data directory and ports.
    pub async fn restart(&mut self, id: NodeId) {
        self.restart_with(id, &[]).await;
    }

    /// [`Cluster::restart`] with more flags for this start only.
    pub async fn restart_with(&mut self, id: NodeId, flags: &[&str]) {
        assert!(!self.is_running(id), "node {id} is running already");
        self.spawn(id, flags).await;
    }

    /// The node's process id.
    pub fn pid(&self, id: NodeId) -> u32 {
        self.node(id)
            .process
            .as_ref()
            .unwrap_or_else(|| panic!("node {id} is not running"))
            .child
            .id()
    }

    /// The node's data directory.
    pub fn data(&self, id: NodeId) -> &Path {
        &self.node(id).data
    }

    /// Everything the node logged so far (complete for a stopped node).
    pub fn log(&self, id: NodeId) -> String {
        std::fs::read_to_string(self.node(id).data.join("musterd.log")).unwrap_or_default()
    }

    /// The client address clients are given for the node (its relay's, if relayed).
    pub fn client_addr(&self, id: NodeId) -> String {
        self.node(id).advertise.to_string()
    }

    /// The node-to-node address the node binds and advertises.
    pub fn cluster_addr(&self, id: NodeId) -> String {
        self.node(id).cluster_listen.to_string()
    }

    /// The client addresses of every member, comma-separated.
    pub fn addrs(&self) -> String {
        self.nodes
            .iter()
            .filter(|n| n.member)
            .map(|n| n.advertise.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Connect options for the whole cluster (the SDK finds the leader among
    /// [`Cluster::addrs`]), trusting and authenticating as on a single daemon.
    pub fn options(&self) -> ConnectOptions {
        self.options_for(self.addrs())
    }

    /// Connect options for the whole cluster through every node's real client address
    /// (the port it binds), not the relays it advertises.
    pub fn direct_options(&self) -> ConnectOptions {
        let addrs: Vec<String> = self.nodes.iter().map(|n| n.listen.to_string()).collect();
        self.options_for(addrs.join(","))
    }

    /// The client port the node binds (behind its advertised relay when relayed).
    pub fn listen_addr(&self, id: NodeId) -> String {
        self.node(id).listen.to_string()
    }

    /// Connect options for exactly one node, through its client address.
    pub fn node_options(&self, id: NodeId) -> ConnectOptions {
        self.options_for(self.client_addr(id))
    }

    fn options_for(&self, addr: String) -> ConnectOptions {
        ConnectOptions {
            addr,
            trust: Trust::DataDir(self.client_dir()),
            token: self.token.clone(),
            ..ConnectOptions::default()
        }
    }

    /// An SDK client connected through the address list, retried for up to
    /// [`CLIENT_TIMEOUT`] (e.g. while a new leader is elected).
    pub async fn client(&self) -> Client {
        self.client_with(self.options()).await
    }

    /// [`Cluster::client`] through `options`' addresses.
    pub async fn client_with(&self, options: ConnectOptions) -> Client {
        let deadline = Instant::now() + CLIENT_TIMEOUT;
        loop {
            match Client::connect(options.clone()).await {
                Ok(client) => return client,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "no connection through {} within {CLIENT_TIMEOUT:?}: {e}",
                    options.addr
                ),
            }
            tokio::time::sleep(POLL_PAUSE).await;
        }
    }

    /// A raw connection to exactly one node, through its client address.
    pub async fn probe(&self, id: NodeId) -> Probe {
        Probe::open(&self.node_options(id))
            .await
            .unwrap_or_else(|e| panic!("probing node {id}: {e}"))
    }

    /// What each running member's hello says now, through its real client address (a
    /// node that does not answer within [`PROBE_TIMEOUT`] is `None`).
    pub async fn hellos(&self) -> Vec<(NodeId, Option<ClusterHello>)> {
        let mut probes = tokio::task::JoinSet::new();
        for n in self
            .nodes
            .iter()
            .filter(|n| n.member && n.process.is_some())
        {
            let (id, options) = (n.id, self.options_for(n.listen.to_string()));
            probes.spawn(async move {
                let hello = Probe::open(&options).await.ok().and_then(|p| p.cluster());
                (id, hello)
            });
        }
        let mut views = Vec::new();
        while let Some(joined) = probes.join_next().await {
            views.push(joined.expect("a probe task"));
        }
        views.sort_by_key(|(id, _)| *id);
        views
    }

    /// Waits (up to [`LEADER_TIMEOUT`]) until one node leads and a majority of the
    /// members, itself included, name it the leader in its term; of several nodes that
    /// think they lead (one cut off and not told yet), the one with the highest term.
    pub async fn leader(&self) -> Leader {
        let deadline = Instant::now() + LEADER_TIMEOUT;
        let majority = self.node_ids().len() / 2 + 1;
        loop {
            let views = self.hellos().await;
            if let Some(leader) = agreed_leader(&views, majority) {
                return Leader {
                    addr: self.client_addr(leader.node),
                    node: leader.node,
                    term: leader.term,
                };
            }
            assert!(
                Instant::now() < deadline,
                "no leader that {majority} members follow within {LEADER_TIMEOUT:?}; last views: {views:?}"
            );
            tokio::time::sleep(POLL_PAUSE).await;
        }
    }

    /// One running member other than the leader, chosen by `pick` among them.
    pub fn follower(&self, leader: NodeId, pick: usize) -> NodeId {
        let followers: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|n| n.member && n.process.is_some() && n.id != leader)
            .map(|n| n.id)
            .collect();
        assert!(
            !followers.is_empty(),
            "no running follower of node {leader}"
        );
        followers[pick % followers.len()]
    }

    /// Blackholes every path to and from the node's cluster port.
    pub fn partition_node(&self, id: NodeId) {
        for r in self.relays().node_paths(id) {
            r.partition();
        }
    }

    /// Drops every node-to-node datagram on its way to the node, while what it sends
    /// still arrives: the others hear it, it hears none of them (a one-way loss).
    /// Undone by [`Cluster::heal_node`].
    pub fn deafen_node(&self, id: NodeId) {
        for (from, to, r) in &self.relays().paths {
            // A path carries `from`'s connection to `to`: what `from` sends goes
            // forward, what `to` answers comes back.
            if *to == id {
                r.cut(crate::relay::Direction::Forward);
            } else if *from == id {
                r.cut(crate::relay::Direction::Back);
            }
        }
    }

    /// Undoes [`Cluster::partition_node`] and [`Cluster::deafen_node`].
    pub fn heal_node(&self, id: NodeId) {
        for r in self.relays().node_paths(id) {
            r.heal();
        }
    }

    /// Blackholes the node's client relay: its clients lose it, the cluster does not.
    pub fn cut_clients(&self, id: NodeId) {
        self.relays().clients[id as usize - 1].partition();
    }

    /// Undoes [`Cluster::cut_clients`].
    pub fn restore_clients(&self, id: NodeId) {
        self.relays().clients[id as usize - 1].heal();
    }

    /// Heals every relay.
    pub fn heal_all(&self) {
        let relays = self.relays();
        for r in relays
            .clients
            .iter()
            .chain(relays.paths.iter().map(|(_, _, r)| r))
        {
            r.heal();
        }
    }

    /// Runs the CLI against the whole cluster (`MUSTER_ADDR` = [`Cluster::addrs`]).
    pub async fn cli(&self, args: &[&str]) -> Output {
        self.cli_addr(&self.addrs(), args).await
    }

    /// Starts a long-running CLI command (e.g. `muster work`) against the whole
    /// cluster, in its own process group; it is kill -9ed when dropped.
    pub fn spawn_cli(&self, args: &[&str]) -> crate::Proc {
        crate::Proc::spawn(self.cli_command(args))
    }

    /// The CLI with `args`, set up to talk to the whole cluster (as [`Cluster::cli`]),
    /// not started.
    pub fn cli_command(&self, args: &[&str]) -> std::process::Command {
        self.command_at(&self.addrs(), self.token.as_deref(), args)
    }

    /// The CLI with `args`, talking to `addr` with `token`, trusting the cluster's
    /// identity and nothing from the test's own environment.
    fn command_at(&self, addr: &str, token: Option<&str>, args: &[&str]) -> std::process::Command {
        let mut cmd = std::process::Command::new(crate::muster_bin());
        cmd.args(args)
            .env("MUSTER_ADDR", addr)
            .env("MUSTER_DATA", self.client_dir())
            .env_remove("MUSTER_PIN")
            .env_remove("MUSTER_CA")
            .env_remove("MUSTER_CONTEXT");
        if let Some(token) = token {
            cmd.env("MUSTER_TOKEN", token);
        }
        cmd
    }

    /// Runs the CLI against exactly one node, through its client address.
    pub async fn cli_node(&self, id: NodeId, args: &[&str]) -> Output {
        self.cli_addr(&self.client_addr(id), args).await
    }

    /// Runs the CLI against the whole cluster and returns its stdout, failing the test
    /// on a non-zero exit.
    pub async fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args).await;
        assert!(
            out.status.success(),
            "muster {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8 output")
    }

    /// Waits (up to [`LEADER_TIMEOUT`]) until node `id` follows the leader and has
    /// applied as far as the leader had when the wait began.
    pub async fn wait_caught_up(&self, id: NodeId) {
        let leader = self.leader().await;
        // Where the leader was when the wait began: under load it moves on meanwhile.
        let target = self.status(leader.node).await.applied;
        crate::until(
            LEADER_TIMEOUT,
            "the node catches up with the leader",
            || async move {
                let node = self.status(id).await;
                node.leader == Some(leader.node) && node.applied >= target
            },
        )
        .await;
    }

    /// One node's own view, from `muster --addr NODE cluster status --json`.
    pub async fn status(&self, id: NodeId) -> NodeStatus {
        let out = self.cli_node(id, &["--json", "cluster", "status"]).await;
        assert!(
            out.status.success(),
            "muster cluster status on node {id} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        node_status(&String::from_utf8_lossy(&out.stdout))
            .unwrap_or_else(|e| panic!("node {id}: {e}"))
    }

    /// Runs the CLI against the whole cluster presenting `token` instead of the
    /// harness's own.
    pub async fn cli_as(&self, token: &str, args: &[&str]) -> Output {
        self.cli_run(&self.addrs(), Some(token), args).await
    }

    async fn cli_addr(&self, addr: &str, args: &[&str]) -> Output {
        self.cli_run(addr, self.token.as_deref(), args).await
    }

    async fn cli_run(&self, addr: &str, token: Option<&str>, args: &[&str]) -> Output {
        let mut cmd = tokio::process::Command::from(self.command_at(addr, token, args));
        let run = cmd.stdin(Stdio::null()).kill_on_drop(true).output();
        tokio::time::timeout(CLI_TIMEOUT, run)
            .await
            .unwrap_or_else(|_| panic!("muster {args:?} did not finish within {CLI_TIMEOUT:?}"))
            .expect("running muster")
    }

    /// Where clients find the cluster's identity (`MUSTER_DATA`): node 1's certificate.
    pub fn client_dir(&self) -> PathBuf {
        self.root.path().join("client")
    }

    fn node(&self, id: NodeId) -> &Node {
        self.nodes
            .get((id as usize).wrapping_sub(1))
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes
            .get_mut((id as usize).wrapping_sub(1))
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    fn relays(&self) -> &Relays {
        self.relays
            .as_ref()
            .expect("partitions need a cluster made by Cluster::start_relayed")
    }

    /// Starts the node's process and waits until it listens; then checks that its ready
    /// file names the cluster port it was given.
    async fn spawn(&mut self, id: NodeId, flags: &[&str]) {
        let secret = self.root.path().join("cluster.secret");
        let extra = self.extra.clone();
        let node = self.node_mut(id);
        // At its first start its ports are let go of only now, just before its
        // process binds them: nobody else can have taken them since they were chosen
        // (a child process being started may hold a copy a moment longer: see
        // PORT_WAIT). Later starts find them as the last process left them.
        drop(node.reserved.take());
        let deadline = Instant::now() + PORT_WAIT;
        for addr in [node.listen, node.cluster_listen] {
            while let Err(e) = UdpSocket::bind(addr) {
                assert!(
                    Instant::now() < deadline,
                    "node {id}: port {addr} was taken by another process since the cluster chose it ({e})"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let ready_file = node.data.join("ready.json");
        // A kill -9 leaves the last one behind: it must not be read as this start's.
        let _ = std::fs::remove_file(&ready_file);
        let mut cmd = Command::new(node.binary.clone().unwrap_or_else(crate::musterd_bin));
        cmd.arg("--data")
            .arg(&node.data)
            .args(["--listen", &node.listen.to_string(), "--log-format", "json"])
            .arg("--ready-file")
            .arg(&ready_file)
            .args(["--cluster-id", CLUSTER_ID, "--node-id", &id.to_string()])
            .args(["--cluster-listen", &node.cluster_listen.to_string()])
            .arg("--cluster-secret-file")
            .arg(&secret)
            .args(["--advertise", &node.advertise.to_string()]);
        for (to, via) in &node.routes {
            cmd.args(["--route", &format!("{to}={via}")]);
        }
        let mut child = cmd
            .args(flags)
            .args(&extra)
            // `MUSTER_TEST_NODE_LOG` (e.g. `info,openraft=info`) to see more of a
            // failing run.
            .env(
                "MUSTER_LOG",
                std::env::var("MUSTER_TEST_NODE_LOG").unwrap_or_else(|_| "info".into()),
            )
            // As for a single daemon: a test machine's free space is not the test's business.
            .env("MUSTER_DISK_ALARM_FREE_MIB", "0")
            .env("MUSTER_DISK_ALARM_FREE_PERCENT", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting musterd");
        let stderr = child.stderr.take().expect("musterd stderr");
        let (listening, heard) = tokio::sync::oneshot::channel();
        let log_thread = std::thread::spawn({
            let log_path = node.data.join("musterd.log");
            move || copy_log(stderr, &log_path, listening)
        });
        node.process = Some(Running {
            child,
            log_thread: Some(log_thread),
        });
        let expected_cluster_addr = node.cluster_listen.to_string();
        match tokio::time::timeout(START_TIMEOUT, heard).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => panic!(
                "node {id} exited before listening; its log:\n{}",
                tail(&self.log(id), LOG_LINES_ON_FAILURE)
            ),
            Err(_) => panic!(
                "node {id} did not report listening within {START_TIMEOUT:?}; its log:\n{}",
                tail(&self.log(id), LOG_LINES_ON_FAILURE)
            ),
        }
        // The daemon writes its ready file before it logs that it listens.
        let ready: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&ready_file).expect("reading the node's ready file"),
        )
        .expect("the ready file is JSON");
        assert_eq!(
            ready["cluster_addr"].as_str(),
            Some(expected_cluster_addr.as_str()),
            "node {id}'s ready file: {ready}"
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            // Dropping the process kill -9s it and completes its log.
            node.process = None;
        }
        if let Some(dir) = std::env::var_os(KEEP_LOGS_VAR) {
            let dir = PathBuf::from(dir);
            for node in &self.nodes {
                let kept = dir.join(format!("node-{}.log", node.id));
                if let Err(e) = std::fs::copy(node.data.join("musterd.log"), &kept) {
                    eprintln!("keeping node {}'s log as {}: {e}", node.id, kept.display());
                }
            }
        }
        if !std::thread::panicking() {
            return;
        }
        for node in &self.nodes {
            // A node that never started has no log to show.
            let Ok(log) = std::fs::read_to_string(node.data.join("musterd.log")) else {
                continue;
            };
            let marked: Vec<&str> = log
                .lines()
                .filter(|l| FAILURE_MARKERS.iter().any(|m| l.contains(m)))
                .collect();
            let shown = &marked[marked.len().saturating_sub(LOG_LINES_ON_FAILURE)..];
            eprintln!(
                "--- node {}: {} warning lines (the last {} shown) ---",
                node.id,
                marked.len(),
                shown.len()
            );
            for line in shown {
                eprintln!("{line}");
            }
        }
    }
}

impl Relays {
    /// A client relay per node and a relay per ordered pair of nodes.
    async fn start(ports: &[Ports]) -> Relays {
        let mut clients = Vec::new();
        for p in ports {
            clients.push(
                Relay::start(p.listen)
                    .await
                    .expect("starting a client relay"),
            );
        }
        let mut paths = Vec::new();
        for from in 1..=ports.len() as NodeId {
            for (j, p) in ports.iter().enumerate() {
                let to = j as NodeId + 1;
                if to != from {
                    let relay = Relay::start(p.cluster_listen)
                        .await
                        .expect("starting a node-to-node relay");
                    paths.push((from, to, relay));
                }
            }
        }
        Relays { clients, paths }
    }

    /// The `--route` flags of node `from`.
    fn routes_from(&self, from: NodeId) -> Vec<(NodeId, SocketAddr)> {
        self.paths
            .iter()
            .filter(|(f, _, _)| *f == from)
            .map(|(_, to, r)| (*to, r.addr()))
            .collect()
    }

    /// Every relay on a path from or to node `id`.
    fn node_paths(&self, id: NodeId) -> impl Iterator<Item = &Relay> {
        self.paths
            .iter()
            .filter(move |(from, to, _)| *from == id || *to == id)
            .map(|(_, _, r)| r)
    }
}

/// Of the views, the leader with the highest term that at least `majority` of them
/// (itself included) name in that term.
fn agreed_leader(
    views: &[(NodeId, Option<ClusterHello>)],
    majority: usize,
) -> Option<ClusterHello> {
    let candidate = views
        .iter()
        .filter_map(|(_, h)| h.as_ref())
        .filter(|h| h.leads())
        .max_by_key(|h| h.term)?;
    let followers = views
        .iter()
        .filter_map(|(_, h)| h.as_ref())
        .filter(|h| h.leader == Some(candidate.node) && h.term == candidate.term)
        .count();
    (followers >= majority).then(|| candidate.clone())
}

/// Chooses a client port and a cluster port for each of `count` nodes, and the sockets
/// that hold them (so no two are the same, and nothing else takes one before its node
/// starts).
fn pick_ports(count: usize) -> (Vec<Ports>, Vec<Reserved>) {
    (0..count)
        .map(|_| {
            let (listen, cluster_listen) =
                (free_port_below_ephemeral(), free_port_below_ephemeral());
            let ports = Ports {
                listen: listen.local_addr().expect("a chosen port"),
                cluster_listen: cluster_listen.local_addr().expect("a chosen port"),
            };
            let reserved = Reserved {
                _listen: listen,
                _cluster_listen: cluster_listen,
            };
            (ports, reserved)
        })
        .unzip()
}

/// Writes a fresh random secret, hex, readable by this user only.
fn write_secret(path: &Path) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut bytes = [0u8; SECRET_BYTES];
    rand::rng().fill(&mut bytes[..]);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .expect("creating the cluster secret");
    writeln!(f, "{hex}").expect("writing the cluster secret");
}

/// Creates a directory readable by this user only (as musterd makes its own).
fn make_private_dir(dir: &Path) {
    std::fs::create_dir_all(dir).expect("creating a directory");
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("making a directory private");
}

/// Copies the certificate and local token (and with `key`, the private key) of the
/// data directory `from` into `to` (permissions kept).
fn copy_identity(from: &Path, to: &Path, key: bool, local_token: bool) {
    use muster_sdk::protocol::{CERT_FILE, KEY_FILE, LOCAL_TOKEN_FILE};
    let mut files = vec![CERT_FILE];
    if key {
        files.push(KEY_FILE);
    }
    if local_token {
        files.push(LOCAL_TOKEN_FILE);
    }
    for file in files {
        std::fs::copy(from.join(file), to.join(file))
            .unwrap_or_else(|e| panic!("copying {file} from {}: {e}", from.display()));
    }
}

/// Copies a node's stderr into its `musterd.log`; says on `listening` when the node
/// reports listening (dropping it unsaid if the node exits first).
fn copy_log(
    stderr: std::process::ChildStderr,
    log_path: &Path,
    listening: tokio::sync::oneshot::Sender<()>,
) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(log_path)
        .ok();
    let mut listening = Some(listening);
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        if let Some(f) = log.as_mut() {
            let _ = writeln!(f, "{line}");
        }
        if listening.is_some() && is_listening_line(&line) {
            // The node is flushed to the log first, so a reader sees the line.
            if let Some(f) = log.as_mut() {
                let _ = f.flush();
            }
            if let Some(tx) = listening.take() {
                // The starter may have given up waiting; then nobody needs to know.
                let _ = tx.send(());
            }
        }
    }
}

/// True for the daemon's JSON log line saying it listens.
fn is_listening_line(line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| {
        v["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("musterd listening"))
    })
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(node: u64, term: u64, leader: Option<u64>) -> (NodeId, Option<ClusterHello>) {
        let hello = ClusterHello {
            cluster_id: CLUSTER_ID.into(),
            node,
            term,
            leader,
            leader_addr: None,
        };
        (node, Some(hello))
    }

    #[test]
    fn a_leader_counts_once_a_majority_names_it_in_its_term() {
        let agreed = [view(1, 3, Some(1)), view(2, 3, Some(1)), (3, None)];
        assert_eq!(
            agreed_leader(&agreed, 2).map(|l| (l.node, l.term)),
            Some((1, 3))
        );
        // Alone in its term: not yet.
        let alone = [view(1, 3, Some(1)), view(2, 2, Some(3)), view(3, 2, None)];
        assert_eq!(agreed_leader(&alone, 2), None);
        // A cut-off old leader still thinks it leads: the newer term wins.
        let stale = [
            view(1, 3, Some(1)),
            view(2, 4, Some(2)),
            view(3, 4, Some(2)),
        ];
        assert_eq!(
            agreed_leader(&stale, 2).map(|l| (l.node, l.term)),
            Some((2, 4))
        );
    }

    #[test]
    fn chosen_ports_are_distinct() {
        let (ports, _reserved) = pick_ports(3);
        let mut all: Vec<SocketAddr> = ports
            .iter()
            .flat_map(|p| [p.listen, p.cluster_listen])
            .collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 6);
    }
}
