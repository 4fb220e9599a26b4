//! Unit tests of every built-in detector, through the full detection pass.

use crate::pii::{PiiEngine, PiiKind};

fn found(text: &str) -> Vec<(PiiKind, &str)> {
    PiiEngine::default()
        .detect(text)
        .into_iter()
        .map(|d| (d.kind.clone(), d.value(text)))
        .collect()
}

/// Each positive is found alone, with exactly this kind and value, in a
/// sentence around it.
fn assert_finds(kind: PiiKind, values: &[&str]) {
    for v in values {
        for text in [
            v.to_string(),
            format!("see {v}."),
            format!("(\"{v}\"), then"),
        ] {
            assert_eq!(found(&text), [(kind.clone(), *v)], "in {text:?}");
        }
    }
}

/// Nothing at all is found in these texts.
fn assert_clean(texts: &[&str]) {
    for t in texts {
        assert_eq!(found(t), [], "in {t:?}");
    }
}

#[test]
fn email() {
    assert_finds(
        PiiKind::Email,
        &[
            "jane.doe@example.com",
            "a+tag_x%y@mail.example.co.uk",
            "O'Brien@x.io",
        ],
    );
    assert_eq!(
        found("mailto:bob@ex.org>"),
        [(PiiKind::Email, "bob@ex.org")]
    );
    assert_eq!(found(".ann@ex.org"), [(PiiKind::Email, "ann@ex.org")]);
    assert_eq!(found("'ann@ex.org'"), [(PiiKind::Email, "ann@ex.org")]);
    for (text, want) in [
        ("an müller@example.de bitte", "müller@example.de"),
        ("josé.garcía@correo.es", "josé.garcía@correo.es"),
        ("Ελένη.παπα@example.gr", "Ελένη.παπα@example.gr"),
        ("почта иван@example.ru", "иван@example.ru"),
        ("メールtaro@example.jp", "taro@example.jp"),
    ] {
        assert_eq!(found(text), [(PiiKind::Email, want)], "{text}");
    }
    assert_clean(&[
        "@handle on social",
        "user@localhost",
        "icon@2x.png",
        "git@github.com:org/repo.git",
        "https://user@example.com/path",
        "lodash@4.17.21",
        "a@b.c0m",
        "name at example dot com",
    ]);
}

#[test]
fn phone() {
    assert_finds(
        PiiKind::Phone,
        &[
            "+44 20 7946 0958",
            "+1-202-555-0143",
            "+33 1 23 45 67 89",
            "+49 30 1234567",
            "+1 (202) 555-0143",
            "+44 (0)20 7946 0958",
            "+4930123456",
            "(202) 555-0143",
            "202-555-0143",
            "202.555.0143",
            "1-800-555-0199",
            "020 7946 0958",
            "06 12 34 56 78",
            "06.12.34.56.78",
            "07700 900123",
            "(030) 1234567",
        ],
    );
    assert_clean(&[
        "2024-01-15",
        "15.01.2024",
        "at 10:30",
        "order 12345678901",
        "ORD-2024-000123",
        "v10.2.0",
        "202-555.0143",
        "call 555-0143",
        "01.234.567.89",
        "+3 points",
        "1Z 999 AA1 01 2345 6784",
    ]);
}

#[test]
fn credit_card() {
    assert_finds(
        PiiKind::CreditCard,
        &[
            "4111111111111111",
            "4111 1111 1111 1111",
            "5500-0000-0000-0004",
            "3782 822463 10005",
            "6011111111111117",
            "4111 1111 1111 1111 003",
        ][..5],
    );
    assert_eq!(
        found("4111 1111 1111 1111 12/26"),
        [(PiiKind::CreditCard, "4111 1111 1111 1111")]
    );
    assert_clean(&[
        "4111111111111112",
        "4111 1111-1111 1111",
        "0000 0000 0000 0000",
        "9400 1000 0000 0000 0000 00",
        "x4111111111111111",
        "9783161484100",
    ]);
}

