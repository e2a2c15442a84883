//! The device core: the model's state, its registers, the HCR engine and DMA.
//!
//! The device core: all model state behind one lock, the register handlers
//! both front ends call, the HCR protocol engine, and the DMA and ICM access
//! paths every firmware command uses; the command handlers themselves live in
//! [`crate::hca::fw`].

use std::collections::BTreeMap;
use std::sync::Arc;

use hal::Clock;

use crate::hca::config::HcaConfig;
use crate::hca::eq::EqState;
use crate::hca::faults::FaultPlan;
use crate::hca::fw::{self, Outcome};
use crate::hca::hcr::{Command, Opcode, Status, bits};
use crate::hca::icm::{Geometry, Icm, Table};
use crate::hca::layout::{DevCap, FwInfo, InitHca};
use crate::hca::mem::{DmaFault, DmaFaultKind, HostMemory};
use crate::hca::pci::PciConfig;
use crate::hca::port::Port;
use crate::hca::regs::{self, RegFile};
use crate::hca::trace::TraceEntry;

/// Cap on recorded violations and faults (a runaway driver must not eat the
/// host's memory).
const MAX_LOG: usize = 10_000;

/// Alignment of command mailboxes.
pub const MAILBOX_ALIGN: u64 = 4096;

/// Firmware life cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FwState {
    /// After power-on or reset: only QUERY_FW and MAP_FA.
    Off,
    /// RUN_FW done.
    Running,
    /// INIT_HCA done.
    Initialized,
}

/// A command between GO and completion.
#[derive(Debug, Clone)]
pub struct Busy {
    /// Dword 6 as posted.
    pub posted: u32,
    /// Status to report.
    pub status: u8,
    /// Immediate output, if the command has one.
    pub imm_out: Option<u64>,
    /// Status reads still showing GO (sync mode).
    pub polls_left: u32,
    /// Model-clock time before which GO stays set.
    pub due_ns: u64,
    /// GO never clears.
    pub stuck: bool,
    /// Index of the trace entry.
    pub trace_idx: usize,
    /// When GO was seen.
    pub start_ns: u64,
    /// Event-mode completion requested.
    pub event: bool,
    /// Token.
    pub token: u16,
    /// Dwords 0..5 as the model read them at GO (raw), to see them change
    /// while the command is in flight (polled front ends).
    pub params: [u32; 6],
}

/// HCR protocol state.
#[derive(Debug, Default, Clone)]
pub struct HcrState {
    /// Dwords 0..5 written since the last post (bit n = dword n).
    pub written: u8,
    /// In-flight command.
    pub busy: Option<Busy>,
    /// T of the last post (false after reset).
    pub last_t: bool,
    /// Dword 6 as the device last left it (raw; 0 after reset): what a
    /// dropped GO write leaves visible.
    pub idle_dw6: u32,
    /// Polled front ends: GO was seen with memory decoding off on the last
    /// pass.
    pub go_decode_off: bool,
}

/// Runtime state of a CQ in hardware ownership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqState {
    /// Entries.
    pub nent: u32,
    /// Completion EQ.
    pub eqn: u32,
    /// UAR index.
    pub uar: u32,
    /// Arm requests seen (doorbells; engines come later).
    pub arms: u32,
}

/// Runtime state of an MPT in hardware ownership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MptState {
    /// PD.
    pub pd: u32,
    /// Physical (no translation).
    pub physical: bool,
    /// Fast-register MR in the free state.
    pub free: bool,
}

/// Runtime state of an SRQ in hardware ownership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqState {
    /// PD.
    pub pd: u32,
    /// log2 WQEs.
    pub log_size: u8,
    /// Limit watermark (ARM_SRQ).
    pub limit: u16,
}

/// QP states (QPC flags 31:28).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum QpState {
    /// Reset.
    Rst = 0,
    /// Initialized.
    Init = 1,
    /// Ready to receive.
    Rtr = 2,
    /// Ready to send.
    Rts = 3,
    /// Send queue error.
    Sqer = 4,
    /// Send queue drained.
    Sqd = 5,
    /// Error.
    Err = 6,
}

/// Runtime state of a QP that has left RESET at least once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpRt {
    /// Current state.
    pub state: QpState,
    /// Service type.
    pub st: u8,
    /// Send CQ.
    pub scq: u32,
    /// Receive CQ.
    pub rcq: u32,
    /// SRQ, if any.
    pub srq: Option<u32>,
    /// PD.
    pub pd: u32,
    /// Port (after INIT2RTR for UD/MLX, from the path).
    pub port: u8,
    /// UAR index its send doorbells use.
    pub uar: u32,
}

