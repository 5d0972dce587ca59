//! Numbers: RFC 8785 prints every number as ECMAScript prints the IEEE-754 double
//! nearest to it. A literal that no double holds exactly (`9007199254740993`,
//! `333333333.33333329`) would silently collapse onto its neighbour, so two
//! different params would share one hash and an approval for one would authorize
//! the other. We therefore refuse every literal whose exact decimal value differs
//! from the exact decimal value of its canonical form.
//!
//! The comparison is done on normalized decimal digit strings, never on floats:
//! parsing both sides back to `f64` would compare the doubles, which are equal by
//! construction, and prove nothing.

use crate::CoreError;

/// Appends the canonical (ECMAScript) form of the JSON number literal `literal`
/// to `out`, or refuses a literal that would not survive the trip exactly.
///
/// `literal` must already be valid JSON number grammar (serde_json guarantees it
/// for parsed values and for values it built from integers or floats).
pub(super) fn write_number(out: &mut String, literal: &str) -> Result<(), CoreError> {
    let parsed: f64 = literal.parse().map_err(|_| malformed(literal))?;
    if !parsed.is_finite() {
        return Err(CoreError::NonFiniteNumber(shown(literal)));
    }
    let mut buf = ryu_js::Buffer::new();
    let canonical = buf.format_finite(parsed);
    if !same_value(literal, canonical)? {
        return Err(CoreError::InexactNumber(shown(literal)));
    }
    out.push_str(canonical);
    Ok(())
}

/// Whether two number literals denote the same exact decimal value.
fn same_value(a: &str, b: &str) -> Result<bool, CoreError> {
    let a = Decimal::parse(a).ok_or_else(|| malformed(a))?;
    let b = Decimal::parse(b).ok_or_else(|| malformed(b))?;
    Ok(a.normalized() == b.normalized())
}

fn malformed(literal: &str) -> CoreError {
    CoreError::InvalidJson(format!("malformed number {}", shown(literal)))
}

/// A literal as an error names it: its first 64 digits. The literal is the
/// caller's, of any length, and the server log keeps every error message
/// (thirty-first red-team pass, docs/security.md row 141).
fn shown(literal: &str) -> String {
    crate::text::clip(literal, crate::text::QUOTED_CHARS)
}

/// A decimal literal split into its parts, borrowed from the text:
/// value = (-1)^negative × (int ‖ frac) × 10^(exp − frac.len()).
struct Decimal<'a> {
    negative: bool,
    int: &'a [u8],
    frac: &'a [u8],
    exp: i64,
}

/// The canonical shape of a decimal value: zero, or a sign, the power of ten of
/// the first significant digit, and the significant digits without leading or
/// trailing zeros. Two literals are equal in value iff their shapes are equal.
#[derive(Debug, PartialEq, Eq)]
enum Normalized<'a> {
    Zero,
    NonZero {
        negative: bool,
        /// Power of ten of the first significant digit (scientific exponent).
        magnitude: i64,
        digits: SigDigits<'a>,
    },
}

/// The significant digits of a `Decimal`, compared digit by digit across the
/// integer/fraction boundary without allocating.
#[derive(Debug)]
struct SigDigits<'a> {
    int: &'a [u8],
    frac: &'a [u8],
    first: usize,
    last: usize,
}

impl SigDigits<'_> {
    fn iter(&self) -> impl Iterator<Item = u8> + '_ {
        (self.first..=self.last).map(|i| digit_at(self.int, self.frac, i))
    }
}

impl PartialEq for SigDigits<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.last - self.first == other.last - other.first && self.iter().eq(other.iter())
    }
}

impl Eq for SigDigits<'_> {}

fn digit_at(int: &[u8], frac: &[u8], i: usize) -> u8 {
    if i < int.len() {
        int[i]
    } else {
        frac[i - int.len()]
    }
}

/// Exponents are clamped here. A literal whose exponent is this large is either
/// infinite or zero as a double (refused or normalized before it matters), and the
/// canonical side never comes close, so clamping cannot make unequal values equal
/// in a way that lets an inexact literal through.
const EXP_CLAMP: i64 = 1 << 40;

impl<'a> Decimal<'a> {
    /// Parses JSON number grammar, also accepting an explicit `+` in the exponent
    /// (`1e+30`, as ECMAScript prints it). Returns `None` for anything else.
    fn parse(s: &'a str) -> Option<Self> {
        let bytes = s.as_bytes();
        let (negative, rest) = match bytes.split_first() {
            Some((b'-', rest)) => (true, rest),
            _ => (false, bytes),
        };
        let int_len = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if int_len == 0 {
            return None;
        }
        let (int, mut rest) = rest.split_at(int_len);
        let mut frac: &[u8] = &[];
        if let Some((b'.', after)) = rest.split_first() {
            let n = after.iter().take_while(|b| b.is_ascii_digit()).count();
            if n == 0 {
                return None;
            }
            frac = &after[..n];
            rest = &after[n..];
        }
        let mut exp: i64 = 0;
        if let Some((b'e' | b'E', after)) = rest.split_first() {
            let (exp_negative, digits) = match after.split_first() {
                Some((b'-', d)) => (true, d),
                Some((b'+', d)) => (false, d),
                _ => (false, after),
            };
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            for d in digits {
                exp = (exp * 10 + i64::from(d - b'0')).min(EXP_CLAMP);
            }
            if exp_negative {
                exp = -exp;
            }
        } else if !rest.is_empty() {
            return None;
        }
        Some(Decimal {
            negative,
            int,
            frac,
            exp,
        })
    }

