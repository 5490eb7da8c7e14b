//! UUIDv7 serving: positions from the snowflake generator the gate holds
//! ([`crate::id::Snowflake::reserve_uuids`]), composed under the node's
//! [`UuidLayout`] with fresh random bits from a per-thread CSPRNG.
//!
//! # The random bits
//! Each thread keeps an AES-128 key drawn from the operating system
//! (`ring`'s `SystemRandom`, i.e. `getrandom`) and encrypts a counter
//! (AES-CTR, the construction of NIST SP 800-90A's CTR_DRBG without its
//! derivation function). It encrypts 32 consecutive counter blocks at a
//! time (AES-NI pipelines them) and hands out their 64-bit
//! halves one by one, each once: a UUID takes one for its random bits and
//! one for the counter offset, so a single UUID costs two reads from the
//! buffer, and no system call and no AES round trip of its own. The
//! counter never goes back under a key, so no block is encrypted twice;
//! the key is drawn again every 2^32 blocks.
//!
//! # One UUID
//! [`UuidEngine::take_one`] is the `GenUuid` path: the same reservation as
//! a batch (the generator's clock, mark and close checks), without a Vec,
//! without taking a reference on the generator, and without a wait timer
//! unless the millisecond's counters ran out.
//!
//! # Hiding
//! A layout hidden sortable (`layout.hide = "sortable"`) shows UUIDs
//! through a [`UuidHider`] under the layout's key ([`UuidHiding`]): the
//! generator reserves counters `version_bits` narrower, the hider writes
//! the key version in clear at the top of the counter field and permutes
//! the rest of the counter with the node bits, per millisecond. The key is
//! checked before any position is reserved, so a refusal takes nothing. An
//! opaque layout hides the time, which a UUIDv7 shows: it issues no UUIDs.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aes::cipher::{generic_array::GenericArray, BlockEncrypt, KeyInit};
use aes::Aes128;
use ring::rand::{SecureRandom, SystemRandom};

use super::gate::IssueGate;
use super::hidden::{HiddenOutput, Ready, RevealError};
use crate::error::Error;
use crate::id::hide::{HideError, UuidHider};
use crate::id::uuid::{Uuid, UuidError, UuidLayout, COUNTER_BITS};
use crate::id::{Clock, GenError};
use crate::metrics as m;

/// Blocks drawn from one key before a new one is drawn.
const REKEY_BLOCKS: u64 = 1 << 32;
/// AES blocks encrypted per refill of a thread's buffer: 64 words, the
/// random bits and counter offsets of 32 single UUIDs. Enough to spread a
/// refill's cost thin, small enough (512 bytes) to stay in cache.
const BUFFER_BLOCKS: usize = 32;
const BUFFER_WORDS: usize = 2 * BUFFER_BLOCKS;

/// AES-128 in counter mode, keyed from the operating system, buffered:
/// `words[next..]` are the unused halves of the last [`BUFFER_BLOCKS`]
/// blocks; every word is handed out once.
struct CtrRandom {
    cipher: Aes128,
    /// The counter of the next block to encrypt under this key.
    counter: u64,
    /// Blocks one key may encrypt before a new one is drawn.
    rekey_blocks: u64,
    words: [u64; BUFFER_WORDS],
    /// The next word to hand out; `BUFFER_WORDS` when all are used.
    next: usize,
}

impl CtrRandom {
    fn seeded() -> Result<Self, Error> {
        Ok(Self::keyed(os_key()?, REKEY_BLOCKS))
    }

    /// A generator on `key` (zeroed here after use) that draws a new key
    /// from the operating system after `rekey_blocks` blocks. Nothing is
    /// encrypted until the first word is asked for.
    fn keyed(mut key: [u8; 16], rekey_blocks: u64) -> Self {
        let cipher = Aes128::new(GenericArray::from_slice(&key));
        zeroize::Zeroize::zeroize(&mut key);
        Self {
            cipher,
            counter: 0,
            rekey_blocks,
            words: [0; BUFFER_WORDS],
            next: BUFFER_WORDS,
        }
    }

    /// The next unused random word.
    #[inline]
    fn next(&mut self) -> Result<u64, Error> {
        if self.next == BUFFER_WORDS {
            self.refill()?;
        }
        let v = self.words[self.next];
        self.next += 1;
        Ok(v)
    }

