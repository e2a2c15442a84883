//! The mlx4_ib device (Linux `main.c`): adding and removing it, its queries, its verbs and its events.
//!
//! `mlx4_ib_add` (protection domain, UAR, node data from the firmware SMA,
//! counters), `mlx4_ib_remove`, the queries (`mlx4_ib_query_device`,
//! `mlx4_ib_query_port`, `mlx4_ib_query_gid`, `mlx4_ib_query_pkey`),
//! PD/MR/AH/CQ/SRQ verbs, and mlx4_core events turned into port and device
//! events; an Ethernet port's queries go to `roce.rs`. Left out: IB
//! registration with ib_core, multicast, sysfs and user contexts.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::sync::Arc;

use hal::Bar;
use log::{info, warn};
use mlx4_core::pd::Uar;
use mlx4_core::{Caps, Dev, Event, IntfId};

use crate::ah::{Mlx4IbAh, create_ib_ah};
use crate::buf::write_buf_mtt;
use crate::cq::{CqHw, Mlx4IbCq};
use crate::doorbell::DbPool;
use crate::mad::{self, NodeInfo, PortAttr};
use crate::mr::{Mlx4IbMr, REMOTE_ACCESS, convert_access};
use crate::srq::{Mlx4IbSrq, SrqHw, srq_size};
use crate::table::{AhId, CqId, MrId, PdId, QpTable, Slab, SrqId};
use crate::verbs::{AccessFlags, AhAttr, SrqAttr, SrqAttrMask, Wc};
use crate::{Error, Result};

/// A protection domain (Linux `struct mlx4_ib_pd`).
#[derive(Debug)]
pub struct Mlx4IbPd {
    pub(crate) pdn: u32,
}

/// An event of the device as mlx4_ib reports it to ib_core (Linux
/// `mlx4_ib_event` turning `enum mlx4_dev_event` into `ib_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IbEvent {
    /// `IB_EVENT_PORT_ACTIVE`.
    PortActive(u8),
    /// `IB_EVENT_PORT_ERR`.
    PortErr(u8),
    /// `IB_EVENT_LID_CHANGE`.
    LidChange(u8),
    /// `IB_EVENT_PKEY_CHANGE`.
    PkeyChange(u8),
    /// `IB_EVENT_GID_CHANGE`.
    GidChange(u8),
    /// `IB_EVENT_CLIENT_REREGISTER`.
    ClientReregister(u8),
    /// `IB_EVENT_SM_CHANGE`.
    SmChange(u8),
    /// `IB_EVENT_DEVICE_FATAL`.
    DeviceFatal,
    /// A completion event on a CQ (its comp handler).
    CqComp(CqId),
    /// `IB_EVENT_CQ_ERR`.
    CqErr(CqId),
    /// An affiliated QP event (mlx4 event type).
    Qp(crate::QpId, u8),
    /// An SRQ event (`IB_EVENT_SRQ_LIMIT_REACHED` and others; mlx4 type).
    Srq(SrqId, u8),
}

/// Queue of mlx4_core events waiting for [`Mlx4IbDev::poll`].
type EventQueue = Arc<spin::Mutex<VecDeque<Event>>>;

/// The interface mlx4_ib registers with mlx4_core (Linux `mlx4_ib_interface`).
struct Mlx4IbInterface {
    queue: EventQueue,
}

impl mlx4_core::Interface for Mlx4IbInterface {
    fn event(&mut self, _caps: &Caps, event: Event) {
        let mut q = self.queue.lock();
        // A bounded queue: the progress loop drains it every pass.
        if q.len() < 4096 {
            q.push_back(event);
        }
    }
}

/// The mlx4_ib device (Linux `struct mlx4_ib_dev`): owns the mlx4_core
/// device and every verbs object.
pub struct Mlx4IbDev {
    pub(crate) dev: Dev,
    pub(crate) name: String,
    pub(crate) priv_pdn: u32,
    /// `None` once removed.
    pub(crate) priv_uar: Option<Uar>,
    pub(crate) dbs: DbPool,
    pub(crate) pds: Slab<Mlx4IbPd>,
    pub(crate) cqs: Slab<Mlx4IbCq>,
    pub(crate) qps: QpTable,
    pub(crate) srqs: Slab<Mlx4IbSrq>,
    pub(crate) mrs: Slab<Mlx4IbMr>,
    pub(crate) ahs: Slab<Mlx4IbAh>,
    pub(crate) node_guid: u64,
    pub(crate) node_desc: [u8; 64],
    pub(crate) counters: [Option<u32>; 2],
    pub(crate) events: EventQueue,
    pub(crate) intf: Option<IntfId>,
    pub(crate) fatal: bool,
    /// Events found by snooping SMPs, delivered by the next poll.
    pub(crate) snooped: VecDeque<IbEvent>,
    /// Per port, ib_core's cached P_Key and GID tables as of its last
    /// refresh (what `build_mlx_header` reads; empty until ib_core has
    /// filled its cache).
    pub(crate) port_cache: [crate::provider::SqpCache; 2],
    /// Per port, the RoCE state of an Ethernet port.
    pub(crate) roce: [Option<crate::roce::RocePort>; 2],
}

