//! Stray MADs to the SM's LID (issue 21, item 1): a CM REQ, a Get of a
//! class nobody registered and the same to a LID of the SM's port under
//! LMC reach the SM host's MAD layer, which answers the Get with status
//! 0x000C and drops the rest, as a real host's does; OpenSM never sees
//! them (umad2sim would crash on a class it has no agent for) and keeps
//! answering.

use std::time::Duration;

use sim::fabric::ibsim::ETIMEDOUT;

use crate::protocol::{WAIT, connect, tid_of};
use crate::rig::{NET_SMALL, Rig, tools_present};

const UP_LIMIT: Duration = Duration::from_secs(30);
const DIAG_LIMIT: Duration = Duration::from_secs(20);

/// A GMP header: `class`, class version `ver`, `method`, `attr`, `tid`.
fn gmp(class: u8, ver: u8, method: u8, attr: u16, tid: u64) -> [u8; 256] {
    let mut m = [0u8; 256];
    m[0] = 1;
    m[1] = class;
    m[2] = ver;
    m[3] = method;
    m[8..16].copy_from_slice(&tid.to_be_bytes());
    m[16..18].copy_from_slice(&attr.to_be_bytes());
    m
}

/// Whether process `pid` is alive (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
    })
}

#[test]
fn stray_mads_to_the_sm_lid_never_end_opensm() {
    if !tools_present("stray_mads_to_the_sm_lid_never_end_opensm") {
        return;
    }
    let mut rig = Rig::start("stray", NET_SMALL);
    // LMC 1: the SM's port has two LIDs.
    let pid = rig.start_opensm("H1", &["-l", "1"]);
    assert!(
        rig.wait_subnet_up(1, UP_LIMIT).is_some(),
        "{}",
        rig.opensm_log()
    );
    let sm_lid = rig.world().server.node("H1").expect("H1").lid();
    assert_ne!(sm_lid, 0);
    let c = connect(&rig.base, 78001, "H2", false).expect("attach to H2");
    for (k, lid) in [sm_lid, sm_lid + 1].into_iter().enumerate() {
        let k = k as u64;
        // A CM REQ (class 0x07 version 2, Send, ConnectRequest): dropped.
        c.send(lid, 1, &gmp(0x07, 2, 0x03, 0x0010, 0x100 + k));
        // A Get of a vendor class nobody registered: status 0x000C.
        c.send(lid, 1, &gmp(0x09, 1, 0x01, 0x0001, 0x200 + k));
        let (st, m) = c.recv().expect("an answer to the vendor Get");
        assert_eq!(st, 0, "answered, not timed out (LID {lid})");
        assert_eq!(tid_of(&m), 0x200 + k);
        assert_eq!((m[1], m[3]), (0x09, 0x81), "a GetResp of the same class");
        assert_eq!(
            u16::from_be_bytes([m[4], m[5]]),
            0x000c,
            "unsupported method/attribute (LID {lid})"
        );
        // An SA Get of a class version OpenSM did not register: 0x000C
        // too (the SA's agent is version 2).
        c.send(lid, 1, &gmp(0x03, 1, 0x01, 0x0035, 0x300 + k));
        let (st, m) = c.recv().expect("an answer to the SA Get of version 1");
        assert_eq!((st, tid_of(&m)), (0, 0x300 + k));
        assert_eq!(u16::from_be_bytes([m[4], m[5]]), 0x000c);
    }
    // A Report to the SA (a method its agent does not take): dropped, so
    // the sender's only answer is the server's timeout (status 110).
    c.send(sm_lid, 1, &gmp(0x03, 2, 0x06, 0x0002, 0x400));
    let (st, m) = c.recv().expect("the Report comes back timed out");
    assert_eq!((st, tid_of(&m), m[3]), (ETIMEDOUT, 0x400, 0x06));
    // Nothing came back for the CM REQs.
    c.data
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(c.recv().is_none(), "no answer to a Send");
    c.data.set_read_timeout(Some(WAIT)).unwrap();

    let (ok, out, _) = rig.diag("H2", "/usr/sbin/sminfo", &[], DIAG_LIMIT);
    assert!(
        ok && out.contains(&format!("sminfo: sm lid {sm_lid} ")) && out.contains("SMINFO_MASTER"),
        "OpenSM still answers SMInfo:\n{out}\n{}",
        rig.opensm_log()
    );
    assert!(alive(pid), "OpenSM runs:\n{}", rig.opensm_log());
    let s = rig.world().server.stats().clone();
    assert!(s.unsupported_replies >= 4, "{s:?}");
    assert!(
        s.dropped
            .get("no agent for the class and method")
            .is_some_and(|&n| n >= 3),
        "the CM REQs and the Report dropped by H1's MAD layer: {s:?}"
    );
    // A saquery to the SA still works (the SA's agent is registered).
    let (ok, out, _) = rig.diag(
        "H2",
        "/usr/sbin/saquery",
        &["-p", "--src-to-dst", &format!("{sm_lid}:{sm_lid}")],
        DIAG_LIMIT,
    );
    assert!(ok && out.contains("PathRecord dump:"), "saquery -p:\n{out}");
}
