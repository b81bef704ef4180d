//! Pod Security admission, as the apiserver's own `PodSecurity` plugin decides it: a
//! namespace's `pod-security.kubernetes.io/{enforce,warn,audit}` labels (and their
//! `-version`s) read into the levels it evaluates, and a pod (or a pod template) held to a
//! level and version by the checks of baseline and restricted.
//!
//! A port of kubernetes/pod-security-admission v0.36 (the one in kube-apiserver v1.36):
//! `api/helpers.go` (`PolicyToEvaluate`: labels to levels, an invalid enforce level read as
//! restricted, an invalid version as latest, warn defaulted up to enforce), `policy/
//! registry.go` (which checks run at a level and version: a restricted check overrides the
//! baseline one it replaces, versions newer than the newest check's read as it, baseline
//! checks first, then restricted, each group in the order of its IDs) and every
//! `policy/check_*.go`, with their words: a refusal reads `violates PodSecurity
//! "baseline:latest": hostPath volumes (volume "x")` as `admission.go` writes it. The
//! tests/pod_security.rs test holds this to a real apiserver's answers on generated pods.
//!
//! What the apiserver's AdmissionConfiguration sets (defaults for unlabelled namespaces,
//! exempt users, namespaces and runtime classes) is not visible here: a namespace without a
//! label is privileged, as it is without such a configuration.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::{Container, PodSpec, Probe};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The labels' prefix; a namespace without one has no Pod Security to speak of.
pub(crate) const LABEL_PREFIX: &str = "pod-security.kubernetes.io/";

/// A Pod Security level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PodSecurityLevel {
    Privileged,
    Baseline,
    Restricted,
}

impl PodSecurityLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            PodSecurityLevel::Privileged => "privileged",
            PodSecurityLevel::Baseline => "baseline",
            PodSecurityLevel::Restricted => "restricted",
        }
    }

    /// `ParseLevel`: an unknown level is an error, read as restricted.
    fn parse(s: &str) -> Result<PodSecurityLevel, ()> {
        match s {
            "privileged" => Ok(PodSecurityLevel::Privileged),
            "baseline" => Ok(PodSecurityLevel::Baseline),
            "restricted" => Ok(PodSecurityLevel::Restricted),
            _ => Err(()),
        }
    }
}

/// A policy version: `latest`, or `v1.<minor>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodSecurityVersion {
    Latest,
    V1(u32),
}

impl PodSecurityVersion {
    /// `ParseVersion`: "latest" or `v1.x` (no leading zero); anything else is latest.
    fn parse(s: &str) -> PodSecurityVersion {
        if s == "latest" {
            return PodSecurityVersion::Latest;
        }
        let Some(minor) = s.strip_prefix("v1.") else {
            return PodSecurityVersion::Latest;
        };
        let digits = !minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit());
        if !digits || (minor.len() > 1 && minor.starts_with('0')) {
            return PodSecurityVersion::Latest;
        }
        minor
            .parse()
            .map_or(PodSecurityVersion::Latest, PodSecurityVersion::V1)
    }

    /// The minor version whose checks run: a version newer than the newest check's (and
    /// latest) is that one, as the evaluator's `maxVersion`.
    fn minor(self) -> u32 {
        match self {
            PodSecurityVersion::Latest => NEWEST,
            PodSecurityVersion::V1(m) => m.min(NEWEST),
        }
    }
}

impl fmt::Display for PodSecurityVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PodSecurityVersion::Latest => f.write_str("latest"),
            PodSecurityVersion::V1(m) => write!(f, "v1.{m}"),
        }
    }
}

/// The newest minor version any check of v0.36 starts at.
const NEWEST: u32 = 35;

/// A level at a version, written `baseline:latest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LevelVersion {
    pub level: PodSecurityLevel,
    pub version: PodSecurityVersion,
}

impl fmt::Display for LevelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.level.as_str(), self.version)
    }
}

/// What the policy's load holds tollgate's own sidecar to.
pub(crate) const RESTRICTED_LATEST: LevelVersion = LevelVersion {
    level: PodSecurityLevel::Restricted,
    version: PodSecurityVersion::Latest,
};

const PRIVILEGED: LevelVersion = LevelVersion {
    level: PodSecurityLevel::Privileged,
    version: PodSecurityVersion::Latest,
};

/// A namespace's Pod Security: what each mode evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodSecurity {
    pub enforce: LevelVersion,
    pub audit: LevelVersion,
    pub warn: LevelVersion,
}

/// Which of a namespace's modes: the label a person reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Enforce,
    Warn,
    Audit,
}

impl Mode {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Mode::Enforce => "pod-security.kubernetes.io/enforce",
            Mode::Warn => "pod-security.kubernetes.io/warn",
            Mode::Audit => "pod-security.kubernetes.io/audit",
        }
    }
}

