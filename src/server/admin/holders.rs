//! The holders of worker ids, lease tokens and format tokens: listed,
//! force-released (returning only after the released session's
//! lock-delay) and their sessions renewed by hand.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tonic::Status;

use super::{consul_status, rfc3339, store_status, AdminService};
use crate::consul::{Consistency, KvEntry, SessionInfo};
use crate::error::ErrorKind;
use crate::id::format::TokenSpace;
use crate::proto::{self, HolderKind};
use crate::server::status::refusal;
use crate::store::consul::{ClusterKeys, OwnerInfo};
use crate::store::lease::TokenRecord;
use crate::store::WorkerKey;

/// The longest lock-delay Consul applies; a forced release never waits
/// longer.
const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);

/// Consul's lock-delay when a session does not report one.
const DEFAULT_LOCK_DELAY: Duration = Duration::from_secs(15);

/// The holder state reported for the embedded backend.
pub const EMBEDDED_STATE: &str = "embedded (this node)";

/// A worker id or lease token named by a request or a KV key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum LockKey {
    /// Datacenter, worker.
    Worker(u64, u64),
    /// Zone, token.
    Token(u64, u64),
    /// A formatted-mode token: space, token.
    FormatToken(TokenSpace, u64),
}

impl std::fmt::Display for LockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Worker(dc, w) => write!(f, "worker id {dc}/{w}"),
            Self::Token(zone, t) => write!(f, "lease token {zone}/{t}"),
            Self::FormatToken(space, t) => write!(f, "format token {space}/{t}"),
        }
    }
}

impl LockKey {
    fn key(self, keys: &ClusterKeys) -> String {
        match self {
            Self::Worker(datacenter, worker) => keys.worker(WorkerKey { datacenter, worker }),
            Self::Token(zone, token) => keys.lease(zone, token),
            Self::FormatToken(space, token) => {
                format!("{}{token}", keys.format_token_dir(&space.name()))
            }
        }
    }
}

/// A folder of every datacenter's (or zone's) keys, from the folder of
/// group 0: `<root>/workers/0/` -> `<root>/workers/`.
fn all_groups(group_zero: &str) -> String {
    group_zero
        .strip_suffix("0/")
        .unwrap_or(group_zero)
        .to_owned()
}

/// `<group>/<id>` under `dir`.
fn group_and_id(dir: &str, key: &str) -> Option<(u64, u64)> {
    let (group, id) = key.strip_prefix(dir)?.split_once('/')?;
    Some((group.parse().ok()?, id.parse().ok()?))
}