    /// Encrypts the next [`BUFFER_BLOCKS`] counter blocks into the buffer
    /// (under a new key when this one's blocks would run out).
    #[cold]
    #[inline(never)]
    fn refill(&mut self) -> Result<(), Error> {
        if self.counter + BUFFER_BLOCKS as u64 > self.rekey_blocks {
            *self = Self::keyed(os_key()?, self.rekey_blocks);
        }
        let mut blocks = [GenericArray::default(); BUFFER_BLOCKS];
        for (i, block) in blocks.iter_mut().enumerate() {
            *block = GenericArray::from(u128::from(self.counter + i as u64).to_le_bytes());
        }
        self.counter += BUFFER_BLOCKS as u64;
        self.cipher.encrypt_blocks(&mut blocks);
        for (pair, block) in self.words.chunks_exact_mut(2).zip(&mut blocks) {
            let v = u128::from_le_bytes((*block).into());
            (pair[0], pair[1]) = (v as u64, (v >> 64) as u64);
            zeroize::Zeroize::zeroize(block.as_mut_slice());
        }
        self.next = 0;
        Ok(())
    }
}

impl Drop for CtrRandom {
    /// The words not handed out yet are the next UUIDs' random bits.
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.words);
    }
}

/// A fresh AES-128 key from the operating system.
fn os_key() -> Result<[u8; 16], Error> {
    let mut key = [0u8; 16];
    SystemRandom::new().fill(&mut key).map_err(|_| {
        Error::Setup(
            "the operating system gave no random bytes (getrandom failed), so no UUID can be issued"
                .into(),
        )
    })?;
    Ok(key)
}

thread_local! {
    static RANDOM: RefCell<Option<CtrRandom>> = const { RefCell::new(None) };
}

/// This thread's generator, seeded on first use, lent to `use_it`.
#[inline]
fn with_random<T>(use_it: impl FnOnce(&mut CtrRandom) -> Result<T, Error>) -> Result<T, Error> {
    RANDOM.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(CtrRandom::seeded()?);
        }
        let rng = slot
            .as_mut()
            .ok_or_else(|| Error::Setup("the random generator is missing".into()))?;
        use_it(rng)
    })
}

/// How a node shows its UUIDs: it follows the layout's hiding.
#[derive(Clone, Default)]
pub enum UuidHiding {
    /// Plain UUIDs (the layout is not hidden).
    #[default]
    Plain,
    /// `layout.hide = "sortable"`: time in clear, counter and node
    /// permuted under the layout's hide key.
    Sortable {
        /// The hider, kept current with the key ring.
        output: Arc<HiddenOutput<UuidHider>>,
        /// Bits of key version at the top of the counter field.
        version_bits: u32,
    },
    /// The layout's hiding cannot hold a UUID (opaque hides the time; too
    /// many version bits leave too narrow a counter): every call is
    /// refused with this, before anything is reserved.
    Refused(UuidError),
}

/// Serves UUIDv7.
pub struct UuidEngine {
    gate: Arc<IssueGate>,
    clock: Arc<dyn Clock>,
    max_wait: Duration,
    issued: metrics::Counter,
    hiding: UuidHiding,
}

impl UuidEngine {
    /// UUIDs from the generator `gate` holds, reading `clock`; a call waits
    /// at most `max_wait` for a new millisecond (only when one millisecond's
    /// 2^25 or more counters are used up).
    pub fn new(gate: Arc<IssueGate>, clock: Arc<dyn Clock>, max_wait: Duration) -> Self {
        Self {
            gate,
            clock,
            max_wait,
            issued: metrics::counter!(m::IDS_ISSUED, "mode" => "uuid"),
            hiding: UuidHiding::Plain,
        }
    }

    /// Shows UUIDs as `hiding` says (the layout's `hide`).
    pub fn set_hiding(&mut self, hiding: UuidHiding) {
        self.hiding = hiding;
    }

    /// How UUIDs are shown.
    pub fn hiding(&self) -> &UuidHiding {
        &self.hiding
    }

    /// The UUID layout of the generator held now: refused when the
    /// layout's node field is too wide.
    pub fn layout(&self) -> Result<UuidLayout, Error> {
        UuidLayout::of(self.gate.current().layout()).map_err(Error::Uuid)
    }

