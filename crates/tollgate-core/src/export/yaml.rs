//! Just enough YAML for a ValidatingAdmissionPolicy and its binding, written by hand: maps
//! in the order written (as a reader expects them), CEL as literal blocks with its line
//! breaks, every other string as a JSON string where YAML could misread it.

use std::fmt::Write as _;

/// Just enough YAML for the two objects: maps in the order written, lists, and three
/// kinds of scalar.
#[derive(Debug, Clone)]
pub(super) enum Node {
    Map(Vec<(&'static str, Node)>),
    /// A map whose keys are data (labels).
    Entries(Vec<(String, Node)>),
    List(Vec<Node>),
    /// Written as it is: words that read the same in YAML (Fail, v1, CREATE).
    Plain(String),
    /// Written as a JSON string, which YAML reads as a double-quoted scalar.
    Str(String),
    /// A CEL expression: a literal block, line breaks kept.
    Cel(String),
}

impl Node {
    pub(super) fn plain(s: &str) -> Node {
        Node::Plain(s.to_owned())
    }

    pub(super) fn string(s: &str) -> Node {
        Node::Str(s.to_owned())
    }

    pub(super) fn cel(s: &str) -> Node {
        Node::Cel(s.to_owned())
    }

    pub(super) fn write(&self, out: &mut String, indent: usize) {
        match self {
            Node::Map(entries) => {
                for (k, v) in entries {
                    write_entry(out, indent, &key_text(k), v);
                }
            }
            Node::Entries(entries) => {
                for (k, v) in entries {
                    write_entry(out, indent, &key_text(k), v);
                }
            }
            _ => {}
        }
    }
}

/// Whether YAML reads `s` written plain back as the same string: a word of letters,
/// digits and `./-_` that starts with a letter and is none of YAML 1.1's booleans or null.
fn plain_safe(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '/' | '-' | '_'))
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "y" | "n" | "yes" | "no" | "true" | "false" | "on" | "off" | "null"
        )
}

/// A string scalar: plain when that reads back the same, else a JSON string, which YAML
/// reads as a double-quoted scalar.
fn scalar(s: &str) -> String {
    if plain_safe(s) {
        s.to_owned()
    } else {
        serde_json::to_string(s).unwrap_or_default()
    }
}

fn key_text(k: &str) -> String {
    scalar(k)
}

/// One `key: value` of a map at `indent`.
fn write_entry(out: &mut String, indent: usize, key: &str, v: &Node) {
    let pad = " ".repeat(indent);
    match v {
        Node::Map(m) if m.is_empty() => {
            let _ = writeln!(out, "{pad}{key}: {{}}");
        }
        Node::Entries(m) if m.is_empty() => {
            let _ = writeln!(out, "{pad}{key}: {{}}");
        }
        Node::Map(_) | Node::Entries(_) => {
            let _ = writeln!(out, "{pad}{key}:");
            v.write(out, indent + 2);
        }
        Node::List(items) if items.is_empty() => {
            let _ = writeln!(out, "{pad}{key}: []");
        }
        Node::List(items) => {
            let _ = writeln!(out, "{pad}{key}:");
            for item in items {
                write_item(out, indent + 2, item);
            }
        }
        Node::Plain(s) => {
            let _ = writeln!(out, "{pad}{key}: {s}");
        }
        Node::Str(s) => {
            let _ = writeln!(out, "{pad}{key}: {}", scalar(s));
        }
        Node::Cel(s) if plain_safe(s) => {
            let _ = writeln!(out, "{pad}{key}: {s}");
        }
        Node::Cel(s) => {
            let _ = writeln!(out, "{pad}{key}: |-");
            for line in s.lines() {
                let _ = writeln!(out, "{pad}  {line}");
            }
        }
    }
}

/// One `- item` of a list at `indent`.
fn write_item(out: &mut String, indent: usize, item: &Node) {
    let pad = " ".repeat(indent);
    match item {
        Node::Map(entries) if !entries.is_empty() => {
            let mut first = String::new();
            write_entry(&mut first, 0, &key_text(entries[0].0), &entries[0].1);
            // The first entry goes after the dash; what it wrote below it, and the other
            // entries, are indented past the dash.
            let mut lines = first.lines();
            if let Some(head) = lines.next() {
                let _ = writeln!(out, "{pad}- {head}");
            }
            for l in lines {
                let _ = writeln!(out, "{pad}  {l}");
            }
            for (k, v) in &entries[1..] {
                write_entry(out, indent + 2, &key_text(k), v);
            }
        }
        Node::Plain(s) => {
            let _ = writeln!(out, "{pad}- {s}");
        }
        Node::Str(s) => {
            let _ = writeln!(out, "{pad}- {}", scalar(s));
        }
        other => {
            let _ = writeln!(out, "{pad}-");
            let mut nested = String::new();
            other.write(&mut nested, indent + 2);
            out.push_str(&nested);
        }
    }
}