impl PodSecurity {
    /// `PolicyToEvaluate` over the apiserver's default (privileged:latest for every mode).
    /// None: the labels hold no Pod Security label at all, so nothing is said.
    pub fn of_labels(labels: &BTreeMap<String, String>) -> Option<PodSecurity> {
        if !labels.keys().any(|k| k.starts_with(LABEL_PREFIX)) {
            return None;
        }
        let get = |k: &str| labels.get(k).map(String::as_str);
        let mut p = PodSecurity {
            enforce: PRIVILEGED,
            audit: PRIVILEGED,
            warn: PRIVILEGED,
        };
        let mut has_enforce_level = false;
        if let Some(l) = get("pod-security.kubernetes.io/enforce") {
            match PodSecurityLevel::parse(l) {
                Ok(l) => {
                    p.enforce.level = l;
                    has_enforce_level = true;
                }
                // An enforce level it cannot read is restricted: fail closed.
                Err(()) => p.enforce.level = PodSecurityLevel::Restricted,
            }
        }
        if let Some(v) = get("pod-security.kubernetes.io/enforce-version") {
            p.enforce.version = PodSecurityVersion::parse(v);
        }
        // Audit and warn fail open.
        if let Some(l) = get("pod-security.kubernetes.io/audit") {
            p.audit.level = PodSecurityLevel::parse(l).unwrap_or(PodSecurityLevel::Privileged);
        }
        if let Some(v) = get("pod-security.kubernetes.io/audit-version") {
            p.audit.version = PodSecurityVersion::parse(v);
        }
        let has_warn_level = get("pod-security.kubernetes.io/warn").is_some();
        if let Some(l) = get("pod-security.kubernetes.io/warn") {
            p.warn.level = PodSecurityLevel::parse(l).unwrap_or(PodSecurityLevel::Privileged);
        }
        let has_warn_version = get("pod-security.kubernetes.io/warn-version").is_some();
        if let Some(v) = get("pod-security.kubernetes.io/warn-version") {
            p.warn.version = PodSecurityVersion::parse(v);
        }
        // Warn defaults to the enforce level where that is set and stricter.
        if !has_warn_level && has_enforce_level && p.enforce.level > p.warn.level {
            p.warn.level = p.enforce.level;
            if !has_warn_version {
                p.warn.version = p.enforce.version;
            }
        }
        Some(p)
    }

    /// The strictest level of the three modes and the mode that sets it (enforce first,
    /// then warn, then audit, at the same level): what tollgate must not add to a pod,
    /// since any of them refuses it, warns of it, or records it.
    pub(crate) fn strictest(&self) -> (PodSecurityLevel, Mode) {
        let mut best = (self.enforce.level, Mode::Enforce);
        for (lv, mode) in [(self.warn, Mode::Warn), (self.audit, Mode::Audit)] {
            if lv.level > best.0 {
                best = (lv.level, mode);
            }
        }
        best
    }

    /// What the mode holds pods to.
    pub(crate) fn of_mode(&self, mode: Mode) -> LevelVersion {
        match mode {
            Mode::Enforce => self.enforce,
            Mode::Warn => self.warn,
            Mode::Audit => self.audit,
        }
    }
}

/// One failed check: its reason and details, as the check words them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub reason: String,
    pub detail: String,
}

/// The checks a pod fails at `lv`, in the evaluator's order (none at privileged).
pub fn pod_security_violations(
    lv: LevelVersion,
    meta: &ObjectMeta,
    spec: &PodSpec,
) -> Vec<Violation> {
    let restricted = match lv.level {
        PodSecurityLevel::Privileged => return vec![],
        PodSecurityLevel::Baseline => false,
        PodSecurityLevel::Restricted => true,
    };
    let v = lv.version.minor();
    let pod = PodView::of(meta, spec);
    let mut out = vec![];
    for check in CHECKS {
        if let Some(f) = check.at(restricted, v) {
            if let Some(violation) = f(&pod, v) {
                out.push(violation);
            }
        }
    }
    out
}

/// `AggregateCheckResult.ForbiddenDetail`: each reason with its details in parentheses.
pub fn pod_security_detail(violations: &[Violation]) -> String {
    let mut s = String::new();
    for (i, v) in violations.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(&v.reason);
        if !v.detail.is_empty() {
            s.push_str(" (");
            s.push_str(&v.detail);
            s.push(')');
        }
    }
    s
}

/// The enforce mode's refusal of a pod, in the apiserver's words (`violates PodSecurity
/// "baseline:latest": ...`), or None where it admits it.
pub fn pod_security_refusal(
    security: &PodSecurity,
    meta: &ObjectMeta,
    spec: &PodSpec,
) -> Option<String> {
    let found = pod_security_violations(security.enforce, meta, spec);
    (!found.is_empty()).then(|| {
        format!(
            "violates PodSecurity \"{}\": {}",
            security.enforce,
            pod_security_detail(&found)
        )
    })
}

/// A pod's fields the checks read, its containers in the visitor's order (init, regular,
/// ephemeral).
struct PodView<'a> {
    meta: &'a ObjectMeta,
    spec: &'a PodSpec,
    containers: Vec<&'a Container>,
    /// Ephemeral containers, which share a container's fields under another type.
    ephemeral: Vec<Ephemeral<'a>>,
}

/// What the checks read of an ephemeral container.
struct Ephemeral<'a>(&'a k8s_openapi::api::core::v1::EphemeralContainer);

