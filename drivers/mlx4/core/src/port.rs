//! The port commands mlx4_ib, mlx4_en and bring-up issue, as Linux's `port.c` and `fw.c` have them: SET_PORT (IB and Ethernet), the MAC and VLAN tables, SENSE_PORT, INIT/CLOSE_PORT.
//!
//! Linux: `port.c` (`mlx4_get_port_ib_caps`, `mlx4_SET_PORT`,
//! `mlx4_SET_PORT_general`, `mlx4_SET_PORT_qpn_calc`,
//! `mlx4_register_mac`/`mlx4_unregister_mac`,
//! `mlx4_register_vlan`/`mlx4_unregister_vlan`, `mlx4_SET_MCAST_FLTR`),
//! `sense.c` (`mlx4_do_sense_ports`) and `fw.c` (`mlx4_INIT_PORT`,
//! `mlx4_CLOSE_PORT`, `mlx4_MAD_IFC`), plus the SET_PORT GID table mlx4_ib
//! writes for RoCE and the QUERY_PORT/DUMP_ETH_STATS mlx4_en issues.
//! Left out: the priority table, `mlx4_replace_mac`, changing a port's type
//! while the device runs (the sense work), SR-IOV's per-function tables.

use hal::be::get_be32;
use mlx4_hw::cmd::{Opcode, errno, timeout};
use mlx4_hw::port::*;

use crate::Why;
use crate::{mlx4_err, mlx4_warn};

use crate::cmd::Mailbox;
use crate::dev::{Dev, PortType};
use crate::fw;
use crate::{Error, Result};

impl Dev {
    fn check_port(&self, port: u8) -> Result<()> {
        if port == 0 || port > self.hca.caps.num_ports {
            return Err(Error::InvalidArg);
        }
        Ok(())
    }

    /// Linux `mlx4_get_port_ib_caps`: SubnGet(PortInfo) through MAD_IFC
    /// (ignore M_Key and B_Key); returns the capability mask.
    pub fn get_port_ib_caps(&mut self, port: u8) -> Result<u32> {
        self.check_port(port)?;
        let inb = Mailbox::new(&self.hca.pool)?;
        let outb = Mailbox::new(&self.hca.pool)?;
        inb.write(0, &port_info_query(port));
        self.hca.cmd.cmd_box(
            inb.dma(),
            outb.dma(),
            u32::from(port),
            MAD_IFC_IGNORE_KEYS,
            Opcode::MAD_IFC,
            timeout::CLASS_C,
        )?;
        let o: [u8; MAD_SIZE] = outb.read();
        Ok(get_be32(&o, PORT_INFO_CAP_MASK_OFFSET))
    }

    /// Linux `mlx4_SET_PORT` (IB): MTU cap and the default capability mask,
    /// retrying with a smaller VL cap (8, 4, 2, 1) while the firmware answers
    /// EXCEED_LIM. Ethernet ports are left alone.
    #[doc(alias = "mlx4_SET_PORT")]
    pub fn set_port(&mut self, port: u8) -> Result<()> {
        self.check_port(port)?;
        let pc = self.hca.caps.port[usize::from(port)];
        if pc.port_type == PortType::Eth {
            return Ok(());
        }
        let mb = Mailbox::new(&self.hca.pool)?;
        let mut vl_cap = 8;
        loop {
            mb.write(
                0,
                &set_port_ib(u32::from(pc.port_ib_mtu), vl_cap, pc.ib_port_def_cap, None),
            );
            let r = self.hca.cmd.cmd(
                mb.dma(),
                u32::from(port),
                0,
                Opcode::SET_PORT,
                timeout::CLASS_B,
            );
            match r {
                Err(e) if e.to_errno() == -errno::ENOMEM && vl_cap > 1 => vl_cap >>= 1,
                r => return r,
            }
        }
    }

