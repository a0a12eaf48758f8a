//! [`ShardedMap`]: a hash map split in [`SHARDS`] hash maps, so that growing it never
//! holds up the dispatcher; [`IdMap`] is the one keyed by task id.
//!
//! A hash map grows by moving every entry into a table twice the size, all within the
//! one insert that crossed its load limit. The engine's maps keyed by task id hold one
//! entry per stored (or leased, or fresh) task, and a queue's key lines one per ordering
//! key in use: on the 2-core machines of BENCHMARKS.md the insert that grew a map of
//! 917,504 entries took 138 ms, and one of 1,835,008 took 269 ms, while the dispatcher
//! served nobody. Split in 256 by a hash of the key, each growth moves a 256th of the
//! entries (about a millisecond at that size); the shards hold slightly different
//! counts, so their growths fall on different inserts.
//!
//! The shard is bits 32 to 39 of the key's hash: the shard maps themselves use a hash's
//! low bits (the bucket) and its top 7 (the control byte), so a shard's keys sharing
//! those 8 bits costs them nothing. Task ids are hashed with FxHash (ids are the
//! daemon's own, 80 random bits or a count within one crowded millisecond: no client
//! chooses them); keys a client chooses are hashed with std's randomly keyed SipHash,
//! so no client can pile its keys into one shard.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};
use std::ops::Index;

use rustc_hash::FxBuildHasher;
use ulid::Ulid;

/// Hash maps a [`ShardedMap`] is split in.
pub(crate) const SHARDS: usize = 256;

/// The engine's maps keyed by task id.
pub(crate) type IdMap<V> = ShardedMap<Ulid, V, FxBuildHasher>;

/// A hash map that grows a 256th at a time.
pub(crate) struct ShardedMap<K, V, S = RandomState> {
    /// Empty until the first insert (a queue without keyed tasks pays 24 bytes, not
    /// 256 maps), then exactly [`SHARDS`] maps; a key lives in the one of `shard`.
    shards: Vec<HashMap<K, V, S>>,
    /// Chooses the shard.
    hasher: S,
    /// Entries in all shards.
    len: usize,
}

// By hand: the hasher (FxHash's has no `Debug`) says nothing worth showing.
impl<K: std::fmt::Debug, V: std::fmt::Debug, S> std::fmt::Debug for ShardedMap<K, V, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.shards.iter().flat_map(|shard| shard.iter()))
            .finish()
    }
}

impl<K, V, S: Default> Default for ShardedMap<K, V, S> {
    fn default() -> Self {
        ShardedMap {
            shards: Vec::new(),
            hasher: S::default(),
            len: 0,
        }
    }
}

impl<K: Hash + Eq, V, S: BuildHasher + Default> ShardedMap<K, V, S> {
    /// The shard of `key`, whether or not the shards exist yet.
    fn shard<Q: Hash + ?Sized>(&self, key: &Q) -> usize {
        ((self.hasher.hash_one(key) >> 32) as usize) % SHARDS
    }

    /// Makes the shards on first use.
    fn ensure_shards(&mut self) {
        if self.shards.is_empty() {
            assert_eq!(self.len, 0, "a ShardedMap without shards holds nothing");
            self.shards = (0..SHARDS).map(|_| HashMap::default()).collect();
        }
        debug_assert_eq!(self.shards.len(), SHARDS, "a ShardedMap has all its shards");
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // An empty map (most tasks name no limit and no group) answers without hashing.
        if self.len == 0 {
            return None;
        }
        self.shards.get(self.shard(key))?.get(key)
    }

