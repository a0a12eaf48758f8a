//! Where the daemon is and how to trust it.
//!
//! The address may name one daemon, `HOST:PORT`, or the nodes of a cluster,
//! `HOST:PORT,HOST:PORT,...` (see [`addresses`]): [`crate::Client::connect`] then goes
//! to the node that leads.
//!
//! Trust comes from, in order: a pinned SHA-256 fingerprint of the daemon's certificate,
//! a CA file, or the certificate the daemon wrote into its data directory (found by
//! itself for a local daemon). Only TLS 1.3 is offered and 0-RTT is never used.
//!
//! The token comes from, in order: [`ConnectOptions::token`], the file
//! [`ConnectOptions::token_file`] names (so it never shows in a process's arguments,
//! which every local user can read in `/proc/PID/cmdline`), or, when the daemon is
//! trusted through its data directory, the token the daemon wrote there for its own
//! user ([`LOCAL_TOKEN_FILE`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::QuicClientConfig;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use muster_protocol::{ALPN, CERT_FILE, DATA_DIR_NAME, DEFAULT_PORT, LOCAL_TOKEN_FILE};

use crate::Error;

/// Longest a handshake may take before the connection is given up: a daemon that is
/// not running does not answer at all, so unless the host says nothing listens there
/// (see [`refused`]), this is how long a command waits to say so.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the client pings an idle connection: the daemon counts any packet as news
/// of a member's session, so this keeps a session `connected` with a liveness timeout
/// of 2 s or more (the default is 5 s); and the daemon's QUIC stack acknowledges each
/// ping, so a dead daemon is noticed within this and [`unanswered_limit`] even when
/// the client waits for a reply the daemon already acknowledged receiving (a leader
/// killed mid-request): 0.6–1.2 s on loopback. Two small packets a second per idle
/// connection.
pub const KEEP_ALIVE: Duration = Duration::from_millis(500);

/// Longest a client waits without a single packet from the daemon before it gives the
/// connection up (and a [`crate::Worker`], the console or `muster work` reconnects,
/// following a cluster's new leader). A live daemon acknowledges every keep-alive ping
/// ([`KEEP_ALIVE`]), and a lost ping or acknowledgement is sent again after QUIC's
/// probe timeout (a few round trips), so only a dead or unreachable host stays silent
/// this long: a
/// `kill -9`ed leader's host sends no reset, and QUIC's own idle timeout (30 s) would
/// strand its clients for that long. Checked every [`SILENCE_CHECK`].
pub const SERVER_SILENCE: Duration = Duration::from_secs(2);

/// How often a client looks whether its daemon is still heard from.
///
/// Every 100 ms: a connection is given up within 100 ms of either limit
/// ([`unanswered_limit`], [`SERVER_SILENCE`]), for 10 cheap wake-ups a second per
/// connection.
pub const SILENCE_CHECK: Duration = Duration::from_millis(100);

/// Least time a request (or a keep-alive ping) may go without the daemon's QUIC stack
/// acknowledging it before the client gives the connection up: a live daemon
/// acknowledges every packet within a round trip and 25 ms, whatever its engine is
/// doing, so this is what tells a dead leader from a busy one while a call waits.
pub const UNANSWERED_MIN: Duration = Duration::from_millis(500);

/// Round trips a request may go unacknowledged (lost packets are sent again after about
/// one) before the client gives the connection up, when that is longer than
/// [`UNANSWERED_MIN`].
pub const UNANSWERED_RTTS: u32 = 8;

/// How long a request may go unacknowledged on a connection with round trip `rtt`:
/// [`UNANSWERED_RTTS`] round trips, at least [`UNANSWERED_MIN`].
pub fn unanswered_limit(rtt: Duration) -> Duration {
    (rtt * UNANSWERED_RTTS).max(UNANSWERED_MIN)
}

/// Most addresses one [`ConnectOptions::addr`] may list (the nodes of a cluster), and
/// most a client tries while it looks for the leader, those the nodes name included.
pub const MAX_ADDRESSES: usize = 16;

/// Longest [`crate::Client::connect`] looks for a cluster's leader (an election
/// usually takes well under a second) before it gives up, naming what each address
/// said last.
pub const FIND_LEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`crate::Client::connect`] waits between two rounds of asking every
/// address whom it believes to lead, while no node does.
pub const FIND_LEADER_RETRY: Duration = Duration::from_millis(100);

