//! Port of Linux `drivers/infiniband/core/device.c` (3.11): device and client registration, client data, events, the verbs entry points, and the progress function that replaces interrupts.
//!
//! Events are Linux's event handlers and their dispatch; the verbs entry points
//! are those of `struct ib_device`. Sysfs, netlink, name templates ("mlx4_%d"
//! is the provider's job) and the global locks are left out (the caller owns
//! the one [`IbCore`]).

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::any::Any;
use core::time::Duration;

use hal::{Clock, Deadline};

use crate::cache::{PortCache, event_wants, update};
use crate::error::{Error, PostError, Result};
use crate::mad::MadPort;
use crate::verbs::*;

/// A registered device, by index in the [`IbCore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId(pub u32);

/// A registered client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub u32);

/// A registered event handler (`struct ib_event_handler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandlerId(pub u32);

/// `struct ib_client`: a user of devices (SA, CM, the remote-memory service,
/// the console) that wants to hear of every device, present and future.
pub trait IbClient: Send {
    /// The client's name.
    fn name(&self) -> &str;
    /// Whether the client takes this device at all; a declined device never
    /// reaches `add`, `remove` or `event` (how Linux's clients bail out of
    /// `add` on `rdma_node_get_transport`).
    fn accepts(&self, _node_type: NodeType, _transport: Transport) -> bool {
        true
    }
    /// A device appeared (or existed when the client registered).
    fn add(&mut self, me: ClientId, dev: &mut Device);
    /// The device goes away (or the client unregisters). Client data is
    /// dropped after this returns.
    fn remove(&mut self, me: ClientId, dev: &mut Device);
    /// An asynchronous event on an accepted device (after the cache was
    /// refreshed and the registered handlers ran).
    fn event(&mut self, _me: ClientId, _dev: &mut Device, _event: &Event) {}
    /// Called by every [`IbCore::poll`], after the devices were polled, with
    /// the whole core: where a client without a thread of its own (SA, CM,
    /// a MAD responder) reads its agents' mailboxes and answers. Returns the
    /// work done. The client is out of the core while this runs, so it is
    /// not polled again if it calls [`IbCore::poll`] itself.
    fn poll(&mut self, _me: ClientId, _core: &mut IbCore) -> usize {
        0
    }
    /// The client itself, for a client whose state is not per device
    /// (the RDMA CM's IDs): its module downcasts it through
    /// [`IbCore::client_mut`]. `None` (the default) for the others.
    fn as_any_mut(&mut self) -> Option<&mut dyn Any> {
        None
    }
}

/// An event handler (`ib_register_event_handler`'s callback).
pub type EventHandler = Box<dyn FnMut(DeviceId, &Event) + Send>;

/// MAD layer sizes (Linux's `mad_sendq_size`/`mad_recvq_size` module
/// parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadConfig {
    /// Send WRs per special QP (Linux 128).
    pub send_queue_size: u32,
    /// Receive WRs per special QP (Linux 512, at least 64).
    pub recv_queue_size: u32,
    /// Events an agent's mailbox holds before receives are dropped.
    pub agent_mailbox: usize,
    /// Completions handled per port per [`IbCore::poll`] call.
    pub poll_budget: usize,
}

impl Default for MadConfig {
    fn default() -> Self {
        MadConfig {
            send_queue_size: 128,
            recv_queue_size: 512,
            agent_mailbox: 1024,
            poll_budget: 256,
        }
    }
}

/// `struct ib_device` as the core sees it: the provider, what it said about
/// itself, per-port tables, the cache, the MAD ports and client data.
pub struct Device {
    pub(crate) id: DeviceId,
    pub(crate) ops: Box<dyn IbDevice>,
    info: DeviceInfo,
    link_layer: Vec<LinkLayer>,
    gid_tbl_len: Vec<u32>,
    pkey_tbl_len: Vec<u16>,
    pub(crate) cache: Vec<PortCache>,
    pub(crate) mad: Vec<Option<MadPort>>,
    client_data: Vec<(ClientId, Box<dyn Any + Send>)>,
    handlers: Vec<(HandlerId, EventHandler)>,
    fatal: bool,
    pub(crate) poll_errors: u64,
}

