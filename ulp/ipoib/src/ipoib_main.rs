//! Port of Linux `ipoib_main.c`: the ib_client that takes every InfiniBand port, the device of one port (`ipoib_dev_priv`), its path records and address handles, its neighbours, `ipoib_start_xmit`, and the [`net::Link`] the IP stack drives it through.
//!
//! Left out: P_Key child devices, connected mode, the netdev operations
//! the stack does not need (MTU changes, multicast lists, ethtool), and
//! sysfs. Linux keys its `ipoib_neigh` by the 20-byte hardware address and
//! leaves ARP to the kernel; here the link keeps the ARP table itself
//! ([`crate::arp`]) and keys what waits for resolution by neighbour IP or
//! by hardware address.
//!
//! # How a packet goes out
//!
//! The stack hands a packet and its next hop ([`net::Link::tx_commit`]).
//! The broadcast address of a connected network (or 255.255.255.255) goes
//! to the broadcast group's address handle, QPN 0xffffff; any other
//! address is looked up in the neighbour table (an ARP request for it goes
//! out if it is new), its hardware address gives the QPN and the GID, the
//! GID's path (a PathRecord from the SA, `path_rec_start`) gives the
//! address handle. A packet whose neighbour or path is still resolving is
//! held (a few per neighbour, [`crate::Config::pending_per_neigh`]) and
//! sent when it resolves, or dropped and counted when it fails. Paths are
//! kept for [`crate::Config::path_lifetime_us`] and marked for a new query
//! when the SM changes (SM change, client reregister, LID change, port up
//! or down: `ipoib_mark_paths_invalid`); a path marked so keeps carrying
//! traffic with its old address handle while the new query runs.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::time::Duration;

use ib_core::multicast;
use ib_core::sa_query::{self, PathRecord, SaQueryId, path_comp};
use ib_core::verbs::{Ah, Event, EventElement, EventType, Gid, LinkLayer, PortState, Wc};
use ib_core::{ClientId, Device, DeviceId, IbClient, IbCore};
use net::{HwAddr, Ipv4Address, Ipv4Cidr, Link, LinkKind, LinkStats, Neighbour};

use crate::arp::{self, Action, ArpPacket, NeighTable, Output};
use crate::ipoib_multicast::Bcast;
use crate::ipoib_verbs::{self, Transport};
use crate::{Config, Counters, IPOIB_ENCAP_LEN, IPOIB_UD_MTU, IpoibAddr};

// ---------------------------------------------------------------------------
// The client

/// Port events as `ipoib_event` sorts them, kept until the port's link
/// takes them at its next poll.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flush {
    /// SM change, client reregister, GID change: paths to be asked again
    /// (`flush_light`).
    pub light: bool,
    /// Port up or down, LID change: the port's attributes read again too
    /// (`flush_normal`).
    pub normal: bool,
    /// P_Key change: the broadcast group may be another one
    /// (`flush_heavy`).
    pub heavy: bool,
}

struct PortSlot {
    port: u8,
    name: String,
    opened: bool,
    flush: Flush,
}

/// The client's data on one device: its InfiniBand ports.
struct IpoibDevData {
    ports: Vec<PortSlot>,
}

/// The ib_client (`ipoib_client`: `ipoib_add_one`, `ipoib_remove_one`,
/// and `ipoib_event`, which Linux registers per port).
pub struct IpoibClient {
    next_index: u32,
}

/// One InfiniBand port the client took, as [`ports`] shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Device.
    pub dev: DeviceId,
    /// Port.
    pub port: u8,
    /// The link's name (`ib0`, ...).
    pub name: String,
    /// Whether [`ports_ready`] handed it out.
    pub opened: bool,
}

/// `ipoib_init_module`: registers the client (and ib_core's SA and
/// multicast clients, which it uses) once per core; a later call returns
/// the client already registered.
#[doc(alias = "ipoib_init_module")]
pub fn init(core: &mut IbCore) -> ClientId {
    init_with(core, 0)
}

/// [`init`] naming the first port `ib{first}`.
pub fn init_with(core: &mut IbCore, first: u32) -> ClientId {
    const NAME: &str = "ipoib";
    if let Some(id) = core.client_by_name(NAME) {
        return id;
    }
    sa_query::init(core);
    multicast::init(core);
    core.register_client(Box::new(IpoibClient { next_index: first }))
}

impl IbClient for IpoibClient {
    fn name(&self) -> &str {
        "ipoib"
    }

    fn accepts(&self, _n: ib_core::verbs::NodeType, t: ib_core::verbs::Transport) -> bool {
        t == ib_core::verbs::Transport::Ib
    }

    /// `ipoib_add_one`: every port whose link layer is InfiniBand gets a
    /// name (`rdma_protocol_ib`; an Ethernet port is declined).
    #[doc(alias = "ipoib_add_one")]
    fn add(&mut self, me: ClientId, dev: &mut Device) {
        let mut ports = Vec::new();
        for port in 1..=dev.phys_port_cnt() {
            match dev.port_link_layer(port) {
                Ok(LinkLayer::Infiniband) => {
                    let name = alloc::format!("ib{}", self.next_index);
                    self.next_index += 1;
                    ports.push(PortSlot {
                        port,
                        name,
                        opened: false,
                        flush: Flush::default(),
                    });
                }
                Ok(l) => log::info!(
                    "ipoib: {} port {port}: link layer {}, not an IPoIB port",
                    dev.name(),
                    l.name()
                ),
                Err(e) => log::warn!("ipoib: {} port {port}: {e}", dev.name()),
            }
        }
        dev.set_client_data(me, Box::new(IpoibDevData { ports }));
    }

