//! Each section validates itself into the settings type its part of the
//! node takes; [`FileConfig::validate`] composes them. Every error names
//! its key (`config key server.grpc_listen: ...`) and says what to use.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use super::file::{
    AdminSection, ClockSection, ConsulSection, FileConfig, HwmSection, LayoutSection, LeaseSection,
    LogSection, NodeSection, SegmentSection, ServerSection, StoreSection, StrictSection,
    TestingSection, CONSUL_SESSION_TTL_MIN,
};
use super::{
    invalid, AdminSettings, AdminToken, AllowList, Backend, BackendKind, Config, ConfigError,
    ConnectionSettings, CorsOrigins, FormattedSettings, LeaseModeSettings, LogSettings,
    NodeSettings, SegmentModeSettings, ServerSettings, StoreSettings, StrictModeSettings,
    TlsSettings,
};
use crate::id::{Layout, LayoutSpec, Preset};
use crate::store::hwm::HwmSettings;

mod consul;

impl FileConfig {
    /// Validates everything and produces the runtime config.
    pub fn validate(&self, now_ms: u64) -> Result<Config, ConfigError> {
        let layout = self.layout.validate(now_ms)?;
        let unit = Duration::from_millis(layout.time_unit_ms());
        let node = self.node.validate(&layout)?;
        let server = self.server.validate(unit)?;
        let store = self.store.validate(&self.consul, &self.testing)?;
        if let Backend::Consul(c) = &store.backend {
            if c.check_tls_server_name.is_some() && server.tls.is_none() {
                return Err(invalid(
                    "consul.check_tls_server_name",
                    "is set but [server.tls] is not: the health check uses TLS only when the node serves it",
                ));
            }
        }
        let hwm = self.hwm.validate(&self.clock, unit)?;
        let log = self.log.validate()?;
        let embedded = matches!(store.backend, Backend::Embedded { .. });
        Ok(Config {
            segment: self.segment.validate()?,
            lease: self.lease.validate(embedded.then_some((&layout, &node)))?,
            strict: self.strict.validate()?,
            formatted: self.validate_formats(now_ms)?,
            admin: self.admin.validate(server.tls.as_ref())?,
            layout_preset: self.layout.preset_name(),
            layout_hide: self.layout.hide_settings(&layout, now_ms)?,
            node,
            server,
            store,
            layout,
            hwm,
            log,
            hide: self.hide.validate()?,
        })
    }

    /// The layout this file describes, validated against `now_ms`.
    pub fn layout(&self, now_ms: u64) -> Result<Layout, ConfigError> {
        self.layout.validate(now_ms)
    }
}

impl LayoutSection {
    /// The layout, validated against `now_ms`.
    pub fn validate(&self, now_ms: u64) -> Result<Layout, ConfigError> {
        let l = self;
        let preset =
            Preset::parse(&l.preset).map_err(|e| invalid("layout.preset", e.to_string()))?;
        let epoch = humantime::parse_rfc3339(&l.epoch).map_err(|e| {
            invalid(
                "layout.epoch",
                format!(
                    "{:?} is not an RFC 3339 UTC time like 2024-01-01T00:00:00Z: {e}",
                    l.epoch
                ),
            )
        })?;
        let epoch_ms = epoch
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| invalid("layout.epoch", "must not be before 1970"))?
            .as_millis() as u64;
        let mut spec: LayoutSpec = preset.spec(epoch_ms);
        if let Some(unit) = l.time_unit {
            let ms = unit.as_millis() as u64;
            if Duration::from_millis(ms) != unit {
                return Err(invalid(
                    "layout.time_unit",
                    "must be a whole number of milliseconds",
                ));
            }
            spec.time_unit_ms = ms;
        }
        spec.time_bits = l.time_bits.unwrap_or(spec.time_bits);
        spec.datacenter_bits = l.datacenter_bits.unwrap_or(spec.datacenter_bits);
        spec.worker_bits = l.worker_bits.unwrap_or(spec.worker_bits);
        spec.sequence_bits = l.sequence_bits.unwrap_or(spec.sequence_bits);
        spec.validate(now_ms)
            .map_err(|e| invalid("layout", e.to_string()))
    }
}

