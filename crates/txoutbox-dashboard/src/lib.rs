//! The operator dashboard: server-rendered pages and a JSON API to see, search and repair the
//! outbox, as an [`axum::Router`] a service mounts under any prefix, or the `txoutbox dashboard`
//! command serves on its own.
//!
//! ```no_run
//! use txoutbox_dashboard::{DashboardConfig, Role, User};
//!
//! # fn app(pool: deadpool_postgres::Pool) -> Result<axum::Router, txoutbox_dashboard::UserError> {
//! let config = DashboardConfig {
//!     users: vec![User::parse("alice:s3cret:operator")?, User::parse("bob:sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08:viewer")?],
//!     redact: vec!["email".into(), "card".into()],
//!     ..DashboardConfig::default()
//! };
//! let app = axum::Router::new().nest("/outbox", txoutbox_dashboard::router(pool, config));
//! # Ok(app)
//! # }
//! ```
//!
//! Every action goes through the core's admin functions ([`txoutbox::admin::replay`],
//! [`txoutbox::admin::discard`], [`txoutbox::admin::pause_destination`], [`txoutbox::admin::resume_destination`]), the
//! same the `txoutbox` command calls, and is recorded in the attempt log with the user's name.
//!
//! Layout: `auth` checks users, roles and cross-site requests and sets the security headers;
//! `host` says which Host a dashboard without users answers; `schema` answers 503 while the
//! database's schema is not the one this build reads; `query` reads a page's filter from its
//! query string; `redact` hides configured fields (failing closed) and scrubs free text; `pages`
//! renders the HTML (with `chart`'s inline SVG); `api` answers JSON; the CSS and the
//! live-refresh script are in `assets/`, embedded.

mod api;
mod auth;
mod chart;
mod host;
mod pages;
mod query;
mod redact;
mod schema;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use txoutbox::admin::{
    DestinationFlow, DiscardOptions, DiscardReport, ReplayOptions, ReplayReport, ReplaySelection,
};

use auth::Principal;

pub use auth::{Role, User, UserError};

/// How many rows a list page shows by default.
pub const DEFAULT_PAGE_SIZE: u64 = 50;

/// The address `txoutbox dashboard` listens on by default.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9470";

/// What the dashboard shows and who may use it.
#[derive(Debug, Clone)]
pub struct DashboardConfig {
    /// Who may sign in (HTTP Basic). Empty: no sign-in, everyone is an operator, and only
    /// requests whose Host is a loopback name or address (`localhost`, 127.0.0.0/8, `[::1]`,
    /// with or without a port) or one of [`DashboardConfig::allowed_hosts`] are answered; the
    /// rest get 421 (Misdirected Request), whatever their method. A page of another site that
    /// rebinds its name to 127.0.0.1 (DNS rebinding) reaches the dashboard from a visitor's
    /// browser as its own origin, but still under its own name. Serve it on loopback
    /// ([`listen_addr`]), or configure users.
    pub users: Vec<User>,
    /// More Host names a dashboard without users answers (`ops.example`, or `ops.example:8443`
    /// for that port only), compared without case: for one behind the service's own access
    /// control or a reverse proxy that forwards its own Host. Not needed with users: a
    /// rebinding page cannot send a user's credentials (the browser keeps them for the real
    /// origin), so every request is signed in whatever its Host.
    pub allowed_hosts: Vec<String>,
    /// Field names whose values never reach the browser, compared without case, at any depth
    /// of a payload, its headers and a stored response (its headers and its JSON body).
    ///
    /// Redaction fails closed: a document that cannot be shown to be redacted (a body that is
    /// not JSON, JSON that serde_json refuses such as a number out of range or nesting past 128
    /// levels) is withheld whole, with a placeholder saying why. Without redacted fields every
    /// document is shown as stored.
    ///
    /// Free text (a downstream's error text, receipts, a breaker's reason) is scrubbed, not
    /// withheld: on a message's own page and API answer, of the values its payload and headers
    /// hid (strings and numbers of 3 characters or more, compared without ASCII case; all of its
    /// text is withheld when its payload or headers were); everywhere, of text shaped like a
    /// redacted kind: email addresses when a field name contains `mail`, card numbers (13 to 19
    /// digits passing the Luhn check) when one contains `card` or is `pan`. Lists and failure
    /// groups do not read payloads: a value of no known shape (a name) that a downstream copies
    /// into its error text shows there. Failure groups normalise email addresses to `<email>`,
    /// timestamps to `<time>`, standalone numbers to `<n>` (status codes 100 to 599 kept) and
    /// long words mixing digits and letters to `<id>`.
    ///
    /// With redacted fields, the error-text search (`error=` on pages and in the API's filters)
    /// is refused (400): it matches the stored text, so it would confirm a hidden value. The
    /// failure groups (`error_class=`) still select rows by their normalised text.
    pub redact: Vec<String>,
    /// A link for a message's trace id: `{trace_id}` is replaced (e.g.
    /// `https://tempo.example/trace/{trace_id}`).
    pub trace_url: Option<String>,
    /// Effect names the services enqueue under ([`txoutbox::Claim::enqueue`]): `/keys` finds a
    /// request's messages by the downstream keys derived for them, besides those its transaction
    /// wrote.
    pub effects: Vec<String>,
    /// The destinations the service's relays have sinks for: a pause or resume of one of these
    /// is accepted before any row names it. Any other name nothing in the database names is
    /// refused as a likely typo, with the known ones (`"force": true` in the API accepts it).
    pub destinations: Vec<String>,
    /// Rows per list page (default 50, at most 500).
    pub page_size: u64,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        Self {
            users: Vec::new(),
            allowed_hosts: Vec::new(),
            redact: Vec::new(),
            trace_url: None,
            effects: Vec::new(),
            destinations: Vec::new(),
            page_size: DEFAULT_PAGE_SIZE,
        }
    }
}

