//! Who holds each worker id, lease token and format token of a Consul
//! cluster, read from the keys their sessions lock, and what an operator
//! may do about a holder: destroy its session (a forced release) or renew
//! it by hand. The admin API (`server::admin`) turns these into replies.
//!
//! Nothing here can make an ID repeat: a forced release returns only after
//! the destroyed session's lock-delay, which holds any new holder off until
//! the old one has stopped issuing (its local deadline is at most
//! min(TTL, lock-delay) after its last renew; `store::kv_paths`). A renewal
//! is sent only for a session read back from this cluster's keys.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::consul::{Consistency, ConsulClient, ConsulError, KvEntry, SessionInfo};
use crate::id::format::TokenSpace;
use crate::store::kv_paths::{ClusterPaths, OwnerInfo};
use crate::store::lease::LeaseTokenRecord;
use crate::store::WorkerKey;

/// The longest lock-delay Consul applies; a forced release never waits
/// longer.
pub const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);

/// Consul's lock-delay when a session does not report one.
pub const DEFAULT_LOCK_DELAY: Duration = Duration::from_secs(15);

/// A worker id or lease token named by a request or a KV key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LockKey {
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
    /// The KV key a holder's session locks.
    pub fn key(self, keys: &ClusterPaths) -> String {
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

/// Where a held key's session stands.
#[derive(Debug, Clone)]
pub enum SessionState {
    /// No session locks the key: the last holder let it go.
    Released,
    /// A session locks the key but Consul no longer knows it (it has just
    /// ended; the key is free once its lock-delay has passed).
    Gone,
    /// A live session locks the key.
    Alive(SessionInfo),
}

impl SessionState {
    /// The state as `ListHolders` reports it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::Gone => "gone",
            Self::Alive(_) => "alive",
        }
    }
}

/// A held key, what its value says and the session locking it.
#[derive(Debug, Clone)]
pub struct Holder {
    /// The worker id or token.
    pub held: LockKey,
    /// The holder (or the last one) its value names; `None` when the value
    /// is unreadable.
    pub owner: Option<OwnerInfo>,
    /// For a token, the largest sequence any holder may have handed out.
    pub reserved: u64,
    /// The session locking the key, if any.
    pub session: Option<String>,
    /// Where that session stands.
    pub state: SessionState,
}

impl Holder {
    fn from_entry(held: LockKey, entry: &KvEntry, state: SessionState) -> Self {
        let (owner, reserved) = match held {
            LockKey::Worker(..) => (serde_json::from_slice::<OwnerInfo>(&entry.value).ok(), 0),
            LockKey::Token(..) | LockKey::FormatToken(..) => {
                match serde_json::from_slice::<LeaseTokenRecord>(&entry.value) {
                    Ok(r) => (Some(r.owner), r.reserved),
                    Err(_) => (None, 0),
                }
            }
        };
        Self {
            held,
            owner,
            reserved,
            session: entry.session.clone(),
            state,
        }
    }

    /// The live session's lock-delay (Consul's default when it reports
    /// none); `None` when no live session holds the key.
    pub fn lock_delay(&self) -> Option<Duration> {
        match &self.state {
            SessionState::Alive(info) => Some(info.lock_delay.unwrap_or(DEFAULT_LOCK_DELAY)),
            _ => None,
        }
    }

    /// The live session's TTL, when it reports one.
    pub fn session_ttl(&self) -> Option<Duration> {
        match &self.state {
            SessionState::Alive(info) => info.ttl,
            _ => None,
        }
    }
}