impl Drop for Mlx4IbDev {
    fn drop(&mut self) {
        self.remove();
    }
}

impl core::fmt::Debug for Mlx4IbDev {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Mlx4IbDev({})", self.name)
    }
}

/// A failed [`Mlx4IbDev::add`]: why, and the mlx4_core device back.
pub struct AddError {
    /// Why.
    pub err: Error,
    /// The device, as it was before.
    pub dev: Box<Dev>,
}

impl core::fmt::Debug for AddError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "AddError({:?})", self.err)
    }
}

/// Limits of `mlx4_ib_query_device` (`struct ib_device_attr`, the fields
/// ibv_devinfo prints).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct DeviceAttr {
    pub fw_ver: u64,
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u32,
    pub vendor_id: u32,
    pub vendor_part_id: u16,
    pub hw_ver: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_pkeys: u32,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

impl Mlx4IbDev {
    /// Linux `mlx4_ib_add`: the private PD and UAR, node data from the
    /// firmware SMA, a counter per port, and the mlx4_core interface for
    /// events. On failure the mlx4_core device is handed back untouched
    /// apart from what was undone.
    #[allow(clippy::result_large_err)]
    pub fn add(mut dev: Dev, name: &str) -> core::result::Result<Mlx4IbDev, AddError> {
        let priv_pdn = match dev.pd_alloc() {
            Ok(p) => p,
            Err(e) => {
                return Err(AddError {
                    err: e.into(),
                    dev: Box::new(dev),
                });
            }
        };
        let priv_uar = match dev.uar_alloc() {
            Ok(u) => u,
            Err(e) => {
                dev.pd_free(priv_pdn);
                return Err(AddError {
                    err: e.into(),
                    dev: Box::new(dev),
                });
            }
        };
        // init_node_data: NodeDescription, then NodeInfo.
        let node =
            mad::query_node_desc(&mut dev).and_then(|d| Ok((d, mad::query_node_info(&mut dev)?)));
        let (node_desc, info) = match node {
            Ok(n) => n,
            Err(e) => {
                dev.uar_free(priv_uar);
                dev.pd_free(priv_pdn);
                return Err(AddError {
                    err: e,
                    dev: Box::new(dev),
                });
            }
        };
        let mut counters = [None; 2];
        for c in counters.iter_mut().take(usize::from(dev.caps().num_ports)) {
            *c = dev.counter_alloc().ok();
        }
        let events: EventQueue = Arc::new(spin::Mutex::new(VecDeque::new()));
        let intf = dev.register_interface(Box::new(Mlx4IbInterface {
            queue: events.clone(),
        }));
        info!(
            "{name}: mlx4_ib: node GUID {:016x}, {} port(s)",
            info.node_guid,
            dev.caps().num_ports
        );
        let mut ib = Mlx4IbDev {
            dev,
            name: String::from(name),
            priv_pdn,
            priv_uar: Some(priv_uar),
            dbs: DbPool::default(),
            pds: Slab::default(),
            cqs: Slab::default(),
            qps: QpTable::default(),
            srqs: Slab::default(),
            mrs: Slab::default(),
            ahs: Slab::default(),
            node_guid: info.node_guid,
            node_desc,
            counters,
            events,
            intf: Some(intf),
            fatal: false,
            snooped: VecDeque::new(),
            port_cache: Default::default(),
            roce: Default::default(),
        };
        ib.roce_add();
        Ok(ib)
    }

