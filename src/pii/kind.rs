//! The categories of PII the engine knows about, and what a detection looks like.

use std::{borrow::Cow, fmt, ops::Range, sync::Arc};

/// A category of personally identifiable information (PII) or secret.
///
/// Every kind has a stable upper-case [label](PiiKind::label) which appears in
/// placeholders (`<EMAIL_1>`, `[REDACTED_PHONE]`, ...). IPv4 and IPv6 addresses
/// are kept apart (`IPV4` / `IPV6`) so that a label always names exactly one
/// kind and [`PiiKind::from_label`] is a true inverse of [`PiiKind::label`] for
/// the built-in kinds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum PiiKind {
    /// An e-mail address: `jane.doe@example.com`. Label `EMAIL`.
    Email,
    /// A phone number, international (`+44 20 7946 0958`) or in a common
    /// national format (`(202) 555-0143`, `06 12 34 56 78`). Label `PHONE`.
    Phone,
    /// A payment card number of 13–19 digits that passes the Luhn check.
    /// Label `CREDIT_CARD`.
    CreditCard,
    /// An International Bank Account Number that passes the mod-97 check and
    /// has its country's length. Label `IBAN`.
    Iban,
    /// A US social security number `ddd-dd-dddd` with a valid area, group and
    /// serial. Label `SSN`.
    UsSsn,
    /// A dotted-quad IPv4 address. Label `IPV4`.
    Ipv4,
    /// An IPv6 address, full or compressed. Label `IPV6`.
    Ipv6,
    /// A 48-bit MAC address: `aa:bb:cc:dd:ee:ff`, `AA-BB-CC-DD-EE-FF` or
    /// the dotted `aabb.ccdd.eeff`. Label `MAC`.
    Mac,
    /// An AWS access key id (`AKIA…` / `ASIA…`). Label `AWS_KEY`.
    AwsAccessKeyId,
    /// A GitHub token (`ghp_…`, `gho_…`, `ghu_…`, `ghs_…`, `ghr_…`,
    /// `github_pat_…`). Label `GITHUB_TOKEN`.
    GithubToken,
    /// An API secret key in the `sk-…` / `sk-proj-…` style (also Stripe's
    /// `sk_live_…`). Label `API_KEY`.
    ApiKey,
    /// A JSON Web Token: three base64url segments whose first, the header,
    /// decodes to a JSON object naming an `alg`. Label `JWT`.
    Jwt,
    /// A PEM private-key block, from `-----BEGIN … PRIVATE KEY-----` to the
    /// matching `-----END … PRIVATE KEY-----` line (or to the end of the key
    /// material when the block is truncated). Label `PRIVATE_KEY`.
    PrivateKey,
    /// A credential inside a URL that has no format of its own: the
    /// password of the userinfo (`postgres://app:s3cr3t@db/orders`) or the
    /// value of a credential query parameter (`?token=…`, `?api_key=…`,
    /// `?password=…`, …). A value that is a known token (`ghp_…`, `sk-…`, a
    /// JWT) keeps its own kind. Label `SECRET`.
    Secret,
    /// A kind found by a [custom detector](super::CustomDetector), identified
    /// by its name. Its label is the name upper-cased, with every character
    /// other than `A-Z`, `0-9` and `_` replaced by `_` (`CUSTOM` if empty).
    Custom(Arc<str>),
}

/// How many built-in kinds there are.
pub(crate) const BUILTIN_COUNT: usize = 14;

/// The built-in kinds, in declaration order.
static BUILTIN: [PiiKind; BUILTIN_COUNT] = [
    PiiKind::Email,
    PiiKind::Phone,
    PiiKind::CreditCard,
    PiiKind::Iban,
    PiiKind::UsSsn,
    PiiKind::Ipv4,
    PiiKind::Ipv6,
    PiiKind::Mac,
    PiiKind::AwsAccessKeyId,
    PiiKind::GithubToken,
    PiiKind::ApiKey,
    PiiKind::Jwt,
    PiiKind::PrivateKey,
    PiiKind::Secret,
];

/// Labels of the built-in kinds, indexed like [`BUILTIN`].
const LABELS: [&str; BUILTIN_COUNT] = [
    "EMAIL",
    "PHONE",
    "CREDIT_CARD",
    "IBAN",
    "SSN",
    "IPV4",
    "IPV6",
    "MAC",
    "AWS_KEY",
    "GITHUB_TOKEN",
    "API_KEY",
    "JWT",
    "PRIVATE_KEY",
    "SECRET",
];

