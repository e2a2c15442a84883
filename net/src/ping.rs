//! iputils' `ping` for IPv4 (`ping/ping.c`, `ping/ping_common.c`): the same options, reply lines and summary, over a raw ICMP socket of the stack.
//!
//! Leaves out: host names (addresses only), IPv6, flood and adaptive modes,
//! preload, patterns, record route and timestamps, `-I`, `-M`, `-t`, and
//! the `pipe N` figure of the summary. Options kept: `-c COUNT`, `-s SIZE`,
//! `-i SECONDS` (fractions allowed; 0 sends as fast as replies come, at
//! least every 10 ms, as iputils does for root), `-W SECONDS` (how long to
//! wait for a reply after the last request when none came yet: 10 by
//! default) and `-w SECONDS` (a deadline for the whole run).
//!
//! A run is a state machine the caller drives: [`Ping::start`] prints the
//! `PING` line, [`Ping::step`] (after each poll of the stack) sends what is
//! due and prints each reply, [`Ping::finish`] prints the statistics. Every
//! wait ends: after the last request the run ends at the latest after twice
//! the longest round trip (or the interval, if longer) when replies came,
//! after `-W` when none did, and always at `-w`. The echo data is iputils':
//! a 16-byte send time (`struct timeval`) then the bytes 0x10, 0x11, ...;
//! the round trip is read from the reply's copy of the send time, so
//! duplicates and late replies are timed right.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use core::fmt::Write;
use core::sync::atomic::{AtomicU16, Ordering};

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{Icmpv4Packet, IpProtocol, Ipv4Address, Ipv4Packet, Ipv4Repr};

use crate::{SocketRef, Stack};

/// iputils' largest `-s` for IPv4 (65535 - 20 - 8).
pub const MAX_SIZE: usize = 65507;
/// A timestamp fits in the data from this size on (`sizeof(struct timeval)`).
const TIMEVAL: usize = 16;
/// Sequence numbers remembered for duplicate detection (iputils'
/// `MAX_DUP_CHK`).
const DUP_CHK: usize = 0x10000;
/// With `-i 0`, an unanswered request is followed by the next after this
/// long (iputils' `MININTERVAL`).
const MIN_INTERVAL_US: u64 = 10_000;

/// The usage line.
pub const USAGE: &str =
    "usage: ping [-c COUNT] [-s SIZE] [-i SECONDS] [-W SECONDS] [-w SECONDS] ADDRESS";

/// What the command line asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// `-c`: stop after this many replies (or errors); `None`: until
    /// stopped.
    pub count: Option<u64>,
    /// `-s`: data bytes per request (56).
    pub size: usize,
    /// `-i`: microseconds between requests (1 s).
    pub interval_us: u64,
    /// `-W`: microseconds to wait for a reply after the last request,
    /// when no reply came at all (10 s).
    pub linger_us: u64,
    /// `-w`: microseconds the whole run may take.
    pub deadline_us: Option<u64>,
    /// The destination.
    pub dst: Ipv4Address,
    /// The destination as typed.
    pub host: String,
}

/// Seconds with up to six decimals (`0.2`, `.5`, `3`), as microseconds.
fn seconds(s: &str) -> Option<u64> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if (whole.is_empty() && frac.is_empty())
        || frac.len() > 6
        || !whole
            .bytes()
            .chain(frac.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let w: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let f: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    w.checked_mul(1_000_000)?
        .checked_add(f * 10u64.pow(6 - frac.len() as u32))
}

fn ranged(v: &str, lo: u64, hi: u64) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        Ok(_) => Err(format!(
            "invalid argument: '{v}': out of range: {lo} <= value <= {hi}"
        )),
        Err(_) => Err(format!("invalid argument: '{v}'")),
    }
}

