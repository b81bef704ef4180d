//! The TollgatePolicy and TollgateProfile CRDs: the files shipped (deploy/base/crds and the
//! chart's crds/) are what the policy's types generate (`objects::crd`), and the real
//! kube-apiserver (tests/common/envtest.rs) takes them and holds objects to them: `kubectl
//! explain` prints the fields' docs, only the name `default`, no unknown field, no wrong
//! type, the shipped policy as a spec; and a namespace's admins may edit their namespace's
//! TollgateProfile (the aggregated `tollgate-profile-editor`) and nothing else of tollgate's.

use crate::common;
use tollgate_core::{crd_yaml, crds};

use serde_json::Value;

/// Where each CRD is shipped: deploy/base (kustomize) and the chart's crds/ (Helm installs
/// those before the templates, and never deletes them).
fn shipped() -> Vec<(String, Value)> {
    let mut out = vec![];
    for c in crds() {
        let name = c["metadata"]["name"].as_str().unwrap().to_owned();
        for dir in ["deploy/base/crds", "deploy/helm/tollgate/crds"] {
            out.push((format!("{dir}/{name}.yaml"), c.clone()));
        }
    }
    out
}

fn bless() -> bool {
    std::env::var("TOLLGATE_BLESS").is_ok_and(|v| v == "1")
}

/// The files are the generated text exactly, and read back as the generated CRDs.
/// `TOLLGATE_BLESS=1` rewrites them.
#[test]
fn the_shipped_crds_are_what_the_policy_types_generate() {
    let mut failures = vec![];
    for (path, generated) in shipped() {
        let expected = crd_yaml(&generated).unwrap();
        let read_back: Value = serde_saphyr::from_str(&expected).unwrap();
        assert_eq!(read_back, generated, "{path}: the YAML does not read back");
        let file = common::root().join(&path);
        if bless() {
            std::fs::write(&file, &expected).unwrap();
            continue;
        }
        match std::fs::read_to_string(&file) {
            Err(_) => failures.push(format!("{path} is missing (TOLLGATE_BLESS=1 writes it)")),
            Ok(actual) if actual != expected => failures.push(format!(
                "{path} is out of date: the policy's types changed (TOLLGATE_BLESS=1 rewrites it)"
            )),
            Ok(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use common::policy::kubectl;

fn policy(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "tollgate.dev/v1alpha1", "kind": "TollgatePolicy",
        "metadata": {"name": name}, "spec": spec})
}

fn profile(namespace: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "tollgate.dev/v1alpha1", "kind": "TollgateProfile",
        "metadata": {"name": name, "namespace": namespace}, "spec": spec})
}

/// `kubectl create --dry-run=server -o json` of `object` as `kubeconfig`'s identity: the
/// object as the apiserver would store it (validated, pruned, admitted), or its refusal.
/// A dry run leaves the cluster-wide TollgatePolicy `default` to the tests that own it.
fn dry_run(kubeconfig: &Path, object: &Value) -> Option<Result<Value, String>> {
    let (ok, out, err) = kubectl(
        kubeconfig,
        &["create", "--dry-run=server", "-o", "json", "-f", "-"],
        Some(object),
    )?;
    Some(if ok {
        Ok(serde_json::from_str(&out).unwrap())
    } else {
        Err(err)
    })
}

/// The CRDs installed; kubectl explain prints the fields' own docs (the apiserver publishes
/// a CRD's OpenAPI a moment after it is Established: waited for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explain_prints_the_policy_fields_docs() {
    let Some(cp) = common::envtest::policy_objects_plane() else {
        return;
    };
    if common::policy::install_crds(cp).await.is_none() {
        return;
    }
    let admin = cp.kubeconfig("admin");
    let explain = |what: &str| kubectl(&admin, &["explain", what], None).unwrap();
    let started = Instant::now();
    let (_, out, _) = loop {
        let got = explain("tollgatepolicy.spec.validation");
        if got.0 {
            break got;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "kubectl explain: {}",
            got.2
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    for words in [
        "What the validating webhook requires of a training pod",
        "Whether training pods are validated at all.",
        "Resources every container must request.",
        "enforce (deny), warn (allow with warnings) or audit",
        "mode",
        "requiredRequests",
    ] {
        assert!(out.contains(words), "{words:?} not in:\n{out}");
    }
    let (ok, out, err) = explain("tollgateprofile.spec.mutation.defaultResources");
    assert!(ok, "{err}");
    assert!(
        out.contains("The step that gives containers without limits default ones."),
        "{out}"
    );
    let (ok, out, err) = explain("tollgatepolicy.spec.namespaceProfiles.mayLoosen");
    assert!(ok, "{err}");
    assert!(out.contains("may also loosen the policy"), "{out}");
}

/// `kubectl apply -k deploy/base` applies client-side: the whole CRD goes into its
/// last-applied annotation, which the apiserver bounds (256 KiB of annotations).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crds_apply_client_side_too() {
    let Some(cp) = common::envtest::policy_objects_plane() else {
        return;
    };
    if common::policy::install_crds(cp).await.is_none() {
        return;
    }
    for file in common::policy::CRD_FILES {
        let path = common::root().join(file);
        let (ok, _, err) = kubectl(
            &cp.kubeconfig("admin"),
            &["apply", "--dry-run=server", "-f", path.to_str().unwrap()],
            None,
        )
        .unwrap();
        assert!(ok, "{file}: {err}");
    }
}

