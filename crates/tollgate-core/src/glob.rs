//! Shell-style patterns (`*` and `?`) for namespace, user and group names.
//!
//! The matching is `wildmatch`'s (`*` any run, `?` one character, no escapes, no
//! character classes); what this module adds is a pattern compiled once, when the policy
//! is loaded, that reads and writes as the text the policy file holds.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use wildmatch::WildMatch;

/// One pattern of the policy, compiled.
#[derive(Clone)]
pub struct Glob {
    text: String,
    matcher: WildMatch,
    /// No `*` or `?`: a plain name, compared as a string (most of a policy's user,
    /// group and controller names), which is far cheaper than the matcher on every
    /// opt-out.
    literal: bool,
}

impl Glob {
    pub fn new(text: &str) -> Glob {
        Glob {
            text: text.to_owned(),
            matcher: WildMatch::new(text),
            literal: !text.contains(['*', '?']),
        }
    }

    /// Whether `text` matches the whole pattern.
    pub fn matches(&self, text: &str) -> bool {
        if self.literal {
            self.text == text
        } else {
            self.matcher.matches(text)
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

#[cfg(test)]
mod tests {
    use super::Glob;

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

    /// A plain name compared as a string answers as the matcher would.
    #[test]
    fn literals_match_as_the_matcher_does() {
        let names = [
            "",
            "bob",
            "Bob",
            "system:masters",
            "system:serviceaccount:kube-system:job-controller",
            "system:serviceaccount:kube-system:job-controller-x",
            "ml-team-a",
        ];
        for pattern in names {
            let g = Glob::new(pattern);
            assert!(g.literal, "{pattern}");
            for text in names {
                assert_eq!(
                    g.matches(text),
                    wildmatch::WildMatch::new(pattern).matches(text),
                    "{pattern} / {text}"
                );
            }
        }
        assert!(!Glob::new("ml-*").literal);
        assert!(!Glob::new("team-?").literal);
    }

    #[test]
    fn reads_and_writes_as_its_text() {
        let g: Glob = serde_json::from_str("\"ml-*\"").unwrap();
        assert_eq!(g.as_str(), "ml-*");
        assert_eq!(serde_json::to_string(&g).unwrap(), "\"ml-*\"");
        assert_eq!(g, Glob::from("ml-*"));
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
