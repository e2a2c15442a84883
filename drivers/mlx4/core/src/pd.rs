//! Protection domains, XRC domains and UARs (Linux `pd.c`: `mlx4_pd_alloc/free`, `mlx4_xrcd_alloc/free`, `mlx4_uar_alloc/free`, their table inits); BlueFlame registers (`mlx4_bf_alloc`) are left out.

use hal::Bar;

use crate::bitmap::Bitmap;
use crate::main::Dev;
use crate::{Error, Result};

/// `NOT_MASKED_PD_BITS`: PD numbers carry rotating bits above 15.
pub const NOT_MASKED_PD_BITS: u32 = 17;

/// A user access region: one 4 KiB page of BAR2 (Linux `struct mlx4_uar`).
pub struct Uar {
    /// UAR index (the `usr_page`/`logsize_usrpage` field of contexts).
    pub index: u32,
    /// The doorbell page.
    pub map: Bar,
}

impl core::fmt::Debug for Uar {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Uar({})", self.index)
    }
}

impl Dev {
    pub(crate) fn init_uar_table(&mut self) -> Result<()> {
        let n = self.caps.num_uars;
        if n <= 128 {
            log::error!(
                "mlx4_core {}: Only {n} UAR pages (need more than 128)",
                self.pci
            );
            log::error!(
                "mlx4_core {}: Increase firmware log2_uar_bar_megabytes?",
                self.pci
            );
            return Err(Error::NoDevice);
        }
        self.uar_table = Some(Bitmap::new(n, n - 1, self.caps.reserved_uars, 0)?);
        Ok(())
    }

    /// Linux `mlx4_uar_alloc`.
    #[doc(alias = "mlx4_uar_alloc")]
    pub fn uar_alloc(&mut self) -> Result<Uar> {
        let t = self.uar_table.as_mut().ok_or(Error::InvalidArg)?;
        let index = t.alloc()?;
        let page = index & (self.caps.num_uars - 1);
        let map = self
            .uar_bar
            .as_ref()
            .and_then(|b| b.slice(page as usize * 4096, 4096))
            .ok_or(Error::NoDevice);
        match map {
            Ok(map) => Ok(Uar { index: page, map }),
            Err(e) => {
                t.free(index);
                Err(e)
            }
        }
    }

    /// Linux `mlx4_uar_free`.
    #[doc(alias = "mlx4_uar_free")]
    pub fn uar_free(&mut self, uar: Uar) {
        if let Some(t) = self.uar_table.as_mut() {
            t.free(uar.index);
        }
    }

    pub(crate) fn init_pd_table(&mut self) -> Result<()> {
        self.pd_bitmap = Some(Bitmap::new(
            self.caps.num_pds,
            (1 << NOT_MASKED_PD_BITS) - 1,
            self.caps.reserved_pds,
            0,
        )?);
        Ok(())
    }

    /// Linux `mlx4_pd_alloc`: a protection domain number.
    #[doc(alias = "mlx4_pd_alloc")]
    pub fn pd_alloc(&mut self) -> Result<u32> {
        self.pd_bitmap.as_mut().ok_or(Error::InvalidArg)?.alloc()
    }

    /// Linux `mlx4_pd_free`.
    #[doc(alias = "mlx4_pd_free")]
    pub fn pd_free(&mut self, pdn: u32) {
        if let Some(b) = self.pd_bitmap.as_mut() {
            b.free(pdn);
        }
    }

    pub(crate) fn init_xrcd_table(&mut self) -> Result<()> {
        self.xrcd_bitmap = Some(Bitmap::new(
            1 << 16,
            (1 << 16) - 1,
            self.caps.reserved_xrcds + 1,
            0,
        )?);
        Ok(())
    }

    /// Linux `mlx4_xrcd_alloc`.
    #[doc(alias = "mlx4_xrcd_alloc")]
    pub fn xrcd_alloc(&mut self) -> Result<u32> {
        self.xrcd_bitmap.as_mut().ok_or(Error::InvalidArg)?.alloc()
    }

    /// Linux `mlx4_xrcd_free`.
    #[doc(alias = "mlx4_xrcd_free")]
    pub fn xrcd_free(&mut self, xrcdn: u32) {
        if let Some(b) = self.xrcd_bitmap.as_mut() {
            b.free(xrcdn);
        }
    }

    /// Free PDs, UARs (leak checks).
    pub fn pd_uar_avail(&self) -> (u32, u32) {
        (
            self.pd_bitmap.as_ref().map_or(0, Bitmap::avail),
            self.uar_table.as_ref().map_or(0, Bitmap::avail),
        )
    }
}
