//! The daemon's settings: every one a flag with an environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::Parser;

use crate::dispatcher::Durability;

/// Most connections served at once; a connection takes its place after its handshake
/// (with tokens, at its first valid `hello`) and is closed when none is left.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// Default of `--max-connections-per-token`: a quarter of the default connections, so
/// that one token can never hold them all.
pub const DEFAULT_MAX_CONNECTIONS_PER_TOKEN: usize = 1024;

/// Default of `--max-buffered-mib-per-token`: about 30 connections' worth of
/// unfinished frames at their own limit of 8.25 MiB.
pub const DEFAULT_MAX_BUFFERED_MIB_PER_TOKEN: usize = 256;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// musterd: a durable task dispatcher for swarms of long-running agents.
#[derive(Debug, Clone, Parser)]
#[command(name = "musterd", version = crate::VERSION, about)]
pub struct Config {
    /// Config file (TOML) with the tokens, their roles and queue patterns.
    #[arg(long, env = "MUSTER_CONFIG")]
    pub config: Option<PathBuf>,

    /// How long a new connection has to present its token before it is closed
    /// (only with tokens configured).
    #[arg(long, env = "MUSTER_HELLO_TIMEOUT", value_parser = humantime::parse_duration, default_value = "10s")]
    pub hello_timeout: std::time::Duration,

    /// Data directory: the store, and the certificate if none is given.
    #[arg(long, env = "MUSTER_DATA", default_value_os_t = default_data_dir())]
    pub data: PathBuf,

    /// Address to listen on (UDP), IP:PORT or HOST:PORT (a host name listens on the
    /// first address it resolves to, as the CLI connects to). Loopback by default.
    #[arg(long, env = "MUSTER_LISTEN", default_value_t = default_listen(), value_parser = listen_addr)]
    pub listen: SocketAddr,

    /// `sync`: every reply waits for fsync. `buffered`: faster, but a power loss loses
    /// the last moments of acknowledged work.
    #[arg(long, env = "MUSTER_DURABILITY", value_enum, default_value_t = Durability::Sync)]
    pub durability: Durability,

    /// Export the spans of tasks that carry a W3C trace context (each lease, and each
    /// wait in a queue) over OTLP/HTTP (protobuf) to this collector, e.g.
    /// http://127.0.0.1:4318 (spans go to its /v1/traces; plain HTTP: run a collector
    /// or agent beside the daemon). Off when absent, and free.
    #[arg(long, env = "MUSTER_OTLP_ENDPOINT", value_name = "URL", value_parser = otlp_endpoint)]
    pub otlp_endpoint: Option<String>,

    /// The `service.name` of the exported spans.
    #[arg(long, env = "MUSTER_OTLP_SERVICE_NAME", default_value = "musterd")]
    pub otlp_service_name: String,

    /// Serve Prometheus metrics on this address (HTTP, path /metrics). A local-only
    /// daemon (no tokens, no --open) answers only scrapes that present its local token
    /// as `Authorization: Bearer`; see --metrics-token-file.
    #[arg(long, env = "MUSTER_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,

    /// The only directory admin snapshots are written in (a relative snapshot directory
    /// is taken inside it; an absolute one must lie inside it, with no symbolic link or
    /// `..` on the way). Default: `backups` in the data directory.
    #[arg(long, env = "MUSTER_SNAPSHOT_ROOT")]
    pub snapshot_root: Option<PathBuf>,

    /// A file holding the token scrapes must present (`Authorization: Bearer TOKEN`;
    /// Prometheus: `authorization: {credentials_file: ...}`), instead of the local token
    /// or none.
    #[arg(long, env = "MUSTER_METRICS_TOKEN_FILE")]
    pub metrics_token_file: Option<PathBuf>,

    /// Log format.
    #[arg(long, env = "MUSTER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// PEM certificate chain to serve instead of the self-signed one (with --key).
    #[arg(long, env = "MUSTER_CERT")]
    pub cert: Option<PathBuf>,

