//! The daemon's TLS identity and QUIC server configuration.
//!
//! On first start the daemon writes a self-signed certificate (for `localhost`,
//! `127.0.0.1` and `::1`) and its key into the data directory; later starts reuse them.
//! Operators can give their own certificate chain and key instead. Only TLS 1.3 is
//! offered and 0-RTT is refused, so an enqueue or ack can never be replayed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use quinn::crypto::rustls::QuicServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use muster_protocol::limits::MAX_FRAME_BYTES;
use muster_protocol::{ALPN, CERT_FILE, KEY_FILE, SERVER_NAME};

/// Streams a connection may open before it presented its token (tokens configured);
/// raised to the full limit by its `hello`.
pub const STREAMS_BEFORE_HELLO: u32 = 2;

/// Connection receive window before the token is presented (tokens configured).
pub const WINDOW_BEFORE_HELLO: u32 = 64 * 1024;

/// Bidirectional streams a client may have open at once on one connection.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 64;

/// Idle time after which a silent connection is closed (clients keep alive below it).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes a peer may have in flight on one stream: two maximal frames.
const STREAM_WINDOW: u32 = 2 * MAX_FRAME_BYTES as u32;

/// Bytes a peer may have in flight on one connection, over all its streams.
pub const CONNECTION_WINDOW: u32 = 4 * MAX_FRAME_BYTES as u32;

/// The certificate and key the daemon serves with.
pub struct Identity {
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    /// Lowercase hex SHA-256 of the leaf certificate, for clients to pin.
    pub fingerprint: String,
    /// Where the certificate was read from or written to.
    pub cert_path: PathBuf,
}

/// Loads the operator's certificate and key, or the data directory's, creating the latter on first start.
pub fn load_identity(
    data: &Path,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> anyhow::Result<Identity> {
    let (cert_path, key_path) = match (cert, key) {
        (Some(c), Some(k)) => (c.to_path_buf(), k.to_path_buf()),
        (None, None) => {
            let c = data.join(CERT_FILE);
            let k = data.join(KEY_FILE);
            if !c.exists() && !k.exists() {
                create_self_signed(&c, &k)?;
            }
            (c, k)
        }
        _ => bail!("--cert and --key must be given together"),
    };
    let certs = CertificateDer::pem_file_iter(&cert_path)
        .with_context(|| format!("reading certificate {}", cert_path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing certificate {}", cert_path.display()))?;
    let Some(leaf) = certs.first() else {
        bail!("no certificate in {}", cert_path.display());
    };
    let key = PrivateKeyDer::from_pem_file(&key_path)
        .with_context(|| format!("reading private key {}", key_path.display()))?;
    let fingerprint = hex::encode(ring::digest::digest(&ring::digest::SHA256, leaf).as_ref());
    Ok(Identity {
        certs,
        key,
        fingerprint,
        cert_path,
    })
}

fn create_self_signed(cert_path: &Path, key_path: &Path) -> anyhow::Result<()> {
    let names = vec![
        SERVER_NAME.to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    let generated =
        rcgen::generate_simple_self_signed(names).context("generating a certificate")?;
    write_private(key_path, generated.signing_key.serialize_pem().as_bytes())?;
    std::fs::write(cert_path, generated.cert.pem())
        .with_context(|| format!("writing {}", cert_path.display()))?;
    Ok(())
}

#[cfg(unix)]
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(not(unix))]
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// The file in the data directory holding the key that stateless resets are derived from.
pub const RESET_KEY_FILE: &str = "reset.key";

/// Secrets that survive restarts so that a restarted daemon recognises connection ids it
/// handed out before and answers their packets with a valid stateless reset: clients
/// notice at once that they must reconnect instead of waiting out the idle timeout.
pub struct ResetSecrets {
    /// The key quinn derives stateless-reset tokens from.
    pub reset_key: ring::hmac::Key,
    /// The key of quinn's hashed connection-id generator.
    pub cid_key: u64,
}

/// Reads (or creates, on first start) the reset secrets in the data directory.
pub fn reset_secrets(data: &Path) -> anyhow::Result<ResetSecrets> {
    let path = data.join(RESET_KEY_FILE);
    if !path.exists() {
        let mut secret = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
            .map_err(|_| anyhow::anyhow!("no randomness for the reset key"))?;
        write_private(&path, &secret)?;
    }
    let secret = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    if secret.len() < 32 {
        bail!(
            "{} is shorter than 32 bytes; delete it to make a new one",
            path.display()
        );
    }
    let reset_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret);
    let tag = ring::hmac::sign(&reset_key, b"muster connection ids");
    let mut cid = [0u8; 8];
    cid.copy_from_slice(&tag.as_ref()[..8]);
    Ok(ResetSecrets {
        reset_key,
        cid_key: u64::from_be_bytes(cid),
    })
}

/// The QUIC server configuration: TLS 1.3 only, ALPN `muster/1`, no 0-RTT, explicit limits.
pub fn server_config(identity: Identity) -> anyhow::Result<quinn::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("configuring TLS 1.3")?
        .with_no_client_auth()
        .with_single_cert(identity.certs, identity.key)
        .context("loading the certificate and key")?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    // IMPORTANT: 0-RTT data can be replayed by an attacker; an enqueue or ack must not be.
    tls.max_early_data_size = 0;
    let crypto = QuicServerConfig::try_from(tls).context("building the QUIC TLS configuration")?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport
        // A connection starts small and gets the full limits with its place of
        // --max-connections (at once without tokens, at its first valid `hello` with
        // them): one that never presents a token can buffer little.
        .max_concurrent_bidi_streams(STREAMS_BEFORE_HELLO.into())
        .max_concurrent_uni_streams(0u32.into())
        .stream_receive_window(STREAM_WINDOW.into())
        .receive_window(WINDOW_BEFORE_HELLO.into())
        .send_window(u64::from(CONNECTION_WINDOW))
        .max_idle_timeout(Some(IDLE_TIMEOUT.try_into().context("idle timeout")?))
        .datagram_receive_buffer_size(None);
    config.transport_config(Arc::new(transport));
    Ok(config)
}
