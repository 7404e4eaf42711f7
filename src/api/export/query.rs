//! Query parameters: what a stream asks for, checked before the upgrade.

use std::collections::HashSet;

use serde::Deserialize;
use uuid::Uuid;

use crate::api::ApiError;
use crate::auth::Caller;
use crate::config::Backpressure;
use crate::events::ExtractionEvent;

use super::MAX_GROUP_LEN;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Params {
    group: Option<String>,
    strategy: Option<String>,
    ack: Option<String>,
    status: Option<String>,
    transition: Option<String>,
    from: Option<String>,
}

/// A stream's options, checked before the upgrade.
pub(super) struct Options {
    /// Who opened the stream: its key is looked up again while it runs.
    pub(super) caller: Caller,
    pub(super) group: GroupName,
    pub(super) strategy: Backpressure,
    pub(super) auto_ack: bool,
    pub(super) from_earliest: bool,
    pub(super) filter: Filter,
}

/// A stream's group: its tenant's name and the name the client chose.
#[derive(Debug)]
pub(super) struct GroupName {
    tenant: String,
    name: String,
}

impl GroupName {
    /// The Kafka group: `prefix`, the tenant, `.`, the name. Tenant names
    /// have no `.`, so the first `.` after the prefix ends the tenant, and
    /// two pairs never meet.
    pub(super) fn kafka(&self, prefix: &str) -> String {
        format!("{prefix}{}.{}", self.tenant, self.name)
    }

    /// The group this stream had before groups were joined with `.`: its
    /// commits are carried over to [`Self::kafka`] while that has none.
    pub(super) fn legacy(&self, prefix: &str) -> String {
        format!("{prefix}{}-{}", self.tenant, self.name)
    }
}

/// Which events a stream sends: its tenant's, and of those the ones the
/// client's filters admit (`None` admits all).
pub(super) struct Filter {
    tenant_id: Uuid,
    statuses: Option<HashSet<String>>,
    transitions: Option<HashSet<String>>,
}

impl Filter {
    pub(super) fn admits(&self, event: &ExtractionEvent) -> bool {
        let admits = |set: &Option<HashSet<String>>, value: &str| {
            set.as_ref().is_none_or(|set| set.contains(value))
        };
        event.belongs_to(self.tenant_id)
            && admits(&self.statuses, &event.status)
            && admits(&self.transitions, &event.transition)
    }
}

pub(super) fn options(
    params: Params,
    caller: &Caller,
    default_strategy: Backpressure,
) -> Result<Options, ApiError> {
    let bad = |msg: String| Err(ApiError::BadRequest(msg));
    let Some(group) = params.group else {
        return bad("the group parameter is required: it names the stream's consumer group".into());
    };
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if group.is_empty() || group.len() > MAX_GROUP_LEN || !group.chars().all(legal) {
        return bad(format!(
            "group must be 1 to {MAX_GROUP_LEN} characters of A-Z, a-z, 0-9, '.', '_' and '-'"
        ));
    }
    let strategy = match params.strategy.as_deref() {
        None => default_strategy,
        Some(name) => match name.parse() {
            Ok(strategy) => strategy,
            Err(why) => return bad(format!("strategy {why}")),
        },
    };
    let auto_ack = match params.ack.as_deref() {
        None | Some("client") => false,
        Some("auto") => true,
        Some(other) => return bad(format!("ack {other:?}: expected client or auto")),
    };
    let from_earliest = match params.from.as_deref() {
        None | Some("latest") => false,
        Some("earliest") => true,
        Some(other) => return bad(format!("from {other:?}: expected latest or earliest")),
    };
    let set = |list: Option<String>| {
        list.map(|l| {
            l.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
    };
    Ok(Options {
        caller: caller.clone(),
        // A group belongs to its tenant: equal names of two tenants are two groups.
        group: GroupName {
            tenant: caller.tenant.clone(),
            name: group,
        },
        strategy,
        auto_ack,
        from_earliest,
        filter: Filter {
            tenant_id: caller.tenant_id,
            statuses: set(params.status),
            transitions: set(params.transition),
        },
    })
}

#[cfg(test)]
mod tests {
    use axum::extract::Query;

    use crate::domain::Scope;

    use super::*;

    fn params(query: &str) -> Params {
        let uri: axum::http::Uri = format!("/v1/export?{query}").parse().unwrap();
        Query::<Params>::try_from_uri(&uri).unwrap().0
    }

    fn caller(tenant: &str) -> Caller {
        crate::store::tenants::KeyOwner {
            tenant_id: Uuid::now_v7(),
            tenant: tenant.into(),
            key_id: Uuid::now_v7(),
            scopes: vec![Scope::Export],
            quota: Default::default(),
        }
        .into()
    }

    #[test]
    fn options_are_checked_before_the_upgrade() {
        let acme = caller("acme");
        let ok = options(
            params("group=audit&strategy=drop_new&ack=auto&status=succeeded,failed&from=earliest"),
            &acme,
            Backpressure::Block,
        )
        .unwrap();
        assert_eq!(ok.strategy, Backpressure::DropNew);
        assert!(ok.auto_ack && ok.from_earliest);
        assert_eq!(ok.group.kafka("x-"), "x-acme.audit", "the tenant's group");
        assert_eq!(ok.group.legacy("x-"), "x-acme-audit", "its name before");
        assert_eq!(ok.filter.tenant_id, acme.tenant_id);
        assert_eq!(ok.filter.statuses.unwrap().len(), 2);
        let default = options(params("group=a"), &acme, Backpressure::Block).unwrap();
        assert_eq!(default.strategy, Backpressure::Block);
        assert!(!default.auto_ack && !default.from_earliest);
        for bad in [
            "",
            "group=",
            "group=a%20b",
            "group=a&strategy=fifo",
            "group=a&ack=never",
            "group=a&from=yesterday",
        ] {
            assert!(
                options(params(bad), &acme, Backpressure::Block).is_err(),
                "{bad:?} was accepted"
            );
        }
    }

    #[test]
    fn a_stream_admits_only_its_tenants_events() {
        let mut event = super::super::running_event("0");
        let (acme, other) = (Uuid::now_v7(), Uuid::now_v7());
        let filter = |tenant_id| Filter {
            tenant_id,
            statuses: None,
            transitions: None,
        };
        event.tenant_id = Some(acme.to_string());
        assert!(filter(acme).admits(&event));
        assert!(!filter(other).admits(&event));
        // Written before tenants: the tenant default's.
        event.tenant_id = None;
        assert!(!filter(acme).admits(&event));
        assert!(filter(crate::store::tenants::DEFAULT_TENANT_ID).admits(&event));
    }
}
