//! One detection pass over a text: prefiltered structured detectors, the
//! literal-prefixed secrets, custom detectors, then overlap resolution.

use std::{collections::BTreeMap, ops::Range};

use regex::Regex;

use super::{
    config::PiiConfig,
    jwt,
    kind::{Detection, PiiKind, BUILTIN_COUNT},
    patterns::{self, Checked, SecretKind},
    phone::{self, PhoneShape},
    scan::{for_each_window, may_hold_secret, Window, SHORT_TEXT},
    url,
};

// Indices of the built-in kinds, as in `PiiKind::builtin_index`.
const EMAIL: usize = 0;
const PHONE: usize = 1;
const CARD: usize = 2;
const IBAN: usize = 3;
const SSN: usize = 4;
const IPV4: usize = 5;
const IPV6: usize = 6;
const MAC: usize = 7;
const AWS: usize = 8;
const GITHUB: usize = 9;
const API_KEY: usize = 10;
const JWT: usize = 11;
const PEM: usize = 12;
const SECRET: usize = 13;

/// Tie-break rank of a built-in kind when two overlapping candidates have the
/// same length (lower wins): secrets first, then custom kinds (ranks
/// `CUSTOM_RANK + i`), then the structured kinds, most specific first.
const BUILTIN_RANK: [u32; BUILTIN_COUNT] = {
    let mut r = [0u32; BUILTIN_COUNT];
    r[PEM] = 0;
    r[JWT] = 1;
    r[AWS] = 2;
    r[GITHUB] = 3;
    r[API_KEY] = 4;
    // A URL credential that is also a known token is typed as the token.
    r[SECRET] = 5;
    r[EMAIL] = STRUCTURED_RANK;
    r[IBAN] = STRUCTURED_RANK + 1;
    r[CARD] = STRUCTURED_RANK + 2;
    r[SSN] = STRUCTURED_RANK + 3;
    r[IPV6] = STRUCTURED_RANK + 4;
    r[MAC] = STRUCTURED_RANK + 5;
    r[IPV4] = STRUCTURED_RANK + 6;
    r[PHONE] = STRUCTURED_RANK + 7;
    r
};
const CUSTOM_RANK: u32 = 16;
const STRUCTURED_RANK: u32 = u32::MAX - 16;

/// A possibly overlapping finding, before resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Candidate {
    range: Range<usize>,
    rank: u32,
    /// Built-in index (< `BUILTIN_COUNT`) or `BUILTIN_COUNT + custom
    /// detector index`.
    kind: usize,
}

/// Collects candidates for one text.
struct Collector<'c> {
    config: &'c PiiConfig,
    out: Vec<Candidate>,
}

