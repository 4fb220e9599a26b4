//! Checksums and range rules that turn pattern matches into detections:
//! Luhn (cards), ISO 13616 mod-97 (IBAN), SSA rules (US SSN) and IPv4 octets.
//!
//! All functions work on ASCII and are allocation-free.

/// Luhn check over the ASCII digits of `s` (other bytes are skipped).
///
/// Returns `false` when there are no digits at all.
pub(crate) fn luhn(s: &str) -> bool {
    let mut sum = 0u32;
    let mut double = false;
    let mut any = false;
    for b in s.bytes().rev().filter(u8::is_ascii_digit) {
        any = true;
        let mut d = u32::from(b - b'0');
        if double {
            d *= 2;
            if d > 9 {
                d -= 9;
            }
        }
        sum += d;
        double = !double;
    }
    any && sum % 10 == 0
}

/// IBAN lengths by country code, sorted by code.
const IBAN_LENGTHS: &[(&[u8; 2], u8)] = &[
    (b"AD", 24),
    (b"AE", 23),
    (b"AL", 28),
    (b"AT", 20),
    (b"AZ", 28),
    (b"BA", 20),
    (b"BE", 16),
    (b"BG", 22),
    (b"BH", 22),
    (b"BI", 27),
    (b"BR", 29),
    (b"BY", 28),
    (b"CH", 21),
    (b"CR", 22),
    (b"CY", 28),
    (b"CZ", 24),
    (b"DE", 22),
    (b"DJ", 27),
    (b"DK", 18),
    (b"DO", 28),
    (b"EE", 20),
    (b"EG", 29),
    (b"ES", 24),
    (b"FI", 18),
    (b"FK", 18),
    (b"FO", 18),
    (b"FR", 27),
    (b"GB", 22),
    (b"GE", 22),
    (b"GI", 23),
    (b"GL", 18),
    (b"GR", 27),
    (b"GT", 28),
    (b"HR", 21),
    (b"HU", 28),
    (b"IE", 22),
    (b"IL", 23),
    (b"IQ", 23),
    (b"IS", 26),
    (b"IT", 27),
    (b"JO", 30),
    (b"KW", 30),
    (b"KZ", 20),
    (b"LB", 28),
    (b"LC", 32),
    (b"LI", 21),
    (b"LT", 20),
    (b"LU", 20),
    (b"LV", 21),
    (b"LY", 25),
    (b"MC", 27),
    (b"MD", 24),
    (b"ME", 22),
    (b"MK", 19),
    (b"MN", 20),
    (b"MR", 27),
    (b"MT", 31),
    (b"MU", 30),
    (b"NI", 28),
    (b"NL", 18),
    (b"NO", 15),
    (b"OM", 23),
    (b"PK", 24),
    (b"PL", 28),
    (b"PS", 29),
    (b"PT", 25),
    (b"QA", 29),
    (b"RO", 24),
    (b"RS", 22),
    (b"RU", 33),
    (b"SA", 24),
    (b"SC", 31),
    (b"SD", 18),
    (b"SE", 24),
    (b"SI", 19),
    (b"SK", 24),
    (b"SM", 27),
    (b"SO", 23),
    (b"ST", 25),
    (b"SV", 28),
    (b"TL", 23),
    (b"TN", 24),
    (b"TR", 26),
    (b"UA", 29),
    (b"VA", 22),
    (b"VG", 24),
    (b"XK", 20),
    (b"YE", 30),
];

/// Whether a card number (digits, possibly with separators after the first
/// four) starts with an issuer prefix in use: 2221–2720 (Mastercard), 30 and
/// 34–39 (Diners, Amex, JCB), 4 (Visa), 5 (Mastercard, Maestro), 6 (Discover,
/// UnionPay, Maestro). Rules out timestamps (`2024…`) and most ids.
pub(crate) fn card_prefix(s: &[u8]) -> bool {
    if s.len() < 4 || !s[..4].iter().all(u8::is_ascii_digit) {
        return false;
    }
    match s[0] {
        b'2' => {
            let p = s[..4]
                .iter()
                .fold(0u32, |n, &d| n * 10 + u32::from(d - b'0'));
            (2221..=2720).contains(&p)
        }
        b'3' => matches!(s[1], b'0' | b'4'..=b'9'),
        b'4'..=b'6' => true,
        _ => false,
    }
}

/// Whether `n` digits fit the issuer of a card number starting like `s`:
/// 13-digit numbers are (legacy) Visa only, Visa never has 14 or 15 digits,
/// and every card has 13–19 digits. Keeps EAN-13 barcodes out.
pub(crate) fn card_shape(s: &[u8], n: usize) -> bool {
    card_prefix(s)
        && match n {
            13 => s[0] == b'4',
            14 | 15 => s[0] != b'4',
            16..=19 => true,
            _ => false,
        }
}

/// The IBAN length registered for a country code (ISO 13616 / SWIFT registry).
pub(crate) fn iban_length(country: &[u8]) -> Option<usize> {
    IBAN_LENGTHS
        .binary_search_by(|(cc, _)| cc.as_slice().cmp(country))
        .ok()
        .map(|i| usize::from(IBAN_LENGTHS[i].1))
}

