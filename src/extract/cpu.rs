//! The bounded pool where CPU-bound work runs: the rule extractor and bbox
//! grounding. Work that may take long runs on blocking threads, never on the
//! async runtime, so a slow pattern on a large document cannot hold up
//! heartbeats (which keep the process's other claims) or the API (which
//! shares the runtime under `all`). At most `threads` jobs run there at once;
//! the others wait for a slot.
//!
//! Work too small to hold anything up runs where it is asked for instead:
//! handing a job to a blocking thread and back costs two thread wake-ups,
//! more than the whole rule extraction of a typical document (the benchmark
//! measured 55% more worker CPU per job with every job handed over). The
//! caller says how big the work is ([`INLINE_WORK_MAX`]).
//!
//! Each job has a deadline. The work checks it between steps (fields,
//! matches) and fails with [`ExtractError::DeadlineExceeded`] once it is
//! past; the caller also stops waiting at the deadline, so the job fails on
//! time even while one long regex search runs on. Such a search keeps its
//! thread and its slot until it ends (the regex engine's time is linear in
//! the text, so it does end), which is what keeps the pool bounded.
//!
//! Work that cannot check a deadline and need not end soon (parsing a PDF)
//! runs in a child process instead ([`CpuPool::run_apart`]): at the deadline
//! the process is killed and its slot is free at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::ExtractError;

/// The pool of one process.
#[derive(Debug, Clone)]
pub struct CpuPool {
    slots: Arc<Semaphore>,
}

/// When a job's time is up.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Option<Instant>,
    budget: Duration,
}

impl Deadline {
    /// A deadline that never comes, for callers with no budget (tools, tests).
    pub fn none() -> Self {
        Self {
            at: None,
            budget: Duration::MAX,
        }
    }

    /// `budget` from now.
    pub fn after(budget: Duration) -> Self {
        Self {
            at: Some(Instant::now() + budget),
            budget,
        }
    }

    /// Fails once the deadline has passed.
    pub fn check(&self) -> Result<(), ExtractError> {
        match self.at {
            Some(at) if Instant::now() >= at => Err(self.exceeded()),
            _ => Ok(()),
        }
    }

    /// How long is left until it, if it comes.
    pub fn left(&self) -> Option<Duration> {
        self.at
            .map(|at| at.saturating_duration_since(Instant::now()))
    }

    /// The error of work past this deadline.
    pub fn exceeded(&self) -> ExtractError {
        ExtractError::DeadlineExceeded(self.budget.as_secs_f64())
    }
}

/// The largest work that runs inline: bytes of text times the passes over
/// it (fields to find, values to ground). A regex pass over 64 KiB takes
/// well under a millisecond (tens of µs per KiB in the worst case), which the
/// runtime can spare between two polls of a heartbeat.
pub const INLINE_WORK_MAX: usize = 64 * 1024;

impl CpuPool {
    /// `threads` jobs at once (0: one per CPU).
    pub fn new(threads: usize) -> Self {
        let threads = match threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        Self {
            slots: Arc::new(Semaphore::new(threads)),
        }
    }

