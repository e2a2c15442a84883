//! infiniband-diags' `perfquery`, `smpquery` and `sminfo`, in libibmad's words.
//!
//! infiniband-diags (rdma-core `perfquery.c`, `smpquery.c`, `sminfo.c`) and
//! libibmad's dumpers (`fields.c`, `dump.c`) over ib_core's QP0/QP1
//! (`IbCore::smp_query`, `IbCore::pma_query`): PortCounters, PortCountersExtended,
//! NodeInfo, NodeDesc, PortInfo, SwitchInfo and SMInfo printed in libibmad's
//! `Name:....value` lines; counter reset, aggregation over ports, the
//! SL/VL/congestion counter groups, GUID destinations, node-name maps and
//! PortInfo's capability-mask and "enabled/supported" lists (printed as numbers)
//! are left out.
//!
//! Fields are decoded from the IBTA layouts (volume 1, 14.2.5 and 16.1.3)
//! by byte offset, not through libibmad's bit-offset tables, and printed
//! with the names and value formats libibmad prints.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::{self, Display, Write};
use core::time::Duration;

use hal::be::{get_be16, get_be24, get_be32, get_be64};
use ib_core::{DeviceId, IbCore, SmpRoute};

/// How long one query may take: libibmad's 1 s per try, three retries.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(4);

/// SMP attribute IDs (IBTA 14.2.5).
pub mod smp_attr {
    /// NodeDescription.
    pub const NODE_DESC: u16 = 0x0010;
    /// NodeInfo.
    pub const NODE_INFO: u16 = 0x0011;
    /// SwitchInfo.
    pub const SWITCH_INFO: u16 = 0x0012;
    /// PortInfo.
    pub const PORT_INFO: u16 = 0x0015;
    /// SMInfo.
    pub const SM_INFO: u16 = 0x0020;
}

/// Performance management attribute IDs (IBTA 16.1.3).
pub mod pma_attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// PortCounters.
    pub const PORT_COUNTERS: u16 = 0x0012;
    /// PortCountersExtended.
    pub const PORT_COUNTERS_EXT: u16 = 0x001d;
}

/// ClassPortInfo CapabilityMask bit: PortCountersExtended with the unicast
/// and multicast counters (`IB_PM_EXT_WIDTH_SUPPORTED`).
pub const IB_PM_EXT_WIDTH_SUPPORTED: u16 = 1 << 9;
/// ... PortSelect 255 adds up all the node's ports (`IB_PM_ALL_PORT_SELECT`).
pub const IB_PM_ALL_PORT_SELECT: u16 = 1 << 8;
/// perfquery's port for "all ports" (`ALL_PORTS`): PortSelect 255, which
/// the PMA answers with its ports' counters added up if its CapMask says
/// AllPortSelect.
pub const ALL_PORTS: u8 = 0xff;
/// ... extended counters without the IETF ones (`IB_PM_EXT_WIDTH_NOIETF_SUP`).
pub const IB_PM_EXT_WIDTH_NOIETF_SUP: u16 = 1 << 10;
/// ... PortXmitWait is counted (`IB_PM_PC_XMIT_WAIT_SUP`).
pub const IB_PM_PC_XMIT_WAIT_SUP: u16 = 1 << 12;

/// The attribute data zero-padded to 192 bytes (the most a PMA attribute
/// holds), so a short slice from a caller reads as zeros, never panics.
fn pad(d: &[u8]) -> [u8; 192] {
    let mut b = [0u8; 192];
    let n = d.len().min(192);
    b[..n].copy_from_slice(&d[..n]);
    b
}

/// libibmad's `mad_dump_hex` of a `bytes`-wide field: `0x` and two digits
/// per byte.
struct Hex(u64, usize);

impl Display for Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:0w$x}", self.0, w = self.1 * 2)
    }
}

/// One `Name:....value` line (libibmad `_mad_dump_field`: the name, a
/// colon, dots up to 32 characters of name and dots, the value).
pub fn dump_field(out: &mut dyn Write, name: &str, val: impl Display) -> fmt::Result {
    let dots = 32usize.saturating_sub(name.len());
    write!(out, "{name}:")?;
    for _ in 0..dots {
        out.write_char('.')?;
    }
    writeln!(out, "{val}")
}