/// How long a connection may be silent before the client gives it up.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// How the client trusts the daemon's certificate.
#[derive(Debug, Clone)]
pub enum Trust {
    /// The certificate's SHA-256 fingerprint, hex (colons allowed).
    Pin(String),
    /// A PEM file of CA certificates (or the daemon's self-signed certificate itself).
    CaFile(PathBuf),
    /// The `cert.pem` the daemon wrote in this data directory.
    DataDir(PathBuf),
}

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// `HOST:PORT` of the daemon, or of a cluster's nodes separated by commas
    /// (`HOST:PORT,HOST:PORT,...`, at most [`MAX_ADDRESSES`]): the client connects to
    /// the leader (see [`crate::Client::connect`]).
    pub addr: String,
    /// How to trust its certificate.
    pub trust: Trust,
    /// A token, for daemons that require one.
    pub token: Option<String>,
    /// A file holding the token (surrounding whitespace ignored), read at each
    /// connect when `token` is absent.
    pub token_file: Option<PathBuf>,
    /// The name to verify in the certificate; the host of `addr` if absent.
    pub server_name: Option<String>,
    /// The local address to bind; if absent, the loopback address of the daemon's
    /// family for a loopback daemon, else the unspecified one, port 0 either way. With
    /// several addresses each is tried from a socket of its own bound here, so give
    /// port 0.
    pub bind: Option<SocketAddr>,
}

impl Default for ConnectOptions {
    /// The local daemon on its default port, trusted through the default data directory.
    fn default() -> Self {
        ConnectOptions {
            addr: format!("127.0.0.1:{DEFAULT_PORT}"),
            trust: Trust::DataDir(default_data_dir()),
            token: None,
            token_file: None,
            server_name: None,
            bind: None,
        }
    }
}

impl ConnectOptions {
    /// The defaults, changed by the environment variables the CLI reads too:
    /// `MUSTER_ADDR`, `MUSTER_DATA`, `MUSTER_CA`, `MUSTER_PIN`, `MUSTER_TOKEN` and
    /// `MUSTER_TOKEN_FILE`; named contexts are not read (`MUSTER_CONTEXT` is ignored).
    /// [`ConnectArgs::resolve`](crate::ConnectArgs::resolve) is the CLI's whole
    /// resolution, contexts included.
    pub fn from_env() -> ConnectOptions {
        crate::ConnectArgs::from_env().options_with(None)
    }

