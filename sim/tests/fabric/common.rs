//! Test helpers: raw HCA ports around one switch, and a tiny SM.
//!
//! Test helpers: a fabric of raw HCA ports around one switch, and a tiny
//! SM that sends SMPs from an HCA port as an HCA's SMI would (IBTA
//! C14-9:1: the sender moves the hop pointer to 1 before the SMP leaves).

use sim::fabric::packet::{self, Headers, MAD_LEN, MadHdr, Smp, attr, method, mgmt_class};
use sim::fabric::{Built, Fabric, Packet, PortId, SwitchId, Topology};

pub struct Net {
    pub f: Fabric,
    pub built: Built,
    pub sw: SwitchId,
    pub now: u64,
    tid: u64,
}

impl Net {
    /// `n` HCAs on one switch, every HCA port 1 enabled (INIT_PORT).
    pub fn star(n: usize) -> Net {
        let mut f = Fabric::new();
        let built = Topology::for_nodes(n).unwrap().build(&mut f).unwrap();
        for h in &built.hcas {
            f.set_enabled(h.ports[0], true).unwrap();
        }
        let sw = built.switches[0].1;
        Net {
            f,
            built,
            sw,
            now: 0,
            tid: 0x100,
        }
    }

    pub fn port(&self, node: usize) -> PortId {
        self.built.hca_port(node, 1).unwrap()
    }

    /// Moves time on by 1 µs and lets the fabric work.
    pub fn tick(&mut self) {
        self.now += 1000;
        self.f.advance(self.now);
    }

    /// Everything that arrived at `p` by now (after a tick).
    pub fn drain(&mut self, p: PortId) -> Vec<Packet> {
        self.tick();
        let mut v = Vec::new();
        while let Some(pkt) = self.f.receive(p, self.now) {
            v.push(pkt);
        }
        v
    }

    pub fn send(&mut self, p: PortId, bytes: Vec<u8>) -> bool {
        self.f.transmit(p, Packet { bytes }, self.now)
    }

    pub fn next_tid(&mut self) -> u64 {
        self.tid += 1;
        self.tid
    }

    /// A directed-route SMP from node `from` along `path` (path[0] is the
    /// sender's own port), as it leaves the sender.
    pub fn dr_packet(
        &mut self,
        path: &[u8],
        meth: u8,
        attr_id: u16,
        attr_mod: u32,
        data: &[u8; 64],
    ) -> (u64, Vec<u8>) {
        let tid = self.next_tid();
        let mut smp = Smp::dr_get(tid, attr_id, attr_mod, path).unwrap();
        smp.hdr.method = meth;
        smp.data = *data;
        smp.hop_ptr = 1;
        let h = packet::mad_headers(packet::PERMISSIVE_LID, packet::PERMISSIVE_LID, 0, 0, 0xffff);
        (tid, packet::build(&h, &smp.to_bytes()).unwrap())
    }

    /// Sends a DR SMP from `node` and returns the response that comes back
    /// to it (checked: CRCs good, D bit, TID, GetResp).
    pub fn dr(
        &mut self,
        node: usize,
        path: &[u8],
        meth: u8,
        attr_id: u16,
        attr_mod: u32,
        data: &[u8; 64],
    ) -> Smp {
        let p = self.port(node);
        let (tid, bytes) = self.dr_packet(path, meth, attr_id, attr_mod, data);
        assert!(self.send(p, bytes));
        let got = self.drain(p);
        assert_eq!(got.len(), 1, "one response to the DR SMP {attr_id:#x}");
        let parsed = packet::parse_checked(&got[0].bytes).unwrap();
        assert_eq!(parsed.hdr.lrh.vl, 15);
        let smp = Smp::parse(parsed.payload(&got[0].bytes)).unwrap();
        assert_eq!(smp.hdr.tid, tid);
        assert_eq!(smp.hdr.method, method::GET_RESP);
        assert!(smp.direction, "D bit set on the way back");
        smp
    }

    /// SubnSet(PortInfo) of switch port `port` (one hop away from node 0)
    /// with `f` editing the current PortInfo.
    pub fn set_switch_port_info(&mut self, port: u8, f: impl Fn(&mut [u8; 64])) -> Smp {
        let cur = self.dr(
            0,
            &[1],
            method::GET,
            attr::PORT_INFO,
            u32::from(port),
            &[0; 64],
        );
        let mut d = cur.data;
        d[32] &= 0xf0; // PortState: no change
        d[33] &= 0x0f; // PortPhysicalState: no change
        f(&mut d);
        self.dr(0, &[1], method::SET, attr::PORT_INFO, u32::from(port), &d)
    }

