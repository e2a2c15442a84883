//! A port's network device, as Linux's `en_netdev.c` opens and closes it (`mlx4_en_init_netdev`, `mlx4_en_start_port`, `mlx4_en_stop_port`, the link-state work), and the [`net::Link`] through which the IP stack drives it.
//!
//! VLAN devices (Linux's 8021q devices over an mlx4_en port, `ip link add
//! link eth0 name eth0.5 type vlan id 5`) are [`VlanLink`]s sharing the
//! port's rings: `mlx4_en_vlan_rx_add_vid` registers the VID in the port's
//! VLAN table (the card then takes frames tagged with it, strips the tag
//! and reports it in the CQE), a VLAN device's frames are sent with the
//! card inserting the tag (`MLX4_WQE_CTRL_INS_CVLAN`), and a received frame
//! goes to the device of its VID. Whichever device's poll takes a frame
//! off the ring that belongs to another keeps it in that device's backlog
//! (at most [`BACKLOG`] frames, more are counted as dropped).
//!
//! Left out: RSS and its indirection QP, more than one ring per direction,
//! the VLAN filter (`mlx4_SET_VLAN_FLTR`: the VLAN table alone decides),
//! VLAN priorities (frames go with PCP 0), multicast lists (the port's
//! multicast filter is off: every multicast and broadcast frame reaches the
//! ring), MTU changes while open, the statistics and link-state workqueues
//! (the link state follows the port's events; the counters are read when
//! asked for), watchdog and self-test.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::any::Any;
use core::sync::atomic::{AtomicBool, Ordering};

use mlx4_core::dev::{Mtt, Uar};
use mlx4_core::hw::port::eth::MCAST_DISABLE;
use mlx4_core::intf::{Event, Interface, IntfId, Protocol, ProtocolDev};
use mlx4_core::mr::Mr;
use mlx4_core::qp::Qp;
use mlx4_core::{Caps, Dev, PortType};
use mlx4_hw::mr::flags::{PERM_LOCAL_READ, PERM_LOCAL_WRITE};
use mlx4_hw::qp::{QpContext, QpState, st};
use net::link::{HwAddr, Link, LinkKind, LinkStats};

use crate::en_port::{PortStats, dump_eth_stats};
use crate::en_rx::RxRing;
use crate::en_tx::TxRing;
use crate::{ETH_FCS_LEN, ETH_HLEN, Error, RX_BUF_SIZE, Result, VLAN_HLEN, mac_bytes};

/// What a port is opened with (Linux's module parameters and defaults,
/// smaller rings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnConfig {
    /// Receive descriptors (a power of two; Linux 1024).
    pub rx_ring_size: u32,
    /// Send descriptors (a power of two; Linux 1024).
    pub tx_ring_size: u32,
    /// The IP MTU (Linux `ETH_DATA_LEN`).
    pub mtu: usize,
    /// Global pause on in both directions (Linux's `pfctx`/`pfcrx` 0 and
    /// `rx_pause`/`tx_pause` 1).
    pub pause: bool,
}

impl Default for EnConfig {
    fn default() -> EnConfig {
        EnConfig {
            rx_ring_size: 256,
            tx_ring_size: 128,
            mtu: crate::ETH_DATA_LEN,
            pause: true,
        }
    }
}

/// A ring's counters (Linux `struct mlx4_en_rx_ring`/`tx_ring` stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Frames moved.
    pub packets: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Completions in error (and bad FCS on receive).
    pub errors: u64,
    /// Frames dropped by the driver (too short or long for the buffer).
    pub dropped: u64,
    /// Multicast and broadcast frames received.
    pub multicast: u64,
}