/// A destination as libibmad's `portid2str` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortId {
    /// LID routed.
    Lid(u16),
    /// Directed route: the ports after the local one (`0,1,3` is `[1, 3]`).
    Dr(Vec<u8>),
}

impl PortId {
    /// Parses a LID (`5`, `0x5`) or, with `dr`, a path `0,1,3` (it must start
    /// at this port, 0).
    pub fn parse(s: &str, dr: bool) -> Result<PortId, String> {
        if dr {
            let mut hops = Vec::new();
            for (i, p) in s.split(',').enumerate() {
                let v: u8 = p
                    .trim()
                    .parse()
                    .map_err(|_| format!("bad directed route '{s}' (ports like 0,1,3)"))?;
                if i == 0 {
                    if v != 0 {
                        return Err(format!("directed route '{s}' must start at this port (0)"));
                    }
                } else {
                    hops.push(v);
                }
            }
            if hops.len() >= 63 {
                return Err(String::from("directed route longer than 63 hops"));
            }
            return Ok(PortId::Dr(hops));
        }
        let v = match s.strip_prefix("0x") {
            Some(h) => u32::from_str_radix(h, 16).ok(),
            None => s.parse::<u32>().ok(),
        };
        match v {
            Some(l @ 1..=0xbfff) => Ok(PortId::Lid(l as u16)),
            _ => Err(format!("'{s}' is not a unicast LID (1 to 0xBFFF)")),
        }
    }

    fn route(&self) -> SmpRoute<'_> {
        match self {
            PortId::Lid(l) => SmpRoute::Lid(*l),
            PortId::Dr(p) => SmpRoute::Directed(p),
        }
    }
}

impl Display for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortId::Lid(l) => write!(f, "Lid {l}"),
            PortId::Dr(p) => {
                write!(f, "DR path slid 65535; dlid 65535; 0")?;
                for h in p {
                    write!(f, ",{h}")?;
                }
                Ok(())
            }
        }
    }
}

/// libibmad `mad_dump_perfcounters`: PortCounters (`d` is the attribute
/// data, MAD bytes 64 on).
pub fn dump_perfcounters(out: &mut dyn Write, d: &[u8]) -> fmt::Result {
    let d = &pad(d);
    dump_field(out, "PortSelect", d[1])?;
    dump_field(out, "CounterSelect", Hex(get_be16(d, 2).into(), 2))?;
    dump_field(out, "SymbolErrorCounter", get_be16(d, 4))?;
    dump_field(out, "LinkErrorRecoveryCounter", d[6])?;
    dump_field(out, "LinkDownedCounter", d[7])?;
    dump_field(out, "PortRcvErrors", get_be16(d, 8))?;
    dump_field(out, "PortRcvRemotePhysicalErrors", get_be16(d, 10))?;
    dump_field(out, "PortRcvSwitchRelayErrors", get_be16(d, 12))?;
    dump_field(out, "PortXmitDiscards", get_be16(d, 14))?;
    dump_field(out, "PortXmitConstraintErrors", d[16])?;
    dump_field(out, "PortRcvConstraintErrors", d[17])?;
    dump_field(out, "CounterSelect2", Hex(d[18].into(), 1))?;
    dump_field(out, "LocalLinkIntegrityErrors", d[19] >> 4)?;
    dump_field(out, "ExcessiveBufferOverrunErrors", d[19] & 0xf)?;
    dump_field(out, "VL15Dropped", get_be16(d, 22))?;
    dump_field(out, "PortXmitData", get_be32(d, 24))?;
    dump_field(out, "PortRcvData", get_be32(d, 28))?;
    dump_field(out, "PortXmitPkts", get_be32(d, 32))?;
    dump_field(out, "PortRcvPkts", get_be32(d, 36))?;
    dump_field(out, "PortXmitWait", get_be32(d, 40))
}