/// The shared state of every handler.
struct App {
    pool: deadpool_postgres::Pool,
    config: DashboardConfig,
    schema: schema::SchemaGate,
    /// What [`DashboardConfig::redact`] hides, and how.
    redaction: redact::Redaction,
}

type Shared = Arc<App>;

/// The dashboard: pages at `/`, `/messages`, `/messages/{id}`, `/failures`, `/relays`, `/keys`, the JSON API
/// under `/api`, assets under `/assets`. Links work under whatever prefix it is nested at. A
/// destination in a path is one percent-encoded segment (`/destinations/webhook:orders/pause`).
///
/// While the database's schema is not the version this build reads ([`txoutbox::check_schema`],
/// checked at most every 3 s), every page and API route answers 503 with the line that says what
/// to run (`{"error": …}` under `/api`); it serves again by itself once the schema matches.
pub fn router(pool: deadpool_postgres::Pool, config: DashboardConfig) -> Router {
    let mut config = config;
    config.page_size = config.page_size.clamp(1, 500);
    let redaction = redact::Redaction::new(&config.redact);
    let app = Arc::new(App {
        pool,
        config,
        schema: schema::SchemaGate::default(),
        redaction,
    });
    Router::new()
        .route("/", get(pages::overview))
        .route("/messages", get(pages::messages))
        .route("/messages/{id}", get(pages::message))
        .route(
            "/messages/{id}/replay",
            post(pages::act_on_one::<ReplayOptions>),
        )
        .route("/replay", post(pages::act_on_selected::<ReplayOptions>))
        .route("/replay/filter", post(pages::replay_filter))
        .route(
            "/messages/{id}/discard",
            post(pages::act_on_one::<DiscardOptions>),
        )
        .route("/discard", post(pages::act_on_selected::<DiscardOptions>))
        .route("/discard/filter", post(pages::discard_filter))
        .route(
            "/destinations/{destination}/pause",
            post(pages::pause_destination),
        )
        .route(
            "/destinations/{destination}/resume",
            post(pages::resume_destination),
        )
        .route("/failures", get(pages::failures))
        .route("/relays", get(pages::relays))
        .route("/keys", get(pages::keys))
        .route("/api/stats", get(api::stats))
        .route("/api/messages", get(api::messages))
        .route("/api/messages/{id}", get(api::message))
        .route(
            "/api/messages/{id}/replay",
            post(api::act_on_one::<ReplayOptions>),
        )
        .route("/api/replay", post(api::act_on_selected::<ReplayOptions>))
        .route(
            "/api/messages/{id}/discard",
            post(api::act_on_one::<DiscardOptions>),
        )
        .route("/api/discard", post(api::act_on_selected::<DiscardOptions>))
        .route("/api/destinations", get(api::destinations))
        .route(
            "/api/destinations/{destination}/pause",
            post(api::pause_destination),
        )
        .route(
            "/api/destinations/{destination}/resume",
            post(api::resume_destination),
        )
        .route("/api/relays", get(api::relays))
        .route("/api/keys", get(api::key))
        .route("/assets/dashboard.css", get(pages::css))
        .route("/assets/live.js", get(pages::script))
        .fallback(pages::not_found)
        // Inside the sign-in: only a user learns the schema's state, and its 503 carries the
        // security headers.
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            schema::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            auth::guard,
        ))
        .with_state(app)
}

