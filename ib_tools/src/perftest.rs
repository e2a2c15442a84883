//! perftest's options and output, computed as perftest computes them.
//!
//! perftest (linux-rdma/perftest, `perftest_parameters.c`): the options, the dashed
//! header block, the address lines and the result lines of
//! `ib_{write,read,send}_{bw,lat}` and `ib_atomic_lat`, computed as perftest
//! computes them (its TCP exchange, also carried over rdma_cm with `-R`, is in [`communication`]); multi-QP, dual-port, bidirectional,
//! rate limiting, events, JSON and CPU-utilisation output are left out.
//!
//! The figures follow perftest:
//! * bandwidth: bytes moved over the time from the first post to the last
//!   completion, in MB/sec with MB = 2^20 bytes (perftest's `MBS` format
//!   factor 0x100000; newer releases label the same figure `MiB/sec`);
//!   message rate in Mpps (10^6 messages per second); the peak is the best
//!   per-message time over every window from a post to a later signalled
//!   completion;
//! * latency: the samples are sorted, the two largest dropped
//!   (`LAT_MEASURE_TAIL`), `t_typical` is perftest's median, the 99% and
//!   99.9% percentiles are the samples at `ceil(n * 0.99)` and
//!   `ceil(n * 0.999)`, and `t_max` is the sample just past the kept ones,
//!   as perftest indexes it. Round-trip tools (write, send) halve the time;
//!   read and atomic do not.
//!
//! One deliberate difference: perftest computes `t_stdev` through `int`
//! temporaries (every deviation below 1 usec counts as 0); we compute it in
//! floating point, so our `t_stdev` is the true standard deviation.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::{self, Write};

use crate::cfmt::{self, AltHex};

pub mod communication;
pub mod exchange;
mod path;
pub mod run;

/// perftest's `RESULT_LINE`.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";
/// perftest's `RESULT_FMT` (the MB/sec spelling of perftest before 2024).
pub const RESULT_FMT: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
/// perftest's `RESULT_FMT_LAT`.
pub const RESULT_FMT_LAT: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";
/// perftest's `RESULT_FMT_LAT_DUR` (latency with `-D`).
pub const RESULT_FMT_LAT_DUR: &str = " #bytes        #iterations       t_avg[usec]    tps average";

/// Largest message (perftest's `MAX_SIZE`, the top of `-a`).
pub const MAX_SIZE: u64 = 8_388_608;
/// Fewest iterations perftest accepts (`MIN_ITER`).
pub const MIN_ITER: u64 = 5;
/// Most iterations we accept (perftest allows 2^32; the timestamps of a
/// run are kept, 16 bytes each, so we stop at 2^20).
pub const MAX_ITER: u64 = 1 << 20;
/// Samples dropped from the top of a latency run (`LAT_MEASURE_TAIL`).
pub const LAT_MEASURE_TAIL: usize = 2;
/// 2^20: perftest's MB.
const MB: f64 = 1_048_576.0;

/// What the test moves (perftest's `verb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// SEND/RECV.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// Atomic fetch-and-add or compare-and-swap.
    Atomic,
}

impl Verb {
    /// perftest's `testsStr`.
    pub fn test_str(self) -> &'static str {
        match self {
            Verb::Send => "Send",
            Verb::Write => "RDMA_Write",
            Verb::Read => "RDMA_Read",
            Verb::Atomic => "Atomic",
        }
    }

    /// Whether a latency sample is a round trip that perftest halves
    /// (`rtt_factor` 2 for write and send ping-pong, 1 for read and atomic).
    pub fn rtt_factor(self) -> u32 {
        match self {
            Verb::Send | Verb::Write => 2,
            Verb::Read | Verb::Atomic => 1,
        }
    }
}

/// Bandwidth or latency (perftest's `tst`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestKind {
    /// Streaming, `*_bw`.
    Bw,
    /// Ping-pong or one outstanding operation, `*_lat`.
    Lat,
}

/// Which atomic (`-A`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicType {
    /// `CMP_AND_SWAP`.
    CmpAndSwap,
    /// `FETCH_AND_ADD` (perftest's default).
    FetchAndAdd,
}

impl AtomicType {
    /// perftest's `atomicTypesStr`.
    pub fn as_str(self) -> &'static str {
        match self {
            AtomicType::CmpAndSwap => "CMP_AND_SWAP",
            AtomicType::FetchAndAdd => "FETCH_AND_ADD",
        }
    }
}

