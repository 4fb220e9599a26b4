//! [`MaskPiiLayer`]: the PII layer and its own builder.

use std::fmt;
use std::sync::{Arc, OnceLock};

use regex::Regex;
use tower::Layer;

use super::service::MaskPii;
use crate::error::AgentError;
use crate::pii::{CustomDetector, PiiConfig, PiiEngine, PiiKind, Strategy};

/// Applies [`MaskPii`] to a model service. See the [module docs](super).
///
/// The layer is its own builder: [`new`](Self::new) detects every built-in
/// kind and masks each with reversible placeholders; each setter changes
/// one thing. What can fail (a [custom pattern](Self::custom_pattern) that is
/// not a valid regex) is checked once, when the layer first builds a service
/// (or at [`validate`](Self::validate)): such a service fails every call with
/// [`AgentError::Config`] (`INVALID_CONFIG`) naming the pattern.
///
/// ```
/// use tower_agent::layers::pii::{MaskPiiLayer, PiiKind, Strategy};
///
/// let layer = MaskPiiLayer::new()
///     .disable(PiiKind::Ipv4)
///     .strategy(PiiKind::CreditCard, Strategy::Redact)
///     .block(PiiKind::PrivateKey)
///     .custom_pattern("employee_id", r"\bEMP-\d{6}\b")
///     .hash_salt("a secret of yours");
/// assert!(layer.validate().is_ok());
///
/// let bad = MaskPiiLayer::new().custom_pattern("broken", "(unclosed");
/// assert!(bad.validate().unwrap_err().to_string().contains("broken"));
/// ```
///
/// # Clone
///
/// Clones share the compiled engine (it is built once, on first use).
/// Sessions are per run, never shared between runs.
#[derive(Clone)]
pub struct MaskPiiLayer {
    config: PiiConfig,
    /// Custom detectors in registration order, patterns not yet compiled.
    custom: Vec<Pending>,
    /// The engine, built (and the patterns compiled) once, on first use.
    engine: Arc<OnceLock<Result<PiiEngine, Arc<str>>>>,
}

/// A custom detector as registered on the layer.
#[derive(Debug, Clone)]
enum Pending {
    Ready(CustomDetector),
    Pattern { name: Arc<str>, pattern: String },
}

impl Pending {
    fn name(&self) -> &str {
        match self {
            Pending::Ready(d) => d.name(),
            Pending::Pattern { name, .. } => name,
        }
    }
}

impl MaskPiiLayer {
    /// Detects every built-in kind and masks each with a reversible
    /// placeholder ([`Strategy::Mask`]), with no hash salt and no custom
    /// detectors.
    pub fn new() -> Self {
        Self {
            config: PiiConfig::new(),
            custom: Vec::new(),
            engine: Arc::default(),
        }
    }

    /// Masks with an engine already built (and shared, e.g. with code that
    /// masks outside the model stack). Setters called afterwards start from
    /// that engine's configuration and build an engine of their own.
    pub fn with_engine(engine: PiiEngine) -> Self {
        let mut config = engine.config().clone();
        let custom = config
            .custom_detectors()
            .iter()
            .cloned()
            .map(Pending::Ready)
            .collect();
        for detector in config.custom_detectors().to_vec() {
            config = config.disable(detector.kind());
        }
        Self {
            config,
            custom,
            engine: Arc::new(OnceLock::from(Ok(engine))),
        }
    }

    /// Changes the configuration: the layer gets an engine of its own.
    fn with(mut self, change: impl FnOnce(PiiConfig) -> PiiConfig) -> Self {
        self.config = change(self.config);
        self.engine = Arc::default();
        self
    }

    /// Detects exactly the given built-in kinds (custom kinds in the list
    /// are ignored; add custom detectors with [`custom`](Self::custom)).
    pub fn kinds(self, kinds: impl IntoIterator<Item = PiiKind>) -> Self {
        self.with(|c| c.kinds(kinds))
    }

