//! The embedded SM's own node: its SMA (the SM port's NodeInfo and PortInfo, Sets from another master) and what it receives (SMPs, traps, the SA's and RMPP's GMPs).
//!
//! Split from [`super`] (the sweep's state machine) along the seam between
//! the SM's wire and its sweep.

use super::*;

impl SubnetManager {
    pub(super) fn local_node(&self) -> Node {
        let mut ni = [0u8; 40];
        ni[0] = 1;
        ni[1] = 1;
        ni[2] = 1;
        ni[3] = 1;
        ni[4..12].copy_from_slice(&self.cfg.node_guid.to_be_bytes());
        ni[12..20].copy_from_slice(&self.cfg.node_guid.to_be_bytes());
        ni[20..28].copy_from_slice(&self.port_guid().to_be_bytes());
        ni[28..30].copy_from_slice(&1u16.to_be_bytes());
        ni[30..32].copy_from_slice(&0x1003u16.to_be_bytes());
        ni[36] = 1;
        ni[37..40].copy_from_slice(&[0x00, 0x02, 0xc9]);
        let mut desc = [0u8; 64];
        for (o, c) in desc.iter_mut().zip(self.cfg.description.bytes()) {
            *o = c;
        }
        let mut pr = PortRec::new(self.port_guid(), Vec::new());
        pr.info = Some(self.local_port_info());
        Node {
            guid: self.cfg.node_guid,
            node_type: 1,
            node_info: ni,
            description: desc,
            path: Vec::new(),
            switch_info: None,
            ports: BTreeMap::from([(1, pr)]),
            entry: 1,
        }
    }

    /// The SM port's PortInfo as its SMA reports it.
    pub(super) fn local_port_info(&self) -> [u8; 64] {
        let mut o = [0u8; 64];
        o[8..16].copy_from_slice(&self.cfg.subnet_prefix.to_be_bytes());
        o[16..18].copy_from_slice(&self.lid.to_be_bytes());
        o[18..20].copy_from_slice(&self.port_sm_lid.to_be_bytes());
        // CapabilityMask: IsSM (bit 1).
        o[20..24].copy_from_slice(&0x0000_0002u32.to_be_bytes());
        o[28] = 1;
        o[29] = 0x03;
        o[30] = 0x03;
        o[31] = 0x02; // 4x
        o[32] = 0x70 | self.port_state;
        let phys = if self.port_state == 1 { 2 } else { 5 };
        o[33] = phys << 4 | 2;
        o[35] = 0x40 | 0x07; // QDR
        o[36] = 5 << 4 | (self.port_sm_sl & 0xf);
        o[37] = 4 << 4;
        o[41] = 5; // MTUCap 4096
        o[43] = 4 << 4;
        o[50] = 1;
        o[51] = self.port_subnet_timeout & 0x1f;
        o[53] = self.port_thresholds;
        o
    }

    // ------------------------------------------------------- receiving

    pub(super) fn receive(&mut self, f: &mut Fabric, now: u64, pkt: &Packet) {
        let Ok(p) = packet::parse(&pkt.bytes) else {
            self.stats.bad_mads += 1;
            return;
        };
        if packet::check_crcs(&pkt.bytes).is_err() {
            self.stats.bad_mads += 1;
            return;
        }
        let Some(deth) = p.hdr.deth else {
            // Not a datagram: nothing for the SM's port.
            return;
        };
        let mad = p.payload(&pkt.bytes);
        match p.hdr.bth.dest_qp {
            0 if p.hdr.lrh.vl == 15 => self.receive_smp(f, now, &p, mad),
            1 if deth.qkey == packet::GSI_QKEY => {
                self.receive_gmp(f, now, &p, deth.src_qp, mad);
            }
            _ => self.stats.bad_mads += 1,
        }
    }

