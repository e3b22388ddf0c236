//! The `virtual` connector: Dynamo's etcd decision protocol (the `VirtualConnector` of Dynamo's
//! planner), for deployments that an external orchestrator scales.
//!
//! Keys live under `v1/<dynamo namespace>/planner/`, values are decimal strings. The planner
//! writes `num_prefill_workers`, `num_decode_workers` and then `decision_id` (0 first, then +1);
//! the orchestrator writes `scaled_decision_id` once it has carried a decision out. A new
//! decision waits for the previous one to be acknowledged, for at most `decisionTimeout`
//! (upstream's 1800 s), after which it is published anyway.

use std::time::{Duration, Instant};

use super::etcd::{EtcdClient, EtcdError};

/// Key names under the prefix.
pub const NUM_PREFILL: &str = "num_prefill_workers";
/// Decode workers key.
pub const NUM_DECODE: &str = "num_decode_workers";
/// Decision id key (planner).
pub const DECISION_ID: &str = "decision_id";
/// Acknowledged decision id key (orchestrator).
pub const SCALED_DECISION_ID: &str = "scaled_decision_id";

/// Why the connector failed.
#[derive(Debug, thiserror::Error)]
pub enum VirtualError {
    /// etcd refused, was unreachable or answered something unreadable.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// etcd did not answer in time.
    #[error("etcd did not answer within {0:?}")]
    Timeout(Duration),
    /// A key holds something that is not a number.
    #[error("etcd key {key} holds {value:?}, not a number")]
    BadValue {
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// Another writer published a decision between this planner's read and its write.
    #[error("{key} changed while this decision was being written; the decision is retried next interval")]
    Conflict {
        /// The guarded key.
        key: String,
    },
}

/// The protocol's state as the planner tracks it (unset values are -1, as upstream reads them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecisionState {
    /// Prefill workers of the last published decision.
    pub prefill: i64,
    /// Decode workers of the last published decision.
    pub decode: i64,
    /// Id of the last published decision.
    pub decision_id: i64,
}

/// What a publish attempt should do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing changed since the last decision.
    Unchanged,
    /// The last decision is not acknowledged yet; wait.
    Wait,
    /// Publish a new decision with this id.
    Publish(i64),
}

/// The protocol's decision rule (pure): unchanged counts publish nothing; an unacknowledged
/// previous decision holds new ones back until `timeout` has passed since the first hold.
pub fn next_step(
    state: &DecisionState,
    prefill: u32,
    decode: u32,
    scaled_decision_id: i64,
    first_hold: Option<Instant>,
    timeout: Duration,
    now: Instant,
) -> Step {
    if state.prefill == i64::from(prefill) && state.decode == i64::from(decode) {
        return Step::Unchanged;
    }
    let acknowledged = state.decision_id < 0 || scaled_decision_id >= state.decision_id;
    let waited_long_enough = first_hold.is_some_and(|since| now.duration_since(since) >= timeout);
    if !acknowledged && !waited_long_enough {
        return Step::Wait;
    }
    Step::Publish(if state.decision_id < 0 {
        0
    } else {
        state.decision_id + 1
    })
}

/// The outcome of a publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Published {
    /// A decision was written with this id.
    Decision(i64),
    /// The previous decision is not acknowledged yet.
    Waiting {
        /// The unacknowledged decision.
        decision_id: i64,
    },
    /// Nothing to publish.
    Unchanged,
}

/// A connection to etcd and the protocol state of one policy.
pub struct VirtualConnector {
    client: EtcdClient,
    prefix: String,
    timeout: Duration,
    state: DecisionState,
    /// Revision of the `decision_id` key as last read or written (0: absent), so a decision is
    /// written only over the state it was decided from.
    decision_revision: i64,
    first_hold: Option<Instant>,
}

impl VirtualConnector {
    /// Connects to `endpoints` and loads the protocol state of `dynamo_namespace` from etcd; a
    /// decision left unacknowledged for `decision_timeout` is superseded. Each etcd request is
    /// bounded by `request_timeout`.
    pub async fn connect(
        endpoints: &[String],
        dynamo_namespace: &str,
        decision_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<Self, VirtualError> {
        let client = EtcdClient::new(endpoints, request_timeout)?;
        let mut connector = Self {
            client,
            prefix: format!("v1/{dynamo_namespace}/planner/"),
            timeout: decision_timeout,
            state: DecisionState {
                prefill: -1,
                decode: -1,
                decision_id: -1,
            },
            decision_revision: 0,
            first_hold: None,
        };
        connector.reload().await?;
        Ok(connector)
    }

    /// The key prefix (`v1/<namespace>/planner/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    async fn reload(&mut self) -> Result<(), VirtualError> {
        let (decision_id, revision) = self.read(DECISION_ID).await?;
        self.state = DecisionState {
            prefill: self.read(NUM_PREFILL).await?.0,
            decode: self.read(NUM_DECODE).await?.0,
            decision_id,
        };
        self.decision_revision = revision;
        Ok(())
    }

