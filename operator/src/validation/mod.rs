//! The rules the CRD schemas (OpenAPI and CEL) cannot express, as pure functions over the API
//! types. The admission webhook and the reconcilers call the same functions, so they cannot
//! disagree about what is valid. Lookups (the ClusterTopology, the target DGD) are done by the
//! callers and passed in.
//!
//! - DynamoGraphDeployment: `kvCacheTransferTopology` ([`dgd`], which delegates to
//!   [`crate::topology`]).
//! - PlannerPolicy ([`planner_policy`]): the target DGD exists in the policy's namespace, is
//!   readable at either served version ([`crate::target`]) and its prefill and decode pools
//!   resolve; the built-in profile exists; `adjustmentInterval` fits the
//!   mode; the connector's settings are complete; the policy names only what the cluster admin
//!   allows its namespace ([`tenancy`]: Dynamo namespaces, Prometheus URLs, etcd endpoints);
//!   the GpuBudget it names admits it and holds its floor ([`gpu_budget`]).
//!
//! Every error names the field, the value and what is allowed.

pub mod dgd;
pub mod error;
pub mod gpu_budget;
pub mod planner_policy;
pub mod pools;
pub mod tenancy;

pub use error::{BudgetError, PolicyError, describe};
pub use planner_policy::{
    ResolvedPools, ValidatedPolicy, interval_bounds, resolve_pools, validate, validate_spec, validate_target,
    validate_unreadable,
};
pub use pools::{Pool, PoolTarget, TargetPools};
pub use tenancy::{PrometheusUrlPolicy, Tenancy};
