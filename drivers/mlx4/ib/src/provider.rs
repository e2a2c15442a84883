//! mlx4_ib as an ib_core provider: the `struct ib_device` ops that `mlx4_ib_add` fills in (Linux `main.c`).
//!
//! With them `build_mlx_header` on ib_core's `ud_header` (Linux `qp.c`), and
//! the events of `mlx4_ib_event` and of MAD snooping delivered through the
//! progress function. Left out: user contexts, memory windows, FMRs and port
//! modification.

use alloc::string::String;

use ib_core::error::{Error as IbError, PostError as IbPostError, Result as IbResult};
use ib_core::mad::{Grh, Mad, MadResult};
use ib_core::ud_header;
use ib_core::verbs::{
    self as v, Ah, Cq, CqInitAttr, CqNotifyFlags, DeviceAttr, DeviceCapFlags, DeviceInfo, Event,
    EventElement, EventType, IbDevice, MrPages, NodeType, Pd, PortAttr, PortCapFlags, PortState,
    Qp, QpAttr, QpAttrMask, QpCap, QpInitAttr as IbQpInitAttr, RecvWr, Srq, SrqAttr, SrqAttrMask,
    SrqInitAttr, Wc, modify_qp_is_ok,
};
use mlx4_core::Dev;
use mlx4_hw::wqe::av;

use crate::main::{IbEvent, Mlx4IbDev};
use crate::qp::{MlxFields, MlxHeader, MlxSendInfo};
use crate::table::{AhId, CqId, MrId, PdId, QpId, SrqId};
use crate::verbs::{QpInitAttr, SendWr, WrOpcode};
use crate::{Error, Result};

/// mlx4_ib's error as ib_core's (the same errno).
pub fn to_ib_error(e: Error) -> IbError {
    match e {
        Error::Inval(s) => IbError::Invalid(s),
        Error::QueueFull | Error::NoMem => IbError::NoMem,
        Error::NoObject => IbError::Invalid("no such object"),
        Error::Busy => IbError::Busy,
        Error::Unsupported(_) => IbError::NotSupported,
        Error::MadStatus(s) => IbError::MadStatus(s),
        Error::Fatal => IbError::Errno(5),
        Error::Core(c) => IbError::Errno(c.to_errno().abs()),
    }
}

fn ib<T>(r: Result<T>) -> IbResult<T> {
    r.map_err(to_ib_error)
}

fn post_err(e: crate::qp::PostError) -> IbPostError {
    IbPostError {
        index: e.bad_wr,
        error: to_ib_error(e.error()),
    }
}

fn mlx_post_err(e: crate::qp::MlxPostError) -> IbPostError {
    IbPostError {
        index: e.bad_wr,
        error: to_ib_error(e.err),
    }
}

/// What `build_mlx_header` reads of ib_core's cache for one port: its P_Key
/// and GID tables, copied when the core refreshes the cache
/// ([`IbDevice::cache_updated`]).
#[derive(Debug, Clone, Default)]
pub struct SqpCache {
    /// P_Key table.
    pub pkeys: alloc::vec::Vec<u16>,
    /// GID table.
    pub gids: alloc::vec::Vec<[u8; 16]>,
    /// Refreshes seen.
    pub updates: u32,
}

/// The UD header builder of QP0/QP1 sends (Linux `build_mlx_header`): the
/// LRH/GRH/BTH/DETH of ib_core's `ud_header`, with the P_Key and source GID
/// from ib_core's cache as Linux reads them (`ib_get_cached_pkey`,
/// `ib_get_cached_gid`). Before the core has filled its cache (the driver
/// used without ib_core) they are asked of the SMA through MAD_IFC.
struct UdHeaderBuilder<'a> {
    dev: &'a mut Dev,
    cache: Option<&'a SqpCache>,
    /// The port's RoCE state when it is an Ethernet port.
    roce: Option<&'a crate::roce::RocePort>,
}

impl UdHeaderBuilder<'_> {
    fn pkey(&mut self, port: u8, index: u16) -> Result<u16> {
        match self.cache {
            Some(c) if !c.pkeys.is_empty() => c
                .pkeys
                .get(usize::from(index))
                .copied()
                .ok_or(Error::Inval("P_Key index beyond the cached table")),
            _ => crate::mad::query_pkey(self.dev, port, index),
        }
    }

    fn gid(&mut self, port: u8, index: u8) -> Result<[u8; 16]> {
        if let Some(r) = self.roce {
            return r
                .gids
                .get(usize::from(index))
                .copied()
                .ok_or(Error::Inval("source GID index not in the RoCE GID table"));
        }
        match self.cache {
            Some(c) if !c.gids.is_empty() => c
                .gids
                .get(usize::from(index))
                .copied()
                .ok_or(Error::Inval("GID index beyond the cached table")),
            _ => crate::mad::query_gid(self.dev, port, u32::from(index)),
        }
    }
}

