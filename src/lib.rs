//! tower-agent
pub fn _x() {}