/// perfquery's extended dump: PortCountersExtended, the unicast/multicast
/// counters only when the PMA says it has them.
pub fn dump_perfcounters_ext(out: &mut dyn Write, d: &[u8], cap_mask: u16) -> fmt::Result {
    let d = &pad(d);
    dump_field(out, "PortSelect", d[1])?;
    dump_field(out, "CounterSelect", Hex(get_be16(d, 2).into(), 2))?;
    dump_field(out, "PortXmitData", get_be64(d, 8))?;
    dump_field(out, "PortRcvData", get_be64(d, 16))?;
    dump_field(out, "PortXmitPkts", get_be64(d, 24))?;
    dump_field(out, "PortRcvPkts", get_be64(d, 32))?;
    if cap_mask & IB_PM_EXT_WIDTH_SUPPORTED != 0 {
        dump_field(out, "PortUnicastXmitPkts", get_be64(d, 40))?;
        dump_field(out, "PortUnicastRcvPkts", get_be64(d, 48))?;
        dump_field(out, "PortMulticastXmitPkts", get_be64(d, 56))?;
        dump_field(out, "PortMulticastRcvPkts", get_be64(d, 64))?;
    }
    Ok(())
}

fn node_type_str(t: u8) -> String {
    match t {
        1 => String::from("Channel Adapter"),
        2 => String::from("Switch"),
        3 => String::from("Router"),
        4 => String::from("iWARP RNIC"),
        _ => format!("?({t})"),
    }
}

/// libibmad `mad_dump_nodeinfo` (`d`: the 64 bytes of SMP data).
pub fn dump_nodeinfo(out: &mut dyn Write, d: &[u8]) -> fmt::Result {
    let d = &pad(d);
    dump_field(out, "BaseVers", d[0])?;
    dump_field(out, "ClassVers", d[1])?;
    dump_field(out, "NodeType", node_type_str(d[2]))?;
    dump_field(out, "NumPorts", d[3])?;
    dump_field(out, "SystemGuid", Hex(get_be64(d, 4), 8))?;
    dump_field(out, "Guid", Hex(get_be64(d, 12), 8))?;
    dump_field(out, "PortGuid", Hex(get_be64(d, 20), 8))?;
    dump_field(out, "PartCap", get_be16(d, 28))?;
    dump_field(out, "DevId", Hex(get_be16(d, 30).into(), 2))?;
    dump_field(out, "Revision", Hex(get_be32(d, 32).into(), 4))?;
    dump_field(out, "LocalPort", d[36])?;
    dump_field(out, "VendorId", Hex(get_be24(d, 37).into(), 3))
}

/// The node description: the SMP data up to its first NUL, control
/// characters shown as `.` (infiniband-diags' `clean_nodedesc`).
pub fn node_desc_string(d: &[u8]) -> String {
    d.iter()
        .take(64)
        .take_while(|&&b| b != 0)
        .map(|&b| {
            if (0x20..0x7f).contains(&b) {
                b as char
            } else {
                '.'
            }
        })
        .collect()
}

/// smpquery's `Node Description:......name` line.
pub fn print_nodedesc(out: &mut dyn Write, d: &[u8]) -> fmt::Result {
    let name = node_desc_string(d);
    let dots = if name.len() < 32 { 32 - name.len() } else { 1 };
    write!(out, "Node Description:")?;
    for _ in 0..dots {
        out.write_char('.')?;
    }
    writeln!(out, "{name}")
}

fn link_width(w: u8) -> String {
    match w {
        1 => String::from("1X"),
        2 => String::from("4X"),
        4 => String::from("8X"),
        8 => String::from("12X"),
        16 => String::from("2X"),
        _ => format!("undefined ({w})"),
    }
}

fn link_speed(s: u8) -> String {
    match s {
        1 => String::from("2.5 Gbps"),
        2 => String::from("5.0 Gbps"),
        4 => String::from("10.0 Gbps"),
        _ => format!("undefined ({s})"),
    }
}

fn port_state(s: u8) -> String {
    match s {
        0 => String::from("NoChange"),
        1 => String::from("Down"),
        2 => String::from("Initialize"),
        3 => String::from("Armed"),
        4 => String::from("Active"),
        _ => format!("?({s})"),
    }
}

