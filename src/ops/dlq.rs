//! `docstream dlq …`: the dead letters of `extraction.dlq`, for operators.
//! `list` reads the letters (filtered by kind, source topic and time),
//! `show` one with its excerpt and, while its topic retains it, the original
//! record; `replay` produces the original record again to its source topic,
//! or an edited request to the intake, and records the replay, so that a
//! letter is not replayed twice by accident (`--force` does it knowingly).
//!
//! A letter is named by its place on the dead-letter topic,
//! `PARTITION:OFFSET`, as `list` prints it.

use super::OpsError;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use chrono::{DateTime, Utc};
use clap::Subcommand;
use rdkafka::message::{Message, OwnedMessage};
use serde::Serialize;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::config::Settings;
use crate::events::{decode, encode, now_ms, DeadLetter, ExtractionRequested};
use crate::kafka::reader::{produce_copy, TopicReader, READER_GROUP};

/// `docstream dlq …`
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// List the dead letters, oldest first in each partition.
    List {
        /// Only letters of this error kind (`invalid_request`, `missing_row`, …).
        #[arg(long)]
        kind: Option<String>,
        /// Only letters of records from this topic (its name without the
        /// deployment's prefix, e.g. `extraction.requests`).
        #[arg(long)]
        source_topic: Option<String>,
        /// Only letters written at or after this time (RFC 3339).
        #[arg(long)]
        since: Option<DateTime<Utc>>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one letter (JSON): its reason, coordinates and excerpt, the
    /// original record while its topic retains it (an intake request
    /// decoded, ready to edit for `replay --edit`), and its replays.
    Show {
        /// The letter, `PARTITION:OFFSET`.
        letter: LetterId,
    },
    /// Produce a letter's original record again to its source topic, or
    /// `--edit` an intake request first and produce that to the intake (with
    /// the original's key and headers). Refused for a letter replayed before
    /// unless `--force`; prints where the record went.
    Replay {
        /// The letter, `PARTITION:OFFSET`.
        letter: LetterId,
        /// A JSON file `{"idempotency_key": "…", "request": {…}}` (as `show`
        /// prints the original) to produce instead of the original.
        #[arg(long)]
        edit: Option<PathBuf>,
        /// Replay a letter that was replayed before.
        #[arg(long)]
        force: bool,
    },
}

/// A letter's place on the dead-letter topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LetterId {
    partition: i32,
    offset: i64,
}

impl FromStr for LetterId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: expected PARTITION:OFFSET, as `dlq list` prints it");
        let (partition, offset) = s.split_once(':').ok_or_else(bad)?;
        Ok(Self {
            partition: partition.parse().map_err(|_| bad())?,
            offset: offset.parse().map_err(|_| bad())?,
        })
    }
}

impl std::fmt::Display for LetterId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.partition, self.offset)
    }
}

/// A letter as `list` and `show` print it.
#[derive(Debug, Serialize)]
struct Listed {
    letter: String,
    at: Option<DateTime<Utc>>,
    error_kind: String,
    error: String,
    source: String,
    payload_size: i64,
    replays: i64,
}

/// Runs a `dlq` command; what it prints.
pub async fn dlq(
    settings: &Settings,
    pool: &PgPool,
    command: DlqCommand,
) -> Result<String, OpsError> {
    let reader = TopicReader::new(&settings.kafka(), &settings.group(READER_GROUP))?;
    let dlq_topic = settings.topic(&settings.topic_dlq);
    match command {
        DlqCommand::List {
            kind,
            source_topic,
            since,
            json,
        } => {
            let source_topic = source_topic.map(|t| settings.topic(&t));
            let mut listed = Vec::new();
            for record in reader.read_all(&dlq_topic)? {
                let id = LetterId {
                    partition: record.partition(),
                    offset: record.offset(),
                };
                let Some(letter) = letter_of(&record) else {
                    continue;
                };
                let at = DateTime::from_timestamp_millis(letter.published_at_ms);
                let keep = kind.as_ref().is_none_or(|k| *k == letter.error_kind)
                    && source_topic.as_ref().is_none_or(|t| *t == letter.topic)
                    && since.is_none_or(|since| at.is_some_and(|at| at >= since));
                if keep {
                    let replays = replays(pool, &dlq_topic, id).await?.len() as i64;
                    listed.push(listed_of(id, &letter, replays));
                }
            }
            match json {
                true => Ok(serde_json::to_string_pretty(&listed)? + "\n"),
                false => Ok(table(&listed)),
            }
        }
        DlqCommand::Show { letter: id } => {
            let letter = fetch_letter(&reader, &dlq_topic, id)?;
            let original = reader.read_one(&letter.topic, letter.partition, letter.offset)?;
            let intake = settings.topic(&settings.topic_requests);
            let shown = json!({
                "letter": listed_of(id, &letter, 0),
                "key": letter.key.as_deref().map(text_or_base64),
                "payload_sha256": letter.payload_sha256,
                "payload_excerpt": letter.payload_excerpt.as_deref().map(text_or_base64),
                "original_retained": original.is_some(),
                "original": original.as_ref().map(|o| original_of(o, letter.topic == intake)),
                "replays": replays(pool, &dlq_topic, id).await?,
            });
            Ok(serde_json::to_string_pretty(&shown)? + "\n")
        }
        DlqCommand::Replay {
            letter: id,
            edit,
            force,
        } => replay(settings, pool, &reader, (&dlq_topic, id), edit, force).await,
    }
}

