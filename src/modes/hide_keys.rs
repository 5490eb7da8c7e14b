//! STAND-IN for V2's key rings (replaced at merge).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use tokio::sync::watch;

use crate::id::hide::{HideKey, KeyVersion};

/// A loaded ring.
#[derive(Debug)]
pub struct HideKeyRing {
    /// Key id.
    pub key_id: String,
    /// Active version.
    pub active: Option<KeyVersion>,
    /// Every version.
    pub keys: Vec<HideKey>,
}

/// Rings by key id.
#[derive(Clone)]
pub struct HideKeyRings {
    rings: Arc<RwLock<HashMap<String, Arc<HideKeyRing>>>>,
    tx: Arc<watch::Sender<u64>>,
}

impl Default for HideKeyRings {
    fn default() -> Self {
        Self {
            rings: Arc::default(),
            tx: Arc::new(watch::channel(0).0),
        }
    }
}

impl HideKeyRings {
    /// Current ring.
    pub fn current(&self, key_id: &str) -> Option<Arc<HideKeyRing>> {
        self.rings.read().ok()?.get(key_id).cloned()
    }
    /// Changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
    /// Test: set a ring.
    pub fn set(&self, ring: HideKeyRing) {
        if let Ok(mut r) = self.rings.write() {
            r.insert(ring.key_id.clone(), Arc::new(ring));
        }
        self.tx.send_modify(|v| *v += 1);
    }
}