    /// Runs `work`, of `size` (bytes of text times passes over it), with a
    /// deadline `budget` away that it must check: at once on this thread if
    /// it is small ([`INLINE_WORK_MAX`]), else on a blocking thread once a
    /// slot is free. The budget starts when the work does, not while it
    /// waits for a slot.
    pub async fn run<T, F>(&self, budget: Duration, size: usize, work: F) -> Result<T, ExtractError>
    where
        T: Send + 'static,
        F: FnOnce(&Deadline) -> Result<T, ExtractError> + Send + 'static,
    {
        if size <= INLINE_WORK_MAX {
            return work(&Deadline::after(budget));
        }
        let slot = self.slot().await;
        let deadline = Deadline::after(budget);
        let task = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            work(&deadline)
        });
        // A little past the deadline, so work that checks it reports it
        // itself; past that, the job has failed whatever the thread does.
        let grace = Duration::from_millis(50);
        match tokio::time::timeout(budget + grace, task).await {
            Ok(Ok(result)) => result,
            Ok(Err(panicked)) => Err(ExtractError::Unavailable(format!(
                "extraction failed unexpectedly: {panicked}"
            ))),
            Err(_) => Err(deadline.exceeded()),
        }
    }

    /// Runs `work`, a future that drives a child process killed when the
    /// future is dropped, once a slot is free, with a deadline `budget` away
    /// (from when it starts). At the deadline the future is dropped, so
    /// the process is killed and the slot is free again at once.
    pub async fn run_apart<T, F, Fut>(&self, budget: Duration, work: F) -> Result<T, ExtractError>
    where
        F: FnOnce(Deadline) -> Fut,
        Fut: std::future::Future<Output = Result<T, ExtractError>>,
    {
        let _slot = self.slot().await;
        let deadline = Deadline::after(budget);
        match tokio::time::timeout(budget, work(deadline)).await {
            Ok(result) => result,
            Err(_) => Err(deadline.exceeded()),
        }
    }

    /// Slots free now.
    pub fn free_slots(&self) -> usize {
        self.slots.available_permits()
    }

    /// Runs `work` on a blocking thread once a slot is free, with no
    /// deadline: for work that is bounded on its own and must not be cut
    /// short, because what would follow it on the async runtime is worse
    /// (see `Submitter::learn_patterns`). A caller that stops waiting leaves
    /// it to finish; its slot is taken until then.
    pub async fn run_to_end<T, F>(&self, work: F) -> Result<T, ExtractError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let slot = self.slot().await;
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            work()
        })
        .await
        .map_err(|panicked| {
            ExtractError::Unavailable(format!("extraction failed unexpectedly: {panicked}"))
        })
    }

    /// Waits for a free slot.
    async fn slot(&self) -> tokio::sync::OwnedSemaphorePermit {
        (self.slots.clone().acquire_owned().await).expect("the pool's semaphore is never closed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Work big enough for a blocking thread.
    const LARGE: usize = INLINE_WORK_MAX + 1;

    #[tokio::test]
    async fn small_work_runs_on_the_calling_thread_and_large_work_does_not() {
        let pool = CpuPool::new(1);
        let here = std::thread::current().id();
        let budget = Duration::from_secs(1);
        let thread = |_: &Deadline| Ok(std::thread::current().id());
        assert_eq!(pool.run(budget, INLINE_WORK_MAX, thread).await, Ok(here));
        assert_ne!(pool.run(budget, LARGE, thread).await, Ok(here));
    }

    #[tokio::test]
    async fn work_past_its_deadline_fails_on_time_and_others_wait_for_a_slot() {
        let pool = CpuPool::new(1);
        let budget = Duration::from_millis(100);
        let started = Instant::now();
        // Ignores its deadline: the caller stops waiting all the same.
        let stuck = pool.run(budget, LARGE, |_| {
            std::thread::sleep(Duration::from_millis(400));
            Ok(())
        });
        assert_eq!(stuck.await, Err(ExtractError::DeadlineExceeded(0.1)));
        let waited = started.elapsed();
        assert!(waited < Duration::from_millis(300), "{waited:?}");
        // The one slot is still held by the stuck thread.
        let next = pool.run(budget, LARGE, |deadline| {
            deadline.check().map(|()| Instant::now())
        });
        let ran_at = next.await.unwrap();
        assert!(ran_at - started >= Duration::from_millis(400));
    }

    #[tokio::test]
    async fn a_child_past_its_deadline_is_killed_and_gives_its_slot_back() {
        let pool = CpuPool::new(1);
        let budget = Duration::from_millis(200);
        let (pid_tx, pid_rx) = std::sync::mpsc::channel();
        let stuck = pool.run_apart(budget, |_| async move {
            let mut child = tokio::process::Command::new("sleep")
                .arg("600")
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            pid_tx.send(child.id().unwrap()).unwrap();
            child.wait().await.unwrap();
            Ok(())
        });
        assert_eq!(stuck.await, Err(ExtractError::DeadlineExceeded(0.2)));
        assert_eq!(pool.free_slots(), 1, "the slot is free once the job failed");
        // The process is gone: killed, and reaped by the runtime.
        let pid = pid_rx.recv().unwrap();
        let proc = format!("/proc/{pid}/stat");
        let killed = || {
            let state = std::fs::read_to_string(&proc).unwrap_or_default();
            state.is_empty() || state.split(' ').nth(2) == Some("Z")
        };
        let bound = Instant::now() + Duration::from_secs(5);
        while !killed() {
            assert!(Instant::now() < bound, "the stuck process is still running");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let next = pool.run_apart(budget, |_| async { Ok(Instant::now()) });
        assert!(next.await.is_ok());
    }

    #[tokio::test]
    async fn work_that_checks_its_deadline_reports_it() {
        let pool = CpuPool::new(2);
        let checking = pool.run(Duration::from_millis(50), LARGE, |deadline| loop {
            deadline.check()?;
            std::thread::sleep(Duration::from_millis(5));
        });
        let outcome: Result<(), _> = checking.await;
        assert_eq!(outcome, Err(ExtractError::DeadlineExceeded(0.05)));
    }
}