/// Reads ping's command line (options before the address, values attached
/// or separate: `-c3`, `-c 3`), with iputils' messages for bad values.
pub fn parse(args: &[&str]) -> Result<Options, String> {
    let mut o = Options {
        count: None,
        size: 56,
        interval_us: 1_000_000,
        linger_us: 10_000_000,
        deadline_us: None,
        dst: Ipv4Address::UNSPECIFIED,
        host: String::new(),
    };
    let mut host = None;
    let mut i = 0;
    while i < args.len() {
        let a = args[i];
        i += 1;
        let Some(flag) = a.strip_prefix('-').filter(|f| !f.is_empty()) else {
            if host.replace(a).is_some() {
                return Err(USAGE.to_string());
            }
            continue;
        };
        let (c, attached) = flag.split_at(1);
        let value = if !attached.is_empty() {
            attached
        } else if let Some(v) = args.get(i) {
            i += 1;
            v
        } else {
            return Err(format!("option requires an argument -- '{c}'\n{USAGE}"));
        };
        match c {
            "c" => o.count = Some(ranged(value, 1, i64::MAX as u64)?),
            "s" => o.size = ranged(value, 0, MAX_SIZE as u64)? as usize,
            "i" => {
                o.interval_us = seconds(value)
                    .filter(|&us| us <= 2_147_483_000_000)
                    .ok_or_else(|| format!("bad timing interval: {value}"))?
            }
            "W" => {
                o.linger_us = seconds(value)
                    .filter(|&us| us <= 2_147_483_000_000)
                    .ok_or_else(|| format!("bad linger time: {value}"))?
            }
            "w" => o.deadline_us = Some(ranged(value, 0, i32::MAX as u64)? * 1_000_000),
            _ => return Err(format!("invalid option -- '{c}'\n{USAGE}")),
        }
    }
    let host = host.ok_or("usage error: Destination address required")?;
    o.dst = host
        .parse()
        .map_err(|_| format!("{host}: Name or service not known"))?;
    o.host = host.to_string();
    Ok(o)
}

/// iputils' `%g` of the loss percentage `num / den`: six significant
/// digits, trailing zeros dropped, an exponent below 1e-4.
pub fn fmt_g(num: u128, den: u128) -> String {
    if num == 0 || den == 0 {
        return "0".to_string();
    }
    // The exponent e with 10^e <= num/den < 10^(e+1).
    let mut e: i32 = 0;
    let (mut n, mut d) = (num, den);
    while n >= d * 10 {
        d *= 10;
        e += 1;
    }
    while n < d {
        n *= 10;
        e -= 1;
    }
    // Six digits, rounded half up: n/d is in [1, 10).
    let mut digits = (n * 100_000 * 2 + d) / (2 * d);
    if digits >= 1_000_000 {
        digits /= 10;
        e += 1;
    }
    let trim = |mut s: String| {
        if s.contains('.') {
            while s.ends_with('0') {
                s.pop();
            }
            if s.ends_with('.') {
                s.pop();
            }
        }
        s
    };
    let ds = format!("{digits:06}");
    if (-4..6).contains(&e) {
        let s = if e >= 0 {
            let (int, frac) = ds.split_at(e as usize + 1);
            format!("{int}.{frac}")
        } else {
            format!("0.{}{}", "0".repeat((-e - 1) as usize), ds)
        };
        trim(s)
    } else {
        let m = trim(format!("{}.{}", &ds[..1], &ds[1..]));
        format!(
            "{m}e{}{:02}",
            if e < 0 { '-' } else { '+' },
            e.unsigned_abs()
        )
    }
}

/// The round trip of `us` microseconds as iputils prints it after `time=`:
/// three decimals under 1 ms, two under 10, one under 100, none above.
pub struct RoundTrip(pub u64);

impl core::fmt::Display for RoundTrip {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let us = self.0;
        if us >= 100_000 - 50 {
            write!(f, "{} ms", (us + 500) / 1000)
        } else if us >= 10_000 - 5 {
            write!(f, "{}.{:01} ms", (us + 50) / 1000, (us + 50) % 1000 / 100)
        } else if us >= 1000 {
            write!(f, "{}.{:02} ms", (us + 5) / 1000, (us + 5) % 1000 / 10)
        } else {
            write!(f, "{}.{:03} ms", us / 1000, us % 1000)
        }
    }
}