    /// The token to present in `hello`: `token`, else the contents of `token_file`,
    /// else the daemon's own token in the data directory the daemon is trusted
    /// through (when it wrote one and this user can read it), else none.
    pub fn hello_token(&self) -> Result<Option<String>, Error> {
        if let Some(token) = &self.token {
            return Ok(Some(token.clone()));
        }
        if let Some(path) = &self.token_file {
            return read_token_file(path).map(Some);
        }
        let Trust::DataDir(dir) = &self.trust else {
            return Ok(None);
        };
        let path = dir.join(LOCAL_TOKEN_FILE);
        match read_token_file(&path) {
            Ok(token) => Ok(Some(token)),
            // No local token: a daemon with configured tokens (or `--open`).
            Err(_) if !path.exists() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The addresses an [`ConnectOptions::addr`] lists, in order, each once: `HOST:PORT`
/// entries separated by commas (spaces around an entry are ignored; an IPv6 host is
/// written in brackets, `[::1]:7420`). More than [`MAX_ADDRESSES`] entries, an empty
/// one or one that is not `HOST:PORT` are refused with [`Error::InvalidInput`].
pub fn addresses(addr: &str) -> Result<Vec<String>, Error> {
    let entries: Vec<&str> = addr.split(',').map(str::trim).collect();
    if entries.len() > MAX_ADDRESSES {
        return Err(Error::InvalidInput(format!(
            "more than {MAX_ADDRESSES} addresses in {addr:?}"
        )));
    }
    let mut out: Vec<String> = Vec::with_capacity(entries.len());
    for entry in entries {
        if entry.is_empty() {
            return Err(Error::InvalidInput(format!(
                "an empty address in {addr:?} (addresses are HOST:PORT separated by commas)"
            )));
        }
        if !is_host_port(entry) {
            return Err(Error::InvalidInput(format!(
                "address {entry:?} is not HOST:PORT (an IPv6 host in brackets: [::1]:7420)"
            )));
        }
        if !out.iter().any(|a| a == entry) {
            out.push(entry.to_owned());
        }
    }
    Ok(out)
}

/// Whether `entry` has the form `HOST:PORT`: a host without spaces or commas (an IPv6
/// one in brackets) and a decimal port.
pub(crate) fn is_host_port(entry: &str) -> bool {
    let Some((host, port)) = entry.rsplit_once(':') else {
        return false;
    };
    let port_ok =
        !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok();
    let host_ok = match host.strip_prefix('[') {
        Some(inner) => inner
            .strip_suffix(']')
            .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok()),
        None => {
            !host.is_empty()
                && !host.contains(':')
                && !host.bytes().any(|b| b.is_ascii_whitespace() || b == b',')
        }
    };
    port_ok && host_ok
}

/// Longest token file read, in bytes: a token is a line, not a document.
const MAX_TOKEN_FILE_BYTES: u64 = 4096;

/// Reads a token from a file: its contents less surrounding whitespace, which must
/// leave a token of one line. A file that users other than its owner may write
/// (group- or world-writable) is refused.
pub fn read_token_file(path: &std::path::Path) -> Result<String, Error> {
    use std::io::Read;
    let describe = |e: std::io::Error| {
        Error::InvalidInput(format!("reading token file {}: {e}", path.display()))
    };
    let file = std::fs::File::open(path).map_err(describe)?;
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&file.metadata().map_err(describe)?.permissions());
    if mode & 0o022 != 0 {
        // Whoever can write it chooses the identity this client presents.
        return Err(Error::InvalidInput(format!(
            "token file {} is writable by other users (mode {:o}): chmod go-w it",
            path.display(),
            mode & 0o777
        )));
    }
    let mut text = String::new();
    file.take(MAX_TOKEN_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(describe)?;
    let token = text.trim();
    if text.len() as u64 > MAX_TOKEN_FILE_BYTES || token.is_empty() || token.contains('\n') {
        return Err(Error::InvalidInput(format!(
            "token file {} does not hold one token on one line (at most {MAX_TOKEN_FILE_BYTES} bytes)",
            path.display()
        )));
    }
    Ok(token.to_owned())
}

/// The per-user data directory `musterd` uses by default.
pub fn default_data_dir() -> PathBuf {
    dirs::data_dir()
        .unwrap_or_else(|| PathBuf::from("."))
        .join(DATA_DIR_NAME)
}

/// Opens a raw QUIC connection (TLS 1.3, ALPN `muster/1`, the options' trust), for
/// clients that frame their own requests, to the one address the options name (no
/// leader is looked for). [`crate::Client::connect`] builds on it.
pub async fn open(options: &ConnectOptions) -> Result<quinn::Connection, Error> {
    Ok(open_own(options).await?.1)
}

/// Opens a connection on an endpoint of its own, returned with it so that closing can
/// wait for the daemon to be told.
pub(crate) async fn open_own(
    options: &ConnectOptions,
) -> Result<(quinn::Endpoint, quinn::Connection), Error> {
    let addr = resolve(&options.addr).await?;
    let endpoint = match options.bind {
        Some(bind) => quinn::Endpoint::client(bind)
            .map_err(|e| Error::Connect(format!("binding {bind}: {e}")))?,
        None => endpoint_for(addr)?,
    };
    let conn = open_on(&endpoint, options).await?;
    Ok((endpoint, conn))
}

/// A client endpoint (one UDP socket) that many connections can share, e.g. a process
/// that runs hundreds of agents.
pub fn endpoint_for(addr: SocketAddr) -> Result<quinn::Endpoint, Error> {
    // A loopback daemon is reached from loopback: nothing listens on other interfaces.
    let bind: SocketAddr = match (addr.is_ipv6(), addr.ip().is_loopback()) {
        (true, true) => SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 0)),
        (true, false) => SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0)),
        (false, true) => SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0)),
        (false, false) => SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0)),
    };
    quinn::Endpoint::client(bind).map_err(|e| Error::Connect(format!("binding a UDP socket: {e}")))
}

/// Opens a raw QUIC connection on an existing endpoint.
pub async fn open_on(
    endpoint: &quinn::Endpoint,
    options: &ConnectOptions,
) -> Result<quinn::Connection, Error> {
    let addr = resolve(&options.addr).await?;
    let host = options
        .server_name
        .clone()
        .unwrap_or_else(|| host_of(&options.addr));
    let crypto = tls_config(&options.trust)?;
    let mut config = quinn::ClientConfig::new(Arc::new(
        QuicClientConfig::try_from(crypto).map_err(|e| Error::Connect(e.to_string()))?,
    ));
    let mut transport = quinn::TransportConfig::default();
    transport
        .keep_alive_interval(Some(KEEP_ALIVE))
        .max_idle_timeout(Some(
            IDLE_TIMEOUT
                .try_into()
                .map_err(|_| Error::Connect("idle timeout".into()))?,
        ))
        .max_concurrent_uni_streams(0u32.into());
    config.transport_config(Arc::new(transport));
    let connecting = endpoint
        .connect_with(config, addr, &host)
        .map_err(|e| Error::Connect(format!("{}: {e}", options.addr)))?;
    tokio::select! {
        handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, connecting) => match handshake {
            Ok(connection) => {
                connection.map_err(|e| Error::Connect(format!("{}: {e}", options.addr)))
            }
            Err(_) => Err(Error::Connect(format!(
                "{}: no answer within {}s: is musterd running there?",
                options.addr,
                HANDSHAKE_TIMEOUT.as_secs()
            ))),
        },
        () = refused(addr) => Err(Error::Connect(format!(
            "{}: nothing listens there (the host answered \"port unreachable\"): is musterd running?",
            options.addr
        ))),
    }
}

