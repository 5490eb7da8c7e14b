//! The front ends over one [`crate::modes::Issuer`]: gRPC
//! (`idgen.v1.IdGen`, `idgen.v1.Admin`, health, reflection), the HTTP JSON
//! API and metrics, the admin console, the listener with its connection
//! bounds, TLS, and the one mapping of errors to gRPC codes and HTTP
//! statuses. The node that assembles and runs them is [`crate::node`].

pub mod admin;
pub mod console;
pub mod cors;
pub mod grpc;
pub mod health;
pub mod http;
pub mod http_state;
pub mod listener;
pub mod request_size;
pub mod status;
pub mod tls;