/// One of the tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tool {
    /// What it moves.
    pub verb: Verb,
    /// Bandwidth or latency.
    pub kind: TestKind,
}

/// Every tool, by its command name.
pub const TOOLS: [(&str, Tool); 7] = [
    (
        "ib_write_bw",
        Tool {
            verb: Verb::Write,
            kind: TestKind::Bw,
        },
    ),
    (
        "ib_write_lat",
        Tool {
            verb: Verb::Write,
            kind: TestKind::Lat,
        },
    ),
    (
        "ib_read_bw",
        Tool {
            verb: Verb::Read,
            kind: TestKind::Bw,
        },
    ),
    (
        "ib_read_lat",
        Tool {
            verb: Verb::Read,
            kind: TestKind::Lat,
        },
    ),
    (
        "ib_send_bw",
        Tool {
            verb: Verb::Send,
            kind: TestKind::Bw,
        },
    ),
    (
        "ib_send_lat",
        Tool {
            verb: Verb::Send,
            kind: TestKind::Lat,
        },
    ),
    (
        "ib_atomic_lat",
        Tool {
            verb: Verb::Atomic,
            kind: TestKind::Lat,
        },
    ),
];

impl Tool {
    /// The tool of a command name (`ib_write_bw`, ...).
    pub fn from_name(name: &str) -> Option<Tool> {
        TOOLS.iter().find(|(n, _)| *n == name).map(|&(_, t)| t)
    }

    /// Its command name.
    pub fn name(self) -> &'static str {
        TOOLS
            .iter()
            .find(|(_, t)| *t == self)
            .map_or("ib_atomic_bw", |&(n, _)| n)
    }
}

/// Whom the client connects to: the server's LID, its port GUID, or its
/// GID (RoCE: an Ethernet port has no LID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A unicast LID.
    Lid(u16),
    /// A port GUID (the tool resolves it through the SA).
    Guid(u64),
    /// A GID (`fe80::202:c9ff:fe00:1001`, or show_gids' eight groups).
    Gid([u8; 16]),
    /// An IPv4 address: perftest's TCP exchange (port 18515), or the
    /// RDMA CM with `-R`.
    Ip(core::net::Ipv4Addr),
}

/// Parses an IPv6-style GID: eight groups of up to four hex digits, with
/// at most one `::` standing for the zero groups it leaves out.
pub fn parse_gid(s: &str) -> Option<[u8; 16]> {
    fn groups(part: &str) -> Option<Vec<u16>> {
        if part.is_empty() {
            return Some(Vec::new());
        }
        part.split(':')
            .map(|g| {
                (!g.is_empty() && g.len() <= 4)
                    .then(|| u16::from_str_radix(g, 16).ok())
                    .flatten()
            })
            .collect()
    }
    let words: Vec<u16> = match s.split_once("::") {
        Some((head, tail)) => {
            if tail.contains("::") {
                return None;
            }
            let (h, t) = (groups(head)?, groups(tail)?);
            if h.len() + t.len() > 7 {
                return None;
            }
            let mut w = h;
            w.resize(8 - t.len(), 0);
            w.extend(t);
            w
        }
        None => groups(s)?,
    };
    if words.len() != 8 {
        return None;
    }
    let mut g = [0u8; 16];
    for (i, w) in words.iter().enumerate() {
        g[2 * i..2 * i + 2].copy_from_slice(&w.to_be_bytes());
    }
    Some(g)
}

impl Peer {
    /// Parses `5`, `0x5` (a LID: at most 0xBFFF), `0x0002c903000a1b2c` (a
    /// GUID: more than 16 bits), `0002:c903:000a:1b2c` (a GUID in
    /// ibstat's colon form), `fe80::202:c9ff:fe00:1001` (a GID) or
    /// `10.0.0.2` (an IPv4 address).
    pub fn parse(s: &str) -> Result<Peer, ParseError> {
        let bad = || ParseError::BadPeer(String::from(s));
        if s.contains("::") || s.split(':').count() == 8 {
            return parse_gid(s).map(Peer::Gid).ok_or_else(bad);
        }
        if let Ok(ip) = s.parse::<core::net::Ipv4Addr>() {
            return Ok(Peer::Ip(ip));
        }
        if s.contains(':') {
            let groups: Vec<&str> = s.split(':').collect();
            if groups.len() != 4 || groups.iter().any(|g| g.is_empty() || g.len() > 4) {
                return Err(bad());
            }
            let mut guid = 0u64;
            for g in groups {
                guid = (guid << 16) | u64::from(u16::from_str_radix(g, 16).map_err(|_| bad())?);
            }
            return Ok(Peer::Guid(guid));
        }
        let v = parse_u64(s).ok_or_else(bad)?;
        if v > 0xffff {
            return Ok(Peer::Guid(v));
        }
        if v == 0 || v > 0xbfff {
            return Err(ParseError::NotUnicastLid(v as u16));
        }
        Ok(Peer::Lid(v as u16))
    }
}

