//! The functions of Kubernetes' CEL environment (k8s.io/apiserver
//! `pkg/cel/environment/base.go` `baseOpts`), by the minor version each arrived in: a call
//! is checked against these overloads, and a name that is not here is an undeclared
//! reference, as in cel-go.

use std::collections::HashMap;

use crate::types::{parse_type, split_top, Type};

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
pub(crate) const TYPE_IDENTS: [(&str, &str); 11] = [
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
pub(crate) struct Overload {
    pub(crate) member: bool,
    pub(crate) params: Vec<Type>,
    pub(crate) result: Type,
}

/// The functions and macros of the environment at one Kubernetes minor version.
pub struct Library {
    pub minor: u32,
    pub(crate) functions: HashMap<String, Vec<Overload>>,
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

    pub(crate) fn has_function(&self, name: &str) -> bool {
        self.functions.contains_key(name)
    }

    pub(crate) fn has_macro(&self, name: &str, args: usize) -> bool {
        MACROS
            .iter()
            .any(|&(since, n, a)| n == name && a == args && since <= self.minor)
    }
}
