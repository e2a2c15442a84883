//! Event queues.
//!
//! The state of each EQ in hardware ownership, EQE writing with the ownership bit,
//! the EQ doorbell (consumer index and re-arm), overrun detection and async-event
//! routing through MAP_EQ; interrupts are not generated (arming is recorded,
//! nothing else), and event moderation is ignored.
//!
//! Ownership: the EQE at producer index `p` is written with owner =
//! `(p & nent) != 0`, so software owns it while its owner bit equals the
//! parity of its consumer index. At SW2HW_EQ every entry is marked
//! hardware-owned (owner bit set), which is what lets Linux zero-fill its EQ
//! buffers (porting map 12.4). The EQ context in ICM is kept current: each
//! EQE updates its producer index, each doorbell its consumer index.

use crate::hca::ctx::{ENTRY_32, Event, eqc, eqe};
use crate::hca::device::Hca;
use crate::hca::faults::EqeCorruption;
use crate::hca::hcr::Status;
use crate::hca::icm::Table;
use crate::hca::layout::put32;

/// An EQ in hardware ownership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EqState {
    /// Entries (power of two).
    pub nent: u32,
    /// Bus address of each page of the EQ buffer.
    pub pages: Vec<u64>,
    /// Page size in bytes.
    pub page_size: u64,
    /// Offset of entry 0 in the first page.
    pub page_offset: u64,
    /// Producer index (free running, 24 bits in the context).
    pub prod: u32,
    /// Consumer index from the last doorbell.
    pub cons: u32,
    /// Armed: the next EQE would raise an interrupt (recorded only).
    pub armed: bool,
    /// Interrupts that would have been raised.
    pub interrupts: u32,
    /// Doorbells rung.
    pub doorbells: u32,
    /// The EQ overran (events were lost).
    pub overrun: bool,
    /// MSI-X vector.
    pub intr: u16,
    /// Overrun ignore (EQC bit 17, set by iPXE): the EQ-full check is off
    /// and unconsumed entries are overwritten.
    pub oi: bool,
}

impl EqState {
    /// Bus address of entry `i`.
    pub fn entry_addr(&self, i: u32) -> u64 {
        let off = self.page_offset + u64::from(i & (self.nent - 1)) * ENTRY_32 as u64;
        let page = (off / self.page_size) as usize;
        self.pages.get(page).copied().unwrap_or(0) + off % self.page_size
    }
    /// Entries written and not yet consumed.
    pub fn used(&self) -> u32 {
        self.prod.wrapping_sub(self.cons) & 0xff_ffff
    }
}

