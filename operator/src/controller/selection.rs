//! Which DynamoGraphDeployments the DGD reconciler renders. NVIDIA's Dynamo operator serves the
//! same `nvidia.com` kind and renders the DGDs it sees; two renderers of one DGD would fight over
//! its children and its status. So this operator never takes over a DGD another controller
//! renders. It leaves a DGD alone (no children, no status, no Events) when
//!
//! - it is labelled [`CONTROLLER_LABEL`] with any value but [`THIS_CONTROLLER`] (e.g.
//!   `planner.dynamo.io/dgd-controller: nvidia`): marked as another controller's;
//! - its `status.state` is set: NVIDIA's operator writes that field (its DGD status requires it)
//!   and this operator never does, so the DGD has been rendered by NVIDIA's operator;
//! - with `--dgd-selection=marked`, it is not labelled [`CONTROLLER_LABEL`]`=`[`THIS_CONTROLLER`]:
//!   the mode for clusters where NVIDIA's operator runs too, since it renders unlabelled DGDs
//!   from the moment they are created, before any status says so.
//!
//! Independently, the reconciler never applies over a Deployment or Service of a rendered name
//! that this DGD does not own (see [`super::dgd`]). With `--dgd-controller=false` the DGD
//! reconciler does not run at all.

use std::collections::BTreeMap;

use kube::core::ObjectMeta;

use planner_api::DynamoGraphDeployment;

/// Label that says which controller renders a DGD.
pub const CONTROLLER_LABEL: &str = "planner.dynamo.io/dgd-controller";
/// Value of [`CONTROLLER_LABEL`] that selects this operator.
pub const THIS_CONTROLLER: &str = "planner-operator";

/// Why this operator does not render a DGD.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotSelected {
    /// Labelled as another controller's.
    #[error("labelled {CONTROLLER_LABEL}={controller}: another controller renders it")]
    OtherController {
        /// The label's value.
        controller: String,
    },
    /// Not labelled as this operator's, in marked mode.
    #[error("not labelled {CONTROLLER_LABEL}={THIS_CONTROLLER}, which --dgd-selection=marked requires")]
    NotMarked,
    /// Unlabelled, with a `status.state` that NVIDIA's operator wrote.
    #[error(
        "its status.state is {state:?}: NVIDIA's Dynamo operator renders it (label it {CONTROLLER_LABEL}={THIS_CONTROLLER} to render it here)"
    )]
    RenderedByNvidia {
        /// The state.
        state: String,
    },
}

/// Which DGDs the DGD reconciler renders (`--dgd-selection`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DgdSelection {
    /// Every DGD not marked as another controller's (clusters without NVIDIA's operator).
    #[default]
    Unmarked,
    /// Only DGDs labelled `planner.dynamo.io/dgd-controller=planner-operator` (clusters where
    /// NVIDIA's operator runs too).
    Marked,
}

impl DgdSelection {
    /// `unmarked` or `marked`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unmarked => "unmarked",
            Self::Marked => "marked",
        }
    }

    /// The label selector of the DGD watch: in marked mode only the selected DGDs are watched
    /// (others are never even read); in unmarked mode all, filtered by [`Self::select`].
    pub fn label_selector(self) -> Option<String> {
        match self {
            Self::Unmarked => None,
            Self::Marked => Some(format!("{CONTROLLER_LABEL}={THIS_CONTROLLER}")),
        }
    }

    /// `Ok` when this operator renders the DGD with `metadata` (and `status.state`, when it has
    /// one); else why not.
    pub fn select_meta(self, metadata: &ObjectMeta, status_state: Option<&str>) -> Result<(), NotSelected> {
        static EMPTY: BTreeMap<String, String> = BTreeMap::new();
        let labels = metadata.labels.as_ref().unwrap_or(&EMPTY);
        match labels.get(CONTROLLER_LABEL).map(String::as_str) {
            Some(THIS_CONTROLLER) => {}
            Some(other) => {
                return Err(NotSelected::OtherController {
                    controller: other.to_string(),
                });
            }
            None if self == Self::Marked => return Err(NotSelected::NotMarked),
            None => {}
        }
        match status_state {
            Some(state) if !state.is_empty() && labels.get(CONTROLLER_LABEL).is_none() => {
                Err(NotSelected::RenderedByNvidia {
                    state: state.to_string(),
                })
            }
            _ => Ok(()),
        }
    }

    /// [`Self::select_meta`] for a parsed DGD.
    pub fn select(self, dgd: &DynamoGraphDeployment) -> Result<(), NotSelected> {
        let state = dgd
            .status
            .as_ref()
            .and_then(|s| s.other.get("state"))
            .and_then(|v| v.as_str());
        self.select_meta(&dgd.metadata, state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dgd(labels: serde_json::Value, status: serde_json::Value) -> DynamoGraphDeployment {
        serde_json::from_value(json!({
            "apiVersion": "nvidia.com/v1beta1",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": "g", "labels": labels},
            "spec": {"components": [{"name": "frontend", "type": "frontend"}]},
            "status": status
        }))
        .unwrap()
    }

    #[test]
    fn unmarked_mode_renders_all_but_others_dgds() {
        let mode = DgdSelection::Unmarked;
        assert_eq!(mode.select(&dgd(json!({}), json!({}))), Ok(()));
        assert_eq!(
            mode.select(&dgd(
                json!({"planner.dynamo.io/dgd-controller": "planner-operator"}),
                json!({})
            )),
            Ok(())
        );
        let other = mode
            .select(&dgd(
                json!({"planner.dynamo.io/dgd-controller": "nvidia"}),
                json!({}),
            ))
            .unwrap_err();
        assert_eq!(
            other.to_string(),
            "labelled planner.dynamo.io/dgd-controller=nvidia: another controller renders it"
        );
        let rendered = mode
            .select(&dgd(json!({}), json!({"state": "successful"})))
            .unwrap_err()
            .to_string();
        assert!(
            rendered.contains("NVIDIA's Dynamo operator renders it"),
            "{rendered}"
        );
        // Labelled ours, a status.state does not take it away.
        assert_eq!(
            mode.select(&dgd(
                json!({"planner.dynamo.io/dgd-controller": "planner-operator"}),
                json!({"state": "x"})
            )),
            Ok(())
        );
        assert_eq!(mode.label_selector(), None);
    }

    #[test]
    fn marked_mode_renders_only_labelled_dgds() {
        let mode = DgdSelection::Marked;
        assert!(mode.select(&dgd(json!({}), json!({}))).is_err());
        assert_eq!(
            mode.select(&dgd(
                json!({"planner.dynamo.io/dgd-controller": "planner-operator"}),
                json!({})
            )),
            Ok(())
        );
        assert_eq!(
            mode.label_selector().as_deref(),
            Some("planner.dynamo.io/dgd-controller=planner-operator")
        );
    }
}
