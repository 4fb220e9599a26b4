//! `GET /`: the run viewer, one static page embedded in the crate.

use axum::extract::State;
use axum::response::Html;
use axum::Json;

use super::Shared;

/// The page: HTML, CSS and plain JS, no build step.
pub(crate) const PAGE: &str = include_str!("viewer.html");

pub(crate) async fn page() -> Html<&'static str> {
    Html(PAGE)
}

/// `GET /v1/agents`: the agents' names, for the page's picker.
pub(crate) async fn agents(State(shared): State<Shared>) -> Json<Vec<String>> {
    Json(shared.agent_names())
}