impl<'a> PodView<'a> {
    fn of(meta: &'a ObjectMeta, spec: &'a PodSpec) -> PodView<'a> {
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .collect();
        let ephemeral = spec
            .ephemeral_containers
            .iter()
            .flatten()
            .map(Ephemeral)
            .collect();
        PodView {
            meta,
            spec,
            containers,
            ephemeral,
        }
    }

    /// Every container as the checks see it: name, security context, ports, probes.
    fn visit(&self) -> Vec<Seen<'a>> {
        let mut out: Vec<Seen<'a>> = self
            .containers
            .iter()
            .map(|c| Seen {
                name: &c.name,
                sc: c.security_context.as_ref(),
                ports: c.ports.as_deref().unwrap_or_default(),
                probes: [
                    c.liveness_probe.as_ref(),
                    c.readiness_probe.as_ref(),
                    c.startup_probe.as_ref(),
                ],
                lifecycle: c.lifecycle.as_ref(),
            })
            .collect();
        for e in &self.ephemeral {
            let c = e.0;
            out.push(Seen {
                name: &c.name,
                sc: c.security_context.as_ref(),
                ports: c.ports.as_deref().unwrap_or_default(),
                probes: [
                    c.liveness_probe.as_ref(),
                    c.readiness_probe.as_ref(),
                    c.startup_probe.as_ref(),
                ],
                lifecycle: c.lifecycle.as_ref(),
            });
        }
        out
    }

    fn pod_sc(&self) -> Option<&'a k8s_openapi::api::core::v1::PodSecurityContext> {
        self.spec.security_context.as_ref()
    }

    fn windows(&self) -> bool {
        self.spec.os.as_ref().is_some_and(|o| o.name == "windows")
    }

    /// `relaxPolicyForUserNamespacePod`: `hostUsers: false`.
    fn user_namespace(&self) -> bool {
        self.spec.host_users == Some(false)
    }
}

struct Seen<'a> {
    name: &'a str,
    sc: Option<&'a k8s_openapi::api::core::v1::SecurityContext>,
    ports: &'a [k8s_openapi::api::core::v1::ContainerPort],
    probes: [Option<&'a Probe>; 3],
    lifecycle: Option<&'a k8s_openapi::api::core::v1::Lifecycle>,
}

type CheckFn = fn(&PodView<'_>, u32) -> Option<Violation>;

/// One check of the registry: its level, the first minor version it runs at, and at
/// restricted, from which version it replaces a baseline check (`OverrideCheckIDs`).
struct Check {
    restricted: bool,
    since: u32,
    /// A baseline check: from this minor version on, restricted runs its override instead.
    overridden_from: Option<u32>,
    f: CheckFn,
}

impl Check {
    fn at(&self, restricted: bool, v: u32) -> Option<CheckFn> {
        if v < self.since || (self.restricted && !restricted) {
            return None;
        }
        if restricted && self.overridden_from.is_some_and(|from| v >= from) {
            return None;
        }
        Some(self.f)
    }
}

/// The checks in the evaluator's order: baseline IDs sorted, then restricted IDs sorted.
const CHECKS: &[Check] = &[
    // appArmorProfile
    baseline(0, None, app_armor),
    // capabilities_baseline (capabilities_restricted from 1.22)
    baseline(0, Some(22), capabilities_baseline),
    // hostNamespaces
    baseline(0, None, host_namespaces),
    // hostPathVolumes (restrictedVolumes from 1.0)
    baseline(0, Some(0), host_path_volumes),
    // hostPorts
    baseline(0, None, host_ports),
    // hostProbesAndHostLifecycle
    baseline(34, None, host_probes),
    // privileged
    baseline(0, None, privileged),
    // procMount (procMount_restricted from 1.35)
    baseline(0, Some(35), proc_mount_baseline),
    // seLinuxOptions
    baseline(0, None, se_linux),
    // seccompProfile_baseline (seccompProfile_restricted from 1.19)
    baseline(0, Some(19), seccomp_baseline),
    // sysctls
    baseline(0, None, sysctls),
    // windowsHostProcess
    baseline(0, None, windows_host_process),
    // allowPrivilegeEscalation
    restricted(8, allow_privilege_escalation),
    // capabilities_restricted
    restricted(22, capabilities_restricted),
    // procMount_restricted
    restricted(35, proc_mount_restricted),
    // restrictedVolumes
    restricted(0, restricted_volumes),
    // runAsNonRoot
    restricted(0, run_as_non_root),
    // runAsUser
    restricted(23, run_as_user),
    // seccompProfile_restricted
    restricted(19, seccomp_restricted),
];

const fn baseline(since: u32, overridden_from: Option<u32>, f: CheckFn) -> Check {
    Check {
        restricted: false,
        since,
        overridden_from,
        f,
    }
}

const fn restricted(since: u32, f: CheckFn) -> Check {
    Check {
        restricted: true,
        since,
        overridden_from: None,
        f,
    }
}

fn violation(reason: &str, detail: String) -> Option<Violation> {
    Some(Violation {
        reason: reason.to_owned(),
        detail,
    })
}

/// `joinQuote`: `"a", "b"` (no escaping, as the Go helper).
fn join_quote<S: AsRef<str>>(items: &[S]) -> String {
    if items.is_empty() {
        return String::new();
    }
    let mut s = String::from("\"");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            s.push_str("\", \"");
        }
        s.push_str(item.as_ref());
    }
    s.push('"');
    s
}