    pub(super) fn receive_smp(&mut self, f: &mut Fabric, now: u64, p: &packet::Parsed, mad: &[u8]) {
        let Ok(smp) = Smp::parse(mad) else {
            self.stats.bad_mads += 1;
            return;
        };
        if smp.hdr.method & 0x80 != 0 {
            // A response: ours if the TID matches and it came back to us.
            if smp.is_dr() && smp.direction && smp.hop_ptr == 1 {
                // C14-13:3: the returning SMP reached its requester.
                if let Some(i) = self.pending.iter().position(|q| q.tid == smp.hdr.tid) {
                    let pend = self.pending.swap_remove(i);
                    self.answered(now, pend.req, &smp);
                    return;
                }
            }
            // Late (after a resend) or not ours: dropped.
            return;
        }
        if smp.hdr.method == method::TRAP {
            self.trap(f, now, p, &smp);
            return;
        }
        if smp.hdr.method == method::TRAP_REPRESS {
            return;
        }
        // A request for the SM node's SMA. A directed-route one must end
        // here: hop count 0..63 (C14-6), hop pointer at the end of the
        // path, permissive DrDLID (no LID-routed part).
        if smp.is_dr()
            && (smp.direction
                || smp.hop_cnt >= 64
                || smp.hop_ptr != smp.hop_cnt
                || smp.dr_dlid != PERMISSIVE_LID)
        {
            self.stats.bad_mads += 1;
            return;
        }
        let mut r = smp.clone();
        r.hdr.method = method::GET_RESP;
        r.hdr.status = self.local_sma(now, &smp, &mut r.data);
        if smp.is_dr() {
            // C14-9:3 on receipt, then C14-13:1 on the way back.
            r.direction = true;
            if let Some(e) = r.return_path.get_mut(usize::from(smp.hop_cnt))
                && smp.hop_cnt != 0
            {
                *e = 1;
            }
            r.hop_ptr = smp.hop_cnt;
            let h = packet::mad_headers(PERMISSIVE_LID, PERMISSIVE_LID, 0, 0, p.hdr.bth.pkey);
            if let Ok(bytes) = packet::build(&h, &r.to_bytes()) {
                f.send_from(self.port, Packet { bytes }, now);
            }
        } else {
            let dlid = p.hdr.lrh.dlid;
            if dlid != PERMISSIVE_LID && (self.lid == 0 || dlid != self.lid) {
                self.stats.bad_mads += 1;
                return;
            }
            let mut h = packet::mad_headers(p.hdr.lrh.slid, self.lid, 0, 0, p.hdr.bth.pkey);
            h.lrh.sl = p.hdr.lrh.sl;
            if let Ok(bytes) = packet::build(&h, &r.to_bytes()) {
                f.send_from(self.port, Packet { bytes }, now);
            }
        }
    }

