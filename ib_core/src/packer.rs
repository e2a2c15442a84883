//! Port of Linux `drivers/infiniband/core/packer.c` (3.11): big-endian bit-field packing driven by field tables (`struct ib_field`).
//!
//! Linux's struct-offset half of the descriptor is replaced by an index into a
//! value array, and its `memcpy` fields wider than 64 bits are left to the
//! caller (the GIDs of a GRH).

use crate::error::{Error, Result};

/// One field of a header (`struct ib_field` without the struct offset): it
/// starts `offset_bits` bits after the most significant bit of big-endian
/// dword `offset_words`, and is `size_bits` (1..=64) wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbField {
    /// Linux's field name (`"RESERVED"` for padding).
    pub name: &'static str,
    /// Dword offset inside the header.
    pub offset_words: u16,
    /// Bit offset inside that dword, counted from the MSB.
    pub offset_bits: u8,
    /// Width in bits (1..=64).
    pub size_bits: u8,
}

impl IbField {
    /// A field descriptor.
    pub const fn new(
        name: &'static str,
        offset_words: u16,
        offset_bits: u8,
        size_bits: u8,
    ) -> IbField {
        IbField {
            name,
            offset_words,
            offset_bits,
            size_bits,
        }
    }

    /// The first bit of the field, counted from the MSB of byte 0.
    const fn start_bit(&self) -> usize {
        self.offset_words as usize * 32 + self.offset_bits as usize
    }
}

/// Writes `value` into the field of `buf` (Linux `value_write` for each of
/// `ib_pack`'s sizes). The buffer must hold the field; the value is masked
/// to the field's width.
pub fn pack_field(field: &IbField, value: u64, buf: &mut [u8]) -> Result<()> {
    let size = usize::from(field.size_bits);
    if size == 0 || size > 64 {
        return Err(Error::Invalid("packer: field width must be 1..=64 bits"));
    }
    let start = field.start_bit();
    let end = start + size;
    if end.div_ceil(8) > buf.len() {
        return Err(Error::MsgSize);
    }
    for i in 0..size {
        // Bit i of the field counted from its MSB.
        let bit = (value >> (size - 1 - i)) & 1;
        let pos = start + i;
        let mask = 0x80u8 >> (pos % 8);
        if bit != 0 {
            buf[pos / 8] |= mask;
        } else {
            buf[pos / 8] &= !mask;
        }
    }
    Ok(())
}

/// Reads the field from `buf` (Linux `value_read`).
pub fn unpack_field(field: &IbField, buf: &[u8]) -> Result<u64> {
    let size = usize::from(field.size_bits);
    if size == 0 || size > 64 {
        return Err(Error::Invalid("packer: field width must be 1..=64 bits"));
    }
    let start = field.start_bit();
    if (start + size).div_ceil(8) > buf.len() {
        return Err(Error::MsgSize);
    }
    let mut v = 0u64;
    for i in 0..size {
        let pos = start + i;
        let bit = (buf[pos / 8] >> (7 - pos % 8)) & 1;
        v = (v << 1) | u64::from(bit);
    }
    Ok(v)
}

/// Linux `ib_pack`: writes `values[i]` into field `desc[i]` of `buf`;
/// `RESERVED` fields are written as zero whatever their value.
#[doc(alias = "ib_pack")]
pub fn pack(desc: &[IbField], values: &[u64], buf: &mut [u8]) -> Result<()> {
    if desc.len() != values.len() {
        return Err(Error::Invalid("packer: one value per field"));
    }
    for (f, &v) in desc.iter().zip(values) {
        let v = if f.name == "RESERVED" { 0 } else { v };
        pack_field(f, v, buf)?;
    }
    Ok(())
}

/// Linux `ib_unpack`: reads every field of `desc` from `buf` into `values`
/// (`RESERVED` fields read as they are).
#[doc(alias = "ib_unpack")]
pub fn unpack(desc: &[IbField], buf: &[u8], values: &mut [u64]) -> Result<()> {
    if desc.len() != values.len() {
        return Err(Error::Invalid("packer: one value per field"));
    }
    for (f, v) in desc.iter().zip(values.iter_mut()) {
        *v = unpack_field(f, buf)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_land_msb_first_in_big_endian_dwords() {
        let mut b = [0u8; 8];
        // 4 bits at the top of dword 0, 11 bits at bit 5 of dword 1.
        pack_field(&IbField::new("vl", 0, 0, 4), 0xf, &mut b).unwrap();
        pack_field(&IbField::new("len", 1, 5, 11), 0x48, &mut b).unwrap();
        assert_eq!(b, [0xf0, 0, 0, 0, 0x00, 0x48, 0, 0]);
        assert_eq!(
            unpack_field(&IbField::new("len", 1, 5, 11), &b).unwrap(),
            0x48
        );
        // Masked to the width, neighbours untouched.
        pack_field(&IbField::new("x", 0, 4, 4), 0x1ff, &mut b).unwrap();
        assert_eq!(b[0], 0xff);
        pack_field(&IbField::new("x", 0, 4, 4), 0, &mut b).unwrap();
        assert_eq!(b[0], 0xf0);
        let f64 = IbField::new("q", 0, 0, 64);
        pack_field(&f64, 0x0102_0304_0506_0708, &mut b).unwrap();
        assert_eq!(unpack_field(&f64, &b).unwrap(), 0x0102_0304_0506_0708);
    }

    #[test]
    fn bad_descriptors_and_short_buffers_are_errors() {
        let mut b = [0u8; 4];
        assert_eq!(
            pack_field(&IbField::new("x", 1, 0, 8), 1, &mut b),
            Err(Error::MsgSize)
        );
        assert!(pack_field(&IbField::new("x", 0, 0, 0), 1, &mut b).is_err());
        assert!(unpack_field(&IbField::new("x", 0, 0, 65), &b).is_err());
        assert!(pack(&[IbField::new("x", 0, 0, 8)], &[], &mut b).is_err());
    }

    #[test]
    fn reserved_fields_pack_as_zero() {
        let mut b = [0xffu8; 4];
        let d = [
            IbField::new("a", 0, 0, 8),
            IbField::new("RESERVED", 0, 8, 24),
        ];
        pack(&d, &[0x12, 0xabcdef], &mut b).unwrap();
        assert_eq!(b, [0x12, 0, 0, 0]);
    }
}
