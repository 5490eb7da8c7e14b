//! Lease mode serving: IDs `zone | token | sequence` from blocks of the
//! held token's sequence, reserved ahead in the store.
//!
//! Two blocks in memory, like segment mode: calls take from the current
//! block under a short lock and never wait on the store while a block has
//! IDs; once half of the current block is used and no next block is held,
//! one background fetch reserves the next (never two at once). A block is
//! used only once its reservation is acknowledged. No clock is read.
//!
//! In cluster mode the token is held under the worker id's Consul session:
//! when the node is fenced, [`LeaseEngine::fence`] drops both blocks and calls
//! fail with UNAVAILABLE until [`LeaseEngine::install`] puts a source under the
//! new session in place. (The dropped blocks were already counted in the
//! token's durable counter, so dropping them only leaves a gap.)
//!
//! A hidden zone ([`LeaseEngine::with_hide`]) shows each ID as `zone |
//! version | P_k(token | sequence)`: the hider is checked before any ID is
//! taken from a block (a missing or retired key refuses and takes
//! nothing), and each ID is mapped after it was taken.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::hidden::{HiddenOutput, Ready, RevealError};
use super::refill::{self, Refill};
use crate::error::{Error, Refusal};
use crate::id::buffer::{DoubleBuffer, Prefetch};
use crate::id::decode::{decode_lease, Decoded};
use crate::id::hide::IntHider;
use crate::id::lease::{below_zone, with_zone, Block, LeaseError, ZoneHide, BELOW_ZONE_BITS};
use crate::metrics as m;
use crate::store::lease::LeaseTokenStore;
use crate::store::StoreError;

/// After a failed fetch, the next background attempt waits this long.
const FETCH_RETRY: Duration = Duration::from_millis(500);

/// Lease mode settings.
#[derive(Debug, Clone, Copy)]
pub struct LeaseSettings {
    /// Sequences reserved per block.
    pub block: u64,
    /// Longest a call waits for a block when both are empty.
    pub max_wait: Duration,
}

/// Fetch the next block once half of the current one is used.
const PREFETCH: Prefetch = Prefetch {
    at_per_mille: 500,
    retry: FETCH_RETRY,
};

struct State {
    buffer: DoubleBuffer<Block>,
    fenced: bool,
    /// The token of the block in use, for metrics and logs.
    token: Option<u64>,
    /// Why the last fetch failed (cleared by a success); a lease error
    /// (token space used up) is given to waiting calls as it is.
    last_error: Option<(String, Option<LeaseError>)>,
}

impl State {
    /// Marks a fetch started and returns true if one is due.
    fn claim_fetch(&mut self) -> bool {
        !self.fenced && self.buffer.claim_fetch(Instant::now)
    }

    /// Notes the token of the block now in use.
    fn note_token(&mut self) {
        if let Some(block) = self.buffer.current() {
            self.token = Some(block.token);
        }
    }
}

/// Serves lease mode.
pub struct LeaseEngine {
    source: Mutex<Arc<dyn LeaseTokenStore>>,
    /// Bumped by every install: a fetch started under an older source is
    /// thrown away when it lands.
    generation: AtomicU64,
    settings: LeaseSettings,
    state: Mutex<State>,
    filled: Notify,
    issued: metrics::Counter,
    store_op: m::StoreOp,
    /// A hidden zone's output, and the zone its IDs keep.
    hide: Option<HiddenZone>,
}

/// What a hidden zone's IDs show in `hidden` when decoded: the zone stays
/// in clear, the token and sequence are permuted.
pub const HIDDEN_ZONE: &str = "zone";

/// A hidden zone: its number, its version width and its output.
struct HiddenZone {
    zone: u64,
    version_bits: u32,
    output: Arc<HiddenOutput<IntHider>>,
}

impl LeaseEngine {
    /// Lease mode over `source`.
    pub fn new(source: Arc<dyn LeaseTokenStore>, settings: LeaseSettings) -> Self {
        Self {
            source: Mutex::new(source),
            generation: AtomicU64::new(0),
            settings,
            state: Mutex::new(State {
                buffer: DoubleBuffer::new(PREFETCH),
                fenced: false,
                token: None,
                last_error: None,
            }),
            filled: Notify::new(),
            issued: metrics::counter!(m::IDS_ISSUED, "mode" => crate::id::Mode::Lease.as_str()),
            store_op: m::StoreOp::new(m::label::BACKEND_LEASE, m::label::OP_RESERVE_BLOCK),
            hide: None,
        }
    }

