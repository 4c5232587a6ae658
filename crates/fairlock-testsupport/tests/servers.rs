//! The helpers against real `redis-server` processes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use fairlock_testsupport::{
    free_port, redis62_server, require_redis, RedisCluster, RedisServer, TempDir,
};

/// Whether the process `pid` still exists (zombies included).
fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn redis_is_installed() {
    require_redis();
}

#[test]
fn starts_and_answers_ping() {
    let server = RedisServer::start().unwrap();
    assert_eq!(server.cli(&["PING"]).unwrap(), "PONG");
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(
        server.addr().to_string(),
        format!("127.0.0.1:{}", server.port())
    );
    assert!(server.is_running());
    // Raw protocol, as a client library would speak it.
    let mut stream = TcpStream::connect(server.addr()).unwrap();
    stream.write_all(b"PING\r\n").unwrap();
    let mut reply = [0; 7];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"+PONG\r\n");
    // The configured options are in force.
    assert_eq!(
        server
            .cli(&["CONFIG", "GET", "enable-debug-command"])
            .unwrap(),
        "enable-debug-command\nyes"
    );
    assert_eq!(server.cli(&["CONFIG", "GET", "save"]).unwrap(), "save");
    assert_eq!(server.cli(&["DEBUG", "SLEEP", "0"]).unwrap(), "OK");
    assert!(server.log().contains("Ready to accept connections"));
}

#[test]
fn restart_loses_data_and_keeps_the_port() {
    let mut server = RedisServer::start().unwrap();
    let port = server.port();
    let old_pid = server.pid().unwrap();
    assert_eq!(server.cli(&["SET", "k", "v"]).unwrap(), "OK");
    assert_eq!(server.cli(&["GET", "k"]).unwrap(), "v");
    server.restart().unwrap();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid().unwrap(), old_pid);
    assert!(!process_exists(old_pid));
    assert_eq!(server.cli(&["GET", "k"]).unwrap(), "");
    assert_eq!(server.cli(&["PING"]).unwrap(), "PONG");
}

#[test]
fn stop_makes_the_port_unreachable_and_restart_brings_it_back() {
    let mut server = RedisServer::start().unwrap();
    let pid = server.pid().unwrap();
    server.stop();
    assert!(!server.is_running());
    assert_eq!(server.pid(), None);
    assert!(!process_exists(pid));
    let refused = TcpStream::connect_timeout(&server.addr(), Duration::from_secs(1));
    assert!(refused.is_err(), "something still listens on the port");
    assert!(server.cli(&["PING"]).is_err());
    server.stop(); // idempotent
    server.restart().unwrap();
    assert_eq!(server.cli(&["PING"]).unwrap(), "PONG");
}

#[test]
fn drop_kills_and_reaps_the_process_and_removes_its_directory() {
    let server = RedisServer::start().unwrap();
    let pid = server.pid().unwrap();
    let dir = server.dir();
    assert!(process_exists(pid));
    assert!(dir.is_dir());
    drop(server);
    assert!(
        !process_exists(pid),
        "redis-server {pid} survived its handle"
    );
    assert!(!dir.exists());
}

#[test]
fn drop_during_a_panic_kills_the_process() {
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let server = RedisServer::start().unwrap();
        tx.send(server.pid().unwrap()).unwrap();
        panic!("a test failing while its server runs");
    })
    .join();
    assert!(outcome.is_err());
    let pid = rx.recv().unwrap();
    assert!(!process_exists(pid));
}

#[test]
fn parallel_servers_get_different_ports() {
    let servers: Vec<RedisServer> = (0..8)
        .map(|_| std::thread::spawn(|| RedisServer::start().unwrap()))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|handle| handle.join().unwrap())
        .collect();
    let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), servers.len());
    for server in &servers {
        assert_eq!(
            server
                .cli(&["SET", "owner", &server.port().to_string()])
                .unwrap(),
            "OK"
        );
    }
    for server in &servers {
        assert_eq!(
            server.cli(&["GET", "owner"]).unwrap(),
            server.port().to_string()
        );
    }
}

#[test]
fn password_is_required_and_used_by_cli() {
    let mut server = RedisServer::start_with(&["--requirepass", "secret"]).unwrap();
    assert_eq!(server.password(), Some("secret"));
    assert_eq!(server.cli(&["PING"]).unwrap(), "PONG");
    let mut stream = TcpStream::connect(server.addr()).unwrap();
    stream.write_all(b"PING\r\n").unwrap();
    let mut reply = [0; 7];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"-NOAUTH");
    server.restart().unwrap();
    assert_eq!(server.cli(&["PING"]).unwrap(), "PONG");
}

#[test]
fn a_bad_option_fails_with_the_servers_message() {
    let err = RedisServer::start_with(&["--no-such-option", "1"]).unwrap_err();
    assert!(err.to_string().contains("no-such-option"), "{err}");
}

#[test]
fn paused_server_does_not_answer_until_resumed() {
    let server = RedisServer::start().unwrap();
    server.pause_process().unwrap();
    let mut stream = TcpStream::connect(server.addr()).unwrap(); // the kernel still accepts
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    stream.write_all(b"PING\r\n").unwrap();
    let mut reply = [0; 7];
    assert!(
        stream.read_exact(&mut reply).is_err(),
        "a paused server answered"
    );
    server.resume_process().unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"+PONG\r\n");
}

