//! Tenants and API keys: made, listed and retired by the operator's CLI, and
//! looked up by a presented key's hash on every request (through the cache in
//! `auth`). A tenant is never removed, only marked deleted; a key is never
//! removed, only revoked. Either stops the key working.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;
use crate::domain::{
    key_hash, new_webhook_secret, tenant_name_is_valid, webhook_secret_is_valid, NewApiKey,
    QuotaOverrides, Scope, TenantError,
};

/// The tenant every row written before tenants existed belongs to.
pub const DEFAULT_TENANT_ID: Uuid = Uuid::nil();

/// Why a tenant or key operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum TenantStoreError {
    /// A bad name or scope list.
    #[error(transparent)]
    Invalid(#[from] TenantError),
    /// The name is taken (also by a deleted tenant: names are never reused).
    #[error("a tenant named {0:?} exists already (names of deleted tenants are not reused)")]
    Exists(String),
    /// No live tenant has this name.
    #[error("no tenant named {0:?}")]
    NoSuchTenant(String),
    /// No key has this id.
    #[error("no API key with id {0}")]
    NoSuchKey(Uuid),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for TenantStoreError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

/// A tenant, as `tenants list` shows it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Tenant {
    /// The tenant's id, on each of its rows.
    pub tenant_id: Uuid,
    /// The tenant's name.
    pub tenant: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was deleted; its keys stopped working then.
    pub deleted_at: Option<DateTime<Utc>>,
}

/// A key, as `keys list` shows it: never the key itself.
#[derive(Debug, Clone, Serialize, serde::Deserialize, sqlx::FromRow, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ApiKey {
    /// The key's id, which `keys revoke` takes.
    pub key_id: Uuid,
    /// The key's first characters.
    pub prefix: String,
    /// What it may do.
    pub scopes: Vec<String>,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When it was revoked.
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A tenant just made: its first key (shown only now) and its webhook secret.
#[derive(Debug, Clone, Serialize)]
pub struct CreatedTenant {
    /// The first key.
    #[serde(flatten)]
    pub key: CreatedKey,
    /// The secret that signs the tenant's webhooks (`whsec_…`).
    pub webhook_secret: String,
}

/// A webhook secret just rotated in.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct RotatedSecret {
    /// The tenant's name.
    pub tenant: String,
    /// The new secret, which signs every delivery from now on.
    pub webhook_secret: String,
    /// Until when the previous secret signs too (`None`: it stopped at once).
    pub previous_valid_until: Option<DateTime<Utc>>,
}

/// A tenant's own quotas (`None`: the deployment's setting; 0: no limit).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct TenantQuota {
    /// The tenant's name.
    pub tenant: String,
    /// Submits per second per `serve` process.
    pub submit_rate_per_s: Option<f64>,
    /// The token bucket's size.
    pub submit_burst: Option<i32>,
    /// Jobs queued or running at once.
    pub max_open_jobs: Option<i32>,
}

/// A tenant's retention of finished jobs (`None`: the deployment's).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct TenantRetention {
    /// The tenant's name.
    pub tenant: String,
    /// Days a finished job is kept; 0 for ever.
    pub retention_days: Option<i64>,
}

/// A tenant's weight: its share of the workers when several tenants have
/// work waiting.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct TenantWeight {
    /// The tenant's name.
    pub tenant: String,
    /// 1 to 1,000; 1 unless set.
    pub weight: i32,
}

/// The most a tenant's weight may be.
pub const MAX_WEIGHT: i32 = 1000;

/// A key just made: the only time its secret is seen.
#[derive(Debug, Clone, Serialize)]
pub struct CreatedKey {
    /// The tenant's name.
    pub tenant: String,
    /// The tenant's id.
    pub tenant_id: Uuid,
    /// The key's id.
    pub key_id: Uuid,
    /// The key, for `Authorization: Bearer <key>`.
    pub api_key: String,
    /// What it may do.
    pub scopes: Vec<String>,
}

