//! RDMA over Ethernet (RoCE v1, "IBoE") on an Ethernet port: Linux 3.11 mlx4_ib's `eth_link_query_port`, the GID table of `update_gids_task`, `mlx4_ib_resolve_grh`, and the GID helpers of `include/rdma/ib_addr.h`.
//!
//! The GID table of an Ethernet port holds, as Linux 6.1's `roce_gid_mgmt`
//! fills it for RoCE v1, the link-local GID made from the port's MAC
//! (fe80::EUI-64) at index 0 and one IPv4-mapped GID (`::ffff:a.b.c.d`) per
//! address of the port's interface after it; it is written with SET_PORT
//! GID_TABLE and again whenever the interface's addresses change
//! ([`crate::Mlx4IbDev::set_roce_ipv4_addrs`], a GID change event follows).
//! A destination MAC comes from a link-local or multicast DGID directly; for
//! an IPv4-mapped DGID it comes from the neighbour entries the interface's
//! ARP gives the driver ([`crate::Mlx4IbDev::set_roce_neigh`]: the seam
//! where mlx4_en's interface plugs in). The source MAC is the port's MAC,
//! registered in the port's MAC table (`mlx4_register_mac`, shared with
//! mlx4_en by reference count) and named by its index in QP paths and
//! address vectors, as Linux 3.15+ does.
//!
//! A VLAN interface over the port (mlx4_en's VLAN device, which registered
//! its VID in the port's VLAN table) adds its own GIDs after the port's:
//! the link-local GID with the VID in bytes 11-12 (Linux 3.11's
//! `iboe_mac_vlan_to_ll`, so that the GID names its VLAN wherever it goes)
//! and the IPv4-mapped GIDs of its addresses. Each entry remembers its
//! VLAN: a QP path from it carries the VID's VLAN-table index (`fl` bit 6,
//! `vlan_index`, Linux's `mlx4_find_cached_vlan`), an address vector the
//! tag. The entries go when the VID leaves the VLAN table.
//!
//! Left out: RoCE v2, DCB priorities (a VLAN frame's PCP is the SL's low
//! three bits) and IPv6 addresses of the interface.

use alloc::vec::Vec;

use log::{debug, warn};

use crate::mad::PortAttr;
use crate::{Error, Result};

/// Entries of a RoCE GID table (`MLX4_ROCE_MAX_GIDS`).
pub const ROCE_MAX_GIDS: usize = 128;
/// `MLX4_IB_LINK_TYPE_ETH`: the path's `ackto` low bits on an Ethernet port.
pub const LINK_TYPE_ETH: u8 = 1;
/// The tag value meaning "no VLAN" (`0xffff` in the address vector).
pub const NO_VLAN: u16 = 0xffff;

/// Linux `iboe_mac_vlan_to_ll`: the link-local GID of `mac` (the universal
/// bit flipped, ff:fe in the middle), the VLAN id in bytes 11-12 when the
/// interface is a VLAN.
pub fn iboe_mac_vlan_to_ll(mac: &[u8; 6], vid: Option<u16>) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8] = mac[0] ^ 2;
    g[9] = mac[1];
    g[10] = mac[2];
    match vid {
        Some(v) if v < 0x1000 => {
            g[11] = (v >> 8) as u8;
            g[12] = v as u8;
        }
        _ => {
            g[11] = 0xff;
            g[12] = 0xfe;
        }
    }
    g[13..16].copy_from_slice(&mac[3..6]);
    g
}

/// Linux `rdma_link_local_addr`: fe80::/64.
pub fn rdma_link_local_addr(gid: &[u8; 16]) -> bool {
    gid[0] == 0xfe && gid[1] == 0x80 && gid[2..8].iter().all(|&b| b == 0)
}

/// Linux `rdma_is_multicast_addr`.
pub fn rdma_is_multicast_addr(gid: &[u8; 16]) -> bool {
    gid[0] == 0xff
}

/// Linux `rdma_get_ll_mac`: the MAC inside a link-local GID.
pub fn rdma_get_ll_mac(gid: &[u8; 16]) -> [u8; 6] {
    [gid[8] ^ 2, gid[9], gid[10], gid[13], gid[14], gid[15]]
}

