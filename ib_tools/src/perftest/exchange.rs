//! What perftest exchanges with its peer, carried in the IB CM's private data.
//!
//! What perftest exchanges over its TCP socket (`pingpong_dest` and the parameter
//! negotiation), carried instead in the IB CM's private data (REQ: 92 bytes, REP:
//! 196), plus the data pattern `--check` verifies; GID, multicast and XRC fields
//! are left out.
//!
//! The client's REQ carries a [`Hello`] (its parameters and its buffer);
//! the server adopts the client's size, iterations and options (perftest
//! requires both sides to agree; here the server follows, and prints what it
//! got) and answers with a [`Reply`] (its buffer, or why it refuses). Every
//! field from the wire is checked: a wrong magic or version, an unknown
//! tool, a size or count out of range, a buffer too small for the run is a
//! clear [`ExchangeError`], never a panic.

use alloc::vec::Vec;
use core::fmt;

use hal::be::{get_be32, get_be64};

use super::{AtomicType, MAX_ITER, MAX_SIZE, MIN_ITER, Params, TestKind, Tool, Verb};

/// The CM service ID the tools listen on: "LEGO" and perftest's default TCP
/// port 18515 (0x4853); ours, not an IBTA-assigned one.
pub const PERFTEST_SERVICE_ID: u64 = 0x4c45_474f_0000_4853;

const MAGIC: [u8; 4] = *b"LGPT";
const VERSION: u8 = 1;
const HELLO_LEN: usize = 56;
const REPLY_LEN: usize = 32;

/// Why a peer's message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeError {
    /// Shorter than the message.
    TooShort {
        /// Bytes received.
        got: usize,
        /// Bytes needed.
        need: usize,
    },
    /// Not one of our tools (wrong magic).
    BadMagic,
    /// Another version of the exchange.
    BadVersion(u8),
    /// A tool code we do not know.
    BadTool(u8, u8),
    /// A size outside 1..=8 MiB.
    BadSize(u64),
    /// An iteration count outside 5..=2^20.
    BadIters(u64),
    /// The peer runs another tool than ours.
    ToolMismatch,
    /// The peer's buffer cannot hold the run.
    BufferTooSmall {
        /// What it offered.
        have: u64,
        /// What the run needs.
        need: u64,
    },
    /// The server refused (its reply status).
    Refused(u8),
}

impl fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExchangeError::TooShort { got, need } => {
                write!(f, "peer's parameters are {got} bytes, expected {need}")
            }
            ExchangeError::BadMagic => write!(f, "the peer is not one of our perftest tools"),
            ExchangeError::BadVersion(v) => write!(
                f,
                "the peer speaks exchange version {v}, we speak {VERSION}"
            ),
            ExchangeError::BadTool(v, k) => write!(f, "unknown tool code {v}/{k} from the peer"),
            ExchangeError::BadSize(s) => {
                write!(f, "peer asks for message size {s} (1 to {MAX_SIZE})")
            }
            ExchangeError::BadIters(n) => {
                write!(f, "peer asks for {n} iterations ({MIN_ITER} to {MAX_ITER})")
            }
            ExchangeError::ToolMismatch => {
                write!(
                    f,
                    "the peer runs another test: run the same tool on both sides"
                )
            }
            ExchangeError::BufferTooSmall { have, need } => {
                write!(f, "the peer's buffer is {have} bytes, the run needs {need}")
            }
            ExchangeError::Refused(s) => write!(f, "the server refused the run (status {s})"),
        }
    }
}

fn verb_code(v: Verb) -> u8 {
    match v {
        Verb::Send => 0,
        Verb::Write => 1,
        Verb::Read => 2,
        Verb::Atomic => 3,
    }
}

fn tool_of(v: u8, k: u8) -> Option<Tool> {
    let verb = match v {
        0 => Verb::Send,
        1 => Verb::Write,
        2 => Verb::Read,
        3 => Verb::Atomic,
        _ => return None,
    };
    let kind = match k {
        0 => TestKind::Bw,
        1 => TestKind::Lat,
        _ => return None,
    };
    Some(Tool { verb, kind })
}

