//! Throttling failed admin authentication, per peer.
//!
//! A peer (an IPv4 address, an IPv6 /64) may fail [`FAILURES_PER_WINDOW`]
//! admin authentications in a [`WINDOW`]; the next failure shuts it out
//! for one window, then two, four, ... up to [`MAX_BLOCK`]. While shut
//! out, its admin calls are refused with RESOURCE_EXHAUSTED (HTTP 429) and
//! a retry hint *before* any credential is looked at, so a brute force
//! gets at most 20 guesses a second and far fewer over time. Successful
//! calls are never counted.
//!
//! Only a peer's *own* block refuses it (rule 35 in docs/SAFETY-RULES-26-ON.md): a peer
//! that has not failed is always checked, whatever other peers did, so the
//! right token from an address the node has no block for always works.
//! Only failures make a peer tracked; [`AuthThrottle::gate`] never adds
//! one.
//!
//! Memory is bounded: at most [`MAX_PEERS`] peers are tracked one by one.
//! When the table is full, the peers whose blocks end first are forgotten
//! an eighth of the table at a time (so the scan costs a few steps a
//! failure), but their escalation is not: each one's strikes are kept for
//! its prefix (an IPv4 /24, an IPv6 /48; past [`MAX_PREFIXES`] prefixes,
//! for all of them together). A peer that starts failing in such a prefix
//! starts from the prefix's strikes and is shut out at its *first*
//! failure, not its 21st. An attacker cycling through more addresses than
//! the table holds therefore gets one guess per address each time the
//! node forgets it, and blocks that keep growing to [`MAX_BLOCK`]; it
//! never earns a fresh start by filling the table.
//!
//! Logging is per event, not per call: one WARN line when a peer starts
//! failing and one each time it is shut out (with the failures and the
//! refusals since the previous line), so a flood of guesses from one
//! address writes a line per 20 failures at most.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Failed authentications a peer may make in one window.
pub const FAILURES_PER_WINDOW: u32 = 20;
/// The counting window.
pub const WINDOW: Duration = Duration::from_secs(1);
/// The longest a peer is shut out at once.
pub const MAX_BLOCK: Duration = Duration::from_secs(60);
/// Peers tracked one by one.
pub const MAX_PEERS: usize = 4096;
/// Prefixes whose forgotten peers' strikes are kept one by one; past
/// this, they are kept for all further prefixes together.
pub const MAX_PREFIXES: usize = 4096;
/// Peers forgotten at once when the table is full: an eighth of it, so
/// the scan that picks them is paid once per 512 new peers.
const EVICT_BATCH: usize = MAX_PEERS / 8;
/// A peer (or prefix) quiet this long starts again from a one-window block.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// What to do with a call before its credentials are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Check its credentials.
    Check,
    /// Refuse it unchecked; the peer may try again after this long.
    Refuse(Duration),
}

/// A WARN line to write after a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// Failures in the current window.
    pub failures: u32,
    /// Calls refused unchecked since the previous line.
    pub refused: u64,
    /// Set when the peer is now shut out, for this long.
    pub blocked_for: Option<Duration>,
}

#[derive(Debug, Clone)]
struct PeerState {
    window_start: Option<Instant>,
    failures: u32,
    /// Failures in a window that shut the peer out: [`FAILURES_PER_WINDOW`],
    /// or 1 for a peer that started failing where forgotten peers left
    /// strikes (they are the same attacker more often than not).
    allowance: u32,
    blocked_until: Option<Instant>,
    /// Blocks in a row; each doubles the next.
    strikes: u32,
    refused_since_log: u64,
    last_failure: Option<Instant>,
}

impl PeerState {
    /// A peer's first failure; `inherited` is the strikes its prefix kept.
    fn new(inherited: Option<u32>) -> Self {
        Self {
            window_start: None,
            failures: 0,
            allowance: if inherited.is_some() {
                1
            } else {
                FAILURES_PER_WINDOW
            },
            blocked_until: None,
            strikes: inherited.unwrap_or(0),
            refused_since_log: 0,
            last_failure: None,
        }
    }

    fn blocked(&self, now: Instant) -> Option<Duration> {
        self.blocked_until
            .filter(|until| *until > now)
            .map(|until| until - now)
    }

    fn stale(&self, now: Instant) -> bool {
        self.blocked(now).is_none()
            && self
                .last_failure
                .is_none_or(|at| now.duration_since(at) >= WINDOW)
    }

    /// From when forgetting the peer loses nothing but its strikes (which
    /// its prefix keeps): its block is over and its window closed.
    fn done_at(&self) -> Option<Instant> {
        self.blocked_until
            .max(self.last_failure.map(|at| at + WINDOW))
    }
}