/// iputils' integer square root (Newton).
fn llsqrt(a: i128) -> i128 {
    let mut prev = i128::MAX;
    let mut x = a;
    if x > 0 {
        while x < prev {
            prev = x;
            x = (x + a / x) / 2;
        }
    }
    x
}

/// Where sequence number `seq` sits in the bitmap of answers.
fn rcvd_bit(seq: u16) -> (usize, u64) {
    (usize::from(seq) / 64, 1u64 << (seq % 64))
}

/// Idents of successive runs differ.
static IDENT: AtomicU16 = AtomicU16::new(0);

/// Text of an ICMP error, iputils' `pr_icmph` for the types a ping meets.
fn icmp_error(kind: u8, code: u8, info: u16) -> Option<String> {
    let s = match (kind, code) {
        (3, 0) => "Destination Net Unreachable",
        (3, 1) => "Destination Host Unreachable",
        (3, 2) => "Destination Protocol Unreachable",
        (3, 3) => "Destination Port Unreachable",
        (3, 4) => return Some(format!("Frag needed and DF set (mtu = {info})")),
        (3, 5) => "Source Route Failed",
        (3, 6) => "Destination Net Unknown",
        (3, 7) => "Destination Host Unknown",
        (3, 8) => "Source Host Isolated",
        (3, 9) => "Destination Net Prohibited",
        (3, 10) => "Destination Host Prohibited",
        (3, 11) => "Destination Net Unreachable for Type of Service",
        (3, 12) => "Destination Host Unreachable for Type of Service",
        (3, 13) => "Packet filtered",
        (3, 14) => "Precedence Violation",
        (3, 15) => "Precedence Cutoff",
        (3, c) => return Some(format!("Dest Unreachable, Bad Code: {c}")),
        (11, 0) => "Time to live exceeded",
        (11, 1) => "Frag reassembly time exceeded",
        (11, c) => return Some(format!("Time exceeded, Bad Code: {c}")),
        _ => return None,
    };
    Some(s.to_string())
}

/// One run of ping.
pub struct Ping {
    o: Options,
    sock: SocketRef,
    src: Ipv4Address,
    ident: u16,
    ip_id: u16,
    timing: bool,
    start_us: u64,
    last_send_us: u64,
    next_send_us: u64,
    exit_at_us: Option<u64>,
    ntransmitted: u64,
    nreceived: u64,
    nrepeats: u64,
    nerrors: u64,
    tmin: u64,
    tmax: u64,
    tsum: u128,
    tsum2: u128,
    /// Smoothed round trip, times 8 (iputils' `rtt`).
    rtt: u64,
    /// Sequence numbers answered, a bit each.
    rcvd: Vec<u64>,
    buf: Vec<u8>,
    done: bool,
}

