//! Kubernetes resource quantities as exact numbers.
//!
//! Comparing "1500m" with "2" or "1Gi" with "1000Mi" needs exact arithmetic: a float would
//! round and an off-by-one limit below its request makes the apiserver reject the pod.
//! Values are held in nano-units (10^-9) in an i128, which covers every suffix up to Ei.

/// A quantity that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a Kubernetes quantity (like 500m, 2, 4Gi or 1e3)")]
pub struct QuantityError(pub String);

const NANO: i128 = 1_000_000_000;

/// Powers of ten that fit an i128: 10^0 to 10^38.
const POW10: [i128; 39] = {
    let mut t = [1i128; 39];
    let mut i = 1;
    while i < 39 {
        t[i] = t[i - 1] * 10;
        i += 1;
    }
    t
};

/// Parses a quantity into nano-units. Fractions finer than a nano-unit round up, as the
/// apiserver rounds up to its own precision.
///
/// One pass over the digits and a table of powers: a review reads a pod's requests and
/// limits, the node shapes' allocatable and its quotas' limits through here (about 500
/// instructions each with a scan per step and `checked_pow`; `tests` keeps that version
/// as the reference this one must agree with).
pub fn parse(s: &str) -> Result<i128, QuantityError> {
    let err = || QuantityError(s.to_owned());
    let s_trim = s.trim();
    if s_trim.is_empty() || s_trim.len() > 64 {
        return Err(err());
    }
    let (sign, body) = match s_trim.as_bytes()[0] {
        b'-' => (-1, &s_trim[1..]),
        b'+' => (1, &s_trim[1..]),
        _ => (1, s_trim),
    };
    // The digits of both parts as one integer, leading zeros dropped. i128::MAX has 39
    // digits: anything [`format`] writes fits, larger fails.
    let mut mantissa: i128 = 0;
    let mut significant = 0;
    let mut frac_len: i32 = 0;
    let mut dot = false;
    let mut num_end = body.len();
    for (i, d) in body.bytes().enumerate() {
        match d {
            b'.' if dot => return Err(err()),
            b'.' => dot = true,
            b'0'..=b'9' => {
                frac_len += i32::from(dot);
                if significant == 0 && d == b'0' {
                    continue;
                }
                significant += 1;
                if significant > 39 {
                    return Err(err());
                }
                mantissa = mantissa
                    .checked_mul(10)
                    .and_then(|m| m.checked_add(i128::from(d - b'0')))
                    .ok_or_else(err)?;
            }
            _ => {
                num_end = i;
                break;
            }
        }
    }
    let (num, suffix) = body.split_at(num_end);
    if num.is_empty() || num == "." {
        return Err(err());
    }
    let (mul, pow10) = scale_of(suffix).ok_or_else(err)?;
    // value = mantissa * mul * 10^(pow10 - frac_len) ; in nano-units add 9
    let exp = pow10 - frac_len + 9;
    let pow = |e: i32| POW10.get(e as usize).copied().ok_or_else(err);
    let scaled = mantissa.checked_mul(mul).ok_or_else(err)?;
    let value = if exp >= 0 {
        scaled.checked_mul(pow(exp)?).ok_or_else(err)?
    } else {
        let d = pow(-exp)?;
        // Round up without adding first: `scaled + d - 1` overflows near the top.
        scaled / d + i128::from(scaled % d != 0)
    };
    Ok(sign * value)
}