/// Linux `mlx4_en_fill_qp_context` for a raw Ethernet QP (ST MLX) on
/// `port`: PD, UAR, both CQNs `cqn`, the receive queue geometry and
/// doorbell record if it has one, scheduling queue of the port, no counter.
pub(crate) fn fill_qp_context(
    port: u8,
    pdn: u32,
    uar_index: u32,
    cqn: u32,
    rq: Option<(u8, u64)>,
    sq_size_stride: u8,
) -> QpContext {
    let mut c = QpContext {
        flags: st::MLX << 16,
        pd: pdn,
        mtu_msgmax: 0xff,
        sq_size_stride,
        usr_page: uar_index,
        cqn_send: cqn,
        cqn_recv: cqn,
        ..QpContext::default()
    };
    if let Some((rq_size_stride, db)) = rq {
        c.rq_size_stride = rq_size_stride;
        c.db_rec_addr = db;
    }
    c.pri_path.ackto = 1;
    c.pri_path.sched_queue = 0x83 | (port - 1) << 6;
    c.pri_path.counter_index = 0xff;
    c
}

/// The QP half of `mlx4_en_deactivate_{rx,tx}_ring`, for whatever a ring's
/// activation got to: the QP back to RST (a failure only leaves it to the
/// card) and its context memory freed, then `mtt`.
pub(crate) fn qp_destroy(dev: &mut Dev, qp: Option<Qp>, mtt: Option<Mtt>) {
    if let Some(qp) = qp {
        let _ = dev.qp_modify(
            &qp,
            None,
            QpState::Rts,
            QpState::Rst,
            &QpContext::default(),
            0,
            false,
        );
        dev.qp_free(qp);
    }
    if let Some(m) = mtt {
        dev.mtt_cleanup(&m);
    }
}

/// The events mlx4_en takes from mlx4_core for one port (Linux
/// `mlx4_en_event`), and what it tells mlx4_ib about its device (Linux
/// `mlx4_en_get_netdev`).
struct EnIntf {
    port: u8,
    name: String,
    mac: u64,
    mtu: u32,
    link: Arc<AtomicBool>,
}

impl Interface for EnIntf {
    fn protocol(&self) -> Option<Protocol> {
        Some(Protocol::En)
    }

    fn get_dev(&self, port: u8) -> Option<ProtocolDev> {
        (port == self.port).then(|| ProtocolDev {
            name: self.name.clone(),
            mac: self.mac,
            mtu: self.mtu,
            up: self.link.load(Ordering::Relaxed),
        })
    }

    fn event(&mut self, _caps: &Caps, event: Event) {
        match event {
            Event::PortUp { port } if port == self.port => {
                self.link.store(true, Ordering::Relaxed);
                log::info!("{}: Link Up", self.name);
            }
            Event::PortDown { port } if port == self.port => {
                self.link.store(false, Ordering::Relaxed);
                log::info!("{}: Link Down", self.name);
            }
            _ => {}
        }
    }
}

/// Frames kept for a device whose frame another device's poll took off the
/// ring, per device.
pub const BACKLOG: usize = 64;

/// A VLAN device on the port (the 8021q device of a VID Linux's
/// `mlx4_en_vlan_rx_add_vid` registered), as the port keeps it.
struct Vlan {
    vid: u16,
    backlog: VecDeque<Vec<u8>>,
    stats: LinkStats,
}

/// One open Ethernet port (Linux `struct mlx4_en_priv`).
pub struct EnPriv {
    /// The device's name (`eth0`).
    pub name: String,
    /// The port (1-based).
    pub port: u8,
    /// Its MAC (low 48 bits).
    pub mac: u64,
    /// The MAC's index in the port's MAC table.
    pub mac_index: u32,
    /// The port's first steered QPN (`mlx4_get_base_qpn`).
    pub base_qpn: u32,
    /// The IP MTU.
    pub mtu: usize,
    /// Link speed in Mb/s from QUERY_PORT at open (0: unknown).
    pub speed_mbps: u32,
    /// An opaque handle the link's owner finds the `Dev` by.
    pub handle: u32,
    pdn: Option<u32>,
    uar: Option<Uar>,
    mr: Option<Mr>,
    tx: Option<TxRing>,
    rx: Option<RxRing>,
    link: Arc<AtomicBool>,
    intf: Option<IntfId>,
    mac_registered: bool,
    port_up: bool,
    /// Frames the stack handed that could not be posted (ring full).
    pub tx_dropped: u64,
    /// The VLAN devices, in the order added.
    vlans: Vec<Vlan>,
    /// Untagged frames a VLAN device's poll took off the ring.
    backlog: VecDeque<Vec<u8>>,
    /// Received frames no device took: a VID without a device (killed
    /// while frames were in flight) or a backlog full.
    pub rx_unclaimed: u64,
}

