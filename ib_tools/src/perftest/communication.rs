//! perftest's TCP exchange (`perftest_communication.c`), as Debian bookworm's perftest 4.5-0.17 (VERSION "6.06") speaks it.
//!
//! perftest's default way to meet its peer: a TCP connection to port 18515
//! (`DEF_PORT`) over which the two sides swap fixed-size messages, the client
//! writing first and the server reading first in every exchange
//! (`ctx_xchg_data_ethernet`, `ctx_hand_shake`):
//! 1. `exchange_versions`: 16 bytes, the version string NUL-padded ("6.06");
//!    `check_version_compatibility` refuses a peer older than 5.70;
//! 2. `check_sys_data`: the cycle buffer (page size) and the cache line size,
//!    4 bytes each, big-endian; both sides take the larger;
//! 3. `check_mtu`: the port's MTU as the `ibv_mtu` number in text, 2 bytes
//!    ("4\0" for 2048); both sides take the smaller;
//! 4. `ctx_hand_shake`: the 59-byte `pingpong_dest` text (`KEY_PRINT_FMT`,
//!    `LID:OUT_READS:QPN:PSN:RKEY:VADDR:SRQN` in hex, NUL-terminated), or,
//!    when a GID index is in use (RoCE, `-x`), the 108-byte GID form
//!    (`KEY_PRINT_FMT_GID`: `LID:OUT_READS:QPN:PSN:RKEY:VADDR:` then the
//!    sixteen GID bytes and SRQN, each in hex and followed by a colon);
//!    repeated as a barrier at the points each tool names ([`Script`]);
//! 5. `xchg_bw_reports` (write and read bandwidth): the client's figures, each
//!    8 bytes big-endian (size, iterations, peak, average, message rate),
//!    which the server prints as its result line;
//! 6. `ctx_close_connection`: one more hand shake, then "done\0" each way.
//!
//! Left out: multiple QPs, duplex runs and the per-port reports. Every read has a
//! deadline and every message is checked: a peer that says nothing, closes
//! early, sends text that is not perftest's or is older than 5.70 ends the run
//! with a sentence naming which exchange failed.

use alloc::format;
use alloc::string::String;
use core::time::Duration;

use super::{BwReport, Dest, TestKind, Tool, Verb};

/// perftest's default TCP port (`DEF_PORT`).
pub const DEF_PORT: u16 = 18515;
/// The version we announce: what perftest 4.5-0.17 announces.
pub const VERSION: &str = "6.06";
/// perftest's `MAX_VERSION`: the bytes of the version message.
pub const VERSION_LEN: usize = 16;
/// The oldest peer perftest 4.5-0.17 works with (`check_version_compatibility`).
pub const MIN_PEER_VERSION: f64 = 5.70;
/// perftest's `KEY_MSG_SIZE`: the `pingpong_dest` message without a GID.
pub const KEY_MSG_SIZE: usize = 59;
/// perftest's `KEY_MSG_SIZE_GID`: the message with the GID (RoCE, `-x`).
pub const KEY_MSG_SIZE_GID: usize = 108;
/// The page size perftest uses as its cycle buffer (`sysconf(_SC_PAGESIZE)`).
pub const CYCLE_BUFFER: u32 = 4096;
/// The cache line size perftest reads on x86 (`get_cache_line_size`).
pub const CACHE_LINE: u32 = 64;
/// How long one exchange may wait for the peer (perftest itself waits for
/// ever; we do not).
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(15);

/// A connected byte stream and the clock and loop around it: the TCP
/// socket over our IP stack in the kernel, a script in the tests.
pub trait Link {
    /// Nanoseconds of a monotonic clock.
    fn now_ns(&self) -> u64;
    /// One turn of whatever moves the bytes (the core, the IP stack);
    /// an error (interrupted, the stack is gone) ends the exchange.
    fn pump(&mut self) -> Result<(), String>;
    /// What has arrived, into `buf`: `Ok(0)` when nothing has yet; an
    /// error once the peer closed or reset the connection.
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, String>;
    /// Queues what fits of `buf`: `Ok(0)` when nothing fits yet.
    fn send(&mut self, buf: &[u8]) -> Result<usize, String>;
}

