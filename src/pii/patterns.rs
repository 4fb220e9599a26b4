//! The built-in patterns and the checks that turn a pattern match into a
//! detection (context boundaries, checksums, format consistency).
//!
//! The regex crate has no look-around, so the patterns are deliberately
//! loose and every match goes through a `check_*` function that looks at the
//! surrounding bytes of the *whole* text. A check returns either the accepted
//! range (possibly trimmed) or the position to resume the search from.

use std::{ops::Range, sync::OnceLock};

use regex::Regex;

use super::{url, validate};

/// Outcome of a check: the accepted range, or where to search again.
pub(crate) type Checked = Result<Range<usize>, usize>;

/// The compiled built-in regexes, shared by every engine.
#[derive(Debug)]
pub(crate) struct Patterns {
    pub(crate) email: Regex,
    pub(crate) ipv4: Regex,
    pub(crate) ipv6: Regex,
    pub(crate) mac: Regex,
    pub(crate) ssn: Regex,
    pub(crate) card: Regex,
    pub(crate) iban: Regex,
    pub(crate) mac_dotted: Regex,
    pub(crate) phone_intl: Regex,
    pub(crate) phone_dialled: Regex,
    pub(crate) phone_nanp: Regex,
    pub(crate) phone_national: Regex,
    /// All literal-prefixed secrets in one regex, and the `://` of URLs, so
    /// the text is searched once
    /// (the regex crate finds the literal prefixes with a SIMD prefilter).
    pub(crate) secrets: Regex,
    /// The end line of a PEM private-key block, anchored at its start.
    pub(crate) pem_end: Regex,
}

/// Returns the process-wide compiled patterns (compiled on first use).
pub(crate) fn patterns() -> &'static Patterns {
    static PATTERNS: OnceLock<Patterns> = OnceLock::new();
    PATTERNS.get_or_init(|| {
        let re = |p: &str| Regex::new(p).expect("built-in PII pattern compiles");
        Patterns {
            email: re(
                r"[A-Za-z0-9._%+'\-\p{Latin}\p{Greek}\p{Cyrillic}]+@(?:[A-Za-z0-9\-]+\.)+[A-Za-z]{2,24}",
            ),
            ipv4: re(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}"),
            ipv6: re(
                r"[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,8}(?:\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3})?",
            ),
            mac: re(r"[0-9A-Fa-f]{2}[:\-][0-9A-Fa-f]{2}(?:[:\-][0-9A-Fa-f]{2}){4}"),
            mac_dotted: re(r"[0-9A-Fa-f]{4}\.[0-9A-Fa-f]{4}\.[0-9A-Fa-f]{4}"),
            ssn: re(r"[0-9]{3}-[0-9]{2}-[0-9]{4}"),
            card: re(r"[0-9]{13,19}|[0-9]{4}(?:[ \-][0-9]{3,6}){2,4}"),
            iban: re(r"[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?"),
            phone_intl: re(r"\+[0-9]{1,3}(?:[ .\-]?(?:\([0-9]{1,4}\)|[0-9]{1,12})){1,6}"),
            phone_dialled: re(r"00[1-9][0-9]{0,2}(?:[ .\-][0-9]{1,12}){1,6}"),
            phone_nanp: re(
                r"(?:1[ .\-])?(?:\([2-9][0-9]{2}\) ?|[2-9][0-9]{2}[ .\-])[2-9][0-9]{2}[ .\-][0-9]{4}",
            ),
            phone_national: re(concat!(
                r"(?:\(0[1-9][0-9]{0,4}(?: [0-9]{1,2})?\) ?|0[1-9][0-9]{0,4}[ .\-/]",
                r"|8 ?\([0-9]{3,5}\) ?|8[ \-][0-9]{3,5}[ \-]|\([1-9][0-9]\) ?)",
                r"[0-9]{2,10}(?:[ .\-][0-9]{2,8}){0,3}",
                r"|1[3-9][0-9][ \-][0-9]{4}[ \-][0-9]{4}",
            )),
            secrets: re(concat!(
                r"(?-u:\b)(?:",
                r"sk-[A-Za-z0-9_\-]{20,}",
                r"|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}",
                r"|gh[pousr]_[A-Za-z0-9]{36,}(?-u:\b)",
                r"|github_pat_[A-Za-z0-9_]{22,}",
                r"|A(?:KIA|SIA)[A-Z0-9]{16}(?-u:\b)",
                r"|eyJ[A-Za-z0-9_\-]{7,}\.[A-Za-z0-9_\-]{2,}\.[A-Za-z0-9_\-]*",
                r")",
                r"|-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----",
                // A URL, for the credentials inside it.
                r"|://",
            )),
            pem_end: re(r"\A-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"),
        }
    })
}

