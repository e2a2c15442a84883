//! The switch's PMA: PortCounters and PortCountersExtended of every port (IBTA 16.1.3.5), read and cleared as perfquery does, and the encoders the host nodes' PMA shares.
//!
//! Split from [`super`] (the forwarding) along the PMA's seam; what the
//! counters count is in the parent module's doc.

use super::*;

impl Switch {
    /// A GMP addressed to the switch (its LID): the PMA answers, other
    /// classes are dropped.
    pub(super) fn receive_gmp(&mut self, in_port: u8, bytes: &[u8], p: &packet::Parsed) -> Action {
        let Some(deth) = p.hdr.deth else {
            return Action::Drop("no DETH: not a datagram for the switch");
        };
        if p.hdr.bth.dest_qp != 1 || deth.qkey != GSI_QKEY {
            return Action::Drop("not a GMP for QP1 with the GSI Q_Key");
        }
        let pk = p.hdr.bth.pkey & 0x7fff;
        if !self.pkeys.iter().any(|&k| k != 0 && k & 0x7fff == pk) {
            return Action::Drop("P_Key not in the switch's table");
        }
        let mad = p.payload(bytes);
        let Ok(hdr) = MadHdr::parse(mad) else {
            return Action::Drop("short MAD");
        };
        if mad.len() < MAD_LEN
            || hdr.base_version != 1
            || hdr.mgmt_class != mgmt_class::PERF_MGMT
            || hdr.method & 0x80 != 0
        {
            return Action::Drop("not a PMA request");
        }
        let mut r = [0u8; MAD_LEN];
        r.copy_from_slice(&mad[..MAD_LEN]);
        let status = if hdr.class_version != 1 {
            mad_status::BAD_VERSION
        } else {
            self.pma(hdr, &mut r)
        };
        let mut rh = hdr;
        rh.method = method::GET_RESP;
        rh.status = status;
        rh.write(&mut r);
        let dest = p.hdr.lrh.slid;
        // The response goes where the LFT says, like every packet the
        // switch sends by LID.
        let e = match self.route(dest) {
            Some(e) if e != 0 => e,
            _ => {
                self.ingress(in_port).rcv_switch_relay_errors += 1;
                return Action::Drop("no route back to the requester");
            }
        };
        let h = Headers {
            lrh: Lrh {
                vl: p.hdr.lrh.vl,
                sl: p.hdr.lrh.sl,
                dlid: dest,
                slid: self.lid,
                ..Lrh::default()
            },
            bth: Bth {
                opcode: packet::opcode::UD_SEND_ONLY,
                pkey: p.hdr.bth.pkey,
                dest_qp: deth.src_qp,
                ..Bth::default()
            },
            deth: Some(Deth {
                qkey: GSI_QKEY,
                src_qp: 1,
            }),
            ..Headers::default()
        };
        if self.ports[usize::from(e)].state != LogicalState::Active {
            self.count_xmit_discard(e);
            return Action::Drop("egress port not Active");
        }
        self.emit(e, &h, &r)
    }

    pub(super) fn pma(&mut self, hdr: MadHdr, r: &mut [u8; MAD_LEN]) -> u16 {
        const D: usize = packet::PMA_DATA;
        let set = match hdr.method {
            method::GET => false,
            method::SET => true,
            _ => return mad_status::METHOD_UNSUPPORTED,
        };
        match (hdr.attr_id, set) {
            (attr::CLASS_PORT_INFO, false) => {
                r[D..].fill(0);
                r[D] = 1; // BaseVersion
                r[D + 1] = 1; // ClassVersion
                // CapabilityMask: AllPortSelect (bit 8), extended counters
                // (bit 9).
                r[D + 2..D + 4].copy_from_slice(&0x0300u16.to_be_bytes());
                r[D + 4..D + 8].copy_from_slice(&0x12u32.to_be_bytes());
                0
            }
            (attr::PORT_COUNTERS | attr::PORT_COUNTERS_EXT, _) => {
                let sel_port = r[D + 1];
                let select = u16::from_be_bytes([r[D + 2], r[D + 3]]);
                let n = self.nports();
                let range = if sel_port == 0xff {
                    1..=n
                } else if sel_port <= n {
                    sel_port..=sel_port
                } else {
                    return mad_status::INVALID_FIELD;
                };
                let ext = hdr.attr_id == attr::PORT_COUNTERS_EXT;
                if set {
                    for p in range.clone() {
                        let c = &mut self.ports[usize::from(p)].counters;
                        if ext {
                            clear_ext(c, select);
                        } else {
                            clear(c, select);
                        }
                    }
                }
                let mut c = PortCounters::default();
                for p in range {
                    c.add(&self.ports[usize::from(p)].counters);
                }
                r[D..].fill(0);
                r[D + 1] = sel_port;
                r[D + 2..D + 4].copy_from_slice(&select.to_be_bytes());
                if ext {
                    encode_ext(&c, &mut r[D..]);
                } else {
                    encode(&c, &mut r[D..]);
                }
                0
            }
            _ => mad_status::ATTR_UNSUPPORTED,
        }
    }
}

