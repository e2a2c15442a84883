//! The firmware's multicast group table: MGID_HASH, READ_MCG and WRITE_MCG against the MCG entries in ICM, and the lookup of a group's members that steers multicast datagrams.
//!
//! The table is the one INIT_HCA describes (A0/B0 steering): 2^log_mc_table_sz
//! entries of 2^log_mc_entry_sz bytes at mc_base, the first 2^log_mc_hash_sz of
//! them the hash table (MGM), the rest the overflow area (AMGM) the driver
//! allocates from. An entry (Linux `struct mlx4_mgm`, iPXE `hermonprm_mcg_entry`):
//! next entry index << 6 (BE32), member count in bits 23:0 and protocol in bits
//! 31:30 (BE32), 8 reserved bytes, the MGID, then one BE32 per member (QPN in
//! bits 23:0, block-loopback in bit 30). Left out: WRITE_MCG's promiscuous form
//! (opcode modifier 1, Ethernet steering), device-managed flow steering, and the
//! card's own hash function (the model has its own; a driver only ever uses
//! what MGID_HASH answers).
//!
//! What the card checks and the model records as violations: an index beyond
//! the table (BAD_INDEX), a member count beyond what the entry holds, reserved
//! bits, and the hash chains: a group written into a hash entry its MGID does
//! not hash to, a next index outside the overflow area or to the entry itself,
//! an entry chained to an empty one or to one of another bucket (BAD_PARAM).

use super::{CmdResult, Outcome, need};
use crate::hca::device::{FwState, Hca};
use crate::hca::hcr::{Command, Status};
use crate::hca::layout::{get32, put32};

/// Bytes before the member list.
pub const MGM_HEADER: usize = 0x20;
/// `MGM_QPN_MASK`.
pub const QPN_MASK: u32 = 0x00ff_ffff;
/// Block-loopback bit of a member word (`MGM_BLCK_LB_BIT`).
pub const BLCK_LB: u32 = 1 << 30;
/// Protocols (`enum mlx4_protocol`): IB/IPv6, Ethernet, IB/IPv4, FCoE.
pub const PROT_IB_IPV6: u32 = 0;
/// IB/IPv4.
pub const PROT_IB_IPV4: u32 = 2;

/// The table INIT_HCA set up: (base, log entry size, log hash size, log
/// table size); `BAD_SYS_STATE` (recorded) without one.
fn table(hca: &mut Hca, what: &str) -> Result<(u64, u8, u8, u8), Status> {
    need(hca, &[FwState::Initialized])?;
    let h = hca.geo()?.hca;
    if h.mc_base == 0 && h.log_mc_table_sz == 0 {
        hca.violation(format!("{what}: INIT_HCA set up no multicast table"));
        return Err(Status::BAD_SYS_STATE);
    }
    Ok((
        h.mc_base,
        h.log_mc_entry_sz.min(12),
        h.log_mc_hash_sz,
        h.log_mc_table_sz.min(24),
    ))
}

/// The model's MGID hash: FNV-1a over the 16 bytes, folded to the hash
/// table's size.
pub fn hash(mgid: &[u8; 16], log_hash: u8) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in mgid {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h ^ (h >> 16)) & ((1u32 << log_hash.min(24)) - 1)
}

/// One decoded entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Next entry of the hash chain (0: the end).
    pub next: u32,
    /// Protocol (bits 31:30 of the count word).
    pub prot: u32,
    /// The group's MGID.
    pub mgid: [u8; 16],
    /// Member words (QPN | block-loopback bit).
    pub members: Vec<u32>,
}

/// Decodes `b`; the member count is clamped to what the bytes hold.
pub fn decode(b: &[u8]) -> Entry {
    let count = (get32(b, 4) & 0xff_ffff) as usize;
    let n = count.min(b.len().saturating_sub(MGM_HEADER) / 4);
    let mut mgid = [0u8; 16];
    mgid.copy_from_slice(&b[0x10..0x20]);
    Entry {
        next: get32(b, 0) >> 6,
        prot: get32(b, 4) >> 30,
        mgid,
        members: (0..n).map(|i| get32(b, MGM_HEADER + 4 * i)).collect(),
    }
}

/// Reads entry `index` from ICM.
fn read_entry(hca: &mut Hca, base: u64, log_entry: u8, index: u32) -> Result<Vec<u8>, Status> {
    let mut b = vec![0u8; 1 << log_entry];
    hca.icm_read(base + (u64::from(index) << log_entry), &mut b)?;
    Ok(b)
}

