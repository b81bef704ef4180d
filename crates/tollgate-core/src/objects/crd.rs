//! The CustomResourceDefinitions of the two kinds (`apiextensions.k8s.io/v1`), their schemas
//! from the policy's own types (`policy::types`, through `JsonSchema`): one source for the
//! file, the objects and `kubectl explain`.
//!
//! A spec is a policy *as written*, merged over the file (the TollgatePolicy) or over the
//! cluster's policy (a TollgateProfile): a map merges key by key and `null` puts the
//! built-in value back, while a list, and so each of its items, is written whole. So the
//! schema follows the merge, not the types' `required`: in what merges (a spec, a profile's
//! sections, every map reached from them through maps) every field may be left out and
//! may be `null` (`nullable`, or the apiserver would prune the null and the file's value
//! would stay); an item of a list keeps its type's required fields, and only its `Option`
//! fields are nullable, as serde reads them.
//!
//! The schema is made structural as the apiserver requires (`structural`): `$ref`s inlined,
//! `type` everywhere, `null` as `nullable`, an enum's documented variants as `enum` with
//! their words in the description, no `default` (the apiserver would write it into every
//! object, over the file's value) and no `additionalProperties: false` (the apiserver prunes
//! unknown fields, and refuses them under strict field validation, kubectl's default).
//!
//! What the schema cannot say (a name's syntax, a quantity's, the bounds of a profile, the
//! values of a nullable enum in a list's items or a map's values: see `allow_null_in_enum`)
//! the validating webhook says (`objects::review`), and the composer for an object stored while
//! the webhook was not there.

use schemars::generate::SchemaSettings;
use serde_json::{json, Map, Value};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::{
    GROUP, NAME, POLICY_KIND, POLICY_PLURAL, PROFILE_KIND, PROFILE_PLURAL, PROFILE_SECTIONS,
    VERSION,
};
use crate::policy::{Policy, Profile};

/// The marker (`policy::types`) of a field whose content merges although the object it is
/// in is written whole: a profile's sections.
const MERGED: &str = "x-tollgate-merged";

/// The schema written for every quantity, in place of k8s-openapi's page-long description.
const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";

/// The formats kept (the apiserver's); schemars' others (`uint32`, `uint`) are dropped.
const FORMATS: [&str; 5] = ["int32", "int64", "float", "double", "date-time"];

/// The CRD of the cluster's TollgatePolicy: its spec is a whole policy file.
pub(crate) fn policy_crd() -> Value {
    let (spec, status) = schemas(Schema::Policy);
    crd(
        POLICY_KIND,
        POLICY_PLURAL,
        "tgpolicy",
        "Cluster",
        "The cluster's tollgate policy: its spec is a policy file (every section of \
         policies/default.yaml, profiles and namespaceProfiles included), merged over the \
         file tollgate was started with (--policy) by the rule a file follows over the \
         built-in policy: a map merges key by key, a list or a value replaces, and null \
         puts the built-in value back. The cluster has one, named default.",
        &format!("the cluster has one {POLICY_KIND}, named {NAME}"),
        spec,
        status,
    )
}

/// The CRD of a namespace's TollgateProfile: its spec is a profile's sections.
pub(crate) fn profile_crd() -> Value {
    let (spec, status) = schemas(Schema::Profile);
    crd(
        PROFILE_KIND,
        PROFILE_PLURAL,
        "tgprofile",
        "Namespaced",
        "A namespace's tollgate profile: the sections of the policy that differ for the \
         pods and workloads of this namespace, merged over the cluster's policy (or the \
         cluster profile a pod matches) by the rule profiles follow. It may make the \
         policy stricter or change defaults; it may loosen it only in the sections the \
         TollgatePolicy's namespaceProfiles.mayLoosen names. A namespace has one, named \
         default.",
        &format!("a namespace has one {PROFILE_KIND}, named {NAME}"),
        spec,
        status,
    )
}

/// Both CRDs, the TollgatePolicy's first.
pub fn crds() -> [Value; 2] {
    [policy_crd(), profile_crd()]
}