impl MlxHeader for UdHeaderBuilder<'_> {
    fn build(&mut self, qp: &MlxSendInfo, wr: &SendWr<'_>, out: &mut [u8]) -> Result<MlxFields> {
        let crate::verbs::WrDetail::Ud {
            remote_qpn,
            remote_qkey,
            pkey_index,
            ..
        } = wr.wr
        else {
            return Err(Error::Inval("QP0/QP1 sends need an address handle"));
        };
        let payload: usize = wr.sg_list.iter().map(|s| s.length as usize).sum();
        let a = &qp.av;
        let eth = match (self.roce.map(|r| r.mac), qp.eth) {
            (Some(smac), Some(e)) => Some((smac, e)),
            (None, None) => None,
            _ => return Err(Error::Inval("address handle of another link layer")),
        };
        // On Ethernet the GRH is always there (the AH was refused without).
        let is_grh = eth.is_some() || a.g_slid & av::GRH != 0;
        let imm = wr.opcode == WrOpcode::SendWithImm;
        let mut h = ud_header::init(payload, eth.is_none(), is_grh, imm)
            .map_err(|_| Error::Inval("MAD payload too large for a UD header"))?;
        h.lrh.service_level = (a.sl_tclass_flowlabel >> 28) as u8;
        h.lrh.destination_lid = a.dlid;
        h.lrh.source_lid = u16::from(a.g_slid & 0x7f);
        let mut mlx_eth = None;
        if let Some((smac, (dmac, vlan))) = eth {
            // build_mlx_header, is_eth: the SL (bits 31:29) as the 802.1Q
            // priority, the Ethernet header instead of the LRH.
            h.lrh.service_level = 0;
            let pcp = ((a.sl_tclass_flowlabel >> 29) as u16) << 13;
            h.eth = Some(ud_header::EthHeader {
                dmac,
                smac,
                vlan_tag: (vlan < 0x1000).then_some(vlan | pcp),
                ether_type: ud_header::ETH_P_IBOE,
            });
            mlx_eth = Some(crate::qp::MlxEth {
                dmac,
                pcp,
                loopback: dmac == smac,
            });
        }
        if is_grh {
            h.grh.traffic_class = (a.sl_tclass_flowlabel >> 20) as u8;
            h.grh.flow_label = a.sl_tclass_flowlabel & 0xf_ffff;
            h.grh.hop_limit = a.hop_limit;
            let port = (a.port_pd >> 24) as u8 & 0x7f;
            h.grh.source_gid = v::Gid(self.gid(port, a.gid_index)?);
            h.grh.destination_gid = v::Gid(a.dgid);
        }
        if imm {
            h.immediate_data = wr.imm_data;
        }
        h.lrh.virtual_lane = if qp.is_qp0 { 15 } else { 0 };
        if h.lrh.destination_lid == v::IB_LID_PERMISSIVE {
            h.lrh.source_lid = v::IB_LID_PERMISSIVE;
        }
        h.bth.solicited_event = u8::from(wr.send_flags.contains(v::SendFlags::SOLICITED));
        let pki = if qp.is_qp0 {
            qp.sqp.pkey_index
        } else {
            pkey_index
        };
        h.bth.pkey = self.pkey(qp.port, pki)?;
        h.bth.destination_qpn = remote_qpn & 0xff_ffff;
        h.bth.psn = qp.sqp.send_psn & 0xff_ffff;
        h.deth.qkey = if remote_qkey & v::IB_QP_SET_QKEY != 0 {
            qp.sqp.qkey
        } else {
            remote_qkey
        };
        h.deth.source_qpn = u32::from(!qp.is_qp0);
        let len = h
            .pack(out)
            .map_err(|_| Error::Inval("UD header does not fit"))?;
        Ok(MlxFields {
            len,
            dlid: h.lrh.destination_lid,
            sl: h.lrh.service_level,
            eth: mlx_eth,
        })
    }
}

