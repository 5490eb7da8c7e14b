//! Who may make an admin call: the bearer admin token, compared in
//! constant time, and the client certificate names; failures are counted
//! per peer and throttled (see `auth_throttle.rs`). The admin token is
//! never logged.

use std::net::IpAddr;

use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use super::auth_throttle::Gate;
use super::AdminService;
use crate::config::AdminToken;
use crate::error::ErrorKind;
use crate::metrics as m;
use crate::server::status::refusal;
use crate::server::tls::PeerCertificate;

const DISABLED: &str = "the admin API is disabled on this server: set admin.token or admin.token_file in its config (or IDGEN_ADMIN__TOKEN) and restart it";
const NO_CERT: &str = "admin calls on this server need a client certificate named in its admin.client_cert_names, over TLS (idgen admin: --addr https://... --ca, --cert, --key)";
const NO_HEADER: &str = "admin calls need the metadata `authorization: Bearer <token>` carrying the server's admin token (idgen admin: --token, --token-file or IDGEN_ADMIN__TOKEN)";
const WRONG_ADMIN_TOKEN: &str =
    "the admin token is wrong: use the token in the server's admin.token or admin.token_file";

/// Compares two admin tokens in time that depends only on their lengths, never
/// on where they first differ.
fn same_admin_token(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != expected.len());
    for (i, e) in expected.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(!e);
        diff |= std::hint::black_box(g ^ e);
    }
    std::hint::black_box(diff) == 0
}

/// The token of `Bearer <token>` (the scheme in any case).
fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Checks a call's credentials: with `names`, a verified client
/// certificate naming one of them, and the admin token as well when
/// `admin_token` is set; without, the admin token alone.
fn authorize_call(
    admin_token: Option<&AdminToken>,
    names: &[String],
    peer: Option<&PeerCertificate>,
    metadata: &MetadataMap,
) -> Result<(), Status> {
    if names.is_empty() {
        return authorize(admin_token, metadata);
    }
    match peer {
        None => Err(refusal(ErrorKind::Unauthenticated, NO_CERT)),
        Some(p) if !p.any_in(names) => Err(refusal(
            ErrorKind::Denied,
            format!(
                "the client certificate (names {:?}) is not allowed to administer: its subject CN or a SAN must be in the server's admin.client_cert_names",
                p.names
            ),
        )),
        Some(_) if admin_token.is_some() => authorize(admin_token, metadata),
        Some(_) => Ok(()),
    }
}

/// Checks a call's bearer token against the admin token `expected`.
fn authorize(expected: Option<&AdminToken>, metadata: &MetadataMap) -> Result<(), Status> {
    let Some(expected) = expected else {
        return Err(refusal(ErrorKind::Denied, DISABLED));
    };
    let given = metadata
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .ok_or_else(|| refusal(ErrorKind::Unauthenticated, NO_HEADER))?;
    if same_admin_token(given.as_bytes(), expected.0.as_bytes()) {
        Ok(())
    } else {
        Err(refusal(ErrorKind::Denied, WRONG_ADMIN_TOKEN))
    }
}

impl AdminService {
    /// Who the caller of a non-admin RPC is, when it presents admin
    /// credentials (an `authorization` header, or a client certificate
    /// named in `admin.client_cert_names`): `Ok(Some(who))` when they pass
    /// every admin check (allow list, token, certificate, throttle),
    /// `Ok(None)` for an anonymous caller, and the refusal when they are
    /// presented and wrong. `who` never holds the token.
    pub fn admin_caller<Req>(&self, request: &Request<Req>) -> Result<Option<String>, Status> {
        let cert = request.extensions().get::<PeerCertificate>();
        let named_cert = cert.filter(|p| p.any_in(&self.deps.client_cert_names));
        if request.metadata().get("authorization").is_none() && named_cert.is_none() {
            return Ok(None);
        }
        let peer = request.remote_addr().map(|p| p.ip());
        let port = if request.extensions().get::<super::ViaHttp>().is_some() {
            "http"
        } else {
            "grpc"
        };
        if let Some(ip) = peer.filter(|ip| !self.deps.allow.allows(*ip)) {
            crate::server::listener::count_refusal(port, "admin", &ip.to_string());
            return Err(refusal(
                ErrorKind::Denied,
                format!("peer {ip} is not in this node's admin.allow: call without admin credentials for the public view"),
            ));
        }
        self.authenticate(request, port, peer)?;
        Ok(Some(self.caller_name(request)))
    }

