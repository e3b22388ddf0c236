//! Schema helpers for Kubernetes-specific OpenAPI extensions that schemars does not emit.

use schemars::{Schema, generate::SchemaGenerator, json_schema};

/// Schema of `[]metav1.Condition` as a list-map keyed by `type`, so that server-side apply
/// merges conditions per type instead of replacing the whole list.
pub fn conditions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Latest observations of the object's state, one per condition type.",
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "description": "One condition: a type, its status and why it has that status.",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "lastTransitionTime": {
                    "description": "When the condition last changed status.",
                    "type": "string",
                    "format": "date-time"
                },
                "message": {
                    "description": "Human-readable details about the transition.",
                    "type": "string",
                    "maxLength": 32768
                },
                "observedGeneration": {
                    "description": "metadata.generation the condition was set from.",
                    "type": "integer",
                    "format": "int64",
                    "minimum": 0
                },
                "reason": {
                    "description": "CamelCase reason for the condition's last transition.",
                    "type": "string",
                    "maxLength": 1024,
                    "minLength": 1,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
                },
                "status": {
                    "description": "True, False or Unknown.",
                    "type": "string",
                    "enum": ["True", "False", "Unknown"]
                },
                "type": {
                    "description": "Condition type in CamelCase.",
                    "type": "string",
                    "maxLength": 316,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
                }
            }
        }
    })
}

/// Turns a struct that captures unknown fields with `#[serde(flatten)]` into a structural schema
/// node: Kubernetes forbids `additionalProperties` beside `properties`, and keeps unknown fields
/// only when `x-kubernetes-preserve-unknown-fields` is set.
pub fn preserve_unknown_fields(schema: &mut Schema) {
    if let Some(object) = schema.as_object_mut() {
        object.remove("additionalProperties");
        object.insert("x-kubernetes-preserve-unknown-fields".into(), true.into());
    }
}

/// Drops `description` everywhere below a node. Used for the embedded pod template, whose
/// upstream descriptions would make the DGD CRD several hundred kilobytes for no benefit to
/// users (`kubectl explain pod.spec` documents those fields already).
pub fn strip_descriptions(schema: &mut Schema) {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                if map.get("description").is_some_and(serde_json::Value::is_string) {
                    map.remove("description");
                }
                for child in map.values_mut() {
                    strip(child);
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    if let Some(object) = schema.as_object_mut() {
        // Keep the node's own description, strip its children.
        for (key, child) in object.iter_mut() {
            if key != "description" {
                strip(child);
            }
        }
    }
}