/// A CRD as the YAML file `deploy/` ships (`tests/policy_crds.rs` holds the files to it).
pub fn to_yaml(crd: &Value) -> Result<String, serde_saphyr::ser::Error> {
    let body = serde_saphyr::to_string(crd)?;
    Ok(format!(
        "# Generated from tollgate's policy types (crates/tollgate-core/src/objects/crd.rs);\n\
         # do not edit: TOLLGATE_BLESS=1 cargo test --test integration policy_crds rewrites it.\n\
         {body}"
    ))
}

#[allow(clippy::too_many_arguments)]
fn crd(
    kind: &str,
    plural: &str,
    short: &str,
    scope: &str,
    description: &str,
    only_default: &str,
    spec: Value,
    status: Value,
) -> Value {
    let ready = |field: &str| format!(".status.conditions[?(@.type==\"Ready\")].{field}");
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{plural}.{GROUP}"),
            "labels": {"app.kubernetes.io/name": "tollgate"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": format!("{kind}List"),
                "plural": plural,
                "singular": kind.to_ascii_lowercase(),
                "shortNames": [short],
                "categories": ["tollgate"],
            },
            "scope": scope,
            "versions": [{
                "name": VERSION,
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {
                        "name": "Ready",
                        "type": "string",
                        "description": "Whether this generation's spec is in force.",
                        "jsonPath": ready("status"),
                    },
                    {
                        "name": "Reason",
                        "type": "string",
                        "description": "InForce, or why this generation's spec is not.",
                        "jsonPath": ready("reason"),
                    },
                    {
                        "name": "Age",
                        "type": "date",
                        "jsonPath": ".metadata.creationTimestamp",
                    },
                    {
                        "name": "Message",
                        "type": "string",
                        "priority": 1,
                        "description": "What is in force, and why.",
                        "jsonPath": ready("message"),
                    },
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": description,
                    "properties": {
                        "apiVersion": {
                            "type": "string",
                            "description": "The versioned schema of this representation of an object.",
                        },
                        "kind": {
                            "type": "string",
                            "description": "The REST resource this object represents.",
                        },
                        // name declared, so that the name rule below can point at it.
                        "metadata": {
                            "type": "object",
                            "properties": {"name": {
                                "type": "string",
                                "description": format!("The object's name: {NAME}, the only one allowed."),
                            }},
                        },
                        "spec": spec,
                        "status": status,
                    },
                    // The apiserver allows a root rule to read metadata.name (and only it
                    // and generateName of metadata): the one name is refused there, with
                    // tollgate down too.
                    // fieldPath: the refusal names the field (`metadata.name: Invalid value`),
                    // where a root rule alone is reported at `<nil>`.
                    "x-kubernetes-validations": [{
                        "rule": format!("self.metadata.name == '{NAME}'"),
                        "fieldPath": ".metadata.name",
                        "reason": "FieldValueInvalid",
                        "message": format!(
                            "only the name '{NAME}' is allowed: {only_default}"
                        ),
                    }],
                }},
            }],
        },
    })
}

#[derive(Clone, Copy)]
enum Schema {
    Policy,
    Profile,
}

