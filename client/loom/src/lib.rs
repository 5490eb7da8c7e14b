//! A loom model of `idgen-client`'s ID buffer.
//!
//! `buffer.rs` is the client's own source file, compiled here against
//! loom's atomics, mutex and `Arc` (see `sync` below), so the tests below
//! explore every interleaving of the real code. The buffer is generic over
//! its item (`u64` IDs, 16-byte UUIDs); the claim logic never reads an
//! item, and the models run it with both.

#![allow(dead_code)]

#[path = "../../src/buffer.rs"]
pub mod buffer;

/// Loom's versions of the names `buffer.rs` imports.
pub(crate) mod sync {
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

    /// An atomically replaceable `Arc<T>`. Loom cannot model arc-swap's
    /// internals; its contract (a load sees one whole stored value, and a
    /// value stays alive while loaded) is modelled by a mutex-protected
    /// slot. The buffer's own logic (cursors, replacement, queue) runs
    /// unchanged on loom's atomics.
    #[derive(Debug)]
    pub(crate) struct Current<T>(loom::sync::Mutex<Arc<T>>);

    impl<T> Current<T> {
        pub(crate) fn new(value: Arc<T>) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn load(&self) -> Arc<T> {
            Arc::clone(&self.0.lock().unwrap())
        }

        pub(crate) fn store(&self, value: Arc<T>) {
            *self.0.lock().unwrap() = value;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::buffer::{Block, IdBuffer};
    use loom::sync::Arc;
    use loom::thread;

    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        // Bounded preemption keeps the search exhaustive for every schedule
        // with up to this many forced switches, and fast enough for CI.
        b.preemption_bound = Some(3);
        b.check(f);
    }

    /// Claims until the buffer is empty: the hot path, then the cold path
    /// that replaces a spent block.
    fn drain<T: Copy>(buf: &IdBuffer<T>, limit: usize) -> Vec<T> {
        let mut got = Vec::new();
        while got.len() < limit {
            match buf.try_claim() {
                Some(c) => got.push(c.id),
                None => {
                    if !buf.advance().ready {
                        break;
                    }
                }
            }
        }
        got
    }

    fn assert_distinct<T: Copy + Ord + std::fmt::Debug>(all: &[T]) {
        let mut sorted = all.to_vec();
        sorted.sort_unstable();
        let before = sorted.len();
        sorted.dedup();
        assert_eq!(before, sorted.len(), "an ID was handed out twice: {all:?}");
    }

    /// Two callers race over two blocks, replacing the first when it runs
    /// out: every ID goes to exactly one caller, none is lost.
    #[test]
    fn racing_claims_across_a_block_replacement_hand_out_each_id_once() {
        model(|| {
            let buf = Arc::new(IdBuffer::<u64>::new(1));
            buf.push(Arc::new(Block::new(vec![1, 2])));
            buf.push(Arc::new(Block::new(vec![3, 4])));
            let b2 = Arc::clone(&buf);
            let t = thread::spawn(move || drain(&b2, 4));
            let mut all = drain(&buf, 4);
            all.extend(t.join().unwrap());
            assert_distinct(&all);
            all.sort_unstable();
            assert_eq!(all, vec![1, 2, 3, 4], "an ID was lost");
        });
    }

    /// A refill lands while callers claim and replace blocks: still each
    /// ID once, and every ID of both blocks is handed out.
    #[test]
    fn a_refill_racing_with_claims_loses_and_repeats_nothing() {
        model(|| {
            let buf = Arc::new(IdBuffer::<u64>::new(1));
            buf.push(Arc::new(Block::new(vec![1, 2])));
            let b2 = Arc::clone(&buf);
            let claimer = thread::spawn(move || drain(&b2, 3));
            let b3 = Arc::clone(&buf);
            let refill = thread::spawn(move || b3.push(Arc::new(Block::new(vec![3]))));
            let mut all = drain(&buf, 3);
            all.extend(claimer.join().unwrap());
            refill.join().unwrap();
            // The refill may land after both callers gave up: drain the rest.
            all.extend(drain(&buf, 3));
            assert_distinct(&all);
            all.sort_unstable();
            assert_eq!(all, vec![1, 2, 3], "an ID was lost");
        });
    }

