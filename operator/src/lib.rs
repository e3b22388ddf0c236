//! planner-operator: autoscales NVIDIA Dynamo disaggregated inference (prefill and decode pools)
//! to latency SLAs, and keeps KV-cache transfers inside a topology domain.

pub mod api;
pub mod cli;
pub mod planner;
