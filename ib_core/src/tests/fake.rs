//! A fake provider for ib_core's own tests: software HCAs whose ports are cabled back to back, with a small SMA/PMA behind `process_mad`.
//!
//! QP0/QP1 traffic moves through DMA memory by bus address; data-path QPs other
//! than the special ones, MRs and SRQs are only bookkept.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use hal::fake::ArenaDma;
use hal::{BusAddr, DmaPool};

use crate::error::{Error, PostError, Result};
use crate::mad::{Grh, Mad, MadResult, attr, class, method, status};
use crate::verbs::*;

pub const GID_PREFIX: u64 = 0xfe80_0000_0000_0000;

#[derive(Debug, Clone)]
pub struct FakePort {
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub state: PortState,
    pub gids: Vec<Gid>,
    pub pkeys: Vec<u16>,
    pub link_layer: LinkLayer,
    pub active_mtu: Mtu,
}

#[derive(Debug, Clone)]
pub struct FakeQp {
    pub qp_type: QpType,
    pub port: u8,
    pub state: QpState,
    pub send_cq: Cq,
    pub recv_cq: Cq,
    pub qkey: u32,
    pub pkey_index: u16,
    pub recv: VecDeque<(u64, Sge)>,
    pub qp_num: u32,
    pub max_recv: u32,
    pub create_flags: QpCreateFlags,
}

#[derive(Debug)]
pub struct FakeHca {
    pub name: String,
    pub node_type: NodeType,
    pub node_guid: u64,
    pub ports: Vec<FakePort>,
    pub cqs: Vec<Option<VecDeque<Wc>>>,
    pub qps: Vec<Option<FakeQp>>,
    pub ahs: Vec<Option<AhAttr>>,
    pub pds: u32,
    pub mrs: u32,
    pub events: VecDeque<Event>,
    /// process_mad answers SMPs/PMA (false: NoSys, as a device without it).
    pub has_sma: bool,
    pub process_mad_calls: u32,
    pub modify_log: Vec<(QpType, QpState, QpState, QpAttrMask)>,
    /// Every accepted modify_qp: (QP handle, attributes, mask).
    pub qp_attr_log: Vec<(u32, QpAttr, QpAttrMask)>,
    /// Fail create_qp (to test a port that cannot open).
    pub fail_create_qp: bool,
    /// Multicast attachments: (QP handle, MGID, MLID).
    pub mcast: Vec<(u32, Gid, u16)>,
    /// attach_mcast/detach_mcast answer NoSys (a provider without them).
    pub no_mcast: bool,
}

/// One packet on the wire, as the capture keeps it.
#[derive(Debug, Clone)]
#[allow(dead_code)]
pub struct Packet {
    pub from: (usize, u8),
    pub to: Option<(usize, u8)>,
    pub dest_qpn: u32,
    pub dlid: u16,
    pub mad: Mad,
    pub dropped: bool,
    pub grh: Option<GlobalRoute>,
}

pub struct World {
    pub dma: Arc<ArenaDma>,
    pub pool: DmaPool,
    pub hcas: Vec<FakeHca>,
    pub links: Vec<((usize, u8), (usize, u8))>,
    /// Drop this many of the next packets.
    pub drop_next: usize,
    /// Drop every packet whose MAD matches (method).
    pub drop_method: Option<u8>,
    /// Fail this many of the next sends with a local QP operation error,
    /// putting the QP in SQE as hardware does.
    pub fail_sends: usize,
    /// Keep sends on the "send queue" (no delivery, no completion) and
    /// record (send CQ, wr_id, qp_num) so a test can complete them itself.
    pub hold_sends: bool,
    pub held: Vec<(Cq, u64, u32)>,
    pub wire: Vec<Packet>,
    pub capture: bool,
}

pub type SharedWorld = Arc<Mutex<World>>;

pub fn world() -> SharedWorld {
    world_with_dma(32 << 20)
}

