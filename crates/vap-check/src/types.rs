//! CEL types: cel-go `common/types`, as far as checking needs them.

use std::collections::HashMap;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Type {
    Dyn,
    /// The type of an expression that failed to check: assignable to anything, so one
    /// mistake is reported once.
    Error,
    Null,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Duration,
    Timestamp,
    List(Box<Type>),
    Map(Box<Type>, Box<Type>),
    /// A declared object (cel-go's struct kind): its fields are declared by name.
    Object(String),
    /// An opaque type with parameters: `optional_type(T)`, and `function` during overload
    /// resolution.
    Opaque(String, Vec<Type>),
    /// The type of a type value (`int` used as a value); None for `type` itself.
    Meta(Option<Box<Type>>),
    /// A type parameter: an overload's (`A`), or a fresh one (`_var3`).
    Param(String),
}

impl fmt::Display for Type {
    /// cel-go `checker.FormatCELType`, as its error messages print types.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Dyn => write!(f, "dyn"),
            Type::Error => write!(f, "!error!"),
            Type::Null => write!(f, "null"),
            Type::Bool => write!(f, "bool"),
            Type::Int => write!(f, "int"),
            Type::Uint => write!(f, "uint"),
            Type::Double => write!(f, "double"),
            Type::String => write!(f, "string"),
            Type::Bytes => write!(f, "bytes"),
            Type::Duration => write!(f, "duration"),
            Type::Timestamp => write!(f, "timestamp"),
            Type::List(e) => write!(f, "list({e})"),
            Type::Map(k, v) => write!(f, "map({k}, {v})"),
            Type::Object(n) | Type::Param(n) => write!(f, "{n}"),
            Type::Opaque(n, ps) if ps.is_empty() => write!(f, "{n}"),
            Type::Opaque(n, ps) => {
                let ps: Vec<String> = ps.iter().map(|p| p.to_string()).collect();
                write!(f, "{n}({})", ps.join(", "))
            }
            Type::Meta(None) => write!(f, "type"),
            Type::Meta(Some(t)) => write!(f, "type({t})"),
        }
    }
}

/// cel-go `types.Type.String()`, which compile.go's "must evaluate to" messages print:
/// as `FormatCELType` but for the declared names of null, durations and timestamps.
pub(crate) fn type_string(t: &Type) -> String {
    match t {
        Type::Null => "null_type".into(),
        Type::Duration => "google.protobuf.Duration".into(),
        Type::Timestamp => "google.protobuf.Timestamp".into(),
        Type::List(e) => format!("list({})", type_string(e)),
        Type::Map(k, v) => format!("map({}, {})", type_string(k), type_string(v)),
        Type::Opaque(n, ps) if !ps.is_empty() => {
            let ps: Vec<String> = ps.iter().map(type_string).collect();
            format!("{n}({})", ps.join(", "))
        }
        other => other.to_string(),
    }
}

pub(crate) fn optional_of(t: Type) -> Type {
    Type::Opaque("optional_type".into(), vec![t])
}

pub(crate) fn unwrap_optional(t: &Type) -> (Type, bool) {
    match t {
        Type::Opaque(n, ps) if n == "optional_type" && ps.len() == 1 => (ps[0].clone(), true),
        _ => (t.clone(), false),
    }
}

pub(crate) fn list_of(t: Type) -> Type {
    Type::List(Box::new(t))
}

pub(crate) fn map_of(k: Type, v: Type) -> Type {
    Type::Map(Box::new(k), Box::new(v))
}

