//! The TollgatePolicy and TollgateProfile CRDs: the files shipped (deploy/base/crds and the
//! chart's crds/) are what the policy's types generate (`objects::crd`), and the real
//! kube-apiserver (tests/common/envtest.rs) takes them and holds objects to them: `kubectl
//! explain` prints the fields' docs, only the name `default`, no unknown field, no wrong
//! type, the shipped policy as a spec; and a namespace's admins may edit their namespace's
//! TollgateProfile (the aggregated `tollgate-profile-editor`) and nothing else of tollgate's.

use crate::common;

use serde_json::Value;
use tollgate_core::objects::crd;

/// Where each CRD is shipped: deploy/base (kustomize) and the chart's crds/ (Helm installs
/// those before the templates, and never deletes them).
fn shipped() -> Vec<(String, Value)> {
    let mut out = vec![];
    for c in crd::crds() {
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
        let expected = crd::to_yaml(&generated).unwrap();
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
