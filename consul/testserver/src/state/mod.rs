//! The whole cluster as one plain value: KV, sessions and the catalog,
//! under one raft-like index that every write bumps.
//!
//! Nothing here does I/O, sleeps or reads the clock: time comes in as a
//! `now: Instant` argument, and timers are a pair of functions
//! ([`ClusterState::next_deadline`], [`ClusterState::run_timers`]) that
//! the I/O layer calls. That keeps every semantic testable with a
//! hand-made clock and lets the server hold the lock only for short,
//! synchronous sections.

pub(crate) mod catalog;
pub(crate) mod kv;
pub(crate) mod session;
pub(crate) mod snapshot;
pub(crate) mod txn;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use catalog::Catalog;
use kv::KvStore;
use session::Session;

/// A failed state operation; `crate::http::ApiError` maps it to a status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StateError {
    /// Acquire with a session that does not exist.
    #[error("invalid session {0:?}")]
    InvalidSession(String),
    /// A session or service for a node that no agent serves.
    #[error("Missing node registration {0:?}")]
    UnknownNode(String),
    /// A session bound to a check that does not exist.
    #[error("Missing check '{0}' registration")]
    MissingCheck(String),
    /// A session bound to a critical check.
    #[error("Check '{0}' is in critical state")]
    CriticalCheck(String),
    /// A TTL update for a check the agent does not have (or is not TTL).
    #[error("CheckID {0:?} does not have associated TTL")]
    NoTtlCheck(String),
    /// Deregistering a service the agent does not have.
    #[error(
        "Unknown service ID {0:?}. Ensure that the service ID is passed, not the service name."
    )]
    UnknownService(String),
}

/// See the module doc.
#[derive(Debug)]
pub(crate) struct ClusterState {
    /// The raft index: the index of the latest write.
    pub(crate) index: u64,
    pub(crate) kv: KvStore,
    pub(crate) sessions: BTreeMap<String, Session>,
    pub(crate) sessions_index: u64,
    pub(crate) catalog: Catalog,
    /// Sessions expire this many TTLs after their last renew.
    pub(crate) ttl_expiry_factor: f64,
    /// The reaper's period and its next run; `None`: reap exactly when due.
    pub(crate) check_reap: Option<(Duration, Instant)>,
    /// How many snapshots were restored; blocking queries return when it
    /// moves, since the restored indexes may be below the one they wait on.
    pub(crate) restores: u64,
}

impl ClusterState {
    pub(crate) fn new(ttl_expiry_factor: f64) -> Self {
        ClusterState {
            // Consul never answers index 0; a fresh cluster already has
            // writes behind it.
            index: 1,
            kv: KvStore::default(),
            sessions: BTreeMap::new(),
            sessions_index: 1,
            catalog: Catalog::default(),
            ttl_expiry_factor,
            check_reap: None,
            restores: 0,
        }
    }

    /// Runs the critical-service reaper every `interval` from `now` on, as
    /// Consul's agent does (`check_reap_interval`); zero reaps when due.
    pub(crate) fn set_check_reap_interval(&mut self, interval: Duration, now: Instant) {
        self.check_reap = (!interval.is_zero()).then(|| (interval, now + interval));
    }

    /// The next moment [`run_timers`](Self::run_timers) has work to do.
    pub(crate) fn next_deadline(&self, sessions_paused: bool) -> Option<Instant> {
        let sessions = if sessions_paused {
            None
        } else {
            self.next_session_expiry()
        };
        sessions
            .into_iter()
            .chain(self.next_catalog_deadline())
            .min()
    }