    /// `ipoib_remove_one`: the links see their device gone at their next
    /// poll (no carrier, nothing sent); the kernel unregisters them.
    #[doc(alias = "ipoib_remove_one")]
    fn remove(&mut self, _me: ClientId, _dev: &mut Device) {}

    /// `ipoib_event`: sorted into light, normal and heavy flushes for the
    /// port's link.
    #[doc(alias = "ipoib_event")]
    fn event(&mut self, me: ClientId, dev: &mut Device, e: &Event) {
        let EventElement::Port(p) = e.element else {
            return;
        };
        let Some(d) = dev.client_data::<IpoibDevData>(me) else {
            return;
        };
        let Some(s) = d.ports.iter_mut().find(|s| s.port == p) else {
            return;
        };
        match e.event {
            EventType::SmChange | EventType::ClientReregister | EventType::GidChange => {
                s.flush.light = true
            }
            EventType::PortErr | EventType::PortActive | EventType::LidChange => {
                s.flush.normal = true
            }
            EventType::PkeyChange => s.flush.heavy = true,
            _ => {}
        }
    }
}

/// Every InfiniBand port the client took.
pub fn ports(core: &mut IbCore, client: ClientId) -> Vec<PortInfo> {
    let mut out = Vec::new();
    for id in core.device_ids() {
        let Some(d) = core.device_mut(id) else {
            continue;
        };
        if let Some(data) = d.client_data::<IpoibDevData>(client) {
            out.extend(data.ports.iter().map(|s| PortInfo {
                dev: id,
                port: s.port,
                name: s.name.clone(),
                opened: s.opened,
            }));
        }
    }
    out
}

/// The ports whose link has come up (trained: any state but Down, with or
/// without an SM) and that were not handed out yet; each is handed out
/// once, for the caller to [`IpoibDev::open`] and register. A port with no
/// cable waits here until it has one.
pub fn ports_ready(core: &mut IbCore, client: ClientId) -> Vec<PortInfo> {
    let mut out = Vec::new();
    for id in core.device_ids() {
        let Some(d) = core.device_mut(id) else {
            continue;
        };
        let up: Vec<u8> = (1..=d.phys_port_cnt())
            .filter(|&p| {
                d.port_cache(p)
                    .ok()
                    .and_then(|c| c.state)
                    .is_some_and(|s| s != PortState::Down && s != PortState::Nop)
            })
            .collect();
        if let Some(data) = d.client_data::<IpoibDevData>(client) {
            for s in data.ports.iter_mut() {
                if !s.opened && up.contains(&s.port) {
                    s.opened = true;
                    out.push(PortInfo {
                        dev: id,
                        port: s.port,
                        name: s.name.clone(),
                        opened: true,
                    });
                }
            }
        }
    }
    out
}

/// Takes the flushes the client kept for `port` of `dev` (None: the
/// device or its client data is gone).
fn take_flush(core: &mut IbCore, client: ClientId, dev: DeviceId, port: u8) -> Option<Flush> {
    let d = core.device_mut(dev)?.client_data::<IpoibDevData>(client)?;
    let s = d.ports.iter_mut().find(|s| s.port == port)?;
    Some(core::mem::take(&mut s.flush))
}

// ---------------------------------------------------------------------------
// Paths

/// A path to a GID (`struct ipoib_path`): the SA's record and the address
/// handle made from it.
pub(crate) struct Path {
    pub gid: Gid,
    pub rec: Option<PathRecord>,
    pub ah: Option<Ah>,
    /// False: ask the SA again at the next use (the old AH still serves).
    pub valid: bool,
    pub expires_us: u64,
    pub query: Option<SaQueryId>,
    /// The last query failed: what waits for the path is dropped, and the
    /// next one waits until `next_try_us`.
    pub failed: bool,
    pub next_try_us: u64,
    pub backoff_us: u64,
    pub used_us: u64,
}

/// Where a resolved frame goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dest {
    /// The broadcast group.
    Bcast,
    /// The QP at this address, through its GID's path.
    Addr(IpoibAddr),
}

/// What a held frame waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// For the neighbour's ARP.
    Neigh(Ipv4Address),
    /// For the path to this address's GID.
    Path(IpoibAddr),
    /// For a free send slot (the ring was full: Linux's qdisc queue).
    Ring(Dest),
}

/// A held frame (header and packet), in a slot allocated once.
pub(crate) struct Pending {
    pub wait: Option<Wait>,
    pub seq: u64,
    pub len: usize,
    pub buf: Vec<u8>,
}

// ---------------------------------------------------------------------------
// The device

