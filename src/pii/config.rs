//! What to detect and what to do with it: [`Strategy`], [`CustomDetector`]
//! and the [`PiiConfig`] builder.

use std::{collections::HashMap, fmt, ops::Range, sync::Arc};

use regex::Regex;

use super::kind::{PiiKind, BUILTIN_COUNT};

/// What masking does with one detected value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// Replace the value with a reversible placeholder `<EMAIL_1>`. Within a
    /// [session](super::PiiSession) the same value always gets the same
    /// placeholder, numbered per kind, and
    /// [`restore`](super::PiiSession::restore) puts the value back.
    #[default]
    Mask,
    /// Replace the value with `[REDACTED_EMAIL]`. Not reversible.
    Redact,
    /// Replace the value with a short stable digest `<EMAIL_1a2b3c4d>`: the
    /// first 4 bytes of SHA-256 over the [salt](PiiConfig::hash_salt) and the
    /// value, in lower-case hex. Equal values give equal digests (across
    /// sessions too), so the model can still tell values apart. Not
    /// reversible; without a secret salt, short values such as phone numbers
    /// can be recovered by brute force, so treat it as pseudonymisation.
    Hash,
    /// Refuse the whole text: [`mask`](super::PiiSession::mask) returns
    /// [`PiiBlocked`](super::PiiBlocked) naming the kind.
    Block,
}

/// A matcher: the function form of a custom detector.
type MatchFn = dyn Fn(&str) -> Vec<Range<usize>> + Send + Sync;

#[derive(Clone)]
enum Matcher {
    Regex(Regex),
    Func(Arc<MatchFn>),
}

/// A user-defined detector: a name (its [`PiiKind::Custom`]) and either a
/// regex or a function returning byte ranges.
///
/// Custom detectors run on the whole text (they are not behind the
/// prefilter). On overlap with another detection, the longer one wins; on a
/// tie, a custom kind beats the built-in structured kinds (but not the
/// secrets), and earlier-registered custom detectors beat later ones.
///
/// ```
/// use regex::Regex;
/// use tower_agent::layers::pii::{CustomDetector, PiiConfig, PiiKind};
///
/// let engine = PiiConfig::new()
///     .custom(CustomDetector::regex("employee_id", Regex::new(r"\bEMP-\d{6}\b").unwrap()))
///     .custom(CustomDetector::from_fn("codename", |text: &str| {
///         text.match_indices("Bluebird").map(|(i, m)| i..i + m.len()).collect()
///     }))
///     .build();
/// let found = engine.detect("EMP-004211 runs Bluebird");
/// assert_eq!(found[0].kind, PiiKind::custom("employee_id"));
/// assert_eq!(found[1].kind.label(), "CODENAME");
/// ```
#[derive(Clone)]
pub struct CustomDetector {
    name: Arc<str>,
    matcher: Matcher,
}

impl CustomDetector {
    /// A detector reporting every match of `regex`. Empty matches are ignored.
    pub fn regex(name: impl Into<Arc<str>>, regex: Regex) -> Self {
        CustomDetector {
            name: name.into(),
            matcher: Matcher::Regex(regex),
        }
    }

    /// A detector calling `f` with the text. Returned ranges that are empty,
    /// out of bounds or not on `char` boundaries are ignored; overlapping ones
    /// are resolved like any other detections.
    pub fn from_fn<F>(name: impl Into<Arc<str>>, f: F) -> Self
    where
        F: Fn(&str) -> Vec<Range<usize>> + Send + Sync + 'static,
    {
        CustomDetector {
            name: name.into(),
            matcher: Matcher::Func(Arc::new(f)),
        }
    }

    /// The detector's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The kind of its detections: `PiiKind::Custom(name)`.
    pub fn kind(&self) -> PiiKind {
        PiiKind::Custom(self.name.clone())
    }

    /// Calls `f` with every valid range found in `text`.
    pub(crate) fn find(&self, text: &str, mut f: impl FnMut(Range<usize>)) {
        match &self.matcher {
            Matcher::Regex(re) => re
                .find_iter(text)
                .filter(|m| !m.is_empty())
                .for_each(|m| f(m.range())),
            Matcher::Func(func) => func(text)
                .into_iter()
                .filter(|r| {
                    r.start < r.end
                        && r.end <= text.len()
                        && text.is_char_boundary(r.start)
                        && text.is_char_boundary(r.end)
                })
                .for_each(f),
        }
    }
}

