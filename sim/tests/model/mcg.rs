//! MGID_HASH, READ_MCG and WRITE_MCG against the MCG table in ICM, with the checks the card makes (bad index, member count, reserved bits, hash chains).
//!
//! The small profile's table: 256 entries of 64 bytes (8 members each) at
//! `profile::MC`, the first 128 the hash table.

use super::harness::*;
use sim::hca::fw::mcg::{BLCK_LB, Entry, decode, encode};
use sim::{Opcode, Status};

const ENTRY: usize = 64;
const HASH: u32 = 128;
const TABLE: u32 = 256;

fn up() -> Raw {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    r
}

fn gid(k: u16) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..4].copy_from_slice(&[0xff, 0x12, 0x40, 0x1b]);
    g[14..].copy_from_slice(&k.to_be_bytes());
    g
}

fn hash(r: &mut Raw, g: &[u8; 16]) -> u32 {
    r.inbox.fill(0, 4096, 0);
    r.inbox.write_bytes(0, g);
    let a = r.inbox.bus_addr().0;
    r.post(a, 0, 0, 0, Opcode::MGID_HASH).unwrap() as u32
}

fn write(r: &mut Raw, index: u32, e: &Entry) -> R {
    r.cmd_in(&encode(e, ENTRY), index, 0, Opcode::WRITE_MCG)
}

fn read(r: &mut Raw, index: u32) -> R<Entry> {
    let b = r.cmd_out(index, 0, Opcode::READ_MCG)?;
    Ok(decode(&b[..ENTRY]))
}

fn group(g: [u8; 16], members: &[u32], next: u32) -> Entry {
    Entry {
        next,
        prot: 0,
        mgid: g,
        members: members.to_vec(),
    }
}

/// Two MGIDs that hash to the same bucket (found through MGID_HASH).
fn colliding(r: &mut Raw) -> ([u8; 16], [u8; 16], u32) {
    let first = gid(1);
    let h = hash(r, &first);
    for k in 2..4096 {
        let g = gid(k);
        if hash(r, &g) == h {
            return (first, g, h);
        }
    }
    panic!("no collision among 4096 MGIDs in 128 buckets");
}

#[test]
fn mgid_hash_is_stable_and_lands_in_the_hash_table() {
    let mut r = up();
    let mut buckets = std::collections::BTreeSet::new();
    for k in 0..200 {
        let h = hash(&mut r, &gid(k));
        assert!(h < HASH, "hash {h:#x}");
        assert_eq!(hash(&mut r, &gid(k)), h, "the same MGID, the same hash");
        buckets.insert(h);
    }
    assert!(buckets.len() > 64, "spread over {} buckets", buckets.len());
    assert!(r.ok_trace());
}

#[test]
fn an_entry_written_is_read_back_and_sits_in_icm() {
    let mut r = up();
    let g = gid(7);
    let h = hash(&mut r, &g);
    let e = group(g, &[0x48, 0x49 | BLCK_LB, 0x4a], 0);
    write(&mut r, h, &e).unwrap();
    assert_eq!(read(&mut r, h).unwrap(), e);
    let bytes = r.icm_peek(profile::MC + u64::from(h) * ENTRY as u64, ENTRY);
    assert_eq!(bytes, encode(&e, ENTRY), "the entry is the card's, in ICM");
    assert_eq!(
        r.sim.mcg_members(&g),
        Some(vec![0x48, 0x49 | BLCK_LB, 0x4a])
    );
    // An entry never written reads as zeros (an empty bucket).
    let other = (h + 1) % HASH;
    assert_eq!(read(&mut r, other).unwrap(), group([0; 16], &[], 0));
    assert!(r.ok_trace());
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
}

#[test]
fn a_hash_chain_through_the_overflow_area_finds_each_group() {
    let mut r = up();
    let (g1, g2, h) = colliding(&mut r);
    // Linux's attach of a second group in a used bucket: the new AMGM
    // entry first, then the link from the chain's last entry.
    write(&mut r, h, &group(g1, &[0x40], 0)).unwrap();
    write(&mut r, HASH + 3, &group(g2, &[0x41, 0x42], 0)).unwrap();
    write(&mut r, h, &group(g1, &[0x40], HASH + 3)).unwrap();
    assert_eq!(r.sim.mcg_members(&g1), Some(vec![0x40]));
    assert_eq!(r.sim.mcg_members(&g2), Some(vec![0x41, 0x42]));
    // Linux's detach of the head: its successor copied into the bucket.
    write(&mut r, h, &group(g2, &[0x41, 0x42], 0)).unwrap();
    assert_eq!(r.sim.mcg_members(&g1), None);
    assert_eq!(r.sim.mcg_members(&g2), Some(vec![0x41, 0x42]));
    // The last member gone: an empty bucket.
    write(&mut r, h, &group([0; 16], &[], 0)).unwrap();
    assert_eq!(r.sim.mcg_members(&g2), None);
    assert!(r.ok_trace());
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
}

