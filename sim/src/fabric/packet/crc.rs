//! The two CRCs of an InfiniBand packet (IBTA vol. 1, 7.8: the ICRC over
//! the invariant fields, the VCRC over the whole packet), table-driven and,
//! where the CPU has carry-less multiplication, folded.

use super::*;

/// Slices of the table-driven CRCs: 16 bytes per step.
const SLICES: usize = 16;

const fn crc32_tables() -> [[u32; 256]; SLICES] {
    let mut t = [[0u32; 256]; SLICES];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut s = 1;
    while s < SLICES {
        let mut i = 0;
        while i < 256 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            i += 1;
        }
        s += 1;
    }
    t
}

const fn crc16_tables() -> [[u16; 256]; SLICES] {
    // 0xD008 is 0x100B with its bits reversed.
    let mut t = [[0u16; 256]; SLICES];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u16;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xd008 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut s = 1;
    while s < SLICES {
        let mut i = 0;
        while i < 256 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            i += 1;
        }
        s += 1;
    }
    t
}

static CRC32: [[u32; 256]; SLICES] = crc32_tables();
static CRC16: [[u16; 256]; SLICES] = crc16_tables();

/// Continues a reflected CRC-32 (state not complemented) over `data`:
/// carry-less multiplication where the CPU has it, tables otherwise.
fn crc32_update(c: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if let Some((folded, tail)) = clmul::fold(u128::from(c), data, &clmul::CRC32) {
        return crc32_table_update(crc32_table_update(0, &folded), tail);
    }
    crc32_table_update(c, data)
}

/// The same for the 16-bit VCRC.
fn crc16_update(c: u16, data: &[u8]) -> u16 {
    #[cfg(target_arch = "x86_64")]
    if let Some((folded, tail)) = clmul::fold(u128::from(c), data, &clmul::CRC16) {
        return crc16_table_update(crc16_table_update(0, &folded), tail);
    }
    crc16_table_update(c, data)
}

/// Continues a reflected CRC-32 (state not complemented) over `data`,
/// sixteen bytes per step (slicing-by-16).
fn crc32_table_update(mut c: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(SLICES);
    for ch in &mut chunks {
        let mut x = [0u8; SLICES];
        x.copy_from_slice(ch);
        let lo = c ^ u32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        x[..4].copy_from_slice(&lo.to_le_bytes());
        let mut r = 0u32;
        for (k, &b) in x.iter().enumerate() {
            r ^= CRC32[SLICES - 1 - k][usize::from(b)];
        }
        c = r;
    }
    for &x in chunks.remainder() {
        c = CRC32[0][((c ^ u32::from(x)) & 0xff) as usize] ^ (c >> 8);
    }
    c
}

/// The same for the 16-bit VCRC.
fn crc16_table_update(mut c: u16, data: &[u8]) -> u16 {
    let mut chunks = data.chunks_exact(SLICES);
    for ch in &mut chunks {
        let mut x = [0u8; SLICES];
        x.copy_from_slice(ch);
        let lo = c ^ u16::from_le_bytes([x[0], x[1]]);
        x[..2].copy_from_slice(&lo.to_le_bytes());
        let mut r = 0u16;
        for (k, &b) in x.iter().enumerate() {
            r ^= CRC16[SLICES - 1 - k][usize::from(b)];
        }
        c = r;
    }
    for &x in chunks.remainder() {
        c = CRC16[0][((c ^ u16::from(x)) & 0xff) as usize] ^ (c >> 8);
    }
    c
}

/// Folding with carry-less multiplication (x86_64 PCLMULQDQ), for both
/// reflected CRCs: 16-byte blocks are folded into one 128-bit remainder
/// congruent to the message modulo the polynomial, and the tables finish
/// the last 16 bytes and the tail. With bit k of a little-endian 128-bit
/// block standing for x^(127-k), block B followed by block N folds to
/// H * (x^192 mod P) + L * (x^128 mod P) + N, H and L the halves of B
/// (four blocks at a time are folded across 512 bits the same way). A
/// carry-less product of two reflected 64-bit values, read as a reflected
/// 128-bit value, is the polynomial product times x, so the constants are
/// x^191 and x^127 (x^575 and x^511) mod P, stored reflected.
#[cfg(target_arch = "x86_64")]
mod clmul {
    use std::arch::x86_64::{
        __m128i, _mm_clmulepi64_si128, _mm_loadu_si128, _mm_set_epi64x, _mm_storeu_si128,
        _mm_xor_si128,
    };

    /// Below this many bytes the tables are as fast.
    pub const MIN_LEN: usize = 64;

