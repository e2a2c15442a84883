//! Ethernet frames (IEEE 802.3 with an optional 802.1Q tag, the FCS last)
//! and the RoCE v1 packets they carry (IBTA vol. 1 annex A16: Ethertype
//! 0x8915, then GRH, BTH, the extended headers, the payload, the ICRC).
//!
//! A frame on an Ethernet cable is `DMAC SMAC [0x8100 TCI] Ethertype
//! payload FCS`: at least 64 bytes with the FCS (the sender pads), the FCS
//! a CRC-32 over everything before it, stored least significant byte first
//! (what Wireshark checks). A RoCE v1 packet is the InfiniBand packet with
//! its LRH replaced by the Ethernet header and its VCRC by the FCS; the
//! GRH is always there, the SL travels in the VLAN PCP of a tagged frame.
//!
//! CRCs owed: as on InfiniBand ([`super::build_owed_with`]), a model HCA
//! leaves the ICRC (RoCE) and the FCS as zero placeholders and the fabric
//! computes them when anything could see or change the frame
//! ([`seal_eth_owed`]); a frame counts as owing them only while its last
//! four bytes (the FCS) are zero.

use super::*;

/// Ethernet header without a tag.
pub const ETH_HLEN: usize = 14;
/// An 802.1Q tag.
pub const VLAN_HLEN: usize = 4;
/// The FCS.
pub const FCS_LEN: usize = 4;
/// The smallest frame, FCS included.
pub const MIN_FRAME_FCS: usize = 64;
/// Ethertype of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// Ethertype of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// Ethertype of an 802.1Q tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// Ethertype of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// Ethertype of RoCE v1 (Linux `MLX4_IB_IBOE_ETHERTYPE`, `ETH_P_IBOE`).
pub const ETHERTYPE_ROCE: u16 = 0x8915;
/// The broadcast MAC.
pub const BROADCAST: [u8; 6] = [0xff; 6];

/// The Ethernet header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EthHdr {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// The 802.1Q tag's TCI (PCP 15:13, DEI 12, VID 11:0), if tagged.
    pub vlan: Option<u16>,
    /// Ethertype (after the tag).
    pub ethertype: u16,
}