    /// How the audit log names the caller of `request` (its credential and
    /// peer, never the token), for a request whose credentials were
    /// checked: [`admin_caller`](Self::admin_caller), or an admin call
    /// that got past [`call`](Self::call)'s checks.
    pub fn caller_name<Req>(&self, request: &Request<Req>) -> String {
        let named_cert = request
            .extensions()
            .get::<PeerCertificate>()
            .filter(|p| p.any_in(&self.deps.client_cert_names));
        let via = match named_cert {
            Some(p) => format!("client certificate {:?}", p.names),
            None => "admin token".to_owned(),
        };
        let from = request
            .remote_addr()
            .map_or_else(|| "unknown peer".to_owned(), |a| a.ip().to_string());
        format!("{via} from {from}")
    }

    /// Checks the credentials of `request` unless its peer has failed too
    /// often (then RESOURCE_EXHAUSTED with a retry hint, unchecked); counts
    /// and logs failures per peer (see `admin/auth_throttle.rs`).
    pub(super) fn authenticate<Req>(
        &self,
        request: &Request<Req>,
        port: &'static str,
        peer: Option<IpAddr>,
    ) -> Result<(), Status> {
        let now = tokio::time::Instant::now();
        if let Some(ip) = peer {
            if let Gate::Refuse(left) = self.throttle.gate(ip, now) {
                metrics::counter!(m::ADMIN_AUTH_THROTTLED, "port" => port).increment(1);
                return Err(refusal(
                    ErrorKind::Exhausted,
                    format!(
                        "too many failed admin authentications from {ip}: retry in {} s with the right admin token",
                        left.as_secs().max(1)
                    ),
                ));
            }
        }
        let checked = authorize_call(
            self.deps.admin_token.as_ref(),
            &self.deps.client_cert_names,
            request.extensions().get::<PeerCertificate>(),
            request.metadata(),
        );
        let Some(ip) = peer else { return checked };
        match &checked {
            Ok(()) => self.throttle.succeeded(ip),
            // The API is off: not a guess at a credential.
            Err(s) if s.message() == DISABLED => {}
            Err(s) => {
                metrics::counter!(m::ADMIN_AUTH_FAILURES, "port" => port).increment(1);
                if let Some(w) = self.throttle.failed(ip, now) {
                    tracing::warn!(
                        port,
                        peer = %ip,
                        failures = w.failures,
                        refused_unchecked = w.refused,
                        shut_out_for = w.blocked_for.map(|d| humantime::format_duration(d).to_string()),
                        error = s.message(),
                        "failed admin authentication (logged when a peer starts failing and each time it is shut out; see idgen_admin_auth_failures_total)"
                    );
                }
            }
        }
        checked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;
    use tonic::Code;

    fn md(value: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(v) = value {
            m.insert("authorization", MetadataValue::try_from(v).unwrap());
        }
        m
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same_admin_token(b"s3cret", b"s3cret"));
        for other in [
            &b""[..],
            b"s3cre",
            b"s3crett",
            b"S3cret",
            b"x3cret",
            b"s3crex",
        ] {
            assert!(!same_admin_token(other, b"s3cret"), "{other:?}");
        }
        assert!(
            !same_admin_token(b"", b"\xff"),
            "a missing byte never matches"
        );
    }

    #[test]
    fn credentials_get_the_documented_codes() {
        let token = AdminToken("s3cret".into());
        let code = |t: Option<&AdminToken>, h: Option<&str>| {
            authorize(t, &md(h)).map_err(|s| s.code()).err()
        };
        assert_eq!(code(Some(&token), Some("Bearer s3cret")), None);
        assert_eq!(code(Some(&token), Some("bearer  s3cret ")), None);
        assert_eq!(code(Some(&token), None), Some(Code::Unauthenticated));
        assert_eq!(
            code(Some(&token), Some("s3cret")),
            Some(Code::Unauthenticated)
        );
        assert_eq!(
            code(Some(&token), Some("Basic s3cret")),
            Some(Code::Unauthenticated)
        );
        assert_eq!(
            code(Some(&token), Some("Bearer ")),
            Some(Code::Unauthenticated)
        );
        assert_eq!(
            code(Some(&token), Some("Bearer wrong")),
            Some(Code::PermissionDenied)
        );
        // No token on the server: off, whatever the caller sends.
        assert_eq!(
            code(None, Some("Bearer s3cret")),
            Some(Code::PermissionDenied)
        );
        assert_eq!(code(None, None), Some(Code::PermissionDenied));
        let s = authorize(None, &md(None)).unwrap_err();
        assert!(s.message().contains("admin.token"), "{s:?}");
        let s = authorize(Some(&token), &md(Some("Bearer wrong"))).unwrap_err();
        assert!(!s.message().contains("s3cret"));
    }
}