impl EnPriv {
    /// `mlx4_en_init_netdev` + `mlx4_en_start_port` for `port` of `dev`:
    /// PD, UAR and the DMA MR; the MAC registered; the CQs and rings; the
    /// MTU and pause (SET_PORT general), steering to the receive ring
    /// (RQP_CALC), every multicast let through; INIT_PORT. Whatever was
    /// set up is undone on failure.
    pub fn open(dev: &mut Dev, port: u8, name: &str, handle: u32, cfg: EnConfig) -> Result<EnPriv> {
        let caps = dev.caps();
        if port == 0
            || port > caps.num_ports
            || caps.port[usize::from(port)].port_type != PortType::Eth
        {
            return Err(Error::NotEthernet(port));
        }
        for n in [cfg.rx_ring_size, cfg.tx_ring_size] {
            if !n.is_power_of_two() || !(2..=8192).contains(&n) {
                return Err(Error::BadRingSize(n));
            }
        }
        if !(68..=RX_BUF_SIZE - ETH_HLEN - VLAN_HLEN - ETH_FCS_LEN - 48).contains(&cfg.mtu) {
            return Err(Error::BadMtu(cfg.mtu));
        }
        let mut p = EnPriv {
            name: String::from(name),
            port,
            mac: caps.port[usize::from(port)].def_mac & 0xffff_ffff_ffff,
            mac_index: 0,
            base_qpn: dev.get_base_qpn(port),
            mtu: cfg.mtu,
            speed_mbps: 0,
            handle,
            pdn: None,
            uar: None,
            mr: None,
            tx: None,
            rx: None,
            link: Arc::new(AtomicBool::new(false)),
            intf: None,
            mac_registered: false,
            port_up: false,
            tx_dropped: 0,
            vlans: Vec::new(),
            backlog: VecDeque::new(),
            rx_unclaimed: 0,
        };
        match p.start(dev, cfg) {
            Ok(()) => {
                log::info!(
                    "{name}: mlx4_en: port {port}, MAC {}, rings {}/{} (rx/tx), QPN {:#x}",
                    HwAddr::new(&mac_bytes(p.mac)),
                    cfg.rx_ring_size,
                    cfg.tx_ring_size,
                    p.base_qpn + p.mac_index
                );
                Ok(p)
            }
            Err(e) => {
                log::error!("{name}: mlx4_en: cannot start port {port}: {e}");
                p.stop(dev);
                Err(e)
            }
        }
    }