/// The entry index a command names (in_mod), checked against the table.
fn index(hca: &mut Hca, cmd: &Command, table_log: u8) -> Result<u32, Status> {
    if u64::from(cmd.in_mod) >= 1u64 << table_log {
        hca.violation(format!(
            "{}: MCG index {:#x} beyond the {}-entry table",
            cmd.opcode,
            cmd.in_mod,
            1u64 << table_log
        ));
        return Err(Status::BAD_INDEX);
    }
    Ok(cmd.in_mod)
}

/// MGID_HASH: in_param a mailbox with the MGID, op_mod 0 (IB) or 1
/// (Ethernet VEP steering); the hash-table index in the immediate output.
pub fn mgid_hash(hca: &mut Hca, cmd: &Command) -> CmdResult {
    let (_, _, log_hash, _) = table(hca, "MGID_HASH")?;
    if cmd.op_mod > 1 {
        return Err(Status::BAD_OP);
    }
    let b = hca.read_mailbox(cmd.in_param, 16)?;
    let mut mgid = [0u8; 16];
    mgid.copy_from_slice(&b);
    Ok(Outcome::imm(u64::from(hash(&mgid, log_hash))))
}

/// READ_MCG: in_mod the entry index; the entry in the output mailbox.
pub fn read_mcg(hca: &mut Hca, cmd: &Command) -> CmdResult {
    let (base, log_entry, _, log_table) = table(hca, "READ_MCG")?;
    if cmd.op_mod != 0 {
        return Err(Status::BAD_OP);
    }
    let i = index(hca, cmd, log_table)?;
    let b = read_entry(hca, base, log_entry, i)?;
    hca.write_mailbox(cmd.out_param, &b)?;
    Ok(Outcome::OK)
}

/// Records `msg` for WRITE_MCG of entry `i` and refuses it (BAD_PARAM).
fn refuse(hca: &mut Hca, i: u32, msg: String) -> Status {
    hca.violation(format!("WRITE_MCG {i:#x}: {msg}"));
    Status::BAD_PARAM
}

/// WRITE_MCG: in_mod the entry index, the entry in the input mailbox; the
/// entry and its chain are checked before it is written to ICM.
pub fn write_mcg(hca: &mut Hca, cmd: &Command) -> CmdResult {
    let (base, log_entry, log_hash, log_table) = table(hca, "WRITE_MCG")?;
    if cmd.op_mod != 0 {
        // The promiscuous form (Ethernet steering, in_mod port << 16 |
        // steer << 1) is not modelled.
        return Err(Status::BAD_OP);
    }
    let i = index(hca, cmd, log_table)?;
    let b = hca.read_mailbox(cmd.in_param, 1 << log_entry)?;
    let w0 = get32(&b, 0);
    let w1 = get32(&b, 4);
    if w0 & 0x3f != 0 || w1 & 0x3f00_0000 != 0 || get32(&b, 8) | get32(&b, 12) != 0 {
        return Err(refuse(
            hca,
            i,
            format!("reserved bits set (dwords {w0:#010x} {w1:#010x})"),
        ));
    }
    let count = w1 & 0xff_ffff;
    let capacity = ((1u32 << log_entry) - MGM_HEADER as u32) / 4;
    if count > capacity {
        return Err(refuse(
            hca,
            i,
            format!(
                "member count {count} beyond the entry's capacity ({capacity} QPs in {} bytes)",
                1u32 << log_entry
            ),
        ));
    }
    let e = decode(&b);
    let hash_size = 1u32 << log_hash;
    let table_size = 1u64 << log_table;
    if e.next != 0 {
        if e.next < hash_size || u64::from(e.next) >= table_size {
            return Err(refuse(
                hca,
                i,
                format!(
                    "next index {:#x} outside the overflow area {hash_size:#x}..{table_size:#x}",
                    e.next
                ),
            ));
        }
        if e.next == i {
            return Err(refuse(hca, i, "the entry chains to itself".into()));
        }
        if count == 0 {
            return Err(refuse(
                hca,
                i,
                format!("an empty entry chains to {:#x}", e.next),
            ));
        }
    }
    if count > 0 {
        let h = hash(&e.mgid, log_hash);
        if i < hash_size && h != i {
            return Err(refuse(
                hca,
                i,
                format!(
                    "MGID {} hashes to {h:#x}, not to this hash entry",
                    mgid_str(&e.mgid)
                ),
            ));
        }
        if e.next != 0 {
            let nb = read_entry(hca, base, log_entry, e.next)?;
            let n = decode(&nb);
            if n.members.is_empty() {
                return Err(refuse(
                    hca,
                    i,
                    format!("chains to {:#x}, an empty entry", e.next),
                ));
            }
            if hash(&n.mgid, log_hash) != h {
                return Err(refuse(
                    hca,
                    i,
                    format!(
                        "chains to {:#x}, whose MGID {} is in another bucket",
                        e.next,
                        mgid_str(&n.mgid)
                    ),
                ));
            }
        }
    }
    hca.icm_write(base + (u64::from(i) << log_entry), &b)?;
    Ok(Outcome::OK)
}

