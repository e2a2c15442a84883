//! The model's firmware command interface: a sequence of HCR commands (any opcode, opcode modifier, input modifier, parameters pointing at a mailbox of the input's bytes or anywhere) and of resources created with the contexts Linux writes, one field tweaked (EQs, CQs, SRQs, MPTs, QPs through their transitions, multicast groups), on a card just reset, with its firmware running, or brought up as Linux does with its EQs and ports (the input says which), with register stores to BAR0, doorbells on BAR2, and a driver's posts on the input's own QPs and CQs (send WQEs and doorbells, receive WQEs and their record, CQ arms and consumer indices) between them.
//!
//! Every command must complete (GO clears: no hang, no busy HCR left
//! behind), with a status or a violation recorded; no panic; the card
//! still runs NOP. (Memory the card was not given is the WQE and link
//! targets' check: here a command's raw parameters may give it any page.)
//!
//! Every input starts from the state it names, reached from a card reset
//! as a driver's probe reaches it, so what it covers does not depend on
//! the inputs before it (see `start`).

#![no_main]

use arbitrary::Arbitrary;
use legoib_fuzz::harness::*;
use legoib_fuzz::poster::MboxExt;
use libfuzzer_sys::fuzz_target;
use sim::Opcode;
use sim::hca::fw::mcg::{BLCK_LB, Entry, encode};

#[derive(Arbitrary, Debug)]
enum Param {
    Inbox,
    Outbox,
    Zero,
    Raw(u64),
}

#[derive(Arbitrary, Debug)]
enum Step {
    Cmd {
        op: u16,
        known: bool,
        op_mod: u8,
        in_mod: u32,
        in_param: Param,
        out_param: Param,
        /// Mailbox bytes: (offset, bytes) written over zeros.
        mailbox: Vec<(u16, Vec<u8>)>,
    },
    Bar0(u32, u32),
    Doorbell(u32, u32),
    /// An EQ created as Linux's `mlx4_create_eq` does (pages, MTT,
    /// SW2HW_EQ with a valid context), for the raw commands after it to
    /// map, query, arm and destroy: a valid EQ context out of raw bytes
    /// took millions of executions.
    Eq {
        eqn: u8,
        log_nent: u8,
    },
    /// A command on one of the EQs this input created, its number in the
    /// input modifier as Linux puts it: MAP_EQ (an event mask, the unmap
    /// bit), QUERY_EQ or HW2SW_EQ. A raw command's 32-bit modifier names
    /// such an EQ only by chance: HW2SW_EQ's success path (every mapped
    /// event unmapped first) came at 5.4 million executions in the second
    /// campaign (fuzz/README.md).
    OnEq {
        which: bool,
        op: EqOp,
        mask: u64,
        unmap: bool,
    },
    /// A CQ created as Linux's `mlx4_cq_alloc` does (pages, MTT, doorbell
    /// record, SW2HW_CQ) on the bring-up's completion or async EQ, with
    /// its context tweaked.
    Cq {
        n: u8,
        log_nent: u8,
        async_eq: bool,
        tweak: Tweak,
    },
    /// An SRQ as Linux's `mlx4_srq_alloc` creates it (SW2HW_SRQ).
    Srq {
        n: u8,
        log_size: u8,
        log_stride: u8,
        tweak: Tweak,
    },
    /// A memory region (or a physical one) as `mlx4_mr_enable` writes
    /// its dMPT entry (SW2HW_MPT), over MTT entries of its own.
    Mpt {
        n: u8,
        physical: bool,
        access: u8,
        len: u16,
        tweak: Tweak,
    },
    /// A QP taken from RST to INIT with the RST2INIT mailbox Linux writes
    /// (buffer, MTT, doorbell record, this input's CQ and SRQ).
    Qp {
        n: u8,
        st: St,
        srq: bool,
        tweak: Tweak,
    },
    /// A transition or query on one of this input's QPs, with the
    /// mailbox Linux writes for it: a raw command names such a QP only by
    /// chance, and a transition's checks start after a valid context
    /// (after 10^7 raw executions, QP transitions were still where the
    /// coverage grew: fuzz/README.md, fourth campaign).
    OnQp {
        which: u8,
        op: QpOp,
        optpar: Option<u32>,
        tweak: Tweak,
    },
    /// A query, destroy or modify on one of this input's CQs, SRQs or
    /// MPTs.
    On {
        kind: Kind,
        which: u8,
        op: ResOp,
    },
    /// The multicast table: MGID_HASH, READ_MCG, and WRITE_MCG of a group
    /// of this input's QPs where its MGID hashes, in the overflow area, or
    /// anywhere.
    Mcg {
        mgid: u8,
        at: McgAt,
        members: Vec<u8>,
        next: u8,
        write: bool,
        tweak: Tweak,
    },
    /// Work on this input's own QPs and CQs as a driver posts it: a send
    /// WQE at the SQ's producer index and the send doorbell, receive WQEs
    /// and the RQ's doorbell record, a CQ's arm doorbell or its consumer
    /// index. The raw `Doorbell` step names these only by chance, and the
    /// first structured run's late edges were where the input's CQs and
    /// QPs met the engines (fuzz/README.md, fifth campaign).
    Post {
        which: u8,
        op: PostOp,
    },
}