    /// The SM node's SMA: NodeInfo, NodeDescription, PortInfo (Get, and
    /// Set by another master: LID, SM LID, PortState along the IBTA state
    /// machine, SubnetTimeOut, thresholds), SMInfo ([`sminfo`]),
    /// P_KeyTable block 0, GUIDInfo block 0, SL-to-VL and VL arbitration
    /// tables (kept, not applied), Mellanox's ExtendedPortInfo.
    pub(super) fn local_sma(&mut self, now: u64, smp: &Smp, out: &mut [u8; 64]) -> u16 {
        if smp.hdr.method != method::GET && smp.hdr.method != method::SET {
            return mad_status::METHOD_UNSUPPORTED;
        }
        let set = smp.hdr.method == method::SET;
        let m = smp.hdr.attr_mod;
        if smp.hdr.attr_id == ATTR_SM_INFO {
            return self.sminfo_request(now, smp, out);
        }
        let n = self.local_node();
        out.fill(0);
        match (smp.hdr.attr_id, set) {
            (attr::NODE_INFO, false) => out[..40].copy_from_slice(&n.node_info),
            (attr::NODE_DESC, false) => out.copy_from_slice(&n.description),
            (attr::PORT_INFO, _) => {
                if m & 0xff > 1 {
                    return mad_status::INVALID_FIELD;
                }
                if set && let Err(st) = self.local_port_info_set(now, &smp.data) {
                    out.copy_from_slice(&self.local_port_info());
                    return st;
                }
                out.copy_from_slice(&self.local_port_info());
            }
            (attr::PKEY_TABLE, _) => {
                if m != 0 {
                    return mad_status::INVALID_FIELD;
                }
                let key = (attr::PKEY_TABLE, 0);
                if set {
                    self.local_tables.insert(key, smp.data);
                }
                match self.local_tables.get(&key) {
                    Some(t) => out.copy_from_slice(t),
                    None => out[0..2].copy_from_slice(&packet::DEFAULT_PKEY.to_be_bytes()),
                }
            }
            (attr::GUID_INFO, false) => {
                if m != 0 {
                    return mad_status::INVALID_FIELD;
                }
                out[0..8].copy_from_slice(&self.port_guid().to_be_bytes());
            }
            (attr::SL_TO_VL_TABLE | attr::VL_ARB_TABLE, _) => {
                let key = (smp.hdr.attr_id, m);
                if set {
                    self.local_tables.insert(key, smp.data);
                }
                if let Some(t) = self.local_tables.get(&key) {
                    out.copy_from_slice(t);
                }
            }
            (attr::MLNX_EXT_PORT_INFO, _) => {
                // Our node is a ConnectX-3 (device 0x1003) and answers it as
                // one does, like the fabric's host nodes
                // (`switch::mlnx_ext_port_info`); ibnetdiscover asks it of
                // every Mellanox port at QDR (FDR10 or not).
                if m & 0xff > 1 || m >> 8 != 0 {
                    return mad_status::INVALID_FIELD;
                }
                let key = (attr::MLNX_EXT_PORT_INFO, 0);
                if set {
                    self.local_tables.insert(key, smp.data);
                }
                let (sce, speeds) = self.local_tables.get(&key).map_or((0, 0), |d| {
                    (
                        d[3] & 1,
                        d[11] & crate::fabric::switch::MLNX_SPEEDS_SUPPORTED,
                    )
                });
                *out = crate::fabric::switch::mlnx_ext_port_info(sce, speeds);
            }
            (attr::NODE_INFO | attr::NODE_DESC | attr::GUID_INFO, true) => {
                return mad_status::METHOD_UNSUPPORTED;
            }
            _ => return mad_status::ATTR_UNSUPPORTED,
        }
        0
    }

    /// SubnSet(PortInfo) of our own port by another master: PortState 0
    /// keeps it, 1 (Down) retrains the link to Init, 3 arms a port in Init
    /// or Armed, 4 activates an Armed or Active one; anything else, or a
    /// multicast LID, changes nothing.
    pub(super) fn local_port_info_set(&mut self, now: u64, d: &[u8; 64]) -> Result<(), u16> {
        let to = match (d[32] & 0xf, self.port_state) {
            (0, s) => s,
            (1, _) => 2,
            (3, 2 | 3) => 3,
            (4, 3 | 4) => 4,
            _ => return Err(mad_status::INVALID_FIELD),
        };
        let lid = be16(d, 16);
        if lid >= 0xc000 && lid != 0xffff {
            return Err(mad_status::INVALID_FIELD);
        }
        if lid != self.lid {
            self.note(now, format!("our port's LID set to {lid} by the master"));
        }
        self.lid = lid;
        self.port_sm_lid = be16(d, 18);
        self.port_sm_sl = d[36] & 0xf;
        self.port_subnet_timeout = d[51] & 0x1f;
        self.port_thresholds = d[53];
        if self.port_state != 1 {
            self.port_state = to;
        }
        Ok(())
    }

    /// A trap (LID-routed to our LID): TrapRepress, and a heavy sweep for
    /// the link and capability traps.
    pub(super) fn trap(&mut self, f: &mut Fabric, now: u64, p: &packet::Parsed, smp: &Smp) {
        self.stats.traps += 1;
        let num = be16(&smp.data, 4);
        let issuer = be16(&smp.data, 6);
        self.note(now, format!("trap {num} from LID {issuer}"));
        if smp.hdr.attr_id == ATTR_NOTICE && !smp.is_dr() {
            let mut r = smp.clone();
            r.hdr.method = method::TRAP_REPRESS;
            r.hdr.status = 0;
            let mut h = packet::mad_headers(p.hdr.lrh.slid, self.lid, 0, 0, p.hdr.bth.pkey);
            h.lrh.sl = p.hdr.lrh.sl;
            if let Ok(bytes) = packet::build(&h, &r.to_bytes()) {
                f.send_from(self.port, Packet { bytes }, now);
            }
        }
        if matches!(num, 128..=131 | 144 | 145) {
            self.request_sweep();
        }
    }

