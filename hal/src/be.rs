//! Big-endian integers as they sit in device-visible memory.
//!
//! Every mlx4 mailbox, context, WQE, CQE, EQE and doorbell value is
//! big-endian. These types keep the byte order in the type: construct from a
//! CPU value, convert back with `get`; there is no arithmetic on them, so a
//! value cannot be used without the conversion.

use core::fmt;

macro_rules! be_type {
    ($name:ident, $int:ty, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
        #[repr(transparent)]
        pub struct $name($int);

        impl $name {
            /// Stores a CPU value in big-endian order.
            pub const fn new(v: $int) -> Self {
                Self(v.to_be())
            }
            /// The CPU value.
            pub const fn get(self) -> $int {
                <$int>::from_be(self.0)
            }
            /// Reinterprets the raw in-memory representation (as loaded by a
            /// native-endian access) without swapping.
            pub const fn from_raw(raw: $int) -> Self {
                Self(raw)
            }
            /// The raw in-memory representation, for a native-endian store.
            pub const fn to_raw(self) -> $int {
                self.0
            }
            /// The big-endian bytes.
            pub const fn to_bytes(self) -> [u8; core::mem::size_of::<$int>()] {
                self.get().to_be_bytes()
            }
            /// From big-endian bytes.
            pub const fn from_bytes(b: [u8; core::mem::size_of::<$int>()]) -> Self {
                Self::new(<$int>::from_be_bytes(b))
            }
        }

        impl From<$int> for $name {
            fn from(v: $int) -> Self {
                Self::new(v)
            }
        }

        impl From<$name> for $int {
            fn from(v: $name) -> $int {
                v.get()
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.get())
            }
        }

        const _: () = assert!(core::mem::size_of::<$name>() == core::mem::size_of::<$int>());
    };
}

be_type!(Be16, u16, "A big-endian `u16`.");
be_type!(Be32, u32, "A big-endian `u32`.");
be_type!(Be64, u64, "A big-endian `u64`.");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_order_is_big_endian_in_memory() {
        let v = Be32::new(0x0102_0304);
        assert_eq!(v.to_raw().to_ne_bytes(), [1, 2, 3, 4]);
        assert_eq!(v.to_bytes(), [1, 2, 3, 4]);
        assert_eq!(Be32::from_bytes([1, 2, 3, 4]).get(), 0x0102_0304);
        assert_eq!(Be16::new(0xabcd).to_raw().to_ne_bytes(), [0xab, 0xcd]);
        let q = Be64::new(0x1122_3344_5566_7788);
        assert_eq!(q.to_raw().to_ne_bytes()[0], 0x11);
        assert_eq!(Be64::from_raw(q.to_raw()).get(), 0x1122_3344_5566_7788);
        assert_eq!(format!("{:?}", Be16::new(0x5ad)), "0x5ad");
    }
}
