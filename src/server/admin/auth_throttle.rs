//! Throttling failed admin authentication, per peer.
//!
//! A peer (an IPv4 address, an IPv6 /64) may fail [`FAILURES_PER_WINDOW`]
//! admin authentications in a [`WINDOW`]; the next failure shuts it out
//! for one window, then two, four, ... up to [`MAX_BLOCK`]. While shut
//! out, its admin calls are refused with RESOURCE_EXHAUSTED (HTTP 429) and
//! a retry hint *before* any credential is looked at, so a brute force
//! gets at most 20 guesses a second and far fewer over time. Successful
//! calls are never counted, and other peers are not affected: a good token
//! from elsewhere works during an attack.
//!
//! Logging is per event, not per call: one WARN line when a peer starts
//! failing and one each time it is shut out (with the failures and the
//! refusals since the previous line), so a flood of guesses writes a line
//! per 20 failures at most. Memory is bounded: at most [`MAX_PEERS`]
//! peers are tracked one by one; past that, peers without a live block are
//! forgotten first, and the rest share one state (they are throttled
//! together, which errs on the safe side).

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
/// A peer quiet this long starts again from a one-window block.
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

#[derive(Debug, Default, Clone)]
struct PeerState {
    window_start: Option<Instant>,
    failures: u32,
    blocked_until: Option<Instant>,
    /// Blocks in a row; each doubles the next.
    strikes: u32,
    refused_since_log: u64,
    last_failure: Option<Instant>,
}

impl PeerState {
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
}

/// The per-peer state of failed admin authentication.
#[derive(Debug, Default)]
pub struct AuthThrottle {
    inner: Mutex<Peers>,
}

#[derive(Debug, Default)]
struct Peers {
    map: HashMap<IpAddr, PeerState>,
    /// Shared by peers past [`MAX_PEERS`].
    overflow: PeerState,
}

impl Peers {
    /// The state of `peer`, making room if needed.
    fn state(&mut self, peer: IpAddr, now: Instant) -> &mut PeerState {
        if !self.map.contains_key(&peer) && self.map.len() >= MAX_PEERS {
            self.map.retain(|_, s| !s.stale(now));
        }
        if self.map.contains_key(&peer) || self.map.len() < MAX_PEERS {
            self.map.entry(peer).or_default()
        } else {
            &mut self.overflow
        }
    }
}

impl AuthThrottle {
    /// Whether a call from `peer` may have its credentials checked.
    pub fn gate(&self, peer: IpAddr, now: Instant) -> Gate {
        let mut peers = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let key = crate::server::listener::peer_key(peer);
        let state = peers.state(key, now);
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
        let s = peers.state(key, now);
        if s.last_failure
            .is_some_and(|at| now.duration_since(at) >= FORGET_AFTER)
        {
            s.strikes = 0;
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
        if s.failures >= FAILURES_PER_WINDOW {
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

    /// A peer that authenticated starts afresh.
    pub fn succeeded(&self, peer: IpAddr) {
        let mut peers = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let key = crate::server::listener::peer_key(peer);
        peers.map.remove(&key);
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(t.tracked(), 0);
    }

    #[tokio::test]
    async fn memory_is_bounded_and_overflow_peers_are_still_throttled() {
        let t = AuthThrottle::default();
        let now = Instant::now();
        // MAX_PEERS peers each shut out (so none can be forgotten).
        for i in 0..MAX_PEERS as u32 {
            let peer = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            brute_force(&t, peer, now, FAILURES_PER_WINDOW);
        }
        assert_eq!(t.tracked(), MAX_PEERS);
        let extra = ip("192.168.0.1");
        assert_eq!(brute_force(&t, extra, now, 1000).0, FAILURES_PER_WINDOW);
        assert_eq!(t.tracked(), MAX_PEERS, "no entry past the bound");
        // Once the blocks are over, stale peers make room again.
        let later = now + MAX_BLOCK;
        assert_eq!(t.gate(ip("192.168.0.2"), later), Gate::Check);
        assert!(t.tracked() <= 1);
    }
}
