//! Which literals every match of a pattern must contain: the *clauses* the
//! [`Matcher`](super::matcher::Matcher) gates each pattern on.
//!
//! A clause is a set of literals such that every match of the pattern
//! contains at least one of them. A pattern usually has several (a verb
//! and a noun of an instruction override, say); a text can only match if
//! it holds a literal of each, which one pass of one Aho-Corasick automaton
//! over all clauses' literals tells. Clauses are found from the pattern's
//! syntax tree (literal runs of a concatenation, unions over alternation
//! branches, repetitions of at least one), so they hold for any input.

use regex_syntax::hir::literal::{ExtractKind, Extractor};
use regex_syntax::hir::{Class, Hir, HirKind};

/// A set of literals (ASCII lower case) every match contains one of.
pub(crate) type Clause = Vec<Vec<u8>>;

/// Literals shorter than this are too common to gate on.
const MIN_LITERAL: usize = 3;
/// Literals are cut to this many bytes: as rare in practice, and a small
/// automaton.
const MAX_LITERAL: usize = 8;
/// A clause with more literals than this costs more than it saves.
const MAX_CLAUSE: usize = 96;
/// The most strings an exact set (all a piece can match) may hold.
const MAX_EXACT: usize = 64;
/// The longest string of an exact set.
const MAX_EXACT_LEN: usize = 32;
/// A character class of at most this many characters is exact.
const MAX_CLASS: usize = 4;

/// What every match of a piece of a pattern holds.
struct Facts {
    /// Every string the piece matches, when they are few and short.
    exact: Option<Vec<Vec<u8>>>,
    /// Clauses of the piece (not counting `exact`).
    clauses: Vec<Clause>,
}

impl Facts {
    fn exact(strings: Vec<Vec<u8>>) -> Self {
        Facts {
            exact: Some(strings),
            clauses: Vec::new(),
        }
    }

    /// Every clause, the exact set counted as one, made usable.
    fn usable(self) -> Vec<Clause> {
        self.clauses
            .into_iter()
            .chain(self.exact)
            .filter_map(usable)
            .collect()
    }
}

/// A clause expected this often or more (one holding a common word) gates
/// little and keeps the automaton busy: dropped unless it is the only one.
const MAX_COST: f64 = 1e-4;

/// The clauses of `hir` (parsed case-sensitively; the literals are matched
/// ASCII case-insensitively), cheapest first.
pub(crate) fn clauses(hir: &Hir) -> Vec<Clause> {
    let mut out = facts(hir).usable();
    out.sort_by(|a, b| cost(a).total_cmp(&cost(b)));
    out.dedup();
    let mut kept = 0;
    out.retain(|c| {
        kept += 1;
        kept == 1 || cost(c) < MAX_COST
    });
    out
}

/// The shortest lead worth listing: a shorter one starts too often.
const MIN_LEAD: usize = 2;
/// The most leads a pattern may have.
const MAX_LEADS: usize = 64;

/// The *leads* of `hir` (parsed case-sensitively; the literals are matched
/// ASCII case-insensitively): literals (ASCII lower case) such that every
/// match starts with one of them, if the pattern has few enough. A
/// pattern with leads can be searched anchored where they start instead of
/// over the whole text.
pub(crate) fn leads(hir: &Hir) -> Option<Clause> {
    let seq = Extractor::new().kind(ExtractKind::Prefix).extract(hir);
    let literals = seq.literals()?;
    if literals.is_empty() || literals.len() > MAX_LEADS {
        return None;
    }
    let mut out = Vec::with_capacity(literals.len());
    for lit in literals {
        let text = std::str::from_utf8(lit.as_bytes()).ok()?;
        // Up to the first letter an ASCII case-insensitive search would
        // miss in another case, and at most as long as a gate's literal.
        let mut end = text
            .char_indices()
            .find(|&(_, c)| !c.is_ascii() && (c.to_lowercase().ne([c]) || c.to_uppercase().ne([c])))
            .map_or(text.len(), |(i, _)| i)
            .min(MAX_LITERAL);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        if end < MIN_LEAD {
            return None;
        }
        out.push(text.as_bytes()[..end].to_ascii_lowercase());
    }
    let out = dedup(out)?;
    // A lead that starts with another one adds no start.
    let minimal = out
        .iter()
        .filter(|l| !out.iter().any(|m| m != *l && l.starts_with(m)))
        .cloned()
        .collect();
    Some(minimal)
}

