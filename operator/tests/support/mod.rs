//! Validates objects against the generated CRD schemas the way the API server does, without one:
//! the structural OpenAPI rules (through a JSON-schema validator), unknown fields as under
//! `fieldValidation=Strict`, list-map key uniqueness, and the CEL rules (through kube-cel, after
//! applying schema defaults as admission does). Errors are phrased like the API server's, so the
//! same fixture expectations hold against a real cluster.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers

use std::{
    fmt,
    path::{Path, PathBuf},
};

use jsonschema::error::{TypeKind, ValidationErrorKind};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use planner_api::crds;
use serde_json::{Map, Value};

/// One rejected field, as the API server reports it: `<field>: <message>`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Repository root (the parent of the `operator` crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("operator/ has a parent")
        .to_path_buf()
}

/// Every YAML file of a folder, sorted by name.
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
}

/// Parses a YAML file into JSON.
pub fn load_yaml(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", path.display()))
}

/// The CRD of this project that serves an object's `apiVersion` and `kind`, if any.
pub fn our_crd_for(object: &Value) -> Option<CustomResourceDefinition> {
    let api_version = object["apiVersion"].as_str().expect("object has apiVersion");
    let kind = object["kind"].as_str().expect("object has kind");
    let (group, version) = api_version.split_once('/').expect("apiVersion is group/version");
    crds().into_iter().find(|crd| {
        crd.spec.group == group
            && crd.spec.names.kind == kind
            && crd.spec.versions.iter().any(|v| v.name == version)
    })
}

/// Whether an object is of a kind this project's CRDs serve. Samples of Grove's kinds (a
/// ClusterTopologyBinding) are Grove's to validate: the end-to-end tests apply them to Grove's own
/// CRD.
pub fn served_here(object: &Value) -> bool {
    our_crd_for(object).is_some()
}

/// The CRD that serves an object's `apiVersion` and `kind`.
pub fn crd_for(object: &Value) -> CustomResourceDefinition {
    our_crd_for(object).unwrap_or_else(|| {
        panic!(
            "no CRD of this project serves {} {}",
            object["apiVersion"], object["kind"]
        )
    })
}

/// The `openAPIV3Schema` of a CRD's first version, as JSON.
pub fn open_api_schema(crd: &CustomResourceDefinition) -> Value {
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("CRD has an openAPIV3Schema");
    serde_json::to_value(schema).expect("schema serializes")
}

/// Validates an object against the CRD that serves it; an empty list means the API server would
/// accept it.
pub fn validate(object: &Value) -> Vec<FieldError> {
    let schema = open_api_schema(&crd_for(object));
    let mut errors = structural_errors(&schema, object);
    errors.extend(list_map_errors(&schema, object, ""));
    // The API server evaluates CEL rules on the defaulted object; kube-cel applies the defaults.
    if let Err(cel) = kube::core::cel::Validator::new().validate(&schema, object, None) {
        // The API server prefixes a rule's message with `Invalid value:` and, when the rule sits
        // on a scalar, that value (`Invalid value: "5s": ...`); objects and lists are not
        // printed. A rule's `fieldPath` moves the reported field, not the printed value.
        errors.extend(cel.into_iter().map(|e| {
            let rule_path = rule_field_path(&schema, &e.rule)
                .and_then(|suffix| e.field_path.strip_suffix(suffix.as_str()).map(str::to_string))
                .unwrap_or_else(|| e.field_path.clone());
            let message = match value_at(object, &rule_path) {
                Some(Value::Object(_) | Value::Array(_)) | None => format!("Invalid value: {}", e.message),
                Some(value) => format!("Invalid value: {}: {}", render(value), e.message),
            };
            FieldError {
                field: e.field_path,
                message,
            }
        }));
    }
    errors
}

/// OpenAPI (structural) rules, checked with a JSON-schema validator over the schema converted to
/// the JSON-schema meaning of the Kubernetes extensions.
fn structural_errors(schema: &Value, object: &Value) -> Vec<FieldError> {
    let json_schema = to_json_schema(schema);
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft4)
        .build(&json_schema)
        .expect("the generated schema is a valid JSON schema");
    validator
        .iter_errors(object)
        .map(|error| {
            let path = field_path(object, error.instance_path().as_str());
            let value = error.instance().clone().into_owned();
            k8s_error(&path, &value, error.kind())
        })
        .collect()
}