    /// Shows the IDs of `zone` (the zone every block of the source has)
    /// through `output`, built for `hide`: the zone's bits kept, the token
    /// and sequence permuted under the key version.
    pub fn with_hide(
        mut self,
        zone: u64,
        hide: &ZoneHide,
        output: Arc<HiddenOutput<IntHider>>,
    ) -> Self {
        self.hide = Some(HiddenZone {
            zone,
            version_bits: hide.version_bits,
            output,
        });
        self
    }

    /// A hidden zone's number, hide key id and version width (`None` for
    /// a plain zone): a rotation of the key must stay within the width.
    pub fn hide_key(&self) -> Option<(u64, &str, u32)> {
        self.hide
            .as_ref()
            .map(|h| (h.zone, h.output.key_id(), h.version_bits))
    }

    /// The hider for one call, checked before anything is taken (`None`
    /// for a plain zone).
    fn hider(&self) -> Result<Option<(u64, Ready<'_, IntHider>)>, Error> {
        match &self.hide {
            None => Ok(None),
            Some(h) => Ok(Some((h.zone, h.output.ready()?))),
        }
    }

    /// The parts of lease `id`. An ID of this node's hidden zone
    /// (`[lease.hide]`) decodes with `hidden = "zone"`: for an admin
    /// caller (`reveal`) the zone, token and sequence of the internal ID
    /// behind it, with its key version and `internal_id` (a retired
    /// version still reveals); for anyone else the zone and key version
    /// only, never the permuted bits read as a token and sequence. Any
    /// other lease ID decodes as a plain one.
    pub fn decode(&self, id: u64, reveal: bool) -> Result<Decoded, Error> {
        let public = decode_lease(id).map_err(StoreError::from)?;
        let Some(h) = self.hide.as_ref().filter(|h| public.zone == Some(h.zone)) else {
            return Ok(public);
        };
        if !reveal {
            let version = below_zone(id) >> (BELOW_ZONE_BITS - h.version_bits);
            return Ok(Decoded {
                hidden: Some(HIDDEN_ZONE),
                key_version: Some(version as u32),
                token: None,
                sequence: 0,
                ..public
            });
        }
        let (version, internal) = h.output.reveal(below_zone(id)).map_err(|e| match e {
            RevealError::Refused(e) => *e,
            RevealError::Hide(e) => Error::Hidden {
                namespace: format!("lease zone {}", h.zone),
                key: h.output.key_id().to_owned(),
                reason: e.to_string(),
            },
        })?;
        let internal_id = with_zone(h.zone, internal);
        let parts = decode_lease(internal_id).map_err(StoreError::from)?;
        Ok(Decoded {
            id,
            hidden: Some(HIDDEN_ZONE),
            key_version: Some(u32::from(version)),
            internal_id: Some(internal_id),
            ..parts
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn source(&self) -> Arc<dyn LeaseTokenStore> {
        Arc::clone(
            &self
                .source
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Lease IDs held in memory (current and next block).
    pub fn runway(&self) -> u64 {
        self.state().buffer.buffered()
    }

    /// The token in use now, if any.
    pub fn token(&self) -> Option<u64> {
        self.state().token
    }

    /// Stops issuing at once and drops both blocks (the node lost the
    /// session its token was held under).
    pub fn fence(&self) {
        let mut st = self.state();
        st.fenced = true;
        st.buffer.clear();
        drop(st);
        self.filled.notify_waiters();
    }

    /// Serves from `source` (a new session's) from now on.
    pub fn install(&self, source: Arc<dyn LeaseTokenStore>) {
        *self
            .source
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = source;
        self.generation.fetch_add(1, Ordering::SeqCst);
        let mut st = self.state();
        st.buffer.reset();
        st.fenced = false;
        st.token = None;
        st.last_error = None;
        drop(st);
        self.filled.notify_waiters();
    }

    /// Gives the held token back (shutdown).
    pub async fn release(&self) -> Result<(), StoreError> {
        self.fence();
        self.source().release().await
    }

    /// Reserves the first block before serving, so start-up fails loudly
    /// when the store cannot deliver.
    pub async fn prime(&self) -> Result<(), Error> {
        let claimed = self.state().claim_fetch();
        if claimed {
            self.fetch().await?;
        }
        Ok(())
    }

    /// Takes up to `want` IDs from memory into `out`; returns whether a
    /// background fetch should start (and marks it started).
    fn take_local(&self, want: usize, out: &mut Vec<u64>) -> Result<bool, Error> {
        let mut st = self.state();
        if st.fenced {
            return Err(Error::Fenced);
        }
        // No clock: a block's start time is not used.
        st.buffer.take(want, out, &mut || 0);
        st.note_token();
        Ok(st.claim_fetch())
    }

    /// Reserves the next block (the caller marked the fetch started).
    async fn fetch(&self) -> Result<(), Error> {
        let generation = self.generation.load(Ordering::SeqCst);
        let source = self.source();
        let started = Instant::now();
        let result = source.reserve(self.settings.block).await;
        self.store_op.took(started);
        let outcome = {
            let mut st = self.state();
            if self.generation.load(Ordering::SeqCst) != generation {
                // Installed meanwhile: this fetch belongs to the old session.
                return Ok(());
            }
            match result {
                Ok(block) => {
                    st.last_error = None;
                    st.buffer.fetched(block);
                    if st.fenced {
                        st.buffer.clear();
                    } else {
                        // Served at once when nothing else is.
                        st.buffer.promote(&mut || 0);
                        st.note_token();
                        metrics::gauge!(m::LEASE_TOKEN, "zone" => source.zone().to_string())
                            .set(block.token as f64);
                    }
                    Ok(())
                }
                Err(e) => {
                    st.buffer.fetch_failed(Instant::now());
                    let lease = match &e {
                        StoreError::Lease(l) => Some(l.clone()),
                        _ => None,
                    };
                    st.last_error = Some((e.to_string(), lease));
                    self.store_op.failed();
                    Err(Error::from(e))
                }
            }
        };
        self.filled.notify_waiters();
        outcome
    }

    fn fetch_in_background(self: &Arc<Self>) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(e) = this.fetch().await {
                tracing::warn!(error = %e, "cannot reserve the next lease block; serving from memory");
            }
        });
    }

    /// One ID, from memory when the current block has one.
    pub async fn take_one(self: &Arc<Self>) -> Result<u64, Error> {
        let Some((zone, ready)) = self.hider()? else {
            return self.take_one_plain().await;
        };
        let id = self.take_one_plain().await?;
        Ok(with_zone(zone, ready.hide(below_zone(id))?))
    }

    async fn take_one_plain(self: &Arc<Self>) -> Result<u64, Error> {
        let (id, start_fetch) = {
            let mut st = self.state();
            if st.fenced {
                return Err(Error::Fenced);
            }
            let id = st.buffer.take_one();
            (id, st.claim_fetch())
        };
        if start_fetch {
            self.fetch_in_background();
        }
        match id {
            Some(id) => {
                self.issued.increment(1);
                Ok(id)
            }
            None => Ok(self.take_plain(1).await?[0]),
        }
    }

    /// `count` IDs. Waits on the store only when both blocks are empty,
    /// and then at most `max_wait`; IDs taken before a failure are dropped,
    /// never reused.
    pub async fn take(self: &Arc<Self>, count: usize) -> Result<Vec<u64>, Error> {
        let Some((zone, ready)) = self.hider()? else {
            return self.take_plain(count).await;
        };
        let mut ids = self.take_plain(count).await?;
        // One batch: the hider pipelines its AES calls. On an error nothing
        // is shown and the IDs taken are dropped, never reused.
        ids.iter_mut().for_each(|id| *id = below_zone(*id));
        ready.hide_all(&mut ids)?;
        ids.iter_mut().for_each(|id| *id = with_zone(zone, *id));
        Ok(ids)
    }

    async fn take_plain(self: &Arc<Self>, count: usize) -> Result<Vec<u64>, Error> {
        let ids = refill::take(self, count, self.settings.max_wait, FETCH_RETRY, || {
            self.fetch_in_background()
        })
        .await?;
        self.issued.increment(count as u64);
        Ok(ids)
    }
}

impl Refill for Arc<LeaseEngine> {
    fn take_local(&self, want: usize, out: &mut Vec<u64>) -> Result<bool, Error> {
        LeaseEngine::take_local(self, want, out)
    }

    fn spawn_fetch(&self) -> JoinHandle<Result<(), Error>> {
        let this = Arc::clone(self);
        tokio::spawn(async move { this.fetch().await })
    }

    fn filled(&self) -> &Notify {
        &self.filled
    }

    fn fetch_failed(&self, e: Error) -> Error {
        unavailable(e)
    }

    fn check_waiting(&self) -> Result<(), Error> {
        match &self.state().last_error {
            Some((_, Some(lease))) => Err(StoreError::Lease(lease.clone()).into()),
            _ => Ok(()),
        }
    }

    fn timed_out(&self, max_wait: Duration) -> Error {
        Error::LeaseUnavailable {
            reason: match self.state().last_error.clone() {
                Some((reason, _)) => reason,
                None => format!(
                    "no block arrived within server.max_wait ({} ms)",
                    max_wait.as_millis()
                ),
            },
        }
    }
}

/// A failed fetch as the caller sees it: running out of tokens stays
/// RESOURCE_EXHAUSTED, the rest is UNAVAILABLE naming the cause.
fn unavailable(e: Error) -> Error {
    match e {
        Error::Refused(Refusal::Lease(_)) | Error::Fenced | Error::LayoutChanged(_) => e,
        other => Error::LeaseUnavailable {
            reason: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::atomic::AtomicBool;

    use async_trait::async_trait;

    use super::*;
    use crate::id::lease::{decompose, TokenCounter};

    /// An in-memory token source that can fail and counts reservations.
    struct MemSource {
        counter: Mutex<TokenCounter>,
        token: u64,
        fail: AtomicBool,
        reserves: AtomicU64,
        /// While set, a reservation waits for `release` (counted in `held`).
        hold: AtomicBool,
        held: AtomicU64,
        release: Notify,
    }

    impl MemSource {
        fn new(token: u64) -> Arc<Self> {
            Arc::new(Self {
                counter: Mutex::new(TokenCounter::default()),
                token,
                fail: AtomicBool::new(false),
                reserves: AtomicU64::new(0),
                hold: AtomicBool::new(false),
                held: AtomicU64::new(0),
                release: Notify::new(),
            })
        }
    }

    #[async_trait]
    impl LeaseTokenStore for MemSource {
        fn backend(&self) -> &'static str {
            "memory"
        }
        fn zone(&self) -> u64 {
            9
        }
        fn token(&self) -> Option<u64> {
            Some(self.token)
        }
        async fn reserve(&self, size: u64) -> Result<Block, StoreError> {
            if self.hold.load(Ordering::SeqCst) {
                self.held.fetch_add(1, Ordering::SeqCst);
                self.release.notified().await;
            }
            if self.fail.load(Ordering::SeqCst) {
                return Err(StoreError::Backend("injected outage".into()));
            }
            self.reserves.fetch_add(1, Ordering::SeqCst);
            let mut c = self.counter.lock().unwrap();
            let (block, next) = c.next_block(9, self.token, size)?;
            *c = next;
            Ok(block)
        }
        async fn release(&self) -> Result<(), StoreError> {
            Ok(())
        }
    }

    fn leases(source: Arc<MemSource>, block: u64) -> Arc<LeaseEngine> {
        Arc::new(LeaseEngine::new(
            source,
            LeaseSettings {
                block,
                max_wait: Duration::from_millis(300),
            },
        ))
    }

    /// A lease engine over `source` (blocks of 100) whose zone 9 is
    /// hidden with `key` (4 version bits) from `rings`, and that output.
    fn hidden_zone(
        source: &Arc<MemSource>,
        key: &str,
        rings: &crate::modes::hide_keys::HideKeyRings,
    ) -> (LeaseEngine, Arc<HiddenOutput<IntHider>>) {
        let hide = crate::id::lease::ZoneHide {
            key: key.into(),
            version_bits: 4,
        };
        let output = crate::modes::hidden::int_output(
            "lease zone 9".into(),
            &hide.key,
            Some(rings.clone()),
            hide.version_bits,
            hide.domain_bits(),
        );
        let engine = LeaseEngine::new(
            Arc::clone(source) as Arc<dyn LeaseTokenStore>,
            LeaseSettings {
                block: 100,
                max_wait: Duration::from_millis(300),
            },
        )
        .with_hide(9, &hide, Arc::clone(&output));
        (engine, output)
    }

    #[tokio::test]
    async fn a_call_dropped_while_it_fetches_leaves_the_next_block_to_land() {
        let src = MemSource::new(42);
        let l = leases(Arc::clone(&src), 100);
        src.hold.store(true, Ordering::SeqCst);
        // Nothing in memory: this call claims the fetch and waits on the
        // store; then its client goes (the call is dropped).
        let call = tokio::spawn({
            let l = Arc::clone(&l);
            async move { l.take(5).await }
        });
        refill::yield_until("the fetch at the store", || {
            src.held.load(Ordering::SeqCst) == 1
        })
        .await;
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
        src.hold.store(false, Ordering::SeqCst);
        src.release.notify_waiters();
        // The fetch landed all the same: the next call is served from the
        // block it reserved (before rule 46: waited max_wait, UNAVAILABLE).
        let mut seen = HashSet::new();
        for _ in 0..10 {
            for id in l.take(5).await.unwrap() {
                assert!(seen.insert(id), "duplicate {id}");
                assert_eq!(decompose(id).unwrap().token, 42);
            }
        }
        assert_eq!(seen.len(), 50);
        assert_eq!(
            src.reserves.load(Ordering::SeqCst),
            1,
            "one block, the dropped call's"
        );
    }

    #[tokio::test]
    async fn ids_decode_to_the_token_and_never_repeat() {
        let src = MemSource::new(42);
        let l = leases(Arc::clone(&src), 100);
        l.prime().await.unwrap();
        let mut seen = HashSet::new();
        for i in 0..2_000 {
            let ids = if i % 2 == 0 {
                vec![l.take_one().await.unwrap()]
            } else {
                l.take(7).await.unwrap()
            };
            for id in ids {
                let p = decompose(id).unwrap();
                assert_eq!((p.zone, p.token), (9, 42));
                assert!(seen.insert(id), "duplicate {id}");
            }
        }
        assert_eq!(seen.len(), 1000 * 8);
        // Half-used prefetch: about one reservation per block used.
        let reserves = src.reserves.load(Ordering::SeqCst);
        assert!((80..=83).contains(&reserves), "{reserves} reservations");
    }

    #[tokio::test]
    async fn an_outage_is_served_from_the_blocks_then_unavailable() {
        let src = MemSource::new(1);
        let l = leases(Arc::clone(&src), 100);
        l.prime().await.unwrap();
        assert_eq!(l.runway(), 100, "the first block");
        // Let the prefetch land: 100 current + 100 next after 50 used.
        for _ in 0..50 {
            l.take_one().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            l.runway(),
            150,
            "50 left in the first block, 100 in the next"
        );
        src.fail.store(true, Ordering::SeqCst);
        let mut served = 50;
        let err = loop {
            match l.take_one().await {
                Ok(_) => served += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(served, 200, "both blocks are served during the outage");
        assert_eq!(l.runway(), 0, "nothing left in memory");
        assert!(matches!(err, Error::LeaseUnavailable { .. }), "{err:?}");
        assert!(err.to_string().contains("injected outage"), "{err}");
        // Back up: serving resumes above everything handed out.
        src.fail.store(false, Ordering::SeqCst);
        tokio::time::sleep(FETCH_RETRY).await;
        let id = l.take_one().await.unwrap();
        assert_eq!(decompose(id).unwrap().sequence, 201);
    }

    #[tokio::test]
    async fn fencing_stops_at_once_and_install_resumes_above() {
        let src = MemSource::new(3);
        let l = leases(Arc::clone(&src), 10);
        l.prime().await.unwrap();
        let before = l.take(5).await.unwrap();
        l.fence();
        assert!(matches!(l.take_one().await, Err(Error::Fenced)));
        assert!(matches!(l.take(3).await, Err(Error::Fenced)));
        // The same token, continued from its counter by the new session.
        l.install(Arc::clone(&src) as Arc<dyn LeaseTokenStore>);
        let after = l.take(5).await.unwrap();
        assert!(after.iter().all(|a| before.iter().all(|b| a > b)));
    }

    #[tokio::test]
    async fn running_out_of_tokens_is_resource_exhausted() {
        let src = MemSource::new(5);
        *src.counter.lock().unwrap() = TokenCounter {
            reserved: crate::id::lease::MAX_SEQUENCE - 3,
        };
        let l = leases(Arc::clone(&src), 100);
        assert_eq!(l.take(3).await.unwrap().len(), 3);
        let e = l.take(1).await.unwrap_err();
        assert!(
            matches!(
                e,
                Error::Refused(Refusal::Lease(LeaseError::TokenExhausted { .. }))
            ),
            "{e:?}"
        );
    }
    /// A lease zone is plain or hidden for good: a hidden zone whose key is
    /// missing or retired refuses before any block is reserved; once the
    /// key serves, its IDs keep the zone, never repeat, and reveal to
    /// sequences that go on where they stopped (nothing was taken by the
    /// refused calls), across a rotation.
    #[tokio::test]
    async fn a_hidden_zone_without_its_key_takes_nothing() {
        use crate::id::lease::{below_zone, BELOW_ZONE_BITS};
        use crate::modes::hide_keys::HideKeyRings;
        use crate::store::hide_keys::{HideKeyRecords, HideKeyStore, HideKeys, MasterKey};

        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::EmbeddedStore::create(&dir.path().join("s.redb"), "l").unwrap();
        let records: Arc<dyn HideKeyRecords> = Arc::new(store);
        let keys: Arc<dyn HideKeyStore> = Arc::new(HideKeys::new(
            records,
            Some(Arc::new(MasterKey::from_bytes([3; 32]))),
        ));
        let rings = HideKeyRings::load(keys).await.unwrap();
        let src = MemSource::new(42);
        let (engine, output) = hidden_zone(&src, "tickets", &rings);
        let l = Arc::new(engine);
        // No key: refused with the fix named, nothing reserved.
        for _ in 0..3 {
            let e = l.take(5).await.unwrap_err();
            assert!(e.to_string().contains("admin keys create tickets"), "{e}");
            assert!(l.take_one().await.is_err());
        }
        assert_eq!(src.reserves.load(Ordering::SeqCst), 0, "a block was taken");
        rings.create("tickets", "test").await.unwrap();
        let mut seen = HashSet::new();
        let mut ids = l.take(10).await.unwrap();
        ids.push(l.take_one().await.unwrap());
        // Retired: refused, and the blocks in memory are not touched.
        rings.retire("tickets", "test").await.unwrap();
        assert!(l.take(3).await.is_err());
        assert!(l.take_one().await.is_err());
        rings.rotate("tickets", "test").await.unwrap();
        ids.extend(l.take(10).await.unwrap());
        let ready = output.ready().unwrap();
        for (i, id) in ids.iter().enumerate() {
            assert!(seen.insert(*id), "{id} repeated");
            assert_eq!(id >> BELOW_ZONE_BITS, 9, "the zone is kept");
            let (version, internal) = ready.hider().reveal(below_zone(*id)).unwrap();
            assert_eq!(version, u8::from(i >= 11), "key version of ID {i}");
            let p = decompose((9 << BELOW_ZONE_BITS) | internal).unwrap();
            assert_eq!((p.token, p.sequence), (42, i as u64 + 1));
        }
        // Hidden: the shown IDs are not consecutive.
        assert!(ids.windows(2).filter(|w| w[1] == w[0] + 1).count() < 3);
    }

    /// A hide key created through another node moments ago (this node's
    /// rings were loaded before it and no watch runs) is served from the
    /// first call: the refusal re-reads the rings once and the call goes
    /// on, having taken nothing the first time. A key that exists nowhere
    /// is still refused, after one re-read the concurrent calls share.
    #[tokio::test]
    async fn a_hide_key_created_through_another_node_is_served_from_the_first_call() {
        use crate::modes::hide_keys::HideKeyRings;
        use crate::store::hide_keys::{HideKeyRecords, HideKeyStore, HideKeys, MasterKey};

        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::EmbeddedStore::create(&dir.path().join("s.redb"), "l").unwrap();
        let keys = |master: Option<Arc<MasterKey>>| -> Arc<dyn HideKeyStore> {
            let records: Arc<dyn HideKeyRecords> = Arc::new(store.clone());
            Arc::new(HideKeys::new(records, master))
        };
        let master = || Some(Arc::new(MasterKey::from_bytes([3; 32])));
        let here = HideKeyRings::load(keys(master())).await.unwrap();
        let elsewhere = HideKeyRings::load(keys(master())).await.unwrap();
        let issuer_for = |key: &str, rings: &HideKeyRings, src: &Arc<MemSource>| {
            let (engine, _) = hidden_zone(src, key, rings);
            crate::modes::tests::issuer()
                .0
                .with_leases(Arc::new(engine))
                .with_hide_keys(rings.clone())
        };
        let src = MemSource::new(42);
        let issuer = issuer_for("tickets", &here, &src);
        elsewhere.create("tickets", "test").await.unwrap();
        assert!(!here.issues("tickets"), "this node has not read it yet");
        let ids = issuer.gen_ids(crate::id::Mode::Lease, "", 5).await.unwrap();
        assert_eq!(ids.len(), 5);
        assert!(issuer.gen_id(crate::id::Mode::Lease, "").await.is_ok());
        assert_eq!(src.reserves.load(Ordering::SeqCst), 1, "one block in all");

        // A key nobody created: refused with the fix named, one shared re-read.
        let src = MemSource::new(43);
        let missing = Arc::new(issuer_for("nowhere", &here, &src));
        let before = here.miss_refreshes();
        let calls: Vec<_> = (0..8)
            .map(|_| {
                let issuer = Arc::clone(&missing);
                tokio::spawn(async move { issuer.gen_ids(crate::id::Mode::Lease, "", 5).await })
            })
            .collect();
        for call in calls {
            let e = call.await.unwrap().unwrap_err();
            assert!(e.to_string().contains("admin keys create nowhere"), "{e}");
        }
        assert!(
            here.miss_refreshes() - before <= 2,
            "the calls share the re-reads"
        );
        assert_eq!(src.reserves.load(Ordering::SeqCst), 0, "a block was taken");

        // A node without the master key: no re-read can help, so none is
        // made, and the refusal names the master key, not the key id.
        let blind = HideKeyRings::load(keys(None)).await.unwrap();
        let src = MemSource::new(44);
        let e = issuer_for("tickets", &blind, &src)
            .gen_ids(crate::id::Mode::Lease, "", 5)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("IDGEN_HIDE_MASTER_KEY"), "{e}");
        assert_eq!(blind.miss_refreshes(), 0);
        assert_eq!(src.reserves.load(Ordering::SeqCst), 0, "a block was taken");
    }

    /// A call refused for a key this node holds only retired is refused at
    /// once: five calls in a row start at most one re-read of the keys and
    /// none waits for the re-read gap, and none takes a block. (Issue 33:
    /// each call after the first waited about a second for a re-read.) A
    /// rotation through another node is still served: the next re-read
    /// that is due, or the watch, brings it.
    #[tokio::test]
    async fn a_call_for_a_retired_key_is_refused_at_once() {
        use crate::modes::hide_keys::HideKeyRings;
        use crate::store::hide_keys::{HideKeyRecords, HideKeyStore, HideKeys, MasterKey};

        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::EmbeddedStore::create(&dir.path().join("s.redb"), "l").unwrap();
        let records: Arc<dyn HideKeyRecords> = Arc::new(store);
        let keys: Arc<dyn HideKeyStore> = Arc::new(HideKeys::new(
            records,
            Some(Arc::new(MasterKey::from_bytes([3; 32]))),
        ));
        let rings = HideKeyRings::load(keys).await.unwrap();
        rings.create("tickets", "test").await.unwrap();
        rings.retire("tickets", "test").await.unwrap();
        let src = MemSource::new(45);
        let (engine, _) = hidden_zone(&src, "tickets", &rings);
        let issuer = crate::modes::tests::issuer()
            .0
            .with_leases(Arc::new(engine))
            .with_hide_keys(rings.clone());
        let before = rings.miss_refreshes();
        for _ in 0..5 {
            let e = issuer
                .gen_ids(crate::id::Mode::Lease, "", 5)
                .await
                .unwrap_err();
            assert!(e.to_string().contains("is retired"), "{e}");
            assert!(e.to_string().contains("admin keys rotate tickets"), "{e}");
        }
        assert!(
            rings.miss_refreshes() - before <= 1,
            "{} re-reads for five refused calls",
            rings.miss_refreshes() - before
        );
        assert_eq!(rings.miss_waits(), 0, "a refused call waited for the gap");
        assert_eq!(src.reserves.load(Ordering::SeqCst), 0, "a block was taken");
    }
}
