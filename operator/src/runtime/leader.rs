//! Leader election: only the holder of the Lease runs the controllers, and only while its
//! fence ([`super::fence`]) confirms the lease; when the fence expires while the controllers
//! run, they are stopped (a step-down), to start again only when the lease is confirmed ours
//! again. `/healthz` fails when the controllers stopped on their own while leading (the process
//! then releases the lease and exits non-zero), and when a step-down has not recovered (leading
//! again, or standing by) within [`step_down_recovery`].

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{error, info, warn};

use super::{
    args::RunArgs,
    controllers::run_controllers,
    error::RunError,
    fence::{LeaseFence, fenced_client, watch_lease},
    health::Health,
};
use crate::metrics::operator::OperatorMetrics;

/// How long after a step-down `/healthz` waits for the process to lead again or stand by.
pub fn step_down_recovery(lease_duration: Duration) -> Duration {
    lease_duration * 2 + Duration::from_secs(10)
}

/// Why the controllers of one term as leader stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TermEnd {
    /// Shutdown was requested.
    Shutdown,
    /// The lease library reports another holder.
    Lost,
    /// The lease was not confirmed before its deadline: the controllers were stopped.
    SteppedDown,
}

/// Leader election: runs the controllers while this process holds the lease and it is
/// confirmed (see [`LeaseFence`]); returns when shutdown is requested, or with an error when
/// the controllers stopped on their own while leading.
pub(super) async fn lead(
    client: &Client,
    args: &RunArgs,
    identity: &str,
    lease_namespace: &str,
    metrics: &Arc<OperatorMetrics>,
    health: &Arc<Health>,
    shutdown_rx: &watch::Receiver<bool>,
) -> Result<(), RunError> {
    let duration = args.lease_duration_seconds.max(2);
    let grace = duration.div_ceil(3).max(1).min(duration - 1);
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &args.lease_name)
        .with_namespace(lease_namespace)
        .with_identity(identity)
        .with_duration(duration)
        .with_grace(grace)
        .build()
        .await
        .map_err(|source| RunError::LeaderElection {
            namespace: lease_namespace.to_string(),
            name: args.lease_name.clone(),
            source,
        })?;
    // The lease is renewed `grace` seconds before it expires; writes stop half of that before.
    let margin = Duration::from_secs(grace) / 2;
    let fence = LeaseFence::default();
    let watcher = tokio::spawn(watch_lease(
        Api::namespaced(client.clone(), lease_namespace),
        args.lease_name.clone(),
        identity.to_string(),
        margin,
        (Duration::from_secs(grace) / 2).max(Duration::from_millis(500)),
        fence.clone(),
        shutdown_rx.clone(),
    ));
    let fenced = fenced_client(client.clone(), fence.clone());
    let recovery = step_down_recovery(Duration::from_secs(duration));
    let (mut leading, lease_task) = manager.watch().await;
    info!(%identity, lease = %format!("{lease_namespace}/{}", args.lease_name), "waiting to become the leader");
    let mut shutdown = shutdown_rx.clone();
    let mut outcome = Ok(());
    loop {
        let leader = *leading.borrow_and_update();
        if !leader {
            health.recovered();
        }
        if leader && fence.allows_writes() {
            info!(%identity, "became the leader; starting controllers");
            health.recovered();
            let end = term(&fenced, args, identity, metrics, &leading, &fence, shutdown_rx).await;
            if *shutdown_rx.borrow() {
                break;
            }
            match end {
                Some(TermEnd::Lost) => {
                    warn!(%identity, "lost the leader lease; controllers stopped until it is regained");
                }
                Some(TermEnd::SteppedDown) => {
                    warn!(
                        %identity,
                        "the leader lease was not renewed before its deadline; stepped down (controllers stopped, writes refused) until it is confirmed again"
                    );
                    health.stepped_down(recovery);
                }
                Some(TermEnd::Shutdown) | None => {
                    error!(%identity, "the controllers stopped on their own while leading; releasing the lease and exiting");
                    health.controllers_stopped();
                    outcome = Err(RunError::ControllersStopped);
                    break;
                }
            }
            continue;
        }
        tokio::select! {
            changed = leading.changed() => if changed.is_err() { warn!("leader election stopped"); break; },
            () = fence.confirmed(), if leader => {}
            _ = shutdown.changed() => break,
        }
    }
    watcher.abort();
    // Dropping the receiver releases the lease, so a standby takes over at once.
    drop(leading);
    match tokio::time::timeout(Duration::from_secs(5), lease_task).await {
        Ok(Ok(Err(error))) => warn!(%error, "releasing the lease failed"),
        Err(_) => warn!("timed out releasing the lease"),
        _ => info!("released the leader lease"),
    }
    outcome
}

/// One term as leader: runs the controllers on the fenced client until shutdown is requested,
/// the lease library reports another holder or the fence expires. `None`: the controllers
/// returned before anything asked them to stop.
async fn term(
    fenced: &Client,
    args: &RunArgs,
    identity: &str,
    metrics: &Arc<OperatorMetrics>,
    leading: &watch::Receiver<bool>,
    fence: &LeaseFence,
    shutdown_rx: &watch::Receiver<bool>,
) -> Option<TermEnd> {
    metrics.set_leader(true);
    let ended = Arc::new(Mutex::new(None));
    let stop = {
        let (mut lost, mut shutdown, fence, ended) = (
            leading.clone(),
            shutdown_rx.clone(),
            fence.clone(),
            Arc::clone(&ended),
        );
        async move {
            let end = tokio::select! {
                _ = shutdown.wait_for(|stop| *stop) => TermEnd::Shutdown,
                _ = lost.wait_for(|leader| !*leader) => TermEnd::Lost,
                () = fence.expired() => TermEnd::SteppedDown,
            };
            *ended.lock().unwrap_or_else(PoisonError::into_inner) = Some(end);
        }
    };
    run_controllers(fenced, args, identity, Arc::clone(metrics), stop).await;
    metrics.set_leader(false);
    *ended.lock().unwrap_or_else(PoisonError::into_inner)
}
