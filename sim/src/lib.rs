//! A strict software model of the Mellanox ConnectX-3 HCA and of the fabric its
//! ports are cabled to.
//!
//! A strict software model of the Mellanox ConnectX-3 HCA (MT27500, PCI
//! 15b3:1003) as the Linux `mlx4_core` driver sees it, with its data-path
//! engines and the fabric its ports are cabled to (switches, a subnet
//! manager with its SA, the ibsim protocol for OpenSM and the diags);
//! Ethernet, RoCE and SR-IOV are not modelled.
//!
//! The model is a *checker*: it answers firmware commands with the status the
//! card would use, refuses out-of-order or malformed requests, records
//! protocol violations and DMA faults, and never panics on anything a driver
//! can send. It reads wire formats independently of the driver crates
//! (`mlx4_hw`/`mlx4_core` are deliberately not dependencies): offsets come from
//! the PRM-derived iPXE headers (`hermon.h`, `MT25408_PRM.h`), cross-checked
//! against Linux 3.11 `drivers/net/ethernet/mellanox/mlx4`.
//!
//! # Structure
//!
//! Three wings, with dependencies pointing one way: [`front`] uses
//! [`hca`], [`hca`] uses [`fabric`], and nothing points back (no file under
//! `fabric/` names `hca` or `front`, none under `hca/` names `front`). The
//! card takes its configuration from a front end as an
//! [`hca::HcaConfig`]; the IBTA port states both ends of a cable use are
//! the fabric's ([`LogicalState`], [`PhysicalState`]).
//!
//! | module | models |
//! |---|---|
//! | [`hca`] | the card |
//! | [`hca::pci`] | config space: ids, class, BARs, capability list, command register |
//! | [`hca::regs`] | BAR0/BAR2 register files and their offsets (HCR, ownership, reset, catas, clr_int, UAR) |
//! | [`hca::hcr`] | opcodes, status codes and the go/toggle protocol of the command register |
//! | [`hca::mem`] | the one path to host memory ([`HostMemory`]), DMA faults |
//! | [`hca::layout`] | byte layouts of the query mailboxes (QUERY_FW, QUERY_DEV_CAP, ...) |
//! | [`hca::ctx`] | byte layouts and validation of EQ/CQ/QP/SRQ/MPT contexts, MTT entries, EQEs |
//! | [`hca::icm`] | ICM: FA/aux pages, the ICM virtual-to-bus page table, table geometry |
//! | [`hca::eq`] | event queues: EQE writing, ownership, doorbells, overrun, async events |
//! | [`hca::port`] | the two IB ports: physical/logical state, LID, SM, P_Key and GUID tables |
//! | [`hca::mad_ifc`] | the firmware SMA/PMA behind MAD_IFC |
//! | [`hca::fw`] | the firmware command handlers, by area |
//! | [`hca::engine`] | the data-path engines: queues, transports, the HCA's end of the wire |
//! | [`hca::faults`] | fault injection into the card |
//! | [`hca::trace`] | the command trace |
//! | [`fabric`] | the wire: cables, switches (SMA, PMA, LFT, directed route), topologies, capture, packet faults, host nodes, the SM and SA, the ibsim server |
//! | [`fabric::packet`] | InfiniBand packets: LRH/GRH/BTH/ETHs, MAD/SMP headers, ICRC/VCRC |
//! | [`front`] | the front ends |
//! | [`front::in_process`] | [`SimHca`]: the `hal` backend for host tests (sync and threaded) |
//! | [`front::ivshmem`] | the `cx3-emu` front end: the model served to QEMU guests over ivshmem |
//! | [`front::vfu`] | the `cx3-vfu` front end: the model as a PCI function over vfio-user |
//!
//! # Where the two readings of a layout differ
//!
//! iPXE = `ipxe/ipxe` `src/drivers/infiniband/{hermon.h,MT25408_PRM.h,
//! hermon.c}`; Linux = 3.11 mlx4. The per-field lists are in the module docs
//! of [`hca::layout`] (QUERY_DEV_CAP reserved EQs and BMME bits, INIT_HCA cache
//! line / 64-byte entries / memory windows, QUERY_PORT link state,
//! MOD_STAT_CFG flavours, MAD_IFC extended-info bit, SET_PORT GUID bits) and
//! [`hca::ctx`] (EQC moderation and interrupt widths, CQC EQN width, dMPT bit 17
//! and lkey, QPC page offset and param3, QP path counter/VLAN index). Device
//! level differences:
//!
//! * Reset value: Linux writes the big-endian dword `0x00000001` to
//!   BAR0+0xf0010 (`MLX4_RESET_VALUE = swab32(1)`), iPXE writes
//!   `0x01000001` (`HERMON_RESET_MAGIC`, a little-endian `writel`, i.e. the
//!   BE dword `0x01000001`). Both set bit 0 of the BE dword; the model resets
//!   on bit 0 and ignores the rest.
//! * iPXE takes no reset semaphore (BAR0+0xf03fc) before resetting; Linux
//!   does. The model records a reset without the semaphore as a violation
//!   only when [`SimConfig::strict_reset_semaphore`] is set.
//! * HCR toggle: both start with T=1 on the first command after reset
//!   (Linux initialises its toggle to 1 and checks `T == toggle` for
//!   pending; iPXE initialises 0, flips before posting and waits for
//!   `T == toggle`). They agree.
//! * CQ/EQ ownership at creation: Linux zero-fills CQ and EQ buffers and
//!   relies on the firmware to make every entry hardware-owned; iPXE sets
//!   the owner bits itself. The model sets them at SW2HW, so both work.
//! * HCR status codes: the brief this crate was written from listed
//!   BAD_SEG_PARAM..MULTI_FUNC_REQ as 0x11..0x22; Linux `cmd.c` (all
//!   versions checked) and the porting map use 0x20 BAD_SEG_PARAM, 0x21
//!   REG_BOUND, 0x22 LAM_NOT_PRE, 0x30 BAD_PKT, 0x40 BAD_SIZE, 0x50
//!   MULTI_FUNC_REQ. The model uses Linux's values ([`hca::hcr::Status`]).
//!
//! # What a driver must do for the model (and the card)
//!
//! * Claim ownership (read BAR0+0x8069c), optionally reset (semaphore at
//!   0xf03fc, then BE 1 at 0xf0010, then restore config space: the command
//!   register and BARs are cleared by the reset; config reads return all
//!   ones for [`SimConfig::reset_duration`]).
//! * Enable memory decoding and bus mastering: without them register
//!   accesses are dropped (violation) and every DMA fails (INTERNAL_ERR).
//! * Post commands with 32-bit stores, dwords 0..5 first, dword 6 last, T
//!   flipped each time, and only while the HCR is idle; reserved HCR bits
//!   (dword 5 15:0, dword 6 20:16) clear; event mode (E) only once an EQ
//!   takes command completions. Mailboxes are 4 KiB aligned.
//! * Input modifiers carry nothing but their fields: object numbers in
//!   23:0 (bits 31:24 set is BAD_PARAM, never masked), MAP_EQ's unmap flag
//!   in bit 31, RTS2SQD's SQ-drained request in bit 31; opcode modifiers
//!   are the documented ones (HW2SW_* 0/1, 2RST 0..3, CLOSE_HCA 0/1, else
//!   0), or BAD_OP.
//! * MAP_FA at least QUERY_FW's `fw_pages`; SET_ICM_SIZE, then MAP_ICM_AUX
//!   at least the returned page count before MAP_ICM and INIT_HCA.
//! * INIT_HCA: version 2, every reserved bit of the 0x200 bytes clear, flags
//!   limited to what QUERY_DEV_CAP reported (a byte-swapped flags dword is
//!   refused), each table larger than its reserved part, QPC/SRQC/CQC/dMPT/
//!   cMPT aligned on their size. QUERY_HCA returns the accepted mailbox
//!   plus the core clock.
//! * Teardown undoes what bring-up did before CLOSE_HCA: MAP_EQ with the
//!   unmap bit before HW2SW_EQ, CLOSE_PORT for every port INIT_PORT opened,
//!   every object back from hardware ownership (each left over is a
//!   recorded violation).
//! * MAP_ICM every ICM page a context or MTT entry lives in *before* the
//!   command that uses it: SW2HW_EQ needs the EQC and cMPT-EQ entries,
//!   SW2HW_CQ the CQC and cMPT-CQ, SW2HW_SRQ the SRQC and cMPT-SRQ,
//!   SW2HW_MPT the dMPT, RST2INIT the QPC,
//!   AUXC, ALTC, RDMARC and cMPT-QP entries, and every MTT entry named.
//!   Unmapped is ICM_ERROR, never a silent zero.
//! * MTT entries: BE64 `page_bus_address | 1` at `mtt_base + index * 8` in
//!   ICM, written directly or with WRITE_MTT; a context's MTT field is
//!   `index * 8` (relative); pages must be aligned to the context's page
//!   size. A clear present bit or a set reserved bit (2:1) is BAD_PARAM;
//!   the first 2^`log_rsvd_mtts` entries (16) belong to the firmware:
//!   WRITE_MTT there, or a context or MPT pointing there, is BAD_RESOURCE.
//! * CQ/EQ entries are 32 bytes (64-byte entries are refused at INIT_HCA);
//!   the model marks every entry hardware-owned at SW2HW; owner of entry
//!   `i` = `(i & nent) != 0`. Ring the EQ doorbell (consumer index) before
//!   the EQ fills up, or it overruns (violation, EQ_OVERFLOW event).
//! * Reserved numbers (QUERY_DEV_CAP) are BAD_RESOURCE: EQs < 32, CQs < 128,
//!   QPs < 64, SRQs < 64, MPTs < 16, PDs < 4, MTT entries < 16; UAR indices
//!   < 8 in contexts are refused. EQ and CQ contexts must have their
//!   reserved bits clear; EQ event coalescing is refused (not modelled),
//!   overrun-ignore is honoured.
//!
//! # How the pieces fit
//!
//! The device core (`device`, private) owns all state behind one lock and
//! hands doorbells to the data-path engines ([`hca::engine`]): the send engine
//! runs a QP's send queue on its doorbell, messages to this HCA's own LID
//! run requester and responder together (the card's loopback), messages
//! to anyone else become packets on the fabric ([`fabric`], [`fabric::packet`]).
//! A [`Wire`] groups the HCAs on one fabric: synchronous HCAs are stepped
//! together after every register write and on every `relax` of their
//! shared fake clock (RNR and retry timers run on fake time), threaded
//! ones by their own model threads, `cx3-emu`'s by its poll loop. Lock
//! order: one HCA, then the fabric; the fabric never calls an HCA. That
//! holds for the types too: the fabric's code names no type of the card
//! (an HCA port is a [`fabric::PortId`] to it, a packet is bytes), so the
//! order is one the compiler keeps, not only a convention.
#![warn(missing_docs)]

pub mod fabric;
pub mod front;
pub mod hca;

pub use fabric::{LinkLayer, LogicalState, PhysicalState};
pub use front::in_process::{SimConfig, SimHca, Wire};
pub use hca::config::PortType;
pub use hca::faults::{FaultPlan, OpcodeFault};
pub use hca::hcr::{Opcode, Status};
pub use hca::mem::{DmaFault, HostMemory};
pub use hca::trace::TraceEntry;
