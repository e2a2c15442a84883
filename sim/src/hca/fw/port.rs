//! Port commands.
//!
//! QUERY_PORT, SENSE_PORT, INIT_PORT, CLOSE_PORT, SET_PORT (the IB flavour and
//! the Ethernet ones: general, RQP_CALC, MAC, VLAN and GID tables), the
//! Ethernet filters SET_VLAN_FLTR and SET_MCAST_FLTR, DUMP_ETH_STATS, and
//! MAD_IFC (handed to the firmware SMA/PMA in [`crate::hca::mad_ifc`]); what a
//! VPI port reports and keeps is described in [`crate::hca::eth`].

use super::{CmdResult, Outcome, need};
use crate::fabric::LinkLayer;
use crate::hca::config::PortType;
use crate::hca::device::{FwState, Hca};
use crate::hca::eth::{self, set_port_eth};
use crate::hca::hcr::{Command, Status};
use crate::hca::layout::{
    PortCap, get8, get16, get32, get64, put8, put16, put32, put64, set_port_ib,
};

fn port_of(hca: &mut Hca, cmd: &Command) -> Result<usize, Status> {
    port_in(hca, cmd, cmd.in_mod)
}

/// The port named by `v` (bits 7:0 of an input modifier whose other bits
/// the caller has checked).
fn port_in(hca: &mut Hca, cmd: &Command, v: u32) -> Result<usize, Status> {
    if v >> 8 != 0 {
        hca.violation(format!(
            "{}: input modifier {:#010x} has reserved bits set (the port is 7:0)",
            cmd.opcode, cmd.in_mod
        ));
        return Err(Status::BAD_PARAM);
    }
    hca.port_index(v).ok_or(Status::BAD_PARAM)
}

/// IB VLCap encoding of a number of data VLs.
fn vl_enum(n: u8) -> u8 {
    match n {
        0 | 1 => 1,
        2 => 2,
        3 | 4 => 3,
        _ => 4,
    }
}

/// QUERY_PORT: in_mod = port.
pub fn query_port(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Running, FwState::Initialized])?;
    let i = port_of(hca, cmd)?;
    let p = &hca.ports[i];
    let mut b = PortCap {
        ib_mtu: p.mtu_cap,
        width: 3,
        log_max_gids: 7,
        log_max_pkeys: 7,
        max_vl: vl_enum(p.max_vls),
    }
    .encode();
    // iPXE's `link_state` (byte 0 bit 7) and `ib_link_speed` (byte 4); Linux
    // reads neither.
    if p.phys == crate::fabric::PhysicalState::LinkUp {
        b[0] |= 0x80;
    }
    b[4] = 0x07;
    if p.port_type != PortType::Ib {
        // A port that may be Ethernet (crate::hca::eth): its types, the
        // suggested one (bit 3: Ethernet), "default sense" for either,
        // the Ethernet MTU, speed, table sizes and MAC.
        use crate::hca::layout::query_port::*;
        let suggest_eth = match p.port_type {
            PortType::Eth => true,
            _ => sensed(hca, i) == Some(LinkLayer::Eth),
        };
        let p = &hca.ports[i];
        let auto = p.port_type == PortType::Auto;
        b[SUPPORTED_TYPE] = (b[SUPPORTED_TYPE] & 0x80)
            | p.port_type.supported_bits()
            | u8::from(suggest_eth) << 3
            | u8::from(auto) << 4;
        put16(&mut b, ETH_MTU, eth::ETH_MTU_CAP);
        put8(&mut b, 5, eth::LINK_SPEED_40G);
        put8(
            &mut b,
            MAX_MACVLAN,
            eth::LOG_MAX_VLAN << 4 | eth::LOG_MAX_MAC,
        );
        put64(&mut b, MAC, eth::mac_u64(&p.eth.mac));
    }
    hca.write_mailbox(cmd.out_param, &b)?;
    Ok(Outcome::OK)
}

/// The link layer of what port index `i`'s cable reaches, if it has one.
fn sensed(hca: &Hca, i: usize) -> Option<LinkLayer> {
    let port = hca.ports.get(i)?.num;
    crate::hca::engine::wire::cable_link_layer(hca, port)
}

/// SENSE_PORT: in_mod = port; immediate output = the sensed link type
/// (1 InfiniBand, 2 Ethernet): a fixed port's own type, for a port that
/// may be either the type of what its cable reaches (0, "none", without a
/// cable). Linux (`mlx4_SENSE_PORT`) and iPXE (`hermon_cmd_sense_port`, an
/// 8-byte "out" that fits the HCR) both read it from HCR dwords 3..4.
/// Taken once the firmware runs: Linux's `mlx4_dev_cap` senses a "default
/// sense" port after QUERY_DEV_CAP, before INIT_HCA.
pub fn sense_port(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Running, FwState::Initialized])?;
    let i = port_of(hca, cmd)?;
    let t = match hca.ports[i].port_type {
        PortType::Ib => 1,
        PortType::Eth => 2,
        PortType::Auto => match sensed(hca, i) {
            Some(LinkLayer::Ib) => 1,
            Some(LinkLayer::Eth) => 2,
            None => 0,
        },
    };
    Ok(Outcome::imm(t))
}

