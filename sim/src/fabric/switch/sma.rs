//! The switch's SMA on port 0: directed-route SMP processing at each hop (IBTA vol. 1 14.2.2) and the SubnGet/SubnSet of every attribute the switch answers.
//!
//! Split from [`super`] (the forwarding) along the SMA's seam; the
//! attribute list and what is left out are in the parent module's doc.

use super::*;

impl Switch {
    pub(super) fn receive_smp(&mut self, in_port: u8, bytes: &[u8], p: &packet::Parsed) -> Action {
        let mad = p.payload(bytes);
        let dlid = p.hdr.lrh.dlid;
        // For this switch's SMA: the permissive LID (a directed route, at
        // every hop) or its own LID (LID routed, or the LID-routed start
        // of a directed route); anything else is LID-routed through. Its
        // CRCs before anything reads the MAD.
        let for_sma = dlid == PERMISSIVE_LID || self.is_own_lid(dlid);
        if for_sma && !self.end_port_check(in_port, bytes) {
            return Action::Drop(BAD_ICRC);
        }
        let smp = match Smp::parse(mad) {
            Ok(s) if s.hdr.base_version == 1 && s.hdr.class_version == 1 => s,
            _ => {
                self.ingress(in_port).vl15_dropped += 1;
                return Action::Drop("not an SMP this SMA takes");
            }
        };
        if smp.is_dr() && for_sma {
            return self.receive_dr(in_port, p, smp);
        }
        // LID routed.
        if for_sma {
            if smp.hdr.method & 0x80 != 0 {
                self.ingress(in_port).vl15_dropped += 1;
                return Action::Drop("a response for the switch's SM (there is none)");
            }
            let Some(resp) = self.sma(in_port, smp) else {
                self.ingress(in_port).vl15_dropped += 1;
                return Action::Drop("SMP refused by the SMA (M_Key)");
            };
            let dest = p.hdr.lrh.slid;
            let out = if dlid == PERMISSIVE_LID {
                Some(in_port)
            } else {
                self.route(dest).filter(|&e| e != 0)
            };
            let Some(e) = out else {
                self.ingress(in_port).rcv_switch_relay_errors += 1;
                return Action::Drop("no route back to the requester");
            };
            let mut h = packet::mad_headers(dest, self.lid, 0, 0, p.hdr.bth.pkey);
            h.lrh.sl = p.hdr.lrh.sl;
            return self.emit(e, &h, &resp.to_bytes());
        }
        match self.route(dlid) {
            Some(e) if e != 0 && e != in_port => {
                if !self.link_up(e) {
                    self.count_xmit_discard(e);
                    return Action::Drop("egress link down");
                }
                Action::Send(
                    e,
                    Packet {
                        bytes: bytes.to_vec(),
                    },
                )
            }
            _ => {
                self.ingress(in_port).rcv_switch_relay_errors += 1;
                Action::Drop("unknown DLID")
            }
        }
    }

