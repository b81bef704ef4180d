//! The bounds of a namespace's TollgateProfile: what it may change of the policy its pods
//! get from the cluster (the base, or a cluster profile).
//!
//! By default a namespace may only make that policy stricter or change its defaults: set
//! default resources (and a GPU class's per-GPU defaults), require more requests, judge more
//! operations, move a mode towards `enforce`, narrow the opt-out, turn a step on. Whatever
//! else it changes loosens the policy (validation off or to warn, a required request
//! removed, the opt-out widened, a mutation step or a GPU class off, or what one injects
//! changed: a toleration is a key to a tainted node pool) and crosses a bound, unless the
//! cluster's policy lists the section in `namespaceProfiles.mayLoosen`.
//!
//! Each rule compares the two whole policies, not what the profile wrote: a profile that
//! writes a section's value back as the cluster has it changes nothing and crosses nothing.

use crate::glob::Glob;
use crate::policy::{FeasibilityMode, MetricsSidecar, Mode, Operation, Policy, Section, Step};

/// A bound a TollgateProfile crosses: the field (a path in the policy, as the file writes
/// it) and what the bound is, for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Crossed {
    pub section: Section,
    pub field: String,
    pub bound: String,
}

/// The first bound `mine` (the profile's whole policy) crosses against `over` (what the
/// cluster gives the namespace's pods), outside the sections `may_loosen` lists.
pub(crate) fn check(over: &Policy, mine: &Policy, may_loosen: &[Section]) -> Result<(), Crossed> {
    for section in Section::ALL {
        if may_loosen.contains(&section) {
            continue;
        }
        let found = match section {
            Section::Gpu => gpu(over, mine),
            Section::Selection => selection(over, mine),
            Section::OptOut => opt_out(over, mine),
            Section::Mutation => mutation(over, mine),
            Section::Validation => validation(over, mine),
            Section::Workloads => workloads(over, mine),
            Section::Feasibility => feasibility(over, mine),
        };
        if let Some((field, bound)) = found {
            return Err(Crossed {
                section,
                field,
                bound,
            });
        }
    }
    Ok(())
}

type Found = Option<(String, String)>;

fn crossed(field: impl Into<String>, bound: impl Into<String>) -> Found {
    Some((field.into(), bound.into()))
}

/// A switch that may be turned on, never off.
fn kept_on(field: &str, over: bool, mine: bool, what: &str) -> Found {
    if over && !mine {
        return crossed(
            field,
            format!("{what} is on in the cluster's policy and may not be turned off here"),
        );
    }
    None
}

fn unchanged<T: PartialEq>(field: &str, over: &T, mine: &T, what: &str) -> Found {
    if over == mine {
        return None;
    }
    crossed(
        field,
        format!("{what} is the cluster's to set and may not be changed here"),
    )
}

/// Every item of `over` is in `mine`: a list that may grow, never lose an item.
fn superset<T: PartialEq>(
    field: &str,
    over: &[T],
    mine: &[T],
    name: impl Fn(&T) -> String,
    what: &str,
) -> Found {
    let lost = over.iter().find(|o| !mine.contains(o))?;
    crossed(
        field,
        format!(
            "{} is in the cluster's {what} and may not be removed here (add to the list, never take from it)",
            name(lost)
        ),
    )
}

fn operation_name(o: &Operation) -> String {
    match o {
        Operation::Create => "CREATE".into(),
        Operation::Update => "UPDATE".into(),
    }
}

fn gpu(over: &Policy, mine: &Policy) -> Found {
    let (o, m) = (&over.gpu, &mine.gpu);
    if let f @ Some(_) = unchanged(
        "gpu.allExtendedResources",
        &o.all_extended_resources,
        &m.all_extended_resources,
        "which extended resources count as GPUs",
    ) {
        return f;
    }
    for (name, class) in &o.classes {
        let at = format!("gpu.classes.{name}");
        let Some(mine) = m.classes.get(name) else {
            return crossed(
                at,
                format!("GPU class {name:?} is the cluster's and may not be turned off here"),
            );
        };
        // What a class injects (tolerations, the driver) and which pods it covers are the
        // cluster's; its per-GPU defaults are a default.
        let mut same = mine.clone();
        same.per_gpu = class.per_gpu.clone();
        if &same != class {
            let field = if same.tolerations != class.tolerations {
                format!("{at}.tolerations")
            } else if same.resources != class.resources
                || same.device_classes != class.device_classes
            {
                format!("{at}.resources")
            } else {
                format!("{at}.driver")
            };
            return crossed(
                field,
                format!("what GPU class {name:?} covers and injects is the cluster's to set; a namespace may change only its perGpu defaults"),
            );
        }
    }
    if let Some(name) = m.classes.keys().find(|k| !o.classes.contains_key(*k)) {
        return crossed(
            format!("gpu.classes.{name}"),
            "a GPU class gives its pods tolerations for the cluster's GPU nodes; only the cluster's policy may add one",
        );
    }
    None
}

