//! The "published" stamps of new jobs, written late and in bulk.
//!
//! A queued job's stamp says its event reached the broker, so the reaper
//! leaves it alone while it waits in a backlog (orphan classes 1 and 3, see
//! `store::orphans`). The stamp only matters to a job still queued when the
//! reaper looks, past the queued orphan threshold. Most jobs are claimed
//! within milliseconds of their event, and a stamp written then would be a
//! row rewrite that nobody reads. So the submit path hands the acknowledged
//! id to [`Stamps`], which stamps it after a delay (half the threshold),
//! together with every other id due within a quarter of that delay: the
//! statement skips the jobs claimed meanwhile, and writes only those still
//! waiting.
//!
//! Losing a pending stamp (the process dies first) is safe: the job then looks
//! unpublished, and past its threshold the reaper publishes it again, which
//! its claim makes harmless. A graceful shutdown writes the pending stamps
//! first ([`Stamps::flush`]).

use std::collections::VecDeque;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use uuid::Uuid;

use crate::domain::Stage;
use crate::store::orphans;

/// The most ids one stamp statement carries.
const MAX_BATCH: usize = 5_000;

enum Command {
    Stamp(Uuid, Instant),
    Flush(oneshot::Sender<()>),
}

/// A handle on the process's stamper; clones share it.
#[derive(Clone)]
pub struct Stamps {
    commands: mpsc::UnboundedSender<Command>,
    delay: Duration,
}

impl Stamps {
    /// Starts the stamper on `pool` (needs a Tokio runtime); each stamp is
    /// written `delay` after it was asked for.
    pub fn spawn(pool: PgPool, delay: Duration) -> Self {
        let (commands, queue) = mpsc::unbounded_channel();
        tokio::spawn(run(pool, queue, delay));
        Self { commands, delay }
    }

    /// The event of queued job `id`'s first attempt was acknowledged.
    pub fn published(&self, id: Uuid) {
        let due = Instant::now() + self.delay;
        // The stamper only stops with the runtime; a stamp lost then is one
        // the reaper makes up for.
        let _ = self.commands.send(Command::Stamp(id, due));
    }

    /// Writes every pending stamp now, and returns once they are written (or
    /// failed, which is logged).
    pub async fn flush(&self) {
        let (done, written) = oneshot::channel();
        if self.commands.send(Command::Flush(done)).is_ok() {
            let _ = written.await;
        }
    }
}

async fn run(pool: PgPool, mut queue: mpsc::UnboundedReceiver<Command>, delay: Duration) {
    let mut pending: VecDeque<(Instant, Uuid)> = VecDeque::new();
    loop {
        let next_due = pending.front().map(|(due, _)| *due);
        let sleep_until_due = async {
            match next_due {
                Some(due) => tokio::time::sleep_until(due).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            command = queue.recv() => match command {
                Some(Command::Stamp(id, due)) => pending.push_back((due, id)),
                Some(Command::Flush(done)) => {
                    while !pending.is_empty() {
                        stamp(&pool, &mut pending, None).await;
                    }
                    let _ = done.send(());
                }
                None => return,
            },
            () = sleep_until_due => {
                // Early is harmless: a stamp only has to land before the
                // threshold, and one statement serves a whole window of ids.
                let window = Instant::now() + delay / 4;
                stamp(&pool, &mut pending, Some(window)).await;
            }
        }
    }
}

/// Stamps up to [`MAX_BATCH`] of the pending ids due by `until` (all, if `None`).
async fn stamp(pool: &PgPool, pending: &mut VecDeque<(Instant, Uuid)>, until: Option<Instant>) {
    let mut ids = Vec::new();
    while let Some(&(due, id)) = pending.front() {
        if ids.len() == MAX_BATCH || until.is_some_and(|until| due > until) {
            break;
        }
        ids.push(id);
        pending.pop_front();
    }
    if let Err(e) = orphans::record_published_many(pool, Stage::Extraction, &ids).await {
        tracing::warn!(jobs = ids.len(), error = %e, "publishes not recorded; the reaper may republish them");
    }
}
