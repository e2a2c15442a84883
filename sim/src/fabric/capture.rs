//! The capture: every packet crossing a cable, for Wireshark and tshark.
//!
//! The capture: every packet crossing a cable, written for Wireshark and
//! tshark: InfiniBand packets as ERF records of type 21 (InfiniBand) with
//! link type 197 (LINKTYPE_ERF), because tshark 4.0 refuses the plain
//! InfiniBand link type 247; Ethernet frames (RoCE v1, IPv4, ARP, ...) as
//! Ethernet, FCS included. Two containers:
//!
//! * pcapng (the default, and any file name not ending in `.pcap`): one
//!   interface per cable, named after its two ends (`"node0/1 <-> sw0/1"`),
//!   of link type ERF for an InfiniBand cable and Ethernet (1, with
//!   `if_fcslen` 4) for an Ethernet one; each packet an Enhanced Packet
//!   Block with nanosecond timestamps and the direction flag: outbound =
//!   from the first-named end to the second, inbound = the other way
//!   (tshark: `frame.interface_name`, `frame.packet_flags_direction`).
//! * classic pcap (a name ending in `.pcap`): microsecond timestamps, one
//!   link type (ERF) for both: an Ethernet frame is an ERF record of type
//!   2 (Ethernet, with its two-byte offset and pad, FCS included); the
//!   link is not recorded and the direction is the ERF "capture interface"
//!   field (0 = first-named end to second, 1 = back).
//!
//! Timestamps are the fabric's clock (the fake clock in synchronous tests)
//! added to the wall-clock time the capture was opened. Write errors stop
//! the capture and are kept ([`Capture::error`]); they never stop the
//! fabric. Capture filters and snap lengths are not modelled.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::LinkLayer;

/// Which end sent the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the first-named end of the link to the second.
    AtoB,
    /// From the second-named end to the first.
    BtoA,
}

const LINKTYPE_ERF: u16 = 197;
const ERF_TYPE_INFINIBAND: u8 = 21;
const ERF_TYPE_ETH: u8 = 2;
const LINKTYPE_ETHERNET: u16 = 1;
/// ERF flags: varying-length record.
const ERF_FLAG_VLEN: u8 = 0x04;

/// An open capture file.
pub struct Capture {
    out: Option<BufWriter<File>>,
    pcapng: bool,
    base_ns: u64,
    /// Names of the links that have an interface (pcapng), by link number.
    interfaces: Vec<u64>,
    packets: u64,
    error: Option<String>,
}

impl core::fmt::Debug for Capture {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Capture")
            .field("pcapng", &self.pcapng)
            .field("packets", &self.packets)
            .field("error", &self.error)
            .finish()
    }
}

impl Capture {
    /// Creates `path` (pcapng unless it ends in `.pcap`) and writes the
    /// file header.
    pub fn create(path: &Path) -> std::io::Result<Capture> {
        let pcapng = path.extension().and_then(|e| e.to_str()) != Some("pcap");
        let base_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut w = BufWriter::new(File::create(path)?);
        if pcapng {
            // Section header block: byte-order magic, version 1.0,
            // section length unknown.
            let mut body = Vec::new();
            body.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
            body.extend_from_slice(&1u16.to_le_bytes());
            body.extend_from_slice(&0u16.to_le_bytes());
            body.extend_from_slice(&(-1i64).to_le_bytes());
            push_opt(&mut body, 4, b"LegoIB sim fabric"); // shb_userappl
            push_opt(&mut body, 0, b"");
            write_block(&mut w, 0x0a0d_0d0a, &body)?;
        } else {
            w.write_all(&0xa1b2_c3d4u32.to_le_bytes())?;
            w.write_all(&2u16.to_le_bytes())?;
            w.write_all(&4u16.to_le_bytes())?;
            w.write_all(&0i32.to_le_bytes())?;
            w.write_all(&0u32.to_le_bytes())?;
            w.write_all(&65535u32.to_le_bytes())?;
            w.write_all(&u32::from(LINKTYPE_ERF).to_le_bytes())?;
        }
        Ok(Capture {
            out: Some(w),
            pcapng,
            base_ns,
            interfaces: Vec::new(),
            packets: 0,
            error: None,
        })
    }