/// INIT_PORT: enables the port; the link trains if the cable is plugged.
pub fn init_port(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    let i = port_of(hca, cmd)?;
    let before = hca.ports[i].state;
    hca.ports[i].initialized = true;
    hca.ports[i].retrain();
    hca.port_changed(i, before);
    Ok(Outcome::OK)
}

/// CLOSE_PORT: disables the port (PORT_CHANGE down if it was active).
/// Closing a port that is not open succeeds and changes nothing: Linux
/// closes every port again in `mlx4_unload_one` after mlx4_ib's remove has
/// closed its IB ports (and closes ports it never opened), on every unload,
/// and real cards do not fail it (no "command 0xa failed" on unload).
pub fn close_port(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    let i = port_of(hca, cmd)?;
    if !hca.ports[i].initialized {
        return Ok(Outcome::OK);
    }
    let before = hca.ports[i].state;
    hca.ports[i].initialized = false;
    hca.ports[i].retrain();
    hca.port_changed(i, before);
    Ok(Outcome::OK)
}

/// SET_PORT: op_mod 0 the InfiniBand flavour ([`set_port_ib`]), 1 the
/// Ethernet ones ([`set_port_eth`]).
pub fn set_port(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    match cmd.op_mod {
        0 => set_port_ib(hca, cmd),
        1 => set_port_eth(hca, cmd),
        _ => Err(Status::BAD_OP),
    }
}

/// Port index `i` is to run `want` (the flavour of a SET_PORT): a fixed
/// port of the other type has no such flavour (BAD_OP); a port of type
/// `Auto` takes it, unless it is open and runs the other (BAD_RES_STATE).
fn take_flavour(hca: &mut Hca, cmd: &Command, i: usize, want: LinkLayer) -> Result<(), Status> {
    let p = &hca.ports[i];
    let fixed = match p.port_type {
        PortType::Ib => Some(LinkLayer::Ib),
        PortType::Eth => Some(LinkLayer::Eth),
        PortType::Auto => None,
    };
    if fixed.is_some_and(|f| f != want) {
        return Err(Status::BAD_OP);
    }
    if p.initialized && p.link_layer() != want {
        hca.violation(format!(
            "{} (op_mod {}) on port {}, open as {}: CLOSE_PORT before changing the port's type",
            cmd.opcode,
            cmd.op_mod,
            p.num,
            p.link_layer().name()
        ));
        return Err(Status::BAD_RES_STATE);
    }
    if fixed.is_none() {
        hca.ports[i].asked = Some(want);
    }
    Ok(())
}

/// SET_PORT (IB, op_mod 0): MTU and VL capabilities, P_Key table size,
/// capability mask, Q_Key violation counter reset. A VL capability above
/// what the port supports is EXCEED_LIM (Linux retries with fewer VLs).
fn set_port_ib(hca: &mut Hca, cmd: &Command) -> CmdResult {
    use set_port_ib::*;
    let i = port_of(hca, cmd)?;
    take_flavour(hca, cmd, i, LinkLayer::Ib)?;
    let b = hca.read_mailbox(cmd.in_param, 0x100)?;
    let flags = get32(&b, FLAGS);
    let mtu = ((flags >> MTU_SHIFT) & 0xf) as u8;
    let vl = ((flags >> VL_SHIFT) & 0xf) as u8;
    let pkeys = get16(&b, PKEY_TABLE_SIZE);
    let p = &hca.ports[i];
    if flags & CHANGE_MTU != 0 && (mtu == 0 || mtu > 5) {
        return Err(Status::BAD_PARAM);
    }
    if flags & CHANGE_VL != 0 {
        if !vl.is_power_of_two() {
            return Err(Status::BAD_PARAM);
        }
        if vl > p.max_vls {
            return Err(Status::EXCEED_LIM);
        }
    }
    if flags & CHANGE_PKEY != 0
        && (pkeys == 0 || usize::from(pkeys) > crate::hca::port::PKEY_TABLE_LEN)
    {
        return Err(Status::BAD_PARAM);
    }
    let p = &mut hca.ports[i];
    if flags & CHANGE_MTU != 0 {
        p.mtu_cap = mtu;
    }
    if flags & CHANGE_VL != 0 {
        p.vl_cap = vl;
    }
    if get8(&b, 3) & RESET_QKEY_CNTR as u8 != 0 {
        p.qkey_violations = 0;
    }
    let old_mask = p.cap_mask;
    p.cap_mask = get32(&b, CAP_MASK);
    let mask_changed = p.cap_mask != old_mask;
    // iPXE/PRM only: replace GUID0, the node GUID, the system image GUID.
    if flags & CHANGE_GUID0 != 0 {
        p.guids[0] = get64(&b, GUID0);
    }
    if flags & CHANGE_NODE_GUID != 0 {
        hca.cfg.node_guid = get64(&b, NODE_GUID);
    }
    if flags & CHANGE_SYS_IMAGE_GUID != 0 {
        hca.cfg.sys_image_guid = get64(&b, SYS_IMAGE_GUID);
    }
    if mask_changed {
        // The SMA tells the SM (IsCapabilityMaskNoticeSupported): trap 144.
        crate::hca::mad_ifc::capability_mask_trap(hca, i);
    }
    Ok(Outcome::OK)
}