    /// Detects one more built-in kind (no effect for a custom kind).
    pub fn enable(self, kind: PiiKind) -> Self {
        self.with(|c| c.enable(kind))
    }

    /// Stops detecting one kind. For a custom kind, removes the custom
    /// detectors with that name.
    pub fn disable(mut self, kind: PiiKind) -> Self {
        if let PiiKind::Custom(name) = &kind {
            self.custom.retain(|d| d.name() != &**name);
        }
        self.with(|c| c.disable(kind))
    }

    /// The strategy for kinds without one of their own (default
    /// [`Strategy::Mask`]).
    pub fn default_strategy(self, strategy: Strategy) -> Self {
        self.with(|c| c.default_strategy(strategy))
    }

    /// The strategy for one kind.
    pub fn strategy(self, kind: PiiKind, strategy: Strategy) -> Self {
        self.with(|c| c.strategy(kind, strategy))
    }

    /// Ends the run with a tripwire when the conversation holds `kind`:
    /// short for `.strategy(kind, Strategy::Block)`.
    pub fn block(self, kind: PiiKind) -> Self {
        self.strategy(kind, Strategy::Block)
    }

    /// Adds a custom detector (a compiled regex or a function).
    pub fn custom(mut self, detector: CustomDetector) -> Self {
        self.custom.push(Pending::Ready(detector));
        self.with(|c| c)
    }

    /// Adds a custom detector from a regex pattern, compiled when the layer
    /// first builds a service. A pattern that does not compile makes that
    /// service fail every call with [`AgentError::Config`]; check it up
    /// front with [`validate`](Self::validate).
    pub fn custom_pattern(mut self, name: impl Into<Arc<str>>, pattern: impl Into<String>) -> Self {
        self.custom.push(Pending::Pattern {
            name: name.into(),
            pattern: pattern.into(),
        });
        self.with(|c| c)
    }

    /// The salt mixed into [`Strategy::Hash`] digests (default none). Use a
    /// secret salt to keep short values (phone numbers, SSNs) from being
    /// brute-forced.
    pub fn hash_salt(self, salt: impl AsRef<[u8]>) -> Self {
        self.with(|c| c.hash_salt(salt))
    }

    /// Builds the engine, as building the first service does, and returns
    /// it (shared by every clone of the layer made since the last setter).
    ///
    /// # Errors
    ///
    /// [`AgentError::Config`] naming the custom pattern that is not a valid
    /// regex.
    pub fn engine(&self) -> Result<PiiEngine, AgentError> {
        self.built()
            .map_err(|message| AgentError::Config(message.to_string()))
    }

    /// Checks the configuration, as building the first service does.
    ///
    /// # Errors
    ///
    /// As [`engine`](Self::engine).
    pub fn validate(&self) -> Result<(), AgentError> {
        self.engine().map(drop)
    }

    fn built(&self) -> Result<PiiEngine, Arc<str>> {
        self.engine
            .get_or_init(|| {
                let mut config = self.config.clone();
                for pending in &self.custom {
                    let detector = match pending {
                        Pending::Ready(d) => d.clone(),
                        Pending::Pattern { name, pattern } => match Regex::new(pattern) {
                            Ok(regex) => CustomDetector::regex(name.clone(), regex),
                            Err(err) => {
                                return Err(Arc::from(format!(
                                    "the custom PII detector `{name}` has an invalid pattern: {err}"
                                )))
                            }
                        },
                    };
                    config = config.custom(detector);
                }
                Ok(config.build())
            })
            .clone()
    }
}

impl Default for MaskPiiLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MaskPiiLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaskPiiLayer")
            .field("config", &self.config)
            .field("custom", &self.custom)
            .finish()
    }
}

impl<S> Layer<S> for MaskPiiLayer {
    type Service = MaskPii<S>;

    fn layer(&self, inner: S) -> MaskPii<S> {
        MaskPii::from_built(inner, self.built())
    }
}
