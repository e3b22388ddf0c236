//! End-to-end tests against the cluster `KUBECONFIG` names: `make cluster-up && make e2e`, or
//! `make e2e-kind`. Each test gets its own namespace (see `e2e::in_namespace`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod aggregated;
mod bed;
mod budget;
mod chart;
mod chart_rbac;
mod closed_loop;
mod cluster;
mod conformance;
mod conversion;
mod crd_race;
mod crds;
mod dgd;
mod dgd_ownership;
mod dynamo_operator;
mod fake_prometheus;
mod faults;
mod leader_freeze;
mod operator;
mod policy_rules;
mod profile;
mod prometheus;
mod real_metrics;
mod scrape_interval;
mod topology;
mod topology_label_keys;
mod virtual_connector;
mod webhook;
mod webhook_outage;