    /// PEM private key of --cert.
    #[arg(long, env = "MUSTER_KEY")]
    pub key: Option<PathBuf>,

    /// Allow listening on a non-loopback address with --open (anyone who can reach
    /// the port can then take and settle tasks).
    #[arg(long, env = "MUSTER_INSECURE")]
    pub insecure: bool,

    /// With no tokens configured, serve every client that can connect instead of only
    /// those that read the admin token the daemon keeps in its data directory (0600):
    /// on a shared host, every local user is then an admin.
    #[arg(long, env = "MUSTER_OPEN")]
    pub open: bool,

    /// Most connections served at once.
    #[arg(long, env = "MUSTER_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,

    /// Most connections one configured token holds at once (the last 16 of
    /// --max-connections are kept for admins of every queue whatever this says).
    #[arg(long, env = "MUSTER_MAX_CONNECTIONS_PER_TOKEN", default_value_t = DEFAULT_MAX_CONNECTIONS_PER_TOKEN)]
    pub max_connections_per_token: usize,

    /// Most MiB of unfinished request frames one configured token's connections hold
    /// together; a stream that would pass it is answered too_large and stopped.
    #[arg(long, env = "MUSTER_MAX_BUFFERED_MIB_PER_TOKEN", default_value_t = DEFAULT_MAX_BUFFERED_MIB_PER_TOKEN)]
    pub max_buffered_mib_per_token: usize,

    /// Once serving, write `{"addr", "fingerprint", "cert", "pid"}` (JSON, one line) to
    /// this file, atomically, for a supervisor to read; removed on a clean stop.
    #[arg(long, env = "MUSTER_READY_FILE")]
    pub ready_file: Option<PathBuf>,

    /// How long a member name stays bound to the token that first used it once the
    /// member has no session and no lease (then another token may use it).
    #[arg(long, env = "MUSTER_MEMBER_NAME_EXPIRY", value_parser = humantime::parse_duration, default_value = "24h")]
    pub member_name_expiry: std::time::Duration,

    /// Most tasks one queue may hold, in every state; past it `enqueue` gets `limit`.
    #[arg(long, env = "MUSTER_MAX_TASKS_PER_QUEUE", default_value_t = crate::engine::DEFAULT_MAX_TASKS_PER_QUEUE)]
    pub max_tasks_per_queue: u64,

    /// Most payload bytes the stored tasks one token enqueued may hold; past it its
    /// `enqueue` gets `limit` until tasks are removed (purge, discard, retention).
    #[arg(long, env = "MUSTER_MAX_BYTES_PER_TOKEN", default_value_t = crate::engine::DEFAULT_MAX_BYTES_PER_PRINCIPAL)]
    pub max_bytes_per_token: u64,

    /// Block cache of the store, in MiB: task records and payloads read by claims and
    /// lookups come from it. More helps large backlogs; it counts in resident memory.
    #[arg(long, env = "MUSTER_CACHE_MIB", default_value_t = DEFAULT_CACHE_MIB)]
    pub cache_mib: u64,

    /// Free space of the data directory's file system, in MiB, below which enqueues are
    /// refused (`disk_full`) while everything else is served: the disk alarm. The larger
    /// of this and --disk-alarm-free-percent counts; it lifts a quarter above it. Both 0
    /// turn the alarm off.
    #[arg(long, env = "MUSTER_DISK_ALARM_FREE_MIB", default_value_t = DEFAULT_DISK_ALARM_FREE_MIB)]
    pub disk_alarm_free_mib: u64,

    /// The disk alarm's threshold in percent of the file system's size (0 to 50).
    #[arg(long, env = "MUSTER_DISK_ALARM_FREE_PERCENT", default_value_t = DEFAULT_DISK_ALARM_FREE_PERCENT)]
    pub disk_alarm_free_percent: u8,

    /// Check the flags, the config file with its tokens and the certificate pair, print
    /// one line and exit (0 when valid, 1 with the error): nothing is opened or served.
    #[arg(long)]
    pub check_config: bool,

