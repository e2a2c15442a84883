//! The firmware's subnet-management and performance-management agents behind MAD_IFC.
//!
//! SubnGet/SubnSet of NodeDescription, NodeInfo, PortInfo, GUIDInfo, PKeyTable
//! (LID-routed and directed-route SMPs, processed locally), and PMA ClassPortInfo /
//! PortCounters / PortCountersExtended (the counters the data-path engines keep);
//! SMInfo, SL-to-VL and VL arbitration tables, traps, B_Key checks and
//! directed-route forwarding are not modelled.
//!
//! Layouts are the IBA's (vol. 1, 13.4 MAD header, 14.2.5 SMP attributes,
//! 16.1 PMA): MAD header 24 bytes (attribute id at 0x10, modifier at 0x14),
//! SMP M_Key at 0x18, SMP and PMA data at 0x40. Responses are GetResp
//! (0x81) copies of the request with the IBA status field set; Linux's
//! mlx4_ib adds the directed-route D bit itself, so the firmware does not.

use crate::fabric::LogicalState;
use crate::hca::device::Hca;
use crate::hca::hcr::Status;
use crate::hca::layout::{get8, get16, get32, get64, put8, put16, put32, put64};
use crate::hca::port::Port;

/// MAD size.
pub const MAD_SIZE: usize = 256;
/// SMP/PMA data offset.
pub const DATA: usize = 0x40;

/// Management classes.
pub mod class {
    #![allow(missing_docs)]
    pub const SUBN_LID_ROUTED: u8 = 0x01;
    pub const SUBN_DIRECTED_ROUTE: u8 = 0x81;
    pub const PERF_MGMT: u8 = 0x04;
    pub const VENDOR_09: u8 = 0x09;
    pub const VENDOR_0A: u8 = 0x0a;
    pub const CONG_MGMT: u8 = 0x21;
}

/// Methods.
pub mod method {
    #![allow(missing_docs)]
    pub const GET: u8 = 0x01;
    pub const SET: u8 = 0x02;
    pub const TRAP_REPRESS: u8 = 0x07;
    pub const GET_RESP: u8 = 0x81;
}

/// Attribute ids.
pub mod attr {
    #![allow(missing_docs)]
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    pub const NODE_DESC: u16 = 0x0010;
    pub const NODE_INFO: u16 = 0x0011;
    pub const GUID_INFO: u16 = 0x0014;
    pub const PORT_INFO: u16 = 0x0015;
    pub const PKEY_TABLE: u16 = 0x0016;
    pub const SM_INFO: u16 = 0x0020;
    pub const PORT_COUNTERS: u16 = 0x0012;
    pub const PORT_COUNTERS_EXT: u16 = 0x001d;
    pub const VENDOR_EXT_PORT_INFO: u16 = 0xff90;
}

/// MAD status values (IBA 13.4.7).
pub mod mad_status {
    #![allow(missing_docs)]
    pub const BAD_VERSION: u16 = 0x0004;
    pub const METHOD_UNSUPPORTED: u16 = 0x0008;
    pub const ATTR_UNSUPPORTED: u16 = 0x000c;
    pub const INVALID_FIELD: u16 = 0x001c;
}

/// Mellanox's IEEE OUI.
pub const VENDOR_ID: u32 = 0x0002c9;

/// Processes one MAD for port index `pi` and returns the response MAD.
pub fn process(hca: &mut Hca, pi: usize, op_mod: u8, mad: &[u8]) -> Result<Vec<u8>, Status> {
    if get8(mad, 0) != 1 {
        return Err(Status::BAD_PKT);
    }
    let cls = get8(mad, 1);
    let meth = get8(mad, 3);
    if meth & 0x80 != 0 {
        return Err(Status::BAD_PKT);
    }
    let mut r = mad[..MAD_SIZE.min(mad.len())].to_vec();
    r.resize(MAD_SIZE, 0);
    let status = match cls {
        class::SUBN_LID_ROUTED | class::SUBN_DIRECTED_ROUTE => {
            if get8(mad, 2) != 1 {
                Ok(mad_status::BAD_VERSION)
            } else {
                smp(hca, pi, op_mod, mad, &mut r)
            }
        }
        class::PERF_MGMT => {
            if get8(mad, 2) != 1 {
                Ok(mad_status::BAD_VERSION)
            } else {
                pma(hca, pi, mad, &mut r)
            }
        }
        class::VENDOR_09 | class::VENDOR_0A | class::CONG_MGMT => Ok(mad_status::ATTR_UNSUPPORTED),
        _ => Err(Status::BAD_PKT),
    }?;
    if meth != method::TRAP_REPRESS {
        put8(&mut r, 3, method::GET_RESP);
    }
    let keep_d = get16(&r, 4) & 0x8000;
    put16(&mut r, 4, status | keep_d);
    Ok(r)
}

