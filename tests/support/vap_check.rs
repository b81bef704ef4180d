//! What a kube-apiserver checks when a ValidatingAdmissionPolicy and its binding are
//! created, and what it spends evaluating one: a stand-in for tests, since no apiserver
//! runs where they run.
//!
//! kubectl's `--validate=strict` (tests/export_kubectl.rs) holds the objects to the OpenAPI
//! schema only. The apiserver does more before it stores a policy: the strategy's
//! validation (kubernetes/kubernetes `pkg/apis/admissionregistration/validation/validation.go`,
//! `validateValidatingAdmissionPolicySpec`) compiles every CEL expression in the
//! environment the admission plugin will run it in (k8s.io/apiserver
//! `pkg/admission/plugin/cel/compile.go` and `composition.go`, over the libraries of
//! `pkg/cel/environment/base.go`) and refuses the object on any error. This module does
//! the same, in the same order, and words its findings the way the apiserver's
//! `field.Error`s read (`spec.variables[1].name: Invalid value: "namespace": ...`).
//!
//! What it is made of:
//! - names and structure: `validateVariable`, `validateValidation`,
//!   `validateAuditAnnotation`, the match constraints and the binding, with the
//!   apimachinery name validators (DNS-1123 subdomain, qualified name, label value);
//! - a CEL type checker, a port of cel-go's `checker/checker.go` and `checker/types.go`
//!   (unification with type parameters, overload resolution, comprehension scopes) over the
//!   `cel` crate's parser (its macros expanded into comprehensions as cel-go's are), with
//!   cel-go's post-check validators Kubernetes enables (homogeneous aggregate literals,
//!   regex literals) and the parser's reserved identifiers;
//! - the declarations: the admission variables (`object`, `oldObject`, the typed `request`
//!   and `namespaceObject`, `authorizer`, `variables`) and a table of every function of the
//!   Kubernetes environment with its receiver style and signature, by the Kubernetes minor
//!   version that introduced it;
//! - a runtime cost count: an evaluator that follows cel-go's runtime cost model
//!   (`interpreter/runtimecost.go`, Kubernetes' `pkg/cel/library/cost.go`) over concrete
//!   requests, with the apiserver's per-expression limit and per-evaluation budgets.
//!
//! What it is not: cel-go itself. Known approximations are said where they are made and
//! listed in `KNOWN_GAPS`, and the unit tests at the end show each check refusing what it
//! claims to refuse.
//!
//! Include it with `#[path = "support/vap_check.rs"] mod vap_check;`.
#![allow(dead_code)]

/// What this checker knowingly does differently from a kube-apiserver.
pub const KNOWN_GAPS: &[&str] = &[
    "parsing is the `cel` crate's (built from the same cel-spec ANTLR grammar as cel-go's): \
     its escape handling and parse error texts may differ from cel-go's",
    "compile errors carry no line and column, and printed values over 160 characters are cut",
    "regex literals are compiled with the `regex` crate, whose syntax is close to RE2's",
    "not modelled: paramKind and `params`, struct literals, the duration and timestamp \
     literal validators, resourceNames' path-segment validation",
    "the optional-types library is its latest version from 1.28 on; cel-go's `existsOne` \
     macro is taken to exist at every version",
    "the cost count walks the expression, not cel-go's plan (see the cost section), and \
     evaluates only the functions the export uses",
];

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::rc::Rc;
use std::sync::{Mutex, OnceLock};

use kube_cel::cel::common::ast::{CallExpr, EntryExpr, Expr, IdedExpr, LiteralValue};
use kube_cel::cel::parser::Parser;
use regex::Regex;
use serde_json::Value;

// ---------------------------------------------------------------------------------------
// Limits, each where Kubernetes sets it.

/// k8s.io/apiserver `pkg/apis/cel/config.go` `PerCallLimit`: the runtime cost one
/// evaluation of one expression may reach (`cel.CostLimit` in `environment/base.go`).
pub const PER_CALL_LIMIT: u64 = 1_000_000;
/// `RuntimeCELCostBudget`: what one policy's evaluation may spend, per filter
/// (`policy/validating/validator.go`: validations, then messageExpressions with what the
/// validations left, and auditAnnotations with a budget of their own).
pub const RUNTIME_CEL_COST_BUDGET: u64 = 10_000_000;
/// `MaxEvaluatedMessageExpressionSizeBytes`: a longer messageExpression result is dropped
/// (`validator.go`: "excessively long message denied") and `message` is used instead.
pub const MAX_EVALUATED_MESSAGE_BYTES: usize = 5 * 1024;
/// validation.go `maxAuditAnnotations`.
const MAX_AUDIT_ANNOTATIONS: usize = 20;
/// validation.go `maxAuditAnnotationValueExpressionLength`, on the trimmed expression.
const MAX_AUDIT_ANNOTATION_VALUE_EXPRESSION_LENGTH: usize = 5 * 1024;
/// validation.go `validateMatchConditions`.
const MAX_MATCH_CONDITIONS: usize = 64;
/// cel-go's default `ExpressionSizeCodePointLimit` (`cel/options.go`), which Kubernetes
/// keeps.
const EXPRESSION_SIZE_CODE_POINT_LIMIT: usize = 100_000;
/// cel-go's default parser recursion limit (`parser/options.go` `maxRecursionDepth`); the
/// `cel` crate's own default (96) is lower and would refuse what cel-go parses.
const PARSER_RECURSION_LIMIT: u16 = 250;

// ---------------------------------------------------------------------------------------
// Field errors: apimachinery's `field.Error`, printed as `Error()` prints it.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    Required,
    Invalid,
    NotSupported,
    Duplicate,
    Forbidden,
    TooMany,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub kind: ErrorType,
    pub value: String,
    pub detail: String,
}

/// Values longer than this are cut when printed: a whole messageExpression in every
/// finding would bury the finding. (The apiserver prints the whole value.)
const PRINTED_VALUE_LIMIT: usize = 160;

fn quoted(value: &str) -> String {
    let cut: String = value.chars().take(PRINTED_VALUE_LIMIT).collect();
    let json = serde_json::to_string(&cut).unwrap_or_default();
    if cut.len() < value.len() {
        format!("{}...\" ({} bytes)", &json[..json.len() - 1], value.len())
    } else {
        json
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.field)?;
        match self.kind {
            ErrorType::Required if self.detail.is_empty() => write!(f, "Required value"),
            ErrorType::Required => write!(f, "Required value: {}", self.detail),
            ErrorType::Invalid => {
                write!(f, "Invalid value: {}: {}", quoted(&self.value), self.detail)
            }
            ErrorType::NotSupported => {
                write!(
                    f,
                    "Unsupported value: {}: {}",
                    quoted(&self.value),
                    self.detail
                )
            }
            ErrorType::Duplicate => write!(f, "Duplicate value: {}", quoted(&self.value)),
            ErrorType::Forbidden => write!(f, "Forbidden: {}", self.detail),
            ErrorType::TooMany => write!(f, "Too many: {}: {}", self.value, self.detail),
        }
    }
}

fn required(field: &str, detail: &str) -> FieldError {
    FieldError {
        field: field.to_owned(),
        kind: ErrorType::Required,
        value: String::new(),
        detail: detail.to_owned(),
    }
}

fn invalid(field: &str, value: &str, detail: &str) -> FieldError {
    FieldError {
        field: field.to_owned(),
        kind: ErrorType::Invalid,
        value: value.to_owned(),
        detail: detail.to_owned(),
    }
}

fn not_supported(field: &str, value: &str, supported: &[&str]) -> FieldError {
    let list: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
    FieldError {
        field: field.to_owned(),
        kind: ErrorType::NotSupported,
        value: value.to_owned(),
        detail: format!("supported values: {}", list.join(", ")),
    }
}

fn duplicate(field: &str, value: &str) -> FieldError {
    FieldError {
        field: field.to_owned(),
        kind: ErrorType::Duplicate,
        value: value.to_owned(),
        detail: String::new(),
    }
}

fn forbidden(field: &str, detail: &str) -> FieldError {
    FieldError {
        field: field.to_owned(),
        kind: ErrorType::Forbidden,
        value: String::new(),
        detail: detail.to_owned(),
    }
}

// ---------------------------------------------------------------------------------------
// Names: k8s.io/apimachinery `pkg/util/validation/validation.go`.

fn regex(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("a valid pattern"))
}

/// `IsDNS1123Subdomain`: object names (`NameIsDNSSubdomain`), the binding's policyName,
/// a qualified name's prefix.
fn dns1123_subdomain_errors(s: &str) -> Vec<String> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let mut errs = vec![];
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".to_owned());
    }
    if !regex(
        &RE,
        r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    )
    .is_match(s)
    {
        errs.push(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
             '-' or '.', and must start and end with an alphanumeric character"
                .to_owned(),
        );
    }
    errs
}

/// `IsQualifiedName`: label keys, and a policy's name joined to an audit annotation key.
fn qualified_name_errors(s: &str) -> Vec<String> {
    static NAME: OnceLock<Regex> = OnceLock::new();
    let parts: Vec<&str> = s.split('/').collect();
    let (prefix, name) = match parts.as_slice() {
        [name] => (None, *name),
        [prefix, name] => (Some(*prefix), *name),
        _ => {
            return vec![
                "a qualified name must consist of alphanumeric characters, '-', '_' or '.', \
                 and must start and end with an alphanumeric character with an optional DNS \
                 subdomain prefix and '/'"
                    .to_owned(),
            ]
        }
    };
    let mut errs = vec![];
    if let Some(p) = prefix {
        if p.is_empty() {
            errs.push("prefix part must be non-empty".to_owned());
        } else {
            errs.extend(
                dns1123_subdomain_errors(p)
                    .into_iter()
                    .map(|e| format!("prefix part {e}")),
            );
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_owned());
    }
    if !name.is_empty()
        && !regex(&NAME, r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$").is_match(name)
    {
        errs.push(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must \
             start and end with an alphanumeric character"
                .to_owned(),
        );
    }
    errs
}

/// `IsValidLabelValue`.
fn label_value_errors(s: &str) -> Vec<String> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let mut errs = vec![];
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_owned());
    }
    if !regex(&RE, r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$").is_match(s) {
        errs.push(
            "a valid label must be an empty string or consist of alphanumeric characters, \
             '-', '_' or '.', and must start and end with an alphanumeric character"
                .to_owned(),
        );
    }
    errs
}

/// CEL's reserved words: validation.go `celReserved` (the names a variable may not have),
/// which are also cel-go's `parser.reservedIds` (identifiers an expression may not use).
pub const CEL_RESERVED: [&str; 21] = [
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// validation.go `isCELIdentifier`: `^[_a-zA-Z][_a-zA-Z0-9]*$` and not reserved.
pub fn is_cel_identifier(name: &str) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    regex(&RE, r"^[_a-zA-Z][_a-zA-Z0-9]*$").is_match(name) && !CEL_RESERVED.contains(&name)
}