/// TCP sockets of an IP stack, as the exchange needs them (the kernel's
/// stack implements it; sockets are named by number).
pub trait Sockets {
    /// Listens on TCP `port` (on every link with an address).
    fn listen(&mut self, port: u16) -> Result<u32, String>;
    /// Starts a connection to `dst`:`port`.
    fn connect(&mut self, dst: core::net::Ipv4Addr, port: u16) -> Result<u32, String>;
    /// One pass of the stack (what it received, what it has to send).
    fn poll(&mut self, core: &mut ib_core::IbCore);
    /// Whether `s` is connected; an error once it failed or was refused.
    fn established(&mut self, s: u32) -> Result<bool, String>;
    /// What `s` received (`Ok(0)`: nothing yet); an error once the peer
    /// closed or reset it.
    fn recv(&mut self, s: u32, buf: &mut [u8]) -> Result<usize, String>;
    /// Queues what fits of `buf` on `s`.
    fn send(&mut self, s: u32, buf: &[u8]) -> Result<usize, String>;
    /// Closes `s` (cleanly, bounded) and forgets it.
    fn close(&mut self, core: &mut ib_core::IbCore, s: u32);
    /// The RDMA CM (`cma::init`) and the IP side it resolves addresses
    /// through, for `-R`; `None` (the default) where there is none.
    fn rdma_cm(&mut self) -> Option<(ib_core::ClientId, &mut dyn ib_core::addr::IpNet)> {
        None
    }
}

/// The exchange on a [`Link`]: perftest's `perftest_comm` for one side.
pub struct Comm<'a> {
    link: &'a mut dyn Link,
    /// The client writes first in every exchange; the server reads first.
    client: bool,
    /// The peer's version, once exchanged.
    pub rem_version: f64,
    /// Our GID when a GID index is in use (RoCE, `-x`): the QP address
    /// goes both ways in the GID form (perftest reads the peer's message in
    /// the form of its own GID index).
    pub gid: Option<[u8; 16]>,
    /// The peer's GID from the last GID-form message.
    pub rem_gid: [u8; 16],
    /// `-R`: the exchange runs over the RDMA CM's control connection
    /// (`rdma_write_keys`: the QP address as the binary `pingpong_dest`,
    /// no closing "done").
    pub rdma_cm: bool,
}

fn parse_hex(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

/// The text of a NUL-terminated message, up to its NUL.
fn c_text(b: &[u8]) -> &[u8] {
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    &b[..n]
}

/// The six address fields both text forms start with, each followed by ':'
/// (`lid:out_reads:qpn:psn:rkey:vaddr:`).
fn write_dest_fields(s: &mut String, d: &Dest) {
    let _ = core::fmt::Write::write_fmt(
        s,
        format_args!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            d.lid, d.out_reads, d.qpn, d.psn, d.rkey, d.vaddr
        ),
    );
}

/// `s` as an `N`-byte message: the text, cut to leave room for the NUL,
/// and NULs after it.
fn nul_terminated<const N: usize>(s: &str) -> [u8; N] {
    let mut m = [0u8; N];
    let n = s.len().min(N - 1);
    m[..n].copy_from_slice(&s.as_bytes()[..n]);
    m
}

/// perftest's `KEY_PRINT_FMT` message of `d` (59 bytes, NUL-terminated).
pub fn encode_dest(d: &Dest) -> [u8; KEY_MSG_SIZE] {
    let mut s = String::new();
    write_dest_fields(&mut s, d);
    let _ = core::fmt::Write::write_fmt(&mut s, format_args!("{:08x}", 0u32));
    nul_terminated(&s)
}