    /// Packets written.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// The write error that stopped the capture, if any.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Writes buffered records to the file.
    pub fn flush(&mut self) -> Result<(), String> {
        if let Some(w) = self.out.as_mut()
            && let Err(e) = w.flush()
        {
            self.fail(e);
        }
        match &self.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: std::io::Error) {
        self.error = Some(format!("capture stopped: {e}"));
        self.out = None;
    }

    /// Whether link `link` already has its interface (pcapng), so its name
    /// is not needed again.
    pub fn knows(&self, link: u64) -> bool {
        !self.pcapng || self.interfaces.contains(&link)
    }

    /// Records one packet crossing link `link` (a number the fabric gives
    /// each cable, named `name` the first time) at fabric time `now_ns`;
    /// `ll` says what the cable carries.
    pub fn record(
        &mut self,
        link: u64,
        name: &str,
        dir: Direction,
        now_ns: u64,
        pkt: &[u8],
        ll: LinkLayer,
    ) {
        if self.out.is_none() {
            return;
        }
        let r = if self.pcapng {
            self.record_pcapng(link, name, dir, now_ns, pkt, ll)
        } else {
            self.record_pcap(dir, now_ns, pkt, ll)
        };
        match r {
            Ok(()) => self.packets += 1,
            Err(e) => self.fail(e),
        }
    }

    fn erf(ts_ns: u64, dir: Direction, pkt: &[u8], ll: LinkLayer, rec: &mut Vec<u8>) {
        let secs = ts_ns / 1_000_000_000;
        let frac = ((ts_ns % 1_000_000_000) << 32) / 1_000_000_000;
        rec.extend_from_slice(&(secs << 32 | frac).to_le_bytes());
        let (ty, lead) = match ll {
            LinkLayer::Ib => (ERF_TYPE_INFINIBAND, 0),
            // An Ethernet record: a byte of offset and one of pad first.
            LinkLayer::Eth => (ERF_TYPE_ETH, 2),
        };
        rec.push(ty);
        let iface = match dir {
            Direction::AtoB => 0,
            Direction::BtoA => 1,
        };
        rec.push(ERF_FLAG_VLEN | iface);
        let unpadded = 16 + lead + pkt.len();
        let rlen = unpadded.div_ceil(8) * 8;
        rec.extend_from_slice(&(rlen.min(0xffff) as u16).to_be_bytes());
        rec.extend_from_slice(&0u16.to_be_bytes()); // loss counter
        rec.extend_from_slice(&(pkt.len().min(0xffff) as u16).to_be_bytes()); // wlen
        rec.resize(rec.len() + lead, 0);
        rec.extend_from_slice(pkt);
        rec.resize(rec.len() + (rlen - unpadded), 0);
    }

    fn record_pcap(
        &mut self,
        dir: Direction,
        now_ns: u64,
        pkt: &[u8],
        ll: LinkLayer,
    ) -> std::io::Result<()> {
        let ts = self.base_ns.saturating_add(now_ns);
        let mut rec = Vec::with_capacity(pkt.len() + 24);
        Capture::erf(ts, dir, pkt, ll, &mut rec);
        let Some(w) = self.out.as_mut() else {
            return Ok(());
        };
        w.write_all(&((ts / 1_000_000_000) as u32).to_le_bytes())?;
        w.write_all(&((ts % 1_000_000_000 / 1000) as u32).to_le_bytes())?;
        w.write_all(&(rec.len() as u32).to_le_bytes())?;
        w.write_all(&(rec.len() as u32).to_le_bytes())?;
        w.write_all(&rec)
    }

