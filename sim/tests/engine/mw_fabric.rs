//! Memory windows across a fabric.
//!
//! Two HCAs through a switch. SEND with Invalidate carries the R_Key in an IETH to
//! the responder, which invalidates its own window (or NAKs a bad key with "invalid
//! request"); a type 2 window's bound-QP check on requests that arrive over the
//! link.

use std::time::Duration;

use sim::Wire;
use sim::fabric::packet::opcode;
use sim::fabric::{FaultKind, FaultRule};

use crate::loopback::one;
use crate::pairs::{rc_qps, switched};
use crate::poster::*;

const ERR: u8 = 6;
const REM_ACCESS: u8 = 0x13;
const REM_INV_REQ: u8 = 0x12;
const LOC_ACCESS: u8 = 0x11;

struct Fx {
    a: Hca,
    b: Hca,
    ca: Cq,
    cb: Cq,
    /// A's QP 0x80, connected to B's 0x90.
    qa: Qp,
    qb: Qp,
    /// A's QP 0x84, connected to B's 0x94.
    qa2: Qp,
    qb2: Qp,
    /// A's buffer.
    la: Mr,
    /// B's parent MR (bind enabled).
    pm: Mr,
    /// B's receive buffer.
    rb: Mr,
    _w: Wire,
}

fn setup() -> Fx {
    let (mut a, mut b, w) = switched();
    let ca = a.cq(8);
    let cb = b.cq(8);
    let mut conn = |x: u32, y: u32| rc_qps((&mut a, &ca, x), (&mut b, &cb, y), |_| {});
    let (qa, qb) = conn(0x80, 0x90);
    let (qa2, qb2) = conn(0x84, 0x94);
    let la = a.mr(0x10_0000, 65_536, acc::ALL);
    let pm = b.mr(0x20_0000_0100, 65_536, acc::ALL | acc::BIND);
    let rb = b.mr(0x70_0000, 65_536, acc::ALL);
    Fx {
        a,
        b,
        ca,
        cb,
        qa,
        qb,
        qa2,
        qb2,
        la,
        pm,
        rb,
        _w: w,
    }
}

fn err(c: &Cqe) -> u8 {
    assert_eq!(c.opcode, 0x1e, "not an error CQE: {c:?}");
    c.syndrome
}

/// Binds a type 2 window of B over the parent's first `len` bytes through
/// B's QP 0x90 (`on_qb`) or 0x94; returns its R_Key.
fn bind2(f: &mut Fx, on_qb: bool, len: u64, rights: u32) -> u32 {
    let k = f.b.mw(PD, true);
    let w = Wr {
        opcode: op::BIND_MW,
        signalled: true,
        raw: Some(bind_seg(
            k,
            f.pm.key,
            f.pm.addr(0),
            len,
            rights,
            true,
            false,
        )),
        ..Wr::default()
    };
    if on_qb {
        f.qb.post(&f.b, &w);
    } else {
        f.qb2.post(&f.b, &w);
    }
    let c = one(&mut f.cb, true);
    assert!(c.ok(), "bind: {c:?}");
    k
}

/// A's QP 0x80 sends `len` bytes with Invalidate of `key`.
fn send_inval(f: &mut Fx, key: u32, len: u32) {
    f.qa.post(
        &f.a,
        &Wr {
            opcode: op::SEND_INVAL,
            signalled: true,
            imm: key,
            sges: vec![f.la.sge(0, len)],
            ..Wr::default()
        },
    );
    wait_steps(&f.a.r, Duration::from_millis(1));
}

fn rdma(f: &mut Fx, second: bool, opcode: u8, key: u32, len: u32) -> Cqe {
    let w = Wr {
        opcode,
        signalled: true,
        raddr: f.pm.addr(0),
        rkey: key,
        swap: 1,
        sges: vec![f.la.sge(0, len)],
        ..Wr::default()
    };
    if second {
        f.qa2.post(&f.a, &w);
    } else {
        f.qa.post(&f.a, &w);
    }
    wait_steps(&f.a.r, Duration::from_millis(1));
    one(&mut f.ca, true)
}