    /// Folding constants of one polynomial: (x^(d+64-1), x^(d-1)) mod P,
    /// reflected in 64 bits, for folding across d = 128 and d = 512 bits.
    pub struct Consts {
        k128: (u64, u64),
        k512: (u64, u64),
    }

    /// x^e mod P, with P given with its x^n term.
    const fn xpow_mod(e: u32, poly: u64, n: u32) -> u64 {
        let mut r: u64 = 1;
        let mut i = 0;
        while i < e {
            r <<= 1;
            if r & (1 << n) != 0 {
                r ^= poly;
            }
            i += 1;
        }
        r
    }

    const fn consts(poly: u64, n: u32) -> Consts {
        Consts {
            k128: (
                xpow_mod(128 + 64 - 1, poly, n).reverse_bits(),
                xpow_mod(128 - 1, poly, n).reverse_bits(),
            ),
            k512: (
                xpow_mod(512 + 64 - 1, poly, n).reverse_bits(),
                xpow_mod(512 - 1, poly, n).reverse_bits(),
            ),
        }
    }

    /// The ICRC polynomial.
    pub const CRC32: Consts = consts(0x1_04c1_1db7, 32);
    /// The VCRC polynomial.
    pub const CRC16: Consts = consts(0x1_100b, 16);

    /// Whether the CPU multiplies carry-less.
    pub fn available() -> bool {
        std::arch::is_x86_feature_detected!("pclmulqdq")
            && std::arch::is_x86_feature_detected!("sse2")
    }

    /// Folds `data` with the CRC state `state` (not complemented) into 16
    /// bytes whose CRC from state 0, continued over the returned tail, is
    /// the CRC of `data` from `state`; `None` (use the tables) for fewer
    /// than [`MIN_LEN`] bytes or a CPU without carry-less multiplication.
    pub fn fold<'a>(state: u128, data: &'a [u8], k: &Consts) -> Option<([u8; 16], &'a [u8])> {
        if data.len() < MIN_LEN || !available() {
            return None;
        }
        let mut first = [0u8; 64];
        first.copy_from_slice(&data[..64]);
        // A state is the same as zero state with it XORed into the first
        // bytes (reflected: the low byte meets the first data byte).
        let mut lead = [0u8; 16];
        lead.copy_from_slice(&first[..16]);
        first[..16].copy_from_slice(&(u128::from_le_bytes(lead) ^ state).to_le_bytes());
        let quads = (data.len() - 64) / 64;
        let body = &data[64..64 + quads * 64];
        let rest = &data[64 + quads * 64..];
        let singles = rest.len() / 16;
        let (tail16, tail) = rest.split_at(singles * 16);
        // SAFETY: `available()` was checked above, so the CPU has
        // PCLMULQDQ and SSE2, which is all `fold_blocks` is compiled for.
        let out = unsafe { fold_blocks(&first, body, tail16, k) };
        Some((out, tail))
    }

    #[target_feature(enable = "pclmulqdq,sse2")]
    fn fold_blocks(first: &[u8; 64], body: &[u8], singles: &[u8], k: &Consts) -> [u8; 16] {
        let load = |b: &[u8]| {
            let b = &b[..16];
            // SAFETY: `b` is exactly 16 readable bytes (sliced above); the
            // load is unaligned.
            unsafe { _mm_loadu_si128(b.as_ptr().cast::<__m128i>()) }
        };
        let k128 = _mm_set_epi64x(k.k128.0 as i64, k.k128.1 as i64);
        let k512 = _mm_set_epi64x(k.k512.0 as i64, k.k512.1 as i64);
        // Low half (the first 8 bytes, the higher degrees) times the first
        // constant, high half times the second.
        let fold = |x: __m128i, kk: __m128i| {
            _mm_xor_si128(
                _mm_clmulepi64_si128(x, kk, 0x10),
                _mm_clmulepi64_si128(x, kk, 0x01),
            )
        };
        let mut acc = [
            load(&first[0..]),
            load(&first[16..]),
            load(&first[32..]),
            load(&first[48..]),
        ];
        for q in body.chunks_exact(64) {
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm_xor_si128(fold(*a, k512), load(&q[16 * j..]));
            }
        }
        let mut x = acc[0];
        for a in &acc[1..] {
            x = _mm_xor_si128(fold(x, k128), *a);
        }
        for ch in singles.chunks_exact(16) {
            x = _mm_xor_si128(fold(x, k128), load(ch));
        }
        let mut out = [0u8; 16];
        // SAFETY: an unaligned 16-byte store into a 16-byte array.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().cast::<__m128i>(), x) };
        out
    }
}

/// CRC-32 as zlib computes it (for tests and the ICRC).
pub fn crc32(data: &[u8]) -> u32 {
    !crc32_update(!0, data)
}

