//! A channel adapter the test models itself, written apart from the SM from the IBTA.
//!
//! One port, an SMA answering NodeInfo, NodeDescription and PortInfo (Get/Set with
//! the Init -> Armed -> Active rules) to directed-route SMPs as an end node
//! (C14-9:3, C14-13:1), optionally an SM of its own that only answers SMInfo
//! (IsSM set; SubnSet(SMInfo) recorded, a HANDOVER making it master), and
//! every other packet kept for the test.

use sim::fabric::packet::{self, PERMISSIVE_LID, Smp, attr, mad_status, method};
use sim::fabric::{Fabric, Packet, PortId};

pub struct Ca {
    pub port: PortId,
    pub node_guid: u64,
    pub desc: String,
    pub lid: u16,
    pub sm_lid: u16,
    pub state: u8,
    pub prefix: u64,
    pub subnet_timeout: u8,
    pub nmtu: u8,
    /// Never answers an SMP.
    pub mute: bool,
    pub smps: u64,
    pub sets: u64,
    /// Advertises IsClientReregistrationSupported.
    pub rereg_cap: bool,
    /// SubnSet PortInfo with ClientReregister seen.
    pub reregs: u64,
    pub inbox: Vec<Packet>,
    link_gen: u64,
    /// An SM on this port (IsSM; answers SMInfo).
    pub sm: Option<FakeSm>,
}

/// What the test CA's SM says in SMInfo, and what it was told.
#[derive(Debug, Clone, Default)]
pub struct FakeSm {
    pub priority: u8,
    pub state: u8,
    pub key: u64,
    /// Stops answering SMInfo (the SM died).
    pub silent: bool,
    /// SubnSet(SMInfo) attribute modifiers received.
    pub sets: Vec<u32>,
    /// SubnGet(SMInfo) received.
    pub gets: u64,
}

impl Ca {
    pub fn new(port: PortId, node_guid: u64, desc: &str) -> Ca {
        Ca {
            port,
            node_guid,
            desc: desc.into(),
            lid: 0,
            sm_lid: 0,
            state: 1,
            prefix: 0,
            subnet_timeout: 0,
            nmtu: 0,
            mute: false,
            smps: 0,
            sets: 0,
            rereg_cap: false,
            reregs: 0,
            inbox: Vec::new(),
            link_gen: 0,
            sm: None,
        }
    }

    /// Sends the SM at `sm_lid` trap 144 (local changes: a new
    /// CapabilityMask), LID-routed, as the CA's SMA would when IsSM is set.
    pub fn send_trap144(&mut self, f: &mut Fabric, now: u64) {
        let mut m = [0u8; packet::MAD_LEN];
        packet::MadHdr {
            base_version: 1,
            mgmt_class: 0x01,
            class_version: 1,
            method: method::TRAP,
            tid: 0x144,
            attr_id: 0x0002,
            ..packet::MadHdr::default()
        }
        .write(&mut m);
        m[64] = 0x84;
        m[67] = 1;
        m[68..70].copy_from_slice(&144u16.to_be_bytes());
        m[70..72].copy_from_slice(&self.lid.to_be_bytes());
        m[76..78].copy_from_slice(&self.lid.to_be_bytes());
        m[80..84].copy_from_slice(&self.cap_mask().to_be_bytes());
        let h = packet::mad_headers(self.sm_lid, self.lid, 0, 0, 0xffff);
        let bytes = packet::build(&h, &m).unwrap();
        f.transmit(self.port, Packet { bytes }, now);
    }

    fn cap_mask(&self) -> u32 {
        let mut c = 0;
        if self.rereg_cap {
            c |= 1 << 25;
        }
        if self.sm.is_some() {
            c |= 1 << 1;
        }
        c
    }

    pub fn port_guid(&self) -> u64 {
        self.node_guid + 1
    }

    fn port_info(&self) -> [u8; 64] {
        let mut o = [0u8; 64];
        o[8..16].copy_from_slice(&self.prefix.to_be_bytes());
        o[16..18].copy_from_slice(&self.lid.to_be_bytes());
        o[18..20].copy_from_slice(&self.sm_lid.to_be_bytes());
        o[20..24].copy_from_slice(&self.cap_mask().to_be_bytes());
        o[28] = 1;
        o[31] = 2; // 4x
        o[32] = 0x10 | self.state;
        o[33] = if self.state == 1 { 0x20 } else { 0x50 };
        o[35] = 0x11; // SDR
        o[36] = self.nmtu << 4;
        o[37] = 0x30; // VLCap VL0-3
        o[41] = 4; // MTUCap 2048
        o[51] = self.subnet_timeout;
        o
    }

