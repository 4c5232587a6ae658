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
        Self::start_with(&[])
    }

    fn start_with(extra: &[&str]) -> Server {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
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

/// Three `redis-server` masters joined into one Cluster (no replicas), removed when dropped.
pub struct Cluster {
    pub nodes: Vec<Server>,
    dir: std::path::PathBuf,
}

impl Cluster {
    pub fn start() -> Cluster {
        let dir =
            std::env::temp_dir().join(format!("fairlock-redis-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let dir_arg = dir.to_string_lossy().into_owned();
        let nodes: Vec<Server> = (0..3)
            .map(|i| {
                let config = format!("nodes-{i}.conf");
                Server::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &config,
                    "--dir",
                    &dir_arg,
                ])
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli is installed");
        assert!(created.success(), "redis-cli --cluster create failed");
        let cluster = Cluster { nodes, dir };
        let started = Instant::now();
        while !cluster
            .nodes
            .iter()
            .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the cluster never became ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    pub fn url(&self) -> String {
        let mut url = format!("redis-cluster://127.0.0.1:{}", self.nodes[0].port);
        for (i, node) in self.nodes[1..].iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(&format!("node=127.0.0.1:{}", node.port));
        }
        url
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
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