impl NodeSection {
    /// The node's ids must fit `layout`; its name and advertised address
    /// must be usable.
    fn validate(&self, layout: &Layout) -> Result<NodeSettings, ConfigError> {
        layout
            .check_node(self.datacenter_id, 0)
            .map_err(|e| invalid("node.datacenter_id", e.to_string()))?;
        layout
            .check_node(0, self.worker_id)
            .map_err(|e| invalid("node.worker_id", e.to_string()))?;
        let instance_id = match self.instance_id.as_str() {
            "" => None,
            id if is_name(id, 64, true) => Some(id.to_owned()),
            id => {
                return Err(invalid(
                    "node.instance_id",
                    format!("{id:?}: use 1 to 64 of a-z A-Z 0-9 . _ -"),
                ))
            }
        };
        let advertise = match self.advertise.as_str() {
            "" => None,
            text => {
                let addr = parse_addr("node.advertise", text)?;
                if addr.ip().is_unspecified() || addr.port() == 0 {
                    return Err(invalid(
                        "node.advertise",
                        format!("{addr} cannot be dialled; give the IP and port clients reach this node on"),
                    ));
                }
                Some(addr)
            }
        };
        Ok(NodeSettings {
            datacenter_id: self.datacenter_id,
            worker_id: self.worker_id,
            instance_id,
            advertise,
        })
    }
}

impl ServerSection {
    /// Listeners, request limits and waits; `unit` is the layout's time
    /// unit (a call must be able to wait for at least two).
    fn validate(&self, unit: Duration) -> Result<ServerSettings, ConfigError> {
        let grpc_listen = parse_addr("server.grpc_listen", &self.grpc_listen)?;
        let http_listen = parse_addr("server.http_listen", &self.http_listen)?;
        if grpc_listen == http_listen && grpc_listen.port() != 0 {
            return Err(invalid(
                "server.http_listen",
                "must differ from server.grpc_listen",
            ));
        }
        if !(1..=1_000_000).contains(&self.max_batch) {
            return Err(invalid("server.max_batch", "must be between 1 and 1000000"));
        }
        if !(1024..=16 << 20).contains(&self.max_request_size) {
            return Err(invalid(
                "server.max_request_size",
                "must be between 1024 and 16777216 bytes",
            ));
        }
        let connections = self.connections()?;
        check_max("server.max_wait", self.max_wait, Duration::from_secs(60))?;
        check_max(
            "server.shutdown_grace",
            self.shutdown_grace,
            Duration::from_secs(3600),
        )?;
        if self.max_wait < 2 * unit {
            return Err(invalid(
                "server.max_wait",
                "must be at least two layout time units",
            ));
        }
        let tls = self.tls()?;
        let exposed = !grpc_listen.ip().is_loopback() || !http_listen.ip().is_loopback();
        if exposed && tls.is_none() && !self.insecure {
            return Err(invalid(
                "server.insecure",
                "a listen address is not loopback and [server.tls] is not set: set server.tls.cert and server.tls.key, or set server.insecure = true to serve plaintext on the network (the admin token and IDs then cross it in clear text)",
            ));
        }
        let allow = AllowList::parse(&self.allow).map_err(|e| invalid("server.allow", e))?;
        let cors = CorsOrigins::parse(&self.http.cors_allow_origins)
            .map_err(|e| invalid("server.http.cors_allow_origins", e))?;
        Ok(ServerSettings {
            allow,
            cors,
            insecure: exposed && tls.is_none(),
            tls,
            grpc_listen,
            http_listen,
            max_batch: self.max_batch,
            max_request_size: self.max_request_size as usize,
            max_wait: self.max_wait,
            shutdown_grace: self.shutdown_grace,
            connections,
        })
    }

    /// `[server.tls]`: both files or neither.
    fn tls(&self) -> Result<Option<TlsSettings>, ConfigError> {
        let t = &self.tls;
        match (t.cert.as_os_str().is_empty(), t.key.as_os_str().is_empty()) {
            (true, true) => Ok(None),
            (false, false) => {
                let client_ca = (!t.client_ca.as_os_str().is_empty()).then(|| t.client_ca.clone());
                if t.client_required && client_ca.is_none() {
                    return Err(invalid(
                        "server.tls.client_required",
                        "needs server.tls.client_ca: the CA (PEM) that client certificates must chain to",
                    ));
                }
                Ok(Some(TlsSettings {
                    cert: t.cert.clone(),
                    key: t.key.clone(),
                    client_ca,
                    client_required: t.client_required,
                }))
            }
            (true, false) => Err(invalid(
                "server.tls.cert",
                "is empty but server.tls.key is set: give the certificate chain (PEM) too",
            )),
            (false, true) => Err(invalid(
                "server.tls.key",
                "is empty but server.tls.cert is set: give the private key (PEM) too",
            )),
        }
    }