/// Everything the model knows, behind one lock.
pub struct Hca {
    /// Configuration.
    pub cfg: HcaConfig,
    /// Config space.
    pub pci: Arc<PciConfig>,
    /// Host memory.
    pub mem: Arc<dyn HostMemory>,
    /// BAR0 registers.
    pub bar0: Arc<RegFile>,
    /// BAR2 registers.
    pub bar2: Arc<RegFile>,
    /// Model clock.
    pub clock: Arc<dyn Clock>,
    /// Threaded front end (registers are only polled, reads are invisible).
    pub threaded: bool,
    /// BAR2 alone is shared memory a front end polls ([`Hca::poll_doorbells`])
    /// while BAR0 stays trapped (cx3-vfu with the UAR pages mapped into the
    /// guest): EQ doorbells are taken from it before an EQE is written, as in
    /// the threaded front ends.
    pub bar2_polled: bool,
    /// HCR state.
    pub hcr: HcrState,
    /// Ownership semaphore claimed.
    pub owned: bool,
    /// Reset semaphore held.
    pub reset_sem: bool,
    /// Firmware state.
    pub fw: FwState,
    /// ICM bookkeeping.
    pub icm: Icm,
    /// MOD_STAT_CFG seen.
    pub stat_cfg: bool,
    /// Table geometry after INIT_HCA.
    pub geo: Option<Geometry>,
    /// The INIT_HCA mailbox as given (for QUERY_HCA).
    pub init_hca_raw: Vec<u8>,
    /// Ports 1 and 2 (index 0 and 1).
    pub ports: Vec<Port>,
    /// EQs in hardware ownership.
    pub eqs: BTreeMap<u32, EqState>,
    /// CQs in hardware ownership.
    pub cqs: BTreeMap<u32, CqState>,
    /// MPTs in hardware ownership.
    pub mpts: BTreeMap<u32, MptState>,
    /// SRQs in hardware ownership.
    pub srqs: BTreeMap<u32, SrqState>,
    /// QPs not in RESET (or that have been used).
    pub qps: BTreeMap<u32, QpRt>,
    /// Async event type -> EQ (MAP_EQ).
    pub async_map: [Option<u32>; 64],
    /// CONF_SPECIAL_QP base (0 = none).
    pub special_qp_base: u32,
    /// Command trace.
    pub trace: Vec<TraceEntry>,
    /// Protocol violations.
    pub violations: Vec<String>,
    /// DMA faults.
    pub dma_faults: Vec<DmaFault>,
    /// Armed faults.
    pub faults: FaultPlan,
    /// Catastrophic error raised.
    pub catastrophic: bool,
    /// Clear-interrupt writes seen.
    pub clr_int_writes: u64,
    /// Every UAR doorbell seen, as (BAR2 offset, value), up to a cap (the
    /// engines act on them as they come; this is the log).
    pub pending_doorbells: Vec<(usize, u32)>,
    /// The data-path engines' state.
    pub engine: crate::hca::engine::Engine,
    /// The fabric the ports are cabled to, if any.
    pub fabric: Option<crate::hca::engine::wire::FabricLink>,
    /// What the threaded polling round looks at (see [`PollList`]).
    pub poll_list: PollList,
}

/// The doorbells the threaded polling round reads: the EQ numbers and the
/// UAR pages of the CQs and QPs in hardware ownership. Only a command or a
/// reset adds or removes those objects or moves them to another UAR page,
/// so the list is built again after each ([`Hca::post`], [`Hca::reset`]),
/// and whenever the objects' count differs from the count it was built
/// for: an idle round reads the doorbells without walking the maps.
#[derive(Debug, Default)]
pub struct PollList {
    /// EQ numbers.
    pub eqs: Vec<u32>,
    /// UAR pages, sorted, each once.
    pub uars: Vec<u32>,
    /// EQs + CQs + QPs when built; `None`: to be built.
    pub built_for: Option<usize>,
}

fn be_dw(raw: u32) -> u32 {
    u32::from_be(raw)
}

impl Hca {
    /// A powered-on device with register files of its own.
    pub fn new(
        cfg: HcaConfig,
        mem: Arc<dyn HostMemory>,
        clock: Arc<dyn Clock>,
        threaded: bool,
    ) -> Hca {
        let bar0 = Arc::new(RegFile::new(crate::hca::pci::BAR0_SIZE as usize));
        let bar2 = Arc::new(RegFile::new(crate::hca::pci::BAR2_SIZE as usize));
        Self::with_regs(cfg, mem, clock, threaded, bar0, bar2)
    }

    /// A powered-on device over the given register files.
    pub fn with_regs(
        cfg: HcaConfig,
        mem: Arc<dyn HostMemory>,
        clock: Arc<dyn Clock>,
        threaded: bool,
        bar0: Arc<RegFile>,
        bar2: Arc<RegFile>,
    ) -> Hca {
        let mut cfg = cfg;
        if cfg.has_eth() {
            // What a VPI card reports (crate::hca::eth).
            use crate::hca::layout::cap_flags::{DPDP, IBOE, SENSE_SUPPORT};
            cfg.dev_cap.flags |= DPDP | SENSE_SUPPORT | IBOE;
        }
        let pci = Arc::new(PciConfig::new(clock.clone()));
        let ports = (1..=cfg.num_ports.clamp(1, 2))
            .map(|n| Port::new(n, &cfg))
            .collect();
        Hca {
            pci,
            mem,
            bar0,
            bar2,
            clock,
            threaded,
            bar2_polled: false,
            hcr: HcrState::default(),
            owned: false,
            reset_sem: false,
            fw: FwState::Off,
            icm: Icm::default(),
            stat_cfg: false,
            geo: None,
            init_hca_raw: Vec::new(),
            ports,
            eqs: BTreeMap::new(),
            cqs: BTreeMap::new(),
            mpts: BTreeMap::new(),
            srqs: BTreeMap::new(),
            qps: BTreeMap::new(),
            async_map: [None; 64],
            special_qp_base: 0,
            trace: Vec::new(),
            violations: Vec::new(),
            dma_faults: Vec::new(),
            faults: FaultPlan::default(),
            catastrophic: false,
            clr_int_writes: 0,
            pending_doorbells: Vec::new(),
            engine: crate::hca::engine::Engine::default(),
            fabric: None,
            poll_list: PollList::default(),
            cfg,
        }
    }

