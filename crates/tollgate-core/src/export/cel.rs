//! The CEL of one exported policy: its variables, its validation and messages, its audit
//! annotations, each filled from the same message templates as the webhook's (`words`,
//! `validate`, `optout`), so that both say the same.

use std::fmt::Write as _;

use super::literal::{any_glob, lit};
use super::scope::Scope;
use super::yaml::Node;
use super::FALLBACK_MESSAGE;
use crate::optout::{APPROVED_FOR, AUDIT_NOTE, NOT_APPROVED, NOT_FOR_USER, NOT_IN_NAMESPACE};
use crate::pod::{ContainerKind, GENERATED_SUFFIX, SIDECAR_RESTART_POLICY, TRUE_VALUE, UNNAMED};
use crate::policy::Mode;
use crate::validate::{
    example_amount, CONTAINER_LINE, EXAMPLE_LINE, FIX_LINES, HEADLINE, MISSING_AUDIT_KEY,
    OFFER_LINE, OPT_OUT_AUDIT_KEY, REFUSED_LINE, SUMMARY_ENTRY, SUMMARY_RESOURCE_SEPARATOR,
    SUMMARY_SEPARATOR, WARN_CONTAINER, WARN_FIX, WARN_FIX_SEPARATOR, WARN_OR,
};
use crate::words::{join_words, Piece, Template, AND, COMMA};

/// The CEL of one scope.
pub(super) struct Cel<'a> {
    scope: &'a Scope<'a>,
}

/// `has(c.resources) && has(c.resources.requests) && r in c.resources.requests`: whether
/// container `c` requests resource `r` (both CEL expressions).
fn asks(c: &str, r: &str) -> String {
    format!("has({c}.resources) && has({c}.resources.requests) && {r} in {c}.resources.requests")
}

impl<'a> Cel<'a> {
    pub(super) fn new(scope: &'a Scope<'a>) -> Self {
        Cel { scope }
    }

    fn required(&self) -> &[String] {
        &self.scope.validation.required_requests
    }

