//! rdma-core's `ibv_rc_pingpong` and `ibv_ud_pingpong`.
//!
//! rdma-core's `ibv_rc_pingpong` and `ibv_ud_pingpong` (libibverbs/examples
//! `rc_pingpong.c`, `ud_pingpong.c`): one QP, SEND/RECV ping-pong for `-n`
//! iterations, the address lines and the two result lines in rdma-core's words;
//! their TCP exchange is replaced by the IB CM (see below), and events mode (`-e`),
//! ODP, timestamps, device memory, the new send API and GRH use (`-g` only prints
//! the GID) are left out.
//!
//! How the two sides meet (no TCP here):
//! * RC: the CM connection is the exchange. The client asks the SA for a
//!   path to the server (LID or port GUID), sends a REQ for
//!   [`RC_PINGPONG_SERVICE_ID`] whose private data is a [`Hello`] (size,
//!   iterations, `--chk`, GID); the server checks it, answers with a REP
//!   ([`Hello`] too) and the CM drives both QPs to RTS.
//! * UD: a rendezvous RC connection on [`UD_PINGPONG_SERVICE_ID`], used
//!   only to carry each side's UD QPN, Q_Key and PSN in the REQ/REP private
//!   data (a SIDR-like exchange over the CM ib_core has; it refuses SIDR
//!   itself). The UD QPs then ping-pong through address handles built from
//!   the LIDs the CM saw; the rendezvous is disconnected at the end.
//!
//! The loop is rc_pingpong's: the client posts the first SEND; a side
//! posts its next SEND once its previous SEND completed and the peer's
//! message arrived; both stop after `iters` SENDs and `iters` receives.
//! Every wait has a no-progress deadline ([`OP_TIMEOUT`]) and looks at
//! Ctrl-C. With `-c`/`--chk` every message carries the pattern of its
//! sequence number and every received one is checked.

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::Cell;
use core::fmt::{self, Write};
use core::time::Duration;

use ib_core::cm::{self, CmEvent, CmId, CmRepParam};
use ib_core::verbs::{
    AccessFlags, Ah, AhAttr, Cq, CqInitAttr, Gid, Mr, MrPages, Pd, PortAttr, Qp, QpAttr,
    QpAttrMask, QpCap, QpCreateFlags, QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendWr, Sge,
    SigType, Wc, WcStatus, WrDetail, WrOpcode,
};

use crate::perftest::Peer;
use crate::perftest::exchange::{fill, verify};
use crate::perftest::run::{
    CONNECT_TIMEOUT, Env, Made, Undo, await_done, cm_req, disconnect, e, path_to, progress,
    wait_cm, wait_port_active, wait_rtu,
};

/// CM service of `ibv_rc_pingpong`: "LEGO", 1, rc_pingpong's TCP port 18515.
pub const RC_PINGPONG_SERVICE_ID: u64 = 0x4c45_474f_0001_4853;
/// CM service of `ibv_ud_pingpong`'s rendezvous: "LEGO", 2, 18515.
pub const UD_PINGPONG_SERVICE_ID: u64 = 0x4c45_474f_0002_4853;
/// ud_pingpong's Q_Key.
pub const UD_QKEY: u32 = 0x1111_1111;
/// Bytes of GRH area in front of every UD receive.
pub const GRH_BYTES: u32 = 40;
/// How long one message may take before the run gives up.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// Most iterations accepted.
pub const MAX_ITERS: u32 = 10_000_000;
/// Largest RC message (the buffer is DMA memory).
pub const MAX_RC_SIZE: u32 = 1 << 20;
/// Receive buffers (receives beyond this share them: a ping-pong has one
/// message in flight, checked before the next can come).
const RX_SLOTS: u32 = 8;
const SEND_WRID: u64 = 1 << 63;

/// Which pingpong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `ibv_rc_pingpong`.
    Rc,
    /// `ibv_ud_pingpong`.
    Ud,
}

impl Transport {
    /// The command name.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Rc => "ibv_rc_pingpong",
            Transport::Ud => "ibv_ud_pingpong",
        }
    }
    fn service_id(self) -> u64 {
        match self {
            Transport::Rc => RC_PINGPONG_SERVICE_ID,
            Transport::Ud => UD_PINGPONG_SERVICE_ID,
        }
    }
    fn code(self) -> u8 {
        match self {
            Transport::Rc => 0,
            Transport::Ud => 1,
        }
    }
}

/// The options of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// RC or UD.
    pub transport: Transport,
    /// `-s`: message size (rc 4096, ud 2048 by default).
    pub size: u32,
    /// `-n`: iterations (1000).
    pub iters: u32,
    /// `-r`: receives kept posted (500).
    pub rx_depth: u32,
    /// `-i`: port (1).
    pub ib_port: u8,
    /// `-d`: device.
    pub ib_dev: Option<String>,
    /// `-g`: GID index to print (none: `::`, as rdma-core without `-g`).
    pub gidx: Option<u32>,
    /// `-l`: service level (UD address handles).
    pub sl: u8,
    /// `-m`: path MTU in bytes (RC; at most the path's).
    pub mtu: Option<u32>,
    /// `-c`/`--chk`: check every received byte.
    pub check: bool,
    /// The server's LID or port GUID; `None` makes this the server.
    pub peer: Option<Peer>,
}

