//! The PII engine: finds personal data and secrets in text (14 built-in
//! kinds and custom detectors) and masks them reversibly, per session, so
//! what comes back can be restored. [`MaskPiiLayer`](crate::layers::pii::MaskPiiLayer)
//! masks a model stack with it, and the guardrails' `PiiGuard` checks a text
//! with it; both import it from here, below them. See
//! [`layers::pii`](crate::layers::pii) for examples.

mod config;
mod detect;
mod engine;
mod jwt;
mod kind;
mod patterns;
mod phone;
mod scan;
mod session;
mod stream;
mod url;
mod validate;

pub use config::{CustomDetector, PiiConfig, Strategy};
pub use engine::PiiEngine;
pub use kind::{Detection, PiiKind};
pub use session::{PiiBlocked, PiiSession};
pub use stream::StreamRestorer;