#[test]
fn send_with_invalidate_crosses_the_switch_and_the_key_is_refused_afterwards() {
    // One packet (SEND Only with Invalidate) and three at MTU 4096 (the
    // IETH on SEND Last with Invalidate).
    for len in [21u32, 10_000] {
        let mut f = setup();
        let k = bind2(&mut f, true, 4096, acc::RW);
        let data = Rng(u64::from(len)).bytes(len as usize);
        f.la.write(0, &data);
        f.qb.post_recv(&[f.rb.sge(0, 16_384)]);
        send_inval(&mut f, k, len);
        let s = one(&mut f.ca, true);
        assert!(s.ok(), "{len}: {s:?} {:?}", f.a.r.sim.violations());
        assert_eq!(s.opcode, op::SEND_INVAL);
        let r = one(&mut f.cb, false);
        assert!(r.ok(), "{len}: {r:?}");
        assert_eq!((r.opcode, r.imm, r.byte_cnt), (3, k, len), "SEND_INVAL CQE");
        assert_eq!(f.rb.read(0, len as usize), data);
        // The window is gone on B: a WRITE through it is refused ...
        let c = rdma(&mut f, false, op::RDMA_WRITE, k, 8);
        assert_eq!(err(&c), REM_ACCESS, "{len}: invalidated key refused");
        assert_eq!(f.b.qp_state(f.qb.qpn), ERR);
        // ... and so is a second invalidation (on the other QP pair).
        let mut f2 = setup();
        let k = bind2(&mut f2, true, 4096, acc::RW);
        f2.qb.post_recv(&[f2.rb.sge(0, 16_384)]);
        send_inval(&mut f2, k, len);
        assert!(one(&mut f2.ca, true).ok());
        assert!(one(&mut f2.cb, false).ok());
        f2.qb.post_recv(&[f2.rb.sge(0, 16_384)]);
        send_inval(&mut f2, k, len);
        assert_eq!(err(&one(&mut f2.ca, true)), REM_INV_REQ, "{len}: twice");
        assert_eq!(err(&one(&mut f2.cb, false)), LOC_ACCESS);
        f.a.assert_no_violations();
        f2.a.assert_no_violations();
    }
}

#[test]
fn send_with_invalidate_of_a_bad_key_is_naked_invalid_request() {
    // A window never bound, a window bound to B's other QP, a region key.
    for len in [8u32, 10_000] {
        for case in 0..3 {
            let mut f = setup();
            let key = match case {
                0 => f.b.mw(PD, true),
                1 => bind2(&mut f, false, 4096, acc::RW),
                _ => f.pm.key,
            };
            f.qb.post_recv(&[f.rb.sge(0, 16_384)]);
            send_inval(&mut f, key, len);
            let s = one(&mut f.ca, true);
            assert_eq!(err(&s), REM_INV_REQ, "{len} case {case}");
            assert_eq!(s.qpn, f.qa.qpn);
            let r = one(&mut f.cb, false);
            assert_eq!(err(&r), LOC_ACCESS, "{len} case {case}: local access");
            assert_eq!(f.b.qp_state(f.qb.qpn), ERR);
            assert_eq!(f.a.qp_state(f.qa.qpn), ERR);
            f.a.assert_no_violations();
            if case == 1 {
                // The window bound to 0x94 still works there.
                f.la.write(0, b"still bound");
                let c = rdma(&mut f, true, op::RDMA_WRITE, key, 11);
                assert!(c.ok(), "{c:?}");
                assert_eq!(f.pm.read(0, 11), b"still bound");
            }
        }
    }
}

#[test]
fn a_type2_window_refuses_requests_arriving_at_another_qp() {
    // Bound through B's QP 0x94: A's 0x84 (connected to it) may use it;
    // A's 0x80 (connected to 0x90) may not, for each operation, one
    // packet or several.
    let cases = [
        (op::RDMA_WRITE, 8u32),
        (op::RDMA_WRITE, 10_000),
        (op::RDMA_READ, 8),
        (op::RDMA_READ, 10_000),
        (op::ATOMIC_FA, 8),
    ];
    for (opc, len) in cases {
        let mut f = setup();
        let k = bind2(&mut f, false, 16_384, acc::RR | acc::RW | acc::RA);
        let data = Rng(7).bytes(len as usize);
        f.la.write(0, &data);
        let c = rdma(&mut f, true, opc, k, len);
        assert!(c.ok(), "{opc:#x} {len} at the bound QP: {c:?}");
        if opc == op::RDMA_WRITE {
            assert_eq!(f.pm.read(0, len as usize), data);
        }
        let before = f.pm.read(0, len as usize);
        f.la.write(0, &vec![0x5a; len as usize]);
        let c = rdma(&mut f, false, opc, k, len);
        assert_eq!(err(&c), REM_ACCESS, "{opc:#x} {len} at another QP");
        assert_eq!(f.b.qp_state(f.qb.qpn), ERR, "{opc:#x} {len}");
        assert_eq!(f.pm.read(0, len as usize), before, "nothing written");
        f.a.assert_no_violations();
    }
}

