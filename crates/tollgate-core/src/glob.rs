//! Shell-style patterns (`*` and `?`) for namespace, user and group names.

/// Whether `text` matches `pattern`, where `*` matches any run and `?` one character.
pub fn matches(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative match with single-star backtracking: linear in practice, never exponential.
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// Whether any of `patterns` matches `text`.
pub fn any(patterns: &[String], text: &str) -> bool {
    patterns.iter().any(|p| matches(p, text))
}

#[cfg(test)]
mod tests {
    use super::matches;

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
}