/// Who a live key belongs to and what it may do.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyOwner {
    /// The tenant's id.
    pub tenant_id: Uuid,
    /// The tenant's name.
    pub tenant: String,
    /// The key's id.
    pub key_id: Uuid,
    /// The key's scopes.
    pub scopes: Vec<Scope>,
    /// The tenant's own quotas.
    pub quota: QuotaOverrides,
}

fn scope_names(scopes: &[Scope]) -> Vec<String> {
    scopes.iter().map(|s| s.as_str().to_owned()).collect()
}

const INSERT_KEY: &str = "INSERT INTO api_keys (id, tenant_id, secret_hash, prefix, scopes)
VALUES ($1, $2, $3, $4, $5::text[]::api_scope[])";

/// Creates tenant `name`, its webhook secret, and its first key, with every
/// scope but `admin`.
pub async fn create_tenant(pool: &PgPool, name: &str) -> Result<CreatedTenant, TenantStoreError> {
    if !tenant_name_is_valid(name) {
        return Err(TenantError::InvalidName.into());
    }
    let mut tx = pool.begin().await?;
    let tenant_id = Uuid::now_v7();
    let webhook_secret = new_webhook_secret();
    let inserted = sqlx::query(
        "INSERT INTO tenants (id, name, webhook_secret) VALUES ($1, $2, $3)
         ON CONFLICT (name) DO NOTHING",
    )
    .bind(tenant_id)
    .bind(name)
    .bind(&webhook_secret)
    .execute(&mut *tx)
    .await?;
    if inserted.rows_affected() == 0 {
        return Err(TenantStoreError::Exists(name.to_owned()));
    }
    let key = insert_key(&mut tx, tenant_id, name, &Scope::DEFAULT).await?;
    tx.commit().await?;
    Ok(CreatedTenant {
        key,
        webhook_secret,
    })
}

/// Rotates tenant `name`'s webhook secret to `secret` (a new one when
/// `None`): from now on every delivery is signed with it, and, for
/// `overlap_s` seconds, with the previous one too, so receivers can switch
/// over while both verify. An overlap of 0 ends the previous secret at once
/// (also one still overlapping from an earlier rotation).
pub async fn rotate_webhook_secret(
    pool: &PgPool,
    name: &str,
    secret: Option<&str>,
    overlap_s: f64,
) -> Result<RotatedSecret, TenantStoreError> {
    let secret = match secret {
        Some(secret) if webhook_secret_is_valid(secret) => secret.to_owned(),
        Some(_) => return Err(TenantError::InvalidWebhookSecret.into()),
        None => new_webhook_secret(),
    };
    if !(overlap_s.is_finite() && overlap_s >= 0.0) {
        return Err(TenantError::InvalidOverlap.into());
    }
    sqlx::query_as::<_, RotatedSecret>(
        "UPDATE tenants
            SET webhook_secret_previous = CASE WHEN $3 > 0 THEN webhook_secret END,
                webhook_previous_until =
                    CASE WHEN $3 > 0 THEN now() + make_interval(secs => $3) END,
                webhook_secret = $2
          WHERE name = $1 AND deleted_at IS NULL
      RETURNING name AS tenant, webhook_secret, webhook_previous_until AS previous_valid_until",
    )
    .bind(name)
    .bind(&secret)
    .bind(overlap_s)
    .fetch_optional(pool)
    .await?
    .ok_or_else(|| TenantStoreError::NoSuchTenant(name.to_owned()))
}

async fn insert_key(
    tx: &mut sqlx::PgConnection,
    tenant_id: Uuid,
    tenant: &str,
    scopes: &[Scope],
) -> Result<CreatedKey, TenantStoreError> {
    let key = NewApiKey::generate();
    let key_id = Uuid::now_v7();
    sqlx::query(INSERT_KEY)
        .bind(key_id)
        .bind(tenant_id)
        .bind(key_hash(&key.secret))
        .bind(key.shown_prefix())
        .bind(scope_names(scopes))
        .execute(&mut *tx)
        .await?;
    Ok(CreatedKey {
        tenant: tenant.to_owned(),
        tenant_id,
        key_id,
        api_key: key.secret,
        scopes: scope_names(scopes),
    })
}

