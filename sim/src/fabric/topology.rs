//! Topologies: one switch for N nodes, two HCAs back to back, and ibsim's net files.
//!
//! Topologies: `--nodes N` (N HCAs with port 1 cabled to one 36-port
//! switch, the default; with Ethernet ports, an Ethernet switch beside or
//! instead of it: [`Topology::for_nodes_with`]), two HCAs back to back
//! (over InfiniBand or Ethernet), and ibsim's net-file
//! format (the subset: `Switch`/`Hca`/`Ca` records, their port lines, the
//! `switchguid=`, `caguid=`, `sysimgguid=`, `vendid=`, `devid=`
//! directives); routers, `include`, `do`, link width/speed attributes
//! (accepted and ignored) and per-port GUIDs are left out.
//!
//! Node GUIDs are stable from run to run: taken from the file, or derived
//! from the node's position (HCA i: 0x0002c903_0000_0000 + (i+1) * 0x10,
//! like ibsim's examples; switch j: 0x0002c900_0000_0100 + j).
//!
//! HCAs are numbered in the order they appear (node 0, 1, ...); cx3-emu's
//! node i is HCA i. [`Topology::build`] attaches both ports of every HCA
//! (a ConnectX-3 has two; an uncabled one stays dark), adds the switches
//! and lays the cables, and returns which fabric port each HCA port uses.

use super::switch::{DEVICE_SWITCHX, SWITCHX_PORTS, Switch, VENDOR_MELLANOX};
use super::{EthSwitch, EthSwitchId, Fabric, LinkLayer, PortId, SwitchId, faults::PortRef};

/// Ports of the Ethernet switch `--nodes N` lays (a 36-port 40 GbE
/// top-of-rack switch, an SX1036's count).
pub const ETH_SWITCH_PORTS: u8 = 36;

/// Node kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// A channel adapter (our ConnectX-3 model).
    Hca,
    /// A switch.
    Switch,
    /// An Ethernet switch ([`EthSwitch`]).
    EthSwitch,
}

/// One node of a topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Kind.
    pub kind: NodeKind,
    /// Name (the net file's node id; `node<i>` / `sw<j>` by default).
    pub name: String,
    /// Number of ports.
    pub ports: u8,
    /// Node GUID.
    pub node_guid: u64,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// Vendor id.
    pub vendor_id: u32,
    /// Device id.
    pub device_id: u16,
}

/// A cable between (node index, port) pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkSpec {
    /// One end.
    pub a: (usize, u8),
    /// The other end.
    pub b: (usize, u8),
}

/// A fabric to build.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topology {
    /// Nodes.
    pub nodes: Vec<NodeSpec>,
    /// Cables.
    pub links: Vec<LinkSpec>,
    /// HCA ports (node index, port) that are Ethernet ports; every other
    /// HCA port is InfiniBand (an Ethernet switch's ports are Ethernet).
    pub eth_ports: Vec<(usize, u8)>,
}

/// Why a topology was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyError(pub String);

impl core::fmt::Display for TopologyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TopologyError {}

/// Default node GUID of HCA number `i`.
pub fn hca_guid(i: usize) -> u64 {
    0x0002_c903_0000_0000 + ((i as u64 + 1) << 4)
}

/// Default node GUID of switch number `j`.
pub fn switch_guid(j: usize) -> u64 {
    0x0002_c900_0000_0100 + j as u64
}

fn hca(i: usize, name: String, ports: u8, guid: Option<u64>) -> NodeSpec {
    let g = guid.unwrap_or_else(|| hca_guid(i));
    NodeSpec {
        kind: NodeKind::Hca,
        name,
        ports,
        node_guid: g,
        sys_image_guid: g,
        vendor_id: VENDOR_MELLANOX,
        device_id: 0x1003,
    }
}

fn switch(j: usize, name: String, ports: u8, guid: Option<u64>) -> NodeSpec {
    let g = guid.unwrap_or_else(|| switch_guid(j));
    NodeSpec {
        kind: NodeKind::Switch,
        name,
        ports,
        node_guid: g,
        sys_image_guid: g,
        vendor_id: VENDOR_MELLANOX,
        device_id: DEVICE_SWITCHX,
    }
}

