//! Rendered manifests held to the Kubernetes API's schemas, as the apiserver would hold them
//! at `kubectl apply` with strict field validation: unknown fields, wrong types, missing
//! required fields and values outside an enum are errors, each with its path.
//!
//! - core/v1 (Namespace, ServiceAccount, Service, ConfigMap, Secret) and apps/v1
//!   (Deployment): the apiserver's own OpenAPI v3 schemas (tests/data/openapi/, cut down
//!   from a v1.36 apiserver's documents), walked here: `$ref`, `allOf`, `oneOf`, `type`,
//!   `properties`, `additionalProperties`, `items`, `required`, `enum`.
//! - rbac.authorization.k8s.io/v1, policy/v1, admissionregistration.k8s.io/v1 and
//!   apiextensions.k8s.io/v1, whose documents are not at hand: k8s-openapi's types (generated
//!   from the same OpenAPI specification, v1.36): the object is read into its type and
//!   written back, and must come back unchanged (a field the type does not know is dropped,
//!   a wrong type or a missing required field does not read).
//! - Any other kind (cert-manager's, the Prometheus Operator's): not checked, and said so.
#![allow(dead_code)]

use serde_json::{Map, Value};

/// What [`check`] did with a document.
#[derive(Debug, PartialEq, Eq)]
pub enum Checked {
    OpenApi,
    Typed,
    /// No schema at hand for this apiVersion and kind.
    Unchecked(String),
}

pub struct Schemas {
    schemas: Map<String, Value>,
}

impl Schemas {
    pub fn load() -> Schemas {
        let mut schemas = Map::new();
        for f in ["core-v1.json", "apps-v1.json"] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/openapi")
                .join(f);
            let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            for (k, v) in doc["components"]["schemas"].as_object().unwrap() {
                schemas.insert(k.clone(), v.clone());
            }
        }
        Schemas { schemas }
    }

    /// Checks one object; the errors name each path.
    pub fn check(&self, doc: &Value) -> Result<Checked, Vec<String>> {
        let api_version = doc["apiVersion"].as_str().unwrap_or("");
        let kind = doc["kind"].as_str().unwrap_or("");
        let root = match api_version {
            "v1" => Some(format!("io.k8s.api.core.v1.{kind}")),
            "apps/v1" => Some(format!("io.k8s.api.apps.v1.{kind}")),
            _ => None,
        };
        if let Some(root) = root.filter(|r| self.schemas.contains_key(r)) {
            let mut errors = vec![];
            let schema = self.schemas[&root].clone();
            self.walk(&schema, doc, "", &mut errors);
            return if errors.is_empty() {
                Ok(Checked::OpenApi)
            } else {
                Err(errors)
            };
        }
        use k8s_openapi::api::admissionregistration::v1 as ar;
        use k8s_openapi::api::{policy::v1 as policy, rbac::v1 as rbac};
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
        let typed = match (api_version, kind) {
            ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<rbac::Role>(doc),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<rbac::ClusterRole>(doc),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<rbac::RoleBinding>(doc),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                round_trip::<rbac::ClusterRoleBinding>(doc)
            }
            ("policy/v1", "PodDisruptionBudget") => round_trip::<policy::PodDisruptionBudget>(doc),
            ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
                round_trip::<ar::MutatingWebhookConfiguration>(doc)
            }
            ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
                round_trip::<ar::ValidatingWebhookConfiguration>(doc)
            }
            ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
                round_trip::<ar::ValidatingAdmissionPolicy>(doc)
            }
            ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
                round_trip::<ar::ValidatingAdmissionPolicyBinding>(doc)
            }
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
                round_trip::<apiext::CustomResourceDefinition>(doc)
            }
            _ => return Ok(Checked::Unchecked(format!("{api_version} {kind}"))),
        };
        typed.map(|()| Checked::Typed)
    }

    fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => {
                let name = r.rsplit('/').next().unwrap();
                self.schemas
                    .get(name)
                    .unwrap_or_else(|| panic!("schema {name} is not in tests/data/openapi"))
            }
            None => schema,
        }
    }

    fn walk(&self, schema: &Value, v: &Value, path: &str, errors: &mut Vec<String>) {
        let schema = self.resolve(schema);
        for s in schema["allOf"].as_array().into_iter().flatten() {
            self.walk(s, v, path, errors);
        }
        if let Some(any) = schema["oneOf"].as_array() {
            let fits = any.iter().any(|s| {
                let mut e = vec![];
                self.walk(s, v, path, &mut e);
                e.is_empty()
            });
            if !fits {
                errors.push(format!(
                    "{path}: {v} fits none of {}",
                    Value::Array(any.clone())
                ));
            }
        }
        if let Some(values) = schema["enum"].as_array() {
            if !values.contains(v) {
                errors.push(format!(
                    "{path}: {v} is not one of {}",
                    Value::Array(values.clone())
                ));
            }
        }
        let ty = schema["type"].as_str();
        let ok = match ty {
            Some("object") => v.is_object(),
            Some("array") => v.is_array(),
            Some("string") => v.is_string(),
            Some("integer") => v.is_i64() || v.is_u64(),
            Some("number") => v.is_number(),
            Some("boolean") => v.is_boolean(),
            _ => true,
        };
        if !ok {
            errors.push(format!("{path}: {v} is not of type {}", ty.unwrap_or("")));
            return;
        }
        if let Some(items) = schema.get("items") {
            for (i, item) in v.as_array().into_iter().flatten().enumerate() {
                self.walk(items, item, &format!("{path}[{i}]"), errors);
            }
        }
        let props = schema["properties"].as_object();
        let extra = schema.get("additionalProperties");
        if let Some(obj) = v.as_object() {
            if props.is_none() && extra.is_none() {
                return; // free-form (RawExtension, FieldsV1)
            }
            for (k, field) in obj {
                let p = format!("{path}.{k}");
                match (props.and_then(|p| p.get(k)), extra) {
                    (Some(s), _) => self.walk(s, field, &p, errors),
                    (None, Some(s)) if s.is_object() => self.walk(s, field, &p, errors),
                    (None, Some(Value::Bool(true))) => {}
                    _ => errors.push(format!("{p}: unknown field")),
                }
            }
            for r in schema["required"].as_array().into_iter().flatten() {
                let r = r.as_str().unwrap();
                if !obj.contains_key(r) {
                    errors.push(format!("{path}.{r}: required"));
                }
            }
        }
    }
}

/// Read into `T` and written back: what does not come back is not in the schema.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(
    doc: &Value,
) -> Result<(), Vec<String>> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| vec![e.to_string()])?;
    let back = serde_json::to_value(&typed).unwrap();
    let mut errors = vec![];
    differ(doc, &back, "", &mut errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

fn differ(a: &Value, b: &Value, path: &str, errors: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                match y.get(k) {
                    Some(w) => differ(v, w, &format!("{path}.{k}"), errors),
                    None => errors.push(format!("{path}.{k}: unknown field")),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                differ(v, w, &format!("{path}[{i}]"), errors);
            }
        }
        _ if a == b => {}
        _ => errors.push(format!("{path}: {a} read as {b}")),
    }
}
