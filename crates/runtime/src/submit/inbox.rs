//! A worker's inbox of delegated blocks: bounded, drained in batches by the worker, closed
//! when the worker exits.
//!
//! The queue is `crossbeam_queue::ArrayQueue` (bounded, lock-free, one slot per block); under
//! loom a mutex-guarded deque with the same bound stands in for it, so that the models check
//! this module's own protocol (back-pressure, batches, closing) around the queue.
//!
//! Closing: a submitter that pushes just as the worker exits must not leave its block behind
//! unserved, or its waiter would wait for ever. Both sides make a store, a `SeqCst` fence,
//! then a load (Dekker): the submitter pushes, then looks at `closed`; the worker sets
//! `closed`, then drains. At least one of them sees the other's store, so the block is either
//! drained by the worker or the submitter cancels it itself (the queue is multi-consumer, so
//! both draining at once is fine: each block is popped once).

use std::sync::Arc;

use super::block::Job;
use crate::sync::{fence, AtomicBool, Ordering};

/// Blocks a worker's inbox holds before submitters wait for room.
#[cfg(not(loom))]
pub(crate) const INBOX_BLOCKS: usize = 1024;
/// Small under loom, so that the models reach a full inbox.
#[cfg(loom)]
pub(crate) const INBOX_BLOCKS: usize = 1;

/// Blocks a worker serves before it looks at its mailbox again, so tasks are not starved.
pub(crate) const SERVE_BATCH: usize = 64;

pub(crate) type Request = Arc<dyn Job>;

pub(crate) struct Inbox {
    queue: Queue,
    closed: AtomicBool,
}

impl Inbox {
    pub(crate) fn new() -> Self {
        Inbox { queue: Queue::new(INBOX_BLOCKS), closed: AtomicBool::new(false) }
    }

    /// Queues `request`, calling `backoff` while the inbox is full (back-pressure: the
    /// inbox never grows), and serves the request itself as cancelled if the worker has
    /// exited. The caller then wakes the worker.
    pub(crate) fn push(&self, mut request: Request, mut backoff: impl FnMut()) {
        loop {
            match self.queue.push(request) {
                Ok(()) => break,
                Err(back) => {
                    request = back;
                    if self.closed.load(Ordering::SeqCst) {
                        self.cancel_all();
                    } else {
                        backoff();
                    }
                }
            }
        }
        fence(Ordering::SeqCst);
        if self.closed.load(Ordering::Relaxed) {
            self.cancel_all();
        }
    }

    /// Whether a block waits (a cheap look: two loads, no fence).
    #[inline]
    pub(crate) fn has_requests(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Runs up to [`SERVE_BATCH`] waiting blocks, in the order they came; returns how many.
    pub(crate) fn serve(&self) -> usize {
        let mut served = 0;
        while served < SERVE_BATCH {
            let Some(request) = self.queue.pop() else { break };
            request.run();
            served += 1;
        }
        served
    }

    /// The worker exits: no block will be served from now on; those waiting are cancelled.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        self.cancel_all();
    }

    fn cancel_all(&self) {
        while let Some(request) = self.queue.pop() {
            request.cancel();
        }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        // Blocks still here were never served; their waiters learn so.
        self.cancel_all();
    }
}

#[cfg(not(loom))]
struct Queue(crossbeam_queue::ArrayQueue<Request>);

#[cfg(not(loom))]
impl Queue {
    fn new(capacity: usize) -> Self {
        Queue(crossbeam_queue::ArrayQueue::new(capacity))
    }

    #[inline]
    fn push(&self, request: Request) -> Result<(), Request> {
        self.0.push(request)
    }

    #[inline]
    fn pop(&self) -> Option<Request> {
        self.0.pop()
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(loom)]
struct Queue {
    blocks: loom::sync::Mutex<std::collections::VecDeque<Request>>,
    capacity: usize,
}

#[cfg(loom)]
impl Queue {
    fn new(capacity: usize) -> Self {
        Queue { blocks: loom::sync::Mutex::new(std::collections::VecDeque::new()), capacity }
    }

    fn push(&self, request: Request) -> Result<(), Request> {
        let mut blocks = self.blocks.lock().unwrap();
        if blocks.len() == self.capacity {
            return Err(request);
        }
        blocks.push_back(request);
        Ok(())
    }

    fn pop(&self) -> Option<Request> {
        self.blocks.lock().unwrap().pop_front()
    }

    fn is_empty(&self) -> bool {
        self.blocks.lock().unwrap().is_empty()
    }
}
