//! PII detection and masking: keep personal data and secrets out of what is
//! sent to a model, and put them back into what comes out.
//!
//! [`MaskPiiLayer`] is the tower layer: put it innermost in the model stack,
//! so it also masks whatever outer middleware added to a request, while the
//! middleware itself sees the real values.
//!
//! ```
//! use tower::ServiceBuilder;
//! use tower_agent::layers::pii::{MaskPiiLayer, PiiKind};
//! use tower_agent::{Agent, ScriptedModel, ScriptedTurn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_agent::AgentError> {
//! let model = ScriptedModel::new([ScriptedTurn::text("I will write to <EMAIL_1>.")]);
//! let agent = Agent::builder("support")
//!     .model(
//!         ServiceBuilder::new()
//!             .layer(MaskPiiLayer::new().block(PiiKind::PrivateKey))
//!             .service(model.clone()),
//!     )
//!     .build()?;
//!
//! let run = agent.run("Please e-mail ann@example.com").await?;
//! // The model read a placeholder; the user reads the address.
//! assert_eq!(model.requests()[0].messages[0].text(), "Please e-mail <EMAIL_1>");
//! assert_eq!(run.output, "I will write to ann@example.com.");
//! # Ok(()) }
//! ```
//!
//! # What the layer does
//!
//! * **Masks every message the model receives**: text, text parts, tool-call
//!   arguments and tool results, with one [`PiiSession`] per run, kept in the
//!   run's context so placeholders stay the same from turn to turn. Masked
//!   messages are kept too: each turn masks only the messages added since
//!   the last, which [`History::lineage`](crate::types::History::lineage)
//!   tells in O(1). After a middleware edited the history, or copied it, the
//!   messages before the first one that changed keep their masked form.
//!   A service also remembers, across runs, the histories its engine found
//!   clean (by lineage and length) and the messages it found clean (by a
//!   hash of their texts, seeded at random per service): such a history is
//!   sent as it is, without a look at the run's state, a run that continues
//!   it scans only what was added, and a message seen clean before (a
//!   system prompt, a copied or edited history's unchanged messages) is not
//!   scanned again.
//! * **Restores** the placeholders in the model's answer and in its tool-call
//!   arguments, so the user and the tools see the real values. A call whose
//!   history holds nothing to mask, or whose run has handed out no
//!   placeholder yet, returns the answer untouched. Inside the
//!   arguments' JSON strings a value is escaped for JSON
//!   ([`PiiSession::restore_json`]): a multi-line key still parses, and one
//!   masked from arguments ([`PiiSession::mask_json`]) comes back as it stood.
//! * **Masks a message's text parts as one text**
//!   ([`PiiSession::mask_parts`]), as the model reads them joined up.
//! * **Streams**: deltas pass through [`StreamRestorer`]s (one for the text,
//!   one per tool call), so the emitted deltas concatenate to the restored
//!   full text for any chunking; what they hold back is sent when the call
//!   ends.
//! * **Blocks**: a kind with [`Strategy::Block`] ends the run with a
//!   [tripwire](crate::tripwire) (`GUARDRAIL_TRIPPED`, middleware `pii`,
//!   `info.kind` the label). It fails closed.
//! * Emits [`AgentEvent::PiiMasked`](crate::event::AgentEvent::PiiMasked)
//!   with the number of values replaced in a call.
//!
//! # Kinds
//!
//! [`PiiKind`] lists what is detected. Each kind has a stable upper-case
//! label used in placeholders:
//!
//! | Kind | Label | Recognised |
//! |---|---|---|
//! | [`Email`](PiiKind::Email) | `EMAIL` | `jane.doe+tag@mail.example.co.uk` |
//! | [`Phone`](PiiKind::Phone) | `PHONE` | international: `+44 20 7946 0958`, `+44 (0)20 7946 0958`, `+1-202-555-0143`, `+33.1.23.45.67.89`, `+12025550143`, `0044 20 7946 0958`; national: `(202) 555-0143`, `202.555.0143`, `020 7946 0958`, `06 12 34 56 78`, `030/1234567`, `012.34.56.78`, `08-12 34 56`, `8 (912) 345-67-89`, `(11) 96123-4567`, `131 2345 6789` |
//! | [`CreditCard`](PiiKind::CreditCard) | `CREDIT_CARD` | 13–19 digits, optionally grouped by single spaces or dashes, Luhn-valid |
//! | [`Iban`](PiiKind::Iban) | `IBAN` | `GB82 WEST 1234 5698 7654 32`: known country length, mod-97-valid |
//! | [`UsSsn`](PiiKind::UsSsn) | `SSN` | `ddd-dd-dddd`, not area 000/666/9xx, group 00 or serial 0000 |
//! | [`Ipv4`](PiiKind::Ipv4) | `IPV4` | dotted quads with octets 0–255 (not `1.2.3.4.5`, `v1.2.3.4`, `version 1.2.3.4`) |
//! | [`Ipv6`](PiiKind::Ipv6) | `IPV6` | full and compressed forms (`2001:db8::1`, `::1`), checked by [`std::net::Ipv6Addr`] |
//! | [`Mac`](PiiKind::Mac) | `MAC` | `aa:bb:cc:dd:ee:ff`, `AA-BB-CC-DD-EE-FF`, `aabb.ccdd.ee01` (dotted: with a digit and a letter) |
//! | [`AwsAccessKeyId`](PiiKind::AwsAccessKeyId) | `AWS_KEY` | `AKIA…`/`ASIA…` + 16 capitals or digits |
//! | [`GithubToken`](PiiKind::GithubToken) | `GITHUB_TOKEN` | `ghp_`/`gho_`/`ghu_`/`ghs_`/`ghr_` + 36 alphanumerics, `github_pat_…` |
//! | [`ApiKey`](PiiKind::ApiKey) | `API_KEY` | `sk-…`/`sk-proj-…` with ≥ 20 more characters, `sk_live_…` |
//! | [`Jwt`](PiiKind::Jwt) | `JWT` | three base64url segments, the first (the header) decoding to a JSON object with an `alg` |
//! | [`PrivateKey`](PiiKind::PrivateKey) | `PRIVATE_KEY` | PEM `-----BEGIN … PRIVATE KEY-----` … `-----END … PRIVATE KEY-----` blocks |
//! | [`Secret`](PiiKind::Secret) | `SECRET` | inside a URL: the userinfo's password (`redis://app:s3cr3t@cache`), a credential query parameter's value (`?token=…`, `?api_key=…`, `?password=…`, `?sig=…`); a known token there keeps its own kind |
//! | [`Custom`](PiiKind::Custom) | the name, upper-cased | [`CustomDetector`]: a named regex or function |
//!
//! Things that look like numbers but are not personal data are deliberately
//! left alone: dates, times, prices, version strings, order ids, ISBNs,
//! hashes, and **UUIDs** (they identify records, not people, and masking them
//! would break tool calls that pass them around). Detection favours
//! structure and checksums over guesswork; a number without separators is a
//! phone number only when it starts with `+`. A value is reported as one
//! kind only: a card number grouped like a phone number is a card, an
//! e-mail-shaped `token@host` in a URL's userinfo is the token.
//!
//! # Strategies
//!
//! The layer picks the kinds to detect and a [`Strategy`] per kind
//! (default [`Strategy::Mask`]) with its setters
//! ([`MaskPiiLayer::kinds`], [`strategy`](MaskPiiLayer::strategy),
//! [`block`](MaskPiiLayer::block), [`custom`](MaskPiiLayer::custom),
//! [`hash_salt`](MaskPiiLayer::hash_salt), …); a [`PiiConfig`] does the
//! same for an engine used on its own:
//!
//! * **Mask**: `<EMAIL_1>`, `<EMAIL_2>`, …, numbered per kind; reversible.
//! * **Redact**: `[REDACTED_EMAIL]`; not reversible.
//! * **Hash**: `<EMAIL_1a2b3c4d>`, a salted SHA-256 prefix; stable, not reversible.
//! * **Block**: masking fails with [`PiiBlocked`] naming the kind.
//!
//! # Engines and sessions
//!
//! [`PiiConfig::build`] gives a [`PiiEngine`], cheap to clone and meant to be
//! built once. [`PiiEngine::detect`] scans a text in one pass: a byte-level
//! prefilter finds the few regions that can hold structured PII (digits, `@`,
//! `:`), the literal-prefixed secrets are found with one SIMD-accelerated
//! regex, and the candidates are validated (checksums, ranges, context) and
//! resolved to sorted, non-overlapping [`Detection`]s: the longest match wins,
//! then a fixed kind priority.
//!
//! A [`PiiSession`] (from [`PiiEngine::session`]) holds the placeholder map of
//! one run. Within a session the same value always gets the same placeholder,
//! so the model can refer to "`<EMAIL_1>`" consistently, and
//! [`PiiSession::restore`] replaces the placeholders in the model's output
//! with the original values. Placeholder-looking text the session did not
//! hand out is left untouched. Sessions take `&self` everywhere and can be
//! shared in an `Arc`.
//!
//! # Streaming
//!
//! Model output often arrives in small deltas that can split a placeholder
//! (`"<EMA"`, `"IL_1>"`). A [`StreamRestorer`] holds back only a possible
//! placeholder prefix and guarantees that, for **any** chunking of a text, the
//! concatenation of its outputs equals `session.restore(full_text)`.
//!
//! # Limitations
//!
//! * Detection is pattern-based: names, postal addresses and free-form
//!   identifiers are not found (add [`CustomDetector`]s for your own ids).
//! * Phone numbers are found in the international forms (`+` or `00` and a
//!   country code) for every country, and in the national forms of countries
//!   that write a trunk prefix (`0`, Russia's `8`), of North America, of
//!   Brazil and of Chinese mobiles. National numbers of countries without a
//!   trunk prefix (Spain's `612 345 678`, Singapore's `6123 4567`), national
//!   numbers without separators, eight-digit national numbers in one
//!   uniform layout (`022-62447`) and vanity numbers are not found.
//! * E-mail domains must be ASCII (punycode); local parts may use Latin,
//!   Greek and Cyrillic letters. IBANs must be upper-case. An IPv6 address
//!   must contain a decimal digit (keeps `dead::beef`-like identifiers out),
//!   and so must a dotted MAC address, which must contain a letter too.
//! * [`Secret`](PiiKind::Secret)s are found inside URLs only (after a
//!   `://`); a `password=…` in a configuration file is not.
//! * Documentation placeholders are not secrets: `sk-XXXX…`, `ghp_xxxx…`
//!   (a run of six identical characters) and PEM blocks without base64 key
//!   material are skipped.
//! * [`PiiSession::restore`] replaces every placeholder it handed out,
//!   wherever it appears: text that already contained `<EMAIL_1>` before
//!   masking is restored too, and a model that is induced to write
//!   `<EMAIL_1>` into, say, a tool call gets the real value there. The layer
//!   decides where restoring is appropriate.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use tower_agent::layers::pii::{PiiConfig, PiiKind, Strategy};
//!
//! let engine = PiiConfig::new()
//!     .strategy(PiiKind::CreditCard, Strategy::Redact)
//!     .build();
//! let session = Arc::new(engine.session());
//!
//! let prompt = "Email ann@example.com or call +44 20 7946 0958; \
//!               card 4111 1111 1111 1111. Cc ann@example.com.";
//! let masked = session.mask(prompt).unwrap();
//! assert_eq!(
//!     masked,
//!     "Email <EMAIL_1> or call <PHONE_1>; card [REDACTED_CREDIT_CARD]. Cc <EMAIL_1>."
//! );
//!
//! // The model answers with placeholders; restore them, here from a stream.
//! let mut restorer = session.stream_restorer();
//! let mut answer = String::new();
//! for delta in ["I wrote to <EMA", "IL_1> and will call <PHO", "NE_1>."] {
//!     answer += &restorer.push(delta);
//! }
//! answer += &restorer.finish();
//! assert_eq!(answer, "I wrote to ann@example.com and will call +44 20 7946 0958.");
//! assert_eq!(session.restore("<EMAIL_1>"), "ann@example.com");
//! ```
//!
//! Texts with nothing to mask are returned borrowed, without allocating:
//!
//! ```
//! # use std::borrow::Cow;
//! # use tower_agent::layers::pii::PiiEngine;
//! let session = PiiEngine::default().session();
//! assert!(matches!(session.mask("Nothing to see here, 42 times.").unwrap(), Cow::Borrowed(_)));
//! ```

mod clean;
mod layer;
mod memo;
mod service;
mod stream;

pub use crate::pii::{
    CustomDetector, Detection, PiiBlocked, PiiConfig, PiiEngine, PiiKind, PiiSession, Strategy,
    StreamRestorer,
};
pub use layer::MaskPiiLayer;
pub use service::{future, MaskPii};