impl core::fmt::Debug for Device {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Device")
            .field("id", &self.id)
            .field("name", &self.info.name)
            .field("node_type", &self.info.node_type)
            .field("ports", &self.info.phys_port_cnt)
            .finish()
    }
}

impl Device {
    /// The id.
    pub fn id(&self) -> DeviceId {
        self.id
    }
    /// Name ("mlx4_0").
    pub fn name(&self) -> &str {
        &self.info.name
    }
    /// What the provider said at registration.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }
    /// Node type.
    pub fn node_type(&self) -> NodeType {
        self.info.node_type
    }
    /// Number of ports.
    pub fn phys_port_cnt(&self) -> u8 {
        self.info.phys_port_cnt
    }
    /// Failed `poll_events` calls (only the first is logged).
    pub fn poll_errors(&self) -> u64 {
        self.poll_errors
    }
    /// True once `IB_EVENT_DEVICE_FATAL` was dispatched.
    pub fn is_fatal(&self) -> bool {
        self.fatal
    }
    /// The provider itself: the hot path (`post_send`, `post_recv`,
    /// `poll_cq`) goes straight through it.
    pub fn provider(&mut self) -> &mut dyn IbDevice {
        &mut *self.ops
    }

    /// The provider as its concrete type, if it offers
    /// [`IbDevice::as_any_mut`].
    pub fn provider_as<T: Any>(&mut self) -> Option<&mut T> {
        self.ops.as_any_mut()?.downcast_mut::<T>()
    }

    fn port_index(&self, port: u8) -> Result<usize> {
        if port == 0 || port > self.info.phys_port_cnt {
            return Err(Error::Invalid("port number out of range"));
        }
        Ok(usize::from(port - 1))
    }

    /// `rdma_port_get_link_layer`.
    pub fn port_link_layer(&self, port: u8) -> Result<LinkLayer> {
        Ok(self.link_layer[self.port_index(port)?])
    }
    /// GID table length of a port (`ib_device.gid_tbl_len`).
    pub fn gid_tbl_len(&self, port: u8) -> Result<u32> {
        Ok(self.gid_tbl_len[self.port_index(port)?])
    }
    /// P_Key table length of a port.
    pub fn pkey_tbl_len(&self, port: u8) -> Result<u16> {
        Ok(self.pkey_tbl_len[self.port_index(port)?])
    }

    /// `ib_set_client_data`.
    pub fn set_client_data(&mut self, client: ClientId, data: Box<dyn Any + Send>) {
        if let Some(slot) = self.client_data.iter_mut().find(|(c, _)| *c == client) {
            slot.1 = data;
        } else {
            self.client_data.push((client, data));
        }
    }
    /// `ib_get_client_data`, typed.
    pub fn client_data<T: Any>(&mut self, client: ClientId) -> Option<&mut T> {
        self.client_data
            .iter_mut()
            .find(|(c, _)| *c == client)
            .and_then(|(_, d)| d.downcast_mut::<T>())
    }
    fn take_client_data(&mut self, client: ClientId) {
        self.client_data.retain(|(c, _)| *c != client);
    }

    // --- cache (cache.c entry points) ---