/// The client's parameters and buffer (REQ private data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The tool the client runs.
    pub tool: Tool,
    /// Which atomic.
    pub atomic_type: AtomicType,
    /// `--check`.
    pub check: bool,
    /// `-a`.
    pub all_sizes: bool,
    /// `-D` seconds (0: count iterations).
    pub duration: u32,
    /// Message size (`-s`; the largest with `-a`).
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// The client's buffer address (for the server's writes/reads, if any).
    pub vaddr: u64,
    /// Its rkey.
    pub rkey: u32,
    /// Its length.
    pub len: u64,
}

impl Hello {
    /// The hello of a client run with `p`, offering its buffer.
    pub fn from_params(p: &Params, vaddr: u64, rkey: u32, len: u64) -> Hello {
        Hello {
            tool: p.tool,
            atomic_type: p.atomic_type,
            check: p.check,
            all_sizes: p.all_sizes,
            duration: p.duration.unwrap_or(0),
            size: p.max_size(),
            iters: p.iters,
            vaddr,
            rkey,
            len,
        }
    }

    /// The bytes for the REQ's private data (56 of its 92).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HELLO_LEN);
        b.extend_from_slice(&MAGIC);
        b.push(VERSION);
        b.push(verb_code(self.tool.verb));
        b.push(match self.tool.kind {
            TestKind::Bw => 0,
            TestKind::Lat => 1,
        });
        b.push(
            u8::from(self.check)
                | u8::from(self.all_sizes) << 1
                | u8::from(self.atomic_type == AtomicType::CmpAndSwap) << 2,
        );
        b.extend_from_slice(&self.duration.to_be_bytes());
        b.extend_from_slice(&self.rkey.to_be_bytes());
        b.extend_from_slice(&self.size.to_be_bytes());
        b.extend_from_slice(&self.iters.to_be_bytes());
        b.extend_from_slice(&self.vaddr.to_be_bytes());
        b.extend_from_slice(&self.len.to_be_bytes());
        b.resize(HELLO_LEN, 0);
        b
    }

    /// Reads and checks a hello from the wire.
    pub fn decode(b: &[u8]) -> Result<Hello, ExchangeError> {
        if b.len() < HELLO_LEN {
            return Err(ExchangeError::TooShort {
                got: b.len(),
                need: HELLO_LEN,
            });
        }
        if b[0..4] != MAGIC {
            return Err(ExchangeError::BadMagic);
        }
        if b[4] != VERSION {
            return Err(ExchangeError::BadVersion(b[4]));
        }
        let tool = tool_of(b[5], b[6]).ok_or(ExchangeError::BadTool(b[5], b[6]))?;
        let flags = b[7];
        let size = get_be64(b, 16);
        if !(1..=MAX_SIZE).contains(&size) {
            return Err(ExchangeError::BadSize(size));
        }
        let iters = get_be64(b, 24);
        if !(MIN_ITER..=MAX_ITER).contains(&iters) {
            return Err(ExchangeError::BadIters(iters));
        }
        Ok(Hello {
            tool,
            atomic_type: if flags & 4 != 0 {
                AtomicType::CmpAndSwap
            } else {
                AtomicType::FetchAndAdd
            },
            check: flags & 1 != 0,
            all_sizes: flags & 2 != 0,
            duration: get_be32(b, 8),
            rkey: get_be32(b, 12),
            size,
            iters,
            vaddr: get_be64(b, 32),
            len: get_be64(b, 40),
        })
    }

    /// The server's side: the hello must be for the same tool, and the
    /// client's buffer must hold what the server will put there or take
    /// from it (`need` bytes).
    pub fn accept(&self, server_tool: Tool, need: u64) -> Result<(), ExchangeError> {
        if self.tool != server_tool {
            return Err(ExchangeError::ToolMismatch);
        }
        if self.len < need {
            return Err(ExchangeError::BufferTooSmall {
                have: self.len,
                need,
            });
        }
        Ok(())
    }
}