    fn start(&mut self, dev: &mut Dev, cfg: EnConfig) -> Result<()> {
        let port = self.port;
        let pdn = *self.pdn.insert(dev.pd_alloc()?);
        let uar = &*self.uar.insert(dev.uar_alloc()?);
        let mut mr = dev.mr_alloc(pdn, 0, !0, PERM_LOCAL_READ | PERM_LOCAL_WRITE, 0, 0)?;
        if let Err(e) = dev.mr_enable(&mut mr) {
            let _ = dev.mr_free(mr);
            return Err(e.into());
        }
        let lkey = self.mr.insert(mr).key;
        self.mac_index = dev.register_mac(port, self.mac)?;
        self.mac_registered = true;
        let qpn = self.base_qpn + self.mac_index;
        self.rx = Some(RxRing::create(
            dev,
            port,
            qpn,
            cfg.rx_ring_size,
            uar,
            pdn,
            lkey,
        )?);
        self.tx = Some(TxRing::create(dev, port, cfg.tx_ring_size, uar, pdn, lkey)?);
        let frame = (cfg.mtu + ETH_HLEN + VLAN_HLEN + ETH_FCS_LEN) as u16;
        dev.set_port_general(port, frame, cfg.pause, 0, cfg.pause, 0)?;
        dev.set_port_qpn_calc(port, self.base_qpn, false)?;
        dev.set_mcast_fltr(port, 0, false, MCAST_DISABLE)?;
        // Events before INIT_PORT so that the port's first PORT_CHANGE is
        // not missed; the state as QUERY_PORT has it after.
        self.intf = Some(dev.register_interface(Box::new(EnIntf {
            port,
            name: self.name.clone(),
            mac: self.mac,
            mtu: self.mtu as u32,
            link: self.link.clone(),
        })));
        dev.init_port(port)?;
        self.port_up = true;
        let st = dev.query_eth_port(port)?;
        self.speed_mbps = st.speed_mbps();
        if st.link_up {
            self.link.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// `mlx4_en_stop_port` + the frees of `mlx4_en_destroy_netdev`, for
    /// whatever [`EnPriv::start`] got to.
    fn stop(&mut self, dev: &mut Dev) {
        for v in core::mem::take(&mut self.vlans) {
            dev.unregister_vlan(self.port, v.vid);
        }
        self.backlog.clear();
        if core::mem::take(&mut self.port_up)
            && let Err(e) = dev.close_port(self.port)
        {
            log::warn!("{}: CLOSE_PORT failed: {e}", self.name);
        }
        if let Some(id) = self.intf.take() {
            dev.unregister_interface(id);
        }
        self.link.store(false, Ordering::Relaxed);
        if let Some(t) = self.tx.take() {
            t.destroy(dev);
        }
        if let Some(r) = self.rx.take() {
            r.destroy(dev);
        }
        if core::mem::take(&mut self.mac_registered) {
            dev.unregister_mac(self.port, self.mac);
        }
        if let Some(mr) = self.mr.take()
            && let Err(e) = dev.mr_free(mr)
        {
            log::warn!("{}: HW2SW_MPT failed: {e}", self.name);
        }
        if let Some(u) = self.uar.take() {
            dev.uar_free(u);
        }
        if let Some(pd) = self.pdn.take() {
            dev.pd_free(pd);
        }
    }

    /// Closes the port and frees everything (`mlx4_en_stop_port`,
    /// `mlx4_en_destroy_netdev`); the device stays as a closed link (no
    /// carrier, nothing sent or received). A second close does nothing.
    pub fn close(&mut self, dev: &mut Dev) {
        if self.pdn.is_none() {
            return;
        }
        self.stop(dev);
        log::info!("{}: closed", self.name);
    }

    /// The carrier: the port is open and its link up.
    pub fn carrier(&self) -> bool {
        self.port_up && self.link.load(Ordering::Relaxed)
    }

    /// Send completions (`mlx4_en_process_tx_cq`).
    pub fn poll(&mut self, dev: &Dev) {
        if let Some(t) = self.tx.as_mut() {
            t.process_cq(dev);
        }
    }

    /// Free send descriptors after reaping completions.
    pub fn tx_room(&mut self, dev: &Dev) -> u32 {
        let Some(t) = self.tx.as_mut() else {
            return 0;
        };
        if t.room() == 0 {
            t.process_cq(dev);
        }
        t.room()
    }

    /// Sends one frame (`mlx4_en_xmit`); `false` if it could not be posted
    /// (counted as dropped).
    pub fn xmit(&mut self, dev: &Dev, frame: &[u8]) -> bool {
        let sent = self.post(dev, frame, None);
        if !sent {
            self.tx_dropped += 1;
        }
        sent
    }

    fn post(&mut self, dev: &Dev, frame: &[u8], tci: Option<u16>) -> bool {
        frame.len() <= self.mtu + ETH_HLEN
            && self.tx_room(dev) > 0
            && self.tx.as_mut().is_some_and(|t| t.xmit(frame, tci))
    }

    /// The next received untagged frame into `out`
    /// (`mlx4_en_process_rx_cq`).
    pub fn receive(&mut self, dev: &Dev, out: &mut [u8]) -> Option<usize> {
        self.receive_on(dev, None, out)
    }

    /// Linux `mlx4_en_vlan_rx_add_vid`: the port takes frames tagged `vid`
    /// (registered in its VLAN table) for a VLAN device.
    pub fn vlan_rx_add_vid(&mut self, dev: &mut Dev, vid: u16) -> Result<()> {
        if !(1..=4094).contains(&vid) {
            return Err(Error::BadVlan(vid));
        }
        if self.vlans.iter().any(|v| v.vid == vid) {
            return Err(Error::VlanExists(vid));
        }
        if self.pdn.is_none() {
            return Err(Error::Closed);
        }
        let index = dev.register_vlan(self.port, vid)?;
        log::info!("{}: VLAN {vid} registered at index {index}", self.name);
        self.vlans.push(Vlan {
            vid,
            backlog: VecDeque::new(),
            stats: LinkStats::default(),
        });
        Ok(())
    }

    /// Linux `mlx4_en_vlan_rx_kill_vid`: the VLAN device of `vid` goes, its
    /// VID leaves the port's VLAN table; nothing if there is none.
    pub fn vlan_rx_kill_vid(&mut self, dev: &mut Dev, vid: u16) {
        if let Some(i) = self.vlans.iter().position(|v| v.vid == vid) {
            self.vlans.remove(i);
            dev.unregister_vlan(self.port, vid);
            log::info!("{}: VLAN {vid} unregistered", self.name);
        }
    }

    /// The VIDs of the port's VLAN devices.
    pub fn vlan_ids(&self) -> impl Iterator<Item = u16> + '_ {
        self.vlans.iter().map(|v| v.vid)
    }

    /// The counters of the VLAN device of `vid` (what it sent and
    /// received); `None` if there is no such device.
    pub fn vlan_stats(&self, vid: u16) -> Option<LinkStats> {
        self.vlans.iter().find(|v| v.vid == vid).map(|v| v.stats)
    }

    /// Sends one frame of the VLAN device of `vid`, the card inserting the
    /// tag (PCP 0); `false` if it could not be posted, or the card is gone
    /// (`dev` is `None`): counted as the VLAN device's drop.
    pub fn xmit_vlan(&mut self, dev: Option<&Dev>, frame: &[u8], vid: u16) -> bool {
        if !self.vlans.iter().any(|v| v.vid == vid) {
            return false;
        }
        let sent = dev.is_some_and(|d| self.post(d, frame, Some(vid)));
        if let Some(v) = self.vlans.iter_mut().find(|v| v.vid == vid) {
            if sent {
                v.stats.count_tx(frame.len());
            } else {
                v.stats.tx_dropped += 1;
            }
        }
        sent
    }

    /// The next received frame of the device of `vid` (`None`: the port
    /// itself, untagged frames) into `out`: one its backlog holds, else
    /// one off the ring, the frames of other devices met on the way put
    /// into their backlogs (at most a ring's worth per call).
    pub fn receive_on(&mut self, dev: &Dev, vid: Option<u16>, out: &mut [u8]) -> Option<usize> {
        let waiting = match vid {
            None => self.backlog.pop_front(),
            Some(id) => self
                .vlans
                .iter_mut()
                .find(|v| v.vid == id)?
                .backlog
                .pop_front(),
        };
        if let Some(f) = waiting {
            let n = f.len().min(out.len());
            out[..n].copy_from_slice(&f[..n]);
            self.count_vlan_rx(vid, n);
            return Some(n);
        }
        let rx = self.rx.as_mut()?;
        for _ in 0..rx.size() {
            let (n, tag) = rx.receive(dev, out)?;
            if tag == vid {
                self.count_vlan_rx(vid, n);
                return Some(n);
            }
            let q = match tag {
                None => Some(&mut self.backlog),
                Some(id) => self
                    .vlans
                    .iter_mut()
                    .find(|v| v.vid == id)
                    .map(|v| &mut v.backlog),
            };
            match q {
                Some(q) if q.len() < BACKLOG => q.push_back(out[..n].to_vec()),
                _ => self.rx_unclaimed += 1,
            }
        }
        None
    }

    fn count_vlan_rx(&mut self, vid: Option<u16>, n: usize) {
        if let Some(v) = vid.and_then(|id| self.vlans.iter_mut().find(|v| v.vid == id)) {
            v.stats.count_rx(n);
        }
    }

    /// The receive and send rings' counters.
    pub fn ring_stats(&self) -> (RingStats, RingStats) {
        (
            self.rx.as_ref().map(|r| r.stats).unwrap_or_default(),
            self.tx.as_ref().map(|t| t.stats).unwrap_or_default(),
        )
    }

    /// The device's counters as `ip -s link` shows them.
    pub fn link_stats(&self) -> LinkStats {
        let (rx, tx) = self.ring_stats();
        LinkStats {
            rx_bytes: rx.bytes,
            rx_packets: rx.packets,
            rx_errors: rx.errors,
            rx_dropped: rx.dropped + self.rx_unclaimed,
            multicast: rx.multicast,
            tx_bytes: tx.bytes,
            tx_packets: tx.packets,
            tx_errors: tx.errors,
            tx_dropped: self.tx_dropped,
            ..LinkStats::default()
        }
    }

    /// The port's counters from the firmware (`mlx4_en_DUMP_ETH_STATS`).
    pub fn port_stats(&self, dev: &mut Dev) -> Result<PortStats> {
        dump_eth_stats(dev, self.port, false)
    }

    /// What `ethtool -S` prints (Linux `mlx4_en_get_ethtool_stats`): the
    /// device's counters, the rings' (`rx0_packets`, ...), then the port's.
    pub fn ethtool_stats(&self, dev: &mut Dev) -> Vec<(String, u64)> {
        let s = self.link_stats();
        let (rx, tx) = self.ring_stats();
        let mut v: Vec<(String, u64)> = [
            ("rx_packets", s.rx_packets),
            ("tx_packets", s.tx_packets),
            ("rx_bytes", s.rx_bytes),
            ("tx_bytes", s.tx_bytes),
            ("rx_errors", s.rx_errors),
            ("tx_errors", s.tx_errors),
            ("rx_dropped", s.rx_dropped),
            ("tx_dropped", s.tx_dropped),
            ("multicast", s.multicast),
            ("rx0_packets", rx.packets),
            ("rx0_bytes", rx.bytes),
            ("rx0_dropped", rx.dropped),
            ("rx0_errors", rx.errors),
            ("tx0_packets", tx.packets),
            ("tx0_bytes", tx.bytes),
            ("tx0_errors", tx.errors),
        ]
        .into_iter()
        .map(|(n, v)| (String::from(n), v))
        .collect();
        match self.port_stats(dev) {
            Ok(p) => v.extend(p.named()),
            Err(e) => log::warn!("{}: DUMP_ETH_STATS failed: {e}", self.name),
        }
        v
    }
}

/// How an [`EnLink`] finds its `Dev` in the context the stack polls it
/// with, from the port's handle (the kernel: ib_core's device, through
/// mlx4_ib).
pub type DevGetter<C> = for<'a> fn(&'a mut C, u32) -> Option<&'a mut Dev>;

