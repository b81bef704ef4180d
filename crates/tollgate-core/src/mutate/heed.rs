//! Pod Security, heeded: tollgate never adds what the namespace's Pod Security levels
//! forbid. Any of the three modes counts: what `enforce` refuses, `warn` prints to every
//! `kubectl apply` and `audit` records, and none of that should be tollgate's doing.
//!
//! The one place the steps ask. A driver decided as a hostPath mount (by the class, or by
//! whatever decides a class's driver) comes through [`Heed::driver`], which leaves it to the
//! runtime at baseline and restricted, whatever decided it: Pod Security wins. At
//! restricted, [`Heed::sidecar`] gives the metrics sidecar what restricted requires of
//! every container and its policy leaves unset. A sidecar whose policy sets what
//! restricted forbids is refused at load (`judge::additions`), so none reaches here.

use k8s_openapi::api::core::v1::{Capabilities, Container, PodSpec, SeccompProfile};

use crate::podsecurity::{PodSecurity, PodSecurityLevel};
use crate::policy::Driver;

/// The namespace's Pod Security, as the steps heed it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Heed<'a> {
    namespace: &'a str,
    /// None: no Pod Security label (or the namespace is not known): nothing to heed.
    security: Option<PodSecurity>,
}

/// Why a hostPath driver mount was not made: the level and the mode (label) that forbid it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Veto {
    level: PodSecurityLevel,
    /// `pod-security.kubernetes.io/enforce: baseline`.
    label: String,
    /// `baseline:latest`.
    level_version: String,
}

impl<'a> Heed<'a> {
    pub(crate) fn of(namespace: &'a str, security: Option<PodSecurity>) -> Heed<'a> {
        Heed {
            namespace,
            security,
        }
    }

    /// The driver a class gets, `decided` elsewhere: a hostPath mount is left to the
    /// runtime where any mode of the namespace is baseline or restricted, with the veto
    /// that says why.
    pub(crate) fn driver(&self, decided: Driver) -> (Driver, Option<Veto>) {
        if decided != Driver::HostPath {
            return (decided, None);
        }
        match self.forbidding(PodSecurityLevel::Baseline) {
            Some(veto) => (Driver::Runtime, Some(veto)),
            None => (decided, None),
        }
    }

    /// The strictest mode, where it is at least `level`.
    fn forbidding(&self, level: PodSecurityLevel) -> Option<Veto> {
        let security = self.security?;
        let (strictest, mode) = security.strictest();
        (strictest >= level).then(|| Veto {
            level: strictest,
            label: format!("{}: {}", mode.label(), strictest.as_str()),
            level_version: security.of_mode(mode).to_string(),
        })
    }

    /// The metrics sidecar as restricted requires, where a mode is restricted: a seccomp
    /// profile of `RuntimeDefault` unless the pod sets one for all its containers,
    /// `runAsNonRoot`, no privilege escalation, every capability dropped. What the policy
    /// sets itself is kept.
    pub(crate) fn sidecar(&self, spec: &PodSpec, c: &mut Container) {
        if self.forbidding(PodSecurityLevel::Restricted).is_none() {
            return;
        }
        let pod_seccomp = spec
            .security_context
            .as_ref()
            .is_some_and(|s| s.seccomp_profile.is_some());
        let sc = c.security_context.get_or_insert_with(Default::default);
        if !pod_seccomp && sc.seccomp_profile.is_none() {
            sc.seccomp_profile = Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            });
        }
        sc.run_as_non_root.get_or_insert(true);
        sc.allow_privilege_escalation.get_or_insert(false);
        let caps = sc.capabilities.get_or_insert_with(Capabilities::default);
        let drop = caps.drop.get_or_insert_with(Vec::new);
        if !drop.iter().any(|d| d == "ALL") {
            drop.push("ALL".into());
        }
    }

    /// The namespace's name, for the words.
    fn namespace(&self) -> &str {
        self.namespace
    }
}

impl Veto {
    /// The user's warning: the class's driver was left to the runtime, and why.
    pub(crate) fn warning(&self, heed: &Heed<'_>, class: &str, volumes: &[&str]) -> String {
        format!(
            "tollgate: the {class} GPU driver was left to the runtime (no hostPath {} {}): namespace {:?} has {}, and Pod Security {:?} forbids hostPath volumes",
            if volumes.len() == 1 { "volume" } else { "volumes" },
            volumes
                .iter()
                .map(|v| format!("{v:?}"))
                .collect::<Vec<_>>()
                .join(", "),
            heed.namespace(),
            self.label,
            self.level_version,
        )
    }

    /// The applied annotation's item: `driver=runtime(pod-security:baseline)`.
    pub(crate) fn applied(&self) -> String {
        format!("runtime(pod-security:{})", self.level.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn heed(pairs: &[(&str, &str)]) -> Option<PodSecurity> {
        let labels: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        PodSecurity::of_labels(&labels)
    }

    #[test]
    fn a_host_path_driver_is_left_to_the_runtime_at_baseline_in_any_mode() {
        for mode in ["enforce", "warn", "audit"] {
            for level in ["baseline", "restricted"] {
                let label = format!("pod-security.kubernetes.io/{mode}");
                let h = Heed::of("ml", heed(&[(&label, level)]));
                let (d, veto) = h.driver(Driver::HostPath);
                assert_eq!(d, Driver::Runtime, "{mode}: {level}");
                let w = veto
                    .unwrap()
                    .warning(&h, "nvidia", &["tollgate-nvidia-driver"]);
                assert!(w.contains(&format!("{label}: {level}")), "{w}");
            }
        }
        let privileged = Heed::of(
            "ml",
            heed(&[("pod-security.kubernetes.io/enforce", "privileged")]),
        );
        assert_eq!(
            privileged.driver(Driver::HostPath),
            (Driver::HostPath, None)
        );
        assert_eq!(
            Heed::default().driver(Driver::HostPath),
            (Driver::HostPath, None)
        );
    }
}
