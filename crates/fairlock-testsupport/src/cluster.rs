//! A Redis Cluster on loopback ports, each node a [`RedisServer`]: masters only, or masters
//! with replicas for shard failovers.

use std::io;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::resp::Reply;
use crate::server::{run_cli, Program, RedisServer};

/// How long the cluster may take to agree on its slots after creation.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The number of hash slots of a Redis Cluster.
const SLOTS: usize = 16_384;

/// A Redis Cluster of `masters` nodes, without replicas or with
/// [`start_with_replicas`](Self::start_with_replicas), all on 127.0.0.1, every node stopped
/// when dropped.
///
/// Nodes run with `--cluster-node-timeout 2000` and `--cluster-announce-ip 127.0.0.1`, their
/// `nodes.conf` in their own directory; slots are split evenly over the masters in node order.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    replicas_per_master: usize,
}

impl RedisCluster {
    /// Starts `masters` nodes, joins them (`redis-cli --cluster create … --cluster-replicas 0`
    /// for 3 or more; `CLUSTER ADDSLOTS` and `CLUSTER MEET` for 1 or 2, which
    /// `redis-cli` refuses), and waits until every node reports `cluster_state:ok`, knows every
    /// other node and sees all slots assigned. Takes about 2 to 3 s: Redis itself keeps a
    /// freshly started master at `cluster_state:fail` for about 2 s.
    ///
    /// # Panics
    ///
    /// When Redis is not installed (see [`require_redis`](crate::require_redis)).
    pub fn start(masters: usize) -> io::Result<RedisCluster> {
        Self::start_with(masters, &[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments for every node (e.g.
    /// `&["--requirepass", "secret"]`).
    ///
    /// # Panics
    ///
    /// When Redis is not installed (see [`require_redis`](crate::require_redis)).
    pub fn start_with(masters: usize, args: &[&str]) -> io::Result<RedisCluster> {
        Self::start_program(Program::default_server(), masters, 0, args)
    }

    /// Starts `masters` masters (at least 3), each with `replicas` replicas, and waits until
    /// the cluster is settled and every replica is in sync with its master. The masters are
    /// nodes `0..masters`, their replicas the nodes after them. A master killed with
    /// [`RedisServer::stop`] is replaced by one of its replicas after the node timeout (2 s):
    /// see [`wait_for_failover`](Self::wait_for_failover).
    ///
    /// Nodes also run with `--repl-diskless-sync-delay 0`, so the initial full
    /// synchronisation does not wait Redis's default 5 s for more replicas to join.
    ///
    /// # Panics
    ///
    /// When Redis is not installed (see [`require_redis`](crate::require_redis)).
    pub fn start_with_replicas(masters: usize, replicas: usize) -> io::Result<RedisCluster> {
        if masters < 3 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "redis-cli creates clusters with replicas from 3 masters up",
            ));
        }
        Self::start_program(
            Program::default_server(),
            masters,
            replicas,
            &["--repl-diskless-sync-delay", "0"],
        )
    }

    /// Like [`start_with`](Self::start_with), every node running the `redis-server` binary at
    /// `binary` (e.g. [`redis62_server`](crate::redis62_server)); the cluster is still created
    /// with the `redis-cli` on `PATH`.
    pub fn start_binary(
        binary: impl AsRef<std::path::Path>,
        masters: usize,
        args: &[&str],
    ) -> io::Result<RedisCluster> {
        crate::require_redis();
        Self::start_program(Program::at(binary.as_ref())?, masters, 0, args)
    }

    fn start_program(
        program: Program,
        masters: usize,
        replicas_per_master: usize,
        args: &[&str],
    ) -> io::Result<RedisCluster> {
        if masters == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a cluster needs at least one master",
            ));
        }
        let extra: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let nodes = (0..masters * (1 + replicas_per_master))
            .map(|_| RedisServer::start_inner(program.clone(), extra.clone(), true))
            .collect::<io::Result<Vec<_>>>()?;
        let cluster = RedisCluster {
            nodes,
            replicas_per_master,
        };
        if masters >= 3 {
            cluster.create_with_cli()?;
        } else {
            cluster.create_by_hand()?;
        }
        cluster.wait_until_ok()?;
        cluster.wait_until_replicas_online()?;
        Ok(cluster)
    }

    /// Waits until every master reports all its replicas online.
    fn wait_until_replicas_online(&self) -> io::Result<()> {
        for (index, node) in self.nodes.iter().enumerate() {
            if self.replicas_per_master > 0 && is_master(node)? {
                self.wait_for_replicas(index, self.replicas_per_master, SETTLE_TIMEOUT)?;
            }
        }
        Ok(())
    }

    /// Waits (up to `timeout`) until node `index`, a master, reports `replicas` replicas online
    /// (`INFO replication`), e.g. once a restarted node rejoined as a replica after a failover.
    pub fn wait_for_replicas(
        &self,
        index: usize,
        replicas: usize,
        timeout: Duration,
    ) -> io::Result<()> {
        let started = Instant::now();
        loop {
            // A node busy with a failover or a sync may not answer at once: ask again.
            let info = self.nodes[index]
                .request(&["INFO", "replication"], Duration::from_secs(2))
                .and_then(Reply::into_text)
                .unwrap_or_default();
            let online = info
                .lines()
                .filter(|line| line.starts_with("slave") && line.contains("state=online"))
                .count();
            if online >= replicas {
                return Ok(());
            }
            if started.elapsed() > timeout {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "node {index}: {online} of {replicas} replicas online after {timeout:?}"
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn create_with_cli(&self) -> io::Result<()> {
        let mut command = Command::new("redis-cli");
        if let Some(password) = self.nodes[0].password() {
            command.args(["-a", password, "--no-auth-warning"]);
        }
        command.args(["--cluster", "create"]);
        command.args(self.nodes.iter().map(|n| n.addr().to_string()));
        let replicas = self.replicas_per_master.to_string();
        let output = command
            .args(["--cluster-replicas", &replicas, "--cluster-yes"])
            .stdin(Stdio::null())
            .output()?;
        if output.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "redis-cli --cluster create failed ({}):\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
            )))
        }
    }

    fn create_by_hand(&self) -> io::Result<()> {
        let timeout = Duration::from_secs(5);
        let count = self.nodes.len();
        for (i, node) in self.nodes.iter().enumerate() {
            // ADDSLOTS rather than ADDSLOTSRANGE, which Redis 6 lacks.
            let slots: Vec<String> = (i * SLOTS / count..(i + 1) * SLOTS / count)
                .map(|slot| slot.to_string())
                .collect();
            let mut command = vec!["CLUSTER", "ADDSLOTS"];
            command.extend(slots.iter().map(String::as_str));
            expect_ok(node.request(&command, timeout)?)?;
            let epoch = (i + 1).to_string();
            expect_ok(node.request(&["CLUSTER", "SET-CONFIG-EPOCH", &epoch], timeout)?)?;
        }
        for node in &self.nodes[1..] {
            let port = node.port().to_string();
            let reply = self.nodes[0].request(&["CLUSTER", "MEET", "127.0.0.1", &port], timeout)?;
            expect_ok(reply)?;
        }
        Ok(())
    }

    /// Waits (up to 30 s) until every node reports `cluster_state:ok`, knows every node (none
    /// in handshake or failed) and sees all 16384 slots assigned; e.g. after
    /// [`RedisServer::restart`] of a node, which only waits until the node answers. Redis keeps
    /// a freshly started master at `cluster_state:fail` for about 2 s, so this takes about
    /// that long after a restart. Fails if a node is stopped or paused.
    pub fn wait_until_ok(&self) -> io::Result<()> {
        let started = Instant::now();
        loop {
            let mut unsettled = None;
            for (i, node) in self.nodes.iter().enumerate() {
                if let Err(reason) = self.node_settled(node) {
                    unsettled = Some(format!("node {i} (port {}): {reason}", node.port()));
                    break;
                }
            }
            let Some(reason) = unsettled else {
                return Ok(());
            };
            if started.elapsed() > SETTLE_TIMEOUT {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the cluster did not settle within {SETTLE_TIMEOUT:?}: {reason}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn node_settled(&self, node: &RedisServer) -> Result<(), String> {
        let timeout = Duration::from_secs(2);
        let info = node
            .request(&["CLUSTER", "INFO"], timeout)
            .and_then(Reply::into_text)
            .map_err(|err| err.to_string())?;
        for wanted in [
            "cluster_state:ok".to_owned(),
            format!("cluster_slots_assigned:{SLOTS}"),
            format!("cluster_known_nodes:{}", self.nodes.len()),
        ] {
            if !info.lines().any(|line| line.trim() == wanted) {
                return Err(format!("CLUSTER INFO lacks {wanted}"));
            }
        }
        let nodes = node
            .request(&["CLUSTER", "NODES"], timeout)
            .and_then(Reply::into_text)
            .map_err(|err| err.to_string())?;
        for line in nodes.lines() {
            let flags = line.split_whitespace().nth(2).unwrap_or("");
            if ["handshake", "fail", "noaddr"]
                .iter()
                .any(|bad| flags.split(',').any(|flag| flag.starts_with(bad)))
            {
                return Err(format!("CLUSTER NODES has {line:?}"));
            }
        }
        Ok(())
    }

    /// The client ports of the nodes, in node order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// The cluster URL in fred's format:
    /// `redis-cluster://127.0.0.1:p1?node=127.0.0.1:p2&node=127.0.0.1:p3`.
    pub fn url(&self) -> String {
        let mut url = format!("redis-cluster://127.0.0.1:{}", self.nodes[0].port());
        for (i, node) in self.nodes[1..].iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(&format!("node=127.0.0.1:{}", node.port()));
        }
        url
    }

    /// Runs `redis-cli` (without `-c`) against node `index`, stdout trimmed; see
    /// [`RedisServer::cli`].
    ///
    /// # Panics
    ///
    /// When `index` is not a node's index.
    pub fn cli(&self, index: usize, args: &[&str]) -> io::Result<String> {
        let node = &self.nodes[index];
        run_cli(node.port(), node.password(), args)
    }

    /// Node `index`, e.g. to [`pause_process`](RedisServer::pause_process) it.
    ///
    /// # Panics
    ///
    /// When `index` is not a node's index.
    pub fn node(&self, index: usize) -> &RedisServer {
        &self.nodes[index]
    }

    /// Node `index`, mutably, e.g. to [`stop`](RedisServer::stop) or
    /// [`restart`](RedisServer::restart) it (it comes back with its slots, without data; then
    /// call [`wait_until_ok`](Self::wait_until_ok)).
    ///
    /// # Panics
    ///
    /// When `index` is not a node's index.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// The index of the node that serves `key`'s hash slot, as the first running node sees
    /// the cluster.
    pub fn node_for_key(&self, key: &str) -> io::Result<usize> {
        let slot: u16 = self
            .cli(self.first_running()?, &["CLUSTER", "KEYSLOT", key])?
            .parse()
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))?;
        self.node_for_slot(slot)
    }

    /// The index of the node that serves hash slot `slot`, as the first running node sees the
    /// cluster.
    pub fn node_for_slot(&self, slot: u16) -> io::Result<usize> {
        self.node_for_slot_seen_by(self.first_running()?, slot)
    }

    /// The index of the first node that is not stopped.
    fn first_running(&self) -> io::Result<usize> {
        self.nodes
            .iter()
            .position(RedisServer::is_running)
            .ok_or_else(|| io::Error::other("every node of the cluster is stopped"))
    }

    /// The index of the master that serves hash slot `slot`, as node `seen_by` sees the
    /// cluster; a master flagged as failed serves nothing.
    fn node_for_slot_seen_by(&self, seen_by: usize, slot: u16) -> io::Result<usize> {
        let nodes = self.nodes[seen_by]
            .request(&["CLUSTER", "NODES"], Duration::from_secs(2))?
            .into_text()?;
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags: Vec<&str> = fields.get(2).map_or(vec![], |f| f.split(',').collect());
            if fields.len() < 9
                || !flags.contains(&"master")
                || flags.iter().any(|flag| flag.starts_with("fail"))
            {
                continue;
            }
            let serves = fields[8..].iter().any(|range| {
                slot_range(range).is_some_and(|(first, last)| (first..=last).contains(&slot))
            });
            if !serves {
                continue;
            }
            let port = fields[1]
                .split('@')
                .next()
                .and_then(|addr| addr.rsplit(':').next())
                .and_then(|port| port.parse::<u16>().ok());
            if let Some(index) = port.and_then(|port| self.ports().iter().position(|p| *p == port))
            {
                return Ok(index);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no node serves slot {slot}"),
        ))
    }
}

