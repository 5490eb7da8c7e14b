//! The Consul test server and clients of it, as the integration tests use
//! them: one place for the settings every cluster test relies on.

use std::time::Duration;

use consul_testserver::{Config, TestConsul};
use idgen::consul::{ConsulClient, ConsulConfig};

/// The Consul test server's settings for cluster tests: session TTLs down
/// to 1 s (idgen opts in with `[testing] consul_session_ttl_min`, which
/// `write_cluster_config` writes), sessions expiring exactly one TTL after
/// their last renew (the earliest real Consul may), and critical services
/// reaped after 1 s. Tests that need more set it over these:
/// `Config { acl_master_token: .., ..cluster_settings() }`.
pub fn cluster_settings() -> Config {
    Config {
        min_ttl: Duration::from_secs(1),
        ttl_expiry_factor: 1.0,
        min_deregister_critical_after: Duration::from_secs(1),
        ..Config::default()
    }
}

/// The Consul test server started with `config`.
pub async fn start(config: Config) -> TestConsul {
    TestConsul::start(config).await.expect("test consul")
}

/// The Consul test server with [`cluster_settings`].
pub async fn test_consul() -> TestConsul {
    start(cluster_settings()).await
}

/// A client of `consul` over plain HTTP without an ACL token: each request
/// given `timeout`, idempotent calls retried `retries` times.
pub fn client(consul: &TestConsul, timeout: Duration, retries: u32) -> ConsulClient {
    ConsulClient::new(ConsulConfig {
        address: format!("http://{}", consul.addr()),
        timeout,
        retries,
        ..ConsulConfig::default()
    })
    .expect("a client of the test server")
}

/// A client of `consul` with idgen's default timeout and retries.
pub fn default_client(consul: &TestConsul) -> ConsulClient {
    let defaults = ConsulConfig::default();
    client(consul, defaults.timeout, defaults.retries)
}

/// An ACL-enabled test server with [`cluster_settings`]: master token
/// `master`, and a token `reader` that may read everything (what a client
/// that only discovers nodes is given).
pub async fn acl_consul() -> TestConsul {
    let consul = start(Config {
        acl_master_token: Some("master".into()),
        ..cluster_settings()
    })
    .await;
    consul.add_token(
        "reader",
        consul_testserver::Policy {
            read_all: true,
            ..consul_testserver::Policy::default()
        },
    );
    consul
}
