//! Server-sent events, shared by both providers: the bytes of a response go
//! through a small guard, then `eventsource-stream`, then a provider's
//! [`Decoder`].
//!
//! The guard exists because `eventsource-stream` 0.2.3 panics when the first
//! text it sees starts with a byte-order mark (it slices one byte off a
//! three-byte character), buffers invalid UTF-8 forever, and has no size
//! limit. The guard strips a leading BOM itself (split across chunks or
//! not), always opens the stream with a harmless blank line so the library
//! never sees a BOM, fails fast on invalid UTF-8 and stops past
//! `max_bytes`.

use std::collections::BTreeMap;
use std::pin::Pin;

use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};

use super::error::broken;
use crate::error::ProviderError;
use crate::request::DeltaSink;
use crate::types::{ModelDelta, ModelResponse, ToolCall, Usage};

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Whether a stream goes on after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Keep reading.
    More,
    /// The provider said the answer is complete.
    Done,
}

/// What turns a provider's events into a [`ModelResponse`].
pub(crate) trait Decoder {
    /// One event: its type (`message` when unnamed) and its data.
    fn event(
        &mut self,
        event: &str,
        data: &str,
        sink: Option<&DeltaSink>,
    ) -> Result<Flow, ProviderError>;

    /// The response, once the provider said it is complete.
    fn finish(self) -> Result<ModelResponse, ProviderError>;

    /// The usage reported so far, if any.
    fn usage(&self) -> Option<Usage>;

    /// The deltas sent to the sink so far.
    fn deltas(&self) -> &Deltas;

    /// How many deltas went to the sink.
    fn deltas_sent(&self) -> usize {
        self.deltas().sent()
    }
}

/// The deltas a decoder sends: each goes to the sink, if any, and is
/// counted, so a stream that breaks later says how many went out
/// ([`BrokenResponse::deltas_sent`](super::BrokenResponse::deltas_sent)).
#[derive(Debug, Default)]
pub(crate) struct Deltas {
    sent: usize,
}

impl Deltas {
    /// Sends `delta` to `sink`.
    pub(crate) fn send(&mut self, sink: Option<&DeltaSink>, delta: ModelDelta) {
        if let Some(sink) = sink {
            sink.send(&delta);
            self.sent += 1;
        }
    }

    /// How many deltas went out.
    pub(crate) fn sent(&self) -> usize {
        self.sent
    }

    /// A broken answer, after the deltas sent so far.
    pub(crate) fn broken(&self, detail: impl Into<String>) -> ProviderError {
        broken(detail, self.sent)
    }
}

/// A failed stream: the error and whatever usage the provider had reported
/// before it failed (it was billed, so it is recorded).
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) error: ProviderError,
    pub(crate) usage: Option<Usage>,
}

enum GuardError<E> {
    Transport(E),
    Utf8,
    TooLarge(usize),
}

struct Guard<S, E> {
    inner: Pin<Box<S>>,
    opened: bool,
    /// Leading bytes held back while they might still be a BOM.
    head: Option<Vec<u8>>,
    /// The tail of an incomplete UTF-8 character, for validation.
    carry: Vec<u8>,
    total: usize,
    max: usize,
    /// An error to report after the valid bytes before it.
    pending: Option<GuardError<E>>,
    ended: bool,
}

impl<S, E> Guard<S, E> {
    /// Validates `bytes` as the continuation of the text so far: the length
    /// of its valid prefix, and whether the rest is invalid.
    fn check_utf8(&mut self, bytes: &[u8]) -> (usize, bool) {
        let carried = self.carry.len();
        let mut joined;
        let text: &[u8] = if carried == 0 {
            bytes
        } else {
            joined = std::mem::take(&mut self.carry);
            joined.extend_from_slice(bytes);
            &joined
        };
        match std::str::from_utf8(text) {
            Ok(_) => (bytes.len(), false),
            Err(err) if err.error_len().is_none() => {
                self.carry = text[err.valid_up_to()..].to_vec();
                (bytes.len(), false)
            }
            Err(err) => (err.valid_up_to().saturating_sub(carried), true),
        }
    }
}

