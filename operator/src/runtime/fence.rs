//! The leader's fence. The lease library keeps saying "leader" while it retries a failed
//! renewal, and a process frozen past its lease (SIGSTOP, a stalled node, a long GC-like pause)
//! wakes up still believing it leads. So this process reads its Lease itself every few seconds
//! ([`watch_lease`]) and knows until when the lease is certainly its own: its `renewTime` plus
//! its duration, less a margin ([`lease_validity`]). Every write the controllers make goes
//! through a client that refuses it once that time has passed ([`fenced_client`]), whichever
//! task notices first after a pause.

use std::{sync::Arc, time::Duration};

use axum::http::Method;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    jiff::Timestamp,
};
use kube::{Api, Client};
use tokio::{sync::watch, time::Instant};
use tracing::{debug, warn};

/// Until when this process may write as the leader: the expiry of its lease as last read from
/// the API server, less a margin; `None` when the lease is not (known to be) its own. Shared by
/// the lease reader, the fenced client and the step-down watchdog.
#[derive(Clone, Debug)]
pub struct LeaseFence {
    valid_until: Arc<watch::Sender<Option<Instant>>>,
}

impl Default for LeaseFence {
    fn default() -> Self {
        Self {
            valid_until: Arc::new(watch::Sender::new(None)),
        }
    }
}

impl LeaseFence {
    /// Whether a write may be sent now.
    pub fn allows_writes(&self) -> bool {
        self.valid_until
            .borrow()
            .is_some_and(|until| Instant::now() < until)
    }

    /// Records what the last read of the lease showed.
    pub fn set(&self, valid_until: Option<Instant>) {
        self.valid_until.send_replace(valid_until);
    }

    /// Resolves once the lease's validity has passed without being extended (at once when it
    /// is not known to be ours).
    pub async fn expired(&self) {
        let mut updates = self.valid_until.subscribe();
        loop {
            let until = *updates.borrow_and_update();
            let Some(until) = until.filter(|until| Instant::now() < *until) else {
                return;
            };
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                changed = updates.changed() => if changed.is_err() { return; },
            }
        }
    }

    /// Resolves once writes are allowed.
    pub(super) async fn confirmed(&self) {
        let mut updates = self.valid_until.subscribe();
        loop {
            if self.allows_writes() {
                return;
            }
            if updates.changed().await.is_err() {
                return;
            }
        }
    }
}

/// Until when a lease read at `sent` (monotonic) / `wall` (wall clock, when the request was sent)
/// is certainly held by `identity`: its renewal time plus its duration, less `margin` (for the
/// request's own latency and other replicas' clocks), and never further than one duration from
/// `sent`. `None` when someone else (or nobody) holds it.
pub fn lease_validity(
    spec: &LeaseSpec,
    identity: &str,
    sent: Instant,
    wall: Timestamp,
    margin: Duration,
) -> Option<Instant> {
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
    let duration = Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).ok()?);
    let since_renewal = wall.duration_since(renewed);
    // Time left before another replica may take the lease, by our clock (a renewal in our
    // future, from a faster clock, counts as now).
    let left = if since_renewal.is_negative() {
        duration
    } else {
        duration.saturating_sub(Duration::try_from(since_renewal).ok()?)
    };
    Some(sent + left.saturating_sub(margin))
}

/// Reads the lease every `period` and records in `fence` until when it is certainly ours.
pub(super) async fn watch_lease(
    leases: Api<Lease>,
    name: String,
    identity: String,
    margin: Duration,
    period: Duration,
    fence: LeaseFence,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let (sent, wall) = (Instant::now(), Timestamp::now());
        match leases.get_opt(&name).await {
            Ok(lease) => {
                let until = lease
                    .and_then(|l| l.spec)
                    .and_then(|spec| lease_validity(&spec, &identity, sent, wall, margin));
                fence.set(until);
            }
            // Keep what is known: it expires by itself.
            Err(error) => debug!(%error, "cannot read the leader lease"),
        }
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// Why the fenced client refused a request.
#[derive(Debug, thiserror::Error)]
#[error(
    "{method} {path} refused: this process's leader lease is not confirmed (not renewed before its deadline, or held by another replica)"
)]
pub struct FencedWrite {
    method: Method,
    path: String,
}

