//! Memory windows within one HCA.
//!
//! Memory windows: BIND_MW of type 1 and type 2 windows, RDMA through the
//! window's R_Key checked against the window, each bind error with the
//! memory-window bind syndrome, LOCAL_INVAL and SEND with Invalidate, and
//! the firmware side (SW2HW_MPT / HW2SW_MPT of window entries).

use sim::{Opcode, Status};

use crate::harness::CmdError;
use crate::loopback::one;
use crate::pairs::pair;
use crate::poster::*;

const ERR: u8 = 6;
const MW_BIND: (u8, u8) = (0x06, 0x6a);
const REM_ACCESS: u8 = 0x13;
const REM_INV_REQ: u8 = 0x12;

struct Fx {
    h: Hca,
    cq: Cq,
    a: Qp,
    b: Qp,
    /// Requester's local buffer.
    la: Mr,
    /// The parent MR on the responder's side (bind enabled).
    pm: Mr,
}

fn setup() -> Fx {
    let mut h = Hca::new();
    let cq = h.cq(8);
    let (a, b, _) = pair(&mut h, RC, &cq);
    let la = h.mr(0x10_0000, 16_384, acc::ALL);
    let pm = h.mr(0x20_0000_0100, 16_384, acc::ALL | acc::BIND);
    Fx {
        h,
        cq,
        a,
        b,
        la,
        pm,
    }
}

fn sge(m: &Mr, off: u64, len: u32) -> Sge {
    Sge {
        addr: m.addr(off),
        len,
        lkey: m.key,
    }
}

fn err(c: &Cqe) -> (u8, u8) {
    assert_eq!(c.opcode, 0x1e, "not an error CQE: {c:?}");
    (c.syndrome, c.vendor)
}

fn bind_wr(seg: Vec<u8>) -> Wr {
    Wr {
        opcode: op::BIND_MW,
        signalled: true,
        raw: Some(seg),
        ..Wr::default()
    }
}

/// Binds on `q`; returns the send CQE.
fn bind(on_b: bool, seg: Vec<u8>, f: &mut Fx) -> Cqe {
    let w = bind_wr(seg);
    if on_b {
        f.b.post(&f.h, &w);
    } else {
        f.a.post(&f.h, &w);
    }
    one(&mut f.cq, true)
}

/// Binds `seg` through b (`on_b`) or a and expects success.
fn bind_ok(on_b: bool, seg: Vec<u8>, f: &mut Fx) {
    let c = bind(on_b, seg, f);
    assert!(c.ok(), "bind: {c:?}");
    assert_eq!(c.opcode, op::BIND_MW);
}

/// A new window (type 2 if `type2`, not zero-based) bound through b
/// (`on_b`) or a over the parent's bytes `off..off + len` with `rights`;
/// returns its R_Key.
fn bound(f: &mut Fx, type2: bool, on_b: bool, off: u64, len: u64, rights: u32) -> u32 {
    let k = f.h.mw(PD, type2);
    let seg = bind_seg(k, f.pm.key, f.pm.addr(off), len, rights, type2, false);
    bind_ok(on_b, seg, f);
    k
}

/// LOCAL_INVAL of `key` on b; returns its CQE.
fn local_inval(key: u32, f: &mut Fx) -> Cqe {
    f.b.post(
        &f.h,
        &Wr {
            opcode: op::LOCAL_INVAL,
            signalled: true,
            raw: Some(inval_seg(key)),
            ..Wr::default()
        },
    );
    one(&mut f.cq, true)
}

/// a sends the first `len` bytes of its buffer with Invalidate of `key`.
fn send_inval(key: u32, len: u32, f: &mut Fx) {
    f.a.post(
        &f.h,
        &Wr {
            opcode: op::SEND_INVAL,
            signalled: true,
            imm: key,
            sges: vec![sge(&f.la, 0, len)],
            ..Wr::default()
        },
    );
}

/// An RDMA WRITE, READ or fetch-and-add (adding 1) from a; returns its
/// CQE.
fn rdma(opcode: u8, raddr: u64, rkey: u32, local_off: u64, len: u32, f: &mut Fx) -> Cqe {
    let w = Wr {
        opcode,
        signalled: true,
        raddr,
        rkey,
        swap: 1,
        sges: vec![sge(&f.la, local_off, len)],
        ..Wr::default()
    };
    f.a.post(&f.h, &w);
    one(&mut f.cq, true)
}

