//! The HTTP API on a real Postgres and Kafka: submit publishes, idempotency holds
//! under concurrency, and bad input gets a clear error with nothing written or
//! published.

use crate::common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{sample_body, topic_size, TestEnv};
use docstream::events::{decode, ExtractionSubmitted};
use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// The API of one test, served in-process, with its internal listener.
struct Api {
    env: TestEnv,
    base: String,
    /// The internal listener (`/metrics`).
    metrics: String,
    client: reqwest::Client,
    _stop: (tokio_util::sync::DropGuard, tokio_util::sync::DropGuard),
}

impl Api {
    async fn start(name: &str) -> Self {
        Self::start_with(name, |_| {}).await
    }

    /// [`Api::start`] with settings `adjust` changes.
    async fn start_with(name: &str, adjust: impl FnOnce(&mut docstream::config::Settings)) -> Self {
        let metrics = format!("127.0.0.1:{}", common::free_port());
        let env = TestEnv::with_settings(name, |s| {
            s.http_body_limit_bytes = 64 * 1024;
            s.metrics_addr = metrics.parse().unwrap();
            adjust(s);
        })
        .await;
        let services = env.services().await;
        let stop = CancellationToken::new();
        let internal = docstream::roles::metrics_endpoint(services.clone(), stop.clone());
        tokio::spawn(internal);
        let (base, serving) = env.serve_here(services).await;
        common::wait_healthy(&format!("http://{metrics}")).await;
        Self {
            client: env.client(),
            env,
            base,
            metrics,
            _stop: (stop.drop_guard(), serving),
        }
    }

