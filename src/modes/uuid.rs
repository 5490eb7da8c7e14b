//! UUIDv7 serving: positions from the snowflake generator the gate holds
//! ([`crate::id::Snowflake::reserve_uuids`]), composed under the node's
//! [`UuidLayout`] with fresh random bits from a per-thread CSPRNG.
//!
//! # The random bits
//! Each thread keeps an AES-128 key drawn from the operating system
//! (`ring`'s `SystemRandom`, i.e. `getrandom`) and encrypts a counter
//! (AES-CTR, the construction of NIST SP 800-90A's CTR_DRBG without its
//! derivation function): one block gives two UUIDs' random bits and
//! counter offsets, at the cost of one AES round trip (AES-NI) instead of a
//! system call per UUID. The key is drawn again every 2^32 blocks.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aes::cipher::{generic_array::GenericArray, BlockEncrypt, KeyInit};
use aes::Aes128;
use ring::rand::{SecureRandom, SystemRandom};

use super::gate::IssueGate;
use crate::error::Error;
use crate::id::uuid::{Uuid, UuidLayout};
use crate::id::{Clock, GenError};
use crate::metrics as m;

/// Blocks drawn from one key before a new one is drawn.
const REKEY_BLOCKS: u64 = 1 << 32;

/// AES-128 in counter mode, keyed from the operating system.
struct CtrRandom {
    cipher: Aes128,
    counter: u64,
    /// The second half of the last block, not handed out yet.
    spare: Option<u64>,
}

impl CtrRandom {
    fn seeded() -> Result<Self, Error> {
        let mut key = [0u8; 16];
        SystemRandom::new()
            .fill(&mut key)
            .map_err(|_| Error::Setup("the operating system gave no random bytes (getrandom failed), so no UUID can be issued".into()))?;
        let cipher = Aes128::new(GenericArray::from_slice(&key));
        zeroize::Zeroize::zeroize(&mut key);
        Ok(Self {
            cipher,
            counter: 0,
            spare: None,
        })
    }

    fn next(&mut self) -> Result<u64, Error> {
        if let Some(v) = self.spare.take() {
            return Ok(v);
        }
        if self.counter == REKEY_BLOCKS {
            *self = Self::seeded()?;
        }
        let mut block = GenericArray::from(u128::from(self.counter).to_le_bytes());
        self.counter += 1;
        self.cipher.encrypt_block(&mut block);
        let v = u128::from_le_bytes(block.into());
        self.spare = Some((v >> 64) as u64);
        Ok(v as u64)
    }
}

thread_local! {
    static RANDOM: RefCell<Option<CtrRandom>> = const { RefCell::new(None) };
}

/// This thread's generator, seeded on first use, lent to `use_them` as a
/// source of random words.
fn with_random<T>(
    use_them: impl FnOnce(&mut dyn FnMut() -> Result<u64, Error>) -> Result<T, Error>,
) -> Result<T, Error> {
    RANDOM.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(CtrRandom::seeded()?);
        }
        let rng = slot
            .as_mut()
            .ok_or_else(|| Error::Setup("the random generator is missing".into()))?;
        use_them(&mut || rng.next())
    })
}

/// Serves UUIDv7.
pub struct UuidEngine {
    gate: Arc<IssueGate>,
    clock: Arc<dyn Clock>,
    max_wait: Duration,
    issued: metrics::Counter,
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
        }
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
    pub async fn take(&self, count: usize) -> Result<Vec<Uuid>, Error> {
        let generator = self.gate.generator();
        let layout = UuidLayout::of(generator.layout()).map_err(Error::Uuid)?;
        let node = generator.node_number();
        let mut out = Vec::with_capacity(count);
        let started = Instant::now();
        while out.len() < count {
            let want = (count - out.len()) as u64;
            // A failing random source is its own error, never "closed".
            let offset = with_random(|random| random())?;
            match generator.reserve_uuids(self.clock.now_micros(), want, offset) {
                Ok(r) => with_random(|random| {
                    for c in r.counters() {
                        out.push(layout.compose(r.unix_ms, c, node, random()?));
                    }
                    Ok(())
                })?,
                Err(GenError::Exhausted { retry_after_micros }) => {
                    if started.elapsed() >= self.max_wait {
                        return Err(Error::WaitTimeout {
                            waited_ms: started.elapsed().as_millis() as u64,
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
}

/// Reads UUID text (canonical, 32 hex digits or ULID) and splits it under
/// the node layout `layout` (its datacenter and worker widths).
pub fn decode(layout: &crate::id::Layout, text: &str) -> Result<DecodedUuid, Error> {
    let uuid = Uuid::parse(text.trim())?;
    let parts = UuidLayout::of(layout)?.decompose(uuid)?;
    Ok(DecodedUuid {
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
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::id::{ManualClock, Preset, Snowflake, StartPlan, DEFAULT_EPOCH_MS};

    const T0: u64 = DEFAULT_EPOCH_MS + 10_000_000;

    fn engine(clock: Arc<ManualClock>) -> UuidEngine {
        let layout = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(T0)
            .expect("layout");
        let plan = StartPlan::new(&layout, T0, None, 60_000).expect("plan");
        let g =
            Arc::new(Snowflake::new(layout, 3, 9, 1_000, plan, T0 + 60_000).expect("generator"));
        let clock: Arc<dyn Clock> = clock;
        let gate = Arc::new(IssueGate::new(g, Arc::clone(&clock)).expect("gate"));
        UuidEngine::new(gate, clock, Duration::from_secs(1))
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
        }
        assert!(all.windows(2).all(|w| w[0] < w[1]), "strictly increasing");
        let mut randoms = HashSet::new();
        for u in &all {
            let p = layout.decompose(*u).expect("version 7, variant 10");
            assert_eq!((p.datacenter, p.worker), (3, 9));
            randoms.insert(p.random);
        }
        // 38 random bits: 20,020 draws practically never repeat.
        assert!(randoms.len() > all.len() - 5, "random bits repeat");
    }
}