impl Mlx4IbDev {
    /// The ib_core events waiting for the next `poll_events`.
    fn ib_event(&mut self, e: IbEvent) -> Option<Event> {
        let port = |event, p| Some(Event::port(event, p));
        match e {
            IbEvent::PortActive(p) => {
                log::debug!("{}: port {p} changed to ACTIVE", self.name);
                port(EventType::PortActive, p)
            }
            IbEvent::PortErr(p) => {
                log::debug!("{}: port {p} changed to DOWN", self.name);
                port(EventType::PortErr, p)
            }
            IbEvent::LidChange(p) => port(EventType::LidChange, p),
            IbEvent::PkeyChange(p) => port(EventType::PkeyChange, p),
            IbEvent::GidChange(p) => port(EventType::GidChange, p),
            IbEvent::ClientReregister(p) => port(EventType::ClientReregister, p),
            IbEvent::SmChange(p) => port(EventType::SmChange, p),
            IbEvent::DeviceFatal => Some(Event {
                event: EventType::DeviceFatal,
                element: EventElement::Device,
            }),
            IbEvent::CqErr(c) => Some(Event {
                event: EventType::CqErr,
                element: EventElement::Cq(Cq(c.0)),
            }),
            IbEvent::Qp(q, t) => {
                let qp = self.qps.get(q)?;
                let event = match t {
                    0x01 => EventType::PathMig,
                    0x02 => EventType::CommEst,
                    0x03 => EventType::SqDrained,
                    0x13 => EventType::QpLastWqeReached,
                    0x05 => EventType::QpFatal,
                    0x07 => EventType::PathMigErr,
                    0x10 => EventType::QpReqErr,
                    0x11 => EventType::QpAccessErr,
                    _ => return None,
                };
                Some(Event {
                    event,
                    element: EventElement::Qp(Qp {
                        handle: q.0,
                        qp_num: qp.qp_num(),
                    }),
                })
            }
            IbEvent::Srq(s, t) => Some(Event {
                event: if t == 0x14 {
                    EventType::SrqLimitReached
                } else {
                    EventType::SrqErr
                },
                element: EventElement::Srq(Srq(s.0)),
            }),
            // Completion events need no handler: every CQ is busy-polled.
            IbEvent::CqComp(_) => None,
        }
    }
}

fn qp_id(qp: Qp) -> QpId {
    QpId(qp.handle)
}