    pub(crate) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shard = self.shard(key);
        self.shards.get_mut(shard)?.get_mut(key)
    }

    pub(crate) fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key).is_some()
    }

    /// Inserts `value` under `key`: the value it replaces, if any.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        let shard = self.shard(&key);
        self.ensure_shards();
        let old = self.shards[shard].insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        debug_assert!(
            self.len >= self.shards[shard].len(),
            "a ShardedMap counts what its shards hold"
        );
        old
    }

    /// The value under `key`, inserted with `make` if there is none.
    pub(crate) fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let shard = self.shard(&key);
        self.ensure_shards();
        let len = &mut self.len;
        self.shards[shard].entry(key).or_insert_with(|| {
            *len += 1;
            make()
        })
    }

    pub(crate) fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.len == 0 {
            return None;
        }
        let shard = self.shard(key);
        let old = self.shards.get_mut(shard)?.remove(key);
        if old.is_some() {
            self.len = self
                .len
                .checked_sub(1)
                .expect("a ShardedMap counts what its shards hold");
        }
        old
    }

    /// Makes room for `additional` more entries spread evenly over the shards, as the
    /// start-up does for the tasks it is about to index.
    pub(crate) fn reserve(&mut self, additional: usize) {
        let each = additional.div_ceil(SHARDS);
        self.ensure_shards();
        for shard in &mut self.shards {
            shard.reserve(each);
        }
    }

    /// Every entry, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.shards.iter().flat_map(|s| s.iter())
    }

    /// Every key, in no particular order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.iter().map(|(k, _)| k)
    }
}

