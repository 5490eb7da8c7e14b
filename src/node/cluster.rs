//! What a Consul node joins the cluster with: its advertised address,
//! instance name, registration tags and the cluster's keys.

use std::net::SocketAddr;

use crate::cluster::supervisor::ClusterSpec;
use crate::config::{ClusterConfig, Config};
use crate::error::Error;
use crate::server::tls;
use crate::store::kv_paths::ClusterPaths;

/// The stable instance name: configured, or `<hostname>-<port>`.
pub(crate) fn instance_id(config: &Config, advertise: SocketAddr) -> String {
    if let Some(id) = &config.node.instance_id {
        return id.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| {
            h.trim()
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .take(50)
                .collect::<String>()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "idgen".into());
    format!("{host}-{}", advertise.port())
}

/// What a Consul node joins with: the advertised address (refused when
/// clients could not dial it), the name the agent's TLS probe verifies,
/// and the cluster's keys.
pub(super) fn cluster_spec(
    config: &Config,
    cluster: ClusterConfig,
) -> Result<(ClusterSpec, ClusterPaths), Error> {
    let advertise = config.node.advertise.unwrap_or(config.server.grpc_listen);
    if advertise.ip().is_unspecified() || advertise.port() == 0 {
        return Err(Error::Setup(format!(
            "cannot advertise {advertise} in Consul: clients cannot dial it; set node.advertise to this node's IP:port"
        )));
    }
    // With TLS the agent's probe must use it, and verify a name the
    // certificate carries.
    let check_tls_server_name = match &config.server.tls {
        Some(settings) => Some(
            tls::check_server_name(
                settings,
                advertise.ip(),
                cluster.check_tls_server_name.as_deref(),
            )
            .map_err(|e| Error::Setup(e.to_string()))?,
        ),
        None => None,
    };
    let keys = cluster.keys.clone();
    let spec = ClusterSpec {
        check_tls_server_name,
        config: cluster,
        datacenter: config.node.datacenter_id,
        worker_id: config.node.worker_id,
        layout: config.layout,
        layout_preset: config.layout_preset.clone(),
        layout_hide: config
            .layout_hide
            .as_ref()
            .map(|h| h.record_text())
            .unwrap_or_default(),
        generator_layout: config.generator_layout(),
        hwm: config.hwm,
        instance: instance_id(config, advertise),
        advertise,
        // Port 0 (bound later, in tests) is not advertised.
        metrics_port: Some(config.server.http_listen.port()).filter(|p| *p != 0),
        modes: served_modes(config),
    };
    Ok((spec, keys))
}

/// The modes `config` serves, as registration tags: snowflake and
/// formatted always, segment, lease and strict when enabled.
fn served_modes(config: &Config) -> Vec<String> {
    [
        ("snowflake", true),
        ("segment", config.segment.is_some()),
        ("lease", config.lease.is_some()),
        ("strict", config.strict.is_some()),
        ("formatted", true),
    ]
    .into_iter()
    .filter(|(_, on)| *on)
    .map(|(mode, _)| mode.to_owned())
    .collect()
}