/// Where `txoutbox dashboard` may listen: `requested` when users are configured or it is a
/// loopback address; else the loopback address with the same port, and a notice saying why.
pub fn listen_addr(requested: SocketAddr, has_users: bool) -> (SocketAddr, Option<String>) {
    if has_users {
        return (requested, None);
    }
    if requested.ip().is_loopback() {
        return (
            requested,
            Some(format!(
                "no users configured (--user): the dashboard is open to anyone on this machine; \
                 listening on {requested} (loopback only)"
            )),
        );
    }
    let loopback = SocketAddr::from(([127, 0, 0, 1], requested.port()));
    (
        loopback,
        Some(format!(
            "no users configured (--user): listening on {loopback} (loopback only) instead of \
             {requested}; add --user NAME:PASSWORD:ROLE to serve other machines"
        )),
    )
}

/// Why a page or an API call failed.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Admin(#[from] txoutbox::admin::AdminError),
    #[error("the database is unavailable: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("{0}")]
    BadRequest(String),
    #[error("not found")]
    NotFound,
    #[error(transparent)]
    Schema(txoutbox::SchemaMismatch),
}

impl Failure {
    fn status(&self) -> StatusCode {
        use txoutbox::admin::AdminError as A;
        match self {
            Failure::Admin(A::NotFound(_)) | Failure::NotFound => StatusCode::NOT_FOUND,
            Failure::Admin(
                A::Leased { .. }
                | A::NotReplayable { .. }
                | A::KeyConflict { .. }
                | A::TooMany { .. },
            ) => StatusCode::CONFLICT,
            Failure::Admin(A::Invalid(_) | A::UnknownDestination { .. })
            | Failure::BadRequest(_) => StatusCode::BAD_REQUEST,
            Failure::Admin(e) if e.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
            Failure::Pool(_) | Failure::Schema(_) => StatusCode::SERVICE_UNAVAILABLE,
            Failure::Admin(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// The operator's actions, as the pages' forms and the API both run them: each takes a
/// connection of its own once its input is checked.
impl App {
    async fn client(&self) -> Result<deadpool_postgres::Object, Failure> {
        Ok(self.pool.get().await?)
    }

    async fn replay(
        &self,
        selection: &ReplaySelection,
        options: &ReplayOptions,
    ) -> Result<ReplayReport, Failure> {
        let mut client = self.client().await?;
        Ok(txoutbox::admin::replay(&mut client, selection, options, None).await?)
    }

    async fn discard(
        &self,
        selection: &ReplaySelection,
        options: &DiscardOptions,
    ) -> Result<DiscardReport, Failure> {
        let mut client = self.client().await?;
        Ok(txoutbox::admin::discard(&mut client, selection, options).await?)
    }

    /// Pauses `destination` for every relay, by `who`, with a reason already checked
    /// ([`pages::pause_reason`]); one nothing names is refused unless `force`.
    async fn pause(
        &self,
        destination: &str,
        reason: &str,
        who: &Principal,
        force: bool,
    ) -> Result<DestinationFlow, Failure> {
        let mut client = self.destination_client(destination, force).await?;
        let by = Some(who.name.as_str());
        Ok(txoutbox::admin::pause_destination(&mut client, destination, reason, by).await?)
    }

    /// Ends an operator's pause of `destination`, by `who`; one nothing names is refused
    /// unless `force`.
    async fn resume(
        &self,
        destination: &str,
        who: &Principal,
        force: bool,
    ) -> Result<DestinationFlow, Failure> {
        let mut client = self.destination_client(destination, force).await?;
        let by = Some(who.name.as_str());
        Ok(txoutbox::admin::resume_destination(&mut client, destination, by).await?)
    }

    /// A connection for an action on `destination`, once its name is checked storable; one
    /// nothing names (a likely typo) is refused unless `force`: see
    /// [`txoutbox::admin::require_known_destination`], with the configured destinations.
    async fn destination_client(
        &self,
        destination: &str,
        force: bool,
    ) -> Result<deadpool_postgres::Object, Failure> {
        query::storable("destination", destination)?;
        let client = self.client().await?;
        if !force {
            txoutbox::admin::require_known_destination(
                &**client,
                destination,
                &self.config.destinations,
            )
            .await?;
        }
        Ok(client)
    }
}

/// A JSON answer.
fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (
            status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}
