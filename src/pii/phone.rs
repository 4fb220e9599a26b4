//! Phone numbers: the checks that turn a match of one of the phone patterns
//! into a detection (context, digit counts, consistent separators, a known
//! country calling code).

use std::ops::Range;

use super::patterns::{after, before, digits, is_word, uniform_separator, Checked};

/// Which phone pattern matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PhoneShape {
    /// `+` and a country code: `+44 20 7946 0958`, `+1 (202) 555-0143`.
    International,
    /// `00` and a country code, as dialled from Europe: `0044 20 7946 0958`.
    Dialled,
    /// North American `(202) 555-0143`, `202-555-0143`.
    NorthAmerican,
    /// A national number: with a trunk `0` (`020 7946 0958`,
    /// `06 12 34 56 78`, `030/123456`, `(02) 1234 5678`), Russia's trunk `8`
    /// (`8 (912) 345-67-89`), Brazil's `(11) 96123-4567`, a Chinese mobile
    /// (`131 2345 6789`).
    National,
}

/// The country calling codes in use (ITU-T E.164), sorted. No code is a
/// prefix of another.
const COUNTRY_CODES: &[u16] = &[
    1, 7, 20, 27, 30, 31, 32, 33, 34, 36, 39, 40, 41, 43, 44, 45, 46, 47, 48, 49, 51, 52, 53, 54,
    55, 56, 57, 58, 60, 61, 62, 63, 64, 65, 66, 81, 82, 84, 86, 90, 91, 92, 93, 94, 95, 98, 211,
    212, 213, 216, 218, 220, 221, 222, 223, 224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234,
    235, 236, 237, 238, 239, 240, 241, 242, 243, 244, 245, 246, 247, 248, 249, 250, 251, 252, 253,
    254, 255, 256, 257, 258, 260, 261, 262, 263, 264, 265, 266, 267, 268, 269, 290, 291, 297, 298,
    299, 350, 351, 352, 353, 354, 355, 356, 357, 358, 359, 370, 371, 372, 373, 374, 375, 376, 377,
    378, 380, 381, 382, 383, 385, 386, 387, 389, 420, 421, 423, 500, 501, 502, 503, 504, 505, 506,
    507, 508, 509, 590, 591, 592, 593, 594, 595, 596, 597, 598, 599, 670, 672, 673, 674, 675, 676,
    677, 678, 679, 680, 681, 682, 683, 685, 686, 687, 688, 689, 690, 691, 692, 800, 808, 850, 852,
    853, 855, 856, 870, 878, 880, 881, 882, 883, 886, 888, 960, 961, 962, 963, 964, 965, 966, 967,
    968, 970, 971, 972, 973, 974, 975, 976, 977, 979, 992, 993, 994, 995, 996, 998,
];

/// Whether `code` (ASCII digits) is a country calling code in use.
fn country_code(code: &[u8]) -> bool {
    !code.is_empty()
        && code.len() <= 3
        && code.iter().all(u8::is_ascii_digit)
        && COUNTRY_CODES
            .binary_search(&code.iter().fold(0u16, |n, &d| n * 10 + u16::from(d - b'0')))
            .is_ok()
}

pub(crate) fn check_phone(text: &str, r: Range<usize>, shape: PhoneShape) -> Checked {
    let t = text.as_bytes();
    let s = &t[r.clone()];
    let retry = r.start + 1;
    let left_ok = match before(t, r.start, 1) {
        None => true,
        Some(p) if is_word(p) || p == b'+' => false,
        Some(b' ' | b'.' | b'-' | b'/') => {
            !before(t, r.start, 2).is_some_and(|q| q.is_ascii_digit())
        }
        Some(_) => true,
    };
    let right_ok = match after(t, r.end, 0) {
        None => true,
        Some(n) if is_word(n) => false,
        Some(b'.' | b'-' | b'/') => !after(t, r.end, 1).is_some_and(|q| q.is_ascii_digit()),
        Some(_) => true,
    };
    if !left_ok || !right_ok {
        return Err(retry);
    }
    let ok = match shape {
        PhoneShape::International => {
            let trunk = text[r.clone()].contains("(0)");
            let n = digits(s) - usize::from(trunk);
            (8..=15).contains(&n)
        }
        PhoneShape::Dialled => {
            let code = s[2..].iter().take_while(|b| b.is_ascii_digit()).count();
            country_code(&s[2..2 + code]) && (8..=15).contains(&(digits(s) - 2))
        }
        PhoneShape::NorthAmerican => {
            // The separators after the area code and the exchange agree,
            // unless the area code is in parentheses.
            let body = if s.starts_with(b"1") && !s.starts_with(b"1(") {
                &s[2..]
            } else {
                s
            };
            body[0] == b'(' || body[3] == body[7]
        }
        PhoneShape::National => national(s),
    };
    if ok {
        Ok(r)
    } else {
        Err(retry)
    }
}

