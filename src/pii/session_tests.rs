//! Unit tests of masking strategies and restoring.

use std::{borrow::Cow, sync::Arc};

use regex::Regex;

use crate::pii::{CustomDetector, PiiBlocked, PiiConfig, PiiKind, PiiSession, Strategy};

fn session(config: PiiConfig) -> PiiSession {
    config.build().session()
}

#[test]
fn mask_numbers_per_kind_and_reuses_placeholders() {
    let s = session(PiiConfig::new());
    let masked = s.mask("a@x.io, b@x.io, a@x.io, +44 20 7946 0958").unwrap();
    assert_eq!(masked, "<EMAIL_1>, <EMAIL_2>, <EMAIL_1>, <PHONE_1>");
    // Consistent across calls of the same session.
    assert_eq!(
        s.mask("b@x.io then c@x.io").unwrap(),
        "<EMAIL_2> then <EMAIL_3>"
    );
    assert_eq!(s.len(), 4);
    assert_eq!(s.value_of("<EMAIL_3>").as_deref(), Some("c@x.io"));
    assert_eq!(s.value_of("<EMAIL_4>"), None);
    // A fresh session starts over.
    let t = session(PiiConfig::new());
    assert!(t.is_empty());
    assert_eq!(t.mask("c@x.io").unwrap(), "<EMAIL_1>");
}

#[test]
fn mask_borrows_clean_text() {
    let s = session(PiiConfig::new());
    assert!(matches!(
        s.mask("nothing here 2024").unwrap(),
        Cow::Borrowed(_)
    ));
    assert!(matches!(s.restore("nothing <here>"), Cow::Borrowed(_)));
    s.mask("a@x.io").unwrap();
    assert!(matches!(
        s.restore("nothing <here> <EMAIL_2>"),
        Cow::Borrowed(_)
    ));
}

#[test]
fn redact_and_hash() {
    let s = session(
        PiiConfig::new()
            .strategy(PiiKind::Email, Strategy::Redact)
            .strategy(PiiKind::Ipv4, Strategy::Hash),
    );
    let masked = s.mask("a@x.io from 10.0.0.1 and 10.0.0.1").unwrap();
    assert_eq!(
        masked, "[REDACTED_EMAIL] from <IPV4_f5047344> and <IPV4_f5047344>",
        "sha256(\"10.0.0.1\") starts f5047344"
    );
    // Neither is reversible: nothing was stored.
    assert!(s.is_empty());
    assert_eq!(s.restore(&masked), masked);

    let salted = session(
        PiiConfig::new()
            .default_strategy(Strategy::Hash)
            .hash_salt("pepper"),
    );
    let other = salted.mask("10.0.0.1").unwrap();
    assert!(other.starts_with("<IPV4_") && other.len() == "<IPV4_f5047344>".len());
    assert_ne!(other, "<IPV4_f5047344>");
}

#[test]
fn block_returns_typed_error_and_leaves_session_untouched() {
    let s = session(PiiConfig::new().strategy(PiiKind::UsSsn, Strategy::Block));
    let err = s
        .mask("mail a@x.io, ssn 123-45-6789, ssn 234-56-7890")
        .unwrap_err();
    assert_eq!(
        err,
        PiiBlocked {
            kind: PiiKind::UsSsn
        }
    );
    assert_eq!(err.to_string(), "text contains PII of a blocked kind: SSN");
    assert!(s.is_empty(), "nothing masked before the block");
    assert_eq!(s.mask("a@x.io").unwrap(), "<EMAIL_1>");
}

#[test]
fn custom_detectors_mask_with_their_label() {
    let s = session(
        PiiConfig::empty()
            .custom(CustomDetector::regex(
                "employee-id",
                Regex::new(r"EMP-\d{6}").unwrap(),
            ))
            .strategy(PiiKind::custom("employee-id"), Strategy::Mask),
    );
    assert_eq!(
        s.mask("EMP-123456 and EMP-654321").unwrap(),
        "<EMPLOYEE_ID_1> and <EMPLOYEE_ID_2>"
    );
    assert_eq!(s.restore("<EMPLOYEE_ID_2>"), "EMP-654321");
}

#[test]
fn restore_replaces_known_placeholders_only() {
    let s = session(PiiConfig::new());
    s.mask("a@x.io b@x.io").unwrap();
    assert_eq!(s.restore("<EMAIL_2>, <EMAIL_1>."), "b@x.io, a@x.io.");
    assert_eq!(s.restore("<<EMAIL_1>>"), "<a@x.io>");
    assert_eq!(
        s.restore("<EMAIL_3> <email_1> <EMAIL_1 > [REDACTED_EMAIL]"),
        "<EMAIL_3> <email_1> <EMAIL_1 > [REDACTED_EMAIL]"
    );
    assert_eq!(s.restore("é<EMAIL_1>é"), "éa@x.ioé");
    assert_eq!(s.restore("<EMAIL_1"), "<EMAIL_1");
}

#[test]
fn mask_then_restore_is_identity() {
    let s = session(PiiConfig::new());
    let text = "Hi, I'm ann@example.com, card 4111 1111 1111 1111, IBAN GB82 WEST 1234 5698 7654 32, \
                key sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv, host 192.168.0.12 / fe80::1, mac aa:bb:cc:dd:ee:ff.";
    let masked = s.mask(text).unwrap();
    for secret in [
        "ann@", "4111", "GB82", "sk-proj", "192.168", "fe80", "aa:bb",
    ] {
        assert!(!masked.contains(secret), "{secret} in {masked}");
    }
    assert_eq!(s.restore(&masked), text);
}

#[test]
fn sessions_are_shareable() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<PiiSession>();
    let s = Arc::new(session(PiiConfig::new()));
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || s.mask(&format!("user{i}@x.io")).unwrap().into_owned())
        })
        .collect();
    let mut got: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    got.sort();
    assert_eq!(got, ["<EMAIL_1>", "<EMAIL_2>", "<EMAIL_3>", "<EMAIL_4>"]);
    for i in 0..4 {
        let p = s.mask(&format!("user{i}@x.io")).unwrap().into_owned();
        assert_eq!(s.restore(&p), format!("user{i}@x.io"));
    }
}
