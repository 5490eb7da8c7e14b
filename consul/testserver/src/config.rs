//! Server settings. Defaults are Consul's; tests shrink the time limits so
//! that expiry and reaping happen within a second instead of minutes. Each
//! such limit mirrors a setting real Consul has too (named in its doc), so
//! a test that lowers one describes a Consul that could exist.

use std::time::Duration;

/// How the test server behaves. `Config::default()` matches Consul's
/// defaults; tests typically lower `min_ttl`,
/// `min_deregister_critical_after` and `check_reap_interval` to keep runs
/// short.
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
    /// Shortest accepted session TTL: Consul's server option
    /// `session_ttl_min` (default 10 s). A TTL below it (or above 24 h) is
    /// refused with 500 `Invalid Session TTL '<ns>'`. Lower it in tests to
    /// use TTLs like `"1s"`; a production Consul has 10 s.
    pub min_ttl: Duration,
    /// Shortest `DeregisterCriticalServiceAfter`: Consul's
    /// `check_deregister_interval_min` (1 min; shorter values are raised to
    /// it). Lower it in tests.
    pub min_deregister_critical_after: Duration,
    /// How often the agent's reaper looks for services whose check has been
    /// critical for longer than their `DeregisterCriticalServiceAfter`:
    /// Consul's `check_reap_interval` (30 s). A service is removed at the
    /// first reaper run after that time, not at it. `Duration::ZERO` reaps
    /// exactly on time (no real Consul does that).
    pub check_reap_interval: Duration,
    /// Serve HTTPS instead of HTTP on every agent (Consul's HTTPS port
    /// with `tls.https`). `None`: plaintext HTTP.
    pub https: Option<HttpsConfig>,
    /// What gRPC checks with `GRPCUseTLS` trust and present (Consul's
    /// `enable_agent_tls_for_checks` with the agent's CA and certificate).
    pub check_tls: CheckTlsConfig,
    /// How long a Raft write (KV and txn writes, session create and
    /// destroy, snapshot restore) takes to commit; concurrent writes share
    /// one commit round (see the `latency` module). Zero (the default):
    /// at once. Consul's docs put a write at a few ms on good disks.
    pub raft_write_delay: Duration,
    /// How long a `?consistent` read waits for the leader to confirm it
    /// still leads (one round of heartbeats to a quorum). Zero (the
    /// default): at once.
    pub consistent_read_delay: Duration,
    /// The name of the datacenter [`TestConsul::start`](crate::TestConsul::start)
    /// creates (Consul's `datacenter`, default `dc1`). More datacenters join
    /// it with [`TestConsul::add_datacenter`](crate::TestConsul::add_datacenter).
    pub datacenter: String,
    /// Consul's `primary_datacenter`, which every agent of every linked
    /// datacenter reports in `/v1/agent/self`. `None`: the first one,
    /// [`Config::datacenter`].
    pub primary_datacenter: Option<String>,
}

/// The agents' HTTPS certificate, PEM, and optionally the CA that client
/// certificates must chain to.
#[derive(Clone, Default)]
pub struct HttpsConfig {
    /// Certificate chain, leaf first.
    pub cert_pem: Vec<u8>,
    /// Private key of the leaf.
    pub key_pem: Vec<u8>,
    /// With a CA here every client must present a certificate it signed
    /// (Consul's `verify_incoming`); the handshake of any other fails.
    pub client_ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for HttpsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpsConfig")
            .field("verify_incoming", &self.client_ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

/// TLS of gRPC health probes with `GRPCUseTLS`. The probe verifies the
/// chain against `ca_pem` and the name against the check's
/// `TLSServerName`, or the target's host when that is empty (Consul
/// 1.21). Without a CA nothing is trusted: Consul without
/// `enable_agent_tls_for_checks` uses the system roots, which hold no test
/// CA, so such a check stays critical there too.
#[derive(Clone, Default)]
pub struct CheckTlsConfig {
    /// CA certificate(s) the probed servers' certificates must chain to.
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate chain and key the probe presents.
    pub client_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for CheckTlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckTlsConfig")
            .field("ca", &self.ca_pem.is_some())
            .field("client_cert", &self.client_pem.is_some())
            .finish()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            acl_master_token: None,
            ttl_expiry_factor: 2.0,
            max_lock_delay: Duration::from_secs(60),
            min_ttl: Duration::from_secs(10),
            min_deregister_critical_after: Duration::from_secs(60),
            check_reap_interval: Duration::from_secs(30),
            https: None,
            check_tls: CheckTlsConfig::default(),
            raft_write_delay: Duration::ZERO,
            consistent_read_delay: Duration::ZERO,
            datacenter: "dc1".to_owned(),
            primary_datacenter: None,
        }
    }
}

/// Consul's upper bound for a session TTL.
pub(crate) const MAX_SESSION_TTL: Duration = Duration::from_secs(86_400);

/// Consul's default session lock-delay.
pub(crate) const DEFAULT_LOCK_DELAY: Duration = Duration::from_secs(15);

/// Consul's `checks.MinInterval`: a check `Interval` below it is raised to
/// it.
pub(crate) const MIN_CHECK_INTERVAL: Duration = Duration::from_secs(1);