#[derive(Arbitrary, Debug)]
enum PostOp {
    /// A send WQE: the control segment (owner bit of the pass, or the
    /// other one), the datagram segment of a UD QP (to another of this
    /// input's QPs), the remote address of an RDMA or atomic operation,
    /// then a data segment and the input's bytes, as much as the 64-byte
    /// stride holds; the send doorbell after it.
    Send {
        opcode: u8,
        signalled: bool,
        wrong_owner: bool,
        sge: Sge,
        /// The remote key's MPT (RDMA, atomics) or the DLID (UD).
        remote: u8,
        tail: Vec<u8>,
    },
    /// Up to eight receive WQEs of one data segment (the RQ's 16-byte
    /// stride), then the doorbell record's receive counter.
    Recv { n: u8, sge: Sge },
    /// The RQ doorbell record's counter, any value.
    RqRecord(u16),
    /// A CQ's arm doorbell (the arm record first, as `mlx4_cq_arm`
    /// writes it): the command (1 solicited, 2 next; others are wrong)
    /// and the sequence number.
    Arm { cmd: u8, sn: u8 },
    /// The CQ's consumer index moved on by this much (its record).
    Consume(u16),
}

/// A data segment over one of this input's MPTs (or a key of none).
#[derive(Arbitrary, Debug, Clone, Copy)]
struct Sge {
    mpt: u8,
    off: u16,
    len: u16,
}

/// Up to three big-endian dwords written over a context Linux would
/// write: a valid context out of raw bytes takes millions of executions,
/// and one field wrong in a valid context is what the card's checks are
/// there for.
#[derive(Arbitrary, Debug)]
struct Tweak(Vec<(u8, u32)>);

impl Tweak {
    fn apply(&self, b: &mut [u8]) {
        let dwords = b.len() / 4;
        for (k, v) in self.0.iter().take(3) {
            let o = usize::from(*k) % dwords * 4;
            b[o..o + 4].copy_from_slice(&v.to_be_bytes());
        }
    }
}

/// Service types (the QP context's `st` field).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum St {
    Rc,
    Uc,
    Ud,
    Mlx,
    Raw(u8),
}