/// Returns once the host at `addr` says nothing listens on its UDP port, and never
/// otherwise. QUIC endpoints ignore ICMP errors, so this asks on a socket of its own:
/// one datagram of one byte (which a QUIC server drops as too short to be a packet)
/// from a socket connected to `addr`, whose next receive fails with "connection
/// refused" when the host answers with ICMP port unreachable (loopback and most
/// hosts do at once; firewalls that drop silently leave the handshake timeout).
async fn refused(addr: SocketAddr) {
    let bind: SocketAddr = if addr.is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let probe = async {
        let socket = tokio::net::UdpSocket::bind(bind).await.ok()?;
        socket.connect(addr).await.ok()?;
        socket.send(&[0]).await.ok()?;
        let mut buf = [0u8; 1];
        match socket.recv(&mut buf).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(()),
            _ => None,
        }
    };
    if probe.await.is_none() {
        // No word from the host: only the handshake (or its timeout) decides.
        std::future::pending::<()>().await;
    }
}

async fn resolve(addr: &str) -> Result<SocketAddr, Error> {
    let mut addrs = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| Error::Connect(format!("resolving {addr:?}: {e}")))?;
    addrs
        .next()
        .ok_or_else(|| Error::Connect(format!("{addr:?} resolves to no address")))
}

fn host_of(addr: &str) -> String {
    let host = match addr.rsplit_once(':') {
        Some((h, _)) => h,
        None => addr,
    };
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned()
}

fn tls_config(trust: &Trust) -> Result<rustls::ClientConfig, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::Connect(e.to_string()))?;
    let mut config = match trust {
        Trust::Pin(pin) => {
            let want = normalize_pin(pin)?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(PinnedCert { want, provider }))
                .with_no_client_auth()
        }
        Trust::CaFile(path) => builder
            .with_root_certificates(roots(path)?)
            .with_no_client_auth(),
        Trust::DataDir(dir) => {
            let path = dir.join(CERT_FILE);
            match std::fs::metadata(&path) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Error::Connect(format!(
                        "no daemon certificate at {}: start musterd with this data directory, or pass --ca or --pin",
                        path.display()
                    )));
                }
                // Another user's private data directory, most likely.
                Err(e) => {
                    return Err(Error::Connect(format!(
                        "reading the daemon certificate at {}: {e}",
                        path.display()
                    )));
                }
            }
            builder
                .with_root_certificates(roots(&path)?)
                .with_no_client_auth()
        }
    };
    config.alpn_protocols = vec![ALPN.to_vec()];
    config.enable_early_data = false;
    Ok(config)
}

fn roots(path: &std::path::Path) -> Result<rustls::RootCertStore, Error> {
    let mut store = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| Error::Connect(format!("reading CA file {}: {e}", path.display())))?;
    for cert in certs {
        let cert =
            cert.map_err(|e| Error::Connect(format!("parsing CA file {}: {e}", path.display())))?;
        store
            .add(cert)
            .map_err(|e| Error::Connect(format!("CA file {}: {e}", path.display())))?;
    }
    if store.is_empty() {
        return Err(Error::Connect(format!(
            "no certificate in CA file {}",
            path.display()
        )));
    }
    Ok(store)
}

fn normalize_pin(pin: &str) -> Result<Vec<u8>, Error> {
    let cleaned: String = pin.chars().filter(|c| *c != ':').collect();
    let bytes = hex::decode(&cleaned)
        .map_err(|_| Error::InvalidInput(format!("pin {pin:?} is not hex")))?;
    if bytes.len() != 32 {
        return Err(Error::InvalidInput(format!(
            "pin {pin:?} is not a SHA-256 fingerprint (64 hex digits)"
        )));
    }
    Ok(bytes)
}

