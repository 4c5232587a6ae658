//! The signals `fairlock` catches (to leave the queue cleanly, or to pass on to the command)
//! and sending signals to the command.
//!
//! Sending goes through `nix`: `libc::kill` is an `unsafe fn`, and the workspace forbids
//! `unsafe` code.

use std::future::poll_fn;
use std::io;
use std::task::Poll;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::signal::unix::{signal, SignalKind};

/// Signals that ask `fairlock` to stop: while waiting it leaves the queue, while the command
/// runs it passes them on.
const CAUGHT: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// Listeners for [`CAUGHT`]. While they exist those signals no longer end the process.
#[derive(Debug)]
pub(crate) struct Signals {
    listeners: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    /// Starts catching the signals.
    pub(crate) fn catch() -> io::Result<Self> {
        let listeners = CAUGHT
            .iter()
            .map(|&caught| Ok((caught, signal(SignalKind::from_raw(caught as i32))?)))
            .collect::<io::Result<_>>()?;
        Ok(Signals { listeners })
    }

    /// The next signal received.
    ///
    /// Cancel safe: a signal that arrives while nobody waits is kept for the next call.
    pub(crate) async fn recv(&mut self) -> Signal {
        poll_fn(|cx| {
            for (caught, listener) in &mut self.listeners {
                if listener.poll_recv(cx).is_ready() {
                    return Poll::Ready(*caught);
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// Sends `signal` to `child` if it is still running (not yet reaped, so its pid is still its
/// own). Errors are ignored: the only likely one is that it just exited.
pub(crate) fn send(child: &Child, signal: Signal) {
    if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}
