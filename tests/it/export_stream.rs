//! The WebSocket export stream against a real `serve` process and a real
//! broker: a group resumes after what its client acknowledged, the committed
//! offset never passes an event the client did not acknowledge, the drop
//! strategies count every drop while memory stays bounded, and a server
//! shutdown with both streams busy drains, commits and closes normally.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{
    answers_until_close, busy_import, first_answers, free_port, peak_rss_kib,
    read_topic_positioned, scrape, signal, stop, wait_count, wait_for, wait_healthy, TestEnv,
    ALL_BBOX_SUCCEEDED,
};
use docstream::events::{encode, now_ms, ExtractionEvent, PublishReason};
use docstream::store::tenants::{self, CreatedKey, DEFAULT_TENANT_ID};
use futures::{stream, SinkExt, StreamExt};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use tokio::net::TcpStream;
use tokio::process::Child;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use uuid::Uuid;

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// One event as the client received it.
#[derive(Debug, Clone)]
struct Received {
    seq: u64,
    position: (i32, i64),
}

/// Produces `n` events straight onto the test's `extraction.events`, each about
/// a job of its own, of the tenant `default` (the test key's).
async fn produce_events(env: &TestEnv, n: usize) {
    produce_events_of(env, n, DEFAULT_TENANT_ID).await
}

/// [`produce_events`] for jobs of tenant `tenant_id`.
async fn produce_events_of(env: &TestEnv, n: usize, tenant_id: Uuid) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.settings.kafka_brokers)
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let topic = env.topic("extraction.events");
    stream::iter(0..n)
        .map(|_| {
            let id = Uuid::new_v4().to_string();
            let event = ExtractionEvent {
                extraction_id: id.clone(),
                transition: "mark_succeeded".into(),
                status: "succeeded".into(),
                bbox_status: Some("pending".into()),
                token: Some(1),
                error: None,
                reason: PublishReason::Submit,
                published_at_ms: now_ms(),
                tenant_id: Some(tenant_id.to_string()),
                correction: None,
            };
            let payload = encode(&event).unwrap();
            let (producer, topic) = (producer.clone(), topic.clone());
            async move {
                let record = FutureRecord::to(&topic)
                    .key(id.as_bytes())
                    .payload(&payload);
                producer
                    .send(record, Duration::from_secs(30))
                    .await
                    .unwrap();
            }
        })
        .buffered(256)
        .collect::<Vec<_>>()
        .await;
}

async fn connect(env: &TestEnv, port: u16, query: &str) -> Socket {
    connect_with(&env.api_key, port, query).await
}

/// An export stream opened with API key `key`.
async fn connect_with(key: &str, port: u16, query: &str) -> Socket {
    let url = format!("ws://127.0.0.1:{port}/v1/export?{query}");
    tokio_tungstenite::connect_async(common::ws_request(&url, key))
        .await
        .expect("connect")
        .0
}

fn ack(seq: u64) -> Message {
    Message::Text(serde_json::json!({ "ack": seq }).to_string().into())
}

/// An event frame's seq and position; panics on anything else.
fn parse(text: &str) -> Received {
    let frame: serde_json::Value = serde_json::from_str(text).unwrap();
    let (Some(seq), Some(partition), Some(offset)) = (
        frame["seq"].as_u64(),
        frame["partition"].as_i64(),
        frame["offset"].as_i64(),
    ) else {
        panic!("not an event frame: {text}");
    };
    assert!(frame["event"]["extraction_id"].is_string(), "{text}");
    Received {
        seq,
        position: (partition as i32, offset),
    }
}

/// Reads until the server's close frame (answering it), returning the events
/// that arrived meanwhile and the close frame.
async fn read_to_close(socket: &mut Socket) -> (Vec<Received>, Option<CloseFrame>) {
    let mut late = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(60), socket.next()).await {
            Ok(Some(Ok(Message::Text(text)))) => late.push(parse(&text)),
            Ok(Some(Ok(Message::Close(frame)))) => {
                // Drive the close reply out.
                while let Some(Ok(_)) = socket.next().await {}
                return (late, frame);
            }
            Ok(Some(Ok(_))) => {}
            Ok(None) | Ok(Some(Err(_))) => return (late, None),
            Err(_) => panic!("no close from the server within 60 s"),
        }
    }
}

/// Waits until the export group's committed offsets sum to `n`, checking on
/// the way that they never pass it.
async fn wait_committed(env: &TestEnv, group: &str, n: usize) -> i64 {
    let what = format!("group {group} to commit {n} records");
    wait_for(&what, Duration::from_secs(30), || {
        let sum = committed_sum(env, group);
        async move {
            assert!(sum <= n as i64, "group {group} committed {sum} > {n}");
            (sum == n as i64)
                .then_some(sum)
                .ok_or(format!("committed {sum}"))
        }
    })
    .await
}

/// A partition's events arrive in offset order (a job's events share a
/// partition, so a client sees each job's changes in the order they happened).
fn assert_in_partition_order<'a>(received: impl IntoIterator<Item = &'a Received>) {
    let mut last: HashMap<i32, &Received> = HashMap::new();
    for r in received {
        if let Some(before) = last.insert(r.position.0, r) {
            assert!(
                before.position.1 < r.position.1 && before.seq < r.seq,
                "out of order: {before:?} then {r:?}"
            );
        }
    }
}

/// Every (partition, offset) on the test's `extraction.events` so far.
fn event_positions(env: &TestEnv) -> HashSet<(i32, i64)> {
    read_topic_positioned(&env.settings.kafka_brokers, &env.topic("extraction.events"))
        .into_iter()
        .map(|(partition, offset, _, _)| (partition, offset))
        .collect()
}

/// The tenant of each event on the test's `extraction.events`, by position.
fn event_tenants(env: &TestEnv) -> HashMap<(i32, i64), Uuid> {
    read_topic_positioned(&env.settings.kafka_brokers, &env.topic("extraction.events"))
        .into_iter()
        .map(|(partition, offset, _, value)| {
            let event: ExtractionEvent = docstream::events::decode(&value).unwrap();
            let tenant = event.tenant_id.unwrap().parse().unwrap();
            ((partition, offset), tenant)
        })
        .collect()
}

/// Positions received on `socket` (which must not need acknowledgements)
/// until `done` says the set is complete, or `quiet` passes without a frame.
async fn receive_until(
    socket: &mut Socket,
    quiet: Duration,
    done: impl Fn(&HashSet<(i32, i64)>) -> bool,
) -> HashSet<(i32, i64)> {
    let mut seen = HashSet::new();
    while !done(&seen) {
        match tokio::time::timeout(quiet, socket.next()).await {
            Ok(Some(Ok(Message::Text(text)))) => {
                seen.insert(parse(&text).position);
            }
            Ok(Some(Ok(_))) => {}
            Ok(other) => panic!("the stream broke: {other:?}"),
            Err(_) => break,
        }
    }
    seen
}

/// The export group's committed offsets, summed: records it has delivered.
fn committed_sum(env: &TestEnv, group: &str) -> i64 {
    // The tenant `default`'s group (the test's key is that tenant's).
    let group = env
        .settings
        .group(&format!("docstream-export-default.{group}"));
    env.committed(&group, "extraction.events").values().sum()
}

/// Events each tenant has on the topic before the server starts, and how many
/// more each gets once A's latest stream has started.
const TENANT_EVENTS_BEFORE: usize = 300;
const TENANT_EVENTS_AFTER: usize = 100;

/// Tenants A and B with events on the topic, and a `serve` started after them.
struct TwoTenants {
    env: TestEnv,
    a: CreatedKey,
    b: CreatedKey,
    /// Every position on the topic before the server started.
    old: HashSet<(i32, i64)>,
    port: u16,
    serve: Child,
}