fn phys_state(s: u8) -> String {
    match s {
        0 => String::from("NoChange"),
        1 => String::from("Sleep"),
        2 => String::from("Polling"),
        3 => String::from("Disabled"),
        4 => String::from("PortConfigurationTraining"),
        5 => String::from("LinkUp"),
        6 => String::from("LinkErrorRecovery"),
        7 => String::from("PhyTest"),
        _ => format!("?({s})"),
    }
}

fn mtu(m: u8) -> String {
    match m {
        1..=5 => format!("{}", 128u32 << m),
        _ => format!("?({m})"),
    }
}

fn vl_cap(v: u8) -> String {
    match v {
        1 => String::from("VL0"),
        2 => String::from("VL0-1"),
        3 => String::from("VL0-3"),
        4 => String::from("VL0-7"),
        5 => String::from("VL0-14"),
        _ => format!("?({v})"),
    }
}

/// libibmad `mad_dump_portinfo`, the fields a researcher reads (LIDs,
/// state, width, speed, MTU, VLs, violations, timers); the "enabled" and
/// "supported" sets print as numbers.
pub fn dump_portinfo(out: &mut dyn Write, d: &[u8]) -> fmt::Result {
    let d = &pad(d);
    dump_field(out, "Mkey", Hex(get_be64(d, 0), 8))?;
    dump_field(out, "GidPrefix", Hex(get_be64(d, 8), 8))?;
    dump_field(out, "Lid", get_be16(d, 16))?;
    dump_field(out, "SMLid", get_be16(d, 18))?;
    dump_field(out, "CapMask", Hex(get_be32(d, 20).into(), 4))?;
    dump_field(out, "DiagCode", Hex(get_be16(d, 24).into(), 2))?;
    dump_field(out, "MkeyLeasePeriod", get_be16(d, 26))?;
    dump_field(out, "LocalPort", d[28])?;
    dump_field(out, "LinkWidthEnabled", d[29])?;
    dump_field(out, "LinkWidthSupported", d[30])?;
    dump_field(out, "LinkWidthActive", link_width(d[31]))?;
    dump_field(out, "LinkSpeedSupported", d[32] >> 4)?;
    dump_field(out, "LinkState", port_state(d[32] & 0xf))?;
    dump_field(out, "PhysLinkState", phys_state(d[33] >> 4))?;
    dump_field(out, "LinkDownDefState", d[33] & 0xf)?;
    dump_field(out, "ProtectBits", d[34] >> 6)?;
    dump_field(out, "LMC", d[34] & 0x7)?;
    dump_field(out, "LinkSpeedActive", link_speed(d[35] >> 4))?;
    dump_field(out, "LinkSpeedEnabled", d[35] & 0xf)?;
    dump_field(out, "NeighborMTU", mtu(d[36] >> 4))?;
    dump_field(out, "SMSL", d[36] & 0xf)?;
    dump_field(out, "VLCap", vl_cap(d[37] >> 4))?;
    dump_field(out, "InitType", Hex((d[37] & 0xf).into(), 1))?;
    dump_field(out, "VLHighLimit", d[38])?;
    dump_field(out, "VLArbHighCap", d[39])?;
    dump_field(out, "VLArbLowCap", d[40])?;
    dump_field(out, "InitReply", Hex((d[41] >> 4).into(), 1))?;
    dump_field(out, "MtuCap", mtu(d[41] & 0xf))?;
    dump_field(out, "VLStallCount", d[42] >> 5)?;
    dump_field(out, "HoqLife", d[42] & 0x1f)?;
    dump_field(out, "OperVLs", vl_cap(d[43] >> 4))?;
    dump_field(out, "PartEnforceInb", (d[43] >> 3) & 1)?;
    dump_field(out, "PartEnforceOutb", (d[43] >> 2) & 1)?;
    dump_field(out, "FilterRawInb", (d[43] >> 1) & 1)?;
    dump_field(out, "FilterRawOutb", d[43] & 1)?;
    dump_field(out, "MkeyViolations", get_be16(d, 44))?;
    dump_field(out, "PkeyViolations", get_be16(d, 46))?;
    dump_field(out, "QkeyViolations", get_be16(d, 48))?;
    dump_field(out, "GuidCap", d[50])?;
    dump_field(out, "ClientReregister", d[51] >> 7)?;
    dump_field(out, "McastPkeyTrapSuppressionEnabled", (d[51] >> 5) & 3)?;
    dump_field(out, "SubnetTimeout", d[51] & 0x1f)?;
    dump_field(out, "RespTimeVal", d[52] & 0x1f)?;
    dump_field(out, "LocalPhysErr", d[53] >> 4)?;
    dump_field(out, "OverrunErr", d[53] & 0xf)?;
    dump_field(out, "MaxCreditHint", get_be16(d, 54))?;
    dump_field(out, "RoundTrip", get_be24(d, 57))
}