/// The apiserver holds a TollgatePolicy to the schema: only the name `default`, no unknown
/// field (kubectl's strict field validation), no wrong type; the shipped policy is a spec
/// it takes whole, and a null (the built-in value back) is kept, not pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tollgate_policy_is_held_to_the_schema() {
    let Some(cp) = common::envtest::policy_objects_plane() else {
        return;
    };
    if common::policy::install_crds(cp).await.is_none() {
        return;
    }
    // Dry runs of a create of `default`: refused while another test's `default` exists.
    let _turn = common::policy::cluster_policy_turn().await;
    let admin = cp.kubeconfig("admin");
    let refused = |object: Value| dry_run(&admin, &object).unwrap().unwrap_err();

    let e = refused(policy("team-a", json!({})));
    assert!(
        e.contains(
            "only the name 'default' is allowed: the cluster has one TollgatePolicy, named default"
        ),
        "{e}"
    );
    // Said of the field, not of `<nil>`.
    assert!(e.contains("metadata.name: Invalid value"), "{e}");
    assert!(!e.contains("<nil>"), "{e}");
    let e = refused(policy("default", json!({"validation": {"enabeld": true}})));
    assert!(
        e.contains("unknown field") && e.contains("spec.validation.enabeld"),
        "{e}"
    );
    let e = refused(policy("default", json!({"validation": {"enabled": "yes"}})));
    assert!(
        e.contains("spec.validation.enabled") && e.contains("boolean"),
        "{e}"
    );
    let e = refused(policy("default", json!({"validation": {"mode": "block"}})));
    assert!(
        e.contains("spec.validation.mode") && e.contains("must be one of: enforce, warn, audit"),
        "{e}"
    );
    // A profile of the cluster's is a list item: written whole, its name required.
    let e = refused(policy(
        "default",
        json!({"profiles": [{"match": {"namespaces": ["a"]}}]}),
    ));
    assert!(
        e.contains("spec.profiles[0].name") && e.contains("Required"),
        "{e}"
    );
    // A field replaced long ago (gpu.resources) is not in the schema.
    let e = refused(policy(
        "default",
        json!({"gpu": {"resources": ["nvidia.com/gpu"]}}),
    ));
    assert!(e.contains("unknown field"), "{e}");

    let shipped: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(common::root().join("policies/default.yaml")).unwrap(),
    )
    .unwrap();
    let stored = dry_run(&admin, &policy("default", shipped.clone()))
        .unwrap()
        .unwrap();
    assert_eq!(stored["spec"], shipped, "nothing pruned or defaulted");

    let partial = json!({
        "validation": {"mode": null, "requiredRequests": null},
        "mutation": {"defaultResources": {"limits": {"cpu": 4, "memory": null}}},
        "gpu": {"classes": {"nvidia": null}},
        "namespaceProfiles": {"mayLoosen": ["validation"]},
        "profiles": [{"name": "team-a", "match": {"namespaces": ["team-a-*"]},
            "validation": {"mode": "warn", "requiredRequests": null}}],
    });
    let stored = dry_run(&admin, &policy("default", partial.clone()))
        .unwrap()
        .unwrap();
    assert_eq!(
        stored["spec"], partial,
        "the nulls are kept: each puts a built-in value back"
    );
}

