//! planner-operator: autoscales NVIDIA Dynamo disaggregated inference (prefill and decode pools)
//! to latency SLAs, and keeps KV-cache transfers inside a topology domain.

pub mod api;
pub mod cli;
pub mod connector;
pub mod controller;
pub mod frontend;
pub mod metrics;
pub mod planner;
pub mod rbac;
pub mod runtime;
pub mod sim;
pub mod telemetry;
pub mod topology;
pub mod validation;
pub mod webhook;
