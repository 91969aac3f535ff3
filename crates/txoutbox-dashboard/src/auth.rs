//! Who is asking, and may they: the Host check of a dashboard without users, HTTP Basic users
//! with roles, the cross-site check on actions, and the security headers every answer carries.

use std::fmt;
use std::str::FromStr;

use axum::extract::rejection::ExtensionRejection;
use axum::extract::{FromRequestParts, OriginalUri, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::Shared;

/// What a user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Reads every page and API answer; no action.
    Viewer,
    /// Reads, replays, discards, and pauses and resumes destinations.
    Operator,
}

impl FromStr for Role {
    type Err = UserError;

    fn from_str(s: &str) -> Result<Self, UserError> {
        match s {
            "viewer" => Ok(Role::Viewer),
            "operator" => Ok(Role::Operator),
            other => Err(UserError(format!(
                "{other:?} is not a role (viewer, operator)"
            ))),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        })
    }
}

/// A user spec that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid user: {0}")]
pub struct UserError(String);

/// One user of the dashboard. Only the SHA-256 of the password is kept.
#[derive(Clone)]
pub struct User {
    name: String,
    password_sha256: [u8; 32],
    role: Role,
}

impl fmt::Debug for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

impl User {
    /// Reads `NAME:PASSWORD:ROLE` (the `--user` flag's form). The password may contain `:`; a
    /// password of the form `sha256:<64 hex digits>` is the SHA-256 of the real one (keep
    /// passwords out of process lists and shell history: `printf %s PASSWORD | sha256sum`).
    pub fn parse(spec: &str) -> Result<Self, UserError> {
        let (name, rest) = spec
            .split_once(':')
            .ok_or_else(|| UserError("expected NAME:PASSWORD:ROLE".into()))?;
        let (password, role) = rest
            .rsplit_once(':')
            .ok_or_else(|| UserError("expected NAME:PASSWORD:ROLE".into()))?;
        if name.is_empty() || name.chars().any(|c| c.is_control()) {
            return Err(UserError(
                "a user name is non-empty, without control characters".into(),
            ));
        }
        if password.is_empty() {
            return Err(UserError(format!("user {name:?} has an empty password")));
        }
        let password_sha256 = match password.strip_prefix("sha256:") {
            Some(hash) => {
                let bytes = hex::decode(hash).map_err(|_| {
                    UserError(format!("user {name:?}: sha256: takes 64 hex digits"))
                })?;
                <[u8; 32]>::try_from(bytes.as_slice())
                    .map_err(|_| UserError(format!("user {name:?}: sha256: takes 64 hex digits")))?
            }
            None => Sha256::digest(password.as_bytes()).into(),
        };
        Ok(User {
            name: name.to_owned(),
            password_sha256,
            role: role.parse()?,
        })
    }

    /// The user's name (recorded in the attempt log with each action).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The user's role.
    pub fn role(&self) -> Role {
        self.role
    }
}

/// The signed-in user of a request.
#[derive(Debug, Clone)]
pub(crate) struct Principal {
    pub name: String,
    pub role: Role,
}

impl Principal {
    pub fn may_act(&self) -> bool {
        self.role == Role::Operator
    }
}

/// The path prefix the dashboard is mounted at (`""` at the root, `/outbox` nested there).
#[derive(Debug, Clone)]
pub(crate) struct Base(pub String);

/// What a handler reads before its own inputs: the dashboard's state, the signed-in user and the
/// path prefix (the last two put in the request by [`guard`]).
pub(crate) struct Caller {
    pub app: Shared,
    pub who: Principal,
    pub base: Base,
}

impl FromRequestParts<Shared> for Caller {
    type Rejection = ExtensionRejection;

    async fn from_request_parts(parts: &mut Parts, app: &Shared) -> Result<Self, Self::Rejection> {
        let Extension(who) = Extension::<Principal>::from_request_parts(parts, app).await?;
        let Extension(base) = Extension::<Base>::from_request_parts(parts, app).await?;
        Ok(Self {
            app: app.clone(),
            who,
            base,
        })
    }
}

/// The user `authorization` names, if its password is right. Every user's hash is compared, in
/// constant time, whatever matches first.
fn authenticate<'a>(users: &'a [User], authorization: Option<&HeaderValue>) -> Option<&'a User> {
    let value = authorization?.to_str().ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (name, password) = decoded.split_once(':')?;
    let given: [u8; 32] = Sha256::digest(password.as_bytes()).into();
    let mut found = None;
    for user in users {
        let same_name = user.name.as_bytes().ct_eq(name.as_bytes());
        let same_password = user.password_sha256.ct_eq(&given);
        if bool::from(same_name & same_password) && found.is_none() {
            found = Some(user);
        }
    }
    found
}