    /// Fires every timer due at `now`: TTL checks turn critical (which may
    /// invalidate sessions), services critical for long enough are
    /// deregistered, and, unless paused, expired sessions are invalidated.
    pub(crate) fn run_timers(&mut self, now: Instant, sessions_paused: bool) {
        self.expire_ttl_checks(now);
        self.reap_critical_services(now);
        if !sessions_paused {
            self.expire_sessions(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::catalog::{CheckDef, CheckDefKind, HealthStatus, ServiceDef};
    use super::kv::PutMode;
    use super::session::{Behavior, SessionSpec};
    use super::*;

    fn spec(id: &str, ttl: Option<u64>, behavior: Behavior, checks: Vec<String>) -> SessionSpec {
        SessionSpec {
            id: id.to_owned(),
            name: String::new(),
            node: "agent-0".to_owned(),
            ttl: ttl.map(|s| (Duration::from_secs(s), format!("{s}s"))),
            behavior,
            lock_delay: Duration::from_secs(15),
            node_checks: vec![session::SERF_HEALTH.to_owned()],
            service_checks: checks,
        }
    }

    fn cluster() -> ClusterState {
        let mut st = ClusterState::new(2.0);
        st.add_node("agent-0");
        st
    }

    fn ttl_service(status: Option<HealthStatus>) -> ServiceDef {
        ServiceDef {
            id: "idgen-1".into(),
            name: "idgen".into(),
            tags: vec![],
            address: String::new(),
            port: 1,
            meta: BTreeMap::new(),
            checks: vec![CheckDef {
                id: "idgen-1:ttl".into(),
                name: "ttl".into(),
                notes: String::new(),
                status,
                kind: CheckDefKind::Ttl(Duration::from_secs(10)),
                deregister_after: Some(Duration::from_secs(60)),
            }],
        }
    }

    #[test]
    fn session_expires_at_factor_times_ttl_and_releases_with_lock_delay() {
        let mut st = cluster();
        let t0 = Instant::now();
        st.session_create(spec("s1", Some(10), Behavior::Release, vec![]), t0)
            .map(|_| ())
            .unwrap_or_else(|e| panic!("{e}"));
        let acquired = st.kv_put("l", b"v".to_vec(), 0, &PutMode::Acquire("s1".into()), t0);
        assert_eq!(acquired, Ok(true));
        assert_eq!(st.next_deadline(false), Some(t0 + Duration::from_secs(20)));
        assert_eq!(st.next_deadline(true), None);

        st.run_timers(t0 + Duration::from_secs(19), false);
        assert!(st.session_get("s1").is_some(), "not before 2xTTL");
        st.run_timers(t0 + Duration::from_secs(20), true);
        assert!(
            st.session_get("s1").is_some(),
            "paused expiry must not fire"
        );
        let t1 = t0 + Duration::from_secs(20);
        st.run_timers(t1, false);
        assert!(st.session_get("s1").is_none());
        let entry = st.kv.get("l").cloned();
        assert_eq!(entry.as_ref().and_then(|e| e.session.clone()), None);
        assert_eq!(entry.map(|e| e.value), Some(b"v".to_vec()));

        st.session_create(spec("s2", None, Behavior::Release, vec![]), t1)
            .map(|_| ())
            .unwrap_or_else(|e| panic!("{e}"));
        let blocked = st.kv_put("l", vec![], 0, &PutMode::Acquire("s2".into()), t1);
        assert_eq!(blocked, Ok(false), "lock-delay blocks acquire");
        let later = t1 + Duration::from_secs(15);
        let allowed = st.kv_put("l", vec![], 0, &PutMode::Acquire("s2".into()), later);
        assert_eq!(allowed, Ok(true));
    }

    #[test]
    fn an_election_restarts_every_timer_at_twice_the_ttl_and_forgets_lock_delays() {
        let mut st = ClusterState::new(1.0);
        st.add_node("agent-0");
        let t0 = Instant::now();
        for id in ["s1", "s2"] {
            st.session_create(spec(id, Some(10), Behavior::Release, vec![]), t0)
                .map(|_| ())
                .unwrap_or_else(|e| panic!("{e}"));
        }
        st.session_create(spec("forever", None, Behavior::Release, vec![]), t0)
            .map(|_| ())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            st.kv_put("l", b"v".to_vec(), 0, &PutMode::Acquire("s2".into()), t0),
            Ok(true)
        );
        assert!(st.session_invalidate("s2", t0));
        assert!(st.kv.in_lock_delay("l", t0));
        let index = st.index;
        let t1 = t0 + Duration::from_secs(9);
        assert_eq!(
            st.leader_elected(t1),
            1,
            "only live TTL sessions have timers"
        );
        assert_eq!(st.index, index, "not a write");
        assert!(!st.kv.in_lock_delay("l", t1), "lock-delay forgotten");
        // Factor 1.0 would expire s1 at t0 + 10 s; the new leader gives it
        // until t1 + 20 s.
        st.run_timers(t1 + Duration::from_secs(19), false);
        assert!(st.session_get("s1").is_some());
        assert_eq!(st.next_deadline(false), Some(t1 + Duration::from_secs(20)));
        st.run_timers(t1 + Duration::from_secs(20), false);
        assert!(st.session_get("s1").is_none());
        assert!(st.session_get("forever").is_some());
    }

    #[test]
    fn renew_moves_the_deadline_without_a_write() {
        let mut st = cluster();
        let t0 = Instant::now();
        st.session_create(spec("s1", Some(10), Behavior::Release, vec![]), t0)
            .map(|_| ())
            .unwrap_or_else(|e| panic!("{e}"));
        let index = st.index;
        let t1 = t0 + Duration::from_secs(15);
        assert!(st.session_renew("s1", t1).is_some());
        assert_eq!(st.index, index);
        st.run_timers(t0 + Duration::from_secs(21), false);
        assert!(st.session_get("s1").is_some());
        assert!(st.session_renew("nope", t1).is_none());
    }

    #[test]
    fn critical_check_refuses_binding_and_invalidates_bound_sessions() {
        let mut st = cluster();
        let t0 = Instant::now();
        st.register_service("agent-0", ttl_service(None), false, t0)
            .map(|_| ())
            .unwrap_or_else(|e| panic!("{e}"));
        let refused = st.session_create(
            spec("s1", None, Behavior::Delete, vec!["idgen-1:ttl".into()]),
            t0,
        );
        assert_eq!(
            refused.err(),
            Some(StateError::CriticalCheck("idgen-1:ttl".into()))
        );
        st.update_ttl_check(
            "agent-0",
            "idgen-1:ttl",
            HealthStatus::Passing,
            String::new(),
            t0,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        st.session_create(
            spec("s1", None, Behavior::Delete, vec!["idgen-1:ttl".into()]),
            t0,
        )
        .map(|_| ())
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            st.kv_put("k", b"x".to_vec(), 0, &PutMode::Acquire("s1".into()), t0),
            Ok(true)
        );
        // No update within the check's TTL: it goes critical, the session is
        // invalidated, and Behavior delete removes the held key.
        st.run_timers(t0 + Duration::from_secs(10), false);
        assert!(st.session_get("s1").is_none());
        assert!(st.kv.get("k").is_none());
        // Critical for DeregisterCriticalServiceAfter: reaped.
        st.run_timers(t0 + Duration::from_secs(70), false);
        assert!(st.service_infos().is_empty());
    }

    #[test]
    fn the_reaper_runs_every_check_reap_interval_not_when_a_service_is_due() {
        let mut st = cluster();
        let t0 = Instant::now();
        st.set_check_reap_interval(Duration::from_secs(30), t0);
        let mut def = ttl_service(Some(HealthStatus::Critical));
        def.checks[0].deregister_after = Some(Duration::from_secs(65));
        st.register_service("agent-0", def, false, t0)
            .map(|_| ())
            .unwrap_or_else(|e| panic!("{e}"));
        // The TTL check's own expiry first, then the reaper's first run.
        assert_eq!(st.next_deadline(false), Some(t0 + Duration::from_secs(10)));
        st.run_timers(t0 + Duration::from_secs(10), false);
        assert_eq!(st.next_deadline(false), Some(t0 + Duration::from_secs(30)));
        st.run_timers(t0 + Duration::from_secs(30), false);
        st.run_timers(t0 + Duration::from_secs(60), false);
        assert_eq!(st.service_infos().len(), 1, "not due yet");
        assert_eq!(st.next_deadline(false), Some(t0 + Duration::from_secs(90)));
        st.run_timers(t0 + Duration::from_secs(89), false);
        assert_eq!(
            st.service_infos().len(),
            1,
            "due at 65 s, reaped at the 90 s run"
        );
        st.run_timers(t0 + Duration::from_secs(90), false);
        assert!(st.service_infos().is_empty());
        assert_eq!(st.next_deadline(false), None, "nothing left to reap");
    }

    #[test]
    fn reregistration_keeps_check_status() {
        let mut st = cluster();
        let t0 = Instant::now();
        st.register_service(
            "agent-0",
            ttl_service(Some(HealthStatus::Passing)),
            false,
            t0,
        )
        .map(|_| ())
        .unwrap_or_else(|e| panic!("{e}"));
        st.register_service("agent-0", ttl_service(None), false, t0)
            .map(|_| ())
            .unwrap_or_else(|e| panic!("{e}"));
        let services = st.service_infos();
        assert_eq!(services.len(), 1);
        assert_eq!(services[0].status, HealthStatus::Passing);
        assert_eq!(
            st.update_ttl_check("agent-0", "other", HealthStatus::Passing, String::new(), t0),
            Err(StateError::NoTtlCheck("other".into()))
        );
    }
}
