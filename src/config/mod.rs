//! Typed settings. Sources, later ones winning: built-in defaults, an optional TOML
//! file (`--config` or `DOCSTREAM_CONFIG`), then environment variables. Every
//! setting has one environment variable (`DOCSTREAM_…`, or `DATABASE_URL`), and
//! every default carries the reason it was chosen. [`Settings::validate`] refuses
//! combinations that cannot work before anything starts.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::{RequestLimits, ResultLimits, Stage};

pub mod check;
mod extractors;
mod kafka;
mod rules;
mod types;

use rules::{
    at_least, at_most, empty_or_at_least_16_bytes, http_url_or_empty, positive,
    revocations_in_time, within, zero_or_more,
};
pub use types::{
    canonical, AllowList, Backpressure, ConfigError, Described, GroupProtocol, Seconds,
};

pub use kafka::{redact as redact_kafka, KafkaClient, KafkaProperties};

pub use extractors::{
    env_of as extractors_env, env_var as extractor_env_var, ExtractorSettings, RULES,
};

/// The deployment-wide webhook secret of the releases before tenants: refused
/// when set, so an upgrade never signs with a secret nobody expects.
const RETIRED_WEBHOOK_SECRET: &str = "DOCSTREAM_WEBHOOK_SECRET";

/// The rule extractor's timeout of the releases before the CPU pool, whose
/// jobs were retried past it: refused when set, since its meaning changed.
const RETIRED_ASYNC_TIMEOUT: &str = "DOCSTREAM_ASYNC_TIMEOUT_S";

/// The longest a process may trust a key lookup: revocations take effect
/// within it.
pub const MAX_API_KEY_CACHE_S: f64 = 5.0;

/// The most pages `DOCSTREAM_MAX_PAGES` may allow: the API describes a page
/// number as at most this.
pub const MAX_PAGES: usize = 65_535;

/// The settings that hold secrets. Each may instead be read from a file
/// named by the same variable with `_FILE` added (`DATABASE_URL_FILE`), as
/// container platforms mount secrets; a final newline is dropped.
pub const SECRET_SETTINGS: &[&str] = &[
    "DATABASE_URL",
    "DOCSTREAM_KAFKA_SASL_PASSWORD",
    "DOCSTREAM_KAFKA_OAUTH_CLIENT_SECRET",
    "DOCSTREAM_FILES_S3_SECRET_ACCESS_KEY",
    "DOCSTREAM_CALLBACK_SECRET",
];

/// The secret settings given as files: each variable with its file's content.
fn secret_files(
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<std::collections::HashMap<&'static str, String>, ConfigError> {
    let mut found = std::collections::HashMap::new();
    for var in SECRET_SETTINGS {
        let file_var = format!("{var}_FILE");
        let Some(path) = lookup(&file_var) else {
            continue;
        };
        let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::File {
            path: path.clone(),
            reason: format!("{file_var}: {e}"),
        })?;
        let value = text.strip_suffix('\n').unwrap_or(&text);
        let value = value.strip_suffix('\r').unwrap_or(value);
        // A child started with its parent's settings has both, alike.
        if lookup(var).is_some_and(|given| given != value) {
            return Err(ConfigError::Invalid(format!(
                "{var} and {file_var} are both set, differently: keep one"
            )));
        }
        found.insert(*var, value.to_owned());
    }
    Ok(found)
}