/// SET_PORT (Ethernet, op_mod 1): in_mod = flavour << 8 | port (bits
/// 31:16 reserved); general (MTU, pause), RQP_CALC, the MAC, VLAN and GID
/// tables, and the priority table (accepted, not kept). A table the card
/// would not keep is BAD_PARAM, recorded; the flavours of the ConnectX-3
/// Pro (VXLAN, RoCE v2 addresses) are BAD_PARAM.
fn set_port_eth(hca: &mut Hca, cmd: &Command) -> CmdResult {
    use set_port_eth::*;
    if cmd.in_mod >> 16 != 0 {
        hca.violation(format!(
            "SET_PORT (Ethernet): input modifier {:#010x} has reserved bits 31:16 set",
            cmd.in_mod
        ));
        return Err(Status::BAD_PARAM);
    }
    let i = hca.port_index(cmd.in_mod & 0xff).ok_or(Status::BAD_PARAM)?;
    let sub = (cmd.in_mod >> 8) & 0xff;
    if !matches!(
        sub,
        GENERAL | RQP_CALC | MAC_TABLE | VLAN_TABLE | PRIO_TABLE | GID_TABLE
    ) {
        hca.violation(format!(
            "SET_PORT (Ethernet) flavour {sub:#x} is not a ConnectX-3 one (general 0, RQP_CALC 1, MAC 2, VLAN 3, priority 4, GID 5)"
        ));
        return Err(Status::BAD_PARAM);
    }
    take_flavour(hca, cmd, i, LinkLayer::Eth)?;
    let len = match sub {
        MAC_TABLE => eth::MAC_TABLE_LEN * 8,
        VLAN_TABLE => eth::VLAN_TABLE_LEN * 4,
        GID_TABLE => eth::GID_TABLE_LEN * 16,
        _ => 0x40,
    };
    let b = hca.read_mailbox(cmd.in_param, len)?;
    let p = &mut hca.ports[i].eth;
    let r = match sub {
        GENERAL => p.set_general(&b),
        RQP_CALC => {
            p.rqp = Some(eth::RqpCalc::decode(&b));
            Ok(())
        }
        MAC_TABLE => p.set_macs(&b),
        VLAN_TABLE => p.set_vlans(&b),
        GID_TABLE => p.set_gids(&b),
        _ => Ok(()),
    };
    match r {
        Ok(()) => Ok(Outcome::OK),
        Err(why) => {
            hca.violation(format!(
                "SET_PORT (Ethernet) flavour {sub} on port {}: {why}",
                i + 1
            ));
            Err(Status::BAD_PARAM)
        }
    }
}

/// The Ethernet port an Ethernet filter command names (in_mod = port).
fn eth_port_of(hca: &mut Hca, cmd: &Command) -> Result<usize, Status> {
    let i = port_of(hca, cmd)?;
    if !hca.ports[i].is_eth() {
        hca.violation(format!(
            "{} on port {}, which runs InfiniBand",
            cmd.opcode,
            i + 1
        ));
        return Err(Status::BAD_PARAM);
    }
    Ok(i)
}

/// SET_MCAST_FLTR: in_mod = port, op_mod = 0 configure (in_param = MAC,
/// bit 63 clears the filter first; Linux `mlx4_SET_MCAST_FLTR`), 1
/// disable, 2 enable the filter.
pub fn set_mcast_fltr(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    let i = eth_port_of(hca, cmd)?;
    let f = &mut hca.ports[i].eth.mcast_filter;
    match cmd.op_mod {
        0 => {
            if cmd.in_param >> 63 != 0 {
                f.1.clear();
            }
            let mac = cmd.in_param & 0xffff_ffff_ffff;
            if mac != 0 {
                f.1.insert(mac);
            }
        }
        1 => f.0 = false,
        2 => f.0 = true,
        _ => return Err(Status::BAD_OP),
    }
    Ok(Outcome::OK)
}