/// The strikes of forgotten peers, kept for whoever fails next in their
/// prefix.
#[derive(Debug, Default, Clone, Copy)]
struct Escalation {
    strikes: u32,
    last_failure: Option<Instant>,
}

impl Escalation {
    /// The strikes a newly failing peer starts from; `None` when no peer
    /// forgotten here failed within [`FORGET_AFTER`].
    fn live(&self, now: Instant) -> Option<u32> {
        self.last_failure
            .filter(|at| now.duration_since(*at) < FORGET_AFTER)
            .map(|_| self.strikes)
    }

    /// Keeps the strikes of `peer`, which is being forgotten.
    fn absorb(&mut self, peer: &PeerState, now: Instant) {
        if self.live(now).is_none() {
            *self = Self::default();
        }
        self.strikes = self.strikes.max(peer.strikes);
        self.last_failure = self.last_failure.max(peer.last_failure);
    }
}

/// The prefix a forgotten peer's strikes are kept under: an IPv4 /24, an
/// IPv6 /48 (what one site usually holds, as a /64 is one host).
fn prefix_of(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(v4) => IpAddr::V4((u32::from(v4) & 0xffff_ff00).into()),
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 80) - 1)).into()),
    }
}

/// The per-peer state of failed admin authentication.
#[derive(Debug, Default)]
pub struct AuthThrottle {
    inner: Mutex<Peers>,
}

#[derive(Debug, Default)]
struct Peers {
    /// Peers that failed, one by one; at most [`MAX_PEERS`].
    map: HashMap<IpAddr, PeerState>,
    /// Strikes of forgotten peers by prefix; at most [`MAX_PREFIXES`].
    prefixes: HashMap<IpAddr, Escalation>,
    /// Strikes of forgotten peers whose prefix found no room.
    wide: Escalation,
    /// No sweep of quiet prefixes before this (one a window at most).
    next_sweep: Option<Instant>,
}

impl Peers {
    /// The state of `peer`, which has just failed, making room if needed.
    fn failing(&mut self, peer: IpAddr, now: Instant) -> &mut PeerState {
        if !self.map.contains_key(&peer) {
            if self.map.len() >= MAX_PEERS {
                self.evict(now);
            }
            let inherited = self.inherited(peer, now);
            self.map.insert(peer, PeerState::new(inherited));
        }
        self.map.entry(peer).or_insert_with(|| PeerState::new(None))
    }

    /// The strikes kept for `peer`'s prefix (or for all prefixes, when
    /// they overflowed), if any are live.
    fn inherited(&self, peer: IpAddr, now: Instant) -> Option<u32> {
        let prefix = self
            .prefixes
            .get(&prefix_of(peer))
            .and_then(|e| e.live(now));
        prefix.max(self.wide.live(now))
    }

    /// Forgets the [`EVICT_BATCH`] peers done soonest (stale ones first,
    /// then the blocks that end first), keeping their strikes.
    fn evict(&mut self, now: Instant) {
        let mut order: Vec<(Option<Instant>, IpAddr)> =
            self.map.iter().map(|(ip, s)| (s.done_at(), *ip)).collect();
        let n = EVICT_BATCH.min(order.len());
        if n == 0 {
            return;
        }
        order.select_nth_unstable(n - 1);
        for (_, ip) in &order[..n] {
            if let Some(state) = self.map.remove(ip) {
                self.keep_strikes(*ip, &state, now);
            }
        }
    }

    /// Keeps a forgotten peer's strikes for its prefix, or for all
    /// prefixes when the prefix table is full of live ones.
    fn keep_strikes(&mut self, peer: IpAddr, state: &PeerState, now: Instant) {
        let prefix = prefix_of(peer);
        let full = |p: &Self| !p.prefixes.contains_key(&prefix) && p.prefixes.len() >= MAX_PREFIXES;
        if full(self) && self.next_sweep.is_none_or(|at| now >= at) {
            self.prefixes.retain(|_, e| e.live(now).is_some());
            self.next_sweep = Some(now + WINDOW);
        }
        let kept = if full(self) {
            &mut self.wide
        } else {
            self.prefixes.entry(prefix).or_default()
        };
        kept.absorb(state, now);
    }
}

impl AuthThrottle {
    /// Whether a call from `peer` may have its credentials checked: only
    /// the peer's own block refuses it, never another peer's failures.
    pub fn gate(&self, peer: IpAddr, now: Instant) -> Gate {
        let mut peers = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let key = crate::server::listener::peer_key(peer);
        let Some(state) = peers.map.get_mut(&key) else {
            return Gate::Check;
        };
        match state.blocked(now) {
            Some(left) => {
                state.refused_since_log += 1;
                Gate::Refuse(left)
            }
            None => Gate::Check,
        }
    }