    /// The cached view of a port.
    pub fn port_cache(&self, port: u8) -> Result<&PortCache> {
        Ok(&self.cache[self.port_index(port)?])
    }
    /// `ib_get_cached_gid`.
    pub fn get_cached_gid(&self, port: u8, index: usize) -> Result<Gid> {
        self.port_cache(port)?.get_gid(index)
    }
    /// `ib_find_cached_gid`: the port and index holding `gid`.
    pub fn find_cached_gid(&self, gid: &Gid) -> Option<(u8, usize)> {
        self.cache
            .iter()
            .enumerate()
            .find_map(|(i, c)| c.find_gid(gid).map(|x| (i as u8 + 1, x)))
    }
    /// `ib_get_cached_pkey`.
    pub fn get_cached_pkey(&self, port: u8, index: usize) -> Result<u16> {
        self.port_cache(port)?.get_pkey(index)
    }
    /// `ib_find_cached_pkey`.
    pub fn find_cached_pkey(&self, port: u8, pkey: u16) -> Result<u16> {
        self.port_cache(port)?.find_pkey(pkey)
    }
    /// `ib_get_cached_lmc`.
    pub fn get_cached_lmc(&self, port: u8) -> Result<u8> {
        Ok(self.port_cache(port)?.lmc)
    }
    /// Refreshes a port's cache now (`ib_cache_update`) and hands the new
    /// contents to the provider ([`IbDevice::cache_updated`]).
    pub fn cache_update(&mut self, port: u8) -> Result<()> {
        let i = self.port_index(port)?;
        update(
            &mut *self.ops,
            port,
            self.gid_tbl_len[i],
            self.pkey_tbl_len[i],
            &mut self.cache[i],
        )?;
        self.ops.cache_updated(port, &self.cache[i]);
        Ok(())
    }

    // --- verbs (verbs.c entry points; argument checks, then the provider) ---

