//! Tasks that start at a given instant instead of at once.
//!
//! A hold's lease keeper first acts a third of the watchdog lease after the grant (its first
//! renewal), and a hand-over's confirmation a tenth of the waiter TTL after it (at most
//! 100 ms). Most holds
//! are over before either, yet spawning those tasks at the grant cost every `lock()` a task
//! and, on a multi-thread runtime, usually a wake-up of another worker thread: about 20-35 µs
//! of a 170 µs uncontended `lock()` on a 2-vCPU machine (`docs/performance.md`). Here they
//! are queued instead, and one timer task per client and runtime spawns each when it is due;
//! one released before then never runs.
//!
//! The timer task only has to wake when a task is due earlier than it already planned to
//! look, which a new hold of the usual lease never is: in steady state, acquiring and
//! releasing wakes nothing but the timer's own look, at least once a second. It exits when it
//! finds its queue empty, so an idle client keeps no task.
//!
//! Bounds: the queue holds one entry per task not yet started (per live hold, and per guard
//! of an unconfirmed hand-over); an aborted task leaves it at once.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::runtime::{self, Handle};
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::{sleep_until, Instant};

type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Tasks that start at a later instant, with no task of their own until then.
///
/// [`spawn_at`](Self::spawn_at) queues a future, and one timer task per runtime spawns it
/// when due; [`DeferredTask::abort`] takes it out of the queue before then. Spawning at once
/// and sleeping costs every such task a spawn, and on a multi-thread runtime usually a
/// wake-up of another worker thread, on the caller's path. The timer task only wakes for a
/// task due before it planned to look (it looks at least once a second), and exits when its
/// queue is empty. The core uses it for a hold's lease keeper and a hand-over's
/// confirmation; a backend can use it for work
/// that is usually called off, such as unsubscribing a channel some time after its last
/// watch. Each runtime has its own timer, so no runtime's tasks depend on another being
/// driven; tasks queued on a runtime that shuts down never run.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use fairlock::backend::Deferred;
/// use tokio::runtime::Handle;
/// use tokio::time::Instant;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let later = Arc::new(Deferred::default());
/// // Unsubscribe 2 s after the last watch, unless the channel is watched again before.
/// let unsubscribe = later.spawn_at(&Handle::current(), Instant::now() + Duration::from_secs(2), async {
///     // ... UNSUBSCRIBE
/// });
/// // Watched again: the work never runs, and no task was spawned for it.
/// unsubscribe.abort();
/// # }
/// ```
#[derive(Debug, Default)]
pub struct Deferred {
    queues: Mutex<HashMap<runtime::Id, Queue>>,
}

#[derive(Debug)]
struct Queue {
    /// By start instant, then order of arrival.
    tasks: BTreeMap<(Instant, u64), Arc<Slot>>,
    next_seq: u64,
    /// When the timer task will look next; a task due earlier must wake it.
    wakes_at: Instant,
    wake: Arc<Notify>,
}

/// A task from [`Deferred::spawn_at`]: not started yet, running, or aborted.
#[derive(Debug)]
pub struct DeferredTask {
    slot: Arc<Slot>,
}

#[derive(Debug)]
struct Slot {
    deferred: Arc<Deferred>,
    runtime: Handle,
    state: Mutex<State>,
}

enum State {
    Waiting {
        key: (Instant, u64),
        future: BoxFuture,
    },
    Running(AbortHandle),
    Aborted,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            State::Waiting { key, .. } => write!(f, "Waiting({:?})", key.0),
            State::Running(_) => f.write_str("Running"),
            State::Aborted => f.write_str("Aborted"),
        }
    }
}

impl Deferred {
    fn queues(&self) -> MutexGuard<'_, HashMap<runtime::Id, Queue>> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Spawns `future` on `runtime` at `at` (at once if `at` has passed), unless it is
    /// aborted first. Like `Handle::spawn`, dropping the returned handle detaches the task.
    pub fn spawn_at(
        self: &Arc<Self>,
        runtime: &Handle,
        at: Instant,
        future: impl Future<Output = ()> + Send + 'static,
    ) -> DeferredTask {
        let slot = Arc::new(Slot {
            deferred: self.clone(),
            runtime: runtime.clone(),
            state: Mutex::new(State::Aborted),
        });
        let mut state = slot.lock();
        let key = self.enqueue(&slot, at);
        *state = State::Waiting {
            key,
            future: Box::pin(future),
        };
        drop(state);
        DeferredTask { slot }
    }

