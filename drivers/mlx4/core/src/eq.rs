//! Event queues, polled (Linux `eq.c`: `mlx4_create_eq`, `mlx4_free_eq`, `mlx4_init_eq_table`, `mlx4_cleanup_eq_table`, `mlx4_eq_int`, `eq_set_ci`, MAP_EQ); IRQs, MSI-X, the clear-interrupt register and SR-IOV slave events are left out.
//!
//! One completion EQ (Linux's INTx configuration: `num_comp_vectors = 1`)
//! and one async EQ are created. Nothing raises an interrupt: the kernel's
//! progress loop calls [`Dev::poll_eq`], which consumes EQEs exactly as
//! `mlx4_eq_int` does (owner-bit parity, read barrier, consumer index
//! written back at least every `MLX4_NUM_SPARE_EQE` entries and re-armed at
//! the end) and dispatches them to the registered interfaces.

use alloc::vec::Vec;

use hal::DmaBuf;
use hal::barrier::{dma_rmb, mb};
use log::warn;
use mlx4_hw::cmd::{Opcode, timeout};
use mlx4_hw::doorbell::{eq_doorbell, eq_set_ci_value};
use mlx4_hw::eq::{self as hw, EQ_ENTRY_SIZE, EqContext, eqe, event};
use mlx4_hw::fw::dev_cap_flags;

use crate::bitmap::Bitmap;
use crate::cmd::Mailbox;
use crate::intf::Event;
use crate::main::Dev;
use crate::mr::Mtt;
use crate::{Error, Result};

/// One EQ (Linux `struct mlx4_eq`).
pub struct Eq {
    /// EQ number.
    pub eqn: u32,
    nent: u32,
    cons_index: u32,
    pages: Vec<DmaBuf>,
    mtt: Mtt,
    hw_owned: bool,
}

/// Linux `struct mlx4_eq_table`.
pub struct EqTable {
    bitmap: Bitmap,
    /// Completion EQs first, the async EQ last.
    pub(crate) eqs: Vec<Eq>,
    async_mapped: bool,
}

/// Linux `get_async_ev_mask`.
pub fn async_ev_mask(caps_flags: u64) -> u64 {
    let mut m = hw::ASYNC_EVENT_MASK;
    if caps_flags & dev_cap_flags::PORT_MNG_CHG_EV != 0 {
        m |= 1 << event::PORT_MNG_CHG_EVENT;
    }
    m
}

impl Eq {
    fn eqe(&self, i: u32) -> (&DmaBuf, usize) {
        let off = (i & (self.nent - 1)) as usize * EQ_ENTRY_SIZE;
        (&self.pages[off / 4096], off % 4096)
    }
}

#[cfg(test)]
impl Eq {
    pub(crate) fn entry_for_test(&self, i: u32) -> (&DmaBuf, usize) {
        self.eqe(i)
    }
}

impl Dev {
    fn eq_set_ci(&self, eq: &Eq, req_not: bool) {
        let (page, off) = eq_doorbell(eq.eqn);
        if let Some(b) = self.uar_bar.as_ref() {
            b.write_be32(
                page as usize * 4096 + off,
                eq_set_ci_value(eq.cons_index, req_not),
            );
        }
        // Linux: "We still want ordering, just not swabbing, so add a barrier".
        mb();
    }

    /// Linux `mlx4_create_eq`: pages, EQN, MTT, context, SW2HW_EQ.
    fn create_eq(&mut self, bitmap: &mut Bitmap, nent: u32, intr: u8) -> Result<Eq> {
        let nent = nent
            .max(2)
            .checked_next_power_of_two()
            .ok_or(Error::InvalidArg)?;
        let npages = (nent as usize * EQ_ENTRY_SIZE).div_ceil(4096);
        let mut pages = Vec::with_capacity(npages);
        for _ in 0..npages {
            let p = self.pool.alloc_pages(1)?;
            // Start every EQE hardware-owned (owner bit set), as iPXE does;
            // Linux zero-fills and relies on the firmware to do it at
            // SW2HW_EQ. Both are correct; this one does not depend on it.
            for i in 0..4096 / EQ_ENTRY_SIZE {
                p.write_u8(i * EQ_ENTRY_SIZE + eqe::OWNER, eqe::OWNER_BIT);
            }
            pages.push(p);
        }
        let eqn = bitmap.alloc()?;
        let mtt = match self.mtt_init(npages as u32, 12) {
            Ok(m) => m,
            Err(e) => {
                bitmap.free(eqn);
                return Err(e);
            }
        };
        let addrs: Vec<u64> = pages.iter().map(|p| p.bus_addr().0).collect();
        let r = self.write_mtt(&mtt, 0, &addrs).and_then(|()| {
            let mtt_addr = self.mtt_addr(&mtt);
            let ctx = EqContext {
                flags: hw::flags::STATUS_OK | hw::flags::STATE_ARMED,
                log_eq_size: nent.ilog2() as u8,
                intr,
                log_page_size: 0,
                mtt_base_addr_h: (mtt_addr >> 32) as u8,
                mtt_base_addr_l: mtt_addr as u32,
                ..Default::default()
            };
            let mb = Mailbox::new(&self.pool)?;
            mb.write(0, &ctx.to_bytes());
            self.cmd
                .cmd(mb.dma(), eqn, 0, Opcode::SW2HW_EQ, timeout::CLASS_A)
                .inspect_err(|e| {
                    warn!("mlx4_core {}: SW2HW_EQ failed ({})", self.pci, e.to_errno())
                })
        });
        if let Err(e) = r {
            self.mtt_cleanup(&mtt);
            bitmap.free(eqn);
            return Err(e);
        }
        Ok(Eq {
            eqn,
            nent,
            cons_index: 0,
            pages,
            mtt,
            hw_owned: true,
        })
    }

