//! JSON Web Tokens by their header: the first segment must decode
//! (base64url, RFC 7515) to a JSON object naming an `alg`.

use std::{borrow::Cow, ops::Range};

use serde::Deserialize;

/// The longest header decoded; certificate chains (`x5c`) make headers of
/// a few kilobytes.
const MAX_HEADER: usize = 16 << 10;

/// What a JOSE header must carry.
#[derive(Deserialize)]
struct Header<'a> {
    #[serde(borrow)]
    alg: Cow<'a, str>,
}

/// The value of one base64url character, if it is one.
fn sextet(b: u8) -> Option<u32> {
    Some(u32::from(match b {
        b'A'..=b'Z' => b - b'A',
        b'a'..=b'z' => b - b'a' + 26,
        b'0'..=b'9' => b - b'0' + 52,
        b'-' => 62,
        b'_' => 63,
        _ => return None,
    }))
}

/// Decodes unpadded base64url; `None` for a length no encoding has or a
/// byte outside the alphabet.
fn decode(s: &[u8]) -> Option<Vec<u8>> {
    if s.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3 + 2);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in s {
        acc = (acc << 6) | sextet(b)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// Accepts a match of the JWT pattern when its header names an `alg` (a
/// non-empty string): `eyJ…` that is base64 of some other JSON, or no JSON at all, is
/// not a token.
pub(crate) fn check_jwt(text: &str, r: Range<usize>) -> Option<Range<usize>> {
    let s = &text.as_bytes()[r.clone()];
    let dot = s.iter().position(|&b| b == b'.')?;
    if dot > MAX_HEADER / 3 * 4 {
        return None;
    }
    let header = decode(&s[..dot])?;
    let header: Header<'_> = serde_json::from_slice(&header).ok()?;
    (!header.alg.is_empty()).then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(token: &str) -> bool {
        check_jwt(token, 0..token.len()).is_some()
    }

    #[test]
    fn decodes_base64url() {
        assert_eq!(
            decode(b"eyJhbGciOiJIUzI1NiJ9").unwrap(),
            br#"{"alg":"HS256"}"#
        );
        assert_eq!(decode(b"").unwrap(), b"");
        assert_eq!(decode(b"_-8").unwrap(), [0xff, 0xef]);
        assert!(decode(b"abcde").is_none());
        assert!(decode(b"ab+/").is_none());
    }

    #[test]
    fn the_header_must_name_an_alg() {
        // {"alg":"HS256","typ":"JWT"}, {"alg":"none"}
        assert!(check(
            "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxIn0.c2ln"
        ));
        assert!(check("eyJhbGciOiJub25lIn0.eyJzdWIiOiIxIn0."));
        // {"typ":"JWT"}, {"alg":256}, and `{"al g":"HS256"` cut short.
        assert!(!check("eyJ0eXAiOiJKV1QifQ.eyJzdWIiOiIxIn0.c2ln"));
        assert!(!check("eyJhbGciOjI1Nn0.eyJzdWIiOiIxIn0.c2ln"));
        assert!(!check("eyJhbCBnIjoiSFMyNTYi.e30.c2ln"));
    }
}
