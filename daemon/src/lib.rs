//! musterd: the muster daemon.
//!
//! It keeps tasks in fjall and leases them over QUIC. [`run`] wires the pieces:
//! the store, the dispatcher thread that owns the engine, and the QUIC server.
//!
//! # Layout
//! - [`admission`]: the budgets a connection is admitted through (handshakes, token-less
//!   connections, places of `--max-connections`, each token's share).
//! - [`auth`]: tokens from the config file, principals and roles.
//! - [`cluster`]: replication of the store through openraft.
//! - [`config`]: settings from flags and environment variables.
//! - [`data_dir`]: the private data directory and the local-only token.
//! - [`store`]: the fjall database; the only module that imports fjall but for
//!   [`cluster`]'s raft log keyspaces.
//! - [`engine`]: task state, dispatch indexes, leases and timers; single-threaded, no clock.
//! - [`disk`]: the disk alarm over the data directory's free space.
//! - [`dispatcher`]: the OS thread that runs the engine and does group commit.
//! - [`server`]: the QUIC endpoint, the accept loop, each connection's admission, and
//!   which connections were heard from.
//! - [`connection`]: one connection's streams: frames read and decoded, replies and
//!   pushes written.
//! - [`edge`]: the ops answered without the engine (`hello`, `server_stats`, cluster ops).
//! - [`logging`]: the log's filter and format.
//! - [`metrics`]: the Prometheus endpoint.
//! - [`tls`]: the certificate and the QUIC/TLS configuration.

pub mod admission;
pub mod auth;
pub mod cluster;
pub mod config;
pub mod connection;
pub mod data_dir;
pub mod disk;
pub mod dispatcher;
pub mod edge;
pub mod engine;
pub mod logging;
pub mod metrics;
pub mod otlp;
pub mod server;
pub mod store;
pub mod tls;

use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::Config;
use crate::dispatcher::Dispatcher;

/// The version `--version` prints and `muster_build_info` carries: the crate's version
/// and the git commit it was built from (`unknown` outside a git checkout).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("MUSTER_GIT_COMMIT"),
    ")"
);

/// The git commit the daemon was built from.
pub const GIT_COMMIT: &str = env!("MUSTER_GIT_COMMIT");

/// Turns transparent huge pages off for the whole process: the first thing `musterd`
/// does (on Linux; elsewhere there is nothing to turn off).
///
/// The allocator (mimalloc) asks the kernel for huge pages for its arenas. A huge page
/// is resident whole once any byte of it is touched, and zeroed whole at that first
/// touch. With huge pages, the engine's maps split in 256 (`engine::sharded`) left
/// partly used huge pages resident: a start with 1,000,000 stored tasks held 423 MiB
/// against 384 MiB without them, and the enqueue phase of `muster bench` spent 16 % of
/// the daemon's CPU zeroing huge pages. Without them the CPU per task did not change
/// beyond the spread of runs (BENCHMARKS.md).
pub fn no_huge_pages() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    nix::sys::prctl::set_thp_disable(true)?;
    Ok(())
}

/// The file in the data directory a running daemon holds an exclusive lock on, with its
/// process id inside, so a second daemon on the same directory is refused and can say
/// which process holds it.
pub const LOCK_FILE: &str = "musterd.lock";

/// Takes the data directory's lock for the life of the process (the lock goes with the
/// returned file, and with the process however it ends), or says who holds it.
pub fn lock_data_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    let path = dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim().parse::<u32>() {
                Ok(pid) => format!("process {pid}"),
                Err(_) => "another process".to_owned(),
            };
            anyhow::bail!(
                "data directory {} is in use by another musterd ({holder} holds {LOCK_FILE})",
                dir.display()
            );
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
    }
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", std::process::id()))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(file)
}

