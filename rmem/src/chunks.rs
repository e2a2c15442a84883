//! The memory node's chunk table.
//!
//! Page-granular first-fit allocation inside the exported region, each chunk owned
//! by one connection (our own; LITE's LMR bookkeeping in spirit); leaves out
//! per-chunk rkeys (every chunk is reached with the region's rkey, the card
//! bounding accesses to the region).
//!
//! The table's capacity is fixed when the region is exported: allocating
//! and freeing never allocate memory.

use alloc::vec::Vec;

use crate::proto::Status;

/// Chunks are whole pages of this size.
pub const PAGE: u64 = 4096;

/// One allocated chunk: offset and length in the region, and its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Offset from the region's start.
    pub off: u64,
    /// Length (a multiple of [`PAGE`]).
    pub len: u64,
    /// The connection that allocated it.
    pub owner: u32,
}

/// The chunks of one region, sorted by offset.
#[derive(Debug)]
pub struct Chunks {
    size: u64,
    used: Vec<Chunk>,
    cap: usize,
}

impl Chunks {
    /// A table for a region of `size` bytes holding at most `cap` chunks.
    pub fn new(size: u64, cap: usize) -> Chunks {
        Chunks {
            size,
            used: Vec::with_capacity(cap),
            cap,
        }
    }

    /// Allocates `len` bytes (rounded up to pages) for `owner`; returns the
    /// offset and rounded length.
    pub fn alloc(&mut self, len: u64, owner: u32) -> Result<(u64, u64), Status> {
        if len == 0 || len > self.size {
            return Err(Status::BadLength);
        }
        let len = len.div_ceil(PAGE) * PAGE;
        if self.used.len() >= self.cap {
            return Err(Status::NoSpace);
        }
        let mut at = 0u64;
        let mut idx = self.used.len();
        for (i, c) in self.used.iter().enumerate() {
            if c.off - at >= len {
                idx = i;
                break;
            }
            at = c.off + c.len;
        }
        if idx == self.used.len() && self.size - at < len {
            return Err(Status::NoSpace);
        }
        self.used.insert(
            idx,
            Chunk {
                off: at,
                len,
                owner,
            },
        );
        Ok((at, len))
    }

    /// Frees the chunk of `owner` starting at `off`.
    pub fn free(&mut self, off: u64, owner: u32) -> Result<u64, Status> {
        match self.used.binary_search_by_key(&off, |c| c.off) {
            Ok(i) if self.used[i].owner == owner => Ok(self.used.remove(i).len),
            _ => Err(Status::NotOwner),
        }
    }

    /// Frees every chunk of `owner` (its connection went away); returns how
    /// many.
    pub fn free_owner(&mut self, owner: u32) -> usize {
        let before = self.used.len();
        self.used.retain(|c| c.owner != owner);
        before - self.used.len()
    }

    /// The chunks, by offset.
    pub fn iter(&self) -> impl Iterator<Item = &Chunk> {
        self.used.iter()
    }

    /// Bytes allocated.
    pub fn used_bytes(&self) -> u64 {
        self.used.iter().map(|c| c.len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_page_granular_with_owners() {
        let mut t = Chunks::new(16 * PAGE, 8);
        assert_eq!(t.alloc(1, 1), Ok((0, PAGE)));
        assert_eq!(t.alloc(PAGE + 1, 2), Ok((PAGE, 2 * PAGE)));
        assert_eq!(t.alloc(PAGE, 1), Ok((3 * PAGE, PAGE)));
        assert_eq!(t.free(PAGE, 1), Err(Status::NotOwner), "not yours");
        assert_eq!(t.free(PAGE, 2), Ok(2 * PAGE));
        assert_eq!(t.free(PAGE, 2), Err(Status::NotOwner), "twice");
        assert_eq!(t.alloc(PAGE, 3), Ok((PAGE, PAGE)), "hole reused");
        assert_eq!(t.alloc(13 * PAGE, 3), Err(Status::NoSpace));
        assert_eq!(t.alloc(12 * PAGE, 3), Ok((4 * PAGE, 12 * PAGE)));
        assert_eq!(t.alloc(0, 3), Err(Status::BadLength));
        assert_eq!(t.alloc(u64::MAX, 3), Err(Status::BadLength));
        assert_eq!(t.free_owner(1), 2);
        assert_eq!(t.used_bytes(), 13 * PAGE);
    }

    #[test]
    fn table_capacity_is_a_clear_error() {
        let mut t = Chunks::new(16 * PAGE, 2);
        t.alloc(PAGE, 1).unwrap();
        t.alloc(PAGE, 1).unwrap();
        assert_eq!(t.alloc(PAGE, 1), Err(Status::NoSpace));
    }
}