    /// `count` UUIDs, strictly increasing (the caller checked the gate and
    /// the count). One generator for the whole call, so the batch stays
    /// increasing even if the node is fenced meanwhile (the call then
    /// fails and what it reserved is dropped, never reused).
    ///
    /// Hidden UUIDs are shown after reservation and then sorted, so a
    /// batch stays increasing (by time across milliseconds; within one the
    /// order of the shown values is the permutation's).
    pub async fn take(&self, count: usize) -> Result<Vec<Uuid>, Error> {
        let (ready, counter_bits) = self.hiding_now()?;
        let mut out = self.reserve(count, counter_bits).await?;
        if let (Some(ready), UuidHiding::Sortable { output, .. }) = (ready, &self.hiding) {
            ready
                .hider()
                .hide_in_place(&mut out)
                .map_err(|e| hidden_refusal(output, &e))?;
            out.sort_unstable();
        }
        Ok(out)
    }

    /// The hiding key set in use now (none for plain UUIDs) and the counter
    /// width it leaves; a refused layout's reason as the error.
    fn hiding_now(&self) -> Result<(Option<Ready<'_, UuidHider>>, u32), Error> {
        let ready = match &self.hiding {
            UuidHiding::Plain => None,
            UuidHiding::Sortable { output, .. } => Some(output.ready()?),
            UuidHiding::Refused(why) => return Err(Error::Uuid(why.clone())),
        };
        let counter_bits = ready
            .as_ref()
            .map_or(COUNTER_BITS, |r| r.hider().counter_bits());
        Ok((ready, counter_bits))
    }

    /// One UUID (`GenUuid`, `/v1/uuid`; the caller checked the gate): the
    /// UUID [`take`](Self::take) of one would give, without its Vec.
    /// Straight from the generator held now when the millisecond has room;
    /// when its counters ran out, the batch path's wait for the next one.
    pub async fn take_one(&self) -> Result<Uuid, Error> {
        let (ready, counter_bits) = self.hiding_now()?;
        let internal = match self.reserve_one_now(counter_bits)? {
            Some(u) => u,
            None => self
                .reserve(1, counter_bits)
                .await?
                .pop()
                .ok_or(Error::WaitTimeout { waited_ms: 0 })?,
        };
        match (ready, &self.hiding) {
            (Some(ready), UuidHiding::Sortable { output, .. }) => ready
                .hider()
                .hide(internal)
                .map_err(|e| hidden_refusal(output, &e)),
            _ => Ok(internal),
        }
    }

    /// One internal UUID from the generator held now, or `None` when this
    /// millisecond's counters are used up (the caller waits). Borrows the
    /// generator without touching its reference count, and draws both
    /// random words before reserving (a failed reservation drops them:
    /// words are never handed out twice).
    #[inline]
    fn reserve_one_now(&self, counter_bits: u32) -> Result<Option<Uuid>, Error> {
        let generator = self.gate.current();
        let layout = UuidLayout::of(generator.layout()).map_err(Error::Uuid)?;
        let (offset, random) = with_random(|rng| Ok((rng.next()?, rng.next()?)))?;
        let now = self.clock.now_micros();
        match generator.reserve_uuid_counters(now, 1, offset, counter_bits) {
            Ok(r) => {
                self.issued.increment(1);
                Ok(Some(layout.compose(
                    r.unix_ms,
                    r.first_counter,
                    generator.node_number(),
                    random,
                )))
            }
            Err(GenError::Exhausted { .. }) => Ok(None),
            Err(e) => Err(self.gate.refusal(e)),
        }
    }

