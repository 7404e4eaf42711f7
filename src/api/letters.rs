//! `GET /v1/dead-letters`: the caller's tenant's dead letters, newest
//! first: the Kafka intake records refused after their key named the
//! tenant, with why (see [`crate::store::letters`]). Operators see every
//! letter on the topic itself (`docstream dlq`).
//!
//! `POST /v1/dead-letters/{id}/replay` produces a letter's original record
//! to the intake again, once (after a full queue emptied, a key's scope
//! was fixed, …): the same bytes, key and headers, so its idempotency key
//! still makes a second arrival the same job.

use aide::axum::routing::{get_with, post_with};
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::extract::{Path, RawQuery, State};
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::json;

use super::describe;
use super::query::{each_param, page_limit};
use super::state::Api;
use super::ApiError;
use crate::auth::Caller;
use crate::domain::Scope;
use crate::kafka::reader::{produce_copy, TopicReader, READER_GROUP};
use crate::store::letters::{self, ReplayRefused, TenantLetter};

/// Letters a page holds when the query does not say.
pub(super) const DEFAULT_LETTERS: i64 = 50;

pub(super) fn routes() -> ApiRouter<Api> {
    ApiRouter::new().api_route("/v1/dead-letters", get_with(list_letters, describe_list))
}

/// The replay, outside the REST answer bound: reading the original and
/// producing its copy may take the broker's time (30 s at most each).
pub(super) fn replay_routes() -> ApiRouter<Api> {
    ApiRouter::new().api_route(
        "/v1/dead-letters/{id}/replay",
        post_with(replay_letter, describe_replay),
    )
}

/// Where a replayed letter's record went.
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "Replayed", deny_unknown_fields)]
pub(super) struct Replayed {
    /// The letter.
    id: i64,
    /// The topic the copy was produced to (the original's).
    topic: String,
    /// Its partition.
    partition: i32,
    /// Its offset.
    offset: i64,
}

async fn replay_letter(
    caller: Caller,
    State(api): State<Api>,
    Path(id): Path<String>,
) -> Result<Json<Replayed>, ApiError> {
    // A replay submits the record again.
    caller.require(Scope::Submit)?;
    let id: i64 = id
        .parse()
        .map_err(|_| ApiError::BadRequest(format!("{id:?} is not a dead letter's id")))?;
    let pool = &api.pool;
    let (topic, partition, offset) = match letters::claim_replay(pool, caller.tenant_id, id).await {
        Ok(source) => source,
        Err(ReplayRefused::NotFound(_)) => {
            return Err(ApiError::NotFound(format!("no dead letter {id}")))
        }
        Err(e @ ReplayRefused::Replayed(..)) => return Err(ApiError::Conflict(e.to_string())),
        Err(ReplayRefused::Store(e)) => return Err(e.into()),
    };
    // Detached: once claimed, the replay ends (produced, or the claim given
    // back) even if the caller goes away.
    let replay = tokio::spawn(replay_claimed(api.clone(), id, (topic, partition, offset)));
    replay
        .await
        .map_err(|e| ApiError::Unavailable(format!("the replay stopped: {e}")))?
}

fn describe_replay(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "replayDeadLetter",
        "extractions",
        "Replay a dead letter",
        "Produces the letter's original record to its topic again (scope `submit`): the \
         same bytes, key and headers, once. Use it when what refused the record has \
         changed; its idempotency key still makes a record that became a job the same \
         job. A record the intake refuses again is a new letter. 409 when the letter was \
         replayed before, 410 when the topic no longer retains the record.",
    );
    let id = describe::path_parameter(
        "id",
        "The letter's `id`.",
        json!({"type": "integer", "format": "int64", "minimum": 1}),
    );
    let op = describe::parameters(op, [id]);
    let op = op.response_with::<200, Json<Replayed>, _>(|a| a.description("Where the copy went."));
    describe::refusals(op, &[400, 403, 404, 409, 410])
}