impl fmt::Debug for CustomDetector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("CustomDetector");
        d.field("name", &self.name);
        match &self.matcher {
            Matcher::Regex(re) => d.field("regex", &re.as_str()),
            Matcher::Func(_) => d.field("func", &format_args!("<fn>")),
        };
        d.finish()
    }
}

/// Which kinds to detect and which [`Strategy`] applies to each.
///
/// Built with consuming setters, then turned into a shareable
/// [`PiiEngine`](super::PiiEngine) with [`build`](PiiConfig::build):
///
/// ```
/// use tower_agent::layers::pii::{PiiConfig, PiiKind, Strategy};
///
/// let engine = PiiConfig::new()                      // all built-in kinds, Mask
///     .disable(PiiKind::Ipv4)
///     .strategy(PiiKind::CreditCard, Strategy::Redact)
///     .strategy(PiiKind::PrivateKey, Strategy::Block)
///     .build();
/// assert_eq!(engine.config().strategy_for(&PiiKind::Email), Strategy::Mask);
/// ```
#[derive(Debug, Clone)]
pub struct PiiConfig {
    /// Enabled built-in kinds, by [`PiiKind::builtin_index`].
    enabled: [bool; BUILTIN_COUNT],
    default_strategy: Strategy,
    overrides: HashMap<PiiKind, Strategy>,
    custom: Vec<CustomDetector>,
    hash_salt: Arc<[u8]>,
}

impl Default for PiiConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl PiiConfig {
    /// Every built-in kind enabled, [`Strategy::Mask`] for all, no custom
    /// detectors, empty hash salt.
    pub fn new() -> Self {
        PiiConfig {
            enabled: [true; BUILTIN_COUNT],
            default_strategy: Strategy::Mask,
            overrides: HashMap::new(),
            custom: Vec::new(),
            hash_salt: Arc::from(&b""[..]),
        }
    }

    /// No built-in kind enabled: add them with [`enable`](Self::enable) or
    /// [`kinds`](Self::kinds), or use custom detectors only.
    pub fn empty() -> Self {
        PiiConfig {
            enabled: [false; BUILTIN_COUNT],
            ..Self::new()
        }
    }

    /// Enables exactly the given built-in kinds (custom kinds in the list are
    /// ignored; custom detectors are added with [`custom`](Self::custom)).
    pub fn kinds(mut self, kinds: impl IntoIterator<Item = PiiKind>) -> Self {
        self.enabled = [false; BUILTIN_COUNT];
        for kind in kinds {
            self = self.enable(kind);
        }
        self
    }

    /// Enables one built-in kind (no effect for a custom kind).
    pub fn enable(mut self, kind: PiiKind) -> Self {
        if let Some(i) = kind.builtin_index() {
            self.enabled[i] = true;
        }
        self
    }

    /// Disables one kind. For a custom kind, removes the custom detectors
    /// with that name.
    pub fn disable(mut self, kind: PiiKind) -> Self {
        match kind.builtin_index() {
            Some(i) => self.enabled[i] = false,
            None => {
                if let PiiKind::Custom(name) = &kind {
                    self.custom.retain(|d| d.name != *name);
                }
            }
        }
        self
    }

    /// The strategy for kinds without an override (default [`Strategy::Mask`]).
    pub fn default_strategy(mut self, strategy: Strategy) -> Self {
        self.default_strategy = strategy;
        self
    }

    /// The strategy for one kind, overriding the default.
    pub fn strategy(mut self, kind: PiiKind, strategy: Strategy) -> Self {
        self.overrides.insert(kind, strategy);
        self
    }

    /// Adds a custom detector.
    pub fn custom(mut self, detector: CustomDetector) -> Self {
        self.custom.push(detector);
        self
    }

