//! The open connections of one port, by peer: who may connect, and which
//! connection gives way when a new one would pass a limit.
//!
//! A connection that has not yet sent its request headers (HTTP/1, also
//! between requests on a kept-alive connection) or its HTTP/2 preface
//! (gRPC, TLS handshake included) is *waiting*: it holds a descriptor and
//! a slot but nobody is being served on it. When a new connection would
//! pass `server.max_connections_per_peer` (for its peer) or the port's
//! maximum, the connection that has waited longest (of that peer, or of
//! anyone) is closed to make room; only when none is waiting is the new one
//! refused. A slow-header flood therefore churns its own connections, and a
//! health probe, which sends its headers at once, gets in.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use super::{Activity, Port};
use crate::config::ConnectionSettings;
use tokio::sync::Notify;

/// Which limit a new connection met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Limit {
    /// `server.max_connections_per_peer`.
    Peer,
    /// The port's `server.*_max_connections`.
    Port,
}

impl Limit {
    /// The `limit` label of the eviction metric.
    pub(super) fn label(self) -> &'static str {
        match self {
            Limit::Peer => "peer",
            Limit::Port => "port",
        }
    }
}

/// What [`ConnectionTable::admit`] decided.
pub(super) enum Admission {
    /// Serve it; `evicted` names the limit a waiting connection was closed
    /// for, if one was.
    Admitted {
        /// Holds the connection's place until dropped.
        slot: Slot,
        /// Fires when the connection is chosen to make room.
        evict: Arc<Notify>,
        /// The limit another connection was closed for.
        evicted: Option<Limit>,
    },
    /// Every connection counted against `Limit` is busy: close this one.
    Refused(Limit),
}

/// The open connections of one port.
pub(super) struct ConnectionTable {
    port: Port,
    max: usize,
    per_peer: usize,
    inner: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next: u64,
    entries: HashMap<u64, Entry>,
    /// Connections not evicted, by peer key.
    by_peer: HashMap<IpAddr, usize>,
    /// Connections not evicted.
    live: usize,
}

struct Entry {
    peer: IpAddr,
    activity: Arc<Activity>,
    evict: Arc<Notify>,
    evicted: bool,
}

impl ConnectionTable {
    /// A table for `port` with the limits of `settings`.
    pub(super) fn new(port: Port, settings: &ConnectionSettings) -> Arc<Self> {
        Arc::new(Self {
            port,
            max: match port {
                Port::Grpc => settings.grpc_max_connections,
                Port::Http => settings.http_max_connections,
            },
            per_peer: settings.max_connections_per_peer,
            inner: Mutex::new(Table::default()),
        })
    }

    /// Decides whether a new connection from `peer` is served, closing a
    /// waiting connection to make room if needed.
    pub(super) fn admit(self: &Arc<Self>, peer: IpAddr, activity: Arc<Activity>) -> Admission {
        let key = peer_key(peer);
        let mut t = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut evicted = None;
        if t.by_peer.get(&key).copied().unwrap_or(0) >= self.per_peer {
            if !t.evict_longest_waiting(self.port, Some(key)) {
                return Admission::Refused(Limit::Peer);
            }
            evicted = Some(Limit::Peer);
        }
        if t.live >= self.max {
            if !t.evict_longest_waiting(self.port, None) {
                return Admission::Refused(Limit::Port);
            }
            evicted = Some(Limit::Port);
        }
        let id = t.next;
        t.next += 1;
        let evict = Arc::new(Notify::new());
        t.entries.insert(
            id,
            Entry {
                peer: key,
                activity,
                evict: Arc::clone(&evict),
                evicted: false,
            },
        );
        *t.by_peer.entry(key).or_insert(0) += 1;
        t.live += 1;
        Admission::Admitted {
            slot: Slot {
                table: Arc::clone(self),
                id,
            },
            evict,
            evicted,
        }
    }

    /// Connections counted against the limits (not evicted).
    pub(super) fn live(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .live
    }
}

impl Table {
    /// Evicts the connection (of `peer`, if given) that has waited longest
    /// for its headers or preface; false if none is waiting. An evicted
    /// connection stops counting at once; its task closes it.
    fn evict_longest_waiting(&mut self, port: Port, peer: Option<IpAddr>) -> bool {
        let victim = self
            .entries
            .iter()
            .filter(|(_, e)| !e.evicted && peer.is_none_or(|p| e.peer == p))
            .filter_map(|(id, e)| e.activity.waiting_since(port).map(|since| (since, *id)))
            .min();
        let Some((_, id)) = victim else {
            return false;
        };
        let Some(e) = self.entries.get_mut(&id) else {
            return false;
        };
        e.evicted = true;
        e.evict.notify_one();
        let key = e.peer;
        self.forget(key);
        true
    }

    /// Stops counting one connection of `key`.
    fn forget(&mut self, key: IpAddr) {
        self.live = self.live.saturating_sub(1);
        if let Some(n) = self.by_peer.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.by_peer.remove(&key);
            }
        }
    }
}

/// A connection's place in its [`ConnectionTable`], given back on drop.
pub(super) struct Slot {
    table: Arc<ConnectionTable>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut t = self
            .table
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = t.entries.remove(&self.id) {
            if !e.evicted {
                t.forget(e.peer);
            }
        }
    }
}

