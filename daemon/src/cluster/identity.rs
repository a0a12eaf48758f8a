//! A cluster node's identity: everything derived from the cluster secret and the
//! cluster id, and the QUIC endpoint that presents it.
//!
//! Nodes authenticate each other by the cluster secret alone, as mutual TLS: every node
//! derives the same Ed25519 key from the secret and the cluster id ([`identity`]) and
//! presents a certificate for it, and a peer is accepted, as client or as server, only
//! if its certificate carries that same public key ([`ClusterPeers`]). A node with
//! another secret or of another cluster fails the handshake. TLS 1.3 only, no 0-RTT (a
//! replayed vote or append must never be processed twice). The node's endpoint
//! ([`endpoint`], ALPN [`ALPN`]) is its own, apart from the client endpoint.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tracing::warn;

/// The ALPN protocol of node-to-node connections: a client endpoint (ALPN `muster/1`)
/// can never complete a handshake with a cluster endpoint, nor the other way round.
pub const ALPN: &[u8] = b"muster-raft/1";

/// Shortest cluster secret accepted, in bytes: the secret is the only thing that keeps
/// outsiders out of the cluster, so it must not be guessable.
pub const MIN_SECRET_BYTES: usize = 32;

/// Least entropy a cluster secret must show, in bits, as [`secret_entropy_bits`]
/// estimates it. Every node hands its public key (derived from the secret) to whoever
/// connects, so the secret must be beyond offline guessing: 128 bits is, whatever the
/// key derivation costs. `head -c 48 /dev/urandom | base64` gives about 270.
pub const MIN_SECRET_ENTROPY_BITS: f64 = 128.0;

/// Silence after which a connection is given up. Both sides send keep-alives well below
/// it ([`KEEP_ALIVE`]), so only a lost peer reaches it: a connection to a node that died
/// or was cut off is gone within it, and the next RPC connects afresh (to the node's new
/// process, if it was restarted) instead of waiting on the old one.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(2);

/// How often an otherwise idle connection is pinged: 8 pings per [`IDLE_TIMEOUT`], so
/// only a lost peer, not a few lost packets, ends a connection.
pub const KEEP_ALIVE: Duration = Duration::from_millis(250);

// Several keep-alives go unanswered before a live connection could time out.
const _: () = assert!(KEEP_ALIVE.as_millis() * 4 <= IDLE_TIMEOUT.as_millis());

/// RPCs one connection may have in flight at once (its open bidirectional streams).
/// openraft sends to one peer from a replication stream, elections and leadership
/// checks: a few at a time.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 64;

/// The name the cluster certificate carries and clients ask for (it is not verified:
/// the public key is what authenticates).
pub const SERVER_NAME: &str = "muster-cluster";

/// HKDF salt for everything derived from the secret: a new version of the derivation
/// gets a new label, so keys of the two never match.
const HKDF_SALT: &[u8] = b"muster-cluster-v1";

/// PKCS#8 v1 (RFC 8410) of an Ed25519 key, up to the 32-byte seed that follows it.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// Bytes a peer may have in flight on one stream (QUIC flow control).
const STREAM_WINDOW: u32 = 16 * 1024 * 1024;

/// Bytes a peer may have in flight on one connection, over all its streams.
const CONNECTION_WINDOW: u32 = 64 * 1024 * 1024;

/// UDP receive buffer asked of the kernel (capped by `net.core.rmem_max`), for
/// snapshot and catch-up bursts.
const UDP_RECV_BUFFER: usize = 4 * 1024 * 1024;

/// What a node needs to be recognised by its cluster: the key derived from the cluster
/// secret, its certificate, and the public key every peer must present.
pub struct ClusterIdentity {
    cert: CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
    /// The DER SubjectPublicKeyInfo of the derived key, as found in the certificate.
    spki: Vec<u8>,
    /// The key stateless resets are derived from, the same on every node: a restarted
    /// node's resets close its peers' stale connections at once.
    reset_key: [u8; 32],
}

impl ClusterIdentity {
    /// The public key every peer must present (for tests that play a stranger).
    #[cfg(test)]
    pub fn spki(&self) -> &[u8] {
        &self.spki
    }
}

