//! Sessions: creation with health-check binding, renewal, and invalidation
//! (TTL, a bound check going critical, destroy), which releases or deletes
//! the keys the session held and starts their lock-delay.

use std::time::{Duration, Instant};

use super::{ClusterState, StateError};
use crate::state::catalog::HealthStatus;

/// Consul's `SessionTTLMultiplier`: the leader's timer for a session runs
/// this many TTLs; after an election it always does.
pub(crate) const SESSION_TTL_MULTIPLIER: u32 = 2;

/// Node-level check every agent has and that always passes.
pub(crate) const SERF_HEALTH: &str = "serfHealth";

/// What happens to a session's keys when it is invalidated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behavior {
    /// Keys keep their value; the holder is cleared.
    Release,
    /// Keys are deleted.
    Delete,
}

impl Behavior {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Behavior::Release => "release",
            Behavior::Delete => "delete",
        }
    }
}

/// A live session, as returned by [`TestConsul::sessions`](crate::TestConsul::sessions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// The session id (a UUID).
    pub id: String,
    /// The client-chosen name.
    pub name: String,
    /// The node (agent name) the session belongs to.
    pub node: String,
    /// The TTL as asked, if any.
    pub ttl: Option<Duration>,
    /// What invalidation does to held keys.
    pub behavior: Behavior,
    /// How long released keys refuse `acquire` after invalidation.
    pub lock_delay: Duration,
    /// Bound node-level checks (`serfHealth` by default).
    pub node_checks: Vec<String>,
    /// Bound service checks.
    pub service_checks: Vec<String>,
    /// Index of the create.
    pub create_index: u64,
    /// Index of the last change (equal to `create_index`: renewals are not
    /// writes).
    pub modify_index: u64,
}

/// A validated `PUT /v1/session/create` request.
#[derive(Debug, Clone)]
pub(crate) struct SessionSpec {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) node: String,
    /// Parsed TTL and the text the client sent (echoed back like Consul).
    pub(crate) ttl: Option<(Duration, String)>,
    pub(crate) behavior: Behavior,
    pub(crate) lock_delay: Duration,
    pub(crate) node_checks: Vec<String>,
    pub(crate) service_checks: Vec<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub(crate) info: SessionInfo,
    pub(crate) ttl_text: String,
    /// When the leader's timer invalidates the session (renew moves it).
    pub(crate) expires_at: Option<Instant>,
}

impl Session {
    pub(crate) fn binds_check(&self, node: &str, check_id: &str) -> bool {
        self.info.node == node
            && (self.info.node_checks.iter().any(|c| c == check_id)
                || self.info.service_checks.iter().any(|c| c == check_id))
    }
}

impl ClusterState {
    fn expiry(&self, ttl: Option<Duration>, now: Instant) -> Option<Instant> {
        ttl.map(|t| now + t.mul_f64(self.ttl_expiry_factor))
    }

    pub(crate) fn session_create(
        &mut self,
        spec: SessionSpec,
        now: Instant,
    ) -> Result<SessionInfo, StateError> {
        if !self.catalog.has_node(&spec.node) {
            return Err(StateError::UnknownNode(spec.node));
        }
        for check in spec.node_checks.iter().chain(&spec.service_checks) {
            if check == SERF_HEALTH {
                continue;
            }
            match self.catalog.check_status(&spec.node, check) {
                None => return Err(StateError::MissingCheck(check.clone())),
                Some(HealthStatus::Critical) => {
                    return Err(StateError::CriticalCheck(check.clone()))
                }
                Some(_) => {}
            }
        }
        let idx = self.index + 1;
        let ttl = spec.ttl.as_ref().map(|(d, _)| *d);
        let info = SessionInfo {
            id: spec.id,
            name: spec.name,
            node: spec.node,
            ttl,
            behavior: spec.behavior,
            lock_delay: spec.lock_delay,
            node_checks: spec.node_checks,
            service_checks: spec.service_checks,
            create_index: idx,
            modify_index: idx,
        };
        let session = Session {
            info: info.clone(),
            ttl_text: spec.ttl.map(|(_, text)| text).unwrap_or_default(),
            expires_at: self.expiry(ttl, now),
        };
        self.sessions.insert(info.id.clone(), session);
        self.sessions_index = idx;
        self.index = idx;
        Ok(info)
    }

    /// Resets the TTL timer. Not a write: no index moves, as in Consul.
    pub(crate) fn session_renew(&mut self, id: &str, now: Instant) -> Option<Session> {
        let factor = self.ttl_expiry_factor;
        let session = self.sessions.get_mut(id)?;
        session.expires_at = session.info.ttl.map(|t| now + t.mul_f64(factor));
        Some(session.clone())
    }

    /// Destroys or invalidates a session; `false` if it did not exist.
    pub(crate) fn session_invalidate(&mut self, id: &str, now: Instant) -> bool {
        let Some(session) = self.sessions.remove(id) else {
            return false;
        };
        let idx = self.index + 1;
        let delay_until =
            (!session.info.lock_delay.is_zero()).then(|| now + session.info.lock_delay);
        self.kv_drop_session_locks(idx, id, session.info.behavior, delay_until);
        self.sessions_index = idx;
        self.index = idx;
        true
    }

    /// Invalidates every session bound to a check that went critical or
    /// was removed.
    pub(super) fn invalidate_sessions_bound_to(
        &mut self,
        node: &str,
        check_id: &str,
        now: Instant,
    ) {
        let bound: Vec<String> = self
            .sessions
            .values()
            .filter(|s| s.binds_check(node, check_id))
            .map(|s| s.info.id.clone())
            .collect();
        for id in bound {
            self.session_invalidate(&id, now);
        }
    }

    #[cfg(test)]
    pub(crate) fn session_get(&self, id: &str) -> Option<&Session> {
        self.sessions.get(id)
    }

    pub(crate) fn session_list(&self) -> impl Iterator<Item = &Session> {
        self.sessions.values()
    }

    pub(crate) fn sessions_index(&self) -> u64 {
        self.sessions_index
    }

    pub(super) fn expire_sessions(&mut self, now: Instant) {
        let expired: Vec<String> = self
            .sessions
            .values()
            .filter(|s| s.expires_at.is_some_and(|t| t <= now))
            .map(|s| s.info.id.clone())
            .collect();
        for id in expired {
            self.session_invalidate(&id, now);
        }
    }

    /// What a newly elected leader does to session timers: restart each
    /// at [`SESSION_TTL_MULTIPLIER`] x TTL from `now`, and forget the
    /// lock-delays (they live in the old leader's memory only). Not a write:
    /// no index moves. Returns how many timers restarted.
    pub(crate) fn leader_elected(&mut self, now: Instant) -> usize {
        let mut restarted = 0;
        for session in self.sessions.values_mut() {
            if let Some(ttl) = session.info.ttl {
                session.expires_at = Some(now + ttl * SESSION_TTL_MULTIPLIER);
                restarted += 1;
            }
        }
        self.kv.forget_lock_delays();
        restarted
    }

    pub(super) fn next_session_expiry(&self) -> Option<Instant> {
        self.sessions.values().filter_map(|s| s.expires_at).min()
    }
}
