//! `metav1.Condition` bookkeeping shared by the reconcilers: transition times move only when a
//! condition's status changes, conditions other writers own are kept, and messages are cut to
//! [`MAX_MESSAGE_BYTES`] so that a long error (a Prometheus reply, a chain of causes) never
//! makes the status write itself fail.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};

use crate::controller::common::truncate;

/// Longest condition message written, in bytes (the API server accepts 32768; a status is read
/// by people, and every condition of every object is kept in etcd and in watch caches).
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// A condition as a reconciler computes it, before timestamps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredCondition {
    /// Condition type, e.g. `Ready`.
    pub type_: &'static str,
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    /// CamelCase reason.
    pub reason: String,
    /// One sentence a user can act on.
    pub message: String,
}

impl DesiredCondition {
    /// A condition with status `True`.
    pub fn met(type_: &'static str, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: "True",
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// A condition with status `False`.
    pub fn unmet(type_: &'static str, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: "False",
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// A condition with status `Unknown`.
    pub fn unknown(type_: &'static str, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: "Unknown",
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// Merges `desired` into `existing`: each desired condition replaces the one of its type,
/// keeping its `lastTransitionTime` when the status did not change; other types are kept.
/// Messages longer than [`MAX_MESSAGE_BYTES`] are cut, with an ellipsis.
pub fn merge(
    existing: &[Condition],
    desired: &[DesiredCondition],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut merged: Vec<Condition> = existing
        .iter()
        .filter(|c| !desired.iter().any(|d| d.type_ == c.type_))
        .cloned()
        .collect();
    for want in desired {
        let previous = existing.iter().find(|c| c.type_ == want.type_);
        let last_transition_time = match previous {
            Some(previous) if previous.status == want.status => previous.last_transition_time.clone(),
            _ => Time(now),
        };
        merged.push(Condition {
            type_: want.type_.to_string(),
            status: want.status.to_string(),
            reason: want.reason.clone(),
            message: truncate(&want.message, MAX_MESSAGE_BYTES),
            observed_generation: generation,
            last_transition_time,
        });
    }
    merged.sort_by(|a, b| a.type_.cmp(&b.type_));
    merged
}

/// Whether two condition lists say the same thing, ignoring order and, since only a status
/// change moves it, transition times.
pub fn same(a: &[Condition], b: &[Condition]) -> bool {
    let key = |c: &Condition| {
        (
            c.type_.clone(),
            c.status.clone(),
            c.reason.clone(),
            c.message.clone(),
            c.observed_generation,
        )
    };
    let mut a: Vec<_> = a.iter().map(key).collect();
    let mut b: Vec<_> = b.iter().map(key).collect();
    a.sort();
    b.sort();
    a == b
}

/// The condition of a type, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let first = merge(
            &[],
            &[DesiredCondition::unmet("Ready", "Pending", "waiting")],
            Some(1),
            at(100),
        );
        assert_eq!(first[0].last_transition_time, Time(at(100)));
        let same_status = merge(
            &first,
            &[DesiredCondition::unmet("Ready", "Pending", "still waiting")],
            Some(2),
            at(200),
        );
        assert_eq!(same_status[0].last_transition_time, Time(at(100)));
        assert_eq!(same_status[0].message, "still waiting");
        let flipped = merge(
            &same_status,
            &[DesiredCondition::met("Ready", "AllAvailable", "ok")],
            Some(2),
            at(300),
        );
        assert_eq!(flipped[0].last_transition_time, Time(at(300)));
    }

    #[test]
    fn foreign_conditions_are_kept_and_sameness_ignores_time() {
        let foreign = merge(&[], &[DesiredCondition::met("Other", "X", "y")], None, at(1));
        let merged = merge(
            &foreign,
            &[DesiredCondition::met("Ready", "Ok", "ok")],
            None,
            at(2),
        );
        assert_eq!(merged.len(), 2);
        assert!(find(&merged, "Other").is_some());
        let later = merge(
            &merged,
            &[DesiredCondition::met("Ready", "Ok", "ok")],
            None,
            at(50),
        );
        assert!(same(&merged, &later));
        let changed = merge(
            &merged,
            &[DesiredCondition::unmet("Ready", "No", "no")],
            None,
            at(50),
        );
        assert!(!same(&merged, &changed));
    }

    #[test]
    fn long_messages_are_cut_to_what_the_api_server_takes() {
        // A multi-byte character across the cut: the message stays valid UTF-8.
        let long = format!("cannot reach Prometheus: {}", "réponse ".repeat(10_000));
        let merged = merge(
            &[],
            &[DesiredCondition::unmet(
                "MetricsAvailable",
                "PrometheusError",
                &long,
            )],
            Some(1),
            at(1),
        );
        let message = &merged[0].message;
        assert!(message.len() <= MAX_MESSAGE_BYTES, "{} bytes", message.len());
        assert!(message.starts_with("cannot reach Prometheus: réponse"));
        assert!(message.ends_with('…'));
        // A cut message compares equal to itself next time: no status rewrite every reconcile.
        let again = merge(
            &merged,
            &[DesiredCondition::unmet(
                "MetricsAvailable",
                "PrometheusError",
                &long,
            )],
            Some(1),
            at(2),
        );
        assert!(same(&merged, &again));
        let short = merge(&[], &[DesiredCondition::met("Ready", "Ok", "ok")], None, at(1));
        assert_eq!(short[0].message, "ok");
    }
}
