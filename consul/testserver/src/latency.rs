//! The latency model: how long a Raft write and a consistent read take,
//! so figures measured against this server mean something for a real
//! Consul ([`Config::raft_write_delay`](crate::Config::raft_write_delay),
//! [`Config::consistent_read_delay`](crate::Config::consistent_read_delay)).
//!
//! Consul's leader pipelines its log: writes that arrive while one commit
//! is in flight go together into the next one. So a write here waits for
//! the end of the next *commit round*, not for the writes before it: a
//! round starts when the previous one ends (or at once when none is in
//! flight) and lasts the write delay; every write that arrives before a
//! round starts joins it. A write therefore waits between one and two
//! delays, and any number of concurrent writes share a round, while
//! unrelated requests never wait for each other. The write is applied when
//! its round ends, then answered. A consistent read waits one read delay
//! (the leader confirming it still leads) and then reads; other reads do
//! not wait.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::http::Method;
use tokio::time::Instant;

/// The commit rounds of one cluster.
#[derive(Debug)]
pub(crate) struct Latency {
    write: Duration,
    read: Duration,
    /// When the last scheduled commit round ends.
    last_round_end: Mutex<Option<Instant>>,
}

impl Latency {
    pub(crate) fn new(write: Duration, read: Duration) -> Self {
        Latency {
            write,
            read,
            last_round_end: Mutex::new(None),
        }
    }

    /// When a write arriving at `now` is committed (and books its round).
    fn commit_at(&self, now: Instant) -> Instant {
        let mut last = self
            .last_round_end
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let end = match *last {
            // The last round has not started yet: join it.
            Some(end) if end > now + self.write => end,
            // The last round is in flight: the next one starts when it ends.
            Some(end) if end > now => end + self.write,
            // Nothing in flight: a round starts now.
            _ => now + self.write,
        };
        *last = Some(end);
        end
    }

    /// Waits as Consul would before applying a request to `endpoint`.
    pub(crate) async fn wait(&self, endpoint: &str, method: &Method, consistent: bool) {
        let write = matches!(*method, Method::PUT | Method::POST | Method::DELETE)
            && matches!(
                endpoint,
                "kv" | "txn" | "session/create" | "session/destroy" | "snapshot"
            );
        if write && !self.write.is_zero() {
            tokio::time::sleep_until(self.commit_at(Instant::now())).await;
        } else if !write && consistent && !self.read.is_zero() {
            tokio::time::sleep(self.read).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_share_rounds_and_wait_between_one_and_two_delays() {
        let d = Duration::from_millis(2);
        let l = Latency::new(d, Duration::ZERO);
        let t0 = Instant::now();
        // The first write starts a round.
        assert_eq!(l.commit_at(t0), t0 + d);
        // Writes during that round join the next, all of them.
        let t1 = t0 + Duration::from_micros(500);
        assert_eq!(l.commit_at(t1), t0 + 2 * d);
        assert_eq!(l.commit_at(t1 + Duration::from_micros(700)), t0 + 2 * d);
        // Once the first round ended, the second is in flight: next again.
        assert_eq!(l.commit_at(t0 + d), t0 + 3 * d);
        // Idle: a new round at once.
        let t9 = t0 + 10 * d;
        assert_eq!(l.commit_at(t9), t9 + d);
    }
}
