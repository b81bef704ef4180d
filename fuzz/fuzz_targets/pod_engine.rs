//! The mutation and validation engine on arbitrary pods, without the envelope: typed pods
//! edited from the fixtures' objects, every policy toggle, every requester.
#![no_main]

use arbitrary::Unstructured;
use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;
use tollgate_core::{Operation, Requester};

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(policy) = tollgate_fuzz::policy(&mut u) else {
        return;
    };
    let Ok(fixture) = u.choose(tollgate_fuzz::FIXTURES) else {
        return;
    };
    let review: serde_json::Value = serde_json::from_str(fixture).unwrap();
    let mut object = review["request"]["object"].clone();
    if tollgate_fuzz::edit(&mut u, &mut object).is_err() {
        return;
    }
    let Ok(before) = serde_json::from_value::<Pod>(object) else {
        return;
    };
    let groups = vec!["system:masters".to_owned()];
    let who = Requester::new(
        "ml",
        "alice",
        if u.arbitrary().unwrap_or(false) {
            &groups
        } else {
            &[]
        },
    );
    for op in [Operation::Create, Operation::Update] {
        let _ = tollgate_core::validate_pod(&policy, &before, op, &who);
    }
    let _ = tollgate_core::decide_opt_out(&policy, &before, &who);
    let offline = tollgate_core::Offline;
    let gpus = tollgate_core::Gpus::of(&policy, &before, "ml", &offline);
    let training = tollgate_core::is_training_pod(&policy, &before, &gpus);
    let mut pod = before.clone();
    let first = tollgate_core::mutate(&policy, &mut pod, &gpus, None);
    if !training {
        // mutate() itself does not look at selection; it must still behave.
    }
    let before_json = serde_json::to_value(&before).unwrap();
    let after_json = serde_json::to_value(&pod).unwrap();
    let patch = json_patch::diff(&before_json, &after_json);
    let mut patched = before_json.clone();
    json_patch::patch(&mut patched, &patch).expect("the diff applies to its input");
    assert_eq!(patched, after_json);
    if tollgate_core::pod_problems(&before).is_empty() {
        let p = tollgate_core::pod_problems(&pod);
        assert!(
            p.is_empty(),
            "{p:?} after {:?}\n{before_json}",
            first.applied
        );
    }
    let mut again: Pod = serde_json::from_value(after_json.clone()).unwrap();
    let gpus = tollgate_core::Gpus::of(&policy, &again, "ml", &offline);
    let second = tollgate_core::mutate(&policy, &mut again, &gpus, None);
    assert!(
        second.applied.is_empty(),
        "second pass applied {:?}\n{before_json}",
        second.applied
    );
    assert_eq!(serde_json::to_value(&again).unwrap(), after_json);
    for op in [Operation::Create, Operation::Update] {
        let _ = tollgate_core::validate_pod(&policy, &pod, op, &who);
    }
});
