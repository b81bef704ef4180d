//! Loading: a policy's text merged over the built-in text, deserialised, checked, and its
//! profiles resolved.
//!
//! One merge rule serves the file and its profiles: a map merges key by key, a list or a
//! scalar replaces, and `null` puts the built-in value back. A file is merged over the
//! built-in policy; a profile's sections over the file's, then over the built-in policy,
//! so that a profile's `null` restores the built-in value, not the file's.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::builtin::builtin_value;
use super::check::check_written;
use super::{Policy, PolicyError, BASE_PROFILE};
use crate::names;

/// The text as written, as JSON: an empty text or document is an empty map.
fn written(source: &str, text: &str) -> Result<Value, PolicyError> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    let value: Value = serde_saphyr::from_str(text).map_err(|e| PolicyError::Syntax {
        file: source.to_owned(),
        message: super::one_line(e.to_string().trim_start_matches("error: ").to_owned()),
    })?;
    Ok(match value {
        Value::Null => Value::Object(Map::new()),
        v => v,
    })
}

impl Policy {
    /// A policy's text as written (not merged), as JSON: what a layer of a composed policy
    /// keeps (`Layers`).
    pub fn written(source: &str, text: &str) -> Result<Value, PolicyError> {
        written(source, text)
    }

    /// Parses a policy as written (its text read as JSON: a file, or a TollgatePolicy's
    /// spec over one), merged over the built-in text, and checks it and its profiles; not
    /// yet its additions against its validation (`Policy::from_written` does that too).
    /// `source` names it in errors (usually the file path).
    pub(crate) fn parse_written(source: &str, written: &Value) -> Result<Policy, PolicyError> {
        let written = written.clone();
        if !written.is_object() {
            // Not a map: serde says what it expected.
            return Policy::from_value(source, &written);
        }
        // The file's profiles replace the built-in's (none), as any list does.
        let merged = overlay(builtin_value().clone(), &written);
        let mut policy = Policy::from_value(source, &merged).map_err(|e| e.named(&written))?;
        policy.resolve_profiles(source, &written)?;
        Ok(policy)
    }

    /// A policy from its merged JSON form, checked; profiles as written, not yet resolved.
    fn from_value(source: &str, value: &Value) -> Result<Policy, PolicyError> {
        let policy: Policy = serde_path_to_error::deserialize(value).map_err(|e| {
            let field = e.path().to_string();
            PolicyError::field(source, field, e.into_inner().to_string())
        })?;
        check_written(source, value)?;
        policy.check(source)?;
        Ok(policy)
    }

    /// Merges each profile over the file and the built-in policy and checks the result,
    /// so that a profile that makes anything invalid refuses the whole policy at load,
    /// never a review.
    fn resolve_profiles(&mut self, source: &str, written: &Value) -> Result<(), PolicyError> {
        if self.profiles.is_empty() {
            return Ok(());
        }
        let file = without_profiles(written);
        let mut names: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, p) in self.profiles.iter().enumerate() {
            let here = format!("profiles[{i}]");
            if let Err(m) = names::dns_label(&p.name) {
                return Err(PolicyError::field(source, format!("{here}.name"), m));
            }
            if p.name == BASE_PROFILE {
                return Err(PolicyError::field(
                    source,
                    format!("{here}.name"),
                    format!(
                        "{BASE_PROFILE:?} names the policy without a profile; choose another name"
                    ),
                ));
            }
            if let Some(j) = names.insert(&p.name, i) {
                return Err(PolicyError::field(
                    source,
                    format!("{here}.name"),
                    format!(
                        "profile {:?} is also profiles[{j}]: names must be unique",
                        p.name
                    ),
                ));
            }
            let at = format!("profiles[{}]", p.name);
            let written_match = written.pointer(&format!("/profiles/{i}/match"));
            super::check::check_match(source, &at, &p.matches, written_match)?;
        }
        for (i, p) in self.profiles.iter_mut().enumerate() {
            let at = format!("profiles[{}]", p.name);
            let mut mine = file.clone();
            if let Some(Value::Object(sections)) = written.pointer(&format!("/profiles/{i}")) {
                for (key, overrides) in sections {
                    if key != "name" && key != "match" {
                        merge_field(&mut mine, key, overrides);
                    }
                }
            }
            let merged = overlay(builtin_value().clone(), &mine);
            let resolved = Policy::from_value(source, &merged).map_err(|e| e.within(&at))?;
            p.resolved = Some(Box::new(resolved));
        }
        Ok(())
    }
}

