//! The `[consul]` section: the agent's address and TLS, the ACL token,
//! the key prefix, the worker lock's timing and the request, probe and
//! back-off timings, validated into [`ClusterConfig`].

use std::path::PathBuf;
use std::time::Duration;

use super::super::file::{ConsulSection, CONSUL_SESSION_TTL_MIN};
use super::super::{invalid, ClusterConfig, ConfigError, WorkerClaim};
use super::{check_duration, is_name, secret};
use crate::cluster::worker_lock::WorkerLockSettings;
use crate::consul::{ConsulConfig, ConsulTls, ConsulTlsFiles};
use crate::store::kv_paths::ClusterPaths;

impl ConsulSection {
    /// `session_ttl_min` is Consul's minimum session TTL (10 s unless a
    /// test lowers it through `[testing]`).
    pub(super) fn validate(&self, session_ttl_min: Duration) -> Result<ClusterConfig, ConfigError> {
        let https = self.check_address()?;
        let tls = self.tls(https)?;
        let acl_token = secret(
            &self.token,
            &self.token_file,
            "consul.token",
            "consul.token_file",
        )?;
        let prefix = self.check_names()?;
        let lock = self.worker_lock(session_ttl_min)?;
        self.check_timings(&lock)?;
        Ok(ClusterConfig {
            client: ConsulConfig {
                address: self.address.trim_end_matches('/').to_owned(),
                acl_token,
                timeout: self.timeout,
                retries: self.retries,
                tls,
                ..ConsulConfig::default()
            },
            check_tls_server_name: Some(self.check_tls_server_name.trim())
                .filter(|n| !n.is_empty())
                .map(str::to_owned),
            keys: ClusterPaths::new(prefix, &self.cluster).with_index_file(
                Some(self.index_file.clone()).filter(|p| !p.as_os_str().is_empty()),
            ),
            service: self.service.clone(),
            static_worker: self.worker == WorkerClaim::Static,
            lock,
            check_interval: self.check_interval,
            check_timeout: self.check_timeout,
            deregister_after: self.deregister_critical_after,
            reclaim_backoff_max: self.reclaim_backoff_max,
            primary_datacenter: Some(self.primary_datacenter.trim())
                .filter(|n| !n.is_empty())
                .map(str::to_owned),
        })
    }