/// What a quantity's suffix scales its number by: (multiplier numerator, power of ten), so
/// that value = number * mul * 10^pow10. None for no suffix Kubernetes knows.
fn scale_of(suffix: &str) -> Option<(i128, i32)> {
    Some(match suffix {
        "" => (1, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        s if s.starts_with(['e', 'E']) => {
            let exp: i32 = s[1..].parse().ok()?;
            if !(-30..=30).contains(&exp) {
                return None;
            }
            (1, exp)
        }
        _ => return None,
    })
}

/// The binary suffixes, largest first, with their power of two.
const BINARY: [(&str, u32); 6] = [
    ("Ei", 60),
    ("Pi", 50),
    ("Ti", 40),
    ("Gi", 30),
    ("Mi", 20),
    ("Ki", 10),
];

/// Formats nano-units canonically: the largest binary suffix that is exact for byte-like
/// amounts of at least 1Ki, else a plain number, else milli-, micro- or nano-units.
pub fn format(nano: i128) -> String {
    if nano % NANO == 0 {
        let units = nano / NANO;
        for (suffix, shift) in BINARY {
            let m = 1i128 << shift;
            if units != 0 && units % m == 0 {
                return format!("{}{suffix}", units / m);
            }
        }
        return units.to_string();
    }
    for (suffix, div) in [("m", 1_000_000i128), ("u", 1_000), ("n", 1)] {
        if nano % div == 0 {
            return format!("{}{suffix}", nano / div);
        }
    }
    unreachable!("every integer is a multiple of 1")
}

/// Like [`format`], but for cpu prefers plain or milli-units over binary suffixes.
pub fn format_for(resource: &str, nano: i128) -> String {
    if resource == "cpu" {
        if nano % NANO == 0 {
            return (nano / NANO).to_string();
        }
        if nano % 1_000_000 == 0 {
            return format!("{}m", nano / 1_000_000);
        }
    }
    format(nano)
}

/// An amount as a person writes it in a message (never in an object, which takes the
/// exact [`format_for`]): the exact quantity where it reads so (`64Mi`, `1Ti`, `500m`,
/// `16`, `10G`), else in binary units as a sum of two (`1Ti + 64Mi`, not `1048640Mi`),
/// else about so in the largest unit (`about 1.3Ti`).
pub(crate) fn human(resource: &str, nano: i128) -> String {
    let exact = format_for(resource, nano);
    let digits = exact.chars().take_while(char::is_ascii_digit).count();
    if digits <= 4 || resource == "cpu" || nano <= 0 || nano % NANO != 0 {
        return exact;
    }
    let units = nano / NANO;
    for (suffix, exp) in [
        ("E", 18),
        ("P", 15),
        ("T", 12),
        ("G", 9),
        ("M", 6),
        ("k", 3),
    ] {
        let m = 10i128.pow(exp);
        if units % m == 0 && units / m < 10_000 {
            return format!("{}{suffix}", units / m);
        }
    }
    let mut terms = vec![];
    let mut rest = units;
    for (suffix, shift) in BINARY {
        let m = 1i128 << shift;
        if rest >= m {
            terms.push(format!("{}{suffix}", rest / m));
            rest %= m;
        }
    }
    if rest > 0 {
        terms.push(rest.to_string());
    }
    if terms.len() <= 2 {
        return terms.join(" + ");
    }
    let (suffix, shift) = BINARY
        .into_iter()
        .find(|(_, shift)| units >= 1i128 << shift)
        .unwrap_or(("", 0));
    // Precision is not the point here: the exact amount is in the object.
    #[allow(clippy::cast_precision_loss)]
    let value = units as f64 / (1i128 << shift) as f64;
    format!("about {value:.1}{suffix}")
}

/// The prefix of the extended resource name Kubernetes gives a DeviceClass without an
/// `extendedResourceName` (KEP-5004): a pod asking for
/// `deviceclass.resource.kubernetes.io/gpu.nvidia.com: 1` gets one device of that class.
pub(crate) const IMPLICIT_DRA_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// An extended resource: a fully-qualified name outside the kubernetes.io domains, or the
/// implicit name of a DeviceClass. Extended resources cannot be overcommitted: request must
/// equal limit.
pub(crate) fn is_extended_resource(name: &str) -> bool {
    if name
        .strip_prefix(IMPLICIT_DRA_PREFIX)
        .is_some_and(|class| !class.is_empty())
    {
        return true;
    }
    match name.split_once('/') {
        Some((domain, rest)) => {
            !rest.is_empty()
                && !domain.is_empty()
                && domain != "kubernetes.io"
                && !domain.ends_with(".kubernetes.io")
                && !domain.starts_with("requests.")
        }
        None => false,
    }
}

/// Resources that may not be overcommitted (request must equal limit).
pub fn is_non_overcommittable(name: &str) -> bool {
    is_extended_resource(name) || name.starts_with("hugepages-")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parse as it was before the one-pass version (its scan of the digits, its
    /// powers; the suffixes are `scale_of`, unchanged): what `parse` must agree with.
    fn reference(s: &str) -> Result<i128, QuantityError> {
        let err = || QuantityError(s.to_owned());
        let s_trim = s.trim();
        if s_trim.is_empty() || s_trim.len() > 64 {
            return Err(err());
        }
        let (sign, body) = match s_trim.as_bytes()[0] {
            b'-' => (-1, &s_trim[1..]),
            b'+' => (1, &s_trim[1..]),
            _ => (1, s_trim),
        };
        let num_end = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (num, suffix) = body.split_at(num_end);
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return Err(err());
        }
        let (mul, pow10) = scale_of(suffix).ok_or_else(err)?;
        let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
        // The digits of both parts as one integer, leading zeros dropped. i128::MAX has 39
        // digits: anything [`format`] writes fits, larger fails.
        let mut mantissa: i128 = 0;
        let mut significant = 0;
        for d in int_part.bytes().chain(frac_part.bytes()) {
            if significant == 0 && d == b'0' {
                continue;
            }
            significant += 1;
            if significant > 39 {
                return Err(err());
            }
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(i128::from(d - b'0')))
                .ok_or_else(err)?;
        }
        // value = mantissa * mul * 10^(pow10 - frac_len) ; in nano-units add 9
        let exp = pow10 - frac_part.len() as i32 + 9;
        let scaled = mantissa.checked_mul(mul).ok_or_else(err)?;
        let value = if exp >= 0 {
            scaled
                .checked_mul(10i128.checked_pow(exp as u32).ok_or_else(err)?)
                .ok_or_else(err)?
        } else {
            let d = 10i128.checked_pow((-exp) as u32).ok_or_else(err)?;
            // Round up without adding first: `scaled + d - 1` overflows near the top.
            scaled / d + i128::from(scaled % d != 0)
        };
        Ok(sign * value)
    }

    #[test]
    fn agrees_with_the_reference_parse() {
        // Every combination of a sign, digits with and without a dot, and a suffix, plus
        // the edges of precision and overflow.
        let signs = ["", "-", "+", " "];
        let nums = [
            "0",
            "1",
            "007",
            "1.5",
            ".5",
            "5.",
            ".",
            "1.2.3",
            "0.0000000001",
            "123456789012",
            "99999999999999999999999999999999999999",
            "999999999999999999999999999999999999999",
            "0000000000000000000000000000000000000000001",
            "1.000000000000000000000000000001",
            "",
        ];
        let suffixes = [
            "", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
            "e3", "E-3", "e30", "e-30", "e31", "e", "x", "Gi ", "\u{e9}", "e+2",
        ];
        let mut n = 0;
        for sign in signs {
            for num in nums {
                for suffix in suffixes {
                    let q = format!("{sign}{num}{suffix}");
                    assert_eq!(parse(&q), reference(&q), "{q:?}");
                    n += 1;
                }
            }
        }
        assert!(n > 1000);
    }

    #[test]
    fn parses_suffixes_exactly() {
        assert_eq!(parse("1").unwrap(), NANO);
        assert_eq!(parse("500m").unwrap(), NANO / 2);
        assert_eq!(parse("0.5").unwrap(), NANO / 2);
        assert_eq!(parse("1Gi").unwrap(), (1 << 30) * NANO);
        assert_eq!(parse("1024Mi").unwrap(), parse("1Gi").unwrap());
        assert_eq!(parse("1e3").unwrap(), parse("1k").unwrap());
        assert_eq!(parse("1.5Gi").unwrap(), 3 * (1 << 29) * NANO);
        assert_eq!(parse("64Gi").unwrap(), 64 * (1 << 30) * NANO);
        assert_eq!(parse("100n").unwrap(), 100);
        assert_eq!(parse("-1").unwrap(), -NANO);
        assert_eq!(parse("0.0000000001").unwrap(), 1, "rounds up");
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "",
            "abc",
            "1x",
            "1.2.3",
            ".",
            "Gi",
            "1e",
            "1e999",
            "99999999999999999999999999999999999Ei",
        ] {
            assert!(parse(s).is_err(), "{s}");
        }
    }

    #[test]
    fn formats_canonically() {
        assert_eq!(format(parse("64Gi").unwrap() * 8), "512Gi");
        assert_eq!(format(parse("1500m").unwrap()), "1500m");
        assert_eq!(format_for("cpu", parse("8").unwrap() * 8), "64");
        assert_eq!(format_for("cpu", parse("250m").unwrap() * 2), "500m");
        // In words, as a person writes them.
        let sum = parse("1Ti").unwrap() + parse("64Mi").unwrap();
        assert_eq!(format(sum), "1048640Mi");
        assert_eq!(human("memory", sum), "1Ti + 64Mi");
        assert_eq!(human("memory", parse("64Mi").unwrap()), "64Mi");
        assert_eq!(human("memory", parse("10G").unwrap()), "10G");
        assert_eq!(
            human("memory", parse("1Ti").unwrap() + parse("1537Mi").unwrap()),
            "about 1.0Ti"
        );
        assert_eq!(human("cpu", parse("12500m").unwrap()), "12500m");
        assert_eq!(human("nvidia.com/gpu", parse("16").unwrap()), "16");
        assert_eq!(format(parse("1000").unwrap()), "1000");
        assert_eq!(format(0), "0");
    }

    #[test]
    fn extended_resources() {
        assert!(is_extended_resource("nvidia.com/gpu"));
        assert!(is_extended_resource("gpu.intel.com/i915"));
        assert!(!is_extended_resource("cpu"));
        assert!(!is_extended_resource("kubernetes.io/foo"));
        assert!(!is_extended_resource("x.kubernetes.io/foo"));
        assert!(is_extended_resource(
            "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
        ));
        assert!(!is_extended_resource("deviceclass.resource.kubernetes.io/"));
        assert!(is_non_overcommittable("hugepages-2Mi"));
    }
}
