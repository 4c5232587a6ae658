//! The redis-server the benchmark runs against: its own, on a free loopback port.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fairlock::BoxError;

/// A private redis-server, stopped when dropped.
#[derive(Debug)]
pub(crate) struct Server {
    child: Child,
    port: u16,
}

impl Server {
    pub(crate) fn start() -> Result<Server, BoxError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| format!("starting redis-server: {err}"))?;
        let server = Server { child, port };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if started.elapsed() > Duration::from_secs(10) {
                return Err("redis-server did not listen within 10s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