    /// The agent's address must be `http://host:port` or
    /// `https://host:port`; returns whether it is HTTPS.
    fn check_address(&self) -> Result<bool, ConfigError> {
        let url = url::Url::parse(&self.address).map_err(|e| {
            invalid(
                "consul.address",
                format!(
                    "{:?} is not a URL like http://127.0.0.1:8500 ({e})",
                    self.address
                ),
            )
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() || url.path() != "/" {
            return Err(invalid(
                "consul.address",
                format!(
                    "{:?}: give the agent's http://host:port, or https://host:port with consul.ca_file",
                    self.address
                ),
            ));
        }
        Ok(url.scheme() == "https")
    }

    /// The HTTPS settings: loaded and checked with an `https://` address,
    /// refused with an `http://` one.
    fn tls(&self, https: bool) -> Result<Option<ConsulTls>, ConfigError> {
        let path = |p: &PathBuf| Some(p.clone()).filter(|p| !p.as_os_str().is_empty());
        let files = ConsulTlsFiles {
            ca_file: self.ca_file.clone(),
            cert_file: path(&self.cert_file),
            key_file: path(&self.key_file),
            server_name: Some(self.tls_server_name.trim())
                .filter(|n| !n.is_empty())
                .map(str::to_owned),
        };
        let any = path(&self.ca_file).is_some()
            || files.cert_file.is_some()
            || files.key_file.is_some()
            || files.server_name.is_some();
        if !https {
            if any {
                return Err(invalid(
                    "consul.address",
                    format!(
                        "{:?} is plaintext http:// but consul.ca_file, cert_file, key_file or tls_server_name is set: use https:// (the agent's HTTPS port, 8501 by default), or leave those keys empty",
                        self.address
                    ),
                ));
            }
            return Ok(None);
        }
        if path(&self.ca_file).is_none() {
            return Err(invalid(
                "consul.ca_file",
                format!(
                    "is empty but consul.address {:?} is https://: give the CA certificate (PEM) that signed the agent's HTTPS certificate",
                    self.address
                ),
            ));
        }
        ConsulTls::load(&files)
            .map(Some)
            .map_err(|e| invalid(e.key, e.problem))
    }

    /// The KV prefix (trimmed of `/`), cluster and service names.
    fn check_names(&self) -> Result<&str, ConfigError> {
        let prefix = self.prefix.trim_matches('/');
        if prefix.is_empty() || !prefix.split('/').all(|p| is_name(p, 64, false)) {
            return Err(invalid(
                "consul.prefix",
                format!("{:?}: use a-z 0-9 _ - segments separated by /", self.prefix),
            ));
        }
        if !is_name(&self.cluster, 64, false) {
            return Err(invalid(
                "consul.cluster",
                format!("{:?}: use 1 to 64 of a-z 0-9 _ -", self.cluster),
            ));
        }
        if !is_name(&self.service, 64, false) {
            return Err(invalid(
                "consul.service",
                format!("{:?}: use 1 to 64 of a-z 0-9 _ -", self.service),
            ));
        }
        let primary = &self.primary_datacenter;
        if !primary.is_empty() && !is_name(primary, 64, false) {
            return Err(invalid(
                "consul.primary_datacenter",
                format!("{primary:?}: a Consul datacenter name, 1 to 64 of a-z 0-9 _ - (empty: this node's own Consul datacenter)"),
            ));
        }
        Ok(prefix)
    }

    /// The worker lock's timing: a TTL Consul accepts, and a lock-delay
    /// and margin that fit it.
    fn worker_lock(&self, session_ttl_min: Duration) -> Result<WorkerLockSettings, ConfigError> {
        if self.session_ttl < session_ttl_min {
            let whose = if session_ttl_min == CONSUL_SESSION_TTL_MIN {
                "Consul's minimum session TTL (its session_ttl_min, 10s by default)".to_owned()
            } else {
                format!(
                    "the minimum {} set by testing.consul_session_ttl_min",
                    humantime::format_duration(session_ttl_min)
                )
            };
            return Err(invalid(
                "consul.session_ttl",
                format!(
                    "{} is below {whose}: Consul refuses to create such a session; use at least {}",
                    humantime::format_duration(self.session_ttl),
                    humantime::format_duration(session_ttl_min)
                ),
            ));
        }
        let lock = WorkerLockSettings {
            ttl: self.session_ttl,
            lock_delay: self.lock_delay,
            margin: self.lock_margin,
        };
        lock.check().map_err(|e| {
            let key = if e.starts_with("lock_delay") {
                "consul.lock_delay"
            } else if e.starts_with("margin") {
                "consul.lock_margin"
            } else {
                "consul.session_ttl"
            };
            invalid(key, e)
        })?;
        Ok(lock)
    }

    /// Request, probe and back-off timings, and the retry count.
    fn check_timings(&self, lock: &WorkerLockSettings) -> Result<(), ConfigError> {
        let (ms, s) = (Duration::from_millis, Duration::from_secs);
        for (key, value, min, max) in [
            ("consul.timeout", self.timeout, ms(50), s(60)),
            (
                "consul.check_interval",
                self.check_interval,
                ms(100),
                s(600),
            ),
            ("consul.check_timeout", self.check_timeout, ms(100), s(600)),
            (
                "consul.deregister_critical_after",
                self.deregister_critical_after,
                s(1),
                s(86_400),
            ),
            (
                "consul.reclaim_backoff_max",
                self.reclaim_backoff_max,
                ms(100),
                s(600),
            ),
        ] {
            check_duration(key, value, min, max)?;
        }
        // A renew must be able to finish well inside the lock's lifetime.
        if self.timeout > lock.ttl / 3 {
            return Err(invalid(
                "consul.timeout",
                format!(
                    "{} is too long for session_ttl {}: at most a third of the TTL",
                    humantime::format_duration(self.timeout),
                    humantime::format_duration(lock.ttl)
                ),
            ));
        }
        if self.retries > 10 {
            return Err(invalid("consul.retries", "at most 10"));
        }
        Ok(())
    }
}