    pub(super) fn variables(&self) -> Node {
        let o = self.scope.opt_out;
        let annotation = lit(&o.annotation);
        let anyone = o.users.is_empty() && o.groups.is_empty();
        let mut who = vec![];
        if !o.users.is_empty() {
            who.push(any_glob(&o.users, "variables.user"));
        }
        if !o.groups.is_empty() {
            who.push(format!(
                "has(request.userInfo.groups) && request.userInfo.groups.exists(g, {})",
                any_glob(&o.groups, "g")
            ));
        }
        let who = if anyone {
            "true".to_owned()
        } else {
            who.join(" || ")
        };
        let required = format!(
            "[{}]",
            self.required()
                .iter()
                .map(|r| lit(r))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let missing_among = |list: &str| {
            format!(
                "{list}.filter(c, !variables.needed.all(r, {}))",
                asks("c", "r")
            )
        };
        let mut vars = vec![];
        if let Some(guard) = &self.scope.guard {
            vars.push(("inScope", guard.clone()));
        }
        vars.extend([
            // `pod::annotation_is_true`: cel-go's `trim` is Go's strings.TrimSpace, which
            // strips what Unicode calls White_Space, as Rust's `str::trim` does.
            (
                "optOutAsked",
                format!(
                    "has(object.metadata.annotations) && {annotation} in object.metadata.annotations \
                     && object.metadata.annotations[{annotation}].trim().lowerAscii() == {}",
                    lit(TRUE_VALUE)
                ),
            ),
            (
                "requestNamespace",
                "has(request.namespace) ? request.namespace : ''".to_owned(),
            ),
            (
                "user",
                "has(request.userInfo.username) ? request.userInfo.username : ''".to_owned(),
            ),
            // Evaluated only where a message names the user: variables are lazy.
            (
                "userQuoted",
                concat(&[
                    Part::Text("\"".into()),
                    Part::Cel(escape_any("variables.user")),
                    Part::Text("\"".into()),
                ]),
            ),
            ("optOutNamespace", any_glob(&o.namespaces, "variables.requestNamespace")),
            // `optout::is_controller`: a controller's pod opts out only with tollgate's
            // approval from its template, and a controller is never permitted on its own.
            ("controller", any_glob(&o.controllers, "variables.user")),
            (
                "approvedBy",
                format!(
                    "has(object.metadata.annotations) && {approval} in object.metadata.annotations \
                     ? object.metadata.annotations[{approval}] : ''",
                    approval = lit(&o.approval_annotation)
                ),
            ),
            (
                "optOutPermitted",
                if who == "true" {
                    "variables.optOutNamespace && !variables.controller".to_owned()
                } else {
                    format!("variables.optOutNamespace && !variables.controller && ({who})")
                },
            ),
            (
                "optOutHonoured",
                "variables.optOutAsked && (variables.controller \
                 ? variables.optOutNamespace && variables.approvedBy != '' \
                 : variables.optOutPermitted)"
                    .to_owned(),
            ),
            (
                "needed",
                format!(
                    "{required}.filter(r, !(has(object.spec.resources) \
                     && has(object.spec.resources.requests) && r in object.spec.resources.requests))"
                ),
            ),
            (
                "initMissing",
                missing_among(
                    "(has(object.spec.initContainers) ? object.spec.initContainers : [])",
                ),
            ),
            (
                "regularMissing",
                missing_among("(has(object.spec.containers) ? object.spec.containers : [])"),
            ),
            ("ok", self.ok()),
        ]);
        Node::List(
            vars.into_iter()
                .map(|(name, expr)| {
                    Node::Map(vec![
                        ("name", Node::plain(name)),
                        ("expression", Node::cel(&expr)),
                    ])
                })
                .collect(),
        )
    }

    /// Whether the pod passes: honoured opt-out, or nothing missing.
    fn ok(&self) -> String {
        let core = "variables.optOutHonoured || \
                    (size(variables.initMissing) == 0 && size(variables.regularMissing) == 0)";
        match &self.scope.guard {
            Some(_) => format!("!variables.inScope || {core}"),
            None => core.to_owned(),
        }
    }

    pub(super) fn validations(&self) -> Node {
        let message = match self.scope.validation.mode {
            Mode::Enforce | Mode::Audit => self.denial_message(),
            Mode::Warn => self.warn_message(),
        };
        Node::List(vec![Node::Map(vec![
            ("expression", Node::cel("variables.ok")),
            // Computed only for pods that fail: the apiserver evaluates it either way.
            (
                "messageExpression",
                Node::cel(&format!("variables.ok ? '' :\n{message}")),
            ),
            ("message", Node::string(FALLBACK_MESSAGE)),
            ("reason", Node::plain("Forbidden")),
        ])])
    }

    pub(super) fn audit_annotations(&self) -> Node {
        let mut out = vec![(OPT_OUT_AUDIT_KEY, self.opt_out_note())];
        if matches!(self.scope.validation.mode, Mode::Warn | Mode::Audit) {
            let per = |list: &str, noun: &Hole| {
                format!(
                    "{list}.map(c, {})",
                    fill(
                        SUMMARY_ENTRY,
                        &[
                            ("noun", noun.clone()),
                            ("container", cel("c.name")),
                            (
                                "resources",
                                cel(&format!(
                                    "{}.join({})",
                                    lacking("c"),
                                    lit(SUMMARY_RESOURCE_SEPARATOR)
                                )),
                            ),
                        ]
                    )
                )
            };
            out.push((
                MISSING_AUDIT_KEY,
                format!(
                    "variables.ok ? '' : ({} + {}).join({})",
                    per("variables.initMissing", &cel(&init_noun("c"))),
                    per(
                        "variables.regularMissing",
                        &text(ContainerKind::Regular.noun())
                    ),
                    lit(SUMMARY_SEPARATOR)
                ),
            ));
        }
        Node::List(
            out.into_iter()
                .map(|(key, expr)| {
                    Node::Map(vec![
                        ("key", Node::plain(key)),
                        ("valueExpression", Node::cel(&expr)),
                    ])
                })
                .collect(),
        )
    }

    fn opt_out_note(&self) -> String {
        let honoured = match &self.scope.guard {
            Some(_) => "variables.inScope && variables.optOutHonoured",
            None => "variables.optOutHonoured",
        };
        let note = fill_parts(
            AUDIT_NOTE,
            &[
                ("user", cel("variables.userQuoted")),
                ("namespace", quoted("variables.requestNamespace")),
            ],
        );
        format!(
            "{honoured} ? (variables.controller ? {} : {}) : ''",
            fill(
                APPROVED_FOR,
                &[
                    ("note", note.clone()),
                    (
                        "by",
                        vec![
                            Part::Text("\"".into()),
                            Part::Cel(escape_any("variables.approvedBy")),
                            Part::Text("\"".into()),
                        ]
                    ),
                ]
            ),
            concat(&note)
        )
    }

    /// `validate::denial_message` on one line, from the same templates.
    fn denial_message(&self) -> String {
        let required = self.required();
        let line = |list: &str, noun: Hole| {
            format!(
                "{list}.map(c, {})",
                fill(
                    CONTAINER_LINE.unindented(),
                    &[
                        ("noun", noun),
                        ("container", quoted("c.name")),
                        ("resources", cel(&join_words_cel(&lacking("c")))),
                    ]
                )
            )
        };
        let mut parts = vec![
            fill(
                HEADLINE,
                &[
                    ("pod", quoted(&pod_name())),
                    ("required", text(&join_words(required))),
                ],
            ),
            format!(
                "' ' + ({} + {}).join(' ')",
                line("variables.initMissing", cel(&init_noun("c"))),
                line(
                    "variables.regularMissing",
                    text(ContainerKind::Regular.noun())
                )
            ),
            lit(&format!(
                " {}",
                FIX_LINES
                    .iter()
                    .map(|l| Template(l).unindented().0)
                    .collect::<Vec<_>>()
                    .join(" ")
            )),
        ];
        for r in required {
            parts.push(format!(
                "({} in variables.needed && (variables.initMissing + variables.regularMissing).exists(c, !({})) ? {} : '')",
                lit(r),
                asks("c", &lit(r)),
                lit(&format!(
                    " {}",
                    EXAMPLE_LINE
                        .unindented()
                        .fill(&[("resource", r), ("amount", example_amount(r))])
                ))
            ));
        }
        parts.push(self.opt_out_line());
        parts.join("\n+ ")
    }

    /// The last line: why an opt-out is refused, or where it would be honoured.
    fn opt_out_line(&self) -> String {
        let annotation = &self.scope.opt_out.annotation;
        let ns = quoted("variables.requestNamespace");
        let why = format!(
            "(!variables.optOutNamespace ? {} : variables.controller ? {} : {})",
            fill(
                NOT_IN_NAMESPACE,
                &[("annotation", text(annotation)), ("namespace", ns.clone()),]
            ),
            fill(
                NOT_APPROVED,
                &[
                    ("annotation", text(annotation)),
                    ("controller", cel("variables.user")),
                    ("approval", text(&self.scope.opt_out.approval_annotation)),
                ]
            ),
            fill(
                NOT_FOR_USER,
                &[
                    ("annotation", text(annotation)),
                    ("user", cel("variables.userQuoted")),
                    ("namespace", ns),
                ]
            )
        );
        format!(
            "(variables.optOutAsked && !variables.optOutHonoured ? {} \
             : !variables.optOutAsked && variables.optOutPermitted ? {} : '')",
            fill(
                Template(" {line}"),
                &[("line", fill_parts(REFUSED_LINE, &[("why", cel(&why))]))]
            ),
            fill(
                Template(" {line}"),
                &[(
                    "line",
                    fill_parts(OFFER_LINE, &[("annotation", text(annotation))])
                )]
            )
        )
    }

    /// The webhook's warn-mode warnings, on one line.
    fn warn_message(&self) -> String {
        let line = |list: &str, noun: Hole| {
            format!(
                "{list}.map(c, {})",
                fill(
                    WARN_CONTAINER,
                    &[
                        ("noun", noun),
                        ("container", quoted("c.name")),
                        (
                            "resources",
                            cel(&format!("{}.join({})", lacking("c"), lit(WARN_OR))),
                        ),
                    ]
                )
            )
        };
        [
            format!(
                "({} + {}).join(' ')",
                line("variables.initMissing", cel(&init_noun("c"))),
                line(
                    "variables.regularMissing",
                    text(ContainerKind::Regular.noun())
                )
            ),
            lit(" "),
            fill(
                WARN_FIX,
                &[("required", text(&self.required().join(WARN_FIX_SEPARATOR)))],
            ),
        ]
        .join("\n+ ")
    }
}

/// The required resources container `c` does not request (pod-level requests already
/// taken out), in the policy's order.
fn lacking(c: &str) -> String {
    format!("variables.needed.filter(r, !({}))", asks(c, "r"))
}

/// What `ContainerKind::noun` says of init container `c`.
fn init_noun(c: &str) -> String {
    format!(
        "(has({c}.restartPolicy) && {c}.restartPolicy == {} ? {} : {})",
        lit(SIDECAR_RESTART_POLICY),
        lit(ContainerKind::Sidecar.noun()),
        lit(ContainerKind::Init.noun())
    )
}

/// `pod::display_name` in CEL.
fn pod_name() -> String {
    format!(
        "(has(object.metadata.name) && object.metadata.name != '' ? object.metadata.name \
         : has(object.metadata.generateName) && object.metadata.generateName != '' \
         ? object.metadata.generateName + {} : {})",
        lit(GENERATED_SUFFIX),
        lit(UNNAMED)
    )
}

/// `words::join_words` of a CEL list of strings, without list slicing (not in Kubernetes
/// 1.30): the items joined, then the last separator replaced. A resource name holds no
/// whitespace (the policy refuses one), so the last `, ` is the one before the last item.
/// `[x].map(l, ...)[0]` binds `x` once.
fn join_words_cel(list: &str) -> String {
    let comma = lit(COMMA);
    format!(
        "[{list}].map(l, size(l) < 2 ? l.join({comma}) \
         : [l.join({comma})].map(s, s.substring(0, s.lastIndexOf({comma})))[0] + {} + l[size(l) - 1])[0]",
        lit(AND)
    )
}

/// The inside of `words::quote` of any string (a user name): Rust's `{:?}` escapes for
/// every ASCII character. Outside ASCII, `{:?}` also escapes what Unicode calls non-printable or
/// grapheme-extending (`\u{200b}`, a combining accent); CEL passes those through, a
/// difference deploy/README.md lists.
fn escape_any(expr: &str) -> String {
    let mut out = expr.to_owned();
    for (c, esc) in [
        ('\\', "\\\\"),
        ('"', "\\\""),
        ('\t', "\\t"),
        ('\r', "\\r"),
        ('\n', "\\n"),
        ('\0', "\\0"),
    ] {
        let _ = write!(out, ".replace({}, {})", lit(&c.to_string()), lit(esc));
    }
    for b in (1u8..0x20).chain([0x7f]) {
        let c = char::from(b);
        if matches!(c, '\t' | '\r' | '\n') {
            continue;
        }
        let _ = write!(
            out,
            ".replace({}, {})",
            lit(&c.to_string()),
            lit(&c.escape_debug().to_string())
        );
    }
    out
}

/// Part of what fills a hole: text known now, or a CEL string expression.
#[derive(Debug, Clone)]
enum Part {
    Text(String),
    Cel(String),
}

/// What fills a hole.
type Hole = Vec<Part>;

fn text(t: &str) -> Hole {
    vec![Part::Text(t.to_owned())]
}

fn cel(e: &str) -> Hole {
    vec![Part::Cel(e.to_owned())]
}

/// `words::quote` of a name the apiserver has checked to be a DNS label or subdomain
/// (pod, generateName, container and namespace names): nothing in it needs escaping.
fn quoted(e: &str) -> Hole {
    vec![
        Part::Text("\"".into()),
        Part::Cel(e.to_owned()),
        Part::Text("\"".into()),
    ]
}

/// A template as a CEL string expression: its text and the holes' values concatenated,
/// adjacent texts merged into one literal.
fn fill(template: Template, holes: &[(&str, Hole)]) -> String {
    concat(&fill_parts(template, holes))
}

/// A template's text and the holes' values, in order.
fn fill_parts(template: Template, holes: &[(&str, Hole)]) -> Hole {
    let mut parts: Vec<Part> = vec![];
    for piece in template.pieces() {
        match piece {
            Piece::Text(t) => parts.push(Part::Text(t.to_owned())),
            Piece::Hole(h) => match holes.iter().find(|(k, _)| *k == h) {
                Some((_, v)) => parts.extend(v.iter().cloned()),
                None => parts.push(Part::Text(format!("{{{h}}}"))),
            },
        }
    }
    parts
}

/// Parts as one CEL string expression, adjacent texts merged into one literal.
fn concat(parts: &[Part]) -> String {
    let mut out: Vec<String> = vec![];
    let mut text = String::new();
    for part in parts {
        match part {
            Part::Text(t) => text.push_str(t),
            Part::Cel(e) => {
                if !text.is_empty() {
                    out.push(lit(&std::mem::take(&mut text)));
                }
                out.push(e.clone());
            }
        }
    }
    if !text.is_empty() || out.is_empty() {
        out.push(lit(&text));
    }
    out.join(" + ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_become_concatenations() {
        let t = Template("pod {pod} needs {what}.");
        assert_eq!(
            fill(t, &[("pod", quoted("p")), ("what", text("cpu"))]),
            "'pod \"' + p + '\" needs cpu.'"
        );
        assert_eq!(fill(Template("{x}"), &[("x", cel("e"))]), "e");
        assert_eq!(fill(Template(""), &[]), "''");
    }
}