    /// SET_PORT (IB) with a new capability mask and nothing else changed,
    /// as mlx4_ib's `mlx4_SET_PORT` sends it for `ib_modify_port` (an SM
    /// setting IsSM on its port).
    pub fn set_port_cap_mask(
        &mut self,
        port: u8,
        cap_mask: u32,
        reset_qkey_cntrs: bool,
    ) -> Result<()> {
        self.check_port(port)?;
        let mb = Mailbox::new(&self.hca.pool)?;
        mb.write(0, &set_port_ib_cap_mask(cap_mask, reset_qkey_cntrs));
        self.hca.cmd.cmd(
            mb.dma(),
            u32::from(port),
            0,
            Opcode::SET_PORT,
            timeout::CLASS_B,
        )
    }

    /// Linux `mlx4_INIT_PORT` (issued by mlx4_ib when QP0 reaches RTR).
    #[doc(alias = "mlx4_INIT_PORT")]
    pub fn init_port(&mut self, port: u8) -> Result<()> {
        self.check_port(port)?;
        fw::init_port(&mut self.hca.cmd, port)?;
        self.port_open[usize::from(port)] = true;
        Ok(())
    }

    /// Linux `mlx4_CLOSE_PORT`.
    #[doc(alias = "mlx4_CLOSE_PORT")]
    pub fn close_port(&mut self, port: u8) -> Result<()> {
        self.check_port(port)?;
        self.port_open[usize::from(port)] = false;
        fw::close_port(&mut self.hca.cmd, port)
    }

    /// True while the port is open (INIT_PORT done, no CLOSE_PORT since).
    pub fn port_is_open(&self, port: u8) -> bool {
        self.port_open
            .get(usize::from(port))
            .copied()
            .unwrap_or(false)
    }

    /// MAD_IFC for mlx4_ib (Linux `mlx4_MAD_IFC` native path): `mad_in` (256
    /// bytes, plus the optional extended info block at 0x100) in, response
    /// MAD out.
    pub fn mad_ifc(
        &mut self,
        port: u8,
        op_mod: u8,
        in_mod_hi: u16,
        mad_in: &[u8],
    ) -> Result<[u8; MAD_SIZE]> {
        self.check_port(port)?;
        if mad_in.len() > 4096 {
            return Err(Error::InvalidArg);
        }
        let inb = Mailbox::new(&self.hca.pool)?;
        let outb = Mailbox::new(&self.hca.pool)?;
        inb.write(0, mad_in);
        let in_mod = u32::from(port) | (u32::from(in_mod_hi) << 16);
        self.hca.cmd.cmd_box(
            inb.dma(),
            outb.dma(),
            in_mod,
            op_mod,
            Opcode::MAD_IFC,
            timeout::CLASS_C,
        )?;
        Ok(outb.read())
    }
}

/// The MAC and VLAN tables of one Ethernet port as the driver keeps them
/// (Linux `struct mlx4_mac_table`, `struct mlx4_vlan_table`): the entries
/// as SET_PORT writes them and a reference count per entry.
#[derive(Debug, Clone)]
pub struct EthTables {
    macs: [u64; eth::MAX_MAC_NUM],
    mac_refs: [u32; eth::MAX_MAC_NUM],
    vlans: [u32; eth::MAX_VLAN_NUM],
    vlan_refs: [u32; eth::MAX_VLAN_NUM],
}

impl Default for EthTables {
    fn default() -> EthTables {
        EthTables {
            macs: [0; eth::MAX_MAC_NUM],
            mac_refs: [0; eth::MAX_MAC_NUM],
            vlans: [0; eth::MAX_VLAN_NUM],
            vlan_refs: [0; eth::MAX_VLAN_NUM],
        }
    }
}

/// The MAC bits of a MAC-table entry (and of a `u64` MAC argument).
const MAC_MASK: u64 = 0xffff_ffff_ffff;

/// The six bytes of a MAC as mlx4_core keeps it (`caps.def_mac`, the MAC
/// table: the low 48 bits of a u64), first byte first.
pub fn mac_to_bytes(mac: u64) -> [u8; 6] {
    let b = mac.to_be_bytes();
    [b[2], b[3], b[4], b[5], b[6], b[7]]
}