/// Linux `rdma_get_mcast_mac`: 33:33 and the GID's last four bytes.
pub fn rdma_get_mcast_mac(gid: &[u8; 16]) -> [u8; 6] {
    [0x33, 0x33, gid[12], gid[13], gid[14], gid[15]]
}

/// Linux `rdma_get_vlan_id`: the VLAN id a link-local GID carries in bytes
/// 11-12, or [`NO_VLAN`].
pub fn rdma_get_vlan_id(gid: &[u8; 16]) -> u16 {
    let v = u16::from_be_bytes([gid[11], gid[12]]);
    if v < 0x1000 { v } else { NO_VLAN }
}

/// Linux `ipv6_addr_set_v4mapped` as `rdma_ip2gid` uses it: `::ffff:a.b.c.d`
/// (ib_core's [`ib_core::addr::ip2gid`] on bytes).
pub fn ipv4_gid(ip: [u8; 4]) -> [u8; 16] {
    ib_core::addr::ip2gid(core::net::Ipv4Addr::from(ip)).0
}

/// The IPv4 address of an IPv4-mapped GID.
pub fn gid_ipv4(gid: &[u8; 16]) -> Option<[u8; 4]> {
    (gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff)
        .then(|| [gid[12], gid[13], gid[14], gid[15]])
}

/// Sets `dst` to `addrs` without repeats, in their order.
fn set_unique(dst: &mut Vec<[u8; 4]>, addrs: &[[u8; 4]]) {
    dst.clear();
    for a in addrs {
        if !dst.contains(a) {
            dst.push(*a);
        }
    }
}

/// Linux `iboe_get_mtu`: the largest IB MTU (`enum ib_mtu`) that fits a
/// netdev MTU of `mtu` bytes after the GRH, BTH, the largest extension
/// headers and the ICRC.
pub fn iboe_get_mtu(mtu: u32) -> u8 {
    let m = mtu.saturating_sub(40 + 12 + 4 + 28 + 4);
    match m {
        4096.. => 5,
        2048.. => 4,
        1024.. => 3,
        512.. => 2,
        256.. => 1,
        _ => 0,
    }
}

/// A VLAN interface over a RoCE port, as mlx4_ib knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoceVlan {
    /// The VLAN id.
    pub vid: u16,
    /// Its index in the port's VLAN table (mlx4_en registered it).
    pub index: u8,
    /// The interface's IPv4 addresses, in GID-table order.
    pub ipv4: Vec<[u8; 4]>,
    /// Neighbours the interface resolved: IPv4 address and MAC.
    pub neigh: Vec<([u8; 4], [u8; 6])>,
}

/// The RoCE state of one Ethernet port (Linux keeps it in `mlx4_ib_iboe`).
#[derive(Debug, Clone)]
pub struct RocePort {
    /// The port's MAC (the card's, from QUERY_PORT).
    pub mac: [u8; 6],
    /// The interface's IPv4 addresses, in GID-table order.
    pub ipv4: Vec<[u8; 4]>,
    /// The GID table as last written (index 0 the link-local GID).
    pub gids: Vec<[u8; 16]>,
    /// The VLAN of each entry of `gids` ([`NO_VLAN`]: the port's own).
    pub gid_vlans: Vec<u16>,
    /// The VLAN interfaces over the port, in the order they appeared.
    pub vlans: Vec<RoceVlan>,
    /// Neighbours the interface resolved: IPv4 address and MAC.
    pub neigh: Vec<([u8; 4], [u8; 6])>,
    /// The interface's MTU (bytes of IP packet), 1500 until told.
    pub netdev_mtu: u32,
    /// Link up (port up event seen, no port down since).
    pub active: bool,
    /// SET_PORT GID_TABLE commands that succeeded.
    pub gid_table_writes: u32,
    /// The MAC-table index of `mac` (None: registration failed; the card
    /// then sends from index 0).
    pub smac_index: Option<u8>,
}

impl RocePort {
    fn new(mac: [u8; 6]) -> RocePort {
        RocePort {
            mac,
            ipv4: Vec::new(),
            gids: Vec::new(),
            gid_vlans: Vec::new(),
            vlans: Vec::new(),
            neigh: Vec::new(),
            netdev_mtu: 1500,
            active: false,
            gid_table_writes: 0,
            smac_index: None,
        }
    }

