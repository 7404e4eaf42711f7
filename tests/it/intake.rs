//! The Kafka intake against the real broker and Postgres: submissions produced
//! to `extraction.requests` by a plain Kafka producer become jobs by the same
//! path as `POST /v1/extractions`. A repeat of a key creates nothing new, an
//! invalid request goes to the DLQ with its reason, and every valid one is
//! carried through to bbox succeeded by separate processes.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::{
    assert_exactly_once, sample_body, stop, topic_size, wait_count, wait_for, wins, TestEnv,
    ALL_BBOX_SUCCEEDED,
};
use docstream::events::{decode, encode, DeadLetter, ExtractionRequested};
use futures::stream::{self, StreamExt};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use uuid::Uuid;

const REQUESTS: usize = 5_000;
/// 1% of the records: requests that can never become jobs.
const INVALID: usize = 50;
/// 10% of the records: repeats of a valid key with the same request.
const REPEATS: usize = 500;

/// One record of the stream the test produces.
struct Produced {
    key: String,
    requested: ExtractionRequested,
}

fn requested(key: &str, request_json: String) -> ExtractionRequested {
    ExtractionRequested {
        idempotency_key: key.to_owned(),
        request_json,
        requested_at_ms: 0,
    }
}

/// 4,450 distinct valid keys, 500 repeats of them (each some records after its
/// original), and 50 invalid requests of three kinds, interleaved.
fn stream_of_requests(run: &str) -> (Vec<Produced>, HashSet<String>) {
    let distinct = REQUESTS - INVALID - REPEATS;
    let originals: Vec<(String, String)> = (0..distinct)
        .map(|i| (format!("{run}-job-{i}"), sample_body(i).to_string()))
        .collect();
    let keys = originals.iter().map(|(key, _)| key.clone()).collect();
    let mut records: Vec<Produced> = originals
        .iter()
        .map(|(key, body)| Produced {
            key: key.clone(),
            requested: requested(key, body.clone()),
        })
        .collect();
    for j in 0..REPEATS {
        // Each earlier insert moved the original at most one place on, so
        // `original + j + 1` is after it: a repeat follows its original.
        let original = (j * 8) % distinct;
        let (key, body) = &originals[original];
        let at = (original + 1 + j % 40 + j).min(records.len());
        records.insert(
            at,
            Produced {
                key: key.clone(),
                requested: requested(key, body.clone()),
            },
        );
    }
    for i in 0..INVALID {
        let key = format!("{run}-bad-{i}");
        let (key, json) = match i % 3 {
            // Not JSON at all.
            0 => (key, "{\"document\": ".to_owned()),
            // JSON, but no fields to extract.
            1 => {
                let mut body = sample_body(i);
                body["fields"] = serde_json::json!([]);
                (key, body.to_string())
            }
            // A key that cannot name a job.
            _ => (String::new(), sample_body(i).to_string()),
        };
        let at = (i * 97) % records.len();
        records.insert(
            at,
            Produced {
                key: key.clone(),
                requested: requested(&key, json),
            },
        );
    }
    (records, keys)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_submissions_make_one_job_per_key_and_invalid_ones_go_to_the_dlq() {
    let env = TestEnv::new("intake").await;
    let run = Uuid::new_v4().simple().to_string();
    let (records, keys) = the_stream_of_requests(&run);
    produced_to_the_intake_topic(&env, &records).await;

    let mut children = the_intake_and_both_workers(&env);
    every_valid_request_reaches_bbox_succeeded(&env, &keys).await;
    the_invalid_requests_reach_the_dlq(&env).await;
    stop(children.iter_mut()).await;

    let rows = one_job_per_distinct_valid_key_each_through_once(&env, &keys).await;
    let letters = exactly_the_invalid_requests_are_dead_letters(&env);
    report(&keys, &rows, &letters);
}

/// [`stream_of_requests`] for `run`, checked to hold [`REQUESTS`] records and
/// the distinct valid keys it should.
fn the_stream_of_requests(run: &str) -> (Vec<Produced>, HashSet<String>) {
    let (records, keys) = stream_of_requests(run);
    assert_eq!(records.len(), REQUESTS);
    assert_eq!(keys.len(), REQUESTS - INVALID - REPEATS);
    (records, keys)
}

/// Produces every record to `extraction.requests` with a plain Kafka producer
/// (256 sends at once), with the intake headers of the tenant `default`.
async fn produced_to_the_intake_topic(env: &TestEnv, records: &[Produced]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.settings.kafka_brokers)
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let topic = env.topic("extraction.requests");
    let api_key = env.api_key.clone();
    stream::iter(records)
        .map(|record| {
            let payload = encode(&record.requested).unwrap();
            let producer = producer.clone();
            let topic = topic.clone();
            let headers = common::intake_headers("default", &api_key);
            async move {
                let sent = FutureRecord::to(&topic)
                    .key(record.key.as_bytes())
                    .payload(&payload)
                    .headers(headers);
                producer.send(sent, Duration::from_secs(30)).await.unwrap();
            }
        })
        .buffered(256)
        .collect::<Vec<_>>()
        .await;
}

