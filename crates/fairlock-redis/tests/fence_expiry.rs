//! The fence hash (`:f`, the last token) of an idle lock expires after the fence margin, so a
//! service that locks per order id leaves no key per order; while the lock is held or waited
//! for it stays; and tokens keep increasing after it is gone (floored by the server's clock).

mod common;

use std::time::Duration;

use common::Server;
use fairlock::LockClient;
use fairlock_redis::RedisBackend;

fn fence_keys(server: &Server) -> Vec<String> {
    server
        .cli(&["--scan", "--pattern", "fairlock:*:f"])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A backend whose idle locks keep their fence for `margin`.
async fn with_margin(server: &Server, margin: Duration) -> RedisBackend {
    RedisBackend::builder(server.url())
        .fence_margin(margin)
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_lock_leaves_no_fence_key_and_tokens_keep_growing() {
    let server = Server::start();
    let margin = Duration::from_millis(400);
    let backend = with_margin(&server, margin).await;
    let client = LockClient::new(backend);
    let lock = client.fair_lock("order-1").unwrap();

    let guard = lock.lock().await.unwrap();
    let first = guard.fencing_token();
    // Held (watchdog lease 30 s): the fence stays well past the margin.
    tokio::time::sleep(margin * 2).await;
    assert_eq!(
        fence_keys(&server).len(),
        1,
        "the fence of a held lock must stay"
    );
    guard.unlock().await.unwrap();

    // Idle: gone after the margin.
    tokio::time::sleep(margin + Duration::from_millis(300)).await;
    assert!(
        fence_keys(&server).is_empty(),
        "an idle lock left {:?}",
        fence_keys(&server)
    );
    let again = lock.lock().await.unwrap();
    assert!(
        again.fencing_token() > first,
        "tokens must increase after the fence expired: {} then {}",
        first,
        again.fencing_token()
    );
    again.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_outlives_a_waiter_and_many_names_leave_nothing() {
    let server = Server::start();
    let margin = Duration::from_millis(300);
    let backend = with_margin(&server, margin).await;
    let client = LockClient::new(backend);
    // 200 distinct names, used once each.
    for i in 0..200 {
        let guard = client
            .fair_lock(&format!("order-{i}"))
            .unwrap()
            .lock()
            .await
            .unwrap();
        guard.unlock().await.unwrap();
    }
    assert_eq!(fence_keys(&server).len(), 200);
    tokio::time::sleep(margin + Duration::from_millis(400)).await;
    assert!(
        fence_keys(&server).is_empty(),
        "fence keys left after the margin"
    );
}

/// A force release sent again after the lock's fence expired (only its spent-attempt records
/// are left, for the resend horizon) still answers as its first copy did; a token it never
/// freed is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_sent_again_after_the_fence_expired_answers_as_before() {
    use fairlock::backend::LockBackend;

    let server = Server::start();
    let margin = Duration::from_millis(400);
    let backend = with_margin(&server, margin).await;
    let client = LockClient::new(backend.clone());
    let guard = client.fair_lock("order-2").unwrap().lock().await.unwrap();
    let token = guard.fencing_token();
    let name = fairlock::LockName::new("order-2").unwrap();
    assert!(backend.force_release(&name, token).await.unwrap());
    drop(guard);
    tokio::time::sleep(margin + Duration::from_millis(300)).await;
    assert!(fence_keys(&server).is_empty(), "the fence expired");
    assert!(backend.force_release(&name, token).await.unwrap());
    assert!(!backend.force_release(&name, token + 1).await.unwrap());
}

/// A backend with a short fence margin, and a first grant on a fresh lock whose lease is
/// `lease`: the attempt that holds it, and the lock.
async fn granted_briefly(
    backend: &RedisBackend,
    owner: &str,
    lease: Duration,
) -> (fairlock::backend::AcquireRequest, fairlock::backend::Grant) {
    let mut request = common::request(&common::name(), &common::owner(owner), true);
    request.lease = lease;
    let grant = common::granted(backend, &request).await;
    (request, grant)
}

/// Checks that `request`, delivered again now, is refused as spent, not granted again.
async fn still_spent(
    backend: &RedisBackend,
    request: &fairlock::backend::AcquireRequest,
    what: &str,
) {
    use fairlock::backend::{AcquireOutcome, LockBackend};

    let again = backend.acquire(request).await.unwrap();
    assert!(
        matches!(again, AcquireOutcome::Busy),
        "{what}: a spent attempt was answered {again:?}"
    );
}

/// A first grant is remembered for the resend horizon however short the fence margin: the
/// attempt's request delivered again after its lease ran out (no release came) and after the
/// margin is refused as spent, not granted again. Whether the lease was last set by the grant
/// or by an `extend`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_first_grant_stays_spent_past_a_short_fence_margin() {
    use fairlock::backend::LockBackend;

    let server = Server::start();
    let margin = Duration::from_millis(100);
    let lease = Duration::from_millis(200);
    let backend = with_margin(&server, margin).await;
    for extended in [false, true] {
        let (request, grant) = granted_briefly(&backend, "holder", lease).await;
        if extended {
            assert!(backend
                .extend(&request.name, &request.owner, grant.token, lease)
                .await
                .unwrap());
        }
        tokio::time::sleep(lease + margin + Duration::from_millis(300)).await;
        still_spent(&backend, &request, &format!("extended: {extended}")).await;
    }
}

/// The attempt of a hold that lapsed, or that a force release freed, stays spent after the
/// lock was granted to another attempt and released again: whatever kept the first grant's
/// record does not lose it to the next grant's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_grant_stays_spent_after_the_next_grant() {
    use fairlock::backend::LockBackend;

    let server = Server::start();
    let margin = Duration::from_millis(100);
    let lease = Duration::from_millis(200);
    let backend = with_margin(&server, margin).await;
    for forced in [false, true] {
        let (request, grant) = granted_briefly(&backend, "holder", lease).await;
        if forced {
            assert!(backend
                .force_release(&request.name, grant.token)
                .await
                .unwrap());
        } else {
            tokio::time::sleep(lease + Duration::from_millis(50)).await;
        }
        let mut next = common::request(&request.name, &common::owner("next"), true);
        next.lease = lease;
        let next_grant = common::granted(&backend, &next).await;
        backend
            .release(&next.name, &next.owner, next_grant.token, next.attempt)
            .await
            .unwrap();
        tokio::time::sleep(margin + Duration::from_millis(300)).await;
        still_spent(&backend, &request, &format!("forced: {forced}")).await;
    }
}

/// `Queued` reports a token at least as high as every token issued for the lock, also when the
/// fence hash was lost (evicted, or a restart without persistence) while the lock was held:
/// the clock, which floors every token, stands in for the lost one. (It reported 0, below the
/// holder's token: a stale hand-over would have looked fresh.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_fence_hash_does_not_lower_the_last_token() {
    use fairlock::backend::{AcquireOutcome, LockBackend};
    let server = Server::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let lock = common::name();
    let holding = common::request(&lock, &common::owner("holder"), true);
    let grant = common::granted(&backend, &holding).await;
    let deleted = server.cli(&["DEL", &format!("fairlock:{{{lock}}}:f")]);
    assert_eq!(deleted, "1");
    let joining = common::request(&lock, &common::owner("waiter"), true);
    let outcome = backend.acquire(&joining).await.unwrap();
    let AcquireOutcome::Queued { last_token, .. } = outcome else {
        panic!("{outcome:?}");
    };
    assert!(
        last_token >= grant.token,
        "Queued reported {last_token}, below the holder's token {}",
        grant.token
    );
    backend
        .abandon(&lock, &joining.owner, joining.attempt)
        .await
        .unwrap();
}
