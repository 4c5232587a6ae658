//! Wake-ups: one subscriber connection per backend (or shared by backends, when made elsewhere)
//! fans messages out to local waiters.
//!
//! Each lock has a channel, and each dispatcher (one per backend) one more per lock, the
//! lock's channel followed by `:<waker>`, a random id of the dispatcher that its waiters'
//! records name (see `lua/prelude.lua`). They are shard channels (`SSUBSCRIBE`) where the
//! server has sharded pub/sub, classic ones (`SUBSCRIBE`) on Redis 6.2; see [`crate::pubsub`].
//! Both kinds of message arrive on the subscriber's one message stream, named by their
//! channel. The scripts publish `G <token> <attempt> <owner>` when they hand the lock to that
//! attempt of `owner` and `R <owner>` when `owner` should look again, on the channel of the
//! waiter's process: a hand-over wakes that process alone, not every process waiting for the
//! lock. `A`, when every waiter should look (the lock is free but dead waiters in front are
//! still being cleared), goes on the lock's channel.
//! Locally, a lock maps to the watches of this process, by owner: every watch of the owner
//! gets the message, and the core tells its attempts apart. Both channels of a lock are
//! subscribed while it has at least one local watch. A subscriber made elsewhere may serve
//! several backends; a lock's channel is then theirs together (see [`SHARED`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use fairlock::backend::{AttemptId, Deferred, DeferredTask, Grant, Wake, WakeSender, Watch};
use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, ClusterInterface, EventInterface, PubsubInterface};
use fred::types::cluster::ClusterRouting;
use fred::types::{ClusterHash, CustomCommand, Value};
use tokio::sync::broadcast::error::RecvError;

use crate::pubsub::{Detection, PubsubMode};

/// How long a channel stays subscribed after its last watch, unless configured.
pub(crate) const DEFAULT_LINGER: Duration = Duration::from_secs(2);

/// How often a process with waiters on a Cluster re-reads the slot map, to follow shard
/// channels that moved with their slot.
const TOPOLOGY_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How many rounds [`Dispatcher::resubscribe`] tries before leaving the rest to heartbeats.
const RESUBSCRIBE_TRIES: usize = 8;

/// After messages were dropped, waiters are sent to look at most this often: a recheck by
/// every waiter slows the next hand-overs, which could overflow the buffer again.
const LAG_RECHECK_INTERVAL: Duration = Duration::from_millis(500);

/// Routes published wake-ups to the [`Watch`]es of this process.
#[derive(Debug)]
pub(crate) struct Dispatcher {
    subscriber: SubscriberClient,
    /// This dispatcher's channel of each lock is the lock's channel followed by this suffix:
    /// `:` and the waker, random hex digits that acquire stores in its waiter record.
    own_suffix: String,
    /// Whether channels are subscribed with `SSUBSCRIBE` or `SUBSCRIBE`.
    pubsub: Arc<Detection>,
    channels: Mutex<HashMap<String, Channel>>,
    linger: Duration,
    /// Starts the unsubscribe of a channel without a watch when its linger is over: a
    /// dropped watch spawns nothing (a hand-over's grantee drops its watch as its `lock()`
    /// ends), and a channel watched again in time calls its unsubscribe off.
    later: Arc<Deferred>,
    /// The runtime the dispatcher was started on, where the unsubscribes run (a watch may be
    /// dropped on another runtime, or outside any).
    runtime: tokio::runtime::Handle,
    /// Whether a hand-over message is delivered as a grant; if not, as a cue to look.
    trust_grants: bool,
    /// One resubscription after a slot move at a time.
    resync: tokio::sync::Mutex<()>,
    /// The slot map the subscriber routed its subscriptions with, last time they were made.
    known_slots: Mutex<Option<SlotMap>>,
    /// This dispatcher's number in [`SHARED`] when its subscriber was made elsewhere: such a
    /// subscriber outlives the backend, so dropping the dispatcher unsubscribes its channels
    /// from it, and it may serve other backends too, so the lock channels go through
    /// [`SHARED`]. `None`: the subscriber is the backend's own, closed with it.
    shared_as: Option<u64>,
    /// Dropped with the dispatcher: its tasks stop then. They would otherwise wait for the
    /// next message or reconnection of a subscriber that outlives the backend.
    stop: tokio::sync::watch::Sender<()>,
}

/// Which node (by id) serves which slots.
type SlotMap = Vec<(u16, u16, String)>;

fn slot_map_of(routing: &ClusterRouting) -> SlotMap {
    routing
        .slots()
        .iter()
        .map(|range| (range.start, range.end, range.id.to_string()))
        .collect()
}

/// The number of hash slots of a Redis Cluster.
const HASH_SLOTS: usize = 16_384;

/// How many hash slots `slots` has served.
fn served(slots: &SlotMap) -> usize {
    slots
        .iter()
        .map(|(start, end, _)| usize::from(end.saturating_sub(*start)) + 1)
        .sum()
}

/// The slot whose node fred sends `subscriber`'s classic subscriptions to in a Cluster (see
/// fred's `cluster_hash_legacy_command`); ignored elsewhere.
fn classic_slot(subscriber: &SubscriberClient) -> u16 {
    fred::util::redis_keyslot(subscriber.id().as_bytes())
}