impl EthHdr {
    /// Header length: 14, or 18 with a tag.
    pub fn len(&self) -> usize {
        ETH_HLEN + if self.vlan.is_some() { VLAN_HLEN } else { 0 }
    }
    /// Never empty.
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Reads the header (one tag at most).
    pub fn parse(b: &[u8]) -> Result<EthHdr, PacketError> {
        need(b, ETH_HLEN, "Ethernet header")?;
        let mut dst = [0u8; 6];
        let mut src = [0u8; 6];
        dst.copy_from_slice(&b[0..6]);
        src.copy_from_slice(&b[6..12]);
        let t = be16(b, 12);
        if t == ETHERTYPE_VLAN {
            need(b, ETH_HLEN + VLAN_HLEN, "802.1Q tag")?;
            return Ok(EthHdr {
                dst,
                src,
                vlan: Some(be16(b, 14)),
                ethertype: be16(b, 16),
            });
        }
        Ok(EthHdr {
            dst,
            src,
            vlan: None,
            ethertype: t,
        })
    }
    /// Writes the header into `b[..self.len()]`.
    pub fn write(&self, b: &mut [u8]) {
        b[0..6].copy_from_slice(&self.dst);
        b[6..12].copy_from_slice(&self.src);
        match self.vlan {
            Some(tci) => {
                b[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
                b[14..16].copy_from_slice(&tci.to_be_bytes());
                b[16..18].copy_from_slice(&self.ethertype.to_be_bytes());
            }
            None => b[12..14].copy_from_slice(&self.ethertype.to_be_bytes()),
        }
    }
    /// The VLAN id, if tagged.
    pub fn vid(&self) -> Option<u16> {
        self.vlan.map(|t| t & 0xfff)
    }
    /// The priority (PCP), 0 if untagged.
    pub fn pcp(&self) -> u8 {
        self.vlan.map_or(0, |t| (t >> 13) as u8)
    }
}

/// A group (multicast or broadcast) MAC.
pub fn is_group_mac(m: &[u8; 6]) -> bool {
    m[0] & 1 != 0
}

/// The ethertype of `frame` (after a tag), if it has a header.
pub fn ethertype(frame: &[u8]) -> Option<u16> {
    EthHdr::parse(frame).ok().map(|h| h.ethertype)
}

/// The frame (without its FCS) carries RoCE v1.
pub fn is_roce(frame: &[u8]) -> bool {
    ethertype(frame) == Some(ETHERTYPE_ROCE)
}

/// The frame's CRCs are owed: its FCS (the last four bytes) is still the
/// zero placeholder.
pub fn eth_crcs_owed(b: &[u8]) -> bool {
    b.len() >= ETH_HLEN + FCS_LEN && b[b.len() - FCS_LEN..].iter().all(|&x| x == 0)
}

/// Computes a frame's owed CRCs: the ICRC of a RoCE packet whose ICRC is
/// still the placeholder, then the FCS.
pub fn seal_eth_owed(b: &mut [u8]) -> Result<(), PacketError> {
    need(b, ETH_HLEN + FCS_LEN, "frame")?;
    let n = b.len() - FCS_LEN;
    if let Ok(h) = EthHdr::parse(b)
        && h.ethertype == ETHERTYPE_ROCE
        && n >= h.len() + GRH_LEN + BTH_LEN + ICRC_LEN
        && b[n - ICRC_LEN..n].iter().all(|&x| x == 0)
    {
        let i = roce_icrc(&b[h.len()..n - ICRC_LEN]);
        b[n - ICRC_LEN..n].copy_from_slice(&i.to_le_bytes());
    }
    let f = fcs(&b[..n]);
    b[n..].copy_from_slice(&f.to_le_bytes());
    Ok(())
}

/// Recomputes a whole frame's FCS (after a change of its bytes).
pub fn reseal_fcs(b: &mut [u8]) -> Result<(), PacketError> {
    need(b, ETH_HLEN + FCS_LEN, "frame")?;
    let n = b.len() - FCS_LEN;
    let f = fcs(&b[..n]);
    b[n..].copy_from_slice(&f.to_le_bytes());
    Ok(())
}

/// Checks a frame's FCS.
pub fn check_fcs(b: &[u8]) -> Result<(), PacketError> {
    need(b, ETH_HLEN + FCS_LEN, "frame")?;
    let n = b.len() - FCS_LEN;
    let found = u32::from_le_bytes([b[n], b[n + 1], b[n + 2], b[n + 3]]);
    let expected = fcs(&b[..n]);
    if found != expected {
        return Err(PacketError::BadFcs { expected, found });
    }
    Ok(())
}

/// Appends the frame's padding (to 60 bytes) and FCS placeholder, or the
/// computed FCS when `seal`: `b` holds the frame without them.
pub fn finish_frame(b: &mut Vec<u8>, seal: bool) {
    if b.len() < MIN_FRAME_FCS - FCS_LEN {
        b.resize(MIN_FRAME_FCS - FCS_LEN, 0);
    }
    if seal {
        let f = fcs(b);
        b.extend_from_slice(&f.to_le_bytes());
    } else {
        b.extend_from_slice(&[0; FCS_LEN]);
    }
}

/// Parses a RoCE v1 frame (Ethernet header through FCS), checking the
/// Ethertype and every length field; its CRCs are not checked here
/// ([`check_roce_crcs`]). The headers' `eth` is the Ethernet header, the
/// LRH's `sl` the VLAN PCP; `vcrc` is 0.
pub fn parse_roce(b: &[u8]) -> Result<Parsed, PacketError> {
    let e = EthHdr::parse(b)?;
    if e.ethertype != ETHERTYPE_ROCE {
        return Err(PacketError::NotRoce(e.ethertype));
    }
    if b.len() > MAX_PACKET + e.len() + FCS_LEN {
        return Err(PacketError::TooLong(b.len()));
    }
    need(
        b,
        e.len() + GRH_LEN + BTH_LEN + ICRC_LEN + FCS_LEN,
        "RoCE packet",
    )?;
    let body = b.len() - FCS_LEN;
    let mut p = parse_transport(b, e.len(), body, true)?;
    p.hdr.eth = Some(e);
    p.hdr.lrh.sl = e.pcp();
    Ok(p)
}

/// Checks a RoCE frame's FCS and ICRC.
pub fn check_roce_crcs(b: &[u8]) -> Result<(), PacketError> {
    check_fcs(b)?;
    let e = EthHdr::parse(b)?;
    let n = b.len() - FCS_LEN;
    need(
        b,
        e.len() + GRH_LEN + BTH_LEN + ICRC_LEN + FCS_LEN,
        "RoCE packet",
    )?;
    let found = u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]]);
    let expected = roce_icrc(&b[e.len()..n - ICRC_LEN]);
    if found != expected {
        return Err(PacketError::BadIcrc { expected, found });
    }
    Ok(())
}