/// A number in decimal or `0x` hex (`strtol(.., 0)` without octal).
fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) if !h.is_empty() => u64::from_str_radix(h, 16).ok(),
        Some(_) => None,
        None => s.parse().ok(),
    }
}

/// Why the options were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// `-h`/`--help`: print the usage, nothing wrong.
    Help,
    /// An option we do not know.
    UnknownOption(String),
    /// An option without its value.
    MissingValue(&'static str),
    /// A value out of range or not a number.
    BadValue {
        /// The option.
        opt: &'static str,
        /// What was given.
        given: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// Options that exclude each other.
    Conflict(&'static str),
    /// A peer that is neither a LID nor a GUID.
    BadPeer(String),
    /// LID 0 or a multicast/permissive LID.
    NotUnicastLid(u16),
    /// More than one peer.
    ExtraArgument(String),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Help => write!(f, "help requested"),
            ParseError::UnknownOption(o) => write!(f, "unknown option '{o}'"),
            ParseError::MissingValue(o) => write!(f, "option '{o}' needs a value"),
            ParseError::BadValue {
                opt,
                given,
                allowed,
            } => {
                write!(f, "bad value '{given}' for {opt} ({allowed})")
            }
            ParseError::Conflict(w) => write!(f, "{w}"),
            ParseError::BadPeer(p) => write!(
                f,
                "'{p}' is neither a LID (1 to 0xBFFF), a port GUID (0x... or xxxx:xxxx:xxxx:xxxx), a GID (fe80::...) nor an IPv4 address"
            ),
            ParseError::NotUnicastLid(l) => {
                write!(f, "LID {l:#x} is not a unicast LID (1 to 0xBFFF)")
            }
            ParseError::ExtraArgument(a) => {
                write!(f, "unexpected argument '{a}' (one peer at most)")
            }
        }
    }
}

/// The options of one run (perftest's `perftest_parameters`, the part we
/// implement).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// Which tool.
    pub tool: Tool,
    /// Message size in bytes (`-s`).
    pub size: u64,
    /// `-a`: every size from 2 to 2^23.
    pub all_sizes: bool,
    /// Iterations (`-n`).
    pub iters: u64,
    /// `-D SECONDS`: run for a time instead of a count.
    pub duration: Option<u32>,
    /// `--check`: verify every byte moved (ours; perftest has no such option).
    pub check: bool,
    /// The server's LID or GUID; `None` makes this the server.
    pub peer: Option<Peer>,
    /// `-d`: the device (default: the first).
    pub ib_dev: Option<String>,
    /// `-g`/`-x GIDX`: the source GID index (RoCE; default 0).
    pub gid_index: Option<u8>,
    /// `-i`: the port (default 1).
    pub ib_port: u8,
    /// `-t`: send queue depth.
    pub tx_depth: u32,
    /// `-r`: receive queue depth.
    pub rx_depth: u32,
    /// `-Q`: one signalled completion every this many sends (bandwidth).
    pub cq_mod: u32,
    /// `-A`: which atomic.
    pub atomic_type: AtomicType,
    /// `-I`: inline size (0: none).
    pub inline_size: u32,
    /// `-o`: outstanding reads/atomics.
    pub out_reads: u32,
    /// `-R`: meet the peer through the RDMA CM (by IPv4 address).
    pub rdma_cm: bool,
    /// `-p`: the TCP (or RDMA CM) port (perftest's 18515).
    pub port: u16,
    /// Not an option: the peer came by perftest's TCP exchange (the header
    /// says `Ethernet`, as perftest's does).
    pub socket: bool,
}

