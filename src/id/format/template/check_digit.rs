//! Check digits: one Luhn digit, or two ISO 7064 MOD 97-10 digits (as in
//! IBAN), over what precedes the check field.

use super::syntax::CheckKind;

/// The check digits of `payload` (what precedes the check field). Luhn
/// reads its digits; MOD 97-10 its digits and upper-case letters; other
/// literal characters are skipped.
pub fn check_digits(kind: CheckKind, payload: &[u8]) -> String {
    let (value, width) = check_value(kind, payload);
    let mut out = String::with_capacity(2);
    push_num(&mut out, value, width);
    out
}

/// The check digits of `payload` as a number, and how many digits.
pub(super) fn check_value(kind: CheckKind, payload: &[u8]) -> (u64, usize) {
    match kind {
        CheckKind::Luhn => {
            let mut sum = 0u64;
            let digits = payload.iter().rev().filter(|b| b.is_ascii_digit());
            for (i, b) in digits.enumerate() {
                let mut d = u64::from(b - b'0');
                if i % 2 == 0 {
                    d *= 2;
                    if d > 9 {
                        d -= 9;
                    }
                }
                sum += d;
            }
            ((10 - sum % 10) % 10, 1)
        }
        CheckKind::Mod97 => {
            // Reduce only when the accumulator nears overflow: below 2^56,
            // r * 100 + 35 still fits, and divisions are the cost here.
            let mut r: u64 = 0;
            for &b in payload {
                if b.is_ascii_digit() {
                    r = r * 10 + u64::from(b - b'0');
                } else if b.is_ascii_uppercase() {
                    r = r * 100 + u64::from(b - b'A' + 10);
                } else {
                    continue;
                }
                if r >= 1 << 56 {
                    r %= 97;
                }
            }
            (98 - (r % 97 * 100) % 97, 2)
        }
    }
}

/// Writes `v` in decimal, zero-padded to `width` digits (rendering's
/// numeric fields use it too).
pub(super) fn push_num(out: &mut String, v: u64, width: usize) {
    let mut buf = [b'0'; 20];
    let mut i = buf.len();
    let mut v = v;
    while v > 0 {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    let start = buf.len() - width.max(buf.len() - i);
    for &b in &buf[start..] {
        out.push(b as char);
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_helpers::{civil, none, t};
    use super::super::{ParseError, ALNUM};
    use super::*;
    use crate::id::format::period::Reset;

    #[test]
    fn check_digits_are_the_standard_ones() {
        // Luhn: 7992739871 -> 3; MOD 97-10: IBAN GB82 WEST 1234 5698 7654 32
        // rearranged is WEST12345698765432GB00 -> 82.
        // The lazily reduced MOD 97 agrees with reducing at every step, on
        // long payloads of digits and letters.
        let naive = |p: &[u8]| {
            let mut r = 0u64;
            for &b in p {
                if b.is_ascii_digit() {
                    r = (r * 10 + u64::from(b - b'0')) % 97;
                } else if b.is_ascii_uppercase() {
                    r = (r * 100 + u64::from(b - b'A' + 10)) % 97;
                }
            }
            format!("{:02}", 98 - (r * 100) % 97)
        };
        let mut x: u64 = 12345;
        for len in 1..120 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let p: Vec<u8> = (0..len)
                .map(|i| ALNUM[((x >> (i % 50)) % 36) as usize])
                .collect();
            assert_eq!(check_digits(CheckKind::Mod97, &p), naive(&p), "{len}");
        }
        assert_eq!(check_digits(CheckKind::Luhn, b"7992739871"), "3");
        assert_eq!(check_digits(CheckKind::Luhn, b"7992-739871"), "3");
        assert_eq!(
            check_digits(CheckKind::Mod97, b"WEST12345698765432GB"),
            "82"
        );
        let tpl = t("{yyyy}{MM}{dd}{seq:4}{check:luhn}", Reset::Day).unwrap();
        let at = civil("2026-11-23T10:00:00Z", "UTC");
        let id = tpl.render(&at, 17, None, None, &none()).unwrap();
        assert_eq!(
            id,
            format!(
                "202611230017{}",
                check_digits(CheckKind::Luhn, b"202611230017")
            )
        );
        // Every single-digit typo is caught.
        for i in 0..id.len() - 1 {
            let mut typo = id.clone().into_bytes();
            typo[i] = if typo[i] == b'9' { b'0' } else { typo[i] + 1 };
            let typo = String::from_utf8(typo).unwrap();
            assert!(
                matches!(
                    tpl.parse_id(&typo),
                    Err(ParseError::CheckMismatch { .. }) | Err(ParseError::BadTime { .. })
                ),
                "{typo}"
            );
        }
    }
}