    /// Run as a node of the cluster with this id (letters, digits, `-`, `_`, `.`; at
    /// most 64 bytes). Nodes of another cluster id cannot talk to this one.
    #[arg(long, env = "MUSTER_CLUSTER_ID", help_heading = "Cluster")]
    pub cluster_id: Option<String>,

    /// This node's id in the cluster (1 or more; unique within it, never reused).
    #[arg(long, env = "MUSTER_NODE_ID", help_heading = "Cluster")]
    pub node_id: Option<u64>,

    /// Address for node-to-node traffic (UDP), IP:PORT or HOST:PORT.
    #[arg(long, env = "MUSTER_CLUSTER_LISTEN", value_parser = listen_addr, help_heading = "Cluster")]
    pub cluster_listen: Option<SocketAddr>,

    /// File holding the cluster secret (at least 32 bytes; surrounding whitespace is
    /// ignored): every node of the cluster has the same one.
    #[arg(long, env = "MUSTER_CLUSTER_SECRET_FILE", help_heading = "Cluster")]
    pub cluster_secret_file: Option<PathBuf>,

    /// The client address (HOST:PORT) other nodes name when they send clients to this
    /// one as the leader; the bound --listen address if absent.
    #[arg(long, env = "MUSTER_ADVERTISE", help_heading = "Cluster")]
    pub advertise: Option<String>,

    /// The node-to-node address (HOST:PORT) other nodes reach this one at; the bound
    /// --cluster-listen address if absent.
    #[arg(long, env = "MUSTER_CLUSTER_ADVERTISE", help_heading = "Cluster")]
    pub cluster_advertise: Option<String>,

    /// Form a new one-node cluster of this node, if its store holds none yet (the first
    /// node's first start only; others join with `muster cluster add`).
    #[arg(long, env = "MUSTER_BOOTSTRAP", help_heading = "Cluster")]
    pub bootstrap: bool,

    /// The way back from a lost majority: make this node the only voter of its
    /// cluster, keeping everything its store holds (it may include writes the lost
    /// majority never agreed on). Start it once so, then without the flag; add new
    /// nodes with `muster cluster add`, and never restart the former voters with their
    /// old data. A node that is its cluster's only voter already is left as it is.
    #[arg(
        long,
        env = "MUSTER_CLUSTER_FORCE_SINGLE_NODE",
        help_heading = "Cluster"
    )]
    pub cluster_force_single_node: bool,

    /// Reach node ID's node-to-node endpoint at ADDR instead of the address it
    /// advertises (ID=HOST:PORT; repeatable): for proxies and tests.
    #[arg(long = "route", value_parser = route, help_heading = "Cluster")]
    pub routes: Vec<(u64, String)>,

    /// Build a snapshot and compact the log after this many log entries.
    #[arg(long, env = "MUSTER_CLUSTER_SNAPSHOT_EVERY", default_value_t = crate::cluster::node::SNAPSHOT_EVERY_ENTRIES, help_heading = "Cluster")]
    pub cluster_snapshot_every: u64,

    /// How often the leader sends heartbeats (20ms to 1s). Every node of a cluster should
    /// have the same.
    #[arg(long, env = "MUSTER_CLUSTER_HEARTBEAT", value_parser = humantime::parse_duration, default_value = "100ms", help_heading = "Cluster")]
    pub cluster_heartbeat: Duration,

    /// The election timeout T (3 heartbeats to 10s): a leader that hears no majority for
    /// T stops leading; followers elect a new one 1.5–2 T after they last heard from
    /// their leader. Every node of a cluster should have the same.
    #[arg(long, env = "MUSTER_CLUSTER_ELECTION_TIMEOUT", value_parser = humantime::parse_duration, default_value = "400ms", help_heading = "Cluster")]
    pub cluster_election_timeout: Duration,
}

/// Longest cluster id, in bytes.
pub const MAX_CLUSTER_ID_BYTES: usize = 64;

