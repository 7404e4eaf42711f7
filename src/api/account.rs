//! Who the caller is and what its tenant has: `GET /v1/me` (any key: the
//! tenant and the key's scopes, so a client can tell what it may show),
//! `GET /v1/tenant` (scope `admin`: the tenant's quotas in force and their
//! use, its keys, its disabled webhook endpoints), and the same for every
//! tenant at `GET /v1/operator/tenants` (scope `operator`).

use aide::axum::routing::get_with;
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::Serialize;

use super::describe;
use super::state::Api;
use super::ApiError;
use crate::auth::Caller;
use crate::domain::Scope;
use crate::store::tenants::{self, Account, ApiKey, DisabledEndpoint};

pub(super) fn routes() -> ApiRouter<Api> {
    ApiRouter::new()
        .api_route("/v1/me", get_with(me, describe_me))
        .api_route("/v1/tenant", get_with(tenant, describe_tenant))
        .api_route(
            "/v1/operator/tenants",
            get_with(every_tenant, describe_every_tenant),
        )
}

/// The caller: its tenant and what its key may do.
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "Me", deny_unknown_fields)]
pub(super) struct Me {
    /// The tenant's name.
    tenant: String,
    /// The key's scopes.
    scopes: Vec<&'static str>,
}

/// A tenant's quotas in force (its own, else the deployment's), its use, its
/// keys and its disabled webhook endpoints.
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "Tenant", deny_unknown_fields)]
pub(super) struct TenantView {
    /// The tenant's name.
    tenant: String,
    /// When it was created.
    created_at: DateTime<Utc>,
    /// Submits per second per `serve` process; null: no limit.
    submit_rate_per_s: Option<f64>,
    /// Submits at once before the rate applies.
    submit_burst: u32,
    /// Jobs queued or running at once; null: no cap.
    max_open_jobs: Option<i64>,
    /// Jobs queued or running now.
    open_jobs: i64,
    /// Days a finished job is kept; 0: for ever.
    retention_days: i64,
    /// Every key the tenant has had (never the key itself), oldest first.
    keys: Vec<ApiKey>,
    /// Webhook endpoints its deliveries stopped going to, latest first.
    disabled_endpoints: Vec<DisabledEndpoint>,
}

/// Every live tenant, by name.
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "TenantList", deny_unknown_fields)]
pub(super) struct TenantList {
    items: Vec<TenantView>,
}

impl TenantView {
    fn of(account: Account, api: &Api) -> Self {
        let quota = account.quota().over(api.settings.quota);
        let retention_s = account
            .retention_s
            .unwrap_or(i64::from(api.settings.retention_days) * 86_400);
        Self {
            tenant: account.tenant,
            created_at: account.created_at,
            submit_rate_per_s: quota.submit_rate_per_s,
            submit_burst: quota.submit_burst,
            max_open_jobs: quota.max_open_jobs,
            open_jobs: account.open_jobs,
            retention_days: retention_s / 86_400,
            keys: account.keys.0,
            disabled_endpoints: account.disabled_endpoints.0,
        }
    }
}

async fn me(caller: Caller) -> Json<Me> {
    Json(Me {
        tenant: caller.tenant.clone(),
        scopes: caller.scopes().iter().map(|s| s.as_str()).collect(),
    })
}

fn describe_me(op: TransformOperation<'_>) -> TransformOperation<'_> {
    describe::operation(
        op,
        "getMe",
        "tenant",
        "Who the key belongs to",
        "The key's tenant and its scopes (any key), so a client can tell what it may offer.",
    )
    .response_with::<200, Json<Me>, _>(|a| a.description("The caller."))
}

async fn tenant(caller: Caller, State(api): State<Api>) -> Result<Json<TenantView>, ApiError> {
    caller.require(Scope::Admin)?;
    let account = tenants::accounts(&api.pool, Some(caller.tenant_id))
        .await?
        .into_iter()
        .next()
        // The key was live a moment ago; its tenant was deleted since.
        .ok_or_else(|| ApiError::Unauthorized("the key's tenant was deleted".into()))?;
    Ok(Json(TenantView::of(account, &api)))
}

fn describe_tenant(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "getTenant",
        "tenant",
        "The tenant's quotas, keys and disabled webhook endpoints",
        "The caller's tenant (scope `admin`): its quotas in force (its own, else the \
         deployment's) and its open jobs against them, its retention, every key it has \
         had (prefix, scopes, created, revoked; never the key), and the webhook \
         endpoints its deliveries stopped going to.",
    );
    let op = op.response_with::<200, Json<TenantView>, _>(|a| a.description("The tenant."));
    describe::refusals(op, &[403])
}

async fn every_tenant(
    caller: Caller,
    State(api): State<Api>,
) -> Result<Json<TenantList>, ApiError> {
    caller.require(Scope::Operator)?;
    let accounts = tenants::accounts(&api.pool, None).await?;
    let items = accounts
        .into_iter()
        .map(|a| TenantView::of(a, &api))
        .collect();
    Ok(Json(TenantList { items }))
}

fn describe_every_tenant(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "listTenants",
        "operators",
        "Every tenant's quotas, keys and disabled webhook endpoints",
        "What `GET /v1/tenant` answers, for every live tenant by name (scope `operator`).",
    );
    let op = op.response_with::<200, Json<TenantList>, _>(|a| a.description("The tenants."));
    describe::refusals(op, &[403])
}
