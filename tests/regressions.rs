//! Inputs found by fuzzing (`fuzz/`), each kept as a test with the input inline, beside
//! the fix it led to.

use crate::common;

use serde_json::{json, Value};
use tollgate_core::{review_bytes, Policy, SidecarMode, Stage};

/// The mutation invariants the fuzz targets check: the patch applies to the object as sent,
/// and a second pass over the patched object patches nothing.
fn assert_patch_applies(policy: &Policy, review: &Value) -> Value {
    let body = serde_json::to_vec(review).unwrap();
    let reviewed = review_bytes(Stage::Mutate, policy, &body).unwrap();
    let patch = reviewed.patch().expect("a patch");
    let mut object = review["request"]["object"].clone();
    json_patch::patch(&mut object, &patch)
        .unwrap_or_else(|e| panic!("the patch does not apply to the object sent: {e}"));
    let mut again = review.clone();
    again["request"]["object"] = object.clone();
    let second = review_bytes(Stage::Mutate, policy, &serde_json::to_vec(&again).unwrap()).unwrap();
    assert!(
        second.patch().is_none(),
        "second pass: {:?}",
        second.patch()
    );
    object
}

/// review_structured, crash-199d02e2: a pod whose object has no `containers` key at all. The
/// typed pod reads it as an empty list, so the patch said `add /spec/containers/0` (the
/// classic sidecar) to an object without that list, and the apiserver could not apply it.
#[test]
fn sidecar_into_a_pod_without_a_containers_list() {
    let mut review: Value =
        serde_json::from_slice(&common::fixture("resnet50-worker-generatename.mutate.json"))
            .unwrap();
    review["request"]["object"]["spec"]
        .as_object_mut()
        .unwrap()
        .remove("containers");
    let mut policy = Policy::builtin();
    policy.mutation.metrics_sidecar.mode = SidecarMode::Classic;
    let object = assert_patch_applies(&policy, &review);
    assert_eq!(object["spec"]["containers"][0]["name"], "tollgate-metrics");

    // The same with the native sidecar and no initContainers list, or a null one.
    for absent in [None, Some(Value::Null)] {
        let mut review = review.clone();
        let spec = review["request"]["object"]["spec"].as_object_mut().unwrap();
        spec.insert(
            "containers".into(),
            json!([{"name": "t", "image": "x",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
        );
        match &absent {
            None => {
                spec.remove("initContainers");
            }
            Some(v) => {
                spec.insert("initContainers".into(), v.clone());
            }
        }
        let object = assert_patch_applies(&Policy::builtin(), &review);
        assert_eq!(
            object["spec"]["initContainers"][0]["name"],
            "tollgate-metrics"
        );
    }
}

/// quantity, crash-782fd718: leading zeros let a 40-digit input parse to a value whose
/// canonical text has 31 digits, which the 30-digit guard then refused: tollgate could
/// write a limit (a per-GPU product, say) that it could not read back.
#[test]
fn formatted_quantities_parse_back() {
    use tollgate_core::{format_quantity, format_quantity_for, parse_quantity};
    for input in [
        "0000000000009950999000000000000000900019.5",
        "9950999000000000000000900019500m",
        "170141183460469231731",
        "170141183460469231731.687303715",
    ] {
        let n = parse_quantity(input).unwrap_or_else(|e| panic!("{input}: {e}"));
        for text in [
            format_quantity(n),
            format_quantity_for("cpu", n),
            format_quantity_for("memory", n),
        ] {
            assert_eq!(parse_quantity(&text), Ok(n), "{input} -> {n} -> {text}");
        }
    }
}

/// Found while fixing the above: rounding a fine fraction up added the divisor before
/// dividing, which overflowed (a panic with overflow checks, a negative quantity without)
/// for values near the top of the range.
#[test]
fn rounding_up_near_the_top_does_not_overflow() {
    use tollgate_core::parse_quantity;
    // (2^67 - 1) * 2^60 * 10^-28 units: just below i128::MAX before the division by 10^19.
    let n = parse_quantity("0.0000000147573952589676412927Ei").unwrap();
    let scaled: i128 = ((1i128 << 67) - 1) << 60;
    let d = 10i128.pow(19);
    assert_eq!(n, scaled / d + 1);
    assert!(n > 0);
}

/// Every field of a real training pod, removed or set to null in turn: whatever tollgate
/// patches must apply to the object as sent. This is what lets the engine re-read the body
/// only for pods whose containers read as empty (see `review_bytes`).
#[test]
fn patches_apply_with_any_field_absent_or_null() {
    fn paths(v: &Value, at: String, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                    out.push(p.clone());
                    paths(child, p, out);
                }
            }
            Value::Array(a) => {
                for (i, child) in a.iter().enumerate() {
                    paths(child, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }
    let mut policy = Policy::builtin();
    policy.gpu.all_extended_resources = true;
    let mut classic = policy.clone();
    classic.mutation.metrics_sidecar.mode = SidecarMode::Classic;
    for fixture in [
        "resnet50-worker-generatename.mutate.json",
        "resnet50-master-0.mutate.json",
    ] {
        let review: Value = serde_json::from_slice(&common::fixture(fixture)).unwrap();
        let mut all = vec![];
        paths(&review["request"]["object"], String::new(), &mut all);
        assert!(all.len() > 50, "{fixture}: {} paths", all.len());
        for path in &all {
            for null in [false, true] {
                let mut r = review.clone();
                let object = &mut r["request"]["object"];
                let (parent, key) = path.rsplit_once('/').unwrap();
                match object.pointer_mut(parent) {
                    Some(Value::Object(m)) if null => {
                        m.insert(key.replace("~1", "/").replace("~0", "~"), Value::Null);
                    }
                    Some(Value::Object(m)) => {
                        m.remove(&key.replace("~1", "/").replace("~0", "~"));
                    }
                    _ => continue,
                }
                for p in [&policy, &classic] {
                    let body = serde_json::to_vec(&r).unwrap();
                    let Ok(reviewed) = review_bytes(Stage::Mutate, p, &body) else {
                        continue;
                    };
                    if let Some(patch) = reviewed.patch() {
                        let mut sent = r["request"]["object"].clone();
                        if let Err(e) = json_patch::patch(&mut sent, &patch) {
                            panic!(
                                "{fixture}: with {path} {}: {e}",
                                if null { "null" } else { "absent" }
                            );
                        }
                    }
                }
            }
        }
    }
}