    /// The GID table the port should have, each entry with its VLAN: the
    /// port's link-local and IPv4 GIDs, then each VLAN interface's.
    fn wanted_gids(&self) -> impl Iterator<Item = ([u8; 16], u16)> + '_ {
        let port = core::iter::once((iboe_mac_vlan_to_ll(&self.mac, None), NO_VLAN))
            .chain(self.ipv4.iter().map(|&ip| (ipv4_gid(ip), NO_VLAN)));
        let vlans = self.vlans.iter().flat_map(|v| {
            core::iter::once((iboe_mac_vlan_to_ll(&self.mac, Some(v.vid)), v.vid))
                .chain(v.ipv4.iter().map(|&ip| (ipv4_gid(ip), v.vid)))
        });
        port.chain(vlans).take(ROCE_MAX_GIDS)
    }

    /// The VLAN id of source GID `index` ([`NO_VLAN`]: the port's own, or
    /// no such entry).
    pub fn sgid_vlan_id(&self, index: u8) -> u16 {
        self.gid_vlans
            .get(usize::from(index))
            .copied()
            .unwrap_or(NO_VLAN)
    }

    /// The VLAN-table index of VLAN `vid` (Linux `mlx4_find_cached_vlan`
    /// on what mlx4_en registered).
    pub fn vlan_index(&self, vid: u16) -> Option<u8> {
        self.vlans.iter().find(|v| v.vid == vid).map(|v| v.index)
    }

    /// The source MAC index paths and address vectors carry.
    pub fn smac_idx(&self) -> u8 {
        self.smac_index.unwrap_or(0)
    }

    /// Linux `mlx4_ib_resolve_grh` (and, for an IPv4-mapped GID, the
    /// neighbour lookup later kernels make through ARP): the destination
    /// MAC of `dgid`.
    pub fn resolve_dmac(&self, dgid: &[u8; 16]) -> Result<[u8; 6]> {
        if rdma_link_local_addr(dgid) {
            return Ok(rdma_get_ll_mac(dgid));
        }
        if rdma_is_multicast_addr(dgid) {
            return Ok(rdma_get_mcast_mac(dgid));
        }
        if let Some(ip) = gid_ipv4(dgid) {
            return self
                .neigh
                .iter()
                .chain(self.vlans.iter().flat_map(|v| v.neigh.iter()))
                .find(|(a, _)| *a == ip)
                .map(|&(_, m)| m)
                .ok_or(Error::Inval(
                    "no ARP entry for the IPv4 address of the destination GID",
                ));
        }
        Err(Error::Inval(
            "destination GID is neither link-local, multicast nor IPv4-mapped",
        ))
    }
}

impl crate::Mlx4IbDev {
    /// True if `port` is an Ethernet port (Linux `mlx4_ib_port_link_layer`
    /// says `IB_LINK_LAYER_ETHERNET`).
    pub fn is_eth(&self, port: u8) -> bool {
        self.dev
            .caps()
            .port
            .get(usize::from(port))
            .is_some_and(|p| p.port_type == mlx4_core::PortType::Eth)
            && port >= 1
            && port <= self.num_ports()
    }

    /// The RoCE state of an Ethernet port.
    pub fn roce_port(&self, port: u8) -> Option<&RocePort> {
        self.roce.get(usize::from(port.checked_sub(1)?))?.as_ref()
    }

    pub(crate) fn roce_port_mut(&mut self, port: u8) -> Result<&mut RocePort> {
        self.roce
            .get_mut(usize::from(port.wrapping_sub(1)))
            .and_then(|r| r.as_mut())
            .ok_or(Error::Inval("not an Ethernet port"))
    }