impl Clone for ClusterIdentity {
    fn clone(&self) -> Self {
        ClusterIdentity {
            cert: self.cert.clone(),
            key: self.key.clone_key(),
            spki: self.spki.clone(),
            reset_key: self.reset_key,
        }
    }
}

impl std::fmt::Debug for ClusterIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key: only the public half.
        f.debug_struct("ClusterIdentity")
            .field("spki", &hex::encode(&self.spki))
            .finish_non_exhaustive()
    }
}

/// Derives the cluster's identity from its secret and id: the same on every node given
/// the same two, and unrelated for another secret or another id.
pub fn identity(secret: &[u8], cluster_id: &str) -> anyhow::Result<ClusterIdentity> {
    let prk = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, HKDF_SALT).extract(secret);
    let expand = |label: &[u8]| -> anyhow::Result<[u8; 32]> {
        let mut out = [0u8; 32];
        prk.expand(&[label, cluster_id.as_bytes()], ring::hkdf::HKDF_SHA256)
            .and_then(|okm| okm.fill(&mut out))
            .map_err(|_| anyhow!("deriving the cluster key"))?;
        Ok(out)
    };
    let seed = expand(b"ed25519:")?;
    let reset_key = expand(b"stateless-reset:")?;
    // The key that signs and the key that resets are apart: one never gives the other.
    assert_ne!(seed, reset_key, "keys derived under distinct labels");

    let mut pkcs8 = Vec::with_capacity(ED25519_PKCS8_PREFIX.len() + seed.len());
    pkcs8.extend_from_slice(&ED25519_PKCS8_PREFIX);
    pkcs8.extend_from_slice(&seed);
    let key = PrivatePkcs8KeyDer::from(pkcs8);
    let pair = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&key, &rcgen::PKCS_ED25519)
        .context("loading the derived cluster key")?;
    let params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_owned()])
        .context("describing the cluster certificate")?;
    let cert = params
        .self_signed(&pair)
        .context("signing the cluster certificate")?
        .der()
        .clone();
    let spki = ParsedCertificate::try_from(&cert)
        .context("reading back the cluster certificate")?
        .subject_public_key_info()
        .as_ref()
        .to_vec();
    // What every peer is checked against (`ClusterPeers`): never empty.
    assert!(
        !spki.is_empty(),
        "the derived certificate carries its public key"
    );
    Ok(ClusterIdentity {
        cert,
        key,
        spki,
        reset_key,
    })
}

/// Reads the cluster secret from a file: its bytes less surrounding whitespace, at
/// least [`MIN_SECRET_BYTES`] of them.
pub fn read_secret(path: &Path) -> anyhow::Result<Vec<u8>> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("reading the cluster secret {}", path.display()))?;
    let secret = bytes.trim_ascii();
    if secret.len() < MIN_SECRET_BYTES {
        bail!(
            "the cluster secret in {} is {} bytes long; it must be at least {MIN_SECRET_BYTES} bytes",
            path.display(),
            secret.len()
        );
    }
    let bits = secret_entropy_bits(secret);
    if bits < MIN_SECRET_ENTROPY_BITS {
        bail!(
            "the cluster secret in {} looks guessable (about {bits:.0} bits of entropy; at least {MIN_SECRET_ENTROPY_BITS:.0} are needed): make one with `head -c 48 /dev/urandom | base64`",
            path.display()
        );
    }
    Ok(secret.to_vec())
}

/// An estimate of a secret's entropy, in bits: its length times the Shannon entropy of
/// its bytes' frequencies. Random bytes, hex or base64 score near their true entropy;
/// repeated characters and short alphabets (`AAAA…`, `passwordpassword…`) score low.
/// An upper bound for text a person chose, which is why the floor is well above what
/// guessing can reach.
pub fn secret_entropy_bits(secret: &[u8]) -> f64 {
    let mut counts = [0u32; 256];
    for &b in secret {
        counts[usize::from(b)] += 1;
    }
    let n = secret.len() as f64;
    let per_byte: f64 = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum();
    debug_assert!(
        (0.0..=8.0 + 1e-9).contains(&per_byte),
        "a byte carries 0 to 8 bits, not {per_byte}"
    );
    per_byte * n
}