/// The cluster settings of a node, once checked.
pub struct ClusterFlags {
    /// The cluster id.
    pub cluster_id: String,
    /// This node's id.
    pub node_id: u64,
    /// The node-to-node listen address.
    pub listen: SocketAddr,
    /// The secret file.
    pub secret_file: PathBuf,
    /// Heartbeats and election timeouts.
    pub timing: crate::cluster::timing::Timing,
}

/// Default absolute threshold of the disk alarm, in MiB: room for the store to flush
/// its memtables and finish a compaction after the alarm goes off.
pub const DEFAULT_DISK_ALARM_FREE_MIB: u64 = 1024;

/// Default relative threshold of the disk alarm, in percent of the file system: on a
/// large disk 1 % is room enough, and more would keep a disk that is merely well used
/// in alarm.
pub const DEFAULT_DISK_ALARM_FREE_PERCENT: u8 = 1;

/// Highest relative threshold of the disk alarm, in percent.
pub const MAX_DISK_ALARM_FREE_PERCENT: u8 = 50;

/// Default block cache of the store, in MiB.
pub const DEFAULT_CACHE_MIB: u64 = 64;

impl Config {
    /// The disk alarm's threshold.
    pub fn disk_threshold(&self) -> crate::disk::Threshold {
        crate::disk::Threshold {
            min_free_bytes: self.disk_alarm_free_mib << 20,
            min_free_percent: self.disk_alarm_free_percent,
        }
    }

    /// Refuses settings that are unsafe or contradictory.
    pub fn check(&self, tokens_configured: bool) -> anyhow::Result<()> {
        if !self.listen.ip().is_loopback() && !self.insecure && !tokens_configured {
            bail!(
                "refusing to listen on {}: it is not a loopback address and --open serves without tokens; \
                 anyone who can reach it could take and settle tasks (pass --insecure to do it anyway)",
                self.listen
            );
        }
        if self.max_connections == 0 {
            bail!("--max-connections must be at least 1");
        }
        if self.max_connections_per_token == 0 {
            bail!("--max-connections-per-token must be at least 1");
        }
        if !(1..=1 << 20).contains(&self.max_buffered_mib_per_token) {
            bail!("--max-buffered-mib-per-token must be between 1 and 1048576");
        }
        if self.max_tasks_per_queue == 0 || self.max_bytes_per_token == 0 {
            bail!("--max-tasks-per-queue and --max-bytes-per-token must be at least 1");
        }
        if self.member_name_expiry < crate::engine::MIN_MEMBER_NAME_EXPIRY {
            bail!("--member-name-expiry must be at least 1s");
        }
        if !(1..=1 << 20).contains(&self.cache_mib) {
            bail!("--cache-mib must be between 1 and 1048576");
        }
        if self.disk_alarm_free_percent > MAX_DISK_ALARM_FREE_PERCENT {
            bail!("--disk-alarm-free-percent must be between 0 and {MAX_DISK_ALARM_FREE_PERCENT}");
        }
        if self.disk_alarm_free_mib > 1 << 30 {
            bail!("--disk-alarm-free-mib must be at most 1073741824 (1 PiB)");
        }
        self.cluster()?;
        Ok(())
    }

    /// The cluster settings: `None` for a single daemon (no cluster flag given), an
    /// error when some are missing or wrong.
    pub fn cluster(&self) -> anyhow::Result<Option<ClusterFlags>> {
        let any = self.cluster_id.is_some()
            || self.node_id.is_some()
            || self.cluster_listen.is_some()
            || self.cluster_secret_file.is_some()
            || self.advertise.is_some()
            || self.cluster_advertise.is_some()
            || self.bootstrap
            || self.cluster_force_single_node
            || !self.routes.is_empty();
        if !any {
            return Ok(None);
        }
        let (Some(cluster_id), Some(node_id), Some(listen), Some(secret_file)) = (
            &self.cluster_id,
            self.node_id,
            self.cluster_listen,
            &self.cluster_secret_file,
        ) else {
            bail!(
                "a cluster node needs --cluster-id, --node-id, --cluster-listen and --cluster-secret-file"
            );
        };
        if cluster_id.is_empty()
            || cluster_id.len() > MAX_CLUSTER_ID_BYTES
            || !cluster_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            bail!(
                "--cluster-id must be 1 to {MAX_CLUSTER_ID_BYTES} letters, digits, '-', '_' or '.'"
            );
        }
        if node_id == 0 {
            bail!("--node-id must be at least 1");
        }
        if self.cluster_snapshot_every == 0 {
            bail!("--cluster-snapshot-every must be at least 1");
        }
        let timing = crate::cluster::timing::Timing::new(
            self.cluster_heartbeat,
            self.cluster_election_timeout,
        )
        .map_err(anyhow::Error::msg)?;
        for addr in [&self.advertise, &self.cluster_advertise]
            .into_iter()
            .flatten()
        {
            host_port(addr).map_err(anyhow::Error::msg)?;
        }
        Ok(Some(ClusterFlags {
            cluster_id: cluster_id.clone(),
            node_id,
            listen,
            secret_file: secret_file.clone(),
            timing,
        }))
    }
}