impl<K, Q, V, S> Index<&Q> for ShardedMap<K, V, S>
where
    K: Hash + Eq + Borrow<Q>,
    Q: Hash + Eq + std::fmt::Debug + ?Sized,
    S: BuildHasher + Default,
{
    type Output = V;

    fn index(&self, key: &Q) -> &V {
        self.get(key)
            .unwrap_or_else(|| panic!("no entry for {key:?} in the ShardedMap"))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u32),
        GetOrInsert(u16, u32),
        Remove(u16),
        Reserve(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (any::<u16>(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            (any::<u16>(), any::<u32>()).prop_map(|(k, v)| Op::GetOrInsert(k, v)),
            any::<u16>().prop_map(Op::Remove),
            any::<u16>().prop_map(Op::Reserve),
        ]
    }

    /// Keys from a small space, so inserts meet earlier ones and removes find something.
    fn small(k: u16) -> u16 {
        k % 512
    }

    fn id(k: u16) -> Ulid {
        Ulid::from_parts(1_764_000_000_000, u128::from(small(k)) * 0x1_0000_0001)
    }

    fn name(k: u16) -> Arc<str> {
        format!("key-{}", small(k)).into()
    }

    /// Applies `ops` to a sharded map and to a std HashMap, checking every answer and
    /// the count after each; then every lookup, the listing and the index.
    fn same_as_a_hash_map<K, S>(ops: Vec<Op>, key: impl Fn(u16) -> K) -> Result<(), TestCaseError>
    where
        K: Hash + Eq + Clone + Ord + std::fmt::Debug,
        S: BuildHasher + Default,
    {
        let mut map: ShardedMap<K, u32, S> = ShardedMap::default();
        let mut model = std::collections::HashMap::new();
        for op in ops {
            match op {
                Op::Insert(k, v) => {
                    prop_assert_eq!(map.insert(key(k), v), model.insert(key(k), v));
                }
                Op::GetOrInsert(k, v) => {
                    let got = *map.get_or_insert_with(key(k), || v);
                    prop_assert_eq!(got, *model.entry(key(k)).or_insert(v));
                }
                Op::Remove(k) => prop_assert_eq!(map.remove(&key(k)), model.remove(&key(k))),
                Op::Reserve(n) => map.reserve(usize::from(n)),
            }
            prop_assert_eq!(map.len(), model.len());
            prop_assert_eq!(
                map.shards.iter().map(HashMap::len).sum::<usize>(),
                model.len()
            );
        }
        for k in 0..512 {
            prop_assert_eq!(map.get(&key(k)), model.get(&key(k)));
            prop_assert_eq!(map.contains_key(&key(k)), model.contains_key(&key(k)));
        }
        let mut listed: Vec<(K, u32)> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let mut expected: Vec<(K, u32)> = model.iter().map(|(k, v)| (k.clone(), *v)).collect();
        listed.sort();
        expected.sort();
        prop_assert_eq!(listed, expected);
        prop_assert_eq!(map.keys().count(), model.len());
        for (k, v) in &model {
            prop_assert_eq!(&map[k], v);
            let stored = map.get_mut(k).unwrap();
            *stored = stored.wrapping_add(1);
            prop_assert_eq!(map[k], v.wrapping_add(1));
        }
        Ok(())
    }

    proptest! {
        /// Keyed by task id with FxHash, and by client keys with SipHash (looked up by
        /// `&str` too), a ShardedMap answers as one std HashMap given the same operations.
        #[test]
        fn a_sharded_map_is_a_hash_map(ops in proptest::collection::vec(op(), 0..400)) {
            same_as_a_hash_map::<Ulid, FxBuildHasher>(ops.clone(), id)?;
            same_as_a_hash_map::<Arc<str>, RandomState>(ops.clone(), name)?;
            let mut by_str: ShardedMap<Arc<str>, u16> = ShardedMap::default();
            for op in ops {
                if let Op::Insert(k, _) = op {
                    by_str.insert(name(k), small(k));
                }
            }
            for (k, v) in by_str.iter() {
                prop_assert_eq!(by_str.get(&**k as &str), Some(v));
            }
        }
    }

    /// Ids drawn as the engine draws them, ids counted up within one millisecond, and
    /// client keys, spread evenly over the shards.
    #[test]
    fn keys_spread_evenly_over_the_shards() {
        const EACH: usize = 400;
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(7);
        let mut random: IdMap<()> = IdMap::default();
        let mut counted: IdMap<()> = IdMap::default();
        let mut named: ShardedMap<String, ()> = ShardedMap::default();
        let mut next = Ulid::from_parts(1_764_000_000_000, rand::Rng::random::<u128>(&mut rng));
        for n in 0..SHARDS * EACH {
            let drawn = Ulid::from_parts(1_764_000_000_000, rand::Rng::random::<u128>(&mut rng));
            random.insert(drawn, ());
            counted.insert(next, ());
            next = next.increment().unwrap();
            named.insert(format!("customer-{n}"), ());
        }
        for (what, sizes) in [
            (
                "random ids",
                random.shards.iter().map(HashMap::len).collect::<Vec<_>>(),
            ),
            (
                "counted ids",
                counted.shards.iter().map(HashMap::len).collect(),
            ),
            (
                "client keys",
                named.shards.iter().map(HashMap::len).collect(),
            ),
        ] {
            assert_eq!(sizes.iter().sum::<usize>(), SHARDS * EACH, "{what}");
            let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            // 400 on average; a shard of twice that would grow as two shards' worth.
            assert!(
                *min >= EACH * 7 / 10 && *max <= EACH * 13 / 10,
                "{what}: shards of {min} to {max}"
            );
        }
    }

    /// A map nothing was ever inserted into holds no shards: a queue without keyed
    /// tasks pays for none.
    #[test]
    fn shards_are_made_on_the_first_insert() {
        let mut map: ShardedMap<Arc<str>, u8> = ShardedMap::default();
        assert_eq!(map.get("a"), None);
        assert_eq!(map.remove("a"), None);
        assert_eq!(map.iter().count(), 0);
        assert!(map.shards.is_empty());
        map.insert("a".into(), 1);
        assert_eq!(map.shards.len(), SHARDS);
        assert_eq!(map.remove("a"), Some(1));
        assert_eq!(map.len(), 0);
    }

    #[test]
    #[should_panic(expected = "no entry for")]
    fn indexing_a_missing_key_panics() {
        let map: IdMap<u8> = IdMap::default();
        let _ = map[&id(1)];
    }
}