/// The spec's and the status's structural schemas.
fn schemas(which: Schema) -> (Value, Value) {
    let mut generator = SchemaSettings::draft2020_12()
        .with(|s| {
            s.meta_schema = None;
            s.inline_subschemas = false;
        })
        .into_generator();
    let spec = match which {
        Schema::Policy => generator.subschema_for::<Policy>(),
        Schema::Profile => generator.subschema_for::<Profile>(),
    };
    let condition = generator.subschema_for::<Condition>();
    let defs = generator.take_definitions(true);
    let inliner = Inliner { defs: &defs };
    let mut spec = inliner.structural(spec.as_value(), true, true);
    if let Schema::Profile = which {
        // A TollgateProfile's spec is a cluster profile's sections, without the name
        // and match its namespace and object name stand for.
        if let Some(Value::Object(props)) = spec.get_mut("properties") {
            props.retain(|k, _| PROFILE_SECTIONS.contains(&k.as_str()));
        }
        spec["description"] = json!(
            "The sections of the policy this namespace's pods and workloads get \
             differently, each merged over the cluster's."
        );
    } else {
        spec["description"] = json!(
            "The policy, as a policy file writes it: only what differs from the file \
             tollgate was started with (or the built-in policy)."
        );
    }
    if let Some(s) = spec.as_object_mut() {
        // The spec itself is not null: a spec left out is an empty one.
        s.remove("nullable");
    }
    let condition = inliner.structural(condition.as_value(), false, false);
    let status = json!({
        "type": "object",
        "description": "What tollgate made of this object: written by tollgate.",
        "properties": {
            "observedGeneration": {
                "type": "integer",
                "format": "int64",
                "description": "The generation of the spec the conditions are about.",
            },
            "conditions": {
                "type": "array",
                "description": "Ready: True (reason InForce) when this generation's spec \
                    is in force; False when it is not, the reason saying why (Invalid: it \
                    does not load; OutOfBounds: a TollgateProfile loosens a section the \
                    TollgatePolicy does not let it; NotDefault: not named default), the \
                    message which spec is in force instead (the last good one, or none).",
                "items": condition,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
        },
    });
    (spec, status)
}

/// Inlines a schemars schema's `$ref`s (`defs`) into the structural form the apiserver takes.
struct Inliner<'a> {
    defs: &'a Map<String, Value>,
}