    fn record_pcapng(
        &mut self,
        link: u64,
        name: &str,
        dir: Direction,
        now_ns: u64,
        pkt: &[u8],
        ll: LinkLayer,
    ) -> std::io::Result<()> {
        let Some(w) = self.out.as_mut() else {
            return Ok(());
        };
        let iface = match self.interfaces.iter().position(|&l| l == link) {
            Some(i) => i,
            None => {
                let mut body = Vec::new();
                let linktype = match ll {
                    LinkLayer::Ib => LINKTYPE_ERF,
                    LinkLayer::Eth => LINKTYPE_ETHERNET,
                };
                body.extend_from_slice(&linktype.to_le_bytes());
                body.extend_from_slice(&0u16.to_le_bytes());
                body.extend_from_slice(&0u32.to_le_bytes()); // no snap length
                push_opt(&mut body, 2, name.as_bytes()); // if_name
                push_opt(&mut body, 9, &[9]); // if_tsresol: nanoseconds
                if ll == LinkLayer::Eth {
                    push_opt(&mut body, 13, &[4]); // if_fcslen: the FCS is there
                }
                push_opt(&mut body, 0, b"");
                write_block(w, 1, &body)?;
                self.interfaces.push(link);
                self.interfaces.len() - 1
            }
        };
        let ts = self.base_ns.saturating_add(now_ns);
        let mut rec = Vec::with_capacity(pkt.len() + 24);
        match ll {
            LinkLayer::Ib => Capture::erf(ts, dir, pkt, ll, &mut rec),
            LinkLayer::Eth => rec.extend_from_slice(pkt),
        }
        let mut body = Vec::with_capacity(rec.len() + 40);
        body.extend_from_slice(&(iface as u32).to_le_bytes());
        body.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
        body.extend_from_slice(&(ts as u32).to_le_bytes());
        body.extend_from_slice(&(rec.len() as u32).to_le_bytes());
        body.extend_from_slice(&(rec.len() as u32).to_le_bytes());
        body.extend_from_slice(&rec);
        body.resize(body.len().div_ceil(4) * 4, 0);
        // epb_flags: direction inbound (1) or outbound (2).
        let flags: u32 = match dir {
            Direction::AtoB => 2,
            Direction::BtoA => 1,
        };
        push_opt(&mut body, 2, &flags.to_le_bytes());
        push_opt(&mut body, 0, b"");
        write_block(w, 6, &body)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Some(w) = self.out.as_mut() {
            let _ = w.flush();
        }
    }
}

fn push_opt(body: &mut Vec<u8>, code: u16, val: &[u8]) {
    let len = val.len().min(0xffff);
    body.extend_from_slice(&code.to_le_bytes());
    body.extend_from_slice(&(len as u16).to_le_bytes());
    body.extend_from_slice(&val[..len]);
    body.resize(body.len().div_ceil(4) * 4, 0);
}

fn write_block(w: &mut impl Write, kind: u32, body: &[u8]) -> std::io::Result<()> {
    let total = (12 + body.len().div_ceil(4) * 4) as u32;
    w.write_all(&kind.to_le_bytes())?;
    w.write_all(&total.to_le_bytes())?;
    w.write_all(body)?;
    w.write_all(&vec![0u8; body.len().div_ceil(4) * 4 - body.len()])?;
    w.write_all(&total.to_le_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_record_layout() {
        let mut rec = Vec::new();
        Capture::erf(
            1_500_000_000,
            Direction::BtoA,
            &[0xaa; 11],
            LinkLayer::Ib,
            &mut rec,
        );
        assert_eq!(
            &rec[0..8],
            &(1u64 << 32 | 1 << 31).to_le_bytes(),
            "1.5 s in 32.32"
        );
        assert_eq!(rec[8], 21, "ERF type InfiniBand");
        assert_eq!(rec[9], 0x05, "varying length, interface 1");
        assert_eq!(&rec[10..12], &32u16.to_be_bytes(), "rlen padded to 8");
        assert_eq!(&rec[14..16], &11u16.to_be_bytes(), "wlen");
        assert_eq!(rec.len(), 32);
    }
}
