//! High-water marks (snowflake mode): the [`HwmStore`] trait, its two
//! backends (`embedded.rs`: the `hwm` table of the state file; [`consul`]:
//! `hwm/<dc>/<worker>` written under the worker lock), and the
//! [`HwmKeeper`] that starts a generator above the stored mark and keeps
//! the mark ahead.

pub mod consul;
mod embedded;
pub mod keeper;

use async_trait::async_trait;

use super::{StoreError, WorkerKey};

pub use consul::ConsulHwmStore;
pub use keeper::{HwmKeeper, HwmSettings, KeeperHandle, KeeperStartError};

/// Durable state a node needs to issue IDs safely.
#[async_trait]
pub trait HwmStore: Send + Sync + 'static {
    /// A short name for logs and metrics (`embedded`, `consul`).
    fn backend(&self) -> &'static str;

    /// Reads the stored high-water mark (Unix ms) of `key` with the
    /// strongest consistency the backend offers; `None` if never written.
    async fn load_hwm(&self, key: WorkerKey) -> Result<Option<u64>, StoreError>;

    /// Stores the high-water mark of `key`. Returns only once the value is
    /// durable (fsync'd, or acknowledged by a quorum): the caller hands out
    /// IDs up to it as soon as this returns.
    async fn store_hwm(&self, key: WorkerKey, hwm_ms: u64) -> Result<(), StoreError>;
}
