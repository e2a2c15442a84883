//! infiniband-diags' `ibnetdiscover`: the subnet's topology by a directed-route walk.
//!
//! infiniband-diags' `ibnetdiscover` (`ibnetdiscover.c` over libibnetdiscover's
//! directed-route walk): from this port, NodeInfo, NodeDescription and PortInfo of
//! every node reached through switches, printed as ibnetdiscover's topology file
//! (`vendid=`, `devid=`, `sysimgguid=`, `switchguid=`/`caguid=`, the `Switch`/`Ca`
//! lines and one line per connected port); chassis grouping (`-g`), node-name maps,
//! `-l`/`-H`/`-S` lists, ports reports, the cache file, extended speeds (FDR and
//! above) and routers' details are left out.
//!
//! The walk is breadth first: a node is identified by its node GUID (a
//! second path to a known node adds only the link), only switches are
//! walked through, a port is followed when its PortInfo says the link is
//! up (PhysLinkState LinkUp). It is bounded: at most [`MAX_NODES`] nodes,
//! paths of at most 63 hops, each query [`crate::diags::QUERY_TIMEOUT`];
//! Ctrl-C is looked at between queries. A node that does not answer is
//! reported (`ibwarn:`) and left out.
//!
//! Deliberate difference: the kernel has no real-time clock, so the
//! header's `generated on` names no date.

use alloc::collections::VecDeque;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::{self, Write};

use ib_core::{IbCore, SmpRoute};

use crate::diags::{QUERY_TIMEOUT, Src, node_desc_string, smp_attr};
use hal::be::{get_be16, get_be64};

/// Nodes at most (a bound on the walk).
pub const MAX_NODES: usize = 512;

/// One port of a discovered node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// Its number.
    pub num: u8,
    /// Port GUID (CAs; a switch's ports share the node's port GUID).
    pub guid: u64,
    /// Base LID (CA ports; a switch's is its port 0's).
    pub lid: u16,
    /// LMC.
    pub lmc: u8,
    /// LinkWidthActive (IBTA code).
    pub width: u8,
    /// LinkSpeedActive (IBTA code).
    pub speed: u8,
    /// The node and port at the other end of the cable.
    pub remote: Option<(usize, u8)>,
}

/// One discovered node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// NodeType (1 CA, 2 switch, 3 router).
    pub node_type: u8,
    /// NumPorts.
    pub nports: u8,
    /// SystemImageGUID.
    pub sysimg_guid: u64,
    /// NodeGUID.
    pub guid: u64,
    /// PortGUID of the port the walk reached it by (a switch's only one).
    pub port_guid: u64,
    /// DeviceID.
    pub devid: u16,
    /// VendorID.
    pub vendid: u32,
    /// NodeDescription.
    pub desc: String,
    /// Switch: port 0's LID and LMC.
    pub sw_lid: u16,
    /// Switch port 0's LMC.
    pub sw_lmc: u8,
    /// The directed route to it from the walk's start.
    pub path: Vec<u8>,
    /// Its ports seen so far (those with a link, and the ones the walk used).
    pub ports: Vec<Port>,
}

impl Node {
    fn port_mut(&mut self, num: u8) -> &mut Port {
        if let Some(i) = self.ports.iter().position(|p| p.num == num) {
            return &mut self.ports[i];
        }
        self.ports.push(Port {
            num,
            guid: 0,
            lid: 0,
            lmc: 0,
            width: 0,
            speed: 0,
            remote: None,
        });
        let last = self.ports.len() - 1;
        &mut self.ports[last]
    }

    fn port(&self, num: u8) -> Option<&Port> {
        self.ports.iter().find(|p| p.num == num)
    }

    /// ibnetdiscover's `node_name`: `"S-<guid>"`, `"H-<guid>"`, `"R-<guid>"`.
    pub fn name(&self) -> String {
        let t = match self.node_type {
            2 => 'S',
            1 => 'H',
            3 => 'R',
            _ => '?',
        };
        format!("\"{t}-{:016x}\"", self.guid)
    }
}

/// The result of a walk.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fabric {
    /// Every node, in the order found (the start first).
    pub nodes: Vec<Node>,
    /// SMPs sent.
    pub mads: u32,
    /// The longest path walked.
    pub max_hops: usize,
    /// What went wrong on the way (nodes left out).
    pub warnings: Vec<String>,
}