/// The cluster's slot map, read with `CLUSTER SLOTS` from the nodes `client` routes to, one
/// after the other until one answers with every slot served; failing that (a cluster that
/// runs with slots unserved, or nodes behind a change), the answer that serves the most, if
/// any does. A node removed from the cluster and reset answers with no slots at all, and
/// asking it alone (fred sends a command without a slot over one and the same connection)
/// would hide every later change.
async fn read_slot_map(client: &fred::clients::Client) -> Option<SlotMap> {
    let nodes = client.cached_cluster_state()?.unique_hash_slots();
    let mut best: Option<SlotMap> = None;
    for slot in nodes {
        let command = CustomCommand::new_static("CLUSTER", ClusterHash::Custom(slot), false);
        match client
            .custom::<Value, &str>(command, vec!["SLOTS"])
            .await
            .and_then(|reply| ClusterRouting::from_cluster_slots(reply, ""))
        {
            Ok(routing) => {
                let slots = slot_map_of(&routing);
                if served(&slots) == HASH_SLOTS {
                    return Some(slots);
                }
                if served(&slots) > best.as_ref().map_or(0, served) {
                    best = Some(slots);
                }
            }
            Err(error) => {
                tracing::debug!(%error, "fairlock-redis: reading the slot map failed");
            }
        }
    }
    best
}

/// The slot map `client` routes with.
fn slot_map(client: &impl ClusterInterface) -> Option<SlotMap> {
    client
        .cached_cluster_state()
        .map(|routing| slot_map_of(&routing))
}

#[derive(Debug, Default)]
/// A lock's channel, which also stands for this dispatcher's channel of the lock: the two are
/// subscribed and unsubscribed together.
struct Channel {
    /// Local watches of the lock; both channels are unsubscribed when this drops to 0.
    watches: usize,
    /// Whether the server has us subscribed to both. Its lock orders subscribing and
    /// unsubscribing them, so a late unsubscribe never undoes a newer subscribe.
    subscribed: Shared,
    senders: HashMap<String, Vec<WakeSender>>,
    /// While it has no watch: its unsubscribe, due when the linger is over.
    linger: Option<DeferredTask>,
}

/// The subscription state of a lock's two channels.
type Shared = Arc<ChannelState>;

#[derive(Debug, Default)]
struct ChannelState {
    /// Its lock orders the channels' subscribes and unsubscribes. In an `Arc`, so a
    /// subscribe's task can own its guard.
    state: Arc<tokio::sync::Mutex<Subscription>>,
    /// How many subscribes or unsubscribes of the channels failed. A watch that waited for
    /// the lock while one failed does not try again itself: with the server not answering,
    /// each queued watch would add a command timeout.
    failures: AtomicU64,
}

impl ChannelState {
    fn failed(&self) {
        self.failures.fetch_add(1, Ordering::AcqRel);
    }

    fn failures(&self) -> u64 {
        self.failures.load(Ordering::Acquire)
    }
}

#[derive(Debug, Default)]
struct Subscription {
    /// Whether the server has us subscribed to both channels.
    subscribed: bool,
    /// Whether a background task is trying to subscribe them after a failure: a watch then
    /// leaves it to that task. Otherwise each watch queued behind a failing subscribe would
    /// try it again in turn, and the k-th would wait k command timeouts.
    retrying: bool,
}

/// Keeps a watch registered; dropping it unregisters.
#[derive(Debug)]
struct Registration {
    dispatcher: Weak<Dispatcher>,
    channel: String,
}

