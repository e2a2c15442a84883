//! Big-endian field access in byte buffers (the `MLX4_PUT`/`MLX4_GET` helpers of Linux `fw.h`).
//!
//! Every function bounds-checks through slice indexing; callers pass buffers
//! of the layout's documented size.

/// Stores a byte at `off`.
pub fn put_u8(b: &mut [u8], off: usize, v: u8) {
    b[off] = v;
}
/// Stores a big-endian `u16` at `off`.
pub fn put_be16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_be_bytes());
}
/// Stores a big-endian `u32` at `off`.
pub fn put_be32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}
/// Stores a big-endian `u64` at `off`.
pub fn put_be64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_be_bytes());
}
/// Loads the byte at `off`.
pub fn get_u8(b: &[u8], off: usize) -> u8 {
    b[off]
}
/// Loads a big-endian `u16` at `off`.
pub fn get_be16(b: &[u8], off: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[off..off + 2]);
    u16::from_be_bytes(a)
}
/// Loads a big-endian `u32` at `off`.
pub fn get_be32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_be_bytes(a)
}
/// Loads a big-endian `u64` at `off`.
pub fn get_be64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_is_big_endian() {
        let mut b = [0u8; 16];
        put_be16(&mut b, 0, 0x0102);
        put_be32(&mut b, 2, 0x0304_0506);
        put_be64(&mut b, 6, 0x0708_090a_0b0c_0d0e);
        put_u8(&mut b, 14, 0x0f);
        assert_eq!(b[..15], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
        assert_eq!(get_be16(&b, 0), 0x0102);
        assert_eq!(get_be32(&b, 2), 0x0304_0506);
        assert_eq!(get_be64(&b, 6), 0x0708_090a_0b0c_0d0e);
        assert_eq!(get_u8(&b, 14), 0x0f);
    }
}