/// Declares the settings once: field, type, default, variable, and the
/// rules of the one setting (see [`rules`]); `#[section = "…"]` starts a
/// heading of the manual's tables. It generates the struct, its defaults,
/// reading the environment, writing it back ([`Settings::to_env`]), checking
/// each setting's rules, and the description the manual's tables are made of
/// ([`Settings::described`]).
macro_rules! settings {
    ($( $(#[section = $section:literal])? $(#[doc = $doc:literal])* $field:ident : $ty:ty = $default:expr, env $var:literal $(, $rule:expr)* ; )*) => {
        /// Every setting of a docstream process.
        #[derive(Clone, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct Settings {
            $( $(#[doc = $doc])* pub $field: $ty, )*
            /// External extractors by name (`[extractors.NAME]`, or
            /// `DOCSTREAM_EXTRACTORS` and `DOCSTREAM_EXTRACTOR_<NAME>_…`).
            /// None by default: the built-in `rules` extractor needs no setting.
            pub extractors: std::collections::BTreeMap<String, ExtractorSettings>,
            /// The Kafka clients' properties, read from
            /// `DOCSTREAM_KAFKA_PROPERTIES_FILE` and the secret settings when
            /// the settings are loaded ([`Settings::load_kafka_properties`]).
            #[serde(skip)]
            pub kafka_properties: KafkaProperties,
        }

        /// Every setting, the secrets ([`SECRET_SETTINGS`]) as `***`.
        impl std::fmt::Debug for Settings {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let mut out = f.debug_struct("Settings");
                $(
                    match SECRET_SETTINGS.contains(&$var) {
                        true => out.field(stringify!($field), &"***"),
                        false => out.field(stringify!($field), &self.$field),
                    };
                )*
                out.field("extractors", &self.extractors)
                    .field("kafka_properties", &self.kafka_properties)
                    .finish()
            }
        }

        impl Default for Settings {
            fn default() -> Self {
                Self {
                    $( $field: $default.into(), )*
                    extractors: Default::default(),
                    kafka_properties: KafkaProperties::default(),
                }
            }
        }

        impl Settings {
            /// Overrides each setting whose variable `lookup` knows.
            fn apply_env(&mut self, lookup: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
                $(
                    if let Some(value) = lookup($var) {
                        self.$field = value.parse::<$ty>().map_err(|e| ConfigError::Env {
                            var: $var.to_owned(),
                            value: value.clone(),
                            reason: e.to_string(),
                        })?;
                    }
                )*
                extractors::apply_env(&mut self.extractors, lookup)
            }

            /// Every setting as the environment variables that set it, the
            /// external extractors' included: a child process started with
            /// them runs with exactly these settings.
            pub fn to_env(&self) -> Vec<(String, String)> {
                let mut env = vec![$( ($var.to_owned(), self.$field.to_string()), )*];
                env.extend(extractors::env_of(&self.extractors));
                env
            }

            /// Each setting's variable, its default and what it is for, under
            /// the heading of the manual's table it belongs to.
            pub fn described() -> Vec<(&'static str, Described)> {
                let defaults = Self::default();
                let mut section: &'static str;
                let mut described = Vec::new();
                $(
                    $( section = $section; )?
                    described.push((
                        section,
                        Described::new($var.to_owned(), defaults.$field.to_string(), &[$($doc),*]),
                    ));
                )*
                described
            }

            /// Checks each setting against its own rules.
            fn check_each(&self) -> Result<(), ConfigError> {
                $( $(
                    ($rule)(&self.$field)
                        .map_err(|why| ConfigError::Invalid(format!("{} {why}", $var)))?;
                )* )*
                Ok(())
            }
        }
    };
}

/// A loopback listen address: exposing a port is a decision, not a default.
fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

settings! {
    #[section = "Services, topics and groups"]
    /// Postgres connection string. Default: the cluster `scripts/services.sh` starts.
    database_url: String = "postgres://docstream:docstream@127.0.0.1:55432/docstream", env "DATABASE_URL";
    /// Kafka bootstrap servers. Default: the broker `scripts/services.sh` starts.
    kafka_brokers: String = "127.0.0.1:59092", env "DOCSTREAM_KAFKA_BROKERS";
    /// A file of librdkafka properties (`key=value` lines, as Kafka's tools
    /// read) given to every Kafka client: `security.protocol`, `sasl.*`,
    /// `ssl.*`. Those docstream's guarantees rest on (offset storing and
    /// commits, `acks`, idempotence, the group's protocol and timing) are
    /// refused. Default: none, a plaintext connection.
    kafka_properties_file: String = "", env "DOCSTREAM_KAFKA_PROPERTIES_FILE";
    /// `sasl.password`, when not in the properties file (a secret: or
    /// `DOCSTREAM_KAFKA_SASL_PASSWORD_FILE`).
    kafka_sasl_password: String = "", env "DOCSTREAM_KAFKA_SASL_PASSWORD";
    /// `sasl.oauthbearer.client.secret` (OAUTHBEARER over OIDC), when not in the
    /// properties file (a secret: or `DOCSTREAM_KAFKA_OAUTH_CLIENT_SECRET_FILE`).
    kafka_oauth_client_secret: String = "", env "DOCSTREAM_KAFKA_OAUTH_CLIENT_SECRET";
    /// Prepended to every topic and consumer-group name, so several deployments (or
    /// test runs) share one cluster without seeing each other. Default: none.
    topic_prefix: String = "", env "DOCSTREAM_TOPIC_PREFIX";
    /// Jobs produced straight to Kafka.
    topic_requests: String = "extraction.requests", env "DOCSTREAM_TOPIC_REQUESTS";
    /// Queued jobs waiting for a worker.
    topic_submitted: String = "extraction.submitted", env "DOCSTREAM_TOPIC_SUBMITTED";
    /// Bbox refinements waiting for a bbox worker.
    topic_post_processing: String = "extraction.post_processing.requested", env "DOCSTREAM_TOPIC_POST_PROCESSING";
    /// One event per state change.
    topic_events: String = "extraction.events", env "DOCSTREAM_TOPIC_EVENTS";
    /// Records that could not be processed.
    topic_dlq: String = "extraction.dlq", env "DOCSTREAM_TOPIC_DLQ";
    /// Partitions of the two job topics: the most worker replicas that can share
    /// the work. 6 lets 1, 2, 3 or 6 replicas split it evenly.
    job_topic_partitions: i32 = 6, env "DOCSTREAM_JOB_TOPIC_PARTITIONS", at_least(1);
    /// Partitions of extraction.events and extraction.requests; 6 for the same reason.
    stream_topic_partitions: i32 = 6, env "DOCSTREAM_STREAM_TOPIC_PARTITIONS", at_least(1);
    /// Most bytes of a poison record's value its dead letter keeps (with
    /// the value's size and SHA-256). 16 KiB shows what a record was; with
    /// the letter's other parts bounded too, a letter stays far below the
    /// producer's 1 MB maximum, so it can always be produced. At most 256 KiB.
    dlq_excerpt_bytes: usize = 16_usize * 1024, env "DOCSTREAM_DLQ_EXCERPT_BYTES", at_most(256 * 1024);
    /// Partitions of the DLQ: 1, since it is rare and read by humans in order.
    dlq_topic_partitions: i32 = 1, env "DOCSTREAM_DLQ_TOPIC_PARTITIONS", at_least(1);
    /// Replication factor of created topics; 0: from the cluster, 3 when it
    /// has three brokers or more (one on a single node). `docstream topics`
    /// refuses a factor the cluster cannot hold.
    topic_replication_factor: i32 = 0, env "DOCSTREAM_TOPIC_REPLICATION_FACTOR", at_least(0);
    /// `min.insync.replicas` of created topics: copies a write needs before
    /// it is acknowledged; 0: a majority of the replicas (2 of 3; 1 for one
    /// or two replicas). Must not exceed the factor.
    topic_min_insync_replicas: i32 = 0, env "DOCSTREAM_TOPIC_MIN_INSYNC_REPLICAS", at_least(0);
    /// Consumer group of `worker`.
    worker_group: String = "docstream-worker", env "DOCSTREAM_WORKER_GROUP";
    /// Consumer group of `bbox-worker`.
    bbox_worker_group: String = "docstream-bbox-worker", env "DOCSTREAM_BBOX_WORKER_GROUP";
    /// Consumer group of the intake (on `extraction.requests`).
    intake_group: String = "docstream-intake", env "DOCSTREAM_INTAKE_GROUP";
    /// Listen address of `serve` (and of `all`). Loopback by default: exposing it is
    /// a decision, not an accident.
    http_addr: SocketAddr = loopback(8080), env "DOCSTREAM_HTTP_ADDR";
    /// Listen address of `/metrics`, `/healthz` and `/readyz` in every process,
    /// `serve` included: it belongs on an internal network, apart from the API.
    /// Port 0 picks a free one, which is what tests running several processes want.
    metrics_addr: SocketAddr = loopback(9464), env "DOCSTREAM_METRICS_ADDR";
    #[section = "Tenants and keys"]
    /// How long a process trusts what it looked up about an API key. A revoked
    /// key, or one whose tenant was deleted, is refused by every process within
    /// this time; 2 s keeps a busy client to one lookup per key every 2 s, and
    /// stays well inside the 5 s a revocation may take. At most 5.
    api_key_cache_s: Seconds = Seconds::new(2), env "DOCSTREAM_API_KEY_CACHE_S", revocations_in_time;
    /// Submits one tenant may make per second through one `serve` process
    /// (HTTP and the import stream), unless the tenant has its own
    /// (`tenants set-quota`); beyond it, 429 with `Retry-After`. 100/s per
    /// process lets one tenant use a good share of a process but not all of
    /// it. 0: no limit.
    tenant_submit_rate_per_s: f64 = 100.0, env "DOCSTREAM_TENANT_SUBMIT_RATE_PER_S", zero_or_more;
    /// Submits a tenant may make at once before its rate applies: the token
    /// bucket's size. 200 absorbs a client's start-up burst.
    tenant_submit_burst: u32 = 200_u32, env "DOCSTREAM_TENANT_SUBMIT_BURST", at_least(1);
    /// Jobs one tenant may have queued or running at once, unless it has its
    /// own cap; a submit past it gets 429 (the Kafka intake waits instead).
    /// 10,000 is minutes of work for one deployment: enough for any burst,
    /// small enough that a flood cannot bury everyone else's jobs behind it.
    /// 0: no cap.
    tenant_max_open_jobs: u32 = 10_000_u32, env "DOCSTREAM_TENANT_MAX_OPEN_JOBS";
    #[section = "Limits"]
    /// Requests per second one peer address may make that present a well-formed
    /// API key that is not valid, each a lookup in Postgres (ten seconds' worth
    /// at once); past it, a key the process does not know gets 429 without
    /// being looked up. Keys it knows pass, so behind a proxy, where every
    /// client shares the proxy's address, only their new keys wait.
    auth_failures_per_peer_per_s: u32 = 10_u32, env "DOCSTREAM_AUTH_FAILURES_PER_PEER_PER_S", at_least(1);
    /// Corrections one field of one job may have; one more gets 409. A
    /// field is corrected once or twice in a real review.
    max_corrections_per_field: usize = 20_usize, env "DOCSTREAM_MAX_CORRECTIONS_PER_FIELD", at_least(1);
    /// Corrections one job may have, all its fields together; one more gets
    /// 409. With the result's limit of bytes per field, what a job's
    /// corrections may weigh.
    max_corrections_per_job: usize = 200_usize, env "DOCSTREAM_MAX_CORRECTIONS_PER_JOB", at_least(1);
    /// Corrections one API key may make per minute on one `serve` process
    /// (a burst of a tenth of it at once); past it, 429 with `Retry-After`.
    corrections_per_key_per_min: u32 = 120_u32, env "DOCSTREAM_CORRECTIONS_PER_KEY_PER_MIN", at_least(1);
    /// Requests from the Kafka intake one tenant may have held while it is at
    /// its cap on open jobs (they become jobs as its jobs finish); a record
    /// past it is dead-lettered as `too_many_open_jobs`.
    max_held_requests_per_tenant: u32 = 100_000_u32, env "DOCSTREAM_MAX_HELD_REQUESTS_PER_TENANT", at_least(1);
    /// Largest accepted request body. 4 MiB fits a multi-page OCR document with
    /// word geometry; larger bodies get 413. It is also the largest import
    /// frame (one past it closes the socket with 1009) and the largest
    /// `request_json` of an intake record.
    http_body_limit_bytes: usize = 4_usize * 1024 * 1024, env "DOCSTREAM_HTTP_BODY_LIMIT_BYTES", at_least(1);
    /// Largest file, in bytes, that `POST /v1/files`, a multipart submit or a
    /// `document.url` fetch takes: their own body limit; a larger one gets 413.
    file_max_bytes: usize = 32_usize * 1024 * 1024, env "DOCSTREAM_FILE_MAX_BYTES", at_least(1);
    /// Most bytes a PDF's compressed streams may inflate to, all together
    /// (and what its pages draw, with repeats); more is refused as a
    /// decompression bomb (422). A PDF's pages are held to `max_pages`.
    file_max_inflated_bytes: usize = 128_usize * 1024 * 1024, env "DOCSTREAM_FILE_MAX_INFLATED_BYTES", at_least(1);
    /// Most objects (operators and operands) a PDF page's content, or a form
    /// it draws, may decode into: the parser holds them all, tens of bytes
    /// each, so content within the inflate cap can still take gigabytes
    /// (`0 ` repeated). More is refused (422). A dense page of text is tens
    /// of thousands.
    file_max_content_objects: usize = 1_000_000_usize, env "DOCSTREAM_FILE_MAX_CONTENT_OBJECTS", at_least(1);
    /// The program a worker reads a PDF's words with, in a process of its
    /// own that is killed at the extraction deadline (so a parse that runs
    /// long gives its CPU slot back): it is run as `<program> read-pdf`.
    /// Empty: this docstream binary. It runs with an empty environment (a
    /// wrapper, such as a sandbox around docstream, gets only `PATH`), in a
    /// temporary folder of its own, its memory capped by
    /// `DOCSTREAM_PDF_READER_MAX_MEMORY_BYTES`.
    pdf_reader: String = "", env "DOCSTREAM_PDF_READER";
    /// Most bytes of address space the PDF reader's process may use; past
    /// it the reader fails, and the file is refused (422 at the job).
    pdf_reader_max_memory_bytes: usize = 2_usize << 30, env "DOCSTREAM_PDF_READER_MAX_MEMORY_BYTES", at_least(64 << 20);
    /// The Tesseract 5 program that reads pages without text (an image
    /// upload, a PDF page made of an image): run as a child process per
    /// page. Empty: no OCR, and such pages fail naming the fix.
    ocr_tesseract: String = "tesseract", env "DOCSTREAM_OCR_TESSERACT";
    /// Poppler's `pdftoppm`, which renders a PDF page without text for OCR.
    ocr_pdftoppm: String = "pdftoppm", env "DOCSTREAM_OCR_PDFTOPPM";
    /// ImageMagick's `convert`, which prepares a page for OCR: grey,
    /// despeckled, turned upright when skewed. Empty: pages go to the
    /// engine as they are (a skewed or noisy scan then reads worse).
    ocr_convert: String = "convert", env "DOCSTREAM_OCR_CONVERT";
    /// Tesseract's languages, `+`-separated (`eng+deu`); each needs its
    /// traineddata installed (`tesseract-ocr-deu`).
    ocr_languages: String = "eng", env "DOCSTREAM_OCR_LANGUAGES";
    /// Resolution a PDF page without text is rendered at for OCR (lower for
    /// a page that would pass `DOCSTREAM_OCR_MAX_PIXELS`).
    ocr_dpi: u32 = 300_u32, env "DOCSTREAM_OCR_DPI", at_least(72);
    /// Most pixels on one page of an image (a decompression bomb declares
    /// billions in a few bytes): more is refused at the submit (422), from
    /// the image's headers. 50 million is an A3 page at 600 dpi.
    ocr_max_pixels: usize = 50_000_000_usize, env "DOCSTREAM_OCR_MAX_PIXELS", at_least(1);
    /// Most pixels across or down one page of an image: ImageMagick's own
    /// default policy (`width` and `height` of 16KP in its `policy.xml`),
    /// which refuses a wider image however few pixels it has. More is
    /// refused at the submit (422), from the image's headers; a PDF page
    /// is rendered small enough. Raise it with ImageMagick's policy.
    ocr_max_side_pixels: usize = 16_000_usize, env "DOCSTREAM_OCR_MAX_SIDE_PIXELS", at_least(1);
    /// Longest OCR may take on one page (a multi-page TIFF: this times its
    /// pages); past it the job fails for good, naming the limit.
    ocr_page_timeout_s: Seconds = Seconds::new(60), env "DOCSTREAM_OCR_PAGE_TIMEOUT_S", positive;
    /// Longest OCR may take on all the pages of one job together (their
    /// reading, not their wait for a slot); past it the job fails for
    /// good, naming the limit: a file of many slow pages cannot hold the
    /// deployment's OCR slots for its pages times their limit.
    ocr_job_timeout_s: Seconds = Seconds::new(300), env "DOCSTREAM_OCR_JOB_TIMEOUT_S", positive;
    /// Most bytes of address space the OCR engine (and ImageMagick and
    /// poppler beside it) may use on a page; past it the program fails, and
    /// the job with it, for good: the same page would need as much again.
    ocr_max_memory_bytes: usize = 1_usize << 30, env "DOCSTREAM_OCR_MAX_MEMORY_BYTES", at_least(64 << 20);
    /// PDF pages one `serve` process may draw at once for people
    /// (`GET /v1/extractions/{id}/pages/{page}`, the console), each in a
    /// process of its own under OCR's memory cap; one more gets 503 with
    /// `Retry-After`. A page is drawn within OCR's pixel cap.
    render_slots: usize = 2_usize, env "DOCSTREAM_RENDER_SLOTS", at_least(1);
    /// Bytes of drawn pages one `serve` process keeps, by file and page, so
    /// a page asked for again is not drawn again. 0: none are kept.
    render_cache_bytes: usize = 32_usize << 20, env "DOCSTREAM_RENDER_CACHE_BYTES";
    /// Pages read by OCR at once across the whole deployment (slots leased
    /// in Postgres, as an external extractor's), besides the CPU pool each
    /// holds: OCR cannot take every worker's CPU from the claim, heartbeat
    /// and commit paths.
    ocr_max_concurrency: usize = 2_usize, env "DOCSTREAM_OCR_MAX_CONCURRENCY", at_least(1);
    /// How long fetching a `document.url` may take, all of it (the SSRF
    /// guard judges the URL; `DOCSTREAM_FILE_FETCH_ALLOW` admits more);
    /// past it the submit gets 422.
    file_fetch_timeout_s: Seconds = Seconds::new(30), env "DOCSTREAM_FILE_FETCH_TIMEOUT_S", positive;
    /// Addresses a `document.url` may be fetched from although the SSRF
    /// guard refuses them: comma-separated IPs or CIDR blocks, as
    /// `DOCSTREAM_WEBHOOK_ALLOW`. Its own list, since what is fetched comes
    /// back in the job's results: a host webhooks may post to is not one
    /// submitters may read. Empty, the default: only public addresses.
    file_fetch_allow: AllowList = AllowList::default(), env "DOCSTREAM_FILE_FETCH_ALLOW";
    /// How long an upload's body (`POST /v1/files`, a multipart submit) may
    /// take to arrive, all of it, from when its reading begins; past it the
    /// request is answered 408 and its connection closed. 120 s takes a
    /// file at the default 32 MiB limit at 2.3 Mbit/s; a client that
    /// trickles its bytes holds its upload slot no longer.
    http_body_timeout_s: Seconds = Seconds::new(120), env "DOCSTREAM_HTTP_BODY_TIMEOUT_S", positive;
    /// Uploads one tenant may have in progress on one `serve` process
    /// (`POST /v1/files`, multipart submits, `document.url` fetches); one
    /// more gets 429 with `Retry-After`. Uploads take as long as their
    /// bytes do, so no tenant may keep the process's time for itself.
    tenant_max_uploads: usize = 8_usize, env "DOCSTREAM_TENANT_MAX_UPLOADS", at_least(1);
    /// How long the URL an extractor of protocol version 2 gets for a job's
    /// file stays valid (signed by `serve` for the folder store, presigned
    /// by the bucket for S3).
    file_url_ttl_s: Seconds = Seconds::new(900), env "DOCSTREAM_FILE_URL_TTL_S", positive;
    /// How long a file no job names is kept after its last use (its upload,
    /// or the last job that named it being made): then the retention pass
    /// deletes it. A job's file is kept while the job is (its retention).
    file_grace_s: Seconds = Seconds::new(86_400), env "DOCSTREAM_FILE_GRACE_S", positive;
    /// Bytes of files one tenant may keep; an upload past it gets 429 until
    /// files are deleted. 0: no quota.
    tenant_max_file_bytes: u64 = 10_u64 * 1024 * 1024 * 1024, env "DOCSTREAM_TENANT_MAX_FILE_BYTES";
    /// The folder uploaded files are kept in (made at the first upload),
    /// unless `files_s3_bucket` names a bucket.
    files_dir: String = "data/files", env "DOCSTREAM_FILES_DIR";
    /// A bucket of an S3-compatible service to keep uploaded files in,
    /// instead of the folder; its region and (unless set below) credentials
    /// come from the standard `AWS_REGION`, `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`.
    files_s3_bucket: String = "", env "DOCSTREAM_FILES_S3_BUCKET";
    /// The S3-compatible service's address, for one that is not AWS
    /// (`http://127.0.0.1:9000`); empty: AWS's own.
    files_s3_endpoint: String = "", env "DOCSTREAM_FILES_S3_ENDPOINT";
    /// The S3 access key id, when not `AWS_ACCESS_KEY_ID`'s.
    files_s3_access_key_id: String = "", env "DOCSTREAM_FILES_S3_ACCESS_KEY_ID";
    /// Its secret, when not `AWS_SECRET_ACCESS_KEY`'s.
    files_s3_secret_access_key: String = "", env "DOCSTREAM_FILES_S3_SECRET_ACCESS_KEY";
    /// Most field specs one request may carry. 100 covers the widest form
    /// we have seen (invoices list a few dozen) and bounds the work of a job.
    max_fields: usize = RequestLimits::DEFAULT.fields, env "DOCSTREAM_MAX_FIELDS", at_least(1);
    /// Longest field name, in bytes: it is a key of the result.
    max_field_name_bytes: usize = RequestLimits::DEFAULT.field_name_bytes, env "DOCSTREAM_MAX_FIELD_NAME_BYTES", at_least(1);
    /// Longest pattern, in bytes. 512 fits any pattern a person writes; the
    /// compiled program is size-limited too (`max_pattern_program_bytes`).
    max_pattern_bytes: usize = RequestLimits::DEFAULT.pattern_bytes, env "DOCSTREAM_MAX_PATTERN_BYTES", at_least(1);
    /// Largest compiled pattern, in bytes (the regex size limit; the lazy DFA
    /// gets the same cache). 1 MiB compiles `\d{1,100}` on Unicode text and
    /// refuses `\w{1000}`, blown up to tens of MiB, at submit. Compiling one
    /// near the limit takes about 5 ms, so patterns the process has not met
    /// compile on blocking threads of their own (one per CPU at once), never on
    /// the threads that answer requests or the extraction pool; compiled
    /// patterns and refusals are kept (1,024 to 2,048 per process, in two
    /// generations), so a template's patterns compile once. Eight clients
    /// sending 100 new patterns each held `/healthz` for 1.9 s when they
    /// compiled on the runtime; off it, `/healthz` answered within 10 ms.
    max_pattern_program_bytes: usize = RequestLimits::DEFAULT.pattern_program_bytes, env "DOCSTREAM_MAX_PATTERN_PROGRAM_BYTES", at_least(1);
    /// Longest anchor, in bytes: a label such as "Invoice number".
    max_anchor_bytes: usize = RequestLimits::DEFAULT.anchor_bytes, env "DOCSTREAM_MAX_ANCHOR_BYTES", at_least(1);
    /// Most pages of one document. 1,000 pages of OCR words do not fit the
    /// body limit anyway; the cap keeps an empty-page flood out.
    max_pages: usize = RequestLimits::DEFAULT.pages, env "DOCSTREAM_MAX_PAGES", within(1, MAX_PAGES);
    /// Most words on one page. A dense A4 page has about 1,000; 10,000 is ten
    /// times that.
    max_words_per_page: usize = RequestLimits::DEFAULT.words_per_page, env "DOCSTREAM_MAX_WORDS_PER_PAGE", at_least(1);
    /// Most words in a text document. Each stage splits the text into its
    /// words, some 40 bytes each: within the body limit, `"a a a …"` made
    /// 2 million of them, 80 MB for one job in each stage. 200,000 is twenty
    /// dense pages; a longer document can come as pages.
    max_text_words: usize = RequestLimits::DEFAULT.text_words, env "DOCSTREAM_MAX_TEXT_WORDS", at_least(1);
    /// Largest `metadata`, as compact JSON. It is echoed in every answer and
    /// event, so 16 KiB: enough for client ids and tags, not for a document.
    max_metadata_bytes: usize = RequestLimits::DEFAULT.metadata_bytes, env "DOCSTREAM_MAX_METADATA_BYTES", at_least(1);
    /// Deepest nesting of `metadata` (arrays and objects). 32 holds any
    /// record a client keeps; deeper JSON only serves to hurt parsers.
    max_json_depth: usize = RequestLimits::DEFAULT.json_depth, env "DOCSTREAM_MAX_JSON_DEPTH", at_least(1);
    /// Longest `webhook_url`, in bytes. 8 KiB is what common HTTP servers
    /// accept in a request line.
    max_url_bytes: usize = RequestLimits::DEFAULT.url_bytes, env "DOCSTREAM_MAX_URL_BYTES", at_least(1);
    /// Largest extracted value of one field, as JSON, from any extractor. 64
    /// KiB holds any value a form has; a pattern like `(.+)` over a whole
    /// document does not fit, and fails the job at once with `result_too_large`
    /// (not retried).
    max_result_field_bytes: usize = ResultLimits::DEFAULT.field_bytes, env "DOCSTREAM_MAX_RESULT_FIELD_BYTES", at_least(1);
    /// Largest result of one job, as JSON. A job whose result is larger fails
    /// at once (`result_too_large`) and is not retried. 1 MiB is 100 fields
    /// of 10 KiB, and keeps every row and event small.
    max_result_bytes: usize = ResultLimits::DEFAULT.total_bytes, env "DOCSTREAM_MAX_RESULT_BYTES", at_least(1);
    /// Threads that run the rules extractor and bbox grounding, off the async
    /// runtime, so heartbeats and the API never wait behind a slow pattern.
    /// Jobs beyond it wait for a thread. 0: one per CPU.
    extraction_threads: usize = 0_usize, env "DOCSTREAM_EXTRACTION_THREADS";
    /// Longest the rules extractor or bbox grounding may run on one job; past
    /// it the job fails (`deadline_exceeded`) and is not retried, since the
    /// same input would take as long again. 10 s is a hundred times what a
    /// dense document takes. It holds within one search too: over a long text a
    /// search checks it at least every 64 KiB and every few milliseconds of
    /// work (a worst-case pattern over 4 MiB of accented words ran 33 s in one
    /// `regex` search before). It replaces `DOCSTREAM_ASYNC_TIMEOUT_S`, which
    /// is refused at start-up.
    extraction_deadline_s: Seconds = Seconds::new(10), env "DOCSTREAM_EXTRACTION_DEADLINE_S", positive;
    /// WebSocket connections (import and export streams) one `serve` process
    /// holds at once; one more is refused with 503. Each stream costs a task
    /// and buffers; an export stream also a Kafka consumer.
    max_sockets: usize = 1_024_usize, env "DOCSTREAM_MAX_SOCKETS", at_least(1);
    /// WebSocket connections one tenant may hold on one `serve` process; one
    /// more gets 429. 64 leaves room for many clients, not for all sockets.
    max_sockets_per_tenant: usize = 64_usize, env "DOCSTREAM_MAX_SOCKETS_PER_TENANT", at_least(1);
    /// Text of the import frames one socket has in flight, in bytes; the
    /// next frame is read when there is room. 16 MiB is four frames of the
    /// body limit, so a socket streaming the largest documents still
    /// overlaps their submits, and its memory stays a small multiple of it.
    import_max_in_flight_bytes: usize = 16_usize << 20, env "DOCSTREAM_IMPORT_MAX_IN_FLIGHT_BYTES", at_least(1);
    /// Export streams one `serve` process runs at once; one more gets 503.
    /// Each is a librdkafka consumer with its own threads and prefetch, so
    /// 64, far fewer than sockets.
    max_export_streams: usize = 64_usize, env "DOCSTREAM_MAX_EXPORT_STREAMS", at_least(1);
    /// Export streams one tenant may run on one `serve` process; one more
    /// gets 429. A quarter of `max_export_streams`, so that no tenant can
    /// hold them all (its socket cap alone allowed every one).
    max_export_streams_per_tenant: usize = 16_usize, env "DOCSTREAM_MAX_EXPORT_STREAMS_PER_TENANT", at_least(1);
    /// Bulk actions (`POST /v1/extractions/actions`) one tenant may have
    /// running at once, across the deployment; one more gets 429 with
    /// `Retry-After`. Each walks every job it names and writes an outcome
    /// per job, so 4 lets a tenant overlap a few while hundreds at once
    /// cannot hold the database.
    bulk_max_running_per_tenant: usize = 4_usize, env "DOCSTREAM_BULK_MAX_RUNNING_PER_TENANT", at_least(1);
    /// TCP connections each HTTP listener (the API's, the internal one)
    /// holds at once; past it a new connection is answered 503 and closed.
    /// 4,096 is far above what one process serves well, and below its file
    /// descriptor limit.
    http_max_connections: usize = 4_096_usize, env "DOCSTREAM_HTTP_MAX_CONNECTIONS", at_least(1);
    /// The idle limit: a connection with no request in progress for this long
    /// is closed, whatever its protocol and whatever it sends meanwhile: a
    /// socket that never sends a byte, one stuck in the HTTP/2 preface, a
    /// kept-alive HTTP/1 connection, an HTTP/2 connection that answers pings
    /// but opens no stream (it gets a GOAWAY, and is dropped 1 s later if it
    /// does not go). HTTP/2 connections are pinged at this interval and closed
    /// when a ping goes unanswered as long. 10 s: a slowloris client holds a
    /// connection that long at most (bodies are bounded by
    /// `DOCSTREAM_HTTP_ANSWER_TIMEOUT_S`), and a client pausing between
    /// requests keeps its connection. With 5 s, 4,096 idle sockets (the default
    /// cap) were all closed 5.0-6.0 s after they opened, and a real client was
    /// served 4.5 s after they had filled the cap.
    http_header_read_timeout_s: Seconds = Seconds::new(10), env "DOCSTREAM_HTTP_HEADER_READ_TIMEOUT_S", positive;
    #[section = "Leases, reapers and retries"]
    /// How long a claim on an extraction lasts without a heartbeat. The holder
    /// renews it while it works, so a job may run far longer; only a dead or
    /// frozen holder loses it. 10 s bounds recovery after a crash to seconds
    /// while leaving room for five missed heartbeats.
    extraction_run_lease_s: Seconds = Seconds::new(10), env "DOCSTREAM_EXTRACTION_RUN_LEASE_S", positive;
    /// The same for a claim on a bbox refinement.
    bbox_refinement_lease_s: Seconds = Seconds::new(10), env "DOCSTREAM_BBOX_REFINEMENT_LEASE_S", positive;
    /// How long a worker's lease on one of an extractor's deployment-wide
    /// slots lasts without renewal (renewed every third of it during a
    /// call): a crashed worker's slots come back within it.
    extractor_slot_lease_s: Seconds = Seconds::new(10), env "DOCSTREAM_EXTRACTOR_SLOT_LEASE_S", positive;
    /// How often a holder renews its lease: at most half the shorter lease, so a
    /// single slow renewal never loses a live claim. 2 s is a fifth of 10 s.
    heartbeat_interval_s: Seconds = Seconds::new(2), env "DOCSTREAM_HEARTBEAT_INTERVAL_S", positive;
    /// Longest bbox grounding may run on one job, on the same pool as the
    /// rule extractor; past it the refinement fails.
    bbox_refine_timeout_s: Seconds = Seconds::new(60), env "DOCSTREAM_BBOX_REFINE_TIMEOUT_S", positive;
    /// How often each reaper looks for orphans (one replica at a time sweeps).
    /// Recovery after a crash takes at most lease + this interval.
    reaper_sweep_interval_s: Seconds = Seconds::new(2), env "DOCSTREAM_REAPER_SWEEP_INTERVAL_S", positive;
    /// A queued job this long past its submit (or its retry's due time), with
    /// no "published" stamp, has lost its event (orphan classes 1 and 3). Far
    /// above the publish-to-claim latency of a healthy pipeline; a job waiting
    /// in a backlog has its stamp (written half of this after the ack) and is
    /// left alone.
    queued_orphan_threshold_s: Seconds = Seconds::new(10), env "DOCSTREAM_QUEUED_ORPHAN_THRESHOLD_S", positive;
    /// A pending bbox refinement this long past its request (or the extraction's
    /// end) has lost its event (orphan class 4). Same reasoning as above.
    post_processing_pending_orphan_threshold_s: Seconds = Seconds::new(10), env "DOCSTREAM_POST_PROCESSING_PENDING_ORPHAN_THRESHOLD_S", positive;
    /// A queued job or pending bbox refinement whose event was acknowledged
    /// and that nobody claimed for this long is revived anyway (orphan
    /// classes 7 and 8): the last net should an offset ever be committed
    /// past a record not delivered. Well past any normal wait: a job in a
    /// backlog older than this gets a second record, which its claim makes
    /// harmless.
    unclaimed_orphan_threshold_s: Seconds = Seconds::new(1800), env "DOCSTREAM_UNCLAIMED_ORPHAN_THRESHOLD_S", positive;
    /// Most orphans one sweep republishes; the rest wait for the next sweep.
    reaper_batch_size: i64 = 500_i64, env "DOCSTREAM_REAPER_BATCH_SIZE", at_least(1);
    /// First retry delay; each further attempt doubles it, up to
    /// `DOCSTREAM_RETRY_MAX_DELAY_S`, and each delay is drawn from [d/2, d].
    retry_base_delay_s: Seconds = Seconds::new(1), env "DOCSTREAM_RETRY_BASE_DELAY_S", positive;
    /// Cap on the retry delay: a flaky dependency is retried at least this often.
    retry_max_delay_s: Seconds = Seconds::new(30), env "DOCSTREAM_RETRY_MAX_DELAY_S", positive;
    /// Attempts (claims) before a failing job is marked failed with its last error.
    max_attempts: i32 = 5, env "DOCSTREAM_MAX_ATTEMPTS", at_least(1);
    #[section = "Consumers and the publisher"]
    /// Kafka consumer session timeout: how soon the group notices a dead member
    /// and hands its partitions on. 10 s is librdkafka's order of magnitude and
    /// matches the lease, so a dead worker's partitions and claims free up together.
    kafka_session_timeout_ms: u32 = 10_000_u32, env "DOCSTREAM_KAFKA_SESSION_TIMEOUT_MS";
    /// Consumer group protocol: `classic` (cooperative-sticky assignment) or
    /// `consumer` (KIP-848, assignment by the broker). Classic works with every
    /// Kafka 2.4+ broker; `consumer` needs Kafka 4.0+ and sets the session
    /// timeout on the broker (`group.consumer.session.timeout.ms`).
    kafka_group_protocol: GroupProtocol = GroupProtocol::Classic, env "DOCSTREAM_KAFKA_GROUP_PROTOCOL";
    /// On a partition revoke, how long the consumer waits for that partition's
    /// in-flight records before it commits what was delivered and lets the
    /// rebalance go on. Must stay below the session timeout; 5 s is half of it.
    rebalance_drain_timeout_s: Seconds = Seconds::new(5), env "DOCSTREAM_REBALANCE_DRAIN_TIMEOUT_S", positive;
    /// librdkafka's prefetch buffer per consumer (`queued.max.messages.kbytes`).
    /// With pause at the in-flight bound, this is what bounds memory under any
    /// backlog; 8 MiB holds tens of thousands of our small events.
    consumer_prefetch_kbytes: u32 = 8_192_u32, env "DOCSTREAM_CONSUMER_PREFETCH_KBYTES", at_least(1);
    /// Records waiting in the publisher's queue before publishers wait (backpressure).
    publisher_queue_size: usize = 10_000_usize, env "DOCSTREAM_PUBLISHER_QUEUE_SIZE", at_least(1);
    /// How long the producer lets records gather into one request
    /// (`linger.ms`). Every hop of a job waits for one acknowledgement, so this
    /// is paid once per hop; under load, records gather anyway while earlier
    /// requests are in flight.
    publisher_linger_ms: f64 = 5.0, env "DOCSTREAM_PUBLISHER_LINGER_MS", within(0.0, 900_000.0);
    /// On shutdown, how long `serve` waits for accepted requests and the
    /// publisher's queue to drain before it flushes and closes the listener.
    publisher_drain_timeout_s: Seconds = Seconds::new(10), env "DOCSTREAM_PUBLISHER_DRAIN_TIMEOUT_S", positive;
    /// Records a consumer works on at once. Their statements are grouped
    /// (`DOCSTREAM_DB_BATCH_MAX`), so a few hundred in flight cost a few
    /// commits, not a few hundred connections: 384 ran as fast as 512 in the
    /// burn-down, with less memory. The records waiting in front of them are
    /// bounded by `DOCSTREAM_CONSUMER_READ_AHEAD`.
    consumer_max_in_flight: usize = 384_usize, env "DOCSTREAM_CONSUMER_MAX_IN_FLIGHT", at_least(1);
    /// Records of one partition a consumer receives ahead of its free slots
    /// before it pauses the partition (at least twice
    /// `DOCSTREAM_CONSUMER_MAX_IN_FLIGHT`; a job stage passes over a lane that
    /// fills half of it instead, and pauses at twice it). The worker chooses
    /// what to start among the records it received (priority, then tenants'
    /// shares), so this is how deep into a backlog that choice sees, and enough
    /// that a resumed partition's refetch leaves no worker idle. A waiting
    /// record costs its few hundred bytes, and holds its partition's commit
    /// point back.
    consumer_read_ahead: usize = 2_048_usize, env "DOCSTREAM_CONSUMER_READ_AHEAD", at_least(1);
    /// The longest a received record is passed over by more urgent ones:
    /// past it, it starts in the order it arrived, whatever its priority.
    worker_priority_max_wait_s: Seconds = Seconds::new(30), env "DOCSTREAM_WORKER_PRIORITY_MAX_WAIT_S", positive;
    /// How long a stopping consumer waits for in-flight records before it gives up
    /// on them (they are not committed and will be redelivered).
    subscriber_drain_timeout_s: Seconds = Seconds::new(10), env "DOCSTREAM_SUBSCRIBER_DRAIN_TIMEOUT_S", positive;
    /// Longest the producer keeps trying to deliver one record (message.timeout.ms).
    publish_timeout_s: Seconds = Seconds::new(30), env "DOCSTREAM_PUBLISH_TIMEOUT_S", positive;
    #[section = "Answers and admission"]
    /// The longest a REST request of the API waits on Postgres and Kafka
    /// before it is answered: a submit whose row is durable gets 202 (its
    /// event goes out when the broker is back), and anything still waiting on
    /// the database gets 503 with `Retry-After`. Two seconds keeps clients'
    /// own timeouts out of play during an outage.
    http_answer_timeout_s: Seconds = Seconds::new(2), env "DOCSTREAM_HTTP_ANSWER_TIMEOUT_S", positive;
    /// The latency a submit should be answered in when the database is
    /// fast: `serve` admits submits only while it answers them in about this
    /// (see `admission`), and refuses the rest at once with 503 `overloaded`.
    /// A slower database raises it, to at most three quarters of
    /// `http_answer_timeout_s`.
    /// 100 ms leaves a client far from its own timeouts under overload.
    submit_target_latency_ms: u64 = 100_u64, env "DOCSTREAM_SUBMIT_TARGET_LATENCY_MS", at_least(1);
    /// The fewest submits one `serve` admits at once, however slow it is:
    /// 64 keep 100 submits a second flowing even when each takes 0.6 s to
    /// become durable (a loaded machine, a slow network), and under overload
    /// of a fast one they queue for well under the target.
    submit_min_in_flight: usize = 64_usize, env "DOCSTREAM_SUBMIT_MIN_IN_FLIGHT", at_least(1);
    /// The most submits one `serve` admits at once, however fast it is.
    submit_max_in_flight: usize = 1_024_usize, env "DOCSTREAM_SUBMIT_MAX_IN_FLIGHT", at_least(1);
    #[section = "Postgres, probes, census and retention"]
    /// The longest a caller waits for a pooled Postgres connection before the
    /// call fails as passing (the pool keeps trying to reconnect).
    db_acquire_timeout_s: Seconds = Seconds::new(5), env "DOCSTREAM_DB_ACQUIRE_TIMEOUT_S", positive;
    /// How often each process probes Postgres (`SELECT 1`) and the broker
    /// (metadata) for `/readyz` and `docstream_dependency_up`; a probe may take
    /// up to `http_answer_timeout_s`.
    health_probe_interval_s: Seconds = Seconds::new(1), env "DOCSTREAM_HEALTH_PROBE_INTERVAL_S", positive;
    /// How often the queue census runs (jobs by status, the oldest open
    /// job's age, open orphans by class). One process per interval takes it,
    /// whichever comes first; the others skip. 15 s is a dashboard's scrape
    /// resolution, and the census is a handful of indexed counts.
    census_interval_s: Seconds = Seconds::new(15), env "DOCSTREAM_CENSUS_INTERVAL_S", positive;
    /// How long finished jobs are kept (days), unless their tenant has its
    /// own retention (`tenants set-retention`); then every row of theirs is
    /// purged, and their idempotency keys may name new jobs. 30 days covers
    /// a month's reconciliation; 0 keeps them for ever.
    retention_days: u32 = 30_u32, env "DOCSTREAM_RETENTION_DAYS";
    /// How often each process purges the finished jobs past their
    /// retention, in batches of 500 (each its own short transaction) until
    /// none is left; processes skip the rows another one is purging.
    retention_purge_interval_s: Seconds = Seconds::new(60), env "DOCSTREAM_RETENTION_PURGE_INTERVAL_S", positive;
    /// How often librdkafka reports its statistics (consumer lag, committed
    /// offsets, the producer's queue); 0 turns them off. 5 s is under a
    /// typical scrape interval; each report is a JSON document parsed off
    /// the async runtime, on librdkafka's thread.
    kafka_statistics_interval_s: Seconds = Seconds::new(5), env "DOCSTREAM_KAFKA_STATISTICS_INTERVAL_S", at_most(Seconds::new(86_400));
    /// Postgres connections per process. 20 covers the in-flight records of one
    /// worker and the API's concurrency on the default 300-connection server.
    db_max_connections: u32 = 20_u32, env "DOCSTREAM_DB_MAX_CONNECTIONS", at_least(1);
    /// Most requests of one kind (claims, completions, stamps) that one statement
    /// serves: concurrent callers share a statement and its commit.
    db_batch_max: usize = 256_usize, env "DOCSTREAM_DB_BATCH_MAX", at_least(1);
    /// Statements of one kind in flight at once; the requests arriving meanwhile
    /// form the next batch. One gives the largest batches, hence the fewest
    /// commits and the fastest burn-down.
    db_batch_concurrency: usize = 1_usize, env "DOCSTREAM_DB_BATCH_CONCURRENCY", at_least(1);
    #[section = "The export stream"]
    /// Consumer groups of export streams are this prefix, the tenant, `.` and
    /// the client's `group` name, so an export never joins a pipeline role's
    /// group, nor another tenant's.
    export_group_prefix: String = "docstream-export-", env "DOCSTREAM_EXPORT_GROUP_PREFIX";
    /// The backpressure strategy of an export stream whose client names none:
    /// `block` (never lose an event; a slow client slows its stream), `drop_oldest`
    /// or `drop_new` (keep up; count what was dropped). Block, because losing
    /// nothing is the promise a client gets unless it asks otherwise.
    export_backpressure_strategy: Backpressure = Backpressure::Block, env "DOCSTREAM_EXPORT_BACKPRESSURE_STRATEGY";
    /// Events of one export stream waiting for the socket. Beyond it `block`
    /// waits and the drop strategies drop; 256 events are about 64 KiB.
    export_max_queue_size: usize = 256_usize, env "DOCSTREAM_EXPORT_MAX_QUEUE_SIZE", at_least(1);
    /// Events of one export stream sent and not yet acknowledged by the client:
    /// the window a client may lag behind before sending stops. 1,024 keeps a
    /// client that acknowledges in batches busy.
    export_max_unacked: usize = 1024_usize, env "DOCSTREAM_EXPORT_MAX_UNACKED", at_least(1);
    /// On shutdown, how long an export stream waits for its client to
    /// acknowledge what was sent before it commits what was and closes anyway
    /// (a forced close).
    export_drain_timeout_s: Seconds = Seconds::new(10), env "DOCSTREAM_EXPORT_DRAIN_TIMEOUT_S", positive;
    /// The longest an export stream's client may hold an event without
    /// acknowledging it before the stream is closed by force: while it holds
    /// one, its partitions' commits wait, and no other member of the group can
    /// take them over. 30 s leaves room for a client that acknowledges in
    /// batches or pauses for a moment.
    export_ack_timeout_s: Seconds = Seconds::new(30), env "DOCSTREAM_EXPORT_ACK_TIMEOUT_S", positive;
    /// How often the import and export streams ping their client; a client that
    /// sends nothing (not even the pong) for two of these is gone, and its
    /// stream is closed. A half-open socket (the client's machine vanished)
    /// would otherwise hold its socket slot, and an export stream's group
    /// member, for as long as the server runs. Any WebSocket client that reads
    /// its socket answers pings by itself. At each ping the stream's key is
    /// checked again. With 1 s, a silent export and a silent import stream were
    /// closed 4.1 s after they opened, while a stream whose client read stayed
    /// open.
    ws_ping_interval_s: Seconds = Seconds::new(20), env "DOCSTREAM_WS_PING_INTERVAL_S", positive;
    /// Malformed client frames in a row after which an export stream is
    /// closed by force: such a client is broken, and holds a consumer-group
    /// member. (A send that fails or outlasts the drain timeout closes the
    /// stream at once.)
    export_max_consecutive_errors: u32 = 5_u32, env "DOCSTREAM_EXPORT_MAX_CONSECUTIVE_ERRORS", at_least(1);
    #[section = "Webhooks"]
    /// Whether jobs may name a `webhook_url`. Each tenant signs its webhooks
    /// with a secret of its own (`docstream tenants rotate-webhook-secret`).
    /// On by default: the SSRF guard keeps them to public addresses. Off, a
    /// request naming a `webhook_url` is refused, rather than accepted and
    /// never announced.
    webhooks_enabled: bool = true, env "DOCSTREAM_WEBHOOKS_ENABLED";
    /// Addresses webhooks may reach although the SSRF guard refuses them
    /// (loopback, private, link-local…): comma-separated IPs or CIDR blocks,
    /// e.g. `127.0.0.1/32,::1`. Empty, the default: only public addresses,
    /// since a job's submitter chooses the URL and the server makes the request.
    /// Webhooks only: a `document.url` has `DOCSTREAM_FILE_FETCH_ALLOW`.
    webhook_allow: AllowList = AllowList::default(), env "DOCSTREAM_WEBHOOK_ALLOW";
    /// Longest one webhook attempt may take, connect to last byte. Bounded, so
    /// a slow receiver costs an attempt, not a stuck dispatcher.
    webhook_timeout_s: Seconds = Seconds::new(10), env "DOCSTREAM_WEBHOOK_TIMEOUT_S", positive;
    /// Attempts before a delivery is given up as failed. With the delays
    /// below, 12 attempts span about 8 minutes.
    webhook_max_attempts: i32 = 12_i32, env "DOCSTREAM_WEBHOOK_MAX_ATTEMPTS", at_least(1);
    /// First delay between attempts; each further one doubles it, with jitter.
    webhook_retry_base_delay_s: Seconds = Seconds::new(1), env "DOCSTREAM_WEBHOOK_RETRY_BASE_DELAY_S", positive;
    /// Cap on the delay between attempts: a receiver that is back is found
    /// within this long.
    webhook_retry_max_delay_s: Seconds = Seconds::new(60), env "DOCSTREAM_WEBHOOK_RETRY_MAX_DELAY_S", positive;
    /// A pending delivery due this long ago that nobody holds is an orphan
    /// (class 6): its dispatcher died. Well above a wake-up's latency; an
    /// attempt in progress holds a lease (timeout + this) and is left alone.
    webhook_orphan_threshold_s: Seconds = Seconds::new(10), env "DOCSTREAM_WEBHOOK_ORPHAN_THRESHOLD_S", positive;
    /// Webhook attempts one process makes at once.
    webhook_concurrency: usize = 32_usize, env "DOCSTREAM_WEBHOOK_CONCURRENCY", at_least(1);
    /// Of those, the most one tenant's deliveries may hold: an attempt can
    /// hold its slot for the whole timeout, so a tenant whose endpoint never
    /// answers would otherwise hold them all. Its further deliveries wait
    /// their turn; other tenants' go on.
    webhook_concurrency_per_tenant: usize = 4_usize, env "DOCSTREAM_WEBHOOK_CONCURRENCY_PER_TENANT", at_least(1);
    #[section = "Deferred results and logs"]
    /// The API's base URL as extraction services reach it, e.g.
    /// `https://docstream.internal`. With `callback_secret`, it turns deferred
    /// results on: each call names where to post its result later. Empty, the
    /// default: every call must answer with its result.
    public_url: String = "", env "DOCSTREAM_PUBLIC_URL", http_url_or_empty;
    /// The key that signs the token of each deferred result; `serve` and the
    /// workers must share it. At least 16 bytes; empty turns deferred results off.
    callback_secret: String = "", env "DOCSTREAM_CALLBACK_SECRET", empty_or_at_least_16_bytes;
    /// Logs as JSON lines instead of text. `DOCSTREAM_LOG` sets the filter (for
    /// example `debug`, or `docstream=debug,rdkafka=info`).
    log_json: bool = false, env "DOCSTREAM_LOG_JSON";
}

/// A stage's settings, as its workers, its reaper and its orphan statements
/// use them (`Settings::stage`).
#[derive(Debug, Clone, PartialEq)]
pub struct StageSettings {
    /// Which stage.
    pub stage: Stage,
    /// How long a claim holds without a heartbeat; a claim past it is an
    /// orphan (classes 2 and 5), and it is the least time between two
    /// republishes of one running claim.
    pub lease: Duration,
    /// How long an unclaimed stage may wait without its event acknowledged
    /// before it is an orphan (classes 1, 3 and 4).
    pub orphan_after: Duration,
    /// The topic whose records hand the stage to its workers, prefixed.
    pub topic: String,
}

impl Settings {
    /// The bounds every intake checks a request against.
    pub fn request_limits(&self) -> RequestLimits {
        RequestLimits {
            fields: self.max_fields,
            field_name_bytes: self.max_field_name_bytes,
            pattern_bytes: self.max_pattern_bytes,
            pattern_program_bytes: self.max_pattern_program_bytes,
            anchor_bytes: self.max_anchor_bytes,
            pages: self.max_pages,
            words_per_page: self.max_words_per_page,
            text_words: self.max_text_words,
            metadata_bytes: self.max_metadata_bytes,
            json_depth: self.max_json_depth,
            url_bytes: self.max_url_bytes,
        }
    }

    /// What `stage` is configured with: the one place each stage's lease,
    /// orphan threshold and topic are read.
    pub fn stage(&self, stage: Stage) -> StageSettings {
        let (lease, orphan_after, topic) = match stage {
            Stage::Extraction => (
                self.extraction_run_lease_s,
                self.queued_orphan_threshold_s,
                &self.topic_submitted,
            ),
            Stage::BboxRefinement => (
                self.bbox_refinement_lease_s,
                self.post_processing_pending_orphan_threshold_s,
                &self.topic_post_processing,
            ),
        };
        StageSettings {
            stage,
            lease: lease.get(),
            orphan_after: orphan_after.get(),
            topic: self.topic(topic),
        }
    }

    /// The bounds of an extraction's result.
    pub fn result_limits(&self) -> ResultLimits {
        ResultLimits {
            field_bytes: self.max_result_field_bytes,
            total_bytes: self.max_result_bytes,
        }
    }

    /// Defaults, then `file` if given, then the process environment; validated.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, &|var| std::env::var(var).ok())
    }

    /// Like [`Settings::load`], with `lookup` standing in for the environment.
    pub fn load_from(
        file: Option<&Path>,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut settings = match file {
            Some(path) => Self::from_file(path)?,
            None => Self::default(),
        };
        if lookup(RETIRED_ASYNC_TIMEOUT).is_some() {
            return Err(ConfigError::Invalid(format!(
                "{RETIRED_ASYNC_TIMEOUT} is no longer read: the rule extractor's budget is \
                 DOCSTREAM_EXTRACTION_DEADLINE_S, and a job past it now fails instead of being \
                 retried; set that instead, then unset the variable"
            )));
        }
        if lookup(RETIRED_WEBHOOK_SECRET).is_some() {
            return Err(ConfigError::Invalid(format!(
                "{RETIRED_WEBHOOK_SECRET} is no longer read: each tenant signs its webhooks with a \
                 secret of its own; keep yours with `docstream tenants rotate-webhook-secret NAME \
                 --secret <it> --overlap-s 0`, then unset the variable"
            )));
        }
        let secrets = secret_files(lookup)?;
        settings.apply_env(&|var| secrets.get(var).cloned().or_else(|| lookup(var)))?;
        settings.load_kafka_properties()?;
        settings.validate()?;
        Ok(settings)
    }

    /// Reads `DOCSTREAM_KAFKA_PROPERTIES_FILE` and the Kafka secrets again:
    /// after changing them on loaded settings.
    pub fn load_kafka_properties(&mut self) -> Result<(), ConfigError> {
        self.kafka_properties = KafkaProperties::load(
            &self.kafka_properties_file,
            &self.kafka_sasl_password,
            &self.kafka_oauth_client_secret,
        )?;
        Ok(())
    }

    /// How this process's Kafka clients connect: the brokers and the
    /// properties loaded with the settings.
    pub fn kafka(&self) -> KafkaClient {
        KafkaClient::new(self.kafka_brokers.clone(), self.kafka_properties.clone())
    }

    fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let error = |reason: String| ConfigError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
        toml::from_str(&text).map_err(|e| error(e.to_string()))
    }

    /// Refuses settings that break a rule: one of a setting's own, one
    /// between settings, or one of an external extractor's.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_each()?;
        for rule in rules::ACROSS {
            rule(self).map_err(ConfigError::Invalid)?;
        }
        extractors::validate(&self.extractors)
    }

    /// The full name of a topic, with the prefix.
    pub fn topic(&self, name: &str) -> String {
        format!("{}{}", self.topic_prefix, name)
    }

    /// The full name of a consumer group, with the prefix.
    pub fn group(&self, name: &str) -> String {
        format!("{}{}", self.topic_prefix, name)
    }

    /// Where deferred results are posted and the key of their tokens, when
    /// both are set.
    pub fn deferred_results(&self) -> Option<(&str, &str)> {
        let on = !self.public_url.is_empty() && !self.callback_secret.is_empty();
        on.then_some((self.public_url.trim_end_matches('/'), &self.callback_secret))
    }

    /// The quotas of a tenant without its own.
    pub fn tenant_quota(&self) -> crate::domain::Quota {
        crate::domain::Quota {
            submit_rate_per_s: (self.tenant_submit_rate_per_s > 0.0)
                .then_some(self.tenant_submit_rate_per_s),
            submit_burst: self.tenant_submit_burst.max(1),
            max_open_jobs: (self.tenant_max_open_jobs > 0)
                .then_some(i64::from(self.tenant_max_open_jobs)),
        }
    }

    /// `kafka_statistics_interval_s` in milliseconds, as librdkafka's
    /// `statistics.interval.ms` takes it (0: off).
    pub fn kafka_statistics_interval_ms(&self) -> u64 {
        self.kafka_statistics_interval_s.get().as_millis() as u64
    }

    /// How long a running extraction may go on once its consumer stopped: the
    /// drain timeout less a margin (a tenth, at most 1 s) to release the claim
    /// and report before the drain gives up on the record.
    pub fn extraction_drain_budget(&self) -> Duration {
        let drain = self.subscriber_drain_timeout_s.get();
        drain - (drain / 10).min(Duration::from_secs(1))
    }

    /// How long after its event was acknowledged a new job is stamped as
    /// published (`pipeline::stamps`): half the queued orphan threshold, so
    /// that jobs claimed within that time are never stamped, and the stamps of
    /// those still waiting land half a threshold before the reaper would look.
    pub fn published_stamp_delay(&self) -> Duration {
        self.queued_orphan_threshold_s.get() / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::load_from(None, &move |name| {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn a_secret_setting_reads_from_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("url");
        std::fs::write(&file, "postgres://u:p4ss@db/x\n").unwrap();
        let path = file.to_str().unwrap();
        let s = load(&[("DATABASE_URL_FILE", path)]).unwrap();
        assert_eq!(s.database_url, "postgres://u:p4ss@db/x");
        let alike = load(&[
            ("DATABASE_URL_FILE", path),
            ("DATABASE_URL", "postgres://u:p4ss@db/x"),
        ]);
        assert!(alike.is_ok());
        let e = load(&[
            ("DATABASE_URL_FILE", path),
            ("DATABASE_URL", "postgres://other"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("DATABASE_URL and DATABASE_URL_FILE"), "{e}");
        assert!(!e.contains("p4ss"), "{e}");
        let missing = load(&[("DOCSTREAM_KAFKA_SASL_PASSWORD_FILE", "/nonexistent/pw")])
            .unwrap_err()
            .to_string();
        assert!(missing.contains("/nonexistent/pw"), "{missing}");
    }

    #[test]
    fn printed_settings_keep_their_secrets() {
        let s = load(&[
            ("DATABASE_URL", "postgres://u:pg-s3cret@db/x"),
            ("DOCSTREAM_KAFKA_SASL_PASSWORD", "kafka-s3cret"),
        ])
        .unwrap();
        let printed = format!("{s:?}");
        assert!(!printed.contains("s3cret"), "{printed}");
        assert!(printed.contains("kafka_brokers"), "{printed}");
    }

    #[test]
    fn a_kafka_properties_file_reaches_every_client_config() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("client.properties");
        std::fs::write(
            &file,
            "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=u\n",
        )
        .unwrap();
        let s = load(&[
            ("DOCSTREAM_KAFKA_PROPERTIES_FILE", file.to_str().unwrap()),
            ("DOCSTREAM_KAFKA_SASL_PASSWORD", "pw"),
        ])
        .unwrap();
        let config = s.kafka().config();
        assert_eq!(config.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(config.get("sasl.password"), Some("pw"));
        assert_eq!(config.get("bootstrap.servers"), Some("127.0.0.1:59092"));
        std::fs::write(&file, "enable.auto.commit=true\n").unwrap();
        let e = load(&[("DOCSTREAM_KAFKA_PROPERTIES_FILE", file.to_str().unwrap())])
            .unwrap_err()
            .to_string();
        assert!(e.contains("enable.auto.commit is docstream's"), "{e}");
    }

    #[test]
    fn defaults_are_valid() {
        assert!(load(&[]).is_ok());
    }

    #[test]
    fn env_overrides_and_bad_values_name_their_variable() {
        let s = load(&[("DOCSTREAM_JOB_TOPIC_PARTITIONS", "12")]).unwrap();
        assert_eq!(s.job_topic_partitions, 12);
        let err = load(&[("DOCSTREAM_JOB_TOPIC_PARTITIONS", "many")]).unwrap_err();
        assert!(err.to_string().contains("DOCSTREAM_JOB_TOPIC_PARTITIONS"));
    }

    #[test]
    fn a_heartbeat_too_slow_for_its_lease_is_refused() {
        let err = load(&[
            ("DOCSTREAM_EXTRACTION_RUN_LEASE_S", "5"),
            ("DOCSTREAM_HEARTBEAT_INTERVAL_S", "5"),
        ])
        .unwrap_err();
        assert!(
            err.to_string().contains("DOCSTREAM_HEARTBEAT_INTERVAL_S"),
            "{err}"
        );
        // A job may run longer than its lease: that is what heartbeats are for.
        let long_job = [
            ("DOCSTREAM_EXTRACTION_RUN_LEASE_S", "5"),
            ("DOCSTREAM_EXTRACTION_DEADLINE_S", "600"),
        ];
        assert!(load(&long_job).is_ok());
        let err = load(&[("DOCSTREAM_ASYNC_TIMEOUT_S", "60")]).unwrap_err();
        assert!(err.to_string().contains("EXTRACTION_DEADLINE"), "{err}");
        let err = load(&[("DOCSTREAM_RETRY_MAX_DELAY_S", "0.5")]).unwrap_err();
        assert!(err.to_string().contains("RETRY_MAX_DELAY"), "{err}");
        let err = load(&[("DOCSTREAM_REBALANCE_DRAIN_TIMEOUT_S", "12")]).unwrap_err();
        assert!(
            err.to_string()
                .contains("below DOCSTREAM_KAFKA_SESSION_TIMEOUT_MS"),
            "{err}"
        );
        let err = load(&[("DOCSTREAM_KAFKA_GROUP_PROTOCOL", "eager")]).unwrap_err();
        assert!(err.to_string().contains("classic or consumer"), "{err}");
    }

    #[test]
    fn to_env_gives_a_child_exactly_these_settings() {
        let s = Settings {
            topic_prefix: "t.".into(),
            heartbeat_interval_s: Seconds::from_millis(250),
            metrics_addr: "127.0.0.1:0".parse().unwrap(),
            kafka_group_protocol: GroupProtocol::Consumer,
            webhook_allow: "10.0.0.0/8,::1".parse().unwrap(),
            tenant_submit_rate_per_s: 12.5,
            ..Settings::default()
        };
        let env = s.to_env();
        let child = Settings::load_from(None, &|var| {
            env.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone())
        })
        .unwrap();
        let json = |s: &Settings| serde_json::to_value(s).unwrap();
        assert_eq!(json(&child), json(&s));
    }

    #[test]
    fn a_broken_rule_names_its_variable() {
        for (var, value, says) in [
            (
                "DOCSTREAM_REAPER_SWEEP_INTERVAL_S",
                "0",
                "positive number of seconds",
            ),
            ("DOCSTREAM_MAX_FIELDS", "0", "at least 1"),
            ("DOCSTREAM_API_KEY_CACHE_S", "6", "within 5 s"),
            (
                "DOCSTREAM_PUBLIC_URL",
                "ftp://x",
                "not an absolute http or https URL",
            ),
            (
                "DOCSTREAM_WEBHOOK_ALLOW",
                "10.0.0.0/33",
                "not an IP address or CIDR block",
            ),
            ("DOCSTREAM_HTTP_ADDR", "localhost", "invalid socket address"),
        ] {
            let err = load(&[(var, value)]).unwrap_err().to_string();
            assert!(
                err.contains(var) && err.contains(says),
                "{var}={value}: {err}"
            );
        }
    }

    #[test]
    fn toml_file_is_read_and_env_wins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docstream.toml");
        std::fs::write(&path, "topic_prefix = \"a.\"\njob_topic_partitions = 3\n").unwrap();
        let s = Settings::load_from(Some(&path), &|v| {
            (v == "DOCSTREAM_TOPIC_PREFIX").then(|| "b.".to_string())
        })
        .unwrap();
        assert_eq!((s.topic_prefix.as_str(), s.job_topic_partitions), ("b.", 3));
        std::fs::write(&path, "no_such_setting = 1\n").unwrap();
        assert!(Settings::load_from(Some(&path), &|_| None).is_err());
    }
}
