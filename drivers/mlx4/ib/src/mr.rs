//! Memory regions (Linux `mr.c`): DMA MRs, registered page lists and deregistration.
//!
//! `mlx4_ib_get_dma_mr`, `mlx4_ib_reg_phys_mr`-style registration of an
//! arbitrary page list through MTTs, `mlx4_ib_dereg_mr`, `convert_access`.
//! Left out: user memory (`ib_umem`), fast-register MRs, FMRs and memory
//! windows.
//!
//! A DMA MR (no translation) reaches all of memory; this port refuses to
//! give one a remote key, so no peer can read or write the whole host
//! through it. Remote access needs a registered page list.

use mlx4_hw::mr::flags;

use crate::verbs::AccessFlags;

/// A memory region (Linux `struct mlx4_ib_mr`).
#[derive(Debug)]
pub struct Mlx4IbMr {
    pub(crate) mmr: mlx4_core::mr::Mr,
    pub(crate) pd: crate::PdId,
}

impl Mlx4IbMr {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.mmr.key
    }
    /// The remote key (the same key; meaningful only with remote access).
    pub fn rkey(&self) -> u32 {
        self.mmr.key
    }
    /// Start address and length.
    pub fn range(&self) -> (u64, u64) {
        (self.mmr.iova, self.mmr.size)
    }
}

/// Linux `convert_access`: IB access flags to `MLX4_PERM_*` (local read is
/// always granted).
pub fn convert_access(acc: AccessFlags) -> u32 {
    let mut p = flags::PERM_LOCAL_READ;
    if acc.contains(AccessFlags::REMOTE_ATOMIC) {
        p |= flags::PERM_ATOMIC;
    }
    if acc.contains(AccessFlags::REMOTE_WRITE) {
        p |= flags::PERM_REMOTE_WRITE;
    }
    if acc.contains(AccessFlags::REMOTE_READ) {
        p |= flags::PERM_REMOTE_READ;
    }
    if acc.contains(AccessFlags::LOCAL_WRITE) {
        p |= flags::PERM_LOCAL_WRITE;
    }
    p
}

/// Access flags that expose memory to peers.
pub const REMOTE_ACCESS: AccessFlags = AccessFlags(
    AccessFlags::REMOTE_READ.0 | AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_ATOMIC.0,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_bits_follow_linux() {
        assert_eq!(convert_access(AccessFlags::empty()), 1 << 10);
        assert_eq!(
            convert_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE),
            (1 << 10) | (1 << 11) | (1 << 13)
        );
        assert_eq!(
            convert_access(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC),
            (1 << 10) | (1 << 12) | (1 << 14)
        );
    }
}
