//! Credentials inside URLs: the password of a URL's userinfo
//! (`postgres://app:s3cr3t@db/orders`) and the values of credential query
//! parameters (`?token=…`, `&api_key=…`), found from the URL's `://`.

use std::ops::Range;

/// Query parameters whose value is a credential, compared without case.
const CREDENTIAL_PARAMS: &[&str] = &[
    "access_token",
    "api-key",
    "api_key",
    "apikey",
    "auth",
    "auth_token",
    "client_secret",
    "id_token",
    "key",
    "pass",
    "passwd",
    "password",
    "pwd",
    "refresh_token",
    "secret",
    "sig",
    "signature",
    "token",
    "x-amz-signature",
    "x-goog-signature",
];

/// Of those, the ones that hold a password, which may be short and plain.
const PASSWORD_PARAMS: &[&str] = &["pass", "passwd", "password", "pwd"];

/// Values written in documentation instead of a credential.
const PLACEHOLDERS: &[&str] = &[
    "changeme",
    "hidden",
    "mypassword",
    "pass",
    "passwd",
    "password",
    "pw",
    "pwd",
    "redacted",
    "secret",
    "token",
    "your-password",
    "your_password",
    "yourpassword",
];

/// How far back from an address [`in_userinfo`] looks for the `://`.
const USERINFO_REACH: usize = 256;

/// A byte that ends a URL written in text.
fn ends_url(b: u8) -> bool {
    b.is_ascii_whitespace() || matches!(b, b'"' | b'\'' | b'<' | b'>' | b'\\' | b'`')
}

/// Whether `value` is a documentation placeholder: a word such as
/// `password`, a template (`${PASSWORD}`, `<password>`, `{{ token }}`,
/// `%s`), or a run of one character (`***`, `XXXXXXXX`).
fn placeholder(value: &str) -> bool {
    let b = value.as_bytes();
    PLACEHOLDERS.iter().any(|p| p.eq_ignore_ascii_case(value))
        || matches!(b.first(), Some(b'<' | b'{' | b'['))
        || value.starts_with("${")
        || value.starts_with("$(")
        || value.starts_with("%(")
        || value == "%s"
        || b.windows(6).any(|w| w.iter().all(|&c| c == w[0]))
        || (b.len() < 6 && b.iter().all(|&c| c == b[0]))
}

/// Whether the value of the query parameter `name` is a credential worth
/// masking: a password that is no placeholder, or a token of eight or more
/// characters with a digit in it (not a word such as `bearer`).
fn credential(name: &str, value: &str) -> bool {
    if value.is_empty() || placeholder(value) {
        return false;
    }
    PASSWORD_PARAMS.iter().any(|p| p.eq_ignore_ascii_case(name))
        || (value.len() >= 8 && value.bytes().any(|b| b.is_ascii_digit()))
}

/// Calls `found` with the byte range of each credential in the URL whose
/// `://` starts at `at`: the password of its userinfo, and the values of
/// its credential query parameters.
pub(crate) fn credentials(text: &str, at: usize, mut found: impl FnMut(Range<usize>)) {
    let t = text.as_bytes();
    let start = at + 3;
    let mut end = t[start..]
        .iter()
        .position(|&b| ends_url(b))
        .map_or(t.len(), |k| start + k);
    // Punctuation of the sentence the URL stands in.
    while end > start && matches!(t[end - 1], b'.' | b',' | b';' | b':' | b'!' | b'?' | b')') {
        end -= 1;
    }
    let url = &t[start..end];
    let authority = url
        .iter()
        .position(|&b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(url.len());
    if let Some(at_sign) = url[..authority].iter().rposition(|&b| b == b'@') {
        if let Some(colon) = url[..at_sign].iter().position(|&b| b == b':') {
            let password = start + colon + 1..start + at_sign;
            if !password.is_empty() && !placeholder(&text[password.clone()]) {
                found(password);
            }
        }
    }
    let Some(question) = url[authority..].iter().position(|&b| b == b'?') else {
        return;
    };
    let query_start = authority + question + 1;
    let query_end = url[query_start..]
        .iter()
        .position(|&b| b == b'#')
        .map_or(url.len(), |k| query_start + k);
    let mut param = query_start;
    while param < query_end {
        let param_end = url[param..query_end]
            .iter()
            .position(|&b| b == b'&' || b == b';')
            .map_or(query_end, |k| param + k);
        if let Some(eq) = url[param..param_end].iter().position(|&b| b == b'=') {
            let name = &text[start + param..start + param + eq];
            let value = start + param + eq + 1..start + param_end;
            if CREDENTIAL_PARAMS
                .iter()
                .any(|p| p.eq_ignore_ascii_case(name))
                && credential(name, &text[value.clone()])
            {
                found(value);
            }
        }
        param = param_end + 1;
    }
}

/// Whether the address whose local part starts at `start` stands in the
/// userinfo of a URL (`https://token@host`, `redis://user:pw@host`): between
/// a `://` and it there is no `/`, `?`, `#`, `@` or end of the URL.
pub(crate) fn in_userinfo(t: &[u8], start: usize) -> bool {
    let floor = start.saturating_sub(USERINFO_REACH);
    let mut i = start;
    while i > floor {
        let b = t[i - 1];
        if b == b'/' {
            return i >= 3 && &t[i - 3..i] == b"://";
        }
        if ends_url(b) || matches!(b, b'?' | b'#' | b'@') {
            return false;
        }
        i -= 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let at = text.find("://").expect("a URL");
        credentials(text, at, |r| out.push(&text[r]));
        out
    }

    #[test]
    fn userinfo_passwords_and_query_credentials() {
        assert_eq!(creds("postgres://app:S3c!r3t@db:5432/orders"), ["S3c!r3t"]);
        assert_eq!(
            creds("see https://svc.example.com/h?a=1&token=Ab3dEf6hIj9k&b=2#frag."),
            ["Ab3dEf6hIj9k"]
        );
        assert_eq!(
            creds("https://u:pw9@h/p?password=letmein;sig=x"),
            ["pw9", "letmein"]
        );
        assert_eq!(creds("https://h/p?API_KEY=abcdef123456."), ["abcdef123456"]);
    }

    #[test]
    fn usernames_placeholders_and_plain_parameters_are_not_credentials() {
        for url in [
            "https://jane@example.com/path",
            "postgres://user:password@localhost/db",
            "redis://:${REDIS_PASSWORD}@cache:6379",
            "https://user:<password>@example.com",
            "mysql://root:@localhost/test",
            "https://example.com/login?token=&next=/",
            "https://example.com/docs?token_type=bearer&page=2",
            "https://example.com/?key=value",
            "https://example.com/reset?token=XXXXXXXXXXXX",
            "https://example.com/a?q=user:pw@x",
        ] {
            assert_eq!(creds(url), Vec::<&str>::new(), "{url}");
        }
    }

    #[test]
    fn userinfo_is_told_from_addresses() {
        let t = "https://x-token:ghp_a@github.com and mail ann@example.com, \
                 https://example.com/u/bob@example.org";
        let at = |needle: &str| t.find(needle).unwrap();
        assert!(in_userinfo(t.as_bytes(), at("ghp_a@")));
        assert!(in_userinfo(t.as_bytes(), at("x-token")));
        assert!(!in_userinfo(t.as_bytes(), at("ann@")));
        assert!(!in_userinfo(t.as_bytes(), at("bob@")));
    }
}
