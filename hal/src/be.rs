//! Big-endian fields in byte buffers, the one byte-access module of the driver side.
//!
//! Every mlx4 mailbox, context, WQE, CQE and EQE, every MAD, SA record and CM
//! message is big-endian on the wire. These are Linux's `MLX4_GET`/`MLX4_PUT`
//! (`fw.h`) and `be32_to_cpu` over a byte slice, for the drivers, ib_core, the
//! tools and rmem alike (the device model keeps its own reading by design).
//!
//! Offsets are the layout's documented constants and buffers have the layout's
//! size, so an offset past the end is a bug in the caller, not bad input: it
//! panics through slice indexing like any out-of-bounds index. Code that reads
//! a buffer of untrusted length checks the length first.

/// Loads the byte at `off`.
#[inline]
pub fn get_u8(b: &[u8], off: usize) -> u8 {
    b[off]
}

/// Loads a big-endian `u16` at `off`.
#[inline]
pub fn get_be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

/// Loads a big-endian 24-bit value (a QPN, a PSN) at `off`.
#[inline]
pub fn get_be24(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([0, b[off], b[off + 1], b[off + 2]])
}

/// Loads a big-endian `u32` at `off`.
#[inline]
pub fn get_be32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_be_bytes(a)
}

/// Loads a big-endian `u64` at `off`.
#[inline]
pub fn get_be64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(a)
}

/// Stores a byte at `off`.
#[inline]
pub fn put_u8(b: &mut [u8], off: usize, v: u8) {
    b[off] = v;
}

/// Stores a big-endian `u16` at `off`.
#[inline]
pub fn put_be16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_be_bytes());
}

/// Stores the low 24 bits of `v` big-endian at `off` (the top byte is not written).
#[inline]
pub fn put_be24(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

/// Stores a big-endian `u32` at `off`.
#[inline]
pub fn put_be32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

/// Stores a big-endian `u64` at `off`.
#[inline]
pub fn put_be64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_in_wire_order() {
        let mut b = [0u8; 20];
        put_be16(&mut b, 0, 0x0102);
        put_be32(&mut b, 2, 0x0304_0506);
        put_be64(&mut b, 6, 0x0708_090a_0b0c_0d0e);
        put_u8(&mut b, 14, 0x0f);
        put_be24(&mut b, 15, 0xff10_1112);
        assert_eq!(
            b[..18],
            [
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0x10, 0x11, 0x12
            ]
        );
        assert_eq!(b[18], 0, "a 24-bit store writes three bytes only");
        assert_eq!(get_be16(&b, 0), 0x0102);
        assert_eq!(get_be32(&b, 2), 0x0304_0506);
        assert_eq!(get_be64(&b, 6), 0x0708_090a_0b0c_0d0e);
        assert_eq!(get_u8(&b, 14), 0x0f);
        assert_eq!(get_be24(&b, 15), 0x10_1112);
    }

    #[test]
    #[should_panic]
    fn an_offset_past_the_layout_is_a_caller_bug() {
        let b = [0u8; 4];
        let _ = get_be32(&b, 1);
    }
}