impl IbDevice for Mlx4IbDev {
    fn info(&self) -> DeviceInfo {
        let end = self.node_desc.iter().position(|&b| b == 0).unwrap_or(64);
        let node_desc = String::from_utf8_lossy(&self.node_desc[..end]).into_owned();
        DeviceInfo {
            name: self.name.clone(),
            node_type: NodeType::Ca,
            phys_port_cnt: self.num_ports(),
            node_guid: self.node_guid,
            node_desc,
            local_dma_lkey: Some(self.dev.caps().reserved_lkey),
            num_comp_vectors: self.dev.caps().num_comp_vectors.max(1),
        }
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn core::any::Any> {
        Some(self)
    }

    fn dma_pool(&self) -> hal::DmaPool {
        self.dev.dma_pool().clone()
    }

    fn poll_events(&mut self, event: &mut dyn FnMut(Event)) -> IbResult<()> {
        let mut got = alloc::vec::Vec::new();
        self.poll(|e| got.push(e));
        while let Some(e) = self.snooped.pop_front() {
            got.push(e);
        }
        for e in got {
            if let Some(ev) = self.ib_event(e) {
                event(ev);
            }
        }
        Ok(())
    }

    fn query_device(&mut self) -> IbResult<DeviceAttr> {
        let d = ib(Mlx4IbDev::query_device(self))?;
        let c = self.dev.caps();
        Ok(DeviceAttr {
            fw_ver: d.fw_ver,
            sys_image_guid: d.sys_image_guid,
            max_mr_size: d.max_mr_size,
            page_size_cap: u64::from(d.page_size_cap),
            vendor_id: d.vendor_id,
            vendor_part_id: u32::from(d.vendor_part_id),
            hw_ver: d.hw_ver,
            max_qp: d.max_qp,
            max_qp_wr: d.max_qp_wr,
            max_sge: d.max_sge,
            max_sge_rd: 0,
            max_cq: d.max_cq,
            max_cqe: d.max_cqe,
            max_mr: d.max_mr,
            max_pd: d.max_pd,
            max_qp_rd_atom: d.max_qp_rd_atom,
            max_res_rd_atom: d.max_qp_rd_atom * d.max_qp,
            max_qp_init_rd_atom: d.max_qp_init_rd_atom,
            atomic_cap: 1, // IB_ATOMIC_HCA
            masked_atomic_cap: 1,
            max_srq: d.max_srq,
            max_srq_wr: d.max_srq_wr,
            max_srq_sge: d.max_srq_sge,
            max_pkeys: d.max_pkeys as u16,
            local_ca_ack_delay: d.local_ca_ack_delay,
            max_mcast_grp: c.num_mgms + c.num_amgms,
            max_mcast_qp_attach: c.num_qp_per_mgm,
            max_total_mcast_qp_attach: (c.num_mgms + c.num_amgms).saturating_mul(c.num_qp_per_mgm),
            device_cap_flags: DeviceCapFlags::BLOCK_MULTICAST_LOOPBACK,
            ..Default::default()
        })
    }

    fn query_port(&mut self, port: u8) -> IbResult<PortAttr> {
        let a = ib(Mlx4IbDev::query_port(self, port))?;
        Ok(PortAttr {
            state: PortState::from_raw(a.state).unwrap_or(PortState::Nop),
            max_mtu: v::Mtu::from_raw(a.max_mtu).unwrap_or(v::Mtu::Mtu256),
            active_mtu: v::Mtu::from_raw(a.active_mtu).unwrap_or(v::Mtu::Mtu256),
            gid_tbl_len: a.gid_tbl_len,
            port_cap_flags: PortCapFlags(a.port_cap_flags),
            max_msg_sz: a.max_msg_sz,
            bad_pkey_cntr: u32::from(a.bad_pkey_cntr),
            qkey_viol_cntr: u32::from(a.qkey_viol_cntr),
            pkey_tbl_len: a.pkey_tbl_len as u16,
            lid: a.lid,
            sm_lid: a.sm_lid,
            lmc: a.lmc,
            max_vl_num: a.max_vl_num,
            sm_sl: a.sm_sl,
            subnet_timeout: a.subnet_timeout,
            init_type_reply: a.init_type_reply,
            active_width: a.active_width,
            active_speed: a.active_speed,
            phys_state: a.phys_state,
        })
    }

    fn modify_port(
        &mut self,
        port: u8,
        mask: v::PortModifyFlags,
        props: &v::PortModify,
    ) -> IbResult<()> {
        ib(Mlx4IbDev::modify_port(
            self,
            port,
            props.set_port_cap_mask,
            props.clr_port_cap_mask,
            mask.contains(v::PortModifyFlags::RESET_QKEY_CNTR),
        ))
    }

    fn get_link_layer(&self, port: u8) -> v::LinkLayer {
        if self.is_eth(port) {
            v::LinkLayer::Ethernet
        } else {
            v::LinkLayer::Infiniband
        }
    }

    fn query_gid(&mut self, port: u8, index: u32) -> IbResult<v::Gid> {
        ib(Mlx4IbDev::query_gid(self, port, index)).map(v::Gid)
    }

    fn query_pkey(&mut self, port: u8, index: u16) -> IbResult<u16> {
        ib(Mlx4IbDev::query_pkey(self, port, index))
    }

    fn query_gid_table(&mut self, port: u8, out: &mut [v::Gid]) -> IbResult<()> {
        let len = out.len();
        ib(Mlx4IbDev::query_gid_table(self, port, len, |i, g| {
            if let Some(slot) = out.get_mut(i) {
                slot.0 = g;
            }
        }))
    }

    fn query_pkey_table(&mut self, port: u8, out: &mut [u16]) -> IbResult<()> {
        ib(Mlx4IbDev::query_pkey_table(self, port, out))
    }

    fn alloc_pd(&mut self) -> IbResult<Pd> {
        ib(Mlx4IbDev::alloc_pd(self)).map(|p| Pd(p.0))
    }

    fn dealloc_pd(&mut self, pd: Pd) -> IbResult<()> {
        ib(Mlx4IbDev::dealloc_pd(self, PdId(pd.0)))
    }

    fn create_ah(&mut self, pd: Pd, attr: &v::AhAttr) -> IbResult<Ah> {
        ib(Mlx4IbDev::create_ah(self, PdId(pd.0), attr)).map(|a| Ah(a.0))
    }

    fn query_ah(&mut self, ah: Ah) -> IbResult<v::AhAttr> {
        ib(Mlx4IbDev::query_ah(self, AhId(ah.0)))
    }

    fn destroy_ah(&mut self, ah: Ah) -> IbResult<()> {
        ib(Mlx4IbDev::destroy_ah(self, AhId(ah.0)))
    }

    fn create_cq(&mut self, attr: &CqInitAttr) -> IbResult<(Cq, u32)> {
        let id = ib(Mlx4IbDev::create_cq(self, attr.cqe, attr.comp_vector))?;
        let cqe = self.cqs.get(id.0).map_or(0, |c| c.cqe());
        Ok((Cq(id.0), cqe))
    }

    fn destroy_cq(&mut self, cq: Cq) -> IbResult<()> {
        ib(Mlx4IbDev::destroy_cq(self, CqId(cq.0)))
    }

    fn poll_cq(&mut self, cq: Cq, wc: &mut [Wc]) -> IbResult<usize> {
        ib(Mlx4IbDev::poll_cq(self, CqId(cq.0), wc))
    }

    fn req_notify_cq(&mut self, cq: Cq, flags: CqNotifyFlags) -> IbResult<bool> {
        let sol = flags.contains(CqNotifyFlags::SOLICITED);
        ib(Mlx4IbDev::req_notify_cq(self, CqId(cq.0), sol)).map(|()| false)
    }

    fn create_qp(&mut self, pd: Pd, attr: &IbQpInitAttr) -> IbResult<(Qp, QpCap)> {
        let mut init = QpInitAttr {
            send_cq: CqId(attr.send_cq.0),
            recv_cq: CqId(attr.recv_cq.0),
            srq: attr.srq.map(|s| SrqId(s.0)),
            cap: attr.cap,
            sq_sig_type: attr.sq_sig_type,
            qp_type: attr.qp_type,
            create_flags: attr.create_flags,
            port_num: attr.port_num,
        };
        let id = ib(Mlx4IbDev::create_qp(self, PdId(pd.0), &mut init))?;
        let qp_num = self.qps.get(id).map_or(0, |q| q.qp_num());
        Ok((
            Qp {
                handle: id.0,
                qp_num,
            },
            init.cap,
        ))
    }

    fn modify_qp(&mut self, qp: Qp, attr: &QpAttr, mask: QpAttrMask) -> IbResult<()> {
        let q = self
            .qps
            .get(qp_id(qp))
            .ok_or(IbError::Invalid("no such QP"))?;
        let cur = if mask.contains(QpAttrMask::CUR_STATE) {
            attr.cur_qp_state
        } else {
            q.state()
        };
        let new = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            cur
        };
        // mlx4_ib_modify_qp: the IBTA table first.
        modify_qp_is_ok(cur, new, q.qp_type, mask)?;
        ib(Mlx4IbDev::modify_qp(self, qp_id(qp), attr, mask))
    }