fn facts(hir: &Hir) -> Facts {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => Facts::exact(vec![Vec::new()]),
        HirKind::Literal(lit) => Facts::exact(vec![lit.0.to_ascii_lowercase()]),
        HirKind::Class(class) => Facts {
            exact: class_strings(class),
            clauses: Vec::new(),
        },
        HirKind::Capture(capture) => facts(&capture.sub),
        HirKind::Repetition(rep) => {
            let sub = facts(&rep.sub);
            let exact = match (rep.min, rep.max) {
                (0, Some(1)) => sub.exact.clone().and_then(|mut e| {
                    e.push(Vec::new());
                    dedup(e)
                }),
                (n, Some(m)) if n == m && (1..=4).contains(&n) => sub
                    .exact
                    .clone()
                    .and_then(|e| (1..n).try_fold(e.clone(), |acc, _| product(&acc, &e))),
                _ => None,
            };
            if rep.min == 0 {
                return Facts {
                    exact,
                    clauses: Vec::new(),
                };
            }
            Facts {
                exact,
                clauses: sub.usable(),
            }
        }
        HirKind::Concat(children) => concat(children),
        HirKind::Alternation(branches) => alternation(branches),
    }
}

/// A concatenation: each run of exact children makes one clause (the
/// product of their sets); other children bring their own clauses.
fn concat(children: &[Hir]) -> Facts {
    let mut clauses = Vec::new();
    let mut run: Vec<Vec<u8>> = vec![Vec::new()];
    let mut all_exact = true;
    for child in children {
        let f = facts(child);
        match f.exact {
            Some(e) => match product(&run, &e) {
                Some(p) => run = p,
                None => {
                    all_exact = false;
                    clauses.push(std::mem::replace(&mut run, e));
                }
            },
            None => {
                all_exact = false;
                clauses.push(std::mem::replace(&mut run, vec![Vec::new()]));
                clauses.extend(f.clauses);
            }
        }
    }
    if all_exact {
        return Facts::exact(run);
    }
    clauses.push(run);
    Facts {
        exact: None,
        clauses,
    }
}

/// An alternation: one clause, the union of each branch's cheapest.
fn alternation(branches: &[Hir]) -> Facts {
    let facts: Vec<Facts> = branches.iter().map(facts).collect();
    let exact = facts
        .iter()
        .map(|f| f.exact.clone())
        .collect::<Option<Vec<_>>>()
        .and_then(|sets| dedup(sets.concat()));
    let union = facts
        .into_iter()
        .map(|f| {
            f.usable()
                .into_iter()
                .min_by(|a, b| cost(a).total_cmp(&cost(b)))
        })
        .collect::<Option<Vec<Clause>>>()
        .map(|cs| cs.concat())
        .and_then(dedup);
    Facts {
        exact,
        clauses: union.into_iter().collect(),
    }
}

/// The strings a small class matches, ASCII-lower-cased.
fn class_strings(class: &Class) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    match class {
        Class::Unicode(c) => {
            for r in c.ranges() {
                for ch in r.start()..=r.end() {
                    if out.len() > 2 * MAX_CLASS {
                        return None;
                    }
                    let mut buf = [0u8; 4];
                    out.push(ch.encode_utf8(&mut buf).as_bytes().to_ascii_lowercase());
                }
            }
        }
        Class::Bytes(c) => {
            for r in c.ranges() {
                for b in r.start()..=r.end() {
                    if out.len() > 2 * MAX_CLASS {
                        return None;
                    }
                    out.push(vec![b.to_ascii_lowercase()]);
                }
            }
        }
    }
    dedup(out).filter(|o| o.len() <= MAX_CLASS)
}

/// Every `a` followed by every `b`, if that stays small.
fn product(a: &[Vec<u8>], b: &[Vec<u8>]) -> Option<Vec<Vec<u8>>> {
    if a.len() * b.len() > MAX_EXACT {
        return None;
    }
    let mut out = Vec::with_capacity(a.len() * b.len());
    for x in a {
        for y in b {
            if x.len() + y.len() > MAX_EXACT_LEN {
                return None;
            }
            out.push([x.as_slice(), y.as_slice()].concat());
        }
    }
    dedup(out)
}

fn dedup(mut set: Vec<Vec<u8>>) -> Option<Vec<Vec<u8>>> {
    set.sort();
    set.dedup();
    (set.len() <= MAX_EXACT).then_some(set)
}