/// ISO 7064 mod-97-10 check of a compact IBAN (upper-case letters and digits
/// only, no spaces): move the first four characters to the end, map letters to
/// 10..=35 and check that the number is 1 modulo 97.
pub(crate) fn iban_mod97(compact: &[u8]) -> bool {
    if compact.len() < 5 {
        return false;
    }
    let mut rem = 0u32;
    for &b in compact[4..].iter().chain(&compact[..4]) {
        rem = match b {
            b'0'..=b'9' => (rem * 10 + u32::from(b - b'0')) % 97,
            b'A'..=b'Z' => (rem * 100 + u32::from(b - b'A') + 10) % 97,
            _ => return false,
        };
    }
    rem == 1
}

/// Full IBAN check of a compact IBAN: country code, check digits, registered
/// length and mod-97.
pub(crate) fn iban(compact: &[u8]) -> bool {
    compact.len() >= 5
        && compact[..2].iter().all(u8::is_ascii_uppercase)
        && compact[2..4].iter().all(u8::is_ascii_digit)
        && iban_length(&compact[..2]) == Some(compact.len())
        && iban_mod97(compact)
}

/// US SSN rules for `ddd-dd-dddd` (the digits given without separators):
/// area not 000, 666 or 900–999; group not 00; serial not 0000.
pub(crate) fn ssn(area: &[u8], group: &[u8], serial: &[u8]) -> bool {
    area != b"000"
        && area != b"666"
        && area.first() != Some(&b'9')
        && group != b"00"
        && serial != b"0000"
}

/// One dotted-quad octet: 1–3 digits, value 0–255, no leading zero.
pub(crate) fn ipv4_octet(s: &[u8]) -> bool {
    match s {
        [d] => d.is_ascii_digit(),
        [b'0', ..] => false,
        [_, _] | [_, _, _] => {
            s.iter().all(u8::is_ascii_digit)
                && s.iter().fold(0u32, |n, &d| n * 10 + u32::from(d - b'0')) <= 255
        }
        _ => false,
    }
}

/// A dotted-quad IPv4 address with four valid octets.
pub(crate) fn ipv4(s: &str) -> bool {
    let mut n = 0;
    for part in s.split('.') {
        n += 1;
        if n > 4 || !ipv4_octet(part.as_bytes()) {
            return false;
        }
    }
    n == 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn luhn_accepts_known_test_numbers() {
        for n in [
            "4111111111111111",
            "4111 1111 1111 1111",
            "5500-0000-0000-0004",
            "378282246310005",
            "6011111111111117",
            "3530111333300000",
            "4012888888881881",
            "79927398713",
        ] {
            assert!(luhn(n), "{n}");
        }
    }

    #[test]
    fn luhn_rejects_off_by_one() {
        for n in [
            "4111111111111112",
            "378282246310006",
            "79927398710",
            "",
            "abc",
        ] {
            assert!(!luhn(n), "{n}");
        }
    }

    #[test]
    fn card_prefixes_and_lengths() {
        for ok in [
            "2221", "2720", "3000", "3400", "3530", "4111", "5100", "6011",
        ] {
            assert!(card_prefix(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "2024", "2721", "1234", "3100", "3300", "7000", "9400", "0000", "41",
        ] {
            assert!(!card_prefix(bad.as_bytes()), "{bad}");
        }
        assert!(card_shape(b"4222222222222", 13));
        assert!(!card_shape(b"5901234123457", 13));
        assert!(card_shape(b"378282246310005", 15));
        assert!(!card_shape(b"411111111111111", 15));
        assert!(card_shape(b"4111111111111111", 16));
        assert!(!card_shape(b"41111111111111111111", 20));
    }

    #[test]
    fn iban_checks() {
        for ok in [
            "GB82WEST12345698765432",
            "DE89370400440532013000",
            "FR1420041010050500013M02606",
            "NL91ABNA0417164300",
            "BE68539007547034",
            "NO9386011117947",
            "CH9300762011623852957",
            "MT84MALT011000012345MTLCAST001S",
        ] {
            assert!(iban(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "GB82WEST12345698765433", // checksum
            "GB83WEST12345698765432", // check digits
            "DE8937040044053201300",  // length
            "XX89370400440532013000", // unknown country
            "gb82WEST12345698765432", // lower-case country
            "GB8",
        ] {
            assert!(!iban(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn iban_table_is_sorted() {
        assert!(IBAN_LENGTHS.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(iban_length(b"AD"), Some(24));
        assert_eq!(iban_length(b"YE"), Some(30));
        assert_eq!(iban_length(b"NO"), Some(15));
        assert_eq!(iban_length(b"US"), None);
    }

    #[test]
    fn ssn_rules() {
        assert!(ssn(b"123", b"45", b"6789"));
        assert!(ssn(b"078", b"05", b"1120"));
        assert!(!ssn(b"000", b"12", b"3456"));
        assert!(!ssn(b"666", b"12", b"3456"));
        assert!(!ssn(b"900", b"12", b"3456"));
        assert!(!ssn(b"999", b"12", b"3456"));
        assert!(!ssn(b"123", b"00", b"3456"));
        assert!(!ssn(b"123", b"45", b"0000"));
    }

    #[test]
    fn ipv4_ranges() {
        for ok in [
            "0.0.0.0",
            "10.0.0.1",
            "192.168.1.254",
            "255.255.255.255",
            "8.8.8.8",
        ] {
            assert!(ipv4(ok), "{ok}");
        }
        for bad in [
            "256.1.1.1",
            "999.1.1.1",
            "1.2.3",
            "1.2.3.4.5",
            "01.2.3.4",
            "1.2.3.",
            "1..2.3",
            "1.2.3.1000",
        ] {
            assert!(!ipv4(bad), "{bad}");
        }
    }
}
