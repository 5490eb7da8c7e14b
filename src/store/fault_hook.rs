//! TEST-ONLY fault injection for the embedded state file.
//!
//! The end-to-end disk-full test (`tests/store_faults.rs`) fills a real
//! tmpfs when it can mount one (root); where it cannot, it sets
//! [`DISK_FULL`] instead, and every write to an embedded state file then
//! fails with ENOSPC exactly as a full disk makes it fail. The product
//! never sets it; all it costs is one atomic load per write.

use std::io;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// TEST-ONLY: while true, writes to every embedded state file in this
/// process fail with ENOSPC ("No space left on device").
#[doc(hidden)]
pub static DISK_FULL: AtomicBool = AtomicBool::new(false);

/// ENOSPC on Linux and the other Unix systems idgen runs on.
const ENOSPC: i32 = 28;

fn disk_full() -> Result<(), io::Error> {
    if DISK_FULL.load(Ordering::Relaxed) {
        Err(io::Error::from_raw_os_error(ENOSPC))
    } else {
        Ok(())
    }
}

/// redb's file backend, with [`DISK_FULL`] checked before each write.
#[derive(Debug)]
pub(crate) struct HookedFile(pub(crate) FileBackend);

impl StorageBackend for HookedFile {
    fn len(&self) -> Result<u64, io::Error> {
        self.0.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.0.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        disk_full()?;
        self.0.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.0.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        disk_full()?;
        self.0.write(offset, data)
    }

    fn close(&self) -> Result<(), io::Error> {
        self.0.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.0.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.0.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.0.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.0.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.0.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.0.query_lock_range(start, end)
    }
}
