//! Inputs the planner reads from outside the cluster's API: the Prometheus HTTP API that holds
//! the Dynamo frontend's metrics.

pub mod prometheus;
