//! Server settings. Defaults are Consul's; tests shrink the time limits so
//! that expiry and reaping happen within a second instead of minutes.

use std::time::Duration;

/// How the test server behaves. `Config::default()` matches Consul's
/// defaults; tests typically lower `min_ttl` and
/// `min_deregister_critical_after` to keep runs short.
#[derive(Debug, Clone)]
pub struct Config {
    /// With a token here, ACLs are enforced: this token may do anything,
    /// tokens from [`TestConsul::add_token`](crate::TestConsul::add_token)
    /// get their policy, and every other request is answered 403
    /// `Permission denied`. `None` disables ACLs entirely.
    pub acl_master_token: Option<String>,
    /// A session is invalidated this many TTLs after its last renew.
    /// Consul's leader uses 2.0, so expiry lands between TTL and 2×TTL as
    /// seen by a client; a test can set 1.0 to make it exact.
    pub ttl_expiry_factor: f64,
    /// Longest accepted session `LockDelay`; longer values are clamped to it,
    /// as Consul does (60 s there).
    pub max_lock_delay: Duration,
    /// Shortest accepted session TTL (Consul: 10 s). Lower it in tests to
    /// use TTLs like `"1s"`.
    pub min_ttl: Duration,
    /// Shortest `DeregisterCriticalServiceAfter` (Consul: 1 min; shorter
    /// values are raised to it). Lower it in tests.
    pub min_deregister_critical_after: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            acl_master_token: None,
            ttl_expiry_factor: 2.0,
            max_lock_delay: Duration::from_secs(60),
            min_ttl: Duration::from_secs(10),
            min_deregister_critical_after: Duration::from_secs(60),
        }
    }
}

/// Consul's upper bound for a session TTL.
pub(crate) const MAX_SESSION_TTL: Duration = Duration::from_secs(86_400);

/// Consul's default session lock-delay.
pub(crate) const DEFAULT_LOCK_DELAY: Duration = Duration::from_secs(15);
