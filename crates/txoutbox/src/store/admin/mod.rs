//! Every statement of the operator's tools, one file per command, each with the functions that
//! bind its parameters and decode its rows. Hot rows (`pending`, `in_flight`, `failed`,
//! `unknown`) are in `txoutbox_messages`; `delivered` rows in `txoutbox_delivered`, where the
//! relay's completion statement moved them.
//!
//! A filter binds the same parameters everywhere ($2..$8: destination, since (timestamp, seconds
//! ago), until (timestamp, seconds ago), downstream key, ordering key; $10, $11: error text
//! contained, normalised error text; $12, $13: the keyset cursor, (created_at, seq) before which
//! a page starts), so one macro holds its text. Times are compared with `created_at` (enqueue time); relative bounds use the
//! database's clock, the one that wrote `created_at`.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::GenericClient;

use crate::admin::{AdminError, FilterParams};
use crate::state::MessageStatus;

/// The columns of a destination's flow-control state (see [`FLOW_STATE`]).
macro_rules! flow_state {
    () => {
        "SELECT destination, \
             CASE WHEN paused_at IS NOT NULL THEN 'paused' \
                 WHEN throttled_until > now() THEN 'open' \
                 WHEN breaker = 'open' AND open_until > now() THEN 'open' \
                 WHEN breaker <> 'closed' THEN 'half_open' ELSE 'closed' END AS state, \
             paused_at, paused_by, paused_reason, rate_per_sec, \
             CASE WHEN rate_per_sec IS NULL THEN NULL ELSE least(burst, tokens + rate_per_sec \
                 * greatest(EXTRACT(EPOCH FROM now() - refilled_at)::float8, 0)) END AS tokens, \
             failures, \
             CASE WHEN throttled_until > now() THEN throttled_until ELSE open_until END \
                 AS open_until, \
             CASE WHEN throttled_until > now() THEN throttle_reason ELSE open_reason END \
                 AS open_reason \
         FROM txoutbox_destinations"
    };
}

/// A failure's text with what varies between two failures of one cause replaced, and what tells
/// causes apart kept, cut to 300 characters. In order: UUIDs become `<uuid>`; email addresses
/// `<email>` (a bounce names its recipient; the dashboard scrubs the same shape from the text it
/// shows, so a group's text never holds an address); timestamps (ISO 8601 dates and times, and
/// `hh:mm:ss`) `<time>`; standalone runs of digits `<n>` (ids, amounts, card numbers), except the
/// status codes 100 to 599 (HTTP, SMTP); and words of six characters or more that mix digits
/// with letters `<id>` (`ch_3Mml…`, request ids). A run of digits or a word inside a dotted name,
/// after `:` or `-` (a host name, an address, a port, a version) is kept: failures of
/// `api.stripe.com` and of `10.0.0.5:5432` stay apart. Failures with the same normalised text
/// form one group of `failures`.
macro_rules! normalised_error {
    ($text:literal) => {
        concat!(
            "left(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(",
            $text,
            ", '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', \
             '<uuid>', 'g'), '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+', '<email>', 'g'), \
             '[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}([.,][0-9]+)?)?\
             (Z|[+-][0-9]{2}(:?[0-9]{2})?)?)?|[0-9]{2}:[0-9]{2}:[0-9]{2}([.,][0-9]+)?', \
             '<time>', 'g'), \
             '(?<![A-Za-z0-9_.:-])(?![1-5][0-9]{2}(?![A-Za-z0-9_]))[0-9]+\
             (?![A-Za-z0-9_]|[.-][A-Za-z0-9])', '<n>', 'g'), \
             '(?<![A-Za-z0-9_.:-])(?=[A-Za-z0-9_]{6})[A-Za-z_]*[0-9][A-Za-z0-9_]*\
             (?![A-Za-z0-9_]|[.-][A-Za-z0-9])', '<id>', 'g'), 300)"
        )
    };
}

/// The WHERE conditions of a message filter, over a table aliased `t`: `hot` for
/// `txoutbox_messages`, `delivered` for `txoutbox_delivered` (which keeps no error text, so a
/// filter on the error selects none of its rows).
macro_rules! filter {
    (hot) => {
        concat!(
            filter!(common),
            " AND ($10::text IS NULL OR strpos(lower(t.last_error), lower($10)) > 0) \
             AND ($11::text IS NULL OR COALESCE(",
            normalised_error!("t.last_error"),
            ", '') = $11)"
        )
    };
    (delivered) => {
        concat!(
            filter!(common),
            " AND $10::text IS NULL AND $11::text IS NULL"
        )
    };
    (common) => {
        "($2::text IS NULL OR t.destination = $2) \
         AND ($3::timestamptz IS NULL OR t.created_at >= $3) \
         AND ($4::float8 IS NULL OR t.created_at >= now() - make_interval(secs => $4)) \
         AND ($5::timestamptz IS NULL OR t.created_at < $5) \
         AND ($6::float8 IS NULL OR t.created_at < now() - make_interval(secs => $6)) \
         AND ($7::text IS NULL OR t.downstream_key = $7) \
         AND ($8::text IS NULL OR t.ordering_key = $8) \
         AND ($12::timestamptz IS NULL OR (t.created_at, t.seq) < ($12, $13::int8))"
    };
}

pub(crate) mod discard;
pub(crate) mod flow;
pub(crate) mod inspect;
pub(crate) mod known;
pub(crate) mod purge;
pub(crate) mod replay;
pub(crate) mod stats;

/// The relays' wake-up channel (a replay is rare: the hint in the transaction costs nothing).
/// Hints the relays on their wake-up channel ([`crate::store::wake::notify`]).
pub(crate) async fn notify(client: &(impl GenericClient + Sync)) -> Result<(), AdminError> {
    crate::store::wake::notify(&crate::store::Unnamed(client)).await?;
    Ok(())
}

type Param<'a> = (&'a (dyn ToSql + Sync), Type);

/// A filtered statement's parameters: `first` as $1, then the filter's ($2..$13).
fn bind<'a>(first: Param<'a>, p: &'a FilterParams) -> [Param<'a>; 13] {
    [
        first,
        (&p.destination, Type::TEXT),
        (&p.since_at, Type::TIMESTAMPTZ),
        (&p.since_ago, Type::FLOAT8),
        (&p.until_at, Type::TIMESTAMPTZ),
        (&p.until_ago, Type::FLOAT8),
        (&p.downstream_key, Type::TEXT),
        (&p.ordering_key, Type::TEXT),
        (&p.limit, Type::INT8),
        (&p.error_contains, Type::TEXT),
        (&p.error_class, Type::TEXT),
        (&p.before_at, Type::TIMESTAMPTZ),
        (&p.before_seq, Type::INT8),
    ]
}

/// The ids a statement returns as its first column.
async fn ids(
    client: &impl GenericClient,
    statement: &str,
    params: &[Param<'_>],
) -> Result<Vec<uuid::Uuid>, AdminError> {
    client
        .query_typed(statement, params)
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()
        .map_err(AdminError::from)
}

/// The ids a filtered `statement` selects among `statuses` (its `$1`, the filter after it).
async fn ids_by_status(
    client: &impl GenericClient,
    statement: &str,
    statuses: &[MessageStatus],
    filter: &FilterParams,
) -> Result<Vec<uuid::Uuid>, AdminError> {
    let names: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
    ids(client, statement, &bind((&names, Type::TEXT_ARRAY), filter)).await
}
