//! A TCP proxy on loopback that can lose one reply: the request reaches the server and is
//! applied, the reply never reaches the client, and the connection drops. A client that
//! re-sends after reconnecting (fred does) then delivers the same request twice. It can also
//! hold every reply back from a given request on, as a server that stopped answering.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread;

/// A proxy from a free loopback port to `target`, one pair of threads per connection.
///
/// Armed with [`lose_reply_to`](Self::lose_reply_to), the next chunk a client sends that
/// contains the marker is forwarded, and the server's next chunk on that connection (its
/// reply) is swallowed and the connection closed on both sides. Only for tests with one
/// request in flight on the connection at that moment: other replies in the same chunk are
/// lost too.
///
/// ```no_run
/// use fairlock_testsupport::{LossyProxy, RedisServer};
///
/// let server = RedisServer::start()?;
/// let proxy = LossyProxy::start(server.addr())?;
/// proxy.lose_reply_to(b"PING");
/// // A client of redis://{proxy.addr()} now loses the reply to its next PING.
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct LossyProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// The marker of the request whose reply is lost next, if armed.
    marker: Mutex<Option<Vec<u8>>>,
    /// The marker of the request from which on replies are held back, if armed.
    stall_marker: Mutex<Option<Vec<u8>>>,
    /// Whether replies are held back now.
    stalled: AtomicBool,
    lost: AtomicUsize,
    stop: AtomicBool,
}

impl LossyProxy {
    /// Starts forwarding every connection to `target`.
    pub fn start(target: SocketAddr) -> io::Result<LossyProxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let accepting = Arc::clone(&shared);
        thread::Builder::new()
            .name("lossy-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if accepting.stop.load(SeqCst) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    // A server that is gone: the client sees the connection close.
                    let Ok(server) = TcpStream::connect(target) else {
                        continue;
                    };
                    let _ = pump_pair(client, server, Arc::clone(&accepting));
                }
            })?;
        Ok(LossyProxy { addr, shared })
    }

    /// `127.0.0.1:port`, where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Loses the reply to the next request that contains `marker` (see the type's docs).
    pub fn lose_reply_to(&self, marker: &[u8]) {
        *self.shared.marker.lock().unwrap_or_else(|e| e.into_inner()) = Some(marker.to_vec());
    }

    /// Holds back every reply, on every connection, from the next request that contains
    /// `marker` on (that request reaches the server), until [`release`](Self::release).
    pub fn stall_replies_from(&self, marker: &[u8]) {
        *self
            .shared
            .stall_marker
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(marker.to_vec());
    }

    /// Forwards the replies held back, and the later ones, again.
    pub fn release(&self) {
        self.shared.stalled.store(false, SeqCst);
    }

    /// How many replies were lost so far.
    pub fn lost(&self) -> usize {
        self.shared.lost.load(SeqCst)
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        // Wakes the accepting thread so it sees the flag; open connections end with the
        // server's or the client's side.
        self.shared.stop.store(true, SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copies both ways between `client` and `server` on two threads.
fn pump_pair(client: TcpStream, server: TcpStream, shared: Arc<Shared>) -> io::Result<()> {
    let lose_next = Arc::new(AtomicBool::new(false));
    let (client_in, server_out) = (client.try_clone()?, server.try_clone()?);
    let (requests_lose, requests_shared) = (Arc::clone(&lose_next), Arc::clone(&shared));
    pump(
        "lossy-proxy-requests",
        client_in,
        server_out,
        move |chunk| {
            // Set before the request goes on, so its reply cannot pass first.
            if take_if_in(&requests_shared.marker, chunk) {
                requests_lose.store(true, SeqCst);
            }
            if take_if_in(&requests_shared.stall_marker, chunk) {
                requests_shared.stalled.store(true, SeqCst);
            }
            true
        },
    )?;
    pump("lossy-proxy-replies", server, client, move |_| {
        while shared.stalled.load(SeqCst) && !shared.stop.load(SeqCst) {
            thread::sleep(std::time::Duration::from_millis(2));
        }
        if lose_next.load(SeqCst) {
            shared.lost.fetch_add(1, SeqCst);
            return false;
        }
        true
    })
}

/// Whether `chunk` contains the marker armed in `slot`, disarming it if so.
fn take_if_in(slot: &Mutex<Option<Vec<u8>>>, chunk: &[u8]) -> bool {
    let mut marker = slot.lock().unwrap_or_else(|e| e.into_inner());
    let found = marker
        .as_ref()
        .is_some_and(|m| chunk.windows(m.len()).any(|w| w == m.as_slice()));
    if found {
        *marker = None;
    }
    found
}

/// Copies `from` to `to` on a thread of its own, chunk by chunk, while `forward` says so;
/// then closes both.
fn pump(
    name: &str,
    mut from: TcpStream,
    mut to: TcpStream,
    mut forward: impl FnMut(&[u8]) -> bool + Send + 'static,
) -> io::Result<()> {
    thread::Builder::new().name(name.into()).spawn(move || {
        let mut buffer = vec![0; 64 * 1024];
        while let Ok(read) = from.read(&mut buffer) {
            let chunk = &buffer[..read];
            if read == 0 || !forward(chunk) || to.write_all(chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    })?;
    Ok(())
}