    /// The salt mixed into [`Strategy::Hash`] digests. Use a secret salt to
    /// keep short values (phone numbers, SSNs) from being brute-forced.
    pub fn hash_salt(mut self, salt: impl AsRef<[u8]>) -> Self {
        self.hash_salt = Arc::from(salt.as_ref());
        self
    }

    /// The strategy that applies to `kind`.
    pub fn strategy_for(&self, kind: &PiiKind) -> Strategy {
        self.overrides
            .get(kind)
            .copied()
            .unwrap_or(self.default_strategy)
    }

    /// Whether `kind` is detected: an enabled built-in kind, or the name of a
    /// registered custom detector.
    pub fn is_enabled(&self, kind: &PiiKind) -> bool {
        match kind.builtin_index() {
            Some(i) => self.enabled[i],
            None => self.custom.iter().any(|d| d.kind() == *kind),
        }
    }

    /// The enabled built-in kinds.
    pub fn enabled_kinds(&self) -> impl Iterator<Item = &'static PiiKind> + '_ {
        PiiKind::builtin()
            .iter()
            .filter(move |k| k.builtin_index().is_some_and(|i| self.enabled[i]))
    }

    /// The registered custom detectors, in registration order.
    pub fn custom_detectors(&self) -> &[CustomDetector] {
        &self.custom
    }

    pub(crate) fn builtin_enabled(&self, index: usize) -> bool {
        self.enabled[index]
    }

    pub(crate) fn salt(&self) -> &[u8] {
        &self.hash_salt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let c = PiiConfig::new()
            .default_strategy(Strategy::Redact)
            .strategy(PiiKind::Email, Strategy::Hash);
        assert_eq!(c.strategy_for(&PiiKind::Email), Strategy::Hash);
        assert_eq!(c.strategy_for(&PiiKind::Phone), Strategy::Redact);
        assert_eq!(c.enabled_kinds().count(), 14);
        assert_eq!(Strategy::default(), Strategy::Mask);
    }

    #[test]
    fn enable_disable() {
        let c = PiiConfig::empty()
            .enable(PiiKind::Email)
            .enable(PiiKind::custom("x"));
        assert!(c.is_enabled(&PiiKind::Email));
        assert!(!c.is_enabled(&PiiKind::Phone));
        assert!(!c.is_enabled(&PiiKind::custom("x")));
        let c = PiiConfig::new().kinds([PiiKind::Jwt, PiiKind::Mac]);
        assert_eq!(
            c.enabled_kinds().cloned().collect::<Vec<_>>(),
            [PiiKind::Mac, PiiKind::Jwt]
        );
        let c = PiiConfig::new().disable(PiiKind::Jwt);
        assert!(!c.is_enabled(&PiiKind::Jwt));
    }

    #[test]
    fn custom_detectors_register_and_remove() {
        let c = PiiConfig::empty()
            .custom(CustomDetector::regex(
                "ticket",
                Regex::new("T-[0-9]+").unwrap(),
            ))
            .custom(CustomDetector::from_fn("none", |_| Vec::new()));
        assert!(c.is_enabled(&PiiKind::custom("ticket")));
        assert_eq!(c.custom_detectors().len(), 2);
        let dbg = format!("{:?}", c.custom_detectors());
        assert!(dbg.contains("T-[0-9]+") && dbg.contains("<fn>"), "{dbg}");
        let c = c.disable(PiiKind::custom("ticket"));
        assert_eq!(c.custom_detectors().len(), 1);
        assert_eq!(c.custom_detectors()[0].name(), "none");
    }

    #[test]
    #[allow(clippy::reversed_empty_ranges, clippy::single_range_in_vec_init)]
    fn custom_fn_ranges_are_sanitised() {
        let d = CustomDetector::from_fn("bad", |_| vec![0..1, 2..2, 5..99, 1..3, 3..1, 2..3]);
        let mut got = Vec::new();
        d.find("é ok", |r| got.push(r));
        // 0..1 splits 'é'; 2..2 empty; 5..99 out of bounds; 3..1 reversed.
        assert_eq!(got, [2..3]);
        let d = CustomDetector::regex("r", Regex::new("x*").unwrap());
        let mut got = Vec::new();
        d.find("axxb", |r| got.push(r));
        assert_eq!(got, [1..3]);
    }
}
