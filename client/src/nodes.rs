//! The known nodes: one gRPC channel each, how many calls each has in
//! flight, and which ones are set aside after answering UNAVAILABLE.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::metrics as m;

/// One idgen node.
#[derive(Debug)]
pub(crate) struct Node {
    /// `host:port`, as discovered.
    pub addr: String,
    pub channel: Channel,
    /// Calls in flight (the load measure of power-of-two choices).
    outstanding: AtomicUsize,
    /// Milliseconds since the set's epoch until which the node is set
    /// aside; 0 when it is in use.
    aside_until: AtomicU64,
    /// A health probe is running for this node.
    probing: AtomicBool,
    /// The fallback Consul datacenter that listed this node, or `None`
    /// for the local datacenter (and static lists): calls whose values
    /// come from a cluster's counters are refused on such a node
    /// (see [`NodeSet::crossing`]).
    pub fallback: Option<Arc<str>>,
}

/// How a call chooses its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Any node: spread the load (power of two choices).
    Spread,
    /// The node of this key hash ([`key_hash`]): strict calls on one key
    /// go to one node, which combines them into shared writes instead of
    /// racing the other nodes' writes on the same key.
    Key(u64),
}

/// FNV-1a of `s`: a hash every client computes alike (no per-process
/// seed), so clients in different processes send a key to the same node.
pub(crate) fn key_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The rendezvous (highest random weight) score of node `addr` for `key`:
/// the node with the highest score serves the key; when it leaves, only
/// its keys move, each to its own next node.
fn rendezvous(key: u64, addr: &str) -> u64 {
    // splitmix64's finaliser over the pair, so nearby hashes spread.
    let mut z = key ^ key_hash(addr).rotate_left(29);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Counts a call in flight on a node for as long as it lives.
pub(crate) struct InFlight(Arc<Node>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How nodes are dialled and set aside.
#[derive(Debug, Clone)]
pub(crate) struct NodeSettings {
    pub connect_timeout: Duration,
    pub set_aside: Duration,
    /// TLS to the nodes, or plaintext.
    pub tls: Option<crate::tls::Connector>,
    /// Strict, segment, lease and formatted calls may go to a fallback
    /// datacenter's nodes (`ConsulDiscovery::counters_may_cross_datacenters`).
    pub counters_may_cross: bool,
}

/// The current set of nodes, replaced as a whole when discovery changes it.
#[derive(Debug)]
pub(crate) struct NodeSet {
    nodes: ArcSwap<Vec<Arc<Node>>>,
    epoch: Instant,
    settings: NodeSettings,
    /// The name of the Consul datacenter discovery asks first, for the
    /// words of a refusal (empty until discovery learns it).
    local_datacenter: Mutex<String>,
}

impl NodeSet {
    pub(crate) fn new(settings: NodeSettings) -> Self {
        Self {
            nodes: ArcSwap::from_pointee(Vec::new()),
            epoch: Instant::now(),
            settings,
            local_datacenter: Mutex::new(String::new()),
        }
    }

    /// Records the local datacenter's name (see [`NodeSet::crossing`]).
    pub(crate) fn set_local_datacenter(&self, name: String) {
        *self
            .local_datacenter
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = name;
    }

    /// The local datacenter's name, as discovery learned it.
    pub(crate) fn local_datacenter(&self) -> String {
        let name = self
            .local_datacenter
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if name.is_empty() {
            "local".into()
        } else {
            name.clone()
        }
    }

    /// The fallback datacenter whose nodes are in use, or `None` when
    /// they are the local datacenter's.
    pub(crate) fn fallback(&self) -> Option<Arc<str>> {
        self.nodes.load().first().and_then(|n| n.fallback.clone())
    }

    /// Whether a call whose values come from `counter` (e.g. `strict key
    /// "a/b"`) may go to `node`: refused, without sending, when the node
    /// is a fallback datacenter's and the user did not opt in, because
    /// that datacenter's cluster counts the same keys and tags in its own
    /// KV and can hand out a value the local cluster also hands out.
    pub(crate) fn crossing(&self, node: &Node, counter: &str) -> Result<(), crate::Error> {
        match &node.fallback {
            Some(dc) if !self.settings.counters_may_cross => {
                Err(crate::Error::CrossesDatacenters {
                    counter: counter.to_owned(),
                    local: self.local_datacenter(),
                    fallback: dc.to_string(),
                })
            }
            _ => Ok(()),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The addresses currently known.
    pub(crate) fn addrs(&self) -> Vec<String> {
        self.nodes.load().iter().map(|n| n.addr.clone()).collect()
    }

    /// How many nodes are known.
    pub(crate) fn len(&self) -> usize {
        self.nodes.load().len()
    }

    /// Replaces the set with `addrs` of the local datacenter (see
    /// [`NodeSet::replace_from`]).
    pub(crate) fn replace(&self, addrs: &[String]) -> Result<(), String> {
        self.replace_from(addrs, None)
    }

    /// Replaces the set with `addrs`, listed by fallback datacenter
    /// `fallback` (`None`: the local one), keeping the channels (and
    /// counters) of nodes that stay. Returns an error for an address that
    /// is not a valid `host:port`.
    pub(crate) fn replace_from(
        &self,
        addrs: &[String],
        fallback: Option<&str>,
    ) -> Result<(), String> {
        let old = self.nodes.load();
        let by_addr: HashMap<&str, &Arc<Node>> = old
            .iter()
            .filter(|n| n.fallback.as_deref() == fallback)
            .map(|n| (n.addr.as_str(), n))
            .collect();
        let fallback: Option<Arc<str>> = fallback.map(Arc::from);
        let mut next = Vec::with_capacity(addrs.len());
        for addr in addrs {
            if next.iter().any(|n: &Arc<Node>| &n.addr == addr) {
                continue;
            }
            let node = match by_addr.get(addr.as_str()) {
                Some(n) => Arc::clone(n),
                None => Arc::new(Node {
                    addr: addr.clone(),
                    channel: self.channel(addr)?,
                    outstanding: AtomicUsize::new(0),
                    aside_until: AtomicU64::new(0),
                    probing: AtomicBool::new(false),
                    fallback: fallback.clone(),
                }),
            };
            next.push(node);
        }
        let changed =
            next.len() != old.len() || next.iter().zip(old.iter()).any(|(a, b)| !Arc::ptr_eq(a, b));
        if changed {
            tracing::info!(nodes = ?addrs, "idgen nodes changed");
        }
        metrics::gauge!(m::NODES).set(next.len() as f64);
        self.nodes.store(Arc::new(next));
        Ok(())
    }

    /// How the client speaks to the nodes, for the words of a failure.
    pub(crate) fn tls_use(&self) -> crate::tls::TlsUse {
        self.settings
            .tls
            .as_ref()
            .map_or(crate::tls::TlsUse::Plaintext, |t| t.tls_use())
    }

    /// A lazy channel to `addr`, over TLS when the client speaks it.
    fn channel(&self, addr: &str) -> Result<Channel, String> {
        let scheme = if self.settings.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| format!("bad node address {addr:?}: {e}"))?
            .connect_timeout(self.settings.connect_timeout)
            .tcp_nodelay(true);
        match &self.settings.tls {
            Some(tls) => tls.channel(addr, endpoint),
            None => Ok(endpoint.connect_lazy()),
        }
    }

    /// A node among those in use and not in `tried` (falling back to set
    /// aside nodes when no other is left): for [`Route::Spread`], power of
    /// two choices (two random ones, the one with fewer calls in flight);
    /// for [`Route::Key`], the key's own node by rendezvous hashing, so
    /// every call on one key goes to one node while it is up, and the next
    /// one in the key's order when it is not.
    pub(crate) fn pick(&self, tried: &[Arc<Node>], route: Route) -> Option<(Arc<Node>, InFlight)> {
        let chosen = self.choose(tried, route)?;
        chosen.outstanding.fetch_add(1, Ordering::Relaxed);
        Some((Arc::clone(&chosen), InFlight(chosen)))
    }

    /// The address a strict call on `key` goes to now: the first node
    /// [`NodeSet::pick`] would choose for it (so other code, such as the
    /// conformance driver, tells exactly what calls do).
    pub(crate) fn key_node(&self, key: &str) -> Option<String> {
        self.choose(&[], Route::Key(key_hash(key)))
            .map(|n| n.addr.clone())
    }

    /// [`NodeSet::pick`]'s choice, without counting a call in flight.
    fn choose(&self, tried: &[Arc<Node>], route: Route) -> Option<Arc<Node>> {
        let nodes = self.nodes.load();
        let now = self.now_ms();
        let fresh = |n: &&Arc<Node>| !tried.iter().any(|t| Arc::ptr_eq(t, n));
        let mut candidates: Vec<&Arc<Node>> = nodes
            .iter()
            .filter(fresh)
            .filter(|n| n.aside_until.load(Ordering::Relaxed) <= now)
            .collect();
        if candidates.is_empty() {
            candidates = nodes.iter().filter(fresh).collect();
        }
        let chosen = match (candidates.len(), route) {
            (0, _) => return None,
            (1, _) => candidates[0],
            (_, Route::Key(key)) => candidates
                .iter()
                .copied()
                .max_by_key(|n| rendezvous(key, &n.addr))?,
            (len, Route::Spread) => {
                let a = fastrand::usize(..len);
                let mut b = fastrand::usize(..len - 1);
                if b >= a {
                    b += 1;
                }
                let (a, b) = (candidates[a], candidates[b]);
                if b.outstanding.load(Ordering::Relaxed) < a.outstanding.load(Ordering::Relaxed) {
                    b
                } else {
                    a
                }
            }
        };
        Some(Arc::clone(chosen))
    }

    /// Sets a node aside after it answered UNAVAILABLE or could not be
    /// reached: it gets no calls (unless no other node is left) until a
    /// `grpc.health.v1` probe, every set-aside period, finds it SERVING.
    pub(crate) fn set_aside(self: &Arc<Self>, node: &Arc<Node>) {
        metrics::counter!(m::SET_ASIDE).increment(1);
        if node.probing.swap(true, Ordering::AcqRel) {
            // Already aside, and a probe is running.
            node.aside_until.store(u64::MAX, Ordering::Relaxed);
            return;
        }
        tracing::warn!(node = %node.addr, "idgen node set aside until its health check passes");
        let interval = self.settings.set_aside;
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                node.aside_until.store(u64::MAX, Ordering::Relaxed);
                let (set, weak) = (Arc::downgrade(self), Arc::downgrade(node));
                handle.spawn(probe(set, weak, interval));
            }
            Err(_) => {
                // No runtime to probe from: aside for one period.
                let until = self.now_ms() + interval.as_millis() as u64;
                node.aside_until.store(until.max(1), Ordering::Relaxed);
                node.probing.store(false, Ordering::Release);
            }
        }
    }
}

/// Probes a set-aside node's health every `interval` until it is SERVING
/// (it is then put back) or it left the set.
async fn probe(set: Weak<NodeSet>, node: Weak<Node>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let (Some(set), Some(node)) = (set.upgrade(), node.upgrade()) else {
            return;
        };
        if !set.nodes.load().iter().any(|n| Arc::ptr_eq(n, &node)) {
            node.probing.store(false, Ordering::Release);
            return;
        }
        let mut health = HealthClient::new(node.channel.clone());
        let check = health.check(HealthCheckRequest {
            service: "idgen.v1.IdGen".into(),
        });
        let serving = matches!(
            tokio::time::timeout(interval, check).await,
            Ok(Ok(r)) if r.get_ref().status() == ServingStatus::Serving
        );
        if serving {
            node.aside_until.store(0, Ordering::Relaxed);
            node.probing.store(false, Ordering::Release);
            tracing::info!(node = %node.addr, "idgen node serving again: back in use");
            return;
        }
    }
}

