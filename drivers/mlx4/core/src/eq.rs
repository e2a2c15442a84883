//! Event queues, polled, as Linux's `eq.c` creates, drains and re-arms them.
//!
//! Linux: `eq.c` (`mlx4_create_eq`, `mlx4_free_eq`, `mlx4_init_eq_table`,
//! `mlx4_cleanup_eq_table`, `mlx4_eq_int`, `eq_set_ci`, MAP_EQ). IRQs,
//! MSI-X, the clear-interrupt register and SR-IOV slave events are left out.
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
use mlx4_hw::cmd::{Opcode, timeout};
use mlx4_hw::doorbell::{eq_doorbell, eq_set_ci_value};
use mlx4_hw::eq::{self as hw, EQ_ENTRY_SIZE, EqContext, eqe, event};
use mlx4_hw::fw::dev_cap_flags;

use crate::bitmap::Bitmap;
use crate::cmd::Mailbox;
use crate::dev::{Dev, Hca, MrTable};
use crate::intf::Event;
use crate::{Error, Result, mlx4_dbg, mlx4_err, mlx4_warn};

pub use crate::dev::Eq;
pub(crate) use crate::dev::EqTable;

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

impl Eq {
    /// Linux `eq_set_ci`: the consumer index to the EQ's doorbell, asking
    /// for the next event if `req_not`.
    fn set_ci(&self, hca: &Hca, req_not: bool) {
        let (page, off) = eq_doorbell(self.eqn);
        if let Some(b) = hca.uar_bar.as_ref() {
            b.write_be32(
                page as usize * 4096 + off,
                eq_set_ci_value(self.cons_index, req_not),
            );
        }
        // Linux: "We still want ordering, just not swabbing, so add a barrier".
        mb();
    }
}

impl EqTable {
    /// Linux `mlx4_init_eq_table` without IRQs: one completion EQ sized for
    /// every CQ, one async EQ, MAP_EQ of the async events, both armed.
    pub(crate) fn init(hca: &mut Hca, mr: &mut MrTable) -> Result<EqTable> {
        let c = &hca.caps;
        let n = c.num_eqs;
        let mut table = EqTable {
            bitmap: Bitmap::new(n, n - 1, c.reserved_eqs, 0)?,
            eqs: Vec::new(),
            async_mapped: false,
        };
        let comp_nent = c.num_cqs.saturating_sub(c.reserved_cqs) + hw::NUM_SPARE_EQE;
        let r = (|| -> Result<()> {
            for _ in 0..hca.caps.num_comp_vectors {
                let eq = table.create_eq(hca, mr, comp_nent, 0)?;
                table.eqs.push(eq);
            }
            let eq = table.create_eq(hca, mr, hw::NUM_ASYNC_EQE + hw::NUM_SPARE_EQE, 0)?;
            table.eqs.push(eq);
            Ok(())
        })();
        if let Err(e) = r {
            table.free_eqs(hca, mr);
            return Err(e);
        }
        let async_eqn = table.eqs.last().map_or(0, |e| e.eqn);
        let mask = async_ev_mask(hca.caps.flags);
        match hca.cmd.cmd(
            mask,
            hw::map_eq_in_mod(async_eqn, false),
            0,
            Opcode::MAP_EQ,
            timeout::CLASS_B,
        ) {
            Ok(()) => table.async_mapped = true,
            Err(e @ (Error::CmdTimeout { .. } | Error::CmdBusy { .. })) => {
                table.free_eqs(hca, mr);
                return Err(e);
            }
            Err(e) => mlx4_warn!(
                hca.pci,
                "MAP_EQ for async EQ {async_eqn} failed ({})",
                e.to_errno()
            ),
        }
        for eq in &table.eqs {
            eq.set_ci(hca, true);
        }
        Ok(table)
    }

    /// Linux `mlx4_cleanup_eq_table`: unmap the async events, free every EQ.
    pub(crate) fn cleanup(&mut self, hca: &mut Hca, mr: &mut MrTable) {
        if core::mem::take(&mut self.async_mapped) {
            let async_eqn = self.eqs.last().map_or(0, |e| e.eqn);
            let mask = async_ev_mask(hca.caps.flags);
            if let Err(e) = hca.cmd.cmd(
                mask,
                hw::map_eq_in_mod(async_eqn, true),
                0,
                Opcode::MAP_EQ,
                timeout::CLASS_B,
            ) {
                mlx4_warn!(hca.pci, "MAP_EQ unmap failed ({})", e.to_errno());
            }
        }
        self.free_eqs(hca, mr);
    }

    fn free_eqs(&mut self, hca: &mut Hca, mr: &mut MrTable) {
        for eq in core::mem::take(&mut self.eqs) {
            self.free_eq(hca, mr, eq);
        }
    }