/// `clause` with each literal cut to its cheapest piece that an ASCII
/// case-insensitive search finds whatever the case (non-ASCII letters
/// with a case are cut out), if every literal keeps enough of itself.
fn usable(clause: Clause) -> Option<Clause> {
    if clause.is_empty() || clause.len() > MAX_CLAUSE {
        return None;
    }
    let mut out = Vec::with_capacity(clause.len());
    for lit in clause {
        let text = std::str::from_utf8(&lit).ok()?;
        let piece = text
            .split(|c: char| {
                !c.is_ascii() && (c.to_lowercase().ne([c]) || c.to_uppercase().ne([c]))
            })
            .map(|p| {
                let mut end = p.len().min(MAX_LITERAL);
                while !p.is_char_boundary(end) {
                    end -= 1;
                }
                &p[..end]
            })
            .filter(|p| p.len() >= MIN_LITERAL)
            .min_by(|a, b| literal_cost(a.as_bytes()).total_cmp(&literal_cost(b.as_bytes())))?;
        out.push(piece.as_bytes().to_vec());
    }
    let out = dedup(out)?;
    // A literal holding another one of the clause adds nothing.
    let minimal: Clause = out
        .iter()
        .filter(|l| !out.iter().any(|m| m != *l && contains(l, m)))
        .cloned()
        .collect();
    Some(minimal)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// How often a clause's literals can be expected in ordinary text: the sum
/// of its literals' estimates.
pub(crate) fn cost(clause: &Clause) -> f64 {
    clause.iter().map(|l| literal_cost(l)).sum()
}

/// Short words and word pieces so common in prose that a literal holding
/// only them is a poor gate.
const COMMON: &[&str] = &[
    "the", "and", "you", "your", "that", "with", "for", "are", "this", "have", "not", "all", "any",
    "can", "will", "was", "from", "what", "tion", "ing", "ent", "ion", "one", "our", "out", "has",
    "but", "who", "now", "new", "use", "its", "her", "his", "they", "them", "there", "then",
    "than", "when", "which", "would", "about", "also", "more",
];

/// How often `lit` can be expected at a given position of English text:
/// the product of its letters' frequencies, raised for common words.
fn literal_cost(lit: &[u8]) -> f64 {
    // Frequencies of a..z in English text, per mille.
    const LETTERS: [f64; 26] = [
        82.0, 15.0, 28.0, 43.0, 127.0, 22.0, 20.0, 61.0, 70.0, 1.5, 7.7, 40.0, 24.0, 67.0, 75.0,
        19.0, 0.95, 60.0, 63.0, 91.0, 28.0, 9.8, 24.0, 1.5, 20.0, 0.74,
    ];
    let mut p = 1.0f64;
    for &b in lit {
        p *= match b {
            b'a'..=b'z' => LETTERS[usize::from(b - b'a')] / 1000.0,
            b' ' => 0.17,
            b'0'..=b'9' => 0.01,
            0x80.. => 0.2, // a non-ASCII character is 2–4 of these
            _ => 0.02,
        };
    }
    if COMMON.iter().any(|w| w.as_bytes() == lit) {
        p *= 100.0;
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(pattern: &str) -> Vec<Vec<String>> {
        let hir = regex_syntax::ParserBuilder::new()
            .build()
            .parse(pattern)
            .unwrap();
        clauses(&hir)
            .into_iter()
            .map(|c| {
                c.into_iter()
                    .map(|l| String::from_utf8(l).unwrap())
                    .collect()
            })
            .collect()
    }

    fn leads_of(pattern: &str) -> Option<Vec<String>> {
        let hir = regex_syntax::ParserBuilder::new()
            .build()
            .parse(pattern)
            .unwrap();
        leads(&hir).map(|c| {
            c.into_iter()
                .map(|l| String::from_utf8(l).unwrap())
                .collect()
        })
    }

    #[test]
    fn leads_are_the_starts_of_every_match() {
        assert_eq!(
            leads_of(r"\b(?:ignore|set\s+aside|disregarding)\s+rules"),
            Some(vec!["disregar".into(), "ignore".into(), "set".into()])
        );
        assert_eq!(leads_of(r"<!--[\s\S]*-->"), Some(vec!["<!--".into()]));
        assert_eq!(leads_of(r"\bmuéstrame|\bmuestra"), Some(vec!["mu".into()]));
        assert_eq!(leads_of(r"(?:^|\.\s)ai:"), None, "a lead may be empty");
        assert_eq!(leads_of(r"\w+ rules"), None, "too many starts");
        assert_eq!(leads_of(r"(?:a|b)\s+x"), None, "too short");
    }

    #[test]
    fn every_required_word_is_a_clause() {
        let got = of(r"\bignore\s+(?:all\s+)?previous\s+instructions?\b");
        assert!(got.contains(&vec!["ignore".to_owned()]), "{got:?}");
        assert!(got.contains(&vec!["previous".to_owned()]), "{got:?}");
        assert!(got.contains(&vec!["instruct".to_owned()]), "{got:?}");
        assert!(
            !got.iter().any(|c| c.contains(&"all".to_owned())),
            "{got:?}"
        );
    }

    #[test]
    fn an_alternation_is_the_union_of_its_branches() {
        let got = of(r"\b(?:forget|set\s+aside)\s+rules");
        assert!(
            got.contains(&vec!["aside".to_owned(), "forget".to_owned()]),
            "{got:?}"
        );
    }

    #[test]
    fn cased_letters_beyond_ascii_are_cut_out_and_short_literals_dropped() {
        assert_eq!(of(r"précédentes"), [vec!["dentes".to_owned()]]);
        assert!(of(r"\bai\b").is_empty());
        assert_eq!(of(r"忽略"), [vec!["忽略".to_owned()]]);
    }
}