    /// A powered-on card alone, over a 1 MiB arena and a fake clock: the
    /// card's own unit tests (a front end builds the real ones).
    #[cfg(test)]
    pub(crate) fn for_tests(cfg: HcaConfig) -> Hca {
        let mem = Arc::new(hal::fake::ArenaDma::with_bus_base(1 << 20, 0x1_0000_0000));
        Self::new(cfg, mem, Arc::new(hal::fake::FakeClock::new()), false)
    }

    /// What QUERY_FW reports.
    pub fn fw_info(&self) -> FwInfo {
        FwInfo {
            fw_pages: self.cfg.fw_pages,
            version: self.cfg.fw_version,
            cmd_if_rev: self.cfg.cmd_if_rev,
            log_max_cmds: 4,
            clr_int_base: regs::CLR_INT as u64,
            catas_offset: regs::CATAS_BASE as u64,
            catas_size: regs::CATAS_DWORDS as u32,
            clock_offset: regs::INTERNAL_CLOCK as u64,
        }
    }

    /// The device limits.
    pub fn caps(&self) -> &DevCap {
        &self.cfg.dev_cap
    }

    /// Records a protocol violation.
    pub fn violation(&mut self, msg: impl Into<String>) {
        if self.violations.len() < MAX_LOG {
            self.violations.push(msg.into());
        }
    }

    fn fault(&mut self, f: DmaFault) -> Status {
        if self.dma_faults.len() < MAX_LOG {
            self.dma_faults.push(f);
        }
        Status::INTERNAL_ERR
    }

    fn master_check(&mut self, bus: u64, len: usize, write: bool) -> Result<(), Status> {
        if self.pci.bus_master() {
            Ok(())
        } else {
            Err(self.fault(DmaFault {
                bus,
                len,
                write,
                kind: DmaFaultKind::BusMasterOff,
            }))
        }
    }

    /// Device read of host memory; a fault is recorded and fails the command.
    pub fn dma_read(&mut self, bus: u64, buf: &mut [u8]) -> Result<(), Status> {
        self.master_check(bus, buf.len(), false)?;
        let r = self.mem.read(bus, buf);
        r.map_err(|f| self.fault(f))
    }

    /// Device write of host memory.
    pub fn dma_write(&mut self, bus: u64, buf: &[u8]) -> Result<(), Status> {
        self.master_check(bus, buf.len(), true)?;
        let r = self.mem.write(bus, buf);
        r.map_err(|f| self.fault(f))
    }

    /// A mailbox address must be 4 KiB aligned (Linux allocates mailboxes
    /// from a pool aligned to `MLX4_MAILBOX_SIZE`, iPXE aligns them to
    /// `HERMON_MBOX_ALIGN` = 4096); anything else is a recorded BAD_PARAM.
    fn mailbox_check(&mut self, bus: u64, what: &str) -> Result<(), Status> {
        if bus.is_multiple_of(MAILBOX_ALIGN) {
            Ok(())
        } else {
            self.violation(format!(
                "{what} mailbox at {bus:#x} is not {MAILBOX_ALIGN}-byte aligned"
            ));
            Err(Status::BAD_PARAM)
        }
    }

    /// Reads `len` bytes of an input mailbox (4 KiB aligned).
    pub fn read_mailbox(&mut self, bus: u64, len: usize) -> Result<Vec<u8>, Status> {
        self.mailbox_check(bus, "input")?;
        let mut b = vec![0u8; len];
        self.dma_read(bus, &mut b)?;
        Ok(b)
    }

    /// Writes an output mailbox (4 KiB aligned).
    pub fn write_mailbox(&mut self, bus: u64, bytes: &[u8]) -> Result<(), Status> {
        self.mailbox_check(bus, "output")?;
        self.dma_write(bus, bytes)
    }

