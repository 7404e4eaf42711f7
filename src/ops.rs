//! Operator recipes: list the current orphans, force a re-claim now,
//! manage tenants and their API keys (`tenants`), and read and replay dead
//! letters (`dlq`).

pub mod dlq;
pub mod jobs;
pub mod tenants;

use std::fmt::Write as _;

use uuid::Uuid;

use crate::config::Settings;
use crate::domain::Lane;
use crate::events::PublishReason;
use crate::pipeline::{Services, Stage};
use crate::store;
use crate::store::orphans::{self, Orphan};

/// The current orphans (of tenant `tenant`'s jobs only, when given), as a
/// table or as JSON.
pub async fn orphans_report(
    pool: &sqlx::PgPool,
    settings: &Settings,
    tenant: Option<&str>,
    json: bool,
) -> anyhow::Result<String> {
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
pub async fn reclaim(
    services: &Services,
    id: Uuid,
    tenant: Option<&str>,
) -> anyhow::Result<String> {
    if let Some(name) = tenant {
        let owner = store::tenants::tenant_by_name(&services.pool, name).await?;
        if store::get_for_tenant(&services.pool, owner.tenant_id, id)
            .await?
            .is_none()
        {
            anyhow::bail!("tenant {name:?} has no extraction {id}");
        }
    }
    let Some(stage) = orphans::reclaim(&services.pool, id).await? else {
        anyhow::bail!("extraction {id} is unknown or has nothing left to do");
    };
    let lane = match store::get(&services.pool, id).await? {
        Some(row) => crate::pipeline::jobs::lane(&row),
        None => Lane::default(),
    };
    services
        .jobs
        .republish(stage, id, lane, PublishReason::Operator)
        .await?;
    let (what, topic) = match stage {
        Stage::Extraction => ("", &services.jobs.stage(stage).topic),
        Stage::BboxRefinement => ("bbox refinement ", &services.jobs.stage(stage).topic),
    };
    Ok(format!(
        "extraction {id}: {what}lease expired, republished to {topic}\n"
    ))
}