/// The server's answer (REP private data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// 0: accepted; otherwise why not (the client prints it).
    pub status: u8,
    /// The server's buffer address.
    pub vaddr: u64,
    /// Its rkey.
    pub rkey: u32,
    /// Its length.
    pub len: u64,
}

impl Reply {
    /// The bytes for the REP's private data.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(REPLY_LEN);
        b.extend_from_slice(&MAGIC);
        b.push(VERSION);
        b.push(self.status);
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&self.rkey.to_be_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&self.vaddr.to_be_bytes());
        b.extend_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Reads and checks a reply; a refusal is an error. The server's buffer
    /// must hold `need` bytes.
    pub fn decode(b: &[u8], need: u64) -> Result<Reply, ExchangeError> {
        if b.len() < REPLY_LEN {
            return Err(ExchangeError::TooShort {
                got: b.len(),
                need: REPLY_LEN,
            });
        }
        if b[0..4] != MAGIC {
            return Err(ExchangeError::BadMagic);
        }
        if b[4] != VERSION {
            return Err(ExchangeError::BadVersion(b[4]));
        }
        if b[5] != 0 {
            return Err(ExchangeError::Refused(b[5]));
        }
        let r = Reply {
            status: 0,
            rkey: get_be32(b, 8),
            vaddr: get_be64(b, 16),
            len: get_be64(b, 24),
        };
        if r.len < need {
            return Err(ExchangeError::BufferTooSmall { have: r.len, need });
        }
        Ok(r)
    }
}

/// Byte `j` of message `seq` in the `--check` pattern: every message of a
/// run differs from its neighbours at every offset, so a stale, shifted or
/// torn message shows.
pub fn pattern_byte(seq: u64, j: usize) -> u8 {
    let x = (seq as u32).wrapping_mul(0x9e37_79b1) ^ (j as u32).wrapping_mul(0x85eb_ca6b);
    (x ^ (x >> 15)) as u8
}

/// Fills `buf` with message `seq`'s pattern.
pub fn fill(buf: &mut [u8], seq: u64) {
    for (j, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(seq, j);
    }
}

/// A byte `--check` found wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// Which message.
    pub seq: u64,
    /// Offset in it.
    pub offset: usize,
    /// What should be there.
    pub expected: u8,
    /// What is.
    pub got: u8,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "data check failed: byte {} of message {} is {:#04x}, expected {:#04x}",
            self.offset, self.seq, self.got, self.expected
        )
    }
}