    /// Directed-route SMP processing (IBTA 14.2.2.2 C14-9, 14.2.2.4
    /// C14-13) at this switch.
    pub(super) fn receive_dr(&mut self, in_port: u8, p: &packet::Parsed, mut smp: Smp) -> Action {
        let drop = |sw: &mut Switch, why| {
            sw.ingress(in_port).vl15_dropped += 1;
            Action::Drop(why)
        };
        let cnt = smp.hop_cnt;
        if cnt >= 64 {
            return drop(self, "hop count above 63");
        }
        let ptr = smp.hop_ptr;
        let n = self.nports();
        // Reached by LID routing (the first, LID-routed part of a directed
        // route whose DrSLID is the requester's LID).
        let lid_routed_start = self.is_own_lid(p.hdr.lrh.dlid) && smp.dr_slid != PERMISSIVE_LID;
        if !smp.direction {
            if cnt != 0 && ptr == 0 && lid_routed_start {
                // C14-9:1 here: the directed part starts at this switch.
                smp.hop_ptr = 1;
                let e = smp.initial_path[1];
                if e == 0 || e > n {
                    return drop(self, "initial path names no port");
                }
                return self.forward_smp(e, p, &smp);
            }
            if cnt != 0 && ptr == 0 {
                return drop(self, "outgoing SMP with hop pointer 0 (C14-9:1)");
            }
            if ptr != 0 && ptr < cnt {
                // C14-9:2: an intermediate hop.
                smp.return_path[usize::from(ptr)] = in_port;
                smp.hop_ptr = ptr + 1;
                let e = smp.initial_path[usize::from(ptr) + 1];
                if e == 0 || e > n {
                    return drop(self, "initial path names no port");
                }
                return self.forward_smp(e, p, &smp);
            }
            if ptr == cnt {
                // C14-9:3: the end of the directed part.
                if cnt != 0 {
                    smp.return_path[usize::from(ptr)] = in_port;
                }
                smp.hop_ptr = ptr + 1;
                if smp.dr_dlid != PERMISSIVE_LID {
                    return drop(self, "LID-routed end of a DR SMP (not modelled)");
                }
                return self.answer_dr(in_port, p, smp);
            }
            if u16::from(ptr) == u16::from(cnt) + 1 {
                // C14-9:4: delivered here by LID routing.
                return self.answer_dr(in_port, p, smp);
            }
            return drop(self, "unreasonable hop pointer (C14-9:5)");
        }
        // Returning (D = 1).
        if (2..=cnt).contains(&ptr) {
            // C14-13:2: an intermediate hop.
            smp.hop_ptr = ptr - 1;
            let e = smp.return_path[usize::from(ptr) - 1];
            if e == 0 || e > n {
                return drop(self, "return path names no port");
            }
            return self.forward_smp(e, p, &smp);
        }
        if ptr == 1 && smp.dr_slid != PERMISSIVE_LID {
            // C14-13:3: the end of the directed part; LID routed from here
            // to the requester.
            smp.hop_ptr = 0;
            return self.lid_route_smp(in_port, p, &smp);
        }
        drop(self, "returning SMP ends at a switch (no SM here)")
    }

    /// Sends a directed-route SMP by LID routing to its DrSLID (the
    /// LID-routed last part of a response), from this switch's LID.
    pub(super) fn lid_route_smp(&mut self, in_port: u8, p: &packet::Parsed, smp: &Smp) -> Action {
        let Some(e) = self.route(smp.dr_slid).filter(|&e| e != 0) else {
            self.ingress(in_port).rcv_switch_relay_errors += 1;
            return Action::Drop("no route to the DrSLID");
        };
        if !self.link_up(e) {
            self.count_xmit_discard(e);
            return Action::Drop("egress link down");
        }
        let mut h = packet::mad_headers(smp.dr_slid, self.lid, 0, 0, p.hdr.bth.pkey);
        h.lrh.sl = p.hdr.lrh.sl;
        self.emit(e, &h, &smp.to_bytes())
    }

    /// Answers a DR SMP that reached this switch and sends the response
    /// back along the return path (C14-13:1).
    pub(super) fn answer_dr(&mut self, in_port: u8, p: &packet::Parsed, smp: Smp) -> Action {
        if smp.hdr.method & 0x80 != 0 {
            self.ingress(in_port).vl15_dropped += 1;
            return Action::Drop("a response for the switch's SM (there is none)");
        }
        let Some(mut resp) = self.sma(in_port, smp) else {
            self.ingress(in_port).vl15_dropped += 1;
            return Action::Drop("SMP refused by the SMA (M_Key)");
        };
        resp.direction = true;
        let cnt = resp.hop_cnt;
        if cnt == 0 && resp.dr_slid != PERMISSIVE_LID && self.is_own_lid(p.hdr.lrh.dlid) {
            // Reached by LID routing alone: back the same way.
            resp.hop_ptr = 0;
            return self.lid_route_smp(in_port, p, &resp);
        }
        if cnt == 0 {
            // A zero-hop SMP addressed to the switch by its neighbour.
            let h = packet::mad_headers(PERMISSIVE_LID, PERMISSIVE_LID, 0, 0, p.hdr.bth.pkey);
            return self.emit(in_port, &h, &resp.to_bytes());
        }
        resp.hop_ptr = cnt;
        let e = resp.return_path[usize::from(cnt)];
        if e == 0 || e > self.nports() {
            self.ingress(in_port).vl15_dropped += 1;
            return Action::Drop("return path names no port");
        }
        let mut h = packet::mad_headers(PERMISSIVE_LID, PERMISSIVE_LID, 0, 0, p.hdr.bth.pkey);
        h.lrh.sl = p.hdr.lrh.sl;
        self.emit(e, &h, &resp.to_bytes())
    }

