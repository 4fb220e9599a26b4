//! What the detector's one pass over a text also notes of its bytes: the
//! signs that the folded view (leetspeak, spaced-out letters) or the payload
//! decoder (base64 and hex runs, percent escapes) has anything to find.
//! [`Signs::byte`] is fed each byte by the literal pass of the
//! [`Matcher`](super::matcher::Matcher), so these checks cost no second scan.

use super::matcher::ByteWatch;

/// The shortest run of base64 or hex characters worth decoding.
pub(crate) const MIN_RUN: usize = 16;

/// Byte classes.
const ALPHA: u8 = 1;
const ALNUM: u8 = 2;
const LEET: u8 = 4;
const SEPARATOR: u8 = 8;
const BASE64: u8 = 16;
const PERCENT: u8 = 32;

/// The letter a leetspeak character stands for.
pub(crate) const fn leet(b: u8) -> Option<u8> {
    Some(match b {
        b'0' => b'o',
        b'1' | b'!' | b'|' => b'i',
        b'3' => b'e',
        b'4' | b'@' => b'a',
        b'5' | b'$' => b's',
        b'7' | b'+' => b't',
        b'8' => b'b',
        b'9' => b'g',
        _ => return None,
    })
}

/// Whether `b` is in the base64 alphabet (standard or URL-safe) or `=`.
pub(crate) const fn is_base64(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_' | b'=')
}

static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        let mut c = 0;
        if b.is_ascii_alphabetic() {
            c |= ALPHA | ALNUM;
        }
        if b.is_ascii_digit() {
            c |= ALNUM;
        }
        if leet(b).is_some() {
            c |= LEET;
        }
        if matches!(b, b' ' | b'.' | b'-' | b'_' | b'*') {
            c |= SEPARATOR;
        }
        if is_base64(b) {
            c |= BASE64;
        }
        if b == b'%' {
            c |= PERCENT;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// The signs seen so far in a text, byte by byte.
#[derive(Debug, Default)]
pub(crate) struct Signs {
    /// The classes of the last three bytes: the oldest in bits 16..24.
    window: u32,
    /// Letters in a row with a separator on both sides (`i g n o`), not
    /// broken by a letter or digit that is not.
    isolated: u32,
    obfuscated: bool,
    /// Base64-alphabet bytes in a row, and whether a run reached
    /// [`MIN_RUN`].
    run: u32,
    long_run: bool,
    percents: u32,
}

impl ByteWatch for Signs {
    #[inline(always)]
    fn byte(&mut self, b: u8) {
        let c = CLASS[usize::from(b)];
        self.window = (self.window << 8 | u32::from(c)) & 0x00FF_FFFF;
        // The middle byte of the window, between its neighbours.
        let before = self.window >> 16;
        let mid = (self.window >> 8) & 0xFF;
        let after = u32::from(c);
        let both = |class: u8| (before & after & u32::from(class)) != 0;
        // A leet character between letters, as in `1gn0re`.
        let leet_between = mid & u32::from(LEET) != 0 && both(ALPHA);
        // A letter with a separator on both sides, as in `a.b.c`.
        let isolated = mid & u32::from(ALPHA) != 0 && both(SEPARATOR);
        if isolated {
            self.isolated += 1;
        } else if mid & u32::from(ALNUM) != 0 {
            self.isolated = 0;
        }
        self.obfuscated |= leet_between | (self.isolated >= 4);

        self.run = if c & BASE64 != 0 { self.run + 1 } else { 0 };
        self.long_run |= self.run as usize >= MIN_RUN;
        self.percents += u32::from(c & PERCENT != 0);
    }
}

impl Signs {
    /// Whether the text shows leetspeak (a leet character between letters,
    /// as in `1gn0re`) or spaced-out letters (`i g n o r e`, `i.g.n.o.r.e`):
    /// the signs that the folded view is worth building.
    pub(crate) fn obfuscated(&self) -> bool {
        self.obfuscated
    }

    /// Whether the text holds a run of base64 or hex characters long enough
    /// to decode.
    pub(crate) fn long_run(&self) -> bool {
        self.long_run
    }

    /// How many `%` the text holds (percent escapes are at most as many).
    pub(crate) fn percents(&self) -> usize {
        self.percents as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signs(text: &str) -> Signs {
        let mut s = Signs::default();
        for &b in text.as_bytes() {
            s.byte(b);
        }
        s
    }

    /// The obfuscation check written as a plain scan, for comparison.
    fn looks_obfuscated(text: &str) -> bool {
        let b = text.as_bytes();
        let Some((&first, rest)) = b.split_first() else {
            return false;
        };
        let mut prev = CLASS[usize::from(first)];
        let mut isolated_run = 0u32;
        for (i, &byte) in rest.iter().enumerate() {
            let Some(&after) = rest.get(i + 1) else { break };
            let cur = CLASS[usize::from(byte)];
            if cur & (ALNUM | LEET) != 0 {
                let next = CLASS[usize::from(after)];
                if cur & LEET != 0 && prev & ALPHA != 0 && next & ALPHA != 0 {
                    return true;
                }
                if cur & ALPHA != 0 && prev & SEPARATOR != 0 && next & SEPARATOR != 0 {
                    isolated_run += 1;
                    if isolated_run >= 4 {
                        return true;
                    }
                } else if cur & ALNUM != 0 {
                    isolated_run = 0;
                }
            }
            prev = cur;
        }
        false
    }

    #[test]
    fn leet_and_spacing_are_seen() {
        assert!(signs("1gn0r3 all pr3v10us").obfuscated());
        assert!(signs("i g n o r e this").obfuscated());
        assert!(signs("i.g.n.o.r.e").obfuscated());
        assert!(!signs("Meet me at 10 am in room 4b.").obfuscated());
        assert!(!signs("a b c").obfuscated());
        assert!(!signs("").obfuscated());
    }

    #[test]
    fn the_signs_agree_with_a_plain_scan_on_random_texts() {
        // A small xorshift: the texts are random but the same every run.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        const ALPHABET: &[u8] = b"ab ign0r3.-_*4!|$+%=/xyz1 \n";
        for _ in 0..20_000 {
            let len = (next() % 40) as usize;
            let text: String = (0..len)
                .map(|_| char::from(ALPHABET[(next() % ALPHABET.len() as u64) as usize]))
                .collect();
            let s = signs(&text);
            assert_eq!(s.obfuscated(), looks_obfuscated(&text), "{text:?}");
            let longest = text
                .as_bytes()
                .split(|b| !is_base64(*b))
                .map(<[u8]>::len)
                .max()
                .unwrap_or(0);
            assert_eq!(s.long_run(), longest >= MIN_RUN, "{text:?}");
            assert_eq!(s.percents(), text.matches('%').count(), "{text:?}");
        }
    }

    #[test]
    fn base64_runs_and_percents_are_counted() {
        let s = signs("x aWdub3JlIGFsbCBwcmV2aW91cw== y");
        assert!(s.long_run());
        assert!(!signs("short words only, nothing long here").long_run());
        assert_eq!(signs("a%20b%20c%2").percents(), 3);
    }
}
