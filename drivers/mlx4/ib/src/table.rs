//! Object tables of the device: slabs indexed by small handles, where Linux keeps pointers and a radix tree of QPNs.
//!
//! A safe port keeps owned objects in per-kind tables. Left out: generation
//! counters against stale handles (a freed slot is reused only after every
//! other free one).

use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;

macro_rules! handle {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub(crate) u32);

        impl $name {
            /// The slot number (for logs and tests).
            pub fn index(self) -> u32 {
                self.0
            }
            /// The handle of ib_core's object of the same slot (ib_core's
            /// `Qp::handle`, `Cq(n)`, ...: the provider hands out its slot
            /// numbers).
            pub fn from_index(i: u32) -> Self {
                $name(i)
            }
        }
    };
}

handle!(PdId, "A protection domain of the device.");
handle!(CqId, "A completion queue of the device.");
handle!(QpId, "A queue pair of the device.");
handle!(SrqId, "A shared receive queue of the device.");
handle!(MrId, "A memory region of the device.");
handle!(AhId, "An address handle of the device.");

/// A slab of `T`: insert returns a slot, freed slots are reused oldest-first.
#[derive(Debug)]
pub struct Slab<T> {
    items: Vec<Option<T>>,
    free: VecDeque<u32>,
    live: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            items: Vec::new(),
            free: VecDeque::new(),
            live: 0,
        }
    }
}

impl<T> Slab<T> {
    /// Stores `v`; returns its slot.
    pub fn insert(&mut self, v: T) -> u32 {
        self.live += 1;
        if let Some(i) = self.free.pop_front()
            && let Some(slot) = self.items.get_mut(i as usize)
        {
            *slot = Some(v);
            return i;
        }
        self.items.push(Some(v));
        (self.items.len() - 1) as u32
    }

    /// The object in slot `i`.
    #[inline]
    pub fn get(&self, i: u32) -> Option<&T> {
        self.items.get(i as usize)?.as_ref()
    }

    /// The object in slot `i`, mutably.
    #[inline]
    pub fn get_mut(&mut self, i: u32) -> Option<&mut T> {
        self.items.get_mut(i as usize)?.as_mut()
    }

    /// Takes the object out of slot `i`.
    pub fn remove(&mut self, i: u32) -> Option<T> {
        let v = self.items.get_mut(i as usize)?.take()?;
        self.free.push_back(i);
        self.live -= 1;
        Some(v)
    }

    /// Live objects.
    pub fn len(&self) -> usize {
        self.live
    }

    /// True if no object is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Slots of the live objects.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.items
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_some())
            .map(|(i, _)| i as u32)
    }
}

/// The QPs of a device with the QPN index CQ polling uses (Linux's
/// `__mlx4_qp_lookup` radix tree).
#[derive(Debug, Default)]
pub struct QpTable {
    pub(crate) slab: Slab<crate::qp::Mlx4IbQp>,
    pub(crate) by_qpn: BTreeMap<u32, u32>,
}

impl QpTable {
    /// Adds a QP; returns its handle.
    pub fn insert(&mut self, qp: crate::qp::Mlx4IbQp) -> QpId {
        let qpn = qp.qpn;
        let i = self.slab.insert(qp);
        self.by_qpn.insert(qpn, i);
        QpId(i)
    }
    /// Removes a QP.
    pub fn remove(&mut self, id: QpId) -> Option<crate::qp::Mlx4IbQp> {
        let qp = self.slab.remove(id.0)?;
        self.by_qpn.remove(&qp.qpn);
        Some(qp)
    }
    /// The slot of the QP with real QPN `qpn`.
    #[inline]
    pub fn lookup(&self, qpn: u32) -> Option<u32> {
        self.by_qpn.get(&qpn).copied()
    }
    /// A QP by handle.
    #[inline]
    pub fn get(&self, id: QpId) -> Option<&crate::qp::Mlx4IbQp> {
        self.slab.get(id.0)
    }
    /// A QP by handle, mutably.
    #[inline]
    pub fn get_mut(&mut self, id: QpId) -> Option<&mut crate::qp::Mlx4IbQp> {
        self.slab.get_mut(id.0)
    }
    /// Live QPs.
    pub fn len(&self) -> usize {
        self.slab.len()
    }
    /// True if none.
    pub fn is_empty(&self) -> bool {
        self.slab.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_oldest_first() {
        let mut s = Slab::default();
        let a = s.insert('a');
        let b = s.insert('b');
        let c = s.insert('c');
        assert_eq!((a, b, c), (0, 1, 2));
        assert_eq!(s.remove(b), Some('b'));
        assert_eq!(s.remove(a), Some('a'));
        assert_eq!(s.remove(a), None, "double free is refused");
        assert_eq!(s.get(b), None);
        assert_eq!(s.insert('d'), 1);
        assert_eq!(s.insert('e'), 0);
        assert_eq!(s.len(), 3);
        assert_eq!(s.ids().collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(s.get(99), None);
    }
}
