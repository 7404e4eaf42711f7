//! The caller of a request: its `Authorization: Bearer <key>` header, turned
//! into a [`Caller`] by the process's [`Authenticator`](crate::auth::Authenticator).
//! A handler takes a `Caller` as its first argument, so a request without a
//! valid key is refused (401) before its body is read, and checks the scope it
//! needs (403) before it does anything. A submit also passes its tenant's
//! quotas here ([`admit_submit`]).
//!
//! Requests whose well-formed key is not valid are counted per peer address
//! (`DOCSTREAM_AUTH_FAILURES_PER_PEER_PER_S`, with ten seconds' worth as a
//! burst): past that, a key this process does not know is refused with 429
//! before it is looked up, so made-up keys cannot keep the store busy. Keys
//! the process knows are never held up by it, even from a busy address (a
//! proxy in front of many clients).

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use super::ApiError;
use std::net::IpAddr;

use super::state::Api;
use crate::auth::{bearer, AuthError, Caller};
use crate::domain::{key_is_well_formed, Scope};

/// Lets one submit of `caller` through: it needs the `submit` scope and a
/// token of its tenant's rate (429 with `Retry-After` without one). Answers
/// the tenant's cap on open jobs, which the insert enforces.
pub(super) fn admit_submit(api: &Api, caller: &Caller) -> Result<Option<i64>, ApiError> {
    caller.require(Scope::Submit)?;
    let quota = caller.quota.over(api.settings.quota);
    if let Some(rate) = quota.submit_rate_per_s {
        let taken = api
            .submit_rates
            .take(caller.tenant_id, rate, quota.submit_burst);
        if let Err(wait) = taken {
            return Err(ApiError::TooManyRequests {
                message: format!(
                    "tenant {} is past its submit rate ({rate}/s here); retry after Retry-After",
                    caller.tenant
                ),
                retry_after_s: wait.as_secs_f64().ceil().max(1.0) as u64,
            });
        }
    }
    Ok(quota.max_open_jobs)
}

impl FromRequestParts<Api> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, Self::Rejection> {
        let presented = match parts.headers.get(AUTHORIZATION) {
            None => None,
            Some(value) => {
                let value = value.to_str().ok().and_then(bearer).ok_or_else(|| {
                    ApiError::Unauthorized("Authorization must be Bearer <key>".into())
                })?;
                Some(value)
            }
        };
        let peer = parts.extensions.get::<Peer>().map(|p| p.0);
        let rate = f64::from(api.settings.auth_failures_per_peer_per_s);
        let burst = api.settings.auth_failures_per_peer_per_s.saturating_mul(10);
        let failures = &api.failed_authentications;
        let gate = || match peer {
            Some(peer) => failures.check(peer, rate, burst),
            None => Ok(()),
        };
        let authenticated = api.auth.authenticate_gated(presented, gate).await;
        // Only a key that had to be looked up counts: no key, or one that is
        // not even well-formed, costs nothing.
        let looked_up = presented.is_some_and(key_is_well_formed);
        if let (Err(AuthError::Invalid), Some(peer), true) = (&authenticated, peer, looked_up) {
            let _ = failures.take(peer, rate, burst);
        }
        Ok(authenticated?)
    }
}

/// A keyed route's contract: its key, the refusals of a key that is missing
/// or not valid (401), and of an address that keeps presenting such keys
/// (429). The scope a handler checks is its own to declare (403).
impl aide::OperationInput for Caller {
    fn operation_input(
        _: &mut aide::generate::GenContext,
        operation: &mut aide::openapi::Operation,
    ) {
        let key = aide::openapi::SecurityRequirement::from_iter([("ApiKey".to_owned(), vec![])]);
        operation.security = vec![key];
        super::describe::refuse(operation, &[401, 429]);
    }
}

/// The address a request's connection came from (the listener adds it).
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub IpAddr);