/// One IPoIB port (`struct ipoib_dev_priv`): the link the IP stack polls.
pub struct IpoibDev {
    pub(crate) name: String,
    pub(crate) dev: DeviceId,
    pub(crate) port: u8,
    pub(crate) client: ClientId,
    pub(crate) mc: ClientId,
    pub(crate) sa: ClientId,
    pub(crate) cfg: Config,
    /// None once the device went away (or after [`IpoibDev::close`]).
    pub(crate) t: Option<Transport>,
    pub(crate) lid: u16,
    pub(crate) gid: Gid,
    pub(crate) pkey: u16,
    pub(crate) port_active: bool,
    pub(crate) hw: IpoibAddr,
    pub(crate) bcast_hw: IpoibAddr,
    pub(crate) bcast: Bcast,
    /// The IP MTU the broadcast group allows (2044 on a 2048-byte group).
    pub(crate) mcast_mtu: usize,
    // Rings.
    pub(crate) rx_wc: Vec<Wc>,
    pub(crate) rx_wc_len: usize,
    pub(crate) rx_wc_pos: usize,
    pub(crate) rx_posted: u32,
    /// Slots whose post failed, posted again at the next poll.
    pub(crate) rx_down: Vec<u32>,
    pub(crate) tx_wc: Vec<Wc>,
    pub(crate) tx_tail: u32,
    pub(crate) tx_outstanding: u32,
    /// The packet the stack is writing (header room in front).
    pub(crate) stage: Vec<u8>,
    pub(crate) staged: usize,
    /// An ARP frame being built.
    pub(crate) arp_frame: [u8; IPOIB_ENCAP_LEN + arp::ARP_LEN],
    // Resolution.
    pub(crate) neighs: NeighTable,
    pub(crate) paths: Vec<Path>,
    pub(crate) pending: Vec<Pending>,
    pub(crate) pending_seq: u64,
    pub(crate) addrs: Vec<Ipv4Cidr>,
    pub(crate) now_us: u64,
    pub(crate) stats: LinkStats,
    pub(crate) counters: Counters,
    /// Logged once: the device gone.
    pub(crate) gone_logged: bool,
}

impl IpoibDev {
    /// `ipoib_add_port` + `ipoib_open`: the port's QP, CQs and rings, the
    /// QP to RTS, the receive ring posted, the broadcast join started.
    /// `client` is [`init`]'s.
    #[doc(alias = "ipoib_add_port")]
    pub fn open(
        core: &mut IbCore,
        client: ClientId,
        info: &PortInfo,
        cfg: Config,
    ) -> ib_core::Result<IpoibDev> {
        let mc = multicast::init(core);
        let sa = sa_query::init(core);
        let (dev, port) = (info.dev, info.port);
        let d = core.device_mut(dev).ok_or(ib_core::Error::NoDev)?;
        let (gid, pkey, lid, active) = {
            let c = d.port_cache(port)?;
            (
                c.get_gid(0)?,
                c.get_pkey(0)?,
                c.lid,
                c.state == Some(PortState::Active),
            )
        };
        let t = ipoib_verbs::transport_dev_init(d, port, IPOIB_UD_MTU, &cfg)?;
        if let Err(e) = ipoib_verbs::init_qp(d, t.qp, port, 0) {
            ipoib_verbs::transport_dev_cleanup(d, t);
            return Err(e);
        }
        let hw = IpoibAddr::new(t.qpn, &gid);
        let tx_slot = t.tx_slot;
        let rx_n = t.rx_n as usize;
        let mut me = IpoibDev {
            name: info.name.clone(),
            dev,
            port,
            client,
            mc,
            sa,
            cfg,
            t: Some(t),
            lid,
            gid,
            pkey: pkey | 0x8000,
            port_active: active,
            hw,
            bcast_hw: IpoibAddr::broadcast(pkey),
            bcast: Bcast::default(),
            mcast_mtu: IPOIB_UD_MTU,
            rx_wc: vec![Wc::default(); 16],
            rx_wc_len: 0,
            rx_wc_pos: 0,
            rx_posted: 0,
            rx_down: Vec::with_capacity(rx_n),
            tx_wc: vec![Wc::default(); 16],
            tx_tail: 0,
            tx_outstanding: 0,
            stage: vec![0; IPOIB_ENCAP_LEN + IPOIB_UD_MTU],
            staged: 0,
            arp_frame: [0; IPOIB_ENCAP_LEN + arp::ARP_LEN],
            neighs: NeighTable::new(cfg.max_neighs),
            paths: Vec::with_capacity(cfg.max_paths),
            pending: (0..cfg.pending_slots)
                .map(|_| Pending {
                    wait: None,
                    seq: 0,
                    len: 0,
                    buf: vec![0; tx_slot],
                })
                .collect(),
            pending_seq: 0,
            addrs: Vec::new(),
            now_us: 0,
            stats: LinkStats::default(),
            counters: Counters::default(),
            gone_logged: false,
        };
        if let Err(e) = me.ib_post_receives(core) {
            me.close(core);
            return Err(e);
        }
        log::info!(
            "{}: {} port {port}: QPN {:#08x}, address {}",
            me.name,
            core.device(dev).map_or("?", |d| d.name()),
            me.hw.qpn(),
            me.hw
        );
        me.mcast_start(core);
        Ok(me)
    }

    /// `ipoib_dev_cleanup`: leaves the broadcast group and destroys the
    /// address handles, the QP, the CQs and the PD (nothing if the device
    /// is gone).
    #[doc(alias = "ipoib_dev_cleanup")]
    pub fn close(&mut self, core: &mut IbCore) {
        self.mcast_stop(core);
        let Some(t) = self.t.take() else {
            return;
        };
        if let Some(d) = core.device_mut(self.dev) {
            for p in self.paths.drain(..) {
                if let Some(ah) = p.ah {
                    let _ = d.destroy_ah(ah);
                }
            }
            ipoib_verbs::transport_dev_cleanup(d, t);
        }
        self.paths.clear();
        self.neighs.clear();
        for p in self.pending.iter_mut() {
            p.wait = None;
        }
    }

