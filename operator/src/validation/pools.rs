//! The pools a PlannerPolicy scales, as its target graph resolves them.

use std::fmt;

use planner_api::ComponentType;

/// One of the two pools a policy scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// The prefill workers.
    Prefill,
    /// The decode workers.
    Decode,
}

impl Pool {
    /// `prefill` or `decode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }

    pub(super) fn component_type(self) -> ComponentType {
        match self {
            Self::Prefill => ComponentType::Prefill,
            Self::Decode => ComponentType::Decode,
        }
    }
}

impl fmt::Display for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One pool as the planner sizes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolTarget {
    /// The component's name in the DGD.
    pub component: String,
    /// GPUs one replica uses.
    pub gpus: u32,
    /// Replicas the DGD asks for now.
    pub replicas: u32,
}

/// What a policy's target resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetPools {
    /// The prefill pool.
    pub prefill: PoolTarget,
    /// The decode pool.
    pub decode: PoolTarget,
    /// The model the frontend metrics are filtered by (`None` in load mode, which reads no
    /// per-model metrics).
    pub model_name: Option<String>,
    /// One aggregated worker component is both pools (`prefill` and `decode` are the same).
    pub aggregated: bool,
    /// Prompt tokens one step of an aggregated worker carries, from its main container's
    /// `--max-num-batched-tokens` (`None`: not set there, the engines' default).
    pub chunk_tokens: Option<u32>,
}