fn guard<S, B, E>(inner: S, max: usize) -> impl Stream<Item = Result<Vec<u8>, GuardError<E>>>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
{
    let state = Guard {
        inner: Box::pin(inner),
        opened: false,
        head: Some(Vec::new()),
        carry: Vec::new(),
        total: 0,
        max,
        pending: None,
        ended: false,
    };
    futures::stream::unfold(state, |mut g| async move {
        if let Some(err) = g.pending.take() {
            g.ended = true;
            return Some((Err(err), g));
        }
        if g.ended {
            return None;
        }
        if !g.opened {
            g.opened = true;
            return Some((Ok(b"\n".to_vec()), g));
        }
        loop {
            let mut out = match g.inner.next().await {
                Some(Err(err)) => {
                    g.ended = true;
                    return Some((Err(GuardError::Transport(err)), g));
                }
                Some(Ok(chunk)) => {
                    let mut chunk = chunk.as_ref();
                    let room = g.max - g.total;
                    if chunk.len() > room {
                        // Pass on what fits, then fail: the outcome must not
                        // depend on where the chunks were cut.
                        chunk = &chunk[..room];
                        g.pending = Some(GuardError::TooLarge(g.max));
                    }
                    g.total += chunk.len();
                    match g.head.take() {
                        None => chunk.to_vec(),
                        Some(mut head) => {
                            head.extend_from_slice(chunk);
                            if g.pending.is_none()
                                && head.len() < BOM.len()
                                && BOM.starts_with(&head)
                            {
                                g.head = Some(head);
                                continue;
                            }
                            if head.starts_with(BOM) {
                                head.drain(..BOM.len());
                            }
                            head
                        }
                    }
                }
                None => {
                    g.ended = true;
                    match g.head.take() {
                        Some(head) if !head.is_empty() => head,
                        _ => return None,
                    }
                }
            };
            let (valid, invalid) = g.check_utf8(&out);
            if invalid {
                out.truncate(valid);
                g.pending = Some(GuardError::Utf8);
            }
            if out.is_empty() {
                if let Some(err) = g.pending.take() {
                    g.ended = true;
                    return Some((Err(err), g));
                }
                if g.ended {
                    return None;
                }
                continue;
            }
            return Some((Ok(out), g));
        }
    })
}

/// Reads a whole stream of response bytes into `decoder`, forwarding deltas
/// to `sink`. `transport` classifies an error of the byte stream itself.
///
/// The answer is complete only when the decoder says so (OpenAI's
/// `data: [DONE]`, Anthropic's `message_stop`); a stream that ends before is
/// truncated and fails as `PROVIDER_UNAVAILABLE`.
pub(crate) async fn decode<D, S, B, E>(
    bytes: S,
    mut decoder: D,
    sink: Option<&DeltaSink>,
    max_bytes: usize,
    transport: impl Fn(E, usize) -> ProviderError,
) -> Result<ModelResponse, Failed>
where
    D: Decoder,
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
{
    let mut events = std::pin::pin!(guard(bytes, max_bytes).eventsource());
    let fail = |error: ProviderError, decoder: &D| Failed {
        error,
        usage: decoder.usage(),
    };
    while let Some(event) = events.next().await {
        let sent = decoder.deltas_sent();
        let event = match event {
            Ok(event) => event,
            Err(EventStreamError::Transport(GuardError::Transport(err))) => {
                return Err(fail(transport(err, sent), &decoder));
            }
            Err(EventStreamError::Transport(GuardError::TooLarge(max))) => {
                let detail = format!("the response is larger than {max} bytes");
                return Err(fail(broken(detail, sent), &decoder));
            }
            Err(EventStreamError::Transport(GuardError::Utf8) | EventStreamError::Utf8(_)) => {
                return Err(fail(
                    broken("the stream is not valid UTF-8", sent),
                    &decoder,
                ));
            }
            Err(EventStreamError::Parser(err)) => {
                let detail = format!("the stream is not valid server-sent events: {err:?}");
                return Err(fail(broken(detail, sent), &decoder));
            }
        };
        match decoder.event(&event.event, &event.data, sink) {
            Ok(Flow::More) => {}
            Ok(Flow::Done) => {
                let usage = decoder.usage();
                return decoder.finish().map_err(|error| Failed { error, usage });
            }
            Err(error) => return Err(fail(error, &decoder)),
        }
    }
    let sent = decoder.deltas_sent();
    Err(fail(
        broken("the stream ended before the answer was complete", sent),
        &decoder,
    ))
}

/// Runs [`decode`] over in-memory chunks, on the current thread: the entry of
/// the fuzz targets and of the tests.
pub(crate) fn decode_chunks<D: Decoder>(
    chunks: &[&[u8]],
    decoder: D,
    sink: Option<&DeltaSink>,
    max_bytes: usize,
) -> Result<ModelResponse, Failed> {
    let bytes = futures::stream::iter(
        chunks
            .iter()
            .map(|c| Ok::<&[u8], std::convert::Infallible>(c)),
    );
    futures::executor::block_on(decode(
        bytes,
        decoder,
        sink,
        max_bytes,
        |never, _| match never {},
    ))
}