struct Walker<'a> {
    core: &'a mut IbCore,
    src: Src,
    interrupted: &'a mut dyn FnMut() -> bool,
    f: Fabric,
}

impl Walker<'_> {
    fn get(&mut self, path: &[u8], attr: u16, m: u32) -> Result<[u8; 64], String> {
        if (self.interrupted)() {
            return Err(String::from("interrupted"));
        }
        self.f.mads += 1;
        let mad = self
            .core
            .smp_query(
                self.src.dev,
                self.src.port,
                SmpRoute::Directed(path),
                attr,
                m,
                QUERY_TIMEOUT,
            )
            .map_err(|e| format!("{e}"))?;
        let mut d = [0u8; 64];
        d.copy_from_slice(&mad.smp_data()[..64]);
        Ok(d)
    }

    /// NodeInfo, NodeDescription and the PortInfo that matter of the node
    /// at `path`; returns it and the port the SMP arrived on.
    fn probe(&mut self, path: &[u8]) -> Result<(Node, u8), String> {
        let ni = self.get(path, smp_attr::NODE_INFO, 0)?;
        let nd = self.get(path, smp_attr::NODE_DESC, 0)?;
        let local_port = ni[36];
        let mut n = Node {
            node_type: ni[2],
            nports: ni[3],
            sysimg_guid: get_be64(&ni, 4),
            guid: get_be64(&ni, 12),
            port_guid: get_be64(&ni, 20),
            devid: get_be16(&ni, 30),
            vendid: u32::from_be_bytes([0, ni[37], ni[38], ni[39]]),
            desc: node_desc_string(&nd),
            sw_lid: 0,
            sw_lmc: 0,
            path: path.to_vec(),
            ports: Vec::new(),
        };
        if n.node_type == 2 {
            let pi = self.get(path, smp_attr::PORT_INFO, 0)?;
            n.sw_lid = get_be16(&pi, 16);
            n.sw_lmc = pi[34] & 7;
        } else {
            let pi = self.get(path, smp_attr::PORT_INFO, local_port.into())?;
            let p = n.port_mut(local_port);
            p.guid = get_be64(&ni, 20);
            fill_port(p, &pi);
        }
        Ok((n, local_port))
    }

    fn walk(mut self) -> Result<Fabric, String> {
        let (start, local) = self.probe(&[])?;
        self.f.nodes.push(start);
        // (node index, its port to follow)
        let mut todo: VecDeque<(usize, u8)> = VecDeque::new();
        todo.push_back((0, local));
        while let Some((ni, port)) = todo.pop_front() {
            let mut path = self.f.nodes[ni].path.clone();
            path.push(port);
            if path.len() >= 63 {
                self.f
                    .warnings
                    .push(format!("path {path:?} longer than 63 hops: not followed"));
                continue;
            }
            let (mut n, rport) = match self.probe(&path) {
                Ok(x) => x,
                Err(e) if e == "interrupted" => return Err(e),
                Err(e) => {
                    self.f.warnings.push(format!(
                        "no answer through port {port} of {}: {e}",
                        self.f.nodes[ni].name()
                    ));
                    continue;
                }
            };
            self.f.max_hops = self.f.max_hops.max(path.len());
            let known = self.f.nodes.iter().position(|x| x.guid == n.guid);
            let ri = match known {
                Some(k) => {
                    if self.f.nodes[k].node_type != 2 {
                        // A CA reached again through another port.
                        let pi = n.port(rport).cloned();
                        if let Some(pi) = pi {
                            let p = self.f.nodes[k].port_mut(rport);
                            let r = p.remote;
                            *p = pi;
                            p.remote = r;
                        }
                    }
                    k
                }
                None => {
                    if self.f.nodes.len() >= MAX_NODES {
                        self.f
                            .warnings
                            .push(format!("more than {MAX_NODES} nodes: the walk stops"));
                        break;
                    }
                    if n.node_type == 2 {
                        n.path = path.clone();
                    }
                    self.f.nodes.push(n);
                    self.f.nodes.len() - 1
                }
            };
            self.f.nodes[ni].port_mut(port).remote = Some((ri, rport));
            self.f.nodes[ri].port_mut(rport).remote = Some((ni, port));
            if known.is_some() || self.f.nodes[ri].node_type != 2 {
                continue;
            }
            // A new switch: its ports with a link.
            let nports = self.f.nodes[ri].nports;
            let spath = self.f.nodes[ri].path.clone();
            for p in 1..=nports {
                let pi = match self.get(&spath, smp_attr::PORT_INFO, p.into()) {
                    Ok(pi) => pi,
                    Err(e) if e == "interrupted" => return Err(e),
                    Err(e) => {
                        self.f.warnings.push(format!(
                            "PortInfo of port {p} of {}: {e}",
                            self.f.nodes[ri].name()
                        ));
                        continue;
                    }
                };
                let up = pi[33] >> 4 == 5;
                let guid = self.f.nodes[ri].port_guid;
                if up || p == rport {
                    let sp = self.f.nodes[ri].port_mut(p);
                    fill_port(sp, &pi);
                    sp.guid = guid;
                }
                if up && p != rport {
                    todo.push_back((ri, p));
                }
            }
        }
        Ok(self.f)
    }
}