/// The prefix of a national number, by how it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prefix {
    /// A trunk `0` area code, in parentheses or followed by this separator.
    Trunk { parens: bool, sep: u8 },
    /// Russia's trunk `8`.
    Eight,
    /// A two-digit area code in parentheses, without a trunk prefix.
    Brazil,
    /// A Chinese mobile number, `1` and ten digits.
    ChinaMobile,
}

/// The rules for a match of the national pattern.
fn national(s: &[u8]) -> bool {
    let n = digits(s);
    // Split off the prefix: what comes before the subscriber groups.
    let (prefix, rest) = if s[0] == b'(' {
        let Some(close) = s.iter().position(|&b| b == b')') else {
            return false;
        };
        let prefix = if s[1] == b'0' {
            Prefix::Trunk {
                parens: true,
                sep: b' ',
            }
        } else {
            Prefix::Brazil
        };
        (prefix, &s[close + 1..])
    } else if s[0] == b'8' {
        match s.iter().position(|&b| b == b')') {
            Some(close) => (Prefix::Eight, &s[close + 1..]),
            None => (Prefix::Eight, &s[2..]),
        }
    } else if s[0] == b'1' {
        (Prefix::ChinaMobile, s)
    } else {
        let area = s.iter().take_while(|b| b.is_ascii_digit()).count();
        let Some(&sep) = s.get(area) else {
            return false;
        };
        (Prefix::Trunk { parens: false, sep }, &s[area + 1..])
    };
    let rest = rest.strip_prefix(b" ").unwrap_or(rest);
    let Ok(sep) = uniform_separator(rest) else {
        return false;
    };
    if sep == Some(b'/') {
        return false;
    }
    match prefix {
        Prefix::Trunk { parens, sep: area } => {
            if area == b'.' || sep == Some(b'.') {
                // Dotted all through, in groups of two or more digits, and
                // not in thousands (`01.234.567`).
                let groups: Vec<&[u8]> = s.split(|&b| b == b'.').collect();
                let thousands = groups.len() > 2 && groups[1].len() == 3 && groups[2].len() == 3;
                area == b'.'
                    && sep != Some(b' ')
                    && groups.iter().all(|g| g.len() >= 2)
                    && !thousands
                    && (9..=12).contains(&n)
            } else {
                // Eight digits only where the layout says phone: the area
                // code in parentheses, after a slash, or set apart by
                // another separator than the subscriber's groups.
                let distinct = parens || area == b'/' || sep.is_some_and(|x| x != area);
                (9..=13).contains(&n) || (n == 8 && distinct)
            }
        }
        Prefix::Eight => n == 11,
        Prefix::Brazil => {
            let last = rest
                .rsplit(|b| !b.is_ascii_digit())
                .next()
                .map_or(0, <[u8]>::len);
            (10..=11).contains(&n) && sep.is_some() && last == 4
        }
        Prefix::ChinaMobile => n == 11,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn country_codes_are_sorted_and_prefix_free() {
        assert!(COUNTRY_CODES.windows(2).all(|w| w[0] < w[1]));
        for &a in COUNTRY_CODES {
            for &b in COUNTRY_CODES {
                let (a, b) = (a.to_string(), b.to_string());
                assert!(a == b || !b.starts_with(&a), "{a} is a prefix of {b}");
            }
        }
        assert!(country_code(b"44") && country_code(b"1") && country_code(b"353"));
        assert!(!country_code(b"12") && !country_code(b"") && !country_code(b"4444"));
    }

    #[test]
    fn national_layouts() {
        for ok in [
            "020 7946 0958",
            "030/123456",
            "0450/03 48 01",
            "08-12 34 56",
            "(022) 12345",
            "012.32.73.43",
            "0121.231.8057",
            "011 15-2345-6789",
            "8 (912) 345-67-89",
            "8-301-124-16-48",
            "(11) 96123-4567",
            "131 2345 6789",
        ] {
            assert!(national(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "01.234.567.89",
            "05 03 2024",
            "022-62447",
            "012.32 73 43",
            "8 912 345",
            "(11) 2345 678",
        ] {
            assert!(!national(bad.as_bytes()), "{bad}");
        }
    }
}