/// The type parameters of the function table's signatures: one capital letter.
pub(crate) fn parse_type(s: &str) -> Type {
    let s = s.trim();
    if let Some(open) = s.find('(') {
        let name = &s[..open];
        let args: Vec<Type> = split_top(&s[open + 1..s.len() - 1], ',')
            .into_iter()
            .map(parse_type)
            .collect();
        return match name {
            "list" => Type::List(Box::new(args[0].clone())),
            "map" => Type::Map(Box::new(args[0].clone()), Box::new(args[1].clone())),
            "type" => Type::Meta(Some(Box::new(args[0].clone()))),
            other => Type::Opaque(other.to_owned(), args),
        };
    }
    match s {
        "dyn" => Type::Dyn,
        "null" => Type::Null,
        "bool" => Type::Bool,
        "int" => Type::Int,
        "uint" => Type::Uint,
        "double" => Type::Double,
        "string" => Type::String,
        "bytes" => Type::Bytes,
        "duration" => Type::Duration,
        "timestamp" => Type::Timestamp,
        "type" => Type::Meta(None),
        p if p.len() == 1 && p.chars().all(|c| c.is_ascii_uppercase()) => Type::Param(p.to_owned()),
        object => Type::Object(object.to_owned()),
    }
}

/// Splits at `sep` outside parentheses.
pub(crate) fn split_top(s: &str, sep: char) -> Vec<&str> {
    let mut out = vec![];
    let (mut depth, mut start) = (0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            c if c == sep && depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !s[start..].trim().is_empty() {
        out.push(&s[start..]);
    }
    out
}

// Type unification: cel-go `checker/types.go` and `checker/mapping.go`, function by function.

/// Type parameter substitutions, keyed by parameter name. cel-go copies its mapping for
/// each assignability test and keeps the copy on success; this keeps an undo log instead
/// (the copies made checking the long messageExpressions quadratic).
#[derive(Debug, Default)]
pub(crate) struct Mapping {
    subs: HashMap<String, Type>,
    undo: Vec<(String, Option<Type>)>,
}

impl Mapping {
    pub(crate) fn get(&self, name: &str) -> Option<&Type> {
        self.subs.get(name)
    }

    pub(crate) fn insert(&mut self, name: String, t: Type) {
        let old = self.subs.insert(name.clone(), t);
        self.undo.push((name, old));
    }

    /// Keeps what the test since the last commit or rollback substituted, or undoes it.
    pub(crate) fn settle(&mut self, keep: bool) -> bool {
        if keep {
            self.undo.clear();
        } else {
            while let Some((name, old)) = self.undo.pop() {
                match old {
                    Some(t) => self.subs.insert(name, t),
                    None => self.subs.remove(&name),
                };
            }
        }
        keep
    }
}

pub(crate) fn is_dyn_or_error(t: &Type) -> bool {
    matches!(t, Type::Dyn | Type::Error)
}

/// `isEqualOrLessSpecific`.
fn is_equal_or_less_specific(t1: &Type, t2: &Type) -> bool {
    if matches!(t1, Type::Dyn | Type::Param(_)) {
        return true;
    }
    if matches!(t2, Type::Dyn | Type::Param(_)) {
        return false;
    }
    match (t1, t2) {
        (Type::Opaque(n1, p1), Type::Opaque(n2, p2)) => {
            n1 == n2
                && p1.len() == p2.len()
                && p1
                    .iter()
                    .zip(p2)
                    .all(|(a, b)| is_equal_or_less_specific(a, b))
        }
        (Type::List(a), Type::List(b)) => is_equal_or_less_specific(a, b),
        (Type::Map(k1, v1), Type::Map(k2, v2)) => {
            is_equal_or_less_specific(k1, k2) && is_equal_or_less_specific(v1, v2)
        }
        (Type::Meta(_), Type::Meta(_)) => true,
        _ => t1 == t2,
    }
}

/// `mostGeneral`.
pub(crate) fn most_general(t1: &Type, t2: &Type) -> Type {
    if is_equal_or_less_specific(t1, t2) {
        t1.clone()
    } else {
        t2.clone()
    }
}

pub(crate) fn params_of(t: &Type) -> Vec<&Type> {
    match t {
        Type::List(e) => vec![e],
        Type::Map(k, v) => vec![k, v],
        Type::Opaque(_, ps) => ps.iter().collect(),
        Type::Meta(Some(t)) => vec![t],
        _ => vec![],
    }
}

/// `notReferencedIn`: the occurs check.
fn not_referenced_in(m: &Mapping, t: &Type, within: &Type) -> bool {
    if t == within {
        return false;
    }
    match within {
        Type::Param(n) => match m.get(n) {
            None => true,
            Some(sub) => not_referenced_in(m, t, sub),
        },
        _ => params_of(within)
            .into_iter()
            .all(|p| not_referenced_in(m, t, p)),
    }
}

/// `isValidTypeSubstitution`: (valid, t2 had a substitution).
fn is_valid_type_substitution(m: &mut Mapping, t1: &Type, t2: &Type) -> (bool, bool) {
    if t1 == t2 {
        return (true, true);
    }
    let Type::Param(name) = t2 else {
        return (false, false);
    };
    if let Some(t2_sub) = m.get(name).cloned() {
        if *t1 == t2_sub {
            return (true, true);
        }
        if internal_is_assignable(m, t1, &t2_sub) {
            let t2_new = most_general(t1, &t2_sub);
            if not_referenced_in(m, t2, &t2_new) {
                m.insert(name.clone(), t2_new);
            }
            return (true, true);
        }
        return (false, true);
    }
    if not_referenced_in(m, t2, t1) {
        m.insert(name.clone(), t1.clone());
        return (true, false);
    }
    (false, false)
}

/// `internalIsAssignable`: whether t1 is assignable to t2.
pub(crate) fn internal_is_assignable(m: &mut Mapping, t1: &Type, t2: &Type) -> bool {
    if let Type::Param(_) = t2 {
        let (valid, has_sub) = is_valid_type_substitution(m, t1, t2);
        if valid {
            return true;
        }
        if has_sub {
            return false;
        }
    }
    if let Type::Param(_) = t1 {
        return is_valid_type_substitution(m, t2, t1).0;
    }
    if is_dyn_or_error(t1) || is_dyn_or_error(t2) {
        return true;
    }
    // The legacy checker's nullness: null goes where an object, opaque, duration or
    // timestamp goes (`internalIsAssignableNull`).
    let nullable = |t: &Type| {
        matches!(
            t,
            Type::Null | Type::Opaque(..) | Type::Object(_) | Type::Duration | Type::Timestamp
        )
    };
    if *t1 == Type::Null {
        return nullable(t2);
    }
    if *t2 == Type::Null {
        return nullable(t1);
    }
    match (t1, t2) {
        (Type::Meta(_), t2) => matches!(t2, Type::Meta(_)),
        (Type::List(a), Type::List(b)) => internal_is_assignable(m, a, b),
        (Type::Map(k1, v1), Type::Map(k2, v2)) => {
            internal_is_assignable(m, k1, k2) && internal_is_assignable(m, v1, v2)
        }
        (Type::Opaque(n1, p1), Type::Opaque(n2, p2)) => {
            n1 == n2 && internal_is_assignable_list(m, p1, p2)
        }
        // Primitives, durations, timestamps and objects: the same type.
        _ => t1 == t2,
    }
}

pub(crate) fn internal_is_assignable_list(m: &mut Mapping, l1: &[Type], l2: &[Type]) -> bool {
    l1.len() == l2.len()
        && l1
            .iter()
            .zip(l2)
            .all(|(a, b)| internal_is_assignable(m, a, b))
}

/// `substitute`: bound parameters replaced; unbound ones by dyn when `to_dyn`.
pub(crate) fn substitute(m: &Mapping, t: &Type, to_dyn: bool) -> Type {
    match t {
        Type::Param(n) => match m.get(n) {
            Some(sub) => substitute(m, sub, to_dyn),
            None if to_dyn => Type::Dyn,
            None => t.clone(),
        },
        Type::List(e) => Type::List(Box::new(substitute(m, e, to_dyn))),
        Type::Map(k, v) => Type::Map(
            Box::new(substitute(m, k, to_dyn)),
            Box::new(substitute(m, v, to_dyn)),
        ),
        Type::Opaque(n, ps) => Type::Opaque(
            n.clone(),
            ps.iter().map(|p| substitute(m, p, to_dyn)).collect(),
        ),
        Type::Meta(Some(x)) => Type::Meta(Some(Box::new(substitute(m, x, to_dyn)))),
        _ => t.clone(),
    }
}
