//! The queue at a glance: `GET /v1/overview` (scope `read`) for the caller's
//! tenant and `GET /v1/operator/overview` (scope `operator`) for the whole
//! deployment. Each answers the open jobs counted now and the last hour's
//! census samples (one per `census_interval_s`, written by whichever process
//! took the census turn: `store::census`); the deployment's also answers the
//! open orphans by class.

use std::collections::BTreeMap;

use aide::axum::routing::get_with;
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::extract::State;
use axum::Json;
use schemars::JsonSchema;
use serde::Serialize;

use super::describe;
use super::state::Api;
use super::ApiError;
use crate::auth::Caller;
use crate::domain::Scope;
use crate::store::census::{self, Census, Sample};
use crate::store::orphans::OrphanClass;

pub(super) fn routes() -> ApiRouter<Api> {
    ApiRouter::new()
        .api_route(
            "/v1/overview",
            get_with(tenant_overview, describe_tenant_overview),
        )
        .api_route(
            "/v1/operator/overview",
            get_with(deployment_overview, describe_deployment_overview),
        )
}

/// The open jobs now, and the last hour's samples.
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "Overview", deny_unknown_fields)]
pub(super) struct Overview {
    /// Seconds between samples (`census_interval_s`).
    interval_s: f64,
    /// The open jobs, counted as this answer was made.
    now: Census,
    /// The last hour's samples, oldest first.
    samples: Vec<Sample>,
    /// The deployment's open orphans by class, as the latest sample found
    /// them; classes with none are left out (only in the operators'
    /// overview).
    #[serde(skip_serializing_if = "Option::is_none")]
    orphans: Option<Vec<OpenClass>>,
    /// Each consumer group's lag on its topic, as the latest sample read it
    /// (only in the operators' overview; empty when the broker did not
    /// answer the census in time).
    #[serde(skip_serializing_if = "Option::is_none")]
    lag: Option<Vec<GroupLag>>,
}

/// How far a consumer group is behind on its topic.
#[derive(Serialize, serde::Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(super) struct GroupLag {
    /// The group.
    group: String,
    /// Its topic.
    topic: String,
    /// Records past its committed offsets.
    lag: i64,
}

/// The open orphans of one class.
#[derive(Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(super) struct OpenClass {
    /// The class, 1 to 6 (the `class` label of the orphan metrics).
    class: i16,
    /// What it means.
    meaning: &'static str,
    /// How many were open.
    open: i64,
}

async fn tenant_overview(
    caller: Caller,
    State(api): State<Api>,
) -> Result<Json<Overview>, ApiError> {
    caller.require(Scope::Read)?;
    let pool = &api.pool;
    let (now, samples) = tokio::try_join!(
        census::count_tenant(pool, caller.tenant_id),
        census::samples(pool, Some(caller.tenant_id)),
    )?;
    Ok(Json(Overview {
        interval_s: api.settings.census_interval.as_secs_f64(),
        now,
        samples,
        orphans: None,
        lag: None,
    }))
}

fn describe_tenant_overview(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "getOverview",
        "tenant",
        "The tenant's queue at a glance",
        "The caller's tenant's open jobs counted now (scope `read`), and the last \
         hour's census samples: one per `census_interval_s`, each with the jobs open \
         then, the oldest due job's wait, and the jobs submitted and finished since the \
         sample before.",
    );
    let op = op.response_with::<200, Json<Overview>, _>(|a| {
        a.description("The open jobs and the samples.")
    });
    describe::refusals(op, &[403])
}

async fn deployment_overview(
    caller: Caller,
    State(api): State<Api>,
) -> Result<Json<Overview>, ApiError> {
    caller.require(Scope::Operator)?;
    let pool = &api.pool;
    let (now, samples, (orphans, lag)) = tokio::try_join!(
        census::count(pool),
        census::samples(pool, None),
        census::latest_orphans_and_lag(pool),
    )?;
    let lag = lag
        .and_then(|l| serde_json::from_value(l).ok())
        .unwrap_or_default();
    let counts: BTreeMap<String, i64> = orphans
        .and_then(|o| serde_json::from_value(o).ok())
        .unwrap_or_default();
    let orphans = OrphanClass::ALL
        .into_iter()
        .filter_map(|class| {
            let open = *counts.get(class.label())?;
            (open > 0).then_some(OpenClass {
                class: class.number(),
                meaning: class.meaning(),
                open,
            })
        })
        .collect();
    Ok(Json(Overview {
        interval_s: api.settings.census_interval.as_secs_f64(),
        now,
        samples,
        orphans: Some(orphans),
        lag: Some(lag),
    }))
}

fn describe_deployment_overview(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "getDeploymentOverview",
        "operators",
        "The deployment's queue at a glance",
        "The same for every tenant together (scope `operator`), with the open orphans \
         by class as the latest census found them.",
    );
    let op = op.response_with::<200, Json<Overview>, _>(|a| {
        a.description("The open jobs and the samples.")
    });
    describe::refusals(op, &[403])
}