/// perftest's `KEY_PRINT_FMT_GID` message of `d` with our GID `gid`
/// (108 bytes: 107 characters and the NUL).
pub fn encode_dest_gid(d: &Dest, gid: &[u8; 16]) -> [u8; KEY_MSG_SIZE_GID] {
    let mut s = String::new();
    write_dest_fields(&mut s, d);
    for b in gid {
        let _ = core::fmt::Write::write_fmt(&mut s, format_args!("{b:02x}:"));
    }
    let _ = core::fmt::Write::write_fmt(&mut s, format_args!("{:08x}:", 0u32));
    nul_terminated(&s)
}

/// The address of the six leading fields `v` of either text form, or
/// `None` when one is wider than its field in `struct pingpong_dest`.
fn dest_of_fields(v: &[u64]) -> Option<Dest> {
    if v[0] > 0xffff || v[1] > 0xffff || v[2] > 0xff_ffff || v[3] > 0xff_ffff || v[4] > 0xffff_ffff
    {
        return None;
    }
    Some(Dest {
        lid: v[0] as u16,
        out_reads: v[1] as u32,
        qpn: v[2] as u32,
        psn: v[3] as u32,
        rkey: v[4] as u32,
        vaddr: v[5],
    })
}

/// Reads a `KEY_PRINT_FMT_GID` message as `ethernet_read_keys` does
/// (colon-separated hex: six address fields, sixteen GID bytes, SRQN),
/// each field checked against its width. A RoCE peer's LID is 0: not
/// checked.
pub fn decode_dest_gid(m: &[u8]) -> Result<(Dest, [u8; 16]), String> {
    let text = c_text(m);
    let shown = String::from_utf8_lossy(text);
    let bad = || format!("the peer's QP address (GID form) is not perftest's: <{shown}>");
    let t = core::str::from_utf8(text).map_err(|_| bad())?;
    let f: alloc::vec::Vec<&str> = t.trim_end_matches(':').split(':').collect();
    if f.len() != 6 + 16 + 1 {
        return Err(bad());
    }
    let v: Option<alloc::vec::Vec<u64>> = f.iter().map(|x| parse_hex(x)).collect();
    let v = v.ok_or_else(bad)?;
    let d = dest_of_fields(&v).ok_or_else(bad)?;
    let mut gid = [0u8; 16];
    for (g, x) in gid.iter_mut().zip(&v[6..22]) {
        *g = u8::try_from(*x).map_err(|_| bad())?;
    }
    Ok((d, gid))
}

/// The bytes of `struct pingpong_dest` on x86-64, which `-R` sends as it is
/// (`rdma_write_keys`): lid, out_reads, qpn, psn, rkey (4 bytes each,
/// big-endian), 4 bytes of padding, vaddr (8), the GID (16), srqn and
/// gid_index (4 each).
pub const DEST_BIN_SIZE: usize = 56;

