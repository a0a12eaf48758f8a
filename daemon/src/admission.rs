//! Budgets for connections that have not earned a place yet: handshakes in progress,
//! and (with tokens configured) connections that have not presented a token.
//!
//! Each stage is a [`Pool`] with a total size and a size per source address. A newcomer
//! is never refused for lack of room: the oldest entry of its own address (when that
//! address is at its share) or else the oldest entry of all is evicted. A flood of
//! half-open or silent connections therefore only pushes out its own kind, oldest
//! first, and a client that completes its handshake and says `hello` promptly always
//! gets through; its place then comes out of `--max-connections`.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// A budget of entries, evicting the oldest when full.
pub struct Pool {
    /// Most entries at once.
    total: usize,
    /// Most entries from one source address at once.
    per_address: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// Oldest first.
    entries: VecDeque<Entry>,
}

struct Entry {
    id: u64,
    address: IpAddr,
    evict: CancellationToken,
}

/// An entry's place in its pool: dropping it frees the place.
pub struct Place {
    pool: Arc<Pool>,
    id: u64,
    /// Cancelled when the entry is evicted to make room for a newer one.
    pub evicted: CancellationToken,
}

impl Pool {
    /// A pool of `total` places, at most `per_address` of them for one source address.
    pub fn new(total: usize, per_address: usize) -> Arc<Pool> {
        assert!(total > 0 && per_address > 0 && per_address <= total);
        Arc::new(Pool {
            total,
            per_address,
            inner: Mutex::new(Inner::default()),
        })
    }

    /// Places held now.
    pub fn held(&self) -> usize {
        self.lock().entries.len()
    }

    /// Takes a place for a connection from `address`, evicting the oldest entry of the
    /// same address when it holds its share, else the oldest of all when full.
    pub fn admit(self: &Arc<Pool>, address: IpAddr) -> Place {
        let mut inner = self.lock();
        let same = inner
            .entries
            .iter()
            .filter(|e| e.address == address)
            .count();
        let victim = if same >= self.per_address {
            inner.entries.iter().position(|e| e.address == address)
        } else if inner.entries.len() >= self.total {
            Some(0)
        } else {
            None
        };
        if let Some(at) = victim {
            let entry = inner.entries.remove(at).expect("the victim is an entry");
            entry.evict.cancel();
        }
        let id = inner.next;
        inner.next += 1;
        let evicted = CancellationToken::new();
        inner.entries.push_back(Entry {
            id,
            address,
            evict: evicted.clone(),
        });
        assert!(inner.entries.len() <= self.total, "a pool outgrew its size");
        Place {
            pool: Arc::clone(self),
            id,
            evicted,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut inner = self.pool.lock();
        if let Some(at) = inner.entries.iter().position(|e| e.id == self.id) {
            inner.entries.remove(at);
        }
    }
}

/// Places of `--max-connections` kept for admins of every queue.
pub const ADMIN_RESERVED_CONNECTIONS: usize = 16;

/// The budgets connections are admitted through (see `server::serve`).
pub struct Admission {
    /// Places of `--max-connections` for everyone.
    pub slots: Arc<Semaphore>,
    /// The last [`ADMIN_RESERVED_CONNECTIONS`] places: for admins of every queue.
    pub reserved: Arc<Semaphore>,
    /// Each configured token's connections and buffered bytes.
    pub tenants: Arc<Tenants>,
    /// Handshakes in progress.
    pub handshakes: Arc<Pool>,
    /// Connections that have not presented a token yet (tokens configured).
    pub unauthenticated: Arc<Pool>,
}

/// A connection's place of `--max-connections`, and of its token's share of them.
pub struct ConnectionSlot {
    pub permit: tokio::sync::OwnedSemaphorePermit,
    pub tenant: Option<TenantPlace>,
}

/// The connections and buffered request bytes of each configured token.
#[derive(Default)]
pub struct Tenants(std::sync::Mutex<HashMap<String, Tenant>>);

#[derive(Default)]
struct Tenant {
    connections: usize,
    /// Bytes of unfinished request frames over all its connections.
    buffered: Arc<AtomicUsize>,
}

/// A connection's place among its token's: dropping it gives it back.
pub struct TenantPlace {
    tenants: Arc<Tenants>,
    name: String,
    pub buffered: Arc<AtomicUsize>,
}

impl Tenants {
    /// A place among `name`'s connections, or how many it holds when that is `cap`.
    pub fn enter(self: &Arc<Tenants>, name: &str, cap: usize) -> Result<TenantPlace, usize> {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let tenant = map.entry(name.to_owned()).or_default();
        if tenant.connections >= cap {
            return Err(tenant.connections);
        }
        tenant.connections += 1;
        Ok(TenantPlace {
            tenants: Arc::clone(self),
            name: name.to_owned(),
            buffered: Arc::clone(&tenant.buffered),
        })
    }
}

impl Drop for TenantPlace {
    fn drop(&mut self) {
        let mut map = self
            .tenants
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let tenant = map
            .get_mut(&self.name)
            .expect("a tenant with a place is in the map");
        assert!(tenant.connections > 0, "a tenant's places are counted");
        tenant.connections -= 1;
        if tenant.connections == 0 {
            map.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn a_full_pool_evicts_the_oldest_of_the_newcomers_address_first_then_the_oldest() {
        let pool = Pool::new(4, 2);
        let a1 = pool.admit(ip(1));
        let b1 = pool.admit(ip(2));
        let a2 = pool.admit(ip(1));
        // Address 1 holds its share: its oldest goes, nobody else's.
        let a3 = pool.admit(ip(1));
        assert!(a1.evicted.is_cancelled());
        assert!(!b1.evicted.is_cancelled() && !a2.evicted.is_cancelled());
        assert_eq!(pool.held(), 3);
        let c1 = pool.admit(ip(3));
        assert_eq!(pool.held(), 4);
        // Full: the oldest of all (b1) goes for an address below its share.
        let d1 = pool.admit(ip(4));
        assert!(b1.evicted.is_cancelled());
        assert_eq!(pool.held(), 4);
        // Dropping a place frees it; dropping an evicted one changes nothing.
        drop(a1);
        drop(b1);
        assert_eq!(pool.held(), 4);
        drop(c1);
        assert_eq!(pool.held(), 3);
        for p in [&a2, &a3, &d1] {
            assert!(!p.evicted.is_cancelled());
        }
    }
}