/// Each tenant's events, once both got more after A's latest stream started.
struct TenantEvents {
    /// A's events produced after its latest stream started.
    a_new: HashSet<(i32, i64)>,
    all_of_a: HashSet<(i32, i64)>,
    all_of_b: HashSet<(i32, i64)>,
}

/// Tenant A's and B's names, and the group names of their streams: A's
/// `b-c` and B's `c` were one Kafka group when a group was the tenant and
/// the name joined with `-` (`p22430-b-c`), so B's stream joined A's group.
const TENANT_A: &str = "p22430";
const TENANT_B: &str = "p22430-b";
const GROUP_OF_A: &str = "b-c";
const GROUP_OF_B: &str = "c";

/// Tenants A and B, 300 events of each on the topic, then a `serve`.
async fn two_tenants_with_events_and_a_server() -> TwoTenants {
    let env = TestEnv::new("export_tenants").await;
    let a = tenants::create_tenant(&env.pool, TENANT_A)
        .await
        .unwrap()
        .key;
    let b = tenants::create_tenant(&env.pool, TENANT_B)
        .await
        .unwrap()
        .key;
    produce_events_of(&env, TENANT_EVENTS_BEFORE, a.tenant_id).await;
    produce_events_of(&env, TENANT_EVENTS_BEFORE, b.tenant_id).await;
    let old: HashSet<(i32, i64)> = event_positions(&env);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let serve = a_healthy_serve(&env, &addr, &[], "export-tenants-serve").await;
    TwoTenants {
        env,
        a,
        b,
        old,
        port,
        serve,
    }
}

/// A's new group, from the latest, once a marker event of A's has come
/// through it (the group is assigned); and how many markers that took.
async fn a_latest_stream_of_tenant_a_once_it_has_started(scenario: &TwoTenants) -> (Socket, i32) {
    let (env, a) = (&scenario.env, &scenario.a);
    let query = format!("group={GROUP_OF_A}&ack=auto");
    let mut latest = connect_with(&a.api_key, scenario.port, &query).await;
    let quiet = Duration::from_millis(1500);
    let mut markers = 0;
    while receive_until(&mut latest, quiet, |seen| !seen.is_empty())
        .await
        .is_empty()
    {
        assert!(markers < 60, "A's stream never started");
        produce_events_of(env, 1, a.tenant_id).await;
        markers += 1;
    }
    (latest, markers)
}

/// 100 more events of each tenant's, and every event sorted by tenant.
async fn more_events_of_each_tenant(scenario: &TwoTenants) -> TenantEvents {
    let (env, a, b) = (&scenario.env, &scenario.a, &scenario.b);
    let before_after = event_positions(env);
    produce_events_of(env, TENANT_EVENTS_AFTER, a.tenant_id).await;
    produce_events_of(env, TENANT_EVENTS_AFTER, b.tenant_id).await;
    let owners = event_tenants(env);
    let new_of = |tenant: Uuid| -> HashSet<(i32, i64)> {
        owners
            .iter()
            .filter(|(p, t)| **t == tenant && !before_after.contains(p))
            .map(|(p, _)| *p)
            .collect()
    };
    let all_of = |tenant: Uuid| -> HashSet<(i32, i64)> {
        owners
            .iter()
            .filter(|(_, t)| **t == tenant)
            .map(|(p, _)| *p)
            .collect()
    };
    let (a_new, all_of_a) = (new_of(a.tenant_id), all_of(a.tenant_id));
    let all_of_b = all_of(b.tenant_id);
    assert_eq!(
        (a_new.len(), all_of_b.len()),
        (
            TENANT_EVENTS_AFTER,
            TENANT_EVENTS_BEFORE + TENANT_EVENTS_AFTER
        )
    );
    TenantEvents {
        a_new,
        all_of_a,
        all_of_b,
    }
}

/// A's latest stream carries every new event of A's, and none produced
/// before it started, and none of B's.
async fn the_latest_stream_carries_only_the_new_events_of_a(
    scenario: &TwoTenants,
    latest: &mut Socket,
    events: &TenantEvents,
) {
    let (a_new, all_of_a) = (&events.a_new, &events.all_of_a);
    let got = receive_until(latest, Duration::from_secs(10), |seen| {
        a_new.is_subset(seen)
    })
    .await;
    assert!(
        a_new.is_subset(&got),
        "{} of A's new events missing",
        a_new.difference(&got).count()
    );
    assert!(
        got.is_disjoint(&scenario.old),
        "a latest stream replayed old events"
    );
    assert!(
        got.is_subset(all_of_a),
        "A's stream carried another tenant's event"
    );
}

/// From the earliest, A's stream carries every event of A's, none of B's.
async fn a_stream_of_a_from_the_earliest_carries_every_event_of_a(
    scenario: &TwoTenants,
    events: &TenantEvents,
) -> Socket {
    let key = &scenario.a.api_key;
    let mut earliest = connect_with(key, scenario.port, "group=g2&ack=auto&from=earliest").await;
    let got = receive_until(&mut earliest, Duration::from_secs(10), |seen| {
        events.all_of_a.is_subset(seen)
    })
    .await;
    assert_eq!(got, events.all_of_a, "A from the earliest");
    earliest
}

/// B's group, whose name once met A's, is B's own: from the earliest (A's
/// group has committed past B's events by now), all of B's.
async fn a_group_of_b_that_once_met_as_carries_every_event_of_b(
    scenario: &TwoTenants,
    events: &TenantEvents,
) -> Socket {
    let key = &scenario.b.api_key;
    let query = format!("group={GROUP_OF_B}&ack=auto&from=earliest");
    let mut b_stream = connect_with(key, scenario.port, &query).await;
    let got_b = receive_until(&mut b_stream, Duration::from_secs(10), |seen| {
        events.all_of_b.is_subset(seen)
    })
    .await;
    assert_eq!(got_b, events.all_of_b, "B from the earliest");
    b_stream
}