impl Collector<'_> {
    fn push(&mut self, kind: usize, range: Range<usize>) {
        let rank = match kind {
            k if k < BUILTIN_COUNT => BUILTIN_RANK[k],
            k => CUSTOM_RANK + (k - BUILTIN_COUNT) as u32,
        };
        self.out.push(Candidate { range, rank, kind });
    }

    fn on(&self, kind: usize) -> bool {
        self.config.builtin_enabled(kind)
    }

    /// Runs `re` over `w`, keeping the matches `check` accepts.
    fn run(
        &mut self,
        text: &str,
        w: &Window,
        kind: usize,
        re: &Regex,
        check: impl Fn(&str, Range<usize>) -> Checked,
    ) {
        // Slicing at the window end keeps the regex from scanning past it;
        // searching from `w.start` in the full prefix keeps left context.
        let hay = &text[..w.end];
        let mut pos = w.start;
        while pos < w.end {
            let Some(m) = re.find_at(hay, pos) else { break };
            match check(text, m.range()) {
                Ok(r) => {
                    pos = r.end.max(m.start() + 1);
                    self.push(kind, r);
                }
                Err(next) => pos = next.max(m.start() + 1),
            }
            while !text.is_char_boundary(pos) {
                pos += 1;
            }
        }
    }

    fn window(&mut self, text: &str, w: &Window) {
        let p = patterns::patterns();
        if w.at > 0 && self.on(EMAIL) {
            self.run(text, w, EMAIL, &p.email, patterns::check_email);
        }
        if w.digits >= 4 && w.dots >= 3 && self.on(IPV4) {
            self.run(text, w, IPV4, &p.ipv4, patterns::check_ipv4);
        }
        // An IPv6 address has `::`, or eight groups (six and a dotted quad).
        if w.digits >= 1 && (w.double_colon || w.colons >= 6) && self.on(IPV6) {
            self.run(text, w, IPV6, &p.ipv6, patterns::check_ipv6);
        }
        if (w.colons >= 5 || w.dashes >= 5) && self.on(MAC) {
            self.run(text, w, MAC, &p.mac, patterns::check_mac);
        }
        // Dotted `aabb.ccdd.ee01`: always with a digit.
        if w.dots >= 2 && w.digits >= 1 && w.len() >= 14 && self.on(MAC) {
            self.run(text, w, MAC, &p.mac_dotted, patterns::check_mac_dotted);
        }
        if w.digits >= 9 && w.dashes >= 2 && self.on(SSN) {
            self.run(text, w, SSN, &p.ssn, patterns::check_ssn);
        }
        // 13+ digits, in one run or grouped by spaces or dashes.
        if w.digits >= 13 && (w.max_run >= 13 || w.spaces + w.dashes >= 2) && self.on(CARD) {
            self.run(text, w, CARD, &p.card, patterns::check_card);
        }
        if w.digits >= 8 && self.on(PHONE) {
            // Cheap facts of the window rule out most phone shapes: national
            // numbers are always written with separators.
            let separated = w.spaces + w.dots + w.dashes + w.slashes + w.parens > 0;
            for (re, shape, possible) in [
                (&p.phone_intl, PhoneShape::International, w.plus > 0),
                (
                    &p.phone_dialled,
                    PhoneShape::Dialled,
                    separated && w.zero_groups > 0,
                ),
                (&p.phone_nanp, PhoneShape::NorthAmerican, separated),
                (&p.phone_national, PhoneShape::National, separated),
            ] {
                if possible {
                    self.run(text, w, PHONE, re, |t, r| phone::check_phone(t, r, shape));
                }
            }
        }
        if w.digits >= 2 && w.upper >= 2 && w.len() >= 15 && self.on(IBAN) {
            self.run(text, w, IBAN, &p.iban, patterns::check_iban);
        }
    }

    fn secrets(&mut self, text: &str) {
        if ![AWS, GITHUB, API_KEY, JWT, PEM, SECRET]
            .iter()
            .any(|&k| self.on(k))
        {
            return;
        }
        if text.len() <= SHORT_TEXT && !may_hold_secret(text.as_bytes()) {
            return;
        }
        let p = patterns::patterns();
        let mut ends = NextLiteral::new("-----END");
        let mut begins = NextLiteral::new("-----BEGIN");
        let mut pos = 0;
        while let Some(m) = p.secrets.find_at(text, pos) {
            pos = m.end();
            let found = match patterns::secret_kind(m.as_str().as_bytes()) {
                SecretKind::PrivateKey => {
                    let next_end = ends.next(text, m.end());
                    let limit = begins.next(text, m.end()).unwrap_or(text.len());
                    patterns::pem_block(text, m.range(), &p.pem_end, next_end, limit)
                        .map(|r| (PEM, r))
                }
                SecretKind::Jwt => jwt::check_jwt(text, m.range()).map(|r| (JWT, r)),
                SecretKind::Url => {
                    // The credentials are pushed here; the tokens inside the
                    // URL are found as the search goes on from `://`.
                    if self.on(SECRET) {
                        let mut found = Vec::new();
                        url::credentials(text, m.start(), |r| found.push(r));
                        for r in found {
                            self.push(SECRET, r);
                        }
                    }
                    None
                }
                SecretKind::Aws => patterns::check_token(text, m.range()).map(|r| (AWS, r)),
                SecretKind::Github => patterns::check_token(text, m.range()).map(|r| (GITHUB, r)),
                SecretKind::ApiKey => {
                    patterns::check_api_key(text, m.range()).map(|r| (API_KEY, r))
                }
            };
            if let Some((kind, range)) = found {
                if self.on(kind) {
                    pos = pos.max(range.end);
                    self.push(kind, range);
                }
            }
        }
    }
}

/// The next occurrence of a literal at or after a position, memoised for
/// non-decreasing positions: every search starts after the previous result,
/// so all searches together scan the text at most once.
struct NextLiteral {
    needle: &'static str,
    /// Where the last search started, and what it found.
    last: Option<(usize, Option<usize>)>,
}

impl NextLiteral {
    fn new(needle: &'static str) -> Self {
        NextLiteral { needle, last: None }
    }

    fn next(&mut self, text: &str, from: usize) -> Option<usize> {
        match self.last {
            Some((start, found)) if start <= from && found.is_none_or(|k| k >= from) => found,
            _ => {
                let found = text[from..].find(self.needle).map(|k| from + k);
                self.last = Some((from, found));
                found
            }
        }
    }
}