    /// Linux `mlx4_ib_remove`: every object still alive is destroyed (QPs,
    /// SRQs, CQs, MRs, AHs, PDs), then the counters, the interface, the UAR
    /// and the PD. The mlx4_core device stays (it is torn down when this
    /// device is dropped). Idempotent; dropping the device calls it.
    pub fn remove(&mut self) {
        let qps: alloc::vec::Vec<u32> = self.qps.slab.ids().collect();
        for q in qps {
            let _ = self.destroy_qp(crate::QpId(q));
        }
        let srqs: alloc::vec::Vec<u32> = self.srqs.ids().collect();
        for s in srqs {
            let _ = self.destroy_srq(SrqId(s));
        }
        let cqs: alloc::vec::Vec<u32> = self.cqs.ids().collect();
        for c in cqs {
            let _ = self.destroy_cq(CqId(c));
        }
        let mrs: alloc::vec::Vec<u32> = self.mrs.ids().collect();
        for m in mrs {
            let _ = self.dereg_mr(MrId(m));
        }
        let ahs: alloc::vec::Vec<u32> = self.ahs.ids().collect();
        for a in ahs {
            self.ahs.remove(a);
        }
        let pds: alloc::vec::Vec<u32> = self.pds.ids().collect();
        for p in pds {
            if let Some(pd) = self.pds.remove(p) {
                self.dev.pd_free(pd.pdn);
            }
        }
        for c in self.counters.iter_mut() {
            if let Some(i) = c.take() {
                self.dev.counter_free(i);
            }
        }
        self.roce_remove();
        if let Some(id) = self.intf.take() {
            self.dev.unregister_interface(id);
        }
        if let Some(u) = self.priv_uar.take() {
            self.dev.uar_free(u);
            self.dev.pd_free(self.priv_pdn);
        }
    }

    /// The device name (`mlx4_0`).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The mlx4_core device.
    pub fn core(&self) -> &Dev {
        &self.dev
    }
    /// The mlx4_core device, mutably (firmware commands of the console).
    pub fn core_mut(&mut self) -> &mut Dev {
        &mut self.dev
    }
    /// Node GUID read at add time.
    pub fn node_guid(&self) -> u64 {
        self.node_guid
    }
    /// The node description (64 bytes, NUL padded).
    pub fn node_desc(&self) -> &[u8; 64] {
        &self.node_desc
    }
    /// Ports.
    pub fn num_ports(&self) -> u8 {
        self.dev.caps().num_ports
    }
    /// True once a catastrophic error was seen.
    pub fn is_fatal(&self) -> bool {
        self.fatal
    }
    /// The UAR page of kernel QPs and CQs.
    pub(crate) fn uar_page(&self) -> Result<Bar> {
        self.priv_uar
            .as_ref()
            .and_then(|u| u.map.slice(0, mlx4_hw::doorbell::UAR_PAGE_SIZE))
            .ok_or(Error::Fatal)
    }

    /// One pass of progress: mlx4_core's EQs and catastrophic-error buffer,
    /// then its events as ib events, handed to `f` (Linux: `mlx4_ib_event`,
    /// the CQ and QP event callbacks).
    pub fn poll(&mut self, mut f: impl FnMut(IbEvent)) -> usize {
        let n = self.dev.poll();
        loop {
            let Some(ev) = self.events.lock().pop_front() else {
                break;
            };
            if let Some(e) = self.translate(ev) {
                f(e);
            }
        }
        n
    }

    fn translate(&mut self, ev: Event) -> Option<IbEvent> {
        Some(match ev {
            Event::CatastrophicError => {
                self.fatal = true;
                IbEvent::DeviceFatal
            }
            Event::PortUp { port } => {
                self.roce_link_event(port, true);
                IbEvent::PortActive(port)
            }
            Event::PortDown { port } => {
                self.roce_link_event(port, false);
                IbEvent::PortErr(port)
            }
            Event::PortMgmtChange { port, subtype, raw } => match subtype {
                0x15 => {
                    // PORT_INFO: changed_attr at 0x0c.
                    let changed = u32::from_be_bytes([raw[12], raw[13], raw[14], raw[15]]);
                    if changed & (1 << 3) != 0 {
                        IbEvent::ClientReregister(port)
                    } else if changed & (1 << 2) != 0 {
                        IbEvent::LidChange(port)
                    } else if changed & ((1 << 0) | (1 << 4)) != 0 {
                        IbEvent::SmChange(port)
                    } else {
                        IbEvent::GidChange(port)
                    }
                }
                0x16 => IbEvent::PkeyChange(port),
                0x14 => IbEvent::GidChange(port),
                _ => return None,
            },
            Event::CqCompletion { cqn } => IbEvent::CqComp(self.cq_by_cqn(cqn)?),
            Event::CqError { cqn, syndrome } => {
                warn!(
                    "{}: CQ error event on CQ {cqn:06x}, syndrome {syndrome}",
                    self.name
                );
                IbEvent::CqErr(self.cq_by_cqn(cqn)?)
            }
            Event::Qp { qpn, event_type } => {
                IbEvent::Qp(crate::QpId(self.qps.lookup(qpn)?), event_type)
            }
            Event::Srq { srqn, event_type } => {
                let id = self
                    .srqs
                    .ids()
                    .find(|&i| self.srqs.get(i).is_some_and(|s| s.srqn() == srqn))?;
                IbEvent::Srq(SrqId(id), event_type)
            }
        })
    }