    /// Linux `mlx4_create_eq`: pages, EQN, MTT, context, SW2HW_EQ.
    fn create_eq(&mut self, hca: &mut Hca, mr: &mut MrTable, nent: u32, intr: u8) -> Result<Eq> {
        let nent = nent
            .max(2)
            .checked_next_power_of_two()
            .ok_or(Error::InvalidArg)?;
        let npages = (nent as usize * EQ_ENTRY_SIZE).div_ceil(4096);
        let mut pages = Vec::with_capacity(npages);
        for _ in 0..npages {
            let p = hca.pool.alloc_pages(1)?;
            // Start every EQE hardware-owned (owner bit set), as iPXE does;
            // Linux zero-fills and relies on the firmware to do it at
            // SW2HW_EQ. Both are correct; this one does not depend on it.
            for i in 0..4096 / EQ_ENTRY_SIZE {
                p.write_u8(i * EQ_ENTRY_SIZE + eqe::OWNER, eqe::OWNER_BIT);
            }
            pages.push(p);
        }
        let eqn = self.bitmap.alloc()?;
        let mtt = match mr.mtt_init(hca, npages as u32, 12) {
            Ok(m) => m,
            Err(e) => {
                self.bitmap.free(eqn);
                return Err(e);
            }
        };
        let addrs: Vec<u64> = pages.iter().map(|p| p.bus_addr().0).collect();
        let r = hca.write_mtt(&mtt, 0, &addrs).and_then(|()| {
            let mtt_addr = hca.mtt_addr(&mtt);
            let ctx = EqContext {
                flags: hw::flags::STATUS_OK | hw::flags::STATE_ARMED,
                log_eq_size: nent.ilog2() as u8,
                intr,
                log_page_size: 0,
                mtt_base_addr_h: (mtt_addr >> 32) as u8,
                mtt_base_addr_l: mtt_addr as u32,
                ..Default::default()
            };
            let mb = Mailbox::new(&hca.pool)?;
            mb.write(0, &ctx.to_bytes());
            let pci = hca.pci;
            hca.cmd
                .cmd(mb.dma(), eqn, 0, Opcode::SW2HW_EQ, timeout::CLASS_A)
                .inspect_err(|e| mlx4_warn!(pci, "SW2HW_EQ failed ({})", e.to_errno()))
        });
        if let Err(e) = r {
            mr.mtt_cleanup(hca, &mtt);
            self.bitmap.free(eqn);
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
    fn free_eq(&mut self, hca: &mut Hca, mr: &mut MrTable, eq: Eq) {
        if eq.hw_owned {
            let r = Mailbox::new(&hca.pool).and_then(|mb| {
                hca.cmd
                    .cmd_box(0, mb.dma(), eq.eqn, 0, Opcode::HW2SW_EQ, timeout::CLASS_A)
            });
            if let Err(e) = r {
                mlx4_warn!(hca.pci, "HW2SW_EQ failed ({})", e.to_errno());
            }
        }
        mr.mtt_cleanup(hca, &eq.mtt);
        self.bitmap.free(eq.eqn);
        drop(eq.pages);
    }
}

impl Dev {
    /// The EQ number completion vector `vector` uses (CQ contexts name it).
    pub fn comp_eqn(&self, vector: u32) -> Option<u32> {
        if vector >= self.hca.caps.num_comp_vectors {
            return None;
        }
        self.tables.eq.eqs.get(vector as usize).map(|e| e.eqn)
    }

    /// The async EQ's number.
    pub fn async_eqn(&self) -> Option<u32> {
        self.tables.eq.eqs.last().map(|e| e.eqn)
    }

    /// Linux `mlx4_eq_int` for every EQ: consumes the software-owned EQEs,
    /// dispatches their events, writes the consumer index back. Returns the
    /// number of EQEs consumed.
    #[doc(alias = "mlx4_eq_int")]
    pub fn poll_eq(&mut self) -> usize {
        // The EQs are set aside while their events go to the other tables
        // and the interfaces.
        let mut eqs = core::mem::take(&mut self.tables.eq.eqs);
        let mut total = 0;
        for eq in eqs.iter_mut() {
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
                    self.intf.dispatch(&self.hca.caps, ev);
                }
                eq.cons_index = eq.cons_index.wrapping_add(1);
                total += 1;
                set_ci += 1;
                // The HCA thinks the EQ overflowed unless told at least every
                // MLX4_NUM_SPARE_EQE entries.
                if set_ci >= hw::NUM_SPARE_EQE {
                    eq.set_ci(&self.hca, false);
                    set_ci = 0;
                }
            }
            // Linux re-arms at the end of every interrupt; polled, that is
            // every pass that consumed something (an idle poll costs no MMIO).
            if eq.cons_index != start {
                eq.set_ci(&self.hca, true);
            }
        }
        self.tables.eq.eqs = eqs;
        total
    }

    fn decode_eqe(&mut self, eqn: u32, ci: u32, e: &[u8; EQ_ENTRY_SIZE]) -> Option<Event> {
        use hal::be::{get_be32, get_u8};
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
                if port == 0 || port > self.hca.caps.num_ports {
                    mlx4_warn!(self.hca.pci, "PORT_CHANGE for non-existent port {port}");
                    return None;
                }
                if sub == event::PORT_CHANGE_SUBTYPE_DOWN {
                    mlx4_dbg!(self.hca.pci, "port {port} down");
                    Some(Event::PortDown { port })
                } else {
                    mlx4_dbg!(self.hca.pci, "port {port} up");
                    Some(Event::PortUp { port })
                }
            }
            event::CQ_ERROR => {
                let syndrome = get_u8(e, eqe::CQ_ERR_SYNDROME);
                mlx4_warn!(
                    self.hca.pci,
                    "CQ {} on CQN {num:06x}",
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
                mlx4_err!(self.hca.pci, "local catastrophic error event on EQ {eqn}");
                self.catas_detected();
                None
            }
            event::EQ_OVERFLOW => {
                mlx4_warn!(self.hca.pci, "EQ overrun on EQN {eqn}");
                None
            }
            event::FATAL_WARNING => {
                mlx4_warn!(self.hca.pci, "fatal warning event (subtype {sub:#x})");
                None
            }
            _ => {
                mlx4_warn!(
                    self.hca.pci,
                    "Unhandled event {ty:02x}({sub:02x}) on EQ {eqn} at index {ci}. owner={:x}",
                    e[eqe::OWNER]
                );
                None
            }
        }
    }
}
