//! The mlx4_ib fast path measured against a QP and a CQ in plain host memory, the program writing the CQEs the HCA would write.
//!
//! The operations: post one RDMA WRITE with one SGE, post a 64-byte inline
//! SEND, post one receive, poll one completion, poll 16 completions (per
//! completion), poll an empty CQ, and post 16 RDMA WRITEs in one call (per
//! request: one doorbell for the 16).
//!
//! Two figures per operation, printed beside the rdma-core libmlx4 anchor:
//!
//! * instructions, counted by callgrind: each operation runs in its own
//!   `#[inline(never)]` function (`op_*`), called N times; the figure is
//!   the function's inclusive instruction count divided by its calls
//!   (so it includes the call itself, as calling `ibv_post_send` would);
//! * nanoseconds, wall clock, in batches of 64 between two clock reads.
//!
//! Run (release build; valgrind from Debian's `valgrind` package):
//!
//! ```text
//! cargo run --release -p mlx4_ib --example fastpath            # both
//! cargo run --release -p mlx4_ib --example fastpath -- --ns    # timing only
//! ```
//!
//! The program re-runs itself under `valgrind --tool=callgrind` with
//! `--ops N` and reads `callgrind_annotate --inclusive=yes`.

use std::hint::black_box;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use hal::fake::{ArenaDma, MemBar};
use hal::{Bar, DmaPool};
use mlx4_core::Caps;
use mlx4_hw::cqe::{self, Cqe};
use mlx4_ib::cq::Mlx4IbCq;
use mlx4_ib::doorbell::DbPool;
use mlx4_ib::qp::{HostMemory, HostRecv, Mlx4IbQp};
use mlx4_ib::srq::Mlx4IbSrq;
use mlx4_ib::verbs::{QpCap, QpType, RecvWr, SendFlags, SendWr, Sge, Wc, WrDetail, WrOpcode};
use mlx4_ib::{QpTable, Slab};

/// The host-memory HCA: one RC QP (inline-capable), one CQ, and the CQE
/// writer.
struct Rig {
    cq: Mlx4IbCq,
    qps: QpTable,
    srqs: Slab<Mlx4IbSrq>,
    ahs: Slab<mlx4_ib::ah::Mlx4IbAh>,
    qp: mlx4_ib::QpId,
    /// CQEs written so far (absolute index).
    produced: u32,
    /// Send WQEs posted so far.
    sends: u16,
    /// Receive WQEs posted so far.
    recvs: u16,
    data: Vec<u8>,
}

const QPN: u32 = 0x48;

impl Rig {
    fn new() -> Rig {
        let pool = DmaPool::new(Arc::new(ArenaDma::new(16 << 20)));
        // The UAR page as the kernel has it: a register mapping written by
        // one volatile store (ordinary host memory here), not a software
        // register backend behind a dynamic call.
        let uar = if std::env::var_os("FASTPATH_UAR_BACKEND").is_some() {
            Bar::from_backend(Arc::new(MemBar::new(4096)), 4096)
        } else {
            Bar::leaked_host_memory(4096)
        };
        let mut dbs = DbPool::default();
        let caps = Caps {
            num_ports: 1,
            max_wqes: 16384,
            max_sq_sg: 32,
            max_rq_sg: 32,
            max_sq_desc_sz: 1008,
            ..Default::default()
        };
        let mut cap = QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        let db = dbs.alloc(&pool, 0).expect("doorbell record");
        let qp = Mlx4IbQp::detached(
            QpType::Rc,
            QPN,
            &mut cap,
            true,
            HostMemory {
                caps: &caps,
                pool: &pool,
                uar: uar.slice(0, 4096).expect("uar"),
                recv: HostRecv::Rq(db),
            },
        )
        .expect("QP");
        let cdb = dbs.alloc(&pool, 1).expect("CQ doorbell records");
        let cq = Mlx4IbCq::detached(1024, &pool, uar, cdb, 0x81).expect("CQ");
        let mut qps = QpTable::default();
        let qp = qps.insert(qp);
        Rig {
            cq,
            qps,
            srqs: Slab::default(),
            ahs: Slab::default(),
            qp,
            produced: 0,
            sends: 0,
            recvs: 0,
            data: (0..64).collect(),
        }
    }