/// `rdma_write_keys`' message of `d` (no GID: an IB port).
pub fn encode_dest_bin(d: &Dest) -> [u8; DEST_BIN_SIZE] {
    let mut m = [0u8; DEST_BIN_SIZE];
    let words = [u32::from(d.lid), d.out_reads, d.qpn, d.psn, d.rkey];
    for (i, w) in words.iter().enumerate() {
        m[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
    }
    m[24..32].copy_from_slice(&d.vaddr.to_be_bytes());
    m
}

/// `rdma_read_keys`: the fields perftest reads back (srqn and gid_index
/// it ignores; so do we). Every bit pattern is an address: nothing to
/// refuse here (the QP's own checks catch a wrong key or address).
pub fn decode_dest_bin(m: &[u8; DEST_BIN_SIZE]) -> Dest {
    let w = |i: usize| u32::from_be_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
    let mut v = [0u8; 8];
    v.copy_from_slice(&m[24..32]);
    Dest {
        lid: w(0) as u16,
        out_reads: w(4),
        qpn: w(8) & 0xff_ffff,
        psn: w(12) & 0xff_ffff,
        rkey: w(16),
        vaddr: u64::from_be_bytes(v),
    }
}

/// Reads a `KEY_PRINT_FMT` message as perftest's `sscanf` does (seven
/// colon-separated hex fields), checking each against its field's width.
pub fn decode_dest(m: &[u8]) -> Result<Dest, String> {
    let text = c_text(m);
    let shown = String::from_utf8_lossy(text);
    let bad = || format!("the peer's QP address is not perftest's: <{shown}>");
    let t = core::str::from_utf8(text).map_err(|_| bad())?;
    let f: alloc::vec::Vec<&str> = t.split(':').collect();
    if f.len() != 7 {
        return Err(bad());
    }
    let v: Option<alloc::vec::Vec<u64>> = f.iter().map(|x| parse_hex(x)).collect();
    let v = v.ok_or_else(bad)?;
    let d = dest_of_fields(&v).ok_or_else(bad)?;
    if d.lid == 0 || d.lid > 0xbfff {
        return Err(format!(
            "the peer's LID {:#x} is not a unicast LID (is its port up, an SM running?)",
            d.lid
        ));
    }
    Ok(d)
}

/// perftest's `atof` of a version message: the leading number, if any.
pub fn parse_version(m: &[u8]) -> Option<f64> {
    let t = c_text(m);
    let n = t
        .iter()
        .position(|c| !(c.is_ascii_digit() || *c == b'.'))
        .unwrap_or(t.len());
    core::str::from_utf8(&t[..n]).ok()?.parse().ok()
}

/// Which barriers a tool's `main` puts where (perftest 4.5-0.17, RC, one
/// QP, one direction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Script {
    /// Hand shakes before the test (the first carries the QP's address).
    pub before: u32,
    /// The bandwidth report goes from client to server after a hand shake
    /// (write and read bandwidth: the server prints the client's figures).
    pub report: bool,
    /// `ctx_close_connection` at the end (hand shake and "done").
    pub close: bool,
    /// The server closes before the test and does nothing in it (read
    /// latency).
    pub server_idle: bool,
}

impl Script {
    /// The script of `tool`; `None` for the tools whose exchange we do not
    /// follow (send latency, atomics).
    pub fn of(tool: Tool) -> Option<Script> {
        let s = |before, report, close, server_idle| {
            Some(Script {
                before,
                report,
                close,
                server_idle,
            })
        };
        match (tool.verb, tool.kind) {
            (Verb::Write | Verb::Read, TestKind::Bw) => s(3, true, true, false),
            (Verb::Send, TestKind::Bw) => s(4, false, true, false),
            (Verb::Write, TestKind::Lat) => s(4, false, false, false),
            (Verb::Read, TestKind::Lat) => s(4, false, true, true),
            _ => None,
        }
    }
}