    pub(super) fn forward_smp(&mut self, e: u8, p: &packet::Parsed, smp: &Smp) -> Action {
        if !self.link_up(e) {
            self.count_xmit_discard(e);
            return Action::Drop("egress link down");
        }
        // The directed part travels with permissive LIDs (a directed route
        // that began by LID routing arrived with this switch's LID).
        let lrh = Lrh {
            dlid: PERMISSIVE_LID,
            slid: PERMISSIVE_LID,
            ..p.hdr.lrh
        };
        let h = Headers {
            lrh,
            bth: p.hdr.bth,
            deth: p.hdr.deth,
            grh: p.hdr.grh,
            ..Headers::default()
        };
        self.emit(e, &h, &smp.to_bytes())
    }

    pub(super) fn emit(&mut self, e: u8, h: &Headers, payload: &[u8]) -> Action {
        match packet::build(h, payload) {
            Ok(bytes) => Action::Send(e, Packet { bytes }),
            Err(_) => Action::Drop("response does not build"),
        }
    }

    /// The SMA: answers one SMP (Get/Set); `None` when the M_Key check
    /// says to drop it silently.
    pub(super) fn sma(&mut self, in_port: u8, smp: Smp) -> Option<Smp> {
        let meth = smp.hdr.method;
        let key_ok = self.mkey == 0 || smp.mkey == self.mkey;
        if self.mkey != 0 && key_ok {
            // The key stops a running lease timer.
            self.mkey_lease_due = None;
        }
        if !key_ok && (meth == method::SET || self.mkey_protect >= 2) {
            self.mkey_violations = self.mkey_violations.saturating_add(1);
            if self.mkey_lease != 0 && self.mkey_lease_due.is_none() {
                let lease_ns = u64::from(self.mkey_lease) * 1_000_000_000;
                self.mkey_lease_due = Some(self.now_ns.saturating_add(lease_ns));
            }
            return None;
        }
        let mut r = smp.clone();
        r.hdr.method = method::GET_RESP;
        let status = if meth == method::GET || meth == method::SET {
            self.attribute(in_port, meth == method::SET, &smp, &mut r.data)
        } else {
            mad_status::METHOD_UNSUPPORTED
        };
        r.hdr.status = status;
        Some(r)
    }