/// libibmad `mad_dump_switchinfo`.
pub fn dump_switchinfo(out: &mut dyn Write, d: &[u8]) -> fmt::Result {
    let d = &pad(d);
    dump_field(out, "LinearFdbCap", get_be16(d, 0))?;
    dump_field(out, "RandomFdbCap", get_be16(d, 2))?;
    dump_field(out, "McastFdbCap", get_be16(d, 4))?;
    dump_field(out, "LinearFdbTop", get_be16(d, 6))?;
    dump_field(out, "DefPort", d[8])?;
    dump_field(out, "DefMcastPrimPort", d[9])?;
    dump_field(out, "DefMcastNotPrimPort", d[10])?;
    dump_field(out, "LifeTime", d[11] >> 3)?;
    dump_field(out, "StateChange", (d[11] >> 2) & 1)?;
    dump_field(out, "OptSLtoVLMapping", d[11] & 3)?;
    dump_field(out, "LidsPerPort", get_be16(d, 12))?;
    dump_field(out, "PartEnforceCap", get_be16(d, 14))?;
    dump_field(out, "InboundPartEnf", d[16] >> 7)?;
    dump_field(out, "OutboundPartEnf", (d[16] >> 6) & 1)?;
    dump_field(out, "FilterRawInbound", (d[16] >> 5) & 1)?;
    dump_field(out, "FilterRawOutbound", (d[16] >> 4) & 1)?;
    dump_field(out, "EnhancedPort0", (d[16] >> 3) & 1)?;
    dump_field(out, "MulticastFDBTop", Hex(get_be16(d, 18).into(), 2))
}

/// sminfo's state names (`SMINFO_NOTACT` ...).
pub fn sm_state_str(s: u8) -> &'static str {
    match s {
        0 => "SMINFO_NOTACT",
        1 => "SMINFO_DISCOVER",
        2 => "SMINFO_STANDBY",
        3 => "SMINFO_MASTER",
        _ => "UNKNOWN",
    }
}

/// sminfo's one line: `sminfo: sm lid 1 sm guid 0x..., activity count 5
/// priority 0 state 3 SMINFO_MASTER`.
pub fn print_sminfo(out: &mut dyn Write, sm_lid: u16, d: &[u8]) -> fmt::Result {
    let d = &pad(d);
    let state = d[20] & 0xf;
    writeln!(
        out,
        "sminfo: sm lid {} sm guid 0x{:x}, activity count {} priority {} state {} {}",
        sm_lid,
        get_be64(d, 0),
        get_be32(d, 16),
        d[20] >> 4,
        state,
        sm_state_str(state)
    )
}

/// Where a diag runs: the device and port its MADs leave from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Src {
    /// The device.
    pub dev: DeviceId,
    /// Its port.
    pub port: u8,
}

fn err(what: &str, e: ib_core::Error) -> String {
    format!("{what} failed: {e}")
}

fn local_port_attr(core: &mut IbCore, src: Src) -> Result<ib_core::verbs::PortAttr, String> {
    core.device_mut(src.dev)
        .ok_or_else(|| String::from("no such device"))?
        .query_port(src.port)
        .map_err(|e| err("query_port", e))
}

/// The LID of a port GUID (`-G`), from the SA's PathRecord to it.
pub fn resolve_guid(
    core: &mut IbCore,
    sa: Option<ib_core::ClientId>,
    src: Src,
    s: &str,
) -> Result<u16, String> {
    let g = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
    .ok_or_else(|| format!("'{s}' is not a port GUID"))?;
    let sa = sa.ok_or("-G needs the SA client")?;
    path_to_guid(core, sa, src, g, QUERY_TIMEOUT)
        .map(|p| p.dlid)
        .map_err(|e| format!("can't resolve destination port {s}: {e}"))
}