    /// The link's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device and port.
    pub fn port(&self) -> (DeviceId, u8) {
        (self.dev, self.port)
    }

    /// Our hardware address (flags 0, QPN, port GID).
    pub fn addr(&self) -> IpoibAddr {
        self.hw
    }

    /// The drops and events counted by reason.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The broadcast group's record while joined.
    pub fn bcast_record(&self) -> Option<ib_core::sa_query::McMemberRecord> {
        self.bcast.rec
    }

    /// Why the last broadcast join failed, while the group is not joined
    /// (the SA's refusal, no answer, or a group MTU the port cannot carry).
    pub fn join_error(&self) -> Option<ib_core::Error> {
        self.bcast.last_error
    }

    /// The neighbour table.
    pub fn neigh_table(&self) -> &NeighTable {
        &self.neighs
    }

    /// Paths held: (GID, DLID while resolved, whether valid).
    pub fn paths(&self) -> Vec<(Gid, Option<u16>, bool)> {
        self.paths
            .iter()
            .map(|p| (p.gid, p.rec.map(|r| r.dlid), p.valid))
            .collect()
    }

    /// Whether the carrier is up: the port Active and the broadcast group
    /// joined (`netif_carrier_on` in `ipoib_mcast_join_task`).
    pub fn carrier_ok(&self) -> bool {
        self.t.is_some() && self.port_active && self.bcast.ah.is_some()
    }

    // --- port state -------------------------------------------------------

    /// Reads the port's state, LID, GID and P_Key from the cache and acts
    /// on the flushes the client kept (`__ipoib_ib_dev_flush`).
    fn refresh_port(&mut self, core: &mut IbCore) {
        let Some(flush) = take_flush(core, self.client, self.dev, self.port) else {
            self.device_gone();
            return;
        };
        let Some(c) = core
            .device(self.dev)
            .and_then(|d| d.port_cache(self.port).ok())
        else {
            self.device_gone();
            return;
        };
        let active = c.state == Some(PortState::Active);
        let (lid, gid, pkey) = (
            c.lid,
            c.get_gid(0).unwrap_or(self.gid),
            c.get_pkey(0).unwrap_or(self.pkey) | 0x8000,
        );
        if active != self.port_active {
            log::debug!(
                "{}: port {} {}",
                self.name,
                self.port,
                if active { "active" } else { "down" }
            );
            self.port_active = active;
        }
        self.lid = lid;
        if gid != self.gid {
            log::info!("{}: port GID now {gid}", self.name);
            self.gid = gid;
            self.hw = IpoibAddr::new(self.hw.qpn(), &gid);
        }
        if flush.light || flush.normal {
            self.mark_paths_invalid();
        }
        if flush.heavy || pkey != self.pkey {
            if pkey != self.pkey {
                log::info!(
                    "{}: P_Key now {pkey:#06x}: joining its broadcast group",
                    self.name
                );
                self.pkey = pkey;
                self.bcast_hw = IpoibAddr::broadcast(pkey);
                self.mcast_restart(core);
            }
            self.mark_paths_invalid();
        }
    }

    fn device_gone(&mut self) {
        if !self.gone_logged {
            log::warn!("{}: the device went away: no carrier", self.name);
            self.gone_logged = true;
        }
        // The objects went with the device; the rings are freed here.
        self.t = None;
        self.bcast = Bcast::default();
        self.paths.clear();
        for p in self.pending.iter_mut() {
            p.wait = None;
        }
    }

    /// `ipoib_mark_paths_invalid`: every path is asked for again at its
    /// next use.
    #[doc(alias = "ipoib_mark_paths_invalid")]
    pub(crate) fn mark_paths_invalid(&mut self) {
        if self.paths.iter().any(|p| p.valid) {
            self.counters.path_flushes += 1;
        }
        for p in self.paths.iter_mut() {
            p.valid = false;
            p.failed = false;
            p.next_try_us = 0;
        }
    }

    // --- paths ------------------------------------------------------------

    fn path_index(&self, gid: &Gid) -> Option<usize> {
        self.paths.iter().position(|p| p.gid == *gid)
    }

    /// The path to `gid`, made if need be (the least recently used idle
    /// path goes when the table is full), with a query started when it
    /// has none and is not valid.
    fn path_for(&mut self, core: &mut IbCore, gid: Gid) -> Option<usize> {
        let now = self.now_us;
        let i = match self.path_index(&gid) {
            Some(i) => i,
            None => {
                if self.paths.len() >= self.cfg.max_paths.max(1) {
                    let busy = |g: &Gid, pending: &[Pending]| {
                        pending
                            .iter()
                            .any(|p| matches!(p.wait, Some(Wait::Path(a)) if a.gid() == *g))
                    };
                    let victim = self
                        .paths
                        .iter()
                        .enumerate()
                        .filter(|(_, p)| p.query.is_none() && !busy(&p.gid, &self.pending))
                        .min_by_key(|(_, p)| p.used_us)
                        .map(|(i, _)| i)?;
                    let p = self.paths.swap_remove(victim);
                    if let (Some(ah), Some(d)) = (p.ah, core.device_mut(self.dev)) {
                        let _ = d.destroy_ah(ah);
                    }
                }
                self.paths.push(Path {
                    gid,
                    rec: None,
                    ah: None,
                    valid: false,
                    expires_us: 0,
                    query: None,
                    failed: false,
                    next_try_us: 0,
                    backoff_us: self.cfg.path_backoff_us,
                    used_us: now,
                });
                self.paths.len() - 1
            }
        };
        let p = &mut self.paths[i];
        p.used_us = now;
        if p.valid && now >= p.expires_us {
            p.valid = false;
        }
        if !p.valid && p.query.is_none() && now >= p.next_try_us {
            self.path_rec_start(core, i);
        }
        Some(i)
    }