// ---------------------------------------------------------------------------
// Context helpers.

#[inline]
pub(super) fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The byte `k` positions before `i` (`k >= 1`).
#[inline]
pub(super) fn before(t: &[u8], i: usize, k: usize) -> Option<u8> {
    i.checked_sub(k).map(|j| t[j])
}

/// The byte `k` positions after the end `e` (`k = 0` is the byte at `e`).
#[inline]
pub(super) fn after(t: &[u8], e: usize, k: usize) -> Option<u8> {
    t.get(e + k).copied()
}

/// The match starting at `start` is not the tail of a longer token: the
/// previous byte is not a word byte, nor one of `seps` glued to an
/// alphanumeric (`ORD-123-45-6789`, `1.2.3.4.5`).
fn left_free(t: &[u8], start: usize, seps: &[u8]) -> bool {
    match before(t, start, 1) {
        None => true,
        Some(p) if is_word(p) => false,
        Some(p) if seps.contains(&p) => {
            !before(t, start, 2).is_some_and(|q| q.is_ascii_alphanumeric())
        }
        Some(_) => true,
    }
}

/// Mirror of [`left_free`] for the byte after the match.
fn right_free(t: &[u8], end: usize, seps: &[u8]) -> bool {
    match after(t, end, 0) {
        None => true,
        Some(n) if is_word(n) => false,
        Some(n) if seps.contains(&n) => {
            !after(t, end, 1).is_some_and(|q| q.is_ascii_alphanumeric())
        }
        Some(_) => true,
    }
}

/// Where to search again after rejecting a match at `start` because the byte
/// before it is a word byte: past the end of that word, since every match
/// starting inside it would be glued to a word byte too.
fn past_word(t: &[u8], start: usize) -> usize {
    start + 1 + t[start + 1..].iter().take_while(|&&b| is_word(b)).count()
}

/// Counts the ASCII digits of `s`.
pub(super) fn digits(s: &[u8]) -> usize {
    s.iter().filter(|b| b.is_ascii_digit()).count()
}

/// The separators (non-digit, non-paren bytes) of a grouped number, if they
/// are all the same byte. `Ok(None)` when there is no separator at all.
pub(super) fn uniform_separator(s: &[u8]) -> Result<Option<u8>, ()> {
    let mut sep = None;
    for &b in s {
        if b.is_ascii_digit() || matches!(b, b'(' | b')' | b'+') {
            continue;
        }
        match sep {
            None => sep = Some(b),
            Some(x) if x == b => {}
            Some(_) => return Err(()),
        }
    }
    Ok(sep)
}

// ---------------------------------------------------------------------------
// Checks, one per kind.

/// File extensions that look like top-level domains in `icon@2x.png`.
const FILE_EXTENSIONS: &[&str] = &[
    "png", "jpg", "jpeg", "gif", "svg", "webp", "bmp", "ico", "tif", "tiff", "avif", "heic",
];