    /// Returns whether anything happened.
    pub fn poll(&mut self, f: &mut Fabric, now: u64) -> bool {
        let mut did = false;
        let g = f.link_generation(self.port);
        if g != self.link_gen {
            self.link_gen = g;
            self.state = if f.link_up(self.port) { 2 } else { 1 };
            did = true;
        }
        while let Some(pkt) = f.receive(self.port, now) {
            did = true;
            let Ok(p) = packet::parse_checked(&pkt.bytes) else {
                continue;
            };
            if p.hdr.lrh.vl != 15 {
                self.inbox.push(pkt);
                continue;
            }
            let Ok(smp) = Smp::parse(p.payload(&pkt.bytes)) else {
                continue;
            };
            if !smp.is_dr() || smp.direction || smp.hop_ptr != smp.hop_cnt {
                self.inbox.push(pkt);
                continue;
            }
            self.smps += 1;
            if self.mute
                || smp.hdr.attr_id == attr::SM_INFO && self.sm.as_ref().is_some_and(|s| s.silent)
            {
                continue;
            }
            let mut r = smp.clone();
            r.hdr.method = method::GET_RESP;
            r.hdr.status = self.sma(&smp, &mut r.data);
            r.direction = true;
            r.return_path[usize::from(smp.hop_cnt)] = 1;
            r.hop_ptr = smp.hop_cnt;
            let h = packet::mad_headers(PERMISSIVE_LID, PERMISSIVE_LID, 0, 0, 0xffff);
            let bytes = packet::build(&h, &r.to_bytes()).unwrap();
            f.transmit(self.port, Packet { bytes }, now);
        }
        did
    }

    fn sma(&mut self, smp: &Smp, out: &mut [u8; 64]) -> u16 {
        let set = smp.hdr.method == method::SET;
        out.fill(0);
        match smp.hdr.attr_id {
            attr::NODE_INFO if !set => {
                out[0] = 1;
                out[1] = 1;
                out[2] = 1; // CA
                out[3] = 1;
                out[4..12].copy_from_slice(&self.node_guid.to_be_bytes());
                out[12..20].copy_from_slice(&self.node_guid.to_be_bytes());
                out[20..28].copy_from_slice(&self.port_guid().to_be_bytes());
                out[28..30].copy_from_slice(&16u16.to_be_bytes());
                out[30..32].copy_from_slice(&0x1003u16.to_be_bytes());
                out[36] = 1;
                out[37..40].copy_from_slice(&[0, 2, 0xc9]);
            }
            attr::NODE_DESC if !set => {
                for (o, c) in out.iter_mut().zip(self.desc.bytes()) {
                    *o = c;
                }
            }
            attr::PORT_INFO => {
                if smp.hdr.attr_mod & 0xff > 1 {
                    return mad_status::INVALID_FIELD;
                }
                if set {
                    let d = &smp.data;
                    let want = d[32] & 0xf;
                    let ok = match want {
                        0 => true,
                        3 => matches!(self.state, 2 | 3),
                        4 => matches!(self.state, 3 | 4),
                        _ => false,
                    };
                    if !ok {
                        *out = self.port_info();
                        return mad_status::INVALID_FIELD;
                    }
                    self.sets += 1;
                    self.prefix = u64::from_be_bytes(d[8..16].try_into().unwrap());
                    self.lid = u16::from_be_bytes([d[16], d[17]]);
                    self.sm_lid = u16::from_be_bytes([d[18], d[19]]);
                    if d[36] >> 4 != 0 {
                        self.nmtu = (d[36] >> 4).min(4);
                    }
                    self.subnet_timeout = d[51] & 0x1f;
                    if d[51] & 0x80 != 0 {
                        self.reregs += 1;
                    }
                    if want != 0 {
                        self.state = want;
                    }
                }
                *out = self.port_info();
            }
            attr::SM_INFO if self.sm.is_some() => {
                let guid = self.port_guid();
                let Some(sm) = self.sm.as_mut() else {
                    return mad_status::ATTR_UNSUPPORTED;
                };
                if set {
                    sm.sets.push(smp.hdr.attr_mod);
                    if smp.hdr.attr_mod == 1 {
                        sm.state = 3; // HANDOVER: master now
                    }
                } else {
                    sm.gets += 1;
                }
                out[0..8].copy_from_slice(&guid.to_be_bytes());
                out[8..16].copy_from_slice(&sm.key.to_be_bytes());
                out[20] = sm.priority << 4 | sm.state;
            }
            _ => return mad_status::ATTR_UNSUPPORTED,
        }
        0
    }
}
