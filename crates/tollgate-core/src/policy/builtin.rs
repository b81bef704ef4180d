//! The built-in policy's text as JSON, read once: what every policy is merged over
//! (`load`) and whose GPU classes a file may keep or replace (`check`).

use std::sync::OnceLock;

use serde_json::{Map, Value};

use super::BUILTIN_TEXT;

/// The built-in text as JSON, read once: what every policy is merged over.
pub(super) fn builtin_value() -> &'static Value {
    static BUILTIN: OnceLock<Value> = OnceLock::new();
    // The text is compiled in and a test loads it: it always reads. Were it ever not to,
    // an empty base would make every file fail its own load with a field error, never a
    // panic here.
    BUILTIN
        .get_or_init(|| serde_saphyr::from_str(BUILTIN_TEXT).unwrap_or(Value::Object(Map::new())))
}

/// The names of the built-in policy's GPU classes.
pub(super) fn builtin_class_names() -> std::collections::BTreeSet<&'static str> {
    builtin_value()
        .pointer("/gpu/classes")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|m| m.keys().map(String::as_str))
        .collect()
}
