//! Group commit for concurrent callers: requests that arrive while a statement
//! is running are gathered and run together as the next statement (a `_many`
//! transition), and each caller gets its own row's answer.
//!
//! Nothing waits to fill a batch: a lone request runs at once, alone. Under load
//! the requests that queue up behind the running statements form the next batch,
//! so one commit serves many jobs exactly when commits are the bottleneck.
//!
//! A request whose caller stopped waiting (a submit answered 503 at its
//! deadline) is dropped before it joins a batch: during a slow spell of the
//! database, the queue would otherwise fill with work nobody waits for, and
//! every new request would queue behind it.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::StoreError;

type Reply<O> = oneshot::Sender<Result<O, StoreError>>;

/// A handle to submit requests of type `I` answered with `O`. Cloning shares the
/// batcher; it stops once every handle is dropped.
pub struct Coalescer<I, O> {
    requests: mpsc::UnboundedSender<(I, Reply<O>)>,
}

impl<I, O> Clone for Coalescer<I, O> {
    fn clone(&self) -> Self {
        Self {
            requests: self.requests.clone(),
        }
    }
}

impl<I: Send + 'static, O: Send + 'static> Coalescer<I, O> {
    /// Starts a batcher that runs `statement` on up to `max_batch` requests at a
    /// time, with up to `concurrency` statements in flight. `statement` must
    /// answer every request, in order.
    pub fn spawn<F, Fut>(max_batch: usize, concurrency: usize, statement: F) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<O>, StoreError>> + Send + 'static,
    {
        let (requests, mut queue) = mpsc::unbounded_channel::<(I, Reply<O>)>();
        let statement = Arc::new(statement);
        let slots = Arc::new(Semaphore::new(concurrency.max(1)));
        tokio::spawn(async move {
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let Some(first) = queue.recv().await else {
                    return;
                };
                let mut batch = vec![first];
                while batch.len() < max_batch.max(1) {
                    match queue.try_recv() {
                        Ok(request) => batch.push(request),
                        Err(_) => break,
                    }
                }
                batch.retain(|(_, reply)| !reply.is_closed());
                if batch.is_empty() {
                    continue;
                }
                let (inputs, replies): (Vec<I>, Vec<Reply<O>>) = batch.into_iter().unzip();
                let statement = statement.clone();
                tokio::spawn(async move {
                    let _slot = slot;
                    match statement(inputs).await {
                        Ok(outputs) => {
                            debug_assert_eq!(outputs.len(), replies.len());
                            for (reply, output) in replies.into_iter().zip(outputs) {
                                let _ = reply.send(Ok(output));
                            }
                        }
                        Err(e) => {
                            for reply in replies {
                                let _ = reply.send(Err(e.clone()));
                            }
                        }
                    }
                });
            }
        });
        Self { requests }
    }

    /// Runs `input` in the next batch and returns its answer. A failed statement
    /// fails every request of its batch.
    pub async fn run(&self, input: I) -> Result<O, StoreError> {
        let (reply, answer) = oneshot::channel();
        let gone = || StoreError::from(sqlx::Error::PoolClosed);
        self.requests.send((input, reply)).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn concurrent_requests_share_statements_and_get_their_own_answers() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let doubler = Coalescer::spawn(64, 1, move |inputs: Vec<u32>| {
            seen.lock().unwrap().push(inputs.len());
            async move {
                tokio::task::yield_now().await;
                Ok(inputs.into_iter().map(|n| n * 2).collect())
            }
        });
        let answers = futures::future::join_all((0..200u32).map(|n| {
            let doubler = doubler.clone();
            async move { (n, doubler.run(n).await.unwrap()) }
        }))
        .await;
        assert!(answers.iter().all(|(n, doubled)| *doubled == n * 2));
        let sizes = sizes.lock().unwrap();
        assert_eq!(sizes.iter().sum::<usize>(), 200);
        assert!(sizes.iter().all(|&size| size <= 64));
        assert!(
            sizes.len() < 200,
            "no request shared a statement: {sizes:?}"
        );
    }

    #[tokio::test]
    async fn a_request_nobody_waits_for_is_not_run() {
        let ran = Arc::new(Mutex::new(Vec::new()));
        let seen = ran.clone();
        let (release, gate) = tokio::sync::watch::channel(false);
        let slow = Coalescer::spawn(8, 1, move |inputs: Vec<u32>| {
            seen.lock().unwrap().extend(inputs.iter().copied());
            let mut gate = gate.clone();
            async move {
                let _ = gate.wait_for(|open| *open).await;
                Ok(inputs)
            }
        });
        // The first request holds the only slot; the second is abandoned
        // while it waits, the third is not.
        let first = tokio::spawn({
            let slow = slow.clone();
            async move { slow.run(1).await }
        });
        tokio::task::yield_now().await;
        let abandoned = tokio::time::timeout(Duration::from_millis(10), slow.run(2)).await;
        assert!(abandoned.is_err());
        let third = tokio::spawn({
            let slow = slow.clone();
            async move { slow.run(3).await }
        });
        tokio::task::yield_now().await;
        release.send(true).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 1);
        assert_eq!(third.await.unwrap().unwrap(), 3);
        assert_eq!(*ran.lock().unwrap(), vec![1, 3]);
    }

    #[tokio::test]
    async fn a_failed_statement_fails_its_whole_batch() {
        let failing = Coalescer::spawn(8, 1, |_: Vec<u32>| async {
            Err::<Vec<u32>, _>(StoreError::from(sqlx::Error::RowNotFound))
        });
        let (a, b) = tokio::join!(failing.run(1), failing.run(2));
        assert!(a.is_err() && b.is_err());
    }
}