/// A world whose DMA arena holds `len` bytes.
pub fn world_with_dma(len: usize) -> SharedWorld {
    let dma = Arc::new(ArenaDma::new(len));
    let pool = DmaPool::new(dma.clone());
    Arc::new(Mutex::new(World {
        dma,
        pool,
        hcas: Vec::new(),
        links: Vec::new(),
        drop_next: 0,
        drop_method: None,
        fail_sends: 0,
        hold_sends: false,
        held: Vec::new(),
        wire: Vec::new(),
        capture: true,
    }))
}

pub fn lock(w: &SharedWorld) -> MutexGuard<'_, World> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

/// Adds an HCA with `ports` IB ports, LIDs `base_lid + p - 1`, state Active.
pub fn add_hca(w: &SharedWorld, name: &str, node_guid: u64, ports: u8, base_lid: u16) -> FakeDev {
    let mut wl = lock(w);
    let idx = wl.hcas.len();
    wl.hcas.push(FakeHca {
        name: name.into(),
        node_type: NodeType::Ca,
        node_guid,
        ports: (0..ports)
            .map(|p| FakePort {
                lid: base_lid + u16::from(p),
                sm_lid: 1,
                lmc: 0,
                state: PortState::Active,
                gids: (0..4)
                    .map(|i| Gid::new(GID_PREFIX, node_guid + u64::from(p) + ((i as u64) << 40)))
                    .collect(),
                pkeys: vec![0xffff, 0x8001, 0x7fff, 0],
                link_layer: LinkLayer::Infiniband,
                active_mtu: Mtu::Mtu2048,
            })
            .collect(),
        has_sma: true,
        cqs: Vec::new(),
        qps: Vec::new(),
        ahs: Vec::new(),
        pds: 0,
        mrs: 0,
        events: VecDeque::new(),
        process_mad_calls: 0,
        modify_log: Vec::new(),
        qp_attr_log: Vec::new(),
        fail_create_qp: false,
        mcast: Vec::new(),
        no_mcast: false,
    });
    FakeDev {
        world: w.clone(),
        idx,
    }
}

pub fn cable(w: &SharedWorld, a: (usize, u8), b: (usize, u8)) {
    lock(w).links.push((a, b));
}

pub struct FakeDev {
    pub world: SharedWorld,
    pub idx: usize,
}

impl World {
    /// Completes a held send with `status` on `hca`'s CQ.
    pub fn complete_held(&mut self, hca: usize, i: usize, status: WcStatus) {
        let (cq, wr_id, qp_num) = self.held[i];
        if let Some(Some(c)) = self.hcas[hca].cqs.get_mut(cq.0 as usize) {
            c.push_back(Wc {
                wr_id,
                status,
                opcode: WcOpcode::Send,
                qp_num,
                ..Wc::default()
            });
        }
    }

    fn hca(&mut self, i: usize) -> &mut FakeHca {
        &mut self.hcas[i]
    }

    fn peer(&self, me: (usize, u8)) -> Option<(usize, u8)> {
        self.links.iter().find_map(|&(a, b)| {
            if a == me {
                Some(b)
            } else if b == me {
                Some(a)
            } else {
                None
            }
        })
    }

    fn special_qp(&mut self, hca: usize, port: u8, qpn: u32) -> Option<usize> {
        let t = match qpn {
            0 => QpType::Smi,
            1 => QpType::Gsi,
            _ => return None,
        };
        self.hcas[hca]
            .qps
            .iter()
            .position(|q| q.as_ref().is_some_and(|q| q.qp_type == t && q.port == port))
    }

    /// Puts a packet into the receive queue of a special QP: the GRH area
    /// and the payload in the next posted buffer, a completion on its CQ.
    /// Returns false if no buffer was posted.
    pub fn deliver(&mut self, hca: usize, port: u8, qpn: u32, a: Arrival<'_>) -> bool {
        let Arrival {
            grh,
            payload,
            src_qp,
            slid,
            sl,
            byte_len,
            status,
        } = a;
        let Some(qi) = self.special_qp(hca, port, qpn) else {
            return false;
        };
        let dma = self.dma.clone();
        let h = &mut self.hcas[hca];
        let Some(q) = h.qps[qi].as_mut() else {
            return false;
        };
        let Some((wr_id, sge)) = q.recv.pop_front() else {
            return false;
        };
        let mut buf = vec![0u8; 40 + payload.len()];
        if let Some(g) = grh {
            buf[..40].copy_from_slice(&g);
        }
        buf[40..].copy_from_slice(payload);
        let n = buf.len().min(sge.length as usize);
        dma.device_write(BusAddr(sge.addr), &buf[..n])
            .expect("receive buffer inside the arena");
        let wc = Wc {
            wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: byte_len.unwrap_or(buf.len() as u32),
            qp_num: q.qp_num,
            src_qp,
            wc_flags: if grh.is_some() {
                WcFlags::GRH
            } else {
                WcFlags::empty()
            },
            pkey_index: 0,
            slid,
            sl,
            port_num: port,
            ..Wc::default()
        };
        let cq = q.recv_cq;
        if let Some(Some(c)) = h.cqs.get_mut(cq.0 as usize) {
            c.push_back(wc);
        }
        true
    }
}

