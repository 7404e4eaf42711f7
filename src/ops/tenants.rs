//! `docstream tenants …` and `docstream keys …`: the operator's hands on
//! tenants and API keys. Every command prints JSON, for scripts; a key's
//! secret is printed once, when it is made, and never again.

use clap::Subcommand;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

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
    /// Delete a tenant: its keys stop working within DOCSTREAM_API_KEY_CACHE_S
    /// on every process; its jobs stay, and its name is never reused.
    Delete {
        /// The tenant's name.
        name: String,
    },
}

/// `docstream keys …`
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create an API key for a tenant; prints the key, once.
    Create {
        /// The tenant's name.
        tenant: String,
        /// Comma-separated scopes: submit, read, cancel, export, admin.
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

fn json(value: &impl Serialize) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(value)? + "\n")
}

/// Runs a `tenants` command; its JSON output.
pub async fn tenants(pool: &PgPool, command: TenantsCommand) -> anyhow::Result<String> {
    match command {
        TenantsCommand::Create { name } => json(&tenants::create_tenant(pool, &name).await?),
        TenantsCommand::List => json(&tenants::list_tenants(pool).await?),
        TenantsCommand::Delete { name } => json(&tenants::delete_tenant(pool, &name).await?),
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
pub async fn keys(pool: &PgPool, command: KeysCommand) -> anyhow::Result<String> {
    match command {
        KeysCommand::Create { tenant, scopes } => {
            let scopes = Scope::parse_list(&scopes)?;
            json(&tenants::create_key(pool, &tenant, &scopes).await?)
        }
        KeysCommand::List { tenant } => json(&tenants::list_keys(pool, &tenant).await?),
        KeysCommand::Revoke { key_id } => json(&tenants::revoke_key(pool, key_id).await?),
    }
}