impl Dispatcher {
    /// Starts dispatching the messages of `subscriber` (already connected), subscribing
    /// channels in the mode `pubsub` detects.
    pub(crate) fn start(
        subscriber: SubscriberClient,
        linger: Duration,
        pubsub: Arc<Detection>,
        trust_grants: bool,
        owns_subscriber: bool,
    ) -> Arc<Self> {
        // 64 random bits: processes need distinct channels, nothing more.
        let waker = format!("{:016x}", AttemptId::random().as_u128() as u64);
        let dispatcher = Arc::new(Dispatcher {
            own_suffix: format!(":{waker}"),
            subscriber,
            pubsub,
            channels: Mutex::new(HashMap::new()),
            linger,
            later: Arc::new(Deferred::default()),
            runtime: tokio::runtime::Handle::current(),
            trust_grants,
            resync: tokio::sync::Mutex::new(()),
            known_slots: Mutex::new(None),
            shared_as: (!owns_subscriber).then(|| NEXT_NUMBER.fetch_add(1, Ordering::Relaxed)),
            stop: tokio::sync::watch::Sender::new(()),
        });
        let mut messages = dispatcher.subscriber.message_rx();
        let weak = Arc::downgrade(&dispatcher);
        let mut stop = dispatcher.stop.subscribe();
        tokio::spawn(async move {
            let mut last_lag_recheck: Option<tokio::time::Instant> = None;
            loop {
                let received = tokio::select! {
                    biased;
                    received = messages.recv() => received,
                    _ = stop.changed() => return,
                };
                let Some(dispatcher) = weak.upgrade() else {
                    return;
                };
                match received {
                    Ok(message) => {
                        if let Some(payload) = message.value.as_str() {
                            // When this process heard of a hand-over: the benchmark's stage
                            // breakdown timestamps it (docs/performance.md).
                            tracing::trace!(
                                target: "fairlock_redis::wake",
                                channel = %message.channel,
                                payload = payload.as_ref(),
                                "wake-up received"
                            );
                            dispatcher.deliver(&message.channel, &payload);
                        }
                    }
                    // Messages were dropped: whoever missed one must look for itself. Waiters
                    // also heartbeat, so skipping a recheck only delays them (contract).
                    Err(RecvError::Lagged(dropped)) => {
                        let now = tokio::time::Instant::now();
                        if last_lag_recheck.is_none_or(|at| now - at >= LAG_RECHECK_INTERVAL) {
                            last_lag_recheck = Some(now);
                            tracing::debug!(
                                dropped,
                                "fairlock-redis: wake-ups dropped; rechecking"
                            );
                            dispatcher.recheck_all();
                        }
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        });
        let mut reconnects = dispatcher.subscriber.reconnect_rx();
        let weak = Arc::downgrade(&dispatcher);
        let mut stop = dispatcher.stop.subscribe();
        tokio::spawn(async move {
            loop {
                let received = tokio::select! {
                    received = reconnects.recv() => received,
                    _ = stop.changed() => return,
                };
                let Some(dispatcher) = weak.upgrade() else {
                    return;
                };
                match received {
                    Ok(_) | Err(RecvError::Lagged(_)) => {
                        // Messages sent while we were away are lost: have every waiter look
                        // at its lock, and subscribe our channels again; then once more, for
                        // what was published while resubscribing.
                        dispatcher.recheck_all();
                        // In a Cluster the subscriptions now go where the subscriber's
                        // routes say: the node to follow for classic ones (see `moved`).
                        dispatcher.note_subscriber_routes();
                        dispatcher.resubscribe().await;
                        dispatcher.recheck_all();
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        });
        dispatcher
    }

    /// Follows the Cluster's topology as the clients in `clients` learn it (each `MOVED`
    /// makes fred re-read the slots and report a change): when a slot moves to another node,
    /// that node's shard channels move with it, and the old node unsubscribes us with a
    /// `sunsubscribe` push that fred drops, so fred still believes us subscribed. After any
    /// change, every channel with watches is subscribed again (`SSUBSCRIBE` is idempotent, and
    /// fred follows the `MOVED` a stale route gets), then every waiter looks at its lock for
    /// what it may have missed. Classic channels are not bound to slots: nothing to do there.
    pub(crate) fn follow_topology<'c>(
        self: &Arc<Self>,
        clients: impl IntoIterator<Item = &'c fred::clients::Client>,
    ) {
        self.note_subscriber_routes();
        let mut first = None;
        for client in clients {
            first.get_or_insert_with(|| client.clone());
            let mut changes = client.cluster_change_rx();
            let client = client.clone();
            let weak = Arc::downgrade(self);
            let mut stop = self.stop.subscribe();
            tokio::spawn(async move {
                loop {
                    let received = tokio::select! {
                        received = changes.recv() => received,
                        _ = stop.changed() => return,
                    };
                    let Some(dispatcher) = weak.upgrade() else {
                        return;
                    };
                    match received {
                        Ok(_) | Err(RecvError::Lagged(_)) => {
                            dispatcher.topology_changed(slot_map(&client)).await;
                        }
                        Err(RecvError::Closed) => return,
                    }
                }
            });
        }
        if let Some(client) = first {
            self.check_topology_periodically(client);
        }
    }

    /// Reads the slot map every [`TOPOLOGY_CHECK_INTERVAL`] while this process has watches,
    /// with `CLUSTER SLOTS` over a connection `client` already has: a process whose waiters
    /// only wait issues no command that could meet a move, and the server's `sunsubscribe`
    /// push is dropped by fred, so without this its waiters would hear nothing until their
    /// next heartbeat.
    fn check_topology_periodically(self: &Arc<Self>, client: fred::clients::Client) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(TOPOLOGY_CHECK_INTERVAL).await;
                let Some(dispatcher) = weak.upgrade() else {
                    return;
                };
                let watched = dispatcher
                    .channels()
                    .values()
                    .any(|entry| entry.watches > 0);
                if !watched || dispatcher.pubsub.known().is_none() {
                    continue;
                }
                if let Some(slots) = read_slot_map(&client).await {
                    dispatcher.topology_changed(Some(slots)).await;
                }
            }
        });
    }

    /// Someone read the cluster's slot map (fred reports every re-read, changed or not). When
    /// it moved what the subscriptions stand on (see [`moved`](Self::moved)), the subscriber
    /// re-reads its own (its routes decide where a subscribe goes, and it drops its
    /// connections to nodes that left), every watched channel is subscribed again, and every
    /// waiter looks. The map recorded is the subscriber's: if it read a stale view from a node
    /// that had not heard of the move yet, the next check differs again and the subscriptions
    /// follow then. A map that serves no slot is no view of the cluster (a node that was
    /// removed and reset answers with one): it is ignored.
    async fn topology_changed(&self, slots: Option<SlotMap>) {
        let Some(mode) = self.pubsub.known() else {
            return;
        };
        let Some(slots) = slots.filter(|slots| !slots.is_empty()) else {
            return;
        };
        if !self.moved(mode, &slots) {
            return;
        }
        // One run at a time; a change seen while one runs is compared again after it: every
        // client of the pool reports the same move, and the run before may have followed it.
        let _running = self.resync.lock().await;
        if !self.moved(mode, &slots) {
            return;
        }
        if self.subscriber.sync_cluster().await.is_err() {
            return;
        }
        self.note_subscriber_routes();
        tracing::debug!("fairlock-redis: cluster slots moved; subscribing again");
        self.resubscribe().await;
        self.recheck_all();
    }

    /// Whether `slots`, the cluster's slot map now, moved what this dispatcher's subscriptions
    /// stand on. Shard channels live with their slots: any change may have moved a watched
    /// one. Classic channels are all on the node fred sends them to, the one serving the slot
    /// of the subscriber's id, and a classic message reaches every node of the cluster: they
    /// are lost only when that node leaves it (its slots resharded away, then `del-node`),
    /// after which no message reaches it, whether it keeps running or not. As long as it
    /// serves slots, subscribing again elsewhere would only double every message.
    fn moved(&self, mode: PubsubMode, slots: &SlotMap) -> bool {
        let known = self.known_slots();
        match mode {
            PubsubMode::Sharded => known.as_ref() != Some(slots),
            PubsubMode::Classic => {
                let slot = classic_slot(&self.subscriber);
                let subscribed_on = known.as_ref().and_then(|known| {
                    known
                        .iter()
                        .find(|(start, end, _)| (*start..=*end).contains(&slot))
                        .map(|(_, _, node)| node)
                });
                subscribed_on.is_none_or(|node| !slots.iter().any(|(_, _, id)| id == node))
            }
        }
    }

    /// Records the slot map the subscriber routes with now, as the one its subscriptions are
    /// (about to be) made with: `None` outside a Cluster.
    fn note_subscriber_routes(&self) {
        *self.known_slots.lock().unwrap_or_else(|e| e.into_inner()) = slot_map(&self.subscriber);
    }

    fn known_slots(&self) -> Option<SlotMap> {
        self.known_slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Subscribes again, one by one, every channel this process has watches on, after the
    /// subscriber connection was re-established (a new connection has no subscriptions).
    ///
    /// Not fred's `resubscribe_all()`: it sends `SUBSCRIBE` and `PSUBSCRIBE` even with nothing
    /// to subscribe, and their error replies can reach a `watch()` in flight, so a user's
    /// `lock()` failed on a reconnect. A channel that fails is tried again with a backoff; its
    /// waiters heartbeat meanwhile, so nothing is lost but latency.
    async fn resubscribe(&self) {
        let mut pause = Duration::from_millis(50);
        for _ in 0..RESUBSCRIBE_TRIES {
            let channels: Vec<(String, Shared)> = self
                .channels()
                .iter()
                .map(|(channel, entry)| (channel.clone(), entry.subscribed.clone()))
                .collect();
            let mut failed = 0;
            for (channel, subscribed) in channels {
                let mut state = subscribed.state.lock().await;
                // Removed or replaced since the snapshot (its linger ended, and perhaps a new
                // watch made it again): a new entry's own watch subscribes it, under the new
                // entry's lock. Subscribing here, under the old one, could land after the new
                // entry's unsubscribe and leave a subscription no entry stands for.
                let watched = match self.channels().get(&channel) {
                    Some(entry) if Arc::ptr_eq(&entry.subscribed, &subscribed) => entry.watches > 0,
                    _ => continue,
                };
                if !watched {
                    // Lingering with no watch: the new connection has no subscription for it,
                    // so a watch made during the linger must subscribe again.
                    state.subscribed = false;
                    continue;
                }
                match self.subscribe(&channel).await {
                    Ok(()) => state.subscribed = true,
                    Err(error) => {
                        tracing::debug!(%error, channel, "fairlock-redis: resubscribing failed; will retry");
                        subscribed.failed();
                        state.subscribed = false;
                        failed += 1;
                    }
                }
            }
            if failed == 0 {
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
        tracing::warn!("fairlock-redis: some wake-up channels could not be subscribed again; their waiters rely on heartbeats until the next watch or reconnect");
    }

    /// Subscribes `channel` with the command of the server's pub/sub mode (detecting it first
    /// if no one has yet).
    ///
    /// Returns once the server has the subscription. fred waits for `SSUBSCRIBE`'s reply, but
    /// answers a classic `SUBSCRIBE` as soon as it is written (the server's confirmation comes
    /// out of band): a message published right after could reach the server first and be
    /// lost. So a classic subscribe is followed by a `PING` on the same connection, whose
    /// reply comes after the server has run the `SUBSCRIBE`.
    ///
    /// `channel` is a lock's channel: this dispatcher's channel of the lock is subscribed
    /// first, so that once the lock's channel has a subscriber, both have.
    async fn subscribe(&self, channel: &str) -> Result<(), fred::error::Error> {
        let mode = self.pubsub.mode().await?;
        // One command each: fred waits for the reply to one channel only.
        let subscribe = |name: String| async move {
            match mode {
                PubsubMode::Sharded => self.subscriber.ssubscribe(name).await,
                PubsubMode::Classic => self.subscriber.subscribe(name).await,
            }
        };
        subscribe(self.own_channel(channel)).await?;
        match self.shared_as {
            None => subscribe(channel.to_owned()).await?,
            Some(number) => {
                SharedChannel::of(self.subscriber.id(), channel)
                    .join(number, subscribe(channel.to_owned()))
                    .await?
            }
        }
        if mode == PubsubMode::Classic {
            let slot = classic_slot(&self.subscriber);
            let ping = CustomCommand::new_static("PING", ClusterHash::Custom(slot), false);
            let _: Value = self.subscriber.custom(ping, Vec::<Value>::new()).await?;
        }
        Ok(())
    }

    /// Unsubscribes a lock's `channel` and this dispatcher's channel of the lock; nothing to do
    /// while the mode is unknown, since nothing was subscribed then.
    async fn unsubscribe(&self, channel: &str) -> Result<(), fred::error::Error> {
        let Some(mode) = self.pubsub.known() else {
            return Ok(());
        };
        let own = self.own_channel(channel);
        leave_channel(&self.subscriber, mode, self.shared_as, channel, own).await
    }

    /// This dispatcher's channel of the lock whose channel is `channel`.
    fn own_channel(&self, channel: &str) -> String {
        format!("{channel}{}", self.own_suffix)
    }

    /// The waker the scripts store for this dispatcher's waiters (see `lua/acquire.lua`).
    pub(crate) fn waker(&self) -> &str {
        &self.own_suffix[1..]
    }

    pub(crate) fn subscriber(&self) -> &SubscriberClient {
        &self.subscriber
    }

    /// The runtime the dispatcher was started on: the backend's.
    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    fn channels(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        // The map stays consistent per operation even if a holder panicked.
        self.channels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers `owner` on the lock whose channel is `channel`, subscribing the lock's two
    /// channels first if this is its first local watch. Returns once the server confirmed
    /// both subscriptions.
    pub(crate) async fn watch(
        self: &Arc<Self>,
        channel: &str,
        owner: &str,
    ) -> Result<Watch, fred::error::Error> {
        let (sender, watch) = Watch::channel();
        let (subscribed, lingering) = {
            let mut channels = self.channels();
            let entry = channels.entry(channel.to_owned()).or_default();
            entry.watches += 1;
            entry
                .senders
                .entry(owner.to_owned())
                .or_default()
                .push(sender);
            (entry.subscribed.clone(), entry.linger.take())
        };
        // Watched again within the linger: the channel stays subscribed. Called off outside
        // the map's lock (it drops the unsubscribe's future). One already started goes on:
        // it finds the watch, or unsubscribes before the subscribe below, which then
        // subscribes again; stopping it halfway could leave the flag wrong.
        if let Some(unsubscribe) = lingering {
            unsubscribe.cancel();
        }
        // Made before subscribing, so a failed subscribe unregisters on the way out.
        let registration = Registration {
            dispatcher: Arc::downgrade(self),
            channel: channel.to_owned(),
        };
        let shared = subscribed;
        let failures = shared.failures();
        let mut state = shared.state.clone().lock_owned().await;
        // Subscribed, or a background task retries: nothing for the watch to do.
        if state.subscribed || state.retrying {
            return Ok(watch.with_registration(registration));
        }
        // A subscribe or unsubscribe failed while this watch waited: the server is not
        // answering now, so the retries go to the background.
        if shared.failures() != failures {
            self.subscribe_later(channel.to_owned(), shared, state);
            return Ok(watch.with_registration(registration));
        }
        // In a task of its own that keeps the state's lock: a watch whose caller gives up (its
        // deadline) does not stop it halfway, so the watches queued behind it find it done,
        // rather than each starting it over.
        let (dispatcher, channel) = (self.clone(), channel.to_owned());
        let subscribing = self.runtime.spawn(async move {
            match dispatcher.subscribe(&channel).await {
                Ok(()) => state.subscribed = true,
                // The subscriber is reconnecting (or the server refuses for now). Wake-ups may
                // be lost (the waiter heartbeats), so the caller is not failed for it: the
                // subscription is retried in the background.
                Err(error) => {
                    tracing::debug!(%error, channel, "fairlock-redis: subscribing failed; retrying in the background");
                    shared.failed();
                    dispatcher.subscribe_later(channel, shared, state);
                }
            }
        });
        // Failing only if the runtime is shutting down; the watch stands either way.
        let _ = subscribing.await;
        Ok(watch.with_registration(registration))
    }

    /// Retries subscribing `channel` with a backoff while it has watches and is not
    /// subscribed. `shared` is the channel's state, and `state` its lock, held by the caller:
    /// the channel is marked as retried before the lock is let go, and the mark is cleared
    /// when the retries stop, so the next watch tries again.
    fn subscribe_later(
        self: &Arc<Self>,
        channel: String,
        shared: Shared,
        mut state: tokio::sync::OwnedMutexGuard<Subscription>,
    ) {
        state.retrying = true;
        drop(state);
        let weak = Arc::downgrade(self);
        // On the dispatcher's runtime: a watch's own may end before the task does, and a
        // task dropped unfinished would leave the channel marked as retried for good.
        self.runtime.spawn(async move {
            let mut pause = Duration::from_millis(50);
            for _ in 0..RESUBSCRIBE_TRIES {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
                let Some(dispatcher) = weak.upgrade() else {
                    return;
                };
                let mut state = shared.state.lock().await;
                // Still this channel's entry, still watched: the linger may have removed it
                // (subscribing then would leave an orphan).
                let current = dispatcher.channels().get(&channel).is_some_and(|entry| {
                    entry.watches > 0 && Arc::ptr_eq(&entry.subscribed, &shared)
                });
                if state.subscribed || !current {
                    state.retrying = false;
                    return;
                }
                match dispatcher.subscribe(&channel).await {
                    Ok(()) => {
                        state.subscribed = true;
                        state.retrying = false;
                        return;
                    }
                    Err(error) => {
                        tracing::debug!(%error, channel, "fairlock-redis: subscribing failed; will retry");
                        shared.failed();
                    }
                }
            }
            shared.state.lock().await.retrying = false;
            tracing::warn!(channel, "fairlock-redis: a wake-up channel could not be subscribed; its waiters rely on heartbeats");
        });
    }

    fn deliver(&self, channel: &str, payload: &str) {
        let Some((audience, mut wake)) = parse(payload) else {
            tracing::debug!(
                channel,
                payload,
                "fairlock-redis: ignoring an unknown message"
            );
            return;
        };
        if !self.trust_grants && matches!(wake, Wake::Granted { .. }) {
            wake = Wake::Recheck;
        }
        // This dispatcher's channel of a lock delivers to the lock's watches.
        let channel = channel.strip_suffix(&self.own_suffix).unwrap_or(channel);
        let mut channels = self.channels();
        let Some(entry) = channels.get_mut(channel) else {
            return;
        };
        match audience {
            Audience::Owner(owner) => {
                if let Some(senders) = entry.senders.get_mut(owner) {
                    senders.retain(|sender| sender.send(wake));
                }
            }
            Audience::Everyone => {
                for senders in entry.senders.values_mut() {
                    senders.retain(|sender| sender.send(wake));
                }
            }
        }
    }

    fn recheck_all(&self) {
        for entry in self.channels().values_mut() {
            for senders in entry.senders.values_mut() {
                senders.retain(|sender| sender.send(Wake::Recheck));
            }
        }
    }

    /// A watch on `channel` was dropped.
    fn unregister(self: Arc<Self>, channel: String) {
        let mut channels = self.channels();
        let Some(entry) = channels.get_mut(&channel) else {
            return;
        };
        entry.watches = entry.watches.saturating_sub(1);
        for senders in entry.senders.values_mut() {
            senders.retain(|sender| !sender.is_closed());
        }
        entry.senders.retain(|_, senders| !senders.is_empty());
        if entry.watches > 0 {
            return;
        }
        // Linger: a new watch meanwhile finds the channel subscribed and keeps it.
        let Some(due) = tokio::time::Instant::now().checked_add(self.linger) else {
            return; // a linger too long to count: never unsubscribed
        };
        // By a weak reference: a pending unsubscribe keeps no dropped backend alive.
        let (dispatcher, subscribed) = (Arc::downgrade(&self), entry.subscribed.clone());
        let unsubscribe = async move {
            if let Some(dispatcher) = dispatcher.upgrade() {
                dispatcher.unsubscribe_idle(channel, subscribed).await;
            }
        };
        entry.linger = Some(self.later.spawn_at(&self.runtime, due, unsubscribe));
    }

    /// Unsubscribes `channel` if it still has no watch (and the same subscription state).
    async fn unsubscribe_idle(self: Arc<Self>, channel: String, subscribed: Shared) {
        let mut guard = subscribed.state.lock().await;
        if !self.is_idle(&channel, &subscribed) {
            return;
        }
        // Even when the flag says unsubscribed: a subscribe stopped halfway (its runtime
        // shutting down) may have subscribed without recording it, and unsubscribing is
        // harmless anyway.
        if let Err(error) = self.unsubscribe(&channel).await {
            tracing::debug!(%error, channel, "fairlock-redis: unsubscribe failed");
            subscribed.failed();
        }
        guard.subscribed = false;
        let mut channels = self.channels();
        if self.is_idle_in(&channels, &channel, &subscribed) {
            channels.remove(&channel);
        }
    }

    fn is_idle(&self, channel: &str, subscribed: &Shared) -> bool {
        self.is_idle_in(&self.channels(), channel, subscribed)
    }

    fn is_idle_in(
        &self,
        channels: &HashMap<String, Channel>,
        channel: &str,
        subscribed: &Shared,
    ) -> bool {
        channels
            .get(channel)
            .is_some_and(|entry| entry.watches == 0 && Arc::ptr_eq(&entry.subscribed, subscribed))
    }
}

impl Drop for Dispatcher {
    /// Takes this dispatcher's channels off a subscriber made elsewhere, which outlives it:
    /// those lingering after their last watch, and any left with watches. The backend's own
    /// subscriber is closed instead (see `Inner`'s drop in `lib.rs`).
    fn drop(&mut self) {
        // Their unsubscribes would find the dispatcher gone: called off now, outside the
        // map's lock (see `watch`).
        let (channels, lingering): (Vec<String>, Vec<Option<DeferredTask>>) = self
            .channels()
            .iter_mut()
            .map(|(channel, entry)| (channel.clone(), entry.linger.take()))
            .unzip();
        for unsubscribe in lingering.into_iter().flatten() {
            unsubscribe.cancel();
        }
        let Some(shared_as) = self.shared_as else {
            return;
        };
        let Some(mode) = self.pubsub.known().filter(|_| !channels.is_empty()) else {
            return; // nothing was subscribed
        };
        let (subscriber, suffix) = (self.subscriber.clone(), self.own_suffix.clone());
        // A runtime shutting down drops the task: its connections go with it. The channels at
        // once, so a server away costs about one command timeout, not one per channel.
        self.runtime.spawn(async move {
            let subscriber = &subscriber;
            let leaving = channels.into_iter().map(|channel| {
                let own = format!("{channel}{suffix}");
                async move {
                    let left =
                        leave_channel(subscriber, mode, Some(shared_as), &channel, own).await;
                    if let Err(error) = left {
                        tracing::debug!(%error, channel, "fairlock-redis: unsubscribe of a dropped backend failed");
                    }
                }
            });
            futures::future::join_all(leaving).await;
        });
    }
}

/// Unsubscribes `own`, a dispatcher's channel of a lock, and the lock's `channel` unless
/// another dispatcher on the subscriber still wants it (`shared_as`: the dispatcher's number
/// in [`SHARED`], when its subscriber was made elsewhere).
async fn leave_channel(
    subscriber: &SubscriberClient,
    mode: PubsubMode,
    shared_as: Option<u64>,
    channel: &str,
    own: String,
) -> Result<(), fred::error::Error> {
    match shared_as {
        None => unsubscribe_both(subscriber, mode, own, Some(channel)).await,
        Some(number) => {
            SharedChannel::of(subscriber.id(), channel)
                .leave(number, |last| {
                    unsubscribe_both(subscriber, mode, own, last.then_some(channel))
                })
                .await
        }
    }
}

/// Unsubscribes `own`, a dispatcher's channel of a lock, and the lock's `channel` if given,
/// with the commands of `mode`: both, whatever the other's reply, since nothing tries again.
/// At once, not one after the other: fred answers an unsubscribe when it is written, but one
/// queued while the subscriber reconnects waits up to the command timeout, and the channel's
/// lock is held meanwhile (a watch waiting for it would wait for both).
async fn unsubscribe_both(
    subscriber: &SubscriberClient,
    mode: PubsubMode,
    own: String,
    channel: Option<&str>,
) -> Result<(), fred::error::Error> {
    let unsubscribe = |name: String| async move {
        match mode {
            PubsubMode::Sharded => subscriber.sunsubscribe(name).await,
            PubsubMode::Classic => subscriber.unsubscribe(name).await,
        }
    };
    let (first, second) = tokio::join!(unsubscribe(own), async {
        match channel {
            Some(channel) => unsubscribe(channel.to_owned()).await,
            None => Ok(()),
        }
    });
    first.and(second)
}

/// Numbers dispatchers apart in [`SHARED`].
static NEXT_NUMBER: AtomicU64 = AtomicU64::new(0);

/// A lock's channel (`:c`) is the same for every backend with the same prefix, and a
/// subscriber made elsewhere may serve several backends: one made while another is dropped
/// (whose tasks may still run), or several at once. The server keeps one subscription per
/// connection and channel, so one backend's unsubscribe would take it from the others. Here,
/// by subscriber (fred's client id, shared by its clones) and lock channel: which dispatchers
/// want it, under a lock that orders their subscribes and unsubscribes of it. Dispatchers on
/// a subscriber of their own do not use it. An entry goes with its last user.
static SHARED: std::sync::LazyLock<Mutex<SharedTable>> = std::sync::LazyLock::new(Mutex::default);

type SharedTable = HashMap<(String, String), Arc<SharedChannel>>;

#[derive(Debug)]
struct SharedChannel {
    /// Its key in [`SHARED`].
    key: (String, String),
    /// The dispatchers (by number) that want the channel subscribed; held across a command on
    /// it, so those of different dispatchers reach the server in its order.
    users: tokio::sync::Mutex<std::collections::HashSet<u64>>,
    /// How many of those commands failed: a dispatcher that waited while one did does not
    /// send its own (the server is not answering now), as a watch does for its channel.
    failures: AtomicU64,
}

impl SharedChannel {
    fn table() -> MutexGuard<'static, SharedTable> {
        SHARED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The entry of `channel` on the subscriber `subscriber_id`, made if missing.
    fn of(subscriber_id: &str, channel: &str) -> Arc<SharedChannel> {
        let key = (subscriber_id.to_owned(), channel.to_owned());
        Self::table()
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(SharedChannel {
                    key,
                    users: tokio::sync::Mutex::default(),
                    failures: AtomicU64::new(0),
                })
            })
            .clone()
    }

    /// Adds `number` to the users and runs `subscribe` under their lock, so that no other
    /// dispatcher unsubscribes the channel until its reply. Fails without sending it if a
    /// command on the channel failed while this one waited for the lock.
    async fn join(
        &self,
        number: u64,
        subscribe: impl std::future::Future<Output = Result<(), fred::error::Error>>,
    ) -> Result<(), fred::error::Error> {
        let failures = self.failures.load(Ordering::Acquire);
        let mut users = self.users.lock().await;
        users.insert(number);
        if self.failures.load(Ordering::Acquire) != failures {
            return Err(fred::error::Error::new(
                fred::error::ErrorKind::Timeout,
                "another backend's command on the channel failed meanwhile",
            ));
        }
        let result = subscribe.await;
        self.count(&result);
        result
    }

    /// Takes `number` off the users and runs `unsubscribe(last)`, `last` telling whether it
    /// was the last (so the lock's channel goes too), under the users' lock. The entry goes
    /// with its last user, unless someone else is about to use it.
    async fn leave<F, Fut>(
        self: Arc<Self>,
        number: u64,
        unsubscribe: F,
    ) -> Result<(), fred::error::Error>
    where
        F: FnOnce(bool) -> Fut,
        Fut: std::future::Future<Output = Result<(), fred::error::Error>>,
    {
        let mut users = self.users.lock().await;
        users.remove(&number);
        let result = unsubscribe(users.is_empty()).await;
        self.count(&result);
        if users.is_empty() {
            // References are only made under the table's lock: with just the table's and this
            // one left, nobody waits for the entry or is about to.
            let mut table = Self::table();
            if Arc::strong_count(&self) == 2
                && table
                    .get(&self.key)
                    .is_some_and(|entry| Arc::ptr_eq(entry, &self))
            {
                table.remove(&self.key);
            }
        }
        result
    }

    fn count(&self, result: &Result<(), fred::error::Error>) {
        if result.is_err() {
            self.failures.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(dispatcher) = self.dispatcher.upgrade() {
            dispatcher.unregister(std::mem::take(&mut self.channel));
        }
    }
}

/// Whom a message is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Audience<'a> {
    /// Every watch of this owner.
    Owner(&'a str),
    /// Every watch on the channel.
    Everyone,
}

/// `G <token> <attempt> <owner>`, `R <owner>` or `A` (every waiter); owners may contain spaces,
/// so the owner is the rest.
fn parse(payload: &str) -> Option<(Audience<'_>, Wake)> {
    if payload == "A" {
        return Some((Audience::Everyone, Wake::Recheck));
    }
    let (kind, rest) = payload.split_once(' ')?;
    match kind {
        "G" => {
            let (token, rest) = rest.split_once(' ')?;
            let (attempt, owner) = rest.split_once(' ')?;
            let token = token.parse().ok()?;
            let attempt = attempt.parse().ok()?;
            Some((
                Audience::Owner(owner),
                Wake::Granted {
                    attempt,
                    grant: Grant {
                        token,
                        hold_count: 1,
                    },
                },
            ))
        }
        "R" => Some((Audience::Owner(rest), Wake::Recheck)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairlock::backend::AttemptId;

    /// Many watches of a channel wait at once for its first one to subscribe, each in its
    /// backend call's boxed future: that future must not carry the subscribe command's own
    /// future (about 5 KB with fred 10.1), which it did before the subscribe moved out of it
    /// (about 5,900 bytes; a few hundred since).
    #[test]
    fn a_watch_waiting_for_its_channel_stays_small() {
        fn size_of_future<'a, F>(_: impl FnOnce(&'a Arc<Dispatcher>) -> F) -> usize {
            std::mem::size_of::<F>()
        }
        let size = size_of_future(|dispatcher| dispatcher.watch("channel", "owner"));
        assert!(size <= 1024, "Dispatcher::watch future: {size} bytes");
    }

    #[test]
    fn parses_messages() {
        let attempt = AttemptId::from_u128(0xab);
        assert_eq!(
            parse(&format!("G 17 {attempt} job 42")),
            Some((
                Audience::Owner("job 42"),
                Wake::Granted {
                    attempt,
                    grant: Grant {
                        token: 17,
                        hold_count: 1
                    }
                }
            ))
        );
        assert_eq!(
            parse("R a b"),
            Some((Audience::Owner("a b"), Wake::Recheck))
        );
        assert_eq!(parse("A"), Some((Audience::Everyone, Wake::Recheck)));
        assert_eq!(parse("A x"), None);
        assert_eq!(parse(&format!("G x {attempt} owner")), None);
        assert_eq!(parse("G 17 not-an-attempt owner"), None);
        assert_eq!(parse("G 17 owner"), None);
        assert_eq!(parse("hello"), None);
    }
}