/// Decodes in-memory chunks with a sink and collects what it received: the
/// helper of the decoders' tests.
#[cfg(test)]
pub(crate) fn decode_collect<D: Decoder>(
    chunks: &[&[u8]],
    decoder: D,
) -> (Result<ModelResponse, ProviderError>, Vec<ModelDelta>) {
    let (sink, mut rx) = DeltaSink::channel();
    let result = decode_chunks(chunks, decoder, Some(&sink), 1 << 20).map_err(|f| f.error);
    let mut deltas = Vec::new();
    while let Ok(delta) = rx.try_recv() {
        deltas.push(delta);
    }
    (result, deltas)
}

/// Splits `data` into chunks at pseudo-random points drawn from `seed`: how
/// the fuzz targets and property tests choose chunk boundaries.
pub(crate) fn split(data: &[u8], seed: u64) -> Vec<&[u8]> {
    let mut chunks = Vec::new();
    let mut state = seed | 1;
    let mut rest = data;
    while !rest.is_empty() {
        // xorshift64
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let len = 1 + (state % 17) as usize;
        let (head, tail) = rest.split_at(len.min(rest.len()));
        chunks.push(head);
        rest = tail;
    }
    chunks
}

/// Checks that the deltas sent add up to the response: the text deltas to
/// its text, the tool-call deltas (joined by index) to its calls. Panics
/// otherwise: the oracle of the fuzz targets and property tests.
pub(crate) fn check_deltas(response: &ModelResponse, deltas: &[ModelDelta]) {
    let text: String = deltas
        .iter()
        .filter_map(|d| match d {
            ModelDelta::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    if !text.is_empty() {
        assert_eq!(text, response.message.text(), "text deltas != answer");
    }
    let mut calls: BTreeMap<usize, ToolCall> = BTreeMap::new();
    for delta in deltas {
        if let ModelDelta::ToolCall {
            index,
            id,
            name,
            arguments,
        } = delta
        {
            let call = calls
                .entry(*index)
                .or_insert_with(|| ToolCall::new("", "", ""));
            if let Some(id) = id {
                call.id.clone_from(id);
            }
            if let Some(name) = name {
                call.name.clone_from(name);
            }
            call.arguments.push_str(arguments);
        }
    }
    let joined: Vec<ToolCall> = calls.into_values().collect();
    assert_eq!(
        joined, response.message.tool_calls,
        "tool-call deltas != calls"
    );
}

/// Decodes `data` (its first 8 bytes choose where the rest is cut into
/// chunks) with the decoder `make` builds, once cut and once whole, and
/// checks that both give the same outcome and that the deltas add up to the
/// answer. Panics only when one of those invariants breaks.
pub(crate) fn fuzz_one<D: Decoder>(data: &[u8], make: impl Fn() -> D) {
    let (seed, body) = match data.split_first_chunk::<8>() {
        Some((seed, body)) => (u64::from_le_bytes(*seed), body),
        None => (0, data),
    };
    let run = |chunks: &[&[u8]]| {
        let deltas = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = deltas.clone();
        let sink = DeltaSink::new(move |d| seen.lock().unwrap().push(d.clone()));
        let outcome = decode_chunks(chunks, make(), Some(&sink), 64 * 1024)
            .map_err(|f| (f.error.kind(), f.error.to_string(), f.usage));
        let deltas = std::mem::take(&mut *deltas.lock().unwrap());
        (outcome, deltas)
    };
    let (cut, cut_deltas) = run(&split(body, seed));
    let (whole, whole_deltas) = run(&[body]);
    assert_eq!(cut, whole, "the outcome depends on the chunking");
    assert_eq!(
        cut_deltas, whole_deltas,
        "the deltas depend on the chunking"
    );
    if let Ok(response) = &whole {
        check_deltas(response, &whole_deltas);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::types::{Message, ModelResponse};

    /// Collects `message` events' data until `done`.
    #[derive(Default)]
    struct Collect {
        data: Vec<String>,
        deltas: Deltas,
    }

    impl Decoder for Collect {
        fn event(
            &mut self,
            _event: &str,
            data: &str,
            _sink: Option<&DeltaSink>,
        ) -> Result<Flow, ProviderError> {
            if data == "done" {
                return Ok(Flow::Done);
            }
            self.data.push(data.to_owned());
            Ok(Flow::More)
        }

        fn finish(self) -> Result<ModelResponse, ProviderError> {
            Ok(ModelResponse::new(
                "m",
                Message::assistant(self.data.join("|")),
            ))
        }

        fn usage(&self) -> Option<Usage> {
            None
        }

        fn deltas(&self) -> &Deltas {
            &self.deltas
        }
    }

    fn run(chunks: &[&[u8]]) -> Result<String, ErrorKind> {
        decode_chunks(chunks, Collect::default(), None, 1 << 20)
            .map(|r| r.message.text().into_owned())
            .map_err(|f| f.error.kind())
    }

    #[test]
    fn strips_a_byte_order_mark_split_across_chunks() {
        let body = b"\xEF\xBB\xBFdata: a\n\ndata: done\n\n";
        for seed in 0..64 {
            assert_eq!(run(&split(body, seed)).as_deref(), Ok("a"), "seed {seed}");
        }
        assert_eq!(
            run(&[b"\xEF", b"\xBB", b"\xBF", b"data: a\n\ndata: done\n\n"]).as_deref(),
            Ok("a")
        );
        // A second BOM is data, and no longer a panic inside eventsource-stream.
        assert_eq!(
            run(&[b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\ndata: b\n\ndata: done\n\n"]).as_deref(),
            Ok("b")
        );
    }

    #[test]
    fn invalid_utf8_fails_fast() {
        assert_eq!(
            run(&[b"data: \xFF\n\n", b"data: done\n\n"]),
            Err(ErrorKind::Unavailable)
        );
        // A character split across chunks is fine.
        assert_eq!(
            run(&[b"data: \xC3", b"\xA9\n\ndata: done\n\n"]).as_deref(),
            Ok("é")
        );
        // An incomplete character at the end is not.
        assert_eq!(run(&[b"data: a\n\n\xC3"]), Err(ErrorKind::Unavailable));
    }

    #[test]
    fn a_stream_without_its_terminator_is_truncated() {
        let err = decode_chunks(&[b"data: a\n\n"], Collect::default(), None, 1 << 20).unwrap_err();
        assert_eq!(err.error.kind(), ErrorKind::Unavailable);
        assert!(err.error.to_string().contains("ended before"));
        assert_eq!(run(&[]), Err(ErrorKind::Unavailable));
        assert_eq!(run(&[b"\xEF\xBB"]), Err(ErrorKind::Unavailable));
    }

    #[test]
    fn stops_past_the_size_limit() {
        let big = vec![b'a'; 100];
        let err =
            decode_chunks(&[b"data: ", &big, b"\n\n"], Collect::default(), None, 64).unwrap_err();
        assert!(err.error.to_string().contains("larger than 64 bytes"));
    }

    /// Pieces of both protocols (and of broken ones) that the property
    /// tests splice into streams; the fuzz dictionary holds the same.
    const PIECES: &[&str] = &[
        "data: ",
        "data:",
        "event: error\n",
        "event: message_start\n",
        "\n",
        "\n\n",
        "\r\n",
        "\r",
        ": comment\n",
        "\u{feff}",
        "[DONE]",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"h\\u00e9\"}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\"\"}}]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\":1}\"}}]}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"d\",\"function\":{\"name\":\"g\"}}]}}]}",
        "{\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}",
        "{\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":18446744073709551615}}",
        "{\"error\":{\"type\":\"rate_limit_error\"}}",
        "{\"type\":\"message_start\",\"message\":{\"model\":\"m\",\"usage\":{\"input_tokens\":18446744073709551615,\"cache_read_input_tokens\":9}}}",
        "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"a\"}}",
        "{\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{\"x\":1}}}",
        "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"b\"}}",
        "{\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}",
        "{\"type\":\"content_block_stop\",\"index\":1}",
        "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":5}}",
        "{\"type\":\"message_stop\"}",
        "{\"type\":\"ping\"}",
        "{\"choices\":",
        "\u{10FFFF}",
    ];

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_without_panic(data in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            crate::service::openai::fuzz_openai_stream(&data);
            crate::service::anthropic::fuzz_anthropic_stream(&data);
        }

        #[test]
        fn spliced_streams_decode_the_same_however_cut(
            seed in proptest::num::u64::ANY,
            pieces in proptest::collection::vec(proptest::sample::select(PIECES), 0..40),
            junk in proptest::option::of(proptest::collection::vec(proptest::num::u8::ANY, 1..4)),
        ) {
            let mut data = seed.to_le_bytes().to_vec();
            for piece in &pieces {
                data.extend_from_slice(piece.as_bytes());
            }
            if let Some(junk) = junk {
                let at = (seed as usize) % (data.len() + 1);
                data.splice(at..at, junk);
            }
            crate::service::openai::fuzz_openai_stream(&data);
            crate::service::anthropic::fuzz_anthropic_stream(&data);
        }
    }

    #[test]
    fn split_covers_the_input() {
        let data: Vec<u8> = (0..200).collect();
        for seed in 0..8 {
            assert_eq!(split(&data, seed).concat(), data);
        }
    }
}
