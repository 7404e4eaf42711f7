//! Progress bars while the demo runs, and the summary it ends with.

use std::fmt;
use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

/// Jobs by where they are, for the submitted ids.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    /// Queued or running.
    pub in_extraction: i64,
    /// Extraction succeeded.
    pub succeeded: i64,
    /// Extraction failed or was cancelled.
    pub failed_or_cancelled: i64,
    /// Bbox refinement finished (succeeded or failed).
    pub bbox_done: i64,
    /// Bbox refinement succeeded.
    pub bbox_succeeded: i64,
}

impl Counts {
    /// Reads the counts of `ids`.
    pub async fn query(pool: &PgPool, ids: &[Uuid]) -> Result<Self, sqlx::Error> {
        let row: (i64, i64, i64, i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status IN ('queued', 'running')),
                    count(*) FILTER (WHERE status = 'succeeded'),
                    count(*) FILTER (WHERE status IN ('failed', 'cancelled')),
                    count(*) FILTER (WHERE bbox_status IN ('succeeded', 'failed')),
                    count(*) FILTER (WHERE bbox_status = 'succeeded')
               FROM extractions WHERE id = ANY($1)",
        )
        .bind(ids)
        .fetch_one(pool)
        .await?;
        Ok(Self {
            in_extraction: row.0,
            succeeded: row.1,
            failed_or_cancelled: row.2,
            bbox_done: row.3,
            bbox_succeeded: row.4,
        })
    }

    /// Jobs that will not change any more.
    pub fn settled(&self) -> i64 {
        self.failed_or_cancelled + self.bbox_done
    }
}

/// Three bars: submitted, extracted, bbox refined. Plain lines when stderr is not a terminal.
pub struct Progress {
    bars: Option<[ProgressBar; 3]>,
    total: u64,
}

impl Progress {
    /// Bars for `total` documents.
    pub fn new(total: u64) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self { bars: None, total };
        }
        let multi = MultiProgress::new();
        let style =
            ProgressStyle::with_template("{prefix:>10} [{bar:40.cyan/blue}] {pos}/{len} {per_sec}")
                .expect("valid template")
                .progress_chars("=> ");
        let bar = |name: &'static str| {
            let bar = multi.add(ProgressBar::new(total));
            bar.set_style(style.clone());
            bar.set_prefix(name);
            bar
        };
        Self {
            bars: Some([bar("submitted"), bar("extracted"), bar("bbox")]),
            total,
        }
    }

    /// One more submission answered.
    pub fn submitted(&self) {
        if let Some([submitted, _, _]) = &self.bars {
            submitted.inc(1);
        }
    }

    /// Shows the latest counts.
    pub fn update(&self, counts: &Counts) {
        let extracted = (counts.succeeded + counts.failed_or_cancelled) as u64;
        match &self.bars {
            Some([_, e, b]) => {
                e.set_position(extracted);
                b.set_position(counts.bbox_done as u64);
            }
            None => eprintln!(
                "progress: extracted {extracted}/{t}, bbox {b}/{t}",
                t = self.total,
                b = counts.bbox_done
            ),
        }
    }

    /// Leaves the bars on screen.
    pub fn finish(&self) {
        if let Some(bars) = &self.bars {
            bars.iter().for_each(ProgressBar::finish);
        }
    }
}

/// What the demo prints at the end.
#[derive(Debug)]
pub struct Summary {
    /// Documents submitted.
    pub total: i64,
    /// Final counts.
    pub counts: Counts,
    /// Documents whose bbox refinement succeeded.
    pub bbox_succeeded: i64,
    /// Wall time from the first submit to the last settlement.
    pub elapsed: Duration,
    /// p50 and p99 from submit to extraction succeeded, seconds.
    pub to_succeeded: (f64, f64),
    /// p50 and p99 from submit to bbox succeeded, seconds.
    pub to_bbox: (f64, f64),
    /// One result with its boxes.
    pub sample: Option<(Uuid, serde_json::Value, serde_json::Value)>,
    /// One scan's result with its boxes: fields read by OCR.
    pub scan: Option<(Uuid, serde_json::Value, serde_json::Value)>,
}