fn eth_switch(name: String, ports: u8) -> NodeSpec {
    NodeSpec {
        kind: NodeKind::EthSwitch,
        name,
        ports,
        node_guid: 0,
        sys_image_guid: 0,
        vendor_id: VENDOR_MELLANOX,
        device_id: 0,
    }
}

/// What [`Topology::build`] made.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Built {
    /// Per HCA (in topology order): its name, node GUID, and the fabric
    /// ports of its port 1 and port 2.
    pub hcas: Vec<BuiltHca>,
    /// Per switch: its name and id.
    pub switches: Vec<(String, SwitchId)>,
    /// Per Ethernet switch: its name and id.
    pub eth_switches: Vec<(String, EthSwitchId)>,
}

/// One built HCA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltHca {
    /// Name.
    pub name: String,
    /// Node GUID (the HCA model must use it).
    pub node_guid: u64,
    /// Fabric ports of HCA ports 1 and 2.
    pub ports: [PortId; 2],
}

impl Built {
    /// The fabric port of `port` (1 or 2) of HCA `i`.
    pub fn hca_port(&self, i: usize, port: u8) -> Option<PortId> {
        let h = self.hcas.get(i)?;
        match port {
            1 | 2 => Some(h.ports[usize::from(port) - 1]),
            _ => None,
        }
    }

    /// The fabric port a command-line name (`NODE/PORT`) means: NODE is a
    /// node name, or `node<i>` (HCA i) or `sw<j>` (switch j).
    pub fn resolve(&self, fabric: &Fabric, r: &PortRef) -> Result<PortId, String> {
        let hca_by_index = r
            .node
            .strip_prefix("node")
            .and_then(|n| n.parse::<usize>().ok());
        let sw_by_index = r
            .node
            .strip_prefix("sw")
            .and_then(|n| n.parse::<usize>().ok());
        let hi = self
            .hcas
            .iter()
            .position(|h| h.name == r.node)
            .or(hca_by_index);
        if let Some(i) = hi.filter(|&i| i < self.hcas.len()) {
            return self
                .hca_port(i, r.port)
                .ok_or_else(|| format!("{}/{}: an HCA has ports 1 and 2", r.node, r.port));
        }
        let si = self
            .switches
            .iter()
            .position(|(n, _)| *n == r.node)
            .or(sw_by_index);
        if let Some((_, id)) = si.and_then(|j| self.switches.get(j)) {
            return fabric
                .switch_port(*id, r.port)
                .ok_or_else(|| format!("{}/{}: no such switch port", r.node, r.port));
        }
        let esw_by_index = r
            .node
            .strip_prefix("esw")
            .and_then(|n| n.parse::<usize>().ok());
        let ei = self
            .eth_switches
            .iter()
            .position(|(n, _)| *n == r.node)
            .or(esw_by_index);
        if let Some((_, id)) = ei.and_then(|j| self.eth_switches.get(j)) {
            return fabric
                .eth_switch_port(*id, r.port)
                .ok_or_else(|| format!("{}/{}: no such switch port", r.node, r.port));
        }
        Err(format!("{}/{}: no node named `{}`", r.node, r.port, r.node))
    }
}

impl Topology {
    /// `n` HCAs (1..=36), port 1 of HCA i cabled to port i+1 of one
    /// 36-port switch.
    pub fn for_nodes(n: usize) -> Result<Topology, TopologyError> {
        Self::for_nodes_with(n, [LinkLayer::Ib; 2])
    }

