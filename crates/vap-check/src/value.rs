//! The values the cost count computes: CEL's, as far as the export's expressions make
//! them, read from JSON.

use std::collections::BTreeMap;
use std::rc::Rc;

use serde_json::Value;

#[derive(Debug, Clone)]
pub enum Val {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    List(Rc<Vec<Val>>),
    /// Maps with string keys: JSON's objects. (A map literal with other keys is not
    /// evaluable here; the export builds none.)
    Map(Rc<BTreeMap<Rc<str>, Val>>),
    /// A CEL runtime error (no such key, no such overload, ...).
    Err(Rc<str>),
}

impl Val {
    pub(crate) fn err(msg: impl Into<String>) -> Val {
        Val::Err(msg.into().into())
    }

    pub(crate) fn str(s: impl Into<String>) -> Val {
        Val::Str(s.into().into())
    }

    pub fn from_json(v: &Value) -> Val {
        match v {
            Value::Null => Val::Null,
            Value::Bool(b) => Val::Bool(*b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => Val::Int(i),
                None => Val::Double(n.as_f64().unwrap_or_default()),
            },
            Value::String(s) => Val::str(s.as_str()),
            Value::Array(a) => Val::List(Rc::new(a.iter().map(Val::from_json).collect())),
            Value::Object(o) => Val::Map(Rc::new(
                o.iter()
                    .map(|(k, v)| (k.as_str().into(), Val::from_json(v)))
                    .collect(),
            )),
        }
    }

    /// `actualSize`: the size of a sizer (a string's code points, bytes, a list's or a
    /// map's entries), 1 for anything else.
    pub(crate) fn size(&self) -> u64 {
        match self {
            Val::Str(s) => s.chars().count() as u64,
            Val::Bytes(b) => b.len() as u64,
            Val::List(l) => l.len() as u64,
            Val::Map(m) => m.len() as u64,
            _ => 1,
        }
    }
}

/// CEL equality: numbers compare across types, other values of different types differ.
pub(crate) fn cel_eq(a: &Val, b: &Val) -> bool {
    match (a, b) {
        (Val::Null, Val::Null) => true,
        (Val::Bool(x), Val::Bool(y)) => x == y,
        (Val::Str(x), Val::Str(y)) => x == y,
        (Val::Bytes(x), Val::Bytes(y)) => x == y,
        (Val::List(x), Val::List(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(p, q)| cel_eq(p, q))
        }
        (Val::Map(x), Val::Map(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| cel_eq(v, w)))
        }
        _ => match (num(a), num(b)) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        },
    }
}

pub(crate) fn num(v: &Val) -> Option<f64> {
    match v {
        Val::Int(i) => Some(*i as f64),
        Val::Uint(u) => Some(*u as f64),
        Val::Double(d) => Some(*d),
        _ => None,
    }
}