    fn cq_by_cqn(&self, cqn: u32) -> Option<CqId> {
        self.cqs
            .ids()
            .find(|&i| self.cqs.get(i).is_some_and(|c| c.cqn == cqn))
            .map(CqId)
    }

    // ---------------------------------------------------------------- queries

    /// Linux `mlx4_ib_query_device`.
    pub fn query_device(&mut self) -> Result<DeviceAttr> {
        let n: NodeInfo = mad::query_node_info(&mut self.dev)?;
        let c = self.dev.caps();
        Ok(DeviceAttr {
            fw_ver: c.fw_ver,
            node_guid: self.node_guid,
            sys_image_guid: n.sys_image_guid,
            max_mr_size: !0,
            page_size_cap: c.page_size_cap,
            vendor_id: n.vendor_id,
            vendor_part_id: n.device_id,
            hw_ver: n.revision,
            max_qp: c.num_qps.saturating_sub(c.reserved_qps),
            max_qp_wr: c.max_wqes.saturating_sub(mlx4_hw::wqe::SQ_MAX_SPARE),
            max_sge: c.max_sq_sg.min(c.max_rq_sg),
            max_cq: c.num_cqs.saturating_sub(c.reserved_cqs),
            max_cqe: c.max_cqes,
            max_mr: c.num_mpts.saturating_sub(c.reserved_mrws),
            max_pd: c.num_pds.saturating_sub(c.reserved_pds),
            max_qp_rd_atom: c.max_qp_dest_rdma,
            max_qp_init_rd_atom: c.max_qp_init_rdma,
            max_srq: c.num_srqs.saturating_sub(c.reserved_srqs),
            max_srq_wr: c.max_srq_wqes.saturating_sub(1),
            max_srq_sge: c.max_srq_sge,
            max_pkeys: c.port[1].pkey_table_len,
            local_ca_ack_delay: c.local_ca_ack_delay,
            phys_port_cnt: c.num_ports,
        })
    }

    fn check_port(&self, port: u8) -> Result<()> {
        if port == 0 || port > self.num_ports() {
            return Err(Error::Inval("no such port"));
        }
        Ok(())
    }

    /// Linux `mlx4_ib_query_port`: `ib_link_query_port` on an InfiniBand
    /// port, `eth_link_query_port` on an Ethernet one.
    pub fn query_port(&mut self, port: u8) -> Result<PortAttr> {
        self.check_port(port)?;
        if self.is_eth(port) {
            return self.eth_link_query_port(port);
        }
        mad::query_port(&mut self.dev, port)
    }

    /// Linux `mlx4_ib_modify_port`: the capability mask as the port has it,
    /// plus `set` and minus `clr` (an SM's IsSM), written with SET_PORT;
    /// an Ethernet port has none and succeeds without a command.
    pub fn modify_port(
        &mut self,
        port: u8,
        set: u32,
        clr: u32,
        reset_qkey_cntr: bool,
    ) -> Result<()> {
        self.check_port(port)?;
        if self.dev.caps().port[usize::from(port)].port_type == mlx4_core::PortType::Eth {
            return Ok(());
        }
        let attr = mad::query_port(&mut self.dev, port)?;
        let cap_mask = (attr.port_cap_flags | set) & !clr;
        self.dev
            .set_port_cap_mask(port, cap_mask, reset_qkey_cntr)
            .map_err(Error::from)
    }

    /// Linux `mlx4_ib_query_gid`.
    pub fn query_gid(&mut self, port: u8, index: u32) -> Result<[u8; 16]> {
        self.check_port(port)?;
        if self.is_eth(port) {
            return self.roce_query_gid(port, index);
        }
        if index >= self.dev.caps().port[usize::from(port)].gid_table_len {
            return Err(Error::Inval("GID index beyond the table"));
        }
        mad::query_gid(&mut self.dev, port, index)
    }

    /// The port's GID table from index 0, `len` entries (at most the
    /// table's length), each handed to `put` with its index; read in
    /// blocks: see [`mad::query_gid_table`].
    pub fn query_gid_table(
        &mut self,
        port: u8,
        len: usize,
        mut put: impl FnMut(usize, [u8; 16]),
    ) -> Result<()> {
        self.check_port(port)?;
        if self.is_eth(port) {
            for i in 0..len.min(crate::roce::ROCE_MAX_GIDS) {
                put(i, self.roce_query_gid(port, i as u32)?);
            }
            return Ok(());
        }
        if len as u64 > u64::from(self.dev.caps().port[usize::from(port)].gid_table_len) {
            return Err(Error::Inval("GID table read beyond the table"));
        }
        mad::query_gid_table(&mut self.dev, port, len, put)
    }

