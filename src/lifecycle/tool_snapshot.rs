//! [`ToolSnapshot`]: what a tool wrap hook was handed (the argument text
//! and the parsed arguments), kept to tell whether it handed on something
//! else.

use std::fmt::Write as _;
use std::io;

use serde_json::{Number, Value};

use super::inline_bytes::{same_bytes, Builder, InlineBytes, Same};

/// What a tool middleware was handed, to compare with what it hands on: the
/// argument text, then the parsed arguments in a tagged binary layout, in
/// one copy that stays inline for short arguments. Equal layouts are equal
/// values; a difference only the layout shows (a key order kept by
/// `preserve_order`, `-0.0` for `0.0`) counts as a change.
///
/// Public only to name it in the wrap chain's sealed plumbing; unreachable
/// outside the crate.
#[allow(unreachable_pub)]
#[derive(Clone, Debug)]
pub struct ToolSnapshot {
    bytes: InlineBytes,
    text_len: usize,
}

const NULL: u8 = 0;
const FALSE: u8 = 1;
const TRUE: u8 = 2;
const UNSIGNED: u8 = 3;
const SIGNED: u8 = 4;
const OTHER_NUMBER: u8 = 5;
const STRING: u8 = 6;
const ARRAY: u8 = 7;
const OBJECT: u8 = 8;

impl ToolSnapshot {
    /// A snapshot of `text` and `args`.
    pub(crate) fn of(text: &str, args: &Value) -> Self {
        let mut bytes = Builder::new();
        bytes.extend(text.as_bytes());
        write_value(&mut bytes, args);
        Self {
            bytes: bytes.finish(),
            text_len: text.len(),
        }
    }

    /// The argument text.
    pub(crate) fn text(&self) -> &[u8] {
        &self.bytes.as_bytes()[..self.text_len]
    }

    /// Whether `args` are the parsed arguments the snapshot holds.
    pub(crate) fn same_args(&self, args: &Value) -> bool {
        let mut rest = &self.bytes.as_bytes()[self.text_len..];
        same_value(args, &mut rest) && rest.is_empty()
    }
}

/// A tag and eight bytes, in one piece.
fn tagged(tag: u8, bytes: [u8; 8]) -> [u8; 9] {
    let mut head = [tag; 9];
    head[1..].copy_from_slice(&bytes);
    head
}

/// A tag and a length.
fn head(tag: u8, len: usize) -> [u8; 9] {
    tagged(tag, (len as u64).to_le_bytes())
}

fn write_text(to: &mut Builder, tag: u8, text: &str) {
    to.extend(&head(tag, text.len()));
    to.extend(text.as_bytes());
}

fn write_value(to: &mut Builder, value: &Value) {
    match value {
        Value::Null => to.extend(&[NULL]),
        Value::Bool(false) => to.extend(&[FALSE]),
        Value::Bool(true) => to.extend(&[TRUE]),
        Value::Number(n) => write_number(to, n),
        Value::String(s) => write_text(to, STRING, s),
        Value::Array(items) => {
            to.extend(&head(ARRAY, items.len()));
            for item in items {
                write_value(to, item);
            }
        }
        Value::Object(map) => {
            to.extend(&head(OBJECT, map.len()));
            for (key, value) in map {
                write_text(to, STRING, key);
                write_value(to, value);
            }
        }
    }
}

fn write_number(to: &mut Builder, n: &Number) {
    if let Some(u) = n.as_u64() {
        to.extend(&tagged(UNSIGNED, u.to_le_bytes()));
    } else if let Some(i) = n.as_i64() {
        to.extend(&tagged(SIGNED, i.to_le_bytes()));
    } else {
        // Floats (and arbitrary-precision numbers) as they print: exact.
        let mut text = String::new();
        let _ = write!(text, "{n}");
        write_text(to, OTHER_NUMBER, &text);
    }
}

/// Takes `n` bytes off the front of `rest`.
#[inline]
fn take<'a>(rest: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (taken, left) = rest.split_at_checked(n)?;
    *rest = left;
    Some(taken)
}

/// Takes a tag and a length.
fn take_head(rest: &mut &[u8], tag: u8) -> Option<usize> {
    let head = take(rest, 9)?;
    if head[0] != tag {
        return None;
    }
    let len = u64::from_le_bytes(head[1..].try_into().ok()?);
    usize::try_from(len).ok()
}

/// Takes nine bytes off the front of `rest` if they are `expected`.
#[inline]
fn same_nine(expected: [u8; 9], rest: &mut &[u8]) -> bool {
    match rest.split_first_chunk::<9>() {
        Some((found, left)) if *found == expected => {
            *rest = left;
            true
        }
        _ => false,
    }
}