fn smp(hca: &mut Hca, pi: usize, op_mod: u8, mad: &[u8], r: &mut [u8]) -> Result<u16, Status> {
    let meth = get8(mad, 3);
    let id = get16(mad, 0x10);
    let modifier = get32(mad, 0x14);
    let ignore_mkey = op_mod & 1 != 0;
    let port = &hca.ports[pi];
    if !ignore_mkey && port.mkey != 0 && get64(mad, 0x18) != port.mkey {
        let protected = meth == method::SET || port.mkey_protect >= 2;
        if protected {
            hca.ports[pi].mkey_violations = hca.ports[pi].mkey_violations.saturating_add(1);
            return Err(Status::BAD_PKT);
        }
    }
    if meth == method::TRAP_REPRESS {
        return Ok(0);
    }
    if meth != method::GET && meth != method::SET {
        return Ok(mad_status::METHOD_UNSUPPORTED);
    }
    let set = meth == method::SET;
    let data = &mad[DATA..DATA + 64];
    let out = &mut r[DATA..DATA + 64];
    match (id, set) {
        (attr::NODE_DESC, false) => {
            out.fill(0);
            for (o, c) in out.iter_mut().zip(hca.cfg.node_description.bytes()) {
                *o = c;
            }
        }
        (attr::NODE_INFO, false) => {
            out.fill(0);
            put8(out, 0, 1);
            put8(out, 1, 1);
            put8(out, 2, 1); // channel adapter
            put8(out, 3, hca.ports.len() as u8);
            put64(out, 4, hca.cfg.sys_image_guid);
            put64(out, 12, hca.cfg.node_guid);
            put64(out, 20, hca.ports[pi].guid());
            put16(out, 28, crate::hca::port::PKEY_TABLE_LEN as u16);
            put16(out, 30, crate::hca::pci::DEVICE_CONNECTX3);
            put32(out, 32, hca.cfg.hw_rev);
            put32(out, 36, u32::from(hca.ports[pi].num) << 24 | VENDOR_ID);
        }
        (attr::GUID_INFO, _) => {
            let block = modifier as usize;
            if (block + 1) * 8 > crate::hca::port::GUID_TABLE_LEN {
                return Ok(mad_status::INVALID_FIELD);
            }
            if set {
                // Index 0 (the port GUID) is read-only.
                for k in 0..8 {
                    if block * 8 + k != 0 {
                        hca.ports[pi].guids[block * 8 + k] = get64(data, k * 8);
                    }
                }
            }
            for k in 0..8 {
                put64(out, k * 8, hca.ports[pi].guids[block * 8 + k]);
            }
        }
        (attr::PKEY_TABLE, _) => {
            let block = (modifier & 0xffff) as usize;
            if (block + 1) * 32 > crate::hca::port::PKEY_TABLE_LEN {
                return Ok(mad_status::INVALID_FIELD);
            }
            if set {
                for k in 0..32 {
                    hca.ports[pi].pkeys[block * 32 + k] = get16(data, k * 2);
                }
            }
            for k in 0..32 {
                put16(out, k * 2, hca.ports[pi].pkeys[block * 32 + k]);
            }
        }
        (attr::PORT_INFO, _) => {
            // The port is the modifier's low byte; bit 31 is the SM's
            // SMSupportsExtendedSpeeds flag (OpenSM sets it for a port
            // whose CapabilityMask has IsExtendedSpeedsSupported).
            let port = modifier & 0xff;
            let target = if port == 0 {
                Some(pi)
            } else {
                hca.port_index(port)
            };
            let Some(ti) = target else {
                return Ok(mad_status::INVALID_FIELD);
            };
            if set {
                let before = hca.ports[ti].state;
                if let Err(s) = port_info_set(&mut hca.ports[ti], data) {
                    encode_port_info(&hca.ports[ti], out);
                    return Ok(s);
                }
                hca.port_changed(ti, before);
            }
            encode_port_info(&hca.ports[ti], out);
        }
        (attr::VENDOR_EXT_PORT_INFO, false) => out.fill(0),
        _ => return Ok(mad_status::ATTR_UNSUPPORTED),
    }
    Ok(0)
}