impl Summary {
    /// Reads the summary of `ids` from the database.
    pub async fn query(
        pool: &PgPool,
        ids: &[Uuid],
        scans: &[Uuid],
        elapsed: Duration,
    ) -> Result<Self, sqlx::Error> {
        let counts = Counts::query(pool, ids).await?;
        let latency = |until: &str| {
            format!(
                "SELECT COALESCE(percentile_cont(0.5) WITHIN GROUP (ORDER BY s), 0)::float8,
                        COALESCE(percentile_cont(0.99) WITHIN GROUP (ORDER BY s), 0)::float8
                   FROM (SELECT extract(epoch FROM ({until}) - submitted_at) AS s
                           FROM extractions WHERE id = ANY($1) AND status = 'succeeded') t
                  WHERE s IS NOT NULL"
            )
        };
        let to_succeeded: (f64, f64) = sqlx::query_as(AssertSqlSafe(latency("finished_at")))
            .bind(ids)
            .fetch_one(pool)
            .await?;
        let to_bbox: (f64, f64) = sqlx::query_as(AssertSqlSafe(latency("bbox_finished_at")))
            .bind(ids)
            .fetch_one(pool)
            .await?;
        let first = |ids: &[Uuid]| {
            sqlx::query_as::<_, (Uuid, serde_json::Value, serde_json::Value)>(
                "SELECT id, result, bbox_result FROM extraction_rows
                  WHERE id = ANY($1) AND bbox_status = 'succeeded'
                  ORDER BY submitted_at LIMIT 1",
            )
            .bind(ids.to_vec())
            .fetch_optional(pool)
        };
        let sample = first(ids).await?;
        let scan = first(scans).await?;
        Ok(Self {
            total: ids.len() as i64,
            bbox_succeeded: counts.bbox_succeeded,
            counts,
            elapsed,
            to_succeeded,
            to_bbox,
            sample,
            scan,
        })
    }

    /// True when every document reached bbox succeeded.
    pub fn all_bbox_succeeded(&self) -> bool {
        self.bbox_succeeded == self.total
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counts;
        let secs = self.elapsed.as_secs_f64();
        writeln!(f, "== docstream demo summary ==")?;
        writeln!(f, "documents        {}", self.total)?;
        writeln!(
            f,
            "status           succeeded={} failed_or_cancelled={} still_queued_or_running={}",
            c.succeeded, c.failed_or_cancelled, c.in_extraction
        )?;
        writeln!(
            f,
            "bbox_refinement  succeeded={} finished={}",
            c.bbox_succeeded, c.bbox_done
        )?;
        writeln!(
            f,
            "throughput       {:.1} documents/s ({} in {secs:.2} s)",
            self.total as f64 / secs,
            self.total
        )?;
        writeln!(
            f,
            "latency          submit->succeeded p50={:.0} ms p99={:.0} ms; submit->bbox succeeded p50={:.0} ms p99={:.0} ms",
            self.to_succeeded.0 * 1e3,
            self.to_succeeded.1 * 1e3,
            self.to_bbox.0 * 1e3,
            self.to_bbox.1 * 1e3
        )?;
        if let Some((id, result, boxes)) = &self.sample {
            writeln!(f, "sample {id}")?;
            if let (Some(values), Some(grounded)) =
                (result["fields"].as_object(), boxes["fields"].as_object())
            {
                for (name, value) in values {
                    let bbox = &grounded.get(name).cloned().unwrap_or_default();
                    writeln!(
                        f,
                        "  {name:<16} {:<24} page={} bbox={}",
                        value["value"].as_str().unwrap_or("-"),
                        bbox["page"],
                        bbox["bbox"]
                    )?;
                }
            }
        }
        if let Some((id, result, boxes)) = &self.scan {
            writeln!(
                f,
                "read by OCR {id} (a 200 dpi scan; {} of its fields need review)",
                boxes["needs_review"]
            )?;
            if let (Some(values), Some(grounded)) =
                (result["fields"].as_object(), boxes["fields"].as_object())
            {
                for (name, value) in values {
                    let place = &grounded.get(name).cloned().unwrap_or_default();
                    let confidence = place["confidence"]
                        .as_f64()
                        .map_or("-".to_owned(), |c| format!("{:.0}%", c * 100.0));
                    let review = match place["needs_review"].as_bool() {
                        Some(true) => " needs review",
                        _ => "",
                    };
                    writeln!(
                        f,
                        "  {name:<16} {:<24} confidence={confidence}{review} bbox={}",
                        value["value"].as_str().unwrap_or("-"),
                        place["bbox"]
                    )?;
                }
            }
        }
        Ok(())
    }
}
