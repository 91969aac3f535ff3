//! The schema gate: while the database's schema is not the version this build reads (never
//! migrated, behind, or migrated by a newer txoutbox), every page and API route answers 503 with
//! the one line that says what to run, instead of each failing on a missing table. The check is
//! one small query, its answer kept for [`RECHECK`], so the dashboard recovers by itself a few
//! seconds after `txoutbox migrate`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use txoutbox::SchemaMismatch;

use crate::auth::Base;
use crate::{Failure, Shared};

/// How long a check's answer is kept.
pub(crate) const RECHECK: Duration = Duration::from_secs(3);

/// The last check's answer: `None` a schema that matches, else why it does not.
#[derive(Default)]
pub(crate) struct SchemaGate {
    last: Mutex<Option<(Instant, Option<SchemaMismatch>)>>,
}

impl SchemaGate {
    /// Why the schema cannot be used, checked at most once per [`RECHECK`]. A database that
    /// cannot be asked lets the request through: its handler reports the outage its own way.
    async fn mismatch(&self, pool: &deadpool_postgres::Pool) -> Option<SchemaMismatch> {
        if let Some(known) = self.known() {
            return known;
        }
        let checked = match pool.get().await {
            Ok(client) => txoutbox::check_schema(&client).await,
            Err(e) => Err(e.into()),
        };
        let answer = match checked {
            Ok(_) => None,
            Err(txoutbox::Error::Schema(mismatch)) => Some(mismatch),
            Err(_) => return None,
        };
        if let Ok(mut last) = self.last.lock() {
            *last = Some((Instant::now(), answer));
        }
        answer
    }

    /// The last answer while it is fresh.
    fn known(&self) -> Option<Option<SchemaMismatch>> {
        let last = self.last.lock().ok()?;
        let (at, answer) = (*last)?;
        (at.elapsed() < RECHECK).then_some(answer)
    }
}

/// Answers 503 with the schema's line while it does not match (JSON under `/api`, a page
/// elsewhere); the assets are always served, for the error page's own style.
pub(crate) async fn guard(State(app): State<Shared>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if path.starts_with("/assets/") {
        return next.run(req).await;
    }
    let Some(mismatch) = app.schema.mismatch(&app.pool).await else {
        return next.run(req).await;
    };
    let failure = Failure::Schema(mismatch);
    if path.starts_with("/api/") {
        return crate::api::problem(&failure);
    }
    let base = req
        .extensions()
        .get::<Base>()
        .cloned()
        .unwrap_or_else(|| Base(String::new()));
    crate::pages::error_page(&base, &failure)
}