/// A MAC's six bytes as mlx4_core keeps it ([`mac_to_bytes`] backwards).
pub fn mac_from_bytes(mac: &[u8; 6]) -> u64 {
    mac.iter().fold(0, |a, &b| (a << 8) | u64::from(b))
}

impl EthTables {
    /// The index of the valid MAC-table entry for `mac` among the first
    /// `max`.
    fn find_mac(&self, mac: u64, max: usize) -> Option<usize> {
        self.macs[..max.min(eth::MAX_MAC_NUM)]
            .iter()
            .position(|&e| e & eth::MAC_VALID != 0 && e & MAC_MASK == mac)
    }

    /// The index of the VLAN-table entry for `vid` among the registered
    /// ones below `max`.
    fn find_vlan(&self, vid: u16, max: usize) -> Option<usize> {
        let entry = u32::from(vid) | eth::VLAN_VALID;
        (VLAN_REGULAR..max.min(eth::MAX_VLAN_NUM)).find(|&i| self.vlans[i] == entry)
    }
}

/// QPs of the ETH_ADDR region per port, one per MAC-table entry (Linux's
/// `log_num_mac` 7, no VLAN or priority bits).
pub(crate) const ETH_QPS_PER_PORT: u32 = 1 << 7;

/// The first VLAN-table index for registered VLANs (`MLX4_VLAN_REGULAR`):
/// 0 is untagged frames, 1 the VLAN miss.
pub const VLAN_REGULAR: usize = 2;

/// The QUERY_PORT output as mlx4_en reads it (Linux `mlx4_en_QUERY_PORT`'s
/// `struct mlx4_en_query_port_context`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthPortState {
    /// Byte 0 bit 7: the link is up.
    pub link_up: bool,
    /// Byte 5: the link speed code (`MLX4_EN_40G_SPEED` 0x40, ...).
    pub link_speed: u8,
    /// Bytes 2-3: the largest frame the port takes, FCS included.
    pub eth_mtu: u16,
    /// Bytes 0x10-0x17: the port's MAC (low 48 bits).
    pub mac: u64,
}

impl EthPortState {
    /// Link speed in Mb/s as mlx4_en reports it (`MLX4_EN_*_SPEED`), 0
    /// when unknown.
    pub fn speed_mbps(&self) -> u32 {
        match self.link_speed & 0x7f {
            0x01 => 1_000,
            0x02 => 10_000,
            0x04 => 20_000,
            0x40 => 40_000,
            0x60 => 56_000,
            _ => 0,
        }
    }
}

impl Dev {
    fn check_eth_port(&self, port: u8) -> Result<()> {
        self.check_port(port)?;
        if self.hca.caps.port[usize::from(port)].port_type != PortType::Eth {
            return Err(Error::InvalidArg);
        }
        Ok(())
    }

    fn set_port_eth(&mut self, port: u8, flavour: u32, data: &[u8]) -> Result<()> {
        let mb = Mailbox::new(&self.hca.pool)?;
        mb.write(0, data);
        self.hca.cmd.cmd(
            mb.dma(),
            flavour << 8 | u32::from(port),
            eth::OP_MOD,
            Opcode::SET_PORT,
            timeout::CLASS_B,
        )
    }

    /// Linux `mlx4_SET_PORT_general`: the port's MTU (the largest frame,
    /// FCS included) and global pause (`pptx`/`pprx`) or per-priority flow
    /// control bitmaps (`pfctx`/`pfcrx`).
    #[doc(alias = "mlx4_SET_PORT_general")]
    pub fn set_port_general(
        &mut self,
        port: u8,
        mtu: u16,
        pptx: bool,
        pfctx: u8,
        pprx: bool,
        pfcrx: u8,
    ) -> Result<()> {
        self.check_eth_port(port)?;
        let cap = self.hca.caps.port[usize::from(port)].eth_mtu_cap;
        let max = if cap == 0 { u16::MAX } else { cap };
        Error::check_range("mtu", mtu.into(), 64, max.into())?;
        let b = set_port_general(mtu, pptx, pfctx, pprx, pfcrx);
        self.set_port_eth(port, eth::GENERAL, &b)
    }