fn pluralize<'s>(singular: &'s str, plural: &'s str, n: usize) -> &'s str {
    if n == 1 {
        singular
    } else {
        plural
    }
}

/// `container "a"` or `containers "a", "b"`.
fn containers_phrase(names: &[&str]) -> String {
    format!(
        "{} {}",
        pluralize("container", "containers", names.len()),
        join_quote(names)
    )
}

/// Go's `%q` of a string, as far as printable text goes.
fn go_quote(s: &str) -> String {
    format!("{s:?}")
}

const APPARMOR_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

fn app_armor(p: &PodView<'_>, _: u32) -> Option<Violation> {
    let allowed_type = |t: &str| matches!(t, "RuntimeDefault" | "Localhost");
    let mut setters: Vec<String> = vec![];
    let mut values: BTreeSet<String> = BTreeSet::new();
    if let Some(a) = p.pod_sc().and_then(|s| s.app_armor_profile.as_ref()) {
        if !allowed_type(&a.type_) {
            setters.push("pod".into());
            values.insert(a.type_.clone());
        }
    }
    let mut bad: Vec<&str> = vec![];
    for c in p.visit() {
        if let Some(a) = c.sc.and_then(|s| s.app_armor_profile.as_ref()) {
            if !allowed_type(&a.type_) {
                bad.push(c.name);
                values.insert(a.type_.clone());
            }
        }
    }
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    let mut annotations: Vec<String> = p
        .meta
        .annotations
        .iter()
        .flatten()
        .filter(|(k, v)| {
            k.starts_with(APPARMOR_PREFIX)
                && !(v.is_empty() || *v == "runtime/default" || v.starts_with("localhost/"))
        })
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect();
    let mut list: Vec<String> = values.into_iter().collect();
    if !annotations.is_empty() {
        annotations.sort();
        setters.push(pluralize("annotation", "annotations", annotations.len()).into());
        list.extend(annotations);
    }
    if setters.is_empty() {
        return None;
    }
    violation(
        pluralize(
            "forbidden AppArmor profile",
            "forbidden AppArmor profiles",
            list.len(),
        ),
        format!(
            "{} must not set AppArmor profile type to {}",
            setters.join(" and "),
            join_quote(&list)
        ),
    )
}

const DEFAULT_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

fn capabilities_baseline(p: &PodView<'_>, _: u32) -> Option<Violation> {
    let mut bad: Vec<&str> = vec![];
    let mut caps: BTreeSet<&str> = BTreeSet::new();
    for c in p.visit() {
        let Some(capabilities) = c.sc.and_then(|s| s.capabilities.as_ref()) else {
            continue;
        };
        let mut valid = true;
        for cap in capabilities.add.iter().flatten() {
            if !DEFAULT_CAPABILITIES.contains(&cap.as_str()) {
                valid = false;
                caps.insert(cap);
            }
        }
        if !valid {
            bad.push(c.name);
        }
    }
    if bad.is_empty() {
        return None;
    }
    let caps: Vec<&str> = caps.into_iter().collect();
    violation(
        "non-default capabilities",
        format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&bad),
            join_quote(&caps)
        ),
    )
}

fn host_namespaces(p: &PodView<'_>, _: u32) -> Option<Violation> {
    let s = p.spec;
    let set: Vec<&str> = [
        (s.host_network, "hostNetwork=true"),
        (s.host_pid, "hostPID=true"),
        (s.host_ipc, "hostIPC=true"),
    ]
    .into_iter()
    .filter(|(on, _)| *on == Some(true))
    .map(|(_, w)| w)
    .collect();
    if set.is_empty() {
        return None;
    }
    violation("host namespaces", set.join(", "))
}

fn host_path_volumes(p: &PodView<'_>, _: u32) -> Option<Violation> {
    let names: Vec<&str> = p
        .spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.host_path.is_some())
        .map(|v| v.name.as_str())
        .collect();
    if names.is_empty() {
        return None;
    }
    violation(
        "hostPath volumes",
        format!(
            "{} {}",
            pluralize("volume", "volumes", names.len()),
            join_quote(&names)
        ),
    )
}

fn host_ports(p: &PodView<'_>, _: u32) -> Option<Violation> {
    let mut bad: Vec<&str> = vec![];
    // Go's sets.String: sorted as text.
    let mut ports: BTreeSet<String> = BTreeSet::new();
    // With the host's network, the apiserver's defaulting (SetDefaults_PodSpec) gives
    // each port without a hostPort its containerPort as one, before admission: Pod
    // Security sees those, and so must a review of the object as written.
    let host_network = p.spec.host_network == Some(true);
    for c in p.visit() {
        let mut valid = true;
        for port in c.ports {
            let host = match port.host_port.filter(|h| *h != 0) {
                None if host_network => Some(port.container_port),
                h => h,
            };
            if let Some(h) = host.filter(|h| *h != 0) {
                valid = false;
                ports.insert(h.to_string());
            }
        }
        if !valid {
            bad.push(c.name);
        }
    }
    if bad.is_empty() {
        return None;
    }
    let ports: Vec<String> = ports.into_iter().collect();
    violation(
        "hostPort",
        format!(
            "{} {} {} {}",
            containers_phrase(&bad),
            pluralize("uses", "use", bad.len()),
            pluralize("hostPort", "hostPorts", ports.len()),
            ports.join(", ")
        ),
    )
}

