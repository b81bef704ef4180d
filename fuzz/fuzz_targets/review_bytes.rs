//! Arbitrary bytes as the body of POST /mutate and POST /validate.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tollgate_core::Policy;

static POLICY: OnceLock<Policy> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let policy = POLICY.get_or_init(tollgate_fuzz::default_policy);
    for endpoint in [tollgate_core::Stage::Mutate, tollgate_core::Stage::Validate] {
        if let Ok(r) = tollgate_core::review_bytes(endpoint, policy, data) {
            let _ = r.to_json();
        }
    }
    // A body that is JSON gets the full mutation invariants too.
    if let Ok(review) = serde_json::from_slice::<serde_json::Value>(data) {
        tollgate_fuzz::check_mutation(policy, &review);
    }
});
