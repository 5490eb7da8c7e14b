//! Formatted mode's tokens (`{token:N:digits|alnum}`, `uniq64`), leased by
//! lease mode's machinery in a space per width and charset
//! ([`TokenSpace`]).
//!
//! - Embedded: the node's own slice of the space, derived from its
//!   datacenter and worker id ([`TokenSpace::node_range`]); it uses the
//!   first token of it. Nodes with distinct worker ids never share one.
//! - Consul: one [`ConsulLeaseTokens`] per space, locked under the worker id's
//!   session in `<prefix>/<cluster>/format-tokens/<space>/<token>`. Taken
//!   at the first call of a format that needs it (or at start for the
//!   configured formats), released at shutdown, lost with the session:
//!   the node is then fenced like every mode, and after a re-claim takes
//!   tokens again under the new session ([`ConsulFormatTokens::moved`]).
//!   Every counter write of a token's format checks the token's lock in
//!   the same txn ([`TokenLock`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;

use super::counters::TokenLock;
use crate::consul::ConsulClient;
use crate::id::format::TokenSpace;
use crate::id::lease::LeaseError;
use crate::store::kv_paths::{ClusterPaths, OwnerInfo};
use crate::store::lease::{ConsulLeaseTokens, LeaseTokenStore};
use crate::store::StoreError;

/// A token this node holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldToken {
    /// The token (`0..space.size()`).
    pub token: u64,
    /// What a counter write must check (Consul); `None` on the embedded
    /// store.
    pub lock: Option<TokenLock>,
}

/// Why no token could be held.
#[derive(Debug)]
pub enum TokenError {
    /// Every token of the space is held, or this node has none in it.
    Exhausted {
        /// The space.
        space: TokenSpace,
        /// Why, and what to do.
        why: String,
    },
    /// The store failed.
    Store(StoreError),
}

/// Where formatted mode's tokens come from.
#[async_trait]
pub trait FormatTokens: Send + Sync + 'static {
    /// The token this node holds in `space`, taking one first if none is.
    async fn hold(&self, space: TokenSpace) -> Result<HeldToken, TokenError>;

    /// The tokens held now, by space (for `ListHolders`).
    fn held(&self) -> Vec<(TokenSpace, u64)>;

    /// Forgets `token` of `space`: its lock was found gone.
    fn forget(&self, space: TokenSpace, token: u64);

    /// Gives every held token back (shutdown, while the session lives).
    async fn release(&self);
}

/// An embedded node's tokens: the first of its own slice of each space.
pub struct EmbeddedFormatTokens {
    datacenter: u64,
    worker: u64,
    datacenter_bits: u8,
    worker_bits: u8,
    /// The spaces asked for so far (for `ListHolders`).
    used: Mutex<std::collections::BTreeSet<TokenSpace>>,
}

impl EmbeddedFormatTokens {
    /// The tokens of `(datacenter, worker)` under the layout's widths.
    pub fn new(datacenter: u64, worker: u64, datacenter_bits: u8, worker_bits: u8) -> Self {
        Self {
            datacenter,
            worker,
            datacenter_bits,
            worker_bits,
            used: Mutex::new(std::collections::BTreeSet::new()),
        }
    }

    fn token(&self, space: TokenSpace) -> Option<u64> {
        space
            .node_range(
                self.datacenter,
                self.worker,
                self.datacenter_bits,
                self.worker_bits,
            )
            .map(|(first, _)| first)
    }
}

#[async_trait]
impl FormatTokens for EmbeddedFormatTokens {
    async fn hold(&self, space: TokenSpace) -> Result<HeldToken, TokenError> {
        match self.token(space) {
            Some(token) => {
                self.used
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(space);
                Ok(HeldToken { token, lock: None })
            }
            None => Err(TokenError::Exhausted {
                space,
                why: format!(
                    "on the embedded store each (datacenter, worker) has its own tokens, and datacenter {} worker {} has none among {} (only the first {} node indexes get one); give this node a lower worker id, or use a wider token",
                    self.datacenter,
                    self.worker,
                    space.size(),
                    space.size()
                ),
            }),
        }
    }

    fn held(&self) -> Vec<(TokenSpace, u64)> {
        let used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        used.iter()
            .filter_map(|s| Some((*s, self.token(*s)?)))
            .collect()
    }

    fn forget(&self, _space: TokenSpace, _token: u64) {}

    async fn release(&self) {}
}

/// A node's format tokens in Consul, under its worker id's session.
pub struct ConsulFormatTokens {
    client: ConsulClient,
    keys: ClusterPaths,
    /// The session and owner info tokens are taken under now.
    session: Mutex<(String, OwnerInfo)>,
    spaces: Mutex<HashMap<TokenSpace, Arc<ConsulLeaseTokens>>>,
}

impl ConsulFormatTokens {
    /// Tokens taken under `session` (the worker lock's).
    pub fn new(client: ConsulClient, keys: ClusterPaths, session: &str, owner: &OwnerInfo) -> Self {
        Self {
            client,
            keys,
            session: Mutex::new((session.to_owned(), owner.clone())),
            spaces: Mutex::new(HashMap::new()),
        }
    }

    /// A new session holds the worker id: tokens held under the old one are
    /// gone with it; take them again (lazily) under `session`.
    pub fn moved(&self, session: &str, owner: &OwnerInfo) {
        *self.session.lock().unwrap_or_else(PoisonError::into_inner) =
            (session.to_owned(), owner.clone());
        self.spaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    fn space(&self, space: TokenSpace) -> Arc<ConsulLeaseTokens> {
        let (session, owner) = self
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut spaces = self.spaces.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(spaces.entry(space).or_insert_with(|| {
            Arc::new(ConsulLeaseTokens::for_format_space(
                self.client.clone(),
                &self.keys,
                &space.name(),
                space.max(),
                session,
                owner,
            ))
        }))
    }
}

#[async_trait]
impl FormatTokens for ConsulFormatTokens {
    async fn hold(&self, space: TokenSpace) -> Result<HeldToken, TokenError> {
        let tokens = self.space(space);
        match tokens.hold().await {
            Ok(token) => Ok(HeldToken {
                token,
                lock: Some(TokenLock {
                    key: tokens.key(token),
                    session: tokens.session().to_owned(),
                }),
            }),
            Err(StoreError::Lease(LeaseError::NoFreeToken { .. })) => Err(TokenError::Exhausted {
                space,
                why: format!(
                    "all {} tokens are held by other nodes (or inside their lock-delay after a node was lost); retry later, stop a node, or use a wider token",
                    space.size()
                ),
            }),
            Err(e) => Err(TokenError::Store(e)),
        }
    }

    fn held(&self) -> Vec<(TokenSpace, u64)> {
        let spaces = self.spaces.lock().unwrap_or_else(PoisonError::into_inner);
        let mut held: Vec<(TokenSpace, u64)> = spaces
            .iter()
            .filter_map(|(s, t)| t.token().map(|t| (*s, t)))
            .collect();
        held.sort();
        held
    }

    fn forget(&self, space: TokenSpace, token: u64) {
        let tokens = self
            .spaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&space)
            .cloned();
        if let Some(tokens) = tokens {
            tokens.forget(token);
        }
    }

    async fn release(&self) {
        let spaces: Vec<(TokenSpace, Arc<ConsulLeaseTokens>)> = self
            .spaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(s, t)| (*s, Arc::clone(t)))
            .collect();
        for (space, tokens) in spaces {
            if let Err(e) = tokens.release().await {
                tracing::warn!(space = %space, error = %e, "cannot release a format token; it frees itself when the session ends");
            }
        }
    }
}
