//! The `kubernetes` connector: sets `spec.components[].replicas` of the target DGD.
//!
//! A JSON Patch, not a server-side apply: each replace is guarded by a `test` of the
//! component's name at that index, so a concurrent reordering of the list makes the patch fail
//! instead of scaling the wrong component, and it works whether or not the installed DGD CRD
//! (ours, or upstream Dynamo's) declares `components` as a list-map or other required fields,
//! which a partial apply of `spec.components` would have to satisfy. The planner's writes are
//! recorded under their own field manager.

use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

use planner_api::DynamoGraphDeployment;

/// Field manager of the planner's replica writes.
pub const PLANNER_FIELD_MANAGER: &str = "planner-operator-planner";

/// Why replicas could not be set.
#[derive(Debug, thiserror::Error)]
pub enum ScaleError {
    /// The DGD no longer has a component the policy scales.
    #[error("the DynamoGraphDeployment has no component named {0:?}")]
    NoSuchComponent(String),
    /// The patch was refused.
    #[error("cannot patch the DynamoGraphDeployment's replicas: {0}")]
    Patch(#[source] kube::Error),
}

/// The JSON Patch setting each named component's replicas (components already at their target
/// are left out). `None` when nothing changes.
pub fn replicas_patch(
    dgd: &DynamoGraphDeployment,
    targets: &[(&str, u32)],
) -> Result<Option<Value>, ScaleError> {
    let mut operations = Vec::new();
    for (name, replicas) in targets {
        let index = dgd
            .spec
            .components
            .iter()
            .position(|c| c.name == *name)
            .ok_or_else(|| ScaleError::NoSuchComponent((*name).to_string()))?;
        let current = dgd.spec.components[index].replicas;
        if current == Some(i32::try_from(*replicas).unwrap_or(i32::MAX)) {
            continue;
        }
        operations
            .push(json!({"op": "test", "path": format!("/spec/components/{index}/name"), "value": name}));
        let op = if current.is_some() { "replace" } else { "add" };
        operations
            .push(json!({"op": op, "path": format!("/spec/components/{index}/replicas"), "value": replicas}));
    }
    Ok((!operations.is_empty()).then_some(Value::Array(operations)))
}

/// Applies the patch for `targets`; returns whether anything changed.
pub async fn set_replicas(
    api: &Api<DynamoGraphDeployment>,
    dgd: &DynamoGraphDeployment,
    targets: &[(&str, u32)],
) -> Result<bool, ScaleError> {
    let Some(patch) = replicas_patch(dgd, targets)? else {
        return Ok(false);
    };
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(|e| ScaleError::Patch(kube::Error::SerdeError(e)))?;
    let name = dgd.metadata.name.as_deref().unwrap_or_default();
    api.patch(
        name,
        &PatchParams {
            field_manager: Some(PLANNER_FIELD_MANAGER.into()),
            ..PatchParams::default()
        },
        &Patch::Json::<()>(patch),
    )
    .await
    .map_err(ScaleError::Patch)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dgd() -> DynamoGraphDeployment {
        serde_yaml::from_str(include_str!("../../../config/samples/dgd-disagg.yaml")).unwrap()
    }

    #[test]
    fn patch_tests_the_name_then_replaces_replicas() {
        let patch = replicas_patch(&dgd(), &[("prefill", 3), ("decode", 1)])
            .unwrap()
            .unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/spec/components/1/name", "value": "prefill"},
                {"op": "replace", "path": "/spec/components/1/replicas", "value": 3}
            ])
        );
    }

    #[test]
    fn no_change_no_patch_and_missing_replicas_are_added() {
        assert_eq!(
            replicas_patch(&dgd(), &[("prefill", 1), ("decode", 1)]).unwrap(),
            None
        );
        let mut dgd = dgd();
        dgd.spec.components[2].replicas = None;
        let patch = replicas_patch(&dgd, &[("decode", 2)]).unwrap().unwrap();
        assert_eq!(patch[1]["op"], "add");
        assert!(matches!(
            replicas_patch(&dgd, &[("workers", 2)]),
            Err(ScaleError::NoSuchComponent(_))
        ));
    }
}