    /// What an SM does to make the switch forward between the first `n`
    /// nodes: switch LID `sw_lid`, node i gets LID i+1, LFT entries, every
    /// cabled port Armed then Active. All by directed-route SMPs.
    pub fn sm_bring_up(&mut self, n: usize, sw_lid: u16) {
        let r = self.set_switch_port_info(0, |d| d[16..18].copy_from_slice(&sw_lid.to_be_bytes()));
        assert_eq!(r.hdr.status, 0);
        let mut block = [0xffu8; 64];
        for i in 0..n {
            block[i + 1] = i as u8 + 1;
        }
        block[usize::from(sw_lid)] = 0;
        let r = self.dr(
            0,
            &[1],
            method::SET,
            attr::LINEAR_FORWARDING_TABLE,
            0,
            &block,
        );
        assert_eq!((r.hdr.status, r.data), (0, block));
        let mut si = self
            .dr(0, &[1], method::GET, attr::SWITCH_INFO, 0, &[0; 64])
            .data;
        si[6..8].copy_from_slice(&63u16.to_be_bytes());
        let r = self.dr(0, &[1], method::SET, attr::SWITCH_INFO, 0, &si);
        assert_eq!(&r.data[6..8], &[0, 63], "LinearFDBTop");
        for p in 1..=n as u8 {
            for state in [3u8, 4] {
                let r = self.set_switch_port_info(p, |d| d[32] |= state);
                assert_eq!(
                    (r.hdr.status, r.data[32] & 0xf),
                    (0, state),
                    "port {p} to state {state}"
                );
            }
        }
    }

    /// A PMA Get/Set (class 0x04) to the switch's LID from node `node`
    /// (LID node + 1, as [`Net::sm_bring_up`] routes), returning the
    /// response MAD.
    pub fn pma(
        &mut self,
        node: usize,
        sw_lid: u16,
        meth: u8,
        attr_id: u16,
        port_select: u8,
        select: u16,
    ) -> Vec<u8> {
        let slid = node as u16 + 1;
        let tid = self.next_tid();
        let mut mad = [0u8; MAD_LEN];
        MadHdr {
            base_version: 1,
            mgmt_class: mgmt_class::PERF_MGMT,
            class_version: 1,
            method: meth,
            tid,
            attr_id,
            ..MadHdr::default()
        }
        .write(&mut mad);
        mad[64 + 1] = port_select;
        mad[64 + 2..64 + 4].copy_from_slice(&select.to_be_bytes());
        let h = packet::mad_headers(sw_lid, slid, 1, 1, 0xffff);
        let p = self.port(node);
        assert!(self.send(p, packet::build(&h, &mad).unwrap()));
        let got = self.drain(p);
        assert_eq!(got.len(), 1, "one PMA response");
        let parsed = packet::parse_checked(&got[0].bytes).unwrap();
        assert_eq!(parsed.hdr.lrh.dlid, slid);
        assert_eq!(parsed.hdr.deth.unwrap().src_qp, 1);
        let r = parsed.payload(&got[0].bytes).to_vec();
        assert_eq!(MadHdr::parse(&r).unwrap().tid, tid);
        r
    }
}

/// An RC or UD data packet from LID `slid` to LID `dlid`.
pub fn data_packet(
    slid: u16,
    dlid: u16,
    op: u8,
    dest_qp: u32,
    psn: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut h = Headers::for_opcode(op).unwrap();
    h.lrh.dlid = dlid;
    h.lrh.slid = slid;
    h.bth.pkey = 0xffff;
    h.bth.dest_qp = dest_qp;
    h.bth.psn = psn;
    if let Some(d) = h.deth.as_mut() {
        d.qkey = 0x1111_1111;
        d.src_qp = 0x48;
    }
    packet::build(&h, payload).unwrap()
}

/// PortCounters fields of a PMA response.
#[allow(dead_code)]
pub struct Pc {
    pub link_downed: u8,
    pub rcv_errors: u16,
    pub relay_errors: u16,
    pub xmit_discards: u16,
    pub vl15_dropped: u16,
    pub xmit_data: u32,
    pub rcv_data: u32,
    pub xmit_pkts: u32,
    pub rcv_pkts: u32,
}

pub fn port_counters(mad: &[u8]) -> Pc {
    let d = &mad[64..];
    let b16 = |o: usize| u16::from_be_bytes([d[o], d[o + 1]]);
    let b32 = |o: usize| u32::from_be_bytes([d[o], d[o + 1], d[o + 2], d[o + 3]]);
    Pc {
        link_downed: d[7],
        rcv_errors: b16(8),
        relay_errors: b16(12),
        xmit_discards: b16(14),
        vl15_dropped: b16(22),
        xmit_data: b32(24),
        rcv_data: b32(28),
        xmit_pkts: b32(32),
        rcv_pkts: b32(36),
    }
}
