//! Structure-aware AdmissionReviews: an apiserver fixture edited by the fuzz input, under a
//! generated policy. Invariants: no panic; a returned patch applies to the object sent and
//! keeps a valid pod valid; a second mutating pass returns no patch.
#![no_main]

use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(policy) = tollgate_fuzz::policy(&mut u) else {
        return;
    };
    let Ok(fixture) = u.choose(tollgate_fuzz::FIXTURES) else {
        return;
    };
    let mut review: serde_json::Value = serde_json::from_str(fixture).unwrap();
    if tollgate_fuzz::edit(&mut u, &mut review).is_err() {
        return;
    }
    tollgate_fuzz::check_review(&policy, &review);
});
