//! Metrics: the operator's own `/metrics` (Prometheus exposition via prometheus-client).

pub mod budget;
pub mod operator;
pub mod policy;
