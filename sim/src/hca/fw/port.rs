//! Port commands.
//!
//! QUERY_PORT, SENSE_PORT, INIT_PORT, CLOSE_PORT, SET_PORT (IB flavour) and MAD_IFC
//! (handed to the firmware SMA/PMA in [`crate::hca::mad_ifc`]); the Ethernet
//! SET_PORT flavours answer BAD_OP.

use super::{CmdResult, Outcome, need};
use crate::hca::device::{FwState, Hca};
use crate::hca::hcr::{Command, Status};
use crate::hca::layout::{PortCap, get8, get16, get32, get64, set_port_ib};

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
    hca.write_mailbox(cmd.out_param, &b)?;
    Ok(Outcome::OK)
}

/// SENSE_PORT: in_mod = port; immediate output = the sensed link type
/// (1 = InfiniBand: the ports are IB-only). Linux (`mlx4_SENSE_PORT`) and
/// iPXE (`hermon_cmd_sense_port`, an 8-byte "out" that fits the HCR) both
/// read it from HCR dwords 3..4.
pub fn sense_port(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    port_of(hca, cmd)?;
    Ok(Outcome::imm(1))
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

/// SET_PORT (IB, op_mod 0): MTU and VL capabilities, P_Key table size,
/// capability mask, Q_Key violation counter reset. A VL capability above
/// what the port supports is EXCEED_LIM (Linux retries with fewer VLs).
pub fn set_port(hca: &mut Hca, cmd: &Command) -> CmdResult {
    use set_port_ib::*;
    need(hca, &[FwState::Initialized])?;
    if cmd.op_mod != 0 {
        return Err(Status::BAD_OP);
    }
    let i = port_of(hca, cmd)?;
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