fn host_probes(p: &PodView<'_>, _: u32) -> Option<Violation> {
    let mut bad: BTreeSet<&str> = BTreeSet::new();
    let mut hosts: BTreeSet<String> = BTreeSet::new();
    for c in p.visit() {
        let mut found: Vec<String> = vec![];
        for probe in c.probes.into_iter().flatten() {
            if let Some(h) = probe.http_get.as_ref().and_then(|g| g.host.as_ref()) {
                found.push(h.clone());
            }
            if let Some(h) = probe.tcp_socket.as_ref().and_then(|t| t.host.as_ref()) {
                found.push(h.clone());
            }
        }
        if let Some(l) = c.lifecycle {
            for handler in [l.post_start.as_ref(), l.pre_stop.as_ref()]
                .into_iter()
                .flatten()
            {
                if let Some(h) = handler.http_get.as_ref().and_then(|g| g.host.as_ref()) {
                    found.push(h.clone());
                }
                if let Some(h) = handler.tcp_socket.as_ref().and_then(|t| t.host.as_ref()) {
                    found.push(h.clone());
                }
            }
        }
        found.retain(|h| !h.is_empty());
        if !found.is_empty() {
            bad.insert(c.name);
            hosts.extend(found);
        }
    }
    if bad.is_empty() {
        return None;
    }
    let bad: Vec<&str> = bad.into_iter().collect();
    let hosts: Vec<String> = hosts.into_iter().collect();
    violation(
        "probe or lifecycle host",
        format!(
            "{} {} {} {}",
            containers_phrase(&bad),
            pluralize("uses", "use", bad.len()),
            pluralize(
                "probe or lifecycle host",
                "probe or lifecycle hosts",
                hosts.len()
            ),
            join_quote(&hosts)
        ),
    )
}

fn privileged(p: &PodView<'_>, _: u32) -> Option<Violation> {
    let bad: Vec<&str> = p
        .visit()
        .into_iter()
        .filter(|c| c.sc.and_then(|s| s.privileged) == Some(true))
        .map(|c| c.name)
        .collect();
    if bad.is_empty() {
        return None;
    }
    violation(
        "privileged",
        format!(
            "{} must not set securityContext.privileged=true",
            containers_phrase(&bad)
        ),
    )
}

fn proc_mount(p: &PodView<'_>) -> Option<Violation> {
    let mut bad: Vec<&str> = vec![];
    let mut kinds: BTreeSet<&str> = BTreeSet::new();
    for c in p.visit() {
        if let Some(m) = c.sc.and_then(|s| s.proc_mount.as_deref()) {
            if m != "Default" {
                bad.push(c.name);
                kinds.insert(m);
            }
        }
    }
    if bad.is_empty() {
        return None;
    }
    let kinds: Vec<&str> = kinds.into_iter().collect();
    violation(
        "procMount",
        format!(
            "{} must not set securityContext.procMount to {}",
            containers_phrase(&bad),
            join_quote(&kinds)
        ),
    )
}

fn proc_mount_baseline(p: &PodView<'_>, v: u32) -> Option<Violation> {
    if v >= 35 && p.user_namespace() {
        return None;
    }
    proc_mount(p)
}

fn proc_mount_restricted(p: &PodView<'_>, _: u32) -> Option<Violation> {
    proc_mount(p)
}

fn se_linux(p: &PodView<'_>, v: u32) -> Option<Violation> {
    let allowed = |t: &str| {
        matches!(
            t,
            "" | "container_t" | "container_init_t" | "container_kvm_t"
        ) || (v >= 31 && t == "container_engine_t")
    };
    let mut bad_types: BTreeSet<String> = BTreeSet::new();
    let (mut set_user, mut set_role) = (false, false);
    let mut valid = |o: &k8s_openapi::api::core::v1::SELinuxOptions| {
        let mut ok = true;
        let t = o.type_.as_deref().unwrap_or("");
        if !allowed(t) {
            ok = false;
            bad_types.insert(t.to_owned());
        }
        if o.user.as_deref().is_some_and(|u| !u.is_empty()) {
            ok = false;
            set_user = true;
        }
        if o.role.as_deref().is_some_and(|r| !r.is_empty()) {
            ok = false;
            set_role = true;
        }
        ok
    };
    let mut setters: Vec<String> = vec![];
    if let Some(o) = p.pod_sc().and_then(|s| s.se_linux_options.as_ref()) {
        if !valid(o) {
            setters.push("pod".into());
        }
    }
    let mut bad: Vec<&str> = vec![];
    for c in p.visit() {
        if let Some(o) = c.sc.and_then(|s| s.se_linux_options.as_ref()) {
            if !valid(o) {
                bad.push(c.name);
            }
        }
    }
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    let mut data: Vec<String> = vec![];
    if !bad_types.is_empty() {
        let types: Vec<String> = bad_types.into_iter().collect();
        data.push(format!(
            "{} {}",
            pluralize("type", "types", types.len()),
            join_quote(&types)
        ));
    }
    if set_user {
        data.push("user may not be set".into());
    }
    if set_role {
        data.push("role may not be set".into());
    }
    violation(
        "seLinuxOptions",
        format!(
            "{} set forbidden securityContext.seLinuxOptions: {}",
            setters.join(" and "),
            data.join("; ")
        ),
    )
}