    /// Linux `mlx4_get_base_qpn`: the QPN of MAC-table index 0 of `port`
    /// (the ETH_ADDR QP region, `2^log_num_macs` QPs per port).
    #[doc(alias = "mlx4_get_base_qpn")]
    pub fn get_base_qpn(&self, port: u8) -> u32 {
        let c = &self.hca.caps;
        c.reserved_qps_base[1] + u32::from(port.saturating_sub(1)) * ETH_QPS_PER_PORT
    }

    /// Linux `mlx4_SET_PORT_qpn_calc`: frames to MAC index `i` go to
    /// `base_qpn + i`; unicast misses to `base_qpn` when `uc_promisc`;
    /// every multicast and broadcast frame to `base_qpn` (MCAST_DEFAULT:
    /// the MCG table is not used for Ethernet here).
    #[doc(alias = "mlx4_SET_PORT_qpn_calc")]
    pub fn set_port_qpn_calc(&mut self, port: u8, base_qpn: u32, uc_promisc: bool) -> Result<()> {
        self.check_eth_port(port)?;
        let n_mac = self.hca.caps.port[usize::from(port)].log_num_macs;
        let b = set_port_qpn_calc(base_qpn, n_mac, uc_promisc, eth::MCAST_DEFAULT);
        self.set_port_eth(port, eth::RQP_CALC, &b)
    }

    /// Linux `mlx4_register_mac`: the MAC-table index of `mac` on `port`
    /// (`mac` in the low 48 bits), adding it (SET_PORT MAC table) or taking
    /// another reference on it. A multicast or zero MAC is refused; a full
    /// table is [`Error::NoMem`].
    #[doc(alias = "mlx4_register_mac")]
    pub fn register_mac(&mut self, port: u8, mac: u64) -> Result<u32> {
        self.check_eth_port(port)?;
        let mac = mac & MAC_MASK;
        if mac == 0 || mac >> 40 & 1 != 0 {
            return Err(Error::BadArg {
                arg: "mac",
                value: mac,
                why: Why::Other("not a unicast MAC"),
            });
        }
        let max =
            (1usize << self.hca.caps.port[usize::from(port)].log_num_macs).min(eth::MAX_MAC_NUM);
        let t = &mut self.eth[usize::from(port)];
        if let Some(i) = t.find_mac(mac, max) {
            t.mac_refs[i] += 1;
            return Ok(i as u32);
        }
        let free = t.macs[..max]
            .iter()
            .position(|&e| e & eth::MAC_VALID == 0)
            .ok_or(Error::NoMem)?;
        t.macs[free] = mac | eth::MAC_VALID;
        let b = mac_table(&t.macs);
        if let Err(e) = self.set_port_eth(port, eth::MAC_TABLE, &b) {
            mlx4_err!(self.hca.pci, "Failed adding MAC: {mac:#x}");
            self.eth[usize::from(port)].macs[free] = 0;
            return Err(e);
        }
        self.eth[usize::from(port)].mac_refs[free] = 1;
        Ok(free as u32)
    }

    /// Linux `mlx4_unregister_mac`: drops a reference; the last one takes
    /// the MAC out of the table. An unknown MAC only warns.
    #[doc(alias = "mlx4_unregister_mac")]
    pub fn unregister_mac(&mut self, port: u8, mac: u64) {
        if self.check_eth_port(port).is_err() {
            return;
        }
        let mac = mac & MAC_MASK;
        let t = &mut self.eth[usize::from(port)];
        let Some(i) = t.find_mac(mac, eth::MAX_MAC_NUM) else {
            mlx4_warn!(
                self.hca.pci,
                "MAC {mac:#x} is not registered on port {port}"
            );
            return;
        };
        t.mac_refs[i] = t.mac_refs[i].saturating_sub(1);
        if t.mac_refs[i] > 0 {
            return;
        }
        t.macs[i] = 0;
        let b = mac_table(&t.macs);
        if let Err(e) = self.set_port_eth(port, eth::MAC_TABLE, &b) {
            mlx4_warn!(
                self.hca.pci,
                "Failed removing MAC {mac:#x} ({})",
                e.to_errno()
            );
        }
    }