/// What [`World::deliver`] hands a special QP: the packet (GRH and
/// payload) and the fields of its receive completion.
pub struct Arrival<'a> {
    /// The 40-byte GRH area, if the packet had one.
    pub grh: Option<[u8; 40]>,
    /// The bytes after the GRH area (a MAD, or less).
    pub payload: &'a [u8],
    /// The sender's QP.
    pub src_qp: u32,
    /// The sender's LID.
    pub slid: u16,
    /// The SL.
    pub sl: u8,
    /// The completion's length, if not the buffer's.
    pub byte_len: Option<u32>,
    /// The completion's status.
    pub status: WcStatus,
}

impl<'a> Arrival<'a> {
    /// A good completion of `payload` from `src_qp` at `slid`, no GRH, SL 0.
    pub fn mad(payload: &'a [u8], src_qp: u32, slid: u16) -> Arrival<'a> {
        Arrival {
            grh: None,
            payload,
            src_qp,
            slid,
            sl: 0,
            byte_len: None,
            status: WcStatus::Success,
        }
    }
}

fn fake_sma(h: &mut FakeHca, port: u8, in_mad: &Mad, out: &mut Mad) -> MadResult {
    let cls = in_mad.mgmt_class();
    let smp = matches!(cls, class::SUBN_LID_ROUTED | class::SUBN_DIRECTED_ROUTE);
    let Some(p) = h.ports.get_mut(usize::from(port) - 1) else {
        return MadResult::FAILURE;
    };
    if smp && matches!(in_mad.method(), method::GET | method::SET) {
        *out = in_mad.clone();
        out.set_method(method::GET_RESP);
        let mut st = 0u16;
        match (in_mad.method(), in_mad.attr_id()) {
            (method::GET, attr::NODE_INFO) => {
                let d = out.smp_data_mut();
                d.fill(0);
                d[0] = 1;
                d[1] = 1;
                d[2] = 1;
                d[3] = h.ports.len() as u8;
                d[12..20].copy_from_slice(&h.node_guid.to_be_bytes());
                d[36] = port;
            }
            (method::GET, attr::PORT_INFO) => {
                let d = out.smp_data_mut();
                d.fill(0);
                d[16..18].copy_from_slice(&p.lid.to_be_bytes());
                d[18..20].copy_from_slice(&p.sm_lid.to_be_bytes());
                d[32] = p.state as u8;
            }
            (method::SET, attr::PORT_INFO) => {
                // Snooped like mlx4_ib: a new LID raises LID_CHANGE. A
                // port's LID is unicast: a multicast or the permissive
                // LID is an invalid value, refused with the port left as
                // it was (as the model's switch SMA refuses it).
                let d = in_mad.smp_data();
                let lid = u16::from_be_bytes([d[16], d[17]]);
                if lid >= 0xc000 {
                    st = status::INVALID_ATTRIB_VALUE;
                } else if lid != p.lid {
                    p.lid = lid;
                    h.events.push_back(Event::port(EventType::LidChange, port));
                }
            }
            _ => st = status::UNSUPPORTED_METHOD_ATTRIB,
        }
        if cls == class::SUBN_DIRECTED_ROUTE {
            st |= status::IB_SMP_DIRECTION;
        }
        out.set_status(st);
        return MadResult::SUCCESS | MadResult::REPLY;
    }
    if cls == class::PERF_MGMT && in_mad.method() == method::GET {
        *out = in_mad.clone();
        out.set_method(method::GET_RESP);
        out.set_status(0);
        // PortCounters: PortXmitData at data+8 of the PMA payload (offset 40+8).
        out.0[64 + 8..64 + 12].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        return MadResult::SUCCESS | MadResult::REPLY;
    }
    MadResult::SUCCESS
}

impl FakeDev {
    fn w(&self) -> MutexGuard<'_, World> {
        lock(&self.world)
    }
}