    /// `count` internal UUIDs with counters below `2^counter_bits`.
    async fn reserve(&self, count: usize, counter_bits: u32) -> Result<Vec<Uuid>, Error> {
        let generator = self.gate.generator();
        let layout = UuidLayout::of(generator.layout()).map_err(Error::Uuid)?;
        let node = generator.node_number();
        let mut out = Vec::with_capacity(count);
        // Started at the first wait: a call that never waits reads no timer.
        let mut started: Option<Instant> = None;
        while out.len() < count {
            let want = (count - out.len()) as u64;
            // A failing random source is its own error, never "closed".
            let offset = with_random(CtrRandom::next)?;
            let now = self.clock.now_micros();
            match generator.reserve_uuid_counters(now, want, offset, counter_bits) {
                Ok(r) => with_random(|rng| {
                    for c in r.counters() {
                        out.push(layout.compose(r.unix_ms, c, node, rng.next()?));
                    }
                    Ok(())
                })?,
                Err(GenError::Exhausted { retry_after_micros }) => {
                    let waited = started.get_or_insert_with(Instant::now).elapsed();
                    if waited >= self.max_wait {
                        return Err(Error::WaitTimeout {
                            waited_ms: waited.as_millis() as u64,
                        });
                    }
                    tokio::time::sleep(Duration::from_micros(retry_after_micros)).await;
                }
                Err(e) => return Err(self.gate.refusal(e)),
            }
        }
        self.issued.increment(count as u64);
        Ok(out)
    }
}

/// A hidden-UUID failure as the call's refusal, naming the key.
fn hidden_refusal(output: &HiddenOutput<UuidHider>, e: &HideError) -> Error {
    Error::Hidden {
        namespace: "UUIDs".into(),
        key: output.key_id().to_owned(),
        reason: e.to_string(),
    }
}

/// A UUID split into its parts, for `DecodeUuid` and `/v1/uuid/decode`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DecodedUuid {
    /// Canonical lowercase text.
    pub uuid: String,
    /// The same 128 bits as a ULID.
    pub ulid: String,
    /// RFC 3339 time with milliseconds, UTC.
    pub time: String,
    /// `unix_ts_ms`.
    pub unix_millis: u64,
    /// Datacenter field.
    pub datacenter: u64,
    /// Worker field.
    pub worker: u64,
    /// The per-millisecond counter.
    pub counter: u64,
    /// `"sortable"` for a UUID of a hidden layout: without the admin token
    /// its datacenter, worker and counter are 0 (hidden), its time and
    /// `key_version` are shown; with it, they are the internal UUID's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden: Option<&'static str>,
    /// The hide key version of a hidden UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_version: Option<u32>,
    /// The internal UUID behind a hidden one: admin callers only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub internal_uuid: Option<String>,
}

impl UuidEngine {
    /// The parts of `uuid` as this node shows them: a plain UUID's parts;
    /// of a hidden one the time and key version, and for an admin caller
    /// (`reveal`) the internal UUID and its parts too.
    pub fn decode(
        &self,
        layout: &crate::id::Layout,
        uuid: Uuid,
        reveal: bool,
    ) -> Result<DecodedUuid, Error> {
        let uuid_layout = UuidLayout::of(layout)?;
        let parts = uuid_layout.decompose(uuid)?;
        let mut out = decoded(uuid, parts);
        let UuidHiding::Sortable {
            output,
            version_bits,
        } = &self.hiding
        else {
            return Ok(out);
        };
        // The public view needs no key: the version sits in clear at the
        // top of the counter field.
        out.hidden = Some("sortable");
        out.key_version = Some((parts.counter >> (COUNTER_BITS - version_bits)) as u32);
        (out.datacenter, out.worker, out.counter) = (0, 0, 0);
        if !reveal {
            return Ok(out);
        }
        let hider = output.revealer().map_err(|e| match e {
            RevealError::Refused(e) => *e,
            RevealError::Hide(e) => hidden_refusal(output, &e),
        })?;
        let (version, internal) = hider.reveal(uuid).map_err(|e| hidden_refusal(output, &e))?;
        let p = uuid_layout.decompose(internal)?;
        (out.datacenter, out.worker, out.counter) = (p.datacenter, p.worker, p.counter);
        out.key_version = Some(u32::from(version));
        out.internal_uuid = Some(internal.to_string());
        Ok(out)
    }
}

/// A plain UUID's parts.
fn decoded(uuid: Uuid, parts: crate::id::UuidParts) -> DecodedUuid {
    DecodedUuid {
        uuid: uuid.to_string(),
        ulid: uuid.to_ulid(),
        time: humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + Duration::from_millis(parts.unix_ms),
        )
        .to_string(),
        unix_millis: parts.unix_ms,
        datacenter: parts.datacenter,
        worker: parts.worker,
        counter: parts.counter,
        hidden: None,
        key_version: None,
        internal_uuid: None,
    }
}