/// Binds the node's cluster endpoint on `listen`: it serves RPCs ([`serve`]) and sends
/// them ([`Network`]), presenting and demanding the cluster identity both ways.
pub fn endpoint(listen: SocketAddr, identity: &ClusterIdentity) -> anyhow::Result<quinn::Endpoint> {
    let server = server_config(identity, &identity.spki)?;
    let client = client_config(identity, &identity.spki)?;
    let socket =
        std::net::UdpSocket::bind(listen).with_context(|| format!("binding {listen} (cluster)"))?;
    let state =
        quinn::udp::UdpSocketState::new((&socket).into()).context("probing the UDP socket")?;
    if let Err(e) = state.set_recv_buffer_size((&socket).into(), UDP_RECV_BUFFER) {
        warn!(error = %e, "could not raise the cluster UDP receive buffer");
    }
    let reset_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &identity.reset_key);
    let config = quinn::EndpointConfig::new(Arc::new(reset_key));
    let mut endpoint =
        quinn::Endpoint::new(config, Some(server), socket, Arc::new(quinn::TokioRuntime))
            .context("starting the cluster endpoint")?;
    endpoint.set_default_client_config(client);
    Ok(endpoint)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The transport both sides use: only the connecting side opens streams, one per RPC.
fn transport(accept_streams: u32) -> anyhow::Result<Arc<quinn::TransportConfig>> {
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(accept_streams.into())
        .max_concurrent_uni_streams(0u32.into())
        .stream_receive_window(STREAM_WINDOW.into())
        .receive_window(CONNECTION_WINDOW.into())
        .send_window(u64::from(CONNECTION_WINDOW))
        .keep_alive_interval(Some(KEEP_ALIVE))
        .max_idle_timeout(Some(IDLE_TIMEOUT.try_into().context("idle timeout")?))
        .datagram_receive_buffer_size(None);
    Ok(Arc::new(transport))
}

/// The accepting side: presents `presented` and accepts clients whose key is `expected`.
fn server_config(
    presented: &ClusterIdentity,
    expected: &[u8],
) -> anyhow::Result<quinn::ServerConfig> {
    let provider = provider();
    let verifier = Arc::new(ClusterPeers::new(expected, &provider));
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("configuring TLS 1.3")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![presented.cert.clone()],
            PrivateKeyDer::Pkcs8(presented.key.clone_key()),
        )
        .context("loading the cluster key")?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    // IMPORTANT: 0-RTT data can be replayed; a vote or an append must not be.
    tls.max_early_data_size = 0;
    let crypto = QuicServerConfig::try_from(tls).context("building the QUIC TLS configuration")?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(transport(MAX_STREAMS_PER_CONNECTION)?);
    Ok(config)
}

/// The connecting side: presents `presented` and accepts servers whose key is `expected`.
pub fn client_config(
    presented: &ClusterIdentity,
    expected: &[u8],
) -> anyhow::Result<quinn::ClientConfig> {
    let provider = provider();
    let verifier = Arc::new(ClusterPeers::new(expected, &provider));
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("configuring TLS 1.3")?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(
            vec![presented.cert.clone()],
            PrivateKeyDer::Pkcs8(presented.key.clone_key()),
        )
        .context("loading the cluster key")?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    tls.enable_early_data = false;
    let crypto = QuicClientConfig::try_from(tls).context("building the QUIC TLS configuration")?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    // The server side opens no streams towards the connecting node.
    config.transport_config(transport(0)?);
    Ok(config)
}