    /// The connection bounds, each checked against a sane range.
    fn connections(&self) -> Result<ConnectionSettings, ConfigError> {
        for (key, value) in [
            ("server.grpc_max_connections", self.grpc_max_connections),
            ("server.http_max_connections", self.http_max_connections),
            (
                "server.max_connections_per_peer",
                self.max_connections_per_peer,
            ),
        ] {
            if !(1..=1_000_000).contains(&value) {
                return Err(invalid(key, "must be between 1 and 1000000"));
            }
        }
        let ms = Duration::from_millis;
        for (key, value, min, max) in [
            (
                "server.header_timeout",
                self.header_timeout,
                ms(100),
                ms(600_000),
            ),
            (
                "server.request_body_timeout",
                self.request_body_timeout,
                ms(100),
                ms(600_000),
            ),
            (
                "server.grpc_idle_timeout",
                self.grpc_idle_timeout,
                ms(100),
                ms(86_400_000),
            ),
            (
                "server.grpc_keepalive_interval",
                self.grpc_keepalive_interval,
                ms(100),
                ms(86_400_000),
            ),
            (
                "server.grpc_keepalive_timeout",
                self.grpc_keepalive_timeout,
                ms(100),
                ms(600_000),
            ),
        ] {
            check_duration(key, value, min, max)?;
        }
        if !(1..=100_000).contains(&self.grpc_max_concurrent_streams) {
            return Err(invalid(
                "server.grpc_max_concurrent_streams",
                "must be between 1 and 100000",
            ));
        }
        if !(1024..=1 << 20).contains(&self.max_header_size) {
            return Err(invalid(
                "server.max_header_size",
                "must be between 1024 and 1048576 bytes",
            ));
        }
        Ok(ConnectionSettings {
            grpc_max_connections: self.grpc_max_connections as usize,
            http_max_connections: self.http_max_connections as usize,
            max_connections_per_peer: self.max_connections_per_peer as usize,
            header_timeout: self.header_timeout,
            request_body_timeout: self.request_body_timeout,
            grpc_idle_timeout: self.grpc_idle_timeout,
            grpc_keepalive_interval: self.grpc_keepalive_interval,
            grpc_keepalive_timeout: self.grpc_keepalive_timeout,
            grpc_max_concurrent_streams: self.grpc_max_concurrent_streams,
            max_header_size: self.max_header_size as usize,
        })
    }
}

impl StoreSection {
    /// The backend (with `[consul]` validated when it is Consul) and the
    /// unhealthy limit.
    fn validate(
        &self,
        consul: &ConsulSection,
        testing: &TestingSection,
    ) -> Result<StoreSettings, ConfigError> {
        let backend = match self.backend {
            BackendKind::Embedded => {
                if self.path.as_os_str().is_empty() {
                    return Err(invalid("store.path", "must not be empty"));
                }
                let mirror = &self.mirror_path;
                if mirror == &self.path {
                    return Err(invalid(
                        "store.mirror_path",
                        "must name a file other than store.path (best on another disk)",
                    ));
                }
                Backend::Embedded {
                    path: self.path.clone(),
                    init_if_missing: self.init_if_missing,
                    mirror_path: (!mirror.as_os_str().is_empty()).then(|| mirror.clone()),
                }
            }
            BackendKind::Consul => {
                if !self.mirror_path.as_os_str().is_empty() {
                    return Err(invalid(
                        "store.mirror_path",
                        "is for the embedded backend; in Consul mode back up Consul (`consul snapshot save`)",
                    ));
                }
                let ttl_min = testing.consul_session_ttl_min;
                if ttl_min < Duration::from_secs(1) || ttl_min > CONSUL_SESSION_TTL_MIN {
                    return Err(invalid(
                        "testing.consul_session_ttl_min",
                        format!(
                            "{} is out of range 1s..=10s (a test-only setting; leave it out)",
                            humantime::format_duration(ttl_min)
                        ),
                    ));
                }
                Backend::Consul(Box::new(consul.validate(ttl_min)?))
            }
        };
        check_max(
            "store.max_unhealthy",
            self.max_unhealthy,
            Duration::from_secs(86_400),
        )?;
        if self.max_unhealthy < Duration::from_secs(1) {
            return Err(invalid("store.max_unhealthy", "must be at least 1s"));
        }
        Ok(StoreSettings {
            backend,
            max_unhealthy: self.max_unhealthy,
        })
    }
}