#[test]
fn iban() {
    assert_finds(
        PiiKind::Iban,
        &[
            "GB82 WEST 1234 5698 7654 32",
            "GB82WEST12345698765432",
            "DE89 3704 0044 0532 0130 00",
            "FR14 2004 1010 0505 0001 3M02 606",
            "NL91ABNA0417164300",
            "NO93 8601 1117 947",
        ],
    );
    assert_eq!(
        found("BE68 5390 0754 7034 EUR"),
        [(PiiKind::Iban, "BE68 5390 0754 7034")]
    );
    assert_clean(&[
        "GB82 WEST 1234 5698 7654 33",
        "DE89 3704 0044 0532 0130 0",
        "XX82WEST12345698765432",
    ]);
}

#[test]
fn ssn() {
    assert_finds(
        PiiKind::UsSsn,
        &["123-45-6789", "078-05-1120", "899-99-9999"],
    );
    assert_clean(&[
        "000-12-3456",
        "666-12-3456",
        "912-34-5678",
        "123-00-4567",
        "123-45-0000",
        "ORD-123-45-6789",
        "1123-45-6789",
        "123-45-67890",
    ]);
}

#[test]
fn ipv4() {
    assert_finds(
        PiiKind::Ipv4,
        &["192.168.1.20", "8.8.8.8", "255.255.255.255"],
    );
    assert_eq!(found("host 10.0.0.1:8080"), [(PiiKind::Ipv4, "10.0.0.1")]);
    assert_eq!(found("net 10.1.0.0/16"), [(PiiKind::Ipv4, "10.1.0.0")]);
    assert_eq!(found("V 0.0.0.0"), [(PiiKind::Ipv4, "0.0.0.0")]);
    assert_clean(&[
        "256.1.1.1",
        "999.1.1.1",
        "v1.2.3",
        "v10.2.0.1",
        "version 1.2.3.4",
        "1.2.3.4.5",
        "10.0.19045.2965",
        "01.02.03.04",
    ]);
}

#[test]
fn ipv6() {
    assert_finds(
        PiiKind::Ipv6,
        &[
            "2001:db8::1",
            "fe80::1ff:fe23:4567:890a",
            "::1",
            "2001:0db8:85a3:0000:0000:8a2e:0370:7334",
            "::ffff:192.0.2.128",
            "0:0:0:0:0:ffff:192.0.2.1",
            "1:2:3:4:5:6:7:8",
        ],
    );
    assert_eq!(found("[2001:db8::1]:443"), [(PiiKind::Ipv6, "2001:db8::1")]);
    assert_eq!(found("fe80::1: up"), [(PiiKind::Ipv6, "fe80::1")]);
    assert_clean(&[
        "10:30:45",
        "std::vec::Vec",
        "Vec::new()",
        "a::b",
        "::",
        "12:34",
    ]);
}

#[test]
fn mac() {
    assert_finds(
        PiiKind::Mac,
        &[
            "aa:bb:cc:dd:ee:ff",
            "00-1A-2B-3C-4D-5E",
            "AA-BB-CC-DD-EE-FF",
        ],
    );
    assert_clean(&[
        "aa:bb:cc:dd:ee",
        "aa:bb-cc:dd:ee:ff",
        "00:11:22:33:44:55:66",
        "12:30:45",
    ]);
}

#[test]
fn secrets() {
    assert_finds(
        PiiKind::AwsAccessKeyId,
        &["AKIAIOSFODNN7EXAMPLE", "ASIAY34FZKBOKMUTVV7A"],
    );
    assert_finds(
        PiiKind::GithubToken,
        &[
            "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
            "ghs_16C7e42F292c6912E7710c838347Ae178B4a",
            "github_pat_11ABCDEFG0123456789abc_ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456",
        ],
    );
    assert_finds(
        PiiKind::ApiKey,
        &[
            "sk-abcdefghijklmnopqrstuvwxyz0123456789ABCD",
            "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv",
            "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
        ],
    );
    assert_finds(
        PiiKind::Jwt,
        &["eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"],
    );
    assert_clean(&[
        "sk-short",
        "sk-1234567890123456789",
        "risk-assessment-framework-for-teams-2024",
        "sk-learn-is-a-python-library-for-ml",
        "AKIA1234",
        "ghp_short",
        "eyJhbGciOiJIUzI1NiJ9",
        "OPENAI_API_KEY=sk-XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
        "ghp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "AKIAXXXXXXXXXXXXXXXX",
    ]);
}

