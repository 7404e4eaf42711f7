//! `docstream tenants …` and `docstream keys …`: the operator's hands on
//! tenants and API keys. Every command prints JSON, for scripts; a key's
//! secret is printed once, when it is made, and never again.

use super::OpsError;
use clap::Subcommand;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::Parts;
use crate::domain::Scope;
use crate::store::tenants;

/// `docstream tenants …`
#[derive(Debug, Subcommand)]
pub enum TenantsCommand {
    /// Create a tenant, its webhook secret and its first API key (every scope
    /// but admin); prints {"tenant", "tenant_id", "key_id", "api_key",
    /// "scopes", "webhook_secret"}.
    Create {
        /// 1 to 63 lower-case letters, digits, '-' or '_'.
        name: String,
    },
    /// Rotate a tenant's webhook signing secret; prints the new one. The
    /// previous one keeps signing too (a second signature) for the overlap.
    RotateWebhookSecret {
        /// The tenant's name.
        name: String,
        /// The new secret (`whsec_…`); a random one by default.
        #[arg(long)]
        secret: Option<String>,
        /// How long the previous secret keeps signing: receivers switch over
        /// meanwhile. 0 ends it at once.
        #[arg(long, default_value_t = 86_400.0)]
        overlap_s: f64,
    },
    /// List every tenant, deleted ones too.
    List,
    /// Set a tenant's own quotas; prints them. Each takes a number (0: no
    /// limit; a burst is at least 1) or `default` (the deployment's setting);
    /// a quota not named stays as it is.
    SetQuota {
        /// The tenant's name.
        name: String,
        /// Submits per second per serve process.
        #[arg(long, value_parser = quota_value::<f64>)]
        submit_rate_per_s: Option<Setting<f64>>,
        /// Submits at once before the rate applies.
        #[arg(long, value_parser = quota_value::<i32>)]
        submit_burst: Option<Setting<i32>>,
        /// Jobs queued or running at once.
        #[arg(long, value_parser = quota_value::<i32>)]
        max_open_jobs: Option<Setting<i32>>,
    },
    /// Set how long a tenant's finished jobs are kept before they are
    /// purged; prints it. Days (0: for ever) or `default` (the deployment's
    /// DOCSTREAM_RETENTION_DAYS).
    SetRetention {
        /// The tenant's name.
        name: String,
        /// Days, or `default`.
        #[arg(long, value_parser = quota_value::<u32>)]
        days: Setting<u32>,
    },
    /// Set a tenant's weight: its share of the workers when several tenants
    /// have work waiting, and of a `serve`'s admission limit when submits
    /// exceed it (1 to 1000; every tenant starts at 1). Workers and `serve`
    /// use it within 5 s; prints it.
    SetWeight {
        /// The tenant's name.
        name: String,
        /// The weight.
        weight: i32,
    },
    /// Delete a tenant: its keys stop working within DOCSTREAM_API_KEY_CACHE_S
    /// on every process, and its name is never reused. Its jobs stay unless
    /// `--purge`.
    Delete {
        /// The tenant's name.
        name: String,
        /// Also purge every job of the tenant: queued ones are cancelled,
        /// running ones asked to stop (each cancel with its event, as a
        /// client's), and each is purged once finished (every row, in every
        /// table). Fails, with
        /// the count left, if some are still running after `--wait-s`; run
        /// it again then.
        #[arg(long)]
        purge: bool,
        /// How long `--purge` waits for running jobs to stop.
        #[arg(long, default_value_t = 120)]
        wait_s: u64,
    },
}

/// `docstream keys …`
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create an API key for a tenant; prints the key, once.
    Create {
        /// The tenant's name.
        tenant: String,
        /// Comma-separated scopes: submit, read, cancel, export, admin, delete.
        #[arg(long, default_value = "submit,read,cancel,export")]
        scopes: String,
    },
    /// List a tenant's keys (ids, prefixes and scopes; never the keys).
    List {
        /// The tenant's name.
        tenant: String,
    },
    /// Revoke a key: refused within DOCSTREAM_API_KEY_CACHE_S on every process.
    Revoke {
        /// The key's id (from `keys create` or `keys list`).
        key_id: Uuid,
    },
}

/// A quota's new value: a number, or the deployment's setting (`None`).
#[derive(Debug, Clone, Copy)]
pub struct Setting<T>(Option<T>);

fn quota_value<T: std::str::FromStr>(text: &str) -> Result<Setting<T>, String> {
    match text {
        "default" => Ok(Setting(None)),
        number => number
            .parse()
            .map(|n| Setting(Some(n)))
            .map_err(|_| format!("{number:?}: expected a number or default")),
    }
}