/// Event type numbers as a readable list (`0x09 PORT_CHANGE, ...`).
pub fn event_list(types: &[u8]) -> String {
    types
        .iter()
        .map(|t| format!("{t:#04x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

impl Hca {
    /// Async event types mapped (MAP_EQ) to `eqn`, or to any EQ for `None`.
    pub fn mapped_async_events(&self, eqn: Option<u32>) -> Vec<u8> {
        (0u8..64)
            .filter(|&t| self.async_map[usize::from(t)].is_some_and(|m| eqn.is_none_or(|e| e == m)))
            .collect()
    }

    /// Writes every EQE owner bit of a new EQ to "hardware owned".
    pub fn eq_init_owner_bits(&mut self, eq: &EqState) -> Result<(), Status> {
        for i in 0..eq.nent {
            self.dma_write(eq.entry_addr(i) + eqe::OWNER as u64, &[eqe::OWNER_BIT])?;
        }
        Ok(())
    }

    /// Posts `ev` to the EQ mapped for its type (MAP_EQ); dropped if none.
    pub fn post_async(&mut self, ev: Event) {
        if let Some(eqn) = self.async_map[usize::from(ev.kind() & 0x3f)] {
            self.post_event(eqn, ev);
        }
    }

    /// Writes `ev` as the next EQE of `eqn`. In the polled front ends the
    /// EQ's doorbell word is consumed first, so that the room check sees
    /// every consumer index the driver wrote before the event (as the card
    /// would, its doorbells having landed), not only those the model thread
    /// happened to poll already.
    pub fn post_event(&mut self, eqn: u32, ev: Event) {
        if (self.threaded || self.bar2_polled) && self.eqs.contains_key(&eqn) {
            let raw = self.bar2.swap_raw(crate::hca::regs::eq_doorbell(eqn), 0);
            if raw != 0 {
                self.eq_doorbell(eqn, u32::from_be(raw));
            }
        }
        let Some(eq) = self.eqs.get(&eqn).cloned() else {
            return;
        };
        if eq.used() >= eq.nent && !eq.oi {
            if !eq.overrun {
                self.violation(format!(
                    "EQ {eqn} overrun: {} EQEs outstanding (consumer index {} not updated)",
                    eq.used(),
                    eq.cons
                ));
                if let Some(e) = self.eqs.get_mut(&eqn) {
                    e.overrun = true;
                }
                self.eq_ctx_status(eqn, 0x9);
                if !matches!(ev, Event::EqOverflow { .. }) {
                    let target = self.async_map[usize::from(eqe::EQ_OVERFLOW)];
                    if target.is_some_and(|t| t != eqn) {
                        self.post_async(Event::EqOverflow { eqn });
                    }
                }
            }
            return;
        }
        let owner = eq.prod & eq.nent != 0;
        let mut bytes = ev.encode(owner);
        if !self.faults.corrupt_eqes.is_empty() {
            match self.faults.corrupt_eqes.remove(0) {
                EqeCorruption::WrongOwner => bytes[eqe::OWNER] ^= eqe::OWNER_BIT,
                EqeCorruption::BadType => bytes[eqe::TYPE] = 0x3f,
                EqeCorruption::GarbageData => bytes[4..0x1c].fill(0xff),
            }
        }
        let addr = eq.entry_addr(eq.prod);
        // Body first, owner byte last, as the HCA does.
        if self.dma_write(addr, &bytes[..eqe::OWNER]).is_err()
            || self
                .dma_write(addr + eqe::OWNER as u64, &bytes[eqe::OWNER..])
                .is_err()
        {
            self.violation(format!("EQ {eqn}: EQE write to {addr:#x} failed"));
            return;
        }
        let prod = eq.prod.wrapping_add(1) & 0xff_ffff;
        if let Some(e) = self.eqs.get_mut(&eqn) {
            e.prod = prod;
            if e.armed {
                e.armed = false;
                e.interrupts += 1;
            }
        }
        if let Ok(g) = self.geo() {
            let mut b = [0u8; 4];
            put32(&mut b, 0, prod);
            let _ = self.icm_write(
                g.va(Table::Eqc, u64::from(eqn)) + eqc::PROD_INDEX as u64,
                &b,
            );
        }
    }

    fn eq_ctx_status(&mut self, eqn: u32, status: u8) {
        let Ok(g) = self.geo() else { return };
        let va = g.va(Table::Eqc, u64::from(eqn));
        let mut b = [0u8; 4];
        if self.icm_read(va, &mut b).is_ok() {
            b[0] = (b[0] & 0x0f) | status << 4;
            let _ = self.icm_write(va, &b);
        }
    }

    /// An EQ doorbell: consumer index (24 bits) and request-notification bit.
    pub fn eq_doorbell(&mut self, eqn: u32, v: u32) {
        let Some(eq) = self.eqs.get(&eqn).cloned() else {
            self.violation(format!(
                "EQ doorbell {v:#010x} for EQ {eqn}, which is not in hardware ownership"
            ));
            return;
        };
        let ci = v & 0xff_ffff;
        let advance = ci.wrapping_sub(eq.cons) & 0xff_ffff;
        if advance > eq.used() {
            self.violation(format!(
                "EQ {eqn} doorbell: consumer index {ci} beyond producer index {}",
                eq.prod
            ));
            return;
        }
        if let Some(e) = self.eqs.get_mut(&eqn) {
            e.cons = ci;
            e.doorbells += 1;
            if v >> 31 != 0 {
                // Armed behind the producer (an EQE written after the
                // driver's last look and before this doorbell): the event
                // fires at once, as for a CQ armed behind its producer.
                // That is why the arm carries the consumer index: Linux's
                // mlx4_eq_int polls the EQ empty, then arms it, and never
                // looks again.
                if e.prod != ci {
                    e.interrupts += 1;
                } else {
                    e.armed = true;
                }
            }
        }
        if let Ok(g) = self.geo() {
            let mut b = [0u8; 4];
            put32(&mut b, 0, ci);
            let _ = self.icm_write(
                g.va(Table::Eqc, u64::from(eqn)) + eqc::CONS_INDEX as u64,
                &b,
            );
        }
    }
}
