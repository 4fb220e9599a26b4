//! [`PiiEngine`]: a compiled, shareable configuration.

use std::sync::Arc;

use super::{config::PiiConfig, detect, kind::Detection, patterns};

/// A compiled [`PiiConfig`]: detects PII and opens
/// [sessions](super::PiiSession).
///
/// Cloning is cheap (one `Arc`), so build one engine at start-up and share
/// it. The built-in regexes are compiled once per process, on the first
/// engine built.
#[derive(Debug, Clone)]
pub struct PiiEngine {
    config: Arc<PiiConfig>,
}

impl Default for PiiEngine {
    fn default() -> Self {
        PiiConfig::new().build()
    }
}

impl PiiConfig {
    /// Compiles the configuration into a cheaply cloneable [`PiiEngine`].
    pub fn build(self) -> PiiEngine {
        PiiEngine::new(self)
    }
}

impl PiiEngine {
    /// Compiles `config`. Same as [`PiiConfig::build`].
    pub fn new(config: PiiConfig) -> Self {
        patterns::patterns();
        PiiEngine {
            config: Arc::new(config),
        }
    }

    /// The configuration this engine was built from.
    pub fn config(&self) -> &PiiConfig {
        &self.config
    }

    /// Finds the PII in `text`: detections sorted by start, non-overlapping,
    /// with byte ranges on `char` boundaries.
    ///
    /// Overlapping findings are resolved deterministically: the longest
    /// wins; on equal length, secrets beat custom kinds, which beat the
    /// structured kinds (in the order email, IBAN, card, SSN, IPv6, MAC,
    /// IPv4, phone); then the earlier start wins.
    pub fn detect(&self, text: &str) -> Vec<Detection> {
        detect::detect(&self.config, text)
    }
}
