//! The caller of a request: its `Authorization: Bearer <key>` header, turned
//! into a [`Caller`] by the process's [`Authenticator`](crate::auth::Authenticator).
//! A handler takes a `Caller` as its first argument, so a request without a
//! valid key is refused (401) before its body is read, and checks the scope it
//! needs (403) before it does anything.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use super::ApiError;
use crate::auth::{bearer, Caller};
use crate::pipeline::Services;

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