    pub(super) fn receive_gmp(
        &mut self,
        f: &mut Fabric,
        now: u64,
        p: &packet::Parsed,
        src_qp: u32,
        mad: &[u8],
    ) {
        let Ok(hdr) = MadHdr::parse(mad) else {
            self.stats.bad_mads += 1;
            return;
        };
        if hdr.method & 0x80 != 0 || mad.len() < MAD_LEN {
            // Responses (we send no GMP requests) and short MADs.
            self.stats.bad_mads += 1;
            return;
        }
        let mut req = [0u8; MAD_LEN];
        req.copy_from_slice(&mad[..MAD_LEN]);
        let resp = if hdr.mgmt_class == mgmt_class::SUBN_ADM {
            if !self.is_master() {
                // The SA answers once the subnet is up (as OpenSM).
                return;
            }
            // RMPP: an ACK/STOP/ABORT of one of our transfers; a request
            // in several segments is not taken.
            if req[24] == 1 && req[26] & 0x01 != 0 {
                if req[25] != 1 {
                    self.rmpp_control(f, now, p.hdr.lrh.slid, &req);
                    return;
                }
                if req[26] & 0x06 != 0x06 {
                    self.stats.bad_mads += 1;
                    return;
                }
            }
            let rows = self.sm_rows();
            let view = super::super::sa::View {
                ports: &self.subnet,
                lfts: &self.lfts,
                links: &self.links,
                port_infos: &self.port_infos,
                cfg: &self.cfg,
                sm_lid: self.lid,
                switch_infos: &self.switch_infos,
                mfts: &self.mfts,
                sms: &rows,
            };
            let (a, fx) =
                super::super::sa::answer_with(&view, &mut self.sa, &req, p.hdr.lrh.slid, now);
            if fx.mcast_changed {
                self.mcast_dirty = true;
            }
            let Some(a) = a else {
                // What OpenSM drops.
                self.stats.bad_mads += 1;
                return;
            };
            if a.status_error {
                self.stats.bad_mads += 1;
            } else {
                self.stats.sa_answered += 1;
            }
            match a.table {
                None => a.mad,
                Some(data) if data.len() <= super::super::sa::SA_DATA_LEN => {
                    let mut m = a.mad;
                    super::super::sa::write_segment(&mut m, &data, 1, 1);
                    m
                }
                Some(data) => {
                    let (slid, tid) = (p.hdr.lrh.slid, hdr.tid);
                    // A repeated request restarts its transfer.
                    self.rmpp.retain(|r| !(r.tid == tid && r.dlid == slid));
                    if self.rmpp.len() >= RMPP_MAX_SENDS {
                        let mut m = a.mad;
                        let mut h = hdr;
                        h.method = hdr.method | 0x80;
                        h.status = super::super::sa::sa_status::NO_RESOURCES;
                        h.write(&mut m);
                        m
                    } else {
                        self.stats.sa_rmpp_transfers += 1;
                        self.rmpp.push(RmppSend {
                            tid,
                            dlid: slid,
                            dqp: src_qp,
                            pkey: p.hdr.bth.pkey,
                            sl: p.hdr.lrh.sl,
                            mad: a.mad,
                            nsegs: super::super::sa::segments(data.len()),
                            data,
                            acked: 0,
                            window_last: 1,
                            sent: 0,
                            deadline: 0,
                            tries: 0,
                        });
                        let i = self.rmpp.len() - 1;
                        self.rmpp_send_window(f, now, i);
                        return;
                    }
                }
            }
        } else {
            // No other class lives here: "class not supported".
            self.stats.bad_mads += 1;
            let mut r = req;
            let mut h = hdr;
            h.method = method::GET_RESP;
            h.status = mad_status::BAD_VERSION;
            h.write(&mut r);
            r
        };
        let mut h = packet::mad_headers(p.hdr.lrh.slid, self.lid, src_qp, 1, p.hdr.bth.pkey);
        h.lrh.sl = p.hdr.lrh.sl;
        if let Ok(bytes) = packet::build(&h, &resp) {
            f.send_from(self.port, Packet { bytes }, now);
        }
    }

    // --------------------------------------------------------- answers
}