#[test]
fn dropping_a_paused_server_kills_it() {
    let server = RedisServer::start().unwrap();
    let pid = server.pid().unwrap();
    server.pause_process().unwrap();
    drop(server);
    assert!(!process_exists(pid));
}

#[test]
fn cluster_of_three_is_ok_and_routes_keys() {
    let started = Instant::now();
    let cluster = RedisCluster::start(3).unwrap();
    eprintln!("3-master cluster ready in {:?}", started.elapsed());
    let ports = cluster.ports();
    assert_eq!(ports.len(), 3);
    assert_eq!(
        cluster.url(),
        format!(
            "redis-cluster://127.0.0.1:{}?node=127.0.0.1:{}&node=127.0.0.1:{}",
            ports[0], ports[1], ports[2]
        )
    );
    for i in 0..3 {
        let info = cluster.cli(i, &["cluster", "info"]).unwrap();
        assert!(info.contains("cluster_state:ok"), "{info}");
    }
    assert_eq!(
        cluster.cli(0, &["CLUSTER", "KEYSLOT", "foo"]).unwrap(),
        "12182"
    );
    assert_eq!(
        cluster.cli(1, &["CLUSTER", "KEYSLOT", "{foo}x"]).unwrap(),
        "12182"
    );
    // Each key is writable on the node that serves it, and only there.
    for key in ["foo", "bar", "baz", "qux"] {
        let owner = cluster.node_for_key(key).unwrap();
        assert_eq!(cluster.cli(owner, &["SET", key, "1"]).unwrap(), "OK");
        let other = (owner + 1) % 3;
        let moved = cluster.cli(other, &["SET", key, "1"]).unwrap();
        assert!(moved.starts_with("MOVED"), "{moved}");
        assert!(
            moved.ends_with(&format!("127.0.0.1:{}", ports[owner])),
            "{moved}"
        );
    }
    // Slots are announced on the loopback address.
    let slots = cluster.cli(2, &["CLUSTER", "SLOTS"]).unwrap();
    assert_eq!(slots.matches("127.0.0.1").count(), 3, "{slots}");
}

#[test]
fn cluster_node_restart_keeps_its_slots_and_loses_its_data() {
    let mut cluster = RedisCluster::start(3).unwrap();
    let owner = cluster.node_for_key("k").unwrap();
    assert_eq!(cluster.cli(owner, &["SET", "k", "v"]).unwrap(), "OK");
    cluster.node_mut(owner).restart().unwrap();
    cluster.wait_until_ok().unwrap();
    for i in 0..3 {
        let info = cluster.cli(i, &["CLUSTER", "INFO"]).unwrap();
        assert!(info.contains("cluster_state:ok"), "{info}");
    }
    assert_eq!(cluster.node_for_key("k").unwrap(), owner);
    assert_eq!(cluster.cli(owner, &["GET", "k"]).unwrap(), "");
}

#[test]
fn small_clusters_are_joined_by_hand() {
    for masters in [1, 2] {
        let cluster = RedisCluster::start(masters).unwrap();
        for i in 0..masters {
            let info = cluster.cli(i, &["CLUSTER", "INFO"]).unwrap();
            assert!(info.contains("cluster_state:ok"), "{info}");
        }
        let owner = cluster.node_for_key("foo").unwrap();
        assert_eq!(cluster.cli(owner, &["SET", "foo", "1"]).unwrap(), "OK");
    }
    assert!(RedisCluster::start(0).is_err());
}

#[test]
fn redis_6_2_servers_start_from_their_own_binary() {
    let binary = redis62_server();
    let server = RedisServer::start_binary(&binary, &["--requirepass", "pw"]).unwrap();
    let info = server.cli(&["INFO", "server"]).unwrap();
    assert!(info.contains("redis_version:6.2."), "{info}");
    assert_eq!(server.cli(&["DEBUG", "SLEEP", "0"]).unwrap(), "OK");
    // Two masters, joined by hand: without Redis 7's CLUSTER ADDSLOTSRANGE.
    let cluster = RedisCluster::start_binary(&binary, 2, &[]).unwrap();
    for i in 0..2 {
        let info = cluster.cli(i, &["INFO", "server"]).unwrap();
        assert!(info.contains("redis_version:6.2."), "{info}");
    }
    let owner = cluster.node_for_key("foo").unwrap();
    assert_eq!(cluster.cli(owner, &["SET", "foo", "1"]).unwrap(), "OK");
}

#[test]
fn dropping_a_cluster_kills_every_node() {
    let cluster = RedisCluster::start(3).unwrap();
    let pids: Vec<u32> = (0..3).map(|i| cluster.node(i).pid().unwrap()).collect();
    drop(cluster);
    for pid in pids {
        assert!(!process_exists(pid), "node {pid} survived");
    }
}

#[test]
fn free_port_is_unused() {
    let port = free_port().unwrap();
    assert_ne!(port, 0);
    let listener = std::net::TcpListener::bind(("127.0.0.1", port));
    assert!(listener.is_ok(), "free_port returned a port in use");
}

#[test]
fn temp_dir_is_removed_on_drop() {
    let dir = TempDir::new("testsupport").unwrap();
    let path = dir.path().to_owned();
    std::fs::write(path.join("file"), b"x").unwrap();
    assert!(path.is_absolute() && path.is_dir());
    drop(dir);
    assert!(!path.exists());
}