/// Accepts exactly the certificate whose SHA-256 is pinned; signatures are still checked.
#[derive(Debug)]
struct PinnedCert {
    want: Vec<u8>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for PinnedCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got = ring::digest::digest(&ring::digest::SHA256, end_entity);
        if got.as_ref() == self.want.as_slice() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "server certificate fingerprint {} does not match the pinned {}",
                hex::encode(got.as_ref()),
                hex::encode(&self.want)
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_loopback_daemon_is_reached_from_loopback() {
        for (daemon, local) in [("127.0.0.1:7420", "127.0.0.1"), ("[::1]:7420", "::1")] {
            let Ok(endpoint) = endpoint_for(daemon.parse().unwrap()) else {
                continue; // no IPv6 on this host
            };
            assert_eq!(endpoint.local_addr().unwrap().ip().to_string(), local);
        }
        let remote = endpoint_for("192.0.2.1:7420".parse().unwrap()).unwrap();
        assert!(remote.local_addr().unwrap().ip().is_unspecified());
    }

    #[test]
    fn tokens_come_from_the_option_the_file_or_the_data_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = ConnectOptions {
            trust: Trust::DataDir(dir.path().to_path_buf()),
            ..ConnectOptions::default()
        };
        assert_eq!(options.hello_token().unwrap(), None);
        std::fs::write(
            dir.path().join(LOCAL_TOKEN_FILE),
            "local-0123456789abcdef\n",
        )
        .unwrap();
        assert_eq!(
            options.hello_token().unwrap().as_deref(),
            Some("local-0123456789abcdef")
        );
        let file = dir.path().join("agent.token");
        std::fs::write(&file, "  file-0123456789abcdef \n").unwrap();
        options.token_file = Some(file.clone());
        assert_eq!(
            options.hello_token().unwrap().as_deref(),
            Some("file-0123456789abcdef")
        );
        options.token = Some("given".into());
        assert_eq!(options.hello_token().unwrap().as_deref(), Some("given"));
        options.token = None;
        for bad in ["", "two\nlines", &"x".repeat(5000)] {
            std::fs::write(&file, bad).unwrap();
            let err = options.hello_token().unwrap_err().to_string();
            assert!(err.contains("does not hold one token"), "{err}");
        }
        options.token_file = Some(dir.path().join("missing"));
        let err = options.hello_token().unwrap_err().to_string();
        assert!(err.contains("reading token file"), "{err}");
        // Trusted by pin: the data directory's token is never sent elsewhere.
        options.token_file = None;
        options.trust = Trust::Pin("ab".repeat(32));
        assert_eq!(options.hello_token().unwrap(), None);
    }

    #[test]
    fn addresses_are_host_port_entries_separated_by_commas() {
        assert_eq!(addresses("127.0.0.1:7420").unwrap(), ["127.0.0.1:7420"]);
        assert_eq!(
            addresses("a.example:7420, [::1]:7421,b:1,a.example:7420").unwrap(),
            ["a.example:7420", "[::1]:7421", "b:1"]
        );
        let many = vec!["h:1"; MAX_ADDRESSES].join(",");
        assert_eq!(addresses(&many).unwrap(), ["h:1"]);
        let too_many = vec!["h:1"; MAX_ADDRESSES + 1].join(",");
        assert_eq!(
            addresses(&too_many).unwrap_err().to_string(),
            format!("invalid input: more than 16 addresses in {too_many:?}")
        );
        assert_eq!(
            addresses("a:1,,b:2").unwrap_err().to_string(),
            r#"invalid input: an empty address in "a:1,,b:2" (addresses are HOST:PORT separated by commas)"#
        );
        assert_eq!(
            addresses("").unwrap_err().to_string(),
            r#"invalid input: an empty address in "" (addresses are HOST:PORT separated by commas)"#
        );
        for bad in [
            "a",
            "a:",
            ":1",
            "a:x",
            "a:70000",
            "::1:7420",
            "[::1:7420",
            "[x]:1",
            "a b:1",
        ] {
            assert_eq!(
                addresses(&format!("h:1,{bad}")).unwrap_err().to_string(),
                format!(
                    "invalid input: address {bad:?} is not HOST:PORT (an IPv6 host in brackets: [::1]:7420)"
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn pins_and_hosts() {
        let hexpin = "ab".repeat(32);
        assert_eq!(normalize_pin(&hexpin).unwrap(), vec![0xab; 32]);
        let colons = vec!["AB"; 32].join(":");
        assert_eq!(normalize_pin(&colons).unwrap(), vec![0xab; 32]);
        assert!(normalize_pin("abc").is_err());
        assert!(normalize_pin(&"ab".repeat(31)).is_err());
        assert_eq!(host_of("127.0.0.1:7420"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7420"), "::1");
        assert_eq!(host_of("muster.example.com:1"), "muster.example.com");
    }
}
