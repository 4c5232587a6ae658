//! A throwaway `redis-server` on a free loopback port, for these tests only (until the
//! shared `fairlock-testsupport` crate offers the same).

#![allow(dead_code, unreachable_pub)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fairlock::backend::AcquireRequest;
use fairlock::{LockName, Owner};
use fairlock_redis::RedisBackend;

/// A `redis-server` child process, killed when dropped.
pub struct Server {
    child: Child,
    pub port: u16,
}

impl Server {
    pub fn start() -> Server {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test.sh installs it)");
        let server = Server { child, port };
        let started = Instant::now();
        while server.cli(&["PING"]) != "PONG" {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server did not start on port {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs one command with `redis-cli` and returns its raw output, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli is installed");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    pub async fn backend(&self) -> RedisBackend {
        RedisBackend::connect(&self.url()).await.expect("connects")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free loopback port")
}

/// A fresh random lock name, so tests never share state.
pub fn name() -> LockName {
    LockName::new(format!("test-{}", uuid::Uuid::new_v4().simple())).unwrap()
}

pub fn owner(id: &str) -> Owner {
    Owner::new(id).unwrap()
}

pub fn request(name: &LockName, owner: &Owner, queue: bool) -> AcquireRequest {
    AcquireRequest {
        name: name.clone(),
        owner: owner.clone(),
        lease: Duration::from_secs(30),
        waiter_ttl: Duration::from_secs(10),
        queue,
    }
}