/// The SA's path from `src` to the port GUID `guid` under this port's
/// subnet prefix (the link-local one if GID 0 cannot be read).
pub(crate) fn path_to_guid(
    core: &mut IbCore,
    sa: ib_core::ClientId,
    src: Src,
    guid: u64,
    timeout: Duration,
) -> ib_core::Result<ib_core::sa_query::PathRecord> {
    let prefix = core
        .device_mut(src.dev)
        .and_then(|d| d.query_gid(src.port, 0).ok())
        .map_or(0xfe80_0000_0000_0000, |x| x.subnet_prefix());
    ib_core::sa_query::path_to_gid(
        core,
        sa,
        src.dev,
        src.port,
        ib_core::verbs::Gid::new(prefix, guid),
        timeout,
    )
}

/// The positional arguments of a diag's `args`: `flag` takes (and says
/// true to) the options it knows; `-h` and any other option end in `usage`.
fn positional<'a>(
    args: &[&'a str],
    usage: &str,
    mut flag: impl FnMut(&str) -> bool,
) -> Result<Vec<&'a str>, String> {
    let mut pos = Vec::new();
    for &a in args {
        match a {
            _ if flag(a) => {}
            "-h" | "--help" => return Err(String::from(usage)),
            _ if a.starts_with('-') => return Err(format!("unknown option '{a}' ({usage})")),
            _ => pos.push(a),
        }
    }
    Ok(pos)
}

const PERFQUERY_USAGE: &str =
    "usage: perfquery [-x] [-a] [-G] [LID|GUID [PORT]]  (PORT: 0 to 255, 255 or -a: all ports)";

/// A port number as the diags take it: decimal or `0x` hex, at most `max`
/// (perfquery 255: all ports; smpquery 254, the most ports a node has).
fn parse_port(p: &str, max: u8) -> Result<u8, String> {
    let n = match p.strip_prefix("0x") {
        Some(h) => u8::from_str_radix(h, 16).ok(),
        None => p.parse::<u8>().ok(),
    };
    n.filter(|&n| n <= max).ok_or_else(|| {
        if max == ALL_PORTS {
            format!("bad port '{p}' (0 to 254, or 255 for all ports)")
        } else {
            format!("bad port '{p}' (0 to {max})")
        }
    })
}

/// Whether the PMA can answer `port`: 255 (all ports) needs AllPortSelect
/// in its CapMask; perfquery refuses it otherwise in these words.
pub fn check_port_select(port: u8, cap_mask: u16) -> Result<(), String> {
    if port == ALL_PORTS && cap_mask & IB_PM_ALL_PORT_SELECT == 0 {
        return Err(String::from(
            "AllPortSelect not supported (this PMA cannot add up its ports; perfquery's per-port loop is left out here)",
        ));
    }
    Ok(())
}

/// `perfquery [-x] [-a] [LID [PORT]]`: the port counters of `LID`'s
/// `PORT` (default: this port), through the PMA on QP1; port 255 (or `-a`)
/// asks for all the node's ports added up (AllPortSelect), as perfquery.
pub fn perfquery(
    core: &mut IbCore,
    src: Src,
    args: &[&str],
    out: &mut dyn Write,
) -> Result<(), String> {
    perfquery_sa(core, None, src, args, out)
}

