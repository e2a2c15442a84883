//! Packets arriving at the model HCA from its link: InfiniBand packets built from headers the input fills (every RC and UD opcode, LRH, BTH, DETH, RETH, AETH, AtomicETH, immediate), with their CRCs right or not, or bytes as they come, sent by the peer's port of a back-to-back fabric into a model whose port is Active with an RC QP, a UD QP, QP0/QP1 and posted receives.
//!
//! The model may drop, NAK, count and record; it must not panic, loop
//! (every step is bounded), or write memory of another PD. Its port must
//! still answer a PortInfo query through MAD_IFC afterwards.

#![no_main]

use arbitrary::Arbitrary;
use legoib_fuzz::harness::Raw;
use legoib_fuzz::poster::*;
use libfuzzer_sys::fuzz_target;
use sim::fabric::Packet;
use sim::fabric::packet::{self, Headers};
use sim::{SimConfig, SimHca};

#[derive(Arbitrary, Debug)]
enum DestQp {
    Rc,
    Ud,
    Qp0,
    Qp1,
    Raw(u32),
}

/// The BTH PSN: near the one the RC QP's responder expects next (its
/// `rnr_nextrecvpsn` as QUERY_QP reports it), from three behind (the
/// duplicates a requester's retry sends) to three ahead (a sequence
/// error), or any. A raw 24-bit PSN hits the expected one once in 16
/// million: the responder's duplicate-PSN path came after 5 million
/// executions in the second campaign (fuzz/README.md).
#[derive(Arbitrary, Debug)]
enum Psn {
    Near(i8),
    Raw(u32),
}

#[derive(Arbitrary, Debug)]
enum Pkt {
    Built {
        opcode: u8,
        dest: DestQp,
        dlid_self: bool,
        slid: u16,
        psn: Psn,
        pkey: u16,
        ack_req: bool,
        qkey: u32,
        src_qp: u32,
        va_off: u32,
        rkey_good: bool,
        dma_len: u32,
        aeth: (u8, u32),
        swap: u64,
        imm: u32,
        payload: Vec<u8>,
        edits: Vec<(u16, u8)>,
        reseal: bool,
    },
    Raw {
        bytes: Vec<u8>,
        reseal: bool,
    },
}

const OPCODES: [u8; 24] = [
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x10, 0x11, 0x12, 0x13, 0x14, 0x64, 0x65, 0x16,
];

/// 8 MiB of DMA memory hold a card's ICM and queues; a larger arena
/// costs more to build than the runs of its inputs.
fn cfg(guid: u64) -> SimConfig {
    legoib_fuzz::sim_cfg(guid, 8 << 20)
}

struct Rig {
    a: Hca,
    b: Hca,
    w: sim::Wire,
    bport: sim::fabric::PortId,
    cq: Cq,
    rc: Qp,
    /// Kept for its receives (the input's packets name it by number).
    _ud: Qp,
    mr: Mr,
    guard: Mr,
    pattern: Vec<u8>,
}

/// The QPs back to RTS with four receives each.
fn reset_qps(a: &mut Hca, rc: &mut Qp, ud: &mut Qp, mr: &Mr) {
    a.reinit(rc);
    a.connect(rc, rc.spec, 0x81, 2).unwrap();
    a.reinit(ud);
    a.connect(ud, ud.spec, 0, 0).unwrap();
    for i in 0..4 {
        rc.post_recv(&[mr.sge(i * 4096, 4096)]);
        ud.post_recv(&[mr.sge(16384 + i * 4096, 4096)]);
    }
}

/// The PSN `qpn`'s responder expects next, from QUERY_QP (0 if the
/// command fails: the QP may be in error after the packets).
fn expected_psn(a: &mut Hca, qpn: u32) -> u32 {
    use sim::hca::ctx::qpc;
    // The output mailbox holds the optional-parameter mask (8 bytes),
    // then the QP context.
    let at = 8 + qpc::RNR_NEXTRECVPSN;
    a.r.cmd_out(qpn, 0, sim::Opcode::QUERY_QP)
        .ok()
        .and_then(|out| out.get(at..at + 4)?.try_into().ok())
        .map_or(0, |b| u32::from_be_bytes(b) & 0xff_ffff)
}

/// A reset and brought up again (`legoib_fuzz::reset_card` says why each
/// input starts from a reset): port 1 Active with LID 1, the CQ, the RC
/// and UD QPs with their receives, the MR and the other PD's guard. B
/// (`new`: just built) only sends the input's packets and takes A's
/// answers, with no QP of its own: it keeps its state, and its port,
/// down while A's link was, is made Active again (LID 2). Packets still
/// in flight when A resets are dropped with its link. (Resetting B too
/// halved the executions per second.)
fn bring_up(a: Raw, mut b: Hca, w: sim::Wire, new: bool) -> Rig {
    let mut a = legoib_fuzz::bare_again(a);
    if new {
        b.r.cmd(0, 1, 0, sim::Opcode::INIT_PORT).unwrap();
    }
    a.r.cmd(0, 1, 0, sim::Opcode::INIT_PORT).unwrap();
    a.activate(1, 1).unwrap();
    b.activate(1, 2).unwrap();
    let bport = b.r.sim.fabric_port(1).expect("B's fabric port");
    let cq = a.cq(8);
    let s = QpSpec::new(RC, cq.cqn);
    let mut rc = a.qp(0x80, s);
    let us = QpSpec::new(UD, cq.cqn);
    let mut ud = a.qp(0x90, us);
    let mr = a.mr(0x10_0000, 32 << 10, acc::ALL);
    let guard = a.mr_pd(0x80_0000, 8 << 10, acc::ALL, OTHER_PD);
    let pattern: Vec<u8> = (0..8 << 10).map(|i| (i * 7 % 253) as u8).collect();
    guard.write(0, &pattern);
    reset_qps(&mut a, &mut rc, &mut ud, &mr);
    Rig {
        a,
        b,
        w,
        bport,
        cq,
        rc,
        _ud: ud,
        mr,
        guard,
        pattern,
    }
}