    /// The Ethernet ports' part of `mlx4_ib_add`: their RoCE state, the MAC
    /// registered and the GID table written. The port is left to mlx4_en to
    /// open (as in Linux: an INIT_PORT before mlx4_en's SET_PORTs leaves a
    /// port of type `auto` without traffic); without mlx4_en,
    /// [`crate::Mlx4IbDev::roce_open_port`] opens it.
    pub(crate) fn roce_add(&mut self) {
        for port in 1..=self.num_ports() {
            if !self.is_eth(port) {
                continue;
            }
            let mac =
                mlx4_core::port::mac_to_bytes(self.dev.caps().port[usize::from(port)].def_mac);
            let mut rp = RocePort::new(mac);
            match self
                .dev
                .register_mac(port, mlx4_core::port::mac_from_bytes(&mac))
            {
                Ok(i) => rp.smac_index = u8::try_from(i).ok(),
                Err(e) => warn!("{}: port {port}: MAC not registered: {e}", self.name),
            }
            if let Some(slot) = self.roce.get_mut(usize::from(port - 1)) {
                *slot = Some(rp);
            }
            if let Err(e) = self.update_gids(port) {
                warn!("{}: port {port}: GID table not written: {e}", self.name);
            }
        }
    }

    /// The Ethernet ports' part of `mlx4_ib_remove`: the MAC registrations
    /// go.
    pub(crate) fn roce_remove(&mut self) {
        for port in 1..=self.num_ports() {
            let Some(rp) = self
                .roce
                .get_mut(usize::from(port - 1))
                .and_then(|r| r.take())
            else {
                continue;
            };
            if rp.smac_index.is_some() {
                self.dev
                    .unregister_mac(port, mlx4_core::port::mac_from_bytes(&rp.mac));
            }
        }
    }

    /// Opens Ethernet port `port` (INIT_PORT) for RoCE where no mlx4_en
    /// drives it (mlx4_en's `mlx4_en_start_port` otherwise does); nothing if
    /// it is open already.
    pub fn roce_open_port(&mut self, port: u8) -> Result<()> {
        self.roce_port_mut(port)?;
        if !self.dev.port_is_open(port) {
            self.dev.init_port(port)?;
        }
        Ok(())
    }

    /// Linux `update_gids_task`: writes the port's GID table with SET_PORT
    /// GID_TABLE if it differs from what the card has, and reports a GID
    /// change (ib_core then reads the table again).
    fn update_gids(&mut self, port: u8) -> Result<()> {
        let rp = self.roce_port_mut(port)?;
        // What the kernel's stack asks on every pass: compared in place,
        // nothing allocated unless the table is written.
        let written = rp.gids.iter().copied().zip(rp.gid_vlans.iter().copied());
        if rp.gid_table_writes > 0 && rp.wanted_gids().eq(written) {
            return Ok(());
        }
        let (want, vlans): (Vec<[u8; 16]>, Vec<u16>) = rp.wanted_gids().unzip();
        self.dev.set_port_gid_table(port, &want)?;
        let n = want.len();
        let rp = self.roce_port_mut(port)?;
        rp.gids = want;
        rp.gid_vlans = vlans;
        rp.gid_table_writes += 1;
        debug!("{}: port {port}: {n} RoCE GIDs written", self.name);
        self.snooped
            .push_back(crate::main::IbEvent::GidChange(port));
        Ok(())
    }

    /// The interface on Ethernet port `port` has the IPv4 addresses `addrs`
    /// now: the GID table becomes the link-local GID and one `::ffff:a.b.c.d`
    /// per address, written at once (Linux 6.1's `roce_gid_mgmt` on an
    /// address change).
    pub fn set_roce_ipv4_addrs(&mut self, port: u8, addrs: &[[u8; 4]]) -> Result<()> {
        set_unique(&mut self.roce_port_mut(port)?.ipv4, addrs);
        self.update_gids(port)
    }

    /// The interface on `port` resolved `ip` to `mac` (its ARP table): what
    /// address handles and QP paths to the IPv4-mapped GID of `ip` use as
    /// their destination MAC. `None` forgets the entry.
    pub fn set_roce_neigh(&mut self, port: u8, ip: [u8; 4], mac: Option<[u8; 6]>) -> Result<()> {
        let rp = self.roce_port_mut(port)?;
        rp.neigh.retain(|(a, _)| *a != ip);
        if let Some(m) = mac {
            rp.neigh.push((ip, m));
        }
        Ok(())
    }