#[test]
fn type2_window_allows_rdma_inside_and_refuses_outside() {
    // Window over parent bytes 4096..8192, remote read + write.
    for outside in 0..4 {
        let mut f = setup();
        let k = f.h.mw(PD, true);
        let rkey = (k & !0xff) | 0x42;
        let rights = acc::RR | acc::RW;
        let seg = bind_seg(rkey, f.pm.key, f.pm.addr(4096), 4096, rights, true, false);
        bind_ok(true, seg, &mut f);
        // WRITE and READ inside the window move bytes into/out of the parent.
        let data: Vec<u8> = (0..300u32).map(|i| (i * 13 + 1) as u8).collect();
        f.la.write(0, &data);
        let c = rdma(op::RDMA_WRITE, f.pm.addr(4096 + 3900), rkey, 0, 196, &mut f);
        assert!(c.ok(), "write inside: {c:?}");
        assert_eq!(f.pm.read(4096 + 3900, 196), data[..196]);
        f.pm.write(4096, &data);
        let c = rdma(op::RDMA_READ, f.pm.addr(4096), rkey, 8000, 300, &mut f);
        assert!(c.ok(), "read inside: {c:?}");
        assert_eq!(c.byte_cnt, 300);
        assert_eq!(f.la.read(8000, 300), data);
        // Each refusal, on a fresh requester/responder pair state.
        let (opc, raddr, key, len) = match outside {
            0 => (op::RDMA_WRITE, f.pm.addr(4096 + 4000), rkey, 100), // runs past the end
            1 => (op::RDMA_READ, f.pm.addr(4000), rkey, 100),         // starts before it
            2 => (op::ATOMIC_FA, f.pm.addr(4096), rkey, 8),           // no atomic right
            _ => (op::RDMA_WRITE, f.pm.addr(4096), rkey ^ 0x01, 8),   // key byte differs
        };
        let c = rdma(opc, raddr, key, 0, len, &mut f);
        assert_eq!(err(&c).0, REM_ACCESS, "case {outside}");
        assert_eq!(f.h.qp_state(f.a.qpn), ERR);
        assert_eq!(f.h.qp_state(f.b.qpn), ERR, "responder broken too");
        // The parent outside the window was not touched by the refused write.
        if outside == 0 {
            assert_ne!(f.pm.read(4096 + 4000, 96), data[..96]);
        }
    }
}

#[test]
fn zero_based_type2_and_the_bound_qp() {
    let mut f = setup();
    let k = f.h.mw(PD, true);
    let seg = bind_seg(k, f.pm.key, f.pm.addr(1000), 2000, acc::RR, true, true);
    bind_ok(true, seg, &mut f);
    f.pm.write(1000, b"window-at-zero");
    let c = rdma(op::RDMA_READ, 0, k, 0, 14, &mut f);
    assert!(c.ok(), "{c:?}");
    assert_eq!(f.la.read(0, 14), b"window-at-zero");
    // The parent address is not a window address: 1000 + 2000 > 2000.
    let c = rdma(op::RDMA_READ, f.pm.addr(1000), k, 0, 14, &mut f);
    assert_eq!(err(&c).0, REM_ACCESS);

    // A type 2 window bound through QP a: a request arriving at b (another
    // QP of the same PD) is refused (type 2B: QP and PD).
    let mut f = setup();
    let k = bound(&mut f, true, false, 0, 4096, acc::RR);
    let c = rdma(op::RDMA_READ, f.pm.addr(0), k, 0, 16, &mut f);
    assert_eq!(err(&c).0, REM_ACCESS);
}