/// Every held (or once held) worker id, lease token and format token key
/// of the cluster, as consistent reads.
async fn held_keys(
    client: &ConsulClient,
    keys: &ClusterPaths,
) -> Result<Vec<(LockKey, KvEntry)>, ConsulError> {
    let workers_dir = all_groups(&keys.workers_dir(0));
    let lease_dir = all_groups(&keys.lease_dir(0));
    let format_dir = keys.format_tokens_dir();
    let mut entries: Vec<(LockKey, KvEntry)> = Vec::new();
    for e in client
        .kv_list(&workers_dir, Consistency::Consistent)
        .await?
    {
        if let Some((dc, w)) = group_and_id(&workers_dir, &e.key) {
            entries.push((LockKey::Worker(dc, w), e));
        }
    }
    for e in client.kv_list(&lease_dir, Consistency::Consistent).await? {
        if let Some((zone, t)) = group_and_id(&lease_dir, &e.key) {
            entries.push((LockKey::Token(zone, t), e));
        }
    }
    for e in client.kv_list(&format_dir, Consistency::Consistent).await? {
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
    Ok(entries)
}

/// Every holder of the cluster, ordered by kind and number, with the state
/// of its session.
pub async fn list(client: &ConsulClient, keys: &ClusterPaths) -> Result<Vec<Holder>, ConsulError> {
    let entries = held_keys(client, keys).await?;
    // One node's worker id and token share a session: ask once.
    let mut sessions: HashMap<String, Option<SessionInfo>> = HashMap::new();
    let mut holders = Vec::with_capacity(entries.len());
    for (held, e) in &entries {
        let state = match &e.session {
            None => SessionState::Released,
            Some(s) => {
                if !sessions.contains_key(s) {
                    let info = client.session_info(s).await?;
                    sessions.insert(s.clone(), info);
                }
                match sessions.get(s) {
                    Some(Some(info)) => SessionState::Alive(info.clone()),
                    _ => SessionState::Gone,
                }
            }
        };
        holders.push(Holder::from_entry(*held, e, state));
    }
    Ok(holders)
}

/// The holder of `held`; `None` when it has never been claimed in this
/// cluster (no key).
pub async fn find(
    client: &ConsulClient,
    keys: &ClusterPaths,
    held: LockKey,
) -> Result<Option<Holder>, ConsulError> {
    let (entry, _) = client
        .kv_get(&held.key(keys), Consistency::Consistent)
        .await?;
    let Some(entry) = entry else {
        return Ok(None);
    };
    let state = match &entry.session {
        None => SessionState::Released,
        Some(session) => match client.session_info(session).await? {
            None => SessionState::Gone,
            Some(info) => SessionState::Alive(info),
        },
    };
    Ok(Some(Holder::from_entry(held, &entry, state)))
}

/// A forced release that destroyed a session.
#[derive(Debug, Clone, Copy)]
pub struct Released {
    /// The lock-delay waited out (the session's, at most
    /// [`MAX_LOCK_DELAY`]).
    pub lock_delay: Duration,
    /// How long the release waited in all.
    pub waited: Duration,
}

/// Destroys the live session of `holder`, which frees everything its node
/// holds, and returns only after that session's lock-delay (at most
/// [`MAX_LOCK_DELAY`]) has passed, so that no new holder can start while
/// the old one may still issue. `None` when no live session held the key
/// (nothing destroyed).
pub async fn force_release(
    client: &ConsulClient,
    holder: &Holder,
) -> Result<Option<Released>, ConsulError> {
    let (Some(session), Some(lock_delay)) = (&holder.session, holder.lock_delay()) else {
        return Ok(None);
    };
    let lock_delay = lock_delay.min(MAX_LOCK_DELAY);
    client.session_destroy(session).await?;
    let owner = holder.owner.as_ref();
    tracing::warn!(
        held = %holder.held,
        session,
        instance = owner.map(|o| o.instance.as_str()),
        address = owner.map(|o| o.address.as_str()),
        "admin force-released: session destroyed; waiting out its lock-delay"
    );
    let waiting = Instant::now();
    tokio::time::sleep(lock_delay).await;
    Ok(Some(Released {
        lock_delay,
        waited: waiting.elapsed(),
    }))
}

/// What renewing a session by hand did.
#[derive(Debug)]
pub enum Renewal {
    /// The session locks no key of this cluster: nothing was sent.
    NotHolding,
    /// The session has just ended: Consul no longer knows it.
    Ended,
    /// Renewed: Consul keeps it for `ttl` more.
    Renewed {
        /// The TTL Consul applies from now.
        ttl: Option<Duration>,
        /// What the session holds.
        holders: Vec<Holder>,
    },
}

/// Renews `session` once, by hand. Only a session read back from this
/// cluster's keys is sent to Consul, so the id never has to be trusted as
/// a URL part.
pub async fn renew(
    client: &ConsulClient,
    keys: &ClusterPaths,
    session: &str,
) -> Result<Renewal, ConsulError> {
    let held: Vec<Holder> = list(client, keys)
        .await?
        .into_iter()
        .filter(|h| h.session.as_deref() == Some(session))
        .collect();
    if held.is_empty() {
        return Ok(Renewal::NotHolding);
    }
    Ok(match client.session_renew(session).await? {
        None => Renewal::Ended,
        Some(info) => Renewal::Renewed {
            ttl: info.ttl,
            holders: held,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_keys_parse() {
        let keys = ClusterPaths::new("idgen", "prod");
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
}
