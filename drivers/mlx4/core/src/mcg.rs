//! Multicast groups with A0/B0 steering, as Linux's `mcg.c` attaches and detaches QPs.
//!
//! Linux: `mcg.c` (`mlx4_get_mgm_entry_size`, `mlx4_get_qp_per_mgm`,
//! `mlx4_init_mcg_table`, `find_entry`, `mlx4_qp_attach_common`,
//! `mlx4_qp_detach_common`): MGID hashing and the MGM/AMGM hash chains.
//! Device-managed flow steering and the Ethernet steering lists are left out.

use mlx4_hw::cmd::{Opcode, timeout};
use mlx4_hw::mcg::{MGM_BLCK_LB_BIT, MGM_QPN_MASK, Mgm, PROT_IB_IPV6};

use crate::bitmap::Bitmap;
use crate::cmd::Mailbox;
use crate::dev::{Caps, Dev};
use crate::qp::Qp;
use crate::{Error, Result, mlx4_dbg, mlx4_err, mlx4_warn};

/// Linux `mlx4_get_qp_per_mgm`: 4 * (entry size / 16 - 2).
pub fn qp_per_mgm(log_mgm_entry_size: u32) -> u32 {
    4 * ((1u32 << log_mgm_entry_size.min(12)) / 16).saturating_sub(2)
}

/// Linux `mlx4_init_mcg_table` (A0/B0 steering): the AMGM bitmap. The MGM
/// table itself was mapped whole with the ICM.
pub(crate) fn init_mcg_table(caps: &Caps) -> Result<Bitmap> {
    let n = caps.num_amgms.max(1);
    Bitmap::new(n, n - 1, 0, 0)
}

impl Dev {
    fn mgm_entry_size(&self) -> usize {
        1 << self.hca.layout.init_hca.log_mc_entry_sz.min(12)
    }

    fn read_entry(&mut self, index: u32, mb: &Mailbox) -> Result<Mgm> {
        self.hca
            .cmd
            .cmd_box(0, mb.dma(), index, 0, Opcode::READ_MCG, timeout::CLASS_A)?;
        let b: [u8; 4096] = mb.read();
        Ok(Mgm::from_bytes(&b[..self.mgm_entry_size()]))
    }

    fn write_entry(&mut self, index: u32, mb: &Mailbox, m: &Mgm) -> Result<()> {
        let mut b = [0u8; 4096];
        let n = self.mgm_entry_size();
        m.to_bytes(&mut b[..n]);
        mb.write(0, &b[..n]);
        self.hca
            .cmd
            .cmd(mb.dma(), index, 0, Opcode::WRITE_MCG, timeout::CLASS_A)
    }

    fn mgid_hash(&mut self, gid: &[u8; 16]) -> Result<u32> {
        let mb = Mailbox::new(&self.hca.pool)?;
        mb.write(0, gid);
        let h = self
            .hca
            .cmd
            .cmd_imm(mb.dma(), 0, 0, Opcode::MGID_HASH, timeout::CLASS_A)?;
        if h >= u64::from(self.hca.caps.num_mgms) {
            return Err(Error::BadCaps {
                field: "mgid_hash",
                value: h,
            });
        }
        Ok(h as u32)
    }

    /// Linux `find_entry`: walks the hash chain of `gid`. Returns (entry,
    /// index, previous index) if found, else `(None, hash, last index)`.
    fn find_entry(
        &mut self,
        gid: &[u8; 16],
        prot: u32,
        mb: &Mailbox,
    ) -> Result<(Option<Mgm>, u32, Option<u32>)> {
        let hash = self.mgid_hash(gid)?;
        let total = self.hca.caps.num_mgms + self.hca.caps.num_amgms;
        let mut index = hash;
        let mut prev = None;
        // A chain longer than the table is device nonsense, not a loop.
        for _ in 0..=total {
            let m = self.read_entry(index, mb)?;
            if m.qp.is_empty() {
                if index != hash {
                    mlx4_err!(self.hca.pci, "Found zero MGID in AMGM.");
                    return Err(Error::InvalidArg);
                }
                return Ok((None, index, None));
            }
            if m.gid == *gid && m.prot == prot {
                return Ok((Some(m), index, prev));
            }
            prev = Some(index);
            if m.next == 0 {
                return Ok((None, index, prev));
            }
            if m.next >= total {
                return Err(Error::BadCaps {
                    field: "next_gid_index",
                    value: u64::from(m.next),
                });
            }
            index = m.next;
        }
        Err(Error::BadCaps {
            field: "next_gid_index",
            value: u64::from(index),
        })
    }

