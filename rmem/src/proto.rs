//! The rmem RPC message.
//!
//! The rmem RPC: the 32-byte message a compute node and a memory node
//! exchange over SEND with immediate data (our own format, in the spirit of
//! LegoOS FIT's fixed RPC header); leaves out batching and multi-message
//! requests (every request and reply fits one message).
//!
//! Layout (big-endian, as on the wire):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0  | 2 | magic `0x524d` ("RM") |
//! | 2  | 1 | version ([`VERSION`]) |
//! | 3  | 1 | op ([`Op`]; a reply has bit 7 set) |
//! | 4  | 2 | status ([`Status`], replies; 0 in requests) |
//! | 6  | 2 | reserved, 0 |
//! | 8  | 4 | sequence number (echoed in the reply) |
//! | 12 | 4 | rkey (replies to HELLO/ALLOC) |
//! | 16 | 8 | address (remote virtual address in the exported region) |
//! | 24 | 8 | length in bytes |
//!
//! The immediate data of the SEND carries the sequence number again; a
//! message whose immediate and body disagree, or that came without
//! immediate data, is malformed. A malformed request gets an error reply
//! (whatever of its sequence number could be read), never a panic.

use core::fmt;

use hal::be::{get_be16, get_be32, get_be64};

/// Bytes in every message.
pub const MSG_LEN: usize = 32;
/// "RM".
pub const MAGIC: u16 = 0x524d;
/// The version this build speaks. A request of another version is answered
/// with [`Status::BadVersion`] carrying ours in the reply's version byte.
pub const VERSION: u8 = 1;
/// Bit set in the op of a reply.
pub const REPLY: u8 = 0x80;

/// What a request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Who are you: the reply carries the region's base, length and rkey.
    Hello = 1,
    /// Allocate `len` bytes (rounded up to whole 4 KiB pages); the reply
    /// carries the chunk's address and length and the region's rkey.
    Alloc = 2,
    /// Free the chunk starting at `addr`.
    Free = 3,
}

impl Op {
    fn from_u8(v: u8) -> Option<Op> {
        match v {
            1 => Some(Op::Hello),
            2 => Some(Op::Alloc),
            3 => Some(Op::Free),
            _ => None,
        }
    }

    /// The word printed for it.
    pub const fn name(self) -> &'static str {
        match self {
            Op::Hello => "hello",
            Op::Alloc => "alloc",
            Op::Free => "free",
        }
    }
}

/// A reply's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Status {
    /// Done.
    Ok = 0,
    /// The message was not an rmem request (length, magic, reserved bits,
    /// immediate data).
    Malformed = 1,
    /// Another protocol version.
    BadVersion = 2,
    /// Unknown op.
    BadOp = 3,
    /// A zero or oversized length.
    BadLength = 4,
    /// The region has no free run that large (or the chunk table is full).
    NoSpace = 5,
    /// FREE of an address that is not the start of a chunk of this
    /// connection.
    NotOwner = 6,
}

impl Status {
    /// Decodes a status; unknown values are `None`.
    pub fn from_u16(v: u16) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::Malformed,
            2 => Status::BadVersion,
            3 => Status::BadOp,
            4 => Status::BadLength,
            5 => Status::NoSpace,
            6 => Status::NotOwner,
            _ => return None,
        })
    }

    /// Words for a user.
    pub const fn msg(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Malformed => "malformed request",
            Status::BadVersion => "protocol version mismatch",
            Status::BadOp => "unknown request",
            Status::BadLength => "bad length",
            Status::NoSpace => "no space left in the exported region",
            Status::NotOwner => "no chunk of this connection starts there",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.msg())
    }
}

/// One message, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Msg {
    /// Version byte as sent.
    pub version: u8,
    /// The op (without the reply bit).
    pub op: Op,
    /// Whether this is a reply.
    pub reply: bool,
    /// Status (replies).
    pub status: Status,
    /// Sequence number.
    pub seq: u32,
    /// Remote key (replies to HELLO/ALLOC).
    pub rkey: u32,
    /// Address.
    pub addr: u64,
    /// Length.
    pub len: u64,
}