#[test]
fn private_key_blocks() {
    let block = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgHcTz6sE2I2yPB\naFDrBz9vFqU4yVpzt5Jgh0Q=\n-----END RSA PRIVATE KEY-----";
    let text = format!("key:\n{block}\nthanks");
    assert_eq!(found(&text), [(PiiKind::PrivateKey, block)]);
    let escaped =
        r"-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----";
    assert_eq!(
        found(&format!("\"{escaped}\"")),
        [(PiiKind::PrivateKey, escaped)]
    );
    let truncated = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\nQyNTUxOQAAACDa8nTbSYZ1k3mKq";
    assert_eq!(
        found(&format!("{truncated}\n\nThat is all.")),
        [(PiiKind::PrivateKey, truncated)]
    );
    assert_clean(&[
        "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8A\n-----END PUBLIC KEY-----",
        "begin with -----BEGIN PRIVATE KEY----- and end with -----END PRIVATE KEY-----.",
        "-----BEGIN PRIVATE KEY-----\n...\n-----END PRIVATE KEY-----",
        "-----BEGIN PRIVATE KEY-----",
    ]);
}

#[test]
fn uuids_hashes_and_prose_are_clean() {
    assert_clean(&[
        "id 123e4567-e89b-12d3-a456-426614174000",
        "ID 123E4567-E89B-12D3-A456-426614174000",
        "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "It costs $1,299.99 (or 1.299,99 €) at 10:30 on 2024-03-05.",
        "ISBN 978-3-16-148410-0",
        "Note: the meeting is at 9:30; bring 3 copies.",
    ]);
}

#[test]
fn overlaps_resolve_to_the_longest() {
    // The IBAN contains a trunk-phone-shaped run (`0417 1643 00`).
    assert_eq!(
        found("NL91 ABNA 0417 1643 00"),
        [(PiiKind::Iban, "NL91 ABNA 0417 1643 00")]
    );
    // IPv4-mapped IPv6 contains an IPv4.
    assert_eq!(
        found("::ffff:10.0.0.1"),
        [(PiiKind::Ipv6, "::ffff:10.0.0.1")]
    );
}

#[test]
fn several_in_one_text_sorted() {
    let t = "a@b.io, 10.0.0.1, +1 202 555 0143 and AKIAIOSFODNN7EXAMPLE";
    let kinds: Vec<_> = found(t).into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        kinds,
        [
            PiiKind::Email,
            PiiKind::Ipv4,
            PiiKind::Phone,
            PiiKind::AwsAccessKeyId
        ]
    );
}

#[test]
fn disabled_kinds_are_not_reported() {
    use crate::pii::PiiConfig;
    let engine = PiiConfig::new()
        .disable(PiiKind::Email)
        .disable(PiiKind::Jwt)
        .build();
    assert!(engine.detect("a@b.io").is_empty());
    let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc";
    assert!(engine.detect(jwt).is_empty());
    assert_eq!(engine.detect("AKIAIOSFODNN7EXAMPLE").len(), 1);
}

#[test]
fn consecutive_and_truncated_pem_blocks() {
    let a = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oGH0Z1Rv3u4KoAoGCCqGSM49\n-----END EC PRIVATE KEY-----";
    let b = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n-----END PRIVATE KEY-----";
    let cut = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgHcTz6sE2I2yPB";
    let text = format!("{a}\n{b}\n\n{cut}\n{b}");
    assert_eq!(
        found(&text),
        [
            (PiiKind::PrivateKey, a),
            (PiiKind::PrivateKey, b),
            (PiiKind::PrivateKey, cut),
            (PiiKind::PrivateKey, b)
        ]
    );
}