/// An open port as its links share it: the port's link and its VLAN
/// devices' links each hold one. The kernel polls from one thread, so the
/// lock is never contended; it is what lets a VLAN device post on the
/// port's send ring directly, as Linux's `vlan_dev_hard_start_xmit` hands
/// its frame to the real device.
pub type EnShared = Arc<spin::Mutex<EnPriv>>;

/// A link's staging buffer: the frame the stack writes, no longer than the
/// port's MTU and Ethernet header.
fn stage(buf: &mut Vec<u8>, mtu: usize, len: usize) -> Option<&mut [u8]> {
    if len > mtu + ETH_HLEN {
        return None;
    }
    buf.clear();
    buf.resize(len, 0);
    Some(buf)
}

/// An open port as a link of the IP stack: Ethernet frames, smoltcp's ARP.
pub struct EnLink<C: ?Sized> {
    /// The port (shared with its VLAN devices).
    pub en: EnShared,
    get: DevGetter<C>,
    stage: Vec<u8>,
}

impl<C: ?Sized> EnLink<C> {
    /// The link of `en`, which finds its `Dev` with `get`.
    pub fn new(en: EnPriv, get: DevGetter<C>) -> EnLink<C> {
        EnLink {
            en: Arc::new(spin::Mutex::new(en)),
            get,
            stage: Vec::new(),
        }
    }
}