/// What a tenant's purge did.
struct Purged {
    /// Jobs purged.
    purged: u64,
    /// Jobs still open (or refining their boxes) when the wait ran out.
    left: i64,
}

/// Purges every job of tenant `tenant_id`: cancels the queued ones, asks
/// the running ones to stop, and purges each finished one, in batches;
/// waits up to `wait` for the running ones.
async fn purge_jobs(
    parts: &Parts,
    tenant_id: Uuid,
    wait: std::time::Duration,
) -> Result<Purged, OpsError> {
    use crate::store::retention;
    const BATCH: i64 = 500;
    let pool = &parts.pool;
    let deadline = std::time::Instant::now() + wait;
    let mut purged = 0;
    loop {
        loop {
            let open: Vec<Uuid> = sqlx::query_scalar(
                "SELECT id FROM extractions
                  WHERE tenant_id = $1 AND status IN ('queued', 'running')
                    AND cancel_requested_at IS NULL
                  LIMIT $2",
            )
            .bind(tenant_id)
            .bind(BATCH)
            .fetch_all(pool)
            .await?;
            parts.jobs.cancel_many(&open).await?;
            if open.len() < BATCH as usize {
                break;
            }
        }
        loop {
            let n = retention::purge_tenant(pool, tenant_id, BATCH).await?;
            purged += n;
            if n < BATCH as u64 {
                break;
            }
        }
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM extractions WHERE tenant_id = $1")
            .bind(tenant_id)
            .fetch_one(pool)
            .await?;
        if left == 0 || std::time::Instant::now() >= deadline {
            return Ok(Purged { purged, left });
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

fn json(value: &impl Serialize) -> Result<String, OpsError> {
    Ok(serde_json::to_string_pretty(value)? + "\n")
}

/// Runs a `tenants` command; its JSON output.
pub async fn tenants(parts: &Parts, command: TenantsCommand) -> Result<String, OpsError> {
    let pool = &parts.pool;
    match command {
        TenantsCommand::Create { name } => json(&tenants::create_tenant(pool, &name).await?),
        TenantsCommand::List => json(&tenants::list_tenants(pool).await?),
        TenantsCommand::SetQuota {
            name,
            submit_rate_per_s,
            submit_burst,
            max_open_jobs,
        } => {
            let value = |s: Option<Setting<_>>| s.map(|Setting(v)| v);
            let (rate, burst, max_open) = (
                value(submit_rate_per_s),
                submit_burst.map(|Setting(v)| v),
                max_open_jobs.map(|Setting(v)| v),
            );
            json(&tenants::set_quota(pool, &name, rate, burst, max_open).await?)
        }
        TenantsCommand::SetRetention {
            name,
            days: Setting(days),
        } => json(&tenants::set_retention(pool, &name, days).await?),
        TenantsCommand::SetWeight { name, weight } => {
            json(&tenants::set_weight(pool, &name, weight).await?)
        }
        TenantsCommand::Delete {
            name,
            purge,
            wait_s,
        } => {
            let deleted = match tenants::delete_tenant(pool, &name).await {
                // A purge may be run again on a tenant deleted before.
                Err(tenants::TenantStoreError::NoSuchTenant(_)) if purge => {
                    tenants::deleted_tenant(pool, &name).await?
                }
                deleted => deleted?,
            };
            if !purge {
                return json(&deleted);
            }
            let wait = std::time::Duration::from_secs(wait_s);
            let purged = purge_jobs(parts, deleted.tenant_id, wait).await?;
            if purged.left > 0 {
                refuse!(
                    "tenant {name} deleted; {} jobs purged, {} still running after {wait_s} s \
                     (are the workers up?): run the command again",
                    purged.purged,
                    purged.left
                );
            }
            json(&serde_json::json!({"tenant": deleted, "purged_jobs": purged.purged}))
        }
        TenantsCommand::RotateWebhookSecret {
            name,
            secret,
            overlap_s,
        } => {
            let rotated =
                tenants::rotate_webhook_secret(pool, &name, secret.as_deref(), overlap_s).await?;
            json(&rotated)
        }
    }
}

/// Runs a `keys` command; its JSON output.
pub async fn keys(pool: &PgPool, command: KeysCommand) -> Result<String, OpsError> {
    match command {
        KeysCommand::Create { tenant, scopes } => {
            let scopes = Scope::parse_list(&scopes)?;
            json(&tenants::create_key(pool, &tenant, &scopes).await?)
        }
        KeysCommand::List { tenant } => json(&tenants::list_keys(pool, &tenant).await?),
        KeysCommand::Revoke { key_id } => json(&tenants::revoke_key(pool, key_id).await?),
    }
}