/// Rewrites Kubernetes OpenAPI extensions into plain JSON schema: `nullable` admits null,
/// int-or-string admits both, and objects that do not preserve unknown fields reject them.
fn to_json_schema(schema: &Value) -> Value {
    let mut root = rewrite(schema);
    // apiVersion, kind and metadata are implicit in a CRD's root schema.
    if let Value::Object(map) = &mut root {
        map.remove("additionalProperties");
    }
    root
}

fn rewrite(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out: Map<String, Value> = map
                .iter()
                .map(|(key, value)| (key.clone(), rewrite_child(key, value)))
                .collect();
            if map.get("nullable") == Some(&Value::Bool(true)) {
                if let Some(Value::String(kind)) = out.get("type").cloned() {
                    out.insert("type".into(), serde_json::json!([kind, "null"]));
                }
                if let Some(Value::Array(options)) = out.get_mut("enum") {
                    options.push(Value::Null);
                }
            }
            if map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
                out.insert("type".into(), serde_json::json!(["integer", "string"]));
            }
            let preserves = map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
            if map.contains_key("properties") && !preserves && !map.contains_key("additionalProperties") {
                out.insert("additionalProperties".into(), Value::Bool(false));
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

fn rewrite_child(key: &str, value: &Value) -> Value {
    match (key, value) {
        // Maps from names to schemas.
        ("properties", Value::Object(props)) => {
            Value::Object(props.iter().map(|(name, s)| (name.clone(), rewrite(s))).collect())
        }
        ("items" | "additionalProperties" | "not", _) => rewrite(value),
        ("allOf" | "anyOf" | "oneOf", Value::Array(list)) => Value::Array(list.iter().map(rewrite).collect()),
        _ => value.clone(),
    }
}

/// Turns a JSON pointer into the API server's field path (`spec.components[0].name`).
fn field_path(object: &Value, pointer: &str) -> String {
    let mut path = String::new();
    let mut node = object;
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        match node {
            Value::Array(items) => {
                let index: usize = segment.parse().expect("array index");
                path.push_str(&format!("[{index}]"));
                node = &items[index];
            }
            _ => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&segment);
                node = &node[segment.as_str()];
            }
        }
    }
    path
}

/// The `fieldPath` of the CEL rule with this text, if it has one.
fn rule_field_path(schema: &Value, rule: &str) -> Option<String> {
    let here = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .and_then(|rules| rules.iter().find(|r| r["rule"] == rule))
        .map(|r| r["fieldPath"].as_str().map(str::to_string));
    if let Some(field_path) = here {
        return field_path;
    }
    let mut children: Vec<&Value> = Vec::new();
    if let Some(Value::Object(properties)) = schema.get("properties") {
        children.extend(properties.values());
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child @ Value::Object(_)) = schema.get(key) {
            children.push(child);
        }
    }
    children
        .into_iter()
        .find_map(|child| rule_field_path(child, rule))
}

/// The value at an API server field path (`spec.components[1].name`), if the object has it.
fn value_at<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    let mut node = object;
    for part in path.split('.') {
        let mut pieces = part.split('[');
        let name = pieces.next().unwrap_or_default();
        if !name.is_empty() {
            node = node.get(name)?;
        }
        for index in pieces {
            node = node.get(index.trim_end_matches(']').parse::<usize>().ok()?)?;
        }
    }
    Some(node)
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

