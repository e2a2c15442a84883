//! A strict software model of the Mellanox ConnectX-3 HCA (MT27500, PCI
//! 15b3:1003) as the Linux `mlx4_core` driver sees it; the data-path engines
//! (SQ/RQ/CQ processing), the fabric and the subnet manager are not modelled
//! yet.
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
//! | module | models |
//! |---|---|
//! | [`pci`] | config space: ids, class, BARs, capability list, command register |
//! | [`regs`] | BAR0/BAR2 register files and their offsets (HCR, ownership, reset, catas, clr_int, UAR) |
//! | [`hcr`] | opcodes, status codes and the go/toggle protocol of the command register |
//! | [`mem`] | the one path to host memory ([`HostMemory`]), DMA faults |
//! | [`layout`] | byte layouts of the query mailboxes (QUERY_FW, QUERY_DEV_CAP, ...) |
//! | [`ctx`] | byte layouts and validation of EQ/CQ/QP/SRQ/MPT contexts, MTT entries, EQEs |
//! | [`icm`] | ICM: FA/aux pages, the ICM virtual-to-bus page table, table geometry |
//! | [`eq`] | event queues: EQE writing, ownership, doorbells, overrun, async events |
//! | [`port`] | the two IB ports: physical/logical state, LID, SM, P_Key and GUID tables |
//! | [`mad_ifc`] | the firmware SMA/PMA behind MAD_IFC |
//! | [`fw`] | the firmware command handlers, by area |
//! | [`faults`] | fault injection |
//! | [`trace`] | the command trace |
//! | [`frontend`] | [`SimHca`]: the `hal` backend for host tests (sync and threaded) |
//!
//! # Where the two readings of a layout differ
//!
//! Recorded as found while writing the layouts (iPXE = `ipxe/ipxe`
//! `src/drivers/infiniband/{hermon.h,MT25408_PRM.h,hermon.c}`, Linux = 3.11
//! mlx4). See also the module docs of [`layout`] and [`ctx`].
//!
//! * Reset value: Linux writes the big-endian dword `0x00000001` to
//!   BAR0+0xf0010 (`MLX4_RESET_VALUE = swab32(1)`), iPXE writes
//!   `0x01000001` (`HERMON_RESET_MAGIC`, a little-endian `writel`, i.e. the
//!   BE dword `0x01000001`). Both set bit 0 of the BE dword; the model resets
//!   on bit 0 and ignores the rest.
//! * iPXE takes no reset semaphore (BAR0+0xf03fc) before resetting; Linux
//!   does. The model records a reset without the semaphore as a violation
//!   only when [`SimConfig::strict_reset_semaphore`] is set.
//! * HCR status codes: the brief this crate was written from listed
//!   BAD_SEG_PARAM..MULTI_FUNC_REQ as 0x11..0x22; Linux `cmd.c` (all
//!   versions checked) and the porting map use 0x20 BAD_SEG_PARAM, 0x21
//!   REG_BOUND, 0x22 LAM_NOT_PRE, 0x30 BAD_PKT, 0x40 BAD_SIZE, 0x50
//!   MULTI_FUNC_REQ. The model uses Linux's values ([`hcr::Status`]).
//! * Everything else listed in [`layout`] and [`ctx`].
#![warn(missing_docs)]

pub mod ctx;
pub mod eq;
pub mod faults;
pub mod frontend;
pub mod fw;
pub mod hcr;
pub mod icm;
pub mod layout;
pub mod mad_ifc;
pub mod mem;
pub mod pci;
pub mod port;
pub mod regs;
pub mod trace;

mod device;

pub use faults::{FaultPlan, OpcodeFault};
pub use frontend::{SimConfig, SimHca};
pub use hcr::{Opcode, Status};
pub use mem::{DmaFault, HostMemory};
pub use port::{LogicalState, PhysicalState};
pub use trace::TraceEntry;
