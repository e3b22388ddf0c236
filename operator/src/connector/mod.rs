//! Connectors carry the planner's decisions out: `kubernetes` scales the DGD, `virtual`
//! publishes the decision in etcd for an external actor.

pub mod etcd;
pub mod kubernetes;
pub mod virtual_etcd;