#[test]
fn type1_window_rebinds_and_a_zero_length_bind_unbinds() {
    let mut f = setup();
    let k = bound(&mut f, false, false, 0, 64, acc::RW);
    // Type 1 has no QP association: a write arriving at b works.
    f.la.write(0, &[0xab; 64]);
    let c = rdma(op::RDMA_WRITE, f.pm.addr(0), k, 0, 64, &mut f);
    assert!(c.ok(), "{c:?}");
    assert_eq!(f.pm.read(0, 64), vec![0xab; 64]);
    // Rebind elsewhere with a new key tag: the old key is gone.
    let k2 = (k & !0xff) | 0x78;
    let seg = bind_seg(k2, f.pm.key, f.pm.addr(8192), 64, acc::RW, false, false);
    bind_ok(false, seg, &mut f);
    let c = rdma(op::RDMA_WRITE, f.pm.addr(8192), k2, 0, 64, &mut f);
    assert!(c.ok(), "{c:?}");
    assert_eq!(f.pm.read(8192, 64), vec![0xab; 64]);
    // Zero-length bind: unbound.
    let seg = bind_seg(k2, f.pm.key, f.pm.addr(0), 0, acc::RW, false, false);
    bind_ok(false, seg, &mut f);
    let c = rdma(op::RDMA_WRITE, f.pm.addr(8192), k2, 0, 8, &mut f);
    assert_eq!(err(&c).0, REM_ACCESS);
}

#[test]
fn each_bind_error_from_its_cause() {
    let causes = [
        "parent without bind enable",
        "remote write on a parent without local write",
        "range outside the parent",
        "window of another PD",
        "type 2 window already bound",
        "type bit does not match the window",
        "zero-based type 1",
        "window key names a region",
        "parent in another PD",
        "parent key byte differs",
    ];
    for (case, why) in causes.iter().enumerate() {
        let mut f = setup();
        let k2 = f.h.mw(PD, true);
        let k1 = f.h.mw(PD, false);
        let seg = match case {
            0 => {
                let p = f.h.mr(0x50_0000, 4096, acc::ALL);
                bind_seg(k2, p.key, p.addr(0), 64, acc::RR, true, false)
            }
            1 => {
                let p = f.h.mr(0x50_0000, 4096, acc::RR | acc::RW | acc::BIND);
                bind_seg(k2, p.key, p.addr(0), 64, acc::RW, true, false)
            }
            2 => bind_seg(k2, f.pm.key, f.pm.addr(16_000), 1000, acc::RR, true, false),
            3 => {
                let ko = f.h.mw(OTHER_PD, true);
                bind_seg(ko, f.pm.key, f.pm.addr(0), 64, acc::RR, true, false)
            }
            4 => {
                let seg = bind_seg(k2, f.pm.key, f.pm.addr(0), 64, acc::RR, true, false);
                bind_ok(true, seg, &mut f);
                bind_seg(k2, f.pm.key, f.pm.addr(64), 64, acc::RR, true, false)
            }
            5 => bind_seg(k2, f.pm.key, f.pm.addr(0), 64, acc::RR, false, false),
            6 => bind_seg(k1, f.pm.key, f.pm.addr(0), 64, acc::RR, false, true),
            7 => bind_seg(f.la.key, f.pm.key, f.pm.addr(0), 64, acc::RR, true, false),
            8 => {
                let p = f.h.mr_pd(0x50_0000, 4096, acc::ALL | acc::BIND, OTHER_PD);
                bind_seg(k2, p.key, p.addr(0), 64, acc::RR, true, false)
            }
            _ => bind_seg(k2, f.pm.key ^ 1, f.pm.addr(0), 64, acc::RR, true, false),
        };
        let c = bind(true, seg, &mut f);
        assert_eq!(err(&c), MW_BIND, "case {case}: {why}");
        assert_eq!(c.qpn, f.b.qpn);
        assert_eq!(f.h.qp_state(f.b.qpn), ERR, "case {case}: QP in error");
    }
}

#[test]
fn local_invalidate_then_refused() {
    let mut f = setup();
    let k = bound(&mut f, true, true, 0, 4096, acc::RR);
    let c = rdma(op::RDMA_READ, f.pm.addr(0), k, 0, 32, &mut f);
    assert!(c.ok(), "before: {c:?}");
    let c = local_inval(k, &mut f);
    assert!(c.ok(), "local invalidate: {c:?}");
    assert_eq!((c.qpn, c.opcode), (f.b.qpn, op::LOCAL_INVAL));
    let c = rdma(op::RDMA_READ, f.pm.addr(0), k, 0, 32, &mut f);
    assert_eq!(err(&c).0, REM_ACCESS, "invalidated key refused");

    // Invalidating a type 1 window, an unbound window, a region key: each
    // a memory management error.
    for case in 0..3 {
        let mut f = setup();
        let key = match case {
            0 => bound(&mut f, false, true, 0, 64, acc::RR),
            1 => f.h.mw(PD, true),
            _ => f.pm.key,
        };
        assert_eq!(err(&local_inval(key, &mut f)), MW_BIND, "case {case}");
        assert_eq!(f.h.qp_state(f.b.qpn), ERR);
    }
}

