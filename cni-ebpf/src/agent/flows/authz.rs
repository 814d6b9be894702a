//! Who may read flows (they name every pod a node's pods talk to): with
//! `--flows-auth=kubernetes` (the default), a reader presents a bearer token
//! (`Authorization: Bearer …`, a ServiceAccount's or a user's); the API server
//! authenticates it (a `TokenReview`) and authorizes the user it names (a
//! `SubjectAccessReview`) for `get` on the non-resource URL `/flows` — the way
//! kube-rbac-proxy guards a metrics endpoint; a ClusterRole grants it
//! (`deploy/observe-rbac.yaml`). No token is a 401, a token the API server does not
//! accept a 401, a user it does not authorize a 403. Verdicts are remembered for
//! [`VERDICT_TTL`] per token (at most [`MAX_REMEMBERED`] tokens), so a follower's
//! reconnects or a page's refreshes do not each cost two reviews.
//!
//! `--flows-auth=none` serves anyone who can connect: only allowed on a loopback listener.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{api::PostParams, Api, Client};

use crate::k8s::{ApiArgs, ApiClient};

/// The non-resource URL a reader must be allowed to `get`.
pub const FLOWS_URL: &str = "/flows";
/// How long a verdict on a token is remembered.
pub const VERDICT_TTL: Duration = Duration::from_secs(30);
/// Tokens remembered at most.
pub const MAX_REMEMBERED: usize = 1024;

/// How readers are checked (`--flows-auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Auth {
    /// TokenReview and SubjectAccessReview by the API server.
    Kubernetes,
    /// Nobody is checked (a loopback listener only).
    None,
}

/// Why a reader is turned away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 401 or 403 (503 when the API server cannot be asked).
    pub status: u16,
    pub message: String,
}

/// A verdict on a token, and when it was given.
type Remembered = HashMap<u64, (Instant, Result<String, Refusal>)>;

/// Checks readers.
pub struct Authorizer {
    /// The API server to ask (`None`: nobody is checked), and its client once made.
    api: Option<ApiArgs>,
    client: Mutex<Option<Client>>,
    remembered: Mutex<Remembered>,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer")
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

impl Authorizer {
    /// Checks nobody.
    #[must_use]
    pub fn open() -> Self {
        Self {
            api: None,
            client: Mutex::new(None),
            remembered: Mutex::new(HashMap::new()),
        }
    }

    /// Checks through the API server `api` names.
    #[must_use]
    pub fn kubernetes(api: ApiArgs) -> Self {
        Self {
            api: Some(api),
            client: Mutex::new(None),
            remembered: Mutex::new(HashMap::new()),
        }
    }

    /// The API client, made on first use.
    fn client(&self, api: &ApiArgs) -> Result<Client, Refusal> {
        let mut c = self
            .client
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = c.as_ref() {
            return Ok(c.clone());
        }
        let made = ApiClient::new(api)
            .map_err(|e| Refusal {
                status: 503,
                message: format!("no API server to check the token with: {e}"),
            })?
            .client();
        *c = Some(made.clone());
        Ok(made)
    }

    /// The user a request's `Authorization` header names, if it may read flows.
    ///
    /// # Errors
    /// The [`Refusal`] to answer with.
    pub async fn check(&self, authorization: Option<&str>) -> Result<String, Refusal> {
        let Some(api) = &self.api else {
            return Ok("anonymous".to_owned());
        };
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Refusal {
                status: 401,
                message: "a bearer token is needed (Authorization: Bearer <token>)".to_owned(),
            })?;
        let key = cni_ebpf_common::fnv1a64(&[token.as_bytes()], 0);
        if let Some(v) = self.remembered(key) {
            return v;
        }
        let client = self.client(api)?;
        let verdict = review(&client, token).await;
        // The API server unreachable is not remembered: asked again next time.
        if verdict.as_ref().err().is_none_or(|r| r.status != 503) {
            let mut m = self
                .remembered
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if m.len() >= MAX_REMEMBERED {
                m.clear();
            }
            m.insert(key, (Instant::now(), verdict.clone()));
        }
        verdict
    }

    fn remembered(&self, key: u64) -> Option<Result<String, Refusal>> {
        let m = self
            .remembered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        m.get(&key)
            .filter(|(at, _)| at.elapsed() < VERDICT_TTL)
            .map(|(_, v)| v.clone())
    }
}

/// Authenticates `token` and authorizes its user for `get /flows`.
async fn review(client: &Client, token: &str) -> Result<String, Refusal> {
    let unavailable = |e: kube::Error| Refusal {
        status: 503,
        message: format!("the API server cannot check the token now: {e}"),
    };
    let tr = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_owned(),
            ..TokenReviewSpec::default()
        },
        ..TokenReview::default()
    };
    let tr = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &tr)
        .await
        .map_err(unavailable)?;
    let status = tr.status.unwrap_or_default();
    let user = status.user.unwrap_or_default();
    let Some(name) = user.username.filter(|_| status.authenticated == Some(true)) else {
        return Err(Refusal {
            status: 401,
            message: format!(
                "the token is not accepted{}",
                status.error.map(|e| format!(": {e}")).unwrap_or_default()
            ),
        });
    };
    let sar = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(name.clone()),
            groups: user.groups,
            uid: user.uid,
            extra: user.extra,
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(FLOWS_URL.to_owned()),
                verb: Some("get".to_owned()),
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let sar = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &sar)
        .await
        .map_err(unavailable)?;
    let allowed = sar.status.is_some_and(|s| s.allowed);
    if allowed {
        Ok(name)
    } else {
        Err(Refusal {
            status: 403,
            message: format!("user {name:?} may not get {FLOWS_URL}"),
        })
    }
}