/// True when the request comes from a page of another site: its `Sec-Fetch-Site` says so, or
/// its `Origin` is not this host. Requests without either (scripts, curl) are not a browser's
/// cross-site request.
fn cross_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return !matches!(site.to_str(), Ok("same-origin" | "none"));
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    let Ok(origin) = origin.to_str() else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin_host = origin.split_once("://").map(|(_, rest)| rest);
    match (origin_host, host) {
        (Some(o), Some(h)) => !o.eq_ignore_ascii_case(h),
        _ => true,
    }
}

fn refuse(status: StatusCode, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{message}\n"),
    )
        .into_response()
}

/// Signs the request in, refuses what it may not do, and adds the security headers.
pub(crate) async fn guard(State(app): State<Shared>, mut req: Request, next: Next) -> Response {
    let inner = req.uri().path().to_owned();
    let outer = req
        .extensions()
        .get::<OriginalUri>()
        .map(|u| u.0.path().to_owned())
        .unwrap_or_else(|| inner.clone());
    let base = if inner == "/" {
        outer.trim_end_matches('/').to_owned()
    } else {
        outer.strip_suffix(&inner).unwrap_or("").to_owned()
    };

    let users = &app.config.users;
    if users.is_empty() {
        let host = crate::host::of_request(req.headers(), req.uri());
        if !crate::host::is_answered(host.as_deref(), &app.config.allowed_hosts) {
            return secure(crate::host::misdirected(host.as_deref()));
        }
    }
    let principal = if users.is_empty() {
        Principal {
            name: "local".into(),
            role: Role::Operator,
        }
    } else {
        match authenticate(users, req.headers().get(header::AUTHORIZATION)) {
            Some(user) => Principal {
                name: user.name.clone(),
                role: user.role,
            },
            None => {
                let mut response = refuse(StatusCode::UNAUTHORIZED, "sign in to the dashboard");
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"txoutbox\", charset=\"UTF-8\""),
                );
                return secure(response);
            }
        }
    };
    if req.method() == Method::POST {
        if cross_site(req.headers()) {
            return secure(refuse(
                StatusCode::FORBIDDEN,
                "cross-site request refused: actions are taken from the dashboard's own pages",
            ));
        }
        if !principal.may_act() {
            return secure(refuse(
                StatusCode::FORBIDDEN,
                &format!(
                    "user {} is a viewer: actions need the operator role",
                    principal.name
                ),
            ));
        }
    }
    req.extensions_mut().insert(principal);
    req.extensions_mut().insert(Base(base));
    secure(next.run(req).await)
}

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

fn secure(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // Pages and answers hold payloads and errors: never kept by a browser or a proxy.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(name: &str, password: &str) -> HeaderValue {
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{name}:{password}"));
        HeaderValue::from_str(&format!("Basic {encoded}")).expect("header")
    }

    #[test]
    fn a_user_signs_in_with_a_plain_or_a_hashed_password() {
        let hash = hex::encode(Sha256::digest(b"pa:ss"));
        let users = vec![
            User::parse("alice:pa:ss:operator").expect("alice"),
            User::parse(&format!("bob:sha256:{hash}:viewer")).expect("bob"),
        ];
        let alice = authenticate(&users, Some(&basic("alice", "pa:ss")));
        assert_eq!(alice.map(User::name), Some("alice"));
        let bob = authenticate(&users, Some(&basic("bob", "pa:ss")));
        assert_eq!(
            bob.map(|u| (u.name(), u.role())),
            Some(("bob", Role::Viewer))
        );
        assert!(authenticate(&users, Some(&basic("alice", "wrong"))).is_none());
        assert!(authenticate(&users, Some(&basic("carol", "pa:ss"))).is_none());
        assert!(authenticate(&users, None).is_none());
    }

    #[test]
    fn bad_user_specs_are_errors_not_panics() {
        for spec in [
            "",
            "alice",
            "alice:pw",
            ":pw:viewer",
            "alice::viewer",
            "alice:pw:admin",
            "alice:sha256:abc:viewer",
        ] {
            assert!(User::parse(spec).is_err(), "{spec:?}");
        }
    }

    #[test]
    fn a_post_from_another_site_is_cross_site() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("ops.example:9470"));
        assert!(!cross_site(&headers));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://ops.example:9470"),
        );
        assert!(!cross_site(&headers));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(cross_site(&headers));
        headers.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(!cross_site(&headers));
        headers.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(cross_site(&headers));
    }
}
