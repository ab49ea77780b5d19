//! Counts the attempt ledger refused to write, remembered by one environment.

use std::collections::{BTreeMap, HashMap};

/// Counts the ledger refused to write, per job and message, remembered by one environment (at
/// most [`LostCounts::CAPACITY`] entries, the oldest forgotten first). A job whose count was
/// lost reads a ledger that many executions short; adding them back keeps its attempts exact
/// when its redelivery reaches the same environment, so a ledger that refuses writes cannot
/// make a job run past `max_attempts` there. Across environments each adds what it lost.
/// Entries are per message: a replay or a producer's re-send of the job is a new message and
/// starts clean.
#[derive(Debug, Default)]
pub(super) struct LostCounts {
    jobs: HashMap<LostKey, (u32, u64)>,
    /// Entries by when they were last added to, for eviction.
    order: BTreeMap<u64, LostKey>,
    next: u64,
}

/// Job type, job id and message id.
pub(super) type LostKey = (String, String, String);

impl LostCounts {
    const CAPACITY: usize = 10_000;

    pub(super) fn add(&mut self, key: LostKey) {
        self.next += 1;
        let seq = self.next;
        let n = match self.jobs.remove(&key) {
            Some((n, old)) => {
                self.order.remove(&old);
                n + 1
            }
            None => 1,
        };
        if self.jobs.len() >= Self::CAPACITY {
            if let Some((_, oldest)) = self.order.pop_first() {
                self.jobs.remove(&oldest);
            }
        }
        self.order.insert(seq, key.clone());
        self.jobs.insert(key, (n, seq));
    }

    pub(super) fn get(&self, key: &LostKey) -> u32 {
        self.jobs.get(key).map_or(0, |(n, _)| *n)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    pub(super) fn forget(&mut self, key: &LostKey) {
        if let Some((_, seq)) = self.jobs.remove(key) {
            self.order.remove(&seq);
        }
    }
}

#[cfg(test)]
mod lost_counts_tests {
    use super::LostCounts;

    fn key(i: usize) -> (String, String, String) {
        ("t".into(), format!("j{i}"), format!("m{i}"))
    }

    #[test]
    fn counts_add_up_per_message_and_the_oldest_go_first() {
        let mut lost = LostCounts::default();
        lost.add(key(0));
        lost.add(key(0));
        assert_eq!(lost.get(&key(0)), 2);
        let other_message = ("t".to_owned(), "j0".to_owned(), "m-replayed".to_owned());
        assert_eq!(lost.get(&other_message), 0, "a new message starts clean");
        for i in 1..=LostCounts::CAPACITY {
            lost.add(key(i));
        }
        assert_eq!(lost.jobs.len(), LostCounts::CAPACITY);
        assert_eq!(lost.order.len(), LostCounts::CAPACITY);
        assert_eq!(lost.get(&key(0)), 0, "the oldest was forgotten");
        lost.forget(&key(5));
        assert_eq!(lost.get(&key(5)), 0);
        assert_eq!(lost.order.len(), LostCounts::CAPACITY - 1);
    }
}
