//! The interrupts of a vfio-user function: INTx (one eventfd, automasked
//! until the client unmasks it, as vfio's INTx is, and held while the
//! command register's Interrupt Disable bit is set) and MSI-X (one eventfd
//! per vector), each raised by a write to its eventfd.

use std::fs::File;
use std::io::Write as _;

use super::*;

/// The eventfds the client handed over and INTx's mask state.
#[derive(Default)]
pub struct Interrupts {
    intx: Option<File>,
    intx_masked: bool,
    intx_pending: bool,
    /// The command register's Interrupt Disable bit (PCI: the function
    /// must not assert INTx while it is set).
    intx_disabled: bool,
    msix: Vec<Option<File>>,
    /// Interrupts delivered (INTx, MSI-X).
    pub delivered: (u64, u64),
    /// Interrupts of a vector with no eventfd (lost, as on a card whose
    /// vector the OS has not set up).
    pub lost: u64,
}

fn kick(f: &File) -> bool {
    let mut f = f;
    f.write_all(&1u64.to_ne_bytes()).is_ok()
}

impl Interrupts {
    fn msix_enabled(&self) -> bool {
        self.msix.iter().any(Option::is_some)
    }

    /// Raises vector `v`: over MSI-X when the client has enabled it, else
    /// INTx (automasked until unmasked).
    pub fn raise(&mut self, v: u16) {
        if self.msix_enabled() {
            match self.msix.get(usize::from(v)).and_then(Option::as_ref) {
                Some(f) if kick(f) => self.delivered.1 += 1,
                _ => self.lost += 1,
            }
            return;
        }
        let Some(f) = &self.intx else {
            self.lost += 1;
            return;
        };
        if self.intx_masked || self.intx_disabled {
            self.intx_pending = true;
        } else if kick(f) {
            self.intx_masked = true;
            self.delivered.0 += 1;
        } else {
            self.lost += 1;
        }
    }

    /// SET_IRQS; `Err` for what the function does not support.
    pub fn set(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        mut fds: Vec<File>,
    ) -> Result<(), String> {
        let action = flags & (IRQ_SET_ACTION_MASK | IRQ_SET_ACTION_UNMASK | IRQ_SET_ACTION_TRIGGER);
        let data = flags & (IRQ_SET_DATA_NONE | IRQ_SET_DATA_BOOL | IRQ_SET_DATA_EVENTFD);
        match (index, action, data) {
            (irq::INTX, IRQ_SET_ACTION_TRIGGER, IRQ_SET_DATA_EVENTFD) if start == 0 => {
                self.intx = if count == 0 { None } else { fds.pop() };
                self.intx_masked = false;
                self.intx_pending = false;
            }
            (irq::INTX, IRQ_SET_ACTION_TRIGGER, IRQ_SET_DATA_NONE) if count == 0 => {
                self.intx = None;
            }
            (irq::INTX, IRQ_SET_ACTION_MASK, IRQ_SET_DATA_NONE) => self.intx_masked = true,
            (irq::INTX, IRQ_SET_ACTION_UNMASK, IRQ_SET_DATA_NONE) => {
                self.intx_masked = false;
                if !self.intx_disabled && core::mem::take(&mut self.intx_pending) {
                    self.raise_intx_now();
                }
            }
            (irq::INTX, IRQ_SET_ACTION_UNMASK | IRQ_SET_ACTION_MASK, IRQ_SET_DATA_EVENTFD) => {
                // An unmask eventfd (irqfd resampling): the client unmasks
                // with messages too; nothing to keep.
            }
            (irq::MSIX, IRQ_SET_ACTION_TRIGGER, IRQ_SET_DATA_EVENTFD) => {
                let end = start
                    .checked_add(count)
                    .filter(|e| *e <= MSIX_VECTORS)
                    .ok_or(format!(
                        "MSI-X vectors {start}+{count} beyond {MSIX_VECTORS}"
                    ))?;
                if self.msix.len() < MSIX_VECTORS as usize {
                    self.msix.resize_with(MSIX_VECTORS as usize, || None);
                }
                let mut fds = fds.into_iter();
                for v in start..end {
                    self.msix[v as usize] = fds.next();
                }
            }
            (irq::MSIX, IRQ_SET_ACTION_TRIGGER, IRQ_SET_DATA_NONE) if count == 0 => {
                self.msix.clear();
            }
            (irq::MSIX, IRQ_SET_ACTION_MASK | IRQ_SET_ACTION_UNMASK, _) => {
                // Per-vector masking lives in the table the client emulates.
            }
            (
                irq::ERR | irq::REQ,
                IRQ_SET_ACTION_TRIGGER,
                IRQ_SET_DATA_EVENTFD | IRQ_SET_DATA_NONE,
            ) if start == 0 && count <= 1 => {
                // Kept by the client's side only: never raised.
            }
            _ => {
                return Err(format!(
                    "SET_IRQS index {index} flags {flags:#x} start {start} count {count} not supported"
                ));
            }
        }
        Ok(())
    }

