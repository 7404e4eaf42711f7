//! Postgres persistence for extraction jobs.
//!
//! Guarantees: every state change is one conditional statement whose `WHERE`
//! names its legal predecessors (`transitions`), so two racers are serialised by
//! the row lock and exactly one wins; the loser gets `None` and nothing changes.
//! Each winning transition is logged in `extraction_transitions` by that same
//! statement. Submits are idempotent per `Idempotency-Key` (`submit`).
//! Lease arithmetic always uses the database clock (`now()`), never the caller's.

/// The rows the open-bbox index holds (see the migration `hot_bbox_claim`):
/// a bbox refinement requested and not ended. Its columns are ones the bbox
/// claim and its lease renewals leave alone, which keeps those updates HOT. A
/// query for pending or running refinements names this condition, so the
/// planner can use that index.
macro_rules! bbox_open {
    () => {
        "status = 'succeeded' AND bbox_finished_at IS NULL"
    };
}

pub mod bulk;
pub mod census;
pub mod coalesce;
pub mod corrections;
pub mod documents;
mod error;
pub mod files;
pub mod held;
pub mod leases;
pub mod letters;
pub mod list;
pub mod orphans;
pub mod retention;
mod row;
pub mod slots;
pub(crate) mod submit;
pub mod tenants;
pub mod transitions;
pub mod webhooks;

pub use error::StoreError;
pub use row::{BboxRefinement, Claim, Extraction};

pub use submit::{
    by_keys, insert_each, insert_many, request_hash, submit, submit_with, Insert, NewExtraction,
    Refusal, SubmitError, Submitted,
};

use sqlx::postgres::{PgPool, PgPoolOptions};
use uuid::Uuid;

/// The migrations shipped in `migrations/`, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Opens a pool with `max_connections` connections.
pub async fn connect(database_url: &str, max_connections: u32) -> Result<PgPool, StoreError> {
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect(database_url)
        .await?;
    Ok(pool)
}

/// A pool that opens its connections when first used, so it can be made while
/// Postgres is away. A caller waits at most `acquire_timeout` for a connection.
pub fn connect_lazy(
    database_url: &str,
    max_connections: u32,
    acquire_timeout: std::time::Duration,
) -> Result<PgPool, StoreError> {
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        .connect_lazy(database_url)?;
    Ok(pool)
}

/// Applies every pending migration.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    MIGRATOR.run(pool).await
}

/// Reads one of tenant `tenant_id`'s extractions, with its request and
/// results: another tenant's job is `None`, as if it did not exist.
pub async fn get_for_tenant<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    tenant_id: Uuid,
    id: Uuid,
) -> Result<Option<Extraction>, StoreError> {
    let row = sqlx::query_as::<_, Extraction>(
        "SELECT * FROM extraction_rows WHERE id = $1 AND tenant_id = $2",
    )
    .bind(id)
    .bind(tenant_id)
    .fetch_optional(executor)
    .await?;
    Ok(row)
}

/// Reads one extraction, with its request and results, whoever owns it (for
/// the pipeline and the operator).
pub async fn get<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    id: Uuid,
) -> Result<Option<Extraction>, StoreError> {
    let row = sqlx::query_as::<_, Extraction>("SELECT * FROM extraction_rows WHERE id = $1")
        .bind(id)
        .fetch_optional(executor)
        .await?;
    Ok(row)
}