    /// Linux `mlx4_free_eq`: HW2SW_EQ (output mailbox), MTT, pages, EQN.
    fn free_eq(&mut self, bitmap: &mut Bitmap, eq: Eq) {
        if eq.hw_owned {
            let r = Mailbox::new(&self.pool).and_then(|mb| {
                self.cmd
                    .cmd_box(0, mb.dma(), eq.eqn, 0, Opcode::HW2SW_EQ, timeout::CLASS_A)
            });
            if let Err(e) = r {
                warn!("mlx4_core {}: HW2SW_EQ failed ({})", self.pci, e.to_errno());
            }
        }
        self.mtt_cleanup(&eq.mtt);
        bitmap.free(eq.eqn);
        drop(eq.pages);
    }

    /// Linux `mlx4_init_eq_table` without IRQs: one completion EQ sized for
    /// every CQ, one async EQ, MAP_EQ of the async events, both armed.
    pub(crate) fn init_eq_table(&mut self) -> Result<()> {
        let n = self.caps.num_eqs;
        let mut bitmap = Bitmap::new(n, n - 1, self.caps.reserved_eqs, 0)?;
        let mut eqs = Vec::new();
        let comp_nent =
            self.caps.num_cqs.saturating_sub(self.caps.reserved_cqs) + hw::NUM_SPARE_EQE;
        let r = (|| -> Result<()> {
            for _ in 0..self.caps.num_comp_vectors {
                eqs.push(self.create_eq(&mut bitmap, comp_nent, 0)?);
            }
            eqs.push(self.create_eq(&mut bitmap, hw::NUM_ASYNC_EQE + hw::NUM_SPARE_EQE, 0)?);
            Ok(())
        })();
        let mut table = EqTable {
            bitmap,
            eqs,
            async_mapped: false,
        };
        if let Err(e) = r {
            self.free_eq_table(&mut table);
            return Err(e);
        }
        let async_eqn = table.eqs.last().map_or(0, |e| e.eqn);
        let mask = async_ev_mask(self.caps.flags);
        match self.cmd.cmd(
            mask,
            hw::map_eq_in_mod(async_eqn, false),
            0,
            Opcode::MAP_EQ,
            timeout::CLASS_B,
        ) {
            Ok(()) => table.async_mapped = true,
            Err(e @ (Error::CmdTimeout { .. } | Error::CmdBusy { .. })) => {
                self.free_eq_table(&mut table);
                return Err(e);
            }
            Err(e) => warn!(
                "mlx4_core {}: MAP_EQ for async EQ {async_eqn} failed ({})",
                self.pci,
                e.to_errno()
            ),
        }
        for eq in &table.eqs {
            self.eq_set_ci(eq, true);
        }
        self.eq_table = Some(table);
        Ok(())
    }

    fn free_eq_table(&mut self, table: &mut EqTable) {
        let eqs = core::mem::take(&mut table.eqs);
        for eq in eqs {
            self.free_eq(&mut table.bitmap, eq);
        }
    }

    /// Linux `mlx4_cleanup_eq_table`: unmap the async events, free every EQ.
    pub(crate) fn cleanup_eq_table(&mut self) {
        let Some(mut table) = self.eq_table.take() else {
            return;
        };
        if table.async_mapped {
            let async_eqn = table.eqs.last().map_or(0, |e| e.eqn);
            let mask = async_ev_mask(self.caps.flags);
            if let Err(e) = self.cmd.cmd(
                mask,
                hw::map_eq_in_mod(async_eqn, true),
                0,
                Opcode::MAP_EQ,
                timeout::CLASS_B,
            ) {
                warn!(
                    "mlx4_core {}: MAP_EQ unmap failed ({})",
                    self.pci,
                    e.to_errno()
                );
            }
        }
        self.free_eq_table(&mut table);
    }

    /// The EQ number completion vector `vector` uses (CQ contexts name it).
    pub fn comp_eqn(&self, vector: u32) -> Option<u32> {
        let t = self.eq_table.as_ref()?;
        if vector >= self.caps.num_comp_vectors {
            return None;
        }
        t.eqs.get(vector as usize).map(|e| e.eqn)
    }

    /// The async EQ's number.
    pub fn async_eqn(&self) -> Option<u32> {
        self.eq_table.as_ref()?.eqs.last().map(|e| e.eqn)
    }

