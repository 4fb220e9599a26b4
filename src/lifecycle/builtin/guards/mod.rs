//! Guards: a prompt-injection guard and guardrails on input, output and
//! tool calls.
//!
//! TODO-DOCS
#![cfg(feature = "guards")]

mod decode;
mod detector;
mod families;
mod heuristic;
mod matcher;
mod normalize;

pub use detector::{Detection, Evidence, Family, InjectionDetector, View};
pub use heuristic::HeuristicDetector;