impl St {
    fn code(self) -> u8 {
        match self {
            St::Rc => 0,
            St::Uc => 1,
            St::Ud => 3,
            St::Mlx => 7,
            St::Raw(v) => v & 0xf,
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum QpOp {
    Init2Init,
    Init2Rtr,
    Rtr2Rts,
    Rts2Rts,
    Rts2Sqd { event: bool },
    Sqd2Sqd,
    Sqd2Rts,
    Sqerr2Rts,
    ToErr,
    ToRst,
    Query,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Kind {
    Cq,
    Srq,
    Mpt,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum ResOp {
    Query,
    Hw2Sw,
    /// ARM_SRQ's limit, MODIFY_CQ's moderation (count, period) or resize
    /// (log size); nothing for an MPT.
    Modify(u16),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum McgAt {
    /// The index MGID_HASH answers for the group's MGID.
    Hash,
    /// An entry of the overflow area.
    Overflow(u8),
    /// Any index, the table's end and beyond included.
    Index(u16),
}

#[derive(Arbitrary, Debug)]
enum EqOp {
    Map,
    Query,
    Hw2Sw,
}

/// Where an input's commands start: a card just reset, one whose
/// firmware runs (MAP_FA, RUN_FW), or one brought up as Linux does
/// (INIT_HCA, EQs, ports).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Start {
    Reset,
    Firmware,
    Initialised,
}

#[derive(Arbitrary, Debug)]
struct Input {
    start: Start,
    steps: Vec<Step>,
}

thread_local! {
    static RIG: std::cell::RefCell<(Option<Raw>, u32)> = const { std::cell::RefCell::new((None, 0)) };
}

/// One card for 1,000 inputs (a new one then: its command trace grows).
/// 8 MiB of DMA memory hold the initialised card's ICM (5.6 MB) with
/// room for the input's EQs; a larger arena costs more to build than
/// the runs of its inputs.
fn make() -> Raw {
    let mut r = legoib_fuzz::new_card(0, 8 << 20);
    r.timeout = std::time::Duration::from_secs(2);
    r
}

/// Resets the card and brings it to `start` (`legoib_fuzz::reset_card`
/// says why every input starts from a reset). Replayed on one card and
/// on a new card per input, a corpus covers the same edges, but for the
/// new cards' drop code.
fn start(r: &mut Raw, start: Start) {
    legoib_fuzz::reset_card(r);
    let _ = match start {
        Start::Reset => Ok(()),
        Start::Firmware => load_fw_no_reset(r),
        Start::Initialised => load_fw_no_reset(r)
            .and_then(|()| init_after_fw_pub(r))
            .and_then(|()| init_after_hca(r).map(drop)),
    };
    r.sim.take_violations();
}

fuzz_target!(|input: Input| {
    legoib_fuzz::persistent(&RIG, 1000, make, |r| {
        start(r, input.start);
        run(r, &input);
        true
    });
});

fn run(r: &mut Raw, input: &Input) {
    let (inbox, outbox) = (r.inbox.bus_addr().0, r.outbox.bus_addr().0);
    // At most two EQs per input.
    let mut eqs = Vec::new();
    let mut made = Made::default();
    for step in input.steps.iter().take(32) {
        match step {
            Step::Cq { .. }
            | Step::Srq { .. }
            | Step::Mpt { .. }
            | Step::Qp { .. }
            | Step::OnQp { .. }
            | Step::On { .. }
            | Step::Mcg { .. }
            | Step::Post { .. } => structured(r, &mut made, step),
            Step::Eq { eqn, log_nent } => {
                if eqs.len() < 2 {
                    let eqn = u32::from(*eqn) % 32;
                    let _ = create_eq(r, eqn, log_nent % 8);
                    eqs.push(eqn);
                }
            }
            Step::OnEq {
                which,
                op,
                mask,
                unmap,
            } => {
                let Some(&eqn) = eqs.get(usize::from(*which) % eqs.len().max(1)) else {
                    continue;
                };
                let res = match op {
                    EqOp::Map => r.post(*mask, 0, eqn | u32::from(*unmap) << 31, 0, Opcode::MAP_EQ),
                    EqOp::Query => r.post(0, outbox, eqn, 0, Opcode::QUERY_EQ),
                    EqOp::Hw2Sw => r.post(0, outbox, eqn, 0, Opcode::HW2SW_EQ),
                };
                completed(&res, format_args!("{op:?} on EQ {eqn}"));
            }
            Step::Cmd {
                op,
                known,
                op_mod,
                in_mod,
                in_param,
                out_param,
                mailbox,
            } => {
                let op = if *known {
                    Opcode::ALL[usize::from(*op) % Opcode::ALL.len()]
                } else {
                    Opcode(op & 0xfff)
                };
                // CLOSE_HCA and the unmaps are fine too: the card must take
                // any order.
                r.inbox.fill(0, 4096, 0);
                for (off, bytes) in mailbox.iter().take(8) {
                    let off = usize::from(*off) % 4096;
                    let n = bytes.len().min(4096 - off);
                    r.inbox.write_bytes(off, &bytes[..n]);
                }
                let p = |x: &Param| match x {
                    Param::Inbox => inbox,
                    Param::Outbox => outbox,
                    Param::Zero => 0,
                    Param::Raw(v) => *v,
                };
                let res = r.post(p(in_param), p(out_param), *in_mod, op_mod & 0xf, op);
                completed(&res, op);
            }
            Step::Bar0(off, v) => {
                let off = (*off as usize % (1 << 20)) & !3;
                // Not the HCR (commands go through `post`) nor the reset
                // dword (a reset is not a fuzzed store).
                if !(0xf_0000..0xf_0400).contains(&off) && !(HCR..HCR + 0x20).contains(&off) {
                    r.bar0.write32(off, *v);
                }
            }
            Step::Doorbell(off, v) => {
                let off = (*off as usize % (8 << 20)) & !3;
                r.bar2.write32(off, *v);
            }
        }
        r.sim.take_violations();
    }
    let res = r.post(0, 0, 0x1f, 0, Opcode::NOP);
    completed(&res, "NOP at the end");
}

/// Every command completes: a status, never a hang or a busy HCR.
fn completed<T: std::fmt::Debug>(res: &R<T>, what: impl std::fmt::Display) {
    assert!(
        !matches!(res, Err(CmdError::Timeout) | Err(CmdError::Busy)),
        "{what} -> {res:?}"
    );
}

/// What this input created, by number: at most four of each kind.
#[derive(Default)]
struct Made {
    cqs: Vec<u32>,
    srqs: Vec<u32>,
    mpts: Vec<u32>,
    qps: Vec<QpMade>,
    /// Per CQ (as `cqs`): its doorbell record page (an index in
    /// `Raw::keep`) and consumer index.
    cq_db: Vec<(usize, u32)>,
    /// Per MPT (as `mpts`): the address it starts at.
    mpt_start: Vec<u64>,
}

/// A QP this input took to INIT.
#[derive(Clone, Copy)]
struct QpMade {
    qpn: u32,
    st: u8,
    /// Its two buffer pages, SQ then RQ, and its doorbell record page:
    /// indices in `Raw::keep`.
    buf: usize,
    db: usize,
    sq_pi: u32,
    rq_pi: u16,
}

fn pick<T: Copy>(v: &[T], which: u8) -> Option<T> {
    index(v.len(), which).map(|i| v[i])
}

fn index(len: usize, which: u8) -> Option<usize> {
    (len > 0).then(|| usize::from(which) % len)
}

/// A resource number: mostly one of the eight after the reserved ones
/// (where a driver's allocator starts), else one of sixteen spread over
/// the whole table, its reserved entries and its last included.
fn number(n: u8, first: u32, log: u8) -> u32 {
    if n < 0xf0 {
        first + u32::from(n % 8)
    } else {
        u32::from(n & 0xf) * ((1 << log) - 1) / 15
    }
}

/// Linux's scheduling queue byte of a QP on port 1 (a special QP's own).
fn sched(qpn: u32, st: u8) -> u8 {
    if st == 7 && (profile::BASE_SQPN..profile::BASE_SQPN + 2).contains(&qpn) {
        0x3f
    } else {
        0x83
    }
}

/// Hands resource `n`'s context, tweaked, to the card with `op`; the
/// input keeps `n` if the card took it.
fn sw2hw(
    r: &mut Raw,
    made: &mut Vec<u32>,
    mut ctx: Vec<u8>,
    tweak: &Tweak,
    n: u32,
    op: Opcode,
) -> bool {
    tweak.apply(&mut ctx);
    let res = r.cmd_in(&ctx, n, 0, op);
    completed(&res, format_args!("{op} {n}"));
    if res.is_ok() {
        made.push(n);
    }
    res.is_ok()
}

/// The structured steps: resources created with the contexts Linux
/// writes (tweaked), and commands on them by their numbers. Their
/// buffers stay small, a few pages each and at most four of a kind (with
/// CQ resizes, under 1 MiB an input): the initialised card holds 5.7 MB
/// of the 8 MiB arena.
fn structured(r: &mut Raw, made: &mut Made, step: &Step) {
    use profile::*;
    let p = 0x18;
    match step {
        Step::Cq {
            n,
            log_nent,
            async_eq,
            tweak,
        } => {
            if made.cqs.len() >= 4 {
                return;
            }
            let cqn = number(*n, FIRST_CQ, LOG_CQS);
            let log = log_nent % 10;
            let Ok(q) = queue(r, (32usize << log).div_ceil(4096)) else {
                return;
            };
            let db_k = r.keep.len();
            let db = r.pages(1)[0];
            let eqn = FIRST_EQ + u32::from(*async_eq);
            let ctx = cq_ctx(log, UAR, eqn as u8, q.mtt, db);
            if sw2hw(r, &mut made.cqs, ctx, tweak, cqn, Opcode::SW2HW_CQ) {
                made.cq_db.push((db_k, 0));
            }
        }
        Step::Srq {
            n,
            log_size,
            log_stride,
            tweak,
        } => {
            if made.srqs.len() >= 4 {
                return;
            }
            let srqn = number(*n, FIRST_SRQ, LOG_SRQS);
            // WQEs of 16..512 bytes, at most 16 KiB in all.
            let stride = 4 + log_stride % 6;
            let log = (log_size % 16).min(14 - stride);
            let Ok(q) = queue(r, (1usize << (log + stride)).div_ceil(4096)) else {
                return;
            };
            let db = r.pages(1)[0];
            let ctx = srq_ctx(srqn, log, stride - 4, PD, q.mtt, db);
            sw2hw(r, &mut made.srqs, ctx, tweak, srqn, Opcode::SW2HW_SRQ);
        }
        Step::Mpt {
            n,
            physical,
            access,
            len,
            tweak,
        } => {
            if made.mpts.len() >= 4 {
                return;
            }
            let idx = number(*n, FIRST_MPT, LOG_MPTS);
            let len = u64::from(*len % 0x4000) + 1;
            let Ok(q) = queue(r, len.div_ceil(4096) as usize) else {
                return;
            };
            let mut e = mpt_entry(idx, PD, *physical, q.pages[0], len, q.mtt);
            let flags = u32::from_be_bytes([e[0], e[1], e[2], e[3]]) | u32::from(*access) << 10;
            e[0..4].copy_from_slice(&flags.to_be_bytes());
            if sw2hw(r, &mut made.mpts, e, tweak, idx, Opcode::SW2HW_MPT) {
                made.mpt_start.push(q.pages[0]);
            }
        }
        Step::Qp { n, st, srq, tweak } => {
            if made.qps.len() >= 4 {
                return;
            }
            let st = st.code();
            let qpn = if st == 7 && *n < 0xf0 {
                BASE_SQPN + u32::from(n % 4)
            } else {
                number(*n, BASE_SQPN + 8, LOG_QPS)
            };
            let srqn = if *srq { pick(&made.srqs, *n) } else { None };
            let cqn = pick(&made.cqs, *n).unwrap_or(FIRST_CQ);
            // 64 x 64-byte SQ WQEs and 64 x 16-byte RQ WQEs: two pages,
            // the SQ first (the larger stride).
            let buf = r.keep.len();
            let Ok(q) = queue(r, 2) else {
                return;
            };
            let db_k = r.keep.len();
            let db = r.pages(1)[0];
            let msgmax = if st == 3 || st == 7 { 12 } else { 31 };
            let mut m = rst2init(qpn, st, PD, cqn, q.mtt, db)
                .u8(0x08, 5 << 5 | msgmax)
                .u8(p + 0x20, sched(qpn, st))
                .u32(0x90, 1 << 15 | 1 << 14 | 1 << 13);
            if let Some(srqn) = srqn {
                m = m.u8(0x09, 0).u32(0xac, 1 << 24 | srqn);
            }
            tweak.apply(&mut m.0);
            let res = r.cmd_in(&m.0, qpn, 0, Opcode::RST2INIT_QP);
            completed(&res, format_args!("RST2INIT_QP {qpn}"));
            if res.is_ok() {
                made.qps.push(QpMade {
                    qpn,
                    st,
                    buf,
                    db: db_k,
                    sq_pi: 0,
                    rq_pi: 0,
                });
            }
        }
        Step::OnQp {
            which,
            op,
            optpar,
            tweak,
        } => {
            let Some(QpMade { qpn, st, .. }) = pick(&made.qps, *which) else {
                return;
            };
            let msgmax = if st == 3 || st == 7 { 12 } else { 31 };
            // The peer of a connected QP: another of this input's, or itself.
            let dqpn = pick(&made.qps, which.wrapping_add(1)).map_or(qpn, |q| q.qpn);
            let (code, mut m, in_mod) = match op {
                QpOp::Init2Init => (Opcode::INIT2INIT_QP, QpMbox::new(1, st), qpn),
                QpOp::Init2Rtr => {
                    let m = QpMbox::new(2, st)
                        .u8(0x08, 5 << 5 | msgmax)
                        .u32(0x14, dqpn)
                        .u16be(p + 6, 1)
                        .u8(p + 8, 10 << 3)
                        .u8(p + 0x20, sched(qpn, st))
                        .u32(0x90, 1 << 15 | 1 << 14 | 1 << 13)
                        .u32(0x94, 1 << 24 | 0x100)
                        .optpar(1 << 16);
                    (Opcode::INIT2RTR_QP, m, qpn)
                }
                QpOp::Rtr2Rts => {
                    let m = QpMbox::new(3, st)
                        .u32(0x70, 7 << 16 | 7 << 13)
                        .u8(p + 8, 10 << 3)
                        .u32(0x78, 0x100);
                    (Opcode::RTR2RTS_QP, m, qpn)
                }
                QpOp::Rts2Rts => (Opcode::RTS2RTS_QP, QpMbox::new(3, st), qpn),
                QpOp::Rts2Sqd { event } => (
                    Opcode::RTS2SQD_QP,
                    QpMbox::new(5, st),
                    qpn | u32::from(*event) << 31,
                ),
                QpOp::Sqd2Sqd => (Opcode::SQD2SQD_QP, QpMbox::new(5, st), qpn),
                QpOp::Sqd2Rts => (Opcode::SQD2RTS_QP, QpMbox::new(3, st), qpn),
                QpOp::Sqerr2Rts => (Opcode::SQERR2RTS_QP, QpMbox::new(3, st), qpn),
                QpOp::ToErr => (Opcode::ERR_QP, QpMbox::new(6, st), qpn),
                QpOp::ToRst => {
                    let res = r.cmd(0, qpn, 2, Opcode::RST_QP);
                    completed(&res, format_args!("2RST_QP {qpn}"));
                    return;
                }
                QpOp::Query => {
                    let res = r.cmd_out(qpn, 0, Opcode::QUERY_QP);
                    completed(&res, format_args!("QUERY_QP {qpn}"));
                    return;
                }
            };
            if let Some(v) = optpar {
                m = m.optpar(*v);
            }
            tweak.apply(&mut m.0);
            let res = r.cmd_in(&m.0, in_mod, 0, code);
            completed(&res, format_args!("{code} {qpn}"));
        }
        Step::On { kind, which, op } => {
            let (list, query, hw2sw) = match kind {
                Kind::Cq => (&made.cqs, Opcode::QUERY_CQ, Opcode::HW2SW_CQ),
                Kind::Srq => (&made.srqs, Opcode::QUERY_SRQ, Opcode::HW2SW_SRQ),
                Kind::Mpt => (&made.mpts, Opcode::QUERY_MPT, Opcode::HW2SW_MPT),
            };
            let Some(n) = pick(list, *which) else {
                return;
            };
            let res = match (op, kind) {
                (ResOp::Query, _) => r.cmd_out(n, 0, query).map(drop),
                // Linux destroys without a mailbox (opcode modifier 1);
                // with one, the card writes the context back.
                (ResOp::Hw2Sw, _) if *which & 0x80 != 0 => r.cmd_out(n, 0, hw2sw).map(drop),
                (ResOp::Hw2Sw, _) => r.cmd(0, n, 1, hw2sw),
                (ResOp::Modify(v), Kind::Srq) => r.cmd(u64::from(*v), n, 0, Opcode::ARM_SRQ),
                (ResOp::Modify(v), Kind::Cq) if *v & 0x8000 != 0 => {
                    // Resize: a new buffer of 2^log entries.
                    let log = (*v % 10) as u8;
                    let Ok(q) = queue(r, (32usize << log).div_ceil(4096)) else {
                        return;
                    };
                    let mut b = vec![0u8; 64];
                    b[0x0c] = log;
                    b[0x1c..0x20].copy_from_slice(&((q.mtt * 8) as u32).to_be_bytes());
                    r.cmd_in(&b, n, 0, Opcode::MODIFY_CQ)
                }
                (ResOp::Modify(v), Kind::Cq) => {
                    // Moderation: a count and a period.
                    let mut b = vec![0u8; 64];
                    b[0x10..0x14].copy_from_slice(&[0, *v as u8, 0, (*v >> 8) as u8]);
                    r.cmd_in(&b, n, 1, Opcode::MODIFY_CQ)
                }
                (ResOp::Modify(_), Kind::Mpt) => return,
            };
            completed(&res, format_args!("{kind:?} {op:?} {n}"));
        }
        Step::Mcg {
            mgid,
            at,
            members,
            next,
            write,
            tweak,
        } => {
            let mut g = [0u8; 16];
            g[..4].copy_from_slice(&[0xff, 0x12, 0x40, 0x1b]);
            g[15] = *mgid;
            r.inbox.fill(0, 4096, 0);
            r.inbox.write_bytes(0, &g);
            let inbox = r.inbox.bus_addr().0;
            let hash = r.post(inbox, 0, 0, 0, Opcode::MGID_HASH);
            completed(&hash, "MGID_HASH");
            // The small profile's table: 256 entries, the first 128 the
            // hash table.
            let index = match at {
                McgAt::Hash => hash.map_or(0, |h| h as u32),
                McgAt::Overflow(k) => 128 + u32::from(*k) % 128,
                McgAt::Index(i) => u32::from(*i) % 0x200,
            };
            let res = if *write {
                let members = members
                    .iter()
                    .take(10)
                    .map(|w| {
                        let qpn = pick(&made.qps, *w).map_or(u32::from(*w), |q| q.qpn);
                        qpn | if w & 0x80 != 0 { BLCK_LB } else { 0 }
                    })
                    .collect();
                let e = Entry {
                    next: if *next == 0 {
                        0
                    } else {
                        128 + u32::from(*next) % 128
                    },
                    prot: 0,
                    mgid: g,
                    members,
                };
                let mut b = encode(&e, 64);
                tweak.apply(&mut b);
                r.cmd_in(&b, index, 0, Opcode::WRITE_MCG)
            } else {
                r.cmd_out(index, 0, Opcode::READ_MCG).map(drop)
            };
            completed(&res, format_args!("MCG {index}"));
        }
        Step::Post { which, op } => post(r, made, *which, op),
        // Raw commands, stores and EQs: `run`'s.
        _ => {}
    }
}

/// The `Post` step: a driver's work on this input's QP or CQ `which`.
fn post(r: &mut Raw, made: &mut Made, which: u8, op: &PostOp) {
    use sim::hca::engine::wqe::op::*;
    let uar = profile::UAR as usize * 4096;
    match op {
        PostOp::Send {
            opcode,
            signalled,
            wrong_owner,
            sge,
            remote,
            tail,
        } => {
            let Some(i) = index(made.qps.len(), which) else {
                return;
            };
            let q = made.qps[i];
            // Mostly an opcode a driver posts; else any of the 5 bits.
            const OPS: [u8; 11] = [
                NOP,
                SEND,
                SEND_IMM,
                SEND_INVAL,
                RDMA_WRITE,
                RDMA_WRITE_IMM,
                RDMA_READ,
                ATOMIC_CS,
                ATOMIC_FA,
                LOCAL_INVAL,
                LSO,
            ];
            let code = match OPS.get(usize::from(*opcode)) {
                Some(&c) => c,
                None => opcode & 0x1f,
            };
            let mut w = vec![0u8; 16];
            w[8..12].copy_from_slice(&(if *signalled { 0xcu32 } else { 0 }).to_be_bytes());
            if q.st == 3 {
                // The datagram segment: port 1, the PD, a LID, the peer.
                let peer = pick(&made.qps, which.wrapping_add(1)).map_or(q.qpn, |p| p.qpn);
                let mut d = [0u8; 48];
                d[0..4].copy_from_slice(&(1 << 24 | PD).to_be_bytes());
                d[6..8].copy_from_slice(&u16::from(*remote).to_be_bytes());
                d[0x20..0x24].copy_from_slice(&peer.to_be_bytes());
                d[0x24..0x28].copy_from_slice(&0x1_1111u32.to_be_bytes());
                w.extend_from_slice(&d);
            } else if matches!(
                code,
                RDMA_WRITE | RDMA_WRITE_IMM | RDMA_READ | ATOMIC_CS | ATOMIC_FA
            ) {
                let (key, addr) = key_addr(made, *remote, 0);
                w.extend_from_slice(&addr.to_be_bytes());
                w.extend_from_slice(&key.to_be_bytes());
                w.extend_from_slice(&[0; 4]);
            }
            w.extend_from_slice(&data_seg(made, sge));
            w.extend_from_slice(tail);
            w.truncate(64);
            w.resize(w.len().next_multiple_of(16), 0);
            // The DS count with the segments, the owner dword last.
            w[7] = (w.len() / 16) as u8;
            let owner = (q.sq_pi & 64 != 0) != *wrong_owner;
            let base = (q.sq_pi % 64) as usize * 64;
            let page = &r.keep[q.buf];
            page.write_bytes(base + 4, &w[4..]);
            page.write_be32(base, u32::from(owner) << 31 | u32::from(code));
            made.qps[i].sq_pi = q.sq_pi.wrapping_add(1);
            r.bar2.write_be32(uar + 0x14, q.qpn << 8);
        }
        PostOp::Recv { n, sge } => {
            let Some(i) = index(made.qps.len(), which) else {
                return;
            };
            let q = made.qps[i];
            let seg = data_seg(made, sge);
            let count = u16::from(n % 8) + 1;
            for k in 0..count {
                let slot = q.rq_pi.wrapping_add(k) % 64;
                r.keep[q.buf + 1].write_bytes(usize::from(slot) * 16, &seg);
            }
            let pi = q.rq_pi.wrapping_add(count);
            made.qps[i].rq_pi = pi;
            r.keep[q.db].write_be32(0, u32::from(pi));
        }
        PostOp::RqRecord(v) => {
            if let Some(i) = index(made.qps.len(), which) {
                r.keep[made.qps[i].db].write_be32(0, u32::from(*v));
            }
        }
        PostOp::Arm { cmd, sn } => {
            let Some(i) = index(made.cqs.len(), which) else {
                return;
            };
            let (db, ci) = made.cq_db[i];
            let (cmd, sn) = (u32::from(cmd % 4), u32::from(sn % 4));
            r.keep[db].write_be32(4, sn << 28 | cmd << 24 | (ci & 0xff_ffff));
            let dw0 = sn << 28 | cmd << 24 | made.cqs[i];
            r.bar2.write_be32_pair(uar + 0x20, dw0, ci & 0xff_ffff);
        }
        PostOp::Consume(n) => {
            let Some(i) = index(made.cqs.len(), which) else {
                return;
            };
            let (db, ci) = &mut made.cq_db[i];
            *ci = ci.wrapping_add(u32::from(*n));
            r.keep[*db].write_be32(0, *ci & 0xff_ffff);
        }
    }
    // The engines run as a driver polls.
    for _ in 0..4 {
        r.clock.relax();
    }
}

/// The key and an address of this input's MPT `which` (its start plus
/// `off`, within it or past it), or a key that names no MPT of its.
fn key_addr(made: &Made, which: u8, off: u16) -> (u32, u64) {
    match index(made.mpts.len(), which) {
        Some(i) if which < 0xf0 => (made.mpts[i] << 8, made.mpt_start[i] + u64::from(off)),
        _ => (u32::from(which) << 8, u64::from(off)),
    }
}

/// A 16-byte data segment (byte count, L_Key, address).
fn data_seg(made: &Made, s: &Sge) -> [u8; 16] {
    let (key, addr) = key_addr(made, s.mpt, s.off % 0x4000);
    let mut d = [0u8; 16];
    d[0..4].copy_from_slice(&u32::from(s.len).to_be_bytes());
    d[4..8].copy_from_slice(&key.to_be_bytes());
    d[8..16].copy_from_slice(&addr.to_be_bytes());
    d
}
