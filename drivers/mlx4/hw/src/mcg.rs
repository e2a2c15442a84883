//! The multicast group entry of READ_MCG/WRITE_MCG (Linux `struct mlx4_mgm` in `mcg.c`).
//!
//! Left out: device-managed flow-steering rules.

use hal::be::*;

/// `next_gid_index`: BE32, the next entry's index << 6.
pub const NEXT_GID_INDEX: usize = 0x00;
/// `members_count`: BE32, count in bits 23:0, protocol in bits 31:30.
pub const MEMBERS_COUNT: usize = 0x04;
/// The group's GID.
pub const GID: usize = 0x10;
/// The member QPs, BE32 each.
pub const QP: usize = 0x20;
/// `MGM_QPN_MASK`.
pub const MGM_QPN_MASK: u32 = 0x00ff_ffff;
/// `MGM_BLCK_LB_BIT`: block multicast loopback for this member.
pub const MGM_BLCK_LB_BIT: u32 = 30;

/// Protocol of a group (`enum mlx4_protocol`).
pub const PROT_IB_IPV6: u32 = 0;

/// A decoded MGM/AMGM entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Mgm {
    /// Index of the next entry in the hash chain (0 = end).
    pub next: u32,
    /// Protocol (bits 31:30 of `members_count`).
    pub prot: u32,
    /// Group GID.
    pub gid: [u8; 16],
    /// Member QP words (QPN | block-loopback bit).
    pub qp: Members,
}

/// A fixed-capacity list of member words (1016 fill a 4 KiB entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Members {
    len: usize,
    words: [u32; 1016],
}
impl Default for Members {
    fn default() -> Self {
        Members {
            len: 0,
            words: [0; 1016],
        }
    }
}
impl Members {
    /// The members.
    pub fn as_slice(&self) -> &[u32] {
        &self.words[..self.len]
    }
    /// Appends; false when full.
    pub fn push(&mut self, w: u32) -> bool {
        if self.len == self.words.len() {
            return false;
        }
        self.words[self.len] = w;
        self.len += 1;
        true
    }
    /// Removes entry `i` by moving the last one into its place (Linux).
    pub fn swap_remove(&mut self, i: usize) {
        if i < self.len {
            self.len -= 1;
            self.words[i] = self.words[self.len];
            self.words[self.len] = 0;
        }
    }
    /// Number of members.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True without members.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Mgm {
    /// Decodes an entry of `b.len()` bytes; a member count beyond what fits
    /// is clamped (the caller checks it against `qp_per_mgm`).
    pub fn from_bytes(b: &[u8]) -> Mgm {
        let mc = get_be32(b, MEMBERS_COUNT);
        let mut m = Mgm {
            next: get_be32(b, NEXT_GID_INDEX) >> 6,
            prot: mc >> 30,
            ..Default::default()
        };
        m.gid.copy_from_slice(&b[GID..GID + 16]);
        let n = ((mc & 0xff_ffff) as usize).min(b.len().saturating_sub(QP) / 4);
        for i in 0..n {
            m.qp.push(get_be32(b, QP + 4 * i));
        }
        m
    }

    /// Encodes into `b` (the whole entry, zeroing unused member slots).
    pub fn to_bytes(&self, b: &mut [u8]) {
        b.fill(0);
        put_be32(b, NEXT_GID_INDEX, self.next << 6);
        put_be32(
            b,
            MEMBERS_COUNT,
            (self.qp.len() as u32 & 0xff_ffff) | (self.prot << 30),
        );
        b[GID..GID + 16].copy_from_slice(&self.gid);
        for (i, &w) in self.qp.as_slice().iter().enumerate() {
            put_be32(b, QP + 4 * i, w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_mgm() {
        let mut m = Mgm {
            next: 0x81,
            prot: 0,
            gid: [0xff; 16],
            ..Default::default()
        };
        m.gid[0] = 0xfe;
        m.qp.push(0x48);
        m.qp.push(0x49 | (1 << MGM_BLCK_LB_BIT));
        let mut b = [0u8; 64];
        m.to_bytes(&mut b);
        assert_eq!(b[0..8], [0, 0, 0x20, 0x40, 0, 0, 0, 2]);
        assert_eq!(b[0x10], 0xfe);
        assert_eq!(b[0x20..0x28], [0, 0, 0, 0x48, 0x40, 0, 0, 0x49]);
        assert_eq!(Mgm::from_bytes(&b), m);
    }
}
