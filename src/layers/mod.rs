//! The wrap layers of the model stack: each a `tower::Layer`, composed with
//! `ServiceBuilder` around a model service.
//!
//! In the design's order, outermost first: retry ▸ timeout ▸ fallback ▸
//! [`cache`] ▸ [`rate_limit`] ▸ pii ▸ the model. A cache hit then never spends
//! rate-limit capacity, and a retried call asks the limiter again.

pub mod cache;
pub mod rate_limit;
