//! The few pieces of C's `printf` and `libm` the tools' output needs.
//!
//! The few pieces of C's `printf` and `libm` the tools' output needs in `no_std`:
//! `%#0Nx` (alternate hex, which prints a bare zero without `0x`), `ceil` and
//! `sqrt` on `f64`, and glibc's `inet_ntop` of a GID; nothing else of C is
//! modelled.

use core::fmt::{self, Write};

use ib_core::verbs::Gid;

/// C's `%#0<width>x`: `0x` and zero-padded hex, the prefix counted in the
/// width; zero has no prefix and is zero-padded to the width (`%#04x` of 0
/// is `0000`, of 3 is `0x03`).
#[derive(Debug, Clone, Copy)]
pub struct AltHex {
    /// The value.
    pub v: u64,
    /// The field width, prefix included.
    pub width: usize,
}

impl fmt::Display for AltHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.v == 0 {
            write!(f, "{:0w$}", 0, w = self.width.max(1))
        } else {
            write!(f, "0x{:0w$x}", self.v, w = self.width.saturating_sub(2))
        }
    }
}

/// `ceil` for non-negative finite values below 2^53 (what perftest's
/// percentile indices need); others come back unchanged.
pub fn ceil(x: f64) -> f64 {
    if !(0.0..9_007_199_254_740_992.0).contains(&x) {
        return x;
    }
    let t = x as u64 as f64;
    if t < x { t + 1.0 } else { t }
}

/// Square root by Newton's method (at most 100 steps; exact to the last bit
/// or two, which is all a printed `%.2f` needs). Negative or NaN: NaN.
pub fn sqrt(x: f64) -> f64 {
    if x.is_nan() || x < 0.0 {
        return f64::NAN;
    }
    if x == 0.0 || x.is_infinite() {
        return x;
    }
    let mut g = if x > 1.0 { x / 2.0 } else { 1.0 };
    for _ in 0..100 {
        let n = 0.5 * (g + x / g);
        if n == g || (n - g).abs() <= f64::EPSILON * n {
            return n;
        }
        g = n;
    }
    g
}

/// A GID as `inet_ntop(AF_INET6)` writes it (RFC 5952 as glibc does it:
/// lower-case groups without leading zeros, the longest run of two or more
/// zero groups as `::`, and the IPv4-compatible forms), as rdma-core's
/// pingpongs and saquery print it.
pub struct GidStr(pub Gid);

impl fmt::Display for GidStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0.0;
        let w: [u16; 8] = core::array::from_fn(|i| u16::from_be_bytes([b[2 * i], b[2 * i + 1]]));
        // The longest run of at least two zero groups (the first of equals).
        let (mut best, mut best_len) = (usize::MAX, 0usize);
        let mut i = 0;
        while i < 8 {
            if w[i] == 0 {
                let s = i;
                while i < 8 && w[i] == 0 {
                    i += 1;
                }
                if i - s > best_len && i - s >= 2 {
                    best = s;
                    best_len = i - s;
                }
            } else {
                i += 1;
            }
        }
        // IPv4-compatible and IPv4-mapped forms, as glibc prints them.
        let v4 = best == 0 && (best_len == 6 || (best_len == 5 && w[5] == 0xffff));
        let end = if v4 { 6 } else { 8 };
        let mut i = 0;
        while i < end {
            if i == best {
                f.write_str(if i == 0 { "::" } else { ":" })?;
                i += best_len;
                continue;
            }
            write!(f, "{:x}", w[i])?;
            if i + 1 < end {
                f.write_char(':')?;
            }
            i += 1;
        }
        if v4 {
            if best_len == 5 {
                f.write_char(':')?;
            }
            write!(f, "{}.{}.{}.{}", b[12], b[13], b[14], b[15])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alt_hex_matches_c() {
        assert_eq!(format!("{}", AltHex { v: 0, width: 4 }), "0000");
        assert_eq!(format!("{}", AltHex { v: 3, width: 4 }), "0x03");
        assert_eq!(format!("{}", AltHex { v: 0x4a, width: 6 }), "0x004a");
        assert_eq!(
            format!(
                "{}",
                AltHex {
                    v: 0x28004000,
                    width: 8
                }
            ),
            "0x28004000"
        );
        assert_eq!(
            format!(
                "{}",
                AltHex {
                    v: 0x7f12_3456_7000,
                    width: 16
                }
            ),
            "0x007f1234567000"
        );
    }

    #[test]
    fn ceil_and_sqrt() {
        assert_eq!(ceil(98.01), 99.0);
        assert_eq!(ceil(99.0), 99.0);
        assert_eq!(ceil(0.0), 0.0);
        // 100 * 0.99 rounds to exactly 99 in binary, as in C.
        assert_eq!(ceil(100.0 * 0.99), 99.0);
        assert_eq!(sqrt(4.0), 2.0);
        assert!((sqrt(2.0) - core::f64::consts::SQRT_2).abs() < 1e-15);
        assert!((sqrt(1e-6) - 1e-3).abs() < 1e-18);
        assert!(sqrt(-1.0).is_nan());
    }
}
