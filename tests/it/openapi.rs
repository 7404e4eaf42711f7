//! The checked-in contract: `docs/openapi.json` is what a `serve` with the
//! default limits answers at `GET /openapi.json`, byte for byte (pretty
//! JSON and a newline). When they differ, the test says how to regenerate
//! the file: `DOCSTREAM_UPDATE_OPENAPI=1 cargo test --test it openapi::`.

use crate::common;

use std::path::Path;

use common::{free_port, wait_healthy, TestEnv};
use tokio::process::Child;

const CHECKED_IN: &str = "docs/openapi.json";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_is_the_checked_in_one() {
    let mut served = a_serve_with_the_default_limits().await;
    let document = the_document_is_public_json(&served.base).await;
    let rendered = serde_json::to_string_pretty(&document).unwrap() + "\n";
    it_is_the_checked_in_file_byte_for_byte(&rendered);
    every_documented_path_answers_as_documented(&served.base, &document).await;
    common::stop([&mut served.serve]).await;
}

/// A healthy `serve` with the default settings. Fields are in the order the
/// test's locals used to be dropped.
struct Served {
    base: String,
    serve: Child,
    _env: TestEnv,
}

/// Starts `serve` on a free port and waits until it is healthy.
async fn a_serve_with_the_default_limits() -> Served {
    let env = TestEnv::new("openapi").await;
    let addr = format!("127.0.0.1:{}", free_port());
    let serve = env.spawn(
        "serve",
        &[("DOCSTREAM_HTTP_ADDR", addr.clone())],
        "openapi-serve",
    );
    let base = format!("http://{addr}");
    wait_healthy(&base).await;
    Served {
        base,
        serve,
        _env: env,
    }
}

/// No key: the document is public, like the probes. Returns it, after
/// checking it is JSON of OpenAPI 3.1.0.
async fn the_document_is_public_json(base: &str) -> serde_json::Value {
    let response = common::http_client()
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let served: serde_json::Value = response.json().await.expect("JSON");
    assert_eq!(served["openapi"], "3.1.0");
    served
}

/// The served document, `rendered`, is [`CHECKED_IN`] (first written over it
/// with `DOCSTREAM_UPDATE_OPENAPI=1`); if not, panics with the first
/// difference and how to regenerate the file.
fn it_is_the_checked_in_file_byte_for_byte(rendered: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(CHECKED_IN);
    if std::env::var("DOCSTREAM_UPDATE_OPENAPI").as_deref() == Ok("1") {
        std::fs::write(&path, rendered).expect("write docs/openapi.json");
        eprintln!("openapi: wrote {CHECKED_IN}");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if checked_in != rendered {
        let line = first_different_line(&checked_in, rendered);
        panic!(
            "{CHECKED_IN} is not the document `serve` answers with the default settings \
             (first difference at line {line}: {:?} served, {:?} checked in). If the API \
             changed on purpose, regenerate it with\n\n    \
             DOCSTREAM_UPDATE_OPENAPI=1 cargo test --test it openapi::\n\nand commit the file.",
            rendered.lines().nth(line - 1).unwrap_or("<end>"),
            checked_in.lines().nth(line - 1).unwrap_or("<end>"),
        );
    }
}

/// The first line (from 1) where the two texts differ, or the one past the
/// shorter text's end when one is the other's beginning.
fn first_different_line(checked_in: &str, rendered: &str) -> usize {
    checked_in
        .lines()
        .zip(rendered.lines())
        .position(|(a, b)| a != b)
        .map_or(
            checked_in.lines().count().min(rendered.lines().count()),
            |i| i,
        )
        + 1
}

/// Every documented path answers on the real router (none is a 404 of an
/// unknown route), and the routes that need a key refuse a request
/// without one as the document says: 401 with `WWW-Authenticate`.
async fn every_documented_path_answers_as_documented(base: &str, served: &serde_json::Value) {
    let client = common::http_client();
    let operations = ["paths", "x-websockets"]
        .iter()
        .flat_map(|part| served[part].as_object().unwrap());
    for (path, item) in operations {
        let concrete = path.replace("{id}", &uuid::Uuid::now_v7().to_string());
        for (method, operation) in item.as_object().unwrap() {
            let method: reqwest::Method = method.to_uppercase().parse().unwrap();
            let answer = client
                .request(method.clone(), format!("{base}{concrete}"))
                .send()
                .await
                .expect("an answer");
            let status = answer.status().as_u16().to_string();
            assert!(
                operation["responses"].get(&status).is_some(),
                "{method} {path} without a key answered {status}, which the document does not list"
            );
            // A route that names no way to prove who calls needs none.
            let public = operation["security"].as_array().is_none_or(Vec::is_empty);
            if !public {
                assert_eq!(status, "401", "{method} {path} without a key");
                assert_eq!(answer.headers()["www-authenticate"], "Bearer");
            }
        }
    }
}
