//! CEL literals: strings, and globs as CEL conditions, for the expressions (`cel`) and
//! the guards of which pods a policy covers (`scope`) alike.

use std::fmt::Write as _;

use crate::glob::Glob;

/// Whether CEL string `subject` matches any of the globs: a name is compared, a glob is
/// an anchored RE2 pattern, and a run of stars is `true`. No globs: `false`.
pub(super) fn any_glob(globs: &[Glob], subject: &str) -> String {
    if globs.is_empty() {
        return "false".into();
    }
    let terms: Vec<String> = globs
        .iter()
        .map(|g| {
            let text = g.as_str();
            if text.chars().all(|c| c == '*') {
                "true".to_owned()
            } else if !text.contains(['*', '?']) {
                format!("{subject} == {}", lit(text))
            } else {
                format!("{subject}.matches({})", lit(&glob_to_re2(text)))
            }
        })
        .collect();
    if terms.iter().any(|t| t == "true") {
        return "true".into();
    }
    terms.join(" || ")
}

/// A glob (`*` any run, `?` one character, nothing escaped) as an anchored RE2 pattern
/// with every other metacharacter escaped. `(?s)` lets `.` match a line break, as `?`
/// does.
pub fn glob_to_re2(glob: &str) -> String {
    let mut out = String::from("(?s)^");
    for c in glob.chars() {
        match c {
            '*' => out.push_str(".*"),
            '?' => out.push('.'),
            '\\' | '.' | '+' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^' | '$' => {
                out.push('\\');
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out.push('$');
    out
}

/// A CEL string literal. Everything outside printable ASCII is escaped, so an expression
/// is plain ASCII whatever the policy holds.
pub fn lit(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('\'');
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            ' '..='~' => out.push(c),
            c if (c as u32) <= 0xffff => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_patterns_are_escaped() {
        assert_eq!(lit("a'b\\c"), r"'a\'b\\c'");
        assert_eq!(lit("é\n😀"), r"'\u00e9\u000a\U0001f600'");
        assert_eq!(glob_to_re2("ml-*"), "(?s)^ml-.*$");
        assert_eq!(glob_to_re2("a.b?(c)"), r"(?s)^a\.b.\(c\)$");
        assert_eq!(any_glob(&[], "x"), "false");
        assert_eq!(any_glob(&["**".into()], "x"), "true");
        assert_eq!(
            any_glob(&["a".into(), "b*".into()], "x"),
            "x == 'a' || x.matches('(?s)^b.*$')"
        );
    }
}
