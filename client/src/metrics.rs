//! The client's metric names, declared in one place. They are recorded
//! through the `metrics` facade: install any recorder (e.g.
//! `metrics-exporter-prometheus`) in the application to export them.

/// Calls to idgen nodes, by `method` and `outcome` (`ok`, `error`).
pub const CALLS: &str = "idgen_client_calls_total";
/// Attempts repeated on another node after UNAVAILABLE or a transport error.
pub const RETRIES: &str = "idgen_client_retries_total";
/// Calls that succeeded on another node than the one first tried.
pub const FAILOVERS: &str = "idgen_client_failovers_total";
/// Times a node was set aside after answering UNAVAILABLE or failing to connect.
pub const SET_ASIDE: &str = "idgen_client_nodes_set_aside_total";
/// Nodes currently known.
pub const NODES: &str = "idgen_client_nodes";
/// Prefetch refills, by `mode` and `outcome`.
pub const REFILLS: &str = "idgen_client_refills_total";
/// IDs held in a prefetch buffer after the last refill or block change, by `mode` and `tag`.
pub const BUFFER_DEPTH: &str = "idgen_client_buffer_depth";
/// The batch size the next refill asks for, by `mode` and `tag`.
pub const BATCH_SIZE: &str = "idgen_client_batch_size";
/// Prefetched IDs thrown away unused, by `reason` (`age`, `shutdown`); they are gaps, never repeats.
pub const DISCARDED: &str = "idgen_client_ids_discarded_total";
/// Refills a prefetch buffer may have in flight at once now, by `mode` and `tag` (grows while callers wait at the largest batch).
pub const REFILL_LANES: &str = "idgen_client_refill_lanes";
/// Calls to `next_id` that found the buffer empty and waited for a refill.
pub const STALLS: &str = "idgen_client_buffer_stalls_total";
/// Seconds since the node list was last read from Consul.
pub const DISCOVERY_AGE: &str = "idgen_client_discovery_age_seconds";
/// Failed Consul discovery queries.
pub const DISCOVERY_ERRORS: &str = "idgen_client_discovery_errors_total";
/// 1 when the last Consul query succeeded, 0 while the client runs on the last known nodes.
pub const CONSUL_REACHABLE: &str = "idgen_client_consul_reachable";
/// 1 while the nodes in use are a fallback Consul datacenter's (the local one lists no passing idgen node), else 0.
pub const DATACENTER_FALLBACK: &str = "idgen_client_datacenter_fallback";
