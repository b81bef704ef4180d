//! Shell-style patterns (`*` and `?`) for namespace, user and group names.
//!
//! The matching is `wildmatch`'s (`*` any run, `?` one character, no escapes, no
//! character classes); what this module adds is a pattern compiled once, when the policy
//! is loaded, that reads and writes as the text the policy file holds. The shapes policies
//! mostly hold (a plain name, `prefix-*`, `*`) are compared directly: profile matching runs
//! them on every review.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use wildmatch::WildMatch;

/// One pattern of the policy, compiled.
#[derive(Clone)]
pub struct Glob {
    text: String,
    matcher: Matcher,
}

#[derive(Clone)]
enum Matcher {
    /// No wildcard: the text itself.
    Exact,
    /// `*`.
    Any,
    /// `prefix*`, the prefix without wildcards.
    Prefix,
    /// Anything else.
    Wild(WildMatch),
}

impl Glob {
    pub fn new(text: &str) -> Glob {
        let wild = |c: char| c == '*' || c == '?';
        let matcher = match text.strip_suffix('*') {
            _ if !text.contains(wild) => Matcher::Exact,
            Some("") => Matcher::Any,
            Some(prefix) if !prefix.contains(wild) => Matcher::Prefix,
            _ => Matcher::Wild(WildMatch::new(text)),
        };
        Glob {
            text: text.to_owned(),
            matcher,
        }
    }

    /// Whether `text` matches the whole pattern.
    pub fn matches(&self, text: &str) -> bool {
        match &self.matcher {
            Matcher::Exact => self.text == text,
            Matcher::Any => true,
            Matcher::Prefix => text.starts_with(&self.text[..self.text.len() - 1]),
            Matcher::Wild(w) => w.matches(text),
        }
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// Whether any of `patterns` matches `text`.
pub fn any(patterns: &[Glob], text: &str) -> bool {
    patterns.iter().any(|p| p.matches(text))
}

impl From<&str> for Glob {
    fn from(text: &str) -> Glob {
        Glob::new(text)
    }
}

impl PartialEq for Glob {
    fn eq(&self, other: &Glob) -> bool {
        self.text == other.text
    }
}

impl Eq for Glob {}

impl fmt::Debug for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl Serialize for Glob {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Glob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Glob, D::Error> {
        String::deserialize(d).map(|t| Glob::new(&t))
    }
}

/// A pattern is written as its text (the CRDs' schemas, `objects::crd`).
impl schemars::JsonSchema for Glob {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Glob".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string"})
    }
}

#[cfg(test)]
mod tests {
    use super::Glob;
    use wildmatch::WildMatch;

    fn matches(pattern: &str, text: &str) -> bool {
        Glob::new(pattern).matches(text)
    }

    #[test]
    fn globs() {
        assert!(matches("*", ""));
        assert!(matches("*", "ml"));
        assert!(matches("ml-*", "ml-team-a"));
        assert!(!matches("ml-*", "ops"));
        assert!(matches(
            "system:serviceaccount:*:trainer",
            "system:serviceaccount:ml:trainer"
        ));
        assert!(matches("team-?", "team-a"));
        assert!(!matches("team-?", "team-ab"));
        assert!(matches("a*b*c", "aXXbYYc"));
        assert!(!matches("a*b*c", "aXXbYY"));
        assert!(matches("exact", "exact"));
        assert!(!matches("exact", "exactly"));
    }

    #[test]
    fn reads_and_writes_as_its_text() {
        let g: Glob = serde_json::from_str("\"ml-*\"").unwrap();
        assert_eq!(g.as_str(), "ml-*");
        assert_eq!(serde_json::to_string(&g).unwrap(), "\"ml-*\"");
        assert_eq!(g, Glob::from("ml-*"));
    }

    /// The direct comparisons agree with wildmatch on every shape they take.
    #[test]
    fn fast_shapes_agree_with_wildmatch() {
        let texts = ["", "ml", "ml-", "ml-a", "team-ml", "m", "ml*", "x?"];
        for pattern in [
            "ml", "", "*", "ml-*", "ml*", "*ml", "m?", "ml-*-x", "**", "ml**",
        ] {
            for text in texts {
                assert_eq!(
                    Glob::new(pattern).matches(text),
                    WildMatch::new(pattern).matches(text),
                    "{pattern:?} on {text:?}"
                );
            }
        }
    }

    /// Many stars against a long name that does not match: the backtracking stays linear
    /// per star, never exponential.
    #[test]
    fn pathological_patterns_stay_fast() {
        let pattern = "*a".repeat(30) + "b";
        let text = "a".repeat(5000);
        assert!(!matches(&pattern, &text));
    }
}
