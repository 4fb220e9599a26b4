//! The prefilter: one pass over the bytes that finds the few *windows* of a
//! text that can hold a structured, digit-bearing kind of PII.
//!
//! Every e-mail, phone number, card, IBAN, SSN, IP or MAC address contains a
//! *trigger* byte in its first whitespace-separated token: a digit, `@` or
//! `:` — except a MAC address written with dashes and letters only, which is
//! caught by a dedicated check on `-` (`hh-hh-`). So the scanner skips along
//! the text looking for triggers; around each one it grows a window to the
//! left over token bytes, and to the right over token bytes and over single
//! spaces that continue a grouped number (`4111 1111 …`, `GB82 WEST …`,
//! `(202) 555-0143`) and over a slash between digits (`030/1234567`). The per-kind regexes then run on windows only, and only
//! when the window's byte counts make the kind possible. Clean prose costs one
//! table lookup per byte plus a little work per isolated number.

/// Byte may start a window (digit, `@`, `:`), or is `-` (checked further).
const TRIGGER: u8 = 1;
/// Byte may be part of a structured PII token.
const TOKEN: u8 = 2;
/// ASCII hex digit.
const HEX: u8 = 4;

/// Per-byte classes, see the constants above.
static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        let mut c = 0;
        if b.is_ascii_digit() || b == b'@' || b == b':' || b == b'-' {
            c |= TRIGGER;
        }
        // Non-ASCII bytes too: e-mail local parts such as `müller` or `παπα`.
        if b >= 0x80
            || b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'+' | b'-' | b'.' | b'_' | b'(' | b')' | b'@' | b':' | b'%' | b'\''
            )
        {
            c |= TOKEN;
        }
        if b.is_ascii_hexdigit() {
            c |= HEX;
        }
        t[i] = c;
        i += 1;
    }
    t
};

#[inline]
fn is_token(b: u8) -> bool {
    CLASS[usize::from(b)] & TOKEN != 0
}

#[inline]
fn is_hex(b: u8) -> bool {
    CLASS[usize::from(b)] & HEX != 0
}

/// A region of the text worth running the structured detectors on, with the
/// byte counts used to decide which detectors can possibly match in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) digits: u32,
    pub(crate) at: u32,
    pub(crate) colons: u32,
    pub(crate) dots: u32,
    pub(crate) dashes: u32,
    pub(crate) upper: u32,
    pub(crate) plus: u32,
    /// Digit groups starting with `0` (a national trunk prefix candidate).
    pub(crate) zero_groups: u32,
    /// Spaces (crossed between groups), slashes and parentheses.
    pub(crate) spaces: u32,
    pub(crate) slashes: u32,
    pub(crate) parens: u32,
    /// Length of the longest run of digits.
    pub(crate) max_run: u32,
    /// Whether `::` occurs (compressed IPv6).
    pub(crate) double_colon: bool,
}

impl Window {
    fn new(bytes: &[u8], start: usize, end: usize) -> Self {
        let mut w = Window {
            start,
            end,
            ..Window::default()
        };
        let mut run = 0;
        let mut prev = 0u8;
        for &b in &bytes[start..end] {
            if b.is_ascii_digit() {
                if run == 0 && b == b'0' {
                    w.zero_groups += 1;
                }
                run += 1;
                w.digits += 1;
                w.max_run = w.max_run.max(run);
            } else {
                run = 0;
                match b {
                    b'+' => w.plus += 1,
                    b'A'..=b'Z' => w.upper += 1,
                    b'@' => w.at += 1,
                    b':' => {
                        w.colons += 1;
                        w.double_colon |= prev == b':';
                    }
                    b'.' => w.dots += 1,
                    b'-' => w.dashes += 1,
                    b' ' => w.spaces += 1,
                    b'/' => w.slashes += 1,
                    b'(' | b')' => w.parens += 1,
                    _ => {}
                }
            }
            prev = b;
        }
        w
    }

    pub(crate) fn len(&self) -> usize {
        self.end - self.start
    }
}

/// `bytes[i] == b'-'` is the first separator of a dash-written MAC address
/// (`hh-hh-`), the one structured kind that may carry no trigger byte.
fn mac_dash(bytes: &[u8], i: usize) -> bool {
    i >= 2
        && i + 3 < bytes.len()
        && is_hex(bytes[i - 2])
        && is_hex(bytes[i - 1])
        && is_hex(bytes[i + 1])
        && is_hex(bytes[i + 2])
        && bytes[i + 3] == b'-'
}