impl Msg {
    /// A request.
    pub const fn request(op: Op, seq: u32, addr: u64, len: u64) -> Msg {
        Msg {
            version: VERSION,
            op,
            reply: false,
            status: Status::Ok,
            seq,
            rkey: 0,
            addr,
            len,
        }
    }

    /// Writes the message into `out` (exactly [`MSG_LEN`] bytes) and returns
    /// the immediate data to send it with.
    pub fn encode(&self, out: &mut [u8; MSG_LEN]) -> u32 {
        let op = self.op as u8 | if self.reply { REPLY } else { 0 };
        out[0..2].copy_from_slice(&MAGIC.to_be_bytes());
        out[2] = self.version;
        out[3] = op;
        out[4..6].copy_from_slice(&(self.status as u16).to_be_bytes());
        out[6..8].copy_from_slice(&[0, 0]);
        out[8..12].copy_from_slice(&self.seq.to_be_bytes());
        out[12..16].copy_from_slice(&self.rkey.to_be_bytes());
        out[16..24].copy_from_slice(&self.addr.to_be_bytes());
        out[24..32].copy_from_slice(&self.len.to_be_bytes());
        self.seq
    }
}

/// Why a message could not be decoded, and the sequence number to answer
/// it with (0 when not even that could be read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeError {
    /// The status an error reply carries.
    pub status: Status,
    /// The request's sequence number, if readable.
    pub seq: u32,
    /// The op byte as sent (for [`Status::BadOp`] and the reply's op).
    pub op_byte: u8,
    /// What was wrong.
    pub what: &'static str,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (seq {})", self.status, self.what, self.seq)
    }
}

/// Decodes `bytes` (the received bytes, `byte_len` of the completion) sent
/// with immediate data `imm` (`None`: the completion had no immediate).
pub fn decode(bytes: &[u8], imm: Option<u32>) -> Result<Msg, DecodeError> {
    let err = |status, seq, op_byte, what| DecodeError {
        status,
        seq,
        op_byte,
        what,
    };
    if bytes.len() < MSG_LEN {
        let seq = if bytes.len() >= 12 {
            get_be32(bytes, 8)
        } else {
            0
        };
        return Err(err(
            Status::Malformed,
            seq,
            0,
            "message shorter than 32 bytes",
        ));
    }
    if bytes.len() > MSG_LEN {
        return Err(err(
            Status::Malformed,
            get_be32(bytes, 8),
            bytes[3],
            "message longer than 32 bytes",
        ));
    }
    let seq = get_be32(bytes, 8);
    let op_byte = bytes[3];
    if get_be16(bytes, 0) != MAGIC {
        return Err(err(Status::Malformed, seq, op_byte, "bad magic"));
    }
    if bytes[2] != VERSION {
        return Err(err(Status::BadVersion, seq, op_byte, "protocol version"));
    }
    if get_be16(bytes, 6) != 0 {
        return Err(err(Status::Malformed, seq, op_byte, "reserved bits set"));
    }
    match imm {
        None => return Err(err(Status::Malformed, seq, op_byte, "no immediate data")),
        Some(i) if i != seq => {
            return Err(err(
                Status::Malformed,
                seq,
                op_byte,
                "immediate data differs from the sequence number",
            ));
        }
        Some(_) => {}
    }
    let Some(op) = Op::from_u8(op_byte & !REPLY) else {
        return Err(err(Status::BadOp, seq, op_byte, "unknown op"));
    };
    let Some(status) = Status::from_u16(get_be16(bytes, 4)) else {
        return Err(err(Status::Malformed, seq, op_byte, "unknown status"));
    };
    Ok(Msg {
        version: bytes[2],
        op,
        reply: op_byte & REPLY != 0,
        status,
        seq,
        rkey: get_be32(bytes, 12),
        addr: get_be64(bytes, 16),
        len: get_be64(bytes, 24),
    })
}

