//! The validation half of a policy as a ValidatingAdmissionPolicy and its binding
//! (`admissionregistration.k8s.io/v1`, Kubernetes 1.30+), which the apiserver evaluates in
//! process: no webhook call, no TLS, no timeout, and no outage to fail open or closed on.
//!
//! Policy in, YAML text out. The CEL decides what `validate::validate` decides for a pod
//! CREATE: every container and init container requests what the policy lists (pod-level
//! requests count for the resources they name), unless the pod opts out where `optOut`
//! allows it; the messages are filled from the same templates as the webhook's (`words`,
//! `validate`, `optout`). `tests/export_equivalence.rs` evaluates the output against the
//! engine. The expressions keep to what Kubernetes 1.30's CEL environment has (the
//! standard macros, `matches`, and the strings extension's `join`, `lastIndexOf`,
//! `lowerAscii`, `replace`, `substring` and `trim`) and avoid optional types, `cel.bind`
//! and list slicing, which it lacks or which the test's interpreter lacks.

use std::fmt::Write as _;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::glob::Glob;
use crate::optout::{APPROVED_FOR, AUDIT_NOTE, NOT_APPROVED, NOT_FOR_USER, NOT_IN_NAMESPACE};
use crate::pod::{ContainerKind, GENERATED_SUFFIX, SIDECAR_RESTART_POLICY, TRUE_VALUE, UNNAMED};
use crate::policy::{Mode, Operation, OptOut, Policy, ProfileMatch, Validation};
use crate::validate::{
    example_amount, CONTAINER_LINE, EXAMPLE_LINE, FIX_LINES, HEADLINE, MISSING_AUDIT_KEY,
    OFFER_LINE, OPT_OUT_AUDIT_KEY, REFUSED_LINE, SUMMARY_ENTRY, SUMMARY_RESOURCE_SEPARATOR,
    SUMMARY_SEPARATOR, WARN_CONTAINER, WARN_FIX, WARN_FIX_SEPARATOR, WARN_OR,
};
use crate::words::{join_words, Piece, Template, AND, COMMA};

/// The policy's and the binding's name: the validating webhook's, so that the audit
/// annotations are keyed `validate.tollgate.dev/opt-out` and
/// `validate.tollgate.dev/missing-requests` either way.
pub const NAME: &str = "validate.tollgate.dev";

/// What the message says when the apiserver cannot use the CEL message (it drops one over
/// 5 KiB, which takes a pod with dozens of containers lacking requests).
pub const FALLBACK_MESSAGE: &str = "some containers of this pod lack required resource requests \
     (tollgate's full message was too long for a ValidatingAdmissionPolicy): every container \
     and init container must request them";

/// What the export needs besides the policy.
#[derive(Debug, Clone)]
pub struct Options {
    /// The validating webhook's `namespaceSelector`: the policy selects the same namespaces.
    pub namespace_selector: LabelSelector,
    /// Where the policy came from, for the header comment.
    pub source: String,
}

/// The YAML to apply, and what the command tells on stderr.
#[derive(Debug, Clone)]
pub struct Export {
    pub yaml: String,
    pub notes: Vec<Note>,
}

impl Export {
    /// The notes about parts of the policy the export leaves out although the policy asks
    /// for them: what `--strict` refuses.
    pub fn unexported(&self) -> impl Iterator<Item = &Note> {
        self.notes.iter().filter(|n| n.kind == NoteKind::Unexported)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub kind: NoteKind,
    /// The policy field the note is about.
    pub field: &'static str,
    pub text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoteKind {
    /// Not validation: it stays with the webhook (the mutation steps).
    StaysWithWebhook,
    /// Exported, but the apiserver says it differently than the webhook.
    Differs,
    /// The policy asks for it and the exported policy does not do it.
    Unexported,
}

/// One ValidatingAdmissionPolicy and its binding: the base policy, or one profile. Each
/// profile has its own, with a guard selecting its pods as the webhook does (the first
/// profile whose match fits: namespace names and globs through `request.namespace`,
/// namespace labels through `namespaceObject`, pod labels through `object`) and its own
/// mode: validation actions belong to a binding, so scopes with different modes cannot
/// share one. The base's guard is that no profile fits.
struct Scope<'a> {
    name: String,
    validation: &'a Validation,
    opt_out: &'a OptOut,
    /// A CEL condition on the request: pods it is false for are not this scope's.
    guard: Option<String>,
}

fn scopes(policy: &Policy) -> Vec<Scope<'_>> {
    let fits: Vec<String> = policy
        .profiles
        .iter()
        .map(|p| profile_fits(&p.matches))
        .collect();
    let none_before = |i: usize| fits[..i].iter().map(|f| format!("!({f})"));
    let base_guard: Vec<String> = none_before(fits.len()).collect();
    let mut out = vec![Scope {
        name: NAME.to_owned(),
        validation: &policy.validation,
        opt_out: &policy.opt_out,
        guard: (!base_guard.is_empty()).then(|| base_guard.join(" && ")),
    }];
    for (i, p) in policy.profiles.iter().enumerate() {
        let Some(resolved) = p.policy() else { continue };
        let guard: Vec<String> = std::iter::once(format!("({})", fits[i]))
            .chain(none_before(i))
            .collect();
        out.push(Scope {
            name: format!("{}.{NAME}", p.name),
            validation: &resolved.validation,
            opt_out: &resolved.opt_out,
            guard: Some(guard.join(" && ")),
        });
    }
    out
}