/// Checks that `s` is `HOST:PORT`.
fn host_port(s: &str) -> Result<(), String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("invalid address {s:?}: want HOST:PORT"))?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("invalid address {s:?}: want HOST:PORT"));
    }
    Ok(())
}

/// `ID=HOST:PORT`.
fn route(s: &str) -> Result<(u64, String), String> {
    let (id, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("invalid route {s:?}: want ID=HOST:PORT"))?;
    let id = id
        .parse::<u64>()
        .map_err(|_| format!("invalid route {s:?}: {id:?} is not a node id"))?;
    host_port(addr)?;
    Ok((id, addr.to_string()))
}

impl Config {
    /// Where admin snapshots may be written: `--snapshot-root`, else `DATA/backups`.
    pub fn snapshot_root(&self) -> PathBuf {
        self.snapshot_root
            .clone()
            .unwrap_or_else(|| self.data.join("backups"))
    }

    /// Settings that work but expose something: each is logged as a warning at start.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(addr) = self.metrics_addr
            && !addr.ip().is_loopback()
            && self.metrics_token_file.is_none()
        {
            out.push(format!(
                "metrics are served without authentication on {addr}, not a loopback address: \
                 queue names and counts are readable by whoever reaches it"
            ));
        }
        out
    }
}

/// The per-user data directory shared with the CLI.
pub fn default_data_dir() -> PathBuf {
    dirs::data_dir()
        .unwrap_or_else(|| PathBuf::from("."))
        .join(muster_protocol::DATA_DIR_NAME)
}

/// `IP:PORT`, or `HOST:PORT` resolved to its first address.
fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    s.to_socket_addrs()
        .map_err(|e| format!("invalid address {s:?}: {e} (want IP:PORT or HOST:PORT)"))?
        .next()
        .ok_or_else(|| format!("{s:?} resolves to no address"))
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], muster_protocol::DEFAULT_PORT))
}