/// A plaintext node set of `addrs` for tests (dialled lazily: nothing
/// needs to listen).
#[cfg(test)]
pub(crate) fn test_set(addrs: &[&str]) -> NodeSet {
    let set = NodeSet::new(NodeSettings {
        connect_timeout: Duration::from_millis(200),
        set_aside: Duration::from_secs(60),
        tls: None,
        counters_may_cross: false,
    });
    let addrs: Vec<String> = addrs.iter().map(|a| (*a).to_owned()).collect();
    set.replace(&addrs).expect("addresses");
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr_of(set: &NodeSet, tried: &[Arc<Node>], route: Route) -> Arc<Node> {
        set.pick(tried, route).expect("a node").0
    }

    const NODES: [&str; 3] = ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"];
    /// The node of key `orders/k7` among [`NODES`], as
    /// clients/conformance/run.py computes it in Python.
    const VECTOR_ORDERS_K7: &str = "10.0.0.2:50051";

    #[tokio::test]
    async fn a_strict_key_goes_to_one_node_and_keys_spread_over_all() {
        let nodes = test_set(&NODES);
        let mut per_node: HashMap<String, usize> = HashMap::new();
        for i in 0..300 {
            let route = Route::Key(key_hash(&format!("orders/k{i}")));
            let first = addr_of(&nodes, &[], route);
            for _ in 0..5 {
                assert_eq!(
                    addr_of(&nodes, &[], route).addr,
                    first.addr,
                    "key {i} moved"
                );
            }
            *per_node.entry(first.addr.clone()).or_default() += 1;
        }
        assert_eq!(per_node.len(), 3, "{per_node:?}");
        assert!(per_node.values().all(|&n| n >= 50), "{per_node:?}");
        // The same answer in another client: the hash has no seed.
        let other = test_set(&[NODES[2], NODES[0], NODES[1]]);
        let route = Route::Key(key_hash("orders/k7"));
        assert_eq!(
            addr_of(&nodes, &[], route).addr,
            addr_of(&other, &[], route).addr
        );
    }

    #[tokio::test]
    async fn a_key_fails_over_in_its_own_order_and_only_its_node_moves_keys() {
        let nodes = test_set(&NODES);
        let route = Route::Key(key_hash("flights/lh400"));
        let first = addr_of(&nodes, &[], route);
        let second = addr_of(&nodes, std::slice::from_ref(&first), route);
        assert_ne!(first.addr, second.addr);
        // Tried both: the third node.
        let third = addr_of(&nodes, &[first.clone(), second.clone()], route);
        assert!(third.addr != first.addr && third.addr != second.addr);
        // Without the first node, its keys move to their next node and
        // every other key stays where it was.
        let rest: Vec<&str> = NODES.iter().copied().filter(|a| *a != first.addr).collect();
        let smaller = test_set(&rest);
        for i in 0..200 {
            let route = Route::Key(key_hash(&format!("k{i}")));
            let before = addr_of(&nodes, &[], route).addr.clone();
            let after = addr_of(&smaller, &[], route).addr.clone();
            if before != first.addr {
                assert_eq!(before, after, "key k{i} moved though its node stayed");
            }
        }
    }

    #[tokio::test]
    async fn key_node_names_the_node_a_strict_call_picks() {
        let nodes = test_set(&NODES);
        for i in 0..50 {
            let key = format!("conf/k{i}");
            let picked = addr_of(&nodes, &[], Route::Key(key_hash(&key)));
            assert_eq!(nodes.key_node(&key), Some(picked.addr.clone()), "{key}");
        }
        // Cross-language vectors (clients/conformance checks other clients
        // against these): FNV-1a 64 of the key, then the score per address.
        assert_eq!(
            nodes.key_node("orders/k7").as_deref(),
            Some(VECTOR_ORDERS_K7)
        );
    }

    #[tokio::test]
    async fn a_fallback_datacenters_node_refuses_counted_calls_unless_opted_in() {
        let nodes = test_set(&NODES[..1]);
        nodes.set_local_datacenter("dc1".into());
        let local = addr_of(&nodes, &[], Route::Spread);
        assert!(nodes.crossing(&local, "strict key \"a/b\"").is_ok());
        assert_eq!(nodes.fallback(), None);
        // The same address listed by a fallback datacenter is another node.
        nodes
            .replace_from(&[NODES[0].to_owned()], Some("dc2"))
            .expect("addresses");
        let remote = addr_of(&nodes, &[], Route::Spread);
        assert!(!Arc::ptr_eq(&local, &remote));
        assert_eq!(nodes.fallback().as_deref(), Some("dc2"));
        let err = nodes
            .crossing(&remote, "strict key \"a/b\"")
            .expect_err("refused");
        let text = err.to_string();
        assert!(text.starts_with("strict key \"a/b\" refused: the local Consul datacenter \"dc1\" has no passing idgen node"), "{text}");
        assert!(text.contains("counters_may_cross_datacenters"), "{text}");
        assert_eq!(err.code(), tonic::Code::Unavailable);
        let opted_in = NodeSet::new(NodeSettings {
            counters_may_cross: true,
            ..nodes.settings.clone()
        });
        assert!(opted_in.crossing(&remote, "segment tag \"t\"").is_ok());
    }

    #[test]
    fn the_key_hash_is_fnv_1a() {
        // Published FNV-1a 64 test vectors: other clients can match it.
        assert_eq!(key_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(key_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(key_hash("foobar"), 0x8594_4171_f739_67e8);
    }
}