fn selection(over: &Policy, mine: &Policy) -> Found {
    let (o, m) = (&over.selection, &mine.selection);
    if let f @ Some(_) = superset(
        "selection.workloadLabels",
        &o.workload_labels,
        &m.workload_labels,
        |l| format!("{l:?}"),
        "training-pod labels",
    ) {
        return f;
    }
    if let f @ Some(_) = unchanged(
        "selection.trainingAnnotation",
        &o.training_annotation,
        &m.training_annotation,
        "the training annotation",
    ) {
        return f;
    }
    kept_on(
        "selection.gpuPods",
        o.gpu_pods,
        m.gpu_pods,
        "treating every GPU pod as a training pod",
    )
}

/// Whether `glob` lets through only what one of `within` lets through: the same pattern, a
/// name one of them matches, or anything under a `*`.
fn covered(glob: &Glob, within: &[Glob]) -> bool {
    let text = glob.as_str();
    within.iter().any(|w| {
        w.as_str() == text || w.as_str() == "*" || (!text.contains(['*', '?']) && w.matches(text))
    })
}

fn narrower(field: &str, over: &[Glob], mine: &[Glob], what: &str) -> Found {
    let wider = mine.iter().find(|g| !covered(g, over))?;
    crossed(
        field,
        format!(
            "{:?} widens the opt-out: only the cluster's {what} (or fewer) may be named here",
            wider.as_str()
        ),
    )
}

fn opt_out(over: &Policy, mine: &Policy) -> Found {
    let (o, m) = (&over.opt_out, &mine.opt_out);
    for (field, a, b, what) in [
        (
            "optOut.annotation",
            &o.annotation,
            &m.annotation,
            "the opt-out annotation",
        ),
        (
            "optOut.approvalAnnotation",
            &o.approval_annotation,
            &m.approval_annotation,
            "the approval annotation",
        ),
    ] {
        if let f @ Some(_) = unchanged(field, a, b, what) {
            return f;
        }
    }
    if let f @ Some(_) = narrower(
        "optOut.namespaces",
        &o.namespaces,
        &m.namespaces,
        "namespaces",
    ) {
        return f;
    }
    // With neither users nor groups, anyone's opt-out is honoured.
    let anyone = |users: &[Glob], groups: &[Glob]| users.is_empty() && groups.is_empty();
    if !anyone(&o.users, &o.groups) {
        if anyone(&m.users, &m.groups) {
            return crossed(
                "optOut.users",
                "no users and no groups honours anyone's opt-out, wider than the cluster's policy; name the cluster's users or groups (or fewer)",
            );
        }
        if let f @ Some(_) = narrower("optOut.users", &o.users, &m.users, "users") {
            return f;
        }
        if let f @ Some(_) = narrower("optOut.groups", &o.groups, &m.groups, "groups") {
            return f;
        }
    }
    narrower(
        "optOut.controllers",
        &o.controllers,
        &m.controllers,
        "controllers",
    )
}

