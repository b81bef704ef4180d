//! Names: k8s.io/apimachinery `pkg/util/validation/validation.go`, and validation.go's
//! CEL identifiers.

use std::sync::OnceLock;

use regex::Regex;

fn regex(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("a valid pattern"))
}

/// `IsDNS1123Subdomain`: object names (`NameIsDNSSubdomain`), the binding's policyName,
/// a qualified name's prefix.
pub(crate) fn dns1123_subdomain_errors(s: &str) -> Vec<String> {
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
pub(crate) fn qualified_name_errors(s: &str) -> Vec<String> {
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
pub(crate) fn label_value_errors(s: &str) -> Vec<String> {
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