/// The MGID in IPv6 text (full form).
pub fn mgid_str(g: &[u8; 16]) -> String {
    let mut s = String::new();
    for i in 0..8 {
        if i > 0 {
            s.push(':');
        }
        s.push_str(&format!("{:02x}{:02x}", g[2 * i], g[2 * i + 1]));
    }
    s
}

/// The member words of IB group `mgid` as the card finds them for a
/// packet: from the MGID's hash entry along the chain (at most the table's
/// size of steps: a loop in host memory ends the walk); `None` without a
/// table or a group, or if an entry cannot be read.
pub fn members(hca: &mut Hca, mgid: &[u8; 16]) -> Option<Vec<u32>> {
    let h = hca.geo.as_ref()?.hca;
    if h.mc_base == 0 && h.log_mc_table_sz == 0 {
        return None;
    }
    let (log_entry, log_table) = (h.log_mc_entry_sz.min(12), h.log_mc_table_sz.min(24));
    let mut i = hash(mgid, h.log_mc_hash_sz);
    for _ in 0..(1u64 << log_table) {
        if u64::from(i) >= 1u64 << log_table {
            return None;
        }
        let b = read_entry(hca, h.mc_base, log_entry, i).ok()?;
        let e = decode(&b);
        if e.members.is_empty() {
            return None;
        }
        if e.mgid == *mgid && matches!(e.prot, PROT_IB_IPV6 | PROT_IB_IPV4) {
            return Some(e.members);
        }
        if e.next == 0 {
            return None;
        }
        i = e.next;
    }
    None
}

/// Encodes an entry (tests and tools): `entry_size` bytes.
pub fn encode(e: &Entry, entry_size: usize) -> Vec<u8> {
    let mut b = vec![0u8; entry_size];
    put32(&mut b, 0, e.next << 6);
    put32(
        &mut b,
        4,
        (e.members.len() as u32 & 0xff_ffff) | (e.prot & 3) << 30,
    );
    b[0x10..0x20].copy_from_slice(&e.mgid);
    for (k, w) in e.members.iter().enumerate() {
        if MGM_HEADER + 4 * k + 4 <= entry_size {
            put32(&mut b, MGM_HEADER + 4 * k, *w);
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_decode_as_linux_writes_them() {
        let e = Entry {
            next: 0x81,
            prot: PROT_IB_IPV6,
            mgid: [0xff; 16],
            members: vec![0x48, 0x49 | BLCK_LB],
        };
        let b = encode(&e, 64);
        assert_eq!(b[0..8], [0, 0, 0x20, 0x40, 0, 0, 0, 2]);
        assert_eq!(b[0x20..0x28], [0, 0, 0, 0x48, 0x40, 0, 0, 0x49]);
        assert_eq!(decode(&b), e);
        // A count beyond the bytes is clamped.
        let mut b = encode(&e, 64);
        b[7] = 200;
        assert_eq!(decode(&b).members.len(), 8);
    }

    #[test]
    fn the_hash_spreads_and_stays_in_the_table() {
        let mut seen = std::collections::BTreeSet::new();
        for k in 0..64u8 {
            let mut g = [0u8; 16];
            g[0] = 0xff;
            g[15] = k;
            let h = hash(&g, 4);
            assert!(h < 16);
            seen.insert(h);
        }
        assert!(seen.len() >= 12, "{seen:?}");
        assert_eq!(hash(&[0; 16], 0), 0);
    }
}