/// The intake, a worker and a bbox worker, each its own process.
fn the_intake_and_both_workers(env: &TestEnv) -> [tokio::process::Child; 3] {
    [
        env.spawn("intake", &[], "intake"),
        env.spawn("worker", &[], "intake-worker"),
        env.spawn("bbox-worker", &[], "intake-bbox-worker"),
    ]
}

/// Waits (300 s at most) until a job per distinct valid key is bbox succeeded.
async fn every_valid_request_reaches_bbox_succeeded(env: &TestEnv, keys: &HashSet<String>) {
    let valid = keys.len() as i64;
    wait_count(
        &env.pool,
        "every valid request to reach bbox succeeded",
        ALL_BBOX_SUCCEEDED,
        valid,
        Duration::from_secs(300),
    )
    .await;
}

/// Waits (60 s at most) until `extraction.dlq` holds [`INVALID`] records.
async fn the_invalid_requests_reach_the_dlq(env: &TestEnv) {
    let dlq = env.topic("extraction.dlq");
    let brokers = env.settings.kafka_brokers.clone();
    wait_for(
        "the invalid requests in the DLQ",
        Duration::from_secs(60),
        || {
            let (brokers, dlq) = (brokers.clone(), dlq.clone());
            async move {
                match topic_size(&brokers, &dlq) {
                    n if n >= INVALID as i64 => Ok(()),
                    n => Err(format!("{n} dead letters")),
                }
            }
        },
    )
    .await;
}

/// Checks there is one row for each distinct valid key and none for others,
/// each submitted, succeeded and bbox succeeded exactly once: the rows
/// (id, key).
async fn one_job_per_distinct_valid_key_each_through_once(
    env: &TestEnv,
    keys: &HashSet<String>,
) -> Vec<(Uuid, String)> {
    let pool = &env.pool;
    let rows: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT id, idempotency_key FROM extraction_requests")
            .fetch_all(pool)
            .await
            .unwrap();
    let mut per_key: HashMap<&str, usize> = HashMap::new();
    for (_, key) in &rows {
        *per_key.entry(key.as_str()).or_default() += 1;
    }
    let row_keys: HashSet<String> = per_key.keys().map(|k| k.to_string()).collect();
    assert_eq!(
        &row_keys, keys,
        "one row for each distinct valid key, none for others"
    );
    assert!(per_key.values().all(|&n| n == 1), "a key made two rows");
    let ids: Vec<Uuid> = rows.iter().map(|(id, _)| *id).collect();
    assert_exactly_once(&wins(pool, "submit").await, &ids, "submit");
    assert_exactly_once(&wins(pool, "mark_succeeded").await, &ids, "mark_succeeded");
    assert_exactly_once(
        &wins(pool, "mark_bbox_refinement_succeeded").await,
        &ids,
        "bbox succeeded",
    );
    rows
}

