//! rmem's wire protocol: any bytes (and any immediate data) through `proto::decode` on the memory node's side, what decodes as a request taken on by the chunk table the server answers from (`Chunks::alloc` and `free`, several clients), and every decoded message encoded again.
//!
//! Checks: a message that decodes encodes back to the same bytes; an error
//! reply decodes; the chunk table stays sorted, disjoint, page-aligned,
//! inside the region and within its count.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rmem::chunks::{Chunks, PAGE};
use rmem::proto::{self, MAGIC, MSG_LEN, Op, VERSION};

#[derive(Arbitrary, Debug)]
enum Bytes {
    /// A well-framed message (magic, version) with these fields.
    Framed {
        op: u8,
        status: u16,
        reserved: u16,
        rkey: u32,
        addr: u64,
        len: u64,
    },
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Rx {
    bytes: Bytes,
    seq: u32,
    /// The immediate: None, the sequence number, or any.
    imm: Option<Option<u32>>,
    owner: u8,
}

#[derive(Arbitrary, Debug)]
struct Input {
    size_pages: u16,
    cap: u8,
    msgs: Vec<Rx>,
}

/// The region's I/O virtual address (as `ServerConfig`'s default).
const IOVA: u64 = 0x10_0000_0000;

fuzz_target!(|input: Input| {
    let size = u64::from(input.size_pages) * PAGE + u64::from(input.size_pages % 3);
    let cap = usize::from(input.cap % 64);
    let mut chunks = Chunks::new(size, cap);
    for rx in input.msgs.iter().take(256) {
        let bytes = match &rx.bytes {
            Bytes::Framed {
                op,
                status,
                reserved,
                rkey,
                addr,
                len,
            } => {
                let mut b = vec![0u8; MSG_LEN];
                b[0..2].copy_from_slice(&MAGIC.to_be_bytes());
                b[2] = VERSION;
                b[3] = *op;
                b[4..6].copy_from_slice(&status.to_be_bytes());
                b[6..8].copy_from_slice(&reserved.to_be_bytes());
                b[8..12].copy_from_slice(&rx.seq.to_be_bytes());
                b[12..16].copy_from_slice(&rkey.to_be_bytes());
                b[16..24].copy_from_slice(&addr.to_be_bytes());
                b[24..32].copy_from_slice(&len.to_be_bytes());
                b
            }
            Bytes::Raw(b) => b.clone(),
        };
        let imm = match rx.imm {
            None => Some(rx.seq),
            Some(i) => i,
        };
        let owner = u32::from(rx.owner % 4);
        match proto::decode(&bytes, imm) {
            Ok(m) => {
                let mut out = [0u8; MSG_LEN];
                let i = m.encode(&mut out);
                assert_eq!(&out[..], &bytes[..], "{m:?} encodes to other bytes");
                assert_eq!(Some(i), imm);
                assert_eq!(proto::decode(&out, Some(i)), Ok(m));
                if !m.reply {
                    // What the server does with a request (Server::answer).
                    match m.op {
                        Op::Hello => {}
                        Op::Alloc => {
                            if let Ok((off, len)) = chunks.alloc(m.len, owner) {
                                assert!(len >= m.len && len % PAGE == 0);
                                assert!(off.checked_add(len).is_some_and(|e| e <= size));
                            }
                        }
                        Op::Free => {
                            let _ = chunks.free(m.addr.wrapping_sub(IOVA), owner);
                        }
                    }
                }
            }
            Err(e) => {
                let r = proto::error_reply(&e);
                assert!(r.reply);
                let mut out = [0u8; MSG_LEN];
                let i = r.encode(&mut out);
                assert_eq!(proto::decode(&out, Some(i)), Ok(r));
                let _ = e.to_string();
            }
        }
        if rx.owner >= 0xf0 {
            chunks.free_owner(owner);
        }
        let mut end = 0;
        let mut n = 0;
        for c in chunks.iter() {
            assert!(c.off >= end, "chunks overlap or are unsorted");
            assert!(c.off % PAGE == 0 && c.len % PAGE == 0 && c.len > 0);
            end = c.off + c.len;
            assert!(end <= size, "a chunk past the region");
            n += 1;
        }
        assert!(n <= cap);
        assert_eq!(
            chunks.used_bytes(),
            chunks.iter().map(|c| c.len).sum::<u64>()
        );
    }
});