    /// `n` HCAs whose ports 1 and 2 run `ll`: port 1 of HCA i cabled to
    /// port i+1 of the switch of its link layer (the 36-port switch `sw0`,
    /// or the 36-port Ethernet switch `esw0`); port 2 cabled the same way
    /// only when its link layer differs from port 1's (a card with port 1
    /// InfiniBand and port 2 Ethernet has both cabled), else dark, as in
    /// the all-InfiniBand fabric. The switches come first (`sw0`, then
    /// `esw0`), each only if a port uses it.
    pub fn for_nodes_with(n: usize, ll: [LinkLayer; 2]) -> Result<Topology, TopologyError> {
        let most = SWITCHX_PORTS.min(ETH_SWITCH_PORTS);
        if n == 0 || n > usize::from(most) {
            return Err(TopologyError(format!(
                "--nodes {n}: one switch takes 1 to {most} nodes; use a topology file for more"
            )));
        }
        let mut t = Topology::default();
        let cabled: Vec<u8> = if ll[1] != ll[0] { vec![1, 2] } else { vec![1] };
        let uses = |l: LinkLayer| cabled.iter().any(|&p| ll[usize::from(p) - 1] == l);
        let mut sw_of = [None, None];
        if uses(LinkLayer::Ib) {
            sw_of[0] = Some(t.nodes.len());
            t.nodes.push(switch(0, "sw0".into(), SWITCHX_PORTS, None));
        }
        if uses(LinkLayer::Eth) {
            sw_of[1] = Some(t.nodes.len());
            t.nodes.push(eth_switch("esw0".into(), ETH_SWITCH_PORTS));
        }
        let first = t.nodes.len();
        for i in 0..n {
            t.nodes.push(hca(i, format!("node{i}"), 2, None));
            for &p in &cabled {
                let l = ll[usize::from(p) - 1];
                let sw = match l {
                    LinkLayer::Ib => sw_of[0],
                    LinkLayer::Eth => sw_of[1],
                };
                let Some(sw) = sw else { continue };
                t.links.push(LinkSpec {
                    a: (first + i, p),
                    b: (sw, i as u8 + 1),
                });
            }
            for p in [1u8, 2] {
                if ll[usize::from(p) - 1] == LinkLayer::Eth {
                    t.eth_ports.push((first + i, p));
                }
            }
        }
        Ok(t)
    }

    /// Two HCAs, port 1 to port 1, no switch.
    pub fn back_to_back() -> Topology {
        Self::back_to_back_with(LinkLayer::Ib)
    }

    /// Two HCAs, port 1 to port 1 over `ll`, no switch.
    pub fn back_to_back_with(ll: LinkLayer) -> Topology {
        Topology {
            nodes: vec![
                hca(0, "node0".into(), 2, None),
                hca(1, "node1".into(), 2, None),
            ],
            links: vec![LinkSpec {
                a: (0, 1),
                b: (1, 1),
            }],
            eth_ports: match ll {
                LinkLayer::Ib => Vec::new(),
                LinkLayer::Eth => vec![(0, 1), (1, 1)],
            },
        }
    }

    /// The HCAs, in order.
    pub fn hcas(&self) -> impl Iterator<Item = &NodeSpec> {
        self.nodes.iter().filter(|n| n.kind == NodeKind::Hca)
    }

    /// Adds the nodes and cables to `fabric`, attaching both ports of every
    /// HCA.
    pub fn build(&self, fabric: &mut Fabric) -> Result<Built, TopologyError> {
        self.build_with(fabric, |f, _, n, port| {
            Ok(f.attach_hca_port(n.node_guid, port))
        })
    }