/// The address a peer is counted under: IPv4 addresses one by one, IPv6
/// by /64 (one host usually holds a whole /64), IPv4-mapped IPv6 as IPv4.
pub(crate) fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    fn v4(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn limits(max: usize, per_peer: usize) -> ConnectionSettings {
        ConnectionSettings {
            grpc_max_connections: max,
            http_max_connections: max,
            max_connections_per_peer: per_peer,
            header_timeout: std::time::Duration::from_secs(10),
            request_body_timeout: std::time::Duration::from_secs(5),
            grpc_idle_timeout: std::time::Duration::from_secs(10),
            grpc_keepalive_interval: std::time::Duration::from_secs(10),
            grpc_keepalive_timeout: std::time::Duration::from_secs(10),
            grpc_max_concurrent_streams: 10,
            max_header_size: 4096,
        }
    }

    #[tokio::test]
    async fn a_full_peer_gives_up_its_longest_waiting_connection_then_is_refused() {
        let table = ConnectionTable::new(Port::Http, &limits(100, 2));
        let peer = v4("10.0.0.1");
        let first = Arc::new(Activity::new());
        let Admission::Admitted {
            evict: first_evict,
            slot: _a,
            ..
        } = table.admit(peer, Arc::clone(&first))
        else {
            panic!("first refused");
        };
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let second = Arc::new(Activity::new());
        let Admission::Admitted { slot: _b, .. } = table.admit(peer, Arc::clone(&second)) else {
            panic!("second refused");
        };
        // A third: the first (waited longest) gives way.
        let Admission::Admitted {
            evicted, slot: _c, ..
        } = table.admit(peer, Arc::new(Activity::new()))
        else {
            panic!("third refused");
        };
        assert_eq!(evicted, Some(Limit::Peer));
        assert!(
            tokio::time::timeout(std::time::Duration::from_secs(5), first_evict.notified())
                .await
                .is_ok(),
            "the longest-waiting connection was told to close"
        );
        assert_eq!(table.live(), 2);
        // Another peer is not affected by this peer's cap.
        assert!(matches!(
            table.admit(v4("10.0.0.2"), Arc::new(Activity::new())),
            Admission::Admitted { evicted: None, .. }
        ));
        // With every connection of the peer busy, a new one is refused.
        second.open.store(1, Ordering::Release);
        let busy = Arc::new(Activity::new());
        busy.open.store(1, Ordering::Release);
        let t2 = ConnectionTable::new(Port::Http, &limits(100, 1));
        let Admission::Admitted { slot: _d, .. } = t2.admit(peer, busy) else {
            panic!("refused");
        };
        assert!(matches!(
            t2.admit(peer, Arc::new(Activity::new())),
            Admission::Refused(Limit::Peer)
        ));
    }

    /// A gRPC connection past its preface, with `calls` open of which
    /// `held` wait for their bodies (since `held_ms` after it was
    /// accepted).
    fn grpc_conn(calls: usize, held: usize, held_ms: u64) -> Arc<Activity> {
        let a = Arc::new(Activity::new());
        a.preface.store(true, Ordering::Release);
        a.open.store(calls, Ordering::Release);
        for _ in 0..held {
            a.body_pending();
        }
        a.pending_since_ms.store(held_ms, Ordering::Release);
        a
    }

    fn admitted(table: &Arc<ConnectionTable>, a: &Arc<Activity>) -> (Slot, Arc<Notify>) {
        match table.admit(v4("10.0.0.1"), Arc::clone(a)) {
            Admission::Admitted { slot, evict, .. } => (slot, evict),
            Admission::Refused(limit) => panic!("refused at the {limit:?} limit"),
        }
    }

    /// Rule 34: streams held open without their bodies make a connection
    /// waiting (it used to count as busy, so a port full of them refused
    /// everyone); the one held longest gives way first, one serving a
    /// call never does, and one whose call stalled gives way while idle.
    #[tokio::test]
    async fn a_port_full_of_held_streams_gives_up_the_longest_held_one() {
        let table = ConnectionTable::new(Port::Grpc, &limits(3, 10));
        let older = grpc_conn(1, 1, 0);
        let serving = grpc_conn(2, 1, 0);
        let newer = grpc_conn(1, 1, 60_000);
        let (_a, older_evict) = admitted(&table, &older);
        let (_b, _) = admitted(&table, &serving);
        let (_c, newer_evict) = admitted(&table, &newer);
        let busy = || grpc_conn(1, 0, 0);
        let (_d, _) = admitted(&table, &busy());
        let told = |n: &Arc<Notify>| {
            let n = Arc::clone(n);
            async move {
                tokio::time::timeout(std::time::Duration::from_secs(5), n.notified())
                    .await
                    .is_ok()
            }
        };
        assert!(
            told(&older_evict).await,
            "the longest-held connection stayed"
        );
        let (_e, _) = admitted(&table, &busy());
        assert!(told(&newer_evict).await, "the other held connection stayed");
        // Only the connection serving a call is left of the first three.
        assert!(matches!(
            table.admit(v4("10.0.0.2"), busy()),
            Admission::Refused(Limit::Port)
        ));
        // Idle: not waiting, unless a call of it once stalled.
        let idle = grpc_conn(0, 0, 0);
        assert_eq!(idle.waiting_since(Port::Grpc), None);
        idle.body_stalled();
        assert!(idle.waiting_since(Port::Grpc).is_some());
        // A body that arrives makes the connection busy again.
        let arriving = grpc_conn(1, 1, 0);
        assert!(arriving.waiting_since(Port::Grpc).is_some());
        arriving.body_arrived();
        assert_eq!(arriving.waiting_since(Port::Grpc), None);
    }

    #[test]
    fn ipv6_peers_count_by_slash_64() {
        assert_eq!(
            peer_key(v4("2001:db8::1")),
            peer_key(v4("2001:db8::ffff:1"))
        );
        assert_ne!(peer_key(v4("2001:db8::1")), peer_key(v4("2001:db8:0:1::1")));
        assert_eq!(peer_key(v4("::ffff:10.0.0.1")), v4("10.0.0.1"));
    }
}