    /// Linux `mlx4_multicast_attach` for IB (`mlx4_qp_attach_common`).
    #[doc(alias = "mlx4_multicast_attach")]
    pub fn multicast_attach(
        &mut self,
        qp: &Qp,
        gid: &[u8; 16],
        block_loopback: bool,
    ) -> Result<()> {
        let prot = PROT_IB_IPV6;
        let mb = Mailbox::new(&self.hca.pool)?;
        let (found, index, prev) = self.find_entry(gid, prot, &mb)?;
        let (mut m, index, link) = match found {
            Some(m) => (m, index, None),
            None if prev.is_none() => (
                Mgm {
                    gid: *gid,
                    prot,
                    ..Default::default()
                },
                index,
                None,
            ),
            None => {
                // Chain a new AMGM entry after the last one.
                let Ok(a) = self.tables.mcg.alloc() else {
                    mlx4_err!(self.hca.pci, "No AMGM entries left");
                    return Err(Error::NoMem);
                };
                (
                    Mgm {
                        gid: *gid,
                        prot,
                        ..Default::default()
                    },
                    a + self.hca.caps.num_mgms,
                    Some(index),
                )
            }
        };
        let r = (|| {
            if m.qp.len() as u32 >= self.hca.caps.num_qp_per_mgm {
                mlx4_err!(self.hca.pci, "MGM at index {index:x} is full.");
                return Err(Error::NoMem);
            }
            if m.qp.as_slice().iter().any(|&w| w & MGM_QPN_MASK == qp.qpn) {
                mlx4_dbg!(self.hca.pci, "QP {:06x} already a member of MGM", qp.qpn);
                return Ok(());
            }
            let w = (qp.qpn & MGM_QPN_MASK) | (u32::from(block_loopback) << MGM_BLCK_LB_BIT);
            m.qp.push(w);
            self.write_entry(index, &mb, &m)?;
            if let Some(prev) = link {
                let mut p = self.read_entry(prev, &mb)?;
                p.next = index;
                self.write_entry(prev, &mb, &p)?;
            }
            Ok(())
        })();
        if r.is_err() && link.is_some() {
            self.tables.mcg.free(index - self.hca.caps.num_mgms);
        }
        r
    }

    /// Linux `mlx4_multicast_detach` for IB (`mlx4_qp_detach_common`).
    #[doc(alias = "mlx4_multicast_detach")]
    pub fn multicast_detach(&mut self, qp: &Qp, gid: &[u8; 16]) -> Result<()> {
        let prot = PROT_IB_IPV6;
        let mb = Mailbox::new(&self.hca.pool)?;
        let (found, index, prev) = self.find_entry(gid, prot, &mb)?;
        let Some(mut m) = found else {
            mlx4_err!(self.hca.pci, "MGID not found");
            return Err(Error::InvalidArg);
        };
        let Some(loc) =
            m.qp.as_slice()
                .iter()
                .position(|&w| w & MGM_QPN_MASK == qp.qpn)
        else {
            mlx4_err!(self.hca.pci, "QP {:06x} not found in MGM", qp.qpn);
            return Err(Error::InvalidArg);
        };
        m.qp.swap_remove(loc);
        if !m.qp.is_empty() {
            return self.write_entry(index, &mb, &m);
        }
        // The entry goes away.
        let num_mgms = self.hca.caps.num_mgms;
        match prev {
            None => {
                // Remove from the MGM: pull the next AMGM entry into its place.
                let amgm = m.next;
                let repl = if amgm != 0 {
                    self.read_entry(amgm, &mb)?
                } else {
                    Mgm {
                        prot,
                        ..Default::default()
                    }
                };
                self.write_entry(index, &mb, &repl)?;
                if amgm != 0 {
                    if amgm < num_mgms {
                        mlx4_warn!(self.hca.pci, "Got AMGM index {amgm} < {num_mgms}");
                    } else {
                        self.tables.mcg.free(amgm - num_mgms);
                    }
                }
            }
            Some(prev) => {
                // Remove from the AMGM chain.
                let mut p = self.read_entry(prev, &mb)?;
                p.next = m.next;
                self.write_entry(prev, &mb, &p)?;
                if index < num_mgms {
                    mlx4_warn!(
                        self.hca.pci,
                        "entry {prev} had next AMGM index {index} < {num_mgms}"
                    );
                } else {
                    self.tables.mcg.free(index - num_mgms);
                }
            }
        }
        Ok(())
    }

    /// Free AMGM entries (leak checks).
    pub fn amgm_avail(&self) -> u32 {
        self.tables.mcg.avail()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn qp_per_mgm_linux_default() {
        assert_eq!(super::qp_per_mgm(10), 248);
    }
}