/// The letter at `id`, or why there is none.
fn fetch_letter(
    reader: &TopicReader,
    dlq_topic: &str,
    id: LetterId,
) -> Result<DeadLetter, OpsError> {
    let record = reader
        .read_one(dlq_topic, id.partition, id.offset)?
        .ok_or_else(|| {
            OpsError::Refused(format!(
                "no letter at {id} of {dlq_topic} (never, or no longer retained)"
            ))
        })?;
    letter_of(&record)
        .ok_or_else(|| OpsError::Refused(format!("the record at {id} is not a dead letter")))
}

fn letter_of(record: &OwnedMessage) -> Option<DeadLetter> {
    decode::<DeadLetter>(record.payload()?).ok()
}

fn listed_of(id: LetterId, letter: &DeadLetter, replays: i64) -> Listed {
    Listed {
        letter: id.to_string(),
        at: DateTime::from_timestamp_millis(letter.published_at_ms),
        error_kind: letter.error_kind.clone(),
        error: letter.error.clone(),
        source: format!("{}/{}/{}", letter.topic, letter.partition, letter.offset),
        payload_size: letter.payload_size,
        replays,
    }
}

/// `bytes` as text when they are UTF-8, else as `{"base64": …}`.
fn text_or_base64(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => Value::String(text.to_owned()),
        Err(_) => json!({"base64": STANDARD.encode(bytes)}),
    }
}

/// The original record as `show` prints it: an intake request decoded
/// (the form `replay --edit` takes), anything else as its bytes.
fn original_of(record: &OwnedMessage, from_intake: bool) -> Value {
    let payload = record.payload().unwrap_or_default();
    let decoded = from_intake
        .then(|| decode::<ExtractionRequested>(payload).ok())
        .flatten();
    match decoded {
        Some(requested) => json!({
            "idempotency_key": requested.idempotency_key,
            "request": serde_json::from_str::<Value>(&requested.request_json)
                .unwrap_or(Value::String(requested.request_json)),
        }),
        None => json!({"value": text_or_base64(payload)}),
    }
}

/// The replays recorded for letter `id`.
async fn replays(pool: &PgPool, dlq_topic: &str, id: LetterId) -> Result<Vec<Value>, OpsError> {
    type Row = (i32, DateTime<Utc>, bool, String, Option<i32>, Option<i64>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT replay, replayed_at, edited, target_topic, target_partition, target_offset
           FROM dead_letter_replays
          WHERE dlq_topic = $1 AND dlq_partition = $2 AND dlq_offset = $3 ORDER BY replay",
    )
    .bind(dlq_topic)
    .bind(id.partition)
    .bind(id.offset)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(replay, at, edited, topic, partition, offset)| {
            json!({"replay": replay, "at": at, "edited": edited, "to": topic,
                   "partition": partition, "offset": offset})
        })
        .collect())
}

/// Replays letter `id`: claims the replay's row (refused if one exists
/// unless `force`), produces the record, and records where it went; a
/// record the broker did not take gives its row back.
async fn replay(
    settings: &Settings,
    pool: &PgPool,
    reader: &TopicReader,
    (dlq_topic, id): (&str, LetterId),
    edit: Option<PathBuf>,
    force: bool,
) -> Result<String, OpsError> {
    let letter = fetch_letter(reader, dlq_topic, id)?;
    let original = reader
        .read_one(&letter.topic, letter.partition, letter.offset)?
        .ok_or_else(|| {
            OpsError::Refused(format!(
                "the original record ({}/{}/{}) is no longer retained: nothing to replay",
                letter.topic, letter.partition, letter.offset
            ))
        })?;
    let (topic, value) = match &edit {
        None => (
            letter.topic.clone(),
            original.payload().unwrap_or_default().to_vec(),
        ),
        Some(path) => {
            let intake = settings.topic(&settings.topic_requests);
            (intake, edited_request(path)?)
        }
    };
    let before = replays(pool, dlq_topic, id).await?;
    if !before.is_empty() && !force {
        refuse!(
            "letter {id} was replayed before ({}); --force to replay it again",
            before.last().expect("a replay")
        );
    }
    let row = ReplayRow {
        dlq_topic,
        id,
        number: before.len() as i32 + 1,
    };
    if !row.claim(pool, edit.is_some(), &topic).await? {
        refuse!("letter {id} is being replayed by someone else right now");
    }
    let produced = produce_copy(&settings.kafka(), &topic, &original, &value).await;
    let (partition, offset) = match produced {
        Ok(place) => place,
        Err(e) => {
            row.release(pool).await?;
            refuse!("the broker did not take the replayed record: {e}");
        }
    };
    row.placed(pool, partition, offset).await?;
    let number = row.number;
    let done = json!({"letter": id.to_string(), "replay": number, "edited": edit.is_some(),
                      "to": topic, "partition": partition, "offset": offset});
    Ok(serde_json::to_string_pretty(&done)? + "\n")
}