fn slot<T>(v: &mut Vec<Option<T>>, x: T) -> u32 {
    if let Some(i) = v.iter().position(|s| s.is_none()) {
        v[i] = Some(x);
        i as u32
    } else {
        v.push(Some(x));
        (v.len() - 1) as u32
    }
}

impl IbDevice for FakeDev {
    fn info(&self) -> DeviceInfo {
        let w = self.w();
        let h = &w.hcas[self.idx];
        DeviceInfo {
            name: h.name.clone(),
            node_type: h.node_type,
            phys_port_cnt: h.ports.len() as u8,
            node_guid: h.node_guid,
            node_desc: format!("fake {}", h.name),
            local_dma_lkey: Some(0x100),
            num_comp_vectors: 1,
        }
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn dma_pool(&self) -> DmaPool {
        self.w().pool.clone()
    }

    fn poll_events(&mut self, event: &mut dyn FnMut(Event)) -> Result<()> {
        let evs: Vec<Event> = self.w().hca(self.idx).events.drain(..).collect();
        for e in evs {
            event(e);
        }
        Ok(())
    }

    fn query_device(&mut self) -> Result<DeviceAttr> {
        let w = self.w();
        Ok(DeviceAttr {
            sys_image_guid: w.hcas[self.idx].node_guid,
            vendor_id: 0x02c9,
            vendor_part_id: 4099,
            max_qp: 1024,
            ..DeviceAttr::default()
        })
    }

    fn query_port(&mut self, port: u8) -> Result<PortAttr> {
        let mut w = self.w();
        let p = w
            .hca(self.idx)
            .ports
            .get(usize::from(port).wrapping_sub(1))
            .ok_or(Error::Invalid("port"))?;
        Ok(PortAttr {
            state: p.state,
            lid: p.lid,
            sm_lid: p.sm_lid,
            lmc: p.lmc,
            gid_tbl_len: p.gids.len() as u32,
            pkey_tbl_len: p.pkeys.len() as u16,
            active_mtu: p.active_mtu,
            ..PortAttr::default()
        })
    }

    fn get_link_layer(&self, port: u8) -> LinkLayer {
        self.w().hcas[self.idx]
            .ports
            .get(usize::from(port).wrapping_sub(1))
            .map_or(LinkLayer::Unspecified, |p| p.link_layer)
    }

    fn query_gid(&mut self, port: u8, index: u32) -> Result<Gid> {
        let mut w = self.w();
        let p = &w.hca(self.idx).ports[usize::from(port) - 1];
        p.gids
            .get(index as usize)
            .copied()
            .ok_or(Error::Invalid("gid"))
    }

    fn query_pkey(&mut self, port: u8, index: u16) -> Result<u16> {
        let mut w = self.w();
        let p = &w.hca(self.idx).ports[usize::from(port) - 1];
        p.pkeys
            .get(usize::from(index))
            .copied()
            .ok_or(Error::Invalid("pkey"))
    }

    fn alloc_pd(&mut self) -> Result<Pd> {
        let mut w = self.w();
        let h = w.hca(self.idx);
        h.pds += 1;
        Ok(Pd(h.pds))
    }

    fn dealloc_pd(&mut self, _pd: Pd) -> Result<()> {
        let mut w = self.w();
        w.hca(self.idx).pds -= 1;
        Ok(())
    }

    fn create_ah(&mut self, _pd: Pd, attr: &AhAttr) -> Result<Ah> {
        let mut w = self.w();
        Ok(Ah(slot(&mut w.hca(self.idx).ahs, *attr)))
    }

    fn destroy_ah(&mut self, ah: Ah) -> Result<()> {
        let mut w = self.w();
        let h = w.hca(self.idx);
        match h.ahs.get_mut(ah.0 as usize) {
            Some(s @ Some(_)) => {
                *s = None;
                Ok(())
            }
            _ => Err(Error::Invalid("no such AH")),
        }
    }

    fn create_cq(&mut self, attr: &CqInitAttr) -> Result<(Cq, u32)> {
        let mut w = self.w();
        Ok((
            Cq(slot(&mut w.hca(self.idx).cqs, VecDeque::new())),
            attr.cqe,
        ))
    }

    fn destroy_cq(&mut self, cq: Cq) -> Result<()> {
        let mut w = self.w();
        w.hca(self.idx).cqs[cq.0 as usize] = None;
        Ok(())
    }

    fn poll_cq(&mut self, cq: Cq, wc: &mut [Wc]) -> Result<usize> {
        let mut w = self.w();
        let Some(Some(q)) = w.hca(self.idx).cqs.get_mut(cq.0 as usize) else {
            return Err(Error::Invalid("no such CQ"));
        };
        let mut n = 0;
        while n < wc.len() {
            let Some(c) = q.pop_front() else { break };
            wc[n] = c;
            n += 1;
        }
        Ok(n)
    }

    fn req_notify_cq(&mut self, _cq: Cq, _flags: CqNotifyFlags) -> Result<bool> {
        Ok(false)
    }

    fn create_qp(&mut self, _pd: Pd, attr: &QpInitAttr) -> Result<(Qp, QpCap)> {
        let mut w = self.w();
        let h = w.hca(self.idx);
        if h.fail_create_qp {
            return Err(Error::NoMem);
        }
        let qp_num_hint = match attr.qp_type {
            QpType::Smi => Some(0),
            QpType::Gsi => Some(1),
            _ => None,
        };
        let q = FakeQp {
            qp_type: attr.qp_type,
            port: attr.port_num,
            state: QpState::Reset,
            send_cq: attr.send_cq,
            recv_cq: attr.recv_cq,
            qkey: 0,
            pkey_index: 0,
            recv: VecDeque::new(),
            qp_num: 0,
            max_recv: attr.cap.max_recv_wr,
            create_flags: attr.create_flags,
        };
        let handle = slot(&mut h.qps, q);
        let qp_num = qp_num_hint.unwrap_or(0x40 + handle);
        if let Some(Some(q)) = h.qps.get_mut(handle as usize) {
            q.qp_num = qp_num;
        }
        Ok((Qp { handle, qp_num }, attr.cap))
    }

    fn modify_qp(&mut self, qp: Qp, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let mut w = self.w();
        let h = w.hca(self.idx);
        let Some(Some(q)) = h.qps.get_mut(qp.handle as usize) else {
            return Err(Error::Invalid("no such QP"));
        };
        let next = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            q.state
        };
        modify_qp_is_ok(q.state, next, q.qp_type, mask)?;
        let (t, cur) = (q.qp_type, q.state);
        if mask.contains(QpAttrMask::QKEY) {
            q.qkey = attr.qkey;
        }
        if mask.contains(QpAttrMask::PKEY_INDEX) {
            q.pkey_index = attr.pkey_index;
        }
        q.state = next;
        h.modify_log.push((t, cur, next, mask));
        h.qp_attr_log.push((qp.handle, *attr, mask));
        Ok(())
    }