// ---------------------------------------------------------------------------------------
// CEL types: cel-go `common/types`, as far as checking needs them.

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
fn type_string(t: &Type) -> String {
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

fn optional_of(t: Type) -> Type {
    Type::Opaque("optional_type".into(), vec![t])
}

fn unwrap_optional(t: &Type) -> (Type, bool) {
    match t {
        Type::Opaque(n, ps) if n == "optional_type" && ps.len() == 1 => (ps[0].clone(), true),
        _ => (t.clone(), false),
    }
}

/// The type parameters of the function table's signatures: one capital letter.
fn parse_type(s: &str) -> Type {
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
fn split_top(s: &str, sep: char) -> Vec<&str> {
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
struct Mapping {
    subs: HashMap<String, Type>,
    undo: Vec<(String, Option<Type>)>,
}

impl Mapping {
    fn get(&self, name: &str) -> Option<&Type> {
        self.subs.get(name)
    }

    fn insert(&mut self, name: String, t: Type) {
        let old = self.subs.insert(name.clone(), t);
        self.undo.push((name, old));
    }

    /// Keeps what the test since the last commit or rollback substituted, or undoes it.
    fn settle(&mut self, keep: bool) -> bool {
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

fn is_dyn_or_error(t: &Type) -> bool {
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
fn most_general(t1: &Type, t2: &Type) -> Type {
    if is_equal_or_less_specific(t1, t2) {
        t1.clone()
    } else {
        t2.clone()
    }
}

fn params_of(t: &Type) -> Vec<&Type> {
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
fn internal_is_assignable(m: &mut Mapping, t1: &Type, t2: &Type) -> bool {
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

fn internal_is_assignable_list(m: &mut Mapping, l1: &[Type], l2: &[Type]) -> bool {
    l1.len() == l2.len()
        && l1
            .iter()
            .zip(l2)
            .all(|(a, b)| internal_is_assignable(m, a, b))
}

/// `substitute`: bound parameters replaced; unbound ones by dyn when `to_dyn`.
fn substitute(m: &Mapping, t: &Type, to_dyn: bool) -> Type {
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

// ---------------------------------------------------------------------------------------
// The functions of Kubernetes' CEL environment (k8s.io/apiserver
// `pkg/cel/environment/base.go` `baseOpts`), by the minor version each arrived in: a call
// is checked against these overloads, and a name that is not here is an undeclared
// reference, as in cel-go.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    /// `f(x, y)`.
    Global,
    /// `x.f(y)`: the receiver is the first parameter.
    Member,
}
use Style::{Global as G, Member as M};

/// (since Kubernetes 1.x, name, style, `params -> result`). Type parameters are capital
/// letters; `kubernetes.*` and `net.*` are the Kubernetes libraries' object types.
const FUNCTIONS: &[(u32, &str, Style, &str)] = &[
    // cel-go `common/stdlib/standard.go` (operators, conversions, strings, time).
    (0, "_?_:_", G, "bool, A, A -> A"),
    (0, "_&&_", G, "bool, bool -> bool"),
    (0, "_||_", G, "bool, bool -> bool"),
    (0, "!_", G, "bool -> bool"),
    (0, "@not_strictly_false", G, "bool -> bool"),
    (0, "_==_", G, "A, A -> bool"),
    (0, "_!=_", G, "A, A -> bool"),
    (0, "_+_", G, "bytes, bytes -> bytes"),
    (0, "_+_", G, "double, double -> double"),
    (0, "_+_", G, "duration, duration -> duration"),
    (0, "_+_", G, "duration, timestamp -> timestamp"),
    (0, "_+_", G, "timestamp, duration -> timestamp"),
    (0, "_+_", G, "int, int -> int"),
    (0, "_+_", G, "list(A), list(A) -> list(A)"),
    (0, "_+_", G, "string, string -> string"),
    (0, "_+_", G, "uint, uint -> uint"),
    (0, "_/_", G, "double, double -> double"),
    (0, "_/_", G, "int, int -> int"),
    (0, "_/_", G, "uint, uint -> uint"),
    (0, "_%_", G, "int, int -> int"),
    (0, "_%_", G, "uint, uint -> uint"),
    (0, "_*_", G, "double, double -> double"),
    (0, "_*_", G, "int, int -> int"),
    (0, "_*_", G, "uint, uint -> uint"),
    (0, "-_", G, "double -> double"),
    (0, "-_", G, "int -> int"),
    (0, "_-_", G, "double, double -> double"),
    (0, "_-_", G, "duration, duration -> duration"),
    (0, "_-_", G, "int, int -> int"),
    (0, "_-_", G, "timestamp, duration -> timestamp"),
    (0, "_-_", G, "timestamp, timestamp -> duration"),
    (0, "_-_", G, "uint, uint -> uint"),
    // _<_, _<=_, _>_, _>=_: RELATIONS below.
    (0, "_[_]", G, "list(A), int -> A"),
    (0, "_[_]", G, "map(A, B), A -> B"),
    (0, "@in", G, "A, list(A) -> bool"),
    (0, "@in", G, "A, map(A, B) -> bool"),
    (0, "size", G, "bytes -> int"),
    (0, "size", M, "bytes -> int"),
    (0, "size", G, "list(A) -> int"),
    (0, "size", M, "list(A) -> int"),
    (0, "size", G, "map(A, B) -> int"),
    (0, "size", M, "map(A, B) -> int"),
    (0, "size", G, "string -> int"),
    (0, "size", M, "string -> int"),
    (0, "type", G, "A -> type(A)"),
    (0, "bool", G, "bool -> bool"),
    (0, "bool", G, "string -> bool"),
    (0, "bytes", G, "bytes -> bytes"),
    (0, "bytes", G, "string -> bytes"),
    (0, "double", G, "double -> double"),
    (0, "double", G, "int -> double"),
    (0, "double", G, "string -> double"),
    (0, "double", G, "uint -> double"),
    (0, "duration", G, "duration -> duration"),
    (0, "duration", G, "string -> duration"),
    (0, "dyn", G, "A -> dyn"),
    (0, "int", G, "int -> int"),
    (0, "int", G, "double -> int"),
    (0, "int", G, "duration -> int"),
    (0, "int", G, "string -> int"),
    (0, "int", G, "timestamp -> int"),
    (0, "int", G, "uint -> int"),
    (0, "string", G, "string -> string"),
    (0, "string", G, "bool -> string"),
    (0, "string", G, "bytes -> string"),
    (0, "string", G, "double -> string"),
    (0, "string", G, "duration -> string"),
    (0, "string", G, "int -> string"),
    (0, "string", G, "timestamp -> string"),
    (0, "string", G, "uint -> string"),
    (0, "timestamp", G, "timestamp -> timestamp"),
    (0, "timestamp", G, "int -> timestamp"),
    (0, "timestamp", G, "string -> timestamp"),
    (0, "uint", G, "uint -> uint"),
    (0, "uint", G, "double -> uint"),
    (0, "uint", G, "int -> uint"),
    (0, "uint", G, "string -> uint"),
    (0, "contains", M, "string, string -> bool"),
    (0, "endsWith", M, "string, string -> bool"),
    (0, "startsWith", M, "string, string -> bool"),
    (0, "matches", G, "string, string -> bool"),
    (0, "matches", M, "string, string -> bool"),
    // getFullYear ... getMilliseconds: TIME below.
    // cel-go `ext/strings.go`: version 0 from 1.0, version 2 (format, strings.quote, join)
    // from 1.29.
    (0, "charAt", M, "string, int -> string"),
    (0, "indexOf", M, "string, string -> int"),
    (0, "indexOf", M, "string, string, int -> int"),
    (0, "lastIndexOf", M, "string, string -> int"),
    (0, "lastIndexOf", M, "string, string, int -> int"),
    (0, "lowerAscii", M, "string -> string"),
    (0, "replace", M, "string, string, string -> string"),
    (0, "replace", M, "string, string, string, int -> string"),
    (0, "split", M, "string, string -> list(string)"),
    (0, "split", M, "string, string, int -> list(string)"),
    (0, "substring", M, "string, int -> string"),
    (0, "substring", M, "string, int, int -> string"),
    (0, "trim", M, "string -> string"),
    (0, "upperAscii", M, "string -> string"),
    (29, "format", M, "string, list(dyn) -> string"),
    (29, "strings.quote", G, "string -> string"),
    (29, "join", M, "list(string) -> string"),
    (29, "join", M, "list(string), string -> string"),
    // k8s.io/apiserver `pkg/cel/library/lists.go` (isSorted, sum, min, max: LISTS below).
    (0, "indexOf", M, "list(A), A -> int"),
    (0, "lastIndexOf", M, "list(A), A -> int"),
    (37, "includes", M, "dyn, dyn -> bool"),
    // `library/regex.go`.
    (0, "find", M, "string, string -> string"),
    (0, "findAll", M, "string, string -> list(string)"),
    (0, "findAll", M, "string, string, int -> list(string)"),
    // `library/urls.go`.
    (0, "url", G, "string -> kubernetes.URL"),
    (0, "isURL", G, "string -> bool"),
    (0, "getScheme", M, "kubernetes.URL -> string"),
    (0, "getHost", M, "kubernetes.URL -> string"),
    (0, "getHostname", M, "kubernetes.URL -> string"),
    (0, "getPort", M, "kubernetes.URL -> string"),
    (0, "getEscapedPath", M, "kubernetes.URL -> string"),
    (0, "getQuery", M, "kubernetes.URL -> map(string, list(string))"),
    // `library/authz.go` (1.27) and its selectors (1.31).
    (27, "path", M, "kubernetes.authorization.Authorizer, string -> kubernetes.authorization.PathCheck"),
    (27, "group", M, "kubernetes.authorization.Authorizer, string -> kubernetes.authorization.GroupCheck"),
    (27, "serviceAccount", M, "kubernetes.authorization.Authorizer, string, string -> kubernetes.authorization.Authorizer"),
    (27, "resource", M, "kubernetes.authorization.GroupCheck, string -> kubernetes.authorization.ResourceCheck"),
    (27, "subresource", M, "kubernetes.authorization.ResourceCheck, string -> kubernetes.authorization.ResourceCheck"),
    (27, "namespace", M, "kubernetes.authorization.ResourceCheck, string -> kubernetes.authorization.ResourceCheck"),
    (27, "name", M, "kubernetes.authorization.ResourceCheck, string -> kubernetes.authorization.ResourceCheck"),
    (27, "check", M, "kubernetes.authorization.PathCheck, string -> kubernetes.authorization.Decision"),
    (27, "check", M, "kubernetes.authorization.ResourceCheck, string -> kubernetes.authorization.Decision"),
    (27, "errored", M, "kubernetes.authorization.Decision -> bool"),
    (27, "error", M, "kubernetes.authorization.Decision -> string"),
    (27, "allowed", M, "kubernetes.authorization.Decision -> bool"),
    (27, "reason", M, "kubernetes.authorization.Decision -> string"),
    (31, "fieldSelector", M, "kubernetes.authorization.ResourceCheck, string -> kubernetes.authorization.ResourceCheck"),
    (31, "labelSelector", M, "kubernetes.authorization.ResourceCheck, string -> kubernetes.authorization.ResourceCheck"),
    // `library/quantity.go` (1.28). `sign` is declared global there.
    (28, "quantity", G, "string -> kubernetes.Quantity"),
    (28, "isQuantity", G, "string -> bool"),
    (28, "sign", G, "kubernetes.Quantity -> int"),
    (28, "isGreaterThan", M, "kubernetes.Quantity, kubernetes.Quantity -> bool"),
    (28, "isLessThan", M, "kubernetes.Quantity, kubernetes.Quantity -> bool"),
    (28, "compareTo", M, "kubernetes.Quantity, kubernetes.Quantity -> int"),
    (28, "asApproximateFloat", M, "kubernetes.Quantity -> double"),
    (28, "asInteger", M, "kubernetes.Quantity -> int"),
    (28, "isInteger", M, "kubernetes.Quantity -> bool"),
    (28, "add", M, "kubernetes.Quantity, kubernetes.Quantity -> kubernetes.Quantity"),
    (28, "add", M, "kubernetes.Quantity, int -> kubernetes.Quantity"),
    (28, "sub", M, "kubernetes.Quantity, kubernetes.Quantity -> kubernetes.Quantity"),
    (28, "sub", M, "kubernetes.Quantity, int -> kubernetes.Quantity"),
    // cel-go `ext/sets.go` (1.29).
    (29, "sets.contains", G, "list(A), list(A) -> bool"),
    (29, "sets.equivalent", G, "list(A), list(A) -> bool"),
    (29, "sets.intersects", G, "list(A), list(A) -> bool"),
    // `library/ip.go` and `library/cidr.go` (1.30).
    (30, "ip", G, "string -> net.IP"),
    (30, "isIP", G, "string -> bool"),
    (30, "ip.isCanonical", G, "string -> bool"),
    (30, "family", M, "net.IP -> int"),
    (30, "isUnspecified", M, "net.IP -> bool"),
    (30, "isLoopback", M, "net.IP -> bool"),
    (30, "isLinkLocalMulticast", M, "net.IP -> bool"),
    (30, "isLinkLocalUnicast", M, "net.IP -> bool"),
    (30, "isGlobalUnicast", M, "net.IP -> bool"),
    (30, "string", G, "net.IP -> string"),
    (30, "cidr", G, "string -> net.CIDR"),
    (30, "isCIDR", G, "string -> bool"),
    (30, "containsIP", M, "net.CIDR, string -> bool"),
    (30, "containsIP", M, "net.CIDR, net.IP -> bool"),
    (30, "containsCIDR", M, "net.CIDR, string -> bool"),
    (30, "containsCIDR", M, "net.CIDR, net.CIDR -> bool"),
    (30, "ip", M, "net.CIDR -> net.IP"),
    (30, "prefixLength", M, "net.CIDR -> int"),
    (30, "masked", M, "net.CIDR -> net.CIDR"),
    (30, "string", G, "net.CIDR -> string"),
    // `library/format.go` (1.31): format.<name>() below, FORMATS.
    (31, "validate", M, "kubernetes.NamedFormat, string -> optional_type(list(string))"),
    (31, "format.named", G, "string -> optional_type(kubernetes.NamedFormat)"),
    // cel-go `ext/comprehensions.go` (1.32): the macros are in MACROS.
    (32, "cel.@mapInsert", G, "map(K, V), K, V -> map(K, V)"),
    (32, "cel.@mapInsert", G, "map(K, V), map(K, V) -> map(K, V)"),
    // `library/semverlib.go` version 1 (1.33).
    (33, "semver", G, "string -> kubernetes.Semver"),
    (33, "semver", G, "string, bool -> kubernetes.Semver"),
    (33, "isSemver", G, "string -> bool"),
    (33, "isSemver", G, "string, bool -> bool"),
    (33, "isGreaterThan", M, "kubernetes.Semver, kubernetes.Semver -> bool"),
    (33, "isLessThan", M, "kubernetes.Semver, kubernetes.Semver -> bool"),
    (33, "compareTo", M, "kubernetes.Semver, kubernetes.Semver -> int"),
    (33, "major", M, "kubernetes.Semver -> int"),
    (33, "minor", M, "kubernetes.Semver -> int"),
    (33, "patch", M, "kubernetes.Semver -> int"),
    // cel-go `ext/lists.go` version 3 (1.34) (sort, @sortByAssociatedKeys: LISTS below).
    (34, "slice", M, "list(A), int, int -> list(A)"),
    (34, "flatten", M, "list(list(A)) -> list(A)"),
    (34, "flatten", M, "list(dyn), int -> list(dyn)"),
    (34, "lists.range", G, "int -> list(int)"),
    (34, "reverse", M, "list(A) -> list(A)"),
    (34, "distinct", M, "list(A) -> list(A)"),
    // cel-go `cel/library.go` optional types (1.28, `cel.OptionalTypes()` at its latest
    // version).
    (28, "optional.of", G, "V -> optional_type(V)"),
    (28, "optional.ofNonZeroValue", G, "V -> optional_type(V)"),
    (28, "optional.none", G, " -> optional_type(V)"),
    (28, "value", M, "optional_type(V) -> V"),
    (28, "hasValue", M, "optional_type(V) -> bool"),
    (28, "or", M, "optional_type(V), optional_type(V) -> optional_type(V)"),
    (28, "orValue", M, "optional_type(V), V -> V"),
    (28, "_?._", G, "dyn, string -> optional_type(V)"),
    (28, "_[?_]", G, "list(V), int -> optional_type(V)"),
    (28, "_[?_]", G, "optional_type(list(V)), int -> optional_type(V)"),
    (28, "_[?_]", G, "map(K, V), K -> optional_type(V)"),
    (28, "_[?_]", G, "optional_type(map(K, V)), K -> optional_type(V)"),
    (28, "_[_]", G, "optional_type(list(V)), int -> optional_type(V)"),
    (28, "_[_]", G, "optional_type(map(K, V)), K -> optional_type(V)"),
    (28, "first", M, "list(V) -> optional_type(V)"),
    (28, "last", M, "list(V) -> optional_type(V)"),
    (28, "optional.unwrap", G, "list(optional_type(V)) -> list(V)"),
    (28, "unwrapOpt", M, "list(optional_type(V)) -> list(V)"),
];

/// The relations, one overload per pair (standard.go); the mixed numeric ones only with
/// `cel.CrossTypeNumericComparisons(true)` (base.go, 1.28).
const RELATIONS: [&str; 4] = ["_<_", "_<=_", "_>_", "_>=_"];
const RELATION_PAIRS: [(&str, &str, u32); 13] = [
    ("bool", "bool", 0),
    ("int", "int", 0),
    ("int", "double", 28),
    ("int", "uint", 28),
    ("uint", "uint", 0),
    ("uint", "double", 28),
    ("uint", "int", 28),
    ("double", "double", 0),
    ("double", "int", 28),
    ("double", "uint", 28),
    ("string", "string", 0),
    ("bytes", "bytes", 0),
    ("timestamp", "timestamp", 0),
];
/// `duration < duration` too.
const RELATION_DURATION: (&str, &str, u32) = ("duration", "duration", 0);

/// standard.go's timestamp accessors: `t.f()`, `t.f(tz)`, and for the last four `d.f()`.
const TIME: [&str; 10] = [
    "getFullYear",
    "getMonth",
    "getDayOfYear",
    "getDayOfMonth",
    "getDate",
    "getDayOfWeek",
    "getHours",
    "getMinutes",
    "getSeconds",
    "getMilliseconds",
];

/// `library/lists.go`'s templated overloads, and ext/lists.go's sort (1.34).
const COMPARABLE: [&str; 8] = [
    "int",
    "uint",
    "double",
    "bool",
    "duration",
    "timestamp",
    "string",
    "bytes",
];
const SUMMABLE: [&str; 4] = ["int", "uint", "double", "duration"];

/// `library/format.go` `ConstantFormats`: `format.<name>()`.
const FORMATS: [&str; 13] = [
    "dns1123Label",
    "dns1123Subdomain",
    "dns1035Label",
    "qualifiedName",
    "dns1123LabelPrefix",
    "dns1123SubdomainPrefix",
    "dns1035LabelPrefix",
    "labelValue",
    "uri",
    "uuid",
    "byte",
    "date",
    "datetime",
];

/// Receiver macros the `cel` crate's parser leaves as calls (it expands `has`, and the
/// two-argument `all`, `exists`, `exists_one`/`existsOne`, `filter` and the two- and
/// three-argument `map`, as cel-go's `parser/macro.go` does): (since, name, arguments).
const MACROS: [(u32, &str, usize); 13] = [
    // cel-go `ext/comprehensions.go` (1.32).
    (32, "all", 3),
    (32, "exists", 3),
    (32, "existsOne", 3),
    (32, "exists_one", 3),
    (32, "transformList", 3),
    (32, "transformList", 4),
    (32, "transformMap", 3),
    (32, "transformMap", 4),
    (32, "transformMapEntry", 3),
    (32, "transformMapEntry", 4),
    // cel-go `cel/library.go` (optional types, 1.28).
    (28, "optMap", 2),
    (28, "optFlatMap", 2),
    // cel-go `ext/lists.go` (1.34).
    (34, "sortBy", 2),
];

/// Type names usable as values (standard.go `stdTypes`, and the optional library's).
const TYPE_IDENTS: [(&str, &str); 11] = [
    ("bool", "bool"),
    ("bytes", "bytes"),
    ("double", "double"),
    ("int", "int"),
    ("list", "list(A)"),
    ("map", "map(A, B)"),
    ("null_type", "null"),
    ("string", "string"),
    ("type", "type"),
    ("uint", "uint"),
    ("optional_type", "optional_type(A)"),
];

#[derive(Debug, Clone)]
struct Overload {
    member: bool,
    params: Vec<Type>,
    result: Type,
}

/// The functions and macros of the environment at one Kubernetes minor version.
pub struct Library {
    pub minor: u32,
    functions: HashMap<String, Vec<Overload>>,
}

impl Library {
    /// The environment a kube-apiserver compiles a new expression in when its CEL
    /// compatibility version is 1.`minor` (`environment.NewExpressions`; an apiserver's
    /// default compatibility version is its own minor version less one, and base.go
    /// introduces nothing at 1.35 or 1.36).
    pub fn kubernetes(minor: u32) -> Library {
        let mut lib = Library {
            minor,
            functions: HashMap::new(),
        };
        for &(since, name, style, sig) in FUNCTIONS {
            lib.add(since, name, style, sig);
        }
        for op in RELATIONS {
            for (a, b, since) in RELATION_PAIRS.into_iter().chain([RELATION_DURATION]) {
                lib.add(since, op, G, &format!("{a}, {b} -> bool"));
            }
        }
        for f in TIME {
            lib.add(0, f, M, "timestamp -> int");
            lib.add(0, f, M, "timestamp, string -> int");
        }
        for f in ["getHours", "getMinutes", "getSeconds", "getMilliseconds"] {
            lib.add(0, f, M, "duration -> int");
        }
        for t in COMPARABLE {
            lib.add(0, "isSorted", M, &format!("list({t}) -> bool"));
            lib.add(0, "max", M, &format!("list({t}) -> {t}"));
            lib.add(0, "min", M, &format!("list({t}) -> {t}"));
            lib.add(34, "sort", M, &format!("list({t}) -> list({t})"));
            lib.add(
                34,
                "@sortByAssociatedKeys",
                M,
                &format!("list(A), list({t}) -> list(A)"),
            );
        }
        for t in SUMMABLE {
            lib.add(0, "sum", M, &format!("list({t}) -> {t}"));
        }
        for f in FORMATS {
            lib.add(31, &format!("format.{f}"), G, " -> kubernetes.NamedFormat");
        }
        lib
    }

    fn add(&mut self, since: u32, name: &str, style: Style, sig: &str) {
        if since > self.minor {
            return;
        }
        let (params, result) = sig.split_once("->").expect("a signature has ->");
        self.functions
            .entry(name.to_owned())
            .or_default()
            .push(Overload {
                member: style == M,
                params: split_top(params, ',').into_iter().map(parse_type).collect(),
                result: parse_type(result),
            });
    }

    fn has_function(&self, name: &str) -> bool {
        self.functions.contains_key(name)
    }

    fn has_macro(&self, name: &str, args: usize) -> bool {
        MACROS
            .iter()
            .any(|&(since, n, a)| n == name && a == args && since <= self.minor)
    }
}

// ---------------------------------------------------------------------------------------
// Declarations: the variables an admission expression sees (compile.go
// `createEnvForOpts`, composition.go `NewCompositedCompiler`).

/// The identifiers and object types one expression is compiled with.
#[derive(Debug, Clone)]
pub struct Decls {
    idents: BTreeMap<String, Type>,
    objects: BTreeMap<String, BTreeMap<String, Type>>,
}

fn fields(list: &[(&str, Type)]) -> BTreeMap<String, Type> {
    list.iter()
        .map(|(n, t)| ((*n).to_owned(), t.clone()))
        .collect()
}

fn object(name: &str) -> Type {
    Type::Object(name.to_owned())
}

fn list_of(t: Type) -> Type {
    Type::List(Box::new(t))
}

fn map_of(k: Type, v: Type) -> Type {
    Type::Map(Box::new(k), Box::new(v))
}

/// The object type of `variables`: composition.go `variablesTypeName`.
const VARIABLES_TYPE: &str = "kubernetes.variables";

impl Decls {
    /// `object`, `oldObject`, `request`, `namespaceObject`; `authorizer` and
    /// `authorizer.requestResource` when `authorizer` (every expression but a
    /// messageExpression: plugin.go `expressionOptionalVars`); `variables` with the given
    /// fields when the policy has variables (validation.go `createCompiler`: the composited
    /// compiler only then). No `params`: the export sets no paramKind.
    pub fn admission(authorizer: bool, variables: Option<&[(String, Type)]>) -> Decls {
        let s = || Type::String;
        let mut objects = BTreeMap::new();
        // compile.go `BuildRequestType`.
        let gvk = fields(&[("group", s()), ("version", s()), ("kind", s())]);
        let gvr = fields(&[("group", s()), ("version", s()), ("resource", s())]);
        objects.insert("kubernetes.GroupVersionKind".to_owned(), gvk);
        objects.insert("kubernetes.GroupVersionResource".to_owned(), gvr);
        objects.insert(
            "kubernetes.UserInfo".to_owned(),
            fields(&[
                ("username", s()),
                ("uid", s()),
                ("groups", list_of(s())),
                ("extra", map_of(s(), list_of(s()))),
            ]),
        );
        objects.insert(
            "kubernetes.AdmissionRequest".to_owned(),
            fields(&[
                ("kind", object("kubernetes.GroupVersionKind")),
                ("resource", object("kubernetes.GroupVersionResource")),
                ("subResource", s()),
                ("requestKind", object("kubernetes.GroupVersionKind")),
                ("requestResource", object("kubernetes.GroupVersionResource")),
                ("requestSubResource", s()),
                ("name", s()),
                ("namespace", s()),
                ("operation", s()),
                ("userInfo", object("kubernetes.UserInfo")),
                ("dryRun", Type::Bool),
                ("options", Type::Dyn),
            ]),
        );
        // compile.go `BuildNamespaceType`.
        objects.insert(
            "kubernetes.NamespaceSpec".to_owned(),
            fields(&[("finalizers", list_of(s()))]),
        );
        objects.insert(
            "kubernetes.NamespaceCondition".to_owned(),
            fields(&[
                ("status", s()),
                ("type", s()),
                ("lastTransitionTime", Type::Timestamp),
                ("message", s()),
                ("reason", s()),
            ]),
        );
        objects.insert(
            "kubernetes.NamespaceStatus".to_owned(),
            fields(&[
                (
                    "conditions",
                    list_of(object("kubernetes.NamespaceCondition")),
                ),
                ("phase", s()),
            ]),
        );
        objects.insert(
            "kubernetes.NamespaceMetadata".to_owned(),
            fields(&[
                ("name", s()),
                ("generateName", s()),
                ("namespace", s()),
                ("labels", map_of(s(), s())),
                ("annotations", map_of(s(), s())),
                ("UID", s()),
                ("creationTimestamp", Type::Timestamp),
                ("deletionGracePeriodSeconds", Type::Int),
                ("deletionTimestamp", Type::Timestamp),
                ("generation", Type::Int),
                ("resourceVersion", s()),
                ("finalizers", list_of(s())),
            ]),
        );
        objects.insert(
            "kubernetes.Namespace".to_owned(),
            fields(&[
                ("metadata", object("kubernetes.NamespaceMetadata")),
                ("spec", object("kubernetes.NamespaceSpec")),
                ("status", object("kubernetes.NamespaceStatus")),
            ]),
        );
        let mut idents = BTreeMap::new();
        idents.insert("object".to_owned(), Type::Dyn);
        idents.insert("oldObject".to_owned(), Type::Dyn);
        idents.insert("request".to_owned(), object("kubernetes.AdmissionRequest"));
        idents.insert("namespaceObject".to_owned(), object("kubernetes.Namespace"));
        if authorizer {
            idents.insert(
                "authorizer".to_owned(),
                object("kubernetes.authorization.Authorizer"),
            );
            idents.insert(
                "authorizer.requestResource".to_owned(),
                object("kubernetes.authorization.ResourceCheck"),
            );
        }
        if let Some(vars) = variables {
            objects.insert(
                VARIABLES_TYPE.to_owned(),
                vars.iter().map(|(n, t)| (n.clone(), t.clone())).collect(),
            );
            idents.insert("variables".to_owned(), object(VARIABLES_TYPE));
        }
        for (name, t) in TYPE_IDENTS {
            idents.insert(name.to_owned(), Type::Meta(Some(Box::new(parse_type(t)))));
        }
        Decls { idents, objects }
    }
}

/// composition.go `convertCelTypeToDeclType`: the type a variable is declared with in
/// `variables`, from its expression's output type. Objects, optionals and anything else
/// that is not a primitive, list or map become dyn.
fn declared_variable_type(t: &Type) -> Type {
    match t {
        Type::Bool
        | Type::Bytes
        | Type::Double
        | Type::Duration
        | Type::Int
        | Type::Null
        | Type::String
        | Type::Timestamp
        | Type::Uint => t.clone(),
        Type::List(e) => list_of(declared_variable_type(e)),
        Type::Map(k, v) => map_of(declared_variable_type(k), declared_variable_type(v)),
        _ => Type::Dyn,
    }
}

// ---------------------------------------------------------------------------------------
// The type checker: cel-go `checker/checker.go`.

struct Checker<'a> {
    lib: &'a Library,
    decls: &'a Decls,
    /// Comprehension scopes, innermost last.
    scopes: Vec<Vec<(String, Type)>>,
    types: HashMap<u64, Type>,
    m: Mapping,
    fresh: usize,
    errors: Vec<String>,
}

fn literal_type(l: &LiteralValue) -> Type {
    match l {
        LiteralValue::Boolean(_) => Type::Bool,
        LiteralValue::Bytes(_) => Type::Bytes,
        LiteralValue::Double(_) => Type::Double,
        LiteralValue::Int(_) => Type::Int,
        LiteralValue::Null => Type::Null,
        LiteralValue::String(_) => Type::String,
        LiteralValue::UInt(_) => Type::Uint,
    }
}

/// `a.b.c` as a name, if `e` is a chain of (non-presence-test) selects on an identifier:
/// `containers.ToQualifiedName` and the checker's `computeQualifiers`.
fn qualified_name(e: &IdedExpr) -> Option<String> {
    match &e.expr {
        Expr::Ident(n) => Some(n.clone()),
        Expr::Select(s) if !s.test => {
            qualified_name(&s.operand).map(|prefix| format!("{prefix}.{}", s.field))
        }
        _ => None,
    }
}

impl<'a> Checker<'a> {
    fn new(lib: &'a Library, decls: &'a Decls) -> Self {
        Checker {
            lib,
            decls,
            scopes: vec![],
            types: HashMap::new(),
            m: Mapping::default(),
            fresh: 0,
            errors: vec![],
        }
    }

    fn error(&mut self, msg: String) {
        self.errors.push(msg);
    }

    fn set(&mut self, e: &IdedExpr, t: Type) -> Type {
        self.types.insert(e.id, t.clone());
        t
    }

    fn type_of(&self, e: &IdedExpr) -> Type {
        self.types.get(&e.id).cloned().unwrap_or(Type::Error)
    }

    fn new_var(&mut self) -> Type {
        let t = Type::Param(format!("_var{}", self.fresh));
        self.fresh += 1;
        t
    }

    /// `isAssignable`: keeps the substitutions only if t1 goes where t2 does.
    fn assignable(&mut self, t1: &Type, t2: &Type) -> bool {
        let ok = internal_is_assignable(&mut self.m, t1, t2);
        self.m.settle(ok)
    }

    fn assignable_list(&mut self, l1: &[Type], l2: &[Type]) -> bool {
        let ok = internal_is_assignable_list(&mut self.m, l1, l2);
        self.m.settle(ok)
    }

    fn lookup_ident(&self, name: &str) -> Option<Type> {
        for scope in self.scopes.iter().rev() {
            if let Some((_, t)) = scope.iter().rev().find(|(n, _)| n == name) {
                return Some(t.clone());
            }
        }
        self.decls.idents.get(name).cloned()
    }

    fn check(&mut self, e: &IdedExpr) -> Type {
        match &e.expr {
            Expr::Literal(l) => self.set(e, literal_type(l)),
            Expr::Ident(name) => {
                // cel-go's parser refuses reserved words as identifiers (`VisitIdent`); the
                // `cel` crate's parser does not, so the check is made here.
                if CEL_RESERVED.contains(&name.as_str()) {
                    self.error(format!("reserved identifier: {name}"));
                    return self.set(e, Type::Error);
                }
                match self.lookup_ident(name) {
                    Some(t) => self.set(e, t),
                    None => {
                        self.error(format!(
                            "undeclared reference to '{name}' (in container '')"
                        ));
                        self.set(e, Type::Error)
                    }
                }
            }
            Expr::Select(s) => {
                if !s.test {
                    // A qualified identifier (`authorizer.requestResource`) before a field.
                    if let Some(q) = qualified_name(e) {
                        let first = q.split('.').next().unwrap_or_default();
                        let shadowed = self
                            .scopes
                            .iter()
                            .any(|sc| sc.iter().any(|(n, _)| n == first));
                        if !shadowed {
                            if let Some(t) = self.decls.idents.get(&q).cloned() {
                                return self.set(e, t);
                            }
                        }
                    }
                }
                let t = self.check_select_field(&s.operand, &s.field, false);
                let t = if s.test { Type::Bool } else { t };
                let t = substitute(&self.m, &t, false);
                self.set(e, t)
            }
            Expr::Call(call) => {
                let t = self.check_call(call);
                self.set(e, t)
            }
            Expr::List(list) => {
                let mut elem: Option<Type> = None;
                for (i, x) in list.elements.iter().enumerate() {
                    let mut t = self.check(x);
                    if list.optional_indices.contains(&i) {
                        let (inner, was) = unwrap_optional(&t);
                        if !was && t != Type::Dyn {
                            self.error(format!(
                                "expected type '{}' but found '{t}'",
                                optional_of(t.clone())
                            ));
                        }
                        t = inner;
                    }
                    elem = Some(self.join_types(elem, t));
                }
                let elem = match elem {
                    Some(t) => t,
                    None => self.new_var(),
                };
                self.set(e, list_of(elem))
            }
            Expr::Map(map) => {
                let (mut kt, mut vt): (Option<Type>, Option<Type>) = (None, None);
                for entry in &map.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(me) => {
                            let k = self.check(&me.key);
                            kt = Some(self.join_types(kt, k));
                            let mut v = self.check(&me.value);
                            if me.optional {
                                v = unwrap_optional(&v).0;
                            }
                            vt = Some(self.join_types(vt, v));
                        }
                        EntryExpr::StructField(_) => {
                            self.error("a struct field in a map literal".into());
                        }
                    }
                }
                let (k, v) = match (kt, vt) {
                    (Some(k), Some(v)) => (k, v),
                    _ => (self.new_var(), self.new_var()),
                };
                self.set(e, map_of(k, v))
            }
            Expr::Struct(s) => {
                // No message types can be built in the admission environment; the only
                // object types are the declared ones above, which have no constructor the
                // export could want. Refused rather than modelled.
                self.error(format!(
                    "undeclared reference to '{}' (in container '') (struct literals are not \
                     modelled by this checker)",
                    s.type_name
                ));
                self.set(e, Type::Error)
            }
            Expr::Comprehension(c) => {
                let t = self.check_comprehension(
                    &c.iter_range,
                    &c.iter_var,
                    c.iter_var2.as_deref(),
                    &c.accu_var,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                );
                self.set(e, t)
            }
            Expr::Unspecified => {
                self.error("unexpected unspecified expression".into());
                self.set(e, Type::Error)
            }
        }
    }

    /// `joinTypes` without `HomogeneousAggregateLiterals` in the checker itself: mixed
    /// elements make dyn, and the post-check validator refuses them (`homogeneous`).
    fn join_types(&mut self, previous: Option<Type>, current: Type) -> Type {
        match previous {
            None => current,
            Some(p) if self.assignable(&p, &current) => most_general(&p, &current),
            Some(_) => Type::Dyn,
        }
    }

    /// `checkSelectField`.
    fn check_select_field(&mut self, operand: &IdedExpr, field: &str, optional: bool) -> Type {
        let operand_type = self.check(operand);
        let operand_type = substitute(&self.m, &operand_type, false);
        let (target, was_optional) = unwrap_optional(&operand_type);
        let result = match &target {
            Type::Map(_, v) => (**v).clone(),
            Type::Object(name) => match self.decls.objects.get(name).and_then(|f| f.get(field)) {
                Some(t) => t.clone(),
                None => {
                    self.error(format!("undefined field '{field}'"));
                    Type::Error
                }
            },
            Type::Param(_) => {
                self.assignable(&Type::Dyn, &target);
                Type::Dyn
            }
            t if is_dyn_or_error(t) => Type::Dyn,
            t => {
                self.error(format!("type '{t}' does not support field selection"));
                Type::Dyn
            }
        };
        if was_optional || optional {
            optional_of(result)
        } else {
            result
        }
    }

    fn check_call(&mut self, call: &CallExpr) -> Type {
        let name = call.func_name.as_str();
        if name == "_?._" {
            // `checkOptSelect`.
            if call.args.len() != 2 || call.target.is_some() {
                self.error("unsupported optional field selection".into());
                return Type::Error;
            }
            let Expr::Literal(LiteralValue::String(field)) = &call.args[1].expr else {
                self.error("unsupported optional field selection".into());
                return Type::Error;
            };
            self.set(&call.args[1], Type::String);
            let t = self.check_select_field(&call.args[0], field.inner(), true);
            return substitute(&self.m, &t, false);
        }
        if let Some(target) = &call.target {
            if self.lib.has_macro(name, call.args.len()) {
                return self.check_macro(name, target, &call.args);
            }
        }
        match &call.target {
            None => {
                if CEL_RESERVED.contains(&name) {
                    self.error(format!("reserved identifier: {name}"));
                    return Type::Error;
                }
                let args: Vec<Type> = call.args.iter().map(|a| self.check(a)).collect();
                self.resolve(name, None, args)
            }
            Some(target) => {
                // A namespaced function (`sets.contains(a, b)`) rather than a receiver.
                if let Some(q) = qualified_name(target) {
                    let full = format!("{q}.{name}");
                    if self.lib.has_function(&full) {
                        let args: Vec<Type> = call.args.iter().map(|a| self.check(a)).collect();
                        return self.resolve(&full, None, args);
                    }
                }
                let args: Vec<Type> = call.args.iter().map(|a| self.check(a)).collect();
                let t = self.check(target);
                self.resolve(name, Some(t), args)
            }
        }
    }

    /// `resolveOverload`.
    fn resolve(&mut self, name: &str, target: Option<Type>, args: Vec<Type>) -> Type {
        let lib = self.lib;
        let Some(overloads) = lib.functions.get(name) else {
            self.error(format!(
                "undeclared reference to '{name}' (in container '')"
            ));
            return Type::Error;
        };
        let member = target.is_some();
        let arg_types: Vec<Type> = target.into_iter().chain(args).collect();
        let mut result: Option<Type> = None;
        for o in overloads {
            if o.member != member {
                continue;
            }
            if name == "_&&_" || name == "_||_" {
                let mut ok = true;
                for a in &arg_types {
                    if !self.assignable(a, &Type::Bool) {
                        self.error(format!("expected type 'bool' but found '{a}'"));
                        ok = false;
                    }
                }
                return if ok { Type::Bool } else { Type::Error };
            }
            let (params, res) = self.instantiate(o);
            if self.assignable_list(&arg_types, &params) {
                let r = substitute(&self.m, &res, false);
                result = Some(match result {
                    None => r,
                    Some(prev) if prev != Type::Dyn && prev != r => Type::Dyn,
                    Some(prev) => prev,
                });
            }
        }
        match result {
            Some(t) => t,
            None => {
                let shown: Vec<String> = arg_types
                    .iter()
                    .map(|t| substitute(&self.m, t, true).to_string())
                    .collect();
                let signature = if member {
                    format!("{}.({})", shown[0], shown[1..].join(", "))
                } else {
                    format!("({})", shown.join(", "))
                };
                self.error(format!(
                    "found no matching overload for '{name}' applied to '{signature}'"
                ));
                Type::Error
            }
        }
    }

    /// An overload's type with its parameters renamed to fresh variables.
    fn instantiate(&mut self, o: &Overload) -> (Vec<Type>, Type) {
        fn collect(t: &Type, out: &mut Vec<String>) {
            if let Type::Param(n) = t {
                if !out.contains(n) {
                    out.push(n.clone());
                }
            }
            for p in params_of(t) {
                collect(p, out);
            }
        }
        let mut names = vec![];
        for p in o.params.iter().chain([&o.result]) {
            collect(p, &mut names);
        }
        if names.is_empty() {
            return (o.params.clone(), o.result.clone());
        }
        let mut sub = Mapping::default();
        for n in names {
            let v = self.new_var();
            sub.insert(n, v);
        }
        (
            o.params
                .iter()
                .map(|p| substitute(&sub, p, false))
                .collect(),
            substitute(&sub, &o.result, false),
        )
    }

    /// The iteration variables' types over a range: (var, var2) as `checkComprehension`
    /// gives them.
    fn range_vars(&mut self, range: &IdedExpr, two: bool) -> (Type, Type) {
        let range_type = substitute(&self.m, &self.type_of(range), false);
        match &range_type {
            Type::List(e) if two => (Type::Int, (**e).clone()),
            Type::List(e) => ((**e).clone(), Type::Error),
            Type::Map(k, v) => ((**k).clone(), (**v).clone()),
            t if is_dyn_or_error(t) || matches!(t, Type::Param(_)) => {
                self.assignable(&Type::Dyn, &range_type);
                (Type::Dyn, Type::Dyn)
            }
            t => {
                self.error(format!(
                    "expression of type '{t}' cannot be range of a comprehension (must be \
                     list, map, or dynamic)"
                ));
                (Type::Error, Type::Error)
            }
        }
    }

    /// `checkComprehension`.
    #[allow(clippy::too_many_arguments)]
    fn check_comprehension(
        &mut self,
        range: &IdedExpr,
        var: &str,
        var2: Option<&str>,
        accu: &str,
        init: &IdedExpr,
        cond: &IdedExpr,
        step: &IdedExpr,
        result: &IdedExpr,
    ) -> Type {
        // cel-go parses a macro's variable as an identifier, which may not be reserved.
        for v in [Some(var), var2].into_iter().flatten() {
            if CEL_RESERVED.contains(&v) {
                self.error(format!("reserved identifier: {v}"));
            }
        }
        self.check(range);
        let accu_type = self.check(init);
        self.scopes.push(vec![(accu.to_owned(), accu_type.clone())]);
        let (vt, v2t) = self.range_vars(range, var2.is_some());
        let mut inner = vec![(var.to_owned(), vt)];
        if let Some(v2) = var2 {
            inner.push((v2.to_owned(), v2t));
        }
        self.scopes.push(inner);
        let c = self.check(cond);
        if !self.assignable(&Type::Bool, &c) {
            self.error(format!("expected type 'bool' but found '{c}'"));
        }
        let s = self.check(step);
        if !self.assignable(&accu_type, &s) {
            self.error(format!("expected type '{accu_type}' but found '{s}'"));
        }
        self.scopes.pop();
        let r = self.check(result);
        self.scopes.pop();
        substitute(&self.m, &r, false)
    }

    /// The macros the parser left as calls, typed as their cel-go expansions type.
    fn check_macro(&mut self, name: &str, target: &IdedExpr, args: &[IdedExpr]) -> Type {
        let ident = |e: &IdedExpr| match &e.expr {
            Expr::Ident(n) => Some(n.clone()),
            _ => None,
        };
        let (Some(v1), second) = (ident(&args[0]), args.get(1).and_then(ident)) else {
            self.error(format!("{name}: argument must be a simple name"));
            return Type::Error;
        };
        let bool_arg = |c: &mut Self, e: &IdedExpr| {
            let t = c.check(e);
            if !c.assignable(&Type::Bool, &t) {
                c.error(format!("expected type 'bool' but found '{t}'"));
            }
        };
        match name {
            "optMap" | "optFlatMap" => {
                let t = self.check(target);
                let t = substitute(&self.m, &t, false);
                let (inner, was) = unwrap_optional(&t);
                if !was && !is_dyn_or_error(&t) {
                    self.error(format!(
                        "found no matching overload for '{name}' applied to '{t}'"
                    ));
                }
                self.scopes.push(vec![(v1, inner)]);
                let r = self.check(&args[1]);
                self.scopes.pop();
                if name == "optMap" {
                    optional_of(r)
                } else {
                    r
                }
            }
            "sortBy" => {
                self.check(target);
                let (elem, _) = self.range_vars(target, false);
                self.scopes.push(vec![(v1, elem)]);
                self.check(&args[1]);
                self.scopes.pop();
                substitute(&self.m, &self.type_of(target), false)
            }
            _ => {
                let Some(v2) = second else {
                    self.error(format!("{name}: argument must be a simple name"));
                    return Type::Error;
                };
                self.check(target);
                let (t1, t2) = self.range_vars(target, true);
                self.scopes.push(vec![(v1, t1.clone()), (v2, t2)]);
                let out = match (name, args.len()) {
                    ("all" | "exists" | "existsOne" | "exists_one", _) => {
                        bool_arg(self, &args[2]);
                        Type::Bool
                    }
                    ("transformList", n) => {
                        if n == 4 {
                            bool_arg(self, &args[2]);
                        }
                        list_of(self.check(&args[n - 1]))
                    }
                    ("transformMap", n) => {
                        if n == 4 {
                            bool_arg(self, &args[2]);
                        }
                        map_of(t1, self.check(&args[n - 1]))
                    }
                    (_, n) => {
                        if n == 4 {
                            bool_arg(self, &args[2]);
                        }
                        let t = self.check(&args[n - 1]);
                        let want = map_of(self.new_var(), self.new_var());
                        if !self.assignable(&want, &t) {
                            self.error(format!("expected type '{want}' but found '{t}'"));
                        }
                        substitute(&self.m, &want, false)
                    }
                };
                self.scopes.pop();
                out
            }
        }
    }

    /// cel-go `cel/validator.go`, the validators base.go turns on: homogeneous aggregate
    /// literals (every list element, map key and map value of one type, dyn counting as a
    /// type of its own; literals inside `format` calls exempt, as ext/formatting.go
    /// registers) and, from 1.29, regex literals (`matches` with a constant pattern must
    /// compile: checked with the `regex` crate, whose syntax is close to RE2's).
    fn validate(&mut self, e: &IdedExpr, in_format: bool) {
        let final_type = |c: &Self, x: &IdedExpr| substitute(&c.m, &c.type_of(x), true);
        match &e.expr {
            Expr::List(list) if !in_format => {
                let mut first: Option<Type> = None;
                for (i, x) in list.elements.iter().enumerate() {
                    let mut t = final_type(self, x);
                    if list.optional_indices.contains(&i) {
                        t = unwrap_optional(&t).0;
                    }
                    match &first {
                        None => first = Some(t),
                        Some(f) if *f != t => {
                            self.error(format!("expected type '{f}' but found '{t}'"));
                            break;
                        }
                        _ => {}
                    }
                }
            }
            Expr::Map(map) if !in_format => {
                let mut first: Option<(Type, Type)> = None;
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        let k = final_type(self, &me.key);
                        let mut v = final_type(self, &me.value);
                        if me.optional {
                            v = unwrap_optional(&v).0;
                        }
                        match &first {
                            None => first = Some((k, v)),
                            Some((fk, fv)) => {
                                if *fk != k {
                                    self.error(format!("expected type '{fk}' but found '{k}'"));
                                }
                                if *fv != v {
                                    self.error(format!("expected type '{fv}' but found '{v}'"));
                                }
                            }
                        }
                    }
                }
            }
            Expr::Call(call) if call.func_name == "matches" && self.lib.minor >= 29 => {
                if let Some(Expr::Literal(LiteralValue::String(p))) =
                    call.args.first().map(|a| &a.expr)
                {
                    if compiled(p.inner()).is_none() {
                        self.error("invalid matches argument".into());
                    }
                }
            }
            _ => {}
        }
        let in_format = in_format || matches!(&e.expr, Expr::Call(c) if c.func_name == "format");
        for child in children(e) {
            self.validate(child, in_format);
        }
    }
}

/// An expression's direct subexpressions.
fn children(e: &IdedExpr) -> Vec<&IdedExpr> {
    match &e.expr {
        Expr::Call(c) => c.target.iter().map(|t| &**t).chain(&c.args).collect(),
        Expr::Select(s) => vec![&*s.operand],
        Expr::List(l) => l.elements.iter().collect(),
        Expr::Map(m) => m
            .entries
            .iter()
            .flat_map(|en| match &en.expr {
                EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
                EntryExpr::StructField(f) => vec![&f.value],
            })
            .collect(),
        Expr::Struct(s) => s
            .entries
            .iter()
            .flat_map(|en| match &en.expr {
                EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
                EntryExpr::StructField(f) => vec![&f.value],
            })
            .collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        _ => vec![],
    }
}

/// Each pattern compiled once for the test process and kept (leaked, so that the automaton
/// it builds lazily is kept too): the exports use the same few globs many times over.
fn compiled(pattern: &str) -> Option<&'static Regex> {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<&'static Regex>>>> = OnceLock::new();
    let mut cache = CACHE.get_or_init(Default::default).lock().unwrap();
    *cache
        .entry(pattern.to_owned())
        .or_insert_with(|| Regex::new(pattern).ok().map(|r| &*Box::leak(Box::new(r))))
}

/// `source` parsed as cel-go's parser would (optional syntax on: `cel.OptionalTypes()`),
/// once per thread: the exports repeat most expressions, and each is checked at two
/// versions and evaluated.
fn parse(source: &str) -> Result<Rc<IdedExpr>, String> {
    thread_local! {
        static PARSED: std::cell::RefCell<HashMap<String, Result<Rc<IdedExpr>, String>>> =
            Default::default();
    }
    PARSED.with(|cache| {
        cache
            .borrow_mut()
            .entry(source.to_owned())
            .or_insert_with(|| {
                Parser::new()
                    .enable_optional_syntax(true)
                    .max_recursion_depth(PARSER_RECURSION_LIMIT)
                    .parse(source)
                    .map(Rc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
    })
}

/// One expression compiled: compile.go `CompileCELExpression`.
#[derive(Debug)]
pub struct Compiled {
    pub ast: Option<Rc<IdedExpr>>,
    /// The output type, unbound type parameters made dyn (`ast.OutputType()`).
    pub output: Option<Type>,
    /// The apiserver's `Detail` for the field error, if the expression is refused.
    pub error: Option<String>,
}

/// Parses and checks `source`; then the output type must be exactly one of `returns`
/// (`ast.OutputType().IsExactType(returnType)`: dyn is not bool), or anything when
/// `returns` is None (a variable's `ReturnTypes()` is `cel.AnyType`).
pub fn compile(lib: &Library, decls: &Decls, source: &str, returns: Option<&[Type]>) -> Compiled {
    let failed = |msg: String| Compiled {
        ast: None,
        output: None,
        error: Some(format!("compilation failed: {msg}")),
    };
    let size = source.chars().count();
    if size > EXPRESSION_SIZE_CODE_POINT_LIMIT {
        return failed(format!(
            "ERROR: <input>:-1:0: expression code point size exceeds limit: size: {size}, \
             limit {EXPRESSION_SIZE_CODE_POINT_LIMIT}"
        ));
    }
    let ast = match parse(source) {
        Ok(ast) => ast,
        Err(e) => return failed(e),
    };
    let mut c = Checker::new(lib, decls);
    let t = c.check(&ast);
    c.validate(&ast, false);
    if !c.errors.is_empty() {
        let msgs: Vec<String> = c
            .errors
            .iter()
            .map(|m| format!("ERROR: <input>: {m}"))
            .collect();
        return failed(msgs.join("\n"));
    }
    let output = substitute(&c.m, &t, true);
    if let Some(returns) = returns {
        if !returns.contains(&output) {
            let got = type_string(&output);
            let error = if returns.len() == 1 {
                format!(
                    "must evaluate to {} but got {got}",
                    type_string(&returns[0])
                )
            } else {
                let names: Vec<String> = returns.iter().map(type_string).collect();
                format!(
                    "must evaluate to one of [{}] but got {got}",
                    names.join(" ")
                )
            };
            return Compiled {
                ast: Some(ast),
                output: Some(output),
                error: Some(error),
            };
        }
    }
    Compiled {
        ast: Some(ast),
        output: Some(output),
        error: None,
    }
}

// ---------------------------------------------------------------------------------------
// The objects: validation.go's checks of a ValidatingAdmissionPolicy and its binding,
// after the v1 defaults (`pkg/apis/admissionregistration/v1/defaults.go`: failurePolicy
// Fail, matchPolicy Equivalent, empty namespace and object selectors, rule scope "*").

fn str_at<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    v.get(key).and_then(Value::as_str)
}

fn list_at<'v>(v: &'v Value, key: &str) -> &'v [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn has_line_breaks(s: &str) -> bool {
    s.contains(['\n', '\r'])
}

/// A ValidatingAdmissionPolicy as the apiserver takes it, and what it would compile.
pub struct PolicyCheck {
    pub errors: Vec<FieldError>,
    /// Each variable's name and the type `variables.<name>` has for later expressions.
    pub variables: Vec<(String, Type)>,
}

/// `ValidateValidatingAdmissionPolicy`: metadata, then `validateValidatingAdmissionPolicySpec`.
pub fn check_policy(policy: &Value, lib: &Library) -> PolicyCheck {
    let mut errs = vec![];
    let meta = &policy["metadata"];
    let name = str_at(meta, "name").unwrap_or_default();
    object_meta(meta, &mut errs);
    let spec = &policy["spec"];
    match str_at(spec, "failurePolicy").unwrap_or("Fail") {
        "Fail" | "Ignore" => {}
        other => errs.push(not_supported(
            "spec.failurePolicy",
            other,
            &["Fail", "Ignore"],
        )),
    }
    if !spec["paramKind"].is_null() {
        // The declarations below have no `params`; a policy with a paramKind is outside
        // what this checker models.
        errs.push(forbidden(
            "spec.paramKind",
            "not modelled by this checker: the export sets no paramKind",
        ));
    }
    match spec.get("matchConstraints") {
        None | Some(Value::Null) => errs.push(required("spec.matchConstraints", "")),
        Some(mc) => {
            match_resources(mc, "spec.matchConstraints", &mut errs);
            if list_at(mc, "resourceRules").is_empty() {
                errs.push(required("spec.matchConstraints.resourceRules", ""));
            }
        }
    }
    // `validateMatchConditions`: a stateless compiler, so no `variables`.
    let conditions = list_at(spec, "matchConditions");
    if conditions.len() > MAX_MATCH_CONDITIONS {
        errs.push(FieldError {
            field: "spec.matchConditions".into(),
            kind: ErrorType::TooMany,
            value: conditions.len().to_string(),
            detail: format!("must have at most {MAX_MATCH_CONDITIONS} items"),
        });
    }
    let mut condition_names: Vec<&str> = vec![];
    for (i, mc) in conditions.iter().enumerate() {
        let path = format!("spec.matchConditions[{i}]");
        let expr = str_at(mc, "expression").unwrap_or_default();
        if expr.trim().is_empty() {
            errs.push(required(&format!("{path}.expression"), ""));
        } else {
            let decls = Decls::admission(true, None);
            let c = compile(lib, &decls, expr.trim(), Some(&[Type::Bool]));
            if let Some(e) = c.error {
                errs.push(invalid(&format!("{path}.expression"), expr.trim(), &e));
            }
        }
        match str_at(mc, "name").unwrap_or_default() {
            "" => errs.push(required(&format!("{path}.name"), "")),
            n => {
                for e in qualified_name_errors(n) {
                    errs.push(invalid(&format!("{path}.name"), n, &e));
                }
                if condition_names.contains(&n) {
                    errs.push(duplicate(&format!("{path}.name"), n));
                }
                condition_names.push(n);
            }
        }
    }
    // `validateVariable`, in order, each compiled by the composited compiler with the
    // variables before it (`CompileAndStoreVariable`): a later or unknown `variables.x` is
    // an undefined field. A variable that fails to compile is still declared, as dyn
    // (`convertCelTypeToDeclType(nil)`).
    let variable_defs = list_at(spec, "variables");
    let mut variables: Vec<(String, Type)> = vec![];
    for (i, v) in variable_defs.iter().enumerate() {
        let path = format!("spec.variables[{i}]");
        let vname = str_at(v, "name").unwrap_or_default();
        if vname.trim().is_empty() {
            errs.push(required(&format!("{path}.name"), "name is not specified"));
        } else if !is_cel_identifier(vname) {
            errs.push(invalid(
                &format!("{path}.name"),
                vname,
                "name is not a valid CEL identifier",
            ));
        }
        let expr = str_at(v, "expression").unwrap_or_default();
        if expr.trim().is_empty() {
            errs.push(required(
                &format!("{path}.expression"),
                "expression is not specified",
            ));
            continue;
        }
        let decls = Decls::admission(true, Some(&variables));
        let c = compile(lib, &decls, expr, None);
        if let Some(e) = &c.error {
            errs.push(invalid(&format!("{path}.expression"), expr, e));
        }
        let declared = match (&c.error, &c.output) {
            (None, Some(t)) => declared_variable_type(t),
            _ => Type::Dyn,
        };
        match variables.iter_mut().find(|(n, _)| n == vname) {
            Some(slot) => slot.1 = declared,
            None => variables.push((vname.to_owned(), declared)),
        }
    }
    let vars_decl = (!variable_defs.is_empty()).then_some(variables.as_slice());
    let validations = list_at(spec, "validations");
    let annotations = list_at(spec, "auditAnnotations");
    if validations.is_empty() && annotations.is_empty() {
        let msg = "validations or auditAnnotations must contain at least one item";
        errs.push(required("spec.validations", msg));
        errs.push(required("spec.auditAnnotations", msg));
    }
    for (i, v) in validations.iter().enumerate() {
        validation(
            lib,
            v,
            &format!("spec.validations[{i}]"),
            vars_decl,
            &mut errs,
        );
    }
    if annotations.len() > MAX_AUDIT_ANNOTATIONS {
        errs.push(invalid(
            "spec.auditAnnotations",
            &format!("{} items", annotations.len()),
            &format!("must not have more than {MAX_AUDIT_ANNOTATIONS} auditAnnotations"),
        ));
    }
    let mut keys: Vec<&str> = vec![];
    for (i, a) in annotations.iter().enumerate() {
        let path = format!("spec.auditAnnotations[{i}]");
        audit_annotation(lib, name, a, &path, vars_decl, &mut errs);
        let key = str_at(a, "key").unwrap_or_default();
        if keys.contains(&key) {
            errs.push(duplicate(&format!("{path}.key"), key));
        }
        keys.push(key);
    }
    PolicyCheck {
        errors: errs,
        variables,
    }
}

/// `validateValidation`.
fn validation(
    lib: &Library,
    v: &Value,
    path: &str,
    vars: Option<&[(String, Type)]>,
    errs: &mut Vec<FieldError>,
) {
    let expr = str_at(v, "expression").unwrap_or_default();
    if expr.trim().is_empty() {
        errs.push(required(
            &format!("{path}.expression"),
            "expression is not specified",
        ));
    } else {
        let decls = Decls::admission(true, vars);
        if let Some(e) = compile(lib, &decls, expr, Some(&[Type::Bool])).error {
            errs.push(invalid(&format!("{path}.expression"), expr, &e));
        }
    }
    if let Some(m) = str_at(v, "messageExpression") {
        if !m.is_empty() && m.trim().is_empty() {
            errs.push(invalid(
                &format!("{path}.messageExpression"),
                m,
                "must be non-empty if specified",
            ));
        } else if !m.trim().is_empty() {
            // `validateMessageExpression`: no authorizer.
            let decls = Decls::admission(false, vars);
            if let Some(e) = compile(lib, &decls, m, Some(&[Type::String])).error {
                errs.push(invalid(&format!("{path}.messageExpression"), m, &e));
            }
        }
    }
    let msg = str_at(v, "message").unwrap_or_default();
    if !msg.is_empty() && msg.trim().is_empty() {
        errs.push(invalid(
            &format!("{path}.message"),
            msg,
            "message must be non-empty if specified",
        ));
    } else if has_line_breaks(msg.trim()) {
        errs.push(invalid(
            &format!("{path}.message"),
            msg,
            "message must not contain line breaks",
        ));
    }
    // validation.go `supportedValidationPolicyReason`. The API documentation also names
    // Unauthorized, but the validation refuses it.
    if let Some(r) = str_at(v, "reason") {
        let supported = ["Forbidden", "Invalid", "RequestEntityTooLarge"];
        if !supported.contains(&r) {
            errs.push(not_supported(&format!("{path}.reason"), r, &supported));
        }
    }
}

/// `validateAuditAnnotation`.
fn audit_annotation(
    lib: &Library,
    policy_name: &str,
    a: &Value,
    path: &str,
    vars: Option<&[(String, Type)]>,
    errs: &mut Vec<FieldError>,
) {
    let key = str_at(a, "key").unwrap_or_default();
    if policy_name.is_empty() {
        errs.push(invalid(
            &format!("{path}.key"),
            key,
            "requires metadata.name be non-empty",
        ));
    } else {
        let full = format!("{policy_name}/{key}");
        for e in qualified_name_errors(&full) {
            errs.push(invalid(&format!("{path}.key"), &full, &e));
        }
    }
    let expr = str_at(a, "valueExpression").unwrap_or_default();
    let trimmed = expr.trim();
    if trimmed.is_empty() {
        errs.push(required(
            &format!("{path}.valueExpression"),
            "valueExpression is not specified",
        ));
    } else if trimmed.len() > MAX_AUDIT_ANNOTATION_VALUE_EXPRESSION_LENGTH {
        errs.push(required(
            &format!("{path}.valueExpression"),
            &format!(
                "must not exceed {MAX_AUDIT_ANNOTATION_VALUE_EXPRESSION_LENGTH} bytes in length"
            ),
        ));
    } else {
        let decls = Decls::admission(true, vars);
        if let Some(e) = compile(lib, &decls, trimmed, Some(&[Type::String, Type::Null])).error {
            errs.push(invalid(&format!("{path}.valueExpression"), expr, &e));
        }
    }
}

/// `ValidateObjectMeta` as far as these objects go: the name a DNS-1123 subdomain
/// (`NameIsDNSSubdomain`), label keys qualified names, label values valid.
fn object_meta(meta: &Value, errs: &mut Vec<FieldError>) {
    match str_at(meta, "name").unwrap_or_default() {
        "" => errs.push(required(
            "metadata.name",
            "name or generateName is required",
        )),
        name => {
            for e in dns1123_subdomain_errors(name) {
                errs.push(invalid("metadata.name", name, &e));
            }
        }
    }
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        for (k, v) in labels {
            for e in qualified_name_errors(k) {
                errs.push(invalid("metadata.labels", k, &e));
            }
            for e in label_value_errors(v.as_str().unwrap_or_default()) {
                errs.push(invalid(
                    "metadata.labels",
                    v.as_str().unwrap_or_default(),
                    &e,
                ));
            }
        }
    }
}

/// `validateMatchResources`.
fn match_resources(mc: &Value, path: &str, errs: &mut Vec<FieldError>) {
    match str_at(mc, "matchPolicy").unwrap_or("Equivalent") {
        "Exact" | "Equivalent" => {}
        other => errs.push(not_supported(
            &format!("{path}.matchPolicy"),
            other,
            &["Equivalent", "Exact"],
        )),
    }
    for sel in ["namespaceSelector", "objectSelector"] {
        if let Some(s) = mc.get(sel).filter(|s| !s.is_null()) {
            label_selector(s, &format!("{path}.{sel}"), errs);
        }
    }
    for rules in ["resourceRules", "excludeResourceRules"] {
        for (i, r) in list_at(mc, rules).iter().enumerate() {
            rule_with_operations(r, &format!("{path}.{rules}[{i}]"), errs);
        }
    }
}

/// apimachinery `metav1validation.ValidateLabelSelector`, strict about values.
fn label_selector(s: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if let Some(labels) = s.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in labels {
            for e in qualified_name_errors(k) {
                errs.push(invalid(&format!("{path}.matchLabels"), k, &e));
            }
            for e in label_value_errors(v.as_str().unwrap_or_default()) {
                errs.push(invalid(
                    &format!("{path}.matchLabels"),
                    v.as_str().unwrap_or_default(),
                    &e,
                ));
            }
        }
    }
    for (i, r) in list_at(s, "matchExpressions").iter().enumerate() {
        let p = format!("{path}.matchExpressions[{i}]");
        let values = list_at(r, "values");
        match str_at(r, "operator").unwrap_or_default() {
            "In" | "NotIn" if values.is_empty() => errs.push(required(
                &format!("{p}.values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "In" | "NotIn" => {}
            "Exists" | "DoesNotExist" if !values.is_empty() => errs.push(forbidden(
                &format!("{p}.values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "Exists" | "DoesNotExist" => {}
            other => errs.push(invalid(
                &format!("{p}.operator"),
                other,
                "not a valid selector operator",
            )),
        }
        let key = str_at(r, "key").unwrap_or_default();
        for e in qualified_name_errors(key) {
            errs.push(invalid(&format!("{p}.key"), key, &e));
        }
        for (j, v) in values.iter().enumerate() {
            let v = v.as_str().unwrap_or_default();
            for e in label_value_errors(v) {
                errs.push(invalid(&format!("{p}.values[{j}]"), v, &e));
            }
        }
    }
}

/// `validateRuleWithOperations` and `validateRule` (subresources allowed).
fn rule_with_operations(r: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let strings = |key: &str| -> Vec<&str> {
        list_at(r, key)
            .iter()
            .map(|v| v.as_str().unwrap_or_default())
            .collect()
    };
    let ops = strings("operations");
    if ops.is_empty() {
        errs.push(required(&format!("{path}.operations"), ""));
    }
    if ops.len() > 1 && ops.contains(&"*") {
        errs.push(invalid(
            &format!("{path}.operations"),
            &ops.join(","),
            "if '*' is present, must not specify other operations",
        ));
    }
    let supported = ["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];
    for (i, op) in ops.iter().enumerate() {
        if !supported.contains(op) {
            errs.push(not_supported(
                &format!("{path}.operations[{i}]"),
                op,
                &supported,
            ));
        }
    }
    for (key, what) in [("apiGroups", "API groups"), ("apiVersions", "API versions")] {
        let items = strings(key);
        if items.is_empty() {
            errs.push(required(&format!("{path}.{key}"), ""));
        }
        if items.len() > 1 && items.contains(&"*") {
            errs.push(invalid(
                &format!("{path}.{key}"),
                &items.join(","),
                &format!("if '*' is present, must not specify other {what}"),
            ));
        }
    }
    for (i, v) in strings("apiVersions").iter().enumerate() {
        if v.is_empty() {
            errs.push(required(&format!("{path}.apiVersions[{i}]"), ""));
        }
    }
    let resources = strings("resources");
    if resources.is_empty() {
        errs.push(required(&format!("{path}.resources"), ""));
    }
    for (i, res) in resources.iter().enumerate() {
        if res.is_empty() {
            errs.push(required(&format!("{path}.resources[{i}]"), ""));
        }
    }
    if resources.len() > 1 && resources.contains(&"*/*") {
        errs.push(invalid(
            &format!("{path}.resources"),
            &resources.join(","),
            "if '*/*' is present, must not specify other resources",
        ));
    }
    if resources.contains(&"*") && resources.iter().any(|r| *r != "*" && !r.contains('/')) {
        errs.push(invalid(
            &format!("{path}.resources"),
            &resources.join(","),
            "if '*' is present, must not specify other resources without subresources",
        ));
    }
    if let Some(scope) = str_at(r, "scope") {
        let scopes = ["*", "Cluster", "Namespaced"];
        if !scopes.contains(&scope) {
            errs.push(not_supported(&format!("{path}.scope"), scope, &scopes));
        }
    }
}

/// `ValidateValidatingAdmissionPolicyBinding`.
pub fn check_binding(binding: &Value) -> Vec<FieldError> {
    let mut errs = vec![];
    object_meta(&binding["metadata"], &mut errs);
    let spec = &binding["spec"];
    match str_at(spec, "policyName").unwrap_or_default() {
        "" => errs.push(required("spec.policyName", "")),
        name => {
            for e in dns1123_subdomain_errors(name) {
                errs.push(invalid("spec.policyName", name, &e));
            }
        }
    }
    if let Some(mr) = spec.get("matchResources").filter(|m| !m.is_null()) {
        // (sic: the apiserver's path says matchResouces)
        match_resources(mr, "spec.matchResouces", &mut errs);
    }
    let actions: Vec<&str> = list_at(spec, "validationActions")
        .iter()
        .map(|a| a.as_str().unwrap_or_default())
        .collect();
    let supported = ["Audit", "Deny", "Warn"];
    for (i, a) in actions.iter().enumerate() {
        let path = format!("spec.validationActions[{i}]");
        if !supported.contains(a) {
            errs.push(not_supported(&path, a, &supported));
        }
        if actions[..i].contains(a) {
            errs.push(duplicate(&path, a));
        }
    }
    if actions.contains(&"Deny") && actions.contains(&"Warn") {
        errs.push(invalid(
            "spec.validationActions",
            &actions.join(","),
            "must not contain both Deny and Warn (repeating the same validation failure \
             information in the API response and headers serves no purpose)",
        ));
    }
    if actions.is_empty() {
        errs.push(required(
            "spec.validationActions",
            "at least one validation action is required",
        ));
    }
    errs
}

// ---------------------------------------------------------------------------------------
// Runtime cost: what evaluating the policy spends on a given request.
//
// cel-go counts cost while it evaluates (`interpreter/runtimecost.go`, `CostTracker`, over
// the plan of `interpreter/planner.go`): 1 for each identifier and each field selection or
// index (`common.SelectAndIdentCost`; an attribute and each of its qualifiers), 1 more for
// selecting from or indexing what is not itself an attribute (a call's result: the planner
// wraps it in a relative attribute, observed on its own), 0 for the final selection of a
// `has()` (Kubernetes sets `PresenceTestHasCost(false)`), 0 for constants, 10 for a list
// literal and 30 for a map literal (`ListCreateBaseCost`, `MapCreateBaseCost`), nothing
// for `&&`, `||` and `?:` themselves (only for the operands they evaluate), and for every
// other call what the Kubernetes estimator (`library/cost.go` `CallCost`) says, else
// cel-go's default: string traversals at a tenth of a unit per character
// (`StringTraversalCostFactor`), list membership the list's size, `matches` the string's
// traversal times a quarter of the pattern's length, and 1 for the rest. A comprehension
// costs its range, its initial accumulator, each iteration's condition and step, and its
// result, as its parts are evaluated. Kubernetes evaluates with `cel.OptOptimize`
// (base.go), whose plan folds a list or map literal of constants into a constant (0, `[]`
// included) and `x in [constants]` into a set lookup (0 beyond `x`): counted so here.
//
// This evaluator computes the values so that sizes are real (a message's concatenations
// cost what its strings' lengths say) and counts by those rules. It is not cel-go's
// tracker: it walks the expression rather than cel-go's plan, so where the plan differs in
// ways not named above the counts may differ by a little; the limits it is held to are two
// orders of magnitude above what the export spends. It evaluates the functions the export
// uses; any other call is reported as not evaluable rather than guessed.
//
// The apiserver evaluates each variable lazily, once per filter (`composition.go`: a
// variable's own evaluation is charged to the filter, not to the expression that reads
// it), so the per-expression figures below are each expression's own cost and the filter
// totals add the variables it caused to be evaluated.

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
    fn err(msg: impl Into<String>) -> Val {
        Val::Err(msg.into().into())
    }

    fn str(s: impl Into<String>) -> Val {
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
    fn size(&self) -> u64 {
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
fn cel_eq(a: &Val, b: &Val) -> bool {
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

fn num(v: &Val) -> Option<f64> {
    match v {
        Val::Int(i) => Some(*i as f64),
        Val::Uint(u) => Some(*u as f64),
        Val::Double(d) => Some(*d),
        _ => None,
    }
}

fn ceil_cost(x: f64) -> u64 {
    x.ceil() as u64
}

/// library/cost.go `traversalCost`: a tenth per byte of each string, summed over lists
/// and maps, truncated.
fn traversal_cost(v: &Val) -> u64 {
    match v {
        Val::Str(s) => (s.len() as f64 * 0.1) as u64,
        Val::Bytes(b) => (b.len() as f64 * 0.1) as u64,
        Val::List(l) => l.iter().map(traversal_cost).sum(),
        Val::Map(m) => m
            .iter()
            .map(|(k, v)| (k.len() as f64 * 0.1) as u64 + traversal_cost(v))
            .sum(),
        _ => 1,
    }
}

/// The cost of one call, from its (receiver first) arguments and result: library/cost.go
/// `CallCost` first, then runtimecost.go's `costCall` defaults.
fn call_cost(name: &str, member: bool, args: &[Val], result: &Val) -> u64 {
    let size = |i: usize| args.get(i).map_or(1, Val::size) as f64;
    let is_str = |i: usize| matches!(args.get(i), Some(Val::Str(_) | Val::Bytes(_)));
    match name {
        // library/cost.go.
        "isSorted" | "sum" | "max" | "min" | "indexOf" | "lastIndexOf" | "includes" => {
            args.first().map_or(0, traversal_cost)
        }
        "url" | "lowerAscii" | "upperAscii" | "substring" | "trim" => ceil_cost(size(0) * 0.1),
        "replace" | "split" => ceil_cost(size(0) * 2.0 * 0.1),
        "join" => ceil_cost(result.size() as f64 * 2.0 * 0.1),
        "find" | "findAll" => ceil_cost((1.0 + size(0)) * 0.1) * ceil_cost(size(1) * 0.25),
        "quantity" | "isQuantity" | "semver" | "isSemver" | "cidr" | "isIP" | "isCIDR" => {
            ceil_cost(size(0) * 0.1)
        }
        // runtimecost.go defaults, by overload.
        "startsWith" | "endsWith" => ceil_cost(size(0) * 0.1),
        "bytes" if matches!(args.first(), Some(Val::Str(_))) => ceil_cost(size(0) * 0.1),
        "string" if matches!(args.first(), Some(Val::Bytes(_))) => ceil_cost(size(0) * 0.1),
        "@in" if matches!(args.get(1), Some(Val::List(_))) => size(1) as u64,
        "_==_" | "_!=_" | "_<_" | "_<=_" | "_>_" | "_>=_" => {
            let relation = !matches!(name, "_==_" | "_!=_");
            if relation && !(is_str(0) && is_str(1)) {
                1
            } else {
                ceil_cost(size(0).min(size(1)) * 0.1)
            }
        }
        "_+_" if is_str(0) && is_str(1) => ceil_cost((size(0) + size(1)) * 0.1),
        // The member overload is `matches_string`; the global one's id is plain
        // `matches`, which costCall does not name, so it costs 1.
        "matches" if member => ceil_cost((1.0 + size(0)) * 0.1) * ceil_cost(size(1) * 0.25),
        "contains" => ceil_cost(size(0) * 0.1) * ceil_cost(size(1) * 0.1),
        _ => 1,
    }
}

/// A request for the cost count: the admission variables' values.
#[derive(Debug, Clone)]
pub struct Input {
    pub object: Val,
    pub request: Val,
    pub namespace_object: Val,
}

impl Input {
    pub fn new(object: &Value, request: &Value, namespace_object: &Value) -> Input {
        Input {
            object: Val::from_json(object),
            request: Val::from_json(request),
            namespace_object: Val::from_json(namespace_object),
        }
    }
}

/// What one evaluation of the policy on one request spent and gave.
#[derive(Debug, Default)]
pub struct Run {
    /// Each expression's own cost (variables at their path, once per filter that
    /// evaluated them, the largest kept): what `PER_CALL_LIMIT` bounds.
    pub costs: BTreeMap<String, u64>,
    /// The three filters' totals, variables included.
    pub validations: u64,
    pub messages: u64,
    pub audit: u64,
    /// Whether every validation held.
    pub allowed: bool,
    /// Each messageExpression's result length in bytes (trimmed), when it gave a string.
    pub message_bytes: Vec<usize>,
    /// The variables the validations caused to be evaluated, by name.
    pub variables: BTreeMap<String, Val>,
    /// CEL runtime errors, by expression: with failurePolicy Fail, the request is refused.
    pub errors: Vec<String>,
}

/// Limits a run breaks, worded for a test failure.
pub fn limit_violations(run: &Run) -> Vec<String> {
    let mut out = vec![];
    for (path, cost) in &run.costs {
        if *cost > PER_CALL_LIMIT {
            out.push(format!(
                "{path}: cost {cost} over the per-expression limit {PER_CALL_LIMIT}"
            ));
        }
    }
    if run.validations > RUNTIME_CEL_COST_BUDGET {
        out.push(format!(
            "validations: cost {} over the budget {RUNTIME_CEL_COST_BUDGET}",
            run.validations
        ));
    }
    if run.validations + run.messages > RUNTIME_CEL_COST_BUDGET {
        out.push(format!(
            "messageExpressions: cost {} over what the validations left of the budget ({})",
            run.messages,
            RUNTIME_CEL_COST_BUDGET.saturating_sub(run.validations)
        ));
    }
    if run.audit > RUNTIME_CEL_COST_BUDGET {
        out.push(format!(
            "auditAnnotations: cost {} over the budget {RUNTIME_CEL_COST_BUDGET}",
            run.audit
        ));
    }
    out
}

struct Ctx<'p> {
    lib: &'p Library,
    globals: HashMap<&'static str, Val>,
}

/// The variables of one filter: evaluated on first use, then kept.
struct Vars<'p> {
    ctx: &'p Ctx<'p>,
    defs: &'p [(String, String, Rc<IdedExpr>)],
    cache: HashMap<String, Val>,
    /// What the variables' evaluations cost the filter.
    composition: u64,
    costs: BTreeMap<String, u64>,
    errors: Vec<String>,
}

impl<'p> Vars<'p> {
    fn get(&mut self, name: &str) -> Result<Val, String> {
        if let Some(v) = self.cache.get(name) {
            return Ok(v.clone());
        }
        let defs = self.defs;
        let Some((_, path, ast)) = defs.iter().find(|(n, _, _)| n == name) else {
            return Ok(Val::err(format!("no such key: {name}")));
        };
        let ctx = self.ctx;
        let mut ev = Eval {
            ctx,
            vars: self,
            locals: vec![],
            cost: 0,
        };
        let v = ev.eval(ast)?;
        let cost = ev.cost;
        self.composition += cost;
        let slot = self.costs.entry(path.clone()).or_default();
        *slot = (*slot).max(cost);
        if let Val::Err(e) = &v {
            self.errors.push(format!("{path}: {e}"));
        }
        self.cache.insert(name.to_owned(), v.clone());
        Ok(v)
    }
}

struct Eval<'a, 'p> {
    ctx: &'p Ctx<'p>,
    vars: &'a mut Vars<'p>,
    locals: Vec<(String, Val)>,
    cost: u64,
}

impl Eval<'_, '_> {
    fn local(&self, name: &str) -> Option<Val> {
        self.locals
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }

    fn eval(&mut self, e: &IdedExpr) -> Result<Val, String> {
        match &e.expr {
            Expr::Literal(l) => Ok(match l {
                LiteralValue::Boolean(b) => Val::Bool(*b.inner()),
                LiteralValue::Bytes(b) => Val::Bytes(b.inner().into()),
                LiteralValue::Double(d) => Val::Double(*d.inner()),
                LiteralValue::Int(i) => Val::Int(*i.inner()),
                LiteralValue::Null => Val::Null,
                LiteralValue::String(s) => Val::str(s.inner()),
                LiteralValue::UInt(u) => Val::Uint(*u.inner()),
            }),
            Expr::Ident(name) => {
                self.cost += 1;
                if let Some(v) = self.local(name) {
                    return Ok(v);
                }
                match self.ctx.globals.get(name.as_str()) {
                    Some(v) => Ok(v.clone()),
                    None => Err(format!("cannot evaluate identifier {name}")),
                }
            }
            Expr::Select(s) => {
                let variables = matches!(&s.operand.expr, Expr::Ident(n) if n == "variables")
                    && self.local("variables").is_none();
                if variables {
                    self.cost += if s.test { 1 } else { 2 };
                    if s.test {
                        let known = self.vars.defs.iter().any(|(n, _, _)| *n == s.field);
                        return Ok(Val::Bool(known));
                    }
                    return self.vars.get(&s.field);
                }
                let operand = self.eval(&s.operand)?;
                if !s.test {
                    self.cost += 1;
                }
                if !is_attribute(&s.operand) {
                    self.cost += 1;
                }
                Ok(match operand {
                    Val::Map(m) => {
                        let v = m.get(s.field.as_str());
                        match (s.test, v) {
                            (true, v) => Val::Bool(v.is_some()),
                            (false, Some(v)) => v.clone(),
                            (false, None) => Val::err(format!("no such key: {}", s.field)),
                        }
                    }
                    Val::Err(e) => Val::Err(e),
                    other => Val::err(format!("no such overload: {other:?}.{}", s.field)),
                })
            }
            Expr::Call(call) => self.call(call),
            Expr::List(l) => {
                if !l.optional_indices.is_empty() {
                    return Err("cannot evaluate optional list elements".into());
                }
                if !is_constant(e) {
                    self.cost += 10;
                }
                let mut out = Vec::with_capacity(l.elements.len());
                for x in &l.elements {
                    let v = self.eval(x)?;
                    if let Val::Err(_) = v {
                        return Ok(v);
                    }
                    out.push(v);
                }
                Ok(Val::List(Rc::new(out)))
            }
            Expr::Map(m) => {
                if !is_constant(e) {
                    self.cost += 30;
                }
                let mut out = BTreeMap::new();
                for entry in &m.entries {
                    let EntryExpr::MapEntry(me) = &entry.expr else {
                        return Err("cannot evaluate a struct field".into());
                    };
                    if me.optional {
                        return Err("cannot evaluate optional map entries".into());
                    }
                    let k = self.eval(&me.key)?;
                    let v = self.eval(&me.value)?;
                    let Val::Str(k) = k else {
                        return Err(
                            "cannot evaluate a map literal with other than string keys".into()
                        );
                    };
                    out.insert(k, v);
                }
                Ok(Val::Map(Rc::new(out)))
            }
            Expr::Comprehension(c) => {
                let range = self.eval(&c.iter_range)?;
                let mut accu = self.eval(&c.accu_init)?;
                let items: Vec<(Val, Val)> = match &range {
                    Val::List(l) => l
                        .iter()
                        .enumerate()
                        .map(|(i, v)| (Val::Int(i as i64), v.clone()))
                        .collect(),
                    Val::Map(m) => m
                        .iter()
                        .map(|(k, v)| (Val::Str(k.clone()), v.clone()))
                        .collect(),
                    Val::Err(_) => return Ok(range),
                    other => return Ok(Val::err(format!("cannot range over {other:?}"))),
                };
                for (first, second) in items {
                    self.locals.push((c.accu_var.clone(), accu.clone()));
                    match &c.iter_var2 {
                        Some(v2) => {
                            self.locals.push((c.iter_var.clone(), first));
                            self.locals.push((v2.clone(), second));
                        }
                        None => {
                            let one = if matches!(range, Val::Map(_)) {
                                first
                            } else {
                                second
                            };
                            self.locals.push((c.iter_var.clone(), one));
                            self.locals.push((String::new(), Val::Null));
                        }
                    }
                    let cond = self.eval(&c.loop_cond);
                    let go = matches!(cond, Ok(Val::Bool(true)));
                    let step = if go {
                        Some(self.eval(&c.loop_step))
                    } else {
                        None
                    };
                    self.locals.truncate(self.locals.len() - 3);
                    cond?;
                    match step {
                        Some(s) => accu = s?,
                        None => break,
                    }
                }
                self.locals.push((c.accu_var.clone(), accu));
                let r = self.eval(&c.result);
                self.locals.pop();
                r
            }
            Expr::Struct(_) | Expr::Unspecified => Err("cannot evaluate this expression".into()),
        }
    }

    fn call(&mut self, call: &CallExpr) -> Result<Val, String> {
        let name = call.func_name.as_str();
        match name {
            "_&&_" | "_||_" => {
                let decisive = name == "_||_";
                let mut error = None;
                for a in &call.args {
                    match self.eval(a)? {
                        Val::Bool(b) if b == decisive => return Ok(Val::Bool(b)),
                        Val::Bool(_) => {}
                        Val::Err(e) => error = Some(Val::Err(e)),
                        other => error = Some(Val::err(format!("no such overload: {other:?}"))),
                    }
                }
                return Ok(error.unwrap_or(Val::Bool(!decisive)));
            }
            "_?_:_" => {
                return match self.eval(&call.args[0])? {
                    Val::Bool(true) => self.eval(&call.args[1]),
                    Val::Bool(false) => self.eval(&call.args[2]),
                    Val::Err(e) => Ok(Val::Err(e)),
                    other => Ok(Val::err(format!("no such overload: {other:?} ? ..."))),
                };
            }
            "@not_strictly_false" => {
                let v = self.eval(&call.args[0])?;
                self.cost += 1;
                return Ok(Val::Bool(!matches!(v, Val::Bool(false))));
            }
            "_[_]" => {
                let operand = self.eval(&call.args[0])?;
                let index = self.eval(&call.args[1])?;
                self.cost += if is_attribute(&call.args[0]) { 1 } else { 2 };
                return Ok(index_of(&operand, &index));
            }
            // `maybeOptimizeSetMembership`: against a list literal of scalars, a set lookup
            // whose evaluation the tracker does not charge (and against `[]`, false
            // without evaluating the element).
            "@in" if is_constant(&call.args[1]) => {
                if let Expr::List(l) = &call.args[1].expr {
                    let scalars = l
                        .elements
                        .iter()
                        .all(|x| !matches!(x.expr, Expr::Literal(LiteralValue::Bytes(_))));
                    if l.elements.is_empty() {
                        return Ok(Val::Bool(false));
                    }
                    if scalars {
                        let x = self.eval(&call.args[0])?;
                        let list = self.eval(&call.args[1])?;
                        return self.apply("@in", &[x, list]);
                    }
                }
            }
            _ => {}
        }
        // A namespaced function, as the checker resolved it.
        let (fname, target) = match &call.target {
            Some(t) => match qualified_name(t) {
                Some(q) if self.ctx.lib.has_function(&format!("{q}.{name}")) => {
                    (format!("{q}.{name}"), None)
                }
                _ => (name.to_owned(), Some(t)),
            },
            None => (name.to_owned(), None),
        };
        let member = target.is_some();
        let mut args = vec![];
        if let Some(t) = target {
            args.push(self.eval(t)?);
        }
        for a in &call.args {
            args.push(self.eval(a)?);
        }
        if let Some(e) = args.iter().find(|a| matches!(a, Val::Err(_))) {
            return Ok(e.clone());
        }
        let result = self.apply(&fname, &args)?;
        self.cost += call_cost(&fname, member, &args, &result);
        Ok(result)
    }

    /// The functions the export uses, with cel-go's semantics (ext/strings.go indexes in
    /// code points). Anything else is not evaluable here.
    fn apply(&self, name: &str, args: &[Val]) -> Result<Val, String> {
        let chars = |s: &str| s.chars().collect::<Vec<char>>();
        let no = || Val::err(format!("no such overload: {name}{args:?}"));
        Ok(match (name, args) {
            ("!_", [Val::Bool(b)]) => Val::Bool(!b),
            ("-_", [Val::Int(i)]) => i
                .checked_neg()
                .map_or_else(|| Val::err("overflow"), Val::Int),
            ("-_", [Val::Double(d)]) => Val::Double(-d),
            ("_==_", [a, b]) => Val::Bool(cel_eq(a, b)),
            ("_!=_", [a, b]) => Val::Bool(!cel_eq(a, b)),
            ("_+_", [Val::Str(a), Val::Str(b)]) => Val::str(format!("{a}{b}")),
            ("_+_", [Val::List(a), Val::List(b)]) => {
                Val::List(Rc::new(a.iter().chain(b.iter()).cloned().collect()))
            }
            ("_+_", [Val::Int(a), Val::Int(b)]) => a
                .checked_add(*b)
                .map_or_else(|| Val::err("overflow"), Val::Int),
            ("_-_", [Val::Int(a), Val::Int(b)]) => a
                .checked_sub(*b)
                .map_or_else(|| Val::err("overflow"), Val::Int),
            ("_*_", [Val::Int(a), Val::Int(b)]) => a
                .checked_mul(*b)
                .map_or_else(|| Val::err("overflow"), Val::Int),
            ("_<_" | "_<=_" | "_>_" | "_>=_", [a, b]) => {
                let ord = match (a, b) {
                    (Val::Str(x), Val::Str(y)) => x.cmp(y),
                    (Val::Bool(x), Val::Bool(y)) => x.cmp(y),
                    _ => match (num(a), num(b)) {
                        (Some(x), Some(y)) => {
                            x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal)
                        }
                        _ => return Ok(no()),
                    },
                };
                use std::cmp::Ordering::*;
                Val::Bool(match name {
                    "_<_" => ord == Less,
                    "_<=_" => ord != Greater,
                    "_>_" => ord == Greater,
                    _ => ord != Less,
                })
            }
            ("@in", [x, Val::List(l)]) => Val::Bool(l.iter().any(|y| cel_eq(x, y))),
            ("@in", [Val::Str(k), Val::Map(m)]) => Val::Bool(m.contains_key(&**k)),
            ("@in", [_, Val::Map(_)]) => Val::Bool(false),
            ("size", [v @ (Val::Str(_) | Val::Bytes(_) | Val::List(_) | Val::Map(_))]) => {
                Val::Int(v.size() as i64)
            }
            ("string", [Val::Str(s)]) => Val::Str(s.clone()),
            ("string", [Val::Int(i)]) => Val::str(i.to_string()),
            ("string", [Val::Bool(b)]) => Val::str(b.to_string()),
            ("int", [Val::Int(i)]) => Val::Int(*i),
            ("dyn", [v]) => v.clone(),
            ("contains", [Val::Str(s), Val::Str(t)]) => Val::Bool(s.contains(&**t)),
            ("startsWith", [Val::Str(s), Val::Str(t)]) => Val::Bool(s.starts_with(&**t)),
            ("endsWith", [Val::Str(s), Val::Str(t)]) => Val::Bool(s.ends_with(&**t)),
            ("matches", [Val::Str(s), Val::Str(p)]) => match compiled(p) {
                Some(re) => Val::Bool(re.is_match(s)),
                None => Val::err(format!("invalid regex {p}")),
            },
            ("lowerAscii", [Val::Str(s)]) => Val::str(s.to_ascii_lowercase()),
            ("upperAscii", [Val::Str(s)]) => Val::str(s.to_ascii_uppercase()),
            // Go's strings.TrimSpace and Rust's trim both strip Unicode White_Space.
            ("trim", [Val::Str(s)]) => Val::str(s.trim()),
            ("replace", [Val::Str(s), Val::Str(from), Val::Str(to)]) => {
                Val::str(s.replace(&**from, to))
            }
            ("join", [Val::List(l)]) | ("join", [Val::List(l), _]) => {
                let sep = match args.get(1) {
                    Some(Val::Str(sep)) => sep.to_string(),
                    _ => String::new(),
                };
                let mut parts = vec![];
                for v in l.iter() {
                    match v {
                        Val::Str(s) => parts.push(s.to_string()),
                        _ => return Ok(no()),
                    }
                }
                Val::str(parts.join(&sep))
            }
            ("substring", [Val::Str(s), Val::Int(start), rest @ ..]) => {
                let cs = chars(s);
                let end = match rest {
                    [Val::Int(e)] => *e,
                    [] => cs.len() as i64,
                    _ => return Ok(no()),
                };
                if *start < 0 || end < *start || end > cs.len() as i64 {
                    Val::err(format!("index out of range: {start}, {end}"))
                } else {
                    Val::str(cs[*start as usize..end as usize].iter().collect::<String>())
                }
            }
            ("indexOf" | "lastIndexOf", [Val::Str(s), Val::Str(sub)]) => {
                let found = if name == "indexOf" {
                    s.find(&**sub)
                } else {
                    s.rfind(&**sub)
                };
                match found {
                    Some(byte) => Val::Int(s[..byte].chars().count() as i64),
                    None => Val::Int(-1),
                }
            }
            ("charAt", [Val::Str(s), Val::Int(i)]) => {
                let cs = chars(s);
                match usize::try_from(*i) {
                    Ok(i) if i < cs.len() => Val::str(cs[i].to_string()),
                    Ok(i) if i == cs.len() => Val::str(""),
                    _ => Val::err("index out of range"),
                }
            }
            ("split", [Val::Str(s), Val::Str(sep)]) => {
                Val::List(Rc::new(s.split(&**sep).map(Val::str).collect()))
            }
            _ => {
                return Err(format!(
                    "cannot evaluate {name} on {} argument(s)",
                    args.len()
                ))
            }
        })
    }
}

/// Whether the planner makes `e` an attribute (identifiers, selections, indexes and
/// conditionals), which a further selection or index extends at no cost of its own.
fn is_attribute(e: &IdedExpr) -> bool {
    match &e.expr {
        Expr::Ident(_) | Expr::Select(_) => true,
        Expr::Call(c) => c.target.is_none() && matches!(c.func_name.as_str(), "_[_]" | "_?_:_"),
        _ => false,
    }
}

/// Whether `cel.OptOptimize` folds `e` into a constant: a literal, or a list or map literal
/// of them (`maybeBuildListLiteral`, `maybeBuildMapLiteral`).
fn is_constant(e: &IdedExpr) -> bool {
    match &e.expr {
        Expr::Literal(_) => true,
        Expr::List(l) => l.optional_indices.is_empty() && l.elements.iter().all(is_constant),
        Expr::Map(m) => m.entries.iter().all(|en| match &en.expr {
            EntryExpr::MapEntry(me) => {
                !me.optional && is_constant(&me.key) && is_constant(&me.value)
            }
            EntryExpr::StructField(_) => false,
        }),
        _ => false,
    }
}

fn index_of(operand: &Val, index: &Val) -> Val {
    match (operand, index) {
        (Val::Err(e), _) | (_, Val::Err(e)) => Val::Err(e.clone()),
        (Val::List(l), Val::Int(i)) => match usize::try_from(*i).ok().and_then(|i| l.get(i)) {
            Some(v) => v.clone(),
            None => Val::err(format!("index out of range: {i}")),
        },
        (Val::Map(m), Val::Str(k)) => match m.get(&**k) {
            Some(v) => v.clone(),
            None => Val::err(format!("no such key: {k:?}")),
        },
        (o, i) => Val::err(format!("no such overload: {o:?}[{i:?}]")),
    }
}

/// A policy's expressions, parsed once for many requests.
pub struct Evaluable {
    variables: Vec<(String, String, Rc<IdedExpr>)>,
    validations: Vec<(String, Rc<IdedExpr>)>,
    messages: Vec<(String, Rc<IdedExpr>)>,
    audit: Vec<(String, Rc<IdedExpr>)>,
}

impl Evaluable {
    /// The policy's expressions; it should have passed `check_policy`.
    pub fn new(policy: &Value) -> Result<Evaluable, String> {
        let spec = &policy["spec"];
        let parse = |path: String, src: Option<&str>| -> Result<(String, Rc<IdedExpr>), String> {
            let src = src.unwrap_or_default();
            parse(src)
                .map(|ast| (path.clone(), ast))
                .map_err(|e| format!("{path}: {e}"))
        };
        let mut variables = vec![];
        for (i, v) in list_at(spec, "variables").iter().enumerate() {
            let (path, ast) = parse(
                format!("spec.variables[{i}].expression"),
                str_at(v, "expression"),
            )?;
            variables.push((str_at(v, "name").unwrap_or_default().to_owned(), path, ast));
        }
        let mut validations = vec![];
        let mut messages = vec![];
        for (i, v) in list_at(spec, "validations").iter().enumerate() {
            validations.push(parse(
                format!("spec.validations[{i}].expression"),
                str_at(v, "expression"),
            )?);
            if let Some(m) = str_at(v, "messageExpression").filter(|m| !m.trim().is_empty()) {
                messages.push(parse(
                    format!("spec.validations[{i}].messageExpression"),
                    Some(m),
                )?);
            }
        }
        let mut audit = vec![];
        for (i, a) in list_at(spec, "auditAnnotations").iter().enumerate() {
            audit.push(parse(
                format!("spec.auditAnnotations[{i}].valueExpression"),
                str_at(a, "valueExpression").map(str::trim),
            )?);
        }
        Ok(Evaluable {
            variables,
            validations,
            messages,
            audit,
        })
    }

    /// Evaluates the policy on one request as validator.go does: the validations, the
    /// messageExpressions (all of them, whatever the validations gave), the audit
    /// annotations, each filter with its own lazily evaluated variables.
    pub fn run(&self, lib: &Library, input: &Input) -> Result<Run, String> {
        let mut globals = HashMap::new();
        globals.insert("object", input.object.clone());
        globals.insert("oldObject", Val::Null);
        globals.insert("request", input.request.clone());
        globals.insert("namespaceObject", input.namespace_object.clone());
        let ctx = Ctx { lib, globals };
        let mut run = Run {
            allowed: true,
            ..Run::default()
        };
        // (the filter's cost, its expressions' values, the variables it evaluated)
        type Filtered = (u64, Vec<Val>, HashMap<String, Val>);
        let filter =
            |exprs: &[(String, Rc<IdedExpr>)], run: &mut Run| -> Result<Filtered, String> {
                let mut vars = Vars {
                    ctx: &ctx,
                    defs: &self.variables,
                    cache: HashMap::new(),
                    composition: 0,
                    costs: BTreeMap::new(),
                    errors: vec![],
                };
                let mut total = 0;
                let mut values = vec![];
                for (path, ast) in exprs {
                    let mut ev = Eval {
                        ctx: &ctx,
                        vars: &mut vars,
                        locals: vec![],
                        cost: 0,
                    };
                    let v = ev.eval(ast).map_err(|e| format!("{path}: {e}"))?;
                    let cost = ev.cost;
                    total += cost;
                    let slot = run.costs.entry(path.clone()).or_default();
                    *slot = (*slot).max(cost);
                    if let Val::Err(e) = &v {
                        run.errors.push(format!("{path}: {e}"));
                    }
                    values.push(v);
                }
                for (path, cost) in &vars.costs {
                    let slot = run.costs.entry(path.clone()).or_default();
                    *slot = (*slot).max(*cost);
                }
                run.errors.append(&mut vars.errors);
                Ok((total + vars.composition, values, vars.cache))
            };
        let (cost, values, cache) = filter(&self.validations, &mut run)?;
        run.validations = cost;
        run.allowed = values.iter().all(|v| matches!(v, Val::Bool(true)));
        run.variables = cache.into_iter().collect();
        let (cost, values, _) = filter(&self.messages, &mut run)?;
        run.messages = cost;
        for v in values {
            if let Val::Str(s) = v {
                run.message_bytes.push(s.trim().len());
            }
        }
        let (cost, _, _) = filter(&self.audit, &mut run)?;
        run.audit = cost;
        Ok(run)
    }
}

// ---------------------------------------------------------------------------------------
// The checker refuses what the apiserver refuses.

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A small policy the apiserver takes: the shape of the export's.
    fn good() -> Value {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "validate.tollgate.dev"},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [{
                        "apiGroups": [""], "apiVersions": ["v1"],
                        "operations": ["CREATE"], "resources": ["pods"],
                    }],
                },
                "variables": [
                    {"name": "user", "expression": "has(request.userInfo.username) ? request.userInfo.username : ''"},
                    {"name": "requestNamespace", "expression": "has(request.namespace) ? request.namespace : ''"},
                    {"name": "names", "expression": "object.spec.containers.map(c, c.name)"},
                    {"name": "ok", "expression": "size(variables.names) < 100 && variables.user != ''"},
                ],
                "validations": [{
                    "expression": "variables.ok",
                    "messageExpression": "'pod by ' + variables.user + ': ' + variables.names.join(', ')",
                    "message": "refused",
                    "reason": "Forbidden",
                }],
                "auditAnnotations": [{
                    "key": "opt-out",
                    "valueExpression": "variables.ok ? '' : 'in ' + variables.requestNamespace",
                }],
            },
        })
    }

    fn errors(policy: &Value) -> Vec<String> {
        check_policy(policy, &Library::kubernetes(36))
            .errors
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    /// The policy with one field replaced, and what the apiserver says of it.
    fn refused(pointer: &str, value: Value) -> Vec<String> {
        let mut p = good();
        *p.pointer_mut(pointer).unwrap() = value;
        errors(&p)
    }

    fn expect_one(errs: &[String], start: &str, contains: &str) {
        assert_eq!(errs.len(), 1, "{errs:#?}");
        assert!(errs[0].starts_with(start), "{}", errs[0]);
        assert!(errs[0].contains(contains), "{}", errs[0]);
    }

    #[test]
    fn the_good_policy_passes_and_its_variables_are_typed() {
        let c = check_policy(&good(), &Library::kubernetes(36));
        assert!(c.errors.is_empty(), "{:#?}", c.errors);
        let types: Vec<String> = c
            .variables
            .iter()
            .map(|(n, t)| format!("{n}: {t}"))
            .collect();
        assert_eq!(
            types,
            [
                "user: string",
                "requestNamespace: string",
                "names: list(dyn)",
                "ok: bool"
            ]
        );
    }

    #[test]
    fn a_variable_named_namespace_is_refused() {
        let mut p = good();
        p["spec"]["variables"][1]["name"] = json!("namespace");
        // The apiserver still declares it: `variables.namespace` is a field selection,
        // which a reserved word may be.
        p["spec"]["auditAnnotations"][0]["valueExpression"] =
            json!("variables.ok ? '' : 'in ' + variables.namespace");
        let errs = errors(&p);
        expect_one(
            &errs,
            "spec.variables[1].name: Invalid value: \"namespace\": ",
            "name is not a valid CEL identifier",
        );
        // And the expression may not name it either: cel-go's parser reserves it.
        let errs = refused("/spec/variables/0/expression", json!("namespace + ''"));
        expect_one(
            &errs,
            "spec.variables[0].expression: Invalid value: \"namespace + ''\": compilation failed: ",
            "reserved identifier: namespace",
        );
        // A variable that fails is declared dyn for the rest (`convertCelTypeToDeclType(nil)`),
        // and a validation reading it is then not bool.
        let errs = refused("/spec/variables/3/expression", json!("namespace == ''"));
        assert_eq!(errs.len(), 2, "{errs:#?}");
        assert!(
            errs[0].contains("reserved identifier: namespace"),
            "{}",
            errs[0]
        );
        assert_eq!(
            errs[1],
            "spec.validations[0].expression: Invalid value: \"variables.ok\": must evaluate to bool but got dyn"
        );
    }

    #[test]
    fn a_variable_sees_only_the_variables_before_it() {
        let errs = refused(
            "/spec/variables/0/expression",
            json!("variables.ok ? 'a' : 'b'"),
        );
        expect_one(
            &errs,
            "spec.variables[0].expression: Invalid value: \"variables.ok ? 'a' : 'b'\": compilation failed: ",
            "undefined field 'ok'",
        );
        // Without variables there is no `variables` at all.
        let mut p = good();
        p["spec"]["variables"] = json!([]);
        p["spec"]["auditAnnotations"] = json!([]);
        p["spec"]["validations"][0]["messageExpression"] = json!("'x'");
        let errs = errors(&p);
        expect_one(
            &errs,
            "spec.validations[0].expression: ",
            "undeclared reference to 'variables'",
        );
    }

    #[test]
    fn unknown_functions_and_wrong_overloads_are_refused() {
        let errs = refused(
            "/spec/variables/0/expression",
            json!("request.userInfo.username.lower()"),
        );
        expect_one(
            &errs,
            "spec.variables[0].expression: ",
            "undeclared reference to 'lower'",
        );
        // cel.bind is cel-go's, not Kubernetes'.
        let errs = refused("/spec/variables/0/expression", json!("cel.bind(x, 1, x)"));
        expect_one(
            &errs,
            "spec.variables[0].expression: ",
            "undeclared reference to 'cel'",
        );
        let errs = refused(
            "/spec/variables/0/expression",
            json!("request.userInfo.username.substring('a')"),
        );
        expect_one(
            &errs,
            "spec.variables[0].expression: ",
            "found no matching overload for 'substring' applied to 'string.(string)'",
        );
        // A function newer than the apiserver: the semver library is 1.33's.
        let mut p = good();
        p["spec"]["variables"][0]["expression"] = json!("semver('1.2.3').major() > 0 ? 'a' : 'b'");
        assert!(errors(&p).is_empty());
        let old = check_policy(&p, &Library::kubernetes(32)).errors;
        assert_eq!(old.len(), 1, "{old:?}");
        assert!(old[0]
            .to_string()
            .contains("undeclared reference to 'semver'"));
    }

    #[test]
    fn typed_objects_have_only_their_fields() {
        let errs = refused("/spec/variables/0/expression", json!("request.user"));
        expect_one(
            &errs,
            "spec.variables[0].expression: ",
            "undefined field 'user'",
        );
        let errs = refused(
            "/spec/variables/0/expression",
            json!("namespaceObject.metadata.labelz"),
        );
        expect_one(
            &errs,
            "spec.variables[0].expression: ",
            "undefined field 'labelz'",
        );
        // `object` is dyn: anything goes, as in the apiserver.
        assert!(refused(
            "/spec/variables/0/expression",
            json!("object.whatever.at.all")
        )
        .is_empty());
    }

    #[test]
    fn a_message_expression_must_give_a_string_without_the_authorizer() {
        let errs = refused(
            "/spec/validations/0/messageExpression",
            json!("variables.ok"),
        );
        expect_one(
            &errs,
            "spec.validations[0].messageExpression: Invalid value: \"variables.ok\": ",
            "must evaluate to string but got bool",
        );
        let errs = refused(
            "/spec/validations/0/messageExpression",
            json!("authorizer.group('').resource('pods').check('create').reason()"),
        );
        expect_one(
            &errs,
            "spec.validations[0].messageExpression: ",
            "undeclared reference to 'authorizer'",
        );
        // The validation itself has the authorizer.
        assert!(refused(
            "/spec/validations/0/expression",
            json!("authorizer.group('').resource('pods').check('create').allowed()")
        )
        .is_empty());
    }

    #[test]
    fn a_validation_must_be_exactly_bool() {
        let errs = refused("/spec/validations/0/expression", json!("variables.user"));
        expect_one(
            &errs,
            "spec.validations[0].expression: Invalid value: \"variables.user\": ",
            "must evaluate to bool but got string",
        );
        // dyn is not bool either.
        let errs = refused(
            "/spec/validations/0/expression",
            json!("object.spec.hostNetwork"),
        );
        expect_one(
            &errs,
            "spec.validations[0].expression: ",
            "must evaluate to bool but got dyn",
        );
    }

    #[test]
    fn an_audit_annotation_value_over_5_kib_is_refused() {
        let long = format!("'{}'", "x".repeat(5 * 1024));
        let errs = refused("/spec/auditAnnotations/0/valueExpression", json!(long));
        expect_one(
            &errs,
            "spec.auditAnnotations[0].valueExpression: Required value: ",
            "must not exceed 5120 bytes in length",
        );
        let errs = refused(
            "/spec/auditAnnotations/0/valueExpression",
            json!("variables.ok"),
        );
        expect_one(
            &errs,
            "spec.auditAnnotations[0].valueExpression: ",
            "must evaluate to one of [string null_type] but got bool",
        );
        let errs = refused("/spec/auditAnnotations/0/key", json!("opt out"));
        expect_one(
            &errs,
            "spec.auditAnnotations[0].key: Invalid value: \"validate.tollgate.dev/opt out\": ",
            "name part must consist of",
        );
    }

    #[test]
    fn messages_reasons_and_literals_are_held_to_the_rules() {
        let errs = refused("/spec/validations/0/message", json!("two\nlines"));
        expect_one(
            &errs,
            "spec.validations[0].message: ",
            "must not contain line breaks",
        );
        let errs = refused("/spec/validations/0/reason", json!("Unauthorized"));
        expect_one(
            &errs,
            "spec.validations[0].reason: Unsupported value: \"Unauthorized\"",
            "Forbidden",
        );
        let errs = refused("/spec/variables/0/expression", json!("[1, 'a']"));
        expect_one(
            &errs,
            "spec.variables[0].expression: ",
            "expected type 'int' but found 'string'",
        );
        let errs = refused("/spec/variables/0/expression", json!("'a'.matches('(')"));
        expect_one(
            &errs,
            "spec.variables[0].expression: ",
            "invalid matches argument",
        );
    }

    #[test]
    fn bindings_are_checked() {
        let b = json!({
            "metadata": {"name": "validate.tollgate.dev"},
            "spec": {"policyName": "validate.tollgate.dev", "validationActions": ["Deny", "Warn"]},
        });
        let errs: Vec<String> = check_binding(&b).iter().map(|e| e.to_string()).collect();
        expect_one(
            &errs,
            "spec.validationActions: Invalid value: ",
            "must not contain both Deny and Warn",
        );
    }

    #[test]
    fn the_cost_count_follows_the_model() {
        let lib = Library::kubernetes(36);
        let p = good();
        let e = Evaluable::new(&p).unwrap();
        let containers: Vec<Value> = (0..3).map(|i| json!({"name": format!("c{i}")})).collect();
        let input = Input::new(
            &json!({"spec": {"containers": containers}}),
            &json!({"userInfo": {"username": "alice"}, "namespace": "ml"}),
            &json!({"metadata": {"name": "ml"}}),
        );
        let run = e.run(&lib, &input).unwrap();
        assert!(run.allowed, "{run:?}");
        assert!(run.errors.is_empty(), "{:?}", run.errors);
        // `has(request.userInfo.username) ? request.userInfo.username : ''`:
        // has: request (1) + userInfo (1) + the tested field (0); the true branch 3.
        assert_eq!(run.costs["spec.variables[0].expression"], 5);
        // `object.spec.containers.map(c, c.name)` over 3: the range 3, the initial `[]` 0
        // (a constant), per element the step `@result + [c.name]`: @result 1, the list
        // 10, c.name 2, `+` 1; the result 1.
        assert_eq!(run.costs["spec.variables[2].expression"], 3 + 3 * 14 + 1);
        // `size(variables.names) < 100 && variables.user != ''`: 2 + 1 + 1, and 2 + the
        // comparison of "alice" with "" (the shorter's size, 0, a tenth of it, 0).
        assert_eq!(run.costs["spec.variables[3].expression"], 4 + 2);
        assert_eq!(run.costs["spec.validations[0].expression"], 2);
        // The validations' filter: the expression and the variables it needed.
        assert_eq!(run.validations, 2 + 6 + 46 + 5);
        assert!(limit_violations(&run).is_empty());
        assert_eq!(run.message_bytes, ["pod by alice: c0, c1, c2".len()]);
    }

    #[test]
    fn the_cost_of_each_construct() {
        // (expression, how a validation reads it, its cost), the user being "alice".
        let cases = [
            // request, userInfo, username: 3; `+` of 5 and 5 characters: ceil(10 / 10).
            ("request.userInfo.username + 'xxxxx'", "!= ''", 3 + 1),
            // replace: ceil(5 * 2 / 10).
            (
                "request.userInfo.username.replace('a', 'b')",
                "!= ''",
                3 + 1,
            ),
            // A constant list 0; join: ceil(2 * 8 / 10) for "abc, def".
            ("['abc', 'def'].join(', ')", "!= ''", 2),
            // matches: ceil((1 + 5) / 10) * ceil(5 / 4).
            ("request.userInfo.username.matches('^a.*$')", "", 3 + 2),
            // A set lookup: only the element is charged.
            ("request.userInfo.username in ['alice', 'bob']", "", 3),
            // A list of a non-constant 10 + 3; the index of a non-attribute 2.
            ("[request.userInfo.username][0]", "!= ''", 10 + 3 + 2),
            // has: 1 + 0; size 3 + 1; `>` 1; `&&` nothing.
            (
                "has(request.namespace) && size(request.userInfo.username) > 3",
                "",
                1 + 5,
            ),
            // all over 3: the range 3; per element the condition
            // `@not_strictly_false(@result)` 2 and the step `@result && has(c.name)` 2; the
            // result 1.
            (
                "object.spec.containers.all(c, has(c.name))",
                "",
                3 + 3 * 4 + 1,
            ),
        ];
        let variables: Vec<Value> = cases
            .iter()
            .enumerate()
            .map(|(i, (e, _, _))| json!({"name": format!("e{i}"), "expression": e}))
            .collect();
        let validations: Vec<Value> = cases
            .iter()
            .enumerate()
            .map(|(i, (_, read, _))| json!({"expression": format!("variables.e{i} {read}")}))
            .collect();
        let mut p = good();
        p["spec"]["variables"] = json!(variables);
        p["spec"]["validations"] = json!(validations);
        p["spec"]["auditAnnotations"] = json!([]);
        assert_eq!(errors(&p), Vec::<String>::new());
        let containers: Vec<Value> = (0..3).map(|i| json!({"name": format!("c{i}")})).collect();
        let input = Input::new(
            &json!({"spec": {"containers": containers}}),
            &json!({"userInfo": {"username": "alice"}, "namespace": "ml"}),
            &json!({}),
        );
        let run = Evaluable::new(&p)
            .unwrap()
            .run(&Library::kubernetes(36), &input)
            .unwrap();
        assert!(run.allowed && run.errors.is_empty(), "{run:?}");
        for (i, (e, _, cost)) in cases.iter().enumerate() {
            assert_eq!(
                run.costs[&format!("spec.variables[{i}].expression")],
                *cost,
                "{e}"
            );
        }
    }
}