/// Each tenant's group committed on its own, under its own Kafka group
/// (reported beside what each stream carried). The closed streams' last
/// commits may still be on their way.
async fn each_tenants_group_committed_on_its_own(
    scenario: &TwoTenants,
    events: &TenantEvents,
    markers: i32,
) {
    let env = &scenario.env;
    let group_of = |tenant: &str, name: &str| {
        env.settings
            .group(&format!("docstream-export-{tenant}.{name}"))
    };
    let (a_group, b_group) = (
        group_of(TENANT_A, GROUP_OF_A),
        group_of(TENANT_B, GROUP_OF_B),
    );
    assert_ne!(a_group, b_group);
    let sum = |group: &str| -> i64 { env.committed(group, "extraction.events").values().sum() };
    let (a_committed, b_committed) = wait_for(
        "each tenant's group to commit on its own",
        Duration::from_secs(15),
        || {
            let sums = (sum(&a_group), sum(&b_group));
            async move {
                match sums {
                    (a, b) if a > 0 && b > 0 => Ok((a, b)),
                    other => Err(format!("committed (A, B) {other:?}")),
                }
            }
        },
    )
    .await;
    eprintln!(
        "export tenants test: A latest got {} new (0 old, 0 of B; {markers} markers), A earliest {}, B earliest {}; committed A {a_committed}, B {b_committed}",
        events.a_new.len(),
        events.all_of_a.len(),
        events.all_of_b.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_carries_only_its_tenants_events_from_the_latest_unless_asked_for_the_earliest() {
    let mut scenario = two_tenants_with_events_and_a_server().await;
    let (mut latest, markers) = a_latest_stream_of_tenant_a_once_it_has_started(&scenario).await;
    let events = more_events_of_each_tenant(&scenario).await;
    the_latest_stream_carries_only_the_new_events_of_a(&scenario, &mut latest, &events).await;
    let mut earliest =
        a_stream_of_a_from_the_earliest_carries_every_event_of_a(&scenario, &events).await;
    let mut b_stream =
        a_group_of_b_that_once_met_as_carries_every_event_of_b(&scenario, &events).await;
    for socket in [&mut latest, &mut earliest, &mut b_stream] {
        let _ = socket.close(None).await;
    }
    each_tenants_group_committed_on_its_own(&scenario, &events, markers).await;
    stop([&mut scenario.serve]).await;
}

/// The backlog the ack-timeout test reads, and the timeout it sets.
const ACK_TIMEOUT_EVENTS: usize = 600;
const ACK_TIMEOUT_S: u64 = 3;

/// A `serve` with a 3 s acknowledgement timeout, over a backlog.
struct AckTimeout {
    serve: Child,
    port: u16,
    /// Every position on the topic.
    all: HashSet<(i32, i64)>,
    /// Held to the end: dropping it cleans up the test's database and topics.
    env: TestEnv,
}

/// A member that read its first event and never acknowledges, and when it
/// read it.
struct Silent {
    socket: Socket,
    since: std::time::Instant,
}

/// 600 events on the topic, then a `serve` with a 3 s acknowledgement
/// timeout.
async fn a_server_with_a_3_s_ack_timeout_over_600_events() -> AckTimeout {
    let env = TestEnv::new("export_ack_timeout").await;
    produce_events(&env, ACK_TIMEOUT_EVENTS).await;
    let all = event_positions(&env);
    let port = free_port();
    let settings = [("DOCSTREAM_EXPORT_ACK_TIMEOUT_S", ACK_TIMEOUT_S.to_string())];
    let addr = format!("127.0.0.1:{port}");
    let serve = a_healthy_serve(&env, &addr, &settings, "export-ack-timeout-serve").await;
    AckTimeout {
        serve,
        port,
        all,
        env,
    }
}

/// The silent member reads (its first event within 30 s) and never
/// acknowledges; then a second member joins and acknowledges everything it
/// gets.
async fn a_silent_member_and_one_that_acknowledges_everything(
    given: &AckTimeout,
) -> (Silent, AckingMember) {
    // The silent member reads and never acknowledges.
    let mut silent = connect(&given.env, given.port, "group=shared&from=earliest").await;
    let first = tokio::time::timeout(Duration::from_secs(30), silent.next()).await;
    assert!(matches!(first, Ok(Some(Ok(Message::Text(_))))), "{first:?}");
    let since = std::time::Instant::now();
    // A second member joins and acknowledges everything it gets.
    let seen = Arc::new(std::sync::Mutex::new(HashSet::new()));
    let done = tokio_util::sync::CancellationToken::new();
    let socket = connect(&given.env, given.port, "group=shared&from=earliest").await;
    let acking = acking_client(socket, Duration::ZERO, seen.clone(), done.clone());
    let silent = Silent {
        socket: silent,
        since,
    };
    let member = AckingMember {
        seen,
        done,
        task: acking,
    };
    (silent, member)
}

/// The server closes the silent member with an error saying no
/// acknowledgement came; returns how long after its first event.
async fn the_silent_member_is_closed_for_no_acknowledgement(silent: &mut Silent) -> Duration {
    let (_, close) = read_to_close(&mut silent.socket).await;
    let closed_after = silent.since.elapsed();
    let close = close.expect("a close frame");
    assert_eq!(close.code, CloseCode::Error, "{close:?}");
    assert!(close.reason.contains("no acknowledgement"), "{close:?}");
    closed_after
}

/// The other member gets every event (within 120 s), then leaves, and the
/// group commits them all. Returns the commit.
async fn the_other_member_gets_every_event_and_the_group_commits_them(
    given: &AckTimeout,
    member: AckingMember,
) -> i64 {
    let (all, seen) = (&given.all, &member.seen);
    wait_for(
        "the other member to get every event",
        Duration::from_secs(120),
        || {
            let missing = all.difference(&seen.lock().unwrap()).count();
            async move {
                (missing == 0)
                    .then_some(())
                    .ok_or(format!("{missing} missing"))
            }
        },
    )
    .await;
    member.done.cancel();
    member.task.await.unwrap();
    wait_committed(&given.env, "shared", ACK_TIMEOUT_EVENTS).await
}

/// The ack-timeout test's report line; the silent member was closed within
/// 5 s past the timeout.
fn it_was_closed_soon_after_the_timeout(closed_after: Duration, committed: i64) {
    eprintln!(
        "export ack-timeout test: silent member closed {closed_after:?} after its first event (timeout {ACK_TIMEOUT_S} s); the other got all {ACK_TIMEOUT_EVENTS}; committed {committed}"
    );
    assert!(
        closed_after < Duration::from_secs(ACK_TIMEOUT_S + 5),
        "closed after {closed_after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_never_acknowledges_is_closed_and_its_partitions_move_on() {
    let mut given = a_server_with_a_3_s_ack_timeout_over_600_events().await;
    let (mut silent, member) = a_silent_member_and_one_that_acknowledges_everything(&given).await;
    let closed_after = the_silent_member_is_closed_for_no_acknowledgement(&mut silent).await;
    let committed =
        the_other_member_gets_every_event_and_the_group_commits_them(&given, member).await;
    it_was_closed_soon_after_the_timeout(closed_after, committed);
    stop([&mut given.serve]).await;
}

/// The backlog the resume test reads, and how many of it the first
/// connection acknowledges.
const RESUME_EVENTS: usize = 1_000;
const RESUME_ACKED: usize = 500;

/// A `serve` (with its metrics listener) started over a backlog of events.
struct Backlog {
    serve: Child,
    /// Its /metrics, on the internal listener.
    metrics: String,
    port: u16,
    /// Every position on the topic.
    all: HashSet<(i32, i64)>,
    /// Held to the end: dropping it cleans up the test's database and topics.
    env: TestEnv,
}

/// What the first connection of the group received before it left.
struct FirstConnection {
    /// The events it acknowledged (the first 500).
    first: Vec<Received>,
    /// Received after the ack and never acknowledged.
    unacknowledged: Vec<Received>,
    /// The positions of the acknowledged events.
    acked: HashSet<(i32, i64)>,
    /// The connection, closed, kept until the test ends.
    _socket: Socket,
}

/// What the second connection of the group received.
struct SecondConnection {
    second: Vec<Received>,
    /// The connection, closed, kept until the test ends.
    _socket: Socket,
}

/// 1,000 events on the topic, then a `serve` with a metrics listener.
async fn a_server_over_a_backlog_of_1000_events() -> Backlog {
    let env = TestEnv::new("export_resume").await;
    produce_events(&env, RESUME_EVENTS).await;
    let all: HashSet<(i32, i64)> = event_positions(&env);
    assert_eq!(all.len(), RESUME_EVENTS);
    let port = free_port();
    let metrics = format!("127.0.0.1:{}", free_port());
    let settings = [("DOCSTREAM_METRICS_ADDR", metrics.clone())];
    let addr = format!("127.0.0.1:{port}");
    let serve = a_healthy_serve(&env, &addr, &settings, "export-resume-serve").await;
    Backlog {
        serve,
        metrics,
        port,
        all,
        env,
    }
}

/// First connection: acknowledge the first 500 events received, then leave.
async fn a_first_connection_acknowledges_500_and_leaves(backlog: &Backlog) -> FirstConnection {
    let mut socket = connect(&backlog.env, backlog.port, "group=resume&from=earliest").await;
    let mut first = Vec::new();
    while first.len() < RESUME_ACKED {
        match socket.next().await {
            Some(Ok(Message::Text(text))) => first.push(parse(&text)),
            other => panic!("unexpected: {other:?}"),
        }
    }
    assert_eq!(
        first[RESUME_ACKED - 1].seq,
        RESUME_ACKED as u64,
        "seqs count from 1"
    );
    socket.send(ack(RESUME_ACKED as u64)).await.unwrap();
    socket.close(None).await.unwrap();
    // Received after the ack and never acknowledged: not counted as delivered.
    let (unacknowledged, _) = read_to_close(&mut socket).await;
    let acked: HashSet<(i32, i64)> = first.iter().map(|r| r.position).collect();
    assert_eq!(
        acked.len(),
        RESUME_ACKED,
        "no event twice in one connection"
    );
    FirstConnection {
        first,
        unacknowledged,
        acked,
        _socket: socket,
    }
}

/// The group never committed more than was acknowledged, the first
/// connection got each partition in order, and the group commits the 500.
/// Returns that commit.
async fn no_more_than_the_acknowledged_is_committed(
    backlog: &Backlog,
    first: &FirstConnection,
) -> i64 {
    let committed = committed_sum(&backlog.env, "resume");
    assert!(
        committed <= RESUME_ACKED as i64,
        "committed {committed} records, but only {RESUME_ACKED} were acknowledged"
    );

    assert_in_partition_order(first.first.iter().chain(&first.unacknowledged));
    wait_committed(&backlog.env, "resume", RESUME_ACKED).await
}

/// Second connection, same group: everything else arrives (each within
/// 60 s); it acknowledges the last and leaves.
async fn a_second_connection_of_the_group_receives_the_rest(
    backlog: &Backlog,
    first: &FirstConnection,
) -> SecondConnection {
    let mut socket = connect(&backlog.env, backlog.port, "group=resume&from=earliest").await;
    let mut second = Vec::new();
    let mut seen: HashSet<(i32, i64)> = first.acked.clone();
    while seen.len() < RESUME_EVENTS {
        let next = tokio::time::timeout(Duration::from_secs(60), socket.next()).await;
        match next.expect("the rest arrives within 60 s") {
            Some(Ok(Message::Text(text))) => {
                let received = parse(&text);
                seen.insert(received.position);
                second.push(received);
            }
            other => panic!("unexpected: {other:?}"),
        }
    }
    let last = second.last().expect("the rest came").seq;
    socket.send(ack(last)).await.unwrap();
    socket.close(None).await.unwrap();
    read_to_close(&mut socket).await;
    SecondConnection {
        second,
        _socket: socket,
    }
}

/// Together the two connections got every event, none invented; the second
/// got its partitions in order, none of what was acknowledged, and each of
/// the rest once. Returns how many acknowledged events came again (0).
fn the_group_resumed_after_what_was_acknowledged(
    backlog: &Backlog,
    first: &FirstConnection,
    second: &SecondConnection,
) -> usize {
    let (acked, second) = (&first.acked, &second.second);
    let second_set: HashSet<(i32, i64)> = second.iter().map(|r| r.position).collect();
    let union: HashSet<(i32, i64)> = acked.union(&second_set).copied().collect();
    assert_eq!(union, backlog.all, "none missing, none invented");
    assert_in_partition_order(second);
    let again = second_set.intersection(acked).count();
    assert_eq!(again, 0, "the group resumed after what was acknowledged");
    assert_eq!(
        second.len(),
        RESUME_EVENTS - RESUME_ACKED,
        "each of the rest came once"
    );
    again
}

/// The resume test's report line, beside the redeliveries metric.
async fn report_the_resume(
    backlog: &Backlog,
    first: &FirstConnection,
    second: &SecondConnection,
    committed_after_first: i64,
    committed: i64,
    again: usize,
) {
    let redeliveries = scrape(
        &backlog.metrics,
        "docstream_stream_redeliveries_total{stream=\"export\"}",
    )
    .await;
    eprintln!(
        "export resume test: events={RESUME_EVENTS} acked_first={RESUME_ACKED} unacked_first={} committed_after_first={committed_after_first} \
         received_second={} acked_again_in_second={again} missing=0 committed_final={committed} redeliveries_metric={redeliveries}",
        first.unacknowledged.len(),
        second.second.len(),
    );
}

/// ack=auto: a client that never acknowledges reads every event (each
/// within 60 s), then leaves. Returns what it got and its closed socket.
async fn an_auto_ack_client_reads_every_event(backlog: &Backlog) -> (HashSet<(i32, i64)>, Socket) {
    let query = "group=auto&ack=auto&from=earliest";
    let mut socket = connect(&backlog.env, backlog.port, query).await;
    let mut auto = HashSet::new();
    while auto.len() < RESUME_EVENTS {
        let next = tokio::time::timeout(Duration::from_secs(60), socket.next()).await;
        match next.expect("every event arrives within 60 s") {
            Some(Ok(Message::Text(text))) => auto.insert(parse(&text).position),
            other => panic!("unexpected: {other:?}"),
        };
    }
    socket.close(None).await.unwrap();
    read_to_close(&mut socket).await;
    (auto, socket)
}

/// The auto client got every event, and its group still moved on: it
/// commits them all, once the socket took each event.
async fn it_got_every_event_and_its_group_commits_them(
    backlog: &Backlog,
    auto: &HashSet<(i32, i64)>,
) {
    assert_eq!(auto, &backlog.all);
    wait_committed(&backlog.env, "auto", RESUME_EVENTS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnecting_group_resumes_after_what_its_client_acknowledged() {
    let mut backlog = a_server_over_a_backlog_of_1000_events().await;
    let first = a_first_connection_acknowledges_500_and_leaves(&backlog).await;
    let after_first = no_more_than_the_acknowledged_is_committed(&backlog, &first).await;
    let second = a_second_connection_of_the_group_receives_the_rest(&backlog, &first).await;
    let again = the_group_resumed_after_what_was_acknowledged(&backlog, &first, &second);
    let committed = wait_committed(&backlog.env, "resume", RESUME_EVENTS).await;
    report_the_resume(&backlog, &first, &second, after_first, committed, again).await;

    // ack=auto: a client that never acknowledges still moves its group on,
    // once the socket took each event.
    let (auto, _auto_socket) = an_auto_ack_client_reads_every_event(&backlog).await;
    it_got_every_event_and_its_group_commits_them(&backlog, &auto).await;
    stop([&mut backlog.serve]).await;
}

/// A client that acknowledges each event `delay` after receiving it, until it
/// has `until` events; counts what it received and acknowledged.
fn slow_client(
    mut socket: Socket,
    delay: Duration,
    until: usize,
    acked: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<Vec<Received>> {
    tokio::spawn(async move {
        let mut received = Vec::new();
        while received.len() < until {
            match tokio::time::timeout(Duration::from_secs(60), socket.next()).await {
                Ok(Some(Ok(Message::Text(text)))) => {
                    let event = parse(&text);
                    tokio::time::sleep(delay).await;
                    socket.send(ack(event.seq)).await.unwrap();
                    acked.store(event.seq, Ordering::SeqCst);
                    received.push(event);
                }
                Ok(Some(Ok(_))) => {}
                // The test stops the client once the server is idle.
                Ok(None) | Ok(Some(Err(_))) | Err(_) => break,
            }
        }
        let _ = socket.close(None).await;
        while let Some(Ok(_)) = socket.next().await {}
        received
    })
}

/// The backlog the slow-client test reads, and its export queue and window.
const SLOW_EVENTS: usize = 2_000;
const SLOW_QUEUE: usize = 16;

/// A `serve` with a 16-event export queue and window, over a backlog.
struct SlowScenario {
    env: TestEnv,
    port: u16,
    /// Its /metrics, on the internal listener.
    metrics: String,
    serve: Child,
}

/// What a slow client on `drop_new` cost.
struct DropNewRun {
    sent: f64,
    dropped: f64,
    deepest: f64,
    peak_kib: u64,
}

/// What a slow client on `block` received, and the commit sampled meanwhile.
struct BlockRun {
    received: Vec<Received>,
    samples: i32,
    highest: i64,
}

/// What the checks of the `block` run counted.
struct BlockCounts {
    distinct: usize,
    dropped: f64,
    committed: i64,
}

/// Starts `serve` on `addr` with `settings` besides its HTTP address, logging
/// to `log`, and returns once it answers its health check.
async fn a_healthy_serve(
    env: &TestEnv,
    addr: &str,
    settings: &[(&str, String)],
    log: &str,
) -> Child {
    let mut serve_env = vec![("DOCSTREAM_HTTP_ADDR", addr.to_owned())];
    serve_env.extend_from_slice(settings);
    let serve = env.spawn("serve", &serve_env, log);
    wait_healthy(&format!("http://{addr}")).await;
    serve
}

/// A series of `serve`'s metrics: `docstream_{name}{{labels}}`.
fn series(name: &str, labels: &str) -> String {
    format!("docstream_{name}{{{labels}}}")
}

/// 2,000 events on the topic, then a `serve` with a 16-event export queue
/// and window.
async fn a_server_with_a_small_queue_over_a_backlog() -> SlowScenario {
    let env = TestEnv::new("export_slow").await;
    produce_events(&env, SLOW_EVENTS).await;
    let port = free_port();
    let http = format!("127.0.0.1:{port}");
    // Its /metrics, on the internal listener.
    let metrics = format!("127.0.0.1:{}", free_port());
    let settings = [
        ("DOCSTREAM_METRICS_ADDR", metrics.clone()),
        ("DOCSTREAM_EXPORT_MAX_QUEUE_SIZE", SLOW_QUEUE.to_string()),
        ("DOCSTREAM_EXPORT_MAX_UNACKED", SLOW_QUEUE.to_string()),
    ];
    let serve = a_healthy_serve(&env, &http, &settings, "export-slow-serve").await;
    SlowScenario {
        env,
        port,
        metrics,
        serve,
    }
}

/// drop_new: the consumer keeps reading; what finds the queue full is dropped
/// and counted. A client acknowledging 2 ms after each event reads until
/// every event was sent or dropped and it has every sent one; then it stops,
/// and serve's peak memory is read.
async fn a_slow_client_reads_the_backlog_with_drop_new(scenario: &SlowScenario) -> DropNewRun {
    let acked = Arc::new(AtomicU64::new(0));
    let socket = connect(
        &scenario.env,
        scenario.port,
        "group=slow-drop&strategy=drop_new&from=earliest",
    )
    .await;
    let client = slow_client(socket, Duration::from_millis(2), SLOW_EVENTS, acked.clone());
    let (sent, dropped, deepest) = every_event_sent_or_dropped(&scenario.metrics).await;
    // Every sent event reaches the client, which then stops.
    wait_for(
        "the client to receive every sent event",
        Duration::from_secs(60),
        || {
            let seen = acked.load(Ordering::SeqCst) as f64;
            async move {
                (seen >= sent)
                    .then_some(())
                    .ok_or(format!("acked up to {seen}"))
            }
        },
    )
    .await;
    client.abort();
    let peak_kib = peak_rss_kib(scenario.serve.id().unwrap()).unwrap();
    DropNewRun {
        sent,
        dropped,
        deepest,
        peak_kib,
    }
}

/// Scrapes `metrics` every 50 ms (for at most 120 s) until the export
/// stream's sent and dropped frames add up to every event: (sent, dropped,
/// the deepest queue seen on the way).
async fn every_event_sent_or_dropped(metrics: &str) -> (f64, f64, f64) {
    let sent_series = series("stream_frames_total", "outcome=\"sent\",stream=\"export\"");
    let depth_series = series("stream_queue_depth", "stream=\"export\"");
    let dropped_series = series(
        "stream_dropped_total",
        "strategy=\"drop_new\",stream=\"export\"",
    );
    let mut deepest = 0.0_f64;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let (sent, dropped) = loop {
        deepest = deepest.max(scrape(metrics, &depth_series).await);
        let sent = scrape(metrics, &sent_series).await;
        let dropped = scrape(metrics, &dropped_series).await;
        if sent + dropped >= SLOW_EVENTS as f64 {
            break (sent, dropped);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out: sent {sent} dropped {dropped} of {SLOW_EVENTS}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    (sent, dropped, deepest)
}

/// The slow client caused drops, every event was sent or counted as dropped,
/// and the queue and serve's memory stayed bounded; then the group commits
/// every event. Returns that commit.
async fn drops_were_counted_and_the_queue_and_memory_stayed_bounded(
    scenario: &SlowScenario,
    run: &DropNewRun,
) -> i64 {
    let DropNewRun {
        sent,
        dropped,
        deepest,
        peak_kib,
    } = *run;
    assert!(
        dropped > 0.0,
        "a slow client behind a 16-event queue causes drops"
    );
    assert_eq!(
        sent + dropped,
        SLOW_EVENTS as f64,
        "every event was sent or counted as dropped"
    );
    assert!(
        deepest <= SLOW_QUEUE as f64,
        "queue depth {deepest} exceeded {SLOW_QUEUE}"
    );
    assert!(peak_kib < 150 * 1024, "serve peak RSS {peak_kib} KiB");
    wait_committed(&scenario.env, "slow-drop", SLOW_EVENTS).await
}

/// block: a client acknowledging 2 ms after each event works through the
/// backlog, while every 100 ms the committed offset is sampled and found
/// not past what the client acknowledged.
async fn a_slow_client_reads_the_backlog_with_block(scenario: &SlowScenario) -> BlockRun {
    let acked = Arc::new(AtomicU64::new(0));
    let query = "group=slow-block&strategy=block&from=earliest";
    let socket = connect(&scenario.env, scenario.port, query).await;
    let client = slow_client(socket, Duration::from_millis(2), SLOW_EVENTS, acked.clone());
    let mut samples = 0;
    let mut highest = 0;
    while !client.is_finished() {
        // Committed first, acknowledged second: an ack after the read only raises the bound.
        let committed = committed_sum(&scenario.env, "slow-block");
        let acknowledged = acked.load(Ordering::SeqCst) as i64;
        assert!(
            committed <= acknowledged,
            "block committed {committed} records with only {acknowledged} acknowledged"
        );
        highest = highest.max(committed);
        samples += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let received = client.await.unwrap();
    BlockRun {
        received,
        samples,
        highest,
    }
}

/// block delivered every event, in partition order, and dropped none, and
/// the commit was sampled while the client worked; then the group commits
/// every event.
async fn block_delivered_every_event_and_dropped_none(
    scenario: &SlowScenario,
    run: &BlockRun,
) -> BlockCounts {
    assert_in_partition_order(&run.received);
    let distinct: HashSet<(i32, i64)> = run.received.iter().map(|r| r.position).collect();
    assert_eq!(distinct.len(), SLOW_EVENTS, "block delivers every event");
    let block_dropped = scrape(
        &scenario.metrics,
        &series(
            "stream_dropped_total",
            "strategy=\"block\",stream=\"export\"",
        ),
    )
    .await;
    assert_eq!(block_dropped, 0.0);
    let samples = run.samples;
    assert!(
        samples >= 5,
        "the commit was sampled while the client worked ({samples})"
    );
    let committed_block = wait_committed(&scenario.env, "slow-block", SLOW_EVENTS).await;
    BlockCounts {
        distinct: distinct.len(),
        dropped: block_dropped,
        committed: committed_block,
    }
}

/// The slow-client test's report line.
fn report_slow_clients(
    drop_new: &DropNewRun,
    committed_drop: i64,
    block: &BlockRun,
    counts: &BlockCounts,
) {
    let DropNewRun {
        sent,
        dropped,
        deepest,
        peak_kib,
    } = *drop_new;
    let (samples, highest) = (block.samples, block.highest);
    let (block_dropped, committed_block) = (counts.dropped, counts.committed);
    eprintln!(
        "export slow-client test: events={SLOW_EVENTS} queue={SLOW_QUEUE} drop_new: sent={sent} dropped={dropped} deepest_queue={deepest} \
         serve_peak_rss_kib={peak_kib} committed={committed_drop}; block: received={} dropped={block_dropped} \
         commit_samples={samples} (committed <= acknowledged in each; highest mid-run {highest}) committed={committed_block}",
        counts.distinct
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_costs_drops_with_drop_new_and_holds_the_commit_with_block() {
    let mut scenario = a_server_with_a_small_queue_over_a_backlog().await;
    let drop_new = a_slow_client_reads_the_backlog_with_drop_new(&scenario).await;
    let committed_drop =
        drops_were_counted_and_the_queue_and_memory_stayed_bounded(&scenario, &drop_new).await;
    let block = a_slow_client_reads_the_backlog_with_block(&scenario).await;
    let counts = block_delivered_every_event_and_dropped_none(&scenario, &block).await;
    report_slow_clients(&drop_new, committed_drop, &block, &counts);
    stop([&mut scenario.serve]).await;
}

/// Submissions the shutdown test's import client sends at most: more than
/// the import can answer before the SIGTERM, so the shutdown comes
/// mid-stream whatever the machine's pace. The import answers at most 64
/// submissions per 100 ms (its in-flight bound, and the test's submit
/// delay), 38,400 in the 60 s the test waits at most for the export to be
/// busy. With 300, a loaded machine's export took longer than the import's
/// half second, and every submission was answered before the shutdown.
const SHUTDOWN_SUBMISSIONS: usize = 100_000;

/// An import-stream message as its answers arrive.
type WsResult = Result<Message, tokio_tungstenite::tungstenite::Error>;

/// What the export client acknowledged before the server closed, and the
/// server's close frame.
type Exported = (Vec<Received>, Option<CloseFrame>);

/// A `serve` whose submits take 100 ms between INSERT and publish (so the
/// import is busy), with a worker and a bbox worker behind it.
struct Pipeline {
    env: TestEnv,
    port: u16,
    addr: String,
    serve: Child,
    workers: [Child; 2],
}

/// An import stream and an export stream, both busy on the server.
struct BusyStreams<A, S> {
    /// The idempotency keys' prefix of this test's submissions.
    prefix: String,
    sending: tokio::task::JoinHandle<S>,
    answers: A,
    answered: Vec<serde_json::Value>,
    exporting: tokio::task::JoinHandle<Exported>,
}

/// How the server's shutdown ended both streams, and what they had done.
struct Shutdown<A, S> {
    status: std::process::ExitStatus,
    import_close: Option<CloseFrame>,
    export_close: Option<CloseFrame>,
    prefix: String,
    answered: Vec<serde_json::Value>,
    /// The ids of the answered submissions.
    accepted: HashSet<Uuid>,
    /// The positions the export client acknowledged before the shutdown.
    first: HashSet<(i32, i64)>,
    // Both halves of the import socket stay open until the test ends.
    _answers: A,
    _sender: S,
}

/// What a new server's connection of the group received.
struct Resumed {
    received: usize,
    acked_twice: usize,
    /// The connection, closed, kept until the test ends.
    _socket: Socket,
}

/// The pipeline, with submits slowed by 100 ms in `serve`.
async fn a_pipeline_whose_submits_take_100_ms() -> Pipeline {
    let env = TestEnv::new("streams_shutdown").await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    // Submits take 100 ms between INSERT and publish, so the import is busy.
    let serve_env = [
        ("DOCSTREAM_HTTP_ADDR", addr.clone()),
        (
            "DOCSTREAM_FAILPOINTS",
            "submit.after_insert=sleep(100)".to_owned(),
        ),
    ];
    let serve = env.spawn("serve", &serve_env, "streams-shutdown-serve");
    let workers = [
        env.spawn("worker", &[], "streams-shutdown-worker"),
        env.spawn("bbox-worker", &[], "streams-shutdown-bbox-worker"),
    ];
    wait_healthy(&format!("http://{addr}")).await;
    Pipeline {
        env,
        port,
        addr,
        serve,
        workers,
    }
}

/// The export client acknowledges every event 1 ms after it arrives, until
/// the server closes; it reports what it acknowledged and the close frame.
fn export_client_acking_after_1_ms(
    mut socket: Socket,
    exported: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<Exported> {
    tokio::spawn(async move {
        let mut acked = Vec::new();
        loop {
            match socket.next().await {
                Some(Ok(Message::Text(text))) => {
                    let event = parse(&text);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    // After the server's close the ack cannot go out; the
                    // event then counts as unacknowledged.
                    if socket.send(ack(event.seq)).await.is_ok() {
                        acked.push(event);
                        exported.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    while let Some(Ok(_)) = socket.next().await {}
                    return (acked, frame);
                }
                Some(Ok(_)) => {}
                other => panic!("the export stream broke instead of closing: {other:?}"),
            }
        }
    })
}

/// An export stream from the earliest and an import stream that keeps
/// submitting, until 20 submissions were answered and 20 events acknowledged.
async fn two_busy_streams(
    pipeline: &Pipeline,
) -> BusyStreams<impl futures::Stream<Item = WsResult> + Unpin, impl Sized> {
    let env = &pipeline.env;
    let export = connect(env, pipeline.port, "group=dashboard&from=earliest").await;
    let exported = Arc::new(AtomicU64::new(0));
    let exporting = export_client_acking_after_1_ms(export, exported.clone());

    let prefix = format!("both-{}", Uuid::new_v4().simple());
    let (sending, mut answers) =
        busy_import(&pipeline.addr, &env.api_key, &prefix, SHUTDOWN_SUBMISSIONS).await;
    let answered = first_answers(&mut answers, 20).await;
    wait_for(
        "the export stream to be busy",
        Duration::from_secs(60),
        || {
            let n = exported.load(Ordering::SeqCst);
            async move { (n >= 20).then_some(()).ok_or(format!("{n} exported")) }
        },
    )
    .await;
    BusyStreams {
        prefix,
        sending,
        answers,
        answered,
        exporting,
    }
}

/// SIGTERMs `serve` and follows both streams to their close, and `serve` to
/// its exit.
async fn shut_the_server_down<A, S>(
    pipeline: &mut Pipeline,
    streams: BusyStreams<A, S>,
) -> Shutdown<A, S>
where
    A: futures::Stream<Item = WsResult> + Unpin,
{
    let BusyStreams {
        prefix,
        sending,
        mut answers,
        mut answered,
        exporting,
    } = streams;
    signal(&pipeline.serve, "TERM").await;
    let import_close = answers_until_close(&mut answers, &mut answered).await;
    let sender = sending.await.unwrap();
    let (acked_first, export_close) = exporting.await.unwrap();
    let status = pipeline.serve.wait().await.unwrap();
    let accepted: HashSet<Uuid> = answered
        .iter()
        .filter_map(|a| a["id"].as_str().map(|id| id.parse().unwrap()))
        .collect();
    let first: HashSet<(i32, i64)> = acked_first.iter().map(|r| r.position).collect();
    Shutdown {
        status,
        import_close,
        export_close,
        prefix,
        answered,
        accepted,
        first,
        _answers: answers,
        _sender: sender,
    }
}

/// `serve` exited 0, and both streams got a normal close frame.
fn both_closed_normally<A, S>(shutdown: &Shutdown<A, S>) {
    assert!(
        shutdown.status.success(),
        "serve exits 0 after a graceful drain"
    );
    assert_eq!(
        shutdown
            .import_close
            .as_ref()
            .expect("import close frame")
            .code,
        CloseCode::Normal
    );
    assert_eq!(
        shutdown
            .export_close
            .as_ref()
            .expect("export close frame")
            .code,
        CloseCode::Normal
    );
}

/// Import: every answered submission, and nothing else, was written (the
/// shutdown came mid-stream). Returns how many rows there are.
async fn the_rows_are_exactly_the_answered_submissions<A, S>(
    pipeline: &Pipeline,
    shutdown: &Shutdown<A, S>,
) -> usize {
    let (answered, accepted) = (&shutdown.answered, &shutdown.accepted);
    assert!(
        answered.iter().all(|a| a["error"].is_null()),
        "{answered:?}"
    );
    assert!(
        accepted.len() < SHUTDOWN_SUBMISSIONS,
        "the shutdown came mid-stream"
    );
    let rows: HashSet<Uuid> = sqlx::query_scalar(
        "SELECT id FROM extraction_requests WHERE idempotency_key LIKE $1 || '%'",
    )
    .bind(&shutdown.prefix)
    .fetch_all(&pipeline.env.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(
        &rows, accepted,
        "the rows are exactly the answered submissions"
    );
    rows.len()
}

/// Export: the graceful drain committed exactly what was acknowledged.
/// Returns that commit.
fn the_drain_committed_exactly_what_was_acknowledged<A, S>(
    pipeline: &Pipeline,
    shutdown: &Shutdown<A, S>,
) -> i64 {
    let committed_at_close = committed_sum(&pipeline.env, "dashboard");
    assert_eq!(
        committed_at_close,
        shutdown.first.len() as i64,
        "the drain commits every acknowledged event and nothing more"
    );
    committed_at_close
}

/// Waits for every answered submission to reach bbox succeeded and for an
/// event per transition on the topic; returns every position on it.
async fn every_event_once_the_pipeline_is_done(
    pipeline: &Pipeline,
    accepted: usize,
) -> HashSet<(i32, i64)> {
    let env = &pipeline.env;
    wait_count(
        &env.pool,
        "every answered submission to reach bbox succeeded",
        ALL_BBOX_SUCCEEDED,
        accepted as i64,
        Duration::from_secs(120),
    )
    .await;
    let transitions: i64 = sqlx::query_scalar("SELECT count(*) FROM extraction_transitions")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    let events_topic = env.topic("extraction.events");
    let brokers = env.settings.kafka_brokers.clone();
    wait_for("an event per transition", Duration::from_secs(60), || {
        let size = common::topic_size(&brokers, &events_topic);
        async move {
            (size >= transitions)
                .then_some(())
                .ok_or(format!("{size} of {transitions}"))
        }
    })
    .await;
    event_positions(env)
}

/// A new `serve` on the same address.
async fn a_new_server(pipeline: &Pipeline) -> Child {
    a_healthy_serve(
        &pipeline.env,
        &pipeline.addr,
        &[],
        "streams-shutdown-serve-again",
    )
    .await
}

/// A connection of the group to the new server resumes it: with what was
/// acknowledged before the shutdown, it sees every event on the topic, and
/// none of those acknowledged again.
async fn the_group_resumes_and_nothing_was_lost<A, S>(
    pipeline: &Pipeline,
    shutdown: &Shutdown<A, S>,
    all: &HashSet<(i32, i64)>,
) -> Resumed {
    let first = &shutdown.first;
    let mut socket = connect(
        &pipeline.env,
        pipeline.port,
        "group=dashboard&from=earliest",
    )
    .await;
    let mut seen = first.clone();
    let mut second: HashMap<(i32, i64), u64> = HashMap::new();
    while !all.is_subset(&seen) {
        let next = tokio::time::timeout(Duration::from_secs(60), socket.next()).await;
        match next.expect("the rest arrives within 60 s") {
            Some(Ok(Message::Text(text))) => {
                let received = parse(&text);
                seen.insert(received.position);
                second.insert(received.position, received.seq);
            }
            other => panic!("unexpected: {other:?}"),
        }
    }
    socket.close(None).await.unwrap();
    read_to_close(&mut socket).await;
    let again = second.keys().filter(|p| first.contains(p)).count();
    assert_eq!(
        again, 0,
        "nothing acknowledged before the shutdown came again"
    );
    assert_eq!(&seen, all, "none missing");
    Resumed {
        received: second.len(),
        acked_twice: again,
        _socket: socket,
    }
}

/// The shutdown test's report line.
fn report_the_shutdown<A, S>(
    shutdown: &Shutdown<A, S>,
    rows: usize,
    committed_at_close: i64,
    all: &HashSet<(i32, i64)>,
    resumed: &Resumed,
) {
    let again = resumed.acked_twice;
    eprintln!(
        "streams shutdown test: import sent_up_to={SHUTDOWN_SUBMISSIONS} answered={} rows={} close=Normal; \
         export acked_before_shutdown={} committed_at_close={committed_at_close} close=Normal; \
         events_on_topic={} received_after_restart={} acked_twice={again} missing=0",
        shutdown.accepted.len(),
        rows,
        shutdown.first.len(),
        all.len(),
        resumed.received,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_shutdown_with_both_streams_busy_closes_both_normally_and_loses_nothing() {
    let mut pipeline = a_pipeline_whose_submits_take_100_ms().await;
    let streams = two_busy_streams(&pipeline).await;
    let shutdown = shut_the_server_down(&mut pipeline, streams).await;
    both_closed_normally(&shutdown);
    let rows = the_rows_are_exactly_the_answered_submissions(&pipeline, &shutdown).await;
    let committed_at_close =
        the_drain_committed_exactly_what_was_acknowledged(&pipeline, &shutdown);

    // Once the pipeline is done, a new server resumes the group: together the
    // two connections saw every event on the topic.
    let all = every_event_once_the_pipeline_is_done(&pipeline, shutdown.accepted.len()).await;
    let mut serve = a_new_server(&pipeline).await;
    let resumed = the_group_resumes_and_nothing_was_lost(&pipeline, &shutdown, &all).await;
    report_the_shutdown(&shutdown, rows, committed_at_close, &all, &resumed);
    stop(pipeline.workers.iter_mut().chain([&mut serve])).await;
}

/// A client that acknowledges every event `delay` after it arrives and
/// records its position, until `done`; then closes.
fn acking_client(
    mut socket: Socket,
    delay: Duration,
    seen: Arc<std::sync::Mutex<HashSet<(i32, i64)>>>,
    done: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                _ = done.cancelled() => break,
                next = socket.next() => next,
            };
            match next {
                Some(Ok(Message::Text(text))) => {
                    let event = parse(&text);
                    tokio::time::sleep(delay).await;
                    socket.send(ack(event.seq)).await.unwrap();
                    seen.lock().unwrap().insert(event.position);
                }
                Some(Ok(_)) => {}
                other => panic!("the stream broke: {other:?}"),
            }
        }
        let _ = socket.close(None).await;
        while let Some(Ok(_)) = socket.next().await {}
    })
}

/// The backlog the shared-group test reads.
const SHARED_EVENTS: usize = 2_000;

/// A `serve` with a small export queue and window, over a backlog.
struct SharedGroup {
    serve: Child,
    port: u16,
    /// Every position on the topic.
    all: HashSet<(i32, i64)>,
    /// Held to the end: dropping it cleans up the test's database and topics.
    env: TestEnv,
}

/// A connection of a group acknowledging in the background ([`acking_client`]).
struct AckingMember {
    /// The positions it has acknowledged.
    seen: Arc<std::sync::Mutex<HashSet<(i32, i64)>>>,
    /// Tells it to close.
    done: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// 2,000 events on the topic, then a `serve` with a 16-event export queue
/// and window.
async fn a_server_with_a_small_queue_and_window_over_2000_events() -> SharedGroup {
    let env = TestEnv::new("export_shared").await;
    produce_events(&env, SHARED_EVENTS).await;
    let all: HashSet<(i32, i64)> = event_positions(&env);
    let port = free_port();
    // A small queue and window, so records wait for their turn and for room
    // when the partitions move.
    let settings = [
        ("DOCSTREAM_EXPORT_MAX_QUEUE_SIZE", "16".to_owned()),
        ("DOCSTREAM_EXPORT_MAX_UNACKED", "16".to_owned()),
    ];
    let addr = format!("127.0.0.1:{port}");
    let serve = a_healthy_serve(&env, &addr, &settings, "export-shared-serve").await;
    SharedGroup {
        serve,
        port,
        all,
        env,
    }
}

/// A first connection of the group acknowledges each event 5 ms after it
/// arrives; returns once it has seen 200.
async fn a_first_connection_is_busy_acknowledging_every_5_ms(group: &SharedGroup) -> AckingMember {
    let first_seen = Arc::new(std::sync::Mutex::new(HashSet::new()));
    let first_done = tokio_util::sync::CancellationToken::new();
    let socket = connect(&group.env, group.port, "group=shared&from=earliest").await;
    // About 200 events/s: the first connection still has most of the backlog
    // ahead of it when the group rebalances (a join takes seconds).
    let delay = Duration::from_millis(5);
    let first = acking_client(socket, delay, first_seen.clone(), first_done.clone());
    wait_for(
        "the first connection to be busy",
        Duration::from_secs(60),
        || {
            let n = first_seen.lock().unwrap().len();
            async move { (n >= 200).then_some(()).ok_or(format!("{n} seen")) }
        },
    )
    .await;
    AckingMember {
        seen: first_seen,
        done: first_done,
        task: first,
    }
}

/// A second connection of the group takes some partitions, acknowledges
/// 100 events, and leaves: its partitions go back to the first. Returns the
/// positions it received.
async fn a_second_connection_takes_partitions_for_100_events_and_leaves(
    group: &SharedGroup,
) -> HashSet<(i32, i64)> {
    let acked = Arc::new(AtomicU64::new(0));
    let socket = connect(&group.env, group.port, "group=shared&from=earliest").await;
    let second = slow_client(socket, Duration::from_millis(1), 100, acked)
        .await
        .unwrap();
    second.iter().map(|r| r.position).collect()
}

/// Waits (up to 120 s) until the two connections saw every event between
/// them; returns how many the first saw.
async fn the_two_connections_see_every_event(
    group: &SharedGroup,
    first: &AckingMember,
    second: &HashSet<(i32, i64)>,
) -> usize {
    wait_for(
        "the two connections to see every event",
        Duration::from_secs(120),
        || {
            let first: HashSet<(i32, i64)> = first.seen.lock().unwrap().clone();
            let missing = group
                .all
                .iter()
                .filter(|p| !first.contains(p) && !second.contains(p))
                .count();
            async move {
                (missing == 0)
                    .then_some(first.len())
                    .ok_or(format!("{missing} missing"))
            }
        },
    )
    .await
}

/// Tells the first connection to close and waits for it; returns what it
/// acknowledged.
async fn the_first_connection_leaves(
    first: AckingMember,
) -> Arc<std::sync::Mutex<HashSet<(i32, i64)>>> {
    first.done.cancel();
    first.task.await.unwrap();
    first.seen
}

/// The partitions moved, and back: the second connection was given some,
/// and on every one of them the first received events past the last the
/// second saw. Returns how many, by partition.
fn each_partition_of_the_second_came_back_to_the_first(
    second: &HashSet<(i32, i64)>,
    first_seen: &std::sync::Mutex<HashSet<(i32, i64)>>,
) -> Vec<(i32, usize)> {
    // The partitions moved: the second connection was given some, and
    // received events on them (100, unless the backlog ran out first).
    assert!(
        !second.is_empty(),
        "the second connection was given no partitions"
    );
    // And back: on every partition the second held, the first connection
    // received events past the last one the second saw.
    let first_seen = first_seen.lock().unwrap().clone();
    let mut moved_back = Vec::new();
    for partition in second.iter().map(|(p, _)| *p).collect::<HashSet<i32>>() {
        let last_of_second = second
            .iter()
            .filter(|(p, _)| *p == partition)
            .map(|(_, o)| *o)
            .max();
        let first_after = first_seen
            .iter()
            .filter(|(p, o)| *p == partition && Some(*o) > last_of_second)
            .count();
        assert!(
            first_after > 0,
            "partition {partition} never came back to the first connection"
        );
        moved_back.push((partition, first_after));
    }
    moved_back
}

/// Every event was committed once; the shared-group test's report line.
fn every_event_was_committed_once(
    committed: i64,
    seen: usize,
    second: &HashSet<(i32, i64)>,
    moved_back: &[(i32, usize)],
) {
    assert_eq!(
        committed, SHARED_EVENTS as i64,
        "every event committed once"
    );
    eprintln!(
        "export shared-group test: events={SHARED_EVENTS} first_connection={seen} second_connection={} missing=0 committed={committed}; events the first received on the second's partitions after it left: {moved_back:?}",
        second.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_that_move_between_connections_of_a_group_and_back_keep_flowing() {
    let mut group = a_server_with_a_small_queue_and_window_over_2000_events().await;
    let first = a_first_connection_is_busy_acknowledging_every_5_ms(&group).await;
    let second = a_second_connection_takes_partitions_for_100_events_and_leaves(&group).await;
    let seen = the_two_connections_see_every_event(&group, &first, &second).await;
    let first_seen = the_first_connection_leaves(first).await;
    let committed = wait_committed(&group.env, "shared", SHARED_EVENTS).await;
    let moved_back = each_partition_of_the_second_came_back_to_the_first(&second, &first_seen);
    every_event_was_committed_once(committed, seen, &second, &moved_back);
    stop([&mut group.serve]).await;
}

/// The events of `positions`, by partition, in offset order.
fn by_partition(positions: &HashSet<(i32, i64)>) -> HashMap<i32, Vec<i64>> {
    let mut partitions: HashMap<i32, Vec<i64>> = HashMap::new();
    for (partition, offset) in positions {
        partitions.entry(*partition).or_default().push(*offset);
    }
    for offsets in partitions.values_mut() {
        offsets.sort_unstable();
    }
    partitions
}

/// A stream whose group committed under its old name (the tenant and the
/// name joined with `-`) resumes where that group was, on its first open
/// under the new name: the old group committed half of each partition's 40
/// events; the stream, from the latest (which alone would carry none of
/// them), carries exactly the other half, and then commits under its new
/// group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_committed_under_its_old_name_resumes_where_it_was() {
    let env = TestEnv::new("export_legacy_group").await;
    produce_events(&env, 40).await;
    let topic = env.topic("extraction.events");
    let mut commits = rdkafka::TopicPartitionList::new();
    let mut undelivered = HashSet::new();
    for (partition, offsets) in by_partition(&event_positions(&env)) {
        let middle = offsets[offsets.len() / 2];
        let offset = rdkafka::Offset::Offset(middle);
        commits
            .add_partition_offset(&topic, partition, offset)
            .unwrap();
        undelivered.extend(
            offsets
                .into_iter()
                .filter(|o| *o >= middle)
                .map(|o| (partition, o)),
        );
    }
    let old: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.settings.kafka_brokers)
        .set(
            "group.id",
            env.settings.group("docstream-export-default-legacy"),
        )
        .create()
        .unwrap();
    rdkafka::consumer::Consumer::commit(&old, &commits, rdkafka::consumer::CommitMode::Sync)
        .unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut serve = a_healthy_serve(&env, &addr, &[], "export-legacy-serve").await;
    let mut stream = connect(&env, port, "group=legacy&ack=auto").await;
    let got = receive_until(&mut stream, Duration::from_secs(5), |seen| {
        undelivered.is_subset(seen)
    })
    .await;
    assert_eq!(
        got, undelivered,
        "the stream resumed where the old group was"
    );
    let committed = wait_committed(&env, "legacy", 40).await;
    eprintln!(
        "export legacy group: the old group had delivered {} of 40; the stream under the new \
         name carried the other {} and its group committed {committed}",
        40 - undelivered.len(),
        got.len()
    );
    let _ = stream.close(None).await;
    stop([&mut serve]).await;
}