    /// `ib_query_device`.
    pub fn query_device(&mut self) -> Result<DeviceAttr> {
        self.ops.query_device()
    }
    /// `ib_query_port`.
    pub fn query_port(&mut self, port: u8) -> Result<PortAttr> {
        self.port_index(port)?;
        self.ops.query_port(port)
    }
    /// `ib_query_gid`.
    pub fn query_gid(&mut self, port: u8, index: u32) -> Result<Gid> {
        if index >= self.gid_tbl_len(port)? {
            return Err(Error::Invalid("GID index out of range"));
        }
        self.ops.query_gid(port, index)
    }
    /// `ib_query_pkey`.
    pub fn query_pkey(&mut self, port: u8, index: u16) -> Result<u16> {
        if index >= self.pkey_tbl_len(port)? {
            return Err(Error::Invalid("P_Key index out of range"));
        }
        self.ops.query_pkey(port, index)
    }
    /// `ib_modify_port`.
    pub fn modify_port(
        &mut self,
        port: u8,
        mask: PortModifyFlags,
        props: &PortModify,
    ) -> Result<()> {
        self.port_index(port)?;
        self.ops.modify_port(port, mask, props)
    }
    /// `ib_find_pkey`: the index of `pkey` read from the device (not the
    /// cache), full membership preferred.
    pub fn find_pkey(&mut self, port: u8, pkey: u16) -> Result<u16> {
        let len = self.pkey_tbl_len(port)?;
        let mut partial = None;
        for i in 0..len {
            let p = self.ops.query_pkey(port, i)?;
            if p & 0x7fff == pkey & 0x7fff {
                if p & 0x8000 != 0 {
                    return Ok(i);
                }
                partial.get_or_insert(i);
            }
        }
        partial.ok_or(Error::NotFound)
    }
    /// `ib_alloc_pd`.
    pub fn alloc_pd(&mut self) -> Result<Pd> {
        self.ops.alloc_pd()
    }
    /// `ib_dealloc_pd`.
    pub fn dealloc_pd(&mut self, pd: Pd) -> Result<()> {
        self.ops.dealloc_pd(pd)
    }
    /// `ib_create_ah`: checks the port and the SL, refuses a GRH whose SGID
    /// index is beyond the table.
    pub fn create_ah(&mut self, pd: Pd, attr: &AhAttr) -> Result<Ah> {
        self.port_index(attr.port_num)?;
        if attr.sl > 15 {
            return Err(Error::Invalid("AH service level above 15"));
        }
        if let Some(grh) = &attr.grh
            && u32::from(grh.sgid_index) >= self.gid_tbl_len(attr.port_num)?
        {
            return Err(Error::Invalid("AH SGID index out of range"));
        }
        self.ops.create_ah(pd, attr)
    }
    /// `ib_destroy_ah`.
    pub fn destroy_ah(&mut self, ah: Ah) -> Result<()> {
        self.ops.destroy_ah(ah)
    }
    /// `ib_create_cq`.
    pub fn create_cq(&mut self, attr: &CqInitAttr) -> Result<(Cq, u32)> {
        if attr.cqe == 0 {
            return Err(Error::Invalid("CQ with zero entries"));
        }
        self.ops.create_cq(attr)
    }
    /// `ib_destroy_cq`.
    pub fn destroy_cq(&mut self, cq: Cq) -> Result<()> {
        self.ops.destroy_cq(cq)
    }
    /// `ib_poll_cq` (hot path: no allocation, straight to the provider).
    #[inline]
    pub fn poll_cq(&mut self, cq: Cq, wc: &mut [Wc]) -> Result<usize> {
        self.ops.poll_cq(cq, wc)
    }
    /// `ib_req_notify_cq`.
    pub fn req_notify_cq(&mut self, cq: Cq, flags: CqNotifyFlags) -> Result<bool> {
        self.ops.req_notify_cq(cq, flags)
    }
    /// `ib_create_qp`: checks the QP type against the port (QP0 only on an
    /// InfiniBand port) before the provider.
    pub fn create_qp(&mut self, pd: Pd, attr: &QpInitAttr) -> Result<(Qp, QpCap)> {
        if matches!(attr.qp_type, QpType::Smi | QpType::Gsi) {
            let ll = self.port_link_layer(attr.port_num)?;
            if attr.qp_type == QpType::Smi && ll != LinkLayer::Infiniband {
                return Err(Error::Invalid("QP0 exists only on an InfiniBand port"));
            }
        }
        self.ops.create_qp(pd, attr)
    }
    /// `ib_modify_qp`.
    pub fn modify_qp(&mut self, qp: Qp, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        self.ops.modify_qp(qp, attr, mask)
    }
    /// `ib_query_qp`.
    pub fn query_qp(&mut self, qp: Qp, mask: QpAttrMask) -> Result<(QpAttr, QpInitAttr)> {
        self.ops.query_qp(qp, mask)
    }
    /// `ib_destroy_qp`.
    pub fn destroy_qp(&mut self, qp: Qp) -> Result<()> {
        self.ops.destroy_qp(qp)
    }
    /// `ib_attach_mcast`: the UD QP `qp` receives what is sent to multicast
    /// group `gid` (a GID whose first byte is 0xff) with MLID `lid` (a
    /// multicast LID, 0xC000 to 0xFFFE, as later kernels check). Linux
    /// checks the QP type here from its `ib_qp`; a handle here does not
    /// carry it, so the provider refuses a QP that is not UD.
    #[doc(alias = "ib_attach_mcast")]
    pub fn attach_mcast(&mut self, qp: Qp, gid: &Gid, lid: u16) -> Result<()> {
        mcast_check(gid, lid)?;
        self.ops.attach_mcast(qp, gid, lid)
    }
    /// `ib_detach_mcast`, with the checks of [`Device::attach_mcast`].
    #[doc(alias = "ib_detach_mcast")]
    pub fn detach_mcast(&mut self, qp: Qp, gid: &Gid, lid: u16) -> Result<()> {
        mcast_check(gid, lid)?;
        self.ops.detach_mcast(qp, gid, lid)
    }
    /// `ib_post_send` (hot path).
    #[inline]
    pub fn post_send(&mut self, qp: Qp, wr: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        self.ops.post_send(qp, wr)
    }
    /// `ib_post_recv` (hot path).
    #[inline]
    pub fn post_recv(&mut self, qp: Qp, wr: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        self.ops.post_recv(qp, wr)
    }
    /// `ib_create_srq`.
    pub fn create_srq(&mut self, pd: Pd, attr: &SrqInitAttr) -> Result<(Srq, SrqAttr)> {
        self.ops.create_srq(pd, attr)
    }
    /// `ib_modify_srq` (arm the limit with [`SrqAttrMask::LIMIT`]).
    pub fn modify_srq(&mut self, srq: Srq, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        self.ops.modify_srq(srq, attr, mask)
    }
    /// `ib_query_srq`.
    pub fn query_srq(&mut self, srq: Srq) -> Result<SrqAttr> {
        self.ops.query_srq(srq)
    }
    /// `ib_destroy_srq`.
    pub fn destroy_srq(&mut self, srq: Srq) -> Result<()> {
        self.ops.destroy_srq(srq)
    }
    /// `ib_post_srq_recv` (hot path).
    #[inline]
    pub fn post_srq_recv(
        &mut self,
        srq: Srq,
        wr: &[RecvWr<'_>],
    ) -> core::result::Result<(), PostError> {
        self.ops.post_srq_recv(srq, wr)
    }
    /// `ib_get_dma_mr`.
    pub fn get_dma_mr(&mut self, pd: Pd, access: AccessFlags) -> Result<Mr> {
        self.ops.get_dma_mr(pd, access)
    }
    /// `ib_reg_phys_mr`: checks the page list covers `iova..iova+length`.
    pub fn reg_mr(&mut self, pd: Pd, pages: &MrPages<'_>) -> Result<Mr> {
        if pages.page_shift < 12 || pages.page_shift > 40 {
            return Err(Error::Invalid("MR page size below 4 KiB or absurd"));
        }
        let psize = 1u64 << pages.page_shift;
        let first = pages.iova & (psize - 1);
        let need = first
            .checked_add(pages.length)
            .map(|b| b.div_ceil(psize))
            .ok_or(Error::Invalid("MR length overflows"))?;
        if pages.length == 0 || need > pages.pages.len() as u64 {
            return Err(Error::Invalid("MR page list shorter than the region"));
        }
        if pages.pages.iter().any(|p| p & (psize - 1) != 0) {
            return Err(Error::Invalid(
                "MR page address not aligned to the page size",
            ));
        }
        self.ops.reg_mr(pd, pages)
    }
    /// `ib_dereg_mr`.
    pub fn dereg_mr(&mut self, mr: Mr) -> Result<()> {
        self.ops.dereg_mr(mr)
    }
}

/// The checks of `ib_attach_mcast`/`ib_detach_mcast` on the group's GID and
/// LID.
fn mcast_check(gid: &Gid, lid: u16) -> Result<()> {
    if gid.0[0] != 0xff {
        return Err(Error::Invalid("not a multicast GID (first byte 0xff)"));
    }
    if !(0xc000..0xffff).contains(&lid) {
        return Err(Error::Invalid("not a multicast LID (0xC000 to 0xFFFE)"));
    }
    Ok(())
}

/// A refused `ib_register_device`: why, and the provider back.
pub struct RegisterError {
    /// Why.
    pub error: Error,
    /// The provider, untouched by the core beyond `info` and `query_port`.
    pub provider: Box<dyn IbDevice>,
}

impl core::fmt::Debug for RegisterError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "RegisterError({:?})", self.error)
    }
}

