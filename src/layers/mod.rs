//! Cross-cutting concerns for agents: each one is a self-contained engine, later wrapped in a `tower` layer.
pub mod pii;
