//! The data model: messages, tool calls, requests, responses and usage.
//!
//! Every type here serializes to the OpenAI chat-completions wire shape, so a
//! transcript round-trips to and from that JSON:
//!
//! ```
//! use tower_agent::types::{Message, ToolCall};
//!
//! let transcript = vec![
//!     Message::user("What is the weather in Paris?"),
//!     Message::assistant_tool_calls(vec![ToolCall::new("call_1", "weather", r#"{"city":"Paris"}"#)]),
//!     Message::tool("call_1", "18°C, clear"),
//!     Message::assistant("It is 18°C and clear in Paris."),
//! ];
//! let json = serde_json::to_string(&transcript).unwrap();
//! let back: Vec<Message> = serde_json::from_str(&json).unwrap();
//! assert_eq!(back, transcript);
//! ```

mod cost;
mod history;
mod message;
mod model;
mod model_name;
mod run;
mod usage;

pub use cost::{Amount, Cost, Decimal, Price, PriceTable};
pub use history::{History, Iter as HistoryIter};
pub use message::{ContentPart, ImageUrl, Message, MessageContent, Role, ToolCall};
pub use model::{
    FinishReason, JsonSchemaFormat, ModelDelta, ModelRequest, ModelResponse, ModelSettings,
    ResponseFormat, ToolChoice, ToolSpec,
};
pub use model_name::ModelName;
pub use run::{
    arguments_hash, AgentRun, ApprovalDecision, ApprovalScope, Checkpoint, Counters, PendingCall,
    RunStatus, StickyApproval, StopReason,
};
pub use usage::Usage;
