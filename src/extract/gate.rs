//! A semaphore whose waiters go in the worker's order (priority, then
//! tenants' shares: `domain::schedule`) rather than first come first
//! served. An extractor's calls wait at two of them: this process's slots
//! (`Limits`) and the turn to ask Postgres for a deployment-wide one
//! (`slots`). Without it, a worker that starts urgent work first would
//! still have it queue behind every call it started before.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::domain::schedule::{Scheduler, Weights};
use crate::domain::Lane;

/// `permits` holders at once; the others wait in order.
pub struct Gate {
    state: Mutex<State>,
}

struct State {
    free: usize,
    waiting: Scheduler<oneshot::Sender<()>>,
}

/// A permit, given back when dropped.
pub struct Pass<'a> {
    gate: &'a Gate,
}

/// A waiter that is dropped after its permit was sent passes it on.
struct Waiter<'a> {
    gate: &'a Gate,
    rx: Option<oneshot::Receiver<()>>,
}

impl Gate {
    /// A gate of `permits`, ordering its waiters by priority (none passed
    /// over for longer than `max_wait`) and tenants' `weights`.
    pub fn new(permits: usize, max_wait: Duration, weights: Weights) -> Self {
        Self {
            state: Mutex::new(State {
                free: permits,
                waiting: Scheduler::new(max_wait, weights),
            }),
        }
    }

    /// Waits for a permit, in `lane`'s place in the order. Cancel-safe:
    /// dropped while waiting, it holds nothing.
    pub async fn enter(&self, lane: Lane) -> Pass<'_> {
        let rx = {
            let mut state = self.lock();
            if state.free > 0 {
                state.free -= 1;
                return Pass { gate: self };
            }
            let (tx, rx) = oneshot::channel();
            state.waiting.push(tx, 0, lane, Instant::now());
            rx
        };
        let mut waiter = Waiter {
            gate: self,
            rx: Some(rx),
        };
        let rx = waiter.rx.as_mut().expect("set just above");
        // The sender lives in the gate's queue until it is sent on.
        let _ = rx.await;
        waiter.rx = None;
        Pass { gate: self }
    }

    /// Hands a permit given back to the next waiter still waiting, or frees it.
    fn release(&self) {
        let mut state = self.lock();
        while let Some((next, _)) = state.waiting.pop(Instant::now()) {
            if next.send(()).is_ok() {
                return;
            }
        }
        state.free += 1;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("gate lock")
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.gate.release();
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            // Sent before the close: the permit is ours, so pass it on.
            if rx.try_recv().is_ok() {
                self.gate.release();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use uuid::Uuid;

    use super::*;
    use crate::domain::Priority;

    fn lane(priority: Priority) -> Lane {
        Lane::new(Uuid::nil(), priority)
    }

    #[tokio::test]
    async fn waiters_go_in_priority_order_and_a_dropped_one_passes_its_permit_on() {
        let gate = Arc::new(Gate::new(1, Duration::from_secs(60), Weights::default()));
        let first = gate.enter(lane(Priority::Normal)).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for (name, priority) in [
            ("low", Priority::Low),
            ("gone", Priority::High),
            ("normal", Priority::Normal),
            ("high", Priority::High),
        ] {
            let (gate, order) = (gate.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let _pass = gate.enter(lane(priority)).await;
                order.lock().unwrap().push(name);
                tokio::task::yield_now().await;
            }));
            tokio::task::yield_now().await;
        }
        // "gone" gives up before its turn; "high" then goes first.
        waiters.remove(1).abort();
        tokio::task::yield_now().await;
        drop(first);
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["high", "normal", "low"]);
        // Every permit came back.
        let _again = gate.enter(lane(Priority::Low)).await;
    }
}