/// `perfquery [-x] [-G] [DEST [PORT]]`: with `-G` DEST is a port GUID,
/// resolved through the SA client `sa`.
pub fn perfquery_sa(
    core: &mut IbCore,
    sa: Option<ib_core::ClientId>,
    src: Src,
    args: &[&str],
    out: &mut dyn Write,
) -> Result<(), String> {
    let (mut extended, mut guid, mut all) = (false, false, false);
    let pos = positional(args, PERFQUERY_USAGE, |a| {
        match a {
            "-x" | "--extended" => extended = true,
            "-G" | "--Guid" => guid = true,
            "-a" | "--all_ports" => all = true,
            _ => return false,
        }
        true
    })?;
    if pos.len() > 2 {
        return Err(String::from(PERFQUERY_USAGE));
    }
    let (lid, port) = match pos.first() {
        Some(l) => {
            let lid = if guid {
                resolve_guid(core, sa, src, l)?
            } else {
                let PortId::Lid(lid) = PortId::parse(l, false)? else {
                    return Err(String::from("perfquery takes a LID"));
                };
                lid
            };
            let port = match pos.get(1) {
                Some(p) => parse_port(p, ALL_PORTS)?,
                None => 1,
            };
            (lid, port)
        }
        None => {
            let attr = local_port_attr(core, src)?;
            if attr.lid == 0 {
                return Err(String::from(
                    "this port has no LID yet (no subnet manager has configured it)",
                ));
            }
            (attr.lid, src.port)
        }
    };
    let cpi = core
        .pma_query(
            src.dev,
            src.port,
            lid,
            pma_attr::CLASS_PORT_INFO,
            0,
            &[],
            QUERY_TIMEOUT,
        )
        .map_err(|e| err("classportinfo query", e))?;
    let cap_mask = get_be16(&cpi.0[64..], 2);
    let cap_mask2 = get_be32(&cpi.0[64..], 4) >> 5;
    // -a: all ports (perfquery sets the port to ALL_PORTS).
    let port = if all { ALL_PORTS } else { port };
    check_port_select(port, cap_mask)?;
    let req = [0, port];
    let id = Lid(lid);
    if extended {
        if cap_mask & (IB_PM_EXT_WIDTH_SUPPORTED | IB_PM_EXT_WIDTH_NOIETF_SUP) == 0 {
            let _ = writeln!(
                out,
                "ibwarn: PerfMgt ClassPortInfo CapMask 0x{cap_mask:02X}; No extended counter support indicated"
            );
        }
        let m = core
            .pma_query(
                src.dev,
                src.port,
                lid,
                pma_attr::PORT_COUNTERS_EXT,
                0,
                &req,
                QUERY_TIMEOUT,
            )
            .map_err(|e| err("perfextquery", e))?;
        let _ = writeln!(
            out,
            "# Port extended counters: {id} port {port} (CapMask: 0x{cap_mask:02X} CapMask2: 0x{cap_mask2:07X})"
        );
        let _ = dump_perfcounters_ext(out, &m.0[64..], cap_mask);
    } else {
        let mut m = core
            .pma_query(
                src.dev,
                src.port,
                lid,
                pma_attr::PORT_COUNTERS,
                0,
                &req,
                QUERY_TIMEOUT,
            )
            .map_err(|e| err("perfquery", e))?;
        if cap_mask & IB_PM_PC_XMIT_WAIT_SUP == 0 {
            // perfquery clears a counter the PMA does not claim to keep.
            m.0[64 + 40..64 + 44].fill(0);
        }
        let _ = writeln!(
            out,
            "# Port counters: {id} port {port} (CapMask: 0x{cap_mask:02X})"
        );
        let _ = dump_perfcounters(out, &m.0[64..]);
    }
    Ok(())
}

struct Lid(u16);
impl Display for Lid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Lid {}", self.0)
    }
}

const SMPQUERY_USAGE: &str = "usage: smpquery [-D|-G] nodeinfo|nodedesc|portinfo|switchinfo DEST [PORT]  (DEST: a LID, with -D a directed route like 0,1, with -G a port GUID; no DEST: this port)";

/// The counters a perfquery printed, for tests and scripts: `PortXmitData`
/// and friends by name.
pub fn read_counter(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (n, rest) = l.split_once(':')?;
        if n != name {
            return None;
        }
        rest.trim_start_matches('.').parse().ok()
    })
}

/// `smpquery [-D] nodeinfo|nodedesc|portinfo|switchinfo [DEST [PORT]]`.
pub fn smpquery(
    core: &mut IbCore,
    src: Src,
    args: &[&str],
    out: &mut dyn Write,
) -> Result<(), String> {
    smpquery_sa(core, None, src, args, out)
}