/// SET_VLAN_FLTR: in_mod = port, a mailbox of 128 BE32, entry `i` bit `j`
/// letting VID `(127 - i) * 32 + j` through (Linux `mlx4_SET_VLAN_FLTR`).
pub fn set_vlan_fltr(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    if cmd.op_mod != 0 {
        return Err(Status::BAD_OP);
    }
    let i = eth_port_of(hca, cmd)?;
    let b = hca.read_mailbox(cmd.in_param, 512)?;
    let mut f = Box::new([false; 4096]);
    for e in 0..128usize {
        let w = get32(&b, e * 4);
        for j in 0..32usize {
            f[(127 - e) * 32 + j] = w >> j & 1 != 0;
        }
    }
    hca.ports[i].eth.vlan_filter = Some(f);
    Ok(Outcome::OK)
}

/// DUMP_ETH_STATS: in_mod = reset << 8 | port; the port's counters in the
/// output mailbox where Linux's `struct mlx4_en_stat_out_mbox` reads them
/// (the per-priority counters as "no VLAN", the drop counters), zero
/// elsewhere; with the reset bit the counters start again.
pub fn dump_eth_stats(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    if cmd.op_mod != 0 {
        return Err(Status::BAD_OP);
    }
    let reset = cmd.in_mod >> 8 & 1 != 0;
    if cmd.in_mod & !0x1ff != 0 {
        return Err(Status::BAD_PARAM);
    }
    let i = hca.port_index(cmd.in_mod & 0xff).ok_or(Status::BAD_PARAM)?;
    let c = hca.ports[i].eth.counters;
    let mut b = vec![0u8; 4096];
    // __be64 slots (struct order), then the __be32 drop counters at 2952.
    let q = |b: &mut [u8], slot: usize, v: u64| put64(b, slot * 8, v);
    q(&mut b, 98, c.rx_broadcast); // RBCAST_novlan
    q(&mut b, 107, c.rx_multicast); // MCAST_novlan
    q(&mut b, 143, c.rx_bytes); // ROCT_novlan
    q(&mut b, 168, c.rx_frames); // RTOT_novlan
    q(&mut b, 177, c.rx_too_long); // RFrmTooLong
    q(&mut b, 287, c.tx_broadcast); // TBCAST_novlan
    q(&mut b, 297, c.tx_multicast); // TMCAST_novlan
    q(&mut b, 335, c.tx_bytes); // TOCT_novlan
    q(&mut b, 363, c.tx_frames); // TTOT_novlan
    let d = |b: &mut [u8], off: usize, v: u64| put32(b, off, v.min(u64::from(u32::MAX)) as u32);
    let rx_drops = c.rx_no_steer + c.rx_bad_qp + c.rx_no_wqe + c.rx_too_long_for_wqe;
    d(&mut b, 2956, c.rx_bad_fcs); // RCRC
    d(&mut b, 2964, c.rx_runt); // RSHORT
    d(
        &mut b,
        2968,
        rx_drops + c.rx_vlan_drop + c.rx_mcast_filtered,
    ); // RDROP
    d(&mut b, 2972, c.rx_no_wqe); // RdropOvflw
    d(&mut b, 2976, c.rx_too_long_for_wqe); // RdropLength
    d(&mut b, 2980, c.rx_frames); // RTOTFRMS
    d(&mut b, 2984, c.tx_dropped); // TDROP
    hca.write_mailbox(cmd.out_param, &b)?;
    if reset {
        hca.ports[i].eth.counters = eth::EthCounters::default();
    }
    Ok(Outcome::OK)
}

/// MAD_IFC: in_mod = port | SLID << 16; op_mod bits ignore M_Key (1) and
/// B_Key (2); 256-byte request in, 256-byte response out.
pub fn mad_ifc(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    // Bits 7:0 port; bit 8 is iPXE/PRM's "extended info valid" (Linux uses
    // op_mod bit 2 instead); bits 31:16 the source LID; 15:9 reserved.
    let i = port_in(hca, cmd, cmd.in_mod & 0xfeff)?;
    let mad = hca.read_mailbox(cmd.in_param, crate::hca::mad_ifc::MAD_SIZE)?;
    // With the extended info (op_mod bit 2) the MAD came from the link
    // and bits 31:16 are its SLID.
    let slid = (cmd.op_mod & 0x4 != 0).then_some((cmd.in_mod >> 16) as u16);
    let resp = crate::hca::mad_ifc::process_from(hca, i, cmd.op_mod, slid, &mad)?;
    hca.write_mailbox(cmd.out_param, &resp)?;
    Ok(Outcome::OK)
}