impl core::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "ib_register_device: {}", self.error)
    }
}

struct ClientSlot {
    client: Box<dyn IbClient>,
}

/// The core: every registered device and client (Linux's `device_list` and
/// `client_list`), the MAD layer's global state, and the clock every wait
/// uses. One per kernel; host tests make their own.
pub struct IbCore {
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) devices: Vec<Option<Device>>,
    clients: Vec<Option<ClientSlot>>,
    next_handler: u32,
    pub(crate) next_hi_tid: u32,
    pub(crate) mad_config: MadConfig,
    event_buf: Vec<Event>,
}

impl IbCore {
    /// An empty core on `clock`, with Linux's MAD queue sizes.
    pub fn new(clock: Arc<dyn Clock>) -> IbCore {
        Self::with_mad_config(clock, MadConfig::default())
    }

    /// An empty core with other MAD queue sizes.
    pub fn with_mad_config(clock: Arc<dyn Clock>, mad_config: MadConfig) -> IbCore {
        IbCore {
            clock,
            devices: Vec::new(),
            clients: Vec::new(),
            next_handler: 1,
            next_hi_tid: 0,
            mad_config,
            event_buf: Vec::new(),
        }
    }

    /// The clock.
    pub fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// The devices, in registration order.
    pub fn devices(&self) -> impl Iterator<Item = &Device> {
        self.devices.iter().flatten()
    }
    /// Ids of the registered devices.
    pub fn device_ids(&self) -> Vec<DeviceId> {
        self.devices().map(|d| d.id).collect()
    }
    /// A device.
    pub fn device(&self, id: DeviceId) -> Option<&Device> {
        self.devices.get(id.0 as usize).and_then(|d| d.as_ref())
    }
    /// A device, for verbs.
    pub fn device_mut(&mut self, id: DeviceId) -> Option<&mut Device> {
        self.devices.get_mut(id.0 as usize).and_then(|d| d.as_mut())
    }
    /// A device by name (`ib_device.name`).
    pub fn find_device(&self, name: &str) -> Option<DeviceId> {
        self.devices().find(|d| d.name() == name).map(|d| d.id)
    }
    pub(crate) fn dev(&mut self, id: DeviceId) -> Result<&mut Device> {
        self.device_mut(id).ok_or(Error::NoDev)
    }

