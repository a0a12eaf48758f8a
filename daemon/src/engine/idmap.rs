//! [`IdMap`]: the engine's maps keyed by task id, split in [`SHARDS`] hash maps so that
//! growing one never holds up the dispatcher.
//!
//! A hash map grows by moving every entry into a table twice the size, all within the
//! one insert that crossed its load limit. Keyed by task id, the engine's maps hold one
//! entry per stored (or leased, or fresh) task: on the 2-core machines of
//! BENCHMARKS.md the insert that grew a map of 917,504 such entries took 138 ms, and one
//! of 1,835,008 took 269 ms, while the dispatcher served nobody. Split in 256 by the
//! id's low byte, each growth moves a 256th of the entries (about half a millisecond at
//! that size), and the shards grow one at a time, on different inserts.
//!
//! The low byte of an id is random (the daemon draws 80 random bits for each id) or,
//! within one crowded millisecond, a count (the id before it plus one): either way the
//! ids spread evenly over the shards. Ids are the daemon's own, never a client's, so no
//! client can pile its tasks into one shard.

use std::ops::Index;

use rustc_hash::FxHashMap;
use ulid::Ulid;

/// Hash maps an [`IdMap`] is split in.
pub(crate) const SHARDS: usize = 256;

/// A map from task id to `V`: a hash map that grows a 256th at a time.
#[derive(Debug)]
pub(crate) struct IdMap<V> {
    /// Exactly [`SHARDS`] maps; an id lives in the one of [`IdMap::shard`].
    shards: Box<[FxHashMap<Ulid, V>]>,
    /// Entries in all shards.
    len: usize,
}

impl<V> Default for IdMap<V> {
    fn default() -> Self {
        IdMap {
            shards: (0..SHARDS).map(|_| FxHashMap::default()).collect(),
            len: 0,
        }
    }
}

impl<V> IdMap<V> {
    /// The shard of `id`: its low byte.
    fn shard(id: &Ulid) -> usize {
        (u128::from(*id) as usize) % SHARDS
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn get(&self, id: &Ulid) -> Option<&V> {
        self.shards[Self::shard(id)].get(id)
    }

    pub(crate) fn get_mut(&mut self, id: &Ulid) -> Option<&mut V> {
        self.shards[Self::shard(id)].get_mut(id)
    }

    pub(crate) fn contains_key(&self, id: &Ulid) -> bool {
        self.shards[Self::shard(id)].contains_key(id)
    }

    /// Inserts `value` under `id`: the value it replaces, if any.
    pub(crate) fn insert(&mut self, id: Ulid, value: V) -> Option<V> {
        let old = self.shards[Self::shard(&id)].insert(id, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub(crate) fn remove(&mut self, id: &Ulid) -> Option<V> {
        let old = self.shards[Self::shard(id)].remove(id);
        if old.is_some() {
            self.len = self
                .len
                .checked_sub(1)
                .expect("an IdMap counts what its shards hold");
        }
        old
    }

    /// Makes room for `additional` more entries spread evenly over the shards, as the
    /// start-up does for the tasks it is about to index.
    pub(crate) fn reserve(&mut self, additional: usize) {
        let each = additional.div_ceil(SHARDS);
        for shard in self.shards.iter_mut() {
            shard.reserve(each);
        }
    }

    /// Every entry, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Ulid, &V)> {
        self.shards.iter().flat_map(|s| s.iter())
    }

    /// Every id, in no particular order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &Ulid> {
        self.iter().map(|(id, _)| id)
    }
}

impl<V> Index<&Ulid> for IdMap<V> {
    type Output = V;

    fn index(&self, id: &Ulid) -> &V {
        self.get(id)
            .unwrap_or_else(|| panic!("no entry for {id} in the IdMap"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u32),
        Remove(u16),
        Reserve(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (any::<u16>(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            any::<u16>().prop_map(Op::Remove),
            any::<u16>().prop_map(Op::Reserve),
        ]
    }

    /// An id from a small key space, so inserts collide with earlier ones and removes
    /// find something; the key lands in the id's low bits, the shard's.
    fn id(k: u16) -> Ulid {
        Ulid::from_parts(1_764_000_000_000, u128::from(k) * 0x1_0000_0001)
    }

    proptest! {
        /// An IdMap answers every question as one std HashMap given the same operations.
        #[test]
        fn an_idmap_is_a_hash_map(ops in proptest::collection::vec(op(), 0..400)) {
            let mut map = IdMap::default();
            let mut model = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(map.insert(id(k), v), model.insert(id(k), v)),
                    Op::Remove(k) => prop_assert_eq!(map.remove(&id(k)), model.remove(&id(k))),
                    Op::Reserve(n) => map.reserve(usize::from(n)),
                }
                prop_assert_eq!(map.len(), model.len());
            }
            for k in 0..64u16 {
                prop_assert_eq!(map.get(&id(k)), model.get(&id(k)));
                prop_assert_eq!(map.contains_key(&id(k)), model.contains_key(&id(k)));
            }
            let mut listed: Vec<(Ulid, u32)> = map.iter().map(|(k, v)| (*k, *v)).collect();
            let mut expected: Vec<(Ulid, u32)> = model.iter().map(|(k, v)| (*k, *v)).collect();
            listed.sort();
            expected.sort();
            prop_assert_eq!(listed, expected);
            prop_assert_eq!(map.keys().count(), model.len());
            for (k, v) in &model {
                prop_assert_eq!(&map[k], v);
                *map.get_mut(k).unwrap() += 1;
                prop_assert_eq!(map[k], v + 1);
            }
        }
    }

    /// Ids drawn as the engine draws them, and ids counted up within one millisecond,
    /// spread evenly over the shards.
    #[test]
    fn ids_spread_evenly_over_the_shards() {
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(7);
        let mut random = IdMap::default();
        let mut counted = IdMap::default();
        let mut next = Ulid::from_parts(1_764_000_000_000, 0);
        for _ in 0..SHARDS * 400 {
            let drawn = Ulid::from_parts(1_764_000_000_000, rand::Rng::random::<u128>(&mut rng));
            random.insert(drawn, ());
            counted.insert(next, ());
            next = next.increment().unwrap();
        }
        for map in [&random, &counted] {
            assert_eq!(map.len(), SHARDS * 400);
            let sizes: Vec<usize> = map.shards.iter().map(|s| s.len()).collect();
            let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            // 400 on average: random draws stay within ±30 % here, counts are exact.
            assert!(*min >= 280 && *max <= 520, "shard sizes {min}..{max}");
        }
        assert!(counted.shards.iter().all(|s| s.len() == 400));
    }

    #[test]
    #[should_panic(expected = "no entry for")]
    fn indexing_a_missing_id_panics() {
        let map: IdMap<u8> = IdMap::default();
        let _ = map[&id(1)];
    }
}