/// `smpquery [-D|-G] OP [DEST [PORT]]`: with `-G` DEST is a port GUID,
/// resolved through the SA client `sa`.
pub fn smpquery_sa(
    core: &mut IbCore,
    sa: Option<ib_core::ClientId>,
    src: Src,
    args: &[&str],
    out: &mut dyn Write,
) -> Result<(), String> {
    let (mut dr, mut guid) = (false, false);
    let pos = positional(args, SMPQUERY_USAGE, |a| {
        match a {
            "-D" | "--Direct" => dr = true,
            "-G" | "--Guid" => guid = true,
            _ => return false,
        }
        true
    })?;
    let Some((&op, rest)) = pos.split_first() else {
        return Err(String::from(SMPQUERY_USAGE));
    };
    if rest.len() > 2 {
        return Err(String::from(SMPQUERY_USAGE));
    }
    if dr && guid {
        return Err(String::from("-D and -G do not go together"));
    }
    let dest = match rest.first() {
        Some(d) if guid => PortId::Lid(resolve_guid(core, sa, src, d)?),
        Some(d) => PortId::parse(d, dr)?,
        None => PortId::Dr(Vec::new()),
    };
    // No port 255 here (it means "all ports" only to a PMA).
    let port: Option<u8> = match rest.get(1) {
        Some(p) => Some(parse_port(p, ALL_PORTS - 1)?),
        None => None,
    };
    let attr = match op {
        "nodeinfo" | "NI" => smp_attr::NODE_INFO,
        "nodedesc" | "ND" => smp_attr::NODE_DESC,
        "portinfo" | "PI" => smp_attr::PORT_INFO,
        "switchinfo" | "SI" => smp_attr::SWITCH_INFO,
        _ => return Err(format!("unknown operation '{op}' ({SMPQUERY_USAGE})")),
    };
    let q = |core: &mut IbCore, attr: u16, m: u32| {
        core.smp_query(src.dev, src.port, dest.route(), attr, m, QUERY_TIMEOUT)
    };
    match attr {
        smp_attr::NODE_INFO => {
            let m = q(core, attr, 0).map_err(|e| err("node info query", e))?;
            let _ = writeln!(out, "# Node info: {dest}");
            let _ = dump_nodeinfo(out, m.smp_data());
        }
        smp_attr::NODE_DESC => {
            let m = q(core, attr, 0).map_err(|e| err("node desc query", e))?;
            let _ = print_nodedesc(out, m.smp_data());
        }
        smp_attr::PORT_INFO => {
            // No port given: the port the SMP arrives on (attribute modifier 0).
            let p = port.unwrap_or(0);
            let m = q(core, attr, p.into()).map_err(|e| err("port info query", e))?;
            let shown = if p == 0 { m.smp_data()[28] } else { p };
            let _ = writeln!(out, "# Port info: {dest} port {shown}");
            let _ = dump_portinfo(out, m.smp_data());
        }
        _ => {
            let m = q(core, attr, 0).map_err(|e| err("switch info query", e))?;
            let _ = writeln!(out, "# Switch info: {dest}");
            let _ = dump_switchinfo(out, m.smp_data());
        }
    }
    Ok(())
}

/// `sminfo`: the master SM's SMInfo, asked at the SM LID this port knows.
pub fn sminfo(
    core: &mut IbCore,
    src: Src,
    args: &[&str],
    out: &mut dyn Write,
) -> Result<(), String> {
    let sm_lid = match args {
        [] => {
            let attr = local_port_attr(core, src)?;
            if attr.sm_lid == 0 {
                return Err(String::from(
                    "this port knows no subnet manager (SMLid 0): is an SM running?",
                ));
            }
            attr.sm_lid
        }
        [l] => match PortId::parse(l, false)? {
            PortId::Lid(l) => l,
            PortId::Dr(_) => return Err(String::from("usage: sminfo [SM_LID]")),
        },
        _ => return Err(String::from("usage: sminfo [SM_LID]")),
    };
    let m = core
        .smp_query(
            src.dev,
            src.port,
            SmpRoute::Lid(sm_lid),
            smp_attr::SM_INFO,
            0,
            QUERY_TIMEOUT,
        )
        .map_err(|e| err("query", e))?;
    let _ = print_sminfo(out, sm_lid, m.smp_data());
    Ok(())
}

pub mod saquery;

#[cfg(test)]
mod tests;