fn mutation(over: &Policy, mine: &Policy) -> Found {
    let (o, m) = (&over.mutation, &mine.mutation);
    if let f @ Some(_) = superset(
        "mutation.operations",
        &o.operations,
        &m.operations,
        operation_name,
        "mutated operations",
    ) {
        return f;
    }
    if let f @ Some(_) = unchanged(
        "mutation.appliedAnnotation",
        &o.applied_annotation,
        &m.applied_annotation,
        "the applied annotation",
    ) {
        return f;
    }
    // Each step, in their order: it may be turned on, never off; what it injects is the
    // cluster's where it says so.
    for step in Step::ALL {
        let what = match step {
            Step::Tolerations => "the GPU tolerations step",
            Step::DriverMounts => "the driver mounts step",
            Step::MetricsSidecar => "the metrics sidecar",
            Step::DefaultResources => "the default resources step",
        };
        let field = format!("mutation.{}.enabled", step.field());
        if let f @ Some(_) = kept_on(&field, o.enabled(step), m.enabled(step), what) {
            return f;
        }
        let found = match step {
            // The tolerations are the GPU classes' (the `gpu` section's bounds).
            Step::Tolerations => None,
            Step::DriverMounts => unchanged(
                "mutation.driverMounts.volumePrefix",
                &o.driver_mounts.volume_prefix,
                &m.driver_mounts.volume_prefix,
                "the driver volumes' prefix",
            ),
            Step::MetricsSidecar => sidecar(&o.metrics_sidecar, &m.metrics_sidecar),
            // More defaults, or larger, are the namespace's to set.
            Step::DefaultResources => None,
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// The metrics sidecar the cluster injects is the cluster's: where it is on, a namespace
/// may not change how or what is injected.
fn sidecar(o: &MetricsSidecar, m: &MetricsSidecar) -> Found {
    if !o.enabled {
        return None;
    }
    for (field, same) in [
        ("mutation.metricsSidecar.mode", o.mode == m.mode),
        (
            "mutation.metricsSidecar.container",
            o.container == m.container,
        ),
        (
            "mutation.metricsSidecar.annotations",
            o.annotations == m.annotations,
        ),
    ] {
        if !same {
            return crossed(
                field,
                "the metrics sidecar the cluster injects is the cluster's to set and may not be changed here",
            );
        }
    }
    None
}

fn validation(over: &Policy, mine: &Policy) -> Found {
    let (o, m) = (&over.validation, &mine.validation);
    if let f @ Some(_) = kept_on("validation.enabled", o.enabled, m.enabled, "validation") {
        return f;
    }
    let rank = |mode: Mode| match mode {
        Mode::Audit => 0,
        Mode::Warn => 1,
        Mode::Enforce => 2,
    };
    if rank(m.mode) < rank(o.mode) {
        return crossed(
            "validation.mode",
            format!(
                "{} is looser than the cluster's {}: a namespace may only move validation.mode towards enforce (audit, warn, enforce)",
                m.mode.as_str(),
                o.mode.as_str()
            ),
        );
    }
    if let f @ Some(_) = superset(
        "validation.requiredRequests",
        &o.required_requests,
        &m.required_requests,
        |r| format!("{r:?}"),
        "required requests",
    ) {
        return f;
    }
    superset(
        "validation.operations",
        &o.operations,
        &m.operations,
        operation_name,
        "judged operations",
    )
}

fn workloads(over: &Policy, mine: &Policy) -> Found {
    let (o, m) = (&over.workloads, &mine.workloads);
    if let f @ Some(_) = kept_on(
        "workloads.enabled",
        o.enabled,
        m.enabled,
        "judging workloads",
    ) {
        return f;
    }
    superset(
        "workloads.kinds",
        &o.kinds,
        &m.kinds,
        |k| {
            if k.group.is_empty() {
                format!("{} ({})", k.kind, k.version)
            } else {
                format!("{} ({}/{})", k.kind, k.group, k.version)
            }
        },
        "workload kinds (each as the cluster writes it)",
    )
}

fn feasibility(over: &Policy, mine: &Policy) -> Found {
    let rank = |mode: FeasibilityMode| match mode {
        FeasibilityMode::Off => 0,
        FeasibilityMode::Warn => 1,
        FeasibilityMode::Enforce => 2,
    };
    let (oa, ma) = (over.feasibility.autoscaling, mine.feasibility.autoscaling);
    if oa != ma {
        return crossed(
            "feasibility.autoscaling",
            format!(
                "{} is not the cluster's {}: whether nodes may be added is the cluster's fact, which a namespace may not change",
                ma.as_str(),
                oa.as_str()
            ),
        );
    }
    let (o, m) = (over.feasibility.mode, mine.feasibility.mode);
    if rank(m) < rank(o) {
        return crossed(
            "feasibility.mode",
            format!(
                "{} is looser than the cluster's {}: a namespace may only move feasibility.mode towards enforce (off, warn, enforce)",
                m.as_str(),
                o.as_str()
            ),
        );
    }
    None
}