    fn query_qp(&mut self, qp: Qp, _mask: QpAttrMask) -> IbResult<(QpAttr, IbQpInitAttr)> {
        let (a, i) = ib(Mlx4IbDev::query_qp(self, qp_id(qp)))?;
        Ok((
            a,
            IbQpInitAttr {
                send_cq: Cq(i.send_cq.0),
                recv_cq: Cq(i.recv_cq.0),
                srq: i.srq.map(|s| Srq(s.0)),
                cap: i.cap,
                sq_sig_type: i.sq_sig_type,
                qp_type: i.qp_type,
                create_flags: i.create_flags,
                port_num: i.port_num,
            },
        ))
    }

    fn attach_mcast(&mut self, qp: Qp, gid: &v::Gid, lid: u16) -> IbResult<()> {
        ib(Mlx4IbDev::mcg_attach(self, qp_id(qp), &gid.0, lid))
    }

    fn detach_mcast(&mut self, qp: Qp, gid: &v::Gid, lid: u16) -> IbResult<()> {
        ib(Mlx4IbDev::mcg_detach(self, qp_id(qp), &gid.0, lid))
    }

    fn destroy_qp(&mut self, qp: Qp) -> IbResult<()> {
        ib(Mlx4IbDev::destroy_qp(self, qp_id(qp)))
    }