/// The ICRC of `b` = LRH..pad (no CRCs), variant fields masked to ones.
/// Bytes that are not a well-formed header prefix are taken as they are.
pub fn icrc(b: &[u8]) -> u32 {
    // Copy of the headers with the variant fields masked: LRH 8, GRH 40,
    // BTH 12 at most.
    let mut h = [0u8; LRH_LEN + GRH_LEN + BTH_LEN];
    let global = b.len() >= 2 && b[1] & 3 == lnh::IBA_GLOBAL;
    let hlen = (LRH_LEN + if global { GRH_LEN } else { 0 } + BTH_LEN).min(b.len());
    h[..hlen].copy_from_slice(&b[..hlen]);
    if global {
        // The whole LRH is variant in a packet with a GRH.
        h[..LRH_LEN.min(hlen)].fill(0xff);
    } else if hlen > 0 {
        h[0] |= 0xf0; // VL
    }
    let bth = if global {
        if hlen >= LRH_LEN + 8 {
            h[LRH_LEN] |= 0x0f; // TClass (high nibble)
            h[LRH_LEN + 1] = 0xff; // TClass low nibble, FlowLabel
            h[LRH_LEN + 2] = 0xff;
            h[LRH_LEN + 3] = 0xff;
            h[LRH_LEN + 7] = 0xff; // HopLmt
        }
        LRH_LEN + GRH_LEN
    } else {
        LRH_LEN
    };
    if hlen > bth + 4 {
        h[bth + 4] = 0xff; // Resv8a (FECN, BECN)
    }
    let c = crc32_update(!0, &h[..hlen]);
    !crc32_update(c, &b[hlen..])
}

/// The ICRC of a RoCE v1 packet, `b` = GRH..pad (IBTA annex A16: the
/// LRH's place taken by 8 bytes of ones, the GRH and BTH variant fields
/// masked as in a global packet).
pub fn roce_icrc(b: &[u8]) -> u32 {
    let mut h = [0u8; LRH_LEN + GRH_LEN + BTH_LEN];
    h[..LRH_LEN].fill(0xff);
    let n = (GRH_LEN + BTH_LEN).min(b.len());
    h[LRH_LEN..LRH_LEN + n].copy_from_slice(&b[..n]);
    if n >= 8 {
        h[LRH_LEN] |= 0x0f;
        h[LRH_LEN + 1] = 0xff;
        h[LRH_LEN + 2] = 0xff;
        h[LRH_LEN + 3] = 0xff;
        h[LRH_LEN + 7] = 0xff;
    }
    if n > GRH_LEN + 4 {
        h[LRH_LEN + GRH_LEN + 4] = 0xff;
    }
    let c = crc32_update(!0, &h[..LRH_LEN + n]);
    !crc32_update(c, &b[n..])
}

/// The Ethernet FCS of `b` (destination MAC up to the FCS): CRC-32,
/// stored least significant byte first.
pub fn fcs(b: &[u8]) -> u32 {
    crc32(b)
}

