//! tower-agent
/// Placeholder kept until the crate's real items land.
pub fn _x() {}

pub mod layers;
