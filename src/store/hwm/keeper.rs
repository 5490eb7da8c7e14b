//! High-water mark reservation: the rule that makes restarts and clock
//! faults safe (TiDB PD's TSO window).
//!
//! Before the first ID, [`HwmKeeper::start`] reads the stored mark, starts
//! the generator above it and durably stores a new mark `reserve` ahead.
//! While serving, a background task extends the mark every
//! `renew_interval`; the generator is told about a new mark only after the
//! store confirmed it. If the store stops confirming, the node keeps
//! issuing until the wall clock reaches the last confirmed mark, then
//! refuses. On shutdown, [`KeeperHandle::finish`] closes the generator and
//! stores the highest time actually used, so a clean restart begins right
//! away instead of `reserve` in the future.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{HwmStore, StoreError, WorkerKey};
use crate::id::{Clock, Layout, Snowflake, StartError, StartPlan};
use crate::metrics as m;

/// Settings for [`HwmKeeper`].
#[derive(Debug, Clone, Copy)]
pub struct HwmSettings {
    /// How far ahead of the wall clock the mark is kept.
    pub reserve: Duration,
    /// How often it is extended.
    pub renew_interval: Duration,
    /// Largest start-up lag behind the stored mark.
    pub max_startup_skew: Duration,
    /// Largest tolerated clock step back at runtime.
    pub max_backward: Duration,
}

/// Starts generators above the stored mark and keeps the mark ahead.
pub struct HwmKeeper;

/// The running renewal task; [`KeeperHandle::finish`] stops it in order.
pub struct KeeperHandle {
    stop: Arc<Notify>,
    lost: tokio::sync::watch::Receiver<bool>,
    task: JoinHandle<()>,
    store: Arc<dyn HwmStore>,
    key: WorkerKey,
    generator: Arc<Snowflake>,
}

/// Writes a mark and records its latency and failures.
async fn store_timed(store: &dyn HwmStore, key: WorkerKey, hwm_ms: u64) -> Result<(), StoreError> {
    let started = Instant::now();
    let result = store.store_hwm(key, hwm_ms).await;
    m::StoreOp::new(store.backend(), m::label::OP_STORE_HWM).record(started, result.is_ok());
    result
}

/// Why [`HwmKeeper::start`] could not start a generator: the store failed,
/// or the start-up rule refused (the clock is behind the stored mark).
#[derive(Debug, thiserror::Error)]
pub enum KeeperStartError {
    /// Reading or writing the mark failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The start-up rule refused; nothing was issued.
    #[error(transparent)]
    Start(#[from] StartError),
}

impl HwmKeeper {
    /// Reads the stored mark for `key`, applies the start-up rule, durably
    /// stores a mark `reserve` ahead and returns a generator bounded by it,
    /// plus the renewal task.
    pub async fn start(
        store: Arc<dyn HwmStore>,
        key: WorkerKey,
        layout: Layout,
        clock: Arc<dyn Clock>,
        settings: HwmSettings,
    ) -> Result<(Arc<Snowflake>, KeeperHandle), KeeperStartError> {
        let stored = store.load_hwm(key).await?;
        let now_ms = clock.now_millis();
        let plan = StartPlan::new(
            &layout,
            now_ms,
            stored,
            settings.max_startup_skew.as_millis() as u64,
        )?;
        let floor_ms = layout.unix_ms_of(plan.floor_units);
        let first_hwm = floor_ms
            .max(now_ms)
            .saturating_add(settings.reserve.as_millis() as u64);
        store_timed(store.as_ref(), key, first_hwm).await?;
        let generator = Arc::new(Snowflake::new(
            layout,
            key.datacenter,
            key.worker,
            settings.max_backward.as_millis() as u64,
            plan,
            first_hwm,
        )?);
        tracing::info!(
            worker = %key,
            stored_hwm_ms = stored,
            start_ms = floor_ms,
            hwm_ms = first_hwm,
            "high-water mark reserved; generator starts above every earlier ID"
        );
        let stop = Arc::new(Notify::new());
        let (lost_tx, lost) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(renew_loop(
            Arc::clone(&store),
            key,
            Arc::clone(&generator),
            clock,
            settings,
            Arc::clone(&stop),
            lost_tx,
        ));
        Ok((
            Arc::clone(&generator),
            KeeperHandle {
                stop,
                lost,
                task,
                store,
                key,
                generator,
            },
        ))
    }
}

async fn renew_loop(
    store: Arc<dyn HwmStore>,
    key: WorkerKey,
    generator: Arc<Snowflake>,
    clock: Arc<dyn Clock>,
    settings: HwmSettings,
    stop: Arc<Notify>,
    lost: tokio::sync::watch::Sender<bool>,
) {
    let reserve_ms = settings.reserve.as_millis() as u64;
    let mut ticker = tokio::time::interval(settings.renew_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stop.notified() => return,
            _ = ticker.tick() => {}
        }
        let now_ms = clock.now_millis();
        let target = now_ms.saturating_add(reserve_ms);
        if target > generator.hwm_ms() {
            match store_timed(store.as_ref(), key, target).await {
                Ok(()) => {
                    generator.raise_hwm(target);
                    if failing {
                        tracing::info!(worker = %key, "state store confirms high-water marks again");
                        failing = false;
                    }
                }
                Err(e @ StoreError::StateFileLost { .. }) => {
                    // Final: the file this node wrote to is gone. Every mode
                    // has stopped (the issuer checks the same guard).
                    let last = generator.close();
                    tracing::error!(worker = %key, error = %e, last_time_ms = last, "stopped renewing the high-water mark");
                    return;
                }
                Err(StoreError::LockLost(why)) => {
                    // Definite: someone else holds the id now. Stop at once.
                    let last = generator.close();
                    tracing::error!(
                        worker = %key,
                        reason = %why,
                        last_time_ms = last,
                        "the store says this node no longer holds its worker id: stopped issuing"
                    );
                    let _ = lost.send(true);
                    return;
                }
                Err(e) => {
                    if !failing {
                        tracing::error!(
                            worker = %key,
                            error = %e,
                            hwm_ms = generator.hwm_ms(),
                            "cannot extend the high-water mark; issuing continues until the clock reaches it"
                        );
                        failing = true;
                    }
                }
            }
        }
    }
}