    fn query_qp(&mut self, qp: Qp, _mask: QpAttrMask) -> Result<(QpAttr, QpInitAttr)> {
        let mut w = self.w();
        let h = w.hca(self.idx);
        let Some(Some(q)) = h.qps.get(qp.handle as usize) else {
            return Err(Error::Invalid("no such QP"));
        };
        Ok((
            QpAttr {
                qp_state: q.state,
                qkey: q.qkey,
                pkey_index: q.pkey_index,
                ..QpAttr::default()
            },
            QpInitAttr {
                send_cq: q.send_cq,
                recv_cq: q.recv_cq,
                srq: None,
                cap: QpCap::default(),
                sq_sig_type: SigType::AllWr,
                qp_type: q.qp_type,
                create_flags: q.create_flags,
                port_num: q.port,
            },
        ))
    }

    fn destroy_qp(&mut self, qp: Qp) -> Result<()> {
        let mut w = self.w();
        let h = w.hca(self.idx);
        match h.qps.get_mut(qp.handle as usize) {
            Some(s @ Some(_)) => {
                *s = None;
                Ok(())
            }
            _ => Err(Error::Invalid("no such QP")),
        }
    }

    fn attach_mcast(&mut self, qp: Qp, gid: &Gid, lid: u16) -> Result<()> {
        let mut w = self.w();
        let h = w.hca(self.idx);
        if h.no_mcast {
            return Err(Error::NoSys);
        }
        match h.qps.get(qp.handle as usize) {
            Some(Some(q)) if q.qp_type == QpType::Ud => {}
            Some(Some(_)) => return Err(Error::Invalid("multicast attach is for UD QPs only")),
            _ => return Err(Error::Invalid("no such QP")),
        }
        if !h.mcast.contains(&(qp.handle, *gid, lid)) {
            h.mcast.push((qp.handle, *gid, lid));
        }
        Ok(())
    }