pub(crate) fn check_email(text: &str, r: Range<usize>) -> Checked {
    let t = text.as_bytes();
    let at = r.start + text[r.clone()].find('@').expect("pattern contains @");
    let retry = at + 1;
    let mut start = r.start;
    while matches!(t[start], b'.' | b'\'') {
        start += 1;
    }
    if start >= at || text[start..at].chars().count() > 64 {
        return Err(retry);
    }
    if after(t, r.end, 0).is_some_and(|n| is_word(n) || n == b'-' || n == b'@') {
        return Err(retry);
    }
    // `https://token@github.com/…`, `postgres://app:pw@db/…`: the userinfo
    // of a URL, credentials rather than an address.
    if url::in_userinfo(t, start) {
        return Err(retry);
    }
    // `git@github.com:org/repo.git`: an SSH target.
    if after(t, r.end, 0) == Some(b':')
        && after(t, r.end, 1).is_some_and(|b| b.is_ascii_alphanumeric() || b == b'/' || b == b'~')
    {
        return Err(retry);
    }
    let tld = text[..r.end].rsplit('.').next().unwrap_or_default();
    if FILE_EXTENSIONS.iter().any(|e| e.eq_ignore_ascii_case(tld)) {
        return Err(retry);
    }
    Ok(start..r.end)
}

/// Words that, right before a dotted quad, make it a version number.
const VERSION_WORDS: &[&str] = &["ver", "version", "build", "release", "firmware"];

pub(crate) fn check_ipv4(text: &str, r: Range<usize>) -> Checked {
    let t = text.as_bytes();
    let retry = r.start + 1;
    if !validate::ipv4(&text[r.clone()])
        || !left_free(t, r.start, b".")
        || !right_free(t, r.end, b".")
    {
        return Err(retry);
    }
    // `version 10.2.0.1`, `build 4.2.1.9`: a version, not an address.
    if before(t, r.start, 1) == Some(b' ') {
        let head = &text[..r.start - 1];
        let word = head
            .rsplit(|c: char| !c.is_ascii_alphabetic())
            .next()
            .unwrap_or_default();
        if VERSION_WORDS.iter().any(|w| w.eq_ignore_ascii_case(word)) {
            return Err(retry);
        }
    }
    Ok(r)
}

pub(crate) fn check_ipv6(text: &str, r: Range<usize>) -> Checked {
    let t = text.as_bytes();
    let retry = r.start + 1;
    let mut end = r.end;
    // A colon that ends a sentence or a label (`… fe80::1: up`).
    if t[end - 1] == b':' && t[end - 2] != b':' {
        end -= 1;
    }
    let s = &text[r.start..end];
    if s.bytes().filter(|&b| b == b':').count() < 2 || !s.bytes().any(|b| b.is_ascii_digit()) {
        return Err(retry);
    }
    if s.parse::<std::net::Ipv6Addr>().is_err() {
        return Err(retry);
    }
    let left_ok = match before(t, r.start, 1) {
        None => true,
        Some(p) if is_word(p) || p == b'.' => false,
        Some(b':') => !before(t, r.start, 2).is_some_and(|q| q.is_ascii_hexdigit() || q == b':'),
        Some(_) => true,
    };
    let right_ok = match after(t, end, 0) {
        None => true,
        Some(n) if is_word(n) => false,
        Some(b'.') => !after(t, end, 1).is_some_and(|q| q.is_ascii_digit()),
        Some(b':') => !after(t, end, 1).is_some_and(|q| q.is_ascii_hexdigit() || q == b':'),
        Some(_) => true,
    };
    if left_ok && right_ok {
        Ok(r.start..end)
    } else {
        Err(retry)
    }
}

pub(crate) fn check_mac(text: &str, r: Range<usize>) -> Checked {
    let t = text.as_bytes();
    let s = &t[r.clone()];
    let sep = s[2];
    let consistent = s.iter().skip(2).step_by(3).all(|&b| b == sep);
    let left_ok = match before(t, r.start, 1) {
        None => true,
        Some(p) if is_word(p) => false,
        Some(p) if p == sep => !before(t, r.start, 2).is_some_and(|q| q.is_ascii_hexdigit()),
        Some(_) => true,
    };
    let right_ok = match after(t, r.end, 0) {
        None => true,
        Some(n) if is_word(n) => false,
        Some(n) if n == sep => !after(t, r.end, 1).is_some_and(|q| q.is_ascii_hexdigit()),
        Some(_) => true,
    };
    if consistent && left_ok && right_ok {
        Ok(r)
    } else {
        Err(r.start + 1)
    }
}

