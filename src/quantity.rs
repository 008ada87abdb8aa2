//! Kubernetes resource quantities (`1Gi`, `1024Mi`, `1G`, `1.5e9`), parsed exactly.
//!
//! `kube_quantity` would be the obvious crate, but it is tied to k8s-openapi 0.27 while kube 5
//! needs 0.29; linking two k8s-openapi versions doubles the build for one comparison. The
//! grammar is small (apimachinery `resource.ParseQuantity`), so it lives here, exact to the
//! milli-unit, which is the finest precision Kubernetes keeps for storage sizes.

use std::{cmp::Ordering, fmt, str::FromStr};

/// A non-negative quantity, stored in thousandths of the base unit, rounded up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    millis: u128,
}

/// A quantity that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {}: {reason}", crate::echo::quoted(input))]
pub struct QuantityError {
    /// What was given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Quantity {
    /// A whole number of bytes.
    pub fn from_bytes(bytes: u64) -> Self {
        Quantity {
            millis: u128::from(bytes) * 1000,
        }
    }

    /// Whether it is zero.
    pub fn is_zero(self) -> bool {
        self.millis == 0
    }

    /// A size that is almost certainly a slip: a fraction of a byte (`100m`, a tenth of one),
    /// or under a kibibyte.
    pub fn is_implausible_size(self) -> bool {
        !self.millis.is_multiple_of(1000) || self.millis < 1024 * 1000
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        match plain(input) {
            Some(q) => Ok(q),
            None => parse(input),
        }
    }
}

/// `<digits><suffix>` (`100Gi`, `2G`, `1073741824`, `500m`), the way sizes are written, read
/// without the general grammar's sign and decimals, in a u64: the common case of every size a
/// review compares.
/// `None` for anything else, for a fraction of a
/// milli-unit (`1n`) and for a value too large, which [`parse`] reads (or refuses) as the
/// grammar says.
fn plain(s: &str) -> Option<Quantity> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    // 18 digits are below 10^18: no overflow in a u64.
    if digits == 0 || digits > 18 {
        return None;
    }
    let (number, suffix) = s.split_at(digits);
    let mantissa = number
        .bytes()
        .fold(0u64, |n, b| n * 10 + u64::from(b - b'0'));
    let (bin, dec) = suffix_exponents(suffix).ok()?;
    let millis = u128::from(mantissa)
        .checked_mul(1u128 << bin)?
        .checked_mul(10u128.checked_pow(u32::try_from(dec + 3).ok()?)?)?;
    Some(Quantity { millis })
}

/// The general grammar (apimachinery's `resource.ParseQuantity`, without negative values).
fn parse(input: &str) -> Result<Quantity, QuantityError> {
    let err = |reason| QuantityError {
        input: input.to_owned(),
        reason,
    };
    let s = input.strip_prefix('+').unwrap_or(input);
    if s.starts_with('-') {
        return Err(err("sizes cannot be negative"));
    }
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(num_end);
    if number.is_empty() || number == "." {
        return Err(err("expected a number, e.g. 10Gi"));
    }
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => {
            if f.contains('.') {
                return Err(err("more than one decimal point"));
            }
            (i, f)
        }
        None => (number, ""),
    };
    let mut mantissa: u128 = 0;
    for b in int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(b - b'0')))
            .ok_or_else(|| err("too large"))?;
    }
    let frac_digits = i32::try_from(frac_part.len()).map_err(|_| err("too many digits"))?;

    // value = mantissa * 10^-frac * 2^bin * 10^dec; we want value * 1000.
    let (bin, dec) = suffix_exponents(suffix).map_err(err)?;
    let millis = scaled(mantissa, bin, dec + 3 - frac_digits).map_err(err)?;
    Ok(Quantity { millis })
}

/// The binary and decimal exponents a suffix stands for (`Ki` = 2^10, `k` = 10^3, `e9` = 10^9).
fn suffix_exponents(suffix: &str) -> Result<(u32, i32), &'static str> {
    Ok(match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        other => {
            let exp = other
                .strip_prefix('e')
                .or_else(|| other.strip_prefix('E'))
                .ok_or("unknown suffix (use Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E or m)")?;
            let exp: i32 = exp
                .parse()
                .map_err(|_| "exponent must be an integer, e.g. 1e9")?;
            if !(-40..=40).contains(&exp) {
                return Err("exponent out of range");
            }
            (0, exp)
        }
    })
}