/// A SEND with Invalidate whose ACK is lost: the requester resends it
/// after the ACK timeout; the responder answers the duplicate with an ACK
/// without checking the key again (it is already invalidated) or
/// delivering the message twice, and the send completes with success.
#[test]
fn a_resent_send_with_invalidate_is_acked_as_a_duplicate() {
    for len in [21u32, 10_000] {
        let mut f = setup();
        let k = bind2(&mut f, true, 4096, acc::RW);
        f.qb.post_recv(&[f.rb.sge(0, 16_384)]);
        f.qb.post_recv(&[f.rb.sge(16_384, 16_384)]);
        f._w.fabric().lock().unwrap().faults.add(
            FaultRule::new(FaultKind::Drop)
                .qpn(f.qa.qpn)
                .opcode(opcode::RC | opcode::ACKNOWLEDGE)
                .times(1),
        );
        send_inval(&mut f, k, len);
        assert!(f.ca.drain().is_empty(), "{len}: the ACK was lost");
        // The ACK timeout (4.2 ms) passes; the resent SEND is a duplicate.
        wait_steps(&f.a.r, Duration::from_millis(6));
        let s = one(&mut f.ca, true);
        assert!(s.ok(), "{len}: {s:?}");
        let r = f.cb.drain();
        assert_eq!(r.len(), 1, "{len}: delivered once: {r:?}");
        assert_eq!((r[0].opcode, r[0].imm, r[0].wqe_counter), (3, k, 0));
        assert_eq!(f.b.qp_state(f.qb.qpn), 3, "{len}: responder still RTS");
        let c = rdma(&mut f, false, op::RDMA_WRITE, k, 8);
        assert_eq!(err(&c), REM_ACCESS, "{len}: the key stays invalidated");
        f.a.assert_no_violations();
        f.b.assert_no_violations();
    }
}

/// SEND Only and SEND Last with Invalidate as they cross the switch,
/// dissected by `tshark -V`: the opcodes and the IETH's R_Key decode, no
/// malformed frame, no expert info.
#[test]
fn send_with_invalidate_dissects_in_tshark_with_its_ieth() {
    let mut f = setup();
    let path = std::env::temp_dir().join(format!("mw-capture-{}.pcap", std::process::id()));
    let fabric = f._w.fabric();
    fabric
        .lock()
        .unwrap()
        .set_capture(Some(sim::fabric::Capture::create(&path).unwrap()));
    let mut keys = Vec::new();
    for len in [21u32, 10_000] {
        let k = bind2(&mut f, true, 4096, acc::RW);
        f.qb.post_recv(&[f.rb.sge(0, 16_384)]);
        send_inval(&mut f, k, len);
        assert!(one(&mut f.ca, true).ok());
        assert_eq!(one(&mut f.cb, false).opcode, 3);
        keys.push(k);
    }
    let mut c = fabric.lock().unwrap().set_capture(None).unwrap();
    c.flush().unwrap();
    drop(c);
    let Some(ts) = ["/usr/bin/tshark", "/usr/local/bin/tshark"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
    else {
        eprintln!("*** SKIPPED: tshark is not installed (scripts/deps.sh ensure_tshark) ***");
        let _ = std::fs::remove_file(&path);
        return;
    };
    let out = std::process::Command::new(ts)
        .args(["-r", path.to_str().unwrap(), "-V"])
        .env("HOME", std::env::temp_dir())
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(!v.contains("Malformed"), "a malformed frame:\n{v}");
    assert!(!v.contains("Expert Info"), "expert info:\n{v}");
    for what in [
        "(RC) - SEND Only with Invalidate (23)".to_string(),
        "(RC) - SEND Last with Invalidate (22)".to_string(),
        "IETH - Invalidate Extended Transport Header".to_string(),
        format!("RKey: {:08x}", keys[0]),
        format!("RKey: {:08x}", keys[1]),
    ] {
        assert!(v.contains(&what), "no {what} in the capture:\n{v}");
    }
}