/// A replay's row in `dead_letter_replays`: the letter, and which replay of
/// it this is. Claiming it is what makes a replay one of a kind.
struct ReplayRow<'a> {
    dlq_topic: &'a str,
    id: LetterId,
    number: i32,
}

impl ReplayRow<'_> {
    /// Inserts the row; false when it exists (another replay took it).
    async fn claim(&self, pool: &PgPool, edited: bool, target: &str) -> sqlx::Result<bool> {
        let claimed = sqlx::query(
            "INSERT INTO dead_letter_replays
                 (dlq_topic, dlq_partition, dlq_offset, replay, edited, target_topic)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        )
        .bind(self.dlq_topic)
        .bind(self.id.partition)
        .bind(self.id.offset)
        .bind(self.number)
        .bind(edited)
        .bind(target)
        .execute(pool)
        .await?;
        Ok(claimed.rows_affected() > 0)
    }

    /// Gives the row back: the record was not produced.
    async fn release(&self, pool: &PgPool) -> sqlx::Result<()> {
        sqlx::query(
            "DELETE FROM dead_letter_replays
              WHERE dlq_topic = $1 AND dlq_partition = $2 AND dlq_offset = $3 AND replay = $4",
        )
        .bind(self.dlq_topic)
        .bind(self.id.partition)
        .bind(self.id.offset)
        .bind(self.number)
        .execute(pool)
        .await?;
        Ok(())
    }

    /// Records where the replayed record went.
    async fn placed(&self, pool: &PgPool, partition: i32, offset: i64) -> sqlx::Result<()> {
        sqlx::query(
            "UPDATE dead_letter_replays SET target_partition = $5, target_offset = $6
              WHERE dlq_topic = $1 AND dlq_partition = $2 AND dlq_offset = $3 AND replay = $4",
        )
        .bind(self.dlq_topic)
        .bind(self.id.partition)
        .bind(self.id.offset)
        .bind(self.number)
        .bind(partition)
        .bind(offset)
        .execute(pool)
        .await?;
        Ok(())
    }
}

/// The intake record of an edited request: `{"idempotency_key", "request"}`.
fn edited_request(path: &PathBuf) -> Result<Vec<u8>, OpsError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| OpsError::Refused(format!("{}: {e}", path.display())))?;
    let edited: Value = serde_json::from_str(&text)
        .map_err(|e| OpsError::Refused(format!("{}: not JSON: {e}", path.display())))?;
    let key = edited["idempotency_key"].as_str().ok_or_else(|| {
        OpsError::Refused(format!(
            "{}: expected {{\"idempotency_key\": \"…\", \"request\": {{…}}}}",
            path.display()
        ))
    })?;
    let request = match &edited["request"] {
        Value::Object(_) => edited["request"].to_string(),
        _ => {
            refuse!("{}: `request` must be the request object", path.display())
        }
    };
    let requested = ExtractionRequested {
        idempotency_key: key.to_owned(),
        request_json: request,
        requested_at_ms: now_ms(),
    };
    Ok(encode(&requested)?)
}

/// The letters as a table for people.
fn table(listed: &[Listed]) -> String {
    let mut out = String::new();
    if listed.is_empty() {
        out.push_str("no dead letters\n");
        return out;
    }
    let _ = writeln!(
        out,
        "{:<12} {:<20} {:<22} {:<40} {:<8} ERROR",
        "LETTER", "AT", "KIND", "SOURCE", "REPLAYS"
    );
    for l in listed {
        let at = l.at.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string());
        let error: String = l.error.chars().take(80).collect();
        let _ = writeln!(
            out,
            "{:<12} {:<20} {:<22} {:<40} {:<8} {error}",
            l.letter,
            at.unwrap_or_default(),
            l.error_kind,
            l.source,
            l.replays
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_letter_is_named_by_its_partition_and_offset() {
        let id: LetterId = "2:417".parse().unwrap();
        assert_eq!((id.partition, id.offset), (2, 417));
        assert_eq!(id.to_string(), "2:417");
        assert!("417".parse::<LetterId>().is_err());
        assert!("a:1".parse::<LetterId>().is_err());
    }
}