const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
const SECCOMP_CONTAINER_PREFIX: &str = "container.seccomp.security.alpha.kubernetes.io/";

fn valid_seccomp(t: &str) -> bool {
    matches!(t, "Localhost" | "RuntimeDefault")
}

fn seccomp_baseline(p: &PodView<'_>, v: u32) -> Option<Violation> {
    if v < 19 {
        return seccomp_annotations(p);
    }
    seccomp_fields(p, false)
}

/// `seccompProfileBaseline_1_0`: the annotations of before 1.19.
fn seccomp_annotations(p: &PodView<'_>) -> Option<Violation> {
    let valid =
        |v: &str| v == "runtime/default" || v == "docker/default" || v.starts_with("localhost/");
    let annotations = p.meta.annotations.as_ref();
    let get = |k: &str| annotations.and_then(|a| a.get(k));
    let mut forbidden: BTreeSet<String> = BTreeSet::new();
    if let Some(v) = get(SECCOMP_POD_ANNOTATION) {
        if !valid(v) {
            forbidden.insert(format!("{SECCOMP_POD_ANNOTATION}={}", go_quote(v)));
        }
    }
    for c in p.visit() {
        let k = format!("{SECCOMP_CONTAINER_PREFIX}{}", c.name);
        if let Some(v) = get(&k) {
            if !valid(v) {
                forbidden.insert(format!("{k}={}", go_quote(v)));
            }
        }
    }
    if forbidden.is_empty() {
        return None;
    }
    let list: Vec<String> = forbidden.into_iter().collect();
    violation(
        "seccompProfile",
        format!(
            "forbidden {} {}",
            pluralize("annotation", "annotations", list.len()),
            list.join(", ")
        ),
    )
}

/// `seccompProfileBaseline_1_19` and, `required`, `seccompProfileRestricted_1_19`.
fn seccomp_fields(p: &PodView<'_>, required: bool) -> Option<Violation> {
    let mut setters: Vec<String> = vec![];
    let mut values: BTreeSet<String> = BTreeSet::new();
    let mut pod_set = false;
    if let Some(s) = p.pod_sc().and_then(|s| s.seccomp_profile.as_ref()) {
        if !valid_seccomp(&s.type_) {
            setters.push("pod".into());
            values.insert(s.type_.clone());
        } else {
            pod_set = true;
        }
    }
    let mut explicit: Vec<&str> = vec![];
    let mut implicit: Vec<&str> = vec![];
    for c in p.visit() {
        match c.sc.and_then(|s| s.seccomp_profile.as_ref()) {
            Some(s) if !valid_seccomp(&s.type_) => {
                explicit.push(c.name);
                values.insert(s.type_.clone());
            }
            Some(_) => {}
            None if !pod_set => implicit.push(c.name),
            None => {}
        }
    }
    if !explicit.is_empty() {
        setters.push(containers_phrase(&explicit));
    }
    if !setters.is_empty() {
        let values: Vec<String> = values.into_iter().collect();
        return violation(
            "seccompProfile",
            format!(
                "{} must not set securityContext.seccompProfile.type to {}",
                setters.join(" and "),
                join_quote(&values)
            ),
        );
    }
    if required && !implicit.is_empty() {
        return violation(
            "seccompProfile",
            format!(
                "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
                containers_phrase(&implicit)
            ),
        );
    }
    None
}

fn seccomp_restricted(p: &PodView<'_>, v: u32) -> Option<Violation> {
    if v >= 25 && p.windows() {
        return None;
    }
    seccomp_fields(p, true)
}

fn sysctls(p: &PodView<'_>, v: u32) -> Option<Violation> {
    let allowed = |n: &str| {
        matches!(
            n,
            "kernel.shm_rmid_forced"
                | "net.ipv4.ip_local_port_range"
                | "net.ipv4.tcp_syncookies"
                | "net.ipv4.ping_group_range"
                | "net.ipv4.ip_unprivileged_port_start"
        ) || (v >= 27 && n == "net.ipv4.ip_local_reserved_ports")
            || (v >= 29
                && matches!(
                    n,
                    "net.ipv4.tcp_keepalive_time"
                        | "net.ipv4.tcp_fin_timeout"
                        | "net.ipv4.tcp_keepalive_intvl"
                        | "net.ipv4.tcp_keepalive_probes"
                ))
            || (v >= 32 && matches!(n, "net.ipv4.tcp_rmem" | "net.ipv4.tcp_wmem"))
    };
    let bad: Vec<&str> = p
        .pod_sc()
        .and_then(|s| s.sysctls.as_ref())
        .into_iter()
        .flatten()
        .map(|s| s.name.as_str())
        .filter(|n| !allowed(n))
        .collect();
    if bad.is_empty() {
        return None;
    }
    violation("forbidden sysctls", bad.join(", "))
}