impl Params {
    /// The defaults of rdma-core's tool.
    pub fn defaults(t: Transport) -> Params {
        Params {
            transport: t,
            size: if t == Transport::Rc { 4096 } else { 2048 },
            iters: 1000,
            rx_depth: 500,
            ib_port: 1,
            ib_dev: None,
            gidx: None,
            sl: 0,
            mtu: None,
            check: false,
            peer: None,
        }
    }

    /// Parses the arguments after the command name; `Err("")` means `-h`.
    pub fn parse(t: Transport, args: &[&str]) -> Result<Params, String> {
        let mut p = Params::defaults(t);
        let mut it = args.iter();
        while let Some(&a) = it.next() {
            if !a.starts_with('-') {
                if p.peer.is_some() {
                    return Err(format!("unexpected argument '{a}' (one peer at most)"));
                }
                p.peer = Some(Peer::parse(a).map_err(|x| format!("{x}"))?);
                continue;
            }
            let (key, inline) = match a.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (a, None),
            };
            let mut val = |name: &str| -> Result<&str, String> {
                inline
                    .or_else(|| it.next().copied())
                    .ok_or_else(|| format!("option '{name}' needs a value"))
            };
            let num = |v: &str, lo: u64, hi: u64, what: &str| -> Result<u64, String> {
                let n = match v.strip_prefix("0x") {
                    Some(h) => u64::from_str_radix(h, 16).ok(),
                    None => v.parse().ok(),
                };
                n.filter(|n| (lo..=hi).contains(n))
                    .ok_or_else(|| format!("bad value '{v}' for {key} ({what})"))
            };
            match key {
                "-h" | "--help" => return Err(String::new()),
                "-c" | "--chk" => p.check = true,
                "-s" | "--size" => {
                    p.size = num(val(key)?, 1, MAX_RC_SIZE.into(), "1 to 1048576")? as u32
                }
                "-n" | "--iters" => {
                    p.iters = num(val(key)?, 1, MAX_ITERS.into(), "1 to 10000000")? as u32
                }
                "-r" | "--rx-depth" => p.rx_depth = num(val(key)?, 1, 8192, "1 to 8192")? as u32,
                "-i" | "--ib-port" => p.ib_port = num(val(key)?, 1, 2, "1 or 2")? as u8,
                "-d" | "--ib-dev" => p.ib_dev = Some(String::from(val(key)?)),
                "-g" | "--gid-idx" => p.gidx = Some(num(val(key)?, 0, 127, "0 to 127")? as u32),
                "-l" | "--sl" => p.sl = num(val(key)?, 0, 15, "0 to 15")? as u8,
                "-m" | "--mtu" if t == Transport::Rc => {
                    let m = num(val(key)?, 256, 4096, "256, 512, 1024, 2048 or 4096")?;
                    if !m.is_power_of_two() {
                        return Err(format!(
                            "bad value '{m}' for -m (256, 512, 1024, 2048 or 4096)"
                        ));
                    }
                    p.mtu = Some(m as u32);
                }
                "-p" | "--port" => {
                    return Err(String::from(
                        "-p (TCP port) does not apply: the two sides meet through the IB CM",
                    ));
                }
                "-e" | "--events" => {
                    return Err(String::from(
                        "-e (completion events) does not apply: completions are polled here (no interrupts)",
                    ));
                }
                _ => return Err(format!("unknown option '{a}'")),
            }
        }
        Ok(p)
    }
}

/// The usage text.
pub fn usage(t: Transport) -> String {
    let d = Params::defaults(t);
    let mut s = String::new();
    let _ = write!(
        s,
        "Usage:\n  {0}            start a server and wait for connection\n  {0} <peer>     connect to server at <peer> (its LID, or port GUID)\n\n\
         Options:\n\
         \x20 -d, --ib-dev=<dev>     use IB device <dev> (default first device found)\n\
         \x20 -i, --ib-port=<port>   use port <port> of IB device (default 1)\n\
         \x20 -s, --size=<size>      size of message to exchange (default {1})\n",
        t.name(),
        d.size
    );
    if t == Transport::Rc {
        let _ = writeln!(s, "  -m, --mtu=<size>       path MTU (default: the path's)");
    }
    let _ = write!(
        s,
        "  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)\n\
         \x20 -n, --iters=<iters>    number of exchanges (default 1000)\n\
         \x20 -l, --sl=<sl>          service level value\n\
         \x20 -g, --gid-idx=<gid index> local port gid index (printed only)\n\
         \x20 -c, --chk              validate received buffer\n\
         \x20 The two sides meet through the IB CM (no TCP); Ctrl-C interrupts any wait."
    );
    s
}

pub use crate::cfmt::GidStr;

/// One side as the pingpongs print it (`struct pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// LID.
    pub lid: u16,
    /// QPN.
    pub qpn: u32,
    /// PSN the side sends from.
    pub psn: u32,
    /// GID (zero without `-g`).
    pub gid: Gid,
}