/// `mantissa * 2^bin * 10^scale`, rounded up to a whole milli-unit.
fn scaled(mantissa: u128, bin: u32, scale: i32) -> Result<u128, &'static str> {
    let mut millis = mantissa.checked_mul(1u128 << bin).ok_or("too large")?;
    match scale.cmp(&0) {
        Ordering::Greater => {
            let factor = 10u128
                .checked_pow(scale.unsigned_abs())
                .ok_or("too large")?;
            millis = millis.checked_mul(factor).ok_or("too large")?;
        }
        Ordering::Less => {
            let divisor = 10u128.checked_pow(scale.unsigned_abs());
            millis = match divisor {
                Some(d) => millis.div_ceil(d),
                // Smaller than any representable fraction: rounds up to one milli-unit.
                None => u128::from(millis != 0),
            };
        }
        Ordering::Equal => {}
    }
    Ok(millis)
}

impl fmt::Display for Quantity {
    /// Shortest exact binary form for whole byte counts (what a user reads in an error).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.millis.is_multiple_of(1000) {
            return write!(f, "{}m", self.millis);
        }
        let mut v = self.millis / 1000;
        if v == 0 {
            return f.write_str("0");
        }
        let mut unit = 0;
        while v.is_multiple_of(1024) && unit < 6 {
            v /= 1024;
            unit += 1;
        }
        let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][unit];
        write!(f, "{v}{suffix}")
    }
}