    pub(super) fn attribute(
        &mut self,
        in_port: u8,
        set: bool,
        smp: &Smp,
        out: &mut [u8; 64],
    ) -> u16 {
        let m = smp.hdr.attr_mod;
        let d = &smp.data;
        match (smp.hdr.attr_id, set) {
            (attr::NODE_DESC, false) => {
                out.fill(0);
                for (o, c) in out.iter_mut().zip(self.description.bytes()) {
                    *o = c;
                }
            }
            (attr::NODE_INFO, false) => {
                out.fill(0);
                out[0] = 1; // BaseVersion
                out[1] = 1; // ClassVersion
                out[2] = 2; // NodeType: switch
                out[3] = self.nports();
                out[4..12].copy_from_slice(&self.sys_image_guid.to_be_bytes());
                out[12..20].copy_from_slice(&self.node_guid.to_be_bytes());
                out[20..28].copy_from_slice(&self.node_guid.to_be_bytes());
                out[28..30].copy_from_slice(&(PKEY_CAP as u16).to_be_bytes());
                out[30..32].copy_from_slice(&self.device_id.to_be_bytes());
                out[32..36].copy_from_slice(&self.revision.to_be_bytes());
                let w = u32::from(in_port) << 24 | (self.vendor_id & 0xff_ffff);
                out[36..40].copy_from_slice(&w.to_be_bytes());
            }
            (attr::SWITCH_INFO, _) => {
                if set {
                    self.lft_top = u16::from_be_bytes([d[6], d[7]]).min((LFT_CAP - 1) as u16);
                    if d[11] & 0x04 != 0 {
                        self.port_state_change = false;
                    }
                    self.life_time = d[11] >> 3;
                    self.mft_top = u16::from_be_bytes([d[18], d[19]]);
                }
                self.encode_switch_info(out);
            }
            (attr::PORT_INFO, _) => {
                let port = (m & 0xff) as u8;
                if port > self.nports() {
                    return mad_status::INVALID_FIELD;
                }
                // IBTA 14.2.4.1, protection level 1: a Get without the
                // key is answered with the M_Key field 0 (level 2 and up
                // do not answer it at all: `sma`).
                let show_mkey = self.mkey == 0 || smp.mkey == self.mkey || self.mkey_protect != 1;
                // Bit 31: the SM's SMSupportsExtendedSpeeds (OpenSM sets
                // it for a port whose CapabilityMask, port 0's for a
                // switch, has IsExtendedSpeedsSupported).
                let ext = m & 0x8000_0000 != 0;
                if set && let Err(s) = self.port_info_set(port, d, ext) {
                    self.encode_port_info(port, in_port, show_mkey, out);
                    return s;
                }
                self.encode_port_info(port, in_port, show_mkey, out);
            }
            (attr::PKEY_TABLE, _) => {
                // Port 0's table (NodeInfo PartitionCap) or an external
                // port's partition enforcement table (SwitchInfo
                // PartitionEnforcementCap), 32 entries a block.
                let port = (m >> 16) as u8;
                let block = (m & 0xffff) as usize;
                let t: &mut [u16] = if port == 0 {
                    &mut self.pkeys
                } else if port <= self.nports() {
                    &mut self.ports[usize::from(port)].pkeys
                } else {
                    return mad_status::INVALID_FIELD;
                };
                let Some(t) = t.get_mut(block * 32..block * 32 + 32) else {
                    return mad_status::INVALID_FIELD;
                };
                if set {
                    for (k, e) in t.iter_mut().enumerate() {
                        *e = u16::from_be_bytes([d[2 * k], d[2 * k + 1]]);
                    }
                }
                for (k, e) in t.iter().enumerate() {
                    out[2 * k..2 * k + 2].copy_from_slice(&e.to_be_bytes());
                }
            }
            (attr::GUID_INFO, _) => {
                // GUIDCap 1: block 0, entry 0 is port 0's GUID, the node
                // GUID (read-only; ibsim answers the same).
                if m != 0 {
                    return mad_status::INVALID_FIELD;
                }
                out.fill(0);
                out[0..8].copy_from_slice(&self.node_guid.to_be_bytes());
            }
            (attr::MULTICAST_FORWARDING_TABLE, _) => {
                // Modifier: PortMask position (bits 31:28, 16 ports
                // each) and the block of 32 MLIDs (bits 8:0).
                let pos = (m >> 28) as usize;
                let block = (m & 0x1ff) as usize;
                if pos >= self.mft_positions || block >= MCAST_CAP / 32 {
                    return mad_status::INVALID_FIELD;
                }
                for k in 0..32 {
                    let e = &mut self.mft[(block * 32 + k) * self.mft_positions + pos];
                    if set {
                        *e = u16::from_be_bytes([d[2 * k], d[2 * k + 1]]);
                    }
                    out[2 * k..2 * k + 2].copy_from_slice(&e.to_be_bytes());
                }
            }
            (attr::MLNX_EXT_PORT_INFO, _) => {
                // Mellanox ExtendedPortInfo of port `m`: StateChangeEnable
                // (byte 3), LinkSpeedSupported/Enabled/Active (bytes 7,
                // 11, 15; bit 0 is FDR10). The model's links do not run
                // FDR10, so none is supported, enabled or active (as
                // ibsim answers by default): FDR comes through PortInfo's
                // extended speeds. A Set keeps what it may.
                let port = (m & 0xff) as u8;
                if port > self.nports() || m >> 8 != 0 {
                    return mad_status::INVALID_FIELD;
                }
                let sp = &mut self.ports[usize::from(port)];
                if set {
                    sp.mlnx_state_change_enable = d[3] & 1;
                    sp.mlnx_speed_enabled = d[11] & MLNX_SPEEDS_SUPPORTED;
                }
                *out = mlnx_ext_port_info(sp.mlnx_state_change_enable, sp.mlnx_speed_enabled);
            }
            (attr::SL_TO_VL_TABLE, _) => {
                // Kept and reported; forwarding does not remap VLs.
                let (inp, outp) = (((m >> 8) & 0xff) as u8, (m & 0xff) as u8);
                if inp > self.nports() || outp > self.nports() || m >> 16 != 0 {
                    return mad_status::INVALID_FIELD;
                }
                let e = self.sl2vl.entry((inp, outp)).or_insert([0; 8]);
                if set {
                    e.copy_from_slice(&d[..8]);
                }
                out.fill(0);
                out[..8].copy_from_slice(e);
            }
            (attr::VL_ARB_TABLE, _) => {
                // Kept and reported; there is no arbitration to apply.
                let (block, port) = ((m >> 16) as u8, (m & 0xff) as u8);
                if !(1..=4).contains(&block) || port > self.nports() {
                    return mad_status::INVALID_FIELD;
                }
                let e = self.vlarb.entry((port, block)).or_insert([0; 64]);
                if set {
                    e.copy_from_slice(d);
                }
                out.copy_from_slice(e);
            }
            (attr::LINEAR_FORWARDING_TABLE, _) => {
                let block = m as usize;
                if block >= LFT_CAP / 64 {
                    return mad_status::INVALID_FIELD;
                }
                let t = &mut self.lft[block * 64..block * 64 + 64];
                if set {
                    t.copy_from_slice(d);
                }
                out.copy_from_slice(t);
            }
            _ => return mad_status::ATTR_UNSUPPORTED,
        }
        0
    }