    /// `path_rec_start`: a PathRecord Get for the path's GID from our GID,
    /// in our partition, one path, the broadcast group's traffic class.
    fn path_rec_start(&mut self, core: &mut IbCore, i: usize) {
        let rec = PathRecord {
            dgid: self.paths[i].gid,
            sgid: self.gid,
            pkey: self.pkey,
            numb_path: 1,
            traffic_class: self.bcast.rec.map_or(0, |r| r.traffic_class),
            ..PathRecord::default()
        };
        let mask = path_comp::DGID
            | path_comp::SGID
            | path_comp::NUMB_PATH
            | path_comp::TRAFFIC_CLASS
            | path_comp::PKEY;
        let timeout = Duration::from_millis(u64::from(self.cfg.path_query_ms.max(1)));
        self.counters.path_queries += 1;
        match sa_query::path_rec_get(core, self.sa, self.dev, self.port, &rec, mask, timeout) {
            Ok(q) => self.paths[i].query = Some(q),
            Err(e) => self.path_failed(i, e),
        }
    }

    fn path_failed(&mut self, i: usize, e: ib_core::Error) {
        let now = self.now_us;
        let p = &mut self.paths[i];
        self.counters.path_failures += 1;
        if !p.failed {
            log::warn!(
                "{}: no path to {} ({e}); trying again in {} ms",
                self.name,
                p.gid,
                p.backoff_us / 1000
            );
        }
        p.failed = true;
        p.query = None;
        p.next_try_us = now + p.backoff_us;
        p.backoff_us = (p.backoff_us * 2).min(self.cfg.path_backoff_us * 16);
    }

    /// `path_rec_completion` for every path whose query ended.
    #[doc(alias = "path_rec_completion")]
    fn path_completions(&mut self, core: &mut IbCore) {
        for i in 0..self.paths.len() {
            let Some(q) = self.paths[i].query else {
                continue;
            };
            let Some(r) = sa_query::query_result(core, self.sa, q) else {
                continue;
            };
            self.paths[i].query = None;
            let gid = self.paths[i].gid;
            let made = r
                .and_then(|resp| {
                    resp.path_records()?
                        .into_iter()
                        .next()
                        .ok_or(ib_core::Error::NotFound)
                })
                .and_then(|rec| {
                    if rec.dgid != gid {
                        return Err(ib_core::Error::Invalid(
                            "the SA answered with a path to another GID",
                        ));
                    }
                    let d = core.device_mut(self.dev).ok_or(ib_core::Error::NoDev)?;
                    let attr = sa_query::init_ah_from_path(d, self.port, &rec)?;
                    let pd = self.t.as_ref().ok_or(ib_core::Error::NoDev)?.pd;
                    let ah = d.create_ah(pd, &attr)?;
                    Ok((rec, ah))
                });
            match made {
                Ok((rec, ah)) => {
                    let now = self.now_us;
                    let p = &mut self.paths[i];
                    if let (Some(old), Some(d)) = (p.ah, core.device_mut(self.dev)) {
                        let _ = d.destroy_ah(old);
                    }
                    if p.rec.is_none_or(|o| o.dlid != rec.dlid || o.sl != rec.sl) {
                        log::debug!(
                            "{}: path to {gid}: LID {:#x} SL {} rate {} MTU code {}",
                            self.name,
                            rec.dlid,
                            rec.sl,
                            rec.rate,
                            rec.mtu
                        );
                    }
                    p.rec = Some(rec);
                    p.ah = Some(ah);
                    p.valid = true;
                    p.failed = false;
                    p.expires_us = now + self.cfg.path_lifetime_us;
                    p.backoff_us = self.cfg.path_backoff_us;
                    self.counters.path_ahs += 1;
                }
                Err(e) => self.path_failed(i, e),
            }
        }
    }

    // --- sending ----------------------------------------------------------

    /// Whether `dst` is a broadcast address on this link: 255.255.255.255
    /// or the broadcast address of one of our networks.
    fn is_broadcast(&self, dst: &Ipv4Address) -> bool {
        dst.is_broadcast()
            || self
                .addrs
                .iter()
                .any(|c| c.prefix_len() < 31 && c.broadcast() == Some(*dst))
    }

    /// Sends `frame` (header and packet) to the broadcast group.
    fn send_bcast(&mut self, core: &mut IbCore, frame: &[u8]) {
        if self.bcast.ah.is_none() {
            self.counters.tx_no_dest += 1;
            self.stats.tx_dropped += 1;
            return;
        }
        self.send_or_queue(core, frame, Dest::Bcast);
    }

    /// Whether frames wait for send slots.
    fn ring_waiting(&self) -> bool {
        self.pending
            .iter()
            .any(|p| matches!(p.wait, Some(Wait::Ring(_))))
    }