fn fill_port(p: &mut Port, pi: &[u8; 64]) {
    p.lid = get_be16(pi, 16);
    p.lmc = pi[34] & 7;
    p.width = pi[31];
    p.speed = pi[35] >> 4;
}

/// Walks the subnet from `src` by directed route.
pub fn discover(
    core: &mut IbCore,
    src: Src,
    interrupted: &mut dyn FnMut() -> bool,
) -> Result<Fabric, String> {
    Walker {
        core,
        src,
        interrupted,
        f: Fabric::default(),
    }
    .walk()
}

/// `dump_linkwidth_compat`.
fn width_str(w: u8) -> &'static str {
    match w {
        1 => "1x",
        2 => "4x",
        4 => "8x",
        8 => "12x",
        _ => "??",
    }
}

/// `dump_linkspeed_compat` (and QDR from the extended one).
fn speed_str(s: u8) -> &'static str {
    match s {
        1 => "SDR",
        2 => "DDR",
        4 => "QDR",
        _ => "???",
    }
}

fn out_ids(out: &mut dyn Write, n: &Node) -> fmt::Result {
    write!(out, "\nvendid={:#x}\ndevid={:#x}\n", n.vendid, n.devid)?;
    if n.sysimg_guid != 0 {
        writeln!(out, "sysimgguid={:#x}", n.sysimg_guid)?;
    }
    Ok(())
}

/// The topology file, as ibnetdiscover prints it: switches, then CAs.
pub fn print_topology(out: &mut dyn Write, f: &Fabric) -> fmt::Result {
    let Some(start) = f.nodes.first() else {
        return Ok(());
    };
    writeln!(
        out,
        "#\n# Topology file: generated by the LegoIB console (no real-time clock)\n#"
    )?;
    writeln!(
        out,
        "# Initiated from node {:016x} port {:016x}",
        start.guid, start.port_guid
    )?;
    for n in f.nodes.iter().filter(|n| n.node_type == 2) {
        out_ids(out, n)?;
        writeln!(out, "switchguid={:#x}({:x})", n.guid, n.port_guid)?;
        writeln!(
            out,
            "Switch\t{} {}\t\t# \"{}\" base port 0 lid {} lmc {}",
            n.nports,
            n.name(),
            n.desc,
            n.sw_lid,
            n.sw_lmc
        )?;
        let mut ports: Vec<&Port> = n.ports.iter().filter(|p| p.remote.is_some()).collect();
        ports.sort_by_key(|p| p.num);
        for p in ports {
            let Some((ri, rp)) = p.remote else { continue };
            let Some(r) = f.nodes.get(ri) else { continue };
            write!(out, "[{}]\t{}[{}]", p.num, r.name(), rp)?;
            let rport = r.port(rp);
            if r.node_type != 2 {
                write!(out, "({:x}) ", rport.map_or(0, |x| x.guid))?;
            }
            let rlid = if r.node_type == 2 {
                r.sw_lid
            } else {
                rport.map_or(0, |x| x.lid)
            };
            writeln!(
                out,
                "\t\t# \"{}\" lid {} {}{}",
                r.desc,
                rlid,
                width_str(p.width),
                speed_str(p.speed)
            )?;
        }
    }
    for n in f.nodes.iter().filter(|n| n.node_type != 2) {
        out_ids(out, n)?;
        let (t, t2) = if n.node_type == 3 {
            ("rt", "Rt")
        } else {
            ("ca", "Ca")
        };
        writeln!(out, "{t}guid={:#x}", n.guid)?;
        writeln!(out, "{t2}\t{} {}\t\t# \"{}\"", n.nports, n.name(), n.desc)?;
        let mut ports: Vec<&Port> = n.ports.iter().filter(|p| p.remote.is_some()).collect();
        ports.sort_by_key(|p| p.num);
        for p in ports {
            let Some((ri, rp)) = p.remote else { continue };
            let Some(r) = f.nodes.get(ri) else { continue };
            write!(out, "[{}]({:x}) \t{}[{}]", p.num, p.guid, r.name(), rp)?;
            let rport = r.port(rp);
            if r.node_type != 2 {
                write!(out, " ({:x}) ", rport.map_or(0, |x| x.guid))?;
            }
            let rlid = if r.node_type == 2 {
                r.sw_lid
            } else {
                rport.map_or(0, |x| x.lid)
            };
            writeln!(
                out,
                "\t\t# lid {} lmc {} \"{}\" lid {} {}{}",
                p.lid,
                p.lmc,
                r.desc,
                rlid,
                width_str(p.width),
                speed_str(p.speed)
            )?;
        }
    }
    Ok(())
}