impl KeeperHandle {
    /// Completes once the store refused a write because the node no longer
    /// holds its worker id (the generator is closed by then).
    pub async fn lock_lost(&self) {
        let mut lost = self.lost.clone();
        let _ = lost.wait_for(|l| *l).await;
    }

    /// The worker id whose mark this keeper keeps.
    pub fn key(&self) -> WorkerKey {
        self.key
    }

    /// The generator this keeper bounds.
    pub fn generator(&self) -> &Arc<Snowflake> {
        &self.generator
    }

    /// Fencing: closes the generator at once and stops renewing, with no
    /// final write (the lock that writes need is gone). Returns the
    /// generator's final mark, for the log.
    pub fn abort(self) -> u64 {
        let last = self.generator.close();
        self.task.abort();
        last
    }

    /// Stops renewing, closes the generator and stores the highest time
    /// unit it used. Returns that final mark (Unix ms).
    pub async fn finish(self) -> Result<u64, StoreError> {
        self.stop.notify_one();
        // Wait for an in-flight renewal to land before writing a lower mark.
        let _ = self.task.await;
        let final_hwm = self.generator.close();
        store_timed(self.store.as_ref(), self.key, final_hwm).await?;
        tracing::info!(worker = %self.key, hwm_ms = final_hwm, "final high-water mark stored");
        Ok(final_hwm)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    use async_trait::async_trait;

    use super::*;
    use crate::id::{GenError, ManualClock, Preset, DEFAULT_EPOCH_MS};

    const T0: u64 = 1_790_000_000_000;

    /// An in-memory store that can be told to fail writes.
    #[derive(Default)]
    struct MemStore {
        marks: Mutex<HashMap<WorkerKey, u64>>,
        fail: AtomicBool,
    }

    #[async_trait]
    impl HwmStore for MemStore {
        fn backend(&self) -> &'static str {
            "memory"
        }
        async fn load_hwm(&self, key: WorkerKey) -> Result<Option<u64>, StoreError> {
            Ok(self.marks.lock().unwrap().get(&key).copied())
        }
        async fn store_hwm(&self, key: WorkerKey, hwm_ms: u64) -> Result<(), StoreError> {
            if self.fail.load(Ordering::SeqCst) {
                return Err(StoreError::Backend("injected failure".into()));
            }
            self.marks.lock().unwrap().insert(key, hwm_ms);
            Ok(())
        }
    }

