//! Multicast group table sizing (Linux `mcg.c`: `mlx4_get_mgm_entry_size`, `mlx4_get_qp_per_mgm`, `mlx4_init_mcg_table`); attaching QPs to groups (READ_MCG/WRITE_MCG/MGID_HASH) and flow steering are left out, as in LegoOS.

use crate::Result;
use crate::bitmap::Bitmap;
use crate::main::Dev;

/// Linux `mlx4_get_qp_per_mgm`: 4 * (entry size / 16 - 2).
pub fn qp_per_mgm(log_mgm_entry_size: u32) -> u32 {
    4 * ((1u32 << log_mgm_entry_size.min(12)) / 16).saturating_sub(2)
}

impl Dev {
    /// Linux `mlx4_init_mcg_table` (A0/B0 steering): the AMGM bitmap. The MGM
    /// table itself was mapped whole with the ICM.
    pub(crate) fn init_mcg_table(&mut self) -> Result<()> {
        let n = self.caps.num_amgms.max(1);
        self.mcg_bitmap = Some(Bitmap::new(n, n - 1, 0, 0)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn qp_per_mgm_linux_default() {
        assert_eq!(super::qp_per_mgm(10), 248);
    }
}
