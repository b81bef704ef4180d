//! Policy::from_text on arbitrary text. A policy that loads survives a round trip through
//! its own JSON form and can review the fixtures.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::Policy;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(policy) = Policy::from_text("fuzz", &text) else {
        return;
    };
    let json = serde_json::to_string(&policy).unwrap();
    let again = Policy::from_text("fuzz-json", &json)
        .unwrap_or_else(|e| panic!("a loaded policy does not reload from its JSON: {e}\n{json}"));
    assert_eq!(again, policy);
    // One fixture per input (picked by length) keeps executions fast.
    let fixture = tollgate_fuzz::FIXTURES[data.len() % tollgate_fuzz::FIXTURES.len()];
    let review: serde_json::Value = serde_json::from_str(fixture).unwrap();
    tollgate_fuzz::check_review(&policy, &review);
});