impl PiiKind {
    /// All built-in kinds (every variant except [`PiiKind::Custom`]).
    pub fn builtin() -> &'static [PiiKind] {
        &BUILTIN
    }

    /// A custom kind with the given name.
    pub fn custom(name: impl Into<Arc<str>>) -> Self {
        PiiKind::Custom(name.into())
    }

    /// The stable upper-case label used in placeholders.
    ///
    /// ```
    /// use tower_agent::layers::pii::PiiKind;
    /// assert_eq!(PiiKind::CreditCard.label(), "CREDIT_CARD");
    /// assert_eq!(PiiKind::custom("employee-id").label(), "EMPLOYEE_ID");
    /// ```
    pub fn label(&self) -> Cow<'static, str> {
        match self.builtin_index() {
            Some(i) => Cow::Borrowed(LABELS[i]),
            None => match self {
                PiiKind::Custom(name) => Cow::Owned(custom_label(name)),
                _ => unreachable!("every non-custom kind has a builtin index"),
            },
        }
    }

    /// The built-in kind whose [label](PiiKind::label) is `label`, if any.
    ///
    /// Custom kinds are not recognised (their label does not determine their
    /// name).
    pub fn from_label(label: &str) -> Option<PiiKind> {
        LABELS
            .iter()
            .position(|l| *l == label)
            .map(|i| BUILTIN[i].clone())
    }

    /// Whether this is a built-in kind (not [`PiiKind::Custom`]).
    pub fn is_builtin(&self) -> bool {
        self.builtin_index().is_some()
    }

    /// Index of a built-in kind in [`PiiKind::builtin`].
    pub(crate) fn builtin_index(&self) -> Option<usize> {
        Some(match self {
            PiiKind::Email => 0,
            PiiKind::Phone => 1,
            PiiKind::CreditCard => 2,
            PiiKind::Iban => 3,
            PiiKind::UsSsn => 4,
            PiiKind::Ipv4 => 5,
            PiiKind::Ipv6 => 6,
            PiiKind::Mac => 7,
            PiiKind::AwsAccessKeyId => 8,
            PiiKind::GithubToken => 9,
            PiiKind::ApiKey => 10,
            PiiKind::Jwt => 11,
            PiiKind::PrivateKey => 12,
            PiiKind::Secret => 13,
            PiiKind::Custom(_) => return None,
        })
    }
}

/// Upper-cases a custom detector name into a placeholder-safe label.
fn custom_label(name: &str) -> String {
    let label: String = name
        .chars()
        .map(|c| {
            let c = c.to_ascii_uppercase();
            if c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if label.is_empty() {
        "CUSTOM".to_owned()
    } else {
        label
    }
}

impl fmt::Display for PiiKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// One piece of PII found in a text: its kind and its byte range.
///
/// Ranges always lie on `char` boundaries, so `&text[detection.range.clone()]`
/// never panics for the text the detection was made on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Detection {
    /// What was found.
    pub kind: PiiKind,
    /// Where, as a byte range into the scanned text.
    pub range: Range<usize>,
}

impl Detection {
    /// The detected value, sliced out of the text the detection was made on.
    ///
    /// # Panics
    ///
    /// If `text` is not (a text at least as long as, and with the same char
    /// boundaries as) the scanned text.
    pub fn value<'a>(&self, text: &'a str) -> &'a str {
        &text[self.range.clone()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip() {
        for kind in PiiKind::builtin() {
            assert_eq!(PiiKind::from_label(&kind.label()).as_ref(), Some(kind));
            assert!(kind.is_builtin());
        }
        assert_eq!(PiiKind::from_label("NOPE"), None);
    }

    #[test]
    fn custom_labels_are_sanitised() {
        assert_eq!(PiiKind::custom("employee id").label(), "EMPLOYEE_ID");
        assert_eq!(PiiKind::custom("Ticket-42").label(), "TICKET_42");
        assert_eq!(PiiKind::custom("").label(), "CUSTOM");
        assert_eq!(PiiKind::custom("é").label(), "_");
        assert!(!PiiKind::custom("x").is_builtin());
        assert_eq!(PiiKind::Ipv6.to_string(), "IPV6");
    }

    #[test]
    fn detection_value() {
        let d = Detection {
            kind: PiiKind::Email,
            range: 3..8,
        };
        assert_eq!(d.value("to a@b.c now"), "a@b.c");
    }
}
