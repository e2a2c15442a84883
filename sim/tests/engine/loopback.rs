//! Every opcode on every service type over the HCA's loopback, with
//! verified bytes.

use crate::poster::*;

/// Two RC (or UC) QPs connected to each other on port 1.
pub fn pair(h: &mut Hca, st: u8, cq: &Cq) -> (Qp, Qp, QpSpec) {
    let s = QpSpec::new(st, cq.cqn);
    let a = h.qp(0x80, s);
    let b = h.qp(0x81, s);
    let lid = h.lid;
    h.connect(&a, s, 0x81, lid).unwrap();
    h.connect(&b, s, 0x80, lid).unwrap();
    (a, b, s)
}

#[test]
fn rc_send_moves_bytes_and_completes_both_sides() {
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let (mut a, mut b, _) = pair(&mut h, RC, &cq);
    let src = h.mr(0x10_0000_0123, 10_000, acc::ALL);
    let dst = h.mr(0x20_0000_0456, 10_000, acc::ALL);
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    src.write(0, &data);
    b.post_recv(&[Sge {
        addr: dst.addr(0),
        len: 10_000,
        lkey: dst.key,
    }]);
    let w = Wr {
        opcode: op::SEND_IMM,
        signalled: true,
        imm: 0xcafe_f00d,
        sges: vec![Sge {
            addr: src.addr(0),
            len: 5000,
            lkey: src.key,
        }],
        ..Wr::default()
    };
    a.post(&h, &w);
    let cqes = cq.drain();
    assert_eq!(cqes.len(), 2, "{cqes:?} {:?}", h.r.sim.violations());
    let recv = cqes.iter().find(|c| !c.send).unwrap();
    let send = cqes.iter().find(|c| c.send).unwrap();
    assert_eq!((recv.qpn, recv.opcode, recv.byte_cnt, recv.imm), (0x81, 2, 5000, 0xcafe_f00d));
    assert_eq!((send.qpn, send.opcode, send.wqe_counter), (0x80, op::SEND_IMM, 0));
    assert_eq!(dst.read(0, 5000), data);
    assert!(h.r.sim.violations().is_empty(), "{:?}", h.r.sim.violations());
}