impl Policy {
    /// The policy for the pods a profile fits: `base` (a written policy; its profiles are
    /// left out) with each of `layers` (a map of a profile's sections: a cluster profile's,
    /// then a TollgateProfile's) merged over it in order, by the rule a profile follows,
    /// then over the built-in policy; checked, not yet its additions.
    pub(crate) fn resolve_sections(
        source: &str,
        base: &Value,
        layers: &[&Value],
    ) -> Result<Policy, PolicyError> {
        let mut mine = without_profiles(base);
        for layer in layers {
            if let Value::Object(sections) = layer {
                for (key, overrides) in sections {
                    if key != "name" && key != "match" {
                        merge_field(&mut mine, key, overrides);
                    }
                }
            }
        }
        let merged = overlay(builtin_value().clone(), &mine);
        Policy::from_value(source, &merged)
    }
}

/// `over` (a written policy, a TollgatePolicy's spec) merged into `base` (the file as
/// written) by the rule a file follows over the built-in policy: a map merges key by key,
/// anything else replaces, and `null` removes the file's value, so that the built-in one
/// comes back.
pub(crate) fn merge_written(base: &Value, over: &Value) -> Value {
    let mut out = base.clone();
    if !out.is_object() {
        out = Value::Object(Map::new());
    }
    if let Value::Object(o) = over {
        for (k, v) in o {
            merge_field(&mut out, k, v);
        }
    }
    out
}

/// A file's text without its profiles: what its profiles are merged over.
fn without_profiles(written: &Value) -> Value {
    let mut v = written.clone();
    if let Value::Object(m) = &mut v {
        m.remove("profiles");
    }
    v
}

/// `over` merged over `base`: a map merges key by key, anything else replaces, and `null`
/// keeps the base's value (the built-in default).
fn overlay(mut base: Value, over: &Value) -> Value {
    let (Value::Object(b), Value::Object(o)) = (&mut base, over) else {
        return if over.is_null() { base } else { over.clone() };
    };
    for (k, v) in o {
        match (b.get_mut(k), v) {
            (_, Value::Null) => {}
            (Some(slot), Value::Object(_)) if slot.is_object() => {
                *slot = overlay(slot.take(), v);
            }
            (_, Value::Object(_)) => {
                b.insert(k.clone(), overlay(Value::Object(Map::new()), v));
            }
            (_, other) => {
                b.insert(k.clone(), other.clone());
            }
        }
    }
    base
}

/// RFC 7386 merge of `overrides` into the field `key` of `doc`: a map merges key by key,
/// anything else replaces, and `null` removes the field (the built-in value comes back
/// when the result is laid over the built-in policy).
fn merge_field(doc: &mut Value, key: &str, overrides: &Value) {
    let Value::Object(map) = doc else {
        return;
    };
    match overrides {
        Value::Null => {
            map.remove(key);
        }
        Value::Object(o) => {
            let slot = map
                .entry(key.to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
            if !slot.is_object() {
                *slot = Value::Object(Map::new());
            }
            for (k, v) in o {
                merge_field(slot, k, v);
            }
        }
        other => {
            map.insert(key.to_owned(), other.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn overlay_merges_maps_replaces_the_rest_and_null_keeps_the_base() {
        let base = json!({"a": {"x": 1, "y": [1, 2]}, "b": "s", "c": {"k": 1}});
        let over = json!({"a": {"y": [3], "z": true}, "b": null, "c": 5, "d": {"n": null, "m": 1}});
        assert_eq!(
            overlay(base, &over),
            json!({"a": {"x": 1, "y": [3], "z": true}, "b": "s", "c": 5, "d": {"m": 1}})
        );
    }

    #[test]
    fn syntax_errors_are_one_line_naming_the_place() {
        let e = Policy::written("p.yaml", "gpu:\n  classes: [\nvalidation:\n  mode: warn\n")
            .unwrap_err()
            .to_string();
        assert!(!e.contains('\n'), "{e}");
        assert!(
            e.starts_with("p.yaml: not valid YAML: line 4 column 7:"),
            "{e}"
        );
    }
}
