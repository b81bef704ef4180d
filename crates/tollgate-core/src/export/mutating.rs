//! The mutation half of a policy as MutatingAdmissionPolicies (one per scope: the base and
//! each profile), JSONPatch written in CEL, so that the apiserver makes in process what the
//! mutating webhook makes: each GPU class's tolerations, the hostPath driver's mounts and
//! environment in the containers with its GPUs, the metrics sidecar and its annotations,
//! the default limits (never below a request, per GPU where the policy says so, a
//! non-overcommittable request's limit) and the applied annotation.
//!
//! Every patch is guarded so that a second evaluation adds nothing: the policies are
//! `reinvocationPolicy: IfNeeded` (the apiserver runs them again when a later plugin or
//! webhook changes the pod), and an unguarded `add` to `/spec/tolerations/-` would add the
//! toleration twice. Each mutation sees the pod as the ones before it left it (they run in
//! order), as each step of the webhook sees the one before. The applied annotation comes
//! first: it is written from what the steps are about to do to the pod as it came.
//!
//! What CEL cannot see stays with the webhook: a pod with DRA claims (their device classes
//! are in ResourceClaims, which a policy cannot read), a pod with pod-level resources (the
//! sidecar's fit within the pod's budget needs the apiserver's aggregate of the pod's
//! requests), a pod with more containers than [`MAX_CONTAINERS`]; the policies leave such
//! pods alone and the export names them.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{Container, Toleration};
use serde_json::Value;

use super::literal::{any_glob, lit};
use super::scope::profile_fits;
use super::yaml::Node;
use super::{Note, NoteKind};
use crate::policy::{Driver, GpuClass, IfPresent, Operation, Policy, SidecarMode, Step};
use crate::quantity;

/// The mutating policies' name, as the validating one's is `validate.tollgate.dev`.
pub const MUTATE_NAME: &str = "mutate.tollgate.dev";

/// The containers of each list (init containers, containers) a policy indexes: CEL has no
/// range, so patches address containers through a list of indices this long. A pod with
/// more is left to the webhook.
pub const MAX_CONTAINERS: usize = 64;

/// The two container lists, as JSON pointers and CEL.
const LISTS: [(&str, &str); 2] = [
    ("initContainers", "variables.initC"),
    ("containers", "object.spec.containers"),
];

/// One scope's MutatingAdmissionPolicy: its name, the policy in force, the guard that
/// selects its pods and the profile the applied annotation names.
pub(super) struct MapScope<'a> {
    pub(super) name: String,
    pub(super) policy: &'a Policy,
    pub(super) guard: Option<String>,
    pub(super) profile: Option<&'a str>,
}

pub(super) fn map_scopes(policy: &Policy) -> Vec<MapScope<'_>> {
    let fits: Vec<String> = policy
        .profiles
        .iter()
        .map(|p| profile_fits(&p.matches))
        .collect();
    let none_before = |i: usize| fits[..i].iter().map(|f| format!("!({f})"));
    let base: Vec<String> = none_before(fits.len()).collect();
    let mut out = vec![MapScope {
        name: MUTATE_NAME.to_owned(),
        policy,
        guard: (!base.is_empty()).then(|| base.join(" && ")),
        profile: None,
    }];
    for (i, p) in policy.profiles.iter().enumerate() {
        let Some(resolved) = p.policy() else { continue };
        let guard: Vec<String> = std::iter::once(format!("({})", fits[i]))
            .chain(none_before(i))
            .collect();
        out.push(MapScope {
            name: format!("{}.{MUTATE_NAME}", p.name),
            policy: resolved,
            guard: Some(guard.join(" && ")),
            profile: Some(&p.name),
        });
    }
    out
}

/// Whether the scope mutates pod CREATEs at all.
pub(super) fn mutates(policy: &Policy) -> bool {
    policy.mutation.operations.contains(&Operation::Create)
        && Step::ALL.iter().any(|s| policy.mutation.enabled(*s))
}

/// What the export of a scope's mutation leaves to the webhook, beyond the pods the
/// policies skip (said once for the whole export).
pub(super) fn scope_notes(scope: &MapScope<'_>, notes: &mut Vec<Note>) {
    let p = scope.policy;
    if p.mutation.operations.contains(&Operation::Update) {
        notes.push(Note {
            kind: NoteKind::Unexported,
            field: "mutation.operations",
            text: format!(
                "not exported ({}): UPDATE in mutation.operations. The policies mutate pod \
                 CREATEs, as the webhooks are registered (deploy/base)",
                scope.name
            ),
        });
    }
    for (name, class) in &p.gpu.classes {
        if class.driver == Driver::Auto && p.mutation.driver_mounts.enabled {
            notes.push(Note {
                kind: NoteKind::Differs,
                field: "gpu.classes.driver",
                text: format!(
                    "differs ({}): class {name}'s driver: auto is decided from the Nodes, which \
                     a policy cannot read: exported as its driverFallback ({}), as the webhook \
                     decides with no node known. Where the nodes inject the driver, set \
                     driver: runtime in the policy you export",
                    scope.name,
                    if mounts_driver(class) {
                        "hostPath"
                    } else {
                        "runtime"
                    }
                ),
            });
        }
        if !class.shares.is_empty() || class.fractions.is_some() {
            notes.push(Note {
                kind: NoteKind::Unexported,
                field: "gpu.classes.shares",
                text: format!(
                    "left to the mutating webhook ({}): pods asking for a share or a fraction \
                     of a class {name} GPU (shares, fractions), which count as GPUs the way \
                     the webhook reads them, not as CEL can",
                    scope.name
                ),
            });
        }
        for (r, q) in &class.per_gpu {
            if milli(q).is_none() {
                notes.push(Note {
                    kind: NoteKind::Unexported,
                    field: "gpu.classes.perGpu",
                    text: format!(
                        "not exported ({}): class {name}'s per-GPU {r} default {} is finer \
                         than a thousandth: its GPU containers get the plain default",
                        scope.name, q.0
                    ),
                });
            }
        }
    }
    if pod_security_matters(p) {
        notes.push(Note {
            kind: NoteKind::Unexported,
            field: "mutation",
            text: format!(
                "left to the mutating webhook ({}): pods of namespaces whose Pod Security is \
                 baseline or restricted in any mode, where the webhook leaves a hostPath \
                 driver to the runtime and gives the sidecar what restricted requires",
                scope.name
            ),
        });
    }
    for (r, q) in &p.mutation.default_resources.per_gpu {
        if milli(q).is_none() {
            notes.push(Note {
                kind: NoteKind::Unexported,
                field: "mutation.defaultResources.perGpu",
                text: format!(
                    "not exported ({}): the per-GPU {r} default {} is finer than a \
                     thousandth: GPU containers get the plain default",
                    scope.name, q.0
                ),
            });
        }
    }
}

/// Whether the export mounts a class's driver: `hostPath`, and `auto` by its
/// `driverFallback` (hostPath unless it says `runtime`), as the webhook decides with no
/// node known: a policy cannot read the Nodes `auto` decides from.
fn mounts_driver(class: &GpuClass) -> bool {
    match class.driver {
        Driver::HostPath => true,
        Driver::Runtime => false,
        Driver::Auto => class.driver_fallback != Some(Driver::Runtime),
    }
}