/// Finds the PII in `text` according to `config`: sorted by start,
/// non-overlapping, on char boundaries.
pub(crate) fn detect(config: &PiiConfig, text: &str) -> Vec<Detection> {
    let mut c = Collector {
        config,
        out: Vec::new(),
    };
    // Secrets first: a window lying inside a secret (the digits of a JWT or
    // a token) cannot hold a structured value that would win against it, so
    // it is skipped. Secrets are found in text order.
    c.secrets(text);
    // (A URL's credentials come before the tokens inside it: sort.)
    let mut secrets: Vec<Range<usize>> = c.out.iter().map(|s| s.range.clone()).collect();
    secrets.sort_unstable_by_key(|r| r.start);
    let mut next_secret = 0;
    let outside_secrets = |start: usize, end: usize| {
        while next_secret < secrets.len() && secrets[next_secret].end <= start {
            next_secret += 1;
        }
        !secrets
            .get(next_secret)
            .is_some_and(|s| s.start <= start && end <= s.end)
    };
    for_each_window(text, outside_secrets, |w| c.window(text, w));
    for (i, d) in config.custom_detectors().iter().enumerate() {
        let mut found = Vec::new();
        d.find(text, |r| found.push(r));
        for r in found {
            c.push(BUILTIN_COUNT + i, r);
        }
    }
    resolve(c.out)
        .into_iter()
        .map(|cand| Detection {
            kind: match cand.kind {
                k if k < BUILTIN_COUNT => PiiKind::builtin()[k].clone(),
                k => config.custom_detectors()[k - BUILTIN_COUNT].kind(),
            },
            range: cand.range,
        })
        .collect()
}

/// Keeps a maximal set of non-overlapping candidates, preferring longer ones,
/// then lower rank, then earlier start; returns them sorted by start.
fn resolve(mut cands: Vec<Candidate>) -> Vec<Candidate> {
    if cands.len() <= 1 {
        return cands;
    }
    // Usual case: nothing overlaps, and sorting by start is all there is to do.
    cands.sort_unstable_by_key(|c| (c.range.start, c.range.end, c.rank));
    if cands.windows(2).all(|w| w[0].range.end <= w[1].range.start) {
        return cands;
    }
    cands.sort_by(|a, b| {
        (b.range.len())
            .cmp(&a.range.len())
            .then(a.rank.cmp(&b.rank))
            .then(a.range.start.cmp(&b.range.start))
    });
    let mut taken: BTreeMap<usize, Candidate> = BTreeMap::new();
    for cand in cands {
        // Accepted ranges are disjoint, so only the last one starting before
        // this candidate's end can overlap it.
        let overlaps = taken
            .range(..cand.range.end)
            .next_back()
            .is_some_and(|(_, t)| t.range.end > cand.range.start);
        if !overlaps {
            taken.insert(cand.range.start, cand);
        }
    }
    taken.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(range: Range<usize>, rank: u32) -> Candidate {
        Candidate {
            range,
            rank,
            kind: 0,
        }
    }

    #[test]
    fn longest_wins_then_rank_then_start() {
        let got = resolve(vec![
            cand(0..4, 5),
            cand(2..10, 9),
            cand(10..12, 3),
            cand(10..12, 1),
            cand(11..13, 0),
            cand(20..22, 0),
            cand(21..23, 0),
        ]);
        assert_eq!(got, [cand(2..10, 9), cand(11..13, 0), cand(20..22, 0)]);
    }

    #[test]
    fn next_literal_is_memoised_correctly() {
        let text = "a--b----b--b";
        let mut n = NextLiteral::new("--b");
        let want = |from: usize| text[from..].find("--b").map(|k| from + k);
        for from in 0..=text.len() {
            assert_eq!(n.next(text, from), want(from), "from {from}");
        }
    }

    #[test]
    fn many_pem_headers_stay_linear() {
        let config = PiiConfig::new();
        let text = "-----BEGIN PRIVATE KEY----- x\n".repeat(20_000) + "-----END PRIVATE KEY-----";
        let t = std::time::Instant::now();
        assert!(detect(&config, &text).is_empty());
        // Quadratic behaviour took seconds here; linear takes milliseconds.
        assert!(
            t.elapsed() < std::time::Duration::from_millis(1500),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn resolution_is_order_independent() {
        let a = vec![cand(0..5, 2), cand(3..8, 1), cand(8..9, 0), cand(1..2, 0)];
        let mut b = a.clone();
        b.reverse();
        assert_eq!(resolve(a), resolve(b));
    }
}