#[inline]
fn same_text(text: &str, tag: u8, rest: &mut &[u8]) -> bool {
    same_nine(head(tag, text.len()), rest)
        && take(rest, text.len()).is_some_and(|bytes| same_bytes(bytes, text.as_bytes()))
}

/// Whether `value` is the value at the front of `rest`, which it consumes.
fn same_value(value: &Value, rest: &mut &[u8]) -> bool {
    match value {
        Value::Array(items) => {
            same_nine(head(ARRAY, items.len()), rest)
                && items.iter().all(|item| same_item(item, rest))
        }
        Value::Object(map) => {
            same_nine(head(OBJECT, map.len()), rest)
                && map
                    .iter()
                    .all(|(key, value)| same_text(key, STRING, rest) && same_item(value, rest))
        }
        scalar => same_scalar(scalar, rest),
    }
}

/// [`same_value`] for an item of an array or an object: a scalar without a
/// call.
#[inline(always)]
fn same_item(value: &Value, rest: &mut &[u8]) -> bool {
    match value {
        Value::Array(_) | Value::Object(_) => same_value(value, rest),
        scalar => same_scalar(scalar, rest),
    }
}

#[inline(always)]
fn same_scalar(value: &Value, rest: &mut &[u8]) -> bool {
    let tag = |tag: u8, rest: &mut &[u8]| match rest.split_first() {
        Some((&found, left)) if found == tag => {
            *rest = left;
            true
        }
        _ => false,
    };
    match value {
        Value::Null => tag(NULL, rest),
        Value::Bool(false) => tag(FALSE, rest),
        Value::Bool(true) => tag(TRUE, rest),
        Value::Number(n) => same_number(n, rest),
        Value::String(s) => same_text(s, STRING, rest),
        Value::Array(_) | Value::Object(_) => same_value(value, rest),
    }
}

#[inline]
fn same_number(n: &Number, rest: &mut &[u8]) -> bool {
    if let Some(u) = n.as_u64() {
        return same_nine(tagged(UNSIGNED, u.to_le_bytes()), rest);
    }
    if let Some(i) = n.as_i64() {
        return same_nine(tagged(SIGNED, i.to_le_bytes()), rest);
    }
    let Some(len) = take_head(rest, OTHER_NUMBER) else {
        return false;
    };
    let Some(printed) = take(rest, len) else {
        return false;
    };
    let mut same = Same { rest: printed };
    io::Write::write_fmt(&mut same, format_args!("{n}")).is_ok() && same.rest.is_empty()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn same(a: &Value, b: &Value) -> bool {
        ToolSnapshot::of("", a).same_args(b)
    }

    #[test]
    fn equal_values_match_and_any_change_does_not() {
        let args =
            json!({"city": "Paris", "days": 3, "ratio": 0.5, "tags": ["a", null, true], "n": -2});
        let snapshot = ToolSnapshot::of(r#"{"city":"Paris"}"#, &args);
        assert_eq!(snapshot.text(), br#"{"city":"Paris"}"#);
        assert!(snapshot.same_args(&args.clone()));
        for changed in [
            json!({"city": "Pariz", "days": 3, "ratio": 0.5, "tags": ["a", null, true], "n": -2}),
            json!({"city": "Paris", "days": 4, "ratio": 0.5, "tags": ["a", null, true], "n": -2}),
            json!({"city": "Paris", "days": 3, "ratio": 0.25, "tags": ["a", null, true], "n": -2}),
            json!({"city": "Paris", "days": 3, "ratio": 0.5, "tags": ["a", null, false], "n": -2}),
            json!({"city": "Paris", "days": 3, "ratio": 0.5, "tags": ["a", null], "n": -2}),
            json!({"city": "Paris", "days": 3, "ratio": 0.5, "tags": ["a", null, true], "n": -3}),
            json!({"city": "Paris", "days": 3, "ratio": 0.5, "tags": ["a", null, true]}),
            json!(null),
            json!("Paris"),
        ] {
            assert!(!snapshot.same_args(&changed), "{changed} matched");
        }
    }

    #[test]
    fn numbers_keep_their_kind() {
        assert!(same(&json!(3), &json!(3)));
        assert!(!same(&json!(3), &json!(3.0)));
        assert!(!same(&json!(3), &json!(-3)));
        assert!(same(&json!(1e300), &json!(1e300)));
        assert!(!same(&json!(""), &json!(null)));
    }

    #[test]
    fn long_arguments_spill_and_still_compare() {
        let long = json!({"text": "x".repeat(500)});
        assert!(same(&long, &long.clone()));
        assert!(!same(&long, &json!({"text": "x".repeat(499)})));
    }
}