/// The dotted notation `aabb.ccdd.eeff`: free on both sides, and with a
/// digit and a letter among its hex digits (all-decimal groups are lot and
/// version numbers, all-letter groups are words: `face.bead.cafe`).
pub(crate) fn check_mac_dotted(text: &str, r: Range<usize>) -> Checked {
    let t = text.as_bytes();
    let s = &t[r.clone()];
    let mixed = s.iter().any(u8::is_ascii_digit) && s.iter().any(u8::is_ascii_alphabetic);
    if mixed && left_free(t, r.start, b".:-") && right_free(t, r.end, b".:-") {
        Ok(r)
    } else {
        Err(r.start + 1)
    }
}

pub(crate) fn check_ssn(text: &str, r: Range<usize>) -> Checked {
    let t = text.as_bytes();
    let s = &t[r.clone()];
    if validate::ssn(&s[..3], &s[4..6], &s[7..])
        && left_free(t, r.start, b"-./")
        && right_free(t, r.end, b"-./")
    {
        Ok(r)
    } else {
        Err(r.start + 1)
    }
}

pub(crate) fn check_card(text: &str, r: Range<usize>) -> Checked {
    let t = text.as_bytes();
    let s = &t[r.clone()];
    let retry = r.start + 1;
    if before(t, r.start, 1).is_some_and(is_word) || after(t, r.end, 0).is_some_and(is_word) {
        // A digit run glued to letters or longer than a card: skip it.
        return Err(past_word(t, r.start));
    }
    let Ok(sep) = uniform_separator(s) else {
        return Err(retry);
    };
    let n = digits(s);
    if !validate::card_shape(s, n) || !validate::luhn(&text[r.clone()]) {
        return Err(retry);
    }
    if s.iter().filter(|b| b.is_ascii_digit()).all(|&b| b == s[0]) {
        return Err(retry);
    }
    if let Some(sep) = sep {
        // Not a slice of a longer grouped number (tracking numbers, ids).
        let glued_left = before(t, r.start, 1) == Some(sep)
            && before(t, r.start, 2).is_some_and(|b| b.is_ascii_digit());
        let run_right = t[r.end.min(t.len())..]
            .iter()
            .skip(1)
            .take_while(|b| b.is_ascii_digit())
            .count();
        let glued_right = after(t, r.end, 0) == Some(sep) && run_right >= 3;
        if glued_left || glued_right {
            return Err(retry);
        }
    }
    Ok(r)
}

pub(crate) fn check_iban(text: &str, r: Range<usize>) -> Checked {
    let t = text.as_bytes();
    let retry = r.start + 1;
    if before(t, r.start, 1).is_some_and(is_word) {
        return Err(past_word(t, r.start));
    }
    let Some(len) = validate::iban_length(&t[r.start..r.start + 2]) else {
        return Err(retry);
    };
    // Find where the country's length ends; the pattern may have taken a
    // trailing capitalised word (`BE68 5390 0754 7034 EUR`).
    let mut compact = [0u8; 34];
    let mut n = 0;
    let mut end = r.start;
    for (i, &b) in t[r.clone()].iter().enumerate() {
        if b == b' ' {
            continue;
        }
        if n == len {
            break;
        }
        if n < compact.len() {
            compact[n] = b;
        }
        n += 1;
        end = r.start + i + 1;
    }
    if n < len || len > compact.len() || !validate::iban(&compact[..len]) {
        return Err(retry);
    }
    let next = after(t, end, 0);
    let trimmed = end < r.end;
    if next.is_some_and(|b| b.is_ascii_alphanumeric()) || (trimmed && next != Some(b' ')) {
        return Err(retry);
    }
    Ok(r.start..end)
}