/// The error reply to a request that could not be decoded.
pub fn error_reply(e: &DecodeError) -> Msg {
    Msg {
        version: VERSION,
        // The op is echoed when known; an unknown op is answered as HELLO
        // (the status says what went wrong).
        op: Op::from_u8(e.op_byte & !REPLY).unwrap_or(Op::Hello),
        reply: true,
        status: e.status,
        seq: e.seq,
        rkey: 0,
        addr: 0,
        len: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_layout() {
        let m = Msg {
            version: VERSION,
            op: Op::Alloc,
            reply: true,
            status: Status::NoSpace,
            seq: 0x0102_0304,
            rkey: 0xa1b2_c3d4,
            addr: 0x1122_3344_5566_7788,
            len: 0x1000,
        };
        let mut b = [0u8; MSG_LEN];
        assert_eq!(m.encode(&mut b), 0x0102_0304);
        assert_eq!(
            b,
            [
                0x52, 0x4d, 1, 0x82, 0, 5, 0, 0, 1, 2, 3, 4, 0xa1, 0xb2, 0xc3, 0xd4, 0x11, 0x22,
                0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0, 0, 0, 0, 0, 0, 0x10, 0
            ]
        );
        assert_eq!(decode(&b, Some(0x0102_0304)), Ok(m));
    }

    #[test]
    fn malformed_requests_are_named() {
        let mut b = [0u8; MSG_LEN];
        let imm = Msg::request(Op::Free, 7, 0x1000, 0).encode(&mut b);
        assert_eq!(decode(&b, Some(imm)).map(|m| m.op), Ok(Op::Free));
        assert_eq!(decode(&b, None).unwrap_err().what, "no immediate data");
        assert_eq!(decode(&b, Some(8)).unwrap_err().status, Status::Malformed);
        assert_eq!(decode(&b[..31], Some(7)).unwrap_err().seq, 7);
        let mut v = b;
        v[2] = 2;
        let e = decode(&v, Some(7)).unwrap_err();
        assert_eq!((e.status, e.seq), (Status::BadVersion, 7));
        assert_eq!(error_reply(&e).version, VERSION);
        let mut o = b;
        o[3] = 0x7f;
        assert_eq!(decode(&o, Some(7)).unwrap_err().status, Status::BadOp);
        let mut r = b;
        r[7] = 1;
        assert_eq!(decode(&r, Some(7)).unwrap_err().what, "reserved bits set");
        let mut m = b;
        m[0] = 0;
        assert_eq!(decode(&m, Some(7)).unwrap_err().what, "bad magic");
        let mut s = b;
        s[5] = 99;
        assert_eq!(decode(&s, Some(7)).unwrap_err().what, "unknown status");
    }

    /// 10^5 random messages (and random corruptions of good ones) decode to
    /// a message or an error, never a panic, and every error has a reply.
    #[test]
    fn fuzz_never_panics() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut ok = 0;
        for i in 0..100_000u32 {
            let mut b = [0u8; 40];
            let len = (next() % 41) as usize;
            if i % 2 == 0 {
                let mut g = [0u8; MSG_LEN];
                Msg::request(Op::Alloc, i, next(), next()).encode(&mut g);
                b[..MSG_LEN].copy_from_slice(&g);
                let k = (next() % 40) as usize;
                b[k] ^= next() as u8 & 3;
            } else {
                for v in b.iter_mut() {
                    *v = next() as u8;
                }
            }
            match decode(&b[..len], Some(i)) {
                Ok(m) => {
                    ok += 1;
                    let mut again = [0u8; MSG_LEN];
                    m.encode(&mut again);
                    assert_eq!(&again[..], &b[..MSG_LEN]);
                }
                Err(e) => {
                    let r = error_reply(&e);
                    assert!(r.reply && r.status != Status::Ok);
                }
            }
        }
        assert!(ok > 500, "some corruptions keep a valid message: {ok}");
    }
}