/// The usage text of a tool.
pub fn usage(tool: Tool) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "usage: {0} [OPTIONS]            start a server and wait for a client\n       {0} [OPTIONS] PEER       connect to the server at PEER: a LID, port GUID or GID (our IB CM exchange),\n\
         \x20                                 or an IPv4 address (perftest's TCP exchange on port 18515; -R: rdma_cm)\n\
         \x20 -s, --size=SIZE        message size (K and M suffixes; default {1})\n\
         \x20 -n, --iters=ITERS      iterations (at least {2}; default {3})\n\
         \x20 -a, --all              every size from 2 to 2^23\n\
         \x20 -D, --duration=SECONDS run for SECONDS instead of ITERS\n\
         \x20 -d, --ib-dev=DEV       device (default: the first)\n\
         \x20 -i, --ib-port=PORT     port (default 1)\n\
         \x20 -g, -x, --gid-index=N  source GID index (RoCE; default 0)\n\
         \x20 -t, --tx-depth=N       send queue depth\n\
         \x20 -r, --rx-depth=N       receive queue depth\n\
         \x20 -Q, --cq-mod=N         signal one send completion in N (bandwidth)\n\
         \x20 -I, --inline_size=N    inline up to N bytes\n\
         \x20 -o, --outs=N           outstanding reads/atomics\n\
         \x20 -A, --atomic_type=T    CMP_AND_SWAP or FETCH_AND_ADD\n\
         \x20     --check            verify every byte moved\n\
         \x20 -R, --rdma_cm          meet the peer through the RDMA CM (IPv4 peers)\n\
         \x20 -p, --port=PORT        TCP / RDMA CM port (default 18515)\n\
         \x20 Ctrl-C interrupts any wait.",
        tool.name(),
        Params::default_size(tool),
        MIN_ITER,
        Params::default_iters(tool),
    );
    s
}

impl Params {
    fn default_size(tool: Tool) -> u64 {
        match (tool.verb, tool.kind) {
            (Verb::Atomic, _) => 8,
            (_, TestKind::Bw) => 65536,
            (_, TestKind::Lat) => 2,
        }
    }

    fn default_iters(tool: Tool) -> u64 {
        if tool.verb == Verb::Write && tool.kind == TestKind::Bw {
            5000
        } else {
            1000
        }
    }

    /// The defaults of a tool, as perftest sets them.
    pub fn defaults(tool: Tool) -> Params {
        let bw = tool.kind == TestKind::Bw;
        Params {
            tool,
            size: Self::default_size(tool),
            all_sizes: false,
            iters: Self::default_iters(tool),
            duration: None,
            check: false,
            peer: None,
            ib_dev: None,
            gid_index: None,
            ib_port: 1,
            tx_depth: if bw { 128 } else { 1 },
            rx_depth: if tool.verb == Verb::Send { 512 } else { 1 },
            cq_mod: 100,
            atomic_type: AtomicType::FetchAndAdd,
            inline_size: 0,
            out_reads: if matches!(tool.verb, Verb::Read | Verb::Atomic) {
                16
            } else {
                1
            },
            rdma_cm: false,
            port: communication::DEF_PORT,
            socket: false,
        }
    }

