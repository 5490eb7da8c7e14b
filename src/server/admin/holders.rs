//! The holders of worker ids, lease tokens and format tokens: listed,
//! force-released and their sessions renewed by hand. On Consul the
//! holders are read and changed by `cluster::holders` (which waits out a
//! released session's lock-delay); this file checks requests and builds
//! replies. On the embedded store this node is the only holder.

use std::time::Duration;

use tonic::Status;

use super::{consul_status, rfc3339, store_status, AdminService};
use crate::cluster::holders::{self, Holder, LockKey, Renewal};
use crate::error::ErrorKind;
use crate::id::format::TokenSpace;
use crate::proto::{self, HolderKind};
use crate::server::status::refusal;

/// The holder state reported for the embedded backend.
pub const EMBEDDED_STATE: &str = "embedded (this node)";

fn millis(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The kind, datacenter, zone and number of a held key as `ListHolders`
/// reports them, and for a format token its space and rendered token.
fn kind_fields(held: LockKey) -> (HolderKind, u64, u64, u64, String, String) {
    match held {
        LockKey::Worker(dc, w) => (HolderKind::Worker, dc, 0, w, String::new(), String::new()),
        LockKey::Token(zone, t) => (
            HolderKind::LeaseToken,
            0,
            zone,
            t,
            String::new(),
            String::new(),
        ),
        LockKey::FormatToken(space, t) => (
            HolderKind::FormatToken,
            0,
            0,
            t,
            space.name(),
            space.render(t),
        ),
    }
}

/// A Consul holder as `ListHolders` reports it.
fn holder_message(h: &Holder) -> proto::Holder {
    let (kind, datacenter, zone, id, space, rendered) = kind_fields(h.held);
    let (instance, address, since) = match &h.owner {
        Some(o) => (o.instance.clone(), o.address.clone(), rfc3339(o.since_ms)),
        None => (
            "<unreadable value>".to_owned(),
            String::new(),
            String::new(),
        ),
    };
    proto::Holder {
        kind: kind as i32,
        datacenter,
        zone,
        id,
        instance,
        address,
        since,
        session: h.session.clone().unwrap_or_default(),
        state: h.state.as_str().to_owned(),
        reserved: h.reserved,
        lock_delay_ms: millis(h.lock_delay()),
        session_ttl_ms: millis(h.session_ttl()),
        space,
        rendered,
    }
}

impl AdminService {
    pub(super) async fn list_holders(&self) -> Result<proto::ListHoldersResponse, Status> {
        let Some((client, keys)) = &self.deps.cluster else {
            return Ok(self.embedded_holders());
        };
        let listed = holders::list(client, keys).await.map_err(consul_status)?;
        Ok(proto::ListHoldersResponse {
            backend: "consul".into(),
            holders: listed.iter().map(holder_message).collect(),
        })
    }

    /// This node's worker id, lease token and format tokens, held since
    /// it started.
    fn embedded_holders(&self) -> proto::ListHoldersResponse {
        let node = &self.deps.node;
        let mut held = vec![LockKey::Worker(node.worker.datacenter, node.worker.worker)];
        if let Some(token) = node.lease.as_ref().and_then(|l| l.token()) {
            held.push(LockKey::Token(node.lease_zone.unwrap_or(0), token));
        }
        let format_tokens = node.formats.as_ref().map(|f| f.held_tokens());
        for (space, token) in format_tokens.unwrap_or_default() {
            held.push(LockKey::FormatToken(space, token));
        }
        let holders = held
            .into_iter()
            .map(|h| {
                let (kind, datacenter, zone, id, space, rendered) = kind_fields(h);
                proto::Holder {
                    kind: kind as i32,
                    datacenter,
                    zone,
                    id,
                    instance: node.instance.clone(),
                    address: node.address.clone(),
                    since: rfc3339(self.started_ms),
                    session: String::new(),
                    state: EMBEDDED_STATE.into(),
                    reserved: 0,
                    lock_delay_ms: 0,
                    session_ttl_ms: 0,
                    space,
                    rendered,
                }
            })
            .collect();
        proto::ListHoldersResponse {
            backend: "embedded".into(),
            holders,
        }
    }

    fn held(r: &proto::ForceReleaseRequest) -> Result<LockKey, Status> {
        let kind = HolderKind::try_from(r.kind);
        if !r.space.is_empty() && kind != Ok(HolderKind::FormatToken) {
            return Err(refusal(
                ErrorKind::BadRequest,
                "space is for a format token (HOLDER_KIND_FORMAT_TOKEN): leave it empty for a worker id or lease token",
            ));
        }
        match kind {
            Ok(HolderKind::Worker) if r.zone != 0 => Err(refusal(ErrorKind::BadRequest,
                "a worker id has a datacenter, not a zone: leave zone at 0 and set datacenter",
            )),
            Ok(HolderKind::Worker) => Ok(LockKey::Worker(r.datacenter, r.id)),
            Ok(HolderKind::LeaseToken) if r.datacenter != 0 => Err(refusal(ErrorKind::BadRequest,
                "a lease token has a zone, not a datacenter: leave datacenter at 0 and set zone",
            )),
            Ok(HolderKind::LeaseToken) => {
                crate::id::lease::check_zone(r.zone)
                    .and_then(|_| crate::id::lease::check_token(r.id))
                    .map_err(|e| store_status(e.into()))?;
                Ok(LockKey::Token(r.zone, r.id))
            }
            Ok(HolderKind::FormatToken) => Self::held_format_token(r),
            _ => Err(refusal(ErrorKind::BadRequest, format!(
                "kind {} is not one to release: use HOLDER_KIND_WORKER, HOLDER_KIND_LEASE_TOKEN or HOLDER_KIND_FORMAT_TOKEN (idgen admin release --kind worker|token|format-token)",
                r.kind
            ))),
        }
    }

    /// The format token a release request names: a known space and a
    /// token number inside it.
    fn held_format_token(r: &proto::ForceReleaseRequest) -> Result<LockKey, Status> {
        if r.datacenter != 0 || r.zone != 0 {
            return Err(refusal(ErrorKind::BadRequest,
                "a format token has a space, not a datacenter or zone: leave both at 0 and set space (as `idgen admin holders` shows it)",
            ));
        }
        let name = r.space.trim();
        let Some(space) = TokenSpace::from_name(name) else {
            return Err(refusal(ErrorKind::BadRequest, format!(
                "space {name:?} is not a format token space: give one as `idgen admin holders` shows it (digits-N or alnum-N with N from 1 to 4, or uniq64)"
            )));
        };
        if r.id >= space.size() {
            return Err(refusal(ErrorKind::BadRequest, format!(
                "token {} is outside space {space}, whose tokens are 0 to {} (give the number `idgen admin holders` shows as id, not the rendered token)",
                r.id,
                space.max()
            )));
        }
        Ok(LockKey::FormatToken(space, r.id))
    }

    pub(super) async fn force_release(
        &self,
        r: proto::ForceReleaseRequest,
    ) -> Result<proto::ForceReleaseResponse, Status> {
        let held = Self::held(&r)?;
        let Some((client, keys)) = &self.deps.cluster else {
            return Err(refusal(ErrorKind::Precondition,
                "this server runs on the embedded store: its worker id and lease token come from its config and nothing is leased, so there is nothing to release",
            ));
        };
        let Some(found) = holders::find(client, keys, held)
            .await
            .map_err(consul_status)?
        else {
            return Err(refusal(ErrorKind::NotFound, format!(
                "{held} has never been claimed in this cluster (no key {}); see `idgen admin holders`",
                held.key(keys)
            )));
        };
        let holder = holder_message(&found);
        let session = &holder.session;
        let not_held = match found.state {
            holders::SessionState::Released => Some(format!(
                "{held} is not held (last holder {} at {}): nothing to do",
                holder.instance, holder.address
            )),
            holders::SessionState::Gone => Some(format!(
                "{held}: its session {session} has just ended, so it is not held: nothing to do (it can be claimed once its lock-delay has passed)"
            )),
            holders::SessionState::Alive(_) if !r.force => {
                return Err(refusal(ErrorKind::Precondition, format!(
                    "{held} is held by instance {} at {} and its session {session} is alive; releasing it destroys that session, which frees everything that node holds: pass --force (force = true) to do it anyway (the holder stops issuing when it notices)",
                    holder.instance, holder.address
                )));
            }
            holders::SessionState::Alive(_) => None,
        };
        if let Some(message) = not_held {
            return Ok(proto::ForceReleaseResponse {
                released: false,
                message,
                holder: Some(holder),
                waited_ms: 0,
            });
        }
        let released = holders::force_release(client, &found)
            .await
            .map_err(|e| {
                refusal(ErrorKind::Unavailable, format!(
                    "could not destroy session {session} ({e}); it may or may not be gone: check with `idgen admin holders` and retry"
                ))
            })?
            .ok_or_else(|| {
                refusal(
                    ErrorKind::Internal,
                    format!("{held} had no live session to destroy"),
                )
            })?;
        let lock_delay = released.lock_delay;
        Ok(proto::ForceReleaseResponse {
            released: true,
            message: format!(
                "destroyed session {session} of instance {} at {}: this freed everything that node held (its worker id, and its lease token and format tokens, if any). It stops issuing by its lock deadline and claims again. Waited out the lock-delay ({lock_delay:?}): {held} is free now, for whoever claims it first",
                holder.instance, holder.address
            ),
            waited_ms: millis(Some(released.waited)),
            holder: Some(holder),
        })
    }

    pub(super) async fn renew_session(
        &self,
        r: proto::RenewSessionRequest,
    ) -> Result<proto::RenewSessionResponse, Status> {
        let session = r.session.trim();
        if session.is_empty() {
            return Err(refusal(
                ErrorKind::BadRequest,
                "give the session id to renew, as `idgen admin holders` (or the console) shows it",
            ));
        }
        let Some((client, keys)) = &self.deps.cluster else {
            return Err(refusal(ErrorKind::Precondition,
                "this server runs on the embedded store: it has no Consul session to renew (its worker id and lease token come from its config)",
            ));
        };
        let renewal = holders::renew(client, keys, session)
            .await
            .map_err(consul_status)?;
        let (ttl, held) = match renewal {
            Renewal::NotHolding => return Err(refusal(ErrorKind::NotFound, format!(
                "session {session:?} holds no worker id or lease token of this cluster: nothing to renew (see `idgen admin holders`)"
            ))),
            Renewal::Ended => return Err(refusal(ErrorKind::NotFound, format!(
                "session {session} has just ended: Consul no longer knows it, so nothing is renewed (its ids are free once their lock-delay has passed)"
            ))),
            Renewal::Renewed { ttl, holders } => {
                (ttl, holders.iter().map(holder_message).collect::<Vec<_>>())
            }
        };
        let ttl_ms = millis(ttl);
        tracing::warn!(session, ttl_ms, "admin renewed a holder's session by hand");
        Ok(proto::RenewSessionResponse {
            session: session.to_owned(),
            ttl_ms,
            message: format!(
                "renewed session {session} of instance {}: Consul keeps it (and the {} id(s) it holds) for {} ms more unless it is renewed again",
                held[0].instance,
                held.len(),
                ttl_ms
            ),
            holders: held,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn release_requests_are_checked() {
        let req = |kind: HolderKind, datacenter, zone| proto::ForceReleaseRequest {
            kind: kind as i32,
            datacenter,
            zone,
            id: 3,
            force: false,
            space: String::new(),
        };
        let format = |space: &str, id| proto::ForceReleaseRequest {
            space: space.into(),
            id,
            ..req(HolderKind::FormatToken, 0, 0)
        };
        let held = |r| AdminService::held(&r).map_err(|s| s.code());
        assert_eq!(
            held(req(HolderKind::Worker, 1, 0)),
            Ok(LockKey::Worker(1, 3))
        );
        assert_eq!(
            held(req(HolderKind::LeaseToken, 0, 2)),
            Ok(LockKey::Token(2, 3))
        );
        let alnum2 = TokenSpace::from_name("alnum-2").unwrap();
        assert_eq!(
            held(format("alnum-2", 1295)),
            Ok(LockKey::FormatToken(alnum2, 1295))
        );
        assert_eq!(
            held(format("uniq64", 4095)),
            Ok(LockKey::FormatToken(TokenSpace::Uniq64, 4095))
        );
        for bad in [
            req(HolderKind::Unspecified, 0, 0),
            req(HolderKind::Worker, 0, 1),
            req(HolderKind::LeaseToken, 1, 0),
            req(HolderKind::LeaseToken, 0, 1000),
            // A format token: an unknown space, a token outside its space,
            // no space, a datacenter or zone, a space on another kind.
            format("alnum-9", 1),
            format("alnum-2", 1296),
            format("uniq64", 4096),
            format("", 1),
            proto::ForceReleaseRequest {
                zone: 1,
                ..format("digits-2", 1)
            },
            proto::ForceReleaseRequest {
                datacenter: 1,
                ..format("digits-2", 1)
            },
            proto::ForceReleaseRequest {
                space: "digits-2".into(),
                ..req(HolderKind::Worker, 1, 0)
            },
        ] {
            assert_eq!(held(bad), Err(Code::InvalidArgument));
        }
    }
}