/// Accepts a peer, as server or as client, only if its certificate carries the cluster's
/// public key; handshake signatures are checked against that key (Ed25519, TLS 1.3).
/// Names, dates and issuers are not looked at: the key is the whole identity.
#[derive(Debug)]
struct ClusterPeers {
    spki: Vec<u8>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClusterPeers {
    fn new(spki: &[u8], provider: &CryptoProvider) -> ClusterPeers {
        assert!(
            !spki.is_empty(),
            "a verifier expects a key: an empty one matches none"
        );
        ClusterPeers {
            spki: spki.to_vec(),
            algorithms: provider.signature_verification_algorithms,
        }
    }

    fn check(&self, end_entity: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        if parsed.subject_public_key_info().as_ref() == self.spki.as_slice() {
            Ok(())
        } else {
            // Another secret or another cluster id.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }
}

/// TLS 1.2 is never offered; a TLS 1.2 signature is refused should one ever arrive.
fn no_tls12() -> rustls::Error {
    rustls::Error::PeerIncompatible(rustls::PeerIncompatible::Tls13RequiredForQuic)
}

impl ServerCertVerifier for ClusterPeers {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity)
            .map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(no_tls12())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

impl ClientCertVerifier for ClusterPeers {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity)
            .map(|()| ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(no_tls12())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
    const OTHER_SECRET: &[u8] = b"0123456789abcdef0123456789abcdeF";
    const CLUSTER: &str = "prod";

    #[test]
    fn identity_is_derived_from_the_secret_and_the_cluster_id() {
        let a = identity(SECRET, CLUSTER).unwrap();
        let b = identity(SECRET, CLUSTER).unwrap();
        assert_eq!(a.spki, b.spki);
        assert_eq!(a.key.secret_pkcs8_der(), b.key.secret_pkcs8_der());
        assert_eq!(a.reset_key, b.reset_key);
        assert_eq!(a.key.secret_pkcs8_der().len(), 48);
        assert_eq!(&a.key.secret_pkcs8_der()[..16], &ED25519_PKCS8_PREFIX);
        let other_secret = identity(OTHER_SECRET, CLUSTER).unwrap();
        let other_cluster = identity(SECRET, "staging").unwrap();
        assert_ne!(a.spki, other_secret.spki);
        assert_ne!(a.spki, other_cluster.spki);
        assert_ne!(a.reset_key, other_cluster.reset_key);
        assert_ne!(a.reset_key.as_slice(), &a.key.secret_pkcs8_der()[16..]);
        // Ed25519: algorithm id 1.3.101.112, then the 32-byte key.
        assert_eq!(a.spki.len(), 44);
        assert_eq!(&a.spki[4..9], &[0x06, 0x03, 0x2b, 0x65, 0x70]);
        assert!(!format!("{a:?}").contains(&hex::encode(&a.key.secret_pkcs8_der()[16..])));
    }

    #[test]
    fn read_secret_wants_32_bytes_less_surrounding_whitespace() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, [b'x'; 31]).unwrap();
        assert_eq!(
            read_secret(&short).unwrap_err().to_string(),
            format!(
                "the cluster secret in {} is 31 bytes long; it must be at least 32 bytes",
                short.display()
            )
        );
        let padded = dir.path().join("padded");
        std::fs::write(&padded, b"  \n0123456789abcdef0123456789abcde\n").unwrap();
        assert!(
            read_secret(&padded)
                .unwrap_err()
                .to_string()
                .contains("is 31 bytes long")
        );
        let good = dir.path().join("good");
        std::fs::write(&good, [SECRET, b"\n"].concat()).unwrap();
        assert_eq!(read_secret(&good).unwrap(), SECRET);
        // Long enough but guessable: refused, saying how to make a good one.
        for weak in [vec![b'A'; 40], b"passwordpasswordpasswordpassword".to_vec()] {
            let path = dir.path().join("weak");
            std::fs::write(&path, &weak).unwrap();
            let refused = read_secret(&path).unwrap_err().to_string();
            assert!(
                refused.starts_with(&format!(
                    "the cluster secret in {} looks guessable (about ",
                    path.display()
                )) && refused.ends_with(
                    "bits of entropy; at least 128 are needed): make one with `head -c 48 /dev/urandom | base64`"
                ),
                "{refused}"
            );
        }
    }

    #[test]
    fn secrets_are_estimated_by_the_spread_of_their_bytes() {
        assert_eq!(secret_entropy_bits(&[b'A'; 40]), 0.0);
        // 32 bytes over 16 symbols, evenly: 4 bits each.
        assert_eq!(
            secret_entropy_bits(b"0123456789abcdef0123456789abcdef"),
            128.0
        );
        // 64 characters over 64 symbols, evenly: 6 bits each.
        let base64: Vec<u8> = (b'A'..=b'Z')
            .chain(b'a'..=b'z')
            .chain(b'0'..=b'9')
            .chain([b'+', b'/'])
            .collect();
        assert_eq!(secret_entropy_bits(&base64), 384.0);
    }
}
