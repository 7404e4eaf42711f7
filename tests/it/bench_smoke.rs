//! The benchmark keeps working: a seconds-long `docstream bench --smoke` runs
//! every phase (pgbench, Kafka's perf tools, graphile-worker and River with
//! their chains, docstream's burn-down, steady state, saturation curve,
//! refusals, the steady state through extractor-serve, and fairness)
//! against the real services and writes a report
//! in which each phase measured something. It measures nothing worth keeping:
//! performance is the benchmark's job (`scripts/bench.sh`), not this test's.

use std::process::Command;

fn number(report: &serde_json::Value, path: &str) -> f64 {
    report
        .pointer(path)
        .and_then(serde_json::Value::as_f64)
        .unwrap_or_else(|| panic!("report has no number at {path}: {report:#}"))
}

#[test]
fn a_smoke_run_measures_every_phase() {
    let (_out, report) = a_smoke_run();
    it_is_a_smoke_report_with_the_ceilings_measured(&report);
    the_queues_and_the_burn_down_measured(&report);
    both_steady_states_measured(&report);
    the_saturation_curve_measured(&report);
    refusals_and_fair_admission_measured(&report);
    every_check_is_reported(&report);
}

/// The refusals phase got both answers and priced them; the fairness
/// phase's admission run had A refused past the limit and B admitted.
fn refusals_and_fair_admission_measured(report: &serde_json::Value) {
    for answer in ["accepted", "refused"] {
        assert!(number(report, &format!("/refusals/{answer}/answers")) > 0.0);
        assert!(number(report, &format!("/refusals/{answer}/serve_cpu_us")) > 0.0);
    }
    let runs = report["fairness"].as_array().unwrap();
    let admission = runs.iter().find(|r| r["run"] == "admission");
    let admission = admission.unwrap_or_else(|| panic!("no admission run: {runs:?}"));
    assert!(
        admission["a_overloaded"].as_u64().unwrap() > 0,
        "{admission}"
    );
    assert_eq!(admission["b_refused"], serde_json::json!({}), "{admission}");
    assert_eq!(admission["b_jobs"], 100);
}

