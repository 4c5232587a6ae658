//! Wake-ups: one listening connection per backend fans notifications out to local waiters.
//!
//! The SQL functions `pg_notify` one channel per schema (`<schema>_wake`), inside their
//! transaction, so a notification is sent only if the change it announces commits. Payloads:
//! `G <token> <attempt> <owner>\n<lock name>` (the lock was handed to that attempt),
//! `R <owner>\n<lock name>` (look again) and `A\n<lock name>` (every waiter of the lock looks
//! again: more dead waiters stand in front than one call clears). Owners contain no control
//! characters, so the first
//! newline ends the owner and the rest, newlines included, is the lock's name. A payload is at
//! most about 830 bytes (512-byte names, 256-byte owners), far below the 8000-byte limit.
//!
//! The connection `LISTEN`s from the moment the backend is built, whatever the number of locks
//! and waiters; locally, `(lock, owner)` maps to the watches of this process. When the
//! connection breaks (the server restarted, `pg_terminate_backend`, a network fault) it is
//! made again with a backoff and `LISTEN`s again, and every local watch is told to look
//! (`Recheck`): notifications sent meanwhile are lost, and this costs a waiter one round trip
//! instead of one heartbeat.

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use fairlock::backend::{Grant, Wake, WakeSender, Watch};
use tokio::sync::watch;
use tokio_postgres::{AsyncMessage, NoTls};

/// The longest pause between two attempts to make the listening connection again.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

type Key = (String, String);

/// Routes notifications to the [`Watch`]es of this process.
#[derive(Debug)]
pub(crate) struct Dispatcher {
    watches: Mutex<HashMap<Key, Vec<WakeSender>>>,
    /// Whether the connection is listening now (for `wait_listening`).
    listening: watch::Sender<bool>,
    /// The listener task; aborted when the dispatcher is dropped.
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// Keeps a watch registered; dropping it unregisters.
#[derive(Debug)]
struct Registration {
    dispatcher: Weak<Dispatcher>,
    key: Key,
}

impl Dispatcher {
    /// Starts listening on `channel` with its own connection made from `config`.
    pub(crate) fn start(config: tokio_postgres::Config, listen: String) -> Arc<Dispatcher> {
        let dispatcher = Arc::new(Dispatcher {
            watches: Mutex::new(HashMap::new()),
            listening: watch::channel(false).0,
            task: Mutex::new(None),
        });
        let task = tokio::spawn(listen_loop(Arc::downgrade(&dispatcher), config, listen));
        *dispatcher
            .task
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(task);
        dispatcher
    }

    /// Waits until the connection listens, at most `limit`; whether it does.
    pub(crate) async fn wait_listening(&self, limit: Duration) -> bool {
        let mut listening = self.listening.subscribe();
        tokio::time::timeout(limit, listening.wait_for(|up| *up))
            .await
            .is_ok_and(|up| up.is_ok())
    }

    /// Whether the connection listens now.
    pub(crate) fn is_listening(&self) -> bool {
        *self.listening.borrow()
    }

