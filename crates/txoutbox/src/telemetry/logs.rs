//! The log output of txoutbox's binaries (the `logging` feature): human-readable text or one
//! JSON object a line, on standard error, filtered by `RUST_LOG`. Text is coloured only on a
//! terminal and never when `NO_COLOR` is set; a JSON line carries the fields of the span it was
//! logged in (a delivery's `relay`, `destination`, `message_id`, `downstream_key`, `trace_id`).
//!
//! A service that installs its own `tracing` subscriber needs none of this: the library only
//! emits events and spans.

use std::ffi::OsStr;
use std::io::IsTerminal;
use std::str::FromStr;

use tracing::Subscriber;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

use crate::error::{Error, Result};

/// The environment variable that chooses the format when no `--log-format` flag does.
pub const LOG_FORMAT_ENV: &str = "TXOUTBOX_LOG_FORMAT";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LogFormat {
    /// One line of text an event, for people (coloured on a terminal only).
    #[default]
    Text,
    /// One JSON object a line, for a log shipper: `timestamp`, `level`, `target`, the event's
    /// fields (`message` among them) and `span`, the fields of the span it was logged in.
    Json,
}

impl LogFormat {
    /// The format's name, as `--log-format` and [`LOG_FORMAT_ENV`] take it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

display_as_str!(LogFormat);

impl FromStr for LogFormat {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(Error::Config(format!(
                "log format {text:?}: expected text or json"
            ))),
        }
    }
}

/// Whether text written to a stream is coloured: only when the stream is a terminal, and never
/// when `NO_COLOR` holds a value (any non-empty one, as <https://no-color.org> says).
pub fn use_colour(is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// The log layer of a binary: `format` on standard error, filtered by `RUST_LOG` (by
/// `default_filter` when it is unset or does not parse, e.g. `"info"`). Stack it on a
/// `tracing_subscriber::registry()` beside layers of one's own (an OpenTelemetry export).
pub fn layer<S>(format: LogFormat, default_filter: &str) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'span> LookupSpan<'span> + Send + Sync,
{
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        LogFormat::Text => {
            let no_color = std::env::var_os("NO_COLOR");
            fmt.with_ansi(use_colour(
                std::io::stderr().is_terminal(),
                no_color.as_deref(),
            ))
            .with_filter(filter)
            .boxed()
        }
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_filter(filter)
            .boxed(),
    }
}

/// Installs [`layer`] as the process's subscriber (and routes the `log` crate's records into
/// it). Fails when a subscriber is installed already.
pub fn init(format: LogFormat, default_filter: &str) -> Result<()> {
    tracing_subscriber::registry()
        .with(layer(format, default_filter))
        .try_init()
        .map_err(|e| Error::Config(format!("cannot install the log subscriber: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_and_never_with_no_color() {
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some(OsStr::new(""))));
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(false, None));
        assert!(!use_colour(false, Some(OsStr::new("1"))));
    }

    #[test]
    fn a_log_format_is_text_or_json() {
        assert_eq!("json".parse::<LogFormat>().ok(), Some(LogFormat::Json));
        assert_eq!(" Text ".parse::<LogFormat>().ok(), Some(LogFormat::Text));
        let refused = "yaml".parse::<LogFormat>();
        assert!(
            matches!(&refused, Err(Error::Config(line)) if line.contains("text or json")),
            "{refused:?}"
        );
    }
}