fn windows_host_process(p: &PodView<'_>, _: u32) -> Option<Violation> {
    let host_process = |w: Option<&k8s_openapi::api::core::v1::WindowsSecurityContextOptions>| {
        w.and_then(|w| w.host_process) == Some(true)
    };
    let bad: Vec<&str> = p
        .visit()
        .into_iter()
        .filter(|c| host_process(c.sc.and_then(|s| s.windows_options.as_ref())))
        .map(|c| c.name)
        .collect();
    let mut setters: Vec<String> = vec![];
    if host_process(p.pod_sc().and_then(|s| s.windows_options.as_ref())) {
        setters.push("pod".into());
    }
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    violation(
        "hostProcess",
        format!(
            "{} must not set securityContext.windowsOptions.hostProcess=true",
            setters.join(" and ")
        ),
    )
}

fn allow_privilege_escalation(p: &PodView<'_>, v: u32) -> Option<Violation> {
    if v >= 25 && p.windows() {
        return None;
    }
    let bad: Vec<&str> = p
        .visit()
        .into_iter()
        .filter(|c| c.sc.and_then(|s| s.allow_privilege_escalation) != Some(false))
        .map(|c| c.name)
        .collect();
    if bad.is_empty() {
        return None;
    }
    violation(
        "allowPrivilegeEscalation != false",
        format!(
            "{} must set securityContext.allowPrivilegeEscalation=false",
            containers_phrase(&bad)
        ),
    )
}

fn capabilities_restricted(p: &PodView<'_>, v: u32) -> Option<Violation> {
    if v >= 25 && p.windows() {
        return None;
    }
    let mut missing_drop: Vec<&str> = vec![];
    let mut adding: Vec<&str> = vec![];
    let mut forbidden: BTreeSet<&str> = BTreeSet::new();
    for c in p.visit() {
        let Some(caps) = c.sc.and_then(|s| s.capabilities.as_ref()) else {
            missing_drop.push(c.name);
            continue;
        };
        if !caps.drop.iter().flatten().any(|d| d == "ALL") {
            missing_drop.push(c.name);
        }
        let mut added = false;
        for a in caps.add.iter().flatten() {
            if a != "NET_BIND_SERVICE" {
                added = true;
                forbidden.insert(a);
            }
        }
        if added {
            adding.push(c.name);
        }
    }
    let mut details: Vec<String> = vec![];
    if !missing_drop.is_empty() {
        details.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            containers_phrase(&missing_drop)
        ));
    }
    if !adding.is_empty() {
        let forbidden: Vec<&str> = forbidden.into_iter().collect();
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&adding),
            join_quote(&forbidden)
        ));
    }
    if details.is_empty() {
        return None;
    }
    violation("unrestricted capabilities", details.join("; "))
}

fn restricted_volumes(p: &PodView<'_>, _: u32) -> Option<Violation> {
    let mut bad: Vec<&str> = vec![];
    let mut kinds: BTreeSet<&str> = BTreeSet::new();
    for v in p.spec.volumes.iter().flatten() {
        let allowed = v.config_map.is_some()
            || v.csi.is_some()
            || v.downward_api.is_some()
            || v.empty_dir.is_some()
            || v.ephemeral.is_some()
            || v.image.is_some()
            || v.persistent_volume_claim.is_some()
            || v.projected.is_some()
            || v.secret.is_some();
        if allowed {
            continue;
        }
        bad.push(&v.name);
        let kind = [
            (v.host_path.is_some(), "hostPath"),
            (v.gce_persistent_disk.is_some(), "gcePersistentDisk"),
            (v.aws_elastic_block_store.is_some(), "awsElasticBlockStore"),
            (v.git_repo.is_some(), "gitRepo"),
            (v.nfs.is_some(), "nfs"),
            (v.iscsi.is_some(), "iscsi"),
            (v.glusterfs.is_some(), "glusterfs"),
            (v.rbd.is_some(), "rbd"),
            (v.flex_volume.is_some(), "flexVolume"),
            (v.cinder.is_some(), "cinder"),
            (v.cephfs.is_some(), "cephfs"),
            (v.flocker.is_some(), "flocker"),
            (v.fc.is_some(), "fc"),
            (v.azure_file.is_some(), "azureFile"),
            (v.vsphere_volume.is_some(), "vsphereVolume"),
            (v.quobyte.is_some(), "quobyte"),
            (v.azure_disk.is_some(), "azureDisk"),
            (v.photon_persistent_disk.is_some(), "photonPersistentDisk"),
            (v.portworx_volume.is_some(), "portworxVolume"),
            (v.scale_io.is_some(), "scaleIO"),
            (v.storageos.is_some(), "storageos"),
        ]
        .into_iter()
        .find(|(set, _)| *set)
        .map_or("unknown", |(_, k)| k);
        kinds.insert(kind);
    }
    if bad.is_empty() {
        return None;
    }
    let kinds: Vec<&str> = kinds.into_iter().collect();
    violation(
        "restricted volume types",
        format!(
            "{} {} {} {} {}",
            pluralize("volume", "volumes", bad.len()),
            join_quote(&bad),
            pluralize("uses", "use", bad.len()),
            pluralize(
                "restricted volume type",
                "restricted volume types",
                kinds.len()
            ),
            join_quote(&kinds)
        ),
    )
}

