//! Operator recipes: list the current orphans, force a re-claim now,
//! manage tenants and their API keys (`tenants`), and read and replay dead
//! letters (`dlq`).

/// Returns [`OpsError::Refused`] with the text `format!` makes of the
/// arguments: what the operator asked cannot be done, and why. Defined
/// before the submodules, so that they have it too.
macro_rules! refuse {
    ($($arg:tt)*) => {
        return Err($crate::ops::OpsError::Refused(format!($($arg)*)))
    };
}

pub mod dlq;
pub mod jobs;
pub mod tenants;

use std::fmt::Write as _;

use uuid::Uuid;

use crate::config::Settings;
use crate::files::Files;
use crate::pipeline::bulk::Bulk;
use crate::pipeline::{Jobs, Stage};
use crate::store;
use crate::store::orphans::{self, Orphan};

/// What the operator's commands that change jobs work with: the store,
/// and the lifecycle (which publishes each change's events), the files and
/// bulk operations.
pub struct Parts {
    /// The pool the commands' queries run on.
    pub pool: sqlx::PgPool,
    /// The lifecycle: cancels and reclaims, with their events.
    pub jobs: Jobs,
    /// The files jobs name.
    pub files: Files,
    /// Bulk operations.
    pub bulk: Bulk,
}

/// Why an operator's command did not do what it was asked. Printed as it is
/// by the command line.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// Not done as asked, and the text says why: a tenant, job or letter
    /// that is not there, arguments that do not fit together, a state that
    /// refuses it.
    #[error("{0}")]
    Refused(String),
    /// Postgres failed a statement, or is not there.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// Postgres failed a statement, or is not there.
    #[error(transparent)]
    Postgres(#[from] sqlx::Error),
    /// A tenant or key that is not there, or a name or quota refused.
    #[error(transparent)]
    Tenant(#[from] store::tenants::TenantStoreError),
    /// The broker failed a request, or is not there.
    #[error(transparent)]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// A topic could not be read back.
    #[error(transparent)]
    Read(#[from] crate::kafka::reader::ReadError),
    /// A value that should be JSON is not, or did not serialise.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A file the command reads or writes.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A job's file could not be read from the store.
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    /// A scope list that names no scope.
    #[error(transparent)]
    Scope(#[from] crate::domain::TenantError),
    /// A job's change could not be made.
    #[error(transparent)]
    Job(#[from] crate::pipeline::jobs::JobError),
    /// A record could not be encoded.
    #[error(transparent)]
    Codec(#[from] crate::events::CodecError),
}

/// The current orphans (of tenant `tenant`'s jobs only, when given), as a
/// table or as JSON.
pub async fn orphans_report(
    pool: &sqlx::PgPool,
    settings: &Settings,
    tenant: Option<&str>,
    json: bool,
) -> Result<String, OpsError> {
    let tenant_id = match tenant {
        Some(name) => Some(store::tenants::tenant_by_name(pool, name).await?.tenant_id),
        None => None,
    };
    let found = orphans::list_orphans(pool, orphans::Thresholds::of(settings), tenant_id).await?;
    if json {
        return Ok(serde_json::to_string_pretty(&found)? + "\n");
    }
    Ok(table(&found))
}

fn table(found: &[Orphan]) -> String {
    let mut out = String::new();
    if found.is_empty() {
        out.push_str("no orphans\n");
        return out;
    }
    let _ = writeln!(out, "{:<6} {:<32} {:>10}  id", "class", "meaning", "age_s");
    for orphan in found {
        let _ = writeln!(
            out,
            "{:<6} {:<32} {:>10.1}  {}",
            orphan.class,
            orphan.class.meaning(),
            orphan.age_s,
            orphan.id
        );
    }
    out
}

/// Expires whatever claim holds job `id` and republishes its event, so a worker
/// claims it now. Safe against a live holder: its fencing token no longer
/// matches, so its completion is refused. With `tenant`, only that tenant's
/// job is reclaimed.
pub async fn reclaim(parts: &Parts, id: Uuid, tenant: Option<&str>) -> Result<String, OpsError> {
    if let Some(name) = tenant {
        let owner = store::tenants::tenant_by_name(&parts.pool, name).await?;
        if store::get_for_tenant(&parts.pool, owner.tenant_id, id)
            .await?
            .is_none()
        {
            refuse!("tenant {name:?} has no extraction {id}");
        }
    }
    let Some(stage) = parts.jobs.reclaim(id).await? else {
        refuse!("extraction {id} is unknown or has nothing left to do");
    };
    let (what, topic) = match stage {
        Stage::Extraction => ("", &parts.jobs.stage(stage).topic),
        Stage::BboxRefinement => ("bbox refinement ", &parts.jobs.stage(stage).topic),
    };
    Ok(format!(
        "extraction {id}: {what}lease expired, republished to {topic}\n"
    ))
}
