//! Free loopback ports, never handed to two servers of this process at once.

use std::collections::HashSet;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Offset of a Redis Cluster node's bus port from its client port.
pub(crate) const BUS_PORT_OFFSET: u16 = 10_000;

/// Ports held by live servers of this process (client and, for cluster nodes, bus ports).
static RESERVED: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

fn reserved() -> MutexGuard<'static, Option<HashSet<u16>>> {
    RESERVED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A TCP port on 127.0.0.1 that nothing listens on right now.
///
/// The kernel picks it (bind to port 0, then release). Ports held by servers this crate
/// started in this process are never returned. Another process may still take the port before
/// you use it: retry on "address in use". Also handy as a port where nothing answers.
pub fn free_port() -> io::Result<u16> {
    for _ in 0..1000 {
        let port = bind_any()?;
        if !reserved().as_ref().is_some_and(|set| set.contains(&port)) {
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrNotAvailable,
        "no free loopback port found",
    ))
}

fn bind_any() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// Picks and reserves a free port (and, with `bus`, the free port `port + 10000` too).
/// Release it with [`release`].
pub(crate) fn reserve_free(bus: bool) -> io::Result<u16> {
    for _ in 0..1000 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        let bus_port = port.checked_add(BUS_PORT_OFFSET);
        let _bus_listener = if bus {
            let Some(bus_port) = bus_port else { continue };
            match TcpListener::bind((Ipv4Addr::LOCALHOST, bus_port)) {
                Ok(listener) => Some(listener),
                Err(_) => continue,
            }
        } else {
            None
        };
        let mut guard = reserved();
        let set = guard.get_or_insert_with(HashSet::new);
        let wanted: &[u16] = match (bus, bus_port) {
            (true, Some(bus_port)) => &[port, bus_port],
            _ => &[port],
        };
        if wanted.iter().any(|p| set.contains(p)) {
            continue;
        }
        set.extend(wanted.iter().copied());
        return Ok(port);
    }
    Err(io::Error::new(
        io::ErrorKind::AddrNotAvailable,
        "no free loopback port found",
    ))
}

/// Releases a port reserved by [`reserve_free`] (with its bus port when `bus`).
pub(crate) fn release(port: u16, bus: bool) {
    if let Some(set) = reserved().as_mut() {
        set.remove(&port);
        if bus {
            if let Some(bus_port) = port.checked_add(BUS_PORT_OFFSET) {
                set.remove(&bus_port);
            }
        }
    }
}