    /// `ib_register_device`: takes the provider, reads its port table
    /// lengths and link layers, fills the cache, opens the MAD ports (QP0 on
    /// InfiniBand ports, QP1 everywhere; a port that fails to open is logged
    /// and left without MADs, as Linux's `ib_mad_init_device` does), then
    /// calls `add` of every client that accepts the device, in client
    /// registration order.
    ///
    /// On failure the provider is handed back in the [`RegisterError`], so
    /// the driver can tear its device down (as a Linux driver still owns its
    /// `ib_device` when `ib_register_device` fails).
    #[doc(alias = "ib_register_device")]
    pub fn register_device(
        &mut self,
        provider: Box<dyn IbDevice>,
    ) -> core::result::Result<DeviceId, RegisterError> {
        let mut ops = provider;
        let info = ops.info();
        let refuse = |error, provider| Err(RegisterError { error, provider });
        if info.name.is_empty() {
            return refuse(Error::Invalid("device without a name"), ops);
        }
        if self.find_device(&info.name).is_some() {
            return refuse(Error::Conflict("a device of that name is registered"), ops);
        }
        if info.phys_port_cnt == 0 {
            return refuse(Error::Invalid("device without ports"), ops);
        }
        if info.node_desc.len() > 64 {
            return refuse(Error::Invalid("node description longer than 64 bytes"), ops);
        }
        // read_port_table_lengths
        let n = usize::from(info.phys_port_cnt);
        let mut gid_tbl_len = Vec::with_capacity(n);
        let mut pkey_tbl_len = Vec::with_capacity(n);
        let mut link_layer = Vec::with_capacity(n);
        for p in 1..=info.phys_port_cnt {
            let attr = match ops.query_port(p) {
                Ok(a) => a,
                Err(e) => return refuse(e, ops),
            };
            gid_tbl_len.push(attr.gid_tbl_len);
            pkey_tbl_len.push(attr.pkey_tbl_len);
            link_layer.push(ops.get_link_layer(p));
        }
        let idx = self
            .devices
            .iter()
            .position(|d| d.is_none())
            .unwrap_or(self.devices.len());
        let id = DeviceId(idx as u32);
        let mut dev = Device {
            id,
            ops,
            info,
            link_layer,
            gid_tbl_len,
            pkey_tbl_len,
            cache: (0..n).map(|_| PortCache::default()).collect(),
            mad: (0..n).map(|_| None).collect(),
            client_data: Vec::new(),
            handlers: Vec::new(),
            fatal: false,
            poll_errors: 0,
        };
        // ib_cache_setup_one
        for p in 1..=dev.info.phys_port_cnt {
            let _ = dev.cache_update(p);
        }
        // ib_mad_init_device + ib_agent_port_open
        for p in 1..=dev.info.phys_port_cnt {
            match crate::mad::port_open(&mut dev, p, &self.mad_config) {
                Ok(mp) => dev.mad[usize::from(p - 1)] = Some(mp),
                Err(e) => log::error!("{}: Couldn't open port {p}: {e}", dev.info.name),
            }
        }
        if idx == self.devices.len() {
            self.devices.push(Some(dev));
        } else {
            self.devices[idx] = Some(dev);
        }
        let Some(Some(dev)) = self.devices.get_mut(idx) else {
            return Ok(id);
        };
        for (ci, slot) in self.clients.iter_mut().enumerate() {
            if let Some(slot) = slot
                && slot
                    .client
                    .accepts(dev.info.node_type, dev.info.node_type.transport())
            {
                slot.client.add(ClientId(ci as u32), dev);
            }
        }
        Ok(id)
    }