    /// Parses the arguments after the command name.
    pub fn parse(tool: Tool, args: &[&str]) -> Result<Params, ParseError> {
        let mut p = Params::defaults(tool);
        let mut size_given = false;
        let mut iters_given = false;
        let mut i = 0;
        while i < args.len() {
            let a = args[i];
            i += 1;
            if !a.starts_with('-') || a == "-" {
                if p.peer.is_some() {
                    return Err(ParseError::ExtraArgument(String::from(a)));
                }
                p.peer = Some(Peer::parse(a)?);
                continue;
            }
            // `--name=value`, `--name value`, `-x value`, `-xvalue`.
            let (key, inline_val): (&str, Option<&str>) = if let Some(long) = a.strip_prefix("--") {
                match long.split_once('=') {
                    Some((k, v)) => (k, Some(v)),
                    None => (long, None),
                }
            } else if a.len() > 2 {
                match (a.get(1..2), a.get(2..)) {
                    (Some(k), Some(v)) => (k, Some(v)),
                    _ => return Err(ParseError::UnknownOption(String::from(a))),
                }
            } else {
                (&a[1..], None)
            };
            let opt: &'static str = match key {
                "h" | "help" => return Err(ParseError::Help),
                "a" | "all" => {
                    p.all_sizes = true;
                    continue;
                }
                "check" => {
                    p.check = true;
                    continue;
                }
                "R" | "rdma_cm" => {
                    p.rdma_cm = true;
                    continue;
                }
                "p" | "port" => "-p",
                "s" | "size" => "-s",
                "n" | "iters" => "-n",
                "D" | "duration" => "-D",
                "d" | "ib-dev" => "-d",
                "i" | "ib-port" => "-i",
                "g" | "x" | "gid-index" => "-g",
                "t" | "tx-depth" => "-t",
                "r" | "rx-depth" => "-r",
                "Q" | "cq-mod" => "-Q",
                "A" | "atomic_type" => "-A",
                "I" | "inline_size" => "-I",
                "o" | "outs" => "-o",
                _ => return Err(ParseError::UnknownOption(String::from(a))),
            };
            let val = match inline_val {
                Some(v) => v,
                None => {
                    let v = args.get(i).ok_or(ParseError::MissingValue(opt))?;
                    i += 1;
                    v
                }
            };
            let bad = |allowed: &'static str| ParseError::BadValue {
                opt,
                given: String::from(val),
                allowed,
            };
            let num = |lo: u64, hi: u64, allowed: &'static str| {
                parse_u64(val)
                    .filter(|v| (lo..=hi).contains(v))
                    .ok_or_else(|| bad(allowed))
            };
            match opt {
                "-s" => {
                    let (digits, factor) = match val.as_bytes().last() {
                        Some(b'K') => (&val[..val.len() - 1], 1024),
                        Some(b'M') => (&val[..val.len() - 1], 1024 * 1024),
                        _ => (val, 1),
                    };
                    p.size = parse_u64(digits)
                        .and_then(|v| v.checked_mul(factor))
                        .filter(|v| (1..=MAX_SIZE).contains(v))
                        .ok_or_else(|| bad("1 to 8388608 bytes"))?;
                    size_given = true;
                }
                "-n" => {
                    p.iters = num(MIN_ITER, MAX_ITER, "5 to 1048576")?;
                    iters_given = true;
                }
                "-D" => p.duration = Some(num(1, 3600, "1 to 3600 seconds")? as u32),
                "-d" => p.ib_dev = Some(String::from(val)),
                "-i" => p.ib_port = num(1, 2, "1 or 2")? as u8,
                "-g" => p.gid_index = Some(num(0, 127, "0 to 127")? as u8),
                "-t" => p.tx_depth = num(1, 8192, "1 to 8192")? as u32,
                "-r" => p.rx_depth = num(1, 8192, "1 to 8192")? as u32,
                "-Q" => p.cq_mod = num(1, 1024, "1 to 1024")? as u32,
                "-I" => p.inline_size = num(0, 912, "0 to 912 bytes")? as u32,
                "-o" => p.out_reads = num(1, 16, "1 to 16")? as u32,
                "-p" => p.port = num(1, 65535, "1 to 65535")? as u16,
                "-A" => {
                    p.atomic_type = match val {
                        "CMP_AND_SWAP" => AtomicType::CmpAndSwap,
                        "FETCH_AND_ADD" => AtomicType::FetchAndAdd,
                        _ => return Err(bad("CMP_AND_SWAP or FETCH_AND_ADD")),
                    }
                }
                _ => return Err(ParseError::UnknownOption(String::from(a))),
            }
        }
        if p.all_sizes && size_given {
            return Err(ParseError::Conflict(
                "-a runs every size: do not give -s as well",
            ));
        }
        if p.duration.is_some() && iters_given {
            return Err(ParseError::Conflict(
                "-D runs for a time: do not give -n as well",
            ));
        }
        if p.duration.is_some() && p.all_sizes {
            return Err(ParseError::Conflict(
                "-D and -a do not go together (as in perftest)",
            ));
        }
        if p.tool.verb == Verb::Atomic && (size_given || p.all_sizes) && p.size != 8 {
            return Err(ParseError::Conflict("atomics move 8 bytes: -s must be 8"));
        }
        if p.tool.verb == Verb::Atomic && p.all_sizes {
            return Err(ParseError::Conflict(
                "atomics move 8 bytes: -a does not apply",
            ));
        }
        if p.tool.kind == TestKind::Bw {
            // perftest: CQ moderation never exceeds the send queue depth.
            p.cq_mod = p.cq_mod.min(p.tx_depth);
        }
        Ok(p)
    }

    /// Whether this side is the server (no peer given).
    pub fn is_server(&self) -> bool {
        self.peer.is_none()
    }

    /// The message sizes of the run: `-s` alone, or 2, 4, ... 2^23 with `-a`.
    pub fn sizes(&self) -> impl Iterator<Item = u64> + '_ {
        let (lo, hi) = if self.all_sizes {
            (1u32, 23u32)
        } else {
            (0, 0)
        };
        (lo..=hi).map(move |i| if self.all_sizes { 1u64 << i } else { self.size })
    }

    /// The largest size of the run (what the buffers must hold).
    pub fn max_size(&self) -> u64 {
        if self.all_sizes { MAX_SIZE } else { self.size }
    }
}