fn millis(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What a held key's value says, and the session holding it (`info`, when
/// it is alive).
fn holder_from(
    held: LockKey,
    entry: &KvEntry,
    state: &str,
    info: Option<&SessionInfo>,
) -> proto::Holder {
    let (kind, datacenter, zone, id) = match held {
        LockKey::Worker(dc, w) => (HolderKind::Worker, dc, 0, w),
        LockKey::Token(zone, t) => (HolderKind::LeaseToken, 0, zone, t),
        LockKey::FormatToken(_, t) => (HolderKind::FormatToken, 0, 0, t),
    };
    let (space, rendered) = match held {
        LockKey::FormatToken(space, t) => (space.name(), space.render(t)),
        _ => (String::new(), String::new()),
    };
    let (owner, reserved) = match held {
        LockKey::Worker(..) => (serde_json::from_slice::<OwnerInfo>(&entry.value).ok(), 0),
        LockKey::Token(..) | LockKey::FormatToken(..) => {
            match serde_json::from_slice::<TokenRecord>(&entry.value) {
                Ok(r) => (Some(r.owner), r.reserved),
                Err(_) => (None, 0),
            }
        }
    };
    let (instance, address, since) = match owner {
        Some(o) => (o.instance, o.address, rfc3339(o.since_ms)),
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
        session: entry.session.clone().unwrap_or_default(),
        state: state.to_owned(),
        reserved,
        lock_delay_ms: millis(info.map(|i| i.lock_delay.unwrap_or(DEFAULT_LOCK_DELAY))),
        session_ttl_ms: millis(info.and_then(|i| i.ttl)),
        space,
        rendered,
    }
}

impl AdminService {
    pub(super) async fn list_holders(&self) -> Result<proto::ListHoldersResponse, Status> {
        let Some((client, keys)) = &self.deps.cluster else {
            return Ok(self.embedded_holders());
        };
        let workers_dir = all_groups(&keys.workers_dir(0));
        let lease_dir = all_groups(&keys.lease_dir(0));
        let workers = client
            .kv_list(&workers_dir, Consistency::Consistent)
            .await
            .map_err(consul_status)?;
        let tokens = client
            .kv_list(&lease_dir, Consistency::Consistent)
            .await
            .map_err(consul_status)?;
        let mut entries: Vec<(LockKey, KvEntry)> = Vec::new();
        for e in workers {
            if let Some((dc, w)) = group_and_id(&workers_dir, &e.key) {
                entries.push((LockKey::Worker(dc, w), e));
            }
        }
        for e in tokens {
            if let Some((zone, t)) = group_and_id(&lease_dir, &e.key) {
                entries.push((LockKey::Token(zone, t), e));
            }
        }
        let format_dir = keys.format_tokens_dir();
        let format_tokens = client
            .kv_list(&format_dir, Consistency::Consistent)
            .await
            .map_err(consul_status)?;
        for e in format_tokens {
            let held = e
                .key
                .strip_prefix(&format_dir)
                .and_then(|rest| rest.split_once('/'))
                .and_then(|(space, t)| Some((TokenSpace::from_name(space)?, t.parse().ok()?)));
            if let Some((space, t)) = held {
                entries.push((LockKey::FormatToken(space, t), e));
            }
        }
        entries.sort_by_key(|(h, _)| *h);
        // One node's worker id and token share a session: ask once.
        let mut sessions: HashMap<String, Option<SessionInfo>> = HashMap::new();
        let mut holders = Vec::with_capacity(entries.len());
        for (held, e) in &entries {
            let (state, info) = match &e.session {
                None => ("released", None),
                Some(s) => {
                    if !sessions.contains_key(s) {
                        let info = client.session_info(s).await.map_err(consul_status)?;
                        sessions.insert(s.clone(), info);
                    }
                    match sessions.get(s) {
                        Some(Some(info)) => ("alive", Some(info)),
                        _ => ("gone", None),
                    }
                }
            };
            holders.push(holder_from(*held, e, state, info));
        }
        Ok(proto::ListHoldersResponse {
            backend: "consul".into(),
            holders,
        })
    }

    fn embedded_holders(&self) -> proto::ListHoldersResponse {
        let node = &self.deps.node;
        let since = rfc3339(self.started_ms);
        let mut holders = vec![proto::Holder {
            kind: HolderKind::Worker as i32,
            datacenter: node.worker.datacenter,
            zone: 0,
            id: node.worker.worker,
            instance: node.instance.clone(),
            address: node.address.clone(),
            since: since.clone(),
            session: String::new(),
            state: EMBEDDED_STATE.into(),
            reserved: 0,
            lock_delay_ms: 0,
            session_ttl_ms: 0,
            space: String::new(),
            rendered: String::new(),
        }];
        if let Some(token) = node.lease.as_ref().and_then(|l| l.token()) {
            holders.push(proto::Holder {
                kind: HolderKind::LeaseToken as i32,
                datacenter: 0,
                zone: node.lease_zone.unwrap_or(0),
                id: token,
                instance: node.instance.clone(),
                address: node.address.clone(),
                since,
                session: String::new(),
                state: EMBEDDED_STATE.into(),
                reserved: 0,
                lock_delay_ms: 0,
                session_ttl_ms: 0,
                space: String::new(),
                rendered: String::new(),
            });
        }
        let format_tokens = node.formats.as_ref().map(|f| f.held_tokens());
        for (space, token) in format_tokens.unwrap_or_default() {
            holders.push(proto::Holder {
                kind: HolderKind::FormatToken as i32,
                datacenter: 0,
                zone: 0,
                id: token,
                instance: node.instance.clone(),
                address: node.address.clone(),
                since: rfc3339(self.started_ms),
                session: String::new(),
                state: EMBEDDED_STATE.into(),
                reserved: 0,
                lock_delay_ms: 0,
                session_ttl_ms: 0,
                space: space.name(),
                rendered: space.render(token),
            });
        }
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
        let key = held.key(keys);
        let (entry, _) = client
            .kv_get(&key, Consistency::Consistent)
            .await
            .map_err(consul_status)?;
        let Some(entry) = entry else {
            return Err(refusal(ErrorKind::NotFound, format!(
                "{held} has never been claimed in this cluster (no key {key}); see `idgen admin holders`"
            )));
        };
        let Some(session) = entry.session.clone() else {
            let holder = holder_from(held, &entry, "released", None);
            return Ok(proto::ForceReleaseResponse {
                released: false,
                message: format!(
                    "{held} is not held (last holder {} at {}): nothing to do",
                    holder.instance, holder.address
                ),
                holder: Some(holder),
                waited_ms: 0,
            });
        };
        let Some(info) = client.session_info(&session).await.map_err(consul_status)? else {
            return Ok(proto::ForceReleaseResponse {
                released: false,
                message: format!(
                    "{held}: its session {session} has just ended, so it is not held: nothing to do (it can be claimed once its lock-delay has passed)"
                ),
                holder: Some(holder_from(held, &entry, "gone", None)),
                waited_ms: 0,
            });
        };
        let holder = holder_from(held, &entry, "alive", Some(&info));
        if !r.force {
            return Err(refusal(ErrorKind::Precondition, format!(
                "{held} is held by instance {} at {} and its session {session} is alive; releasing it destroys that session, which frees everything that node holds: pass --force (force = true) to do it anyway (the holder stops issuing when it notices)",
                holder.instance, holder.address
            )));
        }
        let lock_delay = info
            .lock_delay
            .unwrap_or(DEFAULT_LOCK_DELAY)
            .min(MAX_LOCK_DELAY);
        client.session_destroy(&session).await.map_err(|e| {
            refusal(ErrorKind::Unavailable, format!(
                "could not destroy session {session} ({e}); it may or may not be gone: check with `idgen admin holders` and retry"
            ))
        })?;
        tracing::warn!(
            %held,
            session,
            instance = holder.instance,
            address = holder.address,
            "admin force-released: session destroyed; waiting out its lock-delay"
        );
        let waiting = Instant::now();
        tokio::time::sleep(lock_delay).await;
        let waited = waiting.elapsed();
        Ok(proto::ForceReleaseResponse {
            released: true,
            message: format!(
                "destroyed session {session} of instance {} at {}: this freed everything that node held (its worker id, and its lease token and format tokens, if any). It stops issuing by its lease deadline and claims again. Waited out the lock-delay ({lock_delay:?}): {held} is free now, for whoever claims it first",
                holder.instance, holder.address
            ),
            holder: Some(holder),
            waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
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
        let Some((client, _)) = &self.deps.cluster else {
            return Err(refusal(ErrorKind::Precondition,
                "this server runs on the embedded store: it has no Consul session to renew (its worker id and lease token come from its config)",
            ));
        };
        // Only a session read back from this cluster's keys is sent to
        // Consul, so the id never has to be trusted as a URL part.
        let held: Vec<proto::Holder> = self
            .list_holders()
            .await?
            .holders
            .into_iter()
            .filter(|h| h.session == session)
            .collect();
        if held.is_empty() {
            return Err(refusal(ErrorKind::NotFound, format!(
                "session {session:?} holds no worker id or lease token of this cluster: nothing to renew (see `idgen admin holders`)"
            )));
        }
        let info = client
            .session_renew(session)
            .await
            .map_err(consul_status)?
            .ok_or_else(|| {
                refusal(ErrorKind::NotFound, format!(
                    "session {session} has just ended: Consul no longer knows it, so nothing is renewed (its ids are free once their lock-delay has passed)"
                ))
            })?;
        let ttl_ms = millis(info.ttl);
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
    fn holder_keys_parse() {
        let keys = ClusterKeys::new("idgen", "prod");
        let dir = all_groups(&keys.workers_dir(0));
        assert_eq!(dir, "idgen/prod/workers/");
        assert_eq!(all_groups(&keys.lease_dir(0)), "idgen/prod/lease/");
        assert_eq!(group_and_id(&dir, "idgen/prod/workers/2/17"), Some((2, 17)));
        assert_eq!(group_and_id(&dir, "idgen/prod/workers/2/"), None);
        assert_eq!(group_and_id(&dir, "idgen/prod/workers/x/1"), None);
        assert_eq!(
            LockKey::Token(1, 5).key(&keys),
            "idgen/prod/lease/1/5",
            "the key the lease store locks"
        );
    }

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
