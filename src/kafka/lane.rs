//! Which line a job's record waits in at its worker: its tenant and its
//! priority, carried in two headers of every record that hands a job to a
//! stage's workers, so the consumer can order its waiting records without
//! decoding them. A record without them (produced before they existed)
//! waits with the normal priority, in a line of its own.

use uuid::Uuid;

use super::record::Record;
use crate::domain::{Lane, Priority};

/// Header naming the job's tenant (its id, as text). Not `docstream-tenant`:
/// that one names the tenant of a Kafka intake record, which the intake reads.
pub const TENANT_HEADER: &str = "docstream-lane-tenant";
/// Header naming the job's priority (`high`, `normal`, `low`).
pub const PRIORITY_HEADER: &str = "docstream-lane-priority";

/// Takes the lane out of `record`'s headers (what a record waits holding is
/// memory: a worker may hold thousands): the lane they name, the default for
/// what they leave out or garble.
pub fn take_lane(record: &mut Record) -> Lane {
    let lane = lane_of(record);
    (record.headers).retain(|(name, _)| name != TENANT_HEADER && name != PRIORITY_HEADER);
    lane
}

/// The lane `record`'s headers name; the default for what they leave out or
/// garble.
pub fn lane_of(record: &Record) -> Lane {
    let text = |name| std::str::from_utf8(record.header(name)?).ok();
    Lane {
        tenant: text(TENANT_HEADER).and_then(|t| Uuid::parse_str(t).ok()),
        priority: text(PRIORITY_HEADER)
            .and_then(Priority::parse)
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(headers: &[(&str, &str)]) -> Record {
        Record {
            topic: "t".into(),
            partition: 0,
            offset: 0,
            key: None,
            payload: None,
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
                .collect(),
        }
    }

    #[test]
    fn a_record_names_its_lane_and_defaults_what_it_leaves_out() {
        let tenant = Uuid::now_v7();
        let tenant_text = tenant.to_string();
        let full = record(&[(TENANT_HEADER, &tenant_text), (PRIORITY_HEADER, "high")]);
        assert_eq!(lane_of(&full), Lane::new(tenant, Priority::High));
        let mut taken = full.clone();
        assert_eq!(take_lane(&mut taken), Lane::new(tenant, Priority::High));
        assert!(taken.headers.is_empty(), "{:?}", taken.headers);
        assert_eq!(lane_of(&record(&[])), Lane::default());
        let garbled = record(&[(TENANT_HEADER, "x"), (PRIORITY_HEADER, "urgent")]);
        assert_eq!(lane_of(&garbled), Lane::default());
    }
}
