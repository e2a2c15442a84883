//! Protection domains, XRC domains and user access regions, as Linux's `pd.c` allocates them.
//!
//! Linux: `pd.c` (`mlx4_pd_alloc/free`, `mlx4_xrcd_alloc/free`,
//! `mlx4_uar_alloc/free` and the table inits). BlueFlame registers
//! (`mlx4_bf_alloc`) are left out.

use hal::PciAddress;

use crate::bitmap::Bitmap;
use crate::dev::{Caps, Dev, Hca};
use crate::{Error, Result, mlx4_err};

pub use crate::dev::Uar;

/// `NOT_MASKED_PD_BITS`: PD numbers carry rotating bits above 15.
pub const NOT_MASKED_PD_BITS: u32 = 17;

/// Linux `mlx4_init_uar_table`: the UARs above the 128 that carry EQ
/// doorbells.
pub(crate) fn init_uar_table(caps: &Caps, pci: PciAddress) -> Result<Bitmap> {
    let n = caps.num_uars;
    if n <= 128 {
        mlx4_err!(pci, "Only {n} UAR pages (need more than 128)");
        mlx4_err!(pci, "Increase firmware log2_uar_bar_megabytes?");
        return Err(Error::NoDevice);
    }
    Bitmap::new(n, n - 1, caps.reserved_uars, 0)
}

/// Linux `mlx4_uar_alloc` from `table`: an index and its page of BAR2.
pub(crate) fn uar_alloc_in(table: &mut Bitmap, hca: &Hca) -> Result<Uar> {
    let index = table.alloc()?;
    let page = index & (hca.caps.num_uars - 1);
    let map = hca
        .uar_bar
        .as_ref()
        .and_then(|b| b.slice(page as usize * 4096, 4096))
        .ok_or(Error::NoDevice);
    match map {
        Ok(map) => Ok(Uar { index: page, map }),
        Err(e) => {
            table.free(index);
            Err(e)
        }
    }
}

/// Linux `mlx4_init_pd_table`.
pub(crate) fn init_pd_table(caps: &Caps) -> Result<Bitmap> {
    Bitmap::new(
        caps.num_pds,
        (1 << NOT_MASKED_PD_BITS) - 1,
        caps.reserved_pds,
        0,
    )
}

/// Linux `mlx4_init_xrcd_table`.
pub(crate) fn init_xrcd_table(caps: &Caps) -> Result<Bitmap> {
    Bitmap::new(1 << 16, (1 << 16) - 1, caps.reserved_xrcds + 1, 0)
}

impl Dev {
    /// Linux `mlx4_uar_alloc`.
    #[doc(alias = "mlx4_uar_alloc")]
    pub fn uar_alloc(&mut self) -> Result<Uar> {
        uar_alloc_in(&mut self.tables.uar, &self.hca)
    }

    /// Linux `mlx4_uar_free`.
    #[doc(alias = "mlx4_uar_free")]
    pub fn uar_free(&mut self, uar: Uar) {
        self.tables.uar.free(uar.index);
    }

    /// Linux `mlx4_pd_alloc`: a protection domain number.
    #[doc(alias = "mlx4_pd_alloc")]
    pub fn pd_alloc(&mut self) -> Result<u32> {
        self.tables.pd.alloc()
    }

    /// Linux `mlx4_pd_free`.
    #[doc(alias = "mlx4_pd_free")]
    pub fn pd_free(&mut self, pdn: u32) {
        self.tables.pd.free(pdn);
    }

    /// Linux `mlx4_xrcd_alloc`.
    #[doc(alias = "mlx4_xrcd_alloc")]
    pub fn xrcd_alloc(&mut self) -> Result<u32> {
        self.tables.xrcd.alloc()
    }

    /// Linux `mlx4_xrcd_free`.
    #[doc(alias = "mlx4_xrcd_free")]
    pub fn xrcd_free(&mut self, xrcdn: u32) {
        self.tables.xrcd.free(xrcdn);
    }

    /// Free PDs, UARs (leak checks).
    pub fn pd_uar_avail(&self) -> (u32, u32) {
        (self.tables.pd.avail(), self.tables.uar.avail())
    }
}