impl HwmSection {
    /// The keeper's settings: the reservation, and the `[clock]` limits it
    /// enforces; `unit` is the layout's time unit.
    fn validate(&self, clock: &ClockSection, unit: Duration) -> Result<HwmSettings, ConfigError> {
        // Upper bounds keep every duration far from overflow and sane.
        check_max("hwm.reserve", self.reserve, Duration::from_secs(3600))?;
        check_max(
            "hwm.renew_interval",
            self.renew_interval,
            Duration::from_secs(600),
        )?;
        check_max(
            "clock.max_backward",
            clock.max_backward,
            Duration::from_secs(3600),
        )?;
        check_max(
            "clock.max_startup_skew",
            clock.max_startup_skew,
            Duration::from_secs(86_400),
        )?;
        if self.renew_interval < Duration::from_millis(10) {
            return Err(invalid("hwm.renew_interval", "must be at least 10ms"));
        }
        if self.reserve < 2 * self.renew_interval {
            return Err(invalid(
                "hwm.reserve",
                format!(
                    "must be at least twice hwm.renew_interval ({}), or one slow write stops issuing",
                    humantime::format_duration(self.renew_interval)
                ),
            ));
        }
        clock.check(unit, self.reserve)?;
        Ok(HwmSettings {
            reserve: self.reserve,
            renew_interval: self.renew_interval,
            max_startup_skew: clock.max_startup_skew,
            max_backward: clock.max_backward,
        })
    }
}

impl ClockSection {
    /// The lower bounds: a step back of two time units must be ridden
    /// out, and a start-up right after a crash (mark up to `reserve`
    /// ahead) must not be refused.
    fn check(&self, unit: Duration, reserve: Duration) -> Result<(), ConfigError> {
        let c = self;
        let min_backward =
            Duration::from_millis(2 * crate::id::snowflake::RACE_SLACK_MS).max(2 * unit);
        if c.max_backward < min_backward {
            return Err(invalid(
                "clock.max_backward",
                format!(
                    "must be at least {} (two time units, and above the {} ms by which racing threads' clock readings differ)",
                    humantime::format_duration(min_backward),
                    crate::id::snowflake::RACE_SLACK_MS
                ),
            ));
        }
        if c.max_startup_skew <= reserve {
            return Err(invalid(
                "clock.max_startup_skew",
                format!(
                    "must be larger than hwm.reserve ({}): after a crash the stored mark is up to that far ahead of a correct clock",
                    humantime::format_duration(reserve)
                ),
            ));
        }
        Ok(())
    }
}

impl LogSection {
    /// The level must be a level (or `target=level` directives).
    fn validate(&self) -> Result<LogSettings, ConfigError> {
        check_log_filter(&self.level).map_err(|problem| invalid("log.level", problem))?;
        Ok(LogSettings {
            level: self.level.clone(),
            format: self.format,
            color: self.color,
        })
    }
}

impl SegmentSection {
    /// Segment mode's settings when it is enabled, each checked.
    fn validate(&self) -> Result<Option<SegmentModeSettings>, ConfigError> {
        if !self.enabled {
            return Ok(None);
        }
        let s = self;
        crate::id::segment::check_step(s.default_step)
            .map_err(|e| invalid("segment.default_step", e.to_string()))?;
        if s.max_step < s.default_step || s.max_step > crate::id::segment::MAX_STEP {
            return Err(invalid(
                "segment.max_step",
                format!(
                    "must be between segment.default_step ({}) and {}",
                    s.default_step,
                    crate::id::segment::MAX_STEP
                ),
            ));
        }
        if s.max_tags == 0 {
            return Err(invalid(
                "segment.max_tags",
                "must be at least 1 (it bounds the live tags)".to_owned(),
            ));
        }
        if s.idle_release < Duration::from_secs(1) {
            return Err(invalid(
                "segment.idle_release",
                "must be at least 1s".to_owned(),
            ));
        }
        Ok(Some(self.settings()))
    }