    /// The port's P_Key table from index 0 into `out`, in blocks of 32.
    pub fn query_pkey_table(&mut self, port: u8, out: &mut [u16]) -> Result<()> {
        self.check_port(port)?;
        if self.is_eth(port) {
            // One P_Key, the default (Linux `eth_link_query_port`'s table).
            out.fill(0);
            if let Some(p) = out.first_mut() {
                *p = 0xffff;
            }
            return Ok(());
        }
        if out.len() as u64 > u64::from(self.dev.caps().port[usize::from(port)].pkey_table_len) {
            return Err(Error::Inval("P_Key table read beyond the table"));
        }
        mad::query_pkey_table(&mut self.dev, port, out)
    }

    /// Linux `mlx4_ib_query_pkey`.
    pub fn query_pkey(&mut self, port: u8, index: u16) -> Result<u16> {
        self.check_port(port)?;
        if self.is_eth(port) {
            return if index == 0 {
                Ok(0xffff)
            } else {
                Err(Error::Inval("P_Key index beyond the table"))
            };
        }
        if u32::from(index) >= self.dev.caps().port[usize::from(port)].pkey_table_len {
            return Err(Error::Inval("P_Key index beyond the table"));
        }
        mad::query_pkey(&mut self.dev, port, index)
    }

    /// Linux `mlx4_ib_process_mad` (see [`mad::process_mad`]).
    pub fn process_mad(
        &mut self,
        mad_flags: u8,
        port: u8,
        in_wc: Option<&Wc>,
        in_grh: Option<&[u8; 40]>,
        in_mad: &[u8; mlx4_hw::port::MAD_SIZE],
    ) -> Result<mad::ProcessMad> {
        self.check_port(port)?;
        let desc = self.node_desc;
        Ok(mad::process_mad(
            &mut self.dev,
            mad_flags,
            port,
            in_wc,
            in_grh,
            in_mad,
            &desc,
        ))
    }

    // ---------------------------------------------------------------- PD

    /// Linux `mlx4_ib_alloc_pd`.
    pub fn alloc_pd(&mut self) -> Result<PdId> {
        let pdn = self.dev.pd_alloc()?;
        Ok(PdId(self.pds.insert(Mlx4IbPd { pdn })))
    }

    /// Linux `mlx4_ib_dealloc_pd`; refused while an object uses the PD.
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<()> {
        self.pds.get(pd.0).ok_or(Error::NoObject)?;
        let used = self
            .qps
            .slab
            .ids()
            .any(|q| self.qps.slab.get(q).is_some_and(|q| q.pd == pd))
            || self
                .mrs
                .ids()
                .any(|m| self.mrs.get(m).is_some_and(|m| m.pd == pd));
        if used {
            return Err(Error::Busy);
        }
        if let Some(p) = self.pds.remove(pd.0) {
            self.dev.pd_free(p.pdn);
        }
        Ok(())
    }

    /// The PD number of a handle.
    pub fn pdn(&self, pd: PdId) -> Result<u32> {
        Ok(self.pds.get(pd.0).ok_or(Error::NoObject)?.pdn)
    }

    // ---------------------------------------------------------------- MR

    /// Linux `mlx4_ib_get_dma_mr`: an MR without translation covering all
    /// memory, for local access only (this port refuses remote rights on
    /// it: see the module doc of [`crate::mr`]).
    pub fn get_dma_mr(&mut self, pd: PdId, acc: AccessFlags) -> Result<MrId> {
        if acc.intersects(REMOTE_ACCESS) {
            return Err(Error::Inval(
                "a DMA MR with remote access would expose all memory",
            ));
        }
        let pdn = self.pdn(pd)?;
        let mut mr = self.dev.mr_alloc(pdn, 0, !0, convert_access(acc), 0, 0)?;
        if let Err(e) = self.dev.mr_enable(&mut mr) {
            let _ = self.dev.mr_free(mr);
            return Err(e.into());
        }
        Ok(MrId(self.mrs.insert(Mlx4IbMr { mmr: mr, pd })))
    }