    const KEY: WorkerKey = WorkerKey {
        datacenter: 0,
        worker: 1,
    };

    fn settings() -> HwmSettings {
        HwmSettings {
            reserve: Duration::from_secs(3),
            renew_interval: Duration::from_millis(20),
            max_startup_skew: Duration::from_secs(10),
            max_backward: Duration::from_secs(1),
        }
    }

    fn layout() -> Layout {
        Preset::Twitter.spec(DEFAULT_EPOCH_MS).validate(T0).unwrap()
    }

    async fn wait_for(cond: impl Fn() -> bool) {
        for _ in 0..500 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not reached in 5 s");
    }

    #[tokio::test]
    async fn mark_is_stored_before_use_and_kept_ahead() {
        let store = Arc::new(MemStore::default());
        let clock = Arc::new(ManualClock::at_millis(T0));
        let (g, keeper) = HwmKeeper::start(store.clone(), KEY, layout(), clock.clone(), settings())
            .await
            .unwrap();
        assert_eq!(store.load_hwm(KEY).await.unwrap(), Some(T0 + 3000));
        assert_eq!(g.hwm_ms(), T0 + 3000);
        clock.advance_millis(2000);
        wait_for(|| g.hwm_ms() == T0 + 5000).await;
        assert_eq!(store.load_hwm(KEY).await.unwrap(), Some(T0 + 5000));
        let id = g.next_id(clock.now_micros()).unwrap();
        let final_hwm = keeper.finish().await.unwrap();
        assert_eq!(final_hwm, T0 + 2000);
        assert_eq!(store.load_hwm(KEY).await.unwrap(), Some(T0 + 2000));
        assert_eq!(layout().decompose(id).unwrap().unix_ms, T0 + 2000);
    }

    #[tokio::test]
    async fn failing_store_stops_issuing_at_the_last_confirmed_mark() {
        let store = Arc::new(MemStore::default());
        let clock = Arc::new(ManualClock::at_millis(T0));
        let (g, keeper) = HwmKeeper::start(store.clone(), KEY, layout(), clock.clone(), settings())
            .await
            .unwrap();
        store.fail.store(true, Ordering::SeqCst);
        clock.advance_millis(2900);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(g.hwm_ms(), T0 + 3000, "unconfirmed marks are never used");
        assert!(
            g.next_id(clock.now_micros()).is_ok(),
            "still below the mark"
        );
        clock.advance_millis(200);
        assert!(matches!(
            g.next_id(clock.now_micros()),
            Err(GenError::HwmReached { .. })
        ));
        store.fail.store(false, Ordering::SeqCst);
        wait_for(|| g.hwm_ms() > T0 + 3000).await;
        assert!(
            g.next_id(clock.now_micros()).is_ok(),
            "resumes once confirmed"
        );
        keeper.finish().await.unwrap();
    }

    #[tokio::test]
    async fn restarts_never_repeat_ids() {
        let store = Arc::new(MemStore::default());
        let clock = Arc::new(ManualClock::at_millis(T0));
        let mut highest = 0;
        for round in 0..5u64 {
            let (g, keeper) =
                HwmKeeper::start(store.clone(), KEY, layout(), clock.clone(), settings())
                    .await
                    .unwrap();
            let id = g.next_id(clock.now_micros()).unwrap();
            assert!(id > highest, "round {round}: {id} <= {highest}");
            highest = id;
            if round % 2 == 0 {
                keeper.finish().await.unwrap();
            } else {
                // A crash: no final write, the renewal task just dies.
                keeper.task.abort();
            }
            // The clock steps back between runs, within the start-up skew.
            clock.step_back_millis(500);
        }
    }

    #[tokio::test]
    async fn refuses_to_start_far_behind_the_stored_mark() {
        let store = Arc::new(MemStore::default());
        store.store_hwm(KEY, T0 + 60_000).await.unwrap();
        let clock = Arc::new(ManualClock::at_millis(T0));
        let err = HwmKeeper::start(store, KEY, layout(), clock, settings())
            .await
            .err()
            .expect("must refuse");
        assert!(err.to_string().contains("60000 ms behind"), "{err}");
    }
}