/// PortInfo (IBA 14.2.5.6) as the SMA reports it.
pub fn encode_port_info(p: &Port, out: &mut [u8]) {
    out[..64].fill(0);
    put64(out, 0, p.mkey);
    put64(out, 8, p.gid_prefix);
    put16(out, 16, p.lid);
    put16(out, 18, p.sm_lid);
    put32(out, 20, p.cap_mask);
    put16(out, 26, p.mkey_lease);
    put8(out, 28, p.num);
    put8(out, 29, 0x03); // width enabled: 1x, 4x
    put8(out, 30, 0x03); // width supported
    put8(out, 31, 0x02); // width active: 4x
    put8(out, 32, 0x70 | p.state as u8); // speed supported SDR/DDR/QDR
    put8(out, 33, (p.phys as u8) << 4 | 0x2); // link down default: polling
    put8(out, 34, p.mkey_protect << 6 | (p.lmc & 7));
    put8(out, 35, 0x40 | 0x07); // active QDR, enabled SDR/DDR/QDR
    put8(out, 36, p.neighbor_mtu << 4 | (p.sm_sl & 0xf));
    let vl_cap = match p.vl_cap {
        0 | 1 => 1,
        2 => 2,
        3 | 4 => 3,
        _ => 4,
    };
    put8(out, 37, vl_cap << 4);
    put8(out, 39, 8); // VL arbitration high cap
    put8(out, 40, 8); // VL arbitration low cap
    put8(out, 41, p.mtu_cap & 0xf);
    put8(out, 42, 0x1f); // HOQ life
    put8(out, 43, p.op_vls << 4);
    put16(out, 44, p.mkey_violations);
    put16(out, 46, p.pkey_violations);
    put16(out, 48, p.qkey_violations);
    put8(out, 50, crate::hca::port::GUID_TABLE_LEN as u8);
    put8(
        out,
        51,
        u8::from(p.client_rereg) << 7 | (p.subnet_timeout & 0x1f),
    );
    put8(out, 52, 0x10); // response time value
}

/// Applies a SubnSet(PortInfo); an invalid state change leaves the port
/// untouched and answers "invalid field".
fn port_info_set(p: &mut Port, d: &[u8]) -> Result<(), u16> {
    let new_state = p
        .state
        .set_by_sm(get8(d, 32) & 0xf)
        .ok_or(mad_status::INVALID_FIELD)?;
    let lid = get16(d, 16);
    if lid >= 0xc000 && lid != 0xffff {
        return Err(mad_status::INVALID_FIELD);
    }
    p.mkey = get64(d, 0);
    p.gid_prefix = get64(d, 8);
    p.lid = lid;
    p.sm_lid = get16(d, 18);
    p.mkey_lease = get16(d, 26);
    p.mkey_protect = get8(d, 34) >> 6;
    p.lmc = get8(d, 34) & 7;
    let nmtu = get8(d, 36) >> 4;
    if nmtu != 0 {
        p.neighbor_mtu = nmtu.min(p.mtu_cap);
    }
    p.sm_sl = get8(d, 36) & 0xf;
    let op_vls = get8(d, 43) >> 4;
    if op_vls != 0 {
        p.op_vls = op_vls;
    }
    p.client_rereg = get8(d, 51) & 0x80 != 0;
    p.subnet_timeout = get8(d, 51) & 0x1f;
    match new_state {
        Some(LogicalState::Down) => {
            // The link retrains: Down, then Init again if it is up.
            p.state = LogicalState::Down;
            p.retrain();
        }
        Some(s) => p.state = s,
        None => {}
    }
    Ok(())
}

