//! The Kubernetes name rules tollgate checks before the apiserver would: DNS labels and
//! subdomains (RFC 1123), label and annotation keys (qualified names) and label values,
//! as `k8s.io/apimachinery/pkg/util/validation` defines them; and how a kind is named to a
//! person, with its group where two kinds share a name (`kind_noun`).
//!
//! A leaf: the policy checks its names with these at load, so that a name the apiserver
//! would refuse never reaches a pod. Each returns the message a policy error shows.

/// A DNS subdomain (RFC 1123): dot-separated DNS labels, at most 253 characters. `what`
/// names it in the message (`DeviceClass name`, `API group`).
pub(crate) fn dns_subdomain(name: &str, what: &str) -> Result<(), String> {
    let ok = !name.is_empty() && name.len() <= 253 && name.split('.').all(|l| dns_label(l).is_ok());
    if ok {
        Ok(())
    } else {
        Err(format!("{name:?} is not a valid {what} (a DNS subdomain)"))
    }
}

/// A DNS label (RFC 1123): lower-case letters, digits and '-', at most 63 characters,
/// starting and ending with a letter or digit.
pub(crate) fn dns_label(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid name (lower-case letters, digits and '-', at most 63)"
        ))
    }
}

/// A label or annotation key: an optional DNS prefix and '/', then a name of at most 63
/// characters, alphanumerics with `-`, `_`, `.` inside.
pub(crate) fn qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.'))
    });
    if name_ok && prefix_ok {
        Ok(())
    } else {
        Err(format!("{key:?} is not a valid label or annotation key"))
    }
}

/// A label value: empty, or at most 63 characters, alphanumerics with `-`, `_`, `.` inside.
pub(crate) fn label_value(v: &str) -> Result<(), String> {
    let ok = v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && v.as_bytes()[0].is_ascii_alphanumeric()
            && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!("{v:?} is not a valid label value"))
    }
}

/// The kinds Kubernetes itself serves whose names other projects give a kind of theirs
/// (Volcano's `Job`): their groups.
const BUILT_IN_KINDS: &[(&str, &str)] = &[
    ("", "Pod"),
    ("batch", "Job"),
    ("batch", "CronJob"),
    ("apps", "Deployment"),
    ("apps", "StatefulSet"),
    ("apps", "ReplicaSet"),
    ("apps", "DaemonSet"),
];

/// A kind as messages name it, as kubectl names resources: in lower case (`pytorchjob`,
/// `job` for batch's Job), with its group where a built-in kind has the same name
/// (`job.batch.volcano.sh` for Volcano's), so that the two are never taken for each other
/// nor counted together.
pub fn kind_noun(group: &str, kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    let shares_a_name = BUILT_IN_KINDS
        .iter()
        .any(|(g, k)| *k == kind && *g != group);
    if shares_a_name && !group.is_empty() {
        format!("{lower}.{group}")
    } else {
        lower
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_that_share_a_name_are_told_apart() {
        assert_eq!(kind_noun("batch", "Job"), "job");
        assert_eq!(kind_noun("batch.volcano.sh", "Job"), "job.batch.volcano.sh");
        assert_eq!(kind_noun("", "Pod"), "pod");
        assert_eq!(kind_noun("kubeflow.org", "PyTorchJob"), "pytorchjob");
    }

    #[test]
    fn names_as_the_apiserver_takes_them() {
        assert!(dns_label("team-a").is_ok());
        assert!(dns_label("Team").is_err() && dns_label("-a").is_err() && dns_label("").is_err());
        assert!(dns_label(&"a".repeat(64)).is_err());
        assert!(dns_subdomain("gpu.nvidia.com", "DeviceClass name").is_ok());
        assert_eq!(
            dns_subdomain("Batch_", "API group").unwrap_err(),
            "\"Batch_\" is not a valid API group (a DNS subdomain)"
        );
        assert!(qualified_name("tollgate.dev/opt-out").is_ok());
        assert!(qualified_name("job name").is_err() && qualified_name("a/").is_err());
        assert!(label_value("").is_ok() && label_value("a.b_c-d").is_ok());
        assert!(label_value("-a").is_err() && label_value(&"a".repeat(64)).is_err());
    }
}