    /// What the HCA does when a WQE completes: a CQE with the owner bit
    /// of its pass.
    fn hw_complete(&mut self, send: bool) {
        let n = self.produced;
        let nent = self.cq.cqe() + 1;
        let (idx, osr) = if send {
            self.sends = self.sends.wrapping_add(1);
            (self.sends.wrapping_sub(1), cqe::IS_SEND_MASK | 0x08)
        } else {
            self.recvs = self.recvs.wrapping_add(1);
            (self.recvs.wrapping_sub(1), 0x01)
        };
        let owner = if n & nent != 0 { cqe::OWNER_MASK } else { 0 };
        let c = Cqe {
            vlan_my_qpn: QPN,
            g_mlpath_rqpn: 0x49,
            rlid: 3,
            byte_cnt: 64,
            wqe_index: idx,
            owner_sr_opcode: osr | owner,
            ..Default::default()
        };
        let off = ((n & (nent - 1)) as usize) * cqe::SIZE;
        self.cq.buf().write_bytes(off, &c.to_bytes());
        self.produced += 1;
    }
}

#[inline(never)]
fn op_post_write(r: &mut Rig, sg: &[Sge; 1]) {
    let wr = SendWr {
        wr_id: 1,
        opcode: WrOpcode::RdmaWrite,
        send_flags: SendFlags::SIGNALED,
        sg_list: sg,
        inline_data: &[],
        imm_data: 0,
        wr: WrDetail::Rdma {
            remote_addr: 0x10_0000,
            rkey: 0x1234,
        },
    };
    let qp = r.qps.get_mut(r.qp).expect("qp");
    let _ = black_box(qp.post_send(&r.ahs, black_box(&[wr])));
}

/// 16 RDMA WRITEs of one SGE in one call: one doorbell.
#[inline(never)]
fn op_post_write_16(r: &mut Rig, sg: &[Sge; 1]) {
    let wrs: [SendWr<'_>; 16] = core::array::from_fn(|i| SendWr {
        wr_id: 16 + i as u64,
        opcode: WrOpcode::RdmaWrite,
        send_flags: SendFlags::SIGNALED,
        sg_list: sg,
        inline_data: &[],
        imm_data: 0,
        wr: WrDetail::Rdma {
            remote_addr: 0x10_0000 + 64 * i as u64,
            rkey: 0x1234,
        },
    });
    let qp = r.qps.get_mut(r.qp).expect("qp");
    let _ = black_box(qp.post_send(&r.ahs, black_box(&wrs)));
}

#[inline(never)]
fn op_post_inline(r: &mut Rig) {
    let wr = SendWr {
        wr_id: 2,
        opcode: WrOpcode::Send,
        send_flags: SendFlags::SIGNALED | SendFlags::INLINE,
        sg_list: &[],
        inline_data: &r.data,
        imm_data: 0,
        wr: WrDetail::None,
    };
    let qp = r.qps.get_mut(r.qp).expect("qp");
    let _ = black_box(qp.post_send(&r.ahs, black_box(&[wr])));
}

#[inline(never)]
fn op_post_recv(r: &mut Rig, sg: &[Sge; 1]) {
    let wr = RecvWr {
        wr_id: 3,
        sg_list: sg,
    };
    let qp = r.qps.get_mut(r.qp).expect("qp");
    let _ = black_box(qp.post_recv(black_box(&[wr])));
}

#[inline(never)]
fn op_poll_one(r: &mut Rig, wc: &mut [Wc; 1]) -> usize {
    r.cq.poll(&mut r.qps, &mut r.srqs, wc).unwrap_or(0)
}