    pub(super) fn encode_switch_info(&self, out: &mut [u8; 64]) {
        out.fill(0);
        out[0..2].copy_from_slice(&(LFT_CAP as u16).to_be_bytes()); // LinearFDBCap
        out[2..4].copy_from_slice(&0u16.to_be_bytes()); // RandomFDBCap
        out[4..6].copy_from_slice(&(MCAST_CAP as u16).to_be_bytes()); // MulticastFDBCap
        out[6..8].copy_from_slice(&self.lft_top.to_be_bytes());
        out[8] = 0; // DefaultPort
        out[9] = 0; // DefaultMulticastPrimaryPort
        out[10] = 0; // DefaultMulticastNotPrimaryPort
        out[11] = (self.life_time & 0x1f) << 3 | u8::from(self.port_state_change) << 2;
        out[12..14].copy_from_slice(&0u16.to_be_bytes()); // LIDsPerPort
        out[14..16].copy_from_slice(&(PART_ENFORCE_CAP as u16).to_be_bytes());
        // Inbound and outbound enforcement, raw filtering both ways; base
        // port 0 (not enhanced).
        out[16] = 0xf0;
        out[18..20].copy_from_slice(&self.mft_top.to_be_bytes()); // MulticastFDBTop
    }

    pub(super) fn encode_port_info(
        &self,
        port: u8,
        in_port: u8,
        show_mkey: bool,
        out: &mut [u8; 64],
    ) {
        out.fill(0);
        let sp = &self.ports[usize::from(port)];
        if show_mkey {
            out[0..8].copy_from_slice(&self.mkey.to_be_bytes());
        }
        out[8..16].copy_from_slice(&self.gid_prefix.to_be_bytes());
        out[16..18].copy_from_slice(&self.lid.to_be_bytes());
        out[18..20].copy_from_slice(&self.sm_lid.to_be_bytes());
        if port == 0 {
            out[20..24].copy_from_slice(&PORT0_CAP_MASK.to_be_bytes());
        }
        out[26..28].copy_from_slice(&self.mkey_lease.to_be_bytes());
        out[28] = in_port; // LocalPortNum: where the SMP came in
        out[29] = 0x03; // LinkWidthEnabled 1x, 4x
        out[30] = 0x03; // LinkWidthSupported
        out[31] = 0x02; // LinkWidthActive 4x
        out[32] = 0x70 | sp.state as u8; // speeds SDR/DDR/QDR | PortState
        out[33] = (sp.phys as u8) << 4 | 2; // PhysState | LinkDownDefault Polling
        out[34] = self.mkey_protect << 6 | (self.lmc & 7);
        out[35] = 0x40 | 0x07; // active QDR | enabled SDR/DDR/QDR
        out[36] = sp.neighbor_mtu << 4 | (self.sm_sl & 0xf);
        out[37] = 4 << 4; // VLCap VL0-7
        out[39] = 8;
        out[40] = 8;
        out[41] = sp.mtu_cap; // MTUCap (4096 by default)
        out[42] = 0x1f; // HOQLife
        out[43] = sp.op_vls << 4 | sp.enforce;
        out[44..46].copy_from_slice(&self.mkey_violations.to_be_bytes());
        out[50] = 1; // GUIDCap
        out[51] = self.subnet_timeout & 0x1f;
        out[52] = 0x10;
        if port != 0 {
            // LinkSpeedExtActive | LinkSpeedExtSupported; the reserved
            // bits and LinkSpeedExtEnabled.
            out[62] = self.link_speed_ext_active(port) << 4 | LINK_SPEEDS_EXT_SUPPORTED;
            out[63] = sp.speeds_ext_enabled & 0x1f;
        }
    }