    /// The same, with the HCA ports given by `hca_port(fabric, HCA index,
    /// node, port)`: for HCAs that attached their ports themselves
    /// ([`Fabric::attach_hca_port`]) before the topology was laid.
    pub fn build_with(
        &self,
        fabric: &mut Fabric,
        mut hca_port: impl FnMut(&mut Fabric, usize, &NodeSpec, u8) -> Result<PortId, TopologyError>,
    ) -> Result<Built, TopologyError> {
        let mut built = Built::default();
        // Fabric ports by node index: HCA ports 1,2 or switch ports.
        enum At {
            Hca(usize),
            Sw(SwitchId),
            Esw(EthSwitchId),
        }
        let mut where_: Vec<At> = Vec::with_capacity(self.nodes.len());
        for n in &self.nodes {
            match n.kind {
                NodeKind::Hca => {
                    let i = built.hcas.len();
                    let p1 = hca_port(fabric, i, n, 1)?;
                    let p2 = hca_port(fabric, i, n, 2)?;
                    for (p, want) in [(p1, 1), (p2, 2)] {
                        match fabric.owner(p) {
                            Some(super::Owner::Hca { node_guid, port })
                                if node_guid == n.node_guid && port == want => {}
                            _ => {
                                return Err(TopologyError(format!(
                                    "\"{}\" port {want}: fabric port {} is not port {want} of node GUID {:#018x}",
                                    n.name, p.0, n.node_guid
                                )));
                            }
                        }
                    }
                    fabric.set_port_name(p1, &format!("{}/1", n.name));
                    fabric.set_port_name(p2, &format!("{}/2", n.name));
                    let node = where_.len();
                    for (p, num) in [(p1, 1u8), (p2, 2)] {
                        let ll = if self.eth_ports.contains(&(node, num)) {
                            LinkLayer::Eth
                        } else {
                            LinkLayer::Ib
                        };
                        fabric.set_link_layer(p, ll).map_err(|e| {
                            TopologyError(format!("\"{}\" port {num}: {e}", n.name))
                        })?;
                    }
                    built.hcas.push(BuiltHca {
                        name: n.name.clone(),
                        node_guid: n.node_guid,
                        ports: [p1, p2],
                    });
                    where_.push(At::Hca(built.hcas.len() - 1));
                }
                NodeKind::Switch => {
                    let mut sw = Switch::new(&n.name, n.node_guid, n.ports);
                    sw.sys_image_guid = n.sys_image_guid;
                    sw.vendor_id = n.vendor_id;
                    sw.device_id = n.device_id;
                    let id = fabric.add_switch(sw);
                    for p in 1..=n.ports {
                        if let Some(fp) = fabric.switch_port(id, p) {
                            fabric.set_port_name(fp, &format!("{}/{p}", n.name));
                        }
                    }
                    built.switches.push((n.name.clone(), id));
                    where_.push(At::Sw(id));
                }
                NodeKind::EthSwitch => {
                    let id = fabric.add_eth_switch(EthSwitch::new(&n.name, n.ports));
                    for p in 1..=n.ports {
                        if let Some(fp) = fabric.eth_switch_port(id, p) {
                            fabric.set_port_name(fp, &format!("{}/{p}", n.name));
                        }
                    }
                    built.eth_switches.push((n.name.clone(), id));
                    where_.push(At::Esw(id));
                }
            }
        }
        let port_of = |(node, port): (usize, u8)| -> Result<PortId, TopologyError> {
            let bad = || {
                TopologyError(format!(
                    "link names port {port} of node {node}, which has none"
                ))
            };
            match where_.get(node).ok_or_else(bad)? {
                At::Hca(h) => built.hca_port(*h, port).ok_or_else(bad),
                At::Sw(id) => fabric.switch_port(*id, port).ok_or_else(bad),
                At::Esw(id) => fabric.eth_switch_port(*id, port).ok_or_else(bad),
            }
        };
        let mut cables = Vec::new();
        for l in &self.links {
            cables.push((port_of(l.a)?, port_of(l.b)?));
        }
        for (a, b) in cables {
            fabric
                .connect(a, b)
                .map_err(|e| TopologyError(format!("cable {} - {}: {e}", a.0, b.0)))?;
        }
        Ok(built)
    }

    /// Parses ibsim's net-file format (the subset in the module doc).
    pub fn from_netfile(text: &str) -> Result<Topology, TopologyError> {
        NetParser::default().parse(text)
    }
}

#[derive(Default)]
struct Directives {
    guid: Option<u64>,
    sysimg: Option<u64>,
    vendid: Option<u32>,
    devid: Option<u16>,
}

#[derive(Default)]
struct NetParser {
    nodes: Vec<NodeSpec>,
    /// (line, node, port, remote name, remote port)
    ports: Vec<(usize, usize, u8, String, u8)>,
    dir: Directives,
    hcas: usize,
    switches: usize,
}

fn err(line: usize, msg: impl core::fmt::Display) -> TopologyError {
    TopologyError(format!("topology line {line}: {msg}"))
}

