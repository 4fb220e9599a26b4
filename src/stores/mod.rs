//! Shared state behind store traits: in memory by default, shared across
//! processes by other implementations of the same trait.
//!
//! | store | module | what it keeps |
//! | --- | --- | --- |
//! | [`BudgetStore`](budget::BudgetStore) | [`budget`] | spend reserved and settled per budget line and window |

pub mod budget;