fn sat(v: u64, max: u64) -> u64 {
    v.min(max)
}

/// PortCounters (IBTA 16.1.3.5) data, 32-bit data counters and narrower
/// error counters saturating.
pub(crate) fn encode(c: &PortCounters, d: &mut [u8]) {
    d[4..6].copy_from_slice(&(sat(c.symbol_errors, 0xffff) as u16).to_be_bytes());
    d[7] = sat(c.link_downed, 0xff) as u8;
    d[8..10].copy_from_slice(&(sat(c.rcv_errors, 0xffff) as u16).to_be_bytes());
    d[12..14].copy_from_slice(&(sat(c.rcv_switch_relay_errors, 0xffff) as u16).to_be_bytes());
    d[14..16].copy_from_slice(&(sat(c.xmit_discards, 0xffff) as u16).to_be_bytes());
    d[16] = sat(c.xmit_constraint_errors, 0xff) as u8;
    d[17] = sat(c.rcv_constraint_errors, 0xff) as u8;
    d[22..24].copy_from_slice(&(sat(c.vl15_dropped, 0xffff) as u16).to_be_bytes());
    d[24..28].copy_from_slice(&(sat(c.xmit_data, 0xffff_ffff) as u32).to_be_bytes());
    d[28..32].copy_from_slice(&(sat(c.rcv_data, 0xffff_ffff) as u32).to_be_bytes());
    d[32..36].copy_from_slice(&(sat(c.xmit_pkts, 0xffff_ffff) as u32).to_be_bytes());
    d[36..40].copy_from_slice(&(sat(c.rcv_pkts, 0xffff_ffff) as u32).to_be_bytes());
}

/// PortCountersExtended (IBTA 16.1.4.11): 64-bit data and packet counters.
pub(crate) fn encode_ext(c: &PortCounters, d: &mut [u8]) {
    d[8..16].copy_from_slice(&c.xmit_data.to_be_bytes());
    d[16..24].copy_from_slice(&c.rcv_data.to_be_bytes());
    d[24..32].copy_from_slice(&c.xmit_pkts.to_be_bytes());
    d[32..40].copy_from_slice(&c.rcv_pkts.to_be_bytes());
    // Everything here is unicast.
    d[40..48].copy_from_slice(&c.xmit_pkts.to_be_bytes());
    d[48..56].copy_from_slice(&c.rcv_pkts.to_be_bytes());
}

/// PortCounters CounterSelect bits (IBTA table 247).
pub(crate) fn clear(c: &mut PortCounters, sel: u16) {
    let bits: [(u16, &mut u64); 11] = [
        (0x0001, &mut c.symbol_errors),
        (0x0004, &mut c.link_downed),
        (0x0008, &mut c.rcv_errors),
        (0x0020, &mut c.rcv_switch_relay_errors),
        (0x0040, &mut c.xmit_discards),
        (0x0080, &mut c.xmit_constraint_errors),
        (0x0100, &mut c.rcv_constraint_errors),
        (0x0800, &mut c.vl15_dropped),
        (0x1000, &mut c.xmit_data),
        (0x2000, &mut c.rcv_data),
        (0x4000, &mut c.xmit_pkts),
    ];
    for (b, v) in bits {
        if sel & b != 0 {
            *v = 0;
        }
    }
    if sel & 0x8000 != 0 {
        c.rcv_pkts = 0;
    }
}

/// PortCountersExtended CounterSelect bits.
pub(crate) fn clear_ext(c: &mut PortCounters, sel: u16) {
    if sel & 0x01 != 0 {
        c.xmit_data = 0;
    }
    if sel & 0x02 != 0 {
        c.rcv_data = 0;
    }
    if sel & 0x04 != 0 {
        c.xmit_pkts = 0;
    }
    if sel & 0x08 != 0 {
        c.rcv_pkts = 0;
    }
}
