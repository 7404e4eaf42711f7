//! The caller of a request: its `Authorization: Bearer <key>` header, turned
//! into a [`Caller`] by the process's [`Authenticator`](crate::auth::Authenticator).
//! A handler takes a `Caller` as its first argument, so a request without a
//! valid key is refused (401) before its body is read, and checks the scope it
//! needs (403) before it does anything. A submit also passes its tenant's
//! quotas here ([`admit_submit`]).

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use super::ApiError;
use crate::auth::{bearer, Caller};
use crate::domain::Scope;
use crate::pipeline::Services;

/// Lets one submit of `caller` through: it needs the `submit` scope and a
/// token of its tenant's rate (429 with `Retry-After` without one). Answers
/// the tenant's cap on open jobs, which the insert enforces.
pub(super) fn admit_submit(services: &Services, caller: &Caller) -> Result<Option<i64>, ApiError> {
    caller.require(Scope::Submit)?;
    let quota = caller.quota.over(services.settings.tenant_quota());
    if let Some(rate) = quota.submit_rate_per_s {
        let taken = services
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

impl FromRequestParts<Services> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        services: &Services,
    ) -> Result<Self, Self::Rejection> {
        let presented = match parts.headers.get(AUTHORIZATION) {
            None => None,
            Some(value) => {
                let value = value.to_str().ok().and_then(bearer).ok_or_else(|| {
                    ApiError::Unauthorized("Authorization must be Bearer <key>".into())
                })?;
                Some(value)
            }
        };
        Ok(services.auth.authenticate(presented).await?)
    }
}