fn render(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

/// A bound as the API server prints it next to `value`: `1`, not `1.0`; and against a whole
/// number the bound too is printed whole, truncated (kube-apiserver 1.36 rejects 100 against a
/// maximum of 99.9 with "should be less than or equal to 99", and 99.95 with "... 99.9").
fn number(limit: &Value, value: &Value) -> String {
    let whole_value = value.as_i64().is_some() || value.as_u64().is_some();
    match limit.as_f64() {
        Some(f) if whole_value && f.abs() < 1e15 => format!("{}", f.trunc() as i64),
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => limit.to_string(),
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Phrases a JSON-schema violation as the API server does.
fn k8s_error(path: &str, value: &Value, kind: &ValidationErrorKind) -> FieldError {
    let invalid = |detail: String| FieldError {
        field: path.to_string(),
        message: format!("Invalid value: {}: {detail}", render(value)),
    };
    match kind {
        ValidationErrorKind::Enum { options } => {
            let supported: Vec<String> = options
                .as_array()
                .map(|o| o.iter().filter(|v| !v.is_null()).map(render).collect())
                .unwrap_or_default();
            FieldError {
                field: path.to_string(),
                message: format!(
                    "Unsupported value: {}: supported values: {}",
                    render(value),
                    supported.join(", ")
                ),
            }
        }
        ValidationErrorKind::Minimum { limit } => invalid(format!(
            "{path} in body should be greater than or equal to {}",
            number(limit, value)
        )),
        ValidationErrorKind::ExclusiveMinimum { limit } => invalid(format!(
            "{path} in body should be greater than {}",
            number(limit, value)
        )),
        ValidationErrorKind::Maximum { limit } => invalid(format!(
            "{path} in body should be less than or equal to {}",
            number(limit, value)
        )),
        ValidationErrorKind::ExclusiveMaximum { limit } => invalid(format!(
            "{path} in body should be less than {}",
            number(limit, value)
        )),
        ValidationErrorKind::Pattern { pattern } => {
            invalid(format!("{path} in body should match '{pattern}'"))
        }
        ValidationErrorKind::MinLength { limit } => {
            invalid(format!("{path} in body should be at least {limit} chars long"))
        }
        ValidationErrorKind::MaxLength { limit } => FieldError {
            field: path.to_string(),
            message: format!("Too long: may not be more than {limit} bytes"),
        },
        // The API server prints the list's length, not the list.
        ValidationErrorKind::MinItems { limit } => FieldError {
            field: path.to_string(),
            message: format!(
                "Invalid value: {}: {path} in body should have at least {limit} items",
                value.as_array().map_or(0, Vec::len)
            ),
        },
        ValidationErrorKind::MaxItems { limit } => FieldError {
            field: path.to_string(),
            message: format!(
                "Too many: {}: must have at most {limit} items",
                value.as_array().map_or(0, Vec::len)
            ),
        },
        ValidationErrorKind::Required { property } => FieldError {
            field: join(path, property.as_str().unwrap_or_default()),
            message: "Required value".into(),
        },
        ValidationErrorKind::AdditionalProperties { unexpected } => FieldError {
            field: path.to_string(),
            message: unexpected
                .iter()
                .map(|name| format!("unknown field \"{}\"", join(path, name)))
                .collect::<Vec<_>>()
                .join(", "),
        },
        ValidationErrorKind::Type { kind } => {
            let expected = match kind {
                TypeKind::Single(t) => t.to_string(),
                TypeKind::Multiple(ts) => ts
                    .iter()
                    .map(|t| t.to_string())
                    .filter(|t| t != "null")
                    .collect::<Vec<_>>()
                    .join(" or "),
            };
            invalid(format!(
                "{path} in body must be of type {expected}: \"{}\"",
                type_name(value)
            ))
        }
        other => invalid(format!("{other:?}")),
    }
}

/// `x-kubernetes-list-type: map` lists may not hold two items with the same keys.
fn list_map_errors(schema: &Value, object: &Value, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    match object {
        Value::Object(fields) => {
            for (name, value) in fields {
                let child = schema
                    .get("properties")
                    .and_then(|p| p.get(name))
                    .or_else(|| schema.get("additionalProperties").filter(|s| s.is_object()));
                if let Some(child) = child {
                    errors.extend(list_map_errors(child, value, &join(path, name)));
                }
            }
        }
        Value::Array(items) => {
            let item_schema = schema.get("items").cloned().unwrap_or(Value::Null);
            if schema.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map") {
                let keys: Vec<&str> = schema["x-kubernetes-list-map-keys"]
                    .as_array()
                    .map(|k| k.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let mut seen = Vec::new();
                for (index, item) in items.iter().enumerate() {
                    let key: Map<String, Value> =
                        keys.iter().map(|k| (k.to_string(), item[*k].clone())).collect();
                    if seen.contains(&key) {
                        errors.push(FieldError {
                            field: format!("{path}[{index}]"),
                            message: format!("Duplicate value: {}", Value::Object(key)),
                        });
                    } else {
                        seen.push(key);
                    }
                }
            }
            for (index, item) in items.iter().enumerate() {
                errors.extend(list_map_errors(&item_schema, item, &format!("{path}[{index}]")));
            }
        }
        _ => {}
    }
    errors
}

/// What a fixture of `tests/fixtures/invalid/` says it must be rejected for.
#[derive(Debug)]
pub struct Expectation {
    pub field: String,
    pub reason: String,
}

/// Reads the `# field:` and `# reason:` header lines of a bad fixture.
pub fn expectation(path: &Path) -> Expectation {
    let text = std::fs::read_to_string(path).expect("fixture readable");
    let header = |name: &str| {
        text.lines()
            .find_map(|line| {
                line.strip_prefix(&format!("# {name}:"))
                    .map(|v| v.trim().to_string())
            })
            .unwrap_or_else(|| panic!("{} has no `# {name}:` line", path.display()))
    };
    Expectation {
        field: header("field"),
        reason: header("reason"),
    }
}