#[test]
fn a_bad_index_is_refused() {
    let mut r = up();
    assert_eq!(
        r.cmd_out(TABLE, 0, Opcode::READ_MCG),
        Err(CmdError::Status(Status::BAD_INDEX))
    );
    assert_eq!(
        write(&mut r, 0x1_0000, &group(gid(1), &[1], 0)),
        Err(CmdError::Status(Status::BAD_INDEX))
    );
    assert!(r.violated("beyond the 256-entry table"));
}

#[test]
fn a_member_count_beyond_the_entry_is_refused() {
    let mut r = up();
    let g = gid(3);
    let h = hash(&mut r, &g);
    // 64 bytes: 32 of header, 8 members.
    let full: Vec<u32> = (0x40..0x48).collect();
    write(&mut r, h, &group(g, &full, 0)).unwrap();
    let mut b = encode(&group(g, &full, 0), ENTRY);
    b[7] = 9; // count 9 in an entry that holds 8
    assert_eq!(
        r.cmd_in(&b, h, 0, Opcode::WRITE_MCG),
        Err(CmdError::Status(Status::BAD_PARAM))
    );
    assert!(r.violated("member count 9 beyond the entry's capacity (8 QPs in 64 bytes)"));
    // The entry kept what it had.
    assert_eq!(read(&mut r, h).unwrap().members.len(), 8);
}

#[test]
fn broken_hash_chains_are_refused() {
    let mut r = up();
    let (g1, g2, h) = colliding(&mut r);
    // A group in a bucket its MGID does not hash to.
    let wrong = (h + 1) % HASH;
    assert_eq!(
        write(&mut r, wrong, &group(g1, &[0x40], 0)),
        Err(CmdError::Status(Status::BAD_PARAM))
    );
    assert!(r.violated("hashes to"));
    // A next index inside the hash table, past the table, or to itself.
    for (next, why) in [
        (5, "outside the overflow area"),
        (TABLE, "outside the overflow area"),
    ] {
        assert_eq!(
            write(&mut r, h, &group(g1, &[0x40], next)),
            Err(CmdError::Status(Status::BAD_PARAM)),
            "next {next:#x}"
        );
        assert!(r.violated(why));
    }
    assert_eq!(
        write(&mut r, HASH + 1, &group(g2, &[0x41], HASH + 1)),
        Err(CmdError::Status(Status::BAD_PARAM))
    );
    assert!(r.violated("chains to itself"));
    // A chain to an empty entry, and to a group of another bucket.
    assert_eq!(
        write(&mut r, h, &group(g1, &[0x40], HASH + 2)),
        Err(CmdError::Status(Status::BAD_PARAM))
    );
    assert!(r.violated("an empty entry"));
    let mut stranger = gid(999);
    while hash(&mut r, &stranger) == h {
        stranger[13] += 1;
    }
    write(&mut r, HASH + 2, &group(stranger, &[0x50], 0)).unwrap();
    assert_eq!(
        write(&mut r, h, &group(g1, &[0x40], HASH + 2)),
        Err(CmdError::Status(Status::BAD_PARAM))
    );
    assert!(r.violated("in another bucket"));
    // An empty entry that chains on.
    assert_eq!(
        write(&mut r, h, &group([0; 16], &[], HASH + 2)),
        Err(CmdError::Status(Status::BAD_PARAM))
    );
    assert!(r.violated("an empty entry chains to"));
    // Reserved bits of the header.
    let mut b = encode(&group(g1, &[0x40], 0), ENTRY);
    b[3] |= 1;
    assert_eq!(
        r.cmd_in(&b, h, 0, Opcode::WRITE_MCG),
        Err(CmdError::Status(Status::BAD_PARAM))
    );
    assert!(r.violated("reserved bits"));
}

#[test]
fn mcg_commands_need_an_initialized_hca_and_their_own_modifiers() {
    let mut r = Raw::new();
    load_fw(&mut r).unwrap();
    assert_eq!(
        r.cmd_out(0, 0, Opcode::READ_MCG),
        Err(CmdError::Status(Status::BAD_SYS_STATE))
    );
    init_after_fw_pub(&mut r).unwrap();
    // WRITE_MCG's promiscuous form (Ethernet steering) is not modelled;
    // READ_MCG and MGID_HASH have no such forms.
    let g = gid(1);
    assert_eq!(
        r.cmd_in(
            &encode(&group(g, &[1], 0), ENTRY),
            1 << 16,
            1,
            Opcode::WRITE_MCG
        ),
        Err(CmdError::Status(Status::BAD_OP))
    );
    assert_eq!(
        r.cmd_out(0, 1, Opcode::READ_MCG),
        Err(CmdError::Status(Status::BAD_OP))
    );
    r.inbox.write_bytes(0, &g);
    let a = r.inbox.bus_addr().0;
    assert_eq!(
        r.post(a, 0, 0, 2, Opcode::MGID_HASH),
        Err(CmdError::Status(Status::BAD_OP))
    );
}