/// What the header block says about the link (from `ibv_query_port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    /// The device name (`mlx4_0`).
    pub ib_dev: String,
    /// The active MTU in bytes.
    pub mtu: u32,
    /// `IB` or `Ethernet`.
    pub link_type: &'static str,
}

/// perftest's `ctx_print_test_info`: the dashed block that opens a run.
pub fn print_test_info(out: &mut dyn Write, p: &Params, link: &LinkInfo) -> fmt::Result {
    writeln!(out, "{RESULT_LINE}")?;
    write!(out, "                    {} ", p.tool.verb.test_str())?;
    if p.tool.verb == Verb::Atomic {
        write!(out, "{} ", p.atomic_type.as_str())?;
    }
    match p.tool.kind {
        TestKind::Bw => write!(out, "BW ")?,
        TestKind::Lat => write!(out, "Latency ")?,
    }
    writeln!(out, "Test")?;
    writeln!(
        out,
        " Dual-port       : OFF\t\tDevice         : {}",
        link.ib_dev
    )?;
    writeln!(out, " Number of qps   : 1\t\tTransport type : IB")?;
    writeln!(out, " Connection type : RC\t\tUsing SRQ      : OFF")?;
    if !p.is_server() {
        writeln!(out, " TX depth        : {}", p.tx_depth)?;
    }
    if p.tool.verb == Verb::Send && p.is_server() {
        writeln!(out, " RX depth        : {}", p.rx_depth)?;
    }
    if p.tool.kind == TestKind::Bw {
        writeln!(out, " CQ Moderation   : {}", p.cq_mod)?;
    }
    writeln!(out, " Mtu             : {}[B]", link.mtu)?;
    writeln!(out, " Link type       : {}", link.link_type)?;
    if let Some(g) = p.gid_index.or((link.link_type == "Ethernet").then_some(0)) {
        writeln!(out, " GID index       : {g}")?;
    }
    if matches!(p.tool.verb, Verb::Read | Verb::Atomic) {
        writeln!(out, " Outstand reads  : {}", p.out_reads)?;
    } else {
        writeln!(out, " Max inline data : {}[B]", p.inline_size)?;
    }
    let (cm_qps, method) = if p.rdma_cm {
        ("ON", "rdma_cm")
    } else if p.socket {
        ("OFF", "Ethernet")
    } else {
        ("OFF", "IB CM")
    };
    writeln!(out, " rdma_cm QPs\t : {cm_qps}")?;
    writeln!(out, " Data ex. method : {method}")?;
    if p.check {
        writeln!(out, " Data check      : ON")?;
    }
    writeln!(out, "{RESULT_LINE}")
}

/// One side of the connection as perftest prints it (`pingpong_dest`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dest {
    /// The port's LID.
    pub lid: u16,
    /// The QP number.
    pub qpn: u32,
    /// The starting PSN.
    pub psn: u32,
    /// The rkey of the buffer (write, read, atomic).
    pub rkey: u32,
    /// Its address.
    pub vaddr: u64,
    /// Outstanding reads (read).
    pub out_reads: u32,
}

/// The GID line perftest prints after an address on RoCE: the sixteen
/// bytes in decimal, two digits each (`PERF_GID_FMT`).
pub fn print_gid(out: &mut dyn Write, gid: &[u8; 16]) -> fmt::Result {
    write!(out, " GID: ")?;
    for (i, b) in gid.iter().enumerate() {
        if i > 0 {
            write!(out, ":")?;
        }
        write!(out, "{b:02}")?;
    }
    writeln!(out)
}

