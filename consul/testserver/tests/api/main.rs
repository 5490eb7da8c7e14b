//! End-to-end tests of the Consul test server over HTTP, one module per
//! area of the API. Every server binds 127.0.0.1:0.

mod acl;
mod agent;
mod blocking;
mod datacenters;
mod faults;
mod https;
mod kv;
mod sessions;
mod snapshot;
mod support;
mod txn;