/// Whether the policy adds what Pod Security at baseline or restricted forbids or wants
/// hardened: a driver mount of some class, or the metrics sidecar.
fn pod_security_matters(p: &Policy) -> bool {
    let m = &p.mutation;
    (m.driver_mounts.enabled && p.gpu.classes.values().any(mounts_driver))
        || m.metrics_sidecar.enabled
}

/// The pod's namespace has a Pod Security level of baseline or restricted in some mode
/// (CEL): an enforce label it cannot read counts as restricted, as the apiserver's
/// PodSecurity admission fails closed; an unreadable warn or audit label as privileged.
fn pod_security_at_least_baseline() -> String {
    let l = "namespaceObject.metadata.labels";
    format!(
        "(namespaceObject != null && has({l}) && (['enforce', 'warn', 'audit'].exists(m, \
         ('pod-security.kubernetes.io/' + m) in {l} && {l}['pod-security.kubernetes.io/' + m] in ['baseline', 'restricted']) \
         || ('pod-security.kubernetes.io/enforce' in {l} && !({l}['pod-security.kubernetes.io/enforce'] in ['privileged', 'baseline', 'restricted']))))"
    )
}

/// A quantity in thousandths, when it is a whole number of them.
fn milli(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<i64> {
    let nano = quantity::parse(&q.0).ok()?;
    (nano % 1_000_000 == 0)
        .then(|| i64::try_from(nano / 1_000_000).ok())
        .flatten()
}

/// The CEL of one scope.
pub(super) struct MapCel<'a> {
    scope: &'a MapScope<'a>,
    p: &'a Policy,
    /// The classes by name, with `extended` last under allExtendedResources.
    classes: Vec<(&'a str, &'a GpuClass)>,
}

/// The class of `allExtendedResources`, as `gpu::EXTENDED`.
fn extended_class() -> &'static GpuClass {
    static EXTENDED: std::sync::OnceLock<GpuClass> = std::sync::OnceLock::new();
    EXTENDED.get_or_init(|| GpuClass {
        driver: Driver::Runtime,
        ..GpuClass::default()
    })
}

impl<'a> MapCel<'a> {
    pub(super) fn new(scope: &'a MapScope<'a>) -> Self {
        let p = scope.policy;
        let mut classes: Vec<(&str, &GpuClass)> =
            p.gpu.classes.iter().map(|(n, c)| (n.as_str(), c)).collect();
        if p.gpu.all_extended_resources {
            classes.push(("extended", extended_class()));
        }
        MapCel { scope, p, classes }
    }

    /// The class a resource name `r` (CEL) belongs to, `''` for none: the first class by
    /// name that covers it, else `extended`.
    fn class_of(&self, r: &str) -> String {
        let mut out = String::new();
        let mut close = 0;
        for (name, class) in &self.classes {
            let covers = if *name == "extended" && self.p.gpu.all_extended_resources {
                is_extended(r)
            } else {
                class_covers(class, r)
            };
            if covers == "false" {
                continue;
            }
            let _ = write!(out, "({covers}) ? {} : (", lit(name));
            close += 1;
        }
        out.push_str("''");
        out.push_str(&")".repeat(close));
        format!("({out})")
    }

    /// The GPU resources of container `c` (CEL): each name once, a request's name or a
    /// limit's without a request, of a class, asked in an amount above zero.
    fn gpu_resources(&self, c: &str) -> String {
        let of = |m: &str, extra: &str| {
            format!(
                "(has({c}.resources) && has({c}.resources.{m}) ? {c}.resources.{m}.filter(r, \
                 r.contains('/'){extra} && {} != '' && quantity(string({c}.resources.{m}[r])).isGreaterThan(quantity('0'))) : [])",
                self.class_of("r")
            )
        };
        format!(
            "{} + {}",
            of("requests", ""),
            of(
                "limits",
                &format!(" && !(has({c}.resources.requests) && r in {c}.resources.requests)")
            )
        )
    }

    /// Whether the pod uses a GPU of class `name`.
    fn pod_uses_class(name: &str) -> String {
        format!(
            "(variables.classesInit.exists(l, {n} in l) || variables.classesMain.exists(l, {n} in l))",
            n = lit(name)
        )
    }