/// Checks `extraction.dlq` holds exactly [`INVALID`] dead letters, of the two
/// kinds the invalid requests make: the letters.
fn exactly_the_invalid_requests_are_dead_letters(env: &TestEnv) -> Vec<DeadLetter> {
    let letters: Vec<DeadLetter> = env
        .read_topic("extraction.dlq")
        .into_iter()
        .map(|(_, value)| decode(&value).unwrap())
        .collect();
    assert_eq!(
        letters.len(),
        INVALID,
        "exactly the invalid requests are dead letters"
    );
    let kinds: HashSet<&str> = letters.iter().map(|l| l.error_kind.as_str()).collect();
    let expected = HashSet::from(["invalid_request", "malformed_json"]);
    assert_eq!(kinds, expected, "the JSON that is not JSON, and the rest");
    letters
}

/// Prints what the run made: rows, dead letters and their reasons.
fn report(keys: &HashSet<String>, rows: &[(Uuid, String)], letters: &[DeadLetter]) {
    let reasons: HashSet<&str> = letters
        .iter()
        .map(|l| l.error.split(':').next().unwrap_or_default())
        .collect();
    eprintln!(
        "intake test: records={REQUESTS} distinct_valid={} repeats={REPEATS} invalid={INVALID} \
         rows={} dead_letters={} reasons={reasons:?}",
        keys.len(),
        rows.len(),
        letters.len()
    );
}

/// A record the intake refused (a request without fields) is a dead
/// letter; the operator lists it, shows the original request, fixes it, and
/// replays it to the intake: it becomes a job, once. A second replay is
/// refused; a forced one makes no second job (the key names the first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_fixed_by_an_edit_and_replayed_becomes_a_job_exactly_once() {
    let env = TestEnv::new("intake_dlq_replay").await;
    let key = format!("fix-me-{}", Uuid::new_v4().simple());
    let mut broken = sample_body(1);
    broken["fields"] = serde_json::json!([]);
    let record = Produced {
        key: key.clone(),
        requested: requested(&key, broken.to_string()),
    };
    produced_to_the_intake_topic(&env, &[record]).await;
    let mut intake = env.spawn("intake", &[], "intake-dlq-replay");
    let dlq = env.topic("extraction.dlq");
    let brokers = env.settings.kafka_brokers.clone();
    wait_for("the letter", Duration::from_secs(60), || {
        let n = topic_size(&brokers, &dlq);
        async move {
            if n == 1 {
                Ok(())
            } else {
                Err(format!("{n} letters"))
            }
        }
    })
    .await;

    the_tenant_sees_its_letter_and_no_other_tenant_does(&env, &key).await;

    let json = |output: std::process::Output| {
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap()
    };
    let listed = json(
        env.run_cli(&["dlq", "list", "--json", "--kind", "invalid_request"])
            .await,
    );
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let letter = listed[0]["letter"].as_str().unwrap().to_owned();
    let none = json(
        env.run_cli(&["dlq", "list", "--json", "--kind", "missing_row"])
            .await,
    );
    assert_eq!(none, serde_json::json!([]));
    let shown = json(env.run_cli(&["dlq", "show", &letter]).await);
    assert_eq!(shown["original_retained"], true, "{shown}");
    let mut fixed = shown["original"].clone();
    assert_eq!(fixed["idempotency_key"], key.as_str());
    assert_eq!(fixed["request"]["fields"], serde_json::json!([]));
    fixed["request"]["fields"] = sample_body(1)["fields"].clone();
    let file = std::env::temp_dir().join(format!("{key}.json"));
    std::fs::write(&file, fixed.to_string()).unwrap();
    let edit = file.to_str().unwrap();

    let replayed = json(
        env.run_cli(&["dlq", "replay", &letter, "--edit", edit])
            .await,
    );
    assert_eq!(
        replayed["to"],
        env.topic("extraction.requests"),
        "{replayed}"
    );
    let jobs_of_key =
        "SELECT count(*) FROM extraction_requests WHERE idempotency_key LIKE 'fix-me-%'";
    wait_count(
        &env.pool,
        "the replayed job",
        jobs_of_key,
        1,
        Duration::from_secs(60),
    )
    .await;
    let again = env
        .run_cli(&["dlq", "replay", &letter, "--edit", edit])
        .await;
    assert!(!again.status.success(), "a second replay without --force");
    assert!(String::from_utf8_lossy(&again.stderr).contains("replayed before"));
    let forced = json(
        env.run_cli(&["dlq", "replay", &letter, "--edit", edit, "--force"])
            .await,
    );
    assert_eq!(forced["replay"], 2);
    // The forced record is consumed behind the first: once the intake's
    // group has committed past it, it was handled (as a repeat of the key).
    let offset = forced["offset"].as_i64().unwrap();
    let partition = forced["partition"].as_i64().unwrap() as i32;
    let group = env.settings.group(&env.settings.intake_group);
    wait_for(
        "the intake to commit past the forced replay",
        Duration::from_secs(60),
        || {
            let committed = env
                .committed(&group, "extraction.requests")
                .get(&partition)
                .copied();
            async move {
                match committed {
                    Some(next) if next > offset => Ok(()),
                    other => Err(format!("committed {other:?}")),
                }
            }
        },
    )
    .await;
    assert_eq!(
        common::count(&env.pool, jobs_of_key).await,
        1,
        "one job, whatever the replays"
    );
    let shown = json(env.run_cli(&["dlq", "show", &letter]).await);
    assert_eq!(shown["replays"].as_array().unwrap().len(), 2, "{shown}");
    assert_eq!(
        topic_size(&brokers, &dlq),
        1,
        "the fixed request was not dead-lettered again"
    );
    the_tenant_replays_its_letter_once(&env).await;
    stop([&mut intake]).await;
    let _ = std::fs::remove_file(file);
}