/// Replays claimed letter `id`, whose original is at `source`.
async fn replay_claimed(
    api: Api,
    id: i64,
    (topic, partition, offset): (String, i32, i64),
) -> Result<Json<Replayed>, ApiError> {
    let pool = &api.pool;
    let kafka = api.consumers.kafka().clone();
    let group = api.consumers.name(READER_GROUP);
    let read = {
        let topic = topic.clone();
        tokio::task::spawn_blocking(move || {
            TopicReader::new(&kafka, &group)?.read_one(&topic, partition, offset)
        })
    };
    // A read that panicked is answered as one the broker did not answer.
    let read = read.await.map_err(|e| e.to_string());
    let original = match read.and_then(|r| r.map_err(|e| e.to_string())) {
        Ok(Some(original)) => original,
        Ok(None) => {
            letters::finish_replay(pool, id, None).await?;
            return Err(ApiError::Gone(format!(
                "dead letter {id}'s record ({topic}/{partition}/{offset}) is no longer retained"
            )));
        }
        Err(e) => {
            letters::finish_replay(pool, id, None).await?;
            return Err(ApiError::Unavailable(format!(
                "the broker did not answer: {e}"
            )));
        }
    };
    let value = rdkafka::Message::payload(&original)
        .unwrap_or_default()
        .to_vec();
    match produce_copy(api.consumers.kafka(), &topic, &original, &value).await {
        Ok(place) => {
            letters::finish_replay(pool, id, Some(place)).await?;
            Ok(Json(Replayed {
                id,
                topic,
                partition: place.0,
                offset: place.1,
            }))
        }
        Err(e) => {
            letters::finish_replay(pool, id, None).await?;
            Err(ApiError::Unavailable(format!(
                "the broker did not take the record: {e}"
            )))
        }
    }
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
    State(api): State<Api>,
    RawQuery(query): RawQuery,
) -> Result<Json<LetterPage>, ApiError> {
    caller.require(Scope::Read)?;
    let (before, limit) = parse(query.as_deref().unwrap_or_default())?;
    let mut items = letters::list(&api.pool, caller.tenant_id, before, limit + 1).await?;
    let more = items.len() as i64 > limit;
    items.truncate(limit as usize);
    let next_cursor = (more.then(|| items.last().map(|l| l.id)).flatten())
        .map(|id| URL_SAFE_NO_PAD.encode(id.to_be_bytes()));
    Ok(Json(LetterPage { items, next_cursor }))
}

fn describe_list(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "listDeadLetters",
        "extractions",
        "List dead letters",
        "The caller's tenant's dead letters, newest first (scope `read`): the records of \
         the Kafka intake that were refused after their key named the tenant (an invalid \
         request, a reused key, a full queue), each with where it was and why. Records \
         refused before (no key, a wrong one) belong to no tenant, and only operators \
         see them. Follow `next_cursor` until it is null.",
    );
    let parameters = [
        describe::query_parameter(
            "limit",
            false,
            "Letters per page.",
            json!({"type": "integer", "minimum": 1, "maximum": crate::store::list::MAX_PAGE,
                   "default": DEFAULT_LETTERS}),
        ),
        describe::query_parameter(
            "cursor",
            false,
            "The previous page's `next_cursor`.",
            json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]$"}),
        ),
    ];
    let op = describe::parameters(op, parameters);
    let op = op.response_with::<200, Json<LetterPage>, _>(|a| a.description("A page of letters."));
    describe::refusals(op, &[400, 403])
}

/// The page a query asks for: `cursor` and `limit`.
fn parse(query: &str) -> Result<(Option<i64>, i64), ApiError> {
    let (mut before, mut limit) = (None, DEFAULT_LETTERS);
    each_param(query, |name, value| {
        match name {
            "cursor" => {
                let bytes = URL_SAFE_NO_PAD.decode(value.as_bytes()).ok();
                let id = bytes.and_then(|b| <[u8; 8]>::try_from(b).ok());
                before = Some(i64::from_be_bytes(id.ok_or("not a cursor")?));
            }
            "limit" => limit = page_limit(value)?,
            _ => return Err("unknown".into()),
        }
        Ok(())
    })?;
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