    pub(super) fn variables(&self) -> Vec<(&'static str, String)> {
        let p = self.p;
        let sel = &p.selection;
        let annotations = "object.metadata.annotations";
        let is_true = |key: &str| {
            format!(
                "(has({annotations}) && {k} in {annotations} && {annotations}[{k}].trim().lowerAscii() == 'true')",
                k = lit(key)
            )
        };
        let labelled = if sel.workload_labels.is_empty() {
            "false".to_owned()
        } else {
            format!(
                "(has(object.metadata.labels) && [{}].exists(k, k in object.metadata.labels))",
                sel.workload_labels
                    .iter()
                    .map(|l| lit(l))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let any_gpu = "(variables.gpuInit.exists(l, l.size() > 0) || variables.gpuMain.exists(l, l.size() > 0))";
        let training = format!(
            "{labelled} || {} || {}",
            is_true(&sel.training_annotation),
            if sel.gpu_pods { any_gpu } else { "false" }
        );
        let o = &p.opt_out;
        let user = "(has(request.userInfo.username) ? request.userInfo.username : '')";
        let ns = "(has(request.namespace) ? request.namespace : '')";
        let mut who = vec![];
        if !o.users.is_empty() {
            who.push(any_glob(&o.users, user));
        }
        if !o.groups.is_empty() {
            who.push(format!(
                "(has(request.userInfo.groups) && request.userInfo.groups.exists(g, {}))",
                any_glob(&o.groups, "g")
            ));
        }
        let who = if who.is_empty() {
            "true".to_owned()
        } else {
            format!("({})", who.join(" || "))
        };
        let in_ns = format!("({})", any_glob(&o.namespaces, ns));
        let controller = format!("({})", any_glob(&o.controllers, user));
        let approved = format!(
            "(has({annotations}) && {a} in {annotations} && {annotations}[{a}] != '')",
            a = lit(&o.approval_annotation)
        );
        // `optout::decide`: a controller's pod opts out with tollgate's approval from its
        // template; anyone else where the rule permits them.
        let opted_out = format!(
            "{} && ({controller} ? {in_ns} && {approved} : {in_ns} && {who})",
            is_true(&o.annotation)
        );
        let idx: Vec<String> = (0..MAX_CONTAINERS).map(|i| i.to_string()).collect();
        let mut vars: Vec<(&'static str, String)> = vec![
            ("idx", format!("[{}]", idx.join(", "))),
            (
                "initC",
                "has(object.spec.initContainers) ? object.spec.initContainers : []".into(),
            ),
            ("gpuInit", format!("variables.initC.map(c, {})", self.gpu_resources("c"))),
            (
                "gpuMain",
                format!("object.spec.containers.map(c, {})", self.gpu_resources("c")),
            ),
            (
                "classesInit",
                format!("variables.gpuInit.map(l, l.map(r, {}))", self.class_of("r")),
            ),
            (
                "classesMain",
                format!("variables.gpuMain.map(l, l.map(r, {}))", self.class_of("r")),
            ),
            (
                "inScope",
                self.scope.guard.clone().unwrap_or_else(|| "true".into()),
            ),
            ("training", training),
            ("optedOut", opted_out),
            (
                "leftToWebhook",
                format!(
                    "(has(object.spec.resourceClaims) && object.spec.resourceClaims.size() > 0) \
                     || has(object.spec.resources) \
                     || variables.initC.size() > {MAX_CONTAINERS} || object.spec.containers.size() > {MAX_CONTAINERS}{}",
                    self.left_for_gpus_and_security()
                ),
            ),
            (
                "go",
                "variables.inScope && !variables.leftToWebhook && !variables.optedOut && variables.training"
                    .into(),
            ),
        ];
        let m = &p.mutation;
        if m.gpu_tolerations.enabled {
            vars.extend(self.toleration_vars());
        }
        if m.driver_mounts.enabled {
            for (i, patch) in self.driver_patches().into_iter().enumerate() {
                vars.push((leak(format!("driverPatch{i}")), patch));
            }
        }
        if m.metrics_sidecar.enabled {
            vars.push(("sidecarState", self.sidecar_state()));
            vars.push(("sidecarPatch", self.sidecar_patch()));
            vars.push(("sidecarAnnotationPatch", self.sidecar_annotation_patch()));
        }
        if m.default_resources.enabled {
            vars.extend(self.limits_vars());
            vars.push(("equalLimitsPatch", self.equal_limits_patch()));
        }
        vars.push(("appliedPatch", self.applied_patch(&vars)));
        vars
    }

    /// The mutations, in order, each a variable's patch.
    pub(super) fn mutations(vars: &[(&'static str, String)]) -> Vec<&'static str> {
        let mut out = vec!["appliedPatch"];
        for (name, _) in vars {
            if name.contains("Patch") && *name != "appliedPatch" {
                out.push(name);
            }
        }
        out
    }

    // -----------------------------------------------------------------------------------
    // Tolerations.

    /// The tolerations the pod's classes call for and the pod lacks, in the webhook's
    /// order (sorted by key, operator, value, effect; one already on the pod, or one added
    /// before, that covers a wanted one means it is not added).
    fn toleration_vars(&self) -> Vec<(&'static str, String)> {
        // Fixed candidates: a class's own list, or one per resource name it lists (not a
        // glob) and per implicit DRA name. Dynamic: the pod's resources of a class without
        // a list that match a glob, and every extended resource under
        // allExtendedResources.
        let mut fixed: Vec<(Toleration, Vec<String>)> = vec![];
        let mut dynamic: Vec<String> = vec![];
        let mut add = |t: Toleration, cond: String| match fixed.iter_mut().find(|(f, _)| *f == t) {
            Some((_, conds)) => conds.push(cond),
            None => fixed.push((t, vec![cond])),
        };
        for (name, class) in &self.classes {
            match &class.tolerations {
                Some(list) => {
                    for t in list {
                        add(t.clone(), Self::pod_uses_class(name));
                    }
                }
                None => {
                    let mut names: Vec<String> = class
                        .resources
                        .iter()
                        .map(|g| g.as_str().to_owned())
                        .filter(|g| !g.contains(['*', '?']))
                        .collect();
                    names.extend(
                        class
                            .device_classes
                            .iter()
                            .map(|d| format!("{}{d}", quantity::IMPLICIT_DRA_PREFIX)),
                    );
                    for r in names {
                        let t = Toleration {
                            key: Some(r.clone()),
                            operator: Some("Exists".into()),
                            effect: Some("NoSchedule".into()),
                            ..Default::default()
                        };
                        // The resource is the pod's and of this class (another class first
                        // by name may claim it).
                        add(
                            t,
                            format!(
                                "(variables.gpuInit.exists(l, {r} in l) || variables.gpuMain.exists(l, {r} in l)) && {} == {}",
                                self.class_of(&lit(&r)),
                                lit(name),
                                r = lit(&r)
                            ),
                        );
                    }
                    let globs: Vec<_> = class
                        .resources
                        .iter()
                        .filter(|g| g.as_str().contains(['*', '?']))
                        .cloned()
                        .collect();
                    if !globs.is_empty() || *name == "extended" {
                        dynamic.push(format!(
                            "variables.gpuInit.map(l, l.filter(r, {c} == {n})) + variables.gpuMain.map(l, l.filter(r, {c} == {n}))",
                            c = self.class_of("r"),
                            n = lit(name)
                        ));
                    }
                }
            }
        }
        fixed.sort_by(|a, b| toleration_order(&a.0).cmp(&toleration_order(&b.0)));
        let existing = "(has(object.spec.tolerations) ? object.spec.tolerations : [])";
        let mut vars: Vec<(&'static str, String)> = vec![];
        let wanted = if dynamic.is_empty() {
            // In the webhook's order already; each added unless the pod's or an earlier
            // one covers it.
            let mut items = vec![];
            for (j, (t, conds)) in fixed.iter().enumerate() {
                let mut cond = format!("({})", conds.join(" || "));
                for (earlier, econds) in &fixed[..j] {
                    if covers(earlier, t) {
                        let _ = write!(cond, " && !({})", econds.join(" || "));
                    }
                }
                let _ = write!(
                    cond,
                    " && !{existing}.exists(t, {})",
                    covers_cel("t", &toleration_fields(t))
                );
                items.push(format!("({cond} ? [{}] : [])", toleration_map(t)));
            }
            if items.is_empty() {
                "[]".to_owned()
            } else {
                items.join(" + ")
            }
        } else {
            // Sorted in CEL: the resource names of the dynamic candidates as tolerations,
            // with the fixed ones, ranked by their sort key.
            let mut parts: Vec<String> = fixed
                .iter()
                .map(|(t, conds)| {
                    format!("(({}) ? [{}] : [])", conds.join(" || "), toleration_map(t))
                })
                .collect();
            for d in &dynamic {
                parts.push(format!(
                    "({d}).flatten().map(r, {{'key': dyn(r), 'operator': dyn('Exists'), 'effect': dyn('NoSchedule')}})"
                ));
            }
            let sort_key = |t: &str| {
                format!(
                    "({t}.key + '\\u0000' + ('operator' in {t} ? string({t}.operator) : '') + '\\u0000' + ('value' in {t} ? string({t}.value) : '') + '\\u0000' + ('effect' in {t} ? string({t}.effect) : ''))"
                )
            };
            vars.push(("tolCandidates", gate_value(&parts.join(" + "))));
            vars.push((
                "tolKeys",
                format!("variables.tolCandidates.map(x, {})", sort_key("x")),
            ));
            vars.push((
                "tolSorted",
                "variables.idx.filter(i, variables.tolKeys.exists(x, variables.tolKeys.filter(y, y < x).size() == i)).map(i, variables.tolCandidates[variables.idx.filter(j, j < variables.tolKeys.size() && variables.tolKeys.filter(y, y < variables.tolKeys[j]).size() == i)[0]])".into(),
            ));
            format!(
                "variables.tolSorted.filter(w, !{existing}.exists(t, {c}) && !variables.tolSorted.exists(u, {su} < {sw} && {cu}))",
                c = covers_cel("t", &dyn_fields("w")),
                su = sort_key("u"),
                sw = sort_key("w"),
                cu = covers_cel("u", &dyn_fields("w")),
            )
        };
        vars.push(("tolWanted", gate_value(&wanted)));
        vars.push((
            "tolerationPatch",
            gate(
                "variables.tolWanted.size() == 0 ? [] : has(object.spec.tolerations) \
                 ? variables.tolWanted.map(t, JSONPatch{op: 'add', path: '/spec/tolerations/-', value: t}) \
                 : [JSONPatch{op: 'add', path: '/spec/tolerations', value: variables.tolWanted}]",
            ),
        ));
        vars
    }

    /// The further pods `leftToWebhook` (CEL, each condition after ` || `): those whose
    /// GPUs the webhook reads from what CEL does not (a class's `shares`, which count as no
    /// GPU of their own; a `fractions` annotation), and, where the policy adds what Pod
    /// Security forbids (a hostPath driver, a sidecar restricted hardens), every pod of a
    /// namespace whose Pod Security labels are baseline or restricted in any mode (an
    /// enforce level it cannot read is restricted, as the apiserver's): `mutate::heed`
    /// leaves the driver to the runtime there and hardens the sidecar.
    fn left_for_gpus_and_security(&self) -> String {
        let mut out = String::new();
        let shares: Vec<crate::glob::Glob> = self
            .classes
            .iter()
            .flat_map(|(_, c)| c.shares.iter().cloned())
            .collect();
        if !shares.is_empty() {
            let any = any_glob(&shares, "r");
            let _ = write!(
                out,
                " || (variables.initC + object.spec.containers).exists(c, has(c.resources) && \
                 ((has(c.resources.requests) && c.resources.requests.exists(r, {any})) || \
                 (has(c.resources.limits) && c.resources.limits.exists(r, {any}))))"
            );
        }
        for (_, class) in &self.classes {
            let Some(f) = class.fractions.as_ref() else {
                continue;
            };
            if f.scheduler_names.is_empty() || f.annotations.is_empty() {
                continue;
            }
            let list = |v: &[String]| v.iter().map(|x| lit(x)).collect::<Vec<_>>().join(", ");
            let _ = write!(
                out,
                " || ((has(object.spec.schedulerName) ? object.spec.schedulerName : 'default-scheduler') in [{}] \
                 && has(object.metadata.annotations) && [{}].exists(a, a in object.metadata.annotations))",
                list(&f.scheduler_names),
                list(&f.annotations),
            );
        }
        if pod_security_matters(self.p) {
            let _ = write!(out, " || {}", pod_security_at_least_baseline());
        }
        out
    }

    // -----------------------------------------------------------------------------------
    // Driver mounts.

    /// One patch per mount and per variable of each hostPath class, in class order:
    /// each sees what the ones before it did, as the webhook's loop does.
    fn driver_patches(&self) -> Vec<String> {
        let mut out = vec![];
        for (name, class) in &self.classes {
            if !mounts_driver(class) {
                continue;
            }
            let uses = |i: &str, list: &str| {
                format!(
                    "{} in variables.{list}[{i}]",
                    lit(name),
                    list = if list == "initContainers" {
                        "classesInit"
                    } else {
                        "classesMain"
                    }
                )
            };
            for m in &class.mounts {
                let n = lit(&m.name);
                let same_path = |a: &str| {
                    format!(
                        "{a}.matches({})",
                        lit(&format!(
                            "^{}/*$",
                            re2_escape(m.mount_path.trim_end_matches('/'))
                        ))
                    )
                };
                let volumes = "(has(object.spec.volumes) ? object.spec.volumes : [])";
                let foreign = format!(
                    "{volumes}.exists(v, v.name == {n} && !(has(v.hostPath) && v.hostPath.path == {p} && (has(v.hostPath.type) ? v.hostPath.type : '') == {t}))",
                    p = lit(&m.host_path),
                    t = lit(&m.r#type)
                );
                let present = |c: &str| {
                    format!(
                        "(has({c}.volumeMounts) && {c}.volumeMounts.exists(vm, vm.name == {n} && {}))",
                        same_path("vm.mountPath")
                    )
                };
                let absent = |c: &str| {
                    format!(
                        "!(has({c}.volumeMounts) && {c}.volumeMounts.exists(vm, vm.name == {n} || {}))",
                        same_path("vm.mountPath")
                    )
                };
                let mount = format!(
                    "{{'name': dyn({n}), 'mountPath': dyn({mp}), 'readOnly': dyn(true)}}",
                    mp = lit(&m.mount_path)
                );
                let mut per_list = vec![];
                let mut mounted = vec![];
                for (key, list) in LISTS {
                    let c = format!("{list}[i]");
                    let size = format!("{list}.size()");
                    per_list.push(format!(
                        "variables.idx.filter(i, i < {size} && {u} && {a}).map(i, has({c}.volumeMounts) \
                         ? JSONPatch{{op: 'add', path: '/spec/{key}/' + string(i) + '/volumeMounts/-', value: {mount}}} \
                         : JSONPatch{{op: 'add', path: '/spec/{key}/' + string(i) + '/volumeMounts', value: [{mount}]}})",
                        u = uses("i", key),
                        a = absent(&c),
                    ));
                    mounted.push(format!(
                        "variables.idx.exists(i, i < {size} && {u} && ({pr} || {a}))",
                        u = uses("i", key),
                        pr = present(&c),
                        a = absent(&c),
                    ));
                }
                let mut volume = format!(
                    "{{'name': dyn({n}), 'hostPath': dyn({{'path': {p}",
                    p = lit(&m.host_path)
                );
                if !m.r#type.is_empty() {
                    let _ = write!(volume, ", 'type': {}", lit(&m.r#type));
                }
                volume.push_str("})}");
                let volume_absent = format!("!{volumes}.exists(v, v.name == {n})");
                let patch = format!(
                    "{foreign} ? [] : {mounts} + (({any}) && {volume_absent} \
                     ? [has(object.spec.volumes) ? JSONPatch{{op: 'add', path: '/spec/volumes/-', value: {volume}}} \
                        : JSONPatch{{op: 'add', path: '/spec/volumes', value: [{volume}]}}] : [])",
                    mounts = per_list.join(" + "),
                    any = mounted.join(" || "),
                );
                out.push(gate(&patch));
            }
            for e in &class.env {
                let n = lit(&e.name);
                let v = lit(&e.value);
                let sep = lit(&e.separator);
                let mut per_list = vec![];
                for (key, list) in LISTS {
                    let c = format!("{list}[i]");
                    // The last definition of the name is the one the container sees.
                    let last = format!(
                        "variables.idx.filter(j, has({c}.env) && j < {c}.env.size() && {c}.env[j].name == {n})"
                    );
                    let var = format!("{c}.env[{last}[{last}.size() - 1]]");
                    let current = format!("(has({var}.value) ? {var}.value : '')");
                    let has_component = if e.separator.is_empty() {
                        format!("{current}.contains({v})")
                    } else {
                        format!("({sep} + {current} + {sep}).contains({sep} + {v} + {sep})")
                    };
                    let joined = match e.if_present {
                        IfPresent::Keep => None,
                        IfPresent::Append => Some(format!("{current} + {sep} + {v}")),
                        IfPresent::Prepend => Some(format!("{v} + {sep} + {current}")),
                    };
                    let entry = format!("{{'name': {n}, 'value': {v}}}");
                    let add = format!(
                        "variables.idx.filter(i, i < {list}.size() && {u} && {last}.size() == 0).map(i, has({c}.env) \
                         ? JSONPatch{{op: 'add', path: '/spec/{key}/' + string(i) + '/env/-', value: {entry}}} \
                         : JSONPatch{{op: 'add', path: '/spec/{key}/' + string(i) + '/env', value: [{entry}]}})",
                        u = uses("i", key),
                    );
                    per_list.push(add);
                    if let Some(joined) = joined {
                        if !e.value.is_empty() {
                            per_list.push(format!(
                                "variables.idx.filter(i, i < {list}.size() && {u} && {last}.size() > 0 && !has({var}.valueFrom) && !({has_component})).map(i, \
                                 JSONPatch{{op: 'add', path: '/spec/{key}/' + string(i) + '/env/' + string({last}[{last}.size() - 1]) + '/value', \
                                 value: {current} == '' ? {v} : {joined}}})",
                                u = uses("i", key),
                            ));
                        }
                    }
                }
                out.push(gate(&per_list.join(" + ")));
            }
        }
        out
    }

    // -----------------------------------------------------------------------------------
    // The metrics sidecar.

    /// `'ours'` (a container of its name and image), `'taken'` (its name or a port of it
    /// taken: never added), or `'absent'`.
    fn sidecar_state(&self) -> String {
        let t = &self.p.mutation.metrics_sidecar.container;
        let name = lit(&t.name);
        let both = |pred: &str| {
            format!(
                "(variables.initC.exists(c, {pred}) || object.spec.containers.exists(c, {pred}))"
            )
        };
        let image = lit(t.image.as_deref().unwrap_or(""));
        let mut clashes = vec![];
        for port in t.ports.iter().flatten() {
            let proto = lit(port.protocol.as_deref().unwrap_or("TCP"));
            let theirs_proto = "(has(p.protocol) ? p.protocol : 'TCP')";
            let mut c = vec![];
            if let Some(n) = port.name.as_deref().filter(|n| !n.is_empty()) {
                c.push(format!("(has(p.name) && p.name == {})", lit(n)));
            }
            c.push(format!(
                "({theirs_proto} == {proto} && p.containerPort == {})",
                port.container_port
            ));
            if let Some(h) = port.host_port.filter(|h| *h != 0) {
                c.push(format!(
                    "({theirs_proto} == {proto} && has(p.hostPort) && p.hostPort == {h})"
                ));
            }
            clashes.push(c.join(" || "));
        }
        let port_taken = if clashes.is_empty() {
            "false".to_owned()
        } else {
            both(&format!(
                "has(c.ports) && c.ports.exists(p, {})",
                clashes.join(" || ")
            ))
        };
        format!(
            "{named} \
             ? ({ours} ? 'ours' : 'taken') \
             : (has(object.spec.ephemeralContainers) && object.spec.ephemeralContainers.exists(c, c.name == {name})) || {port_taken} \
             ? 'taken' : 'absent'",
            named = both(&format!("c.name == {name}")),
            ours = both(&format!("c.name == {name} && (has(c.image) ? c.image : '') == {image}")),
        )
    }

    fn sidecar_patch(&self) -> String {
        let s = &self.p.mutation.metrics_sidecar;
        let mut c = s.container.clone();
        if s.mode == SidecarMode::Native {
            c.restart_policy = Some("Always".into());
        }
        let value = cel_value(&serde_json::to_value(&c).unwrap_or(Value::Null));
        let list = match s.mode {
            SidecarMode::Native => "initContainers",
            SidecarMode::Classic => "containers",
        };
        let exists = match s.mode {
            SidecarMode::Native => "has(object.spec.initContainers)",
            SidecarMode::Classic => "true",
        };
        gate(&format!(
            "variables.sidecarState != 'absent' ? [] : {exists} \
             ? [JSONPatch{{op: 'add', path: '/spec/{list}/-', value: {value}}}] \
             : [JSONPatch{{op: 'add', path: '/spec/{list}', value: [{value}]}}]"
        ))
    }

    /// The annotations of the sidecar a pod lacks, once the sidecar is in it.
    fn sidecar_annotation_patch(&self) -> String {
        let s = &self.p.mutation.metrics_sidecar;
        if s.annotations.is_empty() {
            return "[]".into();
        }
        let a = "object.metadata.annotations";
        let missing: Vec<String> = s
            .annotations
            .iter()
            .map(|(k, v)| {
                format!(
                    "(has({a}) && {k} in {a} ? [] : [JSONPatch{{op: 'add', path: '/metadata/annotations/' + ({k}).replace('~', '~0').replace('/', '~1'), value: {v}}}])",
                    k = lit(k),
                    v = lit(v)
                )
            })
            .collect();
        let any_missing = format!(
            "!(has({a}) && [{}].all(k, k in {a}))",
            s.annotations
                .keys()
                .map(|k| lit(k))
                .collect::<Vec<_>>()
                .join(", ")
        );
        gate(&format!(
            "variables.sidecarState != 'ours' || !({any_missing}) ? [] : \
             (has({a}) ? [] : [JSONPatch{{op: 'add', path: '/metadata/annotations', value: {{}}}}]) + {}",
            missing.join(" + ")
        ))
    }

    // -----------------------------------------------------------------------------------
    // Default limits.

    /// The default limits each container lacks (`default_resources::fill`), as variables:
    /// each GPU container's GPU counts, its per-GPU totals (in thousandths) per resource,
    /// the `[name, value]` pairs each container gets, and the patch.
    fn limits_vars(&self) -> Vec<(&'static str, String)> {
        let dr = &self.p.mutation.default_resources;
        let mut names: Vec<&String> = dr.limits.keys().collect();
        for k in dr
            .per_gpu
            .keys()
            .chain(self.classes.iter().flat_map(|(_, c)| c.per_gpu.keys()))
        {
            if !names.contains(&k) {
                names.push(k);
            }
        }
        let mut vars: Vec<(&'static str, String)> = vec![];
        let mut parts = vec![];
        for (key, list) in LISTS {
            let side = if key == "initContainers" {
                "Init"
            } else {
                "Main"
            };
            let c = format!("{list}[i]");
            let gpu = format!("variables.gpu{side}[i]");
            let count = format!(
                "(quantity(string(has({c}.resources.requests) && r in {c}.resources.requests ? {c}.resources.requests[r] : {c}.resources.limits[r])).isInteger() \
                 ? quantity(string(has({c}.resources.requests) && r in {c}.resources.requests ? {c}.resources.requests[r] : {c}.resources.limits[r])).asInteger() : 0)"
            );
            vars.push((
                leak(format!("counts{side}")),
                format!("variables.idx.filter(i, i < {list}.size()).map(i, {gpu}.map(r, {count}))"),
            ));
            let mut adds = vec![];
            for (j, n) in names.iter().enumerate() {
                // Per class: its per-GPU default of n, if any, in thousandths.
                let per: Vec<(&str, i64)> = self
                    .classes
                    .iter()
                    .filter_map(|(name, class)| {
                        let q = class.per_gpu.get(*n).or(dr.per_gpu.get(*n))?;
                        Some((*name, milli(q)?))
                    })
                    .collect();
                let total = if per.is_empty() {
                    None
                } else {
                    let mut factor = "0".to_owned();
                    for (class, m) in per.iter().rev() {
                        factor = format!(
                            "(variables.classes{side}[i][k] == {} ? {m} : {factor})",
                            lit(class)
                        );
                    }
                    let var = leak(format!("perGpu{j}{side}"));
                    vars.push((
                        var,
                        format!(
                            "variables.idx.filter(i, i < {list}.size()).map(i, variables.idx.filter(k, k < {gpu}.size()).map(k, variables.counts{side}[i][k] * {factor}).sum())"
                        ),
                    ));
                    Some(format!("variables.{var}[i]"))
                };
                if let Some(a) = self.default_add(n, &c, &gpu, total.as_deref()) {
                    adds.push(a);
                }
            }
            if adds.is_empty() {
                continue;
            }
            let var = leak(format!("limits{side}"));
            vars.push((
                var,
                format!(
                    "variables.idx.filter(i, i < {list}.size()).map(i, {})",
                    adds.join(" + ")
                ),
            ));
            let adds = format!("variables.{var}[i]");
            parts.push(format!(
                "variables.idx.filter(i, i < {list}.size() && {adds}.size() > 0).map(i, \
                 (has({c}.resources) ? [] : [JSONPatch{{op: 'add', path: '/spec/{key}/' + string(i) + '/resources', value: {{}}}}]) + \
                 (has({c}.resources) && has({c}.resources.limits) ? [] : [JSONPatch{{op: 'add', path: '/spec/{key}/' + string(i) + '/resources/limits', value: {{}}}}]) + \
                 {adds}.map(a, JSONPatch{{op: 'add', path: '/spec/{key}/' + string(i) + '/resources/limits/' + a[0].replace('~', '~0').replace('/', '~1'), value: a[1]}})).flatten()"
            ));
        }
        let patch = if parts.is_empty() {
            "[]".to_owned()
        } else {
            gate(&parts.join(" + "))
        };
        // The pairs are read only through the patch: computed for the pods it mutates.
        for (_, e) in vars.iter_mut() {
            *e = gate_value(e);
        }
        vars.push(("limitsPatch", patch));
        vars
    }

    /// `[[name, value]]` when container `c` (CEL) lacks a limit of `n` and has a default
    /// for it, else `[]`; None when the policy has no default of `n` for any container.
    /// `total`: the container's per-GPU total of `n` in thousandths (CEL int), where some
    /// class has a per-GPU default of it.
    fn default_add(&self, n: &str, c: &str, gpu: &str, total: Option<&str>) -> Option<String> {
        let dr = &self.p.mutation.default_resources;
        let flat = dr
            .limits
            .get(n)
            .and_then(|q| quantity::parse(&q.0).ok())
            .map(|nano| quantity::format_for(n, nano));
        if total.is_none() && flat.is_none() {
            return None;
        }
        let ln = lit(n);
        let has_limit = format!(
            "(has({c}.resources) && has({c}.resources.limits) && {ln} in {c}.resources.limits)"
        );
        let request = format!("{c}.resources.requests[{ln}]");
        let has_request = format!(
            "(has({c}.resources) && has({c}.resources.requests) && {ln} in {c}.resources.requests)"
        );
        let flat_value = flat.as_deref().map_or_else(|| "''".to_owned(), lit);
        // The default as a CEL string, or '' for none.
        let default = match total {
            Some(t) => format!("({t} > 0 ? {} : {flat_value})", format_milli_cel(n, t)),
            None => flat_value,
        };
        // A flat-only resource applies to every container; per-GPU only with GPUs.
        let applies = if flat.is_some() {
            "true".to_owned()
        } else {
            format!("{gpu}.size() > 0")
        };
        Some(format!(
            "({applies} && !{has_limit} && {default} != '' ? [[{ln}, \
             {has_request} && quantity(string({request})).compareTo(quantity({default})) > 0 ? string({request}) : {default}]] : [])"
        ))
    }

    /// A non-overcommittable request (an extended resource, hugepages) without a limit
    /// gets the request as its limit (after the defaults, as in `fill`).
    fn equal_limits_patch(&self) -> String {
        let mut parts = vec![];
        for (key, list) in LISTS {
            let c = format!("{list}[i]");
            let wanted = format!(
                "(has({c}.resources) && has({c}.resources.requests) ? {c}.resources.requests.filter(r, ({nonover}) && !(has({c}.resources.limits) && r in {c}.resources.limits)) : [])",
                nonover = format_args!("r.startsWith('hugepages-') || {}", is_extended("r"))
            );
            parts.push(format!(
                "variables.idx.filter(i, i < {list}.size() && {wanted}.size() > 0).map(i, \
                 (has({c}.resources.limits) ? [] : [JSONPatch{{op: 'add', path: '/spec/{key}/' + string(i) + '/resources/limits', value: {{}}}}]) + \
                 {wanted}.map(r, JSONPatch{{op: 'add', path: '/spec/{key}/' + string(i) + '/resources/limits/' + r.replace('~', '~0').replace('/', '~1'), value: string({c}.resources.requests[r])}})).flatten()"
            ));
        }
        gate(&parts.join(" + "))
    }

    // -----------------------------------------------------------------------------------
    // The applied annotation.

    /// The union of what the annotation says and what this pass is about to do, sorted as
    /// `mutate::record_applied` sorts it, written only when it adds something.
    fn applied_patch(&self, vars: &[(&'static str, String)]) -> String {
        let key = lit(&self.p.mutation.applied_annotation);
        let a = "object.metadata.annotations";
        let has = |name: &str| vars.iter().any(|(n, _)| *n == name);
        let mut steps: Vec<(Step, String)> = vec![];
        if has("tolerationPatch") {
            steps.push((
                Step::Tolerations,
                "variables.tolerationPatch.size() > 0".into(),
            ));
        }
        let drivers: Vec<String> = vars
            .iter()
            .filter(|(n, _)| n.starts_with("driverPatch"))
            .map(|(n, _)| format!("variables.{n}.size() > 0"))
            .collect();
        if !drivers.is_empty() {
            steps.push((Step::DriverMounts, drivers.join(" || ")));
        }
        if has("sidecarPatch") {
            steps.push((
                Step::MetricsSidecar,
                "variables.sidecarPatch.size() > 0 || variables.sidecarAnnotationPatch.size() > 0"
                    .into(),
            ));
        }
        if has("limitsPatch") {
            let mut cond =
                "variables.limitsPatch.size() > 0 || variables.equalLimitsPatch.size() > 0"
                    .to_owned();
            if has("sidecarPatch") && self.sidecar_gets_defaults() {
                cond.push_str(" || variables.sidecarPatch.size() > 0");
            }
            steps.push((Step::DefaultResources, cond));
        }
        let existing =
            format!("(has({a}) && {key} in {a} ? {a}[{key}].split(',').map(s, s.trim()) : [])");
        let any = if steps.is_empty() {
            "false".to_owned()
        } else {
            steps
                .iter()
                .map(|(_, c)| format!("({c})"))
                .collect::<Vec<_>>()
                .join(" || ")
        };
        // The items, in order: each step, then the classes by name, then the profile.
        let mut step_items = vec![];
        for s in Step::ALL {
            let name = lit(s.as_str());
            let new = steps
                .iter()
                .find(|(t, _)| *t == s)
                .map_or("false".to_owned(), |(_, c)| format!("({c})"));
            step_items.push(format!("({name} in {existing} || {new} ? [{name}] : [])"));
        }
        let class_names: Vec<String> = self
            .classes
            .iter()
            .map(|(n, _)| format!("gpu={n}"))
            .collect();
        let new_classes = format!(
            "variables.applies ? [{}].filter(n, {}) : []",
            class_names
                .iter()
                .map(|n| lit(n))
                .collect::<Vec<_>>()
                .join(", "),
            if class_names.is_empty() {
                "false".to_owned()
            } else {
                "variables.classesInit.exists(l, n.substring(4) in l) || variables.classesMain.exists(l, n.substring(4) in l)".to_owned()
            }
        );
        let sorted = |l: &str| {
            format!(
                "variables.idx.filter(i, ({l}).exists(x, ({l}).filter(y, y < x).size() == i)).map(i, ({l}).filter(x, ({l}).filter(y, y < x).size() == i)[0])"
            )
        };
        let gpus =
            format!("{existing}.filter(s, s.startsWith('gpu=') && s.size() > 4) + ({new_classes})");
        let profile_new = match self.scope.profile {
            Some(p) => format!(
                "(variables.applies ? [{}] : [])",
                lit(&format!("profile={p}"))
            ),
            None => "[]".to_owned(),
        };
        let profiles = format!(
            "{existing}.filter(s, s.startsWith('profile=') && s.size() > 8) + {profile_new}"
        );
        let items = format!(
            "{} + {} + {}",
            step_items.join(" + "),
            sorted(&gpus),
            sorted(&profiles)
        );
        let added = format!(
            "({gpus}).exists(x, !(x in {existing})) || ({profiles}).exists(x, !(x in {existing})) || {}",
            steps
                .iter()
                .map(|(s, c)| format!("(({c}) && !({} in {existing}))", lit(s.as_str())))
                .chain(std::iter::once("false".to_owned()))
                .collect::<Vec<_>>()
                .join(" || ")
        );
        let patch = format!(
            "!({added}) ? [] : \
             (has({a}) ? [] : [JSONPatch{{op: 'add', path: '/metadata/annotations', value: {{}}}}]) + \
             [JSONPatch{{op: 'add', path: '/metadata/annotations/' + ({key}).replace('~', '~0').replace('/', '~1'), value: ({items}).join(',')}}]"
        );
        // `applies`: some step is about to change the pod (the classes and the profile
        // are recorded only then).
        gate(&patch.replace("variables.applies", &format!("({any})")))
    }

    /// Whether the sidecar, as the policy gives it, lacks a limit the defaults fill (it
    /// uses no GPU): then adding it is a change of the default-resources step too.
    fn sidecar_gets_defaults(&self) -> bool {
        let c: &Container = &self.p.mutation.metrics_sidecar.container;
        let dr = &self.p.mutation.default_resources;
        let limits = c.resources.as_ref().and_then(|r| r.limits.as_ref());
        let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        dr.limits
            .keys()
            .any(|k| !limits.is_some_and(|l| l.contains_key(k)))
            || requests.is_some_and(|r| {
                r.keys().any(|k| {
                    quantity::is_non_overcommittable(k)
                        && !limits.is_some_and(|l| l.contains_key(k))
                })
            })
    }
}

/// `expr` (a list of JSONPatch) only for the pods this policy mutates.
fn gate(expr: &str) -> String {
    format!("!variables.go ? [] : {expr}")
}

/// `expr` (a list) computed only for the pods this policy mutates.
fn gate_value(expr: &str) -> String {
    format!("!variables.go ? [] : {expr}")
}

/// A variable's name, for the list of (name, expression) pairs.
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Whether class `class` covers resource `r` (CEL): a name or glob of its resources, or
/// the implicit DRA name of one of its device classes.
fn class_covers(class: &GpuClass, r: &str) -> String {
    let mut any = vec![];
    let globs = any_glob(&class.resources, r);
    if globs != "false" {
        any.push(format!("({globs})"));
    }
    if !class.device_classes.is_empty() {
        any.push(format!(
            "{r} in [{}]",
            class
                .device_classes
                .iter()
                .map(|d| lit(&format!("{}{d}", quantity::IMPLICIT_DRA_PREFIX)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if any.is_empty() {
        return "false".into();
    }
    any.join(" || ")
}

/// `quantity::is_extended_resource` in CEL.
fn is_extended(r: &str) -> String {
    let prefix = quantity::IMPLICIT_DRA_PREFIX;
    format!(
        "(({r}.startsWith({p}) && {r}.size() > {n}) || ({r}.matches('^[^/]+/.+$') && !{r}.startsWith('kubernetes.io/') \
         && !{r}.matches('^[^/]*\\\\.kubernetes\\\\.io/') && !{r}.startsWith('requests.')))",
        p = lit(prefix),
        n = prefix.len()
    )
}

/// An amount in thousandths (`total`, CEL int above 0) written as `quantity::format_for`
/// writes it.
fn format_milli_cel(resource: &str, total: &str) -> String {
    let units = format!("({total} / 1000)");
    let whole = if resource == "cpu" {
        format!("string({units})")
    } else {
        let mut out = format!("string({units})");
        for (suffix, shift) in [
            ("Ki", 10),
            ("Mi", 20),
            ("Gi", 30),
            ("Ti", 40),
            ("Pi", 50),
            ("Ei", 60),
        ] {
            let m: i64 = 1 << shift;
            out = format!("({units} % {m} == 0 ? string({units} / {m}) + '{suffix}' : {out})");
        }
        out
    };
    format!("({total} % 1000 != 0 ? string({total}) + 'm' : {whole})")
}

/// A toleration as the webhook compares them: key, operator, value, effect.
fn toleration_order(t: &Toleration) -> (&str, &str, &str, &str) {
    (
        t.key.as_deref().unwrap_or(""),
        t.operator.as_deref().unwrap_or(""),
        t.value.as_deref().unwrap_or(""),
        t.effect.as_deref().unwrap_or(""),
    )
}

/// `tolerations::covers`, for two tolerations the export knows.
fn covers(t: &Toleration, wanted: &Toleration) -> bool {
    let key = t.key.as_deref().unwrap_or("");
    let exists = t.operator.as_deref() == Some("Exists");
    let wanted_exists = wanted.operator.as_deref() == Some("Exists");
    let key_ok = if key.is_empty() {
        exists
    } else {
        key == wanted.key.as_deref().unwrap_or("")
    };
    let value_ok = exists
        || (!wanted_exists
            && t.value.as_deref().unwrap_or("") == wanted.value.as_deref().unwrap_or(""));
    let effect_ok = match t.effect.as_deref() {
        None | Some("") => true,
        Some(e) => wanted.effect.as_deref() == Some(e),
    };
    key_ok && value_ok && effect_ok
}

/// The fields of a wanted toleration as CEL strings: key, whether its operator is
/// Exists, value, effect.
struct Fields {
    key: String,
    exists: String,
    value: String,
    effect: String,
}

fn toleration_fields(t: &Toleration) -> Fields {
    Fields {
        key: lit(t.key.as_deref().unwrap_or("")),
        exists: (t.operator.as_deref() == Some("Exists")).to_string(),
        value: lit(t.value.as_deref().unwrap_or("")),
        effect: lit(t.effect.as_deref().unwrap_or("")),
    }
}

/// The fields of a toleration map `w` built by the export (CEL).
fn dyn_fields(w: &str) -> Fields {
    Fields {
        key: format!("string({w}.key)"),
        exists: format!("('operator' in {w} && string({w}.operator) == 'Exists')"),
        value: format!("('value' in {w} ? string({w}.value) : '')"),
        effect: format!("('effect' in {w} ? string({w}.effect) : '')"),
    }
}

/// Whether toleration `t` (CEL: a pod's, or a map built by the export) covers the one
/// with fields `w` (`tolerations::covers`).
fn covers_cel(t: &str, w: &Fields) -> String {
    let field = |f: &str| format!("(has({t}.{f}) ? string({t}.{f}) : '')");
    let exists = format!("{} == 'Exists'", field("operator"));
    format!(
        "(({k} == '' ? {exists} : {k} == {wk}) && ({exists} || (!{we} && {v} == {wv})) && ({e} == '' || {e} == {wf}))",
        k = field("key"),
        wk = w.key,
        we = w.exists,
        v = field("value"),
        wv = w.value,
        e = field("effect"),
        wf = w.effect,
    )
}

/// A toleration the policy gives, as a CEL map of dyn values.
fn toleration_map(t: &Toleration) -> String {
    cel_value(&serde_json::to_value(t).unwrap_or(Value::Null))
}

/// A JSON value as a CEL literal: every map value `dyn`, so that maps whose values differ
/// in type pass the apiserver's check of homogeneous literals.
fn cel_value(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => lit(s),
        Value::Array(items) => format!(
            "[{}]",
            items
                .iter()
                .map(|i| format!("dyn({})", cel_value(i)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| format!("{}: dyn({})", lit(k), cel_value(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A string as an RE2 pattern matching it literally.
fn re2_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A policy's MutatingAdmissionPolicy object's spec parts, for `mod.rs` to wrap.
pub(super) fn spec(scope: &MapScope<'_>, match_constraints: Node) -> Node {
    let cel = MapCel::new(scope);
    let vars = cel.variables();
    let mutations = MapCel::mutations(&vars);
    let variables = Node::List(
        vars.iter()
            .map(|(n, e)| {
                Node::Map(vec![
                    ("name", Node::plain(n)),
                    ("expression", Node::cel(&wrap(&as_maps(e)))),
                ])
            })
            .collect(),
    );
    let mutations = Node::List(
        mutations
            .iter()
            .map(|m| {
                Node::Map(vec![
                    ("patchType", Node::plain("JSONPatch")),
                    (
                        "jsonPatch",
                        Node::Map(vec![(
                            "expression",
                            Node::cel(&format!(
                                "variables.{m}.map(p, JSONPatch{{op: string(p.op), path: \
                                 string(p.path), value: p.value}})"
                            )),
                        )]),
                    ),
                ])
            })
            .collect(),
    );
    Node::Map(vec![
        ("failurePolicy", Node::plain("Fail")),
        ("reinvocationPolicy", Node::plain("IfNeeded")),
        ("matchConstraints", match_constraints),
        ("variables", variables),
        ("mutations", mutations),
    ])
}

/// Long expressions broken at their `+` and `?`/`:` for a reader; CEL ignores line
/// breaks outside string literals, and a literal never holds one (`lit` escapes them).
fn wrap(e: &str) -> String {
    if e.len() < 100 {
        return e.to_owned();
    }
    let mut out = String::with_capacity(e.len() + e.len() / 40);
    let mut quote = false;
    let mut escaped = false;
    let mut line = 0;
    for c in e.chars() {
        out.push(c);
        line += 1;
        if quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '\'' {
                quote = false;
            }
            continue;
        }
        if c == '\'' {
            quote = true;
        } else if c == ' ' && line > 100 {
            out.pop();
            out.push('\n');
            line = 0;
        }
    }
    out
}

/// The JSONPatch values of an expression written as maps (`{'op': .., 'path': ..,
/// 'value': ..}`): the apiserver declares the JSONPatch type in the mutations'
/// expressions only, not in the variables', where the patches are computed. Each mutation
/// turns its variable's maps into JSONPatch values.
fn as_maps(e: &str) -> String {
    const OPEN: &str = "JSONPatch{";
    let mut out = String::with_capacity(e.len());
    let mut rest = e;
    while let Some(at) = find_unquoted(rest, OPEN, false) {
        out.push_str(&rest[..at]);
        let body_start = at + OPEN.len();
        let body = &rest[body_start..];
        let end = matching_close(body);
        let inner = &body[..end];
        let path_at = find_unquoted(inner, ", path: ", true).unwrap_or(inner.len());
        let value_at = find_unquoted(inner, ", value: ", true).unwrap_or(inner.len());
        let op = inner[..path_at].trim_start_matches("op: ");
        let path = &inner[path_at + ", path: ".len()..value_at];
        let value = as_maps(&inner[value_at + ", value: ".len()..]);
        let _ = write!(
            out,
            "{{'op': dyn({op}), 'path': dyn({path}), 'value': dyn({value})}}"
        );
        rest = &body[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Where `needle` first occurs in `s` outside string literals (and, `top`, at depth 0 of
/// brackets).
fn find_unquoted(s: &str, needle: &str, top: bool) -> Option<usize> {
    let bytes = s.as_bytes();
    let (mut quote, mut depth, mut i) = (false, 0i32, 0);
    while i < bytes.len() {
        let c = bytes[i];
        if quote {
            if c == b'\\' {
                i += 1;
            } else if c == b'\'' {
                quote = false;
            }
        } else if c == b'\'' {
            quote = true;
        } else {
            if (!top || depth == 0) && s[i..].starts_with(needle) {
                return Some(i);
            }
            match c {
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => depth -= 1,
                _ => {}
            }
        }
        i += 1;
    }
    None
}

/// The index of the `}` that closes a brace opened just before `s`.
fn matching_close(s: &str) -> usize {
    let bytes = s.as_bytes();
    let (mut quote, mut depth, mut i) = (false, 0i32, 0);
    while i < bytes.len() {
        let c = bytes[i];
        if quote {
            if c == b'\\' {
                i += 1;
            } else if c == b'\'' {
                quote = false;
            }
        } else {
            match c {
                b'\'' => quote = true,
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' => depth -= 1,
                b'}' if depth == 0 => return i,
                b'}' => depth -= 1,
                _ => {}
            }
        }
        i += 1;
    }
    s.len()
}