    /// Sends a resolved frame now, or holds it until a send slot frees
    /// (behind the frames held before it), or drops and counts it when
    /// nothing can hold it.
    fn send_or_queue(&mut self, core: &mut IbCore, frame: &[u8], dest: Dest) {
        if self.ring_waiting() || !self.tx_slot_free(core) {
            let slot = self.pending.iter().position(|p| p.wait.is_none());
            match slot {
                Some(s) if frame.len() <= self.pending[s].buf.len() => {
                    self.pending_seq += 1;
                    let p = &mut self.pending[s];
                    p.buf[..frame.len()].copy_from_slice(frame);
                    p.len = frame.len();
                    p.seq = self.pending_seq;
                    p.wait = Some(Wait::Ring(dest));
                }
                _ => {
                    self.counters.tx_ring_full += 1;
                    self.stats.tx_dropped += 1;
                }
            }
            // Held only to keep the order: the ring may take them now.
            self.flush_pending(core);
            return;
        }
        self.send_resolved(core, frame, dest);
    }

    /// Sends to `dest` with the address handle it has now (dropped and
    /// counted if it has none any more).
    fn send_resolved(&mut self, core: &mut IbCore, frame: &[u8], dest: Dest) {
        let (ah, qpn) = match dest {
            Dest::Bcast => (self.bcast.ah, crate::IPOIB_MCAST_QPN),
            Dest::Addr(a) => (
                self.path_index(&a.gid()).and_then(|i| self.paths[i].ah),
                a.qpn(),
            ),
        };
        match ah {
            Some(ah) => {
                self.ib_send(core, frame, ah, qpn);
            }
            None => {
                match dest {
                    Dest::Bcast => self.counters.tx_no_dest += 1,
                    Dest::Addr(_) => self.counters.tx_no_path += 1,
                }
                self.stats.tx_dropped += 1;
            }
        }
    }

    /// `ipoib_start_xmit` for a unicast next hop: resolve, then send or
    /// hold.
    fn send_to_neigh(&mut self, core: &mut IbCore, frame: &[u8], ip: Ipv4Address) {
        let now = self.now_us;
        let pending = &self.pending;
        let busy = |x: &Ipv4Address| pending.iter().any(|p| p.wait == Some(Wait::Neigh(*x)));
        match self.neighs.output(ip, now, &self.cfg, &busy) {
            Output::Send(a) => self.send_to_addr(core, frame, a),
            Output::Hold => {
                self.hold(Wait::Neigh(ip), frame);
                // A new entry asks at once.
                self.neigh_timers(core);
            }
            Output::NoRoom => {
                self.counters.tx_queue_full += 1;
                self.stats.tx_dropped += 1;
            }
        }
    }

    /// Sends `frame` to the QP at `a` through its path, holding it while
    /// the path resolves (`neigh_add_path` / `unicast_arp_send`).
    fn send_to_addr(&mut self, core: &mut IbCore, frame: &[u8], a: IpoibAddr) {
        let Some(i) = self.path_for(core, a.gid()) else {
            self.counters.tx_queue_full += 1;
            self.stats.tx_dropped += 1;
            return;
        };
        let p = &self.paths[i];
        match p.ah {
            Some(_) => self.send_or_queue(core, frame, Dest::Addr(a)),
            None if p.failed && p.query.is_none() => {
                self.counters.tx_no_path += 1;
                self.stats.tx_dropped += 1;
            }
            None => self.hold(Wait::Path(a), frame),
        }
    }

    /// Keeps `frame` until what it waits for resolves (or drops and counts
    /// it when no slot is free or its neighbour holds enough already).
    fn hold(&mut self, wait: Wait, frame: &[u8]) {
        let same = self.pending.iter().filter(|p| p.wait == Some(wait)).count();
        let slot = self.pending.iter().position(|p| p.wait.is_none());
        match slot {
            Some(s)
                if same < self.cfg.pending_per_neigh
                    && frame.len() <= self.pending[s].buf.len() =>
            {
                self.pending_seq += 1;
                let p = &mut self.pending[s];
                p.buf[..frame.len()].copy_from_slice(frame);
                p.len = frame.len();
                p.seq = self.pending_seq;
                p.wait = Some(wait);
            }
            _ => {
                self.counters.tx_queue_full += 1;
                self.stats.tx_dropped += 1;
            }
        }
    }

    /// Sends what was held and can go now, oldest first; drops what waited
    /// for a neighbour that failed or a path whose query failed.
    fn flush_pending(&mut self, core: &mut IbCore) {
        if self.pending.iter().all(|p| p.wait.is_none()) {
            return;
        }
        loop {
            let ring_free = self.tx_slot_free(core);
            // The oldest slot that can move.
            let mut best: Option<(usize, u64)> = None;
            for (i, p) in self.pending.iter().enumerate() {
                let Some(w) = p.wait else { continue };
                let movable = match w {
                    Wait::Neigh(ip) => self
                        .neighs
                        .get(&ip)
                        .is_none_or(|n| n.state != net::NeighState::Incomplete),
                    Wait::Path(a) => self.path_index(&a.gid()).is_none_or(|pi| {
                        let p = &self.paths[pi];
                        (p.ah.is_some() && ring_free) || (p.failed && p.query.is_none())
                    }),
                    Wait::Ring(_) => ring_free,
                };
                if movable && best.is_none_or(|(_, s)| p.seq < s) {
                    best = Some((i, p.seq));
                }
            }
            let Some((i, _)) = best else {
                return;
            };
            let Some(w) = self.pending[i].wait else {
                return;
            };
            match w {
                Wait::Neigh(ip) => match self.neighs.get(&ip).and_then(|n| n.addr) {
                    Some(a) => {
                        // Resolved: now it waits for the path (or goes).
                        self.pending[i].wait = Some(Wait::Path(a));
                        if self.path_for(core, a.gid()).is_none() {
                            self.drop_pending(i, DropWhy::QueueFull);
                        }
                    }
                    None => self.drop_pending(i, DropWhy::Unresolved),
                },
                Wait::Path(a) => {
                    let has_ah = self
                        .path_index(&a.gid())
                        .is_some_and(|pi| self.paths[pi].ah.is_some());
                    if has_ah {
                        self.send_pending(core, i, Dest::Addr(a));
                    } else {
                        self.drop_pending(i, DropWhy::NoPath);
                    }
                }
                Wait::Ring(dest) => self.send_pending(core, i, dest),
            }
        }
    }

