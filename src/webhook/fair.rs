//! Each tenant's share of a dispatcher's attempts. An attempt can hold its
//! slot for the whole webhook timeout (plus a DNS lookup), so without a
//! share one tenant whose endpoint is a tarpit held every slot and every
//! other tenant's deliveries waited behind it. A tenant has at most
//! `per_tenant` attempts under way in a process; its further deliveries wait
//! in its own queue, in order, and start as its attempts end.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use uuid::Uuid;

/// A delivery to attempt, and the tenant whose job it announces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The delivery's id (its `webhook-id`).
    pub id: String,
    /// The job's tenant.
    pub tenant: Uuid,
}

/// The tenants' attempts under way and their queues.
pub struct Shares {
    per_tenant: usize,
    /// Most deliveries waiting in all queues; past it a delivery is left to
    /// the reaper (it stays pending in the outbox).
    most_waiting: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    tenants: HashMap<Uuid, Tenant>,
    waiting: usize,
}

#[derive(Default)]
struct Tenant {
    running: usize,
    queue: VecDeque<String>,
    queued: HashSet<String>,
}

impl Shares {
    /// At most `per_tenant` attempts of one tenant at once, and
    /// `most_waiting` deliveries waiting in all.
    pub fn new(per_tenant: usize, most_waiting: usize) -> Self {
        Self {
            per_tenant: per_tenant.max(1),
            most_waiting,
            state: Mutex::default(),
        }
    }

    /// Whether `due` may start now (its tenant has a share free, now taken);
    /// if not it waits in its tenant's queue (once), or is left to the reaper
    /// when every queue is full.
    pub fn start(&self, due: &Due) -> bool {
        let mut state = self.lock();
        let waiting = state.waiting;
        let tenant = state.tenants.entry(due.tenant).or_default();
        if tenant.running < self.per_tenant {
            tenant.running += 1;
            return true;
        }
        if waiting < self.most_waiting && tenant.queued.insert(due.id.clone()) {
            tenant.queue.push_back(due.id.clone());
            state.waiting += 1;
        } else {
            tracing::debug!(id = %due.id, "webhook waits for the reaper: its tenant's share is busy");
        }
        false
    }

    /// An attempt of `tenant` ended; the tenant's next waiting delivery, if
    /// any, to wake (it takes the share back when it starts).
    pub fn end(&self, tenant: Uuid) -> Option<Due> {
        let mut state = self.lock();
        let entry = state.tenants.get_mut(&tenant)?;
        entry.running = entry.running.saturating_sub(1);
        let next = entry.queue.pop_front();
        if let Some(id) = &next {
            entry.queued.remove(id);
        }
        if entry.running == 0 && entry.queue.is_empty() {
            state.tenants.remove(&tenant);
        }
        if next.is_some() {
            state.waiting -= 1;
        }
        next.map(|id| Due { id, tenant })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(id: &str, tenant: Uuid) -> Due {
        Due {
            id: id.into(),
            tenant,
        }
    }

    #[test]
    fn a_busy_tenant_waits_in_its_own_queue_and_others_start() {
        let (slow, other) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let shares = Shares::new(2, 100);
        assert!(shares.start(&due("a", slow)));
        assert!(shares.start(&due("b", slow)));
        assert!(!shares.start(&due("c", slow)));
        assert!(!shares.start(&due("c", slow)), "queued once");
        assert!(!shares.start(&due("d", slow)));
        assert!(shares.start(&due("x", other)));
        // Its queue, in order, as its attempts end.
        assert_eq!(shares.end(slow), Some(due("c", slow)));
        assert!(shares.start(&due("c", slow)));
        assert_eq!(shares.end(slow), Some(due("d", slow)));
        assert_eq!(shares.end(slow), None);
        assert_eq!(shares.end(other), None);
    }

    #[test]
    fn past_the_waiting_bound_a_delivery_is_left_to_the_reaper() {
        let tenant = Uuid::from_u128(1);
        let shares = Shares::new(1, 1);
        assert!(shares.start(&due("a", tenant)));
        assert!(!shares.start(&due("b", tenant)));
        assert!(!shares.start(&due("c", tenant)));
        assert_eq!(shares.end(tenant), Some(due("b", tenant)));
        assert!(shares.start(&due("b", tenant)));
        assert_eq!(shares.end(tenant), None, "c was never queued");
    }
}
