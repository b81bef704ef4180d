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
//!
//! The rooms, each importing only those below it: `cel` (the expressions, from
//! validation's and the opt-out's own message templates), `scope` (which pods each policy
//! covers: the base and each profile, with its guard), `literal` (CEL string literals and
//! globs as conditions), `yaml` (the writer of the two objects). This module puts them
//! together.

mod cel;
mod literal;
mod mutating;
mod scope;
mod yaml;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use cel::Cel;
pub use literal::{glob_to_re2, lit};
pub use mutating::{MAX_CONTAINERS, MUTATE_NAME as MUTATE_EXPORT_NAME};
use scope::{scopes, Scope};
use yaml::Node;

use crate::policy::{Mode, Operation, Policy, Step, Validation};

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
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The webhooks' `namespaceSelector`: the policies select the same namespaces.
    pub namespace_selector: LabelSelector,
    /// Where the policy came from, for the header comment.
    pub source: String,
    /// The apiserver's minor version the objects are for (Kubernetes 1.`minor`): below 36,
    /// MutatingAdmissionPolicies are `v1beta1` (1.34 and 1.35, behind a gate). 0: the
    /// newest, 1.36.
    pub kubernetes_minor: u32,
    /// Names for a manifest-based admission bundle (KEP-5793): every object's name ends
    /// `.static.k8s.io`.
    pub static_names: bool,
}

impl Options {
    /// The apiVersion of the MutatingAdmissionPolicies and their bindings.
    pub fn map_api_version(&self) -> &'static str {
        if self.kubernetes_minor != 0 && self.kubernetes_minor < 36 {
            "admissionregistration.k8s.io/v1beta1"
        } else {
            "admissionregistration.k8s.io/v1"
        }
    }

    /// An object's name as exported: `validate.tollgate.dev`, or in a static bundle
    /// `validate.tollgate.static.k8s.io`.
    pub fn name(&self, name: &str) -> String {
        match name.strip_suffix(".tollgate.dev") {
            Some(stem) if self.static_names => format!("{stem}.tollgate.static.k8s.io"),
            _ => name.to_owned(),
        }
    }
}

/// The YAML to apply, and what the command tells on stderr.
#[derive(Debug, Clone)]
pub struct Export {
    /// Every object, after a header comment.
    pub yaml: String,
    pub notes: Vec<Note>,
    /// The objects one by one (a policy, then its binding), for a bundle of files.
    pub objects: Vec<Object>,
}