/// A client that sends reads as `client` does, and writes only while `fence` allows them.
pub fn fenced_client(client: Client, fence: LeaseFence) -> Client {
    let default_namespace = client.default_namespace().to_string();
    let service = tower::service_fn(move |request: axum::http::Request<kube::client::Body>| {
        let (client, fence) = (client.clone(), fence.clone());
        async move {
            let read = matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS);
            if !read && !fence.allows_writes() {
                let refused = FencedWrite {
                    method: request.method().clone(),
                    path: request.uri().path().to_string(),
                };
                warn!(%refused, "write refused");
                return Err::<_, Box<dyn std::error::Error + Send + Sync>>(Box::new(refused));
            }
            client.send(request).await.map_err(|e| Box::new(e) as _)
        }
    });
    Client::new(service, default_namespace)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    fn lease(holder: &str, renewed: Timestamp, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(renewed)),
            lease_duration_seconds: Some(seconds),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_lease_is_ours_until_its_expiry_less_the_margin() {
        let sent = Instant::now();
        let wall = Timestamp::from_second(1_800_000_000).unwrap();
        let margin = Duration::from_secs(2);
        // Renewed 5 s ago for 15 s: 10 s left, 8 s once the margin is taken off.
        let renewed = wall - k8s_openapi::jiff::SignedDuration::from_secs(5);
        assert_eq!(
            lease_validity(&lease("me", renewed, 15), "me", sent, wall, margin),
            Some(sent + Duration::from_secs(8))
        );
        // Someone else's, or nobody's.
        assert_eq!(
            lease_validity(&lease("you", renewed, 15), "me", sent, wall, margin),
            None
        );
        assert_eq!(
            lease_validity(&LeaseSpec::default(), "me", sent, wall, margin),
            None
        );
        // Expired: valid until the past, so no write goes out.
        let old = wall - k8s_openapi::jiff::SignedDuration::from_secs(60);
        let until = lease_validity(&lease("me", old, 15), "me", sent, wall, margin).unwrap();
        assert!(until <= sent);
        // A renewal stamped in our future (a faster clock) counts as now, never beyond one
        // duration.
        let future = wall + k8s_openapi::jiff::SignedDuration::from_secs(100);
        assert_eq!(
            lease_validity(&lease("me", future, 15), "me", sent, wall, margin),
            Some(sent + Duration::from_secs(13))
        );
    }

    #[tokio::test]
    async fn the_fence_expires_unless_the_lease_is_confirmed_again() {
        let fence = LeaseFence::default();
        assert!(!fence.allows_writes(), "nothing confirmed yet");
        fence.set(Some(Instant::now() + Duration::from_secs(2)));
        assert!(fence.allows_writes());
        let expired = {
            let fence = fence.clone();
            tokio::spawn(async move { fence.expired().await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Renewed in time: the deadline moves.
        fence.set(Some(Instant::now() + Duration::from_secs(2)));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(!expired.is_finished(), "expired although renewed");
        assert!(fence.allows_writes());
        // Not renewed: it expires, and writes stop.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(expired.is_finished());
        assert!(!fence.allows_writes());
        // Another holder: at once.
        fence.set(None);
        tokio::time::timeout(Duration::from_millis(100), fence.expired())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn the_fenced_client_refuses_writes_but_not_reads_without_a_confirmed_lease() {
        // An API server that answers every request with an empty list and counts them.
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let api_server = {
            let seen = Arc::clone(&seen);
            tower::service_fn(move |_request: axum::http::Request<kube::client::Body>| {
                seen.fetch_add(1, Ordering::SeqCst);
                async move {
                    let body = r#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{},"items":[]}"#;
                    Ok::<_, std::convert::Infallible>(
                        axum::http::Response::builder()
                            .header("content-type", "application/json")
                            .body(kube::client::Body::from(body.as_bytes().to_vec()))
                            .unwrap(),
                    )
                }
            })
        };
        let fence = LeaseFence::default();
        let client = fenced_client(Client::new(api_server, "default"), fence.clone());
        let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client, "default");
        config_maps.list(&Default::default()).await.unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 1, "reads pass");
        let error = config_maps.delete("x", &Default::default()).await.unwrap_err();
        assert!(
            crate::controller::common::chain(&error)
                .contains("DELETE /api/v1/namespaces/default/configmaps/x refused"),
            "{error}"
        );
        assert_eq!(seen.load(Ordering::SeqCst), 1, "the write never left the process");
        fence.set(Some(Instant::now() + Duration::from_secs(10)));
        let _ = config_maps.delete("x", &Default::default()).await;
        assert_eq!(seen.load(Ordering::SeqCst), 2, "a confirmed leader writes");
    }
}