impl Inliner<'_> {
    /// `schema` made structural; `merged`: it is within what merges (see the module's words);
    /// `once`: a value of it is at most one per object (not in a list's items or a map's
    /// values), where the apiserver takes a rule at the cost it estimates.
    fn structural(&self, schema: &Value, merged: bool, once: bool) -> Value {
        let Value::Object(s) = schema else {
            // `true` (anything): no policy type has one; see the tests.
            return json!({"x-kubernetes-preserve-unknown-fields": true});
        };
        let mut s = s.clone();
        if let Some(Value::String(r)) = s.remove("$ref") {
            let name = r.rsplit('/').next().unwrap_or_default();
            let mut base = match name {
                QUANTITY => json!({
                    "x-kubernetes-int-or-string": true,
                    "description": "A quantity: a string (500m, 8Gi, \"4\") or an integer \
                        (4). A fraction is written as a string (\"0.5\"): the apiserver \
                        takes a number here only as an integer.",
                }),
                _ => self.defs.get(name).cloned().unwrap_or_else(|| json!({})),
            };
            // The field's own words (its description) over the type's.
            if let Value::Object(b) = &mut base {
                b.extend(s);
            }
            return self.structural(&base, merged, once);
        }
        let merged = merged || s.remove(MERGED).is_some_and(|v| v == true);
        let mut nullable = false;
        // `Option<T>`: a type list with "null", or a choice of T and null.
        if let Some(Value::Array(types)) = s.get("type").cloned() {
            nullable |= types.iter().any(|t| t == "null");
            let rest: Vec<Value> = types.into_iter().filter(|t| t != "null").collect();
            match rest.as_slice() {
                [one] => s.insert("type".into(), one.clone()),
                _ => s.insert("type".into(), Value::Array(rest)),
            };
        }
        for key in ["anyOf", "oneOf"] {
            let Some(Value::Array(branches)) = s.remove(key) else {
                continue;
            };
            let is_null = |b: &Value| b.get("type").is_some_and(|t| t == "null");
            nullable |= branches.iter().any(is_null);
            let branches: Vec<Value> = branches.into_iter().filter(|b| !is_null(b)).collect();
            if let [one] = branches.as_slice() {
                let mut one = self.structural(one, merged, once);
                if let (Value::Object(o), Some(d)) = (&mut one, s.get("description")) {
                    o.insert("description".into(), d.clone());
                }
                s = one.as_object().cloned().unwrap_or_default();
            } else if let Some((values, words)) = enumeration(&branches) {
                s.insert("type".into(), json!("string"));
                s.insert("enum".into(), Value::Array(values));
                if !words.is_empty() {
                    let own = s.get("description").and_then(Value::as_str).unwrap_or("");
                    let joined = words.join(" ");
                    let text = if own.is_empty() {
                        joined
                    } else {
                        format!("{own}\n\n{joined}")
                    };
                    s.insert("description".into(), json!(text));
                }
            } else {
                s.insert(key.into(), Value::Array(branches));
            }
        }
        if let Some(c) = s.remove("const") {
            s.insert("enum".into(), json!([c]));
        }
        for key in ["$schema", "$defs", "title", "default", "examples"] {
            s.remove(key);
        }
        if s.get("additionalProperties").is_some_and(Value::is_boolean) {
            s.remove("additionalProperties");
        }
        if let Some(f) = s.get("format").and_then(Value::as_str) {
            if !FORMATS.contains(&f) {
                s.remove("format");
            }
        }
        if !matches!(
            s.get("type").and_then(Value::as_str),
            Some("integer" | "number")
        ) {
            s.remove("minimum");
        }
        if let Some(Value::String(d)) = s.get("description") {
            let text = reflow(d);
            s.insert("description".into(), json!(text));
        }
        if let Some(Value::Object(props)) = s.get("properties") {
            let props: Map<String, Value> = props
                .iter()
                .map(|(k, p)| (k.clone(), self.member(p, merged, once)))
                .collect();
            s.insert("properties".into(), Value::Object(props));
            s.entry("type").or_insert(json!("object"));
        }
        if let Some(ap @ Value::Object(_)) = s.get("additionalProperties") {
            let ap = self.member(ap, merged, false);
            s.insert("additionalProperties".into(), ap);
            s.entry("type").or_insert(json!("object"));
        }
        if merged {
            s.remove("required");
        }
        if let Some(items) = s.get("items") {
            // An item of a list is written whole: it leaves what merges.
            let items = self.structural(items, false, false);
            s.insert("items".into(), items);
        }
        if nullable {
            s.insert("nullable".into(), json!(true));
            allow_null_in_enum(&mut s, once);
        }
        let typed = s.contains_key("type")
            || s.contains_key("x-kubernetes-int-or-string")
            || s.contains_key("x-kubernetes-preserve-unknown-fields");
        if !typed {
            s.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
        }
        Value::Object(s)
    }

    /// A property or a map's value: nullable within what merges (null restores the
    /// built-in value).
    fn member(&self, schema: &Value, merged: bool, once: bool) -> Value {
        let mut out = self.structural(schema, merged, once);
        if merged {
            if let Value::Object(o) = &mut out {
                o.insert("nullable".into(), json!(true));
                allow_null_in_enum(o, once);
            }
        }
        out
    }
}

/// A nullable enum's values as a CEL rule instead: the apiserver holds a null to `enum`
/// too (refused: not one of the values), and kubectl refuses a CRD whose `enum` lists
/// null, while a rule is not evaluated on a null. The rule's list is the values as JSON,
/// which CEL reads as the same strings.
///
/// Only where the value is one per object (`once`): the apiserver refuses a rule in a
/// list's items or a map's values of unbounded size (a cluster profile's `validation.mode`,
/// a GPU class's `driver`) as too costly, however cheap. There the schema takes any
/// string (the description names the values), and the webhook and the composer refuse
/// one the policy does not know, as they do what else a schema cannot say.
fn allow_null_in_enum(s: &mut Map<String, Value>, once: bool) {
    let Some(Value::Array(values)) = s.remove("enum") else {
        return;
    };
    if !once {
        return;
    }
    let words: Vec<&str> = values.iter().filter_map(Value::as_str).collect();
    // Bounded, so that the apiserver's estimate of the rule's cost (a string compared per
    // value, in every item of every list and map around it) stays within its budget: no
    // value is longer, and a longer string is refused as too long.
    let longest = words.iter().map(|w| w.len()).max().unwrap_or_default();
    s.insert("maxLength".into(), json!(longest));
    s.insert(
        "x-kubernetes-validations".into(),
        json!([{
            "rule": format!("self in {}", Value::Array(values.clone())),
            "message": format!("must be one of: {}", words.join(", ")),
        }]),
    );
}

