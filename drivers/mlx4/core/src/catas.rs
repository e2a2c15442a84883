//! Catastrophic-error detection by polling the internal error buffer, as Linux's `catas.c` does on a timer.
//!
//! Linux: `catas.c` (`mlx4_start_catas_poll`, `poll_catas`, `dump_err_buf`,
//! `mlx4_stop_catas_poll`). The timer is replaced by [`Dev::poll_catas`]
//! called from the progress loop; the automatic device restart
//! (`internal_err_reset`) is left out.

use crate::dev::{Catas, Dev};
use crate::intf::Event;
use crate::{mlx4_err, mlx4_warn};

/// Linux `MLX4_CATAS_POLL_INTERVAL` (5 s); here every poll reads the buffer
/// (one MMIO dword), so an error is seen within one poll.
pub const CATAS_POLL_INTERVAL_MS: u32 = 5000;

impl Dev {
    /// Linux `mlx4_start_catas_poll`: maps the buffer QUERY_FW described.
    pub(crate) fn start_catas_poll(&mut self) {
        self.mark_registered();
        let fw = self.hca.fw;
        let bar = match fw.catas_bar {
            0 => self.hca.bar0.as_ref(),
            2 => self.hca.uar_bar.as_ref(),
            _ => None,
        };
        let len = (fw.catas_size as usize).checked_mul(4);
        let map = match (bar, usize::try_from(fw.catas_offset), len) {
            (Some(b), Ok(off), Some(len)) if len > 0 && off % 4 == 0 => b.slice(off, len),
            _ => None,
        };
        if map.is_none() {
            mlx4_warn!(
                self.hca.pci,
                "Failed to map internal error buffer at {:#x}",
                fw.catas_offset
            );
        }
        self.catas = Catas {
            map,
            size: fw.catas_size,
            hit: false,
        };
    }

    pub(crate) fn stop_catas_poll(&mut self) {
        self.catas.map = None;
    }

    /// Linux `poll_catas`: if the first dword of the error buffer is
    /// non-zero, dump the buffer, report [`Event::CatastrophicError`] to
    /// every interface (once) and return true.
    pub fn poll_catas(&mut self) -> bool {
        if self.catas.hit {
            return true;
        }
        let Some(map) = self.catas.map.as_ref() else {
            return false;
        };
        if map.read32(0) == 0 {
            return false;
        }
        mlx4_err!(self.hca.pci, "Internal error detected:");
        for i in 0..self.catas.size.min(64) as usize {
            mlx4_err!(self.hca.pci, "  buf[{i:02x}]: {:08x}", map.read_be32(i * 4));
        }
        self.catas_detected();
        true
    }

    /// Marks the device failed and reports [`Event::CatastrophicError`] once.
    pub(crate) fn catas_detected(&mut self) {
        if !self.catas.hit {
            self.catas.hit = true;
            self.dispatch_event(Event::CatastrophicError);
        }
    }

    /// True once a catastrophic error has been seen.
    pub fn is_catastrophic(&self) -> bool {
        self.catas.hit
    }

    /// The progress function: catastrophic-error check, then every EQ.
    /// Returns the number of EQEs consumed.
    pub fn poll(&mut self) -> usize {
        self.poll_catas();
        self.poll_eq()
    }
}