#[test]
fn send_with_invalidate_then_refused() {
    let mut f = setup();
    let k = bound(&mut f, true, true, 0, 4096, acc::RW);
    let rbuf = f.h.mr(0x70_0000, 4096, acc::ALL);
    f.b.post_recv(&[sge(&rbuf, 0, 4096)]);
    f.la.write(0, b"done with your window");
    send_inval(k, 21, &mut f);
    let s = one(&mut f.cq, true);
    assert!(s.ok(), "{s:?}");
    assert_eq!(s.opcode, op::SEND_INVAL);
    let r = one(&mut f.cq, false);
    assert!(r.ok(), "{r:?}");
    assert_eq!((r.opcode, r.imm, r.byte_cnt), (3, k, 21), "SEND_INVAL CQE");
    assert_eq!(rbuf.read(0, 21), b"done with your window");
    let c = rdma(op::RDMA_WRITE, f.pm.addr(0), k, 0, 8, &mut f);
    assert_eq!(err(&c).0, REM_ACCESS, "invalidated key refused");

    // An R_Key that names no bound window, and a window bound to another
    // QP: the responder refuses the invalidation.
    for case in 0..2 {
        let mut f = setup();
        let k = match case {
            0 => f.h.mw(PD, true),
            _ => bound(&mut f, true, false, 0, 64, acc::RW),
        };
        let rbuf = f.h.mr(0x70_0000, 4096, acc::ALL);
        f.b.post_recv(&[sge(&rbuf, 0, 4096)]);
        send_inval(k, 8, &mut f);
        assert_eq!(err(&one(&mut f.cq, true)).0, REM_INV_REQ, "case {case}");
        assert_eq!(
            err(&one(&mut f.cq, false)).0,
            0x11,
            "case {case}: local access"
        );
        assert_eq!(f.h.qp_state(f.b.qpn), ERR);
        assert_eq!(f.h.qp_state(f.a.qpn), ERR);
    }
}

#[test]
fn firmware_window_entries() {
    let mut h = Hca::new();
    let idx = h.next_mpt;
    // Type 1 and type 2 windows (no region bit, no MTT) are accepted.
    let k1 = h.mw(PD, false);
    let k2 = h.mw(PD, true);
    assert_eq!((k1 >> 8, k2 >> 8), (idx, idx + 1));
    // A window entry in the "SW owns" state (as a region would come) is not.
    let mut e = mw_mpt((idx + 2) << 8, PD, false);
    e[0] = 0xf0;
    assert_eq!(
        h.r.cmd_in(&e, idx + 2, 0, Opcode::SW2HW_MPT),
        Err(CmdError::Status(Status::BAD_PARAM))
    );
    // Handed twice: refused.
    assert_eq!(
        h.r.cmd_in(&mw_mpt(k1, PD, false), idx, 0, Opcode::SW2HW_MPT),
        Err(CmdError::Status(Status::BAD_RES_STATE))
    );
    // HW2SW frees it; freeing again is refused; it can be handed again.
    h.r.cmd(0, idx, 1, Opcode::HW2SW_MPT).unwrap();
    assert!(h.r.cmd(0, idx, 1, Opcode::HW2SW_MPT).is_err());
    h.r.cmd_in(&mw_mpt(k1, PD, false), idx, 0, Opcode::SW2HW_MPT)
        .unwrap();

    // A bound window freed and handed back comes back unbound.
    let mut f = setup();
    let k = bound(&mut f, true, true, 0, 64, acc::RR);
    let i = k >> 8;
    f.h.r.cmd(0, i, 1, Opcode::HW2SW_MPT).unwrap();
    f.h.r
        .cmd_in(&mw_mpt(k, PD, true), i, 0, Opcode::SW2HW_MPT)
        .unwrap();
    let c = rdma(op::RDMA_READ, f.pm.addr(0), k, 0, 8, &mut f);
    assert_eq!(err(&c).0, REM_ACCESS);
}

fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes(b[o..o + 4].try_into().unwrap())
}

fn be64(b: &[u8], o: usize) -> u64 {
    u64::from_be_bytes(b[o..o + 8].try_into().unwrap())
}

fn query_mpt(h: &mut Hca, key: u32) -> Vec<u8> {
    h.r.cmd_out(key >> 8, 0, Opcode::QUERY_MPT).unwrap()
}

#[test]
fn the_binding_is_in_the_window_entry_and_a_parent_with_windows_stays() {
    let mut f = setup();
    let pidx = f.pm.key >> 8;
    assert_eq!(be32(&query_mpt(&mut f.h, f.pm.key), 0x24), 0, "win_cnt");
    let k2 = bound(&mut f, true, true, 512, 1024, acc::RR | acc::RW);
    // QUERY_MPT of the window: key, start, length, rights, bound QP.
    let e = query_mpt(&mut f.h, k2);
    assert_eq!(be32(&e, 0x08), k2.rotate_left(24), "key");
    assert_eq!((be64(&e, 0x10), be64(&e, 0x18)), (f.pm.addr(512), 1024));
    assert_eq!(be32(&e, 0x00) & 0x7000, (acc::RR | acc::RW) & 0x7000);
    assert_eq!(be32(&e, 0x04) >> 8, f.b.qpn, "bound QP");
    assert_eq!(be32(&query_mpt(&mut f.h, f.pm.key), 0x24), 1, "win_cnt");
    let k1 = bound(&mut f, false, false, 0, 64, acc::RR);
    assert_eq!(be32(&query_mpt(&mut f.h, f.pm.key), 0x24), 2, "win_cnt");
    // Deregistering the parent is refused while windows are bound; the
    // windows keep working.
    assert_eq!(
        f.h.r.cmd(0, pidx, 1, Opcode::HW2SW_MPT),
        Err(CmdError::Status(Status::REG_BOUND))
    );
    let c = rdma(op::RDMA_READ, f.pm.addr(512), k2, 0, 16, &mut f);
    assert!(c.ok(), "still bound: {c:?}");
    // Invalidating the type 2 window and unbinding the type 1 window (a
    // zero-length bind) drop the count; then the parent goes.
    assert!(local_inval(k2, &mut f).ok());
    let e = query_mpt(&mut f.h, k2);
    assert_eq!((be64(&e, 0x18), be32(&e, 0x00) & 0x7000), (0, 0), "unbound");
    assert_eq!(be32(&query_mpt(&mut f.h, f.pm.key), 0x24), 1, "win_cnt");
    assert_eq!(
        f.h.r.cmd(0, pidx, 1, Opcode::HW2SW_MPT),
        Err(CmdError::Status(Status::REG_BOUND))
    );
    let seg = bind_seg(k1, f.pm.key, f.pm.addr(0), 0, acc::RR, false, false);
    bind_ok(false, seg, &mut f);
    assert_eq!(be32(&query_mpt(&mut f.h, f.pm.key), 0x24), 0, "win_cnt");
    f.h.r.cmd(0, pidx, 1, Opcode::HW2SW_MPT).unwrap();

    // Freeing a bound window (HW2SW_MPT of the window, Linux mlx4_mw_free)
    // releases its parent too; the mailbox shows the binding.
    let mut f = setup();
    let pidx = f.pm.key >> 8;
    let k = bound(&mut f, true, true, 0, 256, acc::RR);
    let e = f.h.r.cmd_out(k >> 8, 0, Opcode::HW2SW_MPT).unwrap();
    assert_eq!((be32(&e, 0x08), be64(&e, 0x18)), (k.rotate_left(24), 256));
    assert_eq!(be32(&query_mpt(&mut f.h, f.pm.key), 0x24), 0, "win_cnt");
    f.h.r.cmd(0, pidx, 1, Opcode::HW2SW_MPT).unwrap();
}
