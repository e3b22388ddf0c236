//! planner-operator: autoscales NVIDIA Dynamo inference graphs (aggregated, or prefill and decode pools)
//! to latency SLAs, and keeps KV-cache transfers inside a topology domain.
//!
//! The planner maths live in `planner_core` (no Kubernetes, no I/O) and the API types in
//! `planner_api`; this crate is the operator around them: the reconcilers, the admission
//! webhook, the connectors that carry decisions out, the metrics sources and the runtime.

pub mod cli;
pub mod connector;
pub mod controller;
pub mod lookup;
pub mod metrics;
pub mod rbac;
pub mod runtime;
pub mod sources;
pub mod target;
pub mod telemetry;
pub mod topology;
pub mod validation;
pub mod webhook;
pub mod whatif;

/// Field manager of every object and status this operator writes with server-side apply. The
/// planner's replica changes use their own manager (see [`connector::kubernetes`]).
pub const FIELD_MANAGER: &str = "planner-operator";

/// Installs the process's TLS provider (ring) if none is installed yet. reqwest is built without
/// one of its own, so every HTTP client constructor calls this first: a library user who never
/// ran `main` gets a working client instead of a panic.
pub fn install_crypto_provider() {
    // An error only says a provider is already installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