    /// Records a failed authentication from `peer`; returns the line to
    /// log, if this failure starts an episode or a block.
    pub fn failed(&self, peer: IpAddr, now: Instant) -> Option<Warning> {
        let mut peers = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let key = crate::server::listener::peer_key(peer);
        let s = peers.failing(key, now);
        if s.last_failure
            .is_some_and(|at| now.duration_since(at) >= FORGET_AFTER)
        {
            s.strikes = 0;
            s.allowance = FAILURES_PER_WINDOW;
        }
        let quiet = s.stale(now);
        s.last_failure = Some(now);
        if s.window_start
            .is_none_or(|start| now.duration_since(start) >= WINDOW)
        {
            s.window_start = Some(now);
            s.failures = 0;
        }
        s.failures += 1;
        if s.failures >= s.allowance {
            let block = WINDOW.saturating_mul(1 << s.strikes.min(16)).min(MAX_BLOCK);
            s.blocked_until = Some(now + block);
            s.strikes += 1;
            let warning = Warning {
                failures: s.failures,
                refused: std::mem::take(&mut s.refused_since_log),
                blocked_for: Some(block),
            };
            s.window_start = None;
            s.failures = 0;
            return Some(warning);
        }
        quiet.then(|| Warning {
            failures: s.failures,
            refused: std::mem::take(&mut s.refused_since_log),
            blocked_for: None,
        })
    }

    /// A peer that authenticated starts afresh (its prefix's kept strikes
    /// stay: they are other peers').
    pub fn succeeded(&self, peer: IpAddr) {
        let mut peers = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let key = crate::server::listener::peer_key(peer);
        peers.map.remove(&key);
    }

    #[cfg(test)]
    fn tracked(&self) -> (usize, usize) {
        let peers = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        (peers.map.len(), peers.prefixes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Drives `calls` wrong-token calls at one instant; returns how many
    /// were checked and how many WARN lines they asked for.
    fn brute_force(t: &AuthThrottle, peer: IpAddr, now: Instant, calls: u32) -> (u32, usize) {
        let (mut checked, mut lines) = (0, 0);
        for _ in 0..calls {
            if t.gate(peer, now) == Gate::Check {
                checked += 1;
                lines += usize::from(t.failed(peer, now).is_some());
            }
        }
        (checked, lines)
    }

    /// The attacker: address `i` of 127.1.0.0/16, 200 to a /24
    /// (so 127.1.0.250 is a fresh address in an attacked /24).
    fn attacker(i: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 1, (i / 200) as u8, (i % 200) as u8))
    }

    #[tokio::test]
    async fn a_peer_gets_twenty_checks_a_window_then_growing_blocks() {
        let t = AuthThrottle::default();
        let attacker = ip("10.0.0.9");
        let start = Instant::now();
        let (checked, lines) = brute_force(&t, attacker, start, 5000);
        assert_eq!(checked, FAILURES_PER_WINDOW, "checks in one window");
        assert_eq!(lines, 2, "one line when it starts, one when it is shut out");
        let Gate::Refuse(left) = t.gate(attacker, start) else {
            panic!("not refused");
        };
        assert_eq!(left, WINDOW);
        // After the first block: 20 more, then a block twice as long.
        let later = start + WINDOW;
        assert_eq!(
            brute_force(&t, attacker, later, 5000).0,
            FAILURES_PER_WINDOW
        );
        assert_eq!(t.gate(attacker, later), Gate::Refuse(WINDOW * 2));
        // Blocks stop growing at MAX_BLOCK.
        let mut now = later + WINDOW * 2;
        for _ in 0..10 {
            brute_force(&t, attacker, now, 100);
            match t.gate(attacker, now) {
                Gate::Refuse(left) => {
                    assert!(left <= MAX_BLOCK);
                    now += left;
                }
                Gate::Check => panic!("not blocked after 100 failures"),
            }
        }
        assert_eq!(
            t.gate(attacker, now - Duration::from_millis(1)),
            Gate::Refuse(Duration::from_millis(1))
        );
        // Another peer is checked as usual throughout.
        assert_eq!(t.gate(ip("10.0.0.10"), start), Gate::Check);
    }

    #[tokio::test]
    async fn success_clears_a_peer_and_a_typo_is_one_line() {
        let t = AuthThrottle::default();
        let peer = ip("10.0.0.1");
        let now = Instant::now();
        assert!(t.failed(peer, now).is_some(), "first failure is logged");
        assert!(
            t.failed(peer, now).is_none(),
            "the next in the window is not"
        );
        t.succeeded(peer);
        assert_eq!(t.tracked().0, 0);
        // Asking is not failing: a gate adds no entry.
        assert_eq!(t.gate(ip("10.0.0.2"), now), Gate::Check);
        assert_eq!(t.tracked().0, 0);
    }