    /// Sends held slot `i` to `dest` (a send slot is free).
    fn send_pending(&mut self, core: &mut IbCore, i: usize, dest: Dest) {
        let len = self.pending[i].len;
        let buf = core::mem::take(&mut self.pending[i].buf);
        self.pending[i].wait = None;
        self.send_resolved(core, &buf[..len], dest);
        self.pending[i].buf = buf;
    }

    fn drop_pending(&mut self, i: usize, why: DropWhy) {
        self.pending[i].wait = None;
        self.stats.tx_dropped += 1;
        match why {
            DropWhy::Unresolved => self.counters.tx_unresolved += 1,
            DropWhy::NoPath => self.counters.tx_no_path += 1,
            DropWhy::QueueFull => self.counters.tx_queue_full += 1,
        }
    }

    // --- ARP --------------------------------------------------------------

    /// Builds an ARP packet from us into `arp_frame` and sends it:
    /// broadcast, or unicast to `to`.
    fn arp_send(
        &mut self,
        core: &mut IbCore,
        op: u16,
        tip: Ipv4Address,
        tha: IpoibAddr,
        sip: Ipv4Address,
        to: Option<IpoibAddr>,
    ) {
        let p = ArpPacket {
            op,
            sha: self.hw,
            sip,
            tha,
            tip,
        };
        let mut f = self.arp_frame;
        crate::put_header(&mut f, crate::ETH_P_ARP);
        p.emit(&mut f[IPOIB_ENCAP_LEN..]);
        if op == arp::ARPOP_REQUEST {
            self.counters.arp_requests_tx += 1;
        } else {
            self.counters.arp_replies_tx += 1;
        }
        match to {
            Some(a) => self.send_to_addr(core, &f, a),
            None => self.send_bcast(core, &f),
        }
    }

    /// Our address to ask from for `ip`: the one whose network holds it,
    /// else the first.
    fn source_for(&self, ip: &Ipv4Address) -> Option<Ipv4Address> {
        self.addrs
            .iter()
            .find(|c| c.contains_addr(ip))
            .or(self.addrs.first())
            .map(|c| c.address())
    }

    /// The neighbour state machine: requests out, failures dropped.
    /// The neighbour `ip` for the RDMA CM's address resolution (what
    /// Linux's `addr.c` gets from `dst_fetch_ha` and `neigh_event_send`):
    /// its hardware address once resolved, `None` while ARP asks. `start`
    /// creates the entry (or restarts a failed one) and sends the first
    /// request at once; without it a failed entry is `-EHOSTUNREACH`.
    pub fn neigh_resolve(
        &mut self,
        core: &mut IbCore,
        ip: Ipv4Address,
        start: bool,
    ) -> ib_core::Result<Option<IpoibAddr>> {
        if let Some(n) = self.neighs.get(&ip) {
            match n.state {
                net::NeighState::Failed if !start => {
                    return Err(ib_core::Error::Errno(ib_core::error::errno::EHOSTUNREACH));
                }
                // Already asking.
                net::NeighState::Incomplete => return Ok(None),
                net::NeighState::Failed => {}
                _ => {
                    if let Some(a) = n.addr {
                        return Ok(Some(a));
                    }
                }
            }
        }
        let now = self.now_us;
        let pending = &self.pending;
        let busy = |x: &Ipv4Address| pending.iter().any(|p| p.wait == Some(Wait::Neigh(*x)));
        match self.neighs.output(ip, now, &self.cfg, &busy) {
            Output::Send(a) => Ok(Some(a)),
            Output::Hold => {
                self.neigh_timers(core);
                Ok(None)
            }
            Output::NoRoom => Err(ib_core::Error::NoMem),
        }
    }

    fn neigh_timers(&mut self, core: &mut IbCore) {
        let mut acts: [Option<Action>; 8] = [None; 8];
        let mut n = 0;
        let mut more = false;
        {
            let pending = &self.pending;
            let busy = |x: &Ipv4Address| pending.iter().any(|p| p.wait == Some(Wait::Neigh(*x)));
            self.neighs.timers(
                self.now_us,
                &self.cfg,
                &busy,
                &mut |a| match acts.get_mut(n) {
                    Some(s) => {
                        *s = Some(a);
                        n += 1;
                    }
                    None => more = true,
                },
            );
        }
        let _ = more; // the rest go at the next poll: their timers stay due
        for a in acts.into_iter().flatten() {
            match a {
                Action::Request { ip, to } => {
                    let Some(sip) = self.source_for(&ip) else {
                        continue;
                    };
                    let tha = to.unwrap_or_default();
                    self.arp_send(core, arp::ARPOP_REQUEST, ip, tha, sip, to);
                }
                Action::Failed { ip } => {
                    self.counters.neigh_failed += 1;
                    log::debug!("{}: {ip}: no ARP answer", self.name);
                }
            }
        }
        self.flush_pending(core);
    }