    fn detach_mcast(&mut self, qp: Qp, gid: &Gid, lid: u16) -> Result<()> {
        let mut w = self.w();
        let h = w.hca(self.idx);
        if h.no_mcast {
            return Err(Error::NoSys);
        }
        let n = h.mcast.len();
        h.mcast.retain(|&(q, g, _)| !(q == qp.handle && g == *gid));
        if h.mcast.len() == n {
            return Err(Error::Invalid("QP not attached to that group"));
        }
        let _ = lid;
        Ok(())
    }

    fn post_send(&mut self, qp: Qp, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        let mut w = self.w();
        for (i, wr) in wrs.iter().enumerate() {
            let bad = |e| PostError { index: i, error: e };
            let h = w.hca(self.idx);
            let Some(Some(q)) = h.qps.get(qp.handle as usize).cloned() else {
                return Err(bad(Error::Invalid("no such QP")));
            };
            if q.state != QpState::Rts {
                return Err(bad(Error::Invalid("send on a QP not in RTS")));
            }
            let WrDetail::Ud {
                ah,
                remote_qpn,
                remote_qkey,
                ..
            } = wr.wr
            else {
                return Err(bad(Error::Invalid("UD send without UD fields")));
            };
            let Some(Some(av)) = h.ahs.get(ah.0 as usize).copied() else {
                return Err(bad(Error::Invalid("bad AH")));
            };
            let mut payload = Vec::new();
            for sge in wr.sg_list {
                let mut b = vec![0u8; sge.length as usize];
                w.dma
                    .device_read(BusAddr(sge.addr), &mut b)
                    .map_err(|_| bad(Error::Invalid("SGE outside DMA memory")))?;
                payload.extend_from_slice(&b);
            }
            // Q_Key rule: bit 31 set -> the QP's own.
            let _qkey = if remote_qkey & IB_QP_SET_QKEY != 0 {
                q.qkey
            } else {
                remote_qkey
            };
            let me = (self.idx, q.port);
            let my_lid = w.hcas[self.idx].ports[usize::from(q.port) - 1].lid;
            let to = if av.dlid == my_lid {
                Some(me)
            } else if av.dlid == IB_LID_PERMISSIVE {
                w.peer(me)
            } else {
                w.peer(me).filter(|&(h, p)| {
                    let l = w.hcas[h].ports[usize::from(p) - 1].lid;
                    av.dlid >= l && av.dlid < l + (1 << w.hcas[h].ports[usize::from(p) - 1].lmc)
                })
            };
            if w.hold_sends {
                w.held.push((q.send_cq, wr.wr_id, q.qp_num));
                if w.capture {
                    w.wire.push(Packet {
                        from: (self.idx, q.port),
                        to: None,
                        dest_qpn: remote_qpn,
                        dlid: av.dlid,
                        mad: Mad::from_bytes(&payload),
                        dropped: true,
                        grh: av.grh,
                    });
                }
                continue;
            }
            if w.fail_sends > 0 {
                w.fail_sends -= 1;
                let h = w.hca(self.idx);
                if let Some(Some(qq)) = h.qps.get_mut(qp.handle as usize) {
                    qq.state = QpState::Sqe;
                }
                if let Some(Some(c)) = h.cqs.get_mut(q.send_cq.0 as usize) {
                    c.push_back(Wc {
                        wr_id: wr.wr_id,
                        status: WcStatus::LocQpOpErr,
                        opcode: WcOpcode::Send,
                        qp_num: q.qp_num,
                        vendor_err: 0x68,
                        ..Wc::default()
                    });
                }
                continue;
            }
            let mad = Mad::from_bytes(&payload);
            let mut dropped = false;
            if w.drop_next > 0 {
                w.drop_next -= 1;
                dropped = true;
            }
            if w.drop_method == Some(mad.method()) {
                dropped = true;
            }
            if w.capture {
                w.wire.push(Packet {
                    from: me,
                    to,
                    dest_qpn: remote_qpn,
                    dlid: av.dlid,
                    mad: mad.clone(),
                    dropped,
                    grh: av.grh,
                });
            }
            if let (Some((th, tp)), false) = (to, dropped) {
                let grh = av.grh.map(|g| {
                    let mut b = [0u8; 40];
                    b[0] = 0x60;
                    b[7] = g.hop_limit;
                    let sgid = w.hcas[self.idx].ports[usize::from(q.port) - 1].gids
                        [usize::from(g.sgid_index)];
                    b[8..24].copy_from_slice(&sgid.0);
                    b[24..40].copy_from_slice(&g.dgid.0);
                    b
                });
                let slid = if av.dlid == IB_LID_PERMISSIVE {
                    IB_LID_PERMISSIVE
                } else {
                    my_lid
                };
                w.deliver(
                    th,
                    tp,
                    remote_qpn,
                    Arrival {
                        grh,
                        sl: av.sl,
                        ..Arrival::mad(&payload, q.qp_num, slid)
                    },
                );
            }
            let h = w.hca(self.idx);
            if let Some(Some(c)) = h.cqs.get_mut(q.send_cq.0 as usize) {
                c.push_back(Wc {
                    wr_id: wr.wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::Send,
                    qp_num: q.qp_num,
                    port_num: q.port,
                    ..Wc::default()
                });
            }
        }
        Ok(())
    }