const USAGE: &str = "usage: ibnetdiscover [-s]  (-s: also print the walk's statistics)";

/// `ibnetdiscover [-s]`: walks the subnet from this port and prints it.
pub fn ibnetdiscover(
    core: &mut IbCore,
    src: Src,
    args: &[&str],
    interrupted: &mut dyn FnMut() -> bool,
    out: &mut dyn Write,
) -> Result<(), String> {
    let mut stats = false;
    for &a in args {
        match a {
            "-s" | "--show" => stats = true,
            "-h" | "--help" => return Err(String::from(USAGE)),
            _ => return Err(format!("unknown argument '{a}' ({USAGE})")),
        }
    }
    let f = discover(core, src, interrupted).map_err(|e| format!("discovery failed: {e}"))?;
    for w in &f.warnings {
        let _ = writeln!(out, "ibwarn: {w}");
    }
    let _ = print_topology(out, &f);
    if stats {
        let _ = writeln!(
            out,
            "\n# Reported max hops discovered: {}\n# Total MADs used: {}",
            f.max_hops, f.mads
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(t: u8, guid: u64, desc: &str, nports: u8) -> Node {
        Node {
            node_type: t,
            nports,
            sysimg_guid: guid,
            guid,
            port_guid: if t == 2 { guid } else { guid + 1 },
            devid: if t == 2 { 0xc738 } else { 0x1003 },
            vendid: 0x2c9,
            desc: String::from(desc),
            sw_lid: if t == 2 { 1 } else { 0 },
            sw_lmc: 0,
            path: Vec::new(),
            ports: Vec::new(),
        }
    }

    #[test]
    fn topology_in_ibnetdiscover_words() {
        let mut ca = node(1, 0x0002_c903_0000_0010, "node0 HCA-1", 2);
        let mut sw = node(2, 0x0002_c900_0000_0100, "switch", 36);
        let p = ca.port_mut(1);
        p.guid = 0x0002_c903_0000_0011;
        p.lid = 2;
        p.width = 2;
        p.speed = 4;
        p.remote = Some((1, 3));
        let sw_pg = sw.port_guid;
        let p = sw.port_mut(3);
        p.guid = sw_pg;
        p.width = 2;
        p.speed = 4;
        p.remote = Some((0, 1));
        let f = Fabric {
            nodes: vec![ca, sw],
            ..Fabric::default()
        };
        let mut o = String::new();
        print_topology(&mut o, &f).unwrap();
        let want = "#\n# Topology file: generated by the LegoIB console (no real-time clock)\n#\n\
# Initiated from node 0002c90300000010 port 0002c90300000011\n\
\nvendid=0x2c9\ndevid=0xc738\nsysimgguid=0x2c90000000100\nswitchguid=0x2c90000000100(2c90000000100)\n\
Switch\t36 \"S-0002c90000000100\"\t\t# \"switch\" base port 0 lid 1 lmc 0\n\
[3]\t\"H-0002c90300000010\"[1](2c90300000011) \t\t# \"node0 HCA-1\" lid 2 4xQDR\n\
\nvendid=0x2c9\ndevid=0x1003\nsysimgguid=0x2c90300000010\ncaguid=0x2c90300000010\n\
Ca\t2 \"H-0002c90300000010\"\t\t# \"node0 HCA-1\"\n\
[1](2c90300000011) \t\"S-0002c90000000100\"[3]\t\t# lid 2 lmc 0 \"switch\" lid 1 4xQDR\n";
        assert_eq!(o, want);
    }
}