    /// Registration of an arbitrary page list (Linux `mlx4_ib_reg_phys_mr`
    /// shape): `length` bytes at I/O virtual address `iova`, backed by
    /// `pages` (bus addresses of `2^page_shift`-byte pages, in order).
    pub fn reg_mr_pages(
        &mut self,
        pd: PdId,
        iova: u64,
        length: u64,
        page_shift: u32,
        pages: &[u64],
        acc: AccessFlags,
    ) -> Result<MrId> {
        let pdn = self.pdn(pd)?;
        if pages.is_empty() || !(12..=30).contains(&page_shift) || length == 0 {
            return Err(Error::Inval("empty or oddly paged memory region"));
        }
        let page = 1u64 << page_shift;
        let first = iova & (page - 1);
        let need = (first + length).div_ceil(page);
        if need != pages.len() as u64 {
            return Err(Error::Inval("page list does not cover the region"));
        }
        if pages.iter().any(|p| p & (page - 1) != 0) {
            return Err(Error::Inval("unaligned page in the page list"));
        }
        let npages = u32::try_from(pages.len()).map_err(|_| Error::Inval("too many pages"))?;
        let mut mr =
            self.dev
                .mr_alloc(pdn, iova, length, convert_access(acc), npages, page_shift)?;
        let r = self
            .dev
            .write_mtt(&mr.mtt, 0, pages)
            .and_then(|()| self.dev.mr_enable(&mut mr));
        if let Err(e) = r {
            let _ = self.dev.mr_free(mr);
            return Err(e.into());
        }
        Ok(MrId(self.mrs.insert(Mlx4IbMr { mmr: mr, pd })))
    }

    /// An MR by handle.
    pub fn mr(&self, mr: MrId) -> Result<&Mlx4IbMr> {
        self.mrs.get(mr.0).ok_or(Error::NoObject)
    }

    /// Linux `mlx4_ib_dereg_mr`.
    pub fn dereg_mr(&mut self, mr: MrId) -> Result<()> {
        let m = self.mrs.remove(mr.0).ok_or(Error::NoObject)?;
        self.dev.mr_free(m.mmr)?;
        Ok(())
    }

    // ---------------------------------------------------------------- AH

    /// Linux `mlx4_ib_create_ah`.
    pub fn create_ah(&mut self, pd: PdId, attr: &AhAttr) -> Result<AhId> {
        let pdn = self.pdn(pd)?;
        let ah = if self.is_eth(attr.port_num) {
            let rp = self
                .roce_port(attr.port_num)
                .ok_or(Error::Inval("not an Ethernet port"))?;
            crate::ah::create_iboe_ah(self.dev.caps(), rp, pdn, attr)?
        } else {
            create_ib_ah(self.dev.caps(), pdn, attr)?
        };
        Ok(AhId(self.ahs.insert(ah)))
    }

    /// Linux `mlx4_ib_query_ah`.
    pub fn query_ah(&self, ah: AhId) -> Result<AhAttr> {
        Ok(*self.ahs.get(ah.0).ok_or(Error::NoObject)?.attr())
    }

    /// Linux `mlx4_ib_destroy_ah`.
    pub fn destroy_ah(&mut self, ah: AhId) -> Result<()> {
        self.ahs.remove(ah.0).map(drop).ok_or(Error::NoObject)
    }

    /// The address handles (special-QP senders resolve WRs through them).
    pub fn ahs(&self) -> &Slab<Mlx4IbAh> {
        &self.ahs
    }

    // ---------------------------------------------------------------- CQ

    /// Linux `mlx4_ib_create_cq` (kernel): at least `entries` entries,
    /// completion events to `vector`.
    pub fn create_cq(&mut self, entries: u32, vector: u32) -> Result<CqId> {
        if entries < 1 || entries > self.dev.caps().max_cqes {
            return Err(Error::Inval("CQ size out of range"));
        }
        let nent = (entries + 1).next_power_of_two();
        let uar = self.uar_page()?;
        let buf = crate::cq::alloc_cq_buf(self.dev.dma_pool(), nent)?;
        let db = self.dbs.alloc(self.dev.dma_pool(), 1)?;
        let dbaddr = db.dma();
        let mut cq = Mlx4IbCq::assemble(nent, buf, uar, db, 0);
        let mtt = match write_buf_mtt(&mut self.dev, &cq.buf) {
            Ok(m) => m,
            Err(e) => {
                self.dbs.free(cq.db);
                return Err(e);
            }
        };
        match self.dev.cq_alloc(
            nent,
            &mtt,
            self.priv_uar.as_ref().ok_or(Error::Fatal)?,
            dbaddr,
            vector,
            false,
            false,
        ) {
            Ok(mcq) => {
                cq.cqn = mcq.cqn;
                cq.hw = Some(CqHw { mcq, mtt });
                Ok(CqId(self.cqs.insert(cq)))
            }
            Err(e) => {
                self.dev.mtt_cleanup(&mtt);
                self.dbs.free(cq.db);
                Err(e.into())
            }
        }
    }