    /// `ib_unregister_device`: calls `remove` of every accepting client in
    /// reverse order of client registration, drops their data, closes the
    /// MAD ports (flushing every pending MAD) and gives the provider back.
    #[doc(alias = "ib_unregister_device")]
    pub fn unregister_device(&mut self, id: DeviceId) -> Result<Box<dyn IbDevice>> {
        let Some(slot) = self.devices.get_mut(id.0 as usize) else {
            return Err(Error::NoDev);
        };
        let Some(dev) = slot.as_mut() else {
            return Err(Error::NoDev);
        };
        for (ci, cslot) in self.clients.iter_mut().enumerate().rev() {
            if let Some(c) = cslot
                && c.client
                    .accepts(dev.info.node_type, dev.info.node_type.transport())
            {
                c.client.remove(ClientId(ci as u32), dev);
                dev.take_client_data(ClientId(ci as u32));
            }
        }
        for p in (1..=dev.info.phys_port_cnt).rev() {
            if let Some(mp) = dev.mad[usize::from(p - 1)].take() {
                crate::mad::port_close(dev, mp);
            }
        }
        let Some(dev) = slot.take() else {
            return Err(Error::NoDev);
        };
        Ok(dev.ops)
    }

    /// `ib_register_client`: appends the client and calls its `add` for
    /// every registered device it accepts.
    #[doc(alias = "ib_register_client")]
    pub fn register_client(&mut self, client: Box<dyn IbClient>) -> ClientId {
        let id = ClientId(self.clients.len() as u32);
        let mut slot = ClientSlot { client };
        for dev in self.devices.iter_mut().flatten() {
            if slot
                .client
                .accepts(dev.info.node_type, dev.info.node_type.transport())
            {
                slot.client.add(id, dev);
            }
        }
        self.clients.push(Some(slot));
        id
    }

