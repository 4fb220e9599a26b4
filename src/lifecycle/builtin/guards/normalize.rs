//! Text normalisation before matching: NFKC, invisible characters removed,
//! confusable letters folded to the ASCII letters they imitate; and the
//! folded view that undoes leetspeak and spacing tricks (whether a text
//! shows them is one of the [`Signs`](super::signs::Signs)).

use std::borrow::Cow;

use unicode_normalization::{IsNormalized, UnicodeNormalization};
use unicode_security::confusable_detection::skeleton;

use super::signs::leet;

/// A text after normalisation, with what was changed on the way.
#[derive(Debug)]
pub(crate) struct Normalized<'a> {
    /// NFKC, without invisible characters, confusables folded.
    pub(crate) text: Cow<'a, str>,
    /// How many invisible (zero-width, bidi, format) characters were removed.
    pub(crate) invisible: usize,
    /// How many letters were folded from another script.
    pub(crate) confusables: usize,
}

/// Zero-width, bidi and other format characters an attacker hides inside
/// words (and the soft hyphen).
fn is_invisible(c: char) -> bool {
    // By the block of 256 the character is in first: one jump for most
    // characters, where one test of every range costs a hundred.
    let u = u32::from(c);
    match u >> 8 {
        0x00 => u == 0xAD,
        0x03 => u == 0x34F,
        0x06 => u == 0x61C,
        0x11 => matches!(u, 0x115F | 0x1160),
        0x17 => matches!(u, 0x17B4 | 0x17B5),
        0x18 => matches!(u, 0x180B..=0x180F),
        0x20 => matches!(u, 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x206F),
        0x31 => u == 0x3164,
        0xFE => matches!(u, 0xFE00..=0xFE0F | 0xFEFF),
        0xFF => u == 0xFFA0,
        0xE00 => matches!(u, 0xE0000..=0xE007F),
        _ => false,
    }
}

/// Whether `c` could stand in for an ASCII letter: letters of other
/// scripts that confusable tables fold (Cyrillic, Greek, Armenian,
/// Cherokee, mathematical letters left after NFKC). CJK is never folded.
fn may_fold(c: char) -> bool {
    let u = u32::from(c);
    match u >> 8 {
        0x03..=0x05 => matches!(u, 0x370..=0x58F),
        0x13 => matches!(u, 0x13A0..=0x13FF),
        0x1D => matches!(u, 0x1D00..=0x1DBF),
        0x21 => matches!(u, 0x2100..=0x214F),
        0xA6 => matches!(u, 0xA640..=0xA69F),
        0xAB => matches!(u, 0xAB70..=0xABBF),
        _ => false,
    }
}

/// The ASCII letter `c` imitates, by the UTS #39 confusable skeleton, if it
/// imitates exactly one.
fn fold_confusable(c: char) -> Option<char> {
    let mut buf = [0u8; 4];
    let mut sk = skeleton(c.encode_utf8(&mut buf));
    match (sk.next(), sk.next()) {
        (Some(a), None) if a.is_ascii_alphabetic() => Some(a),
        _ => None,
    }
}

/// Normalises `text`: an ASCII text comes back borrowed, unchanged.
pub(crate) fn normalize(text: &str) -> Normalized<'_> {
    if text.is_ascii() {
        return Normalized {
            text: Cow::Borrowed(text),
            invisible: 0,
            confusables: 0,
        };
    }
    // Most non-ASCII text (accented letters, CJK) is already NFKC and has
    // nothing to remove or fold: borrow it, as the loop below would return it.
    // (ASCII characters are NFKC, start no sequence and fold nothing: only
    // the others are looked at. Leaving them out can only make the quick
    // check less sure, never wrongly sure.)
    // One pass for both checks: the quick check reads every character
    // when it answers yes, so `suspect` is complete then.
    let mut suspect = false;
    let others = text
        .chars()
        .filter(|c| !c.is_ascii())
        .inspect(|&c| suspect |= is_invisible(c) || may_fold(c));
    if unicode_normalization::is_nfkc_quick(others) == IsNormalized::Yes && !suspect {
        return Normalized {
            text: Cow::Borrowed(text),
            invisible: 0,
            confusables: 0,
        };
    }
    let mut invisible = text.chars().filter(|&c| is_invisible(c)).count();
    let mut confusables = 0;
    let mut out = String::with_capacity(text.len());
    for c in text.chars().filter(|&c| !is_invisible(c)).nfkc() {
        if is_invisible(c) {
            invisible += 1;
            continue;
        }
        if may_fold(c) {
            if let Some(a) = fold_confusable(c) {
                confusables += 1;
                out.push(a);
                continue;
            }
        }
        out.push(c);
    }
    Normalized {
        text: Cow::Owned(out),
        invisible,
        confusables,
    }
}