/// Whether a profile's `match` fits the request, in CEL: every criterion it gives.
fn profile_fits(m: &ProfileMatch) -> String {
    let mut all = vec![];
    if !m.namespaces.is_empty() {
        all.push(format!(
            "({})",
            any_glob(
                &m.namespaces,
                "(has(request.namespace) ? request.namespace : '')"
            )
        ));
    }
    if let Some(s) = &m.namespace_selector {
        all.push(selector_cel(s, "namespaceObject.metadata"));
    }
    if let Some(s) = &m.pod_selector {
        all.push(selector_cel(s, "object.metadata"));
    }
    if all.is_empty() {
        return "true".into();
    }
    all.join(" && ")
}

/// A label selector on the labels of `meta` (an ObjectMeta in CEL), as Kubernetes reads it
/// (`profile::selects`): every pair and requirement hold; an empty selector selects all.
fn selector_cel(s: &LabelSelector, meta: &str) -> String {
    let has = |k: &str| format!("(has({meta}.labels) && {} in {meta}.labels)", lit(k));
    let value = |k: &str| format!("{meta}.labels[{}]", lit(k));
    let values = |vs: &[String]| {
        format!(
            "[{}]",
            vs.iter().map(|v| lit(v)).collect::<Vec<_>>().join(", ")
        )
    };
    let mut all = vec![];
    for (k, v) in s.match_labels.iter().flatten() {
        all.push(format!("({} && {} == {})", has(k), value(k), lit(v)));
    }
    for r in s.match_expressions.iter().flatten() {
        let vs = r.values.as_deref().unwrap_or_default();
        let k = r.key.as_str();
        all.push(match r.operator.as_str() {
            "In" => format!("({} && {} in {})", has(k), value(k), values(vs)),
            "NotIn" => format!("!({} && {} in {})", has(k), value(k), values(vs)),
            "Exists" => has(k),
            "DoesNotExist" => format!("!{}", has(k)),
            // The policy refuses any other operator at load.
            _ => "false".to_owned(),
        });
    }
    if all.is_empty() {
        return "true".into();
    }
    format!("({})", all.join(" && "))
}

/// The ValidatingAdmissionPolicy and binding for `policy`, as YAML, and what was left out.
pub fn validating_admission_policy(policy: &Policy, options: &Options) -> Export {
    let notes = notes(policy);
    let mut yaml = format!(
        "# Generated by `tollgate export validating-admission-policy` from {}.\n\
         # Export again rather than edit: the CEL is the policy's, written out.\n",
        options.source
    );
    for scope in scopes(policy) {
        let (vap, binding) = scope_objects(&scope, options);
        yaml.push_str("---\n");
        vap.write(&mut yaml, 0);
        yaml.push_str("---\n");
        binding.write(&mut yaml, 0);
    }
    Export { yaml, notes }
}