    /// The command register's Interrupt Disable bit as the guest left it:
    /// INTx raised while it was set is asserted once it clears. (A guest
    /// that never takes INTx should set it: QEMU's vfio-user client turns
    /// the mapped BARs back into trapped ones for good at the first INTx,
    /// to see the guest's acknowledgement.)
    pub fn set_intx_disabled(&mut self, disabled: bool) {
        self.intx_disabled = disabled;
        if !disabled && !self.intx_masked && core::mem::take(&mut self.intx_pending) {
            self.raise_intx_now();
        }
    }

    fn raise_intx_now(&mut self) {
        if let Some(f) = &self.intx
            && kick(f)
        {
            self.intx_masked = true;
            self.delivered.0 += 1;
        }
    }

    /// The device was reset: every interrupt is disabled.
    pub fn reset(&mut self) {
        self.intx = None;
        self.intx_masked = false;
        self.intx_pending = false;
        self.msix.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    #[test]
    fn intx_is_automasked_until_unmasked_and_msix_goes_by_vector() {
        let mut irqs = Interrupts::default();
        let efd = |n| {
            // SAFETY: creates a new eventfd.
            let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK) };
            assert!(fd >= 0, "{n}");
            // SAFETY: ours.
            unsafe { File::from_raw_fd(fd) }
        };
        let read = |f: &File| {
            let mut b = [0u8; 8];
            use std::io::Read;
            let mut f = f;
            f.read(&mut b).map(|_| u64::from_ne_bytes(b)).unwrap_or(0)
        };
        let intx = efd(0);
        irqs.set(
            irq::INTX,
            IRQ_SET_ACTION_TRIGGER | IRQ_SET_DATA_EVENTFD,
            0,
            1,
            vec![intx.try_clone().unwrap()],
        )
        .unwrap();
        irqs.raise(0);
        irqs.raise(0);
        assert_eq!(read(&intx), 1, "second raise waits for the unmask");
        irqs.set(
            irq::INTX,
            IRQ_SET_ACTION_UNMASK | IRQ_SET_DATA_NONE,
            0,
            1,
            vec![],
        )
        .unwrap();
        assert_eq!(read(&intx), 1, "pending INTx delivered at unmask");
        // Interrupt Disable set: held, asserted once it clears.
        irqs.set(
            irq::INTX,
            IRQ_SET_ACTION_UNMASK | IRQ_SET_DATA_NONE,
            0,
            1,
            vec![],
        )
        .unwrap();
        irqs.set_intx_disabled(true);
        irqs.raise(0);
        assert_eq!(read(&intx), 0, "INTx disabled");
        irqs.set_intx_disabled(false);
        assert_eq!(read(&intx), 1, "asserted once enabled");
        irqs.set(
            irq::INTX,
            IRQ_SET_ACTION_UNMASK | IRQ_SET_DATA_NONE,
            0,
            1,
            vec![],
        )
        .unwrap();
        let (v0, v3) = (efd(1), efd(2));
        let fds = vec![
            v0.try_clone().unwrap(),
            efd(3),
            efd(4),
            v3.try_clone().unwrap(),
        ];
        irqs.set(
            irq::MSIX,
            IRQ_SET_ACTION_TRIGGER | IRQ_SET_DATA_EVENTFD,
            0,
            4,
            fds,
        )
        .unwrap();
        irqs.raise(3);
        irqs.raise(3);
        irqs.raise(9);
        assert_eq!(read(&v3), 2);
        assert_eq!(read(&v0), 0);
        assert_eq!(read(&intx), 0, "MSI-X enabled: no INTx");
        assert_eq!(irqs.lost, 1, "vector 9 has no eventfd");
        assert!(
            irqs.set(
                irq::MSIX,
                IRQ_SET_ACTION_TRIGGER | IRQ_SET_DATA_EVENTFD,
                120,
                9,
                vec![]
            )
            .is_err()
        );
        assert!(
            irqs.set(
                irq::MSI,
                IRQ_SET_ACTION_TRIGGER | IRQ_SET_DATA_EVENTFD,
                0,
                1,
                vec![]
            )
            .is_err()
        );
    }
}