    /// The interface on Ethernet port `port` as it stands (its IPv4
    /// addresses, the neighbours it resolved): the GID table and the
    /// neighbour entries follow it, the table written only when the
    /// addresses changed. What the kernel calls each time its IP stack has
    /// run (Linux: `roce_gid_mgmt`'s address events and the neighbour
    /// table `addr.c` reads).
    ///
    /// `vlan` names a VLAN interface over the port (mlx4_en's VLAN device):
    /// its GIDs follow the port's while its VID is in the port's VLAN
    /// table; a sync of the port itself drops the VLANs no longer there.
    pub fn sync_roce_netdev(
        &mut self,
        port: u8,
        vlan: Option<u16>,
        addrs: &[[u8; 4]],
        neigh: &[([u8; 4], [u8; 6])],
    ) -> Result<()> {
        // The table is written when what it should hold differs from what
        // was last written (`update_gids`), so a write that failed is tried
        // again at the next sync.
        let Some(vid) = vlan else {
            self.prune_roce_vlans(port)?;
            let rp = self.roce_port_mut(port)?;
            if rp.neigh != neigh {
                rp.neigh.clear();
                rp.neigh.extend_from_slice(neigh);
            }
            set_unique(&mut rp.ipv4, addrs);
            return self.update_gids(port);
        };
        let Some(index) = self.dev.find_cached_vlan(port, vid) else {
            // Not (or no longer) registered: no GIDs for it.
            self.prune_roce_vlans(port)?;
            return self.update_gids(port);
        };
        let index = u8::try_from(index).map_err(|_| Error::Inval("VLAN index above 255"))?;
        let rp = self.roce_port_mut(port)?;
        let v = match rp.vlans.iter().position(|v| v.vid == vid) {
            Some(i) => &mut rp.vlans[i],
            None => {
                rp.vlans.push(RoceVlan {
                    vid,
                    index,
                    ipv4: Vec::new(),
                    neigh: Vec::new(),
                });
                let last = rp.vlans.len() - 1;
                &mut rp.vlans[last]
            }
        };
        v.index = index;
        if v.neigh != neigh {
            v.neigh.clear();
            v.neigh.extend_from_slice(neigh);
        }
        set_unique(&mut v.ipv4, addrs);
        self.update_gids(port)
    }

    /// Forgets the VLAN interfaces whose VID left the port's VLAN table
    /// (mlx4_en's VLAN device went).
    fn prune_roce_vlans(&mut self, port: u8) -> Result<()> {
        let gone: Vec<u16> = self
            .roce_port(port)
            .ok_or(Error::Inval("not an Ethernet port"))?
            .vlans
            .iter()
            .map(|v| v.vid)
            .filter(|&vid| self.dev.find_cached_vlan(port, vid).is_none())
            .collect();
        if !gone.is_empty() {
            self.roce_port_mut(port)?
                .vlans
                .retain(|v| !gone.contains(&v.vid));
        }
        Ok(())
    }

    /// The MTU of the interface on `port` (the RoCE active MTU follows it,
    /// Linux `iboe_get_mtu`).
    pub fn set_roce_netdev_mtu(&mut self, port: u8, mtu: u32) -> Result<()> {
        self.roce_port_mut(port)?.netdev_mtu = mtu;
        Ok(())
    }

    /// A port event on an Ethernet port: its link state.
    pub(crate) fn roce_link_event(&mut self, port: u8, up: bool) {
        if let Ok(rp) = self.roce_port_mut(port) {
            rp.active = up;
        }
    }

    /// Linux `eth_link_query_port`: no LID, no SM, one P_Key, the GID table
    /// of RoCE, state from the link, the active MTU from the interface's.
    pub(crate) fn eth_link_query_port(&self, port: u8) -> Result<PortAttr> {
        let rp = self
            .roce_port(port)
            .ok_or(Error::Inval("not an Ethernet port"))?;
        let caps = self.dev.caps();
        let (state, phys) = if rp.active { (4, 5) } else { (1, 3) };
        Ok(PortAttr {
            state,
            phys_state: phys,
            // IB_PORT_CM_SUP | IB_PORT_IP_BASED_GIDS-era: CM supported.
            port_cap_flags: 1 << 16,
            max_mtu: 5,
            active_mtu: iboe_get_mtu(rp.netdev_mtu),
            // 4X, QDR (40 GbE as Linux 3.11 reports it).
            active_width: 2,
            active_speed: if rp.active { 4 } else { 1 },
            max_vl_num: 2,
            gid_tbl_len: ROCE_MAX_GIDS as u32,
            pkey_tbl_len: 1,
            max_msg_sz: caps.max_msg_sz,
            ..PortAttr::default()
        })
    }