/// Every tenant, deleted ones too, by name.
pub async fn list_tenants(pool: &PgPool) -> Result<Vec<Tenant>, TenantStoreError> {
    let tenants = sqlx::query_as::<_, Tenant>(
        "SELECT id AS tenant_id, name AS tenant, created_at, deleted_at FROM tenants ORDER BY name",
    )
    .fetch_all(pool)
    .await?;
    Ok(tenants)
}

/// The live tenant named `name`.
pub async fn tenant_by_name(pool: &PgPool, name: &str) -> Result<Tenant, TenantStoreError> {
    sqlx::query_as::<_, Tenant>(
        "SELECT id AS tenant_id, name AS tenant, created_at, deleted_at
           FROM tenants WHERE name = $1 AND deleted_at IS NULL",
    )
    .bind(name)
    .fetch_optional(pool)
    .await?
    .ok_or_else(|| TenantStoreError::NoSuchTenant(name.to_owned()))
}

/// Marks tenant `name` deleted: its keys stop working, its jobs stay.
pub async fn delete_tenant(pool: &PgPool, name: &str) -> Result<Tenant, TenantStoreError> {
    sqlx::query_as::<_, Tenant>(
        "UPDATE tenants SET deleted_at = now() WHERE name = $1 AND deleted_at IS NULL
         RETURNING id AS tenant_id, name AS tenant, created_at, deleted_at",
    )
    .bind(name)
    .fetch_optional(pool)
    .await?
    .ok_or_else(|| TenantStoreError::NoSuchTenant(name.to_owned()))
}

/// Sets how many days tenant `name`'s finished jobs are kept (`None`: the
/// deployment's `retention_days`; 0: for ever).
pub async fn set_retention(
    pool: &PgPool,
    name: &str,
    days: Option<u32>,
) -> Result<TenantRetention, TenantStoreError> {
    sqlx::query_as::<_, TenantRetention>(
        "UPDATE tenants SET retention_s = $2 * 86400
          WHERE name = $1 AND deleted_at IS NULL
      RETURNING name AS tenant, retention_s / 86400 AS retention_days",
    )
    .bind(name)
    .bind(days.map(i64::from))
    .fetch_optional(pool)
    .await?
    .ok_or_else(|| TenantStoreError::NoSuchTenant(name.to_owned()))
}

/// Sets tenant `name`'s weight (1 to [`MAX_WEIGHT`]); workers use it within
/// `pipeline::weights::REFRESH`.
pub async fn set_weight(
    pool: &PgPool,
    name: &str,
    weight: i32,
) -> Result<TenantWeight, TenantStoreError> {
    if !(1..=MAX_WEIGHT).contains(&weight) {
        return Err(TenantError::InvalidWeight.into());
    }
    sqlx::query_as::<_, TenantWeight>(
        "UPDATE tenants SET weight = $2 WHERE name = $1 AND deleted_at IS NULL
      RETURNING name AS tenant, weight",
    )
    .bind(name)
    .bind(weight)
    .fetch_optional(pool)
    .await?
    .ok_or_else(|| TenantStoreError::NoSuchTenant(name.to_owned()))
}

/// Tenant `name`, deleted before.
pub async fn deleted_tenant(pool: &PgPool, name: &str) -> Result<Tenant, TenantStoreError> {
    sqlx::query_as::<_, Tenant>(
        "SELECT id AS tenant_id, name AS tenant, created_at, deleted_at FROM tenants
          WHERE name = $1 AND deleted_at IS NOT NULL",
    )
    .bind(name)
    .fetch_optional(pool)
    .await?
    .ok_or_else(|| TenantStoreError::NoSuchTenant(name.to_owned()))
}