/// Whether the window may grow over the single space at `bytes[e]`: the space
/// separates two groups of one grouped number (card, phone, IBAN).
fn crosses_space(bytes: &[u8], start: usize, e: usize) -> bool {
    if e <= start || e + 1 >= bytes.len() || bytes[e] != b' ' {
        return false;
    }
    let prev = bytes[e - 1];
    if !(prev.is_ascii_alphanumeric() || prev == b')') {
        return false;
    }
    match bytes[e + 1] {
        b'0'..=b'9' | b'(' | b'+' => true,
        // An IBAN group written in capitals (`WEST`, `ABNA`, `3M02`).
        b'A'..=b'Z' => {
            let group = bytes[e + 1..]
                .iter()
                .take(5)
                .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
                .count();
            group <= 4
                && bytes
                    .get(e + 1 + group)
                    .is_none_or(|&b| !b.is_ascii_alphanumeric())
        }
        _ => false,
    }
}

/// Whether the window may grow over the `/` at `bytes[e]`: it separates an
/// area code from the number (`030/1234567`).
fn crosses_slash(bytes: &[u8], start: usize, e: usize) -> bool {
    e > start
        && e + 1 < bytes.len()
        && bytes[e] == b'/'
        && bytes[e - 1].is_ascii_digit()
        && bytes[e + 1].is_ascii_digit()
}

/// The position of the first trigger byte at or after `i`.
///
/// Eight bytes at a time: a word is skipped when none of its bytes lies in
/// `0x2D..=0x40` (`-`, `.`, `/`, digits, `:`, `;`, `<`, `=`, `>`, `?`, `@`),
/// which holds for most words of prose; the bytes of the other words are
/// looked up in [`CLASS`].
#[inline]
fn next_trigger(bytes: &[u8], mut i: usize) -> Option<usize> {
    const LO: u64 = u64::from_le_bytes([1; 8]);
    const LOW7: u64 = LO * 0x7F;
    const HIGH: u64 = LO * 0x80;
    // "Has a byte strictly between m and n" (bit-twiddling hacks), exact for
    // every byte; non-ASCII bytes never match.
    const M: u64 = 0x2C;
    const N: u64 = 0x41;
    while i + 8 <= bytes.len() {
        let word: [u8; 8] = bytes[i..i + 8].try_into().expect("8 bytes");
        let x = u64::from_le_bytes(word);
        let mut hits =
            ((LO * (127 + N)).wrapping_sub(x & LOW7) & !x & ((x & LOW7) + LO * (127 - M))) & HIGH;
        while hits != 0 {
            let j = i + (hits.trailing_zeros() / 8) as usize;
            if CLASS[usize::from(bytes[j])] & TRIGGER != 0 {
                return Some(j);
            }
            hits &= hits - 1;
        }
        i += 8;
    }
    bytes[i..]
        .iter()
        .position(|&b| CLASS[usize::from(b)] & TRIGGER != 0)
        .map(|k| i + k)
}

/// Texts up to this many bytes are checked by [`may_hold_secret`] before
/// the secrets regex runs. The check costs about 13 instructions a byte, a
/// search of the regex about 450 whatever the length up to a few hundred
/// bytes: 274 against 454 on 19 bytes, 439 against 525 on 32, 3,275
/// against 526 on 256.
pub(crate) const SHORT_TEXT: usize = 32;

/// Whether `bytes` may hold a match of the secrets regex: one of its literal
/// starts occurs (`sk-`, `sk_`/`rk_`, `gh?_`, `github_pat_`, `AKIA`/`ASIA`,
/// `eyJ`, `-----BEGIN`, `://`). Necessary, not sufficient: one pass over
/// the bytes, a closer look only at `-`, `_`, `:`, `A` and `J`.
pub(crate) fn may_hold_secret(bytes: &[u8]) -> bool {
    let ends_with = |i: usize, lit: &[u8]| i >= lit.len() && &bytes[i - lit.len()..i] == lit;
    bytes.iter().enumerate().any(|(i, &b)| match b {
        b'-' => ends_with(i, b"sk") || bytes[i..].starts_with(b"-----BEGIN"),
        b'_' => {
            ends_with(i, b"sk")
                || ends_with(i, b"rk")
                || (i >= 3 && &bytes[i - 3..i - 1] == b"gh")
                || ends_with(i, b"github")
        }
        b':' => bytes[i + 1..].starts_with(b"//"),
        b'A' => bytes[i + 1..].starts_with(b"KIA") || bytes[i + 1..].starts_with(b"SIA"),
        b'J' => ends_with(i, b"ey"),
        _ => false,
    })
}

