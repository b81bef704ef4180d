//! The words of tollgate's messages, as templates with named holes.
//!
//! The webhook fills a template with text; `export` fills the same template with CEL
//! expressions, so that a ValidatingAdmissionPolicy's message says what the webhook says
//! because both are written from one definition, not because two copies were kept in step.

/// A message with holes written `{name}`. Holes have no escape: no message needs a brace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Template(pub &'static str);

/// A part of a template: literal text, or the name of a hole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Piece {
    Text(&'static str),
    Hole(&'static str),
}

impl Template {
    /// The template's parts in order; empty texts are left out.
    pub(crate) fn pieces(self) -> Vec<Piece> {
        let mut out = vec![];
        let mut rest = self.0;
        while let Some(open) = rest.find('{') {
            let Some(len) = rest[open..].find('}') else {
                break;
            };
            if open > 0 {
                out.push(Piece::Text(&rest[..open]));
            }
            out.push(Piece::Hole(&rest[open + 1..open + len]));
            rest = &rest[open + len + 1..];
        }
        if !rest.is_empty() {
            out.push(Piece::Text(rest));
        }
        out
    }

    /// The template with each hole replaced by its value. A hole without a value stays
    /// as written, which the tests of each message would show at once.
    pub(crate) fn fill(self, values: &[(&str, &str)]) -> String {
        let mut out = String::with_capacity(self.0.len() + 32);
        self.fill_into(&mut out, values);
        out
    }

    /// [`Template::fill`], appended to `out`. One pass over the text, no allocation of its
    /// own: a denial message is a dozen of these on the review path (measured: the
    /// `pieces` list per fill cost a denied pod's review 9k instructions of 78k).
    pub(crate) fn fill_into(self, out: &mut String, values: &[(&str, &str)]) {
        let mut rest = self.0;
        while let Some(open) = rest.find('{') {
            let Some(len) = rest[open..].find('}') else {
                break;
            };
            out.push_str(&rest[..open]);
            let hole = &rest[open + 1..open + len];
            match values.iter().find(|(k, _)| *k == hole) {
                Some((_, v)) => out.push_str(v),
                None => {
                    out.push('{');
                    out.push_str(hole);
                    out.push('}');
                }
            }
            rest = &rest[open + len + 1..];
        }
        out.push_str(rest);
    }

    /// The template without the spaces that indent it as a line of a multi-line message.
    pub(crate) fn unindented(self) -> Template {
        Template(self.0.trim_start_matches(' '))
    }
}

/// "a, b and c": the separator between all but the last two items, and before the last.
pub(crate) const COMMA: &str = ", ";
pub(crate) const AND: &str = " and ";

/// Items as a person lists them: "cpu", "cpu and memory", "cpu, memory and nvidia.com/gpu".
pub(crate) fn join_words(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{}{AND}{last}", init.join(COMMA)),
    }
}

/// Alternatives as a person lists them: "alice", "alice or bob", "alice, bob or carol".
pub(crate) fn join_or(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {last}", init.join(COMMA)),
    }
}

/// A name in double quotes, escaped as Rust's `{:?}` does (which is what every message of
/// the webhook has always written).
pub(crate) fn quote(text: &str) -> String {
    // Printable ASCII but the quote and the backslash is written as it is by `{:?}`: nearly
    // every pod, container, user and namespace name, quoted here without `Debug`'s per-char
    // escaping (an opted-out pod's audit note cost 2.8k instructions with it).
    if text
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        let mut out = String::with_capacity(text.len() + 2);
        out.push('"');
        out.push_str(text);
        out.push('"');
        return out;
    }
    format!("{text:?}")
}

/// A multi-line message on one line, the way a ValidatingAdmissionPolicy must say it (the
/// apiserver drops a message that holds a line break): each line without its indentation,
/// the lines joined by one space.
pub fn one_line<'a>(lines: impl IntoIterator<Item = &'a str>) -> String {
    lines
        .into_iter()
        .map(|l| l.trim_start_matches(' '))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_is_debug() {
        for t in [
            "",
            "jupyter",
            "a b",
            "q\"x",
            "back\\slash",
            "tab\t",
            "dél",
            "日本",
            "\u{7f}",
            "~",
            " ",
        ] {
            assert_eq!(quote(t), format!("{t:?}"), "{t}");
        }
    }

    #[test]
    fn templates_split_into_text_and_holes() {
        let t = Template("pod {pod} lacks {what}.");
        assert_eq!(
            t.pieces(),
            [
                Piece::Text("pod "),
                Piece::Hole("pod"),
                Piece::Text(" lacks "),
                Piece::Hole("what"),
                Piece::Text("."),
            ]
        );
        assert_eq!(
            t.fill(&[("pod", "\"a\""), ("what", "cpu")]),
            "pod \"a\" lacks cpu."
        );
        assert_eq!(t.fill(&[("pod", "x")]), "pod x lacks {what}.");
        assert_eq!(
            Template("{a}{b}").pieces(),
            [Piece::Hole("a"), Piece::Hole("b")]
        );
        assert_eq!(Template("  - {x}").unindented(), Template("- {x}"));
    }

    #[test]
    fn words_are_joined_as_a_person_lists_them() {
        let w =
            |items: &[&str]| join_words(&items.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(w(&[]), "");
        assert_eq!(w(&["cpu"]), "cpu");
        assert_eq!(w(&["cpu", "memory"]), "cpu and memory");
        assert_eq!(w(&["a", "b", "c"]), "a, b and c");
    }

    #[test]
    fn one_line_drops_indentation_and_line_breaks() {
        assert_eq!(one_line("a:\n  - b\n    c".split('\n')), "a: - b c");
        assert_eq!(quote("a\"b\\c\n"), r#""a\"b\\c\n""#);
    }
}
