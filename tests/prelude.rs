//! The README's production example compiles and runs on the prelude, with
//! two `use` lines (see `examples/production.rs`).

#[path = "../examples/production.rs"]
mod production;

#[test]
fn the_production_example_runs() {
    production::main().unwrap();
}

#[test]
fn the_example_needs_two_use_lines() {
    let source = include_str!("../examples/production.rs");
    let uses: Vec<&str> = source.lines().filter(|l| l.starts_with("use ")).collect();
    assert_eq!(
        uses,
        ["use std::time::Duration;", "use tower_agent::prelude::*;"]
    );
}