/// A TollgateProfile holds a profile's sections only, named `default` in its namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tollgate_profile_holds_the_profile_sections() {
    let Some(cp) = common::envtest::policy_objects_plane() else {
        return;
    };
    if common::policy::install_crds(cp).await.is_none() {
        return;
    }
    let admin = cp.kubeconfig("admin");
    let ns = cp.namespace("policy-crds-profile", &[]).await;
    let spec = json!({
        "mutation": {"defaultResources": {"limits": {"cpu": "2", "memory": "4Gi"},
            "perGpu": {"memory": "32Gi"}}},
        "validation": {"mode": "warn"},
    });
    let (ok, out, err) = kubectl(
        &admin,
        &["create", "-o", "json", "-f", "-"],
        Some(&profile(&ns, "default", spec.clone())),
    )
    .unwrap();
    assert!(ok, "{err}");
    let stored: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(stored["spec"], spec);
    let (ok, out, err) = kubectl(&admin, &["get", "tgprofile", "-n", &ns], None).unwrap();
    assert!(ok, "{err}");
    for column in ["NAME", "READY", "REASON", "AGE"] {
        assert!(out.contains(column), "{out}");
    }

    let refused = |object: Value| dry_run(&admin, &object).unwrap().unwrap_err();
    let e = refused(profile(&ns, "team-a", json!({})));
    assert!(
        e.contains("only the name 'default' is allowed: a namespace has one TollgateProfile, named default"),
        "{e}"
    );
    assert!(
        e.contains("metadata.name: Invalid value") && !e.contains("<nil>"),
        "{e}"
    );
    for key in ["name", "match", "profiles", "namespaceProfiles"] {
        let e = refused(profile(&ns, "default", json!({key: {}})));
        assert!(
            e.contains("unknown field") && e.contains(&format!("spec.{key}")),
            "{e}"
        );
    }
}

/// A namespace's admins may write their namespace's TollgateProfile and nothing else of
/// tollgate's. The built-in `admin` ClusterRole takes tollgate-profile-editor in by its
/// aggregation label, which only kube-controller-manager acts on (not run here): so the
/// label is what is checked of the aggregation, and the user is bound to the role itself,
/// in their namespace only, as `admin` would grant it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_admin_edits_the_namespaces_profile_only() {
    use common::identity;
    let Some(cp) = common::envtest::policy_objects_plane() else {
        return;
    };
    if common::policy::install_crds(cp).await.is_none() {
        return;
    }
    let Some(docs) = common::rbac::render_if_kubectl("deploy/base") else {
        return;
    };
    let editor = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "tollgate-profile-editor")
        .expect("deploy/base's tollgate-profile-editor");
    assert_eq!(
        editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"],
        "true"
    );
    let mine = cp.namespace("policy-crds-admin", &[]).await;
    let theirs = cp.namespace("policy-crds-other", &[]).await;
    // The shipped role under a name of this test's own (cluster-wide names are one per
    // apiserver), bound in `mine` only.
    let role = identity::own_names(std::slice::from_ref(editor), &mine).remove(0);
    let role_name = role["metadata"]["name"].as_str().unwrap().to_owned();
    let user = format!("ns-admin-of-{mine}");
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "profile-editor", "namespace": mine},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
            "name": role_name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
    identity::apply(cp, &[role.clone(), binding]).unwrap();
    let as_user = cp.kubeconfig_as(&user, &[]);

    let spec = json!({"validation": {"mode": "warn"}});
    // RBAC is in effect once the apiserver's informers have the binding: waited for.
    let started = Instant::now();
    loop {
        let (ok, _, err) = kubectl(
            &as_user,
            &["create", "-f", "-"],
            Some(&profile(&mine, "default", spec.clone())),
        )
        .unwrap();
        if ok {
            break;
        }
        assert!(
            err.contains("forbidden") && started.elapsed() < Duration::from_secs(30),
            "{err}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (ok, _, err) = kubectl(
        &as_user,
        &[
            "patch",
            "tgprofile",
            "default",
            "-n",
            &mine,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"validation":{"mode":"enforce"}}}"#,
        ],
        None,
    )
    .unwrap();
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(
        &as_user,
        &["get", "tgprofile", "default", "-n", &mine, "-o", "json"],
        None,
    )
    .unwrap();
    assert!(ok, "{err}");
    let got: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(got["spec"]["validation"]["mode"], "enforce");
    let (ok, _, err) = kubectl(
        &as_user,
        &["delete", "tgprofile", "default", "-n", &mine],
        None,
    )
    .unwrap();
    assert!(ok, "{err}");

    // Another namespace's profile, the cluster's policy, and the status: forbidden.
    let (ok, _, err) = kubectl(
        &as_user,
        &["create", "-f", "-"],
        Some(&profile(&theirs, "default", spec.clone())),
    )
    .unwrap();
    assert!(!ok && err.contains("forbidden"), "{err}");
    for args in [
        &["get", "tollgatepolicies"][..],
        &["get", "tollgatepolicy", "default"][..],
        &["create", "--dry-run=server", "-f", "-"][..],
    ] {
        let (ok, _, err) = kubectl(&as_user, args, Some(&policy("default", json!({})))).unwrap();
        assert!(!ok && err.contains("forbidden"), "{args:?}: {err}");
    }
    let (ok, out, _) = kubectl(
        &as_user,
        &[
            "auth",
            "can-i",
            "patch",
            "tollgateprofiles.tollgate.dev",
            "--subresource",
            "status",
            "-n",
            &mine,
        ],
        None,
    )
    .unwrap();
    assert!(!ok && out.trim() == "no", "{out}");

    identity::delete(cp, &[role]).unwrap();
}
