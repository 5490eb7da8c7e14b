//! Cluster membership: how a node gets, keeps and gives up its identity.
//!
//! A node is a member either statically (the embedded backend: the worker
//! id comes from the configuration and the state file) or through Consul:
//! [`worker_lock`] claims a worker id with a session lock and keeps the
//! local fencing deadline, [`supervisor`] renews it, fences the node the
//! moment it may no longer be the holder and claims again, and
//! [`registration`] registers the node as a Consul service with a gRPC
//! health check so clients find only nodes that are issuing IDs.
//! Before any of it, `store::datacenter_claim` registers the node's
//! datacenter id in the primary Consul datacenter, so two Consul
//! datacenters never share one; [`datacenter_release`] frees one for
//! another datacenter (rule 44).
//! [`holders`] reads who holds each worker id and token of a Consul
//! cluster, and force-releases or renews a holder's session for the
//! admin API. [`status`] publishes each node's status to Consul KV and
//! reads every node's back, with Consul's health, for the console.

pub mod datacenter_release;
pub mod holders;
pub mod membership;
pub mod registration;
pub mod settings;
pub mod status;
pub mod supervisor;
pub mod worker_lock;