    /// Linux `mlx4_ib_destroy_cq`; refused while a QP uses the CQ.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<()> {
        self.cqs.get(cq.0).ok_or(Error::NoObject)?;
        let used = self.qps.slab.ids().any(|q| {
            self.qps
                .slab
                .get(q)
                .is_some_and(|q| q.send_cq == cq || q.recv_cq == cq)
        });
        if used {
            return Err(Error::Busy);
        }
        let c = self.cqs.remove(cq.0).ok_or(Error::NoObject)?;
        let mut r = Ok(());
        if let Some(hw) = c.hw {
            r = self.dev.cq_free(hw.mcq).map_err(Error::from);
            self.dev.mtt_cleanup(&hw.mtt);
        }
        self.dbs.free(c.db);
        r
    }

    /// A CQ by handle.
    pub fn cq(&self, cq: CqId) -> Result<&Mlx4IbCq> {
        self.cqs.get(cq.0).ok_or(Error::NoObject)
    }

    /// Linux `mlx4_ib_poll_cq`: fills `wc` with up to `wc.len()` completions.
    #[inline]
    pub fn poll_cq(&mut self, cq: CqId, wc: &mut [Wc]) -> Result<usize> {
        let c = self.cqs.get_mut(cq.0).ok_or(Error::NoObject)?;
        c.poll(&mut self.qps, &mut self.srqs, wc)
    }

    /// Linux `mlx4_ib_arm_cq`: an event for the next (or next solicited)
    /// completion, reported by [`Mlx4IbDev::poll`] as [`IbEvent::CqComp`].
    pub fn req_notify_cq(&mut self, cq: CqId, solicited: bool) -> Result<()> {
        let c = self.cqs.get(cq.0).ok_or(Error::NoObject)?;
        let sn = self.dev.cq_arm_sn(c.cqn).unwrap_or(1);
        c.req_notify(solicited, sn);
        Ok(())
    }

    // ---------------------------------------------------------------- SRQ

    /// Linux `mlx4_ib_create_srq` (kernel, basic SRQ): `attr` is updated to
    /// what was granted.
    pub fn create_srq(&mut self, pd: PdId, attr: &mut SrqAttr) -> Result<SrqId> {
        let pdn = self.pdn(pd)?;
        let (max, max_gs, shift) = srq_size(self.dev.caps(), attr.max_wr, attr.max_sge)?;
        let buf = crate::srq::alloc_srq_buf(self.dev.dma_pool(), max, shift)?;
        let db = self.dbs.alloc(self.dev.dma_pool(), 0)?;
        let dbaddr = db.dma();
        let mut srq = Mlx4IbSrq::assemble(buf, max, max_gs, shift, db);
        let mtt = match write_buf_mtt(&mut self.dev, &srq.buf) {
            Ok(m) => m,
            Err(e) => {
                self.dbs.free(srq.db);
                return Err(e);
            }
        };
        let xrcd = self.dev.caps().reserved_xrcds as u16;
        match self.dev.srq_alloc(pdn, 0, xrcd, &mtt, dbaddr, max, shift) {
            Ok(msrq) => {
                srq.hw = Some(SrqHw { msrq, mtt });
                attr.max_wr = max - 1;
                attr.max_sge = max_gs;
                Ok(SrqId(self.srqs.insert(srq)))
            }
            Err(e) => {
                self.dev.mtt_cleanup(&mtt);
                self.dbs.free(srq.db);
                Err(e.into())
            }
        }
    }

    /// Linux `mlx4_ib_modify_srq`: only the limit can change (resizing is
    /// refused, as Linux mlx4 does).
    pub fn modify_srq(&mut self, srq: SrqId, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        if mask.contains(SrqAttrMask::MAX_WR) {
            return Err(Error::Inval("SRQ resize is not supported"));
        }
        let s = self.srqs.get_mut(srq.0).ok_or(Error::NoObject)?;
        if mask.contains(SrqAttrMask::LIMIT) {
            if attr.srq_limit >= s.max {
                return Err(Error::Inval("SRQ limit not below its size"));
            }
            let hw = s.hw.as_ref().ok_or(Error::NoObject)?;
            self.dev.srq_arm(&hw.msrq, attr.srq_limit)?;
            s.srq_limit = attr.srq_limit;
        }
        Ok(())
    }

    /// Linux `mlx4_ib_query_srq`.
    pub fn query_srq(&mut self, srq: SrqId) -> Result<SrqAttr> {
        let s = self.srqs.get(srq.0).ok_or(Error::NoObject)?;
        let hw = s.hw.as_ref().ok_or(Error::NoObject)?;
        let limit = self.dev.srq_query(&hw.msrq)?;
        Ok(SrqAttr {
            max_wr: s.max - 1,
            max_sge: s.max_gs,
            srq_limit: limit,
        })
    }

    /// Linux `mlx4_ib_post_srq_recv`.
    pub fn post_srq_recv(
        &mut self,
        srq: SrqId,
        wrs: &[crate::verbs::RecvWr<'_>],
    ) -> core::result::Result<(), crate::qp::PostError> {
        match self.srqs.get_mut(srq.0) {
            Some(s) => s.post_recv(wrs),
            None => Err(crate::qp::PostError {
                err: crate::qp::PostFault::NoObject,
                bad_wr: 0,
            }),
        }
    }

    /// Linux `mlx4_ib_destroy_srq`; refused while a QP uses it.
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<()> {
        self.srqs.get(srq.0).ok_or(Error::NoObject)?;
        if self
            .qps
            .slab
            .ids()
            .any(|q| self.qps.slab.get(q).is_some_and(|q| q.srq == Some(srq)))
        {
            return Err(Error::Busy);
        }
        let s = self.srqs.remove(srq.0).ok_or(Error::NoObject)?;
        let mut r = Ok(());
        if let Some(hw) = s.hw {
            r = self.dev.srq_free(hw.msrq).map_err(Error::from);
            self.dev.mtt_cleanup(&hw.mtt);
        }
        self.dbs.free(s.db);
        r
    }

    // ------------------------------------------------------------- multicast

    /// Linux `mlx4_ib_mcg_attach`: the UD QP `id` receives the datagrams of
    /// multicast group `gid` (`mlx4_multicast_attach` over the MCG table,
    /// B0/A0 steering, with the MGM block-loopback bit when the QP was
    /// created with `IB_QP_CREATE_BLOCK_MULTICAST_LOOPBACK`); `lid` is not
    /// used (the card steers by MGID). Attaching twice is not an error.
    #[doc(alias = "mlx4_ib_mcg_attach")]
    pub fn mcg_attach(&mut self, id: crate::QpId, gid: &[u8; 16], lid: u16) -> Result<()> {
        let _ = lid;
        if self.fatal {
            return Err(Error::Fatal);
        }
        let qp = self.qps.get(id).ok_or(Error::NoObject)?;
        if qp.qp_type != crate::verbs::QpType::Ud {
            return Err(Error::Inval("multicast attach is for UD QPs only"));
        }
        let hw = qp.hw.as_ref().ok_or(Error::NoObject)?;
        let block = qp.block_mcast_loopback;
        self.dev.multicast_attach(&hw.mqp, gid, block)?;
        if let Some(qp) = self.qps.get_mut(id)
            && !qp.mcast_gids.contains(gid)
        {
            qp.mcast_gids.push(*gid);
        }
        Ok(())
    }

    /// Linux `mlx4_ib_mcg_detach`: undoes [`Mlx4IbDev::mcg_attach`].
    #[doc(alias = "mlx4_ib_mcg_detach")]
    pub fn mcg_detach(&mut self, id: crate::QpId, gid: &[u8; 16], lid: u16) -> Result<()> {
        let _ = lid;
        let qp = self.qps.get(id).ok_or(Error::NoObject)?;
        if qp.qp_type != crate::verbs::QpType::Ud {
            return Err(Error::Inval("multicast detach is for UD QPs only"));
        }
        let hw = qp.hw.as_ref().ok_or(Error::NoObject)?;
        self.dev.multicast_detach(&hw.mqp, gid)?;
        if let Some(qp) = self.qps.get_mut(id) {
            match qp.mcast_gids.iter().position(|g| g == gid) {
                Some(i) => {
                    qp.mcast_gids.swap_remove(i);
                }
                None => warn!("{}: could not find mgid entry", self.name),
            }
        }
        Ok(())
    }

    /// The MGIDs QP `id` is attached to.
    pub fn mcg_attached(&self, id: crate::QpId) -> Result<&[[u8; 16]]> {
        Ok(&self.qps.get(id).ok_or(Error::NoObject)?.mcast_gids)
    }

    /// Objects alive: (PDs, CQs, QPs, SRQs, MRs, AHs, doorbell records).
    pub fn live_objects(&self) -> [usize; 7] {
        [
            self.pds.len(),
            self.cqs.len(),
            self.qps.len(),
            self.srqs.len(),
            self.mrs.len(),
            self.ahs.len(),
            self.dbs.in_use(),
        ]
    }
}