/// Reads UUID text (canonical, 32 hex digits or ULID) and splits it under
/// the node layout `layout` (its datacenter and worker widths).
pub fn decode(layout: &crate::id::Layout, text: &str) -> Result<DecodedUuid, Error> {
    let uuid = Uuid::parse(text.trim())?;
    let parts = UuidLayout::of(layout)?.decompose(uuid)?;
    Ok(decoded(uuid, parts))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::id::{ManualClock, Preset, Snowflake, StartPlan, DEFAULT_EPOCH_MS};

    const T0: u64 = DEFAULT_EPOCH_MS + 10_000_000;

    fn engine(clock: Arc<ManualClock>) -> UuidEngine {
        engine_waiting(clock, Duration::from_secs(1))
    }

    /// An engine whose calls wait at most `max_wait` for a millisecond.
    fn engine_waiting(clock: Arc<ManualClock>, max_wait: Duration) -> UuidEngine {
        let layout = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(T0)
            .expect("layout");
        let plan = StartPlan::new(&layout, T0, None, 60_000).expect("plan");
        let g =
            Arc::new(Snowflake::new(layout, 3, 9, 1_000, plan, T0 + 60_000).expect("generator"));
        let clock: Arc<dyn Clock> = clock;
        let gate = Arc::new(IssueGate::new(g, Arc::clone(&clock)).expect("gate"));
        UuidEngine::new(gate, clock, max_wait)
    }

    #[tokio::test]
    async fn a_batch_is_valid_increasing_and_carries_the_node() {
        let clock = Arc::new(ManualClock::at_millis(T0));
        let e = engine(Arc::clone(&clock));
        let layout = e.layout().expect("fits");
        let mut all = Vec::new();
        for step in 0..20 {
            clock.set_millis(T0 + step);
            all.extend(e.take(1000).await.expect("batch"));
            all.extend(e.take(1).await.expect("one"));
            all.push(e.take_one().await.expect("single"));
            all.push(e.take_one().await.expect("single"));
        }
        assert!(all.windows(2).all(|w| w[0] < w[1]), "strictly increasing");
        let mut randoms = HashSet::new();
        for u in &all {
            let p = layout.decompose(*u).expect("version 7, variant 10");
            assert_eq!((p.datacenter, p.worker), (3, 9));
            randoms.insert(p.random);
        }
        // 38 random bits: 20,060 draws practically never repeat.
        assert!(randoms.len() > all.len() - 5, "random bits repeat");
    }

    /// A single UUID whose millisecond is full takes the next one: it
    /// waits (here until `max_wait`, the clock standing still) instead of
    /// wrapping the counter, and is issued once the clock moves on.
    #[tokio::test]
    async fn a_single_uuid_after_a_full_millisecond_waits_for_the_next() {
        let clock = Arc::new(ManualClock::at_millis(T0));
        let e = engine_waiting(Arc::clone(&clock), Duration::from_millis(5));
        let layout = e.layout().expect("fits");
        let before = e.take_one().await.expect("first");
        let full = e
            .gate
            .current()
            .reserve_uuids(T0 * 1000, u64::MAX, 0)
            .expect("the rest of the millisecond");
        assert_eq!(full.unix_ms, T0);
        assert!(matches!(e.take_one().await, Err(Error::WaitTimeout { .. })));
        clock.set_millis(T0 + 1);
        let after = e.take_one().await.expect("next millisecond");
        assert!(after > before);
        assert_eq!(layout.decompose(after).expect("v7").unix_ms, T0 + 1);
    }

    /// A sortable hidden engine across a key rotation: every UUID is
    /// version 7, each batch strictly increasing and all distinct; each
    /// reveals (admin decode) to an internal UUID of this node with a
    /// counter below 2^24 and the key version it was shown with, and the
    /// internal positions of a later call all lie above an earlier one's.
    /// A single UUID (`take_one`) after each batch is hidden the same way.
    #[tokio::test]
    async fn a_hidden_engine_issues_v7_uuids_that_reveal_to_increasing_positions() {
        use crate::modes::hide_keys::HideKeyRings;
        use crate::store::hide_keys::{HideKeys, MasterKey};
        let dir = tempfile::tempdir().expect("temp dir");
        let store = crate::store::EmbeddedStore::create(&dir.path().join("s.redb"), "test")
            .expect("state file");
        let keys = HideKeys::new(
            Arc::new(store),
            Some(Arc::new(MasterKey::from_bytes([5; 32]))),
        );
        let rings = HideKeyRings::load(Arc::new(keys)).await.expect("rings");
        rings.create("k", "test").await.expect("create");
        let clock = Arc::new(ManualClock::at_millis(T0));
        let mut e = engine(Arc::clone(&clock));
        let layout = *e.gate.current().layout();
        let output = crate::modes::hidden::uuid_output(
            "k",
            Some(rings.clone()),
            e.layout().expect("fits"),
            2,
        );
        e.set_hiding(UuidHiding::Sortable {
            output,
            version_bits: 2,
        });
        let (mut seen, mut last_internal) = (HashSet::new(), Uuid(0));
        for step in 0..12u64 {
            if step == 6 {
                rings.rotate("k", "test").await.expect("rotate");
            }
            clock.set_millis(T0 + step / 2);
            let batch = e.take(300).await.expect("batch");
            assert!(batch.windows(2).all(|w| w[0] < w[1]), "a batch increases");
            let single = e.take_one().await.expect("single");
            let mut internal = Vec::new();
            for u in batch.into_iter().chain([single]) {
                assert_eq!((u.version(), u.variant()), (7, 0b10), "{u}");
                assert!(seen.insert(u), "{u} twice");
                let d = e.decode(&layout, u, true).expect("reveal");
                assert_eq!((d.datacenter, d.worker), (3, 9));
                assert!(d.counter < 1 << 24, "counter {} over 24 bits", d.counter);
                assert_eq!(d.key_version, Some(u32::from(step >= 6)));
                let public = e.decode(&layout, u, false).expect("public view");
                assert_eq!(
                    (public.counter, public.worker, public.internal_uuid),
                    (0, 0, None)
                );
                assert_eq!(public.key_version, d.key_version);
                internal.push(Uuid::parse(&d.internal_uuid.expect("admin view")).expect("uuid"));
            }
            internal.sort_unstable();
            assert!(internal[0] > last_internal, "positions went back");
            last_internal = internal[internal.len() - 1];
        }
    }

    /// AES-CTR words of blocks `from..to` under `key`, one block at a
    /// time: the unbuffered reference.
    fn ctr_words(key: [u8; 16], from: u64, to: u64) -> Vec<u64> {
        let cipher = Aes128::new(GenericArray::from_slice(&key));
        let mut out = Vec::new();
        for n in from..to {
            let mut block = GenericArray::from(u128::from(n).to_le_bytes());
            cipher.encrypt_block(&mut block);
            let v = u128::from_le_bytes(block.into());
            out.extend([v as u64, (v >> 64) as u64]);
        }
        out
    }

    /// Across refills the buffered words are AES-CTR's, block after block:
    /// no block encrypted twice, no word handed out twice. Past the rekey
    /// point the words are a new key's (not the old key's continuation)
    /// and still never repeat.
    #[test]
    fn the_random_buffer_hands_out_each_block_once_across_refills_and_rekeys() {
        let key = [7u8; 16];
        let blocks = BUFFER_BLOCKS as u64;
        let mut rng = CtrRandom::keyed(key, 2 * blocks);
        // Two buffers and a half: a refill boundary inside the draw.
        let first: Vec<u64> = (0..BUFFER_WORDS * 2 + BUFFER_WORDS / 2)
            .map(|_| rng.next().expect("word"))
            .collect();
        assert!(
            first[..2 * BUFFER_WORDS] == ctr_words(key, 0, 2 * blocks)[..],
            "the first two buffers are not AES-CTR blocks 0 to {} in order",
            2 * blocks - 1
        );
        let old_key_next = ctr_words(key, 2 * blocks, 3 * blocks);
        assert!(
            first[2 * BUFFER_WORDS..] != old_key_next[..BUFFER_WORDS / 2],
            "the third buffer must come from a new key"
        );
        let mut seen = HashSet::new();
        let rest = (0..BUFFER_WORDS * 4).map(|_| rng.next().expect("word"));
        for w in first.into_iter().chain(rest) {
            assert!(seen.insert(w), "word {w:#x} handed out twice");
        }
    }
}