fn pma(hca: &mut Hca, pi: usize, mad: &[u8], r: &mut [u8]) -> Result<u16, Status> {
    let meth = get8(mad, 3);
    let id = get16(mad, 0x10);
    if meth != method::GET && meth != method::SET {
        return Ok(mad_status::METHOD_UNSUPPORTED);
    }
    let out = &mut r[DATA..DATA + 192];
    match (id, meth) {
        (attr::CLASS_PORT_INFO, method::GET) => {
            out.fill(0);
            put8(out, 0, 1);
            put8(out, 1, 1);
            // CapabilityMask: AllPortSelect (bit 8), PortCountersExtended
            // supported (IsExtendedWidthSupported is bit 9: set, the
            // 64-bit data/packet counters are there).
            put16(out, 2, 1 << 8 | 1 << 9);
            put32(out, 4, 0x12); // RespTimeValue
        }
        (attr::PORT_COUNTERS_EXT, _) => {
            // IBA 16.1.4.11: PortSelect at 1, CounterSelect at 2, the
            // 64-bit counters from 8: XmitData, RcvData, XmitPkts,
            // RcvPkts, Unicast Xmit/Rcv, Multicast Xmit/Rcv.
            let select = get16(mad, DATA + 2);
            let c = &mut hca.ports[pi].counters;
            if meth == method::SET {
                if select & 1 != 0 {
                    c.ext_xmit_data = 0;
                }
                if select & 2 != 0 {
                    c.ext_rcv_data = 0;
                }
                if select & 4 != 0 {
                    c.ext_xmit_pkts = 0;
                }
                if select & 8 != 0 {
                    c.ext_rcv_pkts = 0;
                }
            }
            let c = *c;
            let port_select = get8(mad, DATA + 1);
            out.fill(0);
            put8(out, 1, port_select);
            put16(out, 2, select);
            put64(out, 8, c.ext_xmit_data);
            put64(out, 16, c.ext_rcv_data);
            put64(out, 24, c.ext_xmit_pkts);
            put64(out, 32, c.ext_rcv_pkts);
            // Every packet is unicast (multicast is not modelled).
            put64(out, 40, c.ext_xmit_pkts);
            put64(out, 48, c.ext_rcv_pkts);
        }
        (attr::PORT_COUNTERS, _) => {
            let select = get16(mad, DATA + 2);
            let c = &mut hca.ports[pi].counters;
            if meth == method::SET {
                if select & 1 != 0 {
                    c.symbol_errors = 0;
                }
                if select & 4 != 0 {
                    c.link_downed = 0;
                }
                if select & 8 != 0 {
                    c.rcv_errors = 0;
                }
                // IBTA table 247: CounterSelect bit 6 is PortXmitDiscards
                // (bit 7 is PortXmitConstraintErrors, not modelled).
                if select & 0x40 != 0 {
                    c.xmit_discards = 0;
                }
                if select & 0x800 != 0 {
                    c.vl15_dropped = 0;
                }
                if select & 0x1000 != 0 {
                    c.xmit_data = 0;
                }
                if select & 0x2000 != 0 {
                    c.rcv_data = 0;
                }
                if select & 0x4000 != 0 {
                    c.xmit_pkts = 0;
                }
                if select & 0x8000 != 0 {
                    c.rcv_pkts = 0;
                }
            }
            let c = *c;
            let port_select = get8(mad, DATA + 1);
            out.fill(0);
            put8(out, 1, port_select);
            put16(out, 2, select);
            put16(out, 4, c.symbol_errors);
            put8(out, 7, c.link_downed);
            put16(out, 8, c.rcv_errors);
            put16(out, 14, c.xmit_discards);
            put16(out, 22, c.vl15_dropped);
            put32(out, 24, c.xmit_data);
            put32(out, 28, c.rcv_data);
            put32(out, 32, c.xmit_pkts);
            put32(out, 36, c.rcv_pkts);
        }
        _ => return Ok(mad_status::ATTR_UNSUPPORTED),
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hca::HcaConfig;

    #[test]
    fn port_info_golden() {
        let mut p = Port::new(2, &HcaConfig::default());
        p.initialized = true;
        p.retrain();
        p.state = LogicalState::Active;
        p.lid = 0x0012;
        p.sm_lid = 0x0001;
        p.sm_sl = 3;
        p.lmc = 1;
        p.subnet_timeout = 18;
        p.qkey_violations = 5;
        let mut d = [0u8; 64];
        encode_port_info(&p, &mut d);
        assert_eq!(&d[0..8], &[0; 8], "M_Key");
        assert_eq!(&d[8..16], &[0xfe, 0x80, 0, 0, 0, 0, 0, 0], "GID prefix");
        assert_eq!(&d[16..20], &[0x00, 0x12, 0x00, 0x01], "LID, SM LID");
        assert_eq!(&d[20..24], &[0x02, 0x51, 0x48, 0x68], "capability mask");
        assert_eq!(d[28], 2, "local port");
        assert_eq!((d[29], d[30], d[31]), (3, 3, 2), "widths");
        assert_eq!(d[32], 0x74, "speed supported | Active");
        assert_eq!(d[33], 0x52, "LinkUp | default Polling");
        assert_eq!(d[34], 0x01, "LMC");
        assert_eq!(d[35], 0x47, "QDR active | enabled");
        assert_eq!(d[36], 0x53, "neighbor MTU 4096 | SM SL");
        assert_eq!(d[37] >> 4, 4, "VL0-7");
        assert_eq!(d[41] & 0xf, 5, "MTU cap");
        assert_eq!(&d[48..50], &[0, 5], "Q_Key violations");
        assert_eq!(d[50], 128, "GUID cap");
        assert_eq!(d[51], 18, "subnet timeout");
    }

    #[test]
    fn port_info_set_rules() {
        let mut p = Port::new(1, &HcaConfig::default());
        p.initialized = true;
        p.retrain();
        let mut d = [0u8; 64];
        encode_port_info(&p, &mut d);
        d[32] = (d[32] & 0xf0) | 2;
        assert_eq!(
            port_info_set(&mut p, &d),
            Err(mad_status::INVALID_FIELD),
            "Init cannot be set"
        );
        d[32] = (d[32] & 0xf0) | 3;
        d[16..18].copy_from_slice(&0xc001u16.to_be_bytes());
        assert_eq!(
            port_info_set(&mut p, &d),
            Err(mad_status::INVALID_FIELD),
            "multicast LID"
        );
        d[16..18].copy_from_slice(&0x0004u16.to_be_bytes());
        d[51] = 0x80 | 7;
        assert_eq!(port_info_set(&mut p, &d), Ok(()));
        assert_eq!(
            (p.state, p.lid, p.client_rereg, p.subnet_timeout),
            (LogicalState::Armed, 4, true, 7)
        );
        d[32] = (d[32] & 0xf0) | 1;
        assert_eq!(port_info_set(&mut p, &d), Ok(()));
        assert_eq!(
            p.state,
            LogicalState::Init,
            "Down retrains to Init while the link is up"
        );
    }

    #[test]
    fn port_info_modifier_bit_31_is_the_extended_speeds_flag() {
        // OpenSM's SubnSet(PortInfo) to a port advertising extended speeds
        // carries attribute modifier 0x8000_0001 (SMSupportsExtendedSpeeds
        // and port 1): the SMA answers for port 1, it does not refuse it.
        let mut hca = Hca::for_tests(HcaConfig::default());
        let mut mad = [0u8; MAD_SIZE];
        mad[0] = 1;
        mad[1] = class::SUBN_DIRECTED_ROUTE;
        mad[2] = 1;
        mad[3] = method::GET;
        mad[0x10..0x12].copy_from_slice(&attr::PORT_INFO.to_be_bytes());
        mad[0x14..0x18].copy_from_slice(&0x8000_0001u32.to_be_bytes());
        let r = process(&mut hca, 0, 1, &mad).expect("a response");
        assert_eq!(get16(&r, 4) & 0x7fff, 0, "status OK");
        assert_eq!(r[DATA + 28], 1, "LocalPortNum of port 1");
        mad[0x14..0x18].copy_from_slice(&0x8000_0003u32.to_be_bytes());
        let r = process(&mut hca, 0, 1, &mad).expect("a response");
        assert_eq!(get16(&r, 4), mad_status::INVALID_FIELD, "no port 3");
    }
}
