//! What a tool call may send and what its result may write into the
//! conversation: the size caps, and whether the model reads a panic's
//! message (which `request::tool_failure` reads from the run's context).

use std::borrow::Cow;

/// The default cap on a tool call's arguments: 1 MiB.
pub(crate) const DEFAULT_MAX_ARGUMENT_BYTES: usize = 1024 * 1024;

/// The default cap on a tool result written into the conversation: 256 KiB.
pub(crate) const DEFAULT_MAX_RESULT_BYTES: usize = 256 * 1024;

/// The agent's limits on tool calls.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ToolLimits {
    /// The most bytes of arguments a call may send.
    pub(crate) max_argument_bytes: usize,
    /// The most bytes of a result that reach the conversation.
    pub(crate) max_result_bytes: usize,
    /// Whether the model reads a tool's panic message: set on the run's
    /// context, where `request::tool_failure`, the one place that writes a
    /// panic's result, reads it.
    pub(crate) show_panics: bool,
}

impl Default for ToolLimits {
    fn default() -> Self {
        Self {
            max_argument_bytes: DEFAULT_MAX_ARGUMENT_BYTES,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            show_panics: false,
        }
    }
}

impl ToolLimits {
    /// What the model reads when a call's arguments pass the cap; `None`
    /// when they fit.
    pub(crate) fn check_arguments(&self, tool: &str, arguments: &str) -> Option<String> {
        let len = arguments.len();
        (len > self.max_argument_bytes).then(|| {
            format!(
                "The arguments of `{tool}` are {len} bytes, more than the {} bytes a tool call \
                 may send; the tool was not called. Send shorter arguments.",
                self.max_argument_bytes
            )
        })
    }

    /// `content` as it goes into the conversation: at most
    /// `max_result_bytes` of it (cut at a character boundary), then a note
    /// saying how much was cut.
    pub(crate) fn cap_result<'a>(&self, content: &'a str) -> Cow<'a, str> {
        let max = self.max_result_bytes;
        if content.len() <= max {
            return Cow::Borrowed(content);
        }
        let mut end = max;
        while !content.is_char_boundary(end) {
            end -= 1;
        }
        Cow::Owned(format!(
            "{}\n[The result was cut: {} of its {} bytes are left out, past the limit of {max} \
             bytes.]",
            &content[..end],
            content.len() - end,
            content.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_is_cut_at_a_character_boundary_with_a_note() {
        let limits = ToolLimits {
            max_result_bytes: 5,
            ..ToolLimits::default()
        };
        assert_eq!(limits.cap_result("abcde"), "abcde");
        // "é" is two bytes: byte 5 is inside the second one.
        let cut = limits.cap_result("abéé-tail");
        assert!(cut.starts_with("abé\n"), "{cut}");
        assert!(
            cut.contains("7 of its 11 bytes are left out, past the limit of 5 bytes"),
            "{cut}"
        );
    }

    #[test]
    fn arguments_past_the_cap_are_refused_with_their_size() {
        let limits = ToolLimits {
            max_argument_bytes: 4,
            ..ToolLimits::default()
        };
        assert_eq!(limits.check_arguments("t", "{}"), None);
        let refused = limits.check_arguments("t", r#"{"a":1}"#).unwrap();
        assert!(
            refused.contains("`t` are 7 bytes, more than the 4 bytes"),
            "{refused}"
        );
    }
}
