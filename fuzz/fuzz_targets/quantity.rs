//! Quantity parsing and formatting: no panic (overflow checks are on in fuzz builds), and
//! a formatted value parses back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::quantity;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(n) = quantity::parse(s) {
        for f in [quantity::format(n), quantity::format_for("cpu", n)] {
            assert_eq!(quantity::parse(&f), Ok(n), "{s:?} -> {n} -> {f:?}");
        }
    }
});