/// Builds a sealed RoCE frame from `hdr` (its `eth` and `grh` set) and
/// `payload` (tests, peers).
pub fn build_roce(hdr: &Headers, payload: &[u8]) -> Result<Vec<u8>, PacketError> {
    if hdr.eth.is_none() {
        return Err(PacketError::HeaderMismatch(
            "a RoCE packet without its Ethernet header",
        ));
    }
    let mut v = build_owed(hdr, payload)?;
    seal_eth_owed(&mut v)?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roce_hdr() -> Headers {
        let mut h = Headers::for_opcode(opcode::RC | opcode::SEND_ONLY).unwrap();
        h.eth = Some(EthHdr {
            dst: [0x00, 0x02, 0xc9, 0, 0, 0x21],
            src: [0x00, 0x02, 0xc9, 0, 0, 0x11],
            vlan: Some(3 << 13 | 100),
            ethertype: ETHERTYPE_ROCE,
        });
        h.grh = Some(Grh {
            ip_ver: 6,
            nxt_hdr: GRH_NXT_HDR_IBA,
            hop_lmt: 1,
            sgid: [
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 2, 0xc9, 0xff, 0xfe, 0, 0, 0x11,
            ],
            dgid: [
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 2, 0xc9, 0xff, 0xfe, 0, 0, 0x21,
            ],
            ..Grh::default()
        });
        h.bth.dest_qp = 0x91;
        h.bth.psn = 7;
        h
    }

    #[test]
    fn roce_frames_round_trip_with_their_crcs() {
        let h = roce_hdr();
        let b = build_roce(&h, b"hello").unwrap();
        // 18 + 40 + 12 + 5 + 3 pad + 4 ICRC + 4 FCS.
        assert_eq!(b.len(), 86);
        assert_eq!(&b[12..14], &[0x81, 0x00]);
        assert_eq!(&b[16..18], &[0x89, 0x15]);
        check_roce_crcs(&b).unwrap();
        let p = parse_roce(&b).unwrap();
        assert_eq!(p.hdr.eth, h.eth);
        assert_eq!(p.hdr.lrh.sl, 3, "the PCP");
        assert_eq!(p.payload(&b), b"hello");
        assert_eq!((p.hdr.bth.dest_qp, p.hdr.bth.psn), (0x91, 7));
        assert_eq!(usize::from(p.hdr.grh.unwrap().pay_len), 12 + 8 + 4);
        // Owed, then sealed: the same bytes.
        let mut o = build_owed(&h, b"hello").unwrap();
        assert!(eth_crcs_owed(&o));
        seal_eth_owed(&mut o).unwrap();
        assert_eq!(o, b);
        // The ICRC is the InfiniBand one with the LRH's place all ones.
        let mut ib = vec![0x12u8, 0x03, 0, 0, 0, 0, 0, 0];
        ib.extend_from_slice(&b[18..b.len() - 8]);
        let n = b.len();
        assert_eq!(
            icrc(&ib).to_le_bytes(),
            [b[n - 8], b[n - 7], b[n - 6], b[n - 5]]
        );
        // A flipped bit fails the FCS.
        let mut bad = b.clone();
        bad[40] ^= 4;
        assert!(matches!(check_fcs(&bad), Err(PacketError::BadFcs { .. })));
        assert!(matches!(
            parse_roce(&bad[..30]),
            Err(PacketError::Truncated { .. })
        ));
        let mut not = b.clone();
        not[16] = 0x08;
        not[17] = 0x00;
        assert_eq!(parse_roce(&not), Err(PacketError::NotRoce(0x0800)));
        let mut h2 = h;
        h2.grh = None;
        assert!(build_roce(&h2, b"x").is_err(), "RoCE needs its GRH");
    }

    #[test]
    fn short_frames_are_padded_and_the_fcs_is_zlibs() {
        let mut f = vec![0xffu8; 6];
        f.extend_from_slice(&[0, 2, 0xc9, 0, 0, 0x11]);
        f.extend_from_slice(&ETHERTYPE_ARP.to_be_bytes());
        f.extend_from_slice(&[1; 28]);
        finish_frame(&mut f, true);
        assert_eq!(f.len(), 64);
        check_fcs(&f).unwrap();
        assert_eq!(&f[60..], &crc32(&f[..60]).to_le_bytes());
        assert!(!eth_crcs_owed(&f));
    }
}