/// `  local address:  LID 0x0003, QPN 0x000048, PSN 0x..., GID ::` (UD
/// puts a colon before `GID`, as ud_pingpong does).
pub fn print_dest(out: &mut dyn Write, t: Transport, remote: bool, d: &Dest) -> fmt::Result {
    writeln!(
        out,
        "  {} LID {:#06x}, QPN {:#08x}, PSN {:#08x}{} GID {}",
        if remote {
            "remote address:"
        } else {
            "local address: "
        },
        d.lid,
        d.qpn,
        d.psn,
        if t == Transport::Ud { ":" } else { "," },
        GidStr(d.gid)
    )
}

/// The two result lines: `8192000 bytes in 0.05 seconds = 1310.72
/// Mbit/sec` and `1000 iters in 0.05 seconds = 50.00 usec/iter` (bytes
/// are size x iters x 2: both directions, as rdma-core counts).
pub fn print_result(out: &mut dyn Write, size: u32, iters: u32, nanos: u64) -> fmt::Result {
    let bytes = u64::from(size) * u64::from(iters) * 2;
    let usec = (nanos as f64 / 1000.0).max(1e-3);
    writeln!(
        out,
        "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
        bytes,
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    )?;
    writeln!(
        out,
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        iters,
        usec / 1e6,
        usec / f64::from(iters.max(1))
    )
}

const MAGIC: [u8; 4] = *b"LGPP";
const VERSION: u8 = 1;
/// Bytes of a [`Hello`] on the wire.
pub const HELLO_LEN: usize = 48;

/// What each side tells the other in the CM private data (REQ: the
/// client's, REP: the server's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// RC or UD.
    pub transport: Transport,
    /// `--chk`.
    pub check: bool,
    /// Refused (REP only): why, as a code.
    pub status: u8,
    /// Message size.
    pub size: u32,
    /// Iterations.
    pub iters: u32,
    /// The UD QPN (RC: the CM carries it; 0).
    pub qpn: u32,
    /// The UD Q_Key.
    pub qkey: u32,
    /// The UD PSN.
    pub psn: u32,
    /// The sender's GID (printed).
    pub gid: Gid,
}

impl Hello {
    /// The bytes for the private data.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HELLO_LEN);
        b.extend_from_slice(&MAGIC);
        b.push(VERSION);
        b.push(self.transport.code());
        b.push(u8::from(self.check));
        b.push(self.status);
        for v in [self.size, self.iters, self.qpn, self.qkey, self.psn] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        b.extend_from_slice(&self.gid.0);
        b.resize(HELLO_LEN, 0);
        b
    }

    /// Reads and checks one from the wire.
    pub fn decode(b: &[u8]) -> Result<Hello, String> {
        if b.len() < HELLO_LEN {
            return Err(format!(
                "private data of {} bytes, need {HELLO_LEN}",
                b.len()
            ));
        }
        if b[0..4] != MAGIC {
            return Err(String::from(
                "not a pingpong peer (bad magic in the CM private data)",
            ));
        }
        if b[4] != VERSION {
            return Err(format!(
                "pingpong exchange version {} (want {VERSION})",
                b[4]
            ));
        }
        let transport = match b[5] {
            0 => Transport::Rc,
            1 => Transport::Ud,
            x => return Err(format!("unknown transport {x}")),
        };
        let u = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let size = u(8);
        let iters = u(12);
        if !(1..=MAX_RC_SIZE).contains(&size) {
            return Err(format!("message size {size} out of range"));
        }
        if !(1..=MAX_ITERS).contains(&iters) {
            return Err(format!("{iters} iterations out of range"));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[28..44]);
        Ok(Hello {
            transport,
            check: b[6] & 1 != 0,
            status: b[7],
            size,
            iters,
            qpn: u(16) & 0xff_ffff,
            qkey: u(20),
            psn: u(24) & 0xff_ffff,
            gid: Gid(gid),
        })
    }
}

struct Res {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    /// The UD rendezvous's RC QP.
    rdv: Option<Qp>,
    ah: Option<Ah>,
    mr: Mr,
    buf: hal::dma::DmaBuf,
    /// Bytes per buffer slot (slot 0 sends, 1.. receive).
    slot: u64,
}

fn setup(env: &mut Env<'_>, p: &Params) -> Result<Res, String> {
    let dev = env.core.device_mut(env.dev).ok_or("the device is gone")?;
    let mut made = Undo::default();
    let r = build(dev, p, &mut made);
    if r.is_err() {
        made.undo(dev);
    }
    r
}