    /// Entry `index` of an Ethernet port's GID table (zero where unused).
    pub(crate) fn roce_query_gid(&self, port: u8, index: u32) -> Result<[u8; 16]> {
        let rp = self
            .roce_port(port)
            .ok_or(Error::Inval("not an Ethernet port"))?;
        if index as usize >= ROCE_MAX_GIDS {
            return Err(Error::Inval("GID index beyond the table"));
        }
        Ok(rp.gids.get(index as usize).copied().unwrap_or([0; 16]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_from_macs_and_addresses_and_back() {
        let mac = [0x00, 0x02, 0xc9, 0xab, 0xcd, 0xef];
        let ll = iboe_mac_vlan_to_ll(&mac, None);
        assert_eq!(
            ll,
            [
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x02, 0xc9, 0xff, 0xfe, 0xab, 0xcd, 0xef
            ]
        );
        assert!(rdma_link_local_addr(&ll));
        assert_eq!(rdma_get_ll_mac(&ll), mac);
        assert_eq!(rdma_get_vlan_id(&ll), NO_VLAN);
        let tagged = iboe_mac_vlan_to_ll(&mac, Some(7));
        assert_eq!(rdma_get_vlan_id(&tagged), 7);
        let g = ipv4_gid([10, 0, 0, 2]);
        assert_eq!(g[10..], [0xff, 0xff, 10, 0, 0, 2]);
        assert_eq!(gid_ipv4(&g), Some([10, 0, 0, 2]));
        assert_eq!(gid_ipv4(&ll), None);
        assert_eq!(iboe_get_mtu(1500), 3);
        assert_eq!(iboe_get_mtu(9000), 5);
        assert_eq!(iboe_get_mtu(100), 0);
    }

    #[test]
    fn destination_macs_by_kind_of_gid() {
        let mut rp = RocePort::new([0, 2, 0xc9, 1, 2, 3]);
        let peer = [0, 2, 0xc9, 4, 5, 6];
        assert_eq!(
            rp.resolve_dmac(&iboe_mac_vlan_to_ll(&peer, None)).unwrap(),
            peer
        );
        let mut mc = [0u8; 16];
        mc[0] = 0xff;
        mc[12..].copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(rp.resolve_dmac(&mc).unwrap(), [0x33, 0x33, 1, 2, 3, 4]);
        let g = ipv4_gid([10, 0, 0, 9]);
        assert!(
            matches!(rp.resolve_dmac(&g), Err(Error::Inval(_))),
            "no ARP entry yet"
        );
        rp.neigh.push(([10, 0, 0, 9], peer));
        assert_eq!(rp.resolve_dmac(&g).unwrap(), peer);
        let mut global = [0u8; 16];
        global[0] = 0x20;
        assert!(rp.resolve_dmac(&global).is_err());
        rp.ipv4.push([10, 0, 0, 1]);
        let w: Vec<_> = rp.wanted_gids().collect();
        assert_eq!(w.len(), 2);
        assert_eq!(w[1], (ipv4_gid([10, 0, 0, 1]), NO_VLAN));
        // A VLAN interface: its link-local GID names the VLAN, its IPv4
        // GIDs remember it; its neighbours resolve too.
        rp.vlans.push(RoceVlan {
            vid: 5,
            index: 2,
            ipv4: alloc::vec![[10, 5, 0, 1]],
            neigh: alloc::vec![([10, 5, 0, 2], [0, 2, 0xc9, 7, 7, 7])],
        });
        let w: Vec<_> = rp.wanted_gids().collect();
        assert_eq!(w.len(), 4);
        assert_eq!(w[2], (iboe_mac_vlan_to_ll(&rp.mac, Some(5)), 5));
        assert_eq!(w[3], (ipv4_gid([10, 5, 0, 1]), 5));
        assert_eq!(rp.vlan_index(5), Some(2));
        assert_eq!(rp.vlan_index(6), None);
        assert_eq!(
            rp.resolve_dmac(&ipv4_gid([10, 5, 0, 2])).unwrap(),
            [0, 2, 0xc9, 7, 7, 7]
        );
    }
}
