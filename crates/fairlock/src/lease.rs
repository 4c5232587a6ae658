//! Keeping a held lock's lease: watchdog renewal, confirming a hand-over, and the lost-lease
//! signal. One keeper task runs per guard.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{sleep_until, timeout_at, Instant};
use tracing::{debug, warn};

use crate::lock::LockShared;

/// What a guard knows about its lease; shared with its keeper task.
#[derive(Debug)]
pub(crate) struct LeaseState {
    /// `true` once the lease is known (or must be assumed) lost. Never goes back.
    lost: watch::Sender<bool>,
    /// The local instant by which the store's lease has surely not ended yet: the moment the
    /// last successful grant or extension was *sent*, plus its lease. The store started its
    /// lease later than that, so as long as the two clocks run at the same rate this is on the
    /// safe side, and no timestamp crosses between them.
    deadline: watch::Sender<Instant>,
}

impl LeaseState {
    pub(crate) fn new(deadline: Instant) -> Arc<Self> {
        Arc::new(LeaseState {
            lost: watch::Sender::new(false),
            deadline: watch::Sender::new(deadline),
        })
    }

    pub(crate) fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    pub(crate) fn mark_lost(&self, shared: &LockShared, why: &str) {
        if !self.lost.send_replace(true) {
            warn!(lock = %shared.name, owner = %shared.owner, why, "fairlock lease lost");
        }
    }

    /// Records a successful extension sent at `sent` for `lease`.
    pub(crate) fn extended(&self, sent: Instant, lease: Duration) {
        self.deadline.send_replace(sent + lease);
    }

    pub(crate) fn lost_receiver(&self) -> watch::Receiver<bool> {
        self.lost.subscribe()
    }
}

/// The keeper task of one guard. With a watchdog it renews every third of the lease; with a
/// fixed lease it only confirms a hand-over (if `confirm`) and then watches the deadline.
/// Either way it flags the lease lost when the deadline passes unrenewed or the store says
/// we are no longer the holder. Aborted when the guard is released.
pub(crate) async fn keep(
    shared: Arc<LockShared>,
    token: u64,
    state: Arc<LeaseState>,
    confirm: bool,
) {
    let watchdog = shared.options.lease.is_none();
    let lease = shared.options.effective_lease();
    let mut deadline_rx = state.deadline.subscribe();
    let now = Instant::now();
    let mut next_renewal = if confirm {
        Some(now)
    } else if watchdog {
        Some(now + lease / 3)
    } else {
        None
    };
    loop {
        let deadline = *deadline_rx.borrow_and_update();
        tokio::select! {
            _ = sleep_until(deadline) => {
                state.mark_lost(&shared, "the lease ran out before it was renewed");
                return;
            }
            _ = deadline_rx.changed() => {}
            _ = sleep_until(next_renewal.unwrap_or(deadline)), if next_renewal.is_some() => {
                let sent = Instant::now();
                let renewed = timeout_at(
                    deadline,
                    shared.backend.extend(&shared.name, &shared.owner, token, lease),
                )
                .await;
                match renewed {
                    Ok(Ok(true)) => {
                        debug!(lock = %shared.name, token, "fairlock lease renewed");
                        state.extended(sent, lease);
                        next_renewal = watchdog.then(|| sent + lease / 3);
                    }
                    Ok(Ok(false)) => {
                        state.mark_lost(&shared, "the store no longer lists this owner as holder");
                        return;
                    }
                    Ok(Err(err)) => {
                        warn!(lock = %shared.name, token, error = %err, "fairlock lease renewal failed; retrying");
                        // Retry well before the deadline, but do not hammer a failing store.
                        let pause = (lease / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
                        next_renewal = Some(Instant::now() + pause);
                    }
                    Err(_elapsed) => {
                        state.mark_lost(&shared, "renewal did not complete before the lease ended");
                        return;
                    }
                }
            }
        }
    }
}