    /// The settings as written, unchecked.
    pub(super) fn settings(&self) -> SegmentModeSettings {
        SegmentModeSettings {
            auto_create: self.auto_create,
            default_step: self.default_step,
            max_step: self.max_step,
            max_tags: self.max_tags,
            idle_release: self.idle_release,
        }
    }
}

impl LeaseSection {
    /// Lease mode's settings when it is enabled. `embedded` is the layout
    /// and node of an embedded node, which start at a token of their own
    /// range (`None` with Consul, which claims tokens).
    fn validate(
        &self,
        embedded: Option<(&Layout, &NodeSettings)>,
    ) -> Result<Option<LeaseModeSettings>, ConfigError> {
        if !self.enabled {
            return Ok(None);
        }
        crate::id::lease::check_zone(self.zone)
            .map_err(|e| invalid("lease.zone", e.to_string()))?;
        if let Some(token) = self.token {
            crate::id::lease::check_token(token)
                .map_err(|e| invalid("lease.token", e.to_string()))?;
        }
        crate::id::lease::check_block(self.block)
            .map_err(|e| invalid("lease.block", e.to_string()))?;
        if let Some(hide) = &self.hide {
            hide.check()
                .map_err(|e| invalid("lease.hide.version_bits", e.to_string()))?;
            if !valid_hide_key_id(&hide.key) {
                return Err(invalid(
                    "lease.hide.key",
                    format!(
                        "hide key id {:?} is malformed; use [a-z0-9][a-z0-9_-]{{0,62}} (`idgen admin keys create KEY`)",
                        hide.key
                    ),
                ));
            }
        }
        let mut settings = self.settings();
        if let Some((layout, node)) = embedded {
            settings.token = Some(embedded_lease_token(layout, node, self.token, &self.hide)?);
        }
        Ok(Some(settings))
    }

    /// The settings as written, unchecked.
    pub(super) fn settings(&self) -> LeaseModeSettings {
        LeaseModeSettings {
            zone: self.zone,
            token: self.token,
            block: self.block,
            hide: self.hide.clone(),
        }
    }
}

/// A hide key id: `[a-z0-9][a-z0-9_-]{0,62}`, as `idgen admin keys` takes.
fn valid_hide_key_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}

/// The token an embedded node starts lease mode at: the first of its own
/// range, or `explicit` if that lies inside the range. Anything else would
/// let two embedded nodes share a token space and hand out the same lease
/// IDs, so it is refused.
fn embedded_lease_token(
    layout: &Layout,
    node: &NodeSettings,
    explicit: Option<u64>,
    hide: &Option<crate::id::lease::ZoneHide>,
) -> Result<u64, ConfigError> {
    let spec = layout.spec();
    let (dc, worker) = (node.datacenter_id, node.worker_id);
    let token_bits = hide
        .as_ref()
        .map_or(crate::id::lease::TOKEN_BITS, |h| h.token_bits());
    let Some((first, last)) = crate::id::lease::node_token_range_in(
        dc,
        worker,
        spec.datacenter_bits,
        spec.worker_bits,
        token_bits,
    ) else {
        return Err(invalid(
            "lease.enabled",
            format!(
                "lease mode on the embedded store gives every (datacenter, worker) its own range of the 2^{token_bits} tokens (a hidden zone's version takes lease.hide.version_bits of the 16), which needs layout datacenter_bits + worker_bits <= {token_bits} (this layout has {} + {}); use store.backend = \"consul\", a layout with fewer node bits, or fewer version bits",
                spec.datacenter_bits, spec.worker_bits
            ),
        ));
    };
    match explicit {
        None => Ok(first),
        Some(t) if (first..=last).contains(&t) => Ok(t),
        Some(t) => {
            let owner = crate::id::lease::token_owner(t, spec.datacenter_bits, spec.worker_bits)
                .map(|(d, w)| format!(" (it belongs to datacenter {d}, worker {w})"))
                .unwrap_or_default();
            Err(invalid(
                "lease.token",
                format!(
                    "token {t} is outside this node's own range {first} to {last} (derived from datacenter {dc}, worker {worker}){owner}: two embedded nodes using the same token hand out the same lease IDs. Remove lease.token to start at {first}, or pick a token from {first} to {last}"
                ),
            ))
        }
    }
}

