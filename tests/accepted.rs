//! Every object tollgate's mutating webhook makes is one the apiserver accepts: each
//! mutate golden's object as mutated (`mutated.yaml`, which tests/golden.rs holds to the
//! engine: the object as sent with the patch applied) is created in the real kube-apiserver
//! (tests/common/envtest.rs) with `dryRun=All`, which validates it as a create of it would
//! be validated, without storing it. A refusal fails the test, naming the case and quoting
//! the apiserver. (The generated pods of the property tests: tests/mutation_props.rs.)
//!
//! Pods and the built-in workloads (Jobs, CronJobs, Deployments) are sent; the kinds of
//! operators (PyTorchJob, TrainJob) are not, as the apiserver only knows their schema from
//! the operator's own CRD (tests/e2e.rs applies them to CRDs that check nothing).

use crate::common;
use crate::common::apiserver::{self, Verdict};

/// The kinds this apiserver serves and validates.
const BUILT_IN: &[&str] = &["v1", "batch/v1", "apps/v1"];

#[tokio::test]
async fn every_mutated_golden_is_accepted_by_the_apiserver() {
    let Some(cp) = common::envtest::plane() else {
        return;
    };
    let ns = cp.namespace("accepted", &[]).await;
    let mut cases = vec![];
    let mut not_sent = vec![];
    for case in common::golden::cases() {
        let Some(mutated) = case.mutated() else {
            continue;
        };
        if BUILT_IN.contains(&mutated["apiVersion"].as_str().unwrap_or("")) {
            cases.push((case.name.clone(), case.object().clone(), mutated));
        } else {
            not_sent.push(case.name);
        }
    }
    cases.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(cases.len() > 40, "the mutate goldens: {}", cases.len());
    let client = cp.client("admin").await;
    let ns = &ns;
    let results = apiserver::each(cases, |(name, sent, mutated)| {
        let client = client.clone();
        async move {
            let kind = mutated["kind"].as_str().unwrap_or("").to_owned();
            (
                name,
                kind,
                apiserver::admits(&client, ns, &sent, &mutated).await,
            )
        }
    })
    .await;
    let sent = results.len();
    let mut refused = vec![];
    let mut as_sent = vec![];
    for (name, kind, verdict) in results {
        match verdict {
            Verdict::Accepted => {}
            Verdict::AsSent(e) => as_sent.push(format!("{name}: {e}")),
            Verdict::Undecodable(e) => refused.push(format!(
                "{name}: the {kind} as sent is one no apiserver decodes: {e}"
            )),
            Verdict::Refused(e) => refused.push(format!(
                "{name}: the apiserver refuses the {kind} as mutated: {e}"
            )),
        }
    }
    if !as_sent.is_empty() {
        // Not tollgate's doing, but a golden no apiserver would let through: said, so that
        // it is seen.
        eprintln!(
            "accepted: goldens whose input the apiserver refuses as it refuses the output:\n{}",
            as_sent.join("\n")
        );
    }
    assert!(
        refused.is_empty(),
        "{} of {sent} mutated goldens refused (not sent, a custom kind: {not_sent:?}):\n{}",
        refused.len(),
        refused.join("\n")
    );
}