    /// Puts `slot` in its runtime's queue, starting that runtime's timer task if it has none.
    fn enqueue(self: &Arc<Self>, slot: &Arc<Slot>, at: Instant) -> (Instant, u64) {
        let id = slot.runtime.id();
        let mut queues = self.queues();
        let (key, start_timer) = match queues.entry(id) {
            Entry::Occupied(mut entry) => {
                let queue = entry.get_mut();
                let key = (at, queue.next_seq);
                queue.next_seq += 1;
                queue.tasks.insert(key, slot.clone());
                if at < queue.wakes_at {
                    queue.wakes_at = at;
                    queue.wake.notify_one();
                }
                (key, false)
            }
            Entry::Vacant(entry) => {
                let key = (at, 0);
                entry.insert(Queue {
                    tasks: BTreeMap::from([(key, slot.clone())]),
                    next_seq: 1,
                    wakes_at: at,
                    wake: Arc::new(Notify::new()),
                });
                (key, true)
            }
        };
        drop(queues);
        if start_timer {
            // On a runtime that has shut down the timer is dropped at once, unpolled, and
            // its exit guard removes the queue again: nothing in it could run there anyway.
            drop(slot.runtime.spawn(run_timer(ExitGuard {
                deferred: self.clone(),
                id,
                armed: true,
            })));
        }
        key
    }

    /// Takes `key` out of its queue, if it is still there.
    fn dequeue(&self, id: runtime::Id, key: (Instant, u64)) -> Option<Arc<Slot>> {
        let mut queues = self.queues();
        queues.get_mut(&id)?.tasks.remove(&key)
    }
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Spawns the task if it still waits under `key` (it may have been aborted or moved
    /// earlier since the timer took it out of the queue).
    fn start(&self, key: (Instant, u64)) {
        let mut state = self.lock();
        *state = match std::mem::replace(&mut *state, State::Aborted) {
            State::Waiting { key: k, future } if k == key => {
                State::Running(self.runtime.spawn(future).abort_handle())
            }
            other => other,
        };
    }
}

impl DeferredTask {
    /// Stops the task: it never starts if it has not yet, and is aborted if it runs.
    pub fn abort(&self) {
        // Not called off only once started, and a started task stays `Running`.
        if !self.cancel() {
            if let State::Running(handle) = &*self.slot.lock() {
                handle.abort();
            }
        }
    }

    /// Calls the task off if it has not started yet; one that has goes on. Returns whether
    /// it was called off (or had been aborted before).
    pub fn cancel(&self) -> bool {
        let mut state = self.slot.lock();
        if matches!(&*state, State::Running(_)) {
            return false;
        }
        let old = std::mem::replace(&mut *state, State::Aborted);
        let removed = match &old {
            State::Waiting { key, .. } => self.slot.deferred.dequeue(self.slot.runtime.id(), *key),
            _ => None,
        };
        drop(state);
        // Dropped outside the locks: the future may own the last reference to something
        // whose drop aborts another deferred task.
        drop(removed);
        drop(old);
        true
    }

    /// Starts the task by `at` at the latest, if it has not started yet.
    pub fn start_by(&self, at: Instant) {
        let mut state = self.slot.lock();
        let State::Waiting { key, .. } = &mut *state else {
            return;
        };
        if at >= key.0 {
            return;
        }
        let removed = self.slot.deferred.dequeue(self.slot.runtime.id(), *key);
        *key = self.slot.deferred.enqueue(&self.slot, at);
        drop(state);
        drop(removed);
    }