/// Calls `f` for each window of `text`, in order; windows never overlap.
/// Windows whose byte range `wanted` rejects are skipped before their counts
/// are taken.
pub(crate) fn for_each_window(
    text: &str,
    mut wanted: impl FnMut(usize, usize) -> bool,
    mut f: impl FnMut(&Window),
) {
    let bytes = text.as_bytes();
    let n = bytes.len();
    let mut i = 0;
    let mut floor = 0;
    while i < n {
        match next_trigger(bytes, i) {
            Some(k) => i = k,
            None => break,
        }
        if bytes[i] == b'-' && !mac_dash(bytes, i) {
            i += 1;
            continue;
        }
        let mut start = i;
        while start > floor && is_token(bytes[start - 1]) {
            start -= 1;
        }
        let mut end = i + 1;
        loop {
            while end < n && is_token(bytes[end]) {
                end += 1;
            }
            if crosses_space(bytes, start, end) || crosses_slash(bytes, start, end) {
                end += 1;
            } else {
                break;
            }
        }
        if wanted(start, end) {
            f(&Window::new(bytes, start, end));
        }
        i = end;
        floor = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windows(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        for_each_window(text, |_, _| true, |w| out.push(&text[w.start..w.end]));
        out
    }

    #[test]
    fn clean_prose_has_no_windows() {
        assert!(windows("The quick brown fox jumps over the lazy dog.").is_empty());
        assert!(windows("A well-known, long-standing re-entry.").is_empty());
    }

    #[test]
    fn windows_cover_grouped_numbers() {
        assert_eq!(
            windows("card 4111 1111 1111 1111, thanks"),
            ["4111 1111 1111 1111"]
        );
        assert_eq!(
            windows("IBAN GB82 WEST 1234 5698 7654 32 please"),
            ["GB82 WEST 1234 5698 7654 32"]
        );
        assert_eq!(windows("call +1 (202) 555-0143 now"), ["+1 (202) 555-0143"]);
        assert_eq!(windows("mail jo.e+x@ex.com."), ["jo.e+x@ex.com."]);
        assert_eq!(windows("in 2019 The Big"), ["2019"]);
        assert_eq!(
            windows("is LU22 457U 85M5 WY3C HST1."),
            ["LU22 457U 85M5 WY3C HST1."]
        );
    }

    #[test]
    fn windows_for_colons_and_dash_macs() {
        assert_eq!(windows("Note: fine"), ["Note:"]);
        assert_eq!(windows("mac AA-BB-CC-DD-EE-FF ok"), ["AA-BB-CC-DD-EE-FF"]);
        assert_eq!(windows("ip ::1 and fe80::1"), ["::1", "fe80::1"]);
    }

    #[test]
    fn swar_skip_finds_every_trigger() {
        // Every byte value at every offset of a word, against the table.
        for b in 0..=255u8 {
            for at in 0..20 {
                let mut v = vec![b'a'; 20];
                v[at] = b;
                let want = (CLASS[usize::from(b)] & TRIGGER != 0).then_some(at);
                assert_eq!(next_trigger(&v, 0), want, "byte {b:#x} at {at}");
                assert_eq!(
                    next_trigger(&v, at.min(19)),
                    want.filter(|&w| w >= at.min(19))
                );
            }
        }
    }

    #[test]
    fn window_counts() {
        let text = "x 10.0.0.1:80 y";
        let mut ws = Vec::new();
        for_each_window(text, |_, _| true, |w| ws.push(*w));
        assert_eq!(ws.len(), 1);
        let w = ws[0];
        assert_eq!((w.digits, w.dots, w.colons, w.len()), (7, 3, 1, 11));
        assert_eq!((w.max_run, w.zero_groups, w.double_colon), (2, 2, false));
        let mut ws = Vec::new();
        for_each_window("(020) 7946 0958 fe80::1", |_, _| true, |w| ws.push(*w));
        assert_eq!((ws[0].spaces, ws[0].parens, ws[0].max_run), (2, 2, 4));
        assert!(ws[1].double_colon);
    }

    #[test]
    fn every_secret_start_is_seen_by_the_quick_check() {
        let secrets = &crate::pii::patterns::patterns().secrets;
        let starts = [
            "sk-",
            "sk_",
            "rk_",
            "ghp_",
            "gho_",
            "ghu_",
            "ghs_",
            "ghr_",
            "github_pat_",
            "AKIA",
            "ASIA",
            "eyJ",
            "-----BEGIN",
            "://",
        ];
        let tails = [
            "",
            "x",
            "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEf",
            ".ab.cd",
        ];
        for start in starts {
            for tail in tails {
                for head in ["", " ", "x", "a-b "] {
                    let text = format!("{head}{start}{tail}");
                    assert!(may_hold_secret(text.as_bytes()), "{text}");
                }
            }
        }
        // Random texts over the literals' bytes: a regex match implies a hit.
        let alphabet = b"skrgh_ipatubAKISJey-BEGIN:/. 0123456789";
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            let mut text = Vec::new();
            for _ in 0..40 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                text.push(alphabet[(x % alphabet.len() as u64) as usize]);
            }
            let text = String::from_utf8(text).unwrap();
            if secrets.is_match(&text) {
                assert!(may_hold_secret(text.as_bytes()), "{text}");
            }
        }
        assert!(!may_hold_secret(b"Where is order A-1? Ask Jo: at 10."));
        assert!(!may_hold_secret(b""));
    }

    #[test]
    fn windows_stay_on_char_boundaries() {
        let text = "é4111 1111é 😀12:34😀";
        for_each_window(
            text,
            |_, _| true,
            |w| {
                assert!(text.is_char_boundary(w.start) && text.is_char_boundary(w.end));
            },
        );
    }
}