    /// The registered client called `name`, if any (the first).
    pub fn client_by_name(&self, name: &str) -> Option<ClientId> {
        self.clients
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.client.name() == name))
            .map(|i| ClientId(i as u32))
    }

    /// `ib_unregister_client`: calls its `remove` for every device it took,
    /// drops its data and gives the client back.
    #[doc(alias = "ib_unregister_client")]
    pub fn unregister_client(&mut self, id: ClientId) -> Result<Box<dyn IbClient>> {
        let Some(mut slot) = self.clients.get_mut(id.0 as usize).and_then(|s| s.take()) else {
            return Err(Error::NotFound);
        };
        for dev in self.devices.iter_mut().flatten() {
            if slot
                .client
                .accepts(dev.info.node_type, dev.info.node_type.transport())
            {
                slot.client.remove(id, dev);
                dev.take_client_data(id);
            }
        }
        Ok(slot.client)
    }

    /// A registered client, to talk to it.
    pub fn client_mut(&mut self, id: ClientId) -> Option<&mut (dyn IbClient + 'static)> {
        self.clients
            .get_mut(id.0 as usize)
            .and_then(|s| s.as_mut())
            .map(|s| &mut *s.client)
    }

    /// `ib_register_event_handler`.
    #[doc(alias = "ib_register_event_handler")]
    pub fn register_event_handler(
        &mut self,
        dev: DeviceId,
        handler: EventHandler,
    ) -> Result<HandlerId> {
        let hid = HandlerId(self.next_handler);
        self.next_handler = self.next_handler.wrapping_add(1);
        self.dev(dev)?.handlers.push((hid, handler));
        Ok(hid)
    }

    /// `ib_unregister_event_handler`.
    #[doc(alias = "ib_unregister_event_handler")]
    pub fn unregister_event_handler(&mut self, dev: DeviceId, h: HandlerId) -> Result<()> {
        let d = self.dev(dev)?;
        let before = d.handlers.len();
        d.handlers.retain(|(id, _)| *id != h);
        if d.handlers.len() == before {
            return Err(Error::NotFound);
        }
        Ok(())
    }

    /// `ib_dispatch_event`: refreshes the cache first for the port events
    /// Linux's cache listens to (synchronously, as LegoOS does), then runs
    /// every registered handler in registration order, then the accepting
    /// clients' `event`.
    #[doc(alias = "ib_dispatch_event")]
    pub fn dispatch_event(&mut self, id: DeviceId, event: Event) -> Result<()> {
        let Some(dev) = self.devices.get_mut(id.0 as usize).and_then(|d| d.as_mut()) else {
            return Err(Error::NoDev);
        };
        if let EventElement::Port(p) = event.element
            && event_wants(event.event)
        {
            let _ = dev.cache_update(p);
        }
        if event.event == EventType::DeviceFatal {
            dev.fatal = true;
        }
        for (_, h) in dev.handlers.iter_mut() {
            h(id, &event);
        }
        for (ci, slot) in self.clients.iter_mut().enumerate() {
            if let Some(c) = slot
                && c.client
                    .accepts(dev.info.node_type, dev.info.node_type.transport())
            {
                c.client.event(ClientId(ci as u32), dev, &event);
            }
        }
        Ok(())
    }

    /// The progress function: for every device, polls its event queues
    /// (dispatching what they report), its QP0/QP1 completion queues (the
    /// MAD completion handler) and its MAD timeouts. Returns how much work
    /// was done (events + completions + timeouts), so an idle loop can tell
    /// a quiet system from a busy one.
    pub fn poll(&mut self) -> usize {
        let mut work = 0;
        for i in 0..self.devices.len() {
            let id = DeviceId(i as u32);
            let mut events = core::mem::take(&mut self.event_buf);
            events.clear();
            if let Some(Some(dev)) = self.devices.get_mut(i) {
                let r = dev.ops.poll_events(&mut |e| events.push(e));
                if let Err(e) = r {
                    if dev.poll_errors == 0 {
                        log::warn!("{}: polling events: {e}", dev.info.name);
                    }
                    dev.poll_errors += 1;
                }
            }
            for ev in events.drain(..) {
                work += 1;
                let _ = self.dispatch_event(id, ev);
            }
            self.event_buf = events;
            // A dead device is not polled for MADs any more: its owner is
            // expected to unregister it (mlx4_ib removes the device on a
            // catastrophic error).
            if let Some(Some(dev)) = self.devices.get_mut(i)
                && !dev.fatal
            {
                work += crate::mad::poll_device(dev, &*self.clock, &self.mad_config);
            }
        }
        for ci in 0..self.clients.len() {
            let Some(mut slot) = self.clients.get_mut(ci).and_then(|s| s.take()) else {
                continue;
            };
            work += slot.client.poll(ClientId(ci as u32), self);
            if let Some(s @ None) = self.clients.get_mut(ci) {
                *s = Some(slot);
            }
        }
        work
    }

    /// Polls ([`IbCore::poll`]) until `f` returns `Some` or `timeout` passes
    /// (`-ETIMEDOUT`). `f` is checked once more after the deadline.
    pub fn poll_until<T>(
        &mut self,
        timeout: Duration,
        mut f: impl FnMut(&mut IbCore) -> Option<T>,
    ) -> Result<T> {
        let deadline = Deadline::after(&*self.clock, timeout);
        loop {
            let expired = deadline.expired(&*self.clock);
            self.poll();
            if let Some(v) = f(self) {
                return Ok(v);
            }
            if expired {
                return Err(Error::TimedOut);
            }
            self.clock.relax();
        }
    }
}