/// The folded view: letters only, lower case, leetspeak undone. Spaces and
/// punctuation vanish, so `I g-n-0 r e  a l l` reads `ignoreall`.
pub(crate) fn fold(text: &str) -> String {
    let b = text.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let byte = b[i];
        if byte.is_ascii() {
            if byte.is_ascii_alphabetic() {
                out.push(byte.to_ascii_lowercase());
            } else if let Some(l) = leet(byte) {
                // A leet character counts only next to a letter.
                let before = i > 0 && b[i - 1].is_ascii_alphanumeric();
                let after = b.get(i + 1).is_some_and(|n| n.is_ascii_alphanumeric());
                if before || after {
                    out.push(l);
                }
            }
            i += 1;
            continue;
        }
        let c = text[i..].chars().next().expect("a character starts here");
        if c.is_alphabetic() {
            let mut buf = [0u8; 4];
            for l in c.to_lowercase() {
                out.extend_from_slice(l.encode_utf8(&mut buf).as_bytes());
            }
        }
        i += c.len_utf8();
    }
    String::from_utf8(out).expect("whole characters only")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_is_borrowed_unchanged() {
        let n = normalize("ignore me");
        assert!(matches!(n.text, Cow::Borrowed("ignore me")));
    }

    #[test]
    fn invisible_characters_are_removed_and_counted() {
        let n = normalize("ig\u{200B}no\u{200D}re\u{FEFF}");
        assert_eq!(n.text, "ignore");
        assert_eq!(n.invisible, 3);
    }

    #[test]
    fn fullwidth_and_confusables_fold_to_ascii() {
        assert_eq!(normalize("ｉｇｎｏｒｅ").text, "ignore");
        let n = normalize("іgnоrе");
        assert_eq!(n.text, "ignore");
        assert_eq!(n.confusables, 3);
    }

    #[test]
    fn accents_and_cjk_are_kept() {
        assert!(matches!(
            normalize("précédentes 忽略").text,
            Cow::Borrowed("précédentes 忽略")
        ));
        assert_eq!(normalize("pre\u{301}ce\u{301}dentes").text, "précédentes");
    }

    #[test]
    fn the_character_classes_are_the_ranges_they_name() {
        let invisible = |c: char| {
            matches!(c,
                '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
                | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}'
                | '\u{FFA0}' | '\u{E0000}'..='\u{E007F}')
        };
        let foldable = |c: char| {
            matches!(c, '\u{0370}'..='\u{058F}' | '\u{13A0}'..='\u{13FF}' | '\u{1D00}'..='\u{1DBF}'
                | '\u{2100}'..='\u{214F}' | '\u{A640}'..='\u{A69F}' | '\u{AB70}'..='\u{ABBF}')
        };
        for c in (0..=0x10FFFF).filter_map(char::from_u32) {
            assert_eq!(is_invisible(c), invisible(c), "{:X}", u32::from(c));
            assert_eq!(may_fold(c), foldable(c), "{:X}", u32::from(c));
        }
    }

    #[test]
    fn leet_and_spacing_are_folded() {
        assert_eq!(fold("1gn0r3  a-l-l"), "ignoreall");
    }
}