/// Checks the settings and the token file as a start would, without opening the store
/// or listening: `musterd --check-config`. Returns what was checked, for a line of output.
pub fn check_config(config: &Config) -> anyhow::Result<String> {
    let tokens = match &config.config {
        Some(path) => auth::Tokens::load(path)?,
        None => auth::Tokens::default(),
    };
    config.check(!tokens.is_empty())?;
    if config.cert.is_some() || config.key.is_some() {
        // Only the operator's pair is checked: the self-signed one is made at first start.
        let identity =
            tls::load_identity(&config.data, config.cert.as_deref(), config.key.as_deref())?;
        tls::server_config(identity)?;
    }
    Ok(format!(
        "configuration is valid: {} token(s), data directory {}, listening on {}",
        tokens.len(),
        config.data.display(),
        config.listen
    ))
}

/// Writes where the daemon listens and how to trust it, for a supervisor: to a
/// temporary file beside `path`, renamed over it, so a reader never sees half of it.
fn write_ready_file(
    path: &std::path::Path,
    addr: std::net::SocketAddr,
    cluster_addr: Option<std::net::SocketAddr>,
    fingerprint: &str,
    cert: &std::path::Path,
) -> anyhow::Result<()> {
    let mut body = serde_json::json!({
        "addr": addr.to_string(),
        "fingerprint": fingerprint,
        "cert": cert.display().to_string(),
        "pid": std::process::id(),
    });
    if let Some(cluster_addr) = cluster_addr {
        body["cluster_addr"] = cluster_addr.to_string().into();
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{body}\n"))
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// Runs the daemon until SIGINT or SIGTERM, or until the store fails.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let access = Access::prepare(&config)?;
    let identity = tls::load_identity(&config.data, config.cert.as_deref(), config.key.as_deref())?;
    let (fingerprint, cert_path) = (identity.fingerprint.clone(), identity.cert_path.clone());
    for warning in config.warnings() {
        warn!("{warning}");
    }
    let metrics_endpoint = match config.metrics_addr {
        Some(addr) => {
            let endpoint = metrics::install(addr).await?;
            info!(addr = %endpoint.local_addr()?, "serving Prometheus metrics");
            Some(endpoint)
        }
        None => None,
    };
    let server_config = tls::server_config(identity)?;
    let exporter = match &config.otlp_endpoint {
        Some(endpoint) => Some(otlp::Exporter::start(endpoint, &config.otlp_service_name)?),
        None => None,
    };
    let cluster = config.cluster()?;
    let store = open_store(&config, cluster.is_some()).await?;
    let secrets = tls::reset_secrets(&config.data)?;
    let endpoint = server::bind(config.listen, server_config, secrets)?;
    let addr = endpoint.local_addr().context("reading the bound address")?;
    let (dispatcher, node) = start_engine(&config, store, cluster, addr).await?;
    let cluster_addr = node.as_ref().map(|(n, _)| n.cluster_addr);
    if let Some(path) = &config.ready_file {
        write_ready_file(path, addr, cluster_addr, &fingerprint, &cert_path)?;
    }
    server::log_listening(addr, cluster_addr, &fingerprint, &cert_path);
    if !access.local_only {
        // Only now that the start succeeded: a refused start changes nothing.
        data_dir::remove_local_token(&config.data)?;
    }

    let shutdown = CancellationToken::new();
    let context = server::ServerContext {
        commands: dispatcher.tx.clone(),
        max_connections: config.max_connections,
        max_connections_per_token: config.max_connections_per_token,
        max_buffered_per_token: config.max_buffered_mib_per_token << 20,
        tokens: Arc::clone(&access.tokens),
        hello_timeout: config.hello_timeout,
        stats: Arc::clone(&dispatcher.stats),
        durability: config.durability.name(),
        cluster: node.clone(),
    };
    let server = tokio::spawn(server::serve(endpoint, context, shutdown.clone()));
    let metrics_server = metrics_endpoint
        .map(|e| tokio::spawn(metrics::serve(e, access.metrics_bearer, shutdown.clone())));
    let failed = wait_for_stop(&dispatcher, &node).await?;
    if let Some((node, _)) = &node {
        node.step_back();
    }
    shutdown.cancel();
    if let Some(path) = &config.ready_file {
        // Not serving any more: a supervisor must not find a stale address.
        let _ = std::fs::remove_file(path);
    }
    server.await.context("joining the server")?;
    if let Some((node, _)) = &node {
        node.shutdown().await;
    }
    if let Some(metrics_server) = metrics_server {
        metrics_server.await.context("joining the metrics server")?;
    }
    let stopped = stop_dispatcher(dispatcher, &config.data, failed).await;
    if let Some(exporter) = exporter {
        // The spans of the last rounds go out before the process ends.
        tokio::task::spawn_blocking(move || exporter.shutdown())
            .await
            .context("stopping the OTLP exporter")?;
    }
    stopped
}

/// Who the daemon serves, settled before anything in the data directory changes.
struct Access {
    tokens: Arc<auth::Tokens>,
    /// No tokens configured and not `--open`: only holders of the data directory's
    /// own token are served.
    local_only: bool,
    /// The bearer token the metrics endpoint asks for, if any.
    metrics_bearer: Option<String>,
    /// The data directory's lock, held until the process ends: a second daemon on the
    /// directory is refused (before anything in it is written).
    _lock: std::fs::File,
}

impl Access {
    /// Loads the configured tokens (warning of plain-text and unconfined ones), checks
    /// the settings, makes the data directory private and locks it, and settles the
    /// local-only token.
    fn prepare(config: &Config) -> anyhow::Result<Access> {
        let configured = match &config.config {
            Some(path) => auth::Tokens::load(path)?,
            None => auth::Tokens::default(),
        };
        for name in configured.plaintext() {
            warn!(
                token = %name,
                "the config holds token {name:?} in plain text: store its SHA-256 as token_sha256 instead (muster admin token new)"
            );
        }
        for name in configured.unconfined_members() {
            warn!(
                token = %name,
                "token {name:?} may use any member name (no members patterns): it can take other tenants' agent names first; give each tenant's tokens members patterns (an admin's `muster member release NAME` frees a taken name)"
            );
        }
        let local_only = configured.is_empty() && !config.open;
        // Refused before anything is created or changed.
        config.check(!(configured.is_empty() && config.open))?;
        data_dir::prepare(&config.data)?;
        let lock = lock_data_dir(&config.data)?;
        let local_token = data_dir::local_token(&config.data, local_only)?;
        let metrics_bearer = match &config.metrics_token_file {
            Some(path) => Some(data_dir::read_token_file(path)?),
            None => local_token.clone(),
        };
        let tokens = Arc::new(match local_token {
            Some(token) => {
                info!(
                    file = %config.data.join(auth::LOCAL_TOKEN_FILE).display(),
                    "local-only: no tokens configured, so only clients that read the data directory's token are served (--open serves everyone)"
                );
                auth::Tokens::local(&token)
            }
            None => configured,
        });
        if tokens.is_empty() {
            info!("--open: every client that can connect is served fully");
        }
        Ok(Access {
            tokens,
            local_only,
            metrics_bearer,
            _lock: lock,
        })
    }
}

/// Opens the store (off the runtime's workers: fjall blocks), clustered or not.
async fn open_store(
    config: &Config,
    clustered: bool,
) -> anyhow::Result<(store::Store, Option<store::HeldRound>)> {
    let store_dir = config.data.join("store");
    let cache_bytes = config.cache_mib << 20;
    tokio::task::spawn_blocking(move || {
        let opening = std::time::Instant::now();
        let store = if clustered {
            store::Store::open_clustered(&store_dir, cache_bytes).map(|(s, r)| (s, Some(r)))
        } else {
            store::Store::open(&store_dir, cache_bytes).map(|s| (s, None))
        }
        .context("opening the store")?;
        tracing::info!(
            elapsed_ms = opening.elapsed().as_millis() as u64,
            "store opened"
        );
        anyhow::Ok(store)
    })
    .await
    .context("opening the store")?
}

/// Starts the dispatcher over the store: alone, or behind a cluster node started
/// first (with the leadership generation its connections watch).
async fn start_engine(
    config: &Config,
    (store, round): (store::Store, Option<store::HeldRound>),
    cluster: Option<config::ClusterFlags>,
    addr: std::net::SocketAddr,
) -> anyhow::Result<(Dispatcher, ClusterNode)> {
    let disk = disk::DiskAlarm::new(config.data.clone(), config.disk_threshold());
    let settings = dispatcher::EngineSettings {
        member_name_expiry: config.member_name_expiry,
        quotas: engine::Quotas {
            max_tasks_per_queue: config.max_tasks_per_queue,
            max_bytes_per_principal: config.max_bytes_per_token,
        },
        snapshot_root: config.snapshot_root(),
    };
    let (Some(flags), Some(round)) = (cluster, round) else {
        let durability = config.durability;
        let dispatcher = tokio::task::spawn_blocking(move || {
            Dispatcher::start(store, durability, settings, disk)
        });
        return Ok((dispatcher.await.context("opening the store")??, None));
    };
    let node_config = cluster::node::NodeConfig {
        secret: cluster::identity::read_secret(&flags.secret_file)?,
        cluster_id: flags.cluster_id,
        node_id: flags.node_id,
        listen: flags.listen,
        advertise: config.advertise.clone(),
        cluster_advertise: config.cluster_advertise.clone(),
        bootstrap: config.bootstrap,
        force_single_node: config.cluster_force_single_node,
        routes: config.routes.iter().cloned().collect(),
        snapshot_every: config.cluster_snapshot_every,
        timing: flags.timing,
    };
    let node = cluster::node::Node::start(
        node_config,
        &store,
        &config.data,
        config.durability.persist(),
        addr,
    )
    .await?;
    let (generation, watching) = tokio::sync::watch::channel(0u64);
    let dispatcher =
        cluster::lead::start((store, round), node.clone(), settings, disk, generation)?;
    Ok((dispatcher, Some((node, watching))))
}

/// A cluster node, and the generation that moves when it starts or stops leading.
type ClusterNode = Option<(cluster::node::Node, tokio::sync::watch::Receiver<u64>)>;

/// Stops the dispatcher (its last round persisted) and says how the daemon ended: an
/// error for a store failure or an earlier `failed`, with the disk's free space.
async fn stop_dispatcher(
    dispatcher: Dispatcher,
    data: &std::path::Path,
    failed: Option<String>,
) -> anyhow::Result<()> {
    let stats = &dispatcher.stats;
    let (syncs, requests) = (
        stats.syncs.load(std::sync::atomic::Ordering::Relaxed),
        stats
            .synced_requests
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    let stopped = tokio::task::spawn_blocking(move || dispatcher.stop())
        .await
        .context("joining the dispatcher")?;
    if let Err(e) = stopped {
        error!("store failure: {e}");
        // Whatever the error, a full disk is its likeliest cause: say how full it is.
        anyhow::bail!(
            "the store failed; nothing unacknowledged was reported as durable: {:#}; {}",
            anyhow::Error::from(e),
            disk::describe_space(data)
        );
    }
    if let Some(why) = failed {
        anyhow::bail!("{why}; {}", disk::describe_space(data));
    }
    info!(syncs, requests, "musterd stopped");
    Ok(())
}

/// Waits for SIGINT or SIGTERM, or for the dispatcher or raft to stop on their own:
/// then says what failed, if anything did.
async fn wait_for_stop(
    dispatcher: &Dispatcher,
    node: &ClusterNode,
) -> anyhow::Result<Option<String>> {
    Ok(tokio::select! {
        signal = shutdown_signal() => {
            signal?;
            info!("shutting down");
            None
        }
        () = watch_dispatcher(dispatcher) => Some("the dispatcher stopped unexpectedly".to_owned()),
        why = raft_failed(node.as_ref().map(|(node, _)| node)) => {
            error!("the cluster node's raft stopped: {why}");
            Some(format!("the cluster node's raft stopped: {why}"))
        }
    })
}

/// Resolves when a cluster node's raft stops on its own (a storage error inside it);
/// never on a single daemon.
async fn raft_failed(node: Option<&cluster::node::Node>) -> String {
    match node {
        Some(node) => node.failed().await,
        None => std::future::pending().await,
    }
}

/// Resolves when the dispatcher thread ends on its own, which only a store failure causes.
async fn watch_dispatcher(dispatcher: &Dispatcher) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(200));
    loop {
        tick.tick().await;
        if dispatcher.is_finished() {
            return;
        }
    }
}

async fn shutdown_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c()
        .await
        .context("waiting for ctrl-c")?;
    Ok(())
}