fn run_as_non_root(p: &PodView<'_>, v: u32) -> Option<Violation> {
    if v >= 35 && p.user_namespace() {
        return None;
    }
    let mut setters: Vec<String> = vec![];
    let mut pod_non_root = false;
    match p.pod_sc().and_then(|s| s.run_as_non_root) {
        Some(false) => setters.push("pod".into()),
        Some(true) => pod_non_root = true,
        None => {}
    }
    let mut explicit: Vec<&str> = vec![];
    let mut implicit: Vec<&str> = vec![];
    for c in p.visit() {
        match c.sc.and_then(|s| s.run_as_non_root) {
            Some(false) => explicit.push(c.name),
            Some(true) => {}
            None if !pod_non_root => implicit.push(c.name),
            None => {}
        }
    }
    if !explicit.is_empty() {
        setters.push(containers_phrase(&explicit));
    }
    if !setters.is_empty() {
        return violation(
            "runAsNonRoot != true",
            format!(
                "{} must not set securityContext.runAsNonRoot=false",
                setters.join(" and ")
            ),
        );
    }
    if !implicit.is_empty() {
        return violation(
            "runAsNonRoot != true",
            format!(
                "pod or {} must set securityContext.runAsNonRoot=true",
                containers_phrase(&implicit)
            ),
        );
    }
    None
}

fn run_as_user(p: &PodView<'_>, v: u32) -> Option<Violation> {
    if v >= 35 && p.user_namespace() {
        return None;
    }
    let mut setters: Vec<String> = vec![];
    if p.pod_sc().and_then(|s| s.run_as_user) == Some(0) {
        setters.push("pod".into());
    }
    let bad: Vec<&str> = p
        .visit()
        .into_iter()
        .filter(|c| c.sc.and_then(|s| s.run_as_user) == Some(0))
        .map(|c| c.name)
        .collect();
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    violation(
        "runAsUser=0",
        format!("{} must not set runAsUser=0", setters.join(" and ")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn labels_read_as_the_apiserver_reads_them() {
        assert_eq!(PodSecurity::of_labels(&labels(&[("team", "a")])), None);
        let p = PodSecurity::of_labels(&labels(&[
            ("pod-security.kubernetes.io/enforce", "baseline"),
            ("pod-security.kubernetes.io/enforce-version", "v1.24"),
        ]))
        .unwrap();
        assert_eq!(p.enforce.to_string(), "baseline:v1.24");
        // Warn follows enforce, with its version.
        assert_eq!(p.warn.to_string(), "baseline:v1.24");
        assert_eq!(p.audit.to_string(), "privileged:latest");
        // An enforce level it cannot read is restricted; a version, latest.
        let p = PodSecurity::of_labels(&labels(&[
            ("pod-security.kubernetes.io/enforce", "strict"),
            ("pod-security.kubernetes.io/enforce-version", "v1.024"),
        ]))
        .unwrap();
        assert_eq!(p.enforce.to_string(), "restricted:latest");
        assert_eq!(p.warn.level, PodSecurityLevel::Privileged);
        let p = PodSecurity::of_labels(&labels(&[(
            "pod-security.kubernetes.io/warn",
            "restricted",
        )]))
        .unwrap();
        assert_eq!(p.strictest(), (PodSecurityLevel::Restricted, Mode::Warn));
    }

    fn spec(v: serde_json::Value) -> (ObjectMeta, PodSpec) {
        let pod: Pod = serde_json::from_value(v).unwrap();
        (pod.metadata, pod.spec.unwrap())
    }

    fn lv(level: PodSecurityLevel, version: PodSecurityVersion) -> LevelVersion {
        LevelVersion { level, version }
    }

    #[test]
    fn a_host_path_and_sys_admin_in_baselines_words() {
        let (m, s) = spec(json!({"metadata": {"name": "p"}, "spec": {
            "volumes": [{"name": "tollgate-nvidia-driver", "hostPath": {"path": "/usr/local/nvidia"}}],
            "containers": [{"name": "c", "image": "i", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]
        }}));
        let sec = PodSecurity::of_labels(&labels(&[(
            "pod-security.kubernetes.io/enforce",
            "baseline",
        )]))
        .unwrap();
        assert_eq!(
            pod_security_refusal(&sec, &m, &s).unwrap(),
            "violates PodSecurity \"baseline:latest\": non-default capabilities (container \"c\" must not include \"SYS_ADMIN\" in securityContext.capabilities.add), hostPath volumes (volume \"tollgate-nvidia-driver\")"
        );
    }

    #[test]
    fn restricted_differs_by_version() {
        let (m, s) = spec(json!({"metadata": {"name": "p"}, "spec": {
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "image": "i", "securityContext": {
                "allowPrivilegeEscalation": false, "runAsUser": 0
            }}]
        }}));
        let words = |v| {
            pod_security_detail(&pod_security_violations(
                lv(PodSecurityLevel::Restricted, v),
                &m,
                &s,
            ))
        };
        // Before 1.22, capabilities were baseline's; before 1.23, runAsUser was not checked.
        assert_eq!(words(PodSecurityVersion::V1(21)), "");
        assert_eq!(
            words(PodSecurityVersion::V1(22)),
            "unrestricted capabilities (container \"c\" must set securityContext.capabilities.drop=[\"ALL\"])"
        );
        assert_eq!(
            words(PodSecurityVersion::Latest),
            "unrestricted capabilities (container \"c\" must set securityContext.capabilities.drop=[\"ALL\"]), runAsUser=0 (container \"c\" must not set runAsUser=0)"
        );
    }
}