/// An OTLP/HTTP endpoint: an `http://` URL (this build speaks no TLS to collectors).
fn otlp_endpoint(s: &str) -> Result<String, String> {
    match s.strip_prefix("http://") {
        Some(rest) if !rest.is_empty() => Ok(s.to_owned()),
        _ => Err(format!(
            "want an http:// URL such as http://127.0.0.1:4318 (no TLS: export to a collector beside the daemon), not {s:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> Config {
        let mut all = vec!["musterd", "--data", "/nonexistent"];
        all.extend_from_slice(args);
        Config::try_parse_from(all).unwrap()
    }

    #[test]
    fn an_otlp_endpoint_is_an_http_url() {
        let on = config(&["--otlp-endpoint", "http://127.0.0.1:4318"]);
        assert_eq!(on.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4318"));
        assert_eq!(on.otlp_service_name, "musterd");
        assert_eq!(config(&[]).otlp_endpoint, None);
        for bad in ["https://collector:4318", "127.0.0.1:4318", "http://"] {
            let all = ["musterd", "--data", "/nonexistent", "--otlp-endpoint", bad];
            let e = Config::try_parse_from(all).unwrap_err().to_string();
            assert!(e.contains("want an http:// URL"), "{bad}: {e}");
        }
    }

    #[test]
    fn listen_takes_host_names() {
        let named = config(&["--listen", "localhost:7433"]);
        assert!(named.listen.ip().is_loopback(), "{}", named.listen);
        assert_eq!(named.listen.port(), 7433);
        assert_eq!(
            config(&["--listen", "[::1]:7434"]).listen,
            "[::1]:7434".parse().unwrap()
        );
        let mut all = vec!["musterd", "--listen", "localhost"];
        all.push("--data");
        all.push("/nonexistent");
        let e = Config::try_parse_from(all).unwrap_err().to_string();
        assert!(e.contains("want IP:PORT or HOST:PORT"), "{e}");
    }

    #[test]
    fn a_public_address_needs_tokens_or_insecure() {
        let public = config(&["--listen", "0.0.0.0:7420"]);
        let err = public.check(false).unwrap_err().to_string();
        assert!(err.contains("refusing to listen on 0.0.0.0:7420"), "{err}");
        assert_eq!(public.check(true).ok(), Some(()));
        assert_eq!(
            config(&["--listen", "0.0.0.0:7420", "--insecure"])
                .check(false)
                .ok(),
            Some(())
        );
        assert_eq!(config(&[]).check(false).ok(), Some(()));
        assert!(config(&["--cache-mib", "0"]).check(false).is_err());
        let err = config(&["--disk-alarm-free-percent", "51"]).check(false);
        assert_eq!(
            err.unwrap_err().to_string(),
            "--disk-alarm-free-percent must be between 0 and 50"
        );
    }

    #[test]
    fn cluster_flags_are_all_or_nothing_and_checked() {
        assert!(config(&[]).cluster().unwrap().is_none());
        let base = [
            "--cluster-id",
            "prod-1",
            "--node-id",
            "2",
            "--cluster-listen",
            "127.0.0.1:7500",
            "--cluster-secret-file",
            "/s",
        ];
        let flags = config(&base).cluster().unwrap().unwrap();
        assert_eq!(
            (
                flags.cluster_id.as_str(),
                flags.node_id,
                flags.listen.port()
            ),
            ("prod-1", 2, 7500)
        );
        assert_eq!(
            config(&["--bootstrap"])
                .check(false)
                .unwrap_err()
                .to_string(),
            "a cluster node needs --cluster-id, --node-id, --cluster-listen and --cluster-secret-file"
        );
        let mut bad_id = base.to_vec();
        bad_id[1] = "a b";
        assert_eq!(
            config(&bad_id).cluster().err().unwrap().to_string(),
            "--cluster-id must be 1 to 64 letters, digits, '-', '_' or '.'"
        );
        let mut zero = base.to_vec();
        zero[3] = "0";
        assert_eq!(
            config(&zero).cluster().err().unwrap().to_string(),
            "--node-id must be at least 1"
        );
        let mut routed = base.to_vec();
        routed.extend(["--route", "3=127.0.0.1:9000"]);
        assert_eq!(
            config(&routed).routes,
            vec![(3, "127.0.0.1:9000".to_string())]
        );
        let e = Config::try_parse_from(["musterd", "--route", "x=1:2"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("invalid route \"x=1:2\": \"x\" is not a node id"),
            "{e}"
        );
        let mut advertised = base.to_vec();
        advertised.extend(["--advertise", "nohost"]);
        assert_eq!(
            config(&advertised).cluster().err().unwrap().to_string(),
            "invalid address \"nohost\": want HOST:PORT"
        );
    }

    #[test]
    fn metrics_off_loopback_are_warned_about() {
        let warnings = config(&["--metrics-addr", "0.0.0.0:9464"]).warnings();
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].starts_with("metrics are served without authentication on 0.0.0.0:9464"),
            "{warnings:?}"
        );
        assert!(
            config(&["--metrics-addr", "127.0.0.1:9464"])
                .warnings()
                .is_empty()
        );
        assert!(config(&[]).warnings().is_empty());
    }
}
