//! Label and field selectors, parsed as the real server parses them (and refused with its
//! 400s), and the filter a list or watch applies with them.

use serde_json::Value;

use crate::http::ApiError;
use crate::store::{Obj, ResourceType};

#[derive(Debug, Clone)]
pub(crate) enum LabelOp {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    pub(crate) namespace: Option<String>,
    pub(crate) labels: Vec<(String, LabelOp)>,
    /// Field, value, and whether the requirement is `!=`.
    pub(crate) fields: Vec<(String, String, bool)>,
}

impl Filter {
    pub(crate) fn has_selectors(&self) -> bool {
        !self.labels.is_empty() || !self.fields.is_empty()
    }

    pub(crate) fn matches(&self, obj: &Obj) -> bool {
        if let Some(ns) = &self.namespace {
            if &obj.namespace != ns {
                return false;
            }
        }
        let ok = self.labels.iter().all(|(key, op)| {
            let have = obj.label(key);
            match (op, have) {
                (LabelOp::Eq(v), Some(h)) => h == v,
                (LabelOp::Eq(_), None) => false,
                (LabelOp::NotEq(v), Some(h)) => h != v,
                (LabelOp::NotEq(_), None) => true,
                (LabelOp::In(vs), Some(h)) => vs.iter().any(|v| v == h),
                (LabelOp::In(_), None) => false,
                (LabelOp::NotIn(vs), Some(h)) => !vs.iter().any(|v| v == h),
                (LabelOp::NotIn(_), None) => true,
                (LabelOp::Exists, h) => h.is_some(),
                (LabelOp::NotExists, h) => h.is_none(),
                (LabelOp::Gt(n), Some(h)) => h.parse::<i64>().is_ok_and(|h| h > *n),
                (LabelOp::Lt(n), Some(h)) => h.parse::<i64>().is_ok_and(|h| h < *n),
                (LabelOp::Gt(_) | LabelOp::Lt(_), None) => false,
            }
        });
        if !ok {
            return false;
        }
        // Other fields than the name and namespace are rare: read the text only for them.
        let mut parsed = None;
        self.fields.iter().all(|(field, want, negated)| {
            let have = match field.as_str() {
                "metadata.name" => obj.name.clone(),
                "metadata.namespace" => obj.namespace.clone(),
                _ => field_value(parsed.get_or_insert_with(|| obj.value()), field),
            };
            (have == *want) != *negated
        })
    }
}

fn field_value(v: &Value, path: &str) -> String {
    let mut cur = v;
    for part in path.split('.') {
        cur = &cur[part];
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn valid_label_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

pub(crate) fn parse_label_selector(s: &str) -> Result<Vec<(String, LabelOp)>, ApiError> {
    let bad = |why: String| ApiError::bad_request(format!("unable to parse requirement: {why}"));
    let mut reqs = Vec::new();
    if s.trim().is_empty() {
        return Ok(reqs);
    }
    for part in split_top_level(s) {
        let p = part.trim();
        if p.is_empty() {
            return Err(bad(format!("found '', expected: identifier in \"{s}\"")));
        }
        let check_value = |v: &str| -> Result<String, ApiError> {
            let v = v.trim();
            if valid_label_value(v) {
                Ok(v.to_owned())
            } else {
                Err(bad(format!("invalid label value: \"{v}\"")))
            }
        };
        let (key, op) = if let Some(k) = p.strip_prefix('!') {
            (k.trim().to_owned(), LabelOp::NotExists)
        } else if let Some(open) = p.find('(') {
            let Some(inner) = p[open + 1..].strip_suffix(')') else {
                return Err(bad(format!("found '{p}', expected: ')'")));
            };
            let mut words = p[..open].split_whitespace();
            let (Some(key), Some(word), None) = (words.next(), words.next(), words.next()) else {
                return Err(bad(format!("found '{p}', expected: in, notin")));
            };
            let values = inner
                .split(',')
                .map(check_value)
                .collect::<Result<Vec<_>, _>>()?;
            let op = match word {
                "in" => LabelOp::In(values),
                "notin" => LabelOp::NotIn(values),
                other => return Err(bad(format!("found '{other}', expected: in, notin"))),
            };
            (key.to_owned(), op)
        } else if let Some((k, v)) = p.split_once("!=") {
            (k.trim().to_owned(), LabelOp::NotEq(check_value(v)?))
        } else if let Some((k, v)) = p.split_once("==") {
            (k.trim().to_owned(), LabelOp::Eq(check_value(v)?))
        } else if let Some((k, v)) = p.split_once('=') {
            (k.trim().to_owned(), LabelOp::Eq(check_value(v)?))
        } else if let Some((k, v)) = p.split_once('>') {
            let n = v.trim().parse().map_err(|_| {
                bad(format!(
                    "for 'Gt', 'Lt' operators, the value must be an integer: \"{v}\""
                ))
            })?;
            (k.trim().to_owned(), LabelOp::Gt(n))
        } else if let Some((k, v)) = p.split_once('<') {
            let n = v.trim().parse().map_err(|_| {
                bad(format!(
                    "for 'Gt', 'Lt' operators, the value must be an integer: \"{v}\""
                ))
            })?;
            (k.trim().to_owned(), LabelOp::Lt(n))
        } else {
            (p.to_owned(), LabelOp::Exists)
        };
        if !valid_label_key(&key) {
            return Err(bad(format!("invalid label key \"{key}\"")));
        }
        reqs.push((key, op));
    }
    Ok(reqs)
}

pub(crate) fn parse_field_selector(
    s: &str,
    ty: &ResourceType,
) -> Result<Vec<(String, String, bool)>, ApiError> {
    let mut reqs = Vec::new();
    if s.trim().is_empty() {
        return Ok(reqs);
    }
    // Split on commas that are not escaped; values may escape `\,`, `\=` and `\\`.
    let mut parts = vec![String::new()];
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                parts.last_mut().unwrap().push('\\');
                if let Some(n) = chars.next() {
                    parts.last_mut().unwrap().push(n);
                }
            }
            ',' => parts.push(String::new()),
            c => parts.last_mut().unwrap().push(c),
        }
    }
    for p in parts {
        let (field, value, negated) = if let Some((f, v)) = p.split_once("!=") {
            (f, v, true)
        } else if let Some((f, v)) = p.split_once("==") {
            (f, v, false)
        } else if let Some((f, v)) = p.split_once('=') {
            (f, v, false)
        } else {
            return Err(ApiError::bad_request(format!(
                "invalid selector: '{s}'; can't understand '{p}'"
            )));
        };
        let field = field.trim();
        let known = field == "metadata.name"
            || field == "metadata.namespace"
            || ty.field_labels.iter().any(|f| f == field);
        if !known {
            return Err(ApiError::bad_request(format!(
                "field label not supported: {field}"
            )));
        }
        let mut unescaped = String::new();
        let mut it = value.chars();
        while let Some(c) = it.next() {
            if c == '\\' {
                if let Some(n) = it.next() {
                    unescaped.push(n);
                }
            } else {
                unescaped.push(c);
            }
        }
        reqs.push((field.to_owned(), unescaped, negated));
    }
    Ok(reqs)
}
