//! Why `planner-operator run` could not start or stopped.

use std::net::SocketAddr;

use crate::webhook;

/// Why the operator could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No usable kubeconfig or in-cluster config.
    #[error("cannot configure a Kubernetes client (set KUBECONFIG or run in a pod): {0}")]
    Client(#[source] kube::Error),
    /// The health and metrics server could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// The admission webhook could not start.
    #[error("cannot start the admission webhook: {0}")]
    Webhook(#[from] webhook::WebhookError),
    /// Leader election could not start.
    #[error("cannot start leader election on Lease {namespace}/{name}: {source}")]
    LeaderElection {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// The error.
        source: kube_lease_manager::LeaseManagerError,
    },
    /// The controllers stopped while this process was the leader (and not asked to stop): the
    /// lease was released, and the process exits so that it is restarted.
    #[error("the controllers stopped while this process was the leader; lease released, exiting")]
    ControllersStopped,
}