impl<C: ?Sized + 'static> Link<C> for EnLink<C> {
    fn kind(&self) -> LinkKind {
        LinkKind::Ether
    }

    fn mtu(&self) -> usize {
        self.en.lock().mtu
    }

    fn carrier(&self) -> bool {
        self.en.lock().carrier()
    }

    fn hw_addr(&self) -> HwAddr {
        HwAddr::new(&mac_bytes(self.en.lock().mac))
    }

    fn broadcast(&self) -> HwAddr {
        HwAddr::new(&[0xff; 6])
    }

    fn stats(&self) -> LinkStats {
        self.en.lock().link_stats()
    }

    fn poll(&mut self, ctx: &mut C, _now_us: u64) {
        let mut en = self.en.lock();
        if let Some(d) = (self.get)(ctx, en.handle) {
            en.poll(d);
        }
    }

    fn receive(&mut self, ctx: &mut C, buf: &mut [u8]) -> Option<usize> {
        let mut en = self.en.lock();
        let d = (self.get)(ctx, en.handle)?;
        en.receive(d, buf)
    }

    fn tx_ready(&mut self, ctx: &mut C) -> bool {
        let mut en = self.en.lock();
        (self.get)(ctx, en.handle).is_some_and(|d| en.tx_room(d) > 0)
    }

    fn tx_buffer(&mut self, _ctx: &mut C, len: usize) -> Option<&mut [u8]> {
        let mtu = self.en.lock().mtu;
        stage(&mut self.stage, mtu, len)
    }

    fn tx_commit(&mut self, ctx: &mut C, _next_hop: net::link::Ipv4Address) {
        let mut en = self.en.lock();
        match (self.get)(ctx, en.handle) {
            Some(d) => {
                en.xmit(d, &self.stage);
            }
            None => en.tx_dropped += 1,
        }
    }

    fn rdma_port(&self) -> Option<(u32, u8)> {
        // RoCE runs on the same port (mlx4_ib's side of it).
        let en = self.en.lock();
        Some((en.handle, en.port))
    }

    fn add_vlan(
        &mut self,
        ctx: &mut C,
        vid: u16,
        lower: &str,
    ) -> core::result::Result<Box<dyn Link<C>>, String> {
        let mut en = self.en.lock();
        let d = (self.get)(ctx, en.handle).ok_or_else(|| String::from("the device is gone"))?;
        en.vlan_rx_add_vid(d, vid).map_err(|e| match e {
            Error::VlanExists(_) => String::from("RTNETLINK answers: File exists"),
            e => alloc::format!("{}: {e}", en.name),
        })?;
        Ok(Box::new(VlanLink {
            en: self.en.clone(),
            vid,
            lower: String::from(lower),
            get: self.get,
            stage: Vec::new(),
        }))
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(&self.en)
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn Any> {
        Some(&mut self.en)
    }
}

