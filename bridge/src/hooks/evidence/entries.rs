//! One shard's entries, keyed by span id: a small direct-mapped array in front of a map.
//!
//! Span ids are random, so most live roots land in an empty cell of the array and their
//! start and end are a compare and a move, with no hashing or probing; a root whose cell
//! is taken by another live root goes to the map. The shard's lock serialises access.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use super::{Entry, SpanIdHasher};

/// Cells of a shard's array (each ~40 bytes; 64 shards: 160 KiB with every array made).
/// With fewer live roots than cells per shard, most roots find their cell free.
const DIRECT: usize = 64;

/// The array ([`DIRECT`] cells): each cell empty or one (span id, entry).
type Cells = [Option<(u64, Entry)>];

/// A shard's entries (see the module docs).
#[derive(Default)]
pub(super) struct Entries {
    /// Made on the shard's first insert.
    direct: Option<Box<Cells>>,
    /// Entries whose cell was taken.
    overflow: HashMap<u64, Entry, BuildHasherDefault<SpanIdHasher>>,
}

/// An empty array, built on the heap and out of line: as an array value it would give
/// `insert` a stack frame of its size (2.5 KiB) on every call.
#[cold]
#[inline(never)]
fn new_cells() -> Box<Cells> {
    (0..DIRECT).map(|_| None).collect()
}

/// Where `key`'s cell starts in the direct array, in bytes.
#[inline]
pub(super) fn cell_offset(key: u64) -> usize {
    cell(key) * std::mem::size_of::<Option<(u64, Entry)>>()
}

/// The cell of `key`: the bits above the ones that chose the shard (`evidence::shard`).
#[inline]
fn cell(key: u64) -> usize {
    (key >> 6) as usize % DIRECT
}

impl Entries {
    /// Inserts `entry` for `key`; the entry it replaces, if `key` had one.
    pub(super) fn insert(&mut self, key: u64, entry: Entry) -> Option<Entry> {
        let direct = match &mut self.direct {
            Some(direct) => direct,
            None => self.direct.insert(new_cells()),
        };
        let slot = &mut direct[cell(key)];
        match slot {
            Some((held, old)) if *held == key => Some(std::mem::replace(old, entry)),
            Some(_) => self.overflow.insert(key, entry),
            None => {
                *slot = Some((key, entry));
                // The key may be in the map from when its cell was taken (a span id used
                // twice): that entry is the one replaced.
                if self.overflow.is_empty() {
                    None
                } else {
                    self.overflow.remove(&key)
                }
            }
        }
    }

    /// The address of the direct array (0: not made yet). It never moves once made.
    pub(super) fn cells_addr(&self) -> usize {
        self.direct
            .as_ref()
            .map_or(0, |cells| cells.as_ptr() as usize)
    }

    /// The entry of `key`.
    pub(super) fn get(&self, key: u64) -> Option<&Entry> {
        match self.direct.as_ref().and_then(|d| d[cell(key)].as_ref()) {
            Some((held, entry)) if *held == key => Some(entry),
            _ => self.overflow.get(&key),
        }
    }

    /// Takes the entry of `key` out.
    pub(super) fn remove(&mut self, key: u64) -> Option<Entry> {
        if let Some(slot) = self.direct.as_mut().map(|d| &mut d[cell(key)]) {
            if slot.as_ref().is_some_and(|(held, _)| *held == key) {
                return slot.take().map(|(_, entry)| entry);
            }
        }
        self.overflow.remove(&key)
    }

    /// Keeps the entries for which `keep` is true.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&mut Entry) -> bool) {
        if let Some(direct) = self.direct.as_mut() {
            for slot in direct.iter_mut() {
                if slot.as_mut().is_some_and(|(_, entry)| !keep(entry)) {
                    *slot = None;
                }
            }
        }
        self.overflow.retain(|_, entry| keep(entry));
    }

    /// Whether `key` has an entry.
    #[cfg(test)]
    pub(super) fn contains_key(&self, key: u64) -> bool {
        self.get(key).is_some()
    }

    /// Entries held (health counters: 64 direct cells and the overflow map).
    pub(super) fn len(&self) -> usize {
        let direct = self
            .direct
            .as_ref()
            .map_or(0, |d| d.iter().filter(|s| s.is_some()).count());
        direct + self.overflow.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(since: u64) -> Entry {
        Entry::for_test(false, since)
    }

    /// Keys sharing a cell (same bits above the shard's) all keep their own entry, in the
    /// cell or the overflow map, through inserts, replacements, removals and a sweep.
    #[test]
    fn keys_that_share_a_cell_keep_their_own_entries() {
        let mut entries = Entries::default();
        // Same cell: the bits from 6 up agree modulo DIRECT.
        let keys: Vec<u64> = (0..5).map(|i| (i * DIRECT as u64) << 6 | 5).collect();
        assert!(keys.iter().all(|&k| cell(k) == cell(keys[0])));
        for (i, &key) in keys.iter().enumerate() {
            assert!(entries.insert(key, entry(i as u64)).is_none());
        }
        assert_eq!(entries.len(), 5);
        for (i, &key) in keys.iter().enumerate() {
            assert_eq!(entries.get(key).map(|e| e.since), Some(i as u64));
        }
        // Replacing returns the old entry, in the cell and in the map.
        assert_eq!(entries.insert(keys[0], entry(10)).map(|e| e.since), Some(0));
        assert_eq!(entries.insert(keys[3], entry(13)).map(|e| e.since), Some(3));
        assert_eq!(entries.len(), 5);
        // The cell's key leaves; the others are still found.
        assert_eq!(entries.remove(keys[0]).map(|e| e.since), Some(10));
        assert!(entries.remove(keys[0]).is_none(), "removed once");
        assert!(!entries.contains_key(keys[0]));
        for &key in &keys[1..] {
            assert!(entries.contains_key(key), "{key} lost");
        }
        // A new key takes the free cell; the map's keys stay found.
        let other = (7 * DIRECT as u64) << 6 | 5;
        assert!(entries.insert(other, entry(7)).is_none());
        assert_eq!(entries.get(other).map(|e| e.since), Some(7));
        // The sweep sees both places.
        entries.retain(|e| e.since % 2 == 1);
        let mut left: Vec<u64> = keys
            .iter()
            .chain([other].iter())
            .filter_map(|&k| entries.get(k).map(|e| e.since))
            .collect();
        left.sort_unstable();
        assert_eq!(left, vec![1, 7, 13]);
        assert_eq!(entries.len(), 3);
    }

    /// A key sent to the map because its cell was taken, inserted again once the cell is
    /// free, replaces its old entry: one entry per key, the old one handed back.
    #[test]
    fn a_key_inserted_again_after_its_cell_freed_replaces_its_map_entry() {
        let mut entries = Entries::default();
        let (held, key) = (5, (DIRECT as u64) << 6 | 5);
        assert_eq!(cell(held), cell(key));
        assert!(entries.insert(held, entry(1)).is_none());
        assert!(entries.insert(key, entry(2)).is_none(), "to the map");
        assert!(entries.remove(held).is_some(), "the cell is free again");
        assert_eq!(entries.insert(key, entry(3)).map(|e| e.since), Some(2));
        assert_eq!(entries.len(), 1);
        assert_eq!(entries.remove(key).map(|e| e.since), Some(3));
        assert!(entries.get(key).is_none(), "nothing left behind");
    }

    #[test]
    fn an_empty_shard_finds_nothing() {
        let mut entries = Entries::default();
        assert!(entries.get(42).is_none());
        assert!(entries.remove(42).is_none());
        entries.retain(|_| false);
        assert_eq!(entries.len(), 0);
    }
}