#[inline(never)]
fn op_poll_16(r: &mut Rig, wc: &mut [Wc; 16]) -> usize {
    r.cq.poll(&mut r.qps, &mut r.srqs, wc).unwrap_or(0)
}

/// Polls an empty CQ with room for 4 (a different array type than
/// `op_poll_one`, so the compiler cannot fold the two functions into one
/// and merge their counts).
#[inline(never)]
fn op_poll_empty(r: &mut Rig, wc: &mut [Wc; 4]) -> usize {
    r.cq.poll(&mut r.qps, &mut r.srqs, wc).unwrap_or(0)
}

fn sge() -> [Sge; 1] {
    [Sge {
        addr: 0x20_0000,
        length: 64,
        lkey: 0x100,
    }]
}

/// Drains the CQ outside the measured functions.
fn drain(r: &mut Rig) {
    let mut wc = [Wc::default(); 64];
    while r.cq.poll(&mut r.qps, &mut r.srqs, &mut wc).unwrap_or(0) > 0 {}
}

/// Runs every operation `n` times (the callgrind workload).
fn workload(n: usize) {
    let mut r = Rig::new();
    let sg = sge();
    let mut one = [Wc::default(); 1];
    let mut sixteen = [Wc::default(); 16];
    for _ in 0..n {
        op_post_write(&mut r, &sg);
        r.hw_complete(true);
        op_poll_one(&mut r, &mut one);
    }
    for _ in 0..n {
        op_post_inline(&mut r);
        r.hw_complete(true);
        drain(&mut r);
    }
    for _ in 0..n {
        op_post_recv(&mut r, &sg);
        r.hw_complete(false);
        drain(&mut r);
    }
    for _ in 0..n {
        for _ in 0..16 {
            op_post_write(&mut r, &sg);
            r.hw_complete(true);
        }
        op_poll_16(&mut r, &mut sixteen);
    }
    let mut four = [Wc::default(); 4];
    for _ in 0..n {
        op_poll_empty(&mut r, &mut four);
    }
    for _ in 0..n {
        op_post_write_16(&mut r, &sg);
        for _ in 0..16 {
            r.hw_complete(true);
        }
        drain(&mut r);
    }
    assert_eq!(r.cq.cons_index(), r.produced, "every CQE was polled");
}

const BATCH: usize = 64;

/// Nanoseconds per operation, timed in batches.
fn time_ns(rounds: usize) -> [f64; 7] {
    let mut r = Rig::new();
    let sg = sge();
    let mut one = [Wc::default(); 1];
    let mut sixteen = [Wc::default(); 16];
    let mut t = [0u128; 7];
    for _ in 0..rounds {
        let s = Instant::now();
        for _ in 0..BATCH {
            op_post_write(&mut r, &sg);
        }
        t[0] += s.elapsed().as_nanos();
        for _ in 0..BATCH {
            r.hw_complete(true);
        }
        // Poll one completion at a time.
        let s = Instant::now();
        for _ in 0..BATCH {
            op_poll_one(&mut r, &mut one);
        }
        t[3] += s.elapsed().as_nanos();

        let s = Instant::now();
        for _ in 0..BATCH {
            op_post_inline(&mut r);
        }
        t[1] += s.elapsed().as_nanos();
        for _ in 0..BATCH {
            r.hw_complete(true);
        }
        // Poll 16 at a time.
        let s = Instant::now();
        for _ in 0..BATCH / 16 {
            op_poll_16(&mut r, &mut sixteen);
        }
        t[4] += s.elapsed().as_nanos();

        let s = Instant::now();
        for _ in 0..BATCH {
            op_post_recv(&mut r, &sg);
        }
        t[2] += s.elapsed().as_nanos();
        for _ in 0..BATCH {
            r.hw_complete(false);
        }
        drain(&mut r);

        let mut four = [Wc::default(); 4];
        let s = Instant::now();
        for _ in 0..BATCH {
            op_poll_empty(&mut r, &mut four);
        }
        t[5] += s.elapsed().as_nanos();

        let s = Instant::now();
        for _ in 0..BATCH / 16 {
            op_post_write_16(&mut r, &sg);
        }
        t[6] += s.elapsed().as_nanos();
        for _ in 0..BATCH {
            r.hw_complete(true);
        }
        drain(&mut r);
    }
    let per = (rounds * BATCH) as f64;
    t.map(|x| x as f64 / per)
}