    /// A block expiring while callers claim from it: IDs taken before are
    /// distinct and the replacement is served after it.
    #[test]
    fn expiry_racing_with_claims_never_repeats_an_id() {
        model(|| {
            let buf = Arc::new(IdBuffer::<u64>::new(0));
            let first = Arc::new(Block::new(vec![1, 2, 3]));
            buf.push(Arc::clone(&first));
            buf.push(Arc::new(Block::new(vec![4])));
            assert!(buf.advance().ready);
            let b2 = Arc::clone(&buf);
            let t = thread::spawn(move || drain(&b2, 4));
            first.expire();
            let mut all = drain(&buf, 4);
            all.extend(t.join().unwrap());
            assert_distinct(&all);
            assert!(
                all.contains(&4),
                "the block after the expired one was skipped"
            );
        });
    }

    /// The low-water mark asks for exactly one refill per block, whoever
    /// crosses it.
    #[test]
    fn one_refill_request_per_block() {
        model(|| {
            let buf = Arc::new(IdBuffer::<u64>::new(2));
            buf.push(Arc::new(Block::new(vec![1, 2, 3])));
            assert!(buf.advance().ready);
            let b2 = Arc::clone(&buf);
            let t = thread::spawn(move || {
                let mut asks = 0;
                for _ in 0..2 {
                    if b2.try_claim().is_some_and(|c| c.refill) {
                        asks += 1;
                    }
                }
                asks
            });
            let mut asks = 0;
            if buf.try_claim().is_some_and(|c| c.refill) {
                asks += 1;
            }
            asks += t.join().unwrap();
            assert_eq!(asks, 1, "refill asked {asks} times for one block");
        });
    }

    /// Two refills in flight land at once (several refills per buffer,
    /// to different nodes) while a caller claims and replaces blocks:
    /// every ID of every block is handed out once, none is lost.
    #[test]
    fn two_refills_landing_at_once_lose_and_repeat_nothing() {
        model(|| {
            let buf = Arc::new(IdBuffer::<u64>::new(1));
            buf.push(Arc::new(Block::new(vec![1])));
            let (b2, b3) = (Arc::clone(&buf), Arc::clone(&buf));
            let first = thread::spawn(move || b2.push(Arc::new(Block::new(vec![2]))));
            let second = thread::spawn(move || b3.push(Arc::new(Block::new(vec![3]))));
            let mut all = drain(&buf, 3);
            first.join().unwrap();
            second.join().unwrap();
            all.extend(drain(&buf, 3));
            assert_distinct(&all);
            all.sort_unstable();
            assert_eq!(all, vec![1, 2, 3], "an ID was lost");
        });
    }

    /// The buffer as the UUID prefetcher uses it (16-byte items): two
    /// callers race over two blocks and a refill landing meanwhile; every
    /// UUID goes to exactly one caller, none is lost.
    #[test]
    fn uuid_items_are_handed_out_once_across_a_refill_and_a_replacement() {
        let uuid = |n: u8| {
            let mut b = [0x70u8; 16];
            b[15] = n;
            b
        };
        model(move || {
            let buf = Arc::new(IdBuffer::<[u8; 16]>::new(1));
            buf.push(Arc::new(Block::new(vec![uuid(1), uuid(2)])));
            let (b2, b3) = (Arc::clone(&buf), Arc::clone(&buf));
            let claimer = thread::spawn(move || drain(&b2, 3));
            let refill = thread::spawn(move || b3.push(Arc::new(Block::new(vec![uuid(3)]))));
            let mut all = drain(&buf, 3);
            all.extend(claimer.join().unwrap());
            refill.join().unwrap();
            all.extend(drain(&buf, 3));
            assert_distinct(&all);
            all.sort_unstable();
            assert_eq!(all, vec![uuid(1), uuid(2), uuid(3)], "a UUID was lost");
        });
    }
}
