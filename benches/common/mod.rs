//! Shared fixtures of the benches: a 3-turn scripted model and a tool.

#![allow(dead_code, unreachable_pub, missing_docs)]

use schemars::JsonSchema;
use serde::Deserialize;
use tower_agent::types::{ModelRequest, Role};
use tower_agent::{tool_sync, BoxError, ScriptedModel, ScriptedTurn, ToolRouter};

#[derive(Debug, Deserialize, JsonSchema)]
pub struct Lookup {
    pub id: u32,
}

/// model → tool → model → tool → model: two tool turns, then an answer.
pub fn three_turn_model() -> ScriptedModel {
    ScriptedModel::from_fn(|request: &ModelRequest| {
        let turns = request
            .messages
            .iter()
            .rev()
            .take_while(|m| m.role != Role::User)
            .filter(|m| m.role == Role::Assistant)
            .count();
        if turns < 2 {
            ScriptedTurn::tool_call("lookup", r#"{"id": 7}"#)
        } else {
            ScriptedTurn::text("done")
        }
    })
    .record(false)
}

pub fn lookup_tools() -> ToolRouter {
    ToolRouter::new().tool(tool_sync("lookup", "Looks up", |l: Lookup| {
        Ok::<_, BoxError>(l.id)
    }))
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}