/// What a quantity that cannot be read was most likely meant as, each of which can be read:
/// spaces dropped (`10 Gi`), a binary suffix in the wrong case (`1gi`, `1GI`), a byte suffix
/// (`10GB`: `10G` or `10Gi`, `1GiB`: `1Gi`), a decimal suffix in the wrong case (`10g`). Empty
/// when nothing near reads.
pub fn near_misses(input: &str) -> Vec<String> {
    let compact: String = input.chars().filter(|c| !c.is_whitespace()).collect();
    if compact != input && compact.parse::<Quantity>().is_ok() {
        return vec![compact];
    }
    let digits = compact
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(compact.len());
    let (number, suffix) = compact.split_at(digits);
    if number.is_empty() {
        return Vec::new();
    }
    let lower = suffix.to_ascii_lowercase();
    let stem = lower
        .strip_suffix("ib")
        .map(|s| format!("{s}i"))
        .or_else(|| lower.strip_suffix("bytes").map(str::to_owned))
        .or_else(|| lower.strip_suffix('b').map(str::to_owned))
        .unwrap_or_else(|| lower.clone());
    let decimal = |s: &str| match s {
        "k" => Some("k"),
        "m" if suffix.starts_with('M') || lower.ends_with('b') => Some("M"),
        "g" => Some("G"),
        "t" => Some("T"),
        "p" => Some("P"),
        "e" => Some("E"),
        _ => None,
    };
    let binary = |s: &str| match s {
        "ki" | "k" => Some("Ki"),
        "mi" | "m" => Some("Mi"),
        "gi" | "g" => Some("Gi"),
        "ti" | "t" => Some("Ti"),
        "pi" | "p" => Some("Pi"),
        "ei" | "e" => Some("Ei"),
        _ => None,
    };
    let mut out: Vec<String> = Vec::new();
    if stem.ends_with('i') {
        out.extend(binary(&stem).map(|b| format!("{number}{b}")));
    } else if stem.is_empty() {
        out.push(number.to_owned());
    } else {
        out.extend(decimal(&stem).map(|d| format!("{number}{d}")));
        out.extend(binary(&stem).map(|b| format!("{number}{b}")));
    }
    if out.is_empty() && compact != input {
        out.push(compact.clone());
    }
    out.retain(|c| c != input && c.parse::<Quantity>().is_ok());
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::near_misses;

    #[test]
    fn near_misses_are_only_quantities_that_read() {
        for (input, want) in [
            ("1gi", vec!["1Gi"]),
            ("1GI", vec!["1Gi"]),
            ("10GB", vec!["10G", "10Gi"]),
            ("10gb", vec!["10G", "10Gi"]),
            ("512MB", vec!["512M", "512Mi"]),
            ("1GiB", vec!["1Gi"]),
            ("10 Gi", vec!["10Gi"]),
            ("2g", vec!["2G", "2Gi"]),
            ("100bytes", vec!["100"]),
            ("lots", vec![]),
            ("1Zi", vec![]),
        ] {
            assert_eq!(near_misses(input), want, "{input}");
        }
    }

    use super::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    proptest::proptest! {
        /// The plain form's shortcut reads what the general grammar reads, and declines
        /// (leaving the input to the grammar) exactly where it must: signs, decimals,
        /// exponents, other suffixes, more than 18 digits.
        #[test]
        fn the_plain_shortcut_agrees_with_the_grammar(
            s in "[+-]?[0-9]{0,22}(\\.[0-9]{0,3})?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m|n|e[0-9]|gi| Gi|)"
        ) {
            let general = parse(&s);
            match plain(&s) {
                Some(q) => proptest::prop_assert_eq!(Ok(q), general.clone()),
                None => {
                    let number = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E"]
                        .iter()
                        .find_map(|suffix| s.strip_suffix(suffix))
                        .unwrap_or(&s);
                    let plain_form = (1..=18).contains(&number.len())
                        && number.bytes().all(|b| b.is_ascii_digit());
                    // Declined in the plain form only when too large for it to compute.
                    let too_large = general.as_ref().is_err_and(|e| e.reason == "too large");
                    proptest::prop_assert!(
                        !plain_form || too_large,
                        "{s:?} declined; the grammar: {general:?}"
                    );
                }
            }
            proptest::prop_assert_eq!(s.parse::<Quantity>(), general);
        }
    }

    #[test]
    fn plain_sizes_take_the_shortcut() {
        for s in [
            "100Gi",
            "2G",
            "1073741824",
            "0",
            "512Mi",
            "1E",
            "999999999999999999",
            "1e9",
            "1000m",
        ] {
            assert_eq!(plain(s), Some(parse(s).unwrap()), "{s}");
        }
        for s in [
            "+1Gi",
            "1.5Gi",
            "1n",
            "1e-5",
            "1e99",
            "1Gi ",
            "",
            "Gi",
            "1234567890123456789",
            // Too large: the grammar refuses it, and says why.
            "999999999999999999Ei",
        ] {
            assert_eq!(plain(s), None, "{s}");
        }
    }

    #[test]
    fn binary_and_decimal_suffixes_compare_by_value() {
        assert_eq!(q("1Gi"), q("1024Mi"));
        assert_eq!(q("1Gi"), q("1073741824"));
        assert!(q("1G") < q("1Gi"));
        assert_eq!(q("1G"), q("1000M"));
        assert_eq!(q("1G"), q("1e9"));
        assert_eq!(q("1.5Gi"), q("1536Mi"));
        assert_eq!(q("0.5Ki"), q("512"));
        assert_eq!(q("1Ti"), q("1024Gi"));
        assert!(q("100Gi") > q("99.9Gi"));
        assert_eq!(q("+2Gi"), q("2Gi"));
        assert_eq!(q("2E"), q("2e18"));
    }

    #[test]
    fn fractions_below_one_unit_round_up_to_milli_units() {
        assert_eq!(q("1m").millis, 1);
        assert_eq!(q("1n").millis, 1);
        assert_eq!(q("1500m").millis, 1500);
    }

    #[test]
    fn bad_quantities_name_the_input_and_the_problem() {
        for (input, reason) in [
            ("", "expected a number"),
            ("Gi", "expected a number"),
            ("-1Gi", "negative"),
            ("10GB", "unknown suffix"),
            ("10gi", "unknown suffix"),
            ("1.2.3Gi", "decimal point"),
            ("1eX", "exponent"),
            ("1e99", "exponent out of range"),
            ("999999999999999999999999999999999999999Ei", "too large"),
            ("10 Gi", "unknown suffix"),
        ] {
            let e = input.parse::<Quantity>().expect_err(input);
            assert!(e.to_string().contains(reason), "{input}: {e}");
            assert!(e.to_string().contains(&format!("{input:?}")), "{e}");
        }
    }

    #[test]
    fn display_prints_the_shortest_binary_form() {
        assert_eq!(q("1073741824").to_string(), "1Gi");
        assert_eq!(q("1G").to_string(), "1000000000");
        assert_eq!(q("2048Ki").to_string(), "2Mi");
        assert_eq!(q("0").to_string(), "0");
    }
}
