//! Quantity parsing and formatting: no panic (overflow checks are on in fuzz builds), and
//! a formatted value parses back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::{format_quantity, format_quantity_for, parse_quantity};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(n) = parse_quantity(s) {
        for f in [format_quantity(n), format_quantity_for("cpu", n)] {
            assert_eq!(parse_quantity(&f), Ok(n), "{s:?} -> {n} -> {f:?}");
        }
    }
});