/// A VLAN device over an open port (Linux's 8021q device over an mlx4_en
/// netdev): the port's MAC and MTU, frames tagged with its VID on the
/// wire, its own counters.
pub struct VlanLink<C: ?Sized> {
    en: EnShared,
    vid: u16,
    lower: String,
    get: DevGetter<C>,
    stage: Vec<u8>,
}

impl<C: ?Sized> VlanLink<C> {
    /// The VLAN id.
    pub fn vid(&self) -> u16 {
        self.vid
    }
}

impl<C: ?Sized + 'static> Link<C> for VlanLink<C> {
    fn kind(&self) -> LinkKind {
        LinkKind::Ether
    }

    fn mtu(&self) -> usize {
        self.en.lock().mtu
    }

    fn carrier(&self) -> bool {
        let en = self.en.lock();
        en.carrier() && en.vlan_ids().any(|v| v == self.vid)
    }

    fn hw_addr(&self) -> HwAddr {
        HwAddr::new(&mac_bytes(self.en.lock().mac))
    }

    fn broadcast(&self) -> HwAddr {
        HwAddr::new(&[0xff; 6])
    }

    fn stats(&self) -> LinkStats {
        self.en.lock().vlan_stats(self.vid).unwrap_or_default()
    }

    fn poll(&mut self, ctx: &mut C, _now_us: u64) {
        let mut en = self.en.lock();
        if let Some(d) = (self.get)(ctx, en.handle) {
            en.poll(d);
        }
    }

    fn receive(&mut self, ctx: &mut C, buf: &mut [u8]) -> Option<usize> {
        let mut en = self.en.lock();
        let d = (self.get)(ctx, en.handle)?;
        en.receive_on(d, Some(self.vid), buf)
    }

    fn tx_ready(&mut self, ctx: &mut C) -> bool {
        let mut en = self.en.lock();
        (self.get)(ctx, en.handle).is_some_and(|d| en.tx_room(d) > 0)
    }

    fn tx_buffer(&mut self, _ctx: &mut C, len: usize) -> Option<&mut [u8]> {
        let mtu = self.en.lock().mtu;
        stage(&mut self.stage, mtu, len)
    }

    fn tx_commit(&mut self, ctx: &mut C, _next_hop: net::link::Ipv4Address) {
        let mut en = self.en.lock();
        let dev = (self.get)(ctx, en.handle);
        en.xmit_vlan(dev.as_deref(), &self.stage, self.vid);
    }

    fn rdma_port(&self) -> Option<(u32, u8)> {
        let en = self.en.lock();
        Some((en.handle, en.port))
    }

    fn vlan(&self) -> Option<(u16, &str)> {
        Some((self.vid, &self.lower))
    }

    fn detach(&mut self, ctx: &mut C) {
        let mut en = self.en.lock();
        if let Some(d) = (self.get)(ctx, en.handle) {
            en.vlan_rx_kill_vid(d, self.vid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_qp_context_as_mlx4_en_fills_it() {
        let c = fill_qp_context(2, 5, 130, 0x41, Some((8 << 3, 0x1000)), 2);
        let b = c.to_bytes();
        assert_eq!(b[0..4], [0x00, 0x07, 0x00, 0x00], "ST MLX");
        assert_eq!((b[8], b[9], b[10]), (0xff, 0x40, 2));
        // sched_queue: port 2, the default queue.
        assert_eq!(b[0x18 + 0x20], 0xc3);
        assert_eq!(u32::from_be_bytes(b[0x7c..0x80].try_into().unwrap()), 0x41);
        assert_eq!(u32::from_be_bytes(b[0x9c..0xa0].try_into().unwrap()), 0x41);
        assert_eq!(
            u64::from_be_bytes(b[0xa0..0xa8].try_into().unwrap()),
            0x1000
        );
        assert_eq!(crate::mac_bytes(0x0002_c900_0011), [0, 2, 0xc9, 0, 0, 0x11]);
    }
}