    /// Reads ICM; an unmapped page is `ICM_ERROR` and a recorded violation.
    pub fn icm_read(&mut self, va: u64, buf: &mut [u8]) -> Result<(), Status> {
        let mut done = 0usize;
        while done < buf.len() {
            let at = va + done as u64;
            let n = ((crate::hca::icm::ICM_PAGE - at % crate::hca::icm::ICM_PAGE) as usize)
                .min(buf.len() - done);
            let Some(bus) = self.icm.translate(at) else {
                self.violation(format!("ICM read at {at:#x}: page not mapped"));
                return Err(Status::ICM_ERROR);
            };
            self.dma_read(bus, &mut buf[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// Writes ICM; an unmapped page is `ICM_ERROR`.
    pub fn icm_write(&mut self, va: u64, buf: &[u8]) -> Result<(), Status> {
        let mut done = 0usize;
        while done < buf.len() {
            let at = va + done as u64;
            let n = ((crate::hca::icm::ICM_PAGE - at % crate::hca::icm::ICM_PAGE) as usize)
                .min(buf.len() - done);
            let Some(bus) = self.icm.translate(at) else {
                self.violation(format!("ICM write at {at:#x}: page not mapped"));
                return Err(Status::ICM_ERROR);
            };
            self.dma_write(bus, &buf[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// The table geometry (only after INIT_HCA).
    pub fn geo(&self) -> Result<Geometry, Status> {
        self.geo.ok_or(Status::BAD_SYS_STATE)
    }

    /// The QPC-table index of `qpn`: its low `log_num_qps` bits. The bits
    /// above are the QPN's tag (Linux's QP bitmap ORs a rotating `top` into
    /// every QPN it hands out after a free, and masks QPNs the same way in
    /// `mlx4_table_get` and the QP event lookup), so the card indexes the
    /// per-QP tables (QPC, AUXC, ALTC, RDMARC, cMPT) with these bits only.
    pub fn qp_index(&self, qpn: u32) -> u64 {
        let n = self
            .geo
            .and_then(|g| g.count(Table::Qpc))
            .unwrap_or(1 << 24);
        u64::from(qpn & 0xff_ffff) & (n.max(1) - 1)
    }

    /// ICM address of `idx` in `t`, after range and mapping checks: index
    /// outside the table is `BAD_INDEX`, an unmapped entry `ICM_ERROR`.
    pub fn ctx_va(&mut self, t: Table, idx: u64) -> Result<u64, Status> {
        let g = self.geo()?;
        if g.count(t).is_some_and(|n| idx >= n) {
            return Err(Status::BAD_INDEX);
        }
        let va = g.va(t, idx);
        if !self.icm.is_mapped(va, g.entry_size(t)) {
            self.violation(format!(
                "{t:?} entry {idx:#x} at ICM {va:#x}: page not mapped"
            ));
            return Err(Status::ICM_ERROR);
        }
        Ok(va)
    }

    /// Refuses MTT indices `[first, first + n)` that reach into the
    /// firmware-reserved entries (the first `2^log_rsvd_mtts`, QUERY_DEV_CAP
    /// 0x20): `BAD_RESOURCE` ("reserved or unallocated resource", as for
    /// reserved EQ/CQ/QP/SRQ/MPT numbers), recorded with `what`.
    pub fn mtt_reserved_check(&mut self, first: u64, n: u64, what: &str) -> Result<(), Status> {
        let rsvd = u64::from(self.caps().rsvd_mtts());
        if first < rsvd && n > 0 {
            self.violation(format!(
                "{what}: MTT entries {first:#x}..{:#x} reach into the {rsvd} firmware-reserved MTT entries",
                first.saturating_add(n)
            ));
            return Err(Status::BAD_RESOURCE);
        }
        Ok(())
    }

    /// Reads MTT entry `index` (relative to the MTT table) from ICM; a clear
    /// present bit or a set reserved bit (2:1) is `BAD_PARAM`, a
    /// firmware-reserved entry `BAD_RESOURCE`.
    pub fn mtt_lookup(&mut self, index: u64) -> Result<u64, Status> {
        let g = self.geo()?;
        if index >= crate::hca::layout::pow2(self.caps().log_max_mtts) {
            return Err(Status::BAD_PARAM);
        }
        self.mtt_reserved_check(index, 1, "MTT lookup")?;
        let mut b = [0u8; 8];
        self.icm_read(g.va(Table::Mtt, index), &mut b)?;
        if b[7] & 0x6 != 0 {
            self.violation(format!(
                "MTT entry {index:#x} has reserved bits 2:1 set ({:#018x})",
                u64::from_be_bytes(b)
            ));
            return Err(Status::BAD_PARAM);
        }
        match crate::hca::ctx::mtt_decode(&b) {
            Some(pa) => Ok(pa),
            None => {
                self.violation(format!("MTT entry {index:#x} not present"));
                Err(Status::BAD_PARAM)
            }
        }
    }

    /// Resolves a buffer described by an MTT offset (bytes, relative to the
    /// MTT table), a log page size (page_shift - 12) and a length: the bus
    /// address of every page. Each MTT entry is read from ICM and must be
    /// present.
    pub fn mtt_pages(
        &mut self,
        mtt_base: u64,
        log_page_size: u8,
        bytes: u64,
    ) -> Result<Vec<u64>, Status> {
        if !mtt_base.is_multiple_of(8) || log_page_size > 20 {
            return Err(Status::BAD_PARAM);
        }
        let page = 4096u64 << log_page_size;
        let n = bytes.div_ceil(page).max(1);
        if n > 1 << 20 {
            return Err(Status::BAD_PARAM);
        }
        let first = mtt_base / 8;
        self.mtt_reserved_check(first, n, "context MTT base")?;
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n {
            let pa = self.mtt_lookup(first + i)?;
            if pa % page != 0 {
                self.violation(format!(
                    "MTT entry {:#x}: {pa:#x} not aligned to the {page}-byte page",
                    first + i
                ));
                return Err(Status::BAD_PARAM);
            }
            out.push(pa);
        }
        Ok(out)
    }

    // ---------------------------------------------------------------
    // Reset

    /// Software reset: firmware, ICM, objects and HCR back to power-on; the
    /// function drops off the bus for the configured time.
    pub fn reset(&mut self) {
        self.pci.reset(self.cfg.reset_duration.as_nanos() as u64);
        self.hcr = HcrState::default();
        self.bar0.clear(regs::HCR_BASE, regs::HCR_LEN);
        self.bar0.clear(regs::CATAS_BASE, regs::CATAS_DWORDS * 4);
        self.bar0.set_raw(regs::RESET, 0);
        // The reset frees the semaphore (in the polled front ends it lives
        // in the register word itself).
        self.bar0.set_raw(regs::RESET_SEMAPHORE, 0);
        self.reset_sem = false;
        self.fw = FwState::Off;
        self.icm = Icm::default();
        self.stat_cfg = false;
        self.geo = None;
        self.init_hca_raw.clear();
        for p in &mut self.ports {
            p.reset();
        }
        self.eqs.clear();
        self.cqs.clear();
        self.mpts.clear();
        self.srqs.clear();
        self.qps.clear();
        self.async_map = [None; 64];
        self.special_qp_base = 0;
        self.catastrophic = false;
        self.pending_doorbells.clear();
        self.engine = crate::hca::engine::Engine::default();
        self.poll_list.built_for = None;
    }

    // ---------------------------------------------------------------
    // Register handlers (synchronous front end)

    /// A 32-bit load from BAR0.
    pub fn bar0_read(&mut self, off: usize) -> u32 {
        if !self.pci.memory_enabled() {
            self.violation(format!(
                "BAR0 read at {off:#x} with memory decoding disabled (or during reset)"
            ));
            return u32::MAX;
        }
        match off {
            regs::OWNERSHIP => {
                if self.owned {
                    1u32.to_be()
                } else {
                    self.owned = true;
                    0
                }
            }
            regs::RESET_SEMAPHORE => {
                if self.reset_sem {
                    1u32.to_be()
                } else {
                    self.reset_sem = true;
                    0
                }
            }
            regs::HCR_STATUS => {
                self.hcr_status_read();
                self.bar0.raw(off)
            }
            o if o == regs::INTERNAL_CLOCK || o == regs::INTERNAL_CLOCK + 4 => {
                let ticks = self.internal_clock();
                if o == regs::INTERNAL_CLOCK {
                    ((ticks >> 32) as u32).to_be()
                } else {
                    (ticks as u32).to_be()
                }
            }
            _ => self.bar0.raw(off),
        }
    }

    /// The internal clock counter (core clock ticks).
    pub fn internal_clock(&self) -> u64 {
        self.clock.now_ns() / 1000 * u64::from(self.cfg.core_clock_mhz)
    }

    /// A 32-bit store to BAR0.
    pub fn bar0_write(&mut self, off: usize, raw: u32) {
        if !self.pci.memory_enabled() {
            self.violation(format!(
                "BAR0 write {:#010x} at {off:#x} with memory decoding disabled (or during reset)",
                be_dw(raw)
            ));
            return;
        }
        match off {
            o if (regs::HCR_BASE..regs::HCR_STATUS).contains(&o) => {
                let n = (o - regs::HCR_BASE) / 4;
                if self.hcr.busy.is_some() {
                    self.violation(format!(
                        "HCR dword {n} written while a command is in flight"
                    ));
                    return;
                }
                self.bar0.set_raw(o, raw);
                self.hcr.written |= 1 << n;
            }
            regs::HCR_STATUS => self.hcr_go_write(raw),
            regs::OWNERSHIP => {
                if raw == 0 {
                    self.owned = false;
                }
            }
            regs::RESET => {
                if be_dw(raw) & 1 != 0 {
                    if !self.reset_sem && self.cfg.strict_reset_semaphore {
                        self.violation("software reset without holding the reset semaphore");
                    }
                    self.reset();
                }
            }
            regs::RESET_SEMAPHORE => {
                if raw == 0 {
                    self.reset_sem = false;
                }
            }
            o if o == regs::CLR_INT || o == regs::CLR_INT + 4 => {
                self.clr_int_writes += 1;
            }
            o if (regs::CATAS_BASE..regs::CATAS_BASE + regs::CATAS_DWORDS * 4).contains(&o) => {
                self.violation(format!(
                    "write to the read-only catastrophic buffer at {o:#x}"
                ));
            }
            _ => self.bar0.set_raw(off, raw),
        }
    }

    /// A 64-bit store to BAR0 (the HCR takes 32-bit stores only).
    pub fn bar0_write64(&mut self, off: usize, raw: u64) {
        if off + 8 > regs::HCR_BASE && off < regs::HCR_BASE + regs::HCR_LEN {
            self.violation(format!("64-bit store into the HCR at {off:#x}"));
        }
        self.bar0_write(off, raw as u32);
        self.bar0_write(off + 4, (raw >> 32) as u32);
    }

    /// A 32-bit load from BAR2.
    pub fn bar2_read(&mut self, off: usize) -> u32 {
        if !self.pci.memory_enabled() {
            self.violation(format!(
                "BAR2 read at {off:#x} with memory decoding disabled"
            ));
            return u32::MAX;
        }
        self.bar2.raw(off)
    }

    /// A 32-bit store to BAR2 (UAR doorbells).
    pub fn bar2_write(&mut self, off: usize, raw: u32) {
        if !self.pci.memory_enabled() {
            self.violation(format!(
                "BAR2 write at {off:#x} with memory decoding disabled"
            ));
            return;
        }
        self.bar2.set_raw(off, raw);
        self.doorbell(off, be_dw(raw));
    }

    /// A doorbell write at BAR2 offset `off` with BE value `v`.
    fn doorbell(&mut self, off: usize, v: u32) {
        let page = off / regs::UAR_PAGE;
        let in_page = off % regs::UAR_PAGE;
        if (regs::UAR_EQ_DB..regs::UAR_EQ_DB + 32).contains(&in_page) && in_page.is_multiple_of(8) {
            let eqn = (page * 4 + (in_page - regs::UAR_EQ_DB) / 8) as u32;
            self.eq_doorbell(eqn, v);
            return;
        }
        match in_page {
            // The CQ doorbell is one 64-bit store (or two 32-bit stores, low
            // address first): act on the second dword.
            o if o == regs::UAR_CQ_DB => return,
            o if o == regs::UAR_CQ_DB + 4 => {
                let dw0 = self.bar2.be(off - 4);
                self.doorbell_pair(off - 4, dw0, v);
                return;
            }
            regs::UAR_SEND_DB => self.send_doorbell(page as u32, v),
            _ => {}
        }
        if self.pending_doorbells.len() < MAX_LOG {
            self.pending_doorbells.push((off, v));
        }
    }

    /// The CQ doorbell pair at BAR2 offset `off` (the first dword).
    fn doorbell_pair(&mut self, off: usize, dw0: u32, ci: u32) {
        self.cq_doorbell((off / regs::UAR_PAGE) as u32, dw0, ci);
        if self.pending_doorbells.len() + 1 < MAX_LOG {
            self.pending_doorbells.push((off, dw0));
            self.pending_doorbells.push((off + 4, ci));
        }
    }

    /// CQ arm doorbell `[sn << 28 | cmd << 24 | cqn]`, `[ci]` on UAR `uar`.
    fn cq_doorbell(&mut self, uar: u32, dw0: u32, ci: u32) {
        let cqn = dw0 & 0xff_ffff;
        let cmd = (dw0 >> 24) & 7;
        let Some(cq) = self.cqs.get_mut(&cqn) else {
            self.violation(format!(
                "CQ doorbell for CQ {cqn:#x}, which is not in hardware ownership"
            ));
            return;
        };
        let ctx_uar = cq.uar;
        if cmd == 1 || cmd == 2 {
            cq.arms += 1;
        }
        if ctx_uar != uar {
            self.violation(format!(
                "CQ {cqn:#x} doorbell rung on UAR {uar}; its context names UAR {ctx_uar}"
            ));
        }
        if cmd != 1 && cmd != 2 {
            self.violation(format!("CQ {cqn:#x} doorbell with unknown command {cmd}"));
            return;
        }
        if ctx_uar == uar {
            crate::hca::engine::cq_doorbell(self, cqn, cmd, (dw0 >> 28) as u8 & 3, ci);
        }
    }

    /// Send doorbell `qpn << 8` on UAR page `uar`: the QP must have left
    /// RESET; the send engine runs its queue.
    fn send_doorbell(&mut self, uar: u32, v: u32) {
        let qpn = v >> 8;
        let state = self.qps.get(&qpn).map(|q| q.state);
        if matches!(state, None | Some(QpState::Rst)) {
            self.violation(format!("send doorbell for QP {qpn:#x} in RESET"));
            return;
        }
        crate::hca::engine::send_doorbell(self, qpn, uar);
    }

    // ---------------------------------------------------------------
    // HCR engine

    fn hcr_go_write(&mut self, raw: u32) {
        let v = be_dw(raw);
        if v & bits::GO == 0 {
            self.violation(format!("HCR dword 6 written without GO: {v:#010x}"));
            return;
        }
        if self.hcr.busy.is_some() {
            self.violation(format!(
                "GO written while the HCR is busy (opcode {})",
                Opcode((v & bits::OPCODE_MASK) as u16)
            ));
            return;
        }
        if self.hcr.written & 0x3f != 0x3f {
            self.violation(format!(
                "HCR dword 6 (GO) written before dwords 0..5 (written mask {:#04x})",
                self.hcr.written
            ));
        }
        let mut dw = [0u32; 7];
        for (i, d) in dw.iter_mut().enumerate().take(6) {
            *d = self.bar0.be(regs::HCR_BASE + 4 * i);
        }
        dw[6] = v;
        self.bar0.set_raw(regs::HCR_STATUS, raw);
        self.hcr.written = 0;
        self.post(dw);
    }

    /// Executes a posted command and leaves it busy until it completes.
    pub fn post(&mut self, dw: [u32; 7]) {
        let cmd = Command::decode(dw);
        // The command may add, remove or move the objects whose doorbells
        // the polling round reads.
        self.poll_list.built_for = None;
        if dw[5] & 0xffff != 0 {
            self.violation(format!(
                "{}: HCR dword 5 reserved bits 15:0 set ({:#010x}; only the token, bits 31:16, is defined)",
                cmd.opcode, dw[5]
            ));
        }
        if dw[6] & (0xff << bits::STATUS_SHIFT | 0x1f << 16) != 0 {
            self.violation(format!(
                "{}: HCR dword 6 {:#010x} has status or reserved bits 20:16 set",
                cmd.opcode, dw[6]
            ));
        }
        if cmd.event && self.async_map[usize::from(crate::hca::ctx::eqe::CMD)].is_none() {
            self.violation(format!(
                "{} posted in event mode (E bit) while no EQ is mapped for command-completion events: its completion EQE is lost",
                cmd.opcode
            ));
        }
        if cmd.toggle == self.hcr.last_t {
            self.violation(format!(
                "HCR toggle not flipped: {} posted with T={}",
                cmd.opcode, cmd.toggle as u8
            ));
        }
        self.hcr.last_t = cmd.toggle;
        let start_ns = self.clock.now_ns();
        let fault = self.faults.take(cmd.opcode).unwrap_or_default();
        let (outcome, injected) = if self.catastrophic {
            (Outcome::status(Status::INTERNAL_ERR), false)
        } else if let Some(s) = fault.status {
            (Outcome::status(s), true)
        } else {
            (fw::execute(self, &cmd), false)
        };
        let status = outcome.status.0;
        self.trace.push(TraceEntry {
            opcode: cmd.opcode.0,
            name: cmd.opcode.name(),
            in_mod: cmd.in_mod,
            op_mod: cmd.op_mod,
            in_param: cmd.in_param,
            out_param: outcome.imm_out.unwrap_or(cmd.out_param),
            status,
            token: cmd.token,
            event: cmd.event,
            at: core::time::Duration::from_nanos(start_ns),
            duration: None,
            injected,
        });
        let delay = self.cfg.hcr_delay + fault.extra_delay;
        self.hcr.busy = Some(Busy {
            posted: dw[6],
            status,
            imm_out: outcome.imm_out,
            // Polled front ends keep GO up for one more pass, in which they
            // compare dwords 0..5 with what was read at GO.
            polls_left: if self.threaded {
                1
            } else {
                self.cfg.hcr_polls.saturating_add(fault.extra_polls)
            },
            due_ns: start_ns.saturating_add(delay.as_nanos() as u64),
            stuck: fault.stuck,
            trace_idx: self.trace.len() - 1,
            start_ns,
            event: cmd.event,
            token: cmd.token,
            params: [dw[0], dw[1], dw[2], dw[3], dw[4], dw[5]],
        });
        self.try_complete();
    }

    /// A read of the status dword (sync mode): counts down the polls.
    fn hcr_status_read(&mut self) {
        if let Some(b) = &mut self.hcr.busy
            && b.polls_left > 0
        {
            b.polls_left -= 1;
            return;
        }
        self.try_complete();
    }

    /// Completes the in-flight command if its time has come.
    pub fn try_complete(&mut self) {
        let now = self.clock.now_ns();
        let Some(b) = &self.hcr.busy else { return };
        if b.stuck || b.polls_left > 0 || now < b.due_ns {
            return;
        }
        let b = self.hcr.busy.take().expect("checked above");
        if let Some(v) = b.imm_out {
            self.bar0.set_be(regs::HCR_BASE + 0x0c, (v >> 32) as u32);
            self.bar0.set_be(regs::HCR_BASE + 0x10, v as u32);
        }
        let word = (b.posted & !(bits::GO | 0xff << bits::STATUS_SHIFT))
            | u32::from(b.status) << bits::STATUS_SHIFT;
        self.bar0.set_be(regs::HCR_STATUS, word);
        self.hcr.idle_dw6 = word.to_be();
        if let Some(e) = self.trace.get_mut(b.trace_idx) {
            e.duration = Some(core::time::Duration::from_nanos(
                now.saturating_sub(b.start_ns),
            ));
        }
        if b.event {
            self.post_async(crate::hca::ctx::Event::Cmd {
                token: b.token,
                status: b.status,
                out_param: b.imm_out.unwrap_or(0),
            });
        }
    }

    // ---------------------------------------------------------------
    // Threaded front end: poll the shared register memory.

    /// Consumes the doorbells written to the shared BAR2 since the last
    /// pass; true if there were any.
    fn consume_doorbells(&mut self) -> bool {
        let mut active = false;
        // Doorbells are consumed by atomic swap with 0, a value no doorbell
        // carries (CQ command 0 and QPN 0 are invalid; an EQ doorbell of 0,
        // consumer index 0 without re-arm, changes nothing after SW2HW);
        // a plain load first, so an idle round takes no cache line away
        // from the CPU about to ring (and costs no locked instruction).
        // The lists are taken out while the doorbells run (no allocation
        // per round once built).
        let objects = self.eqs.len() + self.cqs.len() + self.qps.len();
        if self.poll_list.built_for != Some(objects) {
            let l = &mut self.poll_list;
            l.eqs.clear();
            l.eqs.extend(self.eqs.keys().copied());
            l.uars.clear();
            l.uars.extend(self.cqs.values().map(|c| c.uar));
            l.uars.extend(self.qps.values().map(|q| q.uar));
            l.uars.sort_unstable();
            l.uars.dedup();
            l.built_for = Some(objects);
        }
        let eqs = core::mem::take(&mut self.poll_list.eqs);
        let uars = core::mem::take(&mut self.poll_list.uars);
        for &eqn in &eqs {
            let raw = take_doorbell(&self.bar2, regs::eq_doorbell(eqn));
            if raw != 0 {
                self.eq_doorbell(eqn, be_dw(raw));
                active = true;
            }
        }
        for &uar in &uars {
            let page = uar as usize * regs::UAR_PAGE;
            // A page's doorbell word holds the last write since the previous
            // pass: two objects of one page rung in between leave one
            // doorbell. The others rung are found from host memory (see
            // `crate::hca::engine::send_doorbells_coalesced`); only here, the
            // synchronous front end sees every write.
            let cq0 = take_doorbell(&self.bar2, page + regs::UAR_CQ_DB);
            if cq0 != 0 {
                let ci = self.bar2.raw(page + regs::UAR_CQ_DB + 4);
                self.doorbell_pair(page + regs::UAR_CQ_DB, be_dw(cq0), be_dw(ci));
                crate::hca::engine::cq_arms_coalesced(self, uar, be_dw(cq0) & 0xff_ffff);
                active = true;
            }
            let send = take_doorbell(&self.bar2, page + regs::UAR_SEND_DB);
            if send != 0 {
                self.doorbell(page + regs::UAR_SEND_DB, be_dw(send));
                crate::hca::engine::send_doorbells_coalesced(self, uar, be_dw(send) >> 8);
                active = true;
            }
        }
        self.poll_list.eqs = eqs;
        self.poll_list.uars = uars;
        active
    }

    /// The doorbells written to a shared BAR2 since the last pass (a front
    /// end that polls BAR2 while trapping BAR0: [`Hca::bar2_polled`]),
    /// taken as [`Hca::poll_shared`] takes them; true if there were any.
    pub fn poll_doorbells(&mut self) -> bool {
        self.consume_doorbells()
    }

    /// One polling pass over the shared registers; true if anything
    /// happened (a command, a reset, a doorbell).
    pub fn poll_shared(&mut self) -> bool {
        let mut active = false;
        if be_dw(self.bar0.raw(regs::RESET)) & 1 != 0 {
            self.reset();
            active = true;
        }
        let clk = self.internal_clock();
        self.bar0.set_be(regs::INTERNAL_CLOCK, (clk >> 32) as u32);
        self.bar0.set_be(regs::INTERNAL_CLOCK + 4, clk as u32);
        // Doorbells before a new command: whatever a driver rang before it
        // wrote GO (an arm of a CQ it then hands back with HW2SW_CQ, say)
        // was rung while the object was still the hardware's; a driver
        // rings nothing for a command's objects until GO clears.
        active |= self.consume_doorbells();
        let dw6 = self.bar0.be(regs::HCR_STATUS);
        match &self.hcr.busy {
            Some(b) => {
                if dw6 != b.posted {
                    let posted = b.posted;
                    self.violation(format!(
                        "HCR dword 6 rewritten while busy ({posted:#010x} -> {dw6:#010x})"
                    ));
                    // Keep showing the in-flight command.
                    self.bar0.set_be(regs::HCR_STATUS, posted);
                }
                self.hcr_params_unchanged();
                if let Some(b) = &mut self.hcr.busy {
                    b.polls_left = b.polls_left.saturating_sub(1);
                }
                self.try_complete();
                active = true;
            }
            None if dw6 & bits::GO != 0 => {
                if self.pci.memory_enabled() {
                    self.hcr.go_decode_off = false;
                    let mut dw = [0u32; 7];
                    for (i, d) in dw.iter_mut().enumerate() {
                        *d = self.bar0.be(regs::HCR_BASE + 4 * i);
                    }
                    self.post(dw);
                } else if !self.hcr.go_decode_off {
                    // The memory-enable write may be racing in the config
                    // image (cx3-emu syncs it after this poll): one more
                    // pass before judging.
                    self.hcr.go_decode_off = true;
                } else {
                    // The synchronous front end drops a BAR write while
                    // decoding is off; here it already landed: undo it.
                    self.hcr.go_decode_off = false;
                    self.violation(format!(
                        "HCR GO ({dw6:#010x}) written with memory decoding disabled (or during reset): dropped"
                    ));
                    self.bar0.set_raw(regs::HCR_STATUS, self.hcr.idle_dw6);
                }
                active = true;
            }
            None => {}
        }
        active |= crate::hca::engine::step(self);
        active
    }

    /// Polled front ends: dwords 0..5 must not change while a command is in
    /// flight (a write after GO, or a late write that GO overtook).
    fn hcr_params_unchanged(&mut self) {
        let Some(b) = &self.hcr.busy else { return };
        let (mut params, op) = (b.params, Opcode((b.posted & bits::OPCODE_MASK) as u16));
        let mut changed = Vec::new();
        for (i, p) in params.iter_mut().enumerate() {
            let now = self.bar0.be(regs::HCR_BASE + 4 * i);
            if now != *p {
                changed.push(format!("dword {i} {:#010x} -> {now:#010x}", *p));
                *p = now;
            }
        }
        if changed.is_empty() {
            return;
        }
        if let Some(b) = &mut self.hcr.busy {
            b.params = params;
        }
        self.violation(format!(
            "HCR parameters changed while {op} was in flight (written after GO?): {}",
            changed.join(", ")
        ));
    }

    /// Raises a catastrophic error: the error buffer gets a syndrome, a
    /// LOCAL_CATAS_ERROR EQE goes to the EQ mapped for it, and every later
    /// command completes with INTERNAL_ERR until reset.
    pub fn raise_catastrophic(&mut self, syndrome: u32) {
        self.catastrophic = true;
        self.bar0.set_be(regs::CATAS_BASE, syndrome.max(1));
        self.bar0.set_be(regs::CATAS_BASE + 4, 0x0bad_0001);
        self.post_async(crate::hca::ctx::Event::LocalCatas);
    }

    /// INIT_HCA parameters, if initialized.
    pub fn init_hca(&self) -> Option<InitHca> {
        self.geo.map(|g| g.hca)
    }
}

/// Consumes the doorbell dword at `off` of a shared BAR (0 if none was
/// rung): a plain load, and the swap with 0 only when it holds one.
fn take_doorbell(bar2: &RegFile, off: usize) -> u32 {
    if bar2.raw(off) == 0 {
        0
    } else {
        bar2.swap_raw(off, 0)
    }
}