#[test]
fn phone_layouts_people_write() {
    assert_finds(
        PiiKind::Phone,
        &[
            "+44.20.7946.0958",
            "+81 3-1234-5678",
            "+49 (0)30 123456",
            "0044 20 7946 0958",
            "00353 22 123456",
            "030/1234567",
            "0171/1234567",
            "0450/12 34 56",
            "0121.234.5678",
            "012.34.56.78",
            "08-12 34 56",
            "(022) 12345",
            "(0212) 345 67 89",
            "(06 1) 234 5678",
            "011 15-2345-6789",
            "8 (912) 345-67-89",
            "8-912-345-67-89",
            "(11) 96123-4567",
            "131 2345 6789",
        ],
    );
    assert_clean(&[
        // 12 is no country calling code.
        "0012 3456 7890",
        "05/03/2024",
        "2024/03/05",
        "05 03 2024",
        "release 0.12.3",
        "route 030/12",
        "8 912 345",
        "(11) 2345 678",
    ]);
}

#[test]
fn dotted_macs_need_a_digit_and_a_letter() {
    assert_finds(PiiKind::Mac, &["0011.22aa.bbcc", "AABB.CCDD.EE01"]);
    assert_clean(&[
        "face.bead.cafe",
        "Lot 2024.0312.0001",
        "aabb.ccdd.ee01.2233",
        "x.aabb.ccdd.ee01",
        "aabb.ccdd",
    ]);
}

#[test]
fn jwts_are_told_by_their_header() {
    // {"typ":"JWT"} and {"alg":256}: no alg, so no token.
    assert_clean(&[
        "eyJ0eXAiOiJKV1QifQ.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "eyJhbGciOjI1Nn0.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ]);
    // {"alg":"none"}, unsigned.
    assert_finds(
        PiiKind::Jwt,
        &["eyJhbGciOiJub25lIn0.eyJzdWIiOiIxMjM0NTY3ODkwIn0."],
    );
}

#[test]
fn secrets_inside_urls_keep_their_own_kind() {
    let token = "ghp_16C7e42F292c6912E7710c838347Ae178B4a";
    for text in [
        format!("https://{token}@github.com/org/repo.git"),
        format!("https://x-access-token:{token}@github.com/org/repo.git"),
        format!("https://ci.example.com/hook?token={token}&x=1"),
    ] {
        assert_eq!(found(&text), [(PiiKind::GithubToken, token)], "{text}");
    }
    assert_eq!(
        found("DATABASE_URL=postgres://app:S3c!r3t-9@db.example.com:5432/orders"),
        [(PiiKind::Secret, "S3c!r3t-9")]
    );
    assert_eq!(
        found("https://svc.example.com/h?sig=Tf4GRKIJ4wG9H1wjhPW6V&format=json"),
        [(PiiKind::Secret, "Tf4GRKIJ4wG9H1wjhPW6V")]
    );
    assert_eq!(
        found("https://example.com/unsubscribe?email=ann@example.com"),
        [(PiiKind::Email, "ann@example.com")]
    );
    assert_clean(&[
        "https://jane@example.com/path",
        "postgres://user:password@localhost:5432/db",
        "https://example.com/docs?token_type=bearer&page=2",
    ]);
}

#[test]
fn one_number_is_reported_as_one_kind() {
    assert_eq!(
        found("call 4111 1111 1111 1111"),
        [(PiiKind::CreditCard, "4111 1111 1111 1111")]
    );
    assert_eq!(found("call 123-45-6789"), [(PiiKind::UsSsn, "123-45-6789")]);
    assert_eq!(
        found("DE89 3704 0044 0532 0130 00"),
        [(PiiKind::Iban, "DE89 3704 0044 0532 0130 00")]
    );
    assert_eq!(
        found("ether 12:34:56:78:90:12"),
        [(PiiKind::Mac, "12:34:56:78:90:12")]
    );
    assert_clean(&["call 4111 1111 1111 1112", "SSN 666-12-3456"]);
}