    /// Linux `mlx4_eq_int` for every EQ: consumes the software-owned EQEs,
    /// dispatches their events, writes the consumer index back. Returns the
    /// number of EQEs consumed.
    #[doc(alias = "mlx4_eq_int")]
    pub fn poll_eq(&mut self) -> usize {
        let Some(mut table) = self.eq_table.take() else {
            return 0;
        };
        let mut total = 0;
        for eq in table.eqs.iter_mut() {
            let start = eq.cons_index;
            let mut set_ci = 0;
            loop {
                let (buf, off) = eq.eqe(eq.cons_index);
                let owner = buf.read_u8(off + eqe::OWNER) & eqe::OWNER_BIT != 0;
                let parity = eq.cons_index & eq.nent != 0;
                if owner != parity {
                    break;
                }
                // Read the EQE body only after the owner bit.
                dma_rmb();
                let mut raw = [0u8; EQ_ENTRY_SIZE];
                buf.read_bytes(off, &mut raw);
                let ev = self.decode_eqe(eq.eqn, eq.cons_index, &raw);
                if let Some(ev) = ev {
                    self.intf.dispatch(&self.caps, ev);
                }
                eq.cons_index = eq.cons_index.wrapping_add(1);
                total += 1;
                set_ci += 1;
                // The HCA thinks the EQ overflowed unless told at least every
                // MLX4_NUM_SPARE_EQE entries.
                if set_ci >= hw::NUM_SPARE_EQE {
                    self.eq_set_ci(eq, false);
                    set_ci = 0;
                }
            }
            // Linux re-arms at the end of every interrupt; polled, that is
            // every pass that consumed something (an idle poll costs no MMIO).
            if eq.cons_index != start {
                self.eq_set_ci(eq, true);
            }
        }
        self.eq_table = Some(table);
        total
    }

    fn decode_eqe(&mut self, eqn: u32, ci: u32, e: &[u8; EQ_ENTRY_SIZE]) -> Option<Event> {
        use mlx4_hw::wire::{get_be32, get_u8};
        let ty = get_u8(e, eqe::TYPE);
        let sub = get_u8(e, eqe::SUBTYPE);
        let num = get_be32(e, eqe::EVENT) & 0xff_ffff;
        match ty {
            event::COMP => {
                self.cq_completion(num);
                Some(Event::CqCompletion { cqn: num })
            }
            event::PATH_MIG
            | event::COMM_EST
            | event::SQ_DRAINED
            | event::SRQ_QP_LAST_WQE
            | event::PATH_MIG_FAILED
            | event::WQ_INVAL_REQ_ERROR
            | event::WQ_ACCESS_ERROR
            | event::WQ_CATAS_ERROR => Some(Event::Qp {
                qpn: num,
                event_type: ty,
            }),
            event::SRQ_LIMIT | event::SRQ_CATAS_ERROR => Some(Event::Srq {
                srqn: num,
                event_type: ty,
            }),
            event::PORT_CHANGE => {
                let port = (get_be32(e, eqe::PORT_CHANGE_PORT) >> 28) as u8;
                if port == 0 || port > self.caps.num_ports {
                    warn!(
                        "mlx4_core {}: PORT_CHANGE for non-existent port {port}",
                        self.pci
                    );
                    return None;
                }
                if sub == event::PORT_CHANGE_SUBTYPE_DOWN {
                    log::debug!("mlx4_core {}: port {port} down", self.pci);
                    Some(Event::PortDown { port })
                } else {
                    log::debug!("mlx4_core {}: port {port} up", self.pci);
                    Some(Event::PortUp { port })
                }
            }
            event::CQ_ERROR => {
                let syndrome = get_u8(e, eqe::CQ_ERR_SYNDROME);
                warn!(
                    "mlx4_core {}: CQ {} on CQN {num:06x}",
                    self.pci,
                    if syndrome == 1 {
                        "overrun"
                    } else {
                        "access violation"
                    }
                );
                Some(Event::CqError { cqn: num, syndrome })
            }
            event::PORT_MNG_CHG_EVENT => Some(Event::PortMgmtChange {
                port: get_u8(e, eqe::PORT_MNG_PORT),
                subtype: sub,
                raw: *e,
            }),
            event::LOCAL_CATAS_ERROR => {
                // Reported through the error buffer as well; whichever the
                // poll sees first raises the (single) catastrophic event.
                log::error!(
                    "mlx4_core {}: local catastrophic error event on EQ {eqn}",
                    self.pci
                );
                self.catas_detected();
                None
            }
            event::EQ_OVERFLOW => {
                warn!("mlx4_core {}: EQ overrun on EQN {eqn}", self.pci);
                None
            }
            event::FATAL_WARNING => {
                warn!(
                    "mlx4_core {}: fatal warning event (subtype {sub:#x})",
                    self.pci
                );
                None
            }
            _ => {
                warn!(
                    "mlx4_core {}: Unhandled event {ty:02x}({sub:02x}) on EQ {eqn} at index {ci}. owner={:x}",
                    self.pci,
                    e[eqe::OWNER]
                );
                None
            }
        }
    }
}