    /// `arp_process` for an ARP packet received from QP `src_qp`.
    pub(crate) fn arp_rcv(&mut self, core: &mut IbCore, b: &[u8]) {
        self.counters.arp_rx += 1;
        let p = match ArpPacket::parse(b) {
            Ok(p) => p,
            Err(_) => {
                self.counters.arp_bad += 1;
                self.stats.rx_errors += 1;
                return;
            }
        };
        let addrs = &self.addrs;
        let ours = |a: &Ipv4Address| addrs.iter().any(|c| c.address() == *a);
        let pending = &self.pending;
        let busy = |x: &Ipv4Address| pending.iter().any(|q| q.wait == Some(Wait::Neigh(*x)));
        match arp::process(&mut self.neighs, &p, &self.hw, &ours, self.now_us, &busy) {
            arp::Verdict::Bad => {
                self.counters.arp_bad += 1;
                self.stats.rx_errors += 1;
                return;
            }
            // Duplicate address detection: not answered here.
            arp::Verdict::Probe => {
                self.counters.arp_probes_ignored += 1;
                return;
            }
            arp::Verdict::Own => return,
            // The reply goes straight to the asker's address.
            arp::Verdict::Answer => {
                self.arp_send(core, arp::ARPOP_REPLY, p.sip, p.sha, p.tip, Some(p.sha));
            }
            arp::Verdict::Seen | arp::Verdict::Reply => {}
            arp::Verdict::Unsolicited => {
                self.counters.arp_unsolicited += 1;
                self.stats.rx_dropped += 1;
            }
        }
        self.flush_pending(core);
    }
}

#[derive(Clone, Copy)]
enum DropWhy {
    Unresolved,
    NoPath,
    QueueFull,
}

// ---------------------------------------------------------------------------
// The link

impl Link<IbCore> for IpoibDev {
    fn kind(&self) -> LinkKind {
        LinkKind::Infiniband
    }

    fn mtu(&self) -> usize {
        IPOIB_UD_MTU
    }

    fn carrier(&self) -> bool {
        self.carrier_ok()
    }

    fn hw_addr(&self) -> HwAddr {
        self.hw.hw()
    }

    fn broadcast(&self) -> HwAddr {
        self.bcast_hw.hw()
    }

    fn stats(&self) -> LinkStats {
        self.stats
    }

    fn neighbours(&self, f: &mut dyn FnMut(&Neighbour)) {
        self.neighs.for_each(f);
    }

    fn addrs_changed(&mut self, addrs: &[Ipv4Cidr]) {
        self.addrs.clear();
        self.addrs.extend_from_slice(addrs);
    }

    fn poll(&mut self, core: &mut IbCore, now_us: u64) {
        self.now_us = self.now_us.max(now_us);
        if self.t.is_none() {
            return;
        }
        self.refresh_port(core);
        if self.t.is_none() {
            return;
        }
        self.mcast_poll(core);
        self.ib_poll_tx(core);
        self.path_completions(core);
        // (This flushes what was held, send slots first.)
        self.neigh_timers(core);
        self.ib_refill_receives(core);
    }

    fn receive(&mut self, core: &mut IbCore, buf: &mut [u8]) -> Option<usize> {
        // Bounded: ARP and dropped frames are taken here too, a flood of
        // them cannot hold the poll.
        for _ in 0..64 {
            let wc = self.ib_next_rx_wc(core)?;
            if let Some(n) = self.ib_handle_rx_wc(core, &wc, buf) {
                return Some(n);
            }
        }
        None
    }

    fn tx_ready(&mut self, core: &mut IbCore) -> bool {
        // While frames wait for send slots the stack keeps its own.
        self.t.is_some() && !self.ring_waiting() && self.tx_slot_free(core)
    }

    fn tx_buffer(&mut self, _core: &mut IbCore, len: usize) -> Option<&mut [u8]> {
        if self.t.is_none() || len > IPOIB_UD_MTU {
            return None;
        }
        self.staged = len;
        self.stage.get_mut(IPOIB_ENCAP_LEN..IPOIB_ENCAP_LEN + len)
    }

    fn as_any(&self) -> Option<&dyn core::any::Any> {
        Some(self)
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn core::any::Any> {
        Some(self)
    }

    fn tx_commit(&mut self, core: &mut IbCore, next_hop: Ipv4Address) {
        let len = core::mem::take(&mut self.staged);
        if self.t.is_none() {
            return;
        }
        let mut stage = core::mem::take(&mut self.stage);
        crate::put_header(&mut stage, crate::ETH_P_IP);
        let frame = &stage[..IPOIB_ENCAP_LEN + len];
        let dst = frame
            .get(IPOIB_ENCAP_LEN + 16..IPOIB_ENCAP_LEN + 20)
            .map(|d| Ipv4Address::new(d[0], d[1], d[2], d[3]));
        if next_hop.is_unspecified() {
            self.counters.tx_no_dest += 1;
            self.stats.tx_dropped += 1;
        } else if self.is_broadcast(&next_hop) || dst.is_some_and(|d| self.is_broadcast(&d)) {
            self.send_bcast(core, frame);
        } else if next_hop.is_multicast() {
            self.counters.tx_multicast += 1;
            self.stats.tx_dropped += 1;
        } else {
            self.send_to_neigh(core, frame, next_hop);
        }
        self.stage = stage;
    }
}