    fn post_recv(&mut self, qp: Qp, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        let mut w = self.w();
        let h = w.hca(self.idx);
        let Some(Some(q)) = h.qps.get_mut(qp.handle as usize) else {
            return Err(PostError {
                index: 0,
                error: Error::Invalid("no such QP"),
            });
        };
        for (i, wr) in wrs.iter().enumerate() {
            if q.state == QpState::Reset {
                return Err(PostError {
                    index: i,
                    error: Error::Invalid("receive on a QP in RESET"),
                });
            }
            if q.recv.len() >= q.max_recv as usize || wr.sg_list.len() != 1 {
                return Err(PostError {
                    index: i,
                    error: Error::NoMem,
                });
            }
            q.recv.push_back((wr.wr_id, wr.sg_list[0]));
        }
        Ok(())
    }

    fn get_dma_mr(&mut self, _pd: Pd, access: AccessFlags) -> Result<Mr> {
        if access.intersects(
            AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
        ) {
            return Err(Error::Invalid("no all-memory remote keys"));
        }
        let mut w = self.w();
        let h = w.hca(self.idx);
        h.mrs += 1;
        Ok(Mr {
            handle: h.mrs,
            lkey: 0x100,
            rkey: 0,
        })
    }

    fn dereg_mr(&mut self, _mr: Mr) -> Result<()> {
        let mut w = self.w();
        w.hca(self.idx).mrs -= 1;
        Ok(())
    }

    fn process_mad(
        &mut self,
        _flags: u32,
        port: u8,
        _in_wc: Option<&Wc>,
        _in_grh: Option<&Grh>,
        in_mad: &Mad,
        out_mad: &mut Mad,
    ) -> Result<MadResult> {
        let mut w = self.w();
        let h = w.hca(self.idx);
        if !h.has_sma {
            return Err(Error::NoSys);
        }
        h.process_mad_calls += 1;
        Ok(fake_sma(h, port, in_mad, out_mad))
    }
}