    /// Linux `mlx4_find_cached_mac`: the index of a registered MAC.
    #[doc(alias = "mlx4_find_cached_mac")]
    pub fn find_cached_mac(&self, port: u8, mac: u64) -> Option<u32> {
        let t = self.eth.get(usize::from(port))?;
        t.find_mac(mac & MAC_MASK, eth::MAX_MAC_NUM)
            .map(|i| i as u32)
    }

    /// Reference count of MAC-table index `idx` of `port` (0: free).
    pub fn mac_refs(&self, port: u8, idx: u32) -> u32 {
        self.eth
            .get(usize::from(port))
            .and_then(|t| t.mac_refs.get(idx as usize))
            .copied()
            .unwrap_or(0)
    }

    /// Linux `mlx4_register_vlan`: the VLAN-table index of `vid` on `port`
    /// (from [`VLAN_REGULAR`]), adding it or taking another reference.
    #[doc(alias = "mlx4_register_vlan")]
    pub fn register_vlan(&mut self, port: u8, vid: u16) -> Result<u32> {
        self.check_eth_port(port)?;
        Error::check_range("vid", vid.into(), 1, 4094)?;
        let max = (1usize << self.hca.caps.port[usize::from(port)].log_num_vlans)
            .clamp(VLAN_REGULAR + 1, eth::MAX_VLAN_NUM);
        let t = &mut self.eth[usize::from(port)];
        if let Some(i) = t.find_vlan(vid, max) {
            t.vlan_refs[i] += 1;
            return Ok(i as u32);
        }
        let free = (VLAN_REGULAR..max)
            .find(|&i| t.vlans[i] & eth::VLAN_VALID == 0)
            .ok_or(Error::NoMem)?;
        t.vlans[free] = u32::from(vid) | eth::VLAN_VALID;
        let b = vlan_table(&t.vlans);
        if let Err(e) = self.set_port_eth(port, eth::VLAN_TABLE, &b) {
            mlx4_err!(self.hca.pci, "Failed adding vlan: {vid}");
            self.eth[usize::from(port)].vlans[free] = 0;
            return Err(e);
        }
        self.eth[usize::from(port)].vlan_refs[free] = 1;
        Ok(free as u32)
    }

    /// Linux `mlx4_unregister_vlan`: drops a reference; the last one takes
    /// the VLAN out of the table.
    #[doc(alias = "mlx4_unregister_vlan")]
    pub fn unregister_vlan(&mut self, port: u8, vid: u16) {
        if self.check_eth_port(port).is_err() {
            return;
        }
        let t = &mut self.eth[usize::from(port)];
        let Some(i) = t.find_vlan(vid, eth::MAX_VLAN_NUM) else {
            mlx4_warn!(self.hca.pci, "vlan {vid} is not registered on port {port}");
            return;
        };
        t.vlan_refs[i] = t.vlan_refs[i].saturating_sub(1);
        if t.vlan_refs[i] > 0 {
            return;
        }
        t.vlans[i] = 0;
        let b = vlan_table(&t.vlans);
        if let Err(e) = self.set_port_eth(port, eth::VLAN_TABLE, &b) {
            mlx4_warn!(
                self.hca.pci,
                "Failed removing vlan {vid} ({})",
                e.to_errno()
            );
        }
    }

    /// Linux `mlx4_find_cached_vlan`: the index of a registered VLAN.
    #[doc(alias = "mlx4_find_cached_vlan")]
    pub fn find_cached_vlan(&self, port: u8, vid: u16) -> Option<u32> {
        let t = self.eth.get(usize::from(port))?;
        t.find_vlan(vid, eth::MAX_VLAN_NUM).map(|i| i as u32)
    }