impl FileConfig {
    /// Formatted mode's settings: every `[[formats]]` entry compiles (so
    /// the node refuses to start with a format that could repeat), names
    /// are unique, and the block size is in range.
    fn validate_formats(&self, now_ms: u64) -> Result<FormattedSettings, ConfigError> {
        if !(1..=1_000_000).contains(&self.formatted.block) {
            return Err(invalid(
                "formatted.block",
                format!("must be 1 to 1000000, got {}", self.formatted.block),
            ));
        }
        let deadline = self.formatted.lua_deadline;
        if !(Duration::from_millis(1)..=Duration::from_secs(10)).contains(&deadline) {
            return Err(invalid(
                "formatted.lua_deadline",
                format!(
                    "must be 1ms to 10s, got {}",
                    humantime::format_duration(deadline)
                ),
            ));
        }
        if !(1..=64).contains(&self.formatted.lua_workers) {
            return Err(invalid(
                "formatted.lua_workers",
                format!("must be 1 to 64, got {}", self.formatted.lua_workers),
            ));
        }
        let budget = self.formatted.lua_check_budget;
        if !(Duration::from_millis(100)..=Duration::from_secs(600)).contains(&budget) {
            return Err(invalid(
                "formatted.lua_check_budget",
                format!(
                    "must be 100ms to 10m, got {}",
                    humantime::format_duration(budget)
                ),
            ));
        }
        if !(1..=1_000_000).contains(&self.formatted.max_scope_values) {
            return Err(invalid(
                "formatted.max_scope_values",
                format!(
                    "must be 1 to 1000000, got {}",
                    self.formatted.max_scope_values
                ),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        let limits = crate::id::format::LuaLimits {
            check_budget: budget,
            ..Default::default()
        };
        for (i, def) in self.formats.iter().enumerate() {
            // A Lua rule's checks run once, when the entry is first stored
            // (`modes::format_catalog`), not at every start.
            crate::id::format::Format::compile_with(
                def.clone(),
                now_ms as i64,
                limits,
                crate::id::format::LoadChecks::Skip,
            )
            .map_err(|e| invalid("formats", format!("entry {} ({:?}): {e}", i + 1, def.name)))?;
            if !seen.insert(def.name.as_str()) {
                return Err(invalid(
                    "formats",
                    format!(
                        "entry {} redefines format {:?}; each name once",
                        i + 1,
                        def.name
                    ),
                ));
            }
        }
        Ok(FormattedSettings {
            block: self.formatted.block,
            formats: self.formats.clone(),
            lua_deadline: deadline,
            lua_workers: self.formatted.lua_workers,
            lua_check_budget: budget,
            max_scope_values: self.formatted.max_scope_values,
        })
    }
}

impl StrictSection {
    /// Strict mode's settings when it is enabled, each checked.
    fn validate(&self) -> Result<Option<StrictModeSettings>, ConfigError> {
        if self.hide.is_some() {
            return Err(invalid(
                "strict.hide",
                "strict mode cannot hide its values: they are consecutive by contract (every value follows the last by the step); remove strict.hide, and use a hidden segment tag (admin tags create --hide-key) or a {seq:N:hidden} format for IDs that must not reveal volume".to_owned(),
            ));
        }
        if !self.enabled {
            return Ok(None);
        }
        crate::id::strict::check_step(self.default_step)
            .map_err(|e| invalid("strict.default_step", e.to_string()))?;
        for (key, value) in [
            ("strict.max_keys_per_namespace", self.max_keys_per_namespace),
            ("strict.max_namespaces", self.max_namespaces),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be at least 1".to_owned()));
            }
        }
        Ok(Some(self.settings()))
    }

    /// The settings as written, unchecked.
    pub(super) fn settings(&self) -> StrictModeSettings {
        StrictModeSettings {
            default_step: self.default_step,
            max_keys_per_namespace: self.max_keys_per_namespace,
            max_namespaces: self.max_namespaces,
        }
    }
}

impl AdminSection {
    /// The admin token, given inline or in a file (not both), and the
    /// client certificates allowed (which need TLS with a client CA).
    fn validate(&self, tls: Option<&TlsSettings>) -> Result<AdminSettings, ConfigError> {
        if !self.client_cert_names.is_empty() && tls.is_none_or(|t| t.client_ca.is_none()) {
            return Err(invalid(
                "admin.client_cert_names",
                "needs [server.tls] with client_ca set: client certificates are only seen over TLS",
            ));
        }
        let token = secret(
            &self.token,
            &self.token_file,
            "admin.token",
            "admin.token_file",
        )?
        .map(AdminToken);
        if self.client_cert_names.iter().any(|n| n.trim().is_empty()) {
            return Err(invalid(
                "admin.client_cert_names",
                "holds an empty name: list subject CNs or SAN names of the certificates allowed",
            ));
        }
        let allow = AllowList::parse(&self.allow).map_err(|e| invalid("admin.allow", e))?;
        Ok(AdminSettings {
            allow,
            token,
            client_cert_names: self.client_cert_names.clone(),
        })
    }
}

/// Reads a secret given inline or in a file (not both).
fn secret(
    inline: &str,
    file: &Path,
    key: &'static str,
    file_key: &'static str,
) -> Result<Option<String>, ConfigError> {
    match (inline.is_empty(), file.as_os_str().is_empty()) {
        (true, true) => Ok(None),
        (false, true) => Ok(Some(inline.to_owned())),
        (true, false) => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| invalid(file_key, format!("cannot read {}: {e}", file.display())))?;
            let token = text.trim();
            if token.is_empty() {
                return Err(invalid(file_key, format!("{} is empty", file.display())));
            }
            Ok(Some(token.to_owned()))
        }
        (false, false) => Err(invalid(key, format!("set {key} or {file_key}, not both"))),
    }
}

