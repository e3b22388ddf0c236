//! The HTTPS server: rustls (ring) with a certificate that can be swapped at any time (every
//! handshake reads the current one, so a rotated certificate needs no restart), HTTP/1.1 via
//! hyper, one task per connection, graceful shutdown.
//!
//! Bounded: at most [`MAX_CONNECTIONS`] connections are open (further clients wait in the
//! listen backlog), a handshake must finish within [`HANDSHAKE_TIMEOUT`] and each request's
//! headers arrive within [`HEADER_READ_TIMEOUT`] (which also closes idle keep-alive
//! connections); the body's limits are the handlers' (see [`super::admission`]).

use std::{
    future::Future,
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};

use axum::Router;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    server::graceful::GracefulShutdown,
    service::TowerToHyperService,
};
use rustls::{
    ServerConfig,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

/// How long a client may take to complete the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send the request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long in-flight requests may run after shutdown begins.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once (the API server keeps a few per replica open).
pub const MAX_CONNECTIONS: usize = 256;

/// Connection limits of [`serve_with`].
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// See [`HANDSHAKE_TIMEOUT`].
    pub handshake_timeout: Duration,
    /// See [`HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// See [`MAX_CONNECTIONS`].
    pub max_connections: usize,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            handshake_timeout: HANDSHAKE_TIMEOUT,
            header_read_timeout: HEADER_READ_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

/// Why TLS material cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate PEM holds no certificate or cannot be parsed.
    #[error("the certificate is not PEM: {0}")]
    Certificate(String),
    /// The key PEM holds no private key or cannot be parsed.
    #[error("the private key is not PEM: {0}")]
    Key(String),
    /// rustls rejects the pair (unsupported key type, key does not match the certificate).
    #[error("the certificate and key cannot be used: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The ring crypto provider, which this process uses everywhere.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses a PEM certificate chain (leaf first) and a PEM private key into a rustls key, checking
/// that the key belongs to the leaf.
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Certificate(e.to_string()))?;
    if chain.is_empty() {
        return Err(TlsError::Certificate("no CERTIFICATE block".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Key(e.to_string()))?;
    Ok(CertifiedKey::from_der(chain, key, &provider())?)
}

/// The serving certificate, replaceable while serving. Handshakes fail while it has none.
#[derive(Debug, Default)]
pub struct CertResolver {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl CertResolver {
    /// Replaces the certificate for every later handshake.
    pub fn set(&self, key: CertifiedKey) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(key));
    }

    /// Whether a certificate is loaded.
    pub fn is_ready(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// A TLS server configuration (TLS 1.2 and 1.3, HTTP/1.1) that takes its certificate from
/// `resolver`.
pub fn server_config(resolver: Arc<CertResolver>) -> Result<ServerConfig, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Serves `router` over TLS on `listener` until `shutdown` resolves, then lets in-flight
/// requests finish (for at most [`DRAIN_TIMEOUT`]).
pub async fn serve(
    listener: TcpListener,
    config: ServerConfig,
    router: Router,
    shutdown: impl Future<Output = ()>,
) {
    serve_with(listener, config, router, ServeLimits::default(), shutdown).await;
}

/// [`serve`] with other connection limits.
pub async fn serve_with(
    listener: TcpListener,
    config: ServerConfig,
    router: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // At the limit, stop accepting until a connection closes.
        let permit = tokio::select! {
            permit = Arc::clone(&connections).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    warn!(%error, "cannot accept a webhook connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(router.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    debug!(%peer, %error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            let connection = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(error) = watcher.watch(connection).await {
                debug!(%peer, %error, "webhook connection ended with an error");
            }
        });
    }
    info!("webhook server stopping; draining connections");
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        warn!("webhook connections did not finish in time");
    }
}