thread_local! {
    static RIG: std::cell::RefCell<(Option<Option<Rig>>, u32)> = const { std::cell::RefCell::new((None, 0)) };
}

// Two cards for 1,000 inputs (new ones then: their command traces grow),
// A brought up again for each: the last input's objects go first, so the
// bring-up gets the same pages.
fuzz_target!(|pkts: Vec<Pkt>| {
    legoib_fuzz::persistent(
        &RIG,
        1000,
        || None,
        |slot| {
            let (a, b, w, new) = match slot.take() {
                Some(rig) => (rig.a.r, rig.b, rig.w, false),
                None => {
                    let (x, y, w) = SimHca::back_to_back(
                        cfg(0x0002_c903_0000_1000),
                        cfg(0x0002_c903_0000_2000),
                    );
                    let b = legoib_fuzz::bare_again(legoib_fuzz::claimed(y));
                    (legoib_fuzz::claimed(x), b, w, true)
                }
            };
            let mut rig = bring_up(a, b, w, new);
            run(&mut rig, &pkts);
            *slot = Some(rig);
            true
        },
    );
});

fn run(rig: &mut Rig, pkts: &[Pkt]) {
    let Rig {
        a,
        w,
        bport,
        cq,
        rc,
        mr,
        guard,
        pattern,
        ..
    } = rig;
    let bport = *bport;
    let clock = w.fake_clock().expect("a synchronous wire");
    for p in pkts.iter().take(24) {
        let mut bytes = match p {
            Pkt::Built {
                opcode,
                dest,
                dlid_self,
                slid,
                psn,
                pkey,
                ack_req,
                qkey,
                src_qp,
                va_off,
                rkey_good,
                dma_len,
                aeth,
                swap,
                imm,
                payload,
                edits,
                reseal,
            } => {
                let op = if opcode & 0x80 != 0 {
                    *opcode
                } else {
                    OPCODES[usize::from(*opcode) % OPCODES.len()]
                };
                let Some(mut h) = Headers::for_opcode(op) else {
                    continue;
                };
                h.lrh.dlid = if *dlid_self { 1 } else { *slid };
                h.lrh.slid = if *dlid_self { 2 } else { slid.wrapping_add(1) };
                h.bth.pkey = if pkey & 0x8000 != 0 { 0xffff } else { *pkey };
                h.bth.dest_qp = match dest {
                    DestQp::Rc => 0x80,
                    DestQp::Ud => 0x90,
                    DestQp::Qp0 => 0,
                    DestQp::Qp1 => 1,
                    DestQp::Raw(v) => v & 0xff_ffff,
                };
                h.bth.psn = match psn {
                    Psn::Near(d) => {
                        expected_psn(a, rc.qpn).wrapping_add_signed(i32::from(*d % 4)) & 0xff_ffff
                    }
                    Psn::Raw(v) => v & 0xff_ffff,
                };
                h.bth.ack_req = *ack_req;
                if let Some(d) = h.deth.as_mut() {
                    d.qkey = *qkey;
                    d.src_qp = src_qp & 0xff_ffff;
                }
                let va = mr
                    .addr(0)
                    .wrapping_add(u64::from(*va_off % (40 << 10)))
                    .wrapping_sub(4096);
                let rkey = if *rkey_good { mr.key } else { guard.key };
                if let Some(r) = h.reth.as_mut() {
                    r.va = va;
                    r.rkey = rkey;
                    r.dma_len = *dma_len % 20_000;
                }
                if let Some(at) = h.atomic_eth.as_mut() {
                    at.va = va & !7;
                    at.rkey = rkey;
                    at.swap_add = *swap;
                    at.compare = !*swap;
                }
                if let Some(ae) = h.aeth.as_mut() {
                    ae.syndrome = aeth.0;
                    ae.msn = aeth.1 & 0xff_ffff;
                }
                if h.imm.is_some() {
                    h.imm = Some(*imm);
                }
                let Ok(mut b) = packet::build(&h, &payload[..payload.len().min(4200)]) else {
                    continue;
                };
                for (at, v) in edits.iter().take(8) {
                    if !b.is_empty() {
                        let n = b.len();
                        b[usize::from(*at) % n] = *v;
                    }
                }
                if *reseal {
                    let _ = packet::reseal(&mut b);
                }
                b
            }
            Pkt::Raw { bytes, reseal } => {
                let mut b = bytes[..bytes.len().min(4400)].to_vec();
                if *reseal && b.len() > 20 {
                    let _ = packet::reseal(&mut b);
                }
                b
            }
        };
        if bytes.is_empty() {
            bytes.push(0);
        }
        let now = hal::Clock::now_ns(&*clock);
        if let Ok(mut f) = w.fabric().lock() {
            f.transmit(bport, Packet { bytes }, now);
        }
        clock.advance(std::time::Duration::from_micros(5));
        w.settle();
        cq.drain();
        cq.stash.clear();
        a.r.sim.take_violations();
        a.r.sim.take_dma_faults();
    }
    assert_eq!(
        guard.read(0, 8 << 10),
        *pattern,
        "memory of another PD untouched"
    );
    // The port still answers its SMA.
    let pi = a.r.cmd_box(
        &legoib_fuzz::harness::smp_get(0x15, 1),
        1,
        1,
        sim::Opcode::MAD_IFC,
    );
    assert!(pi.is_ok(), "MAD_IFC after the packets: {pi:?}");
}