/// Checks that `buf` holds message `seq`'s pattern; the first wrong byte.
pub fn verify(buf: &[u8], seq: u64) -> Result<(), Mismatch> {
    for (j, &b) in buf.iter().enumerate() {
        let e = pattern_byte(seq, j);
        if b != e {
            return Err(Mismatch {
                seq,
                offset: j,
                expected: e,
                got: b,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(line: &str, tool: &str) -> Params {
        let args: Vec<&str> = line.split_whitespace().collect();
        Params::parse(Tool::from_name(tool).unwrap(), &args).unwrap()
    }

    #[test]
    fn hello_round_trips_and_fits_a_req() {
        let p = params("-s 4096 -n 100 --check 3", "ib_write_bw");
        let h = Hello::from_params(&p, 0x7f00_1000, 0x1234_5678, 4096 * 128);
        let b = h.encode();
        assert!(b.len() <= 92, "REQ private data is 92 bytes");
        assert_eq!(Hello::decode(&b), Ok(h));
        assert!(h.check && !h.all_sizes);
        let a = params("-a", "ib_read_bw");
        let h = Hello::from_params(&a, 0, 1, MAX_SIZE);
        let d = Hello::decode(&h.encode()).unwrap();
        assert!(d.all_sizes);
        assert_eq!(d.size, MAX_SIZE);
        let c = params("-A CMP_AND_SWAP", "ib_atomic_lat");
        let d = Hello::decode(&Hello::from_params(&c, 0, 1, 8).encode()).unwrap();
        assert_eq!(d.atomic_type, AtomicType::CmpAndSwap);
    }

    #[test]
    fn bad_hellos_are_refused_with_a_reason() {
        let p = params("", "ib_send_lat");
        let good = Hello::from_params(&p, 0, 1, 64).encode();
        assert_eq!(
            Hello::decode(&good[..10]),
            Err(ExchangeError::TooShort { got: 10, need: 56 })
        );
        let mut b = good.clone();
        b[0] = b'X';
        assert_eq!(Hello::decode(&b), Err(ExchangeError::BadMagic));
        let mut b = good.clone();
        b[4] = 9;
        assert_eq!(Hello::decode(&b), Err(ExchangeError::BadVersion(9)));
        let mut b = good.clone();
        b[5] = 7;
        assert_eq!(Hello::decode(&b), Err(ExchangeError::BadTool(7, 1)));
        let mut b = good.clone();
        b[16..24].copy_from_slice(&(MAX_SIZE + 1).to_be_bytes());
        assert_eq!(Hello::decode(&b), Err(ExchangeError::BadSize(MAX_SIZE + 1)));
        let mut b = good.clone();
        b[24..32].copy_from_slice(&0u64.to_be_bytes());
        assert_eq!(Hello::decode(&b), Err(ExchangeError::BadIters(0)));
        let h = Hello::decode(&good).unwrap();
        let bw = Tool::from_name("ib_send_bw").unwrap();
        assert_eq!(h.accept(bw, 2), Err(ExchangeError::ToolMismatch));
        assert_eq!(
            h.accept(p.tool, 65),
            Err(ExchangeError::BufferTooSmall { have: 64, need: 65 })
        );
        assert_eq!(h.accept(p.tool, 64), Ok(()));
        assert!(
            ExchangeError::ToolMismatch
                .to_string()
                .contains("same tool")
        );
    }

    #[test]
    fn replies_round_trip_and_refusals_show() {
        let r = Reply {
            status: 0,
            vaddr: 0xdead_b000,
            rkey: 0x500,
            len: 1 << 20,
        };
        let b = r.encode();
        assert!(b.len() <= 196);
        assert_eq!(Reply::decode(&b, 4096), Ok(r));
        assert_eq!(
            Reply::decode(&b, 2 << 20),
            Err(ExchangeError::BufferTooSmall {
                have: 1 << 20,
                need: 2 << 20
            })
        );
        let no = Reply { status: 3, ..r }.encode();
        assert_eq!(Reply::decode(&no, 1), Err(ExchangeError::Refused(3)));
        assert_eq!(
            Reply::decode(&b[..4], 1),
            Err(ExchangeError::TooShort { got: 4, need: 32 })
        );
    }

    #[test]
    fn check_pattern_catches_stale_shifted_and_torn_data() {
        let mut m = vec![0u8; 4096];
        fill(&mut m, 17);
        assert_eq!(verify(&m, 17), Ok(()));
        // The previous message left in place.
        let e = verify(&m, 18).unwrap_err();
        assert_eq!(e.seq, 18);
        // Every offset differs between neighbouring messages.
        for j in 0..4096 {
            assert_ne!(pattern_byte(17, j), pattern_byte(18, j), "offset {j}");
        }
        // Shifted by one byte.
        let mut s = vec![0u8; 4097];
        fill(&mut s[1..], 17);
        assert!(verify(&s[..4096], 17).is_err());
        // One torn byte at the end.
        m[4095] ^= 1;
        let e = verify(&m, 17).unwrap_err();
        assert_eq!(e.offset, 4095);
        assert!(
            e.to_string()
                .starts_with("data check failed: byte 4095 of message 17")
        );
    }
}