/// [`setup`]'s steps, each object kept in `made` as it is made (a later
/// step's failure destroys the earlier ones: see [`Undo`]).
fn build(dev: &mut ib_core::Device, p: &Params, made: &mut Undo) -> Result<Res, String> {
    let pd = dev.alloc_pd().map_err(|x| e("Couldn't allocate PD", x))?;
    let pd = made.keep(pd, Made::Pd);
    let (cq, _) = dev
        .create_cq(&CqInitAttr {
            cqe: p.rx_depth + 4,
            comp_vector: 0,
        })
        .map_err(|x| e("Couldn't create CQ", x))?;
    let cq = made.keep(cq, Made::Cq);
    let mut mk = |dev: &mut ib_core::Device, t: QpType, send: u32, recv: u32| {
        dev.create_qp(
            pd,
            &QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: send,
                    max_recv_wr: recv,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_type: SigType::ReqWr,
                qp_type: t,
                create_flags: QpCreateFlags::empty(),
                port_num: p.ib_port,
            },
        )
        .map(|(q, _)| made.keep(q, Made::Qp))
        .map_err(|x| e("Couldn't create QP", x))
    };
    let (qp, rdv) = match p.transport {
        Transport::Rc => (mk(dev, QpType::Rc, 2, p.rx_depth)?, None),
        Transport::Ud => {
            let qp = mk(dev, QpType::Ud, 2, p.rx_depth)?;
            (qp, Some(mk(dev, QpType::Rc, 1, 1)?))
        }
    };
    let extra = if p.transport == Transport::Ud {
        GRH_BYTES
    } else {
        0
    };
    let slot = u64::from(p.size + extra).next_multiple_of(64);
    let len = slot * u64::from(1 + RX_SLOTS);
    let pages = len.div_ceil(4096);
    // Freed when dropped (on any error below too).
    let buf = dev
        .provider()
        .dma_pool()
        .alloc_pages(pages as usize)
        .map_err(|x| e("Couldn't allocate work buf", x))?;
    let base = buf.bus_addr().0;
    let list: Vec<u64> = (0..pages).map(|i| base + i * 4096).collect();
    let mr = dev
        .reg_mr(
            pd,
            &MrPages {
                pages: &list,
                page_shift: 12,
                iova: base,
                length: len,
                access: AccessFlags::LOCAL_WRITE,
            },
        )
        .map_err(|x| e("Couldn't register MR", x))?;
    made.keep(mr, Made::Mr);
    Ok(Res {
        pd,
        cq,
        qp,
        rdv,
        ah: None,
        mr,
        buf,
        slot,
    })
}

/// Destroys what `r` holds after ending the connection `id` (`done`: the
/// server ran to the end; see [`disconnect`]).
fn teardown(env: &mut Env<'_>, r: Res, id: Option<CmId>, done: bool) {
    if let Some(id) = id {
        disconnect(env, id, done);
    }
    if let Some(dev) = env.core.device_mut(env.dev) {
        let _ = dev.destroy_qp(r.qp);
        if let Some(q) = r.rdv {
            let _ = dev.destroy_qp(q);
        }
        if let Some(ah) = r.ah {
            let _ = dev.destroy_ah(ah);
        }
        let _ = dev.dereg_mr(r.mr);
        let _ = dev.destroy_cq(r.cq);
        let _ = dev.dealloc_pd(r.pd);
    }
    drop(r.buf);
}