    /// A key's number (-1 when unset) and its revision (0 when unset).
    async fn read(&self, key: &str) -> Result<(i64, i64), VirtualError> {
        let full = format!("{}{key}", self.prefix);
        match self.client.get(&full).await? {
            None => Ok((-1, 0)),
            Some(kv) => {
                let value = String::from_utf8_lossy(&kv.value).trim().to_string();
                let number = value
                    .parse()
                    .map_err(|_| VirtualError::BadValue { key: full, value })?;
                Ok((number, kv.mod_revision))
            }
        }
    }

    /// Publishes a decision if the protocol allows it now. The three keys are written in one
    /// transaction, and only if `decision_id` is unchanged since it was read.
    pub async fn publish(&mut self, prefill: u32, decode: u32) -> Result<Published, VirtualError> {
        let (scaled, _) = self.read(SCALED_DECISION_ID).await?;
        let now = Instant::now();
        match next_step(
            &self.state,
            prefill,
            decode,
            scaled,
            self.first_hold,
            self.timeout,
            now,
        ) {
            Step::Unchanged => Ok(Published::Unchanged),
            Step::Wait => {
                self.first_hold.get_or_insert(now);
                Ok(Published::Waiting {
                    decision_id: self.state.decision_id,
                })
            }
            Step::Publish(id) => {
                let key = |name: &str| format!("{}{name}", self.prefix);
                let pairs = [
                    (key(NUM_PREFILL), prefill.to_string()),
                    (key(NUM_DECODE), decode.to_string()),
                    (key(DECISION_ID), id.to_string()),
                ];
                let guard = key(DECISION_ID);
                if !self
                    .client
                    .put_all_if_unchanged(&guard, self.decision_revision, &pairs)
                    .await?
                {
                    // Someone else wrote a decision: start over from what etcd holds now.
                    self.reload().await?;
                    return Err(VirtualError::Conflict { key: guard });
                }
                let (_, revision) = self.read(DECISION_ID).await?;
                self.decision_revision = revision;
                self.state = DecisionState {
                    prefill: i64::from(prefill),
                    decode: i64::from(decode),
                    decision_id: id,
                };
                self.first_hold = None;
                Ok(Published::Decision(id))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(1800);

    #[test]
    fn first_decision_gets_id_zero_then_increments_after_acknowledgement() {
        let now = Instant::now();
        let fresh = DecisionState {
            prefill: -1,
            decode: -1,
            decision_id: -1,
        };
        assert_eq!(next_step(&fresh, 1, 1, -1, None, TIMEOUT, now), Step::Publish(0));
        let published = DecisionState {
            prefill: 1,
            decode: 1,
            decision_id: 0,
        };
        assert_eq!(
            next_step(&published, 1, 1, -1, None, TIMEOUT, now),
            Step::Unchanged
        );
        assert_eq!(next_step(&published, 2, 1, -1, None, TIMEOUT, now), Step::Wait);
        assert_eq!(
            next_step(&published, 2, 1, 0, None, TIMEOUT, now),
            Step::Publish(1)
        );
    }

    #[test]
    fn an_unacknowledged_decision_is_superseded_after_the_timeout() {
        let start = Instant::now();
        let state = DecisionState {
            prefill: 1,
            decode: 1,
            decision_id: 4,
        };
        assert_eq!(
            next_step(
                &state,
                3,
                2,
                3,
                Some(start),
                TIMEOUT,
                start + Duration::from_secs(60)
            ),
            Step::Wait
        );
        assert_eq!(
            next_step(&state, 3, 2, 3, Some(start), TIMEOUT, start + TIMEOUT),
            Step::Publish(5)
        );
        // Scaling to zero is a decision like any other.
        let acknowledged = DecisionState {
            prefill: 1,
            decode: 1,
            decision_id: 5,
        };
        assert_eq!(
            next_step(&acknowledged, 0, 0, 5, None, TIMEOUT, start),
            Step::Publish(6)
        );
    }
}