/// The VCRC of `b` = LRH..ICRC.
pub fn vcrc(b: &[u8]) -> u16 {
    !crc16_update(!0, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_zlibs() {
        // The standard check value of CRC-32/ISO-HDLC.
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        let long: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut c = !0u32;
        for &x in &long {
            c = CRC32[0][((c ^ u32::from(x)) & 0xff) as usize] ^ (c >> 8);
        }
        assert_eq!(crc32(&long), !c, "slicing-by-16 equals the bytewise CRC");
    }

    #[test]
    fn folded_crcs_equal_the_tables() {
        let mut x = 0x1234_5678_9abc_def0u64;
        for len in (0..300).chain([1000, 4096, 4133, 8190]) {
            let d: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            for s32 in [0u32, !0, 0xdebb_20e3] {
                assert_eq!(
                    crc32_update(s32, &d),
                    crc32_table_update(s32, &d),
                    "crc32 len {len}"
                );
            }
            for s16 in [0u16, !0, 0x1234] {
                assert_eq!(
                    crc16_update(s16, &d),
                    crc16_table_update(s16, &d),
                    "crc16 len {len}"
                );
            }
        }
    }

    #[test]
    fn vcrc_polynomial() {
        // Bitwise reference of the reflected 0x100B CRC, seed and final
        // complement, against the table version.
        fn bitwise(d: &[u8]) -> u16 {
            let mut c: u16 = 0xffff;
            for &x in d {
                c ^= u16::from(x);
                for _ in 0..8 {
                    c = if c & 1 != 0 {
                        (c >> 1) ^ 0xd008
                    } else {
                        c >> 1
                    };
                }
            }
            !c
        }
        let d: Vec<u8> = (0..777u32).map(|i| (i * 13 + 1) as u8).collect();
        assert_eq!(vcrc(&d), bitwise(&d));
        assert_eq!(vcrc(b"123456789"), bitwise(b"123456789"));
    }

    /// The DR SubnGet(NodeInfo) of real-peers.md, whose ICRC tshark shows
    /// as 0x297e56c8 (the four stored bytes read big-endian).
    #[test]
    fn icrc_matches_the_tshark_capture() {
        let mut smp = Smp::dr_get(0x1234, attr::NODE_INFO, 0, &[1]).unwrap();
        smp.hop_ptr = 0;
        let mad = smp.to_bytes();
        let h = mad_headers(PERMISSIVE_LID, PERMISSIVE_LID, 0, 0, DEFAULT_PKEY);
        let p = build(&h, &mad).unwrap();
        assert_eq!(p.len(), 288 + 2);
        assert_eq!(Lrh::parse(&p).unwrap().pkt_len, 72);
        assert_eq!(&p[284..288], &0x297e_56c8u32.to_be_bytes(), "ICRC");
    }

    /// A global packet's ICRC equals the RoCE computation: Linux rxe
    /// starts from 0xdebb20e3, the CRC-32 state after 8 bytes of ones
    /// standing for the LRH, then takes the masked GRH and BTH.
    #[test]
    fn global_icrc_is_the_roce_one() {
        assert_eq!(crc32_update(!0, &[0xff; 8]), 0xdebb_20e3);
        let mut h = mad_headers(5, 6, 1, 1, 0xffff);
        h.lrh.vl = 2;
        h.lrh.sl = 3;
        h.grh = Some(Grh {
            ip_ver: 6,
            tclass: 0x21,
            flow_label: 0x12345,
            nxt_hdr: GRH_NXT_HDR_IBA,
            hop_lmt: 9,
            sgid: [7; 16],
            dgid: [8; 16],
            ..Grh::default()
        });
        let b = build(&h, &[0x42u8; 256]).unwrap();
        let end = b.len() - ICRC_LEN - VCRC_LEN;
        let mut g = b[LRH_LEN..end].to_vec();
        g[0] |= 0x0f;
        g[1..4].fill(0xff);
        g[7] = 0xff;
        g[GRH_LEN + 4] = 0xff;
        let roce = !crc32_update(0xdebb_20e3, &g);
        assert_eq!(
            u32::from_le_bytes(b[end..end + 4].try_into().unwrap()),
            roce
        );
    }

    #[test]
    fn icrc_ignores_variant_fields_only() {
        let mut h = mad_headers(5, 6, 1, 1, 0xffff);
        h.grh = Some(Grh {
            ip_ver: 6,
            nxt_hdr: GRH_NXT_HDR_IBA,
            hop_lmt: 1,
            ..Grh::default()
        });
        let base = build(&h, &[0u8; 256]).unwrap();
        let mut v = base.clone();
        v[0] ^= 0xf0; // VL
        v[1] ^= 0xf0; // SL: with a GRH the whole LRH is variant
        v[3] ^= 0xff; // DLID
        v[8] ^= 0x0f; // TClass
        v[9] ^= 0xff; // TClass/FlowLabel
        v[15] ^= 0xff; // HopLmt
        v[48 + 4] ^= 0xc0; // FECN/BECN
        assert_eq!(icrc(&v[..v.len() - 6]), icrc(&base[..base.len() - 6]));
        assert!(matches!(check_crcs(&v), Err(PacketError::BadVcrc { .. })));
        reseal_vcrc(&mut v).unwrap();
        assert_eq!(check_crcs(&v), Ok(()));
        for i in [12usize, 20, 30, 48, 60, 100] {
            let mut w = base.clone();
            w[i] ^= 1;
            reseal_vcrc(&mut w).unwrap();
            assert!(
                matches!(check_crcs(&w), Err(PacketError::BadIcrc { .. })),
                "byte {i} is invariant"
            );
        }
        // Without a GRH only the VL of the LRH is variant.
        let local = build(&mad_headers(5, 6, 1, 1, 0xffff), &[0u8; 256]).unwrap();
        let mut v = local.clone();
        v[0] ^= 0xf0;
        reseal_vcrc(&mut v).unwrap();
        assert_eq!(check_crcs(&v), Ok(()), "VL");
        for i in [1usize, 3, 5, 7] {
            let mut w = local.clone();
            w[i] ^= 1;
            reseal_vcrc(&mut w).unwrap();
            assert!(
                matches!(check_crcs(&w), Err(PacketError::BadIcrc { .. })),
                "LRH byte {i} is invariant in a local packet"
            );
        }
    }
}