/// Brings a UD QP to RTS with ud_pingpong's Q_Key and `psn`.
fn ud_up(env: &mut Env<'_>, qp: Qp, port: u8, psn: u32) -> Result<(), String> {
    let dev = env.core.device_mut(env.dev).ok_or("the device is gone")?;
    let steps = [
        (
            QpAttr {
                qp_state: QpState::Init,
                port_num: port,
                pkey_index: 0,
                qkey: UD_QKEY,
                ..QpAttr::default()
            },
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
        ),
        (
            QpAttr {
                qp_state: QpState::Rtr,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        ),
        (
            QpAttr {
                qp_state: QpState::Rts,
                sq_psn: psn,
                ..QpAttr::default()
            },
            QpAttrMask::STATE | QpAttrMask::SQ_PSN,
        ),
    ];
    for (a, m) in steps {
        dev.modify_qp(qp, &a, m)
            .map_err(|x| e("Failed to modify QP", x))?;
    }
    Ok(())
}

fn post_recv(env: &mut Env<'_>, r: &Res, p: &Params, n: u64) -> Result<(), String> {
    let k = 1 + n % u64::from(RX_SLOTS);
    let extra = if p.transport == Transport::Ud {
        GRH_BYTES
    } else {
        0
    };
    let sge = [Sge {
        addr: r.buf.bus_addr().0 + k * r.slot,
        length: p.size + extra,
        lkey: r.mr.lkey,
    }];
    env.core
        .device_mut(env.dev)
        .ok_or("the device is gone")?
        .post_recv(
            r.qp,
            &[RecvWr {
                wr_id: n,
                sg_list: &sge,
            }],
        )
        .map_err(|x| e("Couldn't post receive", x))
}

/// What the server's `--chk` bytes are XORed with: the two directions
/// carry different bytes, so a side that receives its own message back
/// fails its check instead of passing it for the peer's.
const SERVER_XOR: u8 = 0xa5;

/// Fills `m` with message `n` as the client (`from_client`) or the server
/// sends it.
pub fn fill_from(m: &mut [u8], n: u64, from_client: bool) {
    fill(m, n);
    if !from_client {
        m.iter_mut().for_each(|b| *b ^= SERVER_XOR);
    }
}

/// Checks that `m` is message `n` as the client (`from_client`) or the
/// server sends it (`m` is left XORed back for the server's).
pub fn verify_from(m: &mut [u8], n: u64, from_client: bool) -> Result<(), String> {
    if !from_client {
        m.iter_mut().for_each(|b| *b ^= SERVER_XOR);
    }
    verify(m, n).map_err(|x| format!("{x}"))
}

/// Where a UD message came from must be the peer: its QPN and LID, and
/// not this port's LID (`own_lid`): our own SEND come back, as when the SM
/// gave this port the LID the peer had (both nodes hand out the same QPNs,
/// so the QPN alone does not tell).
pub fn check_ud_source(
    wc: &Wc,
    peer_qpn: u32,
    peer_lid: u16,
    own_lid: Option<u16>,
) -> Result<(), String> {
    if own_lid == Some(wc.slid) {
        return Err(format!(
            "receive {} came from this port's own LID {} (QPN {:#08x}): our own SEND came back, not the peer's",
            wc.wr_id, wc.slid, wc.src_qp
        ));
    }
    if wc.src_qp != peer_qpn || wc.slid != peer_lid {
        return Err(format!(
            "receive {} came from LID {} QPN {:#08x}, not from the peer (LID {peer_lid} QPN {peer_qpn:#08x})",
            wc.wr_id, wc.slid, wc.src_qp
        ));
    }
    Ok(())
}

fn post_send(
    env: &mut Env<'_>,
    r: &Res,
    p: &Params,
    peer: &Hello,
    n: u64,
    client: bool,
) -> Result<(), String> {
    if p.check {
        let mut m = vec![0u8; p.size as usize];
        fill_from(&mut m, n, client);
        r.buf.write_bytes(0, &m);
    }
    let sge = [Sge {
        addr: r.buf.bus_addr().0,
        length: p.size,
        lkey: r.mr.lkey,
    }];
    let wr = SendWr {
        wr_id: SEND_WRID | n,
        sg_list: &sge,
        opcode: WrOpcode::Send,
        send_flags: SendFlags::SIGNALED,
        wr: match r.ah {
            Some(ah) => WrDetail::Ud {
                ah,
                remote_qpn: peer.qpn,
                remote_qkey: peer.qkey,
                pkey_index: 0,
                port_num: p.ib_port,
            },
            None => WrDetail::None,
        },
        ..SendWr::default()
    };
    env.core
        .device_mut(env.dev)
        .ok_or("the device is gone")?
        .post_send(r.qp, core::slice::from_ref(&wr))
        .map_err(|x| e("Couldn't post send", x))
}

/// The ping-pong itself (rc_pingpong's loop); returns the elapsed time.
/// UD receives are checked to come from the peer (`peer.qpn`, `peer_lid`).
fn run_loop(
    env: &mut Env<'_>,
    r: &Res,
    p: &Params,
    peer: &Hello,
    peer_lid: u16,
    client: bool,
) -> Result<u64, String> {
    let iters = u64::from(p.iters);
    let start = env.core.clock().now_ns();
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    // Receives posted so far (their wr_id is their number).
    let mut posted = u64::from(p.rx_depth).min(iters);
    // What we wait for before the next SEND: bit 0 our SEND, bit 1 a receive.
    let mut pending = 2u8;
    if client {
        post_send(env, r, p, peer, 0, client)?;
        pending |= 1;
    }
    let mut last = start;
    let mut spins = 0u32;
    let mut wc = [Wc::default(); 8];
    // The SM, the PMA and the peer's DREQ are served meanwhile.
    let progress_at = Cell::new(start);
    while rcnt < iters || scnt < iters {
        let n = env
            .core
            .device_mut(env.dev)
            .ok_or("the device is gone")?
            .poll_cq(r.cq, &mut wc)
            .map_err(|x| e("poll CQ failed", x))?;
        let now = env.core.clock().now_ns();
        if n == 0 {
            progress(env.core, now, &progress_at);
            env.core.clock().relax();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && (env.interrupted)() {
                return Err(format!(
                    "interrupted after {scnt} sends and {rcnt} receives"
                ));
            }
            if now.saturating_sub(last) > OP_TIMEOUT.as_nanos() as u64 {
                return Err(format!(
                    "no completion for {} s after {scnt} sends and {rcnt} receives (is the peer still there?)",
                    OP_TIMEOUT.as_secs()
                ));
            }
            continue;
        }
        last = now;
        for w in &wc[..n] {
            if client
                && w.status == WcStatus::WrFlushErr
                && w.wr_id & SEND_WRID != 0
                && rcnt == iters
            {
                // Our last SEND, flushed: the server got it (all its
                // answers are here), finished and disconnected before the
                // ACK reached us; its DREQ says so (`await_done`).
                scnt = iters;
                continue;
            }
            if w.status != WcStatus::Success {
                return Err(format!(
                    "Failed status {} ({}) for wr_id {} syndrome {:#x}",
                    w.status.msg(),
                    w.status.raw(),
                    w.wr_id,
                    w.vendor_err
                ));
            }
            if w.wr_id & SEND_WRID != 0 {
                scnt += 1;
                pending &= !1;
            } else {
                if w.wr_id != rcnt {
                    return Err(format!(
                        "Completion for unknown wr_id {} (expected receive {rcnt})",
                        w.wr_id
                    ));
                }
                if p.transport == Transport::Ud {
                    let own = env
                        .core
                        .device(env.dev)
                        .and_then(|d| d.port_cache(p.ib_port).ok())
                        .map(|c| c.lid);
                    check_ud_source(w, peer.qpn, peer_lid, own)?;
                }
                if p.check {
                    let k = 1 + rcnt % u64::from(RX_SLOTS);
                    let off = if p.transport == Transport::Ud {
                        GRH_BYTES as usize
                    } else {
                        0
                    };
                    let mut m = vec![0u8; p.size as usize];
                    r.buf.read_bytes((k * r.slot) as usize + off, &mut m);
                    let mut own = m.clone();
                    if let Err(x) = verify_from(&mut m, rcnt, !client) {
                        if verify_from(&mut own, rcnt, client).is_ok() {
                            return Err(format!(
                                "receive {rcnt} holds our own message {rcnt}, not the peer's (it came back to us)"
                            ));
                        }
                        return Err(x);
                    }
                }
                rcnt += 1;
                pending &= !2;
                if posted < iters {
                    post_recv(env, r, p, posted)?;
                    posted += 1;
                }
            }
            if scnt < iters && pending == 0 {
                post_send(env, r, p, peer, scnt, client)?;
                pending = 3;
            }
        }
    }
    Ok(env.core.clock().now_ns().saturating_sub(start))
}

fn sq_rq_psn(env: &mut Env<'_>, qp: Qp) -> (u32, u32) {
    env.core
        .device_mut(env.dev)
        .and_then(|d| d.query_qp(qp, QpAttrMask::SQ_PSN | QpAttrMask::RQ_PSN).ok())
        .map_or((0, 0), |(a, _)| (a.sq_psn, a.rq_psn))
}

/// Runs one pingpong with `p` (server if `p.peer` is `None`).
pub fn run(env: &mut Env<'_>, p: &Params, out: &mut dyn Write) -> Result<(), String> {
    let attr = env
        .core
        .device_mut(env.dev)
        .ok_or("the device is gone")?
        .query_port(p.ib_port)
        .map_err(|x| e("Couldn't get port info", x))?;
    let attr = if attr.lid == 0 || attr.state != ib_core::verbs::PortState::Active {
        let _ = writeln!(
            out,
            "Waiting for port {} to become Active (up to {} s; Ctrl-C stops)",
            p.ib_port,
            crate::perftest::run::PORT_TIMEOUT.as_secs()
        );
        wait_port_active(env, p.ib_port)?
    } else {
        attr
    };
    if p.transport == Transport::Ud && p.size > attr.active_mtu.bytes() {
        return Err(format!(
            "Requested size larger than port MTU ({})",
            attr.active_mtu.bytes()
        ));
    }
    let gid = match p.gidx {
        Some(i) => env
            .core
            .device_mut(env.dev)
            .ok_or("the device is gone")?
            .query_gid(p.ib_port, i)
            .map_err(|x| e(&format!("can't read sgid of index {i}"), x))?,
        None => Gid([0; 16]),
    };
    let mut res = setup(env, p)?;
    let mut id = None;
    let r = side(env, p, &mut res, &mut id, &attr, gid, out);
    // A server that ran to the end says so (the client waits for it).
    let done = p.peer.is_none() && r.is_ok();
    teardown(env, res, id, done);
    r
}

/// One side of the test on the port `attr` describes (its LID and active
/// MTU) with `gid` as the source GID.
fn side(
    env: &mut Env<'_>,
    p: &Params,
    res: &mut Res,
    id_out: &mut Option<CmId>,
    attr: &PortAttr,
    gid: Gid,
    out: &mut dyn Write,
) -> Result<(), String> {
    let lid = attr.lid;
    let active_mtu = attr.active_mtu.bytes();
    let t = p.transport;
    let ud_psn = res.qp.qp_num.wrapping_mul(0x9e37_79b1) & 0xff_ffff;
    if t == Transport::Ud {
        ud_up(env, res.qp, p.ib_port, ud_psn)?;
    }
    let mine = Hello {
        transport: t,
        check: p.check,
        status: 0,
        size: p.size,
        iters: p.iters,
        qpn: res.qp.qp_num,
        qkey: UD_QKEY,
        psn: ud_psn,
        gid,
    };
    let cm_qp = res.rdv.unwrap_or(res.qp);
    let (q, peer, peer_lid) = match p.peer {
        Some(peer) => {
            let mut path = path_to(env, p.ib_port, peer)?;
            let peer_lid = path.dlid;
            if let Some(m) = p.mtu {
                // -m: no larger than asked (the path's is the most it can be).
                let code = (m / 256).trailing_zeros() as u8 + 1;
                path.mtu = path.mtu.min(code);
            }
            // As perftest: a short ACK timeout (see PACKET_LIFE_CAP).
            let mut req = cm_req(path, t.service_id(), cm_qp);
            req.private_data = mine.encode();
            if t == Transport::Ud {
                // Receives first: the server may answer our first SEND at once.
                for n in 0..u64::from(p.rx_depth.min(p.iters)) {
                    post_recv(env, res, p, n)?;
                }
            }
            let (id, rep) =
                cm::connect(env.core, env.cm, env.dev, p.ib_port, &req, CONNECT_TIMEOUT)
                    .map_err(|x| match x {
                        ib_core::Error::Errno(cm::ECONNREFUSED) => format!(
                            "the server refused the connection (is {} running there, with the same options?)",
                            t.name()
                        ),
                        other => format!("Couldn't connect to {peer:?}: {other}"),
                    })?;
            *id_out = Some(id);
            let theirs = Hello::decode(&rep).map_err(|m| format!("server's answer: {m}"))?;
            if theirs.status != 0 {
                return Err(format!("the server refused (code {})", theirs.status));
            }
            if t == Transport::Rc {
                for n in 0..u64::from(p.rx_depth.min(p.iters)) {
                    post_recv(env, res, p, n)?;
                }
            }
            (p.clone(), theirs, peer_lid)
        }
        None => {
            let listen = cm::listen(env.core, env.cm, env.dev, t.service_id())
                .map_err(|x| e("listen", x))?;
            let _ = writeln!(
                out,
                "Waiting for a client to connect (LID {lid}, up to {} s; Ctrl-C stops)",
                CONNECT_TIMEOUT.as_secs()
            );
            let got = wait_cm(env, listen, "a client's CM REQ", CONNECT_TIMEOUT);
            let _ = cm::destroy_id(env.core, env.cm, listen);
            let (id, private, remote_lid) = match got? {
                CmEvent::ReqReceived {
                    id,
                    private_data,
                    remote_lid,
                    ..
                } => (id, private_data, remote_lid),
                _ => return Err(String::from("unexpected CM event on the listener")),
            };
            *id_out = Some(id);
            let theirs = match Hello::decode(&private).and_then(|h| {
                if h.transport != t {
                    return Err(String::from("the client runs the other pingpong"));
                }
                if t == Transport::Ud && h.size > active_mtu {
                    return Err(format!(
                        "the client's size {} is larger than the port MTU ({active_mtu})",
                        h.size
                    ));
                }
                Ok(h)
            }) {
                Ok(h) => h,
                Err(m) => {
                    let _ = cm::send_rej(env.core, env.cm, id, 28, &[], &[]);
                    return Err(format!("refused the client: {m}"));
                }
            };
            // The server follows the client's size, count and check.
            let mut q = p.clone();
            q.size = theirs.size;
            q.iters = theirs.iters;
            q.check = theirs.check;
            if q.size > p.size {
                // Our buffer was sized for -s: build it again for theirs.
                let fresh = setup(env, &q).inspect_err(|_| {
                    let _ = cm::send_rej(env.core, env.cm, id, 28, &[], &[]);
                })?;
                let old = core::mem::replace(res, fresh);
                teardown(env, old, None, false);
                if t == Transport::Ud {
                    ud_up(env, res.qp, p.ib_port, ud_psn)?;
                }
            }
            let mut reply = mine;
            reply.size = q.size;
            reply.iters = q.iters;
            reply.check = q.check;
            reply.qpn = res.qp.qp_num;
            let mut rep = CmRepParam::new(res.rdv.unwrap_or(res.qp));
            rep.private_data = reply.encode();
            if t == Transport::Ud {
                for n in 0..u64::from(q.rx_depth.min(q.iters)) {
                    post_recv(env, res, &q, n)?;
                }
            }
            cm::send_rep(env.core, env.cm, id, &rep).map_err(|x| e("CM REP", x))?;
            if t == Transport::Rc {
                for n in 0..u64::from(q.rx_depth.min(q.iters)) {
                    post_recv(env, res, &q, n)?;
                }
            }
            wait_rtu(env, id)?;
            (q, theirs, remote_lid)
        }
    };
    // What rdma-core prints: our QPN and PSN, then the peer's.
    let (local, remote) = match t {
        Transport::Rc => {
            let (sq, rq) = sq_rq_psn(env, res.qp);
            let remote_qpn = id_out
                .and_then(|id| cm::remote(env.core, env.cm, id))
                .map_or(0, |r| r.1);
            (
                Dest {
                    lid,
                    qpn: res.qp.qp_num,
                    psn: sq,
                    gid,
                },
                Dest {
                    lid: peer_lid,
                    qpn: remote_qpn,
                    psn: rq,
                    gid: peer.gid,
                },
            )
        }
        Transport::Ud => {
            let ah = env
                .core
                .device_mut(env.dev)
                .ok_or("the device is gone")?
                .create_ah(
                    res.pd,
                    &AhAttr {
                        dlid: peer_lid,
                        sl: q.sl,
                        port_num: q.ib_port,
                        ..AhAttr::default()
                    },
                )
                .map_err(|x| e("Failed to create AH", x))?;
            res.ah = Some(ah);
            (
                Dest {
                    lid,
                    qpn: res.qp.qp_num,
                    psn: ud_psn,
                    gid,
                },
                Dest {
                    lid: peer_lid,
                    qpn: peer.qpn,
                    psn: peer.psn,
                    gid: peer.gid,
                },
            )
        }
    };
    let _ = print_dest(out, t, false, &local);
    let _ = print_dest(out, t, true, &remote);
    let nanos = run_loop(env, res, &q, &peer, remote.lid, p.peer.is_some())?;
    let _ = print_result(out, q.size, q.iters, nanos);
    match *id_out {
        // The server's word that it finished too (see `await_done`).
        Some(id) if p.peer.is_some() => await_done(env, id),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_prints_as_inet_ntop() {
        let s = |g: Gid| format!("{}", GidStr(g));
        assert_eq!(s(Gid([0; 16])), "::");
        assert_eq!(
            s(Gid::new(0xfe80_0000_0000_0000, 0x0002_c903_0000_0011)),
            "fe80::2:c903:0:11"
        );
        assert_eq!(
            s(Gid::new(0xfe80_0000_0000_0000, 0x0000_0000_0000_0001)),
            "fe80::1"
        );
        assert_eq!(
            s(Gid::new(0x2001_0db8_0000_0001, 0x0000_0000_0001_0000)),
            "2001:db8:0:1::1:0"
        );
        let mut m = [0u8; 16];
        m[10] = 0xff;
        m[11] = 0xff;
        m[12..].copy_from_slice(&[10, 0, 0, 1]);
        assert_eq!(s(Gid(m)), "::ffff:10.0.0.1");
    }

    #[test]
    fn address_and_result_lines_in_rdma_core_words() {
        let d = Dest {
            lid: 3,
            qpn: 0x48,
            psn: 0x5b1f4f,
            gid: Gid([0; 16]),
        };
        let mut o = String::new();
        print_dest(&mut o, Transport::Rc, false, &d).unwrap();
        print_dest(&mut o, Transport::Ud, true, &d).unwrap();
        assert_eq!(
            o,
            "  local address:  LID 0x0003, QPN 0x000048, PSN 0x5b1f4f, GID ::\n  remote address: LID 0x0003, QPN 0x000048, PSN 0x5b1f4f: GID ::\n"
        );
        let mut o = String::new();
        print_result(&mut o, 4096, 1000, 50_000_000).unwrap();
        assert_eq!(
            o,
            "8192000 bytes in 0.05 seconds = 1310.72 Mbit/sec\n1000 iters in 0.05 seconds = 50.00 usec/iter\n"
        );
    }

    #[test]
    fn options_and_refusals() {
        let p = Params::parse(Transport::Rc, &["-s", "64", "-n", "10", "--chk", "0x3"]).unwrap();
        assert_eq!((p.size, p.iters, p.check), (64, 10, true));
        assert_eq!(p.peer, Some(Peer::Lid(3)));
        assert_eq!(Params::defaults(Transport::Ud).size, 2048);
        assert!(
            Params::parse(Transport::Rc, &["-e"])
                .unwrap_err()
                .contains("polled")
        );
        assert!(
            Params::parse(Transport::Rc, &["-p", "1"])
                .unwrap_err()
                .contains("IB CM")
        );
        assert!(
            Params::parse(Transport::Ud, &["-m", "1024"])
                .unwrap_err()
                .contains("unknown")
        );
        assert!(Params::parse(Transport::Rc, &["-m", "1000"]).is_err());
        assert!(Params::parse(Transport::Rc, &["-s", "0"]).is_err());
        assert_eq!(Params::parse(Transport::Rc, &["-h"]).unwrap_err(), "");
        assert!(Params::parse(Transport::Rc, &["1", "2"]).is_err());
    }

    #[test]
    fn a_ud_message_not_from_the_peer_is_refused() {
        let w = |slid: u16, src_qp: u32| Wc {
            wr_id: 7,
            slid,
            src_qp,
            ..Wc::default()
        };
        // The peer: LID 3, QPN 0x48 (the same QPN as ours: both nodes
        // hand them out alike).
        assert!(check_ud_source(&w(3, 0x48), 0x48, 3, Some(4)).is_ok());
        let e = check_ud_source(&w(4, 0x48), 0x48, 3, Some(4)).unwrap_err();
        assert!(e.contains("own LID 4"), "{e}");
        // This port now has the LID the peer had: its own SENDs come back
        // with the peer's LID and QPN, and only its own LID tells.
        let e = check_ud_source(&w(3, 0x48), 0x48, 3, Some(3)).unwrap_err();
        assert!(e.contains("our own SEND came back"), "{e}");
        let e = check_ud_source(&w(5, 0x48), 0x48, 3, Some(4)).unwrap_err();
        assert!(e.contains("came from LID 5"), "{e}");
        let e = check_ud_source(&w(3, 0x49), 0x48, 3, Some(4)).unwrap_err();
        assert!(e.contains("QPN 0x000049"), "{e}");
    }

    #[test]
    fn the_two_directions_carry_different_patterns() {
        for n in [0, 1, 99, u64::from(MAX_ITERS)] {
            for from_client in [true, false] {
                let mut m = vec![0u8; 64];
                fill_from(&mut m, n, from_client);
                let mut other = m.clone();
                assert!(verify_from(&mut m, n, from_client).is_ok());
                assert!(
                    verify_from(&mut other, n, !from_client).is_err(),
                    "message {n} of one side passes for the other's"
                );
            }
        }
    }

    #[test]
    fn hello_round_trips_and_refuses_garbage() {
        let h = Hello {
            transport: Transport::Ud,
            check: true,
            status: 0,
            size: 2048,
            iters: 77,
            qpn: 0x48,
            qkey: UD_QKEY,
            psn: 0x123456,
            gid: Gid::new(0xfe80_0000_0000_0000, 7),
        };
        let b = h.encode();
        assert!(b.len() <= 92);
        assert_eq!(Hello::decode(&b).unwrap(), h);
        assert!(Hello::decode(&b[..20]).is_err());
        let mut bad = b.clone();
        bad[0] = b'X';
        assert!(Hello::decode(&bad).unwrap_err().contains("magic"));
        let mut bad = b.clone();
        bad[8..12].copy_from_slice(&0u32.to_be_bytes());
        assert!(Hello::decode(&bad).unwrap_err().contains("size"));
        let mut bad = b;
        bad[5] = 9;
        assert!(Hello::decode(&bad).is_err());
    }
}