    fn watches(&self) -> MutexGuard<'_, HashMap<Key, Vec<WakeSender>>> {
        // The map stays consistent per operation even if a holder panicked.
        self.watches
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a watch of `owner` on lock `name`. The connection listens already (or is
    /// being made again, and will tell every watch to look when it is back), so a
    /// notification sent after this returns reaches the watch unless lost.
    pub(crate) fn watch(self: &Arc<Self>, name: &str, owner: &str) -> Watch {
        let (sender, watch) = Watch::channel();
        let key = (name.to_owned(), owner.to_owned());
        self.watches().entry(key.clone()).or_default().push(sender);
        watch.with_registration(Registration {
            dispatcher: Arc::downgrade(self),
            key,
        })
    }

    fn deliver(&self, payload: &str) {
        let Some((name, audience, wake)) = parse(payload) else {
            tracing::debug!(
                payload,
                "fairlock-postgres: ignoring an unknown notification"
            );
            return;
        };
        let mut watches = self.watches();
        let Some(owner) = audience else {
            // Rare (a mass death in front of a queue): a pass over this process's watches.
            watches.retain(|(lock, _), senders| {
                if lock == name {
                    senders.retain(|sender| sender.send(wake));
                }
                !senders.is_empty()
            });
            return;
        };
        let key = (name.to_owned(), owner.to_owned());
        if let Some(senders) = watches.get_mut(&key) {
            senders.retain(|sender| sender.send(wake));
            if senders.is_empty() {
                watches.remove(&key);
            }
        }
    }

    fn recheck_all(&self) {
        self.watches().retain(|_, senders| {
            senders.retain(|sender| sender.send(Wake::Recheck));
            !senders.is_empty()
        });
    }

    /// How many watches are registered (for tests of resource use).
    pub(crate) fn watch_count(&self) -> usize {
        self.watches().values().map(Vec::len).sum()
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        if let Some(task) = self
            .task
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(dispatcher) = self.dispatcher.upgrade() {
            let mut watches = dispatcher.watches();
            if let Some(senders) = watches.get_mut(&self.key) {
                senders.retain(|sender| !sender.is_closed());
                if senders.is_empty() {
                    watches.remove(&self.key);
                }
            }
        }
    }
}

/// Makes the listening connection, `LISTEN`s, and delivers its notifications; makes it again
/// whenever it breaks. Ends when the dispatcher is dropped (it aborts this task; the
/// connection closes with its client).
async fn listen_loop(dispatcher: Weak<Dispatcher>, config: tokio_postgres::Config, listen: String) {
    let mut pause = Duration::from_millis(50);
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut connection)) => {
                // The connection must be polled for the LISTEN to complete, and for
                // notifications: drive it in this task while the LISTEN runs.
                let mut notifications = Vec::new();
                let listened = {
                    let listen_call = client.batch_execute(&listen);
                    tokio::pin!(listen_call);
                    loop {
                        tokio::select! {
                            result = &mut listen_call => break result.is_ok(),
                            message = poll_fn(|cx| connection.poll_message(cx)) => match message {
                                Some(Ok(AsyncMessage::Notification(n))) => {
                                    notifications.push(n.payload().to_owned());
                                }
                                Some(Ok(_)) => {}
                                Some(Err(_)) | None => break false,
                            },
                        }
                    }
                };
                if listened {
                    let Some(live) = dispatcher.upgrade() else {
                        return;
                    };
                    pause = Duration::from_millis(50);
                    live.listening.send_replace(true);
                    // Notifications sent before this LISTEN (while the connection was down,
                    // or not made yet) are lost: every watch registered by then looks.
                    live.recheck_all();
                    for payload in notifications.drain(..) {
                        live.deliver(&payload);
                    }
                    drop(live);
                    loop {
                        match poll_fn(|cx| connection.poll_message(cx)).await {
                            Some(Ok(AsyncMessage::Notification(n))) => {
                                let Some(live) = dispatcher.upgrade() else {
                                    return;
                                };
                                live.deliver(n.payload());
                            }
                            Some(Ok(_)) => {}
                            Some(Err(error)) => {
                                tracing::debug!(%error, "fairlock-postgres: the listening connection broke");
                                break;
                            }
                            None => break,
                        }
                    }
                    drop(client);
                    let Some(live) = dispatcher.upgrade() else {
                        return;
                    };
                    live.listening.send_replace(false);
                    // Whatever was sent from now on until the next LISTEN is lost.
                    live.recheck_all();
                }
            }
            Err(error) => {
                tracing::debug!(%error, "fairlock-postgres: cannot make the listening connection; retrying");
            }
        }
        if dispatcher.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_BACKOFF);
    }
}

/// `G <token> <attempt> <owner>\n<name>`, `R <owner>\n<name>` or `A\n<name>`: (name, the owner
/// told, or `None` for every owner, wake).
fn parse(payload: &str) -> Option<(&str, Option<&str>, Wake)> {
    let (head, name) = payload.split_once('\n')?;
    if head == "A" {
        return Some((name, None, Wake::Recheck));
    }
    let (kind, rest) = head.split_once(' ')?;
    let (name, owner, wake) = match kind {
        "G" => {
            let (token, rest) = rest.split_once(' ')?;
            let (attempt, owner) = rest.split_once(' ')?;
            let wake = Wake::Granted {
                attempt: attempt.parse().ok()?,
                grant: Grant {
                    token: token.parse().ok()?,
                    hold_count: 1,
                },
            };
            (name, owner, wake)
        }
        "R" => (name, rest, Wake::Recheck),
        _ => return None,
    };
    Some((name, Some(owner), wake))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairlock::backend::AttemptId;

    #[test]
    fn parses_notifications() {
        let attempt = AttemptId::from_u128(0xab);
        assert_eq!(
            parse(&format!("G 17 {attempt} job 42\nlock\nwith lines")),
            Some((
                "lock\nwith lines",
                Some("job 42"),
                Wake::Granted {
                    attempt,
                    grant: Grant {
                        token: 17,
                        hold_count: 1
                    }
                }
            ))
        );
        assert_eq!(parse("R a b\nx"), Some(("x", Some("a b"), Wake::Recheck)));
        assert_eq!(parse("A\nx\ny"), Some(("x\ny", None, Wake::Recheck)));
        assert_eq!(parse("A b\nx"), None);
        assert_eq!(parse(&format!("G x {attempt} owner\nx")), None);
        assert_eq!(parse("G 17 not-an-attempt owner\nx"), None);
        assert_eq!(parse("G 17 owner\nx"), None);
        assert_eq!(parse("R owner"), None);
        assert_eq!(parse("hello"), None);
    }
}