    fn post_send(
        &mut self,
        qp: Qp,
        wrs: &[v::SendWr<'_>],
    ) -> core::result::Result<(), IbPostError> {
        match self.qps.slab.get_mut(qp.handle) {
            None => Err(IbPostError {
                index: 0,
                error: to_ib_error(Error::NoObject),
            }),
            Some(q) if q.sqp.is_some() => {
                let i = usize::from(q.port.wrapping_sub(1));
                let cache = self.port_cache.get(i);
                let roce = self.roce.get(i).and_then(|r| r.as_ref());
                let mut b = UdHeaderBuilder {
                    dev: &mut self.dev,
                    cache,
                    roce,
                };
                q.post_send_mlx(&self.ahs, &mut b, wrs)
                    .map_err(mlx_post_err)
            }
            Some(q) => q.post_send(&self.ahs, wrs).map_err(post_err),
        }
    }

    fn post_recv(&mut self, qp: Qp, wrs: &[RecvWr<'_>]) -> core::result::Result<(), IbPostError> {
        Mlx4IbDev::post_recv(self, qp_id(qp), wrs).map_err(post_err)
    }

    fn create_srq(&mut self, pd: Pd, attr: &SrqInitAttr) -> IbResult<(Srq, SrqAttr)> {
        let mut a = attr.attr;
        let id = ib(Mlx4IbDev::create_srq(self, PdId(pd.0), &mut a))?;
        Ok((Srq(id.0), a))
    }

    fn modify_srq(&mut self, srq: Srq, attr: &SrqAttr, mask: SrqAttrMask) -> IbResult<()> {
        ib(Mlx4IbDev::modify_srq(self, SrqId(srq.0), attr, mask))
    }

    fn query_srq(&mut self, srq: Srq) -> IbResult<SrqAttr> {
        ib(Mlx4IbDev::query_srq(self, SrqId(srq.0)))
    }

    fn destroy_srq(&mut self, srq: Srq) -> IbResult<()> {
        ib(Mlx4IbDev::destroy_srq(self, SrqId(srq.0)))
    }

    fn post_srq_recv(
        &mut self,
        srq: Srq,
        wrs: &[RecvWr<'_>],
    ) -> core::result::Result<(), IbPostError> {
        Mlx4IbDev::post_srq_recv(self, SrqId(srq.0), wrs).map_err(post_err)
    }

    fn get_dma_mr(&mut self, pd: Pd, access: v::AccessFlags) -> IbResult<v::Mr> {
        let id = ib(Mlx4IbDev::get_dma_mr(self, PdId(pd.0), access))?;
        self.ib_mr(id)
    }

    fn reg_mr(&mut self, pd: Pd, p: &MrPages<'_>) -> IbResult<v::Mr> {
        let id = ib(Mlx4IbDev::reg_mr_pages(
            self,
            PdId(pd.0),
            p.iova,
            p.length,
            u32::from(p.page_shift),
            p.pages,
            p.access,
        ))?;
        self.ib_mr(id)
    }

    fn dereg_mr(&mut self, mr: v::Mr) -> IbResult<()> {
        ib(Mlx4IbDev::dereg_mr(self, MrId(mr.handle)))
    }

    fn cache_updated(&mut self, port: u8, cache: &ib_core::cache::PortCache) {
        if let Some(c) = self.port_cache.get_mut(usize::from(port.wrapping_sub(1))) {
            c.pkeys.clone_from(&cache.pkeys);
            c.gids.clear();
            c.gids.extend(cache.gids.iter().map(|g| g.0));
            c.updates = c.updates.wrapping_add(1);
        }
    }

    fn process_mad(
        &mut self,
        flags: u32,
        port: u8,
        in_wc: Option<&Wc>,
        in_grh: Option<&Grh>,
        in_mad: &Mad,
        out_mad: &mut Mad,
    ) -> IbResult<MadResult> {
        let r = ib(Mlx4IbDev::process_mad(
            self,
            flags as u8,
            port,
            in_wc,
            in_grh.map(|g| &g.0),
            &in_mad.0,
        ))?;
        out_mad.0 = r.out_mad;
        let s = r.snooped;
        for (on, e) in [
            (s.lid_change, IbEvent::LidChange(port)),
            (s.client_reregister, IbEvent::ClientReregister(port)),
            (s.pkey_change, IbEvent::PkeyChange(port)),
            (s.gid_change, IbEvent::GidChange(port)),
        ] {
            if on {
                self.snooped.push_back(e);
            }
        }
        Ok(MadResult(r.result))
    }
}

impl Mlx4IbDev {
    /// The copy of ib_core's cache that QP0/QP1 sends of `port` read.
    pub fn sqp_cache(&self, port: u8) -> Option<&SqpCache> {
        self.port_cache.get(usize::from(port.checked_sub(1)?))
    }

    fn ib_mr(&self, id: MrId) -> IbResult<v::Mr> {
        let m = self.mrs.get(id.0).ok_or(IbError::Invalid("no such MR"))?;
        Ok(v::Mr {
            handle: id.0,
            lkey: m.lkey(),
            rkey: m.rkey(),
        })
    }
}