impl RedisCluster {
    /// Waits (up to `timeout`) until every running node sees hash slot `slot` served by a
    /// master other than node `old` (e.g. after [`RedisServer::stop`] of `old`, the replica
    /// the cluster promoted), that master answers `ROLE` as a master, and every running node
    /// reports `cluster_state:ok`. Returns the new master's index.
    pub fn wait_for_failover(&self, slot: u16, old: usize, timeout: Duration) -> io::Result<usize> {
        let started = Instant::now();
        loop {
            match self.failed_over(slot, old) {
                Ok(new) => return Ok(new),
                Err(reason) if started.elapsed() > timeout => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no failover of slot {slot} within {timeout:?}: {reason}"),
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn failed_over(&self, slot: u16, old: usize) -> io::Result<usize> {
        let running: Vec<usize> = (0..self.nodes.len())
            .filter(|i| self.nodes[*i].is_running())
            .collect();
        let mut new = None;
        for &index in &running {
            let serving = self.node_for_slot_seen_by(index, slot)?;
            if serving == old || new.is_some_and(|new| new != serving) {
                return Err(io::Error::other(format!(
                    "node {index} sees slot {slot} on node {serving}"
                )));
            }
            new = Some(serving);
            let info = self.nodes[index]
                .request(&["CLUSTER", "INFO"], Duration::from_secs(2))?
                .into_text()?;
            if !info.lines().any(|line| line.trim() == "cluster_state:ok") {
                return Err(io::Error::other(format!("node {index} is not ok yet")));
            }
        }
        let new = new.ok_or_else(|| io::Error::other("no node is running"))?;
        if is_master(&self.nodes[new])? {
            Ok(new)
        } else {
            Err(io::Error::other(format!("node {new} is not a master yet")))
        }
    }

    /// Node `index`'s cluster node id.
    pub fn node_id(&self, index: usize) -> io::Result<String> {
        self.cli(index, &["CLUSTER", "MYID"])
    }

    /// Moves hash slot `slot` to node `to` the way `redis-cli --cluster reshard` does: marks
    /// it importing on `to` and migrating on its owner, moves its keys with `MIGRATE` (again
    /// and again, for at least `open_for`, so clients meanwhile meet `ASK` redirections and
    /// `TRYAGAIN` while keys are split between the nodes), then assigns the slot to `to` on
    /// every node, the target first.
    pub fn migrate_slot(&self, slot: u16, to: usize, open_for: Duration) -> io::Result<()> {
        let from = self.node_for_slot(slot)?;
        if from == to {
            return Ok(());
        }
        let slot_text = slot.to_string();
        let (from_id, to_id) = (self.node_id(from)?, self.node_id(to)?);
        let expect = |reply: String| {
            if reply == "OK" || reply == "NOKEY" {
                Ok(())
            } else {
                Err(io::Error::other(format!("slot migration: {reply}")))
            }
        };
        expect(self.cli(
            to,
            &["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &from_id],
        )?)?;
        expect(self.cli(
            from,
            &["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &to_id],
        )?)?;
        let target_port = self.nodes[to].port().to_string();
        let started = Instant::now();
        loop {
            let keys = self.cli(from, &["CLUSTER", "GETKEYSINSLOT", &slot_text, "100"])?;
            let keys: Vec<&str> = keys.lines().filter(|key| !key.is_empty()).collect();
            if keys.is_empty() && started.elapsed() >= open_for {
                break;
            }
            if !keys.is_empty() {
                let mut command = vec![
                    "MIGRATE",
                    "127.0.0.1",
                    &target_port,
                    "",
                    "0",
                    "5000",
                    "REPLACE",
                ];
                if let Some(password) = self.nodes[to].password() {
                    command.extend(["AUTH", password]);
                }
                command.push("KEYS");
                command.extend(keys.iter().copied());
                expect(self.cli(from, &command)?)?;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut order = vec![to, from];
        order.extend((0..self.nodes.len()).filter(|i| *i != to && *i != from));
        for index in order {
            expect(self.cli(index, &["CLUSTER", "SETSLOT", &slot_text, "NODE", &to_id])?)?;
        }
        Ok(())
    }
}

impl RedisCluster {
    /// Takes master `index` out of the cluster the way `redis-cli --cluster reshard` and then
    /// `--cluster del-node` do: hands every slot it serves to master `to` (the slots must hold
    /// no keys: move those first with [`migrate_slot`](Self::migrate_slot), or flush the
    /// node), makes every other node forget it, resets it (`CLUSTER RESET SOFT`), and waits
    /// until the rest of the cluster settles. Returns the removed node, still running, on its
    /// own and serving nothing; drop it (or [`stop`](RedisServer::stop) it) to shut it down.
    /// The nodes after `index` move down one index.
    ///
    /// # Panics
    ///
    /// When `index` or `to` is not a node's index.
    pub fn remove_node(&mut self, index: usize, to: usize) -> io::Result<RedisServer> {
        let timeout = Duration::from_secs(5);
        let keys = self.nodes[index]
            .request(&["DBSIZE"], timeout)?
            .into_text()?;
        if keys != "0" {
            return Err(io::Error::other(format!(
                "node {index} still holds {keys} keys: move or flush them first"
            )));
        }
        let (gone_id, to_id) = (self.node_id(index)?, self.node_id(to)?);
        let slots = self.slots_of(index)?;
        // The old owner first (it lets go of a slot without keys), then the new one, then
        // the rest: no node ever sees a slot unassigned. Not the new owner first: its claim,
        // gossiped with a higher epoch while the old owner still held them, could take the
        // old owner's last slot from under it, which turns it into the new owner's replica
        // ("SETSLOT only with masters" for the rest of the batch).
        let mut order = vec![index, to];
        order.extend((0..self.nodes.len()).filter(|i| *i != to && *i != index));
        for node in order {
            let texts: Vec<String> = slots.iter().map(u16::to_string).collect();
            let commands: Vec<Vec<&str>> = texts
                .iter()
                .map(|slot| vec!["CLUSTER", "SETSLOT", slot.as_str(), "NODE", to_id.as_str()])
                .collect();
            for reply in self.nodes[node].pipeline(&commands, timeout)? {
                expect_ok(reply)?;
            }
        }
        // Its claims win any gossip that still carries the old owner's.
        self.nodes[to]
            .request(&["CLUSTER", "BUMPEPOCH"], timeout)?
            .into_text()?;
        for (i, node) in self.nodes.iter().enumerate() {
            if i != index {
                expect_ok(node.request(&["CLUSTER", "FORGET", &gone_id], timeout)?)?;
            }
        }
        expect_ok(self.nodes[index].request(&["CLUSTER", "RESET", "SOFT"], timeout)?)?;
        let gone = self.nodes.remove(index);
        self.wait_until_ok()?;
        Ok(gone)
    }

    /// The slots master `index` serves, as it sees itself.
    fn slots_of(&self, index: usize) -> io::Result<Vec<u16>> {
        let nodes = self.nodes[index]
            .request(&["CLUSTER", "NODES"], Duration::from_secs(2))?
            .into_text()?;
        let mine = nodes
            .lines()
            .find(|line| {
                line.split_whitespace()
                    .nth(2)
                    .is_some_and(|flags| flags.contains("myself"))
            })
            .ok_or_else(|| io::Error::other("CLUSTER NODES has no line for the node itself"))?;
        let mut slots = Vec::new();
        // Fields 9 on are slots and ranges; an entry in brackets is a slot being moved.
        for range in mine
            .split_whitespace()
            .skip(8)
            .filter(|r| !r.starts_with('['))
        {
            let (first, last) = slot_range(range).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, format!("slot range {range:?}"))
            })?;
            slots.extend(first..=last);
        }
        Ok(slots)
    }
}

/// A slot entry of `CLUSTER NODES`, `first-last` or a single slot, as `(first, last)`; `None`
/// for anything else (a slot being moved is shown in brackets).
fn slot_range(entry: &str) -> Option<(u16, u16)> {
    let mut bounds = entry.splitn(2, '-').map(str::parse::<u16>);
    match (bounds.next(), bounds.next()) {
        (Some(Ok(first)), Some(Ok(last))) => Some((first, last)),
        (Some(Ok(only)), None) => Some((only, only)),
        _ => None,
    }
}

/// Whether `node` answers `ROLE` as a master.
fn is_master(node: &RedisServer) -> io::Result<bool> {
    match node.request(&["ROLE"], Duration::from_secs(2))? {
        Reply::Array(Some(fields)) => match fields.into_iter().next() {
            Some(role) => Ok(role.into_text()? == "master"),
            None => Ok(false),
        },
        other => Err(io::Error::other(format!("ROLE answered {other:?}"))),
    }
}

fn expect_ok(reply: Reply) -> io::Result<()> {
    match reply {
        Reply::Simple(ok) if ok == "OK" => Ok(()),
        other => Err(io::Error::other(format!("expected OK, got {other:?}"))),
    }
}