/// A choice of constants (an enum whose variants have doc comments): the values, and each
/// documented value's words (`` `runtime`: The runtime puts... ``).
fn enumeration(branches: &[Value]) -> Option<(Vec<Value>, Vec<String>)> {
    let mut values = Vec::new();
    let mut words = Vec::new();
    for b in branches {
        let these: Vec<Value> = match (b.get("const"), b.get("enum")) {
            (Some(c), _) => vec![c.clone()],
            (None, Some(Value::Array(e))) => e.clone(),
            _ => return None,
        };
        if let Some(d) = b.get("description").and_then(Value::as_str) {
            let names: Vec<String> = these
                .iter()
                .map(|v| v.as_str().unwrap_or_default().to_owned())
                .collect();
            words.push(format!("{}: {}", names.join(", "), reflow(d)));
        }
        values.extend(these);
    }
    Some((values, words))
}

/// A doc comment's lines as the paragraphs they are: a line break is a space, unless the
/// next line is indented or an item of a list (as k8s-openapi's descriptions write them).
fn reflow(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            let kept = line.is_empty() || out.ends_with('\n') || line.starts_with([' ', '-', '\t']);
            out.push(if kept { '\n' } else { ' ' });
        }
        out.push_str(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn spec_schema(crd: &Value) -> &Value {
        &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    }

    /// Every schema in `v`, with its path.
    fn walk<'a>(path: String, v: &'a Value, out: &mut Vec<(String, &'a Value)>) {
        out.push((path.clone(), v));
        if let Some(Value::Object(props)) = v.get("properties") {
            for (k, p) in props {
                walk(format!("{path}.{k}"), p, out);
            }
        }
        if let Some(ap @ Value::Object(_)) = v.get("additionalProperties") {
            walk(format!("{path}.*"), ap, out);
        }
        if let Some(items) = v.get("items") {
            walk(format!("{path}[]"), items, out);
        }
    }

    fn schemas_of(crd: &Value) -> Vec<(String, &Value)> {
        let mut out = Vec::new();
        let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        walk(String::new(), root, &mut out);
        out
    }

    /// What the apiserver refuses in a structural schema, or would do differently: none of
    /// it anywhere, and a type (or int-or-string) everywhere; nothing left untyped either
    /// (every field of the policy has a type of its own).
    #[test]
    fn the_schemas_are_structural() {
        for crd in crds() {
            for (path, s) in schemas_of(&crd) {
                for key in [
                    "$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "const", "default", "title",
                    "$schema", "examples", MERGED,
                ] {
                    assert!(s.get(key).is_none(), "{path}: {key} in {s}");
                }
                assert!(
                    s.get("additionalProperties").is_none_or(Value::is_object),
                    "{path}: {s}"
                );
                assert!(
                    !(s.get("properties").is_some() && s.get("additionalProperties").is_some()),
                    "{path}"
                );
                assert!(
                    s.get("x-kubernetes-preserve-unknown-fields").is_none(),
                    "{path}: untyped"
                );
                let typed = s.get("type").is_some_and(Value::is_string)
                    || s.get("x-kubernetes-int-or-string") == Some(&json!(true));
                assert!(typed, "{path}: no type in {s}");
                if let Some(f) = s.get("format").and_then(Value::as_str) {
                    assert!(FORMATS.contains(&f), "{path}: format {f}");
                }
            }
        }
    }

    /// `kubectl explain` prints each field's description: every field has one.
    #[test]
    fn every_field_is_described() {
        for crd in crds() {
            for (path, s) in schemas_of(&crd) {
                if path.ends_with(".*") || path.ends_with("[]") || path == ".metadata" {
                    continue;
                }
                let d = s.get("description").and_then(Value::as_str).unwrap_or("");
                assert!(!d.trim().is_empty(), "{path} has no description");
                assert!(!d.contains("[`"), "{path}: a rustdoc link in {d:?}");
            }
        }
    }

    #[test]
    fn a_profile_spec_holds_the_profile_sections_only() {
        let crd = profile_crd();
        let props = spec_schema(&crd)["properties"].as_object().unwrap();
        let keys: Vec<&str> = props.keys().map(String::as_str).collect();
        let mut sections = PROFILE_SECTIONS.to_vec();
        sections.sort_unstable();
        assert_eq!(keys, sections);
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(policy_crd()["spec"]["scope"], "Cluster");
        assert_eq!(crd["metadata"]["name"], "tollgateprofiles.tollgate.dev");
    }

    /// A structural schema's judgement of a value, as far as these schemas go: types,
    /// enums, required fields, nullable, unknown fields (refused, as strict field
    /// validation does).
    fn check(v: &Value, s: &Value, at: &str) -> Result<(), String> {
        if v.is_null() {
            // The apiserver holds a null to the enum as well as to nullable (a rule it
            // does not evaluate on a null).
            let in_enum = s
                .get("enum")
                .and_then(Value::as_array)
                .is_none_or(|e| e.contains(v));
            return if s.get("nullable") == Some(&json!(true)) && in_enum {
                Ok(())
            } else {
                Err(format!("{at}: null"))
            };
        }
        if s.get("x-kubernetes-int-or-string") == Some(&json!(true)) {
            return match v {
                Value::String(_) => Ok(()),
                Value::Number(n) if n.is_i64() || n.is_u64() => Ok(()),
                _ => Err(format!("{at}: not an integer or a string: {v}")),
            };
        }
        if let Some(Value::Array(e)) = s.get("enum") {
            if !e.contains(v) {
                return Err(format!("{at}: {v} not in {e:?}"));
            }
        }
        // A nullable enum's rule (`allow_null_in_enum`): `self in [JSON values]`.
        for rule in s
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let list = rule["rule"]
                .as_str()
                .unwrap()
                .strip_prefix("self in ")
                .unwrap();
            let values: Vec<Value> = serde_json::from_str(list).unwrap();
            if !values.contains(v) {
                return Err(format!("{at}: {v} not in {values:?}"));
            }
        }
        match (s["type"].as_str().unwrap(), v) {
            ("object", Value::Object(m)) => {
                for r in s
                    .get("required")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let r = r.as_str().unwrap();
                    if !m.contains_key(r) {
                        return Err(format!("{at}: {r} missing"));
                    }
                }
                for (k, x) in m {
                    let here = format!("{at}.{k}");
                    match (s["properties"].get(k), s.get("additionalProperties")) {
                        (Some(p), _) | (None, Some(p)) => check(x, p, &here)?,
                        (None, None) => return Err(format!("{here}: unknown field")),
                    }
                }
                Ok(())
            }
            ("array", Value::Array(items)) => items
                .iter()
                .enumerate()
                .try_for_each(|(i, x)| check(x, &s["items"], &format!("{at}[{i}]"))),
            ("string", Value::String(_)) | ("boolean", Value::Bool(_)) => Ok(()),
            ("integer", Value::Number(n)) if n.is_i64() => Ok(()),
            (t, _) => Err(format!("{at}: not a {t}: {v}")),
        }
    }

    fn yaml(text: &str) -> Value {
        serde_saphyr::from_str(text).unwrap()
    }

    /// The schema takes what the file takes: the shipped policy whole, a policy of a few
    /// fields, nulls where they put the built-in value back.
    #[test]
    fn the_policy_schema_takes_what_a_policy_file_takes() {
        let crd = policy_crd();
        let spec = spec_schema(&crd);
        let shipped = yaml(crate::policy::BUILTIN_TEXT);
        check(&shipped, spec, "spec").unwrap();
        for text in [
            "validation:\n  mode: warn\n",
            "mutation:\n  metricsSidecar:\n    container: {image: other:1}\n",
            "mutation:\n  defaultResources:\n    limits: {cpu: 4, memory: null}\n",
            "validation: {requiredRequests: null}\ngpu: {classes: {nvidia: null}}\n",
            "profiles:\n  - name: a\n    match: {namespaces: [team-*]}\n    validation: {mode: null}\n",
            "namespaceProfiles: {mayLoosen: [validation, mutation]}\n",
            "workloads:\n  kinds:\n    - {version: v1, kind: Job, templates: [{path: spec.template}], from: null}\n",
        ] {
            let written = yaml(text);
            Policy::from_text("p.yaml", text).unwrap();
            check(&written, spec, "spec").unwrap_or_else(|e| panic!("{text}: {e}"));
        }
    }

    /// And refuses what the file refuses, where a schema can tell.
    #[test]
    fn the_policy_schema_refuses_what_a_policy_file_refuses() {
        let crd = policy_crd();
        let spec = spec_schema(&crd);
        for (text, why) in [
            ("validation:\n  mode: block\n", "not in"),
            ("validation:\n  enabeld: true\n", "unknown field"),
            ("validation:\n  enabled: \"yes\"\n", "not a boolean"),
            ("gpu:\n  resources: [nvidia.com/gpu]\n", "unknown field"),
            ("profiles:\n  - match: {namespaces: [a]}\n", "name missing"),
            ("profiles:\n  - name: null\n", "null"),
            (
                "workloads:\n  kinds:\n    - {version: v1, templates: [{path: spec.template}]}\n",
                "kind missing",
            ),
            (
                "mutation:\n  defaultResources:\n    limits: {cpu: [1]}\n",
                "not an integer",
            ),
        ] {
            assert!(Policy::from_text("p.yaml", text).is_err(), "{text}");
            let e = check(&yaml(text), spec, "spec").unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    /// What the schema leaves to the webhook (and the composer): it takes these, the
    /// policy does not.
    #[test]
    fn the_schema_leaves_to_the_webhook_what_it_cannot_say() {
        let crd = policy_crd();
        let spec = spec_schema(&crd);
        for text in [
            "mutation:\n  defaultResources:\n    limits: {cpu: lots}\n",
            "profiles:\n  - name: a\n    validation: {mode: block}\n",
            "gpu:\n  classes:\n    x: {resources: [example.com/gpu], driver: kernel}\n",
            "profiles:\n  - name: Not_A_Name\n",
        ] {
            check(&yaml(text), spec, "spec").unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(Policy::from_text("p.yaml", text).is_err(), "{text}");
        }
    }

    #[test]
    fn the_profile_schema_takes_sections_and_refuses_the_rest() {
        let crd = profile_crd();
        let spec = spec_schema(&crd);
        check(
            &yaml("mutation:\n  defaultResources:\n    limits: {cpu: \"2\", memory: 4Gi}\nvalidation: {mode: warn}\n"),
            spec,
            "spec",
        )
        .unwrap();
        for text in ["name: x\n", "match: {namespaces: [a]}\n", "profiles: []\n"] {
            let e = check(&yaml(text), spec, "spec").unwrap_err();
            assert!(e.contains("unknown field"), "{text}: {e}");
        }
    }

    #[test]
    fn only_the_name_default_and_a_status_with_conditions() {
        for crd in crds() {
            let version = &crd["spec"]["versions"][0];
            assert_eq!(version["name"], VERSION);
            assert_eq!(version["subresources"], json!({"status": {}}));
            let root = &version["schema"]["openAPIV3Schema"];
            let rule = &root["x-kubernetes-validations"][0];
            assert_eq!(rule["rule"], "self.metadata.name == 'default'");
            assert!(rule["message"]
                .as_str()
                .unwrap()
                .starts_with("only the name 'default' is allowed"));
            let conditions = &root["properties"]["status"]["properties"]["conditions"];
            assert_eq!(conditions["x-kubernetes-list-type"], "map");
            let required = &conditions["items"]["required"];
            assert_eq!(
                required,
                &json!(["lastTransitionTime", "message", "reason", "status", "type"])
            );
            assert_eq!(crd["spec"]["names"]["categories"], json!(["tollgate"]));
        }
    }
}