impl<'a> Comm<'a> {
    /// One side's exchange on `link`.
    pub fn new(link: &'a mut dyn Link, client: bool) -> Comm<'a> {
        Comm {
            link,
            client,
            rem_version: 0.0,
            gid: None,
            rem_gid: [0; 16],
            rdma_cm: false,
        }
    }

    /// Reads exactly `buf.len()` bytes within `timeout`.
    pub fn read_exact(
        &mut self,
        buf: &mut [u8],
        what: &str,
        timeout: Duration,
    ) -> Result<(), String> {
        let end = self.link.now_ns().saturating_add(timeout.as_nanos() as u64);
        let mut got = 0;
        while got < buf.len() {
            let n = self.link.recv(&mut buf[got..]).map_err(|e| {
                format!(
                    "{e} after {got} of the {} bytes of {what} (is the peer the same perftest tool, run with the same options?)",
                    buf.len()
                )
            })?;
            got += n;
            if got == buf.len() {
                break;
            }
            if n == 0 {
                if self.link.now_ns() > end {
                    return Err(format!(
                        "the peer sent {got} of the {} bytes of {what} in {} s, then nothing",
                        buf.len(),
                        timeout.as_secs()
                    ));
                }
                self.link.pump()?;
            }
        }
        Ok(())
    }

    /// Writes all of `buf` within [`EXCHANGE_TIMEOUT`].
    pub fn write_all(&mut self, buf: &[u8], what: &str) -> Result<(), String> {
        let end = self
            .link
            .now_ns()
            .saturating_add(EXCHANGE_TIMEOUT.as_nanos() as u64);
        let mut put = 0;
        while put < buf.len() {
            let n = self
                .link
                .send(&buf[put..])
                .map_err(|e| format!("{e} while sending {what}"))?;
            put += n;
            if n == 0 {
                if self.link.now_ns() > end {
                    return Err(format!(
                        "the peer took none of {what} for {} s",
                        EXCHANGE_TIMEOUT.as_secs()
                    ));
                }
                self.link.pump()?;
            }
        }
        // Pushed out before the next wait.
        self.link.pump()
    }

    /// `ctx_xchg_data_ethernet`: the client writes, then reads; the server
    /// reads, then writes.
    pub fn xchg(
        &mut self,
        mine: &[u8],
        theirs: &mut [u8],
        what: &str,
        timeout: Duration,
    ) -> Result<(), String> {
        if self.client {
            self.write_all(mine, what)?;
            self.read_exact(theirs, what, timeout)
        } else {
            self.read_exact(theirs, what, timeout)?;
            self.write_all(mine, what)
        }
    }

    /// `exchange_versions` and `check_version_compatibility`.
    pub fn exchange_versions(&mut self) -> Result<f64, String> {
        let mut mine = [0u8; VERSION_LEN];
        mine[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
        let mut theirs = [0u8; VERSION_LEN];
        self.xchg(&mine, &mut theirs, "the version message", EXCHANGE_TIMEOUT)?;
        let shown = String::from_utf8_lossy(c_text(&theirs)).into_owned();
        let v = parse_version(&theirs).ok_or_else(|| {
            format!("the peer's version message is not a perftest version: <{shown}>")
        })?;
        if v < MIN_PEER_VERSION {
            return Err(format!(
                "the peer runs perftest version {shown}: we speak {VERSION}, which works with versions from 5.70 on"
            ));
        }
        self.rem_version = v;
        Ok(v)
    }

    /// `check_sys_data`: the larger cycle buffer and cache line of the two.
    pub fn check_sys_data(&mut self, cycle: u32, line: u32) -> Result<(u32, u32), String> {
        let mut b = [0u8; 4];
        self.xchg(
            &cycle.to_be_bytes(),
            &mut b,
            "the page size",
            EXCHANGE_TIMEOUT,
        )?;
        let rc = u32::from_be_bytes(b);
        self.xchg(
            &line.to_be_bytes(),
            &mut b,
            "the cache line size",
            EXCHANGE_TIMEOUT,
        )?;
        let rl = u32::from_be_bytes(b);
        // A page (4 KiB, 64 KiB) or a huge page (2 MiB, `--use_hugepages`).
        if !(64..=1 << 21).contains(&rc) || !rc.is_power_of_two() || !(1..=4096).contains(&rl) {
            return Err(format!(
                "the peer's page size {rc} or cache line size {rl} is not one perftest sends"
            ));
        }
        Ok((cycle.max(rc), line.max(rl)))
    }

    /// `check_mtu`: `mtu` is the `ibv_mtu` number (1: 256 ... 5: 4096);
    /// the smaller of the two (perftest keeps its own when the peer's is
    /// not a valid one).
    pub fn check_mtu(&mut self, mtu: u8) -> Result<u8, String> {
        let mine = [b'0' + mtu.min(9), 0];
        let mut theirs = [0u8; 2];
        self.xchg(&mine, &mut theirs, "the MTU", EXCHANGE_TIMEOUT)?;
        let t = c_text(&theirs);
        let n = t.iter().take_while(|c| c.is_ascii_digit()).count();
        let rem = core::str::from_utf8(&t[..n])
            .ok()
            .and_then(|s| s.parse::<u8>().ok());
        Ok(match rem {
            Some(r) if (1..=5).contains(&r) && r < mtu => r,
            _ => mtu,
        })
    }

    /// `ctx_hand_shake`: our address for the peer's.
    pub fn hand_shake(&mut self, my: &Dest, timeout: Duration) -> Result<Dest, String> {
        if self.rdma_cm {
            let mut m = [0u8; DEST_BIN_SIZE];
            self.xchg(
                &encode_dest_bin(my),
                &mut m,
                "the QP address message",
                timeout,
            )?;
            return Ok(decode_dest_bin(&m));
        }
        if let Some(g) = self.gid {
            let mut m = [0u8; KEY_MSG_SIZE_GID];
            let what = "the QP address message (GID form)";
            self.xchg(&encode_dest_gid(my, &g), &mut m, what, timeout)?;
            let (d, rg) = decode_dest_gid(&m)?;
            self.rem_gid = rg;
            return Ok(d);
        }
        let mut m = [0u8; KEY_MSG_SIZE];
        self.xchg(&encode_dest(my), &mut m, "the QP address message", timeout)?;
        decode_dest(&m)
    }

    /// `xchg_bw_reports` for a peer from version 5.33 on (8-byte counts).
    pub fn xchg_bw_reports(&mut self, mine: &BwReport) -> Result<BwReport, String> {
        let mut b = [0u8; 8];
        let mut one = |c: &mut Comm<'_>, v: u64, what: &str| -> Result<u64, String> {
            c.xchg(&v.to_be_bytes(), &mut b, what, EXCHANGE_TIMEOUT)?;
            Ok(u64::from_be_bytes(b))
        };
        let size = one(self, mine.size, "the report's size")?;
        let iters = one(self, mine.iters, "the report's iterations")?;
        let peak = one(self, mine.bw_peak.to_bits(), "the report's peak")?;
        let avg = one(self, mine.bw_avg.to_bits(), "the report's average")?;
        let rate = one(self, mine.msg_rate.to_bits(), "the report's message rate")?;
        Ok(BwReport {
            size,
            iters,
            bw_peak: f64::from_bits(peak),
            bw_avg: f64::from_bits(avg),
            msg_rate: f64::from_bits(rate),
        })
    }

    /// `ctx_close_connection`: a hand shake, then "done" each way (read
    /// here if it comes, not required: perftest never reads it).
    pub fn close(&mut self, my: &Dest, timeout: Duration) -> Result<(), String> {
        self.hand_shake(my, timeout)?;
        if self.rdma_cm {
            return Ok(());
        }
        self.write_all(b"done\0", "the closing \"done\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;
    use core::cell::Cell;

    /// A peer played from a script: what it sends (all at once), and
    /// whether it closes after.
    struct ScriptedPeer {
        t: Cell<u64>,
        inbound: Vec<u8>,
        pos: usize,
        closes: bool,
        sent: Vec<u8>,
    }

    impl Link for ScriptedPeer {
        fn now_ns(&self) -> u64 {
            self.t.get()
        }
        fn pump(&mut self) -> Result<(), String> {
            self.t.set(self.t.get() + 1_000_000);
            Ok(())
        }
        fn recv(&mut self, buf: &mut [u8]) -> Result<usize, String> {
            let n = buf.len().min(self.inbound.len() - self.pos).min(7);
            if n == 0 && self.closes {
                return Err(String::from("the peer closed the connection"));
            }
            buf[..n].copy_from_slice(&self.inbound[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
        fn send(&mut self, buf: &[u8]) -> Result<usize, String> {
            self.sent.extend_from_slice(buf);
            Ok(buf.len())
        }
    }

    fn peer(inbound: &[u8], closes: bool) -> ScriptedPeer {
        ScriptedPeer {
            t: Cell::new(0),
            inbound: inbound.to_vec(),
            pos: 0,
            closes,
            sent: Vec::new(),
        }
    }

    fn version(v: &str) -> Vec<u8> {
        let mut m = vec![0u8; VERSION_LEN];
        m[..v.len()].copy_from_slice(v.as_bytes());
        m
    }

    fn dest() -> Dest {
        Dest {
            lid: 3,
            out_reads: 16,
            qpn: 0x4a,
            psn: 0x123456,
            rkey: 0x8001_0203,
            vaddr: 0x7f12_3456_7000,
        }
    }

    #[test]
    fn with_rdma_cm_the_address_is_the_56_byte_struct_and_no_done_follows() {
        let d = dest();
        let m = encode_dest_bin(&d);
        assert_eq!(&m[0..4], &[0, 0, 0, 3]);
        assert_eq!(&m[4..8], &[0, 0, 0, 16]);
        assert_eq!(&m[8..12], &[0, 0, 0, 0x4a]);
        assert_eq!(&m[12..16], &[0, 0x12, 0x34, 0x56]);
        assert_eq!(&m[16..20], &[0x80, 1, 2, 3]);
        assert_eq!(&m[24..32], &0x7f12_3456_7000u64.to_be_bytes());
        assert_eq!(decode_dest_bin(&m), d);
        // A server's closing: it reads the client's address, sends its own
        // and nothing after ("done" is for the TCP way only).
        let mut link = peer(&m, false);
        let mut c = Comm::new(&mut link, false);
        c.rdma_cm = true;
        c.close(&d, EXCHANGE_TIMEOUT).unwrap();
        assert_eq!(link.sent, m.to_vec());
    }

    /// A whole server-side prefix as Linux's client sends it.
    fn linux_client_prefix() -> Vec<u8> {
        let mut m = version("6.06");
        m.extend_from_slice(&4096u32.to_be_bytes());
        m.extend_from_slice(&64u32.to_be_bytes());
        m.extend_from_slice(b"4\0");
        m.extend_from_slice(&encode_dest(&dest()));
        m
    }

    #[test]
    fn the_dest_message_is_perftests_59_bytes() {
        let m = encode_dest(&dest());
        assert_eq!(m.len(), 59);
        assert_eq!(
            &m[..58],
            b"0003:0010:00004a:123456:80010203:00007f1234567000:00000000"
        );
        assert_eq!(m[58], 0);
        assert_eq!(decode_dest(&m), Ok(dest()));
    }

    #[test]
    fn the_gid_message_is_perftests_108_bytes() {
        // perftest 4.5-0.17 on RoCE with the IPv4-mapped GID of 192.168.50.1.
        let mut gid = [0u8; 16];
        gid[10..].copy_from_slice(&[0xff, 0xff, 192, 168, 50, 1]);
        let d = Dest { lid: 0, ..dest() };
        let m = encode_dest_gid(&d, &gid);
        assert_eq!(m.len(), 108);
        assert_eq!(
            &m[..107],
            &b"0000:0010:00004a:123456:80010203:00007f1234567000:\
               00:00:00:00:00:00:00:00:00:00:ff:ff:c0:a8:32:01:00000000:"[..]
        );
        assert_eq!(m[107], 0);
        assert_eq!(decode_dest_gid(&m), Ok((d, gid)));
        // A field out of its width, or a short message, is refused.
        let mut bad = m;
        bad[51] = b'g';
        assert!(decode_dest_gid(&bad).is_err());
        assert!(decode_dest_gid(&encode_dest(&dest())).is_err());
    }

    #[test]
    fn a_server_follows_linuxs_client_through_the_prefix() {
        let mut p = peer(&linux_client_prefix(), false);
        let mut c = Comm::new(&mut p, false);
        assert_eq!(c.exchange_versions(), Ok(6.06));
        assert_eq!(c.check_sys_data(4096, 64), Ok((4096, 64)));
        assert_eq!(c.check_mtu(4), Ok(4));
        let mine = Dest { lid: 4, ..dest() };
        assert_eq!(c.hand_shake(&mine, EXCHANGE_TIMEOUT), Ok(dest()));
        // What we sent, in perftest's order and sizes.
        let s = &p.sent;
        assert_eq!(s.len(), 16 + 4 + 4 + 2 + 59);
        assert_eq!(&s[..5], b"6.06\0");
        assert_eq!(&s[16..20], &4096u32.to_be_bytes());
        assert_eq!(&s[24..26], b"4\0");
        assert_eq!(&s[26..30], b"0004");
    }

    #[test]
    fn a_too_old_peer_is_refused_by_name() {
        let mut p = peer(&version("5.60"), false);
        let e = Comm::new(&mut p, false).exchange_versions().unwrap_err();
        assert!(e.contains("version 5.60") && e.contains("5.70"), "{e}");
    }

    #[test]
    fn a_malformed_version_or_address_is_refused_with_the_text() {
        let mut p = peer(b"GET / HTTP/1.1\r\n", false);
        let e = Comm::new(&mut p, false).exchange_versions().unwrap_err();
        assert!(
            e.contains("not a perftest version") && e.contains("GET"),
            "{e}"
        );
        let mut m = linux_client_prefix();
        let at = m.len() - KEY_MSG_SIZE;
        m[at + 4] = b'-';
        let mut p = peer(&m, false);
        let mut c = Comm::new(&mut p, false);
        c.exchange_versions().unwrap();
        c.check_sys_data(4096, 64).unwrap();
        c.check_mtu(4).unwrap();
        let e = c.hand_shake(&dest(), EXCHANGE_TIMEOUT).unwrap_err();
        assert!(
            e.contains("not perftest's") && e.contains("0003-0010"),
            "{e}"
        );
    }

    #[test]
    fn a_page_size_perftest_never_sends_is_refused() {
        let mut m = Vec::new();
        m.extend_from_slice(&(1u32 << 30).to_be_bytes());
        m.extend_from_slice(&64u32.to_be_bytes());
        let mut p = peer(&m, false);
        let e = Comm::new(&mut p, false)
            .check_sys_data(4096, 64)
            .unwrap_err();
        assert!(e.contains("page size 1073741824"), "{e}");
    }

    #[test]
    fn a_truncated_exchange_names_what_was_cut() {
        let m = linux_client_prefix();
        let mut p = peer(&m[..16 + 4 + 4 + 2 + 20], true);
        let mut c = Comm::new(&mut p, false);
        c.exchange_versions().unwrap();
        c.check_sys_data(4096, 64).unwrap();
        c.check_mtu(4).unwrap();
        let e = c.hand_shake(&dest(), EXCHANGE_TIMEOUT).unwrap_err();
        assert!(
            e.contains("closed") && e.contains("after 20 of the 59 bytes of the QP address"),
            "{e}"
        );
    }

    #[test]
    fn a_silent_peer_ends_the_wait_at_the_deadline() {
        let mut p = peer(&version("6.06")[..3], false);
        let e = Comm::new(&mut p, false).exchange_versions().unwrap_err();
        assert!(
            e.contains("sent 3 of the 16 bytes of the version message in 15 s"),
            "{e}"
        );
        // Not much past the deadline on the script's clock.
        assert!(p.t.get() <= EXCHANGE_TIMEOUT.as_nanos() as u64 + 2_000_000);
    }

    #[test]
    fn bw_reports_cross_as_big_endian_words() {
        let r = BwReport {
            size: 65536,
            iters: 5000,
            bw_peak: 1234.5,
            bw_avg: 1200.25,
            msg_rate: 0.019204,
        };
        let mut inbound = Vec::new();
        for w in [
            r.size,
            r.iters,
            r.bw_peak.to_bits(),
            r.bw_avg.to_bits(),
            r.msg_rate.to_bits(),
        ] {
            inbound.extend_from_slice(&w.to_be_bytes());
        }
        let mut p = peer(&inbound, false);
        let zero = BwReport {
            size: 0,
            iters: 0,
            bw_peak: 0.0,
            bw_avg: 0.0,
            msg_rate: 0.0,
        };
        assert_eq!(Comm::new(&mut p, false).xchg_bw_reports(&zero), Ok(r));
        assert_eq!(p.sent.len(), 40);
    }

    #[test]
    fn every_supported_tool_has_a_script_and_the_rest_none() {
        let t = |n| Script::of(Tool::from_name(n).unwrap());
        assert_eq!(t("ib_write_bw").unwrap().before, 3);
        assert!(t("ib_read_lat").unwrap().server_idle);
        assert!(!t("ib_write_lat").unwrap().close);
        assert_eq!(t("ib_send_lat"), None);
        assert_eq!(t("ib_atomic_lat"), None);
    }
}