/// perftest's `ctx_print_pingpong_data`: ` local address: LID 0x01 QPN ...`.
pub fn print_pingpong_data(out: &mut dyn Write, remote: bool, verb: Verb, d: &Dest) -> fmt::Result {
    write!(
        out,
        " {} address: LID {} QPN {} PSN {}",
        if remote { "remote" } else { "local" },
        AltHex {
            v: d.lid.into(),
            width: 4
        },
        AltHex {
            v: d.qpn.into(),
            width: 6
        },
        AltHex {
            v: d.psn.into(),
            width: 6
        },
    )?;
    if verb == Verb::Read {
        write!(
            out,
            " OUT {}",
            AltHex {
                v: d.out_reads.into(),
                width: 4
            }
        )?;
    }
    if matches!(verb, Verb::Read | Verb::Write) {
        write!(
            out,
            " RKey {} VAddr {}",
            AltHex {
                v: d.rkey.into(),
                width: 8
            },
            AltHex {
                v: d.vaddr,
                width: 16
            }
        )?;
    }
    writeln!(out)
}

/// Prints the column header of the results (after a `RESULT_LINE`).
pub fn print_result_header(out: &mut dyn Write, p: &Params) -> fmt::Result {
    writeln!(out, "{RESULT_LINE}")?;
    match (p.tool.kind, p.duration.is_some()) {
        (TestKind::Bw, _) => writeln!(out, "{RESULT_FMT}"),
        (TestKind::Lat, false) => writeln!(out, "{RESULT_FMT_LAT}"),
        (TestKind::Lat, true) => writeln!(out, "{RESULT_FMT_LAT_DUR}"),
    }
}

/// Why figures could not be computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsError {
    /// Fewer timestamps than iterations, or too few samples.
    TooFewSamples {
        /// How many there were.
        have: usize,
        /// How many are needed.
        need: usize,
    },
    /// The run took no measurable time (a clock that does not move).
    ZeroTime,
    /// A completion stamped before its post (a clock that goes backwards).
    NonMonotonic,
}

impl fmt::Display for StatsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatsError::TooFewSamples { have, need } => {
                write!(f, "too few samples for a report ({have}, need {need})")
            }
            StatsError::ZeroTime => write!(f, "the run took no measurable time"),
            StatsError::NonMonotonic => write!(f, "a completion is stamped before its post"),
        }
    }
}

/// The figures of one bandwidth line (perftest's `bw_report_data`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Messages.
    pub iters: u64,
    /// Best window, MB/sec.
    pub bw_peak: f64,
    /// Whole run, MB/sec.
    pub bw_avg: f64,
    /// Whole run, million messages per second.
    pub msg_rate: f64,
}

/// perftest's `print_report_bw`: `posted[i]` is when message `i` was posted
/// and `completed[j]` when its completion was seen (with CQ moderation,
/// message `j` counts as complete when the signalled completion covering it
/// is seen: fill every index), in ticks of `ticks_per_sec`. The peak looks
/// at windows ending on signalled completions (every `cq_mod`-th and the
/// last), as perftest does.
pub fn bw_report(
    size: u64,
    posted: &[u64],
    completed: &[u64],
    cq_mod: u32,
    ticks_per_sec: u64,
) -> Result<BwReport, StatsError> {
    let n = posted.len();
    if n == 0 || completed.len() < n {
        return Err(StatsError::TooFewSamples {
            have: completed.len().min(n),
            need: n.max(1),
        });
    }
    let total = completed[n - 1]
        .checked_sub(posted[0])
        .ok_or(StatsError::NonMonotonic)?;
    if total == 0 {
        return Err(StatsError::ZeroTime);
    }
    let m = cq_mod.max(1) as usize;
    let mut opt_delta = total;
    for (i, &t_post) in posted.iter().enumerate() {
        let first = (i + 1).div_ceil(m) * m - 1;
        let mut j = first;
        while j < n {
            let t = completed[j].saturating_sub(t_post) / (j - i + 1) as u64;
            opt_delta = opt_delta.min(t);
            j += m;
        }
        if !n.is_multiple_of(m) {
            let j = n - 1;
            let t = completed[j].saturating_sub(t_post) / (j - i + 1) as u64;
            opt_delta = opt_delta.min(t);
        }
    }
    let tps = ticks_per_sec as f64;
    let size_f = size as f64;
    let bw_peak = if opt_delta == 0 {
        f64::INFINITY
    } else {
        size_f * tps / (opt_delta as f64 * MB)
    };
    Ok(BwReport {
        size,
        iters: n as u64,
        bw_peak,
        bw_avg: size_f * n as f64 * tps / (total as f64 * MB),
        msg_rate: n as f64 * tps / (total as f64 * 1e6),
    })
}