/// A new key for tenant `name` with `scopes`.
pub async fn create_key(
    pool: &PgPool,
    name: &str,
    scopes: &[Scope],
) -> Result<CreatedKey, TenantStoreError> {
    let tenant = tenant_by_name(pool, name).await?;
    let mut conn = pool.acquire().await?;
    insert_key(&mut conn, tenant.tenant_id, &tenant.tenant, scopes).await
}

/// Tenant `name`'s keys, revoked ones too, oldest first.
pub async fn list_keys(pool: &PgPool, name: &str) -> Result<Vec<ApiKey>, TenantStoreError> {
    let tenant = tenant_by_name(pool, name).await?;
    let keys = sqlx::query_as::<_, ApiKey>(
        "SELECT id AS key_id, prefix, scopes::text[] AS scopes, created_at, revoked_at
           FROM api_keys WHERE tenant_id = $1 ORDER BY created_at, id",
    )
    .bind(tenant.tenant_id)
    .fetch_all(pool)
    .await?;
    Ok(keys)
}

/// Revokes key `key_id` (again, harmlessly, if it was revoked already).
pub async fn revoke_key(pool: &PgPool, key_id: Uuid) -> Result<ApiKey, TenantStoreError> {
    sqlx::query_as::<_, ApiKey>(
        "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now()) WHERE id = $1
         RETURNING id AS key_id, prefix, scopes::text[] AS scopes, created_at, revoked_at",
    )
    .bind(key_id)
    .fetch_optional(pool)
    .await?
    .ok_or(TenantStoreError::NoSuchKey(key_id))
}

/// Who owns the live key whose hash is `hash`: `None` when no key has it, or
/// it is revoked, or its tenant is deleted.
pub async fn key_owner(pool: &PgPool, hash: &[u8]) -> Result<Option<KeyOwner>, StoreError> {
    type Row = (
        Uuid,
        String,
        Uuid,
        Vec<String>,
        Option<f64>,
        Option<i32>,
        Option<i32>,
    );
    let row: Option<Row> = sqlx::query_as(
        "SELECT t.id, t.name, k.id, k.scopes::text[],
                t.submit_rate_per_s, t.submit_burst, t.max_open_jobs
           FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
          WHERE k.secret_hash = $1 AND k.revoked_at IS NULL AND t.deleted_at IS NULL",
    )
    .bind(hash)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(
        |(tenant_id, tenant, key_id, scopes, rate, burst, max_open)| KeyOwner {
            tenant_id,
            tenant,
            key_id,
            scopes: scopes.iter().filter_map(|s| Scope::parse(s)).collect(),
            quota: QuotaOverrides {
                submit_rate_per_s: rate,
                submit_burst: burst,
                max_open_jobs: max_open,
            },
        },
    ))
}

/// Sets tenant `name`'s own quotas: each `Some` replaces that quota (`None`
/// inside it returns to the deployment's setting), each `None` leaves it.
pub async fn set_quota(
    pool: &PgPool,
    name: &str,
    rate: Option<Option<f64>>,
    burst: Option<Option<i32>>,
    max_open: Option<Option<i32>>,
) -> Result<TenantQuota, TenantStoreError> {
    let bad = rate.flatten().is_some_and(|r| !(r.is_finite() && r >= 0.0))
        || burst.flatten().is_some_and(|b| b < 1)
        || max_open.flatten().is_some_and(|m| m < 0);
    if bad {
        return Err(TenantError::InvalidQuota.into());
    }
    sqlx::query_as::<_, TenantQuota>(
        "UPDATE tenants
            SET submit_rate_per_s = CASE WHEN $2 THEN $3 ELSE submit_rate_per_s END,
                submit_burst = CASE WHEN $4 THEN $5 ELSE submit_burst END,
                max_open_jobs = CASE WHEN $6 THEN $7 ELSE max_open_jobs END
          WHERE name = $1 AND deleted_at IS NULL
      RETURNING name AS tenant, submit_rate_per_s, submit_burst, max_open_jobs",
    )
    .bind(name)
    .bind(rate.is_some())
    .bind(rate.flatten())
    .bind(burst.is_some())
    .bind(burst.flatten())
    .bind(max_open.is_some())
    .bind(max_open.flatten())
    .fetch_optional(pool)
    .await?
    .ok_or_else(|| TenantStoreError::NoSuchTenant(name.to_owned()))
}