fn hex_or_dec(s: &str) -> Option<u64> {
    // ibnetdiscover writes `0x2c90000000100(2c90000000100)`.
    let s = s.split('(').next().unwrap_or(s).trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Reads `"name"` at the start of `s`; returns the name and the rest.
fn quoted(s: &str) -> Option<(&str, &str)> {
    let s = s.strip_prefix('"')?;
    let end = s.find('"')?;
    Some((&s[..end], &s[end + 1..]))
}

/// Reads `[N]` (and an optional `(guid)` after it) at the start of `s`.
fn bracket(s: &str) -> Option<(u64, &str)> {
    let s = s.strip_prefix('[')?;
    let end = s.find(']')?;
    let n = s[..end].trim().parse().ok()?;
    let mut rest = &s[end + 1..];
    if let Some(r) = rest.strip_prefix('(') {
        rest = &r[r.find(')')? + 1..];
    }
    Some((n, rest))
}

impl NetParser {
    fn parse(mut self, text: &str) -> Result<Topology, TopologyError> {
        let mut current: Option<usize> = None;
        for (i, raw) in text.lines().enumerate() {
            let ln = i + 1;
            // A comment starts at a '#' outside quotes.
            let mut in_q = false;
            let cut = raw
                .char_indices()
                .find(|&(_, c)| {
                    if c == '"' {
                        in_q = !in_q;
                    }
                    c == '#' && !in_q
                })
                .map_or(raw.len(), |(k, _)| k);
            let line = raw[..cut].trim();
            if line.is_empty() {
                continue;
            }
            if line.starts_with('[') {
                let node =
                    current.ok_or_else(|| err(ln, "a port line before any Switch/Hca line"))?;
                self.port_line(ln, node, line)?;
                continue;
            }
            if let Some((k, v)) = line.split_once('=')
                && !k.contains(char::is_whitespace)
            {
                self.directive(ln, k, v)?;
                continue;
            }
            let mut words = line.splitn(2, char::is_whitespace);
            let kw = words.next().unwrap_or("");
            let rest = words.next().unwrap_or("").trim();
            match kw {
                "Switch" | "Hca" | "Ca" => {
                    current = Some(self.header(ln, kw, rest)?);
                }
                "Rt" | "Router" => return Err(err(ln, "routers are not modelled")),
                "include" | "do" => {
                    return Err(err(ln, format!("`{kw}` is not supported here")));
                }
                _ => {
                    return Err(err(
                        ln,
                        format!("unknown keyword `{kw}` (Switch, Hca, Ca, [port], key=value)"),
                    ));
                }
            }
        }
        self.finish()
    }

    fn directive(&mut self, ln: usize, k: &str, v: &str) -> Result<(), TopologyError> {
        let val = hex_or_dec(v).ok_or_else(|| err(ln, format!("{k}={v}: not a number")))?;
        match k.trim() {
            "switchguid" | "caguid" | "hcaguid" => self.dir.guid = Some(val),
            "sysimgguid" => self.dir.sysimg = Some(val),
            "vendid" => {
                self.dir.vendid = Some(
                    u32::try_from(val)
                        .ok()
                        .filter(|v| *v <= 0xff_ffff)
                        .ok_or_else(|| err(ln, "vendid above 24 bits"))?,
                )
            }
            "devid" => {
                self.dir.devid =
                    Some(u16::try_from(val).map_err(|_| err(ln, "devid above 16 bits"))?)
            }
            other => return Err(err(ln, format!("unknown directive `{other}`"))),
        }
        Ok(())
    }

    fn header(&mut self, ln: usize, kw: &str, rest: &str) -> Result<usize, TopologyError> {
        let mut it = rest.splitn(2, char::is_whitespace);
        let n = it.next().unwrap_or("");
        let ports: u8 = n
            .parse()
            .ok()
            .filter(|p| *p >= 1)
            .ok_or_else(|| err(ln, format!("`{n}` is not a port count 1-254")))?;
        let (name, _) = quoted(it.next().unwrap_or("").trim())
            .ok_or_else(|| err(ln, "expected the node id in double quotes"))?;
        if name.is_empty() {
            return Err(err(ln, "empty node id"));
        }
        if self.nodes.iter().any(|n| n.name == name) {
            return Err(err(ln, format!("node \"{name}\" defined twice")));
        }
        let d = std::mem::take(&mut self.dir);
        let mut spec = if kw == "Switch" {
            if ports == 255 {
                return Err(err(ln, "a switch has at most 254 ports"));
            }
            self.switches += 1;
            switch(self.switches - 1, name.into(), ports, d.guid)
        } else {
            if ports > 2 {
                return Err(err(
                    ln,
                    format!("\"{name}\": a ConnectX-3 has 2 ports, not {ports}"),
                ));
            }
            self.hcas += 1;
            hca(self.hcas - 1, name.into(), ports, d.guid)
        };
        if let Some(s) = d.sysimg {
            spec.sys_image_guid = s;
        }
        if let Some(v) = d.vendid {
            spec.vendor_id = v;
        }
        if let Some(v) = d.devid {
            spec.device_id = v;
        }
        self.nodes.push(spec);
        Ok(self.nodes.len() - 1)
    }

    fn port_line(&mut self, ln: usize, node: usize, line: &str) -> Result<(), TopologyError> {
        let syntax = || err(ln, "expected [PORT] \"REMOTE\"[PORT]");
        let (lp, rest) = bracket(line).ok_or_else(syntax)?;
        let (remote, rest) = quoted(rest.trim_start()).ok_or_else(syntax)?;
        let (rp, _) = bracket(rest.trim_start()).ok_or_else(syntax)?;
        let n = &self.nodes[node];
        let lp = u8::try_from(lp)
            .ok()
            .filter(|p| *p >= 1 && *p <= n.ports)
            .ok_or_else(|| err(ln, format!("\"{}\" has no port {lp}", n.name)))?;
        let rp = u8::try_from(rp)
            .ok()
            .filter(|p| *p >= 1)
            .ok_or_else(|| err(ln, format!("remote port {rp} is not 1-254")))?;
        if self.ports.iter().any(|p| p.1 == node && p.2 == lp) {
            return Err(err(ln, format!("port {lp} of \"{}\" listed twice", n.name)));
        }
        self.ports.push((ln, node, lp, remote.into(), rp));
        Ok(())
    }

    fn finish(self) -> Result<Topology, TopologyError> {
        let mut links: Vec<LinkSpec> = Vec::new();
        let find = |name: &str| self.nodes.iter().position(|n| n.name == name);
        for (ln, node, lp, remote, rp) in &self.ports {
            let r = find(remote).ok_or_else(|| err(*ln, format!("no node named \"{remote}\"")))?;
            if *rp > self.nodes[r].ports {
                return Err(err(*ln, format!("\"{remote}\" has no port {rp}")));
            }
            if r == *node && rp == lp {
                return Err(err(*ln, "a cable from a port to itself"));
            }
            // The far end, if it lists this port, must list us back.
            if let Some(back) = self.ports.iter().find(|p| p.1 == r && p.2 == *rp) {
                let me = &self.nodes[*node].name;
                if back.3 != *me || back.4 != *lp {
                    return Err(err(
                        *ln,
                        format!(
                            "\"{me}\"[{lp}] says it is cabled to \"{remote}\"[{rp}], but line {} says \"{remote}\"[{rp}] goes to \"{}\"[{}]",
                            back.0, back.3, back.4
                        ),
                    ));
                }
            }
            let a = (*node, *lp);
            let b = (r, *rp);
            let dup = links
                .iter()
                .any(|l| (l.a == a && l.b == b) || (l.a == b && l.b == a));
            if !dup {
                if links
                    .iter()
                    .any(|l| [l.a, l.b].contains(&b) || [l.a, l.b].contains(&a))
                {
                    return Err(err(*ln, format!("\"{remote}\"[{rp}] is cabled twice")));
                }
                links.push(LinkSpec { a, b });
            }
        }
        if self.nodes.is_empty() {
            return Err(TopologyError("topology: no nodes".into()));
        }
        Ok(Topology {
            eth_ports: Vec::new(),
            nodes: self.nodes,
            links,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"
# from real-peers.md
vendid=0x02c9
devid=0xc738
switchguid=0x0002c90000000100
Switch	8 "Sw1"
[1]	"H1"[1]
[2]	"H2"[1]   # lid 3 4xSDR

caguid=0x0002c90300000010
Ca	1 "H1"
[1]	"Sw1"[1]

Hca	2 "H2"
[1](2c90300000021)	"Sw1"[2]	w=4
"#;

    #[test]
    fn netfile_small() {
        let t = Topology::from_netfile(SMALL).unwrap();
        assert_eq!(t.nodes.len(), 3);
        assert_eq!(t.nodes[0].node_guid, 0x0002_c900_0000_0100);
        assert_eq!(t.nodes[0].ports, 8);
        assert_eq!(t.nodes[1].node_guid, 0x0002_c903_0000_0010);
        assert_eq!(
            t.nodes[2].node_guid,
            hca_guid(1),
            "default GUID by position"
        );
        assert_eq!(t.links.len(), 2);
        let again = Topology::from_netfile(SMALL).unwrap();
        assert_eq!(t, again, "stable from run to run");
    }

    #[test]
    fn netfile_errors_name_the_line() {
        for (text, want) in [
            ("[1] \"x\"[1]", "line 1: a port line before"),
            (
                "Switch 8 \"a\"\n[9] \"b\"[1]",
                "line 2: \"a\" has no port 9",
            ),
            (
                "Switch 8 \"a\"\n[1] \"b\"[1]",
                "line 2: no node named \"b\"",
            ),
            ("Hca 4 \"h\"", "2 ports"),
            ("Switch x \"a\"", "port count"),
            ("Switch 8 a", "double quotes"),
            ("Bridge 2 \"b\"", "unknown keyword `Bridge`"),
            ("caguid=zz\nHca 1 \"h\"", "not a number"),
            ("Switch 8 \"a\"\nSwitch 8 \"a\"", "defined twice"),
            (
                "Switch 8 \"a\"\n[1] \"h\"[1]\nHca 2 \"h\"\n[1] \"a\"[2]",
                "line 2: \"a\"[1] says it is cabled to \"h\"[1], but line 4",
            ),
            ("", "no nodes"),
            ("include other.net", "not supported"),
        ] {
            let e = Topology::from_netfile(text).unwrap_err().0;
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    /// What `ibnetdiscover` writes (ibsim reads the same).
    #[test]
    fn netfile_ibnetdiscover_output() {
        let text = "\
vendid=0x2c9
devid=0xc738
sysimgguid=0x2c90000000100
switchguid=0x2c90000000100(2c90000000100)
Switch\t8 \"S-0002c90000000100\"\t\t# \"Sw1\" base port 0 lid 2 lmc 0
[1]\t\"H-0002c90300000010\"[1](2c90300000011) \t\t# \"H1\" lid 1 4xSDR

vendid=0x2c9
devid=0x1003
sysimgguid=0x2c90300000010
caguid=0x2c90300000010
Ca\t1 \"H-0002c90300000010\"\t\t# \"H1\"
[1](2c90300000011) \t\"S-0002c90000000100\"[1]\t\t# lid 1 lmc 0 \"Sw1\" lid 2 4xSDR
";
        let t = Topology::from_netfile(text).unwrap();
        assert_eq!(t.nodes[0].node_guid, 0x0002_c900_0000_0100);
        assert_eq!(t.nodes[1].node_guid, 0x0002_c903_0000_0010);
        assert_eq!(t.nodes[1].device_id, 0x1003);
        assert_eq!(
            t.links,
            [LinkSpec {
                a: (0, 1),
                b: (1, 1)
            }]
        );
    }

    #[test]
    fn for_nodes_limits() {
        assert!(Topology::for_nodes(0).is_err());
        assert!(Topology::for_nodes(37).is_err());
        let t = Topology::for_nodes(3).unwrap();
        assert_eq!(t.hcas().count(), 3);
        assert_eq!(
            t.hcas().map(|h| h.node_guid).collect::<Vec<_>>(),
            [hca_guid(0), hca_guid(1), hca_guid(2)]
        );
    }
}