    /// SubnSet(PortInfo) of port `port`: port 0 takes the subnet
    /// attributes (LID, LMC, SM LID/SL, M_Key, timeouts); every port takes
    /// PortState, PortPhysicalState (3 disables, 2 enables), NeighborMTU
    /// and OperationalVLs, an external port LinkSpeedExtEnabled when `ext`
    /// (the modifier's SMSupportsExtendedSpeeds: 0 no change, 30 none, 31
    /// all supported). An invalid state change leaves everything as it
    /// was and answers "invalid field".
    pub(super) fn port_info_set(&mut self, port: u8, d: &[u8; 64], ext: bool) -> Result<(), u16> {
        let sp = &self.ports[usize::from(port)];
        let new_state = sp
            .state
            .set_by_sm(d[32] & 0xf)
            .ok_or(mad_status::INVALID_FIELD)?;
        let phys_req = d[33] >> 4;
        if !matches!(phys_req, 0 | 2 | 3) || (port == 0 && phys_req != 0) {
            return Err(mad_status::INVALID_FIELD);
        }
        if port == 0 {
            let lid = u16::from_be_bytes([d[16], d[17]]);
            if lid >= 0xc000 {
                return Err(mad_status::INVALID_FIELD);
            }
            self.mkey = u64::from_be_bytes(d[0..8].try_into().unwrap_or([0; 8]));
            self.gid_prefix = u64::from_be_bytes(d[8..16].try_into().unwrap_or([0; 8]));
            self.lid = lid;
            self.sm_lid = u16::from_be_bytes([d[18], d[19]]);
            self.mkey_lease = u16::from_be_bytes([d[26], d[27]]);
            self.mkey_protect = d[34] >> 6;
            self.lmc = d[34] & 7;
            self.sm_sl = d[36] & 0xf;
            self.subnet_timeout = d[51] & 0x1f;
        }
        let sp = &mut self.ports[usize::from(port)];
        let nmtu = d[36] >> 4;
        if (1..=5).contains(&nmtu) {
            sp.neighbor_mtu = nmtu.min(sp.mtu_cap);
        }
        let vls = d[43] >> 4;
        if (1..=4).contains(&vls) {
            sp.op_vls = vls;
        }
        if port != 0 {
            sp.enforce = d[43] & 0x0f;
        }
        if port != 0 && ext {
            sp.speeds_ext_enabled = match d[63] & 0x1f {
                0 => sp.speeds_ext_enabled,
                30 => 0,
                31 => LINK_SPEEDS_EXT_SUPPORTED,
                v => v & LINK_SPEEDS_EXT_SUPPORTED,
            };
        }
        match phys_req {
            3 if port != 0 && !sp.disabled => {
                // Down at once; the fabric takes the cable's link down
                // right after this SMP.
                sp.disabled = true;
                if sp.phys == PhysicalState::LinkUp {
                    sp.counters.link_downed += 1;
                }
                sp.phys = PhysicalState::Disabled;
                if sp.state != LogicalState::Down {
                    sp.state = LogicalState::Down;
                    self.port_state_change = true;
                }
                return Ok(());
            }
            2 if sp.disabled => {
                // Polling until the fabric brings the link up.
                sp.disabled = false;
                sp.phys = PhysicalState::Polling;
                return Ok(());
            }
            2 if port != 0 && sp.phys == PhysicalState::LinkUp => {
                // Polling on a live link: it retrains (the fabric takes it
                // down and up again right after this SMP).
                sp.retrain = true;
                return Ok(());
            }
            _ => {}
        }
        match new_state {
            Some(LogicalState::Down) if port != 0 => {
                // The link retrains: Down, then Init again while it is up.
                sp.state = if sp.phys == PhysicalState::LinkUp && !sp.disabled {
                    LogicalState::Init
                } else {
                    LogicalState::Down
                };
            }
            Some(LogicalState::Down) => sp.state = LogicalState::Init,
            Some(s) => sp.state = s,
            // Base port 0 has no link of its own: it is Active once the SM
            // gave the switch a LID (ibsim reports it Active too).
            None if port == 0 && self.lid != 0 && sp.state == LogicalState::Init => {
                sp.state = LogicalState::Active;
            }
            None => {}
        }
        Ok(())
    }
}
