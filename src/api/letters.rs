//! `GET /v1/dead-letters`: the caller's tenant's dead letters, newest
//! first: the Kafka intake records refused after their key named the
//! tenant, with why (see [`crate::store::letters`]). Operators see every
//! letter on the topic itself (`docstream dlq`).

use axum::extract::{RawQuery, State};
use axum::routing::get;
use axum::{Json, Router};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use schemars::JsonSchema;
use serde::Serialize;

use super::ApiError;
use crate::auth::Caller;
use crate::domain::Scope;
use crate::pipeline::Services;
use crate::store::letters::{self, TenantLetter};

/// Letters a page holds when the query does not say.
pub(super) const DEFAULT_LETTERS: i64 = 50;

pub(super) fn router() -> Router<Services> {
    Router::new().route("/v1/dead-letters", get(list_letters))
}

/// A page of the caller's tenant's dead letters.
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "DeadLetterPage", deny_unknown_fields)]
pub(super) struct LetterPage {
    /// Newest first.
    items: Vec<TenantLetter>,
    /// Where the next page starts (pass it as `cursor`), or null when this
    /// page is the last.
    next_cursor: Option<String>,
}

async fn list_letters(
    caller: Caller,
    State(services): State<Services>,
    RawQuery(query): RawQuery,
) -> Result<Json<LetterPage>, ApiError> {
    caller.require(Scope::Read)?;
    let (before, limit) = parse(query.as_deref().unwrap_or_default())?;
    let mut items = letters::list(&services.pool, caller.tenant_id, before, limit + 1).await?;
    let more = items.len() as i64 > limit;
    items.truncate(limit as usize);
    let next_cursor = (more.then(|| items.last().map(|l| l.id)).flatten())
        .map(|id| URL_SAFE_NO_PAD.encode(id.to_be_bytes()));
    Ok(Json(LetterPage { items, next_cursor }))
}

/// The page a query asks for: `cursor` and `limit`.
fn parse(query: &str) -> Result<(Option<i64>, i64), ApiError> {
    let (mut before, mut limit) = (None, DEFAULT_LETTERS);
    let mut seen = std::collections::HashSet::new();
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        let bad = |why: &str| ApiError::BadRequest(format!("query parameter `{name}`: {why}"));
        if !seen.insert(name.to_string()) {
            return Err(bad("given twice"));
        }
        match name.as_ref() {
            "cursor" => {
                let bytes = URL_SAFE_NO_PAD.decode(value.as_bytes()).ok();
                let id = bytes.and_then(|b| <[u8; 8]>::try_from(b).ok());
                before = Some(i64::from_be_bytes(id.ok_or_else(|| bad("not a cursor"))?));
            }
            "limit" => limit = super::list::page_limit(&value).map_err(|e| bad(&e))?,
            _ => return Err(bad("unknown")),
        }
    }
    Ok((before, limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_is_the_letter_it_continues_below() {
        let cursor = URL_SAFE_NO_PAD.encode(417_i64.to_be_bytes());
        assert_eq!(
            parse(&format!("cursor={cursor}&limit=3")).unwrap(),
            (Some(417), 3)
        );
        assert!(parse("cursor=abc").is_err());
        assert!(parse("limit=0").is_err());
        assert!(parse("status=x").is_err());
    }
}