/// Runs `docstream bench --smoke` into a temporary directory, checks that it
/// succeeded, and returns the directory (kept until the test ends) and the
/// report it wrote.
fn a_smoke_run() -> (tempfile::TempDir, serde_json::Value) {
    let out = tempfile::tempdir().unwrap();
    let root = env!("CARGO_MANIFEST_DIR");
    let output = Command::new(env!("CARGO_BIN_EXE_docstream"))
        .args(["bench", "--smoke", "--out"])
        .arg(out.path())
        .arg("--scripts")
        .arg(format!("{root}/scripts/bench"))
        .current_dir(root)
        .output()
        .expect("run docstream bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "bench failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("{stdout}");
    let json = std::fs::read_to_string(out.path().join("latest.json")).unwrap();
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    (out, report)
}

/// The report is a smoke run's, with both Postgres ceilings (1 and 100 rows
/// per statement) and both Kafka perf tools measured.
fn it_is_a_smoke_report_with_the_ceilings_measured(report: &serde_json::Value) {
    assert_eq!(report["smoke"], true);
    for (i, rows) in [1.0, 100.0].into_iter().enumerate() {
        assert_eq!(
            number(report, &format!("/postgres/{i}/rows_per_statement")),
            rows
        );
        assert!(number(report, &format!("/postgres/{i}/lifecycles_per_s")) > 0.0);
    }
    assert!(number(report, "/kafka/producer_records_per_s") > 0.0);
    assert!(number(report, "/kafka/consumer_records_per_s") > 0.0);
}

/// graphile-worker (no-op jobs, then its chain), River (no-op jobs, then
/// both its chains), 300 documents each, and docstream's burn-down (300
/// jobs) each measured a rate, and the burn-down each of its costs.
fn the_queues_and_the_burn_down_measured(report: &serde_json::Value) {
    let peers = [
        ("peer", vec!["noop", "chain"]),
        ("river", vec!["noop", "chain", "chain-tx"]),
    ];
    for (peer, modes) in peers {
        let runs = report[peer].as_array().unwrap();
        let ran: Vec<&str> = runs.iter().map(|r| r["mode"].as_str().unwrap()).collect();
        assert_eq!(ran, modes, "{peer}");
        for (i, mode) in modes.iter().enumerate() {
            assert_eq!(number(report, &format!("/{peer}/{i}/documents")), 300.0);
            let stages = if *mode == "noop" { 1.0 } else { 2.0 };
            assert_eq!(number(report, &format!("/{peer}/{i}/jobs")), 300.0 * stages);
            assert!(number(report, &format!("/{peer}/{i}/documents_per_s")) > 0.0);
        }
    }
    assert_eq!(number(report, "/burn_down/jobs"), 300.0);
    assert!(number(report, "/burn_down/jobs_per_s") > 0.0);
    for cost in ["total_cpu_ms", "wal_bytes", "kafka_records", "kafka_bytes"] {
        assert!(
            number(report, &format!("/burn_down/cost/{cost}")) > 0.0,
            "{cost}"
        );
    }
}

/// The steady state, and the steady state through extractor-serve, accepted
/// all they sent and measured latencies; the provider's is in every job. A
/// steady state at a modest rate (100/s) refuses nothing: this is the
/// suite's guard against an admission limit, a pool or a bound that turns
/// away submits a small machine can take (it asserts refusals, not time).
fn both_steady_states_measured(report: &serde_json::Value) {
    let steady = &report["steady"];
    assert_eq!(
        steady["accepted"], steady["sent"],
        "refused at 100/s: {}",
        steady["refused"]
    );
    assert_eq!(steady["refused"], serde_json::json!({}));
    assert!(number(report, "/steady/submit_to_succeeded/count") > 0.0);
    assert!(
        number(report, "/steady/submit_to_bbox_succeeded/p99_ms")
            >= number(report, "/steady/submit_to_bbox_succeeded/p50_ms")
    );
    let provider = &report["provider"]["steady"];
    assert_eq!(provider["accepted"], provider["sent"]);
    assert!(
        number(report, "/provider/steady/submit_to_succeeded/p50_ms") >= 200.0,
        "the provider's latency is in every job"
    );
    assert!(number(report, "/provider/utilisation") > 0.0);
}

/// The saturation curve has a step per offered load, each with what was
/// accepted, and the recovery's p99 for each second after the drop.
fn the_saturation_curve_measured(report: &serde_json::Value) {
    let curve = &report["saturation"];
    assert!(
        number(report, "/saturation/capacity_per_s") > 0.0,
        "{curve}"
    );
    let steps = curve["steps"].as_array().unwrap();
    let loads: Vec<f64> = steps.iter().map(|s| s["load"].as_f64().unwrap()).collect();
    assert_eq!(loads, [0.5, 1.0, 1.5, 2.0, 3.0]);
    for step in steps {
        assert!(step["sent"].as_u64().unwrap() > 0, "{step}");
        assert!(step["accepted"].as_u64().unwrap() > 0, "{step}");
    }
    assert!(!curve["recovery"]["p99_by_second_ms"]
        .as_array()
        .unwrap()
        .is_empty());
}

/// The report holds a check about each of the targets named below.
fn every_check_is_reported(report: &serde_json::Value) {
    let checks = report["checks"].as_array().unwrap();
    for name in [
        "graphile-worker, same work",
        "River, same work",
        "single-stage no-op job",
        "CPU per job",
        "refusal CPU",
        "admission: B's submits refused",
        "Postgres ceiling, 1 row",
        "peak RSS",
        "steady p99",
        "saturation 3x",
        "extractor utilisation",
    ] {
        assert!(
            checks
                .iter()
                .any(|c| c["name"].as_str().unwrap().contains(name)),
            "no check about {name}: {checks:?}"
        );
    }
}