/// A `-D` bandwidth run: `iters` messages completed in `elapsed` ticks;
/// perftest reports no peak (0.00) for timed runs.
pub fn bw_report_duration(
    size: u64,
    iters: u64,
    elapsed: u64,
    ticks_per_sec: u64,
) -> Result<BwReport, StatsError> {
    if elapsed == 0 {
        return Err(StatsError::ZeroTime);
    }
    let tps = ticks_per_sec as f64;
    Ok(BwReport {
        size,
        iters,
        bw_peak: 0.0,
        bw_avg: size as f64 * iters as f64 * tps / (elapsed as f64 * MB),
        msg_rate: iters as f64 * tps / (elapsed as f64 * 1e6),
    })
}

/// perftest's `REPORT_FMT` line.
pub fn print_bw_line(out: &mut dyn Write, r: &BwReport) -> fmt::Result {
    writeln!(
        out,
        " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
        r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
    )
}

/// The figures of one latency line, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatReport {
    /// Message size.
    pub size: u64,
    /// Iterations run.
    pub iters: u64,
    /// Smallest sample.
    pub t_min: f64,
    /// perftest's `t_max` (the sample just above the kept ones).
    pub t_max: f64,
    /// The median.
    pub t_typical: f64,
    /// The mean of the kept samples.
    pub t_avg: f64,
    /// Their standard deviation.
    pub t_stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
}

/// perftest's `print_report_lat`: `samples` are the per-iteration times in
/// ticks of `ticks_per_sec` (sorted here), each a round trip for write and
/// send (halved) and one operation for read and atomic.
pub fn lat_report(
    size: u64,
    iters: u64,
    samples: &mut [u64],
    verb: Verb,
    ticks_per_sec: u64,
) -> Result<LatReport, StatsError> {
    let need = LAT_MEASURE_TAIL + 1;
    if samples.len() < need {
        return Err(StatsError::TooFewSamples {
            have: samples.len(),
            need,
        });
    }
    if ticks_per_sec == 0 {
        return Err(StatsError::ZeroTime);
    }
    samples.sort_unstable();
    let n = samples.len() - LAT_MEASURE_TAIL;
    let q = ticks_per_sec as f64 / 1e6 * f64::from(verb.rtt_factor());
    let us = |t: u64| t as f64 / q;
    // perftest's get_median (on the kept samples, in integer ticks).
    let median = if !(n - 1).is_multiple_of(2) {
        (samples[n / 2] + samples[n / 2 - 1]) / 2
    } else {
        samples[n / 2]
    };
    let sum: f64 = samples[..n].iter().map(|&t| us(t)).sum();
    let avg = sum / n as f64;
    let var: f64 = samples[..n]
        .iter()
        .map(|&t| {
            let d = avg - us(t);
            d * d
        })
        .sum::<f64>()
        / n as f64;
    let i99 = cfmt::ceil(n as f64 * 0.99) as usize;
    let i999 = cfmt::ceil(n as f64 * 0.999) as usize;
    Ok(LatReport {
        size,
        iters,
        t_min: us(samples[0]),
        t_max: us(samples[n]),
        t_typical: us(median),
        t_avg: avg,
        t_stdev: cfmt::sqrt(var),
        p99: us(samples[i99.min(n)]),
        p99_9: us(samples[i999.min(n)]),
    })
}

/// perftest's `REPORT_FMT_LAT` line.
pub fn print_lat_line(out: &mut dyn Write, r: &LatReport) -> fmt::Result {
    writeln!(
        out,
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        r.size, r.iters, r.t_min, r.t_max, r.t_typical, r.t_avg, r.t_stdev, r.p99, r.p99_9
    )
}

/// perftest's `REPORT_FMT_LAT_DUR` line (`-D`): mean latency and
/// transactions per second.
pub fn print_lat_duration_line(
    out: &mut dyn Write,
    size: u64,
    iters: u64,
    elapsed: u64,
    verb: Verb,
    ticks_per_sec: u64,
) -> Result<(), StatsError> {
    if elapsed == 0 || iters == 0 || ticks_per_sec == 0 {
        return Err(StatsError::ZeroTime);
    }
    let secs = elapsed as f64 / ticks_per_sec as f64;
    let lat = secs * 1e6 / f64::from(verb.rtt_factor()) / iters as f64;
    let tps = iters as f64 / secs;
    let _ = writeln!(
        out,
        " {:<7}       {}            {:<7.2}        {:<7.2}",
        size, iters, lat, tps
    );
    Ok(())
}

#[cfg(test)]
mod tests;