/// A live tenant as its administrators and the deployment's operators see
/// it (`GET /v1/tenant`, `GET /v1/operator/tenants`): its own quotas (the
/// caller applies the deployment's defaults), what it uses, its keys and the
/// webhook endpoints its deliveries stopped going to.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Account {
    /// The tenant's id.
    pub tenant_id: Uuid,
    /// The tenant's name.
    pub tenant: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// Its own submit rate (`None`: the deployment's).
    pub submit_rate_per_s: Option<f64>,
    /// Its own burst.
    pub submit_burst: Option<i32>,
    /// Its own cap on open jobs.
    pub max_open_jobs: Option<i32>,
    /// Its own retention in seconds (`None`: the deployment's; 0: for ever).
    pub retention_s: Option<i64>,
    /// Jobs queued or running now (what `max_open_jobs` caps).
    pub open_jobs: i64,
    /// Every key it has had, oldest first.
    pub keys: sqlx::types::Json<Vec<ApiKey>>,
    /// Webhook endpoints disabled for it, most recent first.
    pub disabled_endpoints: sqlx::types::Json<Vec<DisabledEndpoint>>,
}

impl Account {
    /// The tenant's own quotas.
    pub fn quota(&self) -> QuotaOverrides {
        QuotaOverrides {
            submit_rate_per_s: self.submit_rate_per_s,
            submit_burst: self.submit_burst,
            max_open_jobs: self.max_open_jobs,
        }
    }
}

/// A webhook endpoint that deliveries stopped going to.
#[derive(Debug, Clone, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct DisabledEndpoint {
    /// The endpoint.
    pub url: String,
    /// When it was disabled.
    pub disabled_at: DateTime<Utc>,
    /// Why.
    pub reason: String,
}

/// The account of live tenant `tenant_id`, or of every live tenant with
/// `None` (by name).
pub async fn accounts(pool: &PgPool, tenant_id: Option<Uuid>) -> Result<Vec<Account>, StoreError> {
    Ok(sqlx::query_as::<_, Account>(
        "SELECT t.id AS tenant_id, t.name AS tenant, t.created_at,
                t.submit_rate_per_s, t.submit_burst, t.max_open_jobs, t.retention_s,
                (SELECT count(*) FROM extractions e
                  WHERE e.tenant_id = t.id AND e.status IN ('queued', 'running')) AS open_jobs,
                (SELECT COALESCE(json_agg(json_build_object(
                          'key_id', k.id, 'prefix', k.prefix, 'scopes', k.scopes,
                          'created_at', k.created_at, 'revoked_at', k.revoked_at)
                        ORDER BY k.created_at), '[]')
                   FROM api_keys k WHERE k.tenant_id = t.id) AS keys,
                (SELECT COALESCE(json_agg(json_build_object(
                          'url', w.url, 'disabled_at', w.disabled_at, 'reason', w.reason)
                        ORDER BY w.disabled_at DESC), '[]')
                   FROM webhook_endpoints w WHERE w.tenant_id = t.id) AS disabled_endpoints
           FROM tenants t
          WHERE t.deleted_at IS NULL AND ($1::uuid IS NULL OR t.id = $1)
          ORDER BY t.name",
    )
    .bind(tenant_id)
    .fetch_all(pool)
    .await?)
}

/// Every live tenant's weight that is not the default 1.
pub async fn weights(pool: &PgPool) -> Result<Vec<(Uuid, i32)>, StoreError> {
    let rows =
        sqlx::query_as("SELECT id, weight FROM tenants WHERE weight <> 1 AND deleted_at IS NULL")
            .fetch_all(pool)
            .await?;
    Ok(rows)
}