/// Which secret a match of [`Patterns::secrets`] is, from its first bytes.
pub(crate) fn secret_kind(m: &[u8]) -> SecretKind {
    match m {
        [b'-', ..] => SecretKind::PrivateKey,
        [b':', ..] => SecretKind::Url,
        [b'e', ..] => SecretKind::Jwt,
        [b'A', ..] => SecretKind::Aws,
        [b'g', ..] => SecretKind::Github,
        _ => SecretKind::ApiKey,
    }
}

/// The kinds matched by [`Patterns::secrets`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SecretKind {
    ApiKey,
    Github,
    Aws,
    Jwt,
    PrivateKey,
    /// The `://` of a URL.
    Url,
}

/// Accepts a random token (AWS, GitHub, API key) unless it is a documentation
/// placeholder: a run of 6 identical characters (`sk-XXXXXX…`,
/// `ghp_xxxxxx…`), which a random key of this length essentially never has
/// (probability below 1e-7).
pub(crate) fn check_token(text: &str, r: Range<usize>) -> Option<Range<usize>> {
    let s = &text.as_bytes()[r.clone()];
    let mut run = 1;
    for w in s.windows(2) {
        run = if w[0] == w[1] { run + 1 } else { 1 };
        if run >= 6 {
            return None;
        }
    }
    Some(r)
}

/// An `sk-` style key: a random token with some digit or capital letter
/// after the prefix, which keeps slugs such as `sk-learn-is-a-python-library`
/// out.
pub(crate) fn check_api_key(text: &str, r: Range<usize>) -> Option<Range<usize>> {
    let body = &text.as_bytes()[r.start + 3..r.end];
    if body
        .iter()
        .any(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
    {
        check_token(text, r)
    } else {
        None
    }
}

/// Whether `body` holds key material: a run of at least 20 base64 bytes.
/// Keeps prose about PEM files and `...redacted...` examples out.
fn has_key_material(body: &[u8]) -> bool {
    body.split(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=')))
        .any(|run| run.len() >= 20)
}

/// Extends a PEM private-key header match to the whole block; `None` when
/// there is no key material after the header.
///
/// `next_end` is the position of the first `-----END` after the header and
/// `limit` that of the next `-----BEGIN` (or the text length): a block never
/// spans another header, so the bodies of successive headers are disjoint
/// and scanning them all is linear in the text.
pub(crate) fn pem_block(
    text: &str,
    header: Range<usize>,
    pem_end: &Regex,
    next_end: Option<usize>,
    limit: usize,
) -> Option<Range<usize>> {
    let block = pem_extent(text, header.clone(), pem_end, next_end, limit);
    has_key_material(&text.as_bytes()[header.end..block.end]).then_some(block)
}

fn pem_extent(
    text: &str,
    header: Range<usize>,
    pem_end: &Regex,
    next_end: Option<usize>,
    limit: usize,
) -> Range<usize> {
    if let Some(k) = next_end.filter(|&k| k < limit) {
        if let Some(m) = pem_end.find(&text[k..]) {
            return header.start..k + m.end();
        }
    }
    // Truncated block: take the base64 lines that follow the header.
    let t = &text.as_bytes()[..limit];
    let mut end = header.end;
    let is_b64 = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'\\');
    loop {
        let mut i = end;
        while i < t.len() && matches!(t[i], b'\r' | b'\n') && i - end < 2 {
            i += 1;
        }
        if i == end {
            // Base64 glued to the header (JSON-escaped `\n…`) or nothing.
            let run = t[i..].iter().take_while(|b| is_b64(b)).count();
            return header.start..i + run;
        }
        let line = t[i..].iter().take_while(|b| is_b64(b)).count();
        let ends_line = t.get(i + line).is_none_or(|b| matches!(b, b'\r' | b'\n'));
        if line == 0 || !ends_line || (line < 20 && t[i + line - 1] != b'=') {
            return header.start..end;
        }
        end = i + line;
    }
}

#[cfg(test)]
#[path = "patterns_tests.rs"]
mod tests;