fn notes(policy: &Policy) -> Vec<Note> {
    let mut notes = vec![];
    let m = &policy.mutation;
    let steps: Vec<&str> = [
        (m.gpu_tolerations.enabled, "gpuTolerations"),
        (m.driver_mounts.enabled, "driverMounts"),
        (m.metrics_sidecar.enabled, "metricsSidecar"),
        (m.default_resources.enabled, "defaultResources"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    if !steps.is_empty() {
        notes.push(Note {
            kind: NoteKind::StaysWithWebhook,
            field: "mutation",
            text: format!(
                "not exported: the mutation steps ({}). A ValidatingAdmissionPolicy cannot \
                 mutate: keep the mutating webhook. The policy runs after mutating admission \
                 and the apiserver's defaulting, as the validating webhook does, so a training \
                 pod whose requests come from mutation's default limits is judged with them \
                 in both cases",
                steps.join(", ")
            ),
        });
    }
    if policy.workloads.enabled {
        notes.push(Note {
            kind: NoteKind::StaysWithWebhook,
            field: "workloads",
            text: "not exported: the review of workloads (Jobs, Deployments, PyTorchJobs, ...) \
                   by the pods their templates will make, and the refusal of an opt-out \
                   approval tollgate did not give. The exported policy judges pods; without \
                   the validating webhook, workloads are judged only at their pods, and the \
                   approval rests on the mutating webhook alone"
                .into(),
        });
    }
    for scope in scopes(policy) {
        validation_notes(&scope, &mut notes);
    }
    notes
}

/// What a scope's validation means for the export.
fn validation_notes(scope: &Scope<'_>, notes: &mut Vec<Note>) {
    let v = scope.validation;
    if !validates(v) {
        notes.push(Note {
            kind: NoteKind::Differs,
            field: "validation",
            text: "validation is off for pod CREATEs in this policy (validation.enabled, \
                   validation.operations): the exported policy allows every pod"
                .into(),
        });
    } else {
        if v.operations.contains(&Operation::Update) {
            notes.push(Note {
                kind: NoteKind::Unexported,
                field: "validation.operations",
                text: "not exported: UPDATE in validation.operations. The webhooks are \
                       registered for pod CREATEs only (deploy/base), and so is the exported \
                       policy: pod UPDATEs are not judged"
                    .into(),
            });
        }
        if v.mode == Mode::Warn {
            notes.push(Note {
                kind: NoteKind::Differs,
                field: "validation.mode",
                text: "warn: the apiserver gives one warning per pod, the webhook's \
                       warnings on one line after \"Validation failed for \
                       ValidatingAdmissionPolicy ... with binding ...: \""
                    .into(),
            });
        }
    }
}

/// Whether the webhook judges pod CREATEs at all under this rule.
fn validates(v: &Validation) -> bool {
    v.enabled && v.operations.contains(&Operation::Create)
}

fn scope_objects(scope: &Scope<'_>, options: &Options) -> (Node, Node) {
    let v = scope.validation;
    let mut spec = vec![
        ("failurePolicy", Node::plain("Fail")),
        ("matchConstraints", match_constraints(options)),
    ];
    if validates(v) {
        let cel = Cel::new(scope);
        spec.push(("variables", cel.variables()));
        spec.push(("validations", cel.validations()));
        spec.push(("auditAnnotations", cel.audit_annotations()));
    } else {
        // The webhook skips every pod; a policy must still say something.
        spec.push((
            "validations",
            Node::List(vec![Node::Map(vec![
                ("expression", Node::cel("true")),
                (
                    "message",
                    Node::string("validation is off in tollgate's policy"),
                ),
            ])]),
        ));
    }
    let vap = object("ValidatingAdmissionPolicy", &scope.name, Node::Map(spec));
    let action = match v.mode {
        Mode::Enforce => "Deny",
        Mode::Warn => "Warn",
        Mode::Audit => "Audit",
    };
    let binding = object(
        "ValidatingAdmissionPolicyBinding",
        &scope.name,
        Node::Map(vec![
            ("policyName", Node::string(&scope.name)),
            ("validationActions", Node::List(vec![Node::plain(action)])),
        ]),
    );
    (vap, binding)
}

fn object(kind: &str, name: &str, spec: Node) -> Node {
    Node::Map(vec![
        ("apiVersion", Node::plain("admissionregistration.k8s.io/v1")),
        ("kind", Node::plain(kind)),
        (
            "metadata",
            Node::Map(vec![
                ("name", Node::string(name)),
                (
                    "labels",
                    Node::Map(vec![("app.kubernetes.io/name", Node::plain("tollgate"))]),
                ),
            ]),
        ),
        ("spec", spec),
    ])
}

/// Pod CREATEs (no subresource) in the namespaces the webhooks select.
fn match_constraints(options: &Options) -> Node {
    let strings = |items: &[&str]| Node::List(items.iter().map(|s| Node::string(s)).collect());
    Node::Map(vec![
        (
            "resourceRules",
            Node::List(vec![Node::Map(vec![
                ("apiGroups", strings(&[""])),
                ("apiVersions", strings(&["v1"])),
                ("operations", strings(&["CREATE"])),
                ("resources", strings(&["pods"])),
                ("scope", Node::plain("Namespaced")),
            ])]),
        ),
        ("matchPolicy", Node::plain("Equivalent")),
        (
            "namespaceSelector",
            label_selector(&options.namespace_selector),
        ),
    ])
}

fn label_selector(s: &LabelSelector) -> Node {
    let mut out = vec![];
    if let Some(labels) = &s.match_labels {
        out.push((
            "matchLabels",
            Node::Entries(
                labels
                    .iter()
                    .map(|(k, v)| (k.clone(), Node::string(v)))
                    .collect(),
            ),
        ));
    }
    if let Some(exprs) = &s.match_expressions {
        out.push((
            "matchExpressions",
            Node::List(
                exprs
                    .iter()
                    .map(|e| {
                        let mut m = vec![
                            ("key", Node::string(&e.key)),
                            ("operator", Node::string(&e.operator)),
                        ];
                        if let Some(values) = &e.values {
                            m.push((
                                "values",
                                Node::List(values.iter().map(|v| Node::string(v)).collect()),
                            ));
                        }
                        Node::Map(m)
                    })
                    .collect(),
            ),
        ));
    }
    Node::Map(out)
}

/// The CEL of one scope.
struct Cel<'a> {
    scope: &'a Scope<'a>,
}

/// `has(c.resources) && has(c.resources.requests) && r in c.resources.requests`: whether
/// container `c` requests resource `r` (both CEL expressions).
fn asks(c: &str, r: &str) -> String {
    format!("has({c}.resources) && has({c}.resources.requests) && {r} in {c}.resources.requests")
}

impl<'a> Cel<'a> {
    fn new(scope: &'a Scope<'a>) -> Self {
        Cel { scope }
    }

    fn required(&self) -> &[String] {
        &self.scope.validation.required_requests
    }

    fn variables(&self) -> Node {
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

    fn validations(&self) -> Node {
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

    fn audit_annotations(&self) -> Node {
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

/// Whether CEL string `subject` matches any of the globs: a name is compared, a glob is
/// an anchored RE2 pattern, and a run of stars is `true`. No globs: `false`.
fn any_glob(globs: &[Glob], subject: &str) -> String {
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

/// Just enough YAML for the two objects: maps in the order written, lists, and three
/// kinds of scalar.
#[derive(Debug, Clone)]
enum Node {
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
    fn plain(s: &str) -> Node {
        Node::Plain(s.to_owned())
    }

    fn string(s: &str) -> Node {
        Node::Str(s.to_owned())
    }

    fn cel(s: &str) -> Node {
        Node::Cel(s.to_owned())
    }

    fn write(&self, out: &mut String, indent: usize) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Options {
        Options {
            namespace_selector: serde_json::from_value(serde_json::json!({
                "matchLabels": {"tollgate.dev/enforce": "enabled"},
                "matchExpressions": [{
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system", "tollgate-system"],
                }],
            }))
            .unwrap(),
            source: "test".into(),
        }
    }

    fn docs(yaml: &str) -> Vec<serde_json::Value> {
        serde_saphyr::from_multiple(yaml).unwrap()
    }

    #[test]
    fn the_shipped_policy_exports_a_policy_and_its_binding() {
        let e = validating_admission_policy(&Policy::builtin(), &options());
        let d = docs(&e.yaml);
        assert_eq!(d.len(), 2, "{}", e.yaml);
        assert_eq!(d[0]["kind"], "ValidatingAdmissionPolicy");
        assert_eq!(d[0]["metadata"]["name"], NAME);
        assert_eq!(d[0]["spec"]["failurePolicy"], "Fail");
        let rule = &d[0]["spec"]["matchConstraints"]["resourceRules"][0];
        assert_eq!(rule["operations"], serde_json::json!(["CREATE"]));
        assert_eq!(rule["resources"], serde_json::json!(["pods"]));
        assert_eq!(rule["apiGroups"], serde_json::json!([""]));
        assert_eq!(
            d[0]["spec"]["matchConstraints"]["namespaceSelector"],
            serde_json::to_value(&options().namespace_selector).unwrap()
        );
        assert_eq!(d[0]["spec"]["validations"][0]["reason"], "Forbidden");
        assert_eq!(d[1]["kind"], "ValidatingAdmissionPolicyBinding");
        assert_eq!(d[1]["spec"]["policyName"], NAME);
        assert_eq!(
            d[1]["spec"]["validationActions"],
            serde_json::json!(["Deny"])
        );
        // The mutation steps are named as staying with the webhook; nothing is refused.
        assert!(e.notes.iter().any(|n| n.kind == NoteKind::StaysWithWebhook));
        assert_eq!(e.unexported().count(), 0);
        assert!(e.yaml.is_ascii());
    }

    #[test]
    fn modes_become_validation_actions_and_audit_annotations() {
        for (mode, action, keys) in [
            (Mode::Enforce, "Deny", vec!["opt-out"]),
            (Mode::Warn, "Warn", vec!["opt-out", "missing-requests"]),
            (Mode::Audit, "Audit", vec!["opt-out", "missing-requests"]),
        ] {
            let mut p = Policy::builtin();
            p.validation.mode = mode;
            let d = docs(&validating_admission_policy(&p, &options()).yaml);
            assert_eq!(
                d[1]["spec"]["validationActions"],
                serde_json::json!([action])
            );
            let got: Vec<&str> = d[0]["spec"]["auditAnnotations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["key"].as_str().unwrap())
                .collect();
            assert_eq!(got, keys, "{mode:?}");
        }
    }

    #[test]
    fn update_in_the_operations_is_what_strict_refuses() {
        let mut p = Policy::builtin();
        p.validation.operations = vec![Operation::Create, Operation::Update];
        let e = validating_admission_policy(&p, &options());
        let refused: Vec<&Note> = e.unexported().collect();
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].field, "validation.operations");
        // Still exported, for CREATE, as the webhooks are registered.
        let d = docs(&e.yaml);
        assert_eq!(
            d[0]["spec"]["matchConstraints"]["resourceRules"][0]["operations"],
            serde_json::json!(["CREATE"])
        );
        // Off is not a gap: there is nothing to judge.
        p.validation.enabled = false;
        let e = validating_admission_policy(&p, &options());
        assert_eq!(e.unexported().count(), 0);
        let d = docs(&e.yaml);
        assert_eq!(d[0]["spec"]["validations"][0]["expression"], "true");
    }

    #[test]
    fn a_scope_guard_limits_the_decision_and_the_annotation() {
        let p = Policy::builtin();
        let scope = Scope {
            name: "x.validate.tollgate.dev".into(),
            validation: &p.validation,
            opt_out: &p.opt_out,
            guard: Some("has(object.metadata.labels)".into()),
        };
        let (vap, _) = scope_objects(&scope, &options());
        let mut yaml = String::new();
        vap.write(&mut yaml, 0);
        let d = docs(&yaml);
        let vars = d[0]["spec"]["variables"].as_array().unwrap();
        assert_eq!(vars[0]["name"], "inScope");
        let ok = vars.iter().find(|v| v["name"] == "ok").unwrap();
        assert!(ok["expression"]
            .as_str()
            .unwrap()
            .starts_with("!variables.inScope || "));
    }

    /// The apiserver refuses a ValidatingAdmissionPolicy whose variable is not a CEL
    /// identifier or is one of CEL's reserved words (`isCELIdentifier` in its
    /// admissionregistration validation): `namespace`, for one, is reserved.
    #[test]
    fn variable_names_are_cel_identifiers_the_apiserver_accepts() {
        const RESERVED: [&str; 21] = [
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
        let p = Policy::builtin();
        let scope = Scope {
            name: "x.validate.tollgate.dev".into(),
            validation: &p.validation,
            opt_out: &p.opt_out,
            guard: Some("true".into()),
        };
        let Node::List(vars) = Cel::new(&scope).variables() else {
            panic!("variables are a list");
        };
        assert!(vars.len() > 10);
        for v in vars {
            let Node::Map(fields) = v else {
                panic!("a variable is a map")
            };
            let Some((_, Node::Plain(name))) = fields.iter().find(|(k, _)| *k == "name") else {
                panic!("a variable has a name")
            };
            let mut chars = name.chars();
            assert!(
                chars
                    .next()
                    .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
                    && chars.all(|c| c == '_' || c.is_ascii_alphanumeric()),
                "{name}"
            );
            assert!(
                !RESERVED.contains(&name.as_str()),
                "{name} is reserved in CEL"
            );
        }
    }

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