    async fn post(&self, path: &str, body: &Value, key: Option<&str>) -> (StatusCode, Value) {
        let mut request = self.client.post(format!("{}{path}", self.base)).json(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        answer(request.send().await.unwrap()).await
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        answer(
            self.client
                .get(format!("{}{path}", self.base))
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    async fn rows(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM extractions")
            .fetch_one(&self.env.pool)
            .await
            .unwrap()
    }

    fn published(&self) -> i64 {
        topic_size(
            &self.env.settings.kafka_brokers,
            &self.env.topic("extraction.submitted"),
        )
    }
}

async fn answer(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test]
async fn submit_inserts_then_publishes_and_reads_back() {
    let api = Api::start("api_submit").await;
    let mut request = sample_body(0);
    request["priority"] = "low".into();
    let (status, body) = api.post("/v1/extractions", &request, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], "queued");
    let id = body["id"].as_str().unwrap().to_owned();

    let events = api.env.read_topic("extraction.submitted");
    assert_eq!(events.len(), 1);
    let (key, payload) = &events[0];
    assert_eq!(key.as_deref(), Some(id.as_bytes()));
    assert_eq!(
        decode::<ExtractionSubmitted>(payload)
            .unwrap()
            .extraction_id,
        id
    );

    let (status, view) = api.get(&format!("/v1/extractions/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (view["id"].as_str(), view["status"].as_str()),
        (Some(id.as_str()), Some("queued"))
    );
    assert_eq!(view["metadata"], json!({"sample": "invoice-northwind"}));
    assert_eq!(view["priority"], "low", "the request's priority is kept");
}

#[tokio::test]
async fn fifty_concurrent_posts_with_one_key_answer_one_id() {
    let api = Api::start("api_idempotency").await;
    let body = sample_body(1);
    let answers =
        join_all((0..50).map(|_| api.post("/v1/extractions", &body, Some("order-77")))).await;
    let ids: HashSet<String> = answers
        .iter()
        .map(|(status, body)| {
            assert_eq!(*status, StatusCode::ACCEPTED, "{body}");
            body["id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 1);
    assert_eq!(api.rows().await, 1);
    assert_eq!(
        api.published(),
        1,
        "only the request that created the row publishes"
    );

    let (status, body) = api
        .post("/v1/extractions", &sample_body(2), Some("order-77"))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["code"], "invalid_request");
    assert_eq!(api.rows().await, 1);
}

/// Submits sample `i` tagged `batch` in its metadata, under key `list-{i}`;
/// its id.
async fn submit_tagged(api: &Api, i: usize, batch: &str) -> String {
    let mut body = sample_body(i);
    body["metadata"] = json!({"batch": batch, "n": i});
    let key = format!("list-{i}");
    let (status, answer) = api.post("/v1/extractions", &body, Some(&key)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    answer["id"].as_str().unwrap().to_owned()
}

/// Every page of `query`, following `next_cursor` to the end: the ids in
/// the order listed, and how many pages it took.
async fn walk(api: &Api, query: &str) -> (Vec<String>, usize) {
    let (mut ids, mut pages, mut cursor) = (Vec::new(), 0, None::<String>);
    loop {
        let path = match &cursor {
            None => format!("/v1/extractions?{query}"),
            Some(c) => format!("/v1/extractions?{query}&cursor={c}"),
        };
        let (status, page) = api.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {page}");
        pages += 1;
        for item in page["items"].as_array().unwrap() {
            assert!(item["result"].is_null() || query.contains("include=result"));
            ids.push(item["id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return (ids, pages),
        }
    }
}

/// 120 jobs, then a walk of pages of 7 while 100 more are submitted: each of
/// the 120 is listed exactly once, no job twice, newest first. Filters by
/// metadata, key and state list exactly their jobs; another tenant lists none.
#[tokio::test]
async fn the_list_walks_every_job_once_while_more_are_submitted() {
    let api = Api::start("api_list").await;
    let mut before = Vec::new();
    for i in 0..120 {
        let batch = if i % 4 == 0 { "tagged" } else { "other" };
        before.push(submit_tagged(&api, i, batch).await);
    }
    let more = async {
        for i in 120..220 {
            submit_tagged(&api, i, "later").await;
        }
    };
    let ((listed, pages), ()) = tokio::join!(walk(&api, "limit=7"), more);
    let unique: HashSet<&String> = listed.iter().collect();
    assert_eq!(unique.len(), listed.len(), "a job on two pages");
    for id in &before {
        assert!(unique.contains(id), "{id} skipped");
    }
    let mut newest_first = listed.clone();
    newest_first.sort_by(|a, b| b.cmp(a));
    assert_eq!(listed, newest_first);
    assert!(pages >= 120 / 7, "{pages} pages");

    let (tagged, _) = walk(&api, "metadata.batch=tagged&limit=50").await;
    let expected: Vec<String> = before.iter().step_by(4).rev().cloned().collect();
    assert_eq!(tagged, expected);
    let (keyed, _) = walk(&api, "idempotency_key=list-5").await;
    assert_eq!(keyed, vec![before[5].clone()]);
    let (queued, _) = walk(&api, "status=queued,failed&limit=200").await;
    assert_eq!(queued.len(), 220, "no worker runs: every job waits");
    let (failed, _) = walk(&api, "status=failed").await;
    assert!(failed.is_empty());
    let (oldest, _) = walk(&api, "order=asc&limit=200&metadata.batch=other").await;
    let expected: Vec<String> = (0..120)
        .filter(|i| i % 4 != 0)
        .map(|i| before[i].clone())
        .collect();
    assert_eq!(oldest, expected);

    let other = docstream::store::tenants::create_tenant(&api.env.pool, "list-other")
        .await
        .unwrap()
        .key;
    let (status, page) = answer(
        api.client
            .get(format!("{}/v1/extractions?limit=200", api.base))
            .header("authorization", format!("Bearer {}", other.api_key))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["items"], json!([]), "another tenant's jobs listed");
}

/// A failed job retried through the API is queued again and handed to the
/// workers a second time; a job that is not failed answers 409, another
/// tenant's 404.
#[tokio::test]
async fn a_failed_job_is_retried_once_and_published_again() {
    use docstream::domain::Stage;
    use docstream::store::transitions;
    let api = Api::start("api_retry").await;
    let id = submit_tagged(&api, 0, "retry").await;
    let retry = format!("/v1/extractions/{id}/retry");
    let (status, body) = api.post(&retry, &json!(null), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let pool = &api.env.pool;
    let uuid: uuid::Uuid = id.parse().unwrap();
    let claim = transitions::claim(pool, Stage::Extraction, uuid, 30.0)
        .await
        .unwrap()
        .unwrap();
    transitions::fail(pool, Stage::Extraction, uuid, claim.token, "extractor down")
        .await
        .unwrap()
        .unwrap();
    let (status, job) = api.post(&retry, &json!(null), None).await;
    assert_eq!(status, StatusCode::OK, "{job}");
    assert_eq!(
        (job["status"].as_str(), job["attempts"].as_i64()),
        (Some("queued"), Some(1))
    );
    assert_eq!(job["metadata"]["batch"], "retry");
    let (status, _) = api.post(&retry, &json!(null), None).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a second retry finds it queued"
    );
    let submitted = api.env.read_topic("extraction.submitted");
    let handed: Vec<_> = submitted
        .iter()
        .filter(|(key, _)| key.as_deref() == Some(id.as_bytes()))
        .collect();
    assert_eq!(handed.len(), 2, "the submit's and the retry's");
    let other = docstream::store::tenants::create_tenant(pool, "retry-other")
        .await
        .unwrap()
        .key;
    let answer = api
        .client
        .post(format!("{}{retry}", api.base))
        .header("authorization", format!("Bearer {}", other.api_key))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn bad_input_gets_a_clear_error_and_writes_nothing() {
    let api = Api::start("api_bad_input").await;
    bodies_that_are_no_request_get_400_or_422(&api).await;
    requests_whose_fields_or_webhook_cannot_be_used_get_422(&api).await;
    a_wrong_media_type_a_huge_body_and_a_long_key_are_refused(&api).await;
    reads_of_an_unknown_or_malformed_id_are_refused(&api).await;
    nothing_was_written_or_published(&api).await;
}

/// Posts `body` as it is, as JSON, to `/v1/extractions`.
async fn post_raw(api: &Api, body: &'static str) -> (StatusCode, Value) {
    let url = format!("{}/v1/extractions", api.base);
    let response = api
        .client
        .post(&url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    answer(response).await
}

/// Malformed JSON gets 400 and a message; JSON that is not a request
/// (missing fields, a wrong type) gets 422.
async fn bodies_that_are_no_request_get_400_or_422(api: &Api) {
    let (status, body) = post_raw(api, "{\"document\": ").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "malformed JSON: {body}");
    assert!(body["error"]["message"].as_str().unwrap().len() > 10);

    let (status, _) = post_raw(api, "{\"document\": {\"text\": \"x\"}}").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "missing fields");

    let (status, _) = post_raw(api, "{\"document\": {\"text\": 5}, \"fields\": []}").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "wrong type");
}

/// A field with no rule (the message names the pattern), a pattern that
/// does not compile, a `file:` webhook and an unknown priority get 422.
async fn requests_whose_fields_or_webhook_cannot_be_used_get_422(api: &Api) {
    let no_rule = json!({"document": {"text": "Total 5.00"}, "fields": [{"name": "total"}]});
    let (status, body) = api.post("/v1/extractions", &no_rule, None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("pattern"),
        "{body}"
    );

    let bad_pattern = json!({"document": {"text": "x"}, "fields": [{"name": "a", "pattern": "("}]});
    assert_eq!(
        api.post("/v1/extractions", &bad_pattern, None).await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );

    let bad_hook = json!({"document": {"text": "x"}, "fields": [{"name": "a", "anchor": "x"}], "webhook_url": "file:///etc/passwd"});
    assert_eq!(
        api.post("/v1/extractions", &bad_hook, None).await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );

    let urgent = json!({"document": {"text": "x"}, "fields": [{"name": "a", "anchor": "x"}], "priority": "urgent"});
    let (status, body) = api.post("/v1/extractions", &urgent, None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("priority"),
        "the message names the field: {body}"
    );
}

/// A body not labelled JSON gets 415, a body past the 64 KiB limit 413, and
/// an idempotency key of 300 characters 400.
async fn a_wrong_media_type_a_huge_body_and_a_long_key_are_refused(api: &Api) {
    let url = format!("{}/v1/extractions", api.base);
    let plain = api.client.post(&url).body("{}").send().await.unwrap();
    assert_eq!(plain.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let huge = json!({"document": {"text": "x".repeat(100 * 1024)}, "fields": [{"name": "a", "anchor": "x"}]});
    let (status, body) = api.post("/v1/extractions", &huge, None).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");

    let (status, _) = api
        .post("/v1/extractions", &sample_body(0), Some(&"k".repeat(300)))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "oversized idempotency key");
}

/// Reading an unknown id gets 404 `not_found`; an id that is no UUID, 400.
async fn reads_of_an_unknown_or_malformed_id_are_refused(api: &Api) {
    let (status, body) = api
        .get(&format!("/v1/extractions/{}", uuid::Uuid::new_v4()))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    assert_eq!(
        api.get("/v1/extractions/not-a-uuid").await.0,
        StatusCode::BAD_REQUEST
    );
}

/// No row was written and no event published.
async fn nothing_was_written_or_published(api: &Api) {
    assert_eq!(api.rows().await, 0, "nothing written");
    assert_eq!(api.published(), 0, "nothing published");
}

#[tokio::test]
async fn cancel_only_a_queued_extraction() {
    let api = Api::start("api_cancel").await;
    let (_, body) = api.post("/v1/extractions", &sample_body(0), None).await;
    let id = body["id"].as_str().unwrap().to_owned();
    let (status, view) = api
        .post(&format!("/v1/extractions/{id}/cancel"), &json!({}), None)
        .await;
    assert_eq!(
        (status, view["status"].as_str()),
        (StatusCode::OK, Some("cancelled"))
    );
    let (status, body) = api
        .post(&format!("/v1/extractions/{id}/cancel"), &json!({}), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let missing = format!("/v1/extractions/{}/cancel", uuid::Uuid::new_v4());
    assert_eq!(
        api.post(&missing, &json!({}), None).await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn metrics_are_exposed_on_the_internal_listener_only() {
    let api = Api::start("api_metrics").await;
    api.post("/v1/extractions", &sample_body(0), None).await;
    let on_api = api
        .client
        .get(format!("{}/metrics", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        on_api.status(),
        StatusCode::NOT_FOUND,
        "/metrics on the API port"
    );
    let text = common::http_client()
        .get(format!("http://{}/metrics", api.metrics))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("docstream_events_produced_total"), "{text}");
    assert!(
        text.contains("docstream_http_requests_total{route=\"/v1/extractions\",status=\"202\"} 1"),
        "{text}"
    );
}

/// Fails job `id` as its first attempt would.
async fn fail_job(api: &Api, id: &str) {
    use docstream::domain::Stage;
    use docstream::store::transitions;
    let (pool, id) = (&api.env.pool, id.parse().unwrap());
    let claim = transitions::claim(pool, Stage::Extraction, id, 30.0)
        .await
        .unwrap()
        .unwrap();
    transitions::fail(pool, Stage::Extraction, id, claim.token, "extractor down")
        .await
        .unwrap()
        .unwrap();
}

/// Posts bulk action `body` under `key`, and follows the operation until it
/// finished: the operation with every outcome.
async fn bulk(api: &Api, body: &Value, key: &str) -> Value {
    let (status, mut operation) = api.post("/v1/extractions/actions", body, Some(key)).await;
    assert!(
        status == StatusCode::OK || status == StatusCode::ACCEPTED,
        "{status}: {operation}"
    );
    let path = format!(
        "/v1/extractions/actions/{}",
        operation["id"].as_str().unwrap()
    );
    finished(api, &path, "the bulk action to finish").await;
    let (mut outcomes, mut cursor) = (Vec::new(), String::new());
    loop {
        let (status, page) = api.get(&format!("{path}?limit=200{cursor}")).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        outcomes.extend(page["outcomes"].as_array().unwrap().iter().cloned());
        operation = page;
        match operation["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    operation["outcomes"] = Value::Array(outcomes);
    operation
}

/// Waits (two minutes at most) until the operation at `path` finished.
async fn finished(api: &Api, path: &str, what: &str) {
    common::wait_for(what, std::time::Duration::from_secs(120), || async {
        let (_, now) = api.get(path).await;
        match now["state"] == "finished" {
            true => Ok(()),
            false => Err(format!("{now}")),
        }
    })
    .await;
}

/// Each outcome by job id.
fn outcomes_by_id(operation: &Value) -> std::collections::HashMap<String, Value> {
    let outcomes = operation["outcomes"].as_array().unwrap();
    let by_id: std::collections::HashMap<String, Value> = outcomes
        .iter()
        .map(|o| (o["id"].as_str().unwrap().to_owned(), o.clone()))
        .collect();
    assert_eq!(by_id.len(), outcomes.len(), "a job reported twice");
    by_id
}

/// A retry by ids answers for each job: the failed ones retried, the others
/// refused with their state, another tenant's and an unknown id not found.
/// The same key again is the same operation and changes nothing; with
/// another action it is refused. A cancel by filter acts on the caller's
/// matching jobs only.
#[tokio::test]
async fn a_bulk_action_answers_for_each_job_and_a_repeat_changes_nothing() {
    let api = Api::start("api_bulk").await;
    let ids: Vec<String> = join_all((0..4).map(|i| submit_tagged(&api, i, "bulk"))).await;
    let (failed, queued, running) = (&ids[..2], &ids[2], &ids[3]);
    for id in failed {
        fail_job(&api, id).await;
    }
    let claim = docstream::store::transitions::claim(
        &api.env.pool,
        docstream::domain::Stage::Extraction,
        running.parse().unwrap(),
        30.0,
    );
    claim.await.unwrap().unwrap();
    let pool = &api.env.pool;
    let other = docstream::store::tenants::create_tenant(pool, "bulk-other")
        .await
        .unwrap()
        .key;
    let theirs = api
        .client
        .post(format!("{}/v1/extractions", api.base))
        .header("authorization", format!("Bearer {}", other.api_key))
        .json(&sample_body(9))
        .send()
        .await
        .unwrap();
    let theirs = answer(theirs).await.1["id"].as_str().unwrap().to_owned();
    let unknown = docstream::domain::new_job_id().to_string();
    let named: Vec<&String> = ids.iter().chain([&theirs, &unknown]).collect();
    let retry = json!({"action": "retry", "ids": named});

    let operation = bulk(&api, &retry, "retry-1").await;
    let counts = |op: &Value| {
        (
            op["done"].clone(),
            op["refused"].clone(),
            op["not_found"].clone(),
        )
    };
    assert_eq!(
        counts(&operation),
        (json!(2), json!(2), json!(2)),
        "{operation}"
    );
    let outcomes = outcomes_by_id(&operation);
    for id in failed {
        assert_eq!(
            (&outcomes[id]["outcome"], &outcomes[id]["status"]),
            (&json!("done"), &json!("queued"))
        );
    }
    let refused = &outcomes[queued];
    assert_eq!(refused["outcome"], "refused");
    assert!(
        refused["reason"].as_str().unwrap().contains("queued"),
        "{refused}"
    );
    assert_eq!(
        outcomes[running]["reason"]
            .as_str()
            .map(|r| r.contains("running")),
        Some(true)
    );
    for id in [&theirs, &unknown] {
        assert_eq!(
            (&outcomes[id]["outcome"], &outcomes[id]["status"]),
            (&json!("not_found"), &Value::Null)
        );
    }

    let again = bulk(&api, &retry, "retry-1").await;
    assert_eq!(
        (&again["id"], counts(&again)),
        (&operation["id"], counts(&operation))
    );
    let retried = common::wins(pool, "retry_failed").await;
    let failed_ids: Vec<uuid::Uuid> = failed.iter().map(|id| id.parse().unwrap()).collect();
    common::assert_exactly_once(&retried, &failed_ids, "retry_failed");
    let (status, body) = api
        .post(
            "/v1/extractions/actions",
            &json!({"action": "cancel", "ids": [queued]}),
            Some("retry-1"),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    let cancel = json!({"action": "cancel", "filter": {"metadata": {"batch": "bulk"}}});
    let operation = bulk(&api, &cancel, "cancel-1").await;
    assert_eq!(
        counts(&operation),
        (json!(4), json!(0), json!(0)),
        "{operation}"
    );
    let outcomes = outcomes_by_id(&operation);
    assert_eq!(outcomes[running]["status"], "running", "asked to stop");
    let (_, job) = api.get(&format!("/v1/extractions/{running}")).await;
    assert!(job["cancel_requested_at"].is_string(), "{job}");
    let status: String = sqlx::query_scalar("SELECT status FROM extractions WHERE id = $1::uuid")
        .bind(&theirs)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(status, "queued", "another tenant's job is never acted on");
    let (status, _) = api
        .client
        .get(format!(
            "{}/v1/extractions/actions/{}",
            api.base,
            operation["id"].as_str().unwrap()
        ))
        .header("authorization", format!("Bearer {}", other.api_key))
        .send()
        .await
        .map(|r| (r.status(), ()))
        .unwrap();
    assert_eq!(status, StatusCode::NOT_FOUND, "another tenant's operation");
}

/// What a bulk action cannot mean gets 422 (400 for a body that is not
/// JSON), and makes no operation.
#[tokio::test]
async fn a_bulk_action_that_cannot_be_done_is_refused_whole() {
    let api = Api::start("api_bulk_refused").await;
    let too_many: Vec<String> = (0..1001).map(|_| uuid::Uuid::nil().to_string()).collect();
    for body in [
        json!({"action": "retry"}),
        json!({"action": "retry", "ids": [], }),
        json!({"action": "retry", "ids": too_many}),
        json!({"action": "delete", "ids": [uuid::Uuid::nil()]}),
        json!({"action": "retry", "ids": [uuid::Uuid::nil()], "filter": {}}),
        json!({"action": "retry", "filter": {"status": "done"}}),
        json!({"action": "retry", "filter": {"limit": "5"}}),
        json!({"action": "retry", "filter": {"error_prefix": "x".repeat(65)}}),
    ] {
        let (status, answer) = api.post("/v1/extractions/actions", &body, None).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().len() > 5);
    }
    let response = api
        .client
        .post(format!("{}/v1/extractions/actions", api.base))
        .header("content-type", "application/json")
        .body("{\"action\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let operations: i64 = sqlx::query_scalar("SELECT count(*) FROM bulk_operations")
        .fetch_one(&api.env.pool)
        .await
        .unwrap();
    assert_eq!(operations, 0);
}

/// An operation whose runner died after its first batch (its lease ran out,
/// its cursor mid-walk) is resumed by a serving process: every job is
/// cancelled once, and every outcome is written once.
#[tokio::test]
async fn an_abandoned_bulk_action_is_resumed_where_it_stopped() {
    use docstream::store::bulk::{self as store_bulk, Action, Selection};
    use docstream::store::list::{self, JobFilter, Order, PageRequest};
    let api = Api::start("api_bulk_resume").await;
    let pool = &api.env.pool;
    let ids = insert_queued(pool, 450, "resume").await;
    let params = [("metadata.batch".to_owned(), "resume".to_owned())];
    let selection = Selection::Filter(params.clone().into_iter().collect());
    let owner = (docstream::store::tenants::DEFAULT_TENANT_ID, "resume-1");
    let lease = std::time::Duration::ZERO;
    let made = store_bulk::create(pool, owner, (Action::Cancel, &selection), lease, 4).await;
    let store_bulk::Created::New(operation) = made.unwrap() else {
        panic!("the operation was not made");
    };
    let filter = JobFilter::of(params.iter().map(|(k, v)| (k.as_str(), v.as_str()))).unwrap();
    let page = PageRequest {
        after: None,
        limit: 200,
        order: Order::NewestFirst,
        with_results: false,
    };
    let mut connection = pool.acquire().await.unwrap();
    let tenant = docstream::store::tenants::DEFAULT_TENANT_ID;
    let (first, next) = list::list_ids(&mut connection, tenant, &filter, page)
        .await
        .unwrap();
    assert_eq!(first.len(), 200);
    store_bulk::apply(pool, &operation, &first, next, lease)
        .await
        .unwrap()
        .expect("the first batch");
    // The runner "died" here; a serving process's sweep takes it over.
    let path = format!("/v1/extractions/actions/{}", operation.id);
    finished(&api, &path, "the sweep to resume it").await;
    let (_, finished) = api.get(&path).await;
    assert_eq!(finished["done"], 450, "{finished}");
    let outcomes: i64 =
        sqlx::query_scalar("SELECT count(*) FROM bulk_outcomes WHERE operation_id = $1")
            .bind(operation.id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(outcomes, 450);
    let cancelled = common::wins(pool, "mark_cancelled").await;
    common::assert_exactly_once(&cancelled, &ids, "mark_cancelled");
}

/// Starts bulk action `body` with API key `key`: the status, the
/// `Retry-After` header and the body of the answer.
async fn start_bulk(api: &Api, body: &Value, key: &str) -> (StatusCode, Option<String>, Value) {
    let response = api
        .client
        .post(format!("{}/v1/extractions/actions", api.base))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap();
    let retry_after = response.headers().get("retry-after");
    let retry_after = retry_after.map(|v| v.to_str().unwrap().to_owned());
    let (status, body) = answer(response).await;
    (status, retry_after, body)
}

/// A tenant runs at most a few bulk actions at once (4 by default): of
/// seven started at once, four are accepted and three are answered 429
/// with Retry-After, while another tenant's is accepted. Once the four
/// finished, the tenant may start another. Each operation is held running
/// by a lock on the one job its filter names, so "at once" does not depend
/// on how fast the machine is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_past_its_running_bulk_actions_is_answered_429_and_another_is_not() {
    const CAP: usize = 4;
    let api = Api::start("api_bulk_cap").await;
    let pool = &api.env.pool;
    let mine = insert_queued(pool, 1, "capped").await[0];
    let other = docstream::store::tenants::create_tenant(pool, "bulk-cap-other")
        .await
        .unwrap()
        .key;
    let (status, theirs) = {
        let sent = api
            .client
            .post(format!("{}/v1/extractions", api.base))
            .bearer_auth(&other.api_key)
            .json(&sample_body(1));
        answer(sent.send().await.unwrap()).await
    };
    assert_eq!(status, StatusCode::ACCEPTED, "{theirs}");
    let theirs: uuid::Uuid = theirs["id"].as_str().unwrap().parse().unwrap();
    let mut hold = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM extractions WHERE id = ANY($1) FOR UPDATE")
        .bind([mine, theirs])
        .execute(&mut *hold)
        .await
        .unwrap();

    let cancel = json!({"action": "cancel", "filter": {"status": "queued"}});
    let key = &api.env.api_key;
    let started = join_all((0..CAP + 3).map(|_| start_bulk(&api, &cancel, key))).await;
    let accepted: Vec<&Value> = (started.iter())
        .filter(|(status, _, _)| *status == StatusCode::ACCEPTED)
        .map(|(_, _, body)| body)
        .collect();
    let refused: Vec<_> = (started.iter())
        .filter(|(status, _, _)| *status == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    let statuses: Vec<StatusCode> = started.iter().map(|(status, _, _)| *status).collect();
    assert_eq!(
        (accepted.len(), refused.len()),
        (CAP, 3),
        "answers: {statuses:?}"
    );
    for (_, retry_after, body) in &refused {
        let wait: u64 = retry_after.as_deref().unwrap_or_default().parse().unwrap();
        assert!(wait >= 1, "Retry-After: {retry_after:?}");
        assert_eq!(body["error"]["code"], "too_many_requests", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("bulk actions running"), "{message}");
    }
    let (status, _, body) = start_bulk(&api, &cancel, &other.api_key).await;
    assert_eq!(status, StatusCode::ACCEPTED, "another tenant: {body}");

    hold.rollback().await.unwrap();
    for operation in accepted {
        let path = format!(
            "/v1/extractions/actions/{}",
            operation["id"].as_str().unwrap()
        );
        finished(&api, &path, "a held bulk action to finish").await;
    }
    let (status, _, body) = start_bulk(&api, &cancel, key).await;
    assert!(
        status == StatusCode::OK || status == StatusCode::ACCEPTED,
        "once the others finished: {status} {body}"
    );
}

/// Inserts `n` queued jobs tagged `batch` straight into the store (no
/// events: nothing consumes them here); their ids.
async fn insert_queued(pool: &sqlx::PgPool, n: usize, batch: &str) -> Vec<uuid::Uuid> {
    use docstream::store::{insert_many, Insert, NewExtraction};
    let mut ids = Vec::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let inserts: Vec<Insert> = chunk
            .iter()
            .map(|i| {
                let mut body = sample_body(*i);
                body["metadata"] = json!({"batch": batch, "n": i});
                Insert::new(NewExtraction {
                    id: docstream::domain::new_job_id(),
                    tenant_id: docstream::store::tenants::DEFAULT_TENANT_ID,
                    max_open_jobs: None,
                    idempotency_key: None,
                    request: serde_json::from_value(body).unwrap(),
                })
            })
            .collect();
        let rows = insert_many(pool, &inserts).await.unwrap();
        ids.extend(rows.into_iter().map(|row| row.unwrap().id));
    }
    ids
}

/// A cancel by a filter that matches 20,000 queued jobs runs in short
/// batches while submits go on: every job is cancelled once, and every
/// submit made meanwhile is answered 202. The submits' latencies alone
/// before it and beside it are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_cancel_of_twenty_thousand_jobs_leaves_submits_alone() {
    const JOBS: usize = 20_000;
    // Room for the 20,000 and the submits beside them under the cap on open jobs.
    let api = Api::start_with("api_bulk_mass", |s| s.tenant_max_open_jobs = 100_000).await;
    let ids = insert_queued(&api.env.pool, JOBS, "mass").await;
    let cancel =
        json!({"action": "cancel", "filter": {"status": "queued", "metadata": {"batch": "mass"}}});
    let (api, alone, done) = (&api, &AtomicBool::new(false), &AtomicBool::new(false));
    let (before, _) = tokio::join!(submits_until(api, alone), async {
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        alone.store(true, Ordering::Relaxed);
    });
    let started = std::time::Instant::now();
    let cancelled = async move {
        let operation = bulk(api, &cancel, "mass-1").await;
        done.store(true, Ordering::Relaxed);
        operation
    };
    let (operation, during) = tokio::join!(cancelled, submits_until(api, done));
    let took = started.elapsed();
    assert_eq!(operation["done"], JOBS, "{}", operation["done"]);
    eprintln!(
        "bulk cancel of {JOBS} jobs: {:.1} s ({:.0} jobs/s); submits alone before it: {}; beside it: {}",
        took.as_secs_f64(),
        JOBS as f64 / took.as_secs_f64(),
        percentiles(&before),
        percentiles(&during),
    );
    let wins = common::wins(&api.env.pool, "mark_cancelled").await;
    common::assert_exactly_once(&wins, &ids, "mark_cancelled");
    let queued: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM extractions e JOIN extraction_requests q USING (id)
          WHERE q.request->'metadata'->>'batch' = 'beside' AND e.status = 'queued'",
    )
    .fetch_one(&api.env.pool)
    .await
    .unwrap();
    let submitted = before.len() + during.len();
    assert_eq!(
        queued as usize, submitted,
        "the submits beside it are not its jobs"
    );
}

/// Submits in bursts of four at once until `stop`, each answered 202; their
/// latencies.
async fn submits_until(api: &Api, stop: &AtomicBool) -> Vec<std::time::Duration> {
    let mut latencies = Vec::new();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let burst = (0..4).map(|k| {
            let mut body = sample_body(i + k);
            body["metadata"] = json!({"batch": "beside"});
            async move {
                let sent = std::time::Instant::now();
                let (status, answer) = api.post("/v1/extractions", &body, None).await;
                assert_eq!(
                    status,
                    StatusCode::ACCEPTED,
                    "a submit beside the cancel: {answer}"
                );
                sent.elapsed()
            }
        });
        latencies.extend(join_all(burst).await);
        i += 4;
    }
    latencies
}

/// "n submits, p50 …, p99 …, max …".
fn percentiles(latencies: &[std::time::Duration]) -> String {
    let mut sorted = latencies.to_vec();
    sorted.sort();
    let n = sorted.len();
    let p = |q: f64| sorted[((n as f64 * q) as usize).min(n - 1)];
    format!(
        "{n} submits, p50 {:?}, p99 {:?}, max {:?}",
        p(0.5),
        p(0.99),
        p(1.0)
    )
}

/// Rows of every table of the schema whose text (every column, as the row
/// reads as text) holds `marker`, by table.
async fn tables_holding(pool: &sqlx::PgPool, marker: &str) -> Vec<(String, i64)> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT quote_ident(table_name) FROM information_schema.tables
          WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(tables.len() > 10, "{tables:?}");
    let mut holding = Vec::new();
    for table in tables {
        let sql = format!("SELECT count(*) FROM {table} t WHERE strpos(t::text, $1) > 0");
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(marker)
            .fetch_one(pool)
            .await
            .unwrap();
        if n > 0 {
            holding.push((table, n));
        }
    }
    holding
}

/// A finished job's content (document, metadata, webhook URL, results,
/// webhook payload, error text) is in four tables; DELETE leaves it in
/// none, and the job a tombstone: GET, retry and a replay of its key get
/// 410. An open job, and a key without the `delete` scope, are refused.
#[tokio::test]
async fn an_erased_job_leaves_no_request_or_result_text_in_any_table() {
    use docstream::domain::{Scope, Stage};
    use docstream::store::transitions;
    let api = Api::start_with("api_erase", |s| {
        s.webhook_allow = "127.0.0.0/8".parse().unwrap();
    })
    .await;
    let pool = &api.env.pool;
    let marker = format!("ERASE-ME-{}", uuid::Uuid::new_v4().simple());
    let deleter =
        docstream::store::tenants::create_key(pool, "default", &[Scope::Read, Scope::Delete])
            .await
            .unwrap()
            .api_key;
    let body = json!({
        "document": {"text": format!("Invoice {marker} total 12.50")},
        "fields": [{"name": "number", "anchor": "Invoice"}],
        "metadata": {"customer": marker},
        "webhook_url": format!("http://127.0.0.1:9/hooks/{marker}"),
    });
    let (status, answer) = api.post("/v1/extractions", &body, Some("erase-a")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let a: uuid::Uuid = answer["id"].as_str().unwrap().parse().unwrap();
    let mut failing = body.clone();
    failing["metadata"] = json!({"n": 2});
    let (_, answer) = api.post("/v1/extractions", &failing, None).await;
    let b: uuid::Uuid = answer["id"].as_str().unwrap().parse().unwrap();
    let delete = |id: uuid::Uuid, key: &str| {
        api.client
            .delete(format!("{}/v1/extractions/{id}", api.base))
            .header("authorization", format!("Bearer {key}"))
            .send()
    };
    assert_eq!(
        delete(a, &deleter).await.unwrap().status(),
        StatusCode::CONFLICT,
        "queued"
    );

    let claim = transitions::claim(pool, Stage::Extraction, a, 30.0)
        .await
        .unwrap()
        .unwrap();
    let found = json!({"number": {"value": marker, "raw": marker, "words": []}});
    transitions::succeed(pool, Stage::Extraction, a, claim.token, &found)
        .await
        .unwrap()
        .unwrap();
    let bbox = transitions::claim(pool, Stage::BboxRefinement, a, 30.0)
        .await
        .unwrap()
        .unwrap();
    let boxes = json!({"number": {"text": marker, "bbox": [0, 0, 1, 1]}});
    transitions::succeed(pool, Stage::BboxRefinement, a, bbox.token, &boxes)
        .await
        .unwrap()
        .unwrap();
    let claim = transitions::claim(pool, Stage::Extraction, b, 30.0)
        .await
        .unwrap()
        .unwrap();
    let error = format!("extractor \"model\" refused the document: {marker} is unreadable");
    transitions::fail(pool, Stage::Extraction, b, claim.token, &error)
        .await
        .unwrap()
        .unwrap();
    let before: Vec<String> = tables_holding(pool, &marker)
        .await
        .into_iter()
        .map(|(t, _)| t)
        .collect();
    for table in [
        "extraction_requests",
        "extraction_results",
        "extractions",
        "webhook_deliveries",
    ] {
        assert!(
            before.contains(&table.to_owned()),
            "the content is in {table}: {before:?}"
        );
    }

    let key = &api.env.api_key;
    assert_eq!(
        delete(a, key).await.unwrap().status(),
        StatusCode::FORBIDDEN,
        "no delete scope"
    );
    for id in [a, b, a] {
        assert_eq!(
            delete(id, &deleter).await.unwrap().status(),
            StatusCode::NO_CONTENT
        );
    }
    assert_eq!(
        tables_holding(pool, &marker).await,
        vec![],
        "content left after the erasure"
    );

    let (status, gone) = api.get(&format!("/v1/extractions/{a}")).await;
    assert_eq!(
        (status, &gone["error"]["code"]),
        (StatusCode::GONE, &json!("gone"))
    );
    let (status, _) = api
        .post(&format!("/v1/extractions/{b}/retry"), &json!(null), None)
        .await;
    assert_eq!(
        status,
        StatusCode::GONE,
        "an erased failed job is not retried"
    );
    let (status, _) = api.post("/v1/extractions", &body, Some("erase-a")).await;
    assert_eq!(status, StatusCode::GONE, "a replay of the erased job's key");
    let (_, page) = api.get("/v1/extractions").await;
    let listed: Vec<&Value> = page["items"].as_array().unwrap().iter().collect();
    assert_eq!(listed.len(), 2);
    assert!(listed
        .iter()
        .all(|job| job["erased_at"].is_string() && job["metadata"].is_null()));
    let erasures = common::wins(pool, "erase").await;
    common::assert_exactly_once(&erasures, &[a, b], "erase");
}

/// The tenant's dead letters of an erased job's key (a refused record that
/// carried the job's request before or beside it) keep neither its excerpt
/// nor its reason once the job is erased: DELETE leaves the document in no
/// table. A letter of another key keeps its own.
#[tokio::test]
async fn an_erased_jobs_dead_letters_keep_no_excerpt_of_it() {
    use docstream::domain::Scope;
    use docstream::store::{letters, tenants::DEFAULT_TENANT_ID};
    let api = Api::start("api_erase_letters").await;
    let pool = &api.env.pool;
    let marker = format!("ERASE-ME-{}", uuid::Uuid::new_v4().simple());
    let kept = format!("KEEP-ME-{}", uuid::Uuid::new_v4().simple());
    let deleter = docstream::store::tenants::create_key(pool, "default", &[Scope::Delete])
        .await
        .unwrap()
        .api_key;
    let body = json!({
        "document": {"text": format!("Invoice {marker} total 12.50")},
        "fields": [{"name": "number", "anchor": "Invoice"}],
    });
    let (status, answer) = api
        .post("/v1/extractions", &body, Some("erase-letters"))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let id = answer["id"].as_str().unwrap().to_owned();
    let (status, _) = api
        .post(&format!("/v1/extractions/{id}/cancel"), &json!(null), None)
        .await;
    assert!(status.is_success(), "cancel: {status}");
    let letter = |offset: i64, key: &'static str, text: String| {
        let request = json!({"document": {"text": text.clone()}}).to_string();
        let reason = format!("field \"number\": no value in {text}");
        async move {
            let source = ("extraction.requests", 0, offset);
            let (kind, reason) = ("invalid_request", reason.as_str());
            letters::record(
                pool,
                DEFAULT_TENANT_ID,
                source,
                (Some(key), Some(request.as_str())),
                (kind, reason),
            )
            .await
            .unwrap();
        }
    };
    letter(1, "erase-letters", format!("Invoice {marker}")).await;
    letter(2, "another-key", format!("Invoice {kept}")).await;
    let holding = tables_holding(pool, &marker).await;
    assert!(
        holding.contains(&("tenant_dead_letters".to_owned(), 1)),
        "{holding:?}"
    );

    let erased = api
        .client
        .delete(format!("{}/v1/extractions/{id}", api.base))
        .bearer_auth(&deleter)
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        tables_holding(pool, &marker).await,
        vec![],
        "content left after the erasure"
    );
    assert_eq!(
        tables_holding(pool, &kept).await,
        vec![("tenant_dead_letters".to_owned(), 1)],
        "another key's letter keeps its excerpt"
    );
    let (status, page) = api.get("/v1/dead-letters").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let listed: Vec<(Value, Value)> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["idempotency_key"].clone(), l["excerpt"].clone()))
        .collect();
    assert_eq!(listed.len(), 2, "both letters are still listed: {page}");
    assert!(
        listed.contains(&(json!("erase-letters"), Value::Null)),
        "{page}"
    );
}

/// `docstream jobs` lists with the list's filters (JSON and a table), and
/// retries by filter as a bulk operation: each failed job once, a repeat
/// with the same key the same operation; a retry naming no jobs is refused.
#[tokio::test]
async fn the_jobs_command_lists_and_retries_with_the_lists_filters() {
    let api = Api::start("api_jobs_cli").await;
    let ids: Vec<String> = join_all((0..3).map(|i| submit_tagged(&api, i, "cli"))).await;
    for id in &ids[..2] {
        fail_job(&api, id).await;
    }
    let env = &api.env;
    let json = |output: std::process::Output| {
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice::<Value>(&output.stdout).unwrap()
    };
    let filters = ["--status", "failed", "--metadata", "batch=cli"];
    let listed = json(
        env.run_cli(&[&["jobs", "list", "--json"][..], &filters].concat())
            .await,
    );
    let mut listed: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    listed.sort();
    let mut failed: Vec<&str> = ids[..2].iter().map(String::as_str).collect();
    failed.sort();
    assert_eq!(listed, failed);
    let table = env
        .run_cli(&["jobs", "list", "--metadata", "batch=cli"])
        .await;
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.starts_with("ID") && table.lines().count() == 4,
        "{table}"
    );

    let retry = [&["jobs", "retry", "--key", "cli-1", "--json"][..], &filters].concat();
    let first = json(env.run_cli(&retry).await);
    assert_eq!(
        (&first["done"], &first["refused"]),
        (&json!(2), &json!(0)),
        "{first}"
    );
    let again = json(env.run_cli(&retry).await);
    assert_eq!(again["operation"], first["operation"]);
    let failed_ids: Vec<uuid::Uuid> = ids[..2].iter().map(|id| id.parse().unwrap()).collect();
    common::assert_exactly_once(
        &common::wins(&env.pool, "retry_failed").await,
        &failed_ids,
        "retry_failed",
    );
    let nothing = env.run_cli(&["jobs", "cancel"]).await;
    assert!(
        !nothing.status.success(),
        "a cancel of every job by omission"
    );
    assert!(String::from_utf8_lossy(&nothing.stderr).contains("name the jobs"));
}

/// The purge loop every process runs: a finished job past its tenant's
/// one-day retention disappears within a few purge intervals, a recent one
/// and an open one stay.
#[tokio::test]
async fn the_purge_loop_takes_what_is_past_its_retention() {
    let api = Api::start_with("api_purge_loop", |s| {
        s.retention_purge_interval_s = common::secs(0.5);
    })
    .await;
    // The loop every process runs beside its roles (`roles::run`).
    let stop = CancellationToken::new();
    let services = api.env.services().await;
    tokio::spawn(docstream::roles::retention(services, stop.clone()));
    let _stop = stop.drop_guard();
    let pool = &api.env.pool;
    docstream::store::tenants::set_retention(pool, "default", Some(1))
        .await
        .unwrap();
    let ids = insert_queued(pool, 3, "purge").await;
    let two_days_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 86_400);
    let since = two_days_ago.duration_since(std::time::UNIX_EPOCH).unwrap();
    let old = uuid::Uuid::new_v7(uuid::Timestamp::from_unix(
        uuid::NoContext,
        since.as_secs(),
        0,
    ));
    // The first job, made two days old and finished as long ago.
    for sql in [
        "UPDATE extraction_requests SET id = $2 WHERE id = $1",
        "UPDATE extractions SET id = $2, status = 'failed', submitted_at = now() - interval '2 days',
                finished_at = now() - interval '2 days' WHERE id = $1",
    ] {
        sqlx::query(sql).bind(ids[0]).bind(old).execute(pool).await.unwrap();
    }
    sqlx::query("UPDATE extractions SET status = 'failed', finished_at = now() WHERE id = $1")
        .bind(ids[1])
        .execute(pool)
        .await
        .unwrap();
    common::wait_for("the purge", std::time::Duration::from_secs(30), || async {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM extraction_requests WHERE id = $1")
                .bind(old)
                .fetch_one(pool)
                .await
                .unwrap();
        match left {
            0 => Ok(()),
            n => Err(format!("{n} left")),
        }
    })
    .await;
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM extractions WHERE id = ANY($1)")
        .bind(&ids[1..])
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(kept, 2, "the recent failure and the queued job stay");
    let gone: i64 = sqlx::query_scalar("SELECT count(*) FROM extractions WHERE id = $1")
        .bind(old)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(gone, 0);
}

/// A GET of `path` with `key`.
async fn get_as(api: &Api, path: &str, key: &str) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .get(format!("{}{path}", api.base))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    answer(response).await
}

fn sum(samples: &Value, field: &str) -> i64 {
    samples
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s[field].as_i64().unwrap())
        .sum()
}

/// The census samples a tenant's queue: the jobs it submitted, the ones
/// that finished, and the ones still open, and nobody else's. The overview
/// answers them with the open jobs counted now; the deployment's needs the
/// `operator` scope; `GET /v1/tenant` answers quotas, use and keys.
#[tokio::test]
async fn the_overview_samples_a_tenants_queue_and_no_one_elses() {
    use docstream::domain::Scope;
    use docstream::store::tenants;
    let api = Api::start_with("api_overview", |s| {
        s.census_interval_s = common::secs(0.5);
        // Jobs inserted here are never published: orphans at once.
        s.queued_orphan_threshold_s = common::secs(0.1);
    })
    .await;
    let stop = CancellationToken::new();
    let services = api.env.services().await;
    let census = services.metrics.census.clone();
    let taker = docstream::pipeline::census::Taker::new(
        &services.settings,
        services.pool.clone(),
        census.clone(),
        services.health.clone(),
    );
    tokio::spawn(docstream::pipeline::census::run(taker, stop.clone()));
    let _stop = stop.drop_guard();
    let pool = &api.env.pool;
    let other = tenants::create_tenant(pool, "overview-other")
        .await
        .unwrap();
    let ids = insert_queued(pool, 5, "overview").await;
    sqlx::query("UPDATE extractions SET status = 'failed', finished_at = now() WHERE id = ANY($1)")
        .bind(&ids[..2])
        .execute(pool)
        .await
        .unwrap();
    let samples = common::wait_for(
        "the samples",
        std::time::Duration::from_secs(30),
        || async {
            let (status, overview) = api.get("/v1/overview").await;
            assert_eq!(status, StatusCode::OK, "{overview}");
            let samples = overview["samples"].clone();
            let taken = samples.as_array().unwrap();
            let last_queued = taken.last().map(|s| s["queued"].clone());
            // Three turns at least: later turns count none of them again.
            match (
                sum(&samples, "submitted"),
                sum(&samples, "finished"),
                last_queued,
            ) {
                (5, 2, Some(q)) if q == 3 && taken.len() >= 3 => Ok(samples),
                seen => Err(format!("submitted, finished, queued: {seen:?}")),
            }
        },
    )
    .await;
    assert!(samples
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["finished"].as_i64() <= Some(2)));
    let (_, overview) = api.get("/v1/overview").await;
    assert_eq!(overview["now"]["queued"], 3, "{overview}");
    // The census's gauge of waiting work by tenant and priority: the
    // default tenant's 3 normal jobs, and the others' series at 0.
    let default_name: String = sqlx::query_scalar("SELECT name FROM tenants WHERE id = $1")
        .bind(tenants::DEFAULT_TENANT_ID)
        .fetch_one(pool)
        .await
        .unwrap();
    let queued =
        |tenant: &str, priority: &str| (census.queued).with_label_values(&[tenant, priority]).get();
    // Read between a turn's reset and its sets, a gauge is 0 for a moment.
    common::wait_for(
        "the queued gauge",
        std::time::Duration::from_secs(10),
        || async {
            match queued(&default_name, "normal") {
                3 => Ok(()),
                seen => Err(format!("{seen}")),
            }
        },
    )
    .await;
    assert_eq!(queued("(others)", "normal"), 0);
    assert!(
        overview.get("orphans").is_none(),
        "only the operators' has orphans"
    );
    let (status, theirs) = get_as(&api, "/v1/overview", &other.key.api_key).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(theirs["now"]["queued"], 0, "{theirs}");
    assert_eq!(sum(&theirs["samples"], "submitted"), 0, "{theirs}");
    // The deployment's overview and the tenants are the operators'.
    for path in [
        "/v1/operator/overview",
        "/v1/operator/tenants",
        "/v1/tenant",
    ] {
        let (status, _) = api.get(path).await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{path} with the default scopes"
        );
    }
    let operator = tenants::create_key(pool, "overview-other", &[Scope::Admin, Scope::Operator])
        .await
        .unwrap()
        .api_key;
    let (status, deployment) = get_as(&api, "/v1/operator/overview", &operator).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(sum(&deployment["samples"], "submitted"), 5, "{deployment}");
    assert_eq!(
        deployment["orphans"],
        json!([{"class": 1, "meaning": "queued, never published", "open": 3}])
    );
    let (_, me) = get_as(&api, "/v1/me", &operator).await;
    assert_eq!(
        me,
        json!({"tenant": "overview-other", "scopes": ["admin", "operator"]})
    );
    let (status, everyone) = get_as(&api, "/v1/operator/tenants", &operator).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = everyone["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default", "overview-other"]);
    assert_eq!(everyone["items"][0]["open_jobs"], 3);
    let (_, own) = get_as(&api, "/v1/tenant", &operator).await;
    assert_eq!(own["tenant"], "overview-other");
    assert_eq!(own["open_jobs"], 0);
    let keys = own["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "the first key and the operator's: {own}");
    assert!(keys
        .iter()
        .all(|k| k.get("api_key").is_none() && k["prefix"].is_string()));
    assert_eq!(own["retention_days"], 30);
    // One job published and consumed by no worker: the workers' group is one
    // record behind on its topic.
    submit_tagged(&api, 0, "overview").await;
    let worker_group = api.env.settings.group(&api.env.settings.worker_group);
    common::wait_for("the lag", std::time::Duration::from_secs(30), || async {
        let (_, deployment) = get_as(&api, "/v1/operator/overview", &operator).await;
        let lags = deployment["lag"].as_array().cloned().unwrap_or_default();
        let workers = lags.iter().find(|l| l["group"] == worker_group.as_str());
        match workers.map(|l| l["lag"].clone()) {
            Some(lag) if lag == 1 && lags.len() == 3 => Ok(()),
            _ => Err(format!("{lags:?}")),
        }
    })
    .await;
}