/// `GET /v1/dead-letters` shows the tenant whose key sent the refused
/// record its letter (where, why, the key), and another tenant nothing.
async fn the_tenant_sees_its_letter_and_no_other_tenant_does(env: &TestEnv, key: &str) {
    let (base, _serving) = env.serve_here(env.services().await).await;
    let other = docstream::store::tenants::create_tenant(&env.pool, "letters-other")
        .await
        .unwrap()
        .key
        .api_key;
    let page = |api_key: String| {
        let url = format!("{base}/v1/dead-letters");
        async move {
            let client = reqwest::Client::new();
            let answer = client.get(url).bearer_auth(api_key).send().await.unwrap();
            assert_eq!(answer.status(), reqwest::StatusCode::OK);
            answer.json::<serde_json::Value>().await.unwrap()
        }
    };
    let own = page(env.api_key.clone()).await;
    let items = own["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{own}");
    assert_eq!(items[0]["idempotency_key"], key);
    assert_eq!(items[0]["error_kind"], "invalid_request");
    assert_eq!(items[0]["source_topic"], env.topic("extraction.requests"));
    let excerpt = items[0]["excerpt"].as_str().unwrap_or_default();
    assert!(excerpt.starts_with(r#"{"document":{"pages""#), "{excerpt}");
    assert_eq!(
        excerpt.chars().count(),
        docstream::store::letters::EXCERPT_CHARS,
        "the start of the refused request"
    );
    assert_eq!(page(other).await["items"], serde_json::json!([]));
}

/// `POST /v1/dead-letters/{id}/replay` produces the tenant's letter's
/// original record to the intake again, once: unedited, the intake refuses
/// the copy too, which is a second letter at the copy's offset. A second
/// replay is 409, another tenant's is 404.
async fn the_tenant_replays_its_letter_once(env: &TestEnv) {
    let (base, _serving) = env.serve_here(env.services().await).await;
    let client = reqwest::Client::new();
    let letters = || {
        let request = client
            .get(format!("{base}/v1/dead-letters"))
            .bearer_auth(&env.api_key);
        async move {
            request
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    };
    let page = letters().await;
    let first = page["items"][0].clone();
    assert_eq!(first["replayed_at"], serde_json::Value::Null, "{page}");
    let replay = |key: String| {
        let request = client
            .post(format!("{base}/v1/dead-letters/{}/replay", first["id"]))
            .bearer_auth(key);
        async move {
            let answer = request.send().await.unwrap();
            let status = answer.status();
            (
                status,
                answer.json::<serde_json::Value>().await.unwrap_or_default(),
            )
        }
    };
    let other = docstream::store::tenants::create_key(
        &env.pool,
        "letters-other",
        &docstream::domain::Scope::DEFAULT,
    )
    .await
    .unwrap()
    .api_key;
    assert_eq!(replay(other).await.0, reqwest::StatusCode::NOT_FOUND);
    let (status, copy) = replay(env.api_key.clone()).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{copy}");
    assert_eq!(copy["topic"], first["source_topic"]);
    let (status, again) = replay(env.api_key.clone()).await;
    assert_eq!(status, reqwest::StatusCode::CONFLICT, "{again}");
    let page = wait_for("the copy's letter", Duration::from_secs(60), || async {
        let page = letters().await;
        match page["items"].as_array().unwrap().len() {
            2 => Ok(page),
            n => Err(format!("{n} letters")),
        }
    })
    .await;
    let newest = &page["items"][0];
    assert_eq!(
        (&newest["source_partition"], &newest["source_offset"]),
        (&copy["partition"], &copy["offset"]),
        "{page}"
    );
    assert!(page["items"][1]["replayed_at"].is_string(), "{page}");
}

/// A record may name a file its tenant uploaded (`document.object`): it
/// becomes a job the worker reads the PDF of, to bbox succeeded. One naming
/// no file of the tenant's, and one with a URL (fetched by the HTTP API
/// only), are dead letters saying so, and make no job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_request_may_name_an_uploaded_file() {
    let files_dir = tempfile::tempdir().unwrap();
    let dir = files_dir.path().display().to_string();
    let env = TestEnv::with_settings("intake_files", |s| s.files_dir = dir).await;
    let tenant: Uuid = sqlx::query_scalar("SELECT id FROM tenants WHERE name = 'default'")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    let samples = concat!(env!("CARGO_MANIFEST_DIR"), "/samples/files");
    let pdf = std::fs::read(format!("{samples}/receipt-bakery.pdf")).unwrap();
    let sample: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{samples}/receipt-bakery.json")).unwrap(),
    )
    .unwrap();
    let services = env.services().await;
    let (file, _) = services
        .files
        .upload(tenant, Some("application/pdf"), pdf.into())
        .await
        .unwrap();
    let body = |document: serde_json::Value| {
        let mut request = sample["request"].clone();
        request["document"] = document;
        request.to_string()
    };
    let records = [
        ("receipt-file", body(serde_json::json!({"object": file.id}))),
        (
            "no-such-file",
            body(serde_json::json!({"object": "0".repeat(64)})),
        ),
        (
            "a-url",
            body(serde_json::json!({"url": "https://example.com/r.pdf"})),
        ),
    ]
    .map(|(key, json)| Produced {
        key: key.to_owned(),
        requested: requested(key, json),
    });
    produced_to_the_intake_topic(&env, &records).await;
    let mut children = the_intake_and_both_workers(&env);

    wait_count(
        &env.pool,
        "the file's job at bbox succeeded",
        "SELECT count(*) FROM extractions WHERE bbox_status = 'succeeded'",
        1,
        Duration::from_secs(60),
    )
    .await;
    let dlq = env.topic("extraction.dlq");
    let brokers = env.settings.kafka_brokers.clone();
    wait_for("two dead letters", Duration::from_secs(60), || {
        let (brokers, dlq) = (brokers.clone(), dlq.clone());
        async move {
            match topic_size(&brokers, &dlq) {
                n if n >= 2 => Ok(()),
                n => Err(format!("{n} dead letters")),
            }
        }
    })
    .await;
    stop(children.iter_mut()).await;

    let letters: Vec<DeadLetter> = env
        .read_topic("extraction.dlq")
        .into_iter()
        .map(|(_, value)| decode(&value).unwrap())
        .collect();
    let mut errors: Vec<&str> = letters.iter().map(|l| l.error.as_str()).collect();
    errors.sort();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors[0].contains("document.object: no file"), "{errors:?}");
    assert!(
        errors[1].contains("document.url is fetched by POST /v1/extractions only"),
        "{errors:?}"
    );
    let keys: Vec<String> = sqlx::query_scalar("SELECT idempotency_key FROM extraction_requests")
        .fetch_all(&env.pool)
        .await
        .unwrap();
    assert_eq!(keys, ["receipt-file"], "only the file's request made a job");
    let (total,): (String,) =
        sqlx::query_as("SELECT result -> 'fields' -> 'total' ->> 'value' FROM extraction_rows")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(total, "8.60");
}