    /// SET_PORT GID table (RoCE): `gids` (at most 128; the rest of the
    /// table zero) become the port's RoCE GID table, entry `i` the source
    /// GID of GID index `i`. mlx4_ib's `update_gid_table` calls it.
    pub fn set_port_gid_table(&mut self, port: u8, gids: &[[u8; 16]]) -> Result<()> {
        self.check_eth_port(port)?;
        Error::check_range("gids", gids.len() as u64, 0, eth::MAX_GIDS as u64)?;
        let mut b = alloc::vec![0u8; eth::MAX_GIDS * 16];
        for (i, g) in gids.iter().enumerate() {
            b[i * 16..i * 16 + 16].copy_from_slice(g);
        }
        self.set_port_eth(port, eth::GID_TABLE, &b)
    }

    /// Linux `mlx4_SET_MCAST_FLTR`: `op_mod` [`eth::MCAST_CONFIG`] adds
    /// `mac` to the filter (`clear` empties it first),
    /// [`eth::MCAST_DISABLE`] lets every multicast through,
    /// [`eth::MCAST_ENABLE`] only what the filter holds (and broadcast).
    #[doc(alias = "mlx4_SET_MCAST_FLTR")]
    pub fn set_mcast_fltr(&mut self, port: u8, mac: u64, clear: bool, op_mod: u8) -> Result<()> {
        self.check_eth_port(port)?;
        let param = (mac & MAC_MASK) | u64::from(clear) << 63;
        self.hca.cmd.cmd(
            param,
            u32::from(port),
            op_mod,
            Opcode::SET_MCAST_FLTR,
            timeout::CLASS_A,
        )
    }

    /// Linux `mlx4_en_QUERY_PORT`: the Ethernet port's link state, speed,
    /// MTU cap and MAC.
    pub fn query_eth_port(&mut self, port: u8) -> Result<EthPortState> {
        self.check_eth_port(port)?;
        let mb = Mailbox::new(&self.hca.pool)?;
        self.hca.cmd.cmd_box(
            0,
            mb.dma(),
            u32::from(port),
            0,
            Opcode::QUERY_PORT,
            timeout::CLASS_B,
        )?;
        let o: [u8; 0x20] = mb.read();
        Ok(EthPortState {
            link_up: o[0] & 0x80 != 0,
            link_speed: o[5],
            eth_mtu: hal::be::get_be16(&o, 2),
            mac: hal::be::get_be64(&o, 0x10) & MAC_MASK,
        })
    }

    /// Linux `mlx4_DUMP_ETH_STATS` (as `mlx4_en_DUMP_ETH_STATS` issues it):
    /// the port's counters as the firmware lays them out (`struct
    /// mlx4_en_stat_out_mbox`, `len` bytes, at most 4096); `reset` starts
    /// them again.
    #[doc(alias = "mlx4_DUMP_ETH_STATS")]
    pub fn dump_eth_stats(&mut self, port: u8, reset: bool, out: &mut [u8]) -> Result<()> {
        self.check_eth_port(port)?;
        if out.len() > mlx4_hw::cmd::MAILBOX_SIZE {
            return Err(Error::InvalidArg);
        }
        let mb = Mailbox::new(&self.hca.pool)?;
        self.hca.cmd.cmd_box(
            0,
            mb.dma(),
            u32::from(reset) << 8 | u32::from(port),
            0,
            Opcode::DUMP_ETH_STATS,
            timeout::CLASS_B,
        )?;
        mb.read_into(0, out);
        Ok(())
    }

    /// Linux `mlx4_do_sense_ports` without `mlx4_change_port_types`: what
    /// SENSE_PORT says each port that may be either type runs now (`None`
    /// where nothing is sensed or sensing is not allowed). Changing a
    /// port's type while the device runs is left out.
    #[doc(alias = "mlx4_do_sense_ports")]
    pub fn do_sense_ports(&mut self) -> [Option<PortType>; crate::MAX_PORTS] {
        let mut out = [None; crate::MAX_PORTS];
        for port in self.hca.caps.ports() {
            if !self.hca.caps.port[usize::from(port)].sense_allowed {
                continue;
            }
            if let Ok(t) = crate::fw::sense_port(&mut self.hca.cmd, port, &self.hca.pci) {
                out[usize::from(port) - 1] = t;
            }
        }
        out
    }
}