impl Ping {
    /// Opens the socket on the link the route to the destination leaves
    /// by and prints the `PING` line; `Err` with iputils' message when
    /// there is no route or the request would not fit the link's MTU (no
    /// fragmentation here).
    pub fn start<C: ?Sized>(
        stack: &mut Stack<C>,
        o: Options,
        now_us: u64,
        out: &mut dyn Write,
    ) -> Result<Ping, String> {
        let e = stack
            .route_get(o.dst)
            .map_err(|_| "connect: Network is unreachable".to_string())?;
        let len = o.size + 28;
        if len > e.mtu {
            return Err(format!("local error: message too long, mtu={}", e.mtu));
        }
        let rx_bytes = (32 * len.max(576)).min(1 << 20).max(2 * len);
        let sock = stack
            .raw_icmp_open(e.link, 32, rx_bytes)
            .map_err(|err| format!("socket: {err}"))?;
        let _ = writeln!(
            out,
            "PING {} ({}) {}({}) bytes of data.",
            o.host, o.dst, o.size, len
        );
        let ident = IDENT.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9e37) ^ (now_us as u16);
        Ok(Ping {
            timing: o.size >= TIMEVAL,
            o,
            sock,
            src: e.src,
            ident,
            ip_id: ident.rotate_left(8),
            start_us: now_us,
            last_send_us: now_us,
            next_send_us: now_us,
            exit_at_us: None,
            ntransmitted: 0,
            nreceived: 0,
            nrepeats: 0,
            nerrors: 0,
            tmin: u64::MAX,
            tmax: 0,
            tsum: 0,
            tsum2: 0,
            rtt: 0,
            rcvd: vec![0; DUP_CHK / 64],
            buf: vec![0; (e.mtu + 64).max(len + 64)],
            done: false,
        })
    }

    /// Builds request `seq` in the socket's send buffer; false if the
    /// buffer is full.
    fn send<C: ?Sized>(&mut self, stack: &mut Stack<C>, now_us: u64) -> bool {
        let seq = (self.ntransmitted + 1) as u16;
        let len = self.o.size + 28;
        let Some(s) = stack.raw(self.sock) else {
            return false;
        };
        let Ok(buf) = s.send(len) else {
            return false;
        };
        let ip = Ipv4Repr {
            src_addr: self.src,
            dst_addr: self.o.dst,
            next_header: IpProtocol::Icmp,
            payload_len: self.o.size + 8,
            hop_limit: 64,
        };
        let caps = ChecksumCapabilities::default();
        let mut p = Ipv4Packet::new_unchecked(&mut buf[..]);
        ip.emit(&mut p, &caps);
        p.set_ident(self.ip_id);
        p.fill_checksum();
        self.ip_id = self.ip_id.wrapping_add(1);
        let icmp = p.payload_mut();
        // iputils' data: 0, 1, 2, ... with the send time over the first 16.
        let data = &mut icmp[8..];
        for (i, b) in data.iter_mut().enumerate() {
            *b = i as u8;
        }
        if self.timing {
            data[..8].copy_from_slice(&(now_us / 1_000_000).to_le_bytes());
            data[8..16].copy_from_slice(&(now_us % 1_000_000).to_le_bytes());
        }
        let mut ic = Icmpv4Packet::new_unchecked(icmp);
        ic.set_msg_type(smoltcp::wire::Icmpv4Message::EchoRequest);
        ic.set_msg_code(0);
        ic.set_echo_ident(self.ident);
        ic.set_echo_seq_no(seq);
        ic.fill_checksum();
        let (w, bit) = rcvd_bit(seq);
        self.rcvd[w] &= !bit;
        self.ntransmitted += 1;
        self.last_send_us = now_us;
        true
    }

    /// A reply or error in `self.buf[..n]`, printed if it is ours.
    fn received(&mut self, n: usize, now_us: u64, out: &mut dyn Write) {
        let Ok(ip) = Ipv4Packet::new_checked(&self.buf[..n]) else {
            return;
        };
        let (from, ttl) = (ip.src_addr(), ip.hop_limit());
        let Ok(icmp) = Icmpv4Packet::new_checked(ip.payload()) else {
            return;
        };
        let kind = u8::from(icmp.msg_type());
        if kind == 0 {
            if icmp.echo_ident() != self.ident {
                return;
            }
            let seq = icmp.echo_seq_no();
            let cc = ip.payload().len();
            let data = icmp.data();
            let mut trip = 0;
            if self.timing && data.len() >= TIMEVAL {
                let sec = u64::from_le_bytes(data[..8].try_into().unwrap_or([0; 8]));
                let usec = u64::from_le_bytes(data[8..16].try_into().unwrap_or([0; 8]));
                let sent = sec.saturating_mul(1_000_000).saturating_add(usec);
                trip = now_us.saturating_sub(sent);
                self.tsum += u128::from(trip);
                self.tsum2 += u128::from(trip) * u128::from(trip);
                self.tmin = self.tmin.min(trip);
                self.tmax = self.tmax.max(trip);
                self.rtt = if self.rtt == 0 {
                    trip * 8
                } else {
                    (self.rtt + trip).saturating_sub(self.rtt / 8)
                };
            }
            let (w, bit) = rcvd_bit(seq);
            let dup = self.rcvd[w] & bit != 0;
            if dup {
                self.nrepeats += 1;
            } else {
                self.rcvd[w] |= bit;
                self.nreceived += 1;
            }
            let _ = write!(out, "{cc} bytes from {from}: icmp_seq={seq} ttl={ttl}");
            if cc < self.o.size + 8 {
                let _ = writeln!(out, " (truncated)");
                return;
            }
            if self.timing {
                let _ = write!(out, " time={}", RoundTrip(trip));
            }
            if dup {
                let _ = write!(out, " (DUP!)");
            }
            if from != self.o.dst {
                let _ = write!(out, " (DIFFERENT ADDRESS!)");
            }
            let start = if self.timing { TIMEVAL } else { 0 };
            if let Some((i, &b)) = data
                .iter()
                .enumerate()
                .take(self.o.size)
                .skip(start)
                .find(|&(i, &b)| b != i as u8)
            {
                let _ = write!(
                    out,
                    "\nwrong data byte #{i} should be 0x{:x} but was 0x{b:x}",
                    i as u8
                );
            }
            let _ = writeln!(out);
            return;
        }
        // An error about one of our requests: the original IP header and
        // at least 8 bytes of its ICMP follow the 8-byte ICMP header.
        let info = ip
            .payload()
            .get(6..8)
            .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
        let Some(text) = icmp_error(kind, icmp.msg_code(), info) else {
            return;
        };
        let Ok(inner) = Ipv4Packet::new_checked(icmp.data()).or_else(|_| {
            // The quoted packet is cut short: only its header and 8 bytes.
            let d = icmp.data();
            let hl = usize::from(d.first().copied().unwrap_or(0) & 0xf) * 4;
            if hl >= 20 && d.len() >= hl + 8 {
                Ok(Ipv4Packet::new_unchecked(d))
            } else {
                Err(())
            }
        }) else {
            return;
        };
        let hl = usize::from(inner.header_len());
        let q = &icmp.data()[hl.min(icmp.data().len())..];
        if inner.next_header() != IpProtocol::Icmp
            || inner.dst_addr() != self.o.dst
            || q.len() < 8
            || q[0] != 8
            || u16::from_be_bytes([q[4], q[5]]) != self.ident
        {
            return;
        }
        let seq = u16::from_be_bytes([q[6], q[7]]);
        self.nerrors += 1;
        let _ = writeln!(out, "From {from} icmp_seq={seq} {text}");
    }

    /// Takes in what came, sends what is due; false once the run is over
    /// (then call [`finish`](Ping::finish)). Call after each poll of the
    /// stack.
    pub fn step<C: ?Sized>(
        &mut self,
        stack: &mut Stack<C>,
        now_us: u64,
        out: &mut dyn Write,
    ) -> bool {
        if self.done {
            return false;
        }
        // A packet too big for the buffer is dropped by smoltcp: go on.
        while let Some(sock) = stack.raw(self.sock) {
            match sock.recv_slice(&mut self.buf) {
                Ok(n) => self.received(n, now_us, out),
                Err(smoltcp::socket::raw::RecvError::Truncated) => {}
                Err(_) => break,
            }
        }
        let count = self.o.count;
        if count.is_some_and(|c| self.nreceived + self.nerrors >= c)
            || self
                .o
                .deadline_us
                .is_some_and(|d| now_us.saturating_sub(self.start_us) >= d)
            || (self.o.deadline_us.is_some() && self.nerrors > 0)
        {
            self.done = true;
            return false;
        }
        let more = count.is_none_or(|c| self.ntransmitted < c);
        if more && now_us >= self.next_send_us {
            let in_flight =
                self.ntransmitted - (self.nreceived + self.nerrors).min(self.ntransmitted);
            let may = self.o.interval_us > 0
                || in_flight == 0
                || now_us.saturating_sub(self.last_send_us) >= MIN_INTERVAL_US;
            if may && self.send(stack, now_us) {
                self.next_send_us = if self.o.interval_us > 0 {
                    self.next_send_us
                        .max(now_us.saturating_sub(self.o.interval_us))
                        + self.o.interval_us
                } else {
                    now_us
                };
                if count.is_some_and(|c| self.ntransmitted >= c) && self.o.deadline_us.is_none() {
                    let wait = if self.nreceived > 0 {
                        (2 * self.tmax).max(self.o.interval_us)
                    } else {
                        self.o.linger_us
                    };
                    self.exit_at_us = Some(now_us + wait);
                }
            }
        }
        if self.exit_at_us.is_some_and(|t| now_us >= t) {
            self.done = true;
            return false;
        }
        true
    }

    /// Replies so far.
    pub fn received_count(&self) -> u64 {
        self.nreceived
    }

    /// Closes the socket and prints iputils' statistics; true if the run
    /// succeeded as iputils' exit status says (a reply came, and with
    /// `-w` every one of `-c`).
    pub fn finish<C: ?Sized>(self, stack: &mut Stack<C>, out: &mut dyn Write) -> bool {
        stack.close(self.sock);
        let elapsed = self.last_send_us.saturating_sub(self.start_us);
        let _ = writeln!(out);
        let _ = writeln!(out, "--- {} ping statistics ---", self.o.host);
        let _ = write!(
            out,
            "{} packets transmitted, {} received",
            self.ntransmitted, self.nreceived
        );
        if self.nrepeats > 0 {
            let _ = write!(out, ", +{} duplicates", self.nrepeats);
        }
        if self.nerrors > 0 {
            let _ = write!(out, ", +{} errors", self.nerrors);
        }
        if self.ntransmitted > 0 {
            let lost = self.ntransmitted.saturating_sub(self.nreceived);
            let _ = write!(
                out,
                ", {}% packet loss, time {}ms",
                fmt_g(u128::from(lost) * 100, u128::from(self.ntransmitted)),
                (elapsed + 500) / 1000
            );
        }
        let _ = writeln!(out);
        let mut comma = "";
        if self.nreceived > 0 && self.timing {
            let total = i128::from(self.nreceived + self.nrepeats);
            let tsum = self.tsum as i128;
            let tsum2 = self.tsum2 as i128;
            let tmavg = tsum / total;
            let tmvar = if tsum < i128::from(i32::MAX) {
                (tsum2 - tsum * tsum / total) / total
            } else {
                tsum2 / total - tmavg * tmavg
            };
            let tmdev = llsqrt(tmvar);
            let _ = write!(
                out,
                "rtt min/avg/max/mdev = {}.{:03}/{}.{:03}/{}.{:03}/{}.{:03} ms",
                self.tmin / 1000,
                self.tmin % 1000,
                tmavg / 1000,
                tmavg % 1000,
                self.tmax / 1000,
                self.tmax % 1000,
                tmdev / 1000,
                tmdev % 1000
            );
            comma = ", ";
        }
        if self.nreceived > 0 && self.o.interval_us == 0 && self.ntransmitted > 1 {
            let ipg = elapsed / (self.ntransmitted - 1);
            let _ = write!(
                out,
                "{comma}ipg/ewma {}.{:03}/{}.{:03} ms",
                ipg / 1000,
                ipg % 1000,
                self.rtt / 8000,
                (self.rtt / 8) % 1000
            );
        }
        let _ = writeln!(out);
        self.nreceived > 0
            && !(self.o.deadline_us.is_some() && self.o.count.is_some_and(|c| self.nreceived < c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_prints_as_printf_g() {
        assert_eq!(fmt_g(0, 3), "0");
        assert_eq!(fmt_g(100, 1), "100");
        assert_eq!(fmt_g(100, 3), "33.3333");
        assert_eq!(fmt_g(200, 3), "66.6667");
        assert_eq!(fmt_g(100, 4), "25");
        assert_eq!(fmt_g(100, 7), "14.2857");
        assert_eq!(fmt_g(100, 1000), "0.1");
        assert_eq!(fmt_g(100, 1_000_000), "0.0001");
        assert_eq!(fmt_g(100, 3_000_000), "3.33333e-05");
        assert_eq!(fmt_g(100, 10_000_000), "1e-05");
        assert_eq!(fmt_g(9_999_995, 100_000), "100");
    }

    #[test]
    fn round_trips_print_with_iputils_precision() {
        assert_eq!(RoundTrip(0).to_string(), "0.000 ms");
        assert_eq!(RoundTrip(123).to_string(), "0.123 ms");
        assert_eq!(RoundTrip(999).to_string(), "0.999 ms");
        assert_eq!(RoundTrip(1000).to_string(), "1.00 ms");
        assert_eq!(RoundTrip(1234).to_string(), "1.23 ms");
        assert_eq!(RoundTrip(9994).to_string(), "9.99 ms");
        assert_eq!(RoundTrip(9995).to_string(), "10.0 ms");
        assert_eq!(RoundTrip(12_345).to_string(), "12.3 ms");
        assert_eq!(RoundTrip(99_950).to_string(), "100 ms");
        assert_eq!(RoundTrip(123_456).to_string(), "123 ms");
    }

    #[test]
    fn options_parse_as_iputils_and_refuse_as_iputils() {
        let o = parse(&[
            "-c", "3", "-s100", "-i", "0.2", "-W", "1", "-w", "5", "10.0.0.2",
        ])
        .unwrap();
        assert_eq!(o.count, Some(3));
        assert_eq!(o.size, 100);
        assert_eq!(o.interval_us, 200_000);
        assert_eq!(o.linger_us, 1_000_000);
        assert_eq!(o.deadline_us, Some(5_000_000));
        assert_eq!(o.dst, Ipv4Address::new(10, 0, 0, 2));
        assert_eq!(
            parse(&["-i", ".5", "1.2.3.4"]).unwrap().interval_us,
            500_000
        );
        assert_eq!(
            parse(&["-c", "0", "1.2.3.4"]).unwrap_err(),
            "invalid argument: '0': out of range: 1 <= value <= 9223372036854775807"
        );
        assert_eq!(
            parse(&["-s", "70000", "1.2.3.4"]).unwrap_err(),
            "invalid argument: '70000': out of range: 0 <= value <= 65507"
        );
        assert_eq!(
            parse(&["-i", "x", "1.2.3.4"]).unwrap_err(),
            "bad timing interval: x"
        );
        assert_eq!(
            parse(&["-W", "-1", "1.2.3.4"]).unwrap_err(),
            "bad linger time: -1"
        );
        assert_eq!(
            parse(&[]).unwrap_err(),
            "usage error: Destination address required"
        );
        assert_eq!(
            parse(&["nowhere"]).unwrap_err(),
            "nowhere: Name or service not known"
        );
        assert!(
            parse(&["-c"])
                .unwrap_err()
                .starts_with("option requires an argument -- 'c'")
        );
        assert!(
            parse(&["-x", "1", "1.2.3.4"])
                .unwrap_err()
                .starts_with("invalid option -- 'x'")
        );
    }

    #[test]
    fn mdev_is_the_integer_square_root() {
        assert_eq!(llsqrt(0), 0);
        // As iputils: Newton stops when it no longer falls, one above here.
        assert_eq!(llsqrt(15), 4);
        assert_eq!(llsqrt(16), 4);
        assert_eq!(llsqrt(1_000_000), 1000);
    }
}