    /// Whether the task has been spawned (it may have finished since).
    #[cfg(test)]
    pub(crate) fn is_started(&self) -> bool {
        matches!(&*self.slot.lock(), State::Running(_))
    }
}

/// The longest the timer sleeps: an idle timer (its queue emptied by aborts) exits within
/// this, and a busy one wakes at most this often for nothing.
const TIMER_CHECK: Duration = Duration::from_secs(1);

/// Removes its runtime's queue unless disarmed: a timer dropped without exiting on its own
/// (its runtime shut down, even before it ever ran) leaves nothing behind, and a later
/// `spawn_at` starts a new timer instead of trusting this one.
struct ExitGuard {
    deferred: Arc<Deferred>,
    id: runtime::Id,
    armed: bool,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        if self.armed {
            // Dropped outside the lock: the tasks in it may own what aborts other tasks.
            let removed = self.deferred.queues().remove(&self.id);
            drop(removed);
        }
    }
}

/// The timer task of one runtime's queue: spawns each task when it is due, and exits when
/// it finds the queue empty.
async fn run_timer(mut guard: ExitGuard) {
    let deferred = guard.deferred.clone();
    let id = guard.id;
    loop {
        let mut due = Vec::new();
        let next = {
            let mut queues = deferred.queues();
            let Some(queue) = queues.get_mut(&id) else {
                guard.armed = false;
                return;
            };
            let now = Instant::now();
            while let Some(entry) = queue.tasks.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                due.push(entry.remove_entry());
            }
            match queue.tasks.first_key_value() {
                Some((&(at, _), _)) => {
                    let at = at.min(now + TIMER_CHECK);
                    queue.wakes_at = at;
                    Some((at, queue.wake.clone()))
                }
                None => {
                    queues.remove(&id);
                    guard.armed = false;
                    None
                }
            }
        };
        for (key, slot) in due {
            slot.start(key);
        }
        let Some((at, wake)) = next else { return };
        tokio::select! {
            () = sleep_until(at) => {}
            () = wake.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    fn counter() -> (Arc<AtomicUsize>, impl Fn() -> BoxFuture) {
        let count = Arc::new(AtomicUsize::new(0));
        let counted = count.clone();
        let make = move || -> BoxFuture {
            let counted = counted.clone();
            Box::pin(async move {
                counted.fetch_add(1, Ordering::SeqCst);
            })
        };
        (count, make)
    }

    fn queued(deferred: &Deferred) -> usize {
        deferred.queues().values().map(|q| q.tasks.len()).sum()
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_starts_at_its_instant_and_not_before() {
        let deferred = Arc::new(Deferred::default());
        let (count, make) = counter();
        let start = Instant::now();
        let task = deferred.spawn_at(&Handle::current(), start + Duration::from_secs(10), make());
        tokio::time::sleep_until(start + Duration::from_millis(9_999)).await;
        assert_eq!(count.load(Ordering::SeqCst), 0, "started early");
        assert!(!task.is_started());
        tokio::time::sleep_until(start + Duration::from_secs(10)).await;
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert!(task.is_started());
        // The timer exits with its queue empty: nothing is left behind.
        tokio::task::yield_now().await;
        assert!(deferred.queues().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_aborted_task_never_starts_and_leaves_the_queue() {
        let deferred = Arc::new(Deferred::default());
        let (count, make) = counter();
        let start = Instant::now();
        let task = deferred.spawn_at(&Handle::current(), start + Duration::from_secs(1), make());
        let kept = deferred.spawn_at(&Handle::current(), start + Duration::from_secs(2), make());
        task.abort();
        assert_eq!(queued(&deferred), 1);
        tokio::time::sleep(Duration::from_secs(3)).await;
        tokio::task::yield_now().await;
        assert_eq!(count.load(Ordering::SeqCst), 1, "only the other task ran");
        assert!(kept.is_started());
        assert!(!task.is_started());
        task.abort(); // twice is harmless
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_whose_queue_was_emptied_by_aborts_exits_soon() {
        let deferred = Arc::new(Deferred::default());
        let (_, make) = counter();
        let before = Handle::current().metrics().num_alive_tasks();
        let task = deferred.spawn_at(
            &Handle::current(),
            Instant::now() + Duration::from_secs(3_600),
            make(),
        );
        tokio::task::yield_now().await; // the timer runs and sleeps
        assert_eq!(Handle::current().metrics().num_alive_tasks(), before + 1);
        task.abort();
        tokio::time::sleep(TIMER_CHECK).await;
        tokio::task::yield_now().await;
        assert!(deferred.queues().is_empty());
        assert_eq!(Handle::current().metrics().num_alive_tasks(), before);
    }

    #[tokio::test(start_paused = true)]
    async fn cancel_calls_off_a_waiting_task_but_not_a_started_one() {
        let deferred = Arc::new(Deferred::default());
        let started = Arc::new(Notify::new());
        let finish = Arc::new(Notify::new());
        let (finished, _) = counter();
        let task = {
            let (started, finish, done) = (started.clone(), finish.clone(), finished.clone());
            deferred.spawn_at(&Handle::current(), Instant::now(), async move {
                started.notify_one();
                finish.notified().await;
                done.fetch_add(1, Ordering::SeqCst);
            })
        };
        started.notified().await;
        assert!(!task.cancel(), "a started task goes on");
        finish.notify_one();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(finished.load(Ordering::SeqCst), 1);

        let (count, make) = counter();
        let waiting = deferred.spawn_at(
            &Handle::current(),
            Instant::now() + Duration::from_secs(1),
            make(),
        );
        assert!(waiting.cancel());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(count.load(Ordering::SeqCst), 0);
        assert_eq!(queued(&deferred), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_due_earlier_than_the_timer_planned_wakes_it() {
        let deferred = Arc::new(Deferred::default());
        let (count, make) = counter();
        let start = Instant::now();
        let late = deferred.spawn_at(&Handle::current(), start + Duration::from_secs(60), make());
        tokio::task::yield_now().await; // the timer now sleeps until the 60 s mark
        let early = deferred.spawn_at(&Handle::current(), start + Duration::from_secs(1), make());
        tokio::time::sleep(Duration::from_millis(1_001)).await;
        tokio::task::yield_now().await;
        assert!(early.is_started());
        assert!(!late.is_started());
        assert_eq!(count.load(Ordering::SeqCst), 1);
        // And moving one earlier does the same.
        late.start_by(start + Duration::from_secs(2));
        tokio::time::sleep(Duration::from_secs(1)).await;
        tokio::task::yield_now().await;
        assert!(late.is_started());
        assert_eq!(count.load(Ordering::SeqCst), 2);
        assert_eq!(queued(&deferred), 0);
    }

    #[test]
    fn a_runtime_that_shut_down_leaves_no_queue_and_another_gets_its_own_timer() {
        let deferred = Arc::new(Deferred::default());
        let (count, make) = counter();
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let stranded = first.block_on(async {
            let task = deferred.spawn_at(
                &Handle::current(),
                Instant::now() + Duration::from_secs(60),
                make(),
            );
            tokio::task::yield_now().await; // the timer runs and sleeps
            task
        });
        drop(first);
        assert!(
            deferred.queues().is_empty(),
            "the dropped timer removed its queue"
        );
        assert!(!stranded.is_started());
        let second = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        second.block_on(async {
            let task = deferred.spawn_at(
                &Handle::current(),
                Instant::now() + Duration::from_secs(1),
                make(),
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
            tokio::task::yield_now().await;
            assert!(task.is_started());
        });
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_timer_dropped_before_it_ran_leaves_no_queue() {
        let deferred = Arc::new(Deferred::default());
        let (count, make) = counter();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let handle = runtime.handle().clone();
        let in_time = Instant::now() + Duration::from_secs(60);
        // Queued, and the runtime gone before its timer task was ever polled.
        let first = runtime.block_on(async { deferred.spawn_at(&handle, in_time, make()) });
        drop(runtime);
        assert!(deferred.queues().is_empty());
        // Queued on a runtime that had already shut down.
        let second = deferred.spawn_at(&handle, in_time, make());
        assert!(deferred.queues().is_empty());
        assert!(!first.is_started() && !second.is_started());
        assert_eq!(count.load(Ordering::SeqCst), 0);
    }
}
