//! The kernel command line.
//!
//! Kernel command line: space-separated `key=value` words, values may be
//! double-quoted (`run="lspci -v; meminfo" log=info,kernel::pci=debug`).
//! GRUB's Multiboot loader escapes quotes with a backslash when it builds the
//! command line, so `\"` opens and closes a value as well.

/// Iterates `(key, value)` pairs; a bare word has an empty value.
pub fn pairs(cmdline: &str) -> impl Iterator<Item = (&str, &str)> {
    let mut rest = cmdline;
    core::iter::from_fn(move || {
        rest = rest.trim_start();
        if rest.is_empty() {
            return None;
        }
        let key_end = rest.find(['=', ' ']).unwrap_or(rest.len());
        let key = &rest[..key_end];
        rest = &rest[key_end..];
        let value = if let Some(r) = rest.strip_prefix('=') {
            let quote = if r.starts_with('"') {
                Some("\"")
            } else if r.starts_with("\\\"") {
                Some("\\\"")
            } else {
                None
            };
            if let Some(quote) = quote {
                let q = &r[quote.len()..];
                let end = q.find(quote).unwrap_or(q.len());
                rest = q.get(end + quote.len()..).unwrap_or("");
                &q[..end]
            } else {
                let end = r.find(' ').unwrap_or(r.len());
                rest = &r[end..];
                &r[..end]
            }
        } else {
            ""
        };
        Some((key, value))
    })
}

/// The value of `key`, if present.
pub fn get<'a>(cmdline: &'a str, key: &str) -> Option<&'a str> {
    pairs(cmdline).find(|&(k, _)| k == key).map(|(_, v)| v)
}