    /// Issue 32 item 7: 4,096 addresses of 127.1.0.0/16 fail 20 times
    /// each, then 29 more, and keep at it every 5 s: an address that never
    /// failed is checked throughout (it used to get RESOURCE_EXHAUSTED for
    /// as long as the attack lasted). One that never failed in an
    /// attacked /24 is checked too, but shut out at its first failure.
    #[tokio::test]
    async fn a_full_table_never_refuses_a_peer_that_never_failed() {
        let t = AuthThrottle::default();
        let start = Instant::now();
        let attackers = MAX_PEERS as u32 + 29;
        let (admin, neighbour) = (ip("127.0.0.1"), ip("127.1.0.250"));
        for second in (0..40).step_by(5) {
            let now = start + WINDOW * second;
            for i in 0..attackers {
                brute_force(&t, attacker(i), now, FAILURES_PER_WINDOW + 1);
            }
            assert!(t.tracked().0 <= MAX_PEERS);
            for fresh in [admin, neighbour] {
                assert_eq!(
                    t.gate(fresh, now),
                    Gate::Check,
                    "{fresh} refused {second} s into the attack"
                );
            }
        }
        // Their own failures are theirs: the admin's typo costs it nothing
        // for 20 tries; the neighbour is shut out at its first.
        let now = start + WINDOW * 40;
        assert_eq!(
            brute_force(&t, admin, now, 100).0,
            FAILURES_PER_WINDOW,
            "a peer outside the attacked prefixes keeps its 20 tries"
        );
        assert_eq!(brute_force(&t, neighbour, now, 100).0, 1);
        assert!(matches!(t.gate(neighbour, now), Gate::Refuse(_)));
    }

    /// Issue 32 item 7: an attacker cycling through three times as many
    /// addresses as the table holds, one round a minute, used to find its
    /// addresses forgotten each round and start again from 20 guesses
    /// and a 1 s block. Forgetting keeps the strikes by prefix: within a
    /// few rounds each address gets one guess a round and a block of
    /// MAX_BLOCK.
    #[tokio::test]
    async fn cycling_more_addresses_than_the_table_holds_does_not_reset_the_escalation() {
        let t = AuthThrottle::default();
        let start = Instant::now();
        let addresses = 3 * MAX_PEERS as u32;
        for round in 0..10 {
            let now = start + MAX_BLOCK * round;
            let (mut checked, mut shortest) = (0, MAX_BLOCK);
            for i in 0..addresses {
                let peer = attacker(i);
                let (c, _) = brute_force(&t, peer, now, FAILURES_PER_WINDOW + 1);
                checked += c;
                match t.gate(peer, now) {
                    Gate::Refuse(left) => shortest = shortest.min(left),
                    Gate::Check => panic!("{peer} not shut out in round {round}"),
                }
            }
            let (peers, prefixes) = t.tracked();
            assert!(peers <= MAX_PEERS && prefixes <= MAX_PREFIXES);
            if round >= 8 {
                assert_eq!(checked, addresses, "round {round}: one guess an address");
                assert_eq!(shortest, MAX_BLOCK, "round {round}: shortest block");
            }
        }
    }

    #[tokio::test]
    async fn memory_is_bounded_and_prefixes_past_the_bound_share_their_strikes() {
        let t = AuthThrottle::default();
        let now = Instant::now();
        // Twice as many IPv6 peers as prefixes can be kept, each in its
        // own /48, all shut out.
        let spread = |i: u32| IpAddr::V6(Ipv6Addr::new(0x2001, 0x0db8, i as u16, 0, 0, 0, 0, 1));
        for i in 0..2 * MAX_PREFIXES as u32 + MAX_PEERS as u32 {
            brute_force(&t, spread(i), now, FAILURES_PER_WINDOW);
        }
        let (peers, prefixes) = t.tracked();
        assert!(peers <= MAX_PEERS, "{peers} peers tracked");
        assert!(prefixes <= MAX_PREFIXES, "{prefixes} prefixes kept");
        // A new /48 is checked, and its first failure shuts it out: the
        // strikes of the prefixes that found no room are shared.
        let fresh = ip("2001:db9::1");
        assert_eq!(t.gate(fresh, now), Gate::Check);
        assert_eq!(brute_force(&t, fresh, now, 100).0, 1);
        // Quiet for FORGET_AFTER, everything starts afresh.
        let later = now + FORGET_AFTER;
        assert_eq!(
            brute_force(&t, ip("2001:dba::1"), later, 100).0,
            FAILURES_PER_WINDOW
        );
        assert_eq!(
            brute_force(&t, spread(0), later, 100).0,
            FAILURES_PER_WINDOW
        );
    }
}