const OPS: [(&str, &str, f64, f64, f64); 7] = [
    // (label, function, calls per op divisor, anchor, goal)
    ("post RDMA WRITE, 1 SGE", "op_post_write", 1.0, 213.0, 150.0),
    (
        "post SEND, 64 B inline",
        "op_post_inline",
        1.0,
        317.0,
        220.0,
    ),
    ("post receive", "op_post_recv", 1.0, 103.0, 75.0),
    ("poll 1 completion", "op_poll_one", 1.0, 161.0, 110.0),
    ("poll 16 (per completion)", "op_poll_16", 16.0, 92.6, 65.0),
    ("poll empty CQ", "op_poll_empty", 1.0, 68.0, 30.0),
    // No anchor or goal: the figure to keep below the single post's.
    (
        "post 16 WRITEs (per WR)",
        "op_post_write_16",
        16.0,
        f64::NAN,
        f64::NAN,
    ),
];

/// Instructions per operation from callgrind.
fn instructions(n: usize) -> Option<[f64; 7]> {
    let exe = std::env::current_exe().ok()?;
    let out = std::env::temp_dir().join(format!("mlx4_ib_fastpath.{}.cg", std::process::id()));
    let st = Command::new("valgrind")
        .args(["--tool=callgrind", "-q"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&exe)
        .args(["--ops", &n.to_string()])
        .status()
        .ok()?;
    if !st.success() {
        return None;
    }
    let ann = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--threshold=100"])
        .arg(&out)
        .output()
        .ok()?;
    let _ = std::fs::remove_file(&out);
    let text = String::from_utf8_lossy(&ann.stdout);
    // The post ops ran N times, except op_post_write, which also fed the
    // 16-completion polls (16 * N more calls).
    let calls = |f: &str| -> f64 {
        match f {
            "op_post_write" => (n + 16 * n) as f64,
            _ => n as f64,
        }
    };
    let mut r = [0f64; 7];
    for (i, (_, f, div, _, _)) in OPS.iter().enumerate() {
        let line = text
            .lines()
            .find(|l| l.contains(&format!("fastpath::{f} ")))?;
        let ir: f64 = line
            .split_whitespace()
            .next()?
            .replace(',', "")
            .parse()
            .ok()?;
        r[i] = ir / calls(f) / div;
    }
    Some(r)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--ops") {
        let n = args.get(i + 1).and_then(|s| s.parse().ok()).unwrap_or(1000);
        workload(n);
        return;
    }
    let ns_only = args.iter().any(|a| a == "--ns");
    let ns = time_ns(20_000);
    let ir = if ns_only { None } else { instructions(2000) };
    println!("mlx4_ib fast path (host memory, release build)");
    println!(
        "{:<26} {:>12} {:>8} {:>8} {:>10}",
        "operation", "instructions", "anchor", "goal", "ns"
    );
    for (i, (label, _, _, anchor, goal)) in OPS.iter().enumerate() {
        let ins = ir.map_or_else(|| "-".to_string(), |v| format!("{:.1}", v[i]));
        let or_dash = |x: f64| {
            if x.is_nan() {
                "-".to_string()
            } else {
                x.to_string()
            }
        };
        println!(
            "{:<26} {:>12} {:>8} {:>8} {:>10.1}",
            label,
            ins,
            or_dash(*anchor),
            or_dash(*goal),
            ns[i]
        );
    }
    if ir.is_none() && !ns_only {
        println!("(instruction counts need valgrind and callgrind_annotate on PATH)");
    }
}