    fn normalized(&self) -> Normalized<'a> {
        let total = self.int.len() + self.frac.len();
        let is_zero = |i: usize| digit_at(self.int, self.frac, i) == b'0';
        let Some(first) = (0..total).find(|&i| !is_zero(i)) else {
            // -0, 0.000, 0e5: every zero is the same value (and JCS prints "0").
            return Normalized::Zero;
        };
        let last = (first..total).rev().find(|&i| !is_zero(i)).unwrap_or(first);
        // Lengths are bounded by the input size (≤ a few MiB), far below i64::MAX.
        let int_len = i64::try_from(self.int.len()).unwrap_or(i64::MAX);
        let first_i = i64::try_from(first).unwrap_or(i64::MAX);
        Normalized::NonZero {
            negative: self.negative,
            magnitude: self.exp + int_len - 1 - first_i,
            digits: SigDigits {
                int: self.int,
                frac: self.frac,
                first,
                last,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(literal: &str) -> Result<String, CoreError> {
        let mut out = String::new();
        write_number(&mut out, literal).map(|()| out)
    }

    macro_rules! accepted {
        ($($name:ident: $lit:expr => $want:expr,)*) => {$(
            #[test]
            fn $name() {
                assert_eq!(canon($lit).as_deref(), Ok($want));
            }
        )*};
    }

    accepted! {
        test_tenth_stays: "0.1" => "0.1",
        test_trailing_zero_dropped: "4.50" => "4.5",
        test_upper_exponent: "1E30" => "1e+30",
        test_integral_float: "56.0" => "56",
        test_small_exponent_expanded: "2e-3" => "0.002",
        test_tiny_fraction_to_exponent: "0.000000000000000000000000001" => "1e-27",
        test_negative_zero: "-0" => "0",
        test_negative_zero_float: "-0.0e7" => "0",
        test_jsonb_prints_1e30_in_full: "1000000000000000000000000000000" => "1e+30",
        test_max_safe_integer: "9007199254740992" => "9007199254740992",
        test_negative_integer: "-42" => "-42",
        test_explicit_plus_exponent: "1e+2" => "100",
        test_1e21_switches_to_exponent: "1e21" => "1e+21",
        test_1e20_stays_integral: "100000000000000000000" => "100000000000000000000",
        test_leading_zero_fraction: "0.5" => "0.5",
        test_fraction_with_exponent: "12.5e-1" => "1.25",
        test_min_subnormal: "5e-324" => "5e-324",
        test_max_double: "1.7976931348623157e308" => "1.7976931348623157e+308",
    }

    macro_rules! rejected {
        ($($name:ident: $lit:expr => $variant:ident,)*) => {$(
            #[test]
            fn $name() {
                assert_eq!(canon($lit), Err(CoreError::$variant($lit.to_owned())));
            }
        )*};
    }

    rejected! {
        test_2_pow_53_plus_1: "9007199254740993" => InexactNumber,
        test_2_pow_60: "1152921504606846976" => InexactNumber,
        test_rfc_values_number: "333333333.33333329" => InexactNumber,
        test_too_many_digits_of_tenth: "0.10000000000000001" => InexactNumber,
        test_underflow_to_zero: "1e-400" => InexactNumber,
        test_overflow: "1e400" => NonFiniteNumber,
        test_negative_overflow: "-1e400" => NonFiniteNumber,
        test_huge_exponent: "1e99999999999999999999999" => NonFiniteNumber,
        test_huge_negative_exponent: "1e-99999999999999999999999" => InexactNumber,
    }

    #[test]
    fn test_zero_with_huge_exponent_is_zero() {
        assert_eq!(canon("0e99999999999999999999").as_deref(), Ok("0"));
    }

    #[test]
    fn test_same_value_ignores_notation() {
        assert_eq!(same_value("1.50e2", "150"), Ok(true));
        assert_eq!(same_value("0.00150", "1.5e-3"), Ok(true));
        assert_eq!(same_value("150", "151"), Ok(false));
        assert_eq!(same_value("-150", "150"), Ok(false));
        assert_eq!(same_value("15", "150"), Ok(false));
        assert_eq!(same_value("-0", "0.0"), Ok(true));
    }

    #[test]
    fn test_malformed_literal_is_refused() {
        for bad in ["", "-", "1.", ".5", "1e", "1e+", "0x10", "1.5x"] {
            assert!(Decimal::parse(bad).is_none(), "{bad:?} parsed");
        }
    }
}