/// One exported object.
#[derive(Debug, Clone)]
pub struct Object {
    pub kind: &'static str,
    pub name: String,
    /// The object alone, as YAML.
    pub yaml: String,
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

/// The ValidatingAdmissionPolicy and binding for `policy`, as YAML, and what was left out.
///
/// A namespace whose TollgateProfile changes what validation judges (validation or the
/// opt-out) is left out of every binding (`matchResources`, by its name) and named: its
/// pods stay with the validating webhook, never judged by the cluster's policy over the
/// team's profile.
pub fn validating_admission_policy(policy: &Policy, options: &Options) -> Export {
    let mut notes = notes(policy);
    let mut yaml = format!(
        "# Generated by `tollgate export validating-admission-policy` from {}.\n\
         # Export again rather than edit: the CEL is the policy's, written out.\n",
        options.source
    );
    let judged_alike =
        |a: &Policy, b: &Policy| a.validation == b.validation && a.opt_out == b.opt_out;
    let (differ, alike) = namespace_profiles(policy, judged_alike);
    header_namespaces(
        &mut yaml,
        &differ,
        &alike,
        "validation or optOut",
        "validating",
    );
    for (ns, object) in &differ {
        notes.push(Note {
            kind: NoteKind::Unexported,
            field: "namespaceProfiles",
            text: format!(
                "left to the validating webhook: namespace {ns}, whose TollgateProfile \
                 {object} changes validation or optOut: the exported bindings do not select \
                 it (matchResources), so its pods are judged by the webhook alone. Keep the \
                 validating webhook for that namespace"
            ),
        });
    }
    let excluded: Vec<&str> = differ.iter().map(|(ns, _)| ns.as_str()).collect();
    let mut objects = vec![];
    for scope in scopes(policy) {
        let name = options.name(&scope.name);
        let (vap, binding) = scope_objects(&scope, &name, options, &excluded);
        objects.push(object_text("ValidatingAdmissionPolicy", &name, vap));
        objects.push(object_text(
            "ValidatingAdmissionPolicyBinding",
            &name,
            binding,
        ));
    }
    for o in &objects {
        yaml.push_str("---\n");
        yaml.push_str(&o.yaml);
    }
    Export {
        yaml,
        notes,
        objects,
    }
}

/// The MutatingAdmissionPolicies and bindings for `policy` (one per scope: the base and
/// each profile), as YAML, and what was left out: the pods the policies leave to the
/// mutating webhook, and the namespaces whose TollgateProfile changes their mutation.
pub fn mutating_admission_policy(policy: &Policy, options: &Options) -> Export {
    let mut notes = mutating_notes(policy);
    let mut yaml = format!(
        "# Generated by `tollgate export mutating-admission-policy` from {}.\n\
         # Export again rather than edit: the CEL is the policy's, written out.\n\
         # Left to the mutating webhook (these policies skip them): pods with DRA claims\n\
         # (resourceClaims: CEL cannot read a claim's device class), pods with pod-level\n\
         # resources (spec.resources), pods with more than {} containers or init containers,\n\
         # and those the notes on standard error name (a share or a fraction of a GPU, a\n\
         # namespace at Pod Security baseline or restricted).\n",
        options.source,
        mutating::MAX_CONTAINERS
    );
    let mutated_alike = |a: &Policy, b: &Policy| {
        a.gpu == b.gpu
            && a.selection == b.selection
            && a.opt_out == b.opt_out
            && a.mutation == b.mutation
    };
    let (differ, alike) = namespace_profiles(policy, mutated_alike);
    header_namespaces(
        &mut yaml,
        &differ,
        &alike,
        "gpu, selection, optOut or mutation",
        "mutating",
    );
    for (ns, object) in &differ {
        notes.push(Note {
            kind: NoteKind::Unexported,
            field: "namespaceProfiles",
            text: format!(
                "left to the mutating webhook: namespace {ns}, whose TollgateProfile \
                 {object} changes what mutation does: the exported bindings do not select \
                 it (matchResources). Keep the mutating webhook for that namespace"
            ),
        });
    }
    let excluded: Vec<&str> = differ.iter().map(|(ns, _)| ns.as_str()).collect();
    let mut objects = vec![];
    for scope in mutating::map_scopes(policy) {
        if !mutating::mutates(scope.policy) {
            continue;
        }
        mutating::scope_notes(&scope, &mut notes);
        let spec = mutating::spec(&scope, match_constraints(options));
        let name = options.name(&scope.name);
        let mut binding = vec![("policyName", Node::string(&name))];
        if let Some(m) = match_resources(&excluded) {
            binding.push(("matchResources", m));
        }
        for (kind, spec) in [
            ("MutatingAdmissionPolicy", spec),
            ("MutatingAdmissionPolicyBinding", Node::Map(binding.clone())),
        ] {
            let node = object_with(kind, &name, options.map_api_version(), spec);
            objects.push(object_text(kind, &name, node));
        }
    }
    if objects.is_empty() {
        yaml.push_str("# The policy mutates no pod CREATE: nothing to export.\n");
    }
    for o in &objects {
        yaml.push_str("---\n");
        yaml.push_str(&o.yaml);
    }
    Export {
        yaml,
        notes,
        objects,
    }
}

/// What the mutating export leaves to the webhook.
fn mutating_notes(policy: &Policy) -> Vec<Note> {
    let mut notes = vec![Note {
        kind: NoteKind::StaysWithWebhook,
        field: "mutation",
        text: format!(
            "left to the mutating webhook: pods with DRA claims (a policy cannot read the \
             ResourceClaim or template that names the device class), pods with pod-level \
             resources (the sidecar's share of the pod's budget), pods with more than {} \
             containers or init containers. Keep the mutating webhook registered for them, \
             or accept that they are admitted unmutated",
            mutating::MAX_CONTAINERS
        ),
    }];
    notes.push(Note {
        kind: NoteKind::Differs,
        field: "mutation",
        text: "the webhook's warnings (what each step added, a volume or port left to the \
               user) are not given: a MutatingAdmissionPolicy warns of nothing. Feasibility \
               and what needs the cluster's nodes, quotas and claims stay with the webhooks"
            .into(),
    });
    if policy.workloads.enabled {
        notes.push(Note {
            kind: NoteKind::StaysWithWebhook,
            field: "workloads",
            text: "left to the webhooks: the opt-out approval the mutating webhook stamps on \
                   workload templates (the requester's name, which the pod's policy cannot \
                   see when its controller creates it), and the review of workloads"
                .into(),
        });
    }
    notes
}

/// The header lines that name the namespaces' TollgateProfiles.
fn header_namespaces(
    yaml: &mut String,
    differ: &[(String, String)],
    alike: &[String],
    fields: &str,
    webhook: &str,
) {
    if !differ.is_empty() {
        let names: Vec<String> = differ
            .iter()
            .map(|(ns, object)| format!("{ns} ({object})"))
            .collect();
        yaml.push_str(&format!(
            "# Left to the {webhook} webhook (their TollgateProfile changes {fields}; the \
             bindings do not select them): {}.\n",
            names.join(", ")
        ));
    }
    if !alike.is_empty() {
        yaml.push_str(&format!(
            "# Covered alike (their TollgateProfile changes none of {fields}): {}.\n",
            alike.join(", ")
        ));
    }
}

/// A binding's `matchResources` that leaves out the namespaces named, or None.
fn match_resources(excluded: &[&str]) -> Option<Node> {
    if excluded.is_empty() {
        return None;
    }
    Some(Node::Map(vec![(
        "namespaceSelector",
        Node::Map(vec![(
            "matchExpressions",
            Node::List(vec![Node::Map(vec![
                ("key", Node::string(NAMESPACE_NAME_LABEL)),
                ("operator", Node::plain("NotIn")),
                (
                    "values",
                    Node::List(excluded.iter().map(|n| Node::string(n)).collect()),
                ),
            ])]),
        )]),
    )]))
}

/// The label every namespace carries with its name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

fn object_text(kind: &'static str, name: &str, node: Node) -> Object {
    let mut yaml = String::new();
    node.write(&mut yaml, 0);
    Object {
        kind,
        name: name.to_owned(),
        yaml,
    }
}

/// The namespaces' TollgateProfiles whose pods the export would treat otherwise than the
/// webhook (`alike` says whether two policies agree on what the export carries, over the
/// base or a cluster profile), as (namespace, `NAMESPACE/NAME`), and those treated alike
/// (`NAMESPACE/NAME`).
fn namespace_profiles(
    policy: &Policy,
    alike_for: impl Fn(&Policy, &Policy) -> bool,
) -> (Vec<(String, String)>, Vec<String>) {
    let (mut differ, mut alike) = (vec![], vec![]);
    for (ns, n) in &policy.layers.namespaces {
        let over_base = alike_for(&n.over_base.policy, policy);
        let over_profiles = n.over_profiles.iter().enumerate().all(|(i, r)| {
            match (r, policy.profiles.get(i).and_then(|p| p.policy())) {
                (Some(r), Some(theirs)) => alike_for(&r.policy, theirs),
                _ => true,
            }
        });
        if over_base && over_profiles {
            alike.push(n.object.clone());
        } else {
            differ.push((ns.clone(), n.object.clone()));
        }
    }
    (differ, alike)
}

/// Whether the ValidatingAdmissionPolicy export carries what mutation step `step` does.
/// None can be: a ValidatingAdmissionPolicy cannot mutate, so each stays with the mutating
/// webhook, or with the MutatingAdmissionPolicies of `mutating_admission_policy`, which
/// carry every step (`mutating`), and is named in the notes.
fn exported(step: Step) -> bool {
    match step {
        Step::Tolerations | Step::DriverMounts | Step::MetricsSidecar | Step::DefaultResources => {
            false
        }
    }
}

fn notes(policy: &Policy) -> Vec<Note> {
    let mut notes = vec![];
    let steps: Vec<&str> = Step::ALL
        .into_iter()
        .filter(|s| policy.mutation.enabled(*s) && !exported(*s))
        .map(Step::field)
        .collect();
    if !steps.is_empty() {
        notes.push(Note {
            kind: NoteKind::StaysWithWebhook,
            field: "mutation",
            text: format!(
                "not exported: the mutation steps ({}). A ValidatingAdmissionPolicy cannot \
                 mutate: keep the mutating webhook, or export them with `tollgate export \
                 mutating-admission-policy`. The policy runs after mutating admission \
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
    notes.push(Note {
        kind: NoteKind::Differs,
        field: "validation",
        text: "what the webhook knows of the cluster stays with it: a pod refused while one \
               of its DRA claims could not be read is told so by the webhook only, and \
               whether a pod can ever run (feasibility: the quotas, the nodes, the \
               DeviceClasses) is judged by the webhook alone"
            .into(),
    });
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

fn scope_objects(
    scope: &Scope<'_>,
    name: &str,
    options: &Options,
    excluded: &[&str],
) -> (Node, Node) {
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
    let vap = object("ValidatingAdmissionPolicy", name, Node::Map(spec));
    let action = match v.mode {
        Mode::Enforce => "Deny",
        Mode::Warn => "Warn",
        Mode::Audit => "Audit",
    };
    let mut binding = vec![
        ("policyName", Node::string(name)),
        ("validationActions", Node::List(vec![Node::plain(action)])),
    ];
    if let Some(m) = match_resources(excluded) {
        binding.push(("matchResources", m));
    }
    let binding = object("ValidatingAdmissionPolicyBinding", name, Node::Map(binding));
    (vap, binding)
}

fn object(kind: &str, name: &str, spec: Node) -> Node {
    object_with(kind, name, "admissionregistration.k8s.io/v1", spec)
}

fn object_with(kind: &str, name: &str, api_version: &str, spec: Node) -> Node {
    Node::Map(vec![
        ("apiVersion", Node::plain(api_version)),
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
            ..Default::default()
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

    /// The namespaces' TollgateProfiles are not exported: one that changes what validation
    /// judges is named in the header and refused by --strict; one that only changes
    /// mutation's defaults is named as judged alike.
    #[test]
    fn namespace_profiles_are_named_not_covered_or_alike() {
        use crate::policy::{NamespaceProfile, Resolved};
        // As `objects::compose` leaves them (a module of the same layer: built by hand).
        let layer = |ns: &str, mine: Policy| NamespaceProfile {
            object: format!("{ns}/default"),
            spec: serde_json::json!({}),
            over_base: Resolved {
                name: format!("{ns}/default"),
                policy: Box::new(mine),
            },
            over_profiles: vec![],
        };
        let mut warn = Policy::builtin();
        warn.validation.mode = Mode::Warn;
        let mut defaults = Policy::builtin();
        defaults.mutation.default_resources.per_gpu.insert(
            "memory".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("64Gi".into()),
        );
        let mut policy = Policy::builtin();
        policy
            .layers
            .namespaces
            .insert("team-a".into(), layer("team-a", warn));
        policy
            .layers
            .namespaces
            .insert("team-b".into(), layer("team-b", defaults));
        let e = validating_admission_policy(&policy, &options());
        let header: Vec<&str> = e.yaml.lines().take_while(|l| l.starts_with('#')).collect();
        let header = header.join("\n");
        assert!(
            header.contains("Left to the validating webhook"),
            "{header}"
        );
        assert!(header.contains("team-a (team-a/default)"), "{header}");
        assert!(
            header.contains("none of validation or optOut): team-b/default."),
            "{header}"
        );
        let refused: Vec<&Note> = e.unexported().collect();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].field, "namespaceProfiles");
        assert!(refused[0].text.contains("TollgateProfile team-a/default"));
        // The warn namespace is left out of the binding, so that the cluster's policy
        // never refuses what its profile only warns of; team-b's stays selected.
        let d = docs(&e.yaml);
        assert_eq!(
            d[1]["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"],
            serde_json::json!([{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["team-a"]}])
        );
        // The mutating export: team-b's profile changes mutation's defaults, team-a's
        // only validation.
        let m = mutating_admission_policy(&policy, &options());
        let d = docs(&m.yaml);
        assert_eq!(d[1]["kind"], "MutatingAdmissionPolicyBinding");
        assert_eq!(
            d[1]["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"],
            serde_json::json!(["team-b"])
        );
        // Without TollgateProfiles, the header says nothing of them.
        let plain = validating_admission_policy(&Policy::builtin(), &options());
        assert!(!plain.yaml.contains("TollgateProfile"), "{}", plain.yaml);
        assert!(!plain.yaml.contains("matchResources"), "{}", plain.yaml);
    }

    #[test]
    fn the_mutating_export_is_a_policy_and_binding_per_scope() {
        let e = mutating_admission_policy(&Policy::builtin(), &options());
        let d = docs(&e.yaml);
        assert_eq!(d.len(), 2, "{}", e.yaml);
        assert_eq!(d[0]["apiVersion"], "admissionregistration.k8s.io/v1");
        assert_eq!(d[0]["kind"], "MutatingAdmissionPolicy");
        assert_eq!(d[0]["metadata"]["name"], MUTATE_EXPORT_NAME);
        assert_eq!(d[0]["spec"]["reinvocationPolicy"], "IfNeeded");
        assert_eq!(d[1]["spec"]["policyName"], MUTATE_EXPORT_NAME);
        // Every mutation reads a variable of the policy's own.
        let names: Vec<&str> = d[0]["spec"]["variables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        for m in d[0]["spec"]["mutations"].as_array().unwrap() {
            let expr = m["jsonPatch"]["expression"].as_str().unwrap();
            let var = expr
                .strip_prefix("variables.")
                .and_then(|r| r.split('.').next())
                .unwrap();
            assert!(names.contains(&var), "{var}");
        }
        // No expression over the apiserver's 100,000 characters, and none builds a
        // JSONPatch or escapes a key where only a mutation may.
        for v in d[0]["spec"]["variables"].as_array().unwrap() {
            let expr = v["expression"].as_str().unwrap();
            assert!(expr.len() < 100_000, "{}: {}", v["name"], expr.len());
            assert!(!expr.contains("JSONPatch{"), "{}", v["name"]);
            assert!(!expr.contains("jsonpatch."), "{}", v["name"]);
        }
        assert!(e.yaml.is_ascii());
        // Kubernetes 1.34 and 1.35: v1beta1.
        let mut o = options();
        o.kubernetes_minor = 34;
        let d = docs(&mutating_admission_policy(&Policy::builtin(), &o).yaml);
        assert_eq!(d[0]["apiVersion"], "admissionregistration.k8s.io/v1beta1");
        assert_eq!(d[1]["apiVersion"], "admissionregistration.k8s.io/v1beta1");
        // A policy that mutates nothing exports nothing.
        let mut off = Policy::builtin();
        off.mutation.operations.clear();
        assert!(mutating_admission_policy(&off, &options())
            .objects
            .is_empty());
    }

    #[test]
    fn static_names_end_in_static_k8s_io() {
        let mut o = options();
        o.static_names = true;
        for e in [
            validating_admission_policy(&Policy::builtin(), &o),
            mutating_admission_policy(&Policy::builtin(), &o),
        ] {
            for obj in &e.objects {
                assert!(obj.name.ends_with(".static.k8s.io"), "{}", obj.name);
                let d = docs(&obj.yaml);
                assert_eq!(d[0]["metadata"]["name"], obj.name.as_str());
                assert_eq!(d[0]["apiVersion"], "admissionregistration.k8s.io/v1");
                if let Some(p) = d[0]["spec"]["policyName"].as_str() {
                    assert_eq!(p, obj.name);
                }
            }
        }
        assert_eq!(
            o.name("validate.tollgate.dev"),
            "validate.tollgate.static.k8s.io"
        );
        assert_eq!(
            o.name("team-a.mutate.tollgate.dev"),
            "team-a.mutate.tollgate.static.k8s.io"
        );
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
        let (vap, _) = scope_objects(&scope, "x.validate.tollgate.dev", &options(), &[]);
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
}