/// Refuses a duration outside `min..=max`, naming the key and the range.
fn check_duration(
    key: &'static str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(invalid(
            key,
            format!(
                "{} is out of range {}..={}",
                humantime::format_duration(value),
                humantime::format_duration(min),
                humantime::format_duration(max)
            ),
        ));
    }
    Ok(())
}

/// Refuses a duration above `max`, naming the key and the limit.
fn check_max(key: &'static str, value: Duration, max: Duration) -> Result<(), ConfigError> {
    if value > max {
        return Err(invalid(
            key,
            format!(
                "{} is too long; at most {}",
                humantime::format_duration(value),
                humantime::format_duration(max)
            ),
        ));
    }
    Ok(())
}

/// Checks a tracing filter the way an operator means it: every directive is
/// a level (`info`) or `target=level` (`idgen=debug`). A bare word that is
/// not a level would parse as a target name and silence every log line,
/// errors included.
pub fn check_log_filter(filter: &str) -> Result<(), String> {
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    let is_level = |s: &str| LEVELS.contains(&s.trim().to_ascii_lowercase().as_str());
    let mut directives = 0;
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        directives += 1;
        let level = match directive.rsplit_once('=') {
            Some((target, level)) if !target.trim().is_empty() => level,
            Some(_) => return Err(format!("{directive:?} has no target before '='")),
            None => directive,
        };
        if !is_level(level) {
            return Err(format!(
                "{level:?} is not a log level; use trace, debug, info, warn, error or off, \
                 optionally per target (e.g. \"idgen=debug,info\")"
            ));
        }
    }
    if directives == 0 {
        return Err("is empty; use info (the default), or another level".into());
    }
    tracing_subscriber::EnvFilter::try_new(filter)
        .map(|_| ())
        .map_err(|e| format!("{filter:?} is not a valid filter: {e}"))
}

/// `s` is 1..=`max` characters of `a-z 0-9 _ -` (plus `A-Z .` if `loose`).
fn is_name(s: &str, max: usize, loose: bool) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || b == b'_'
                || b == b'-'
                || (loose && (b.is_ascii_uppercase() || b == b'.'))
        })
}

/// Parses `IP:port`, naming the key on failure.
fn parse_addr(key: &'static str, value: &str) -> Result<SocketAddr, ConfigError> {
    value.parse().map_err(|e| {
        invalid(
            key,
            format!("{value:?} is not an IP:port address like 127.0.0.1:50051 ({e})"),
        )
    })
}
