//! The perftest runs between our own tools: perftest's exchange carried by the IB CM.
//!
//! The server listens on [`PERFTEST_SERVICE_ID`] (a TCP connection to
//! perftest's port 18515 is handed to [`socket`](super::socket) instead),
//! takes the client's parameters from the REQ's private data ([`Hello`])
//! and answers with its buffer in the REP ([`Reply`]); the client asks the
//! SA for the path (or makes it locally on RoCE), connects and drives the
//! test; the closing handshake is a DREQ from the server saying it ran to
//! the end. Linux's perftest does not speak this: it is for our own pairs.

use alloc::format;
use alloc::string::String;
use core::fmt::Write;

use ib_core::cm::{self, CmEvent, CmId, CmRepParam, CmReqParam};
use ib_core::sa_query::PathRecord;
use ib_core::verbs::{Qp, QpState};

use super::super::exchange::{Hello, PERFTEST_SERVICE_ID, Reply};
use super::super::{
    Dest, LinkInfo, Params, Peer, RESULT_LINE, TestKind, Verb, print_pingpong_data,
    print_result_header, print_test_info,
};
use super::rdma_cm::Ctl;
use super::{
    CLOSE_TIMEOUT, CM_RESPONSE_TIMEOUT, CM_RETRIES, CONNECT_TIMEOUT, DONE, DREP_TIMEOUT, Env,
    PACKET_LIFE_CAP, Res, Step, drive_size, e, fill_slot, gid_text, path_from, post_recvs,
    serve_size, setup, slots_for, socket, wait_cm,
};

/// Ends a connection (perftest's closing handshake, through the CM): a
/// server that ran to the end (`done`) says so in its DREQ and waits for
/// the client's DREP before it destroys the connection (a lost DREQ is
/// sent again meanwhile); otherwise a plain DREQ (it fails, harmlessly, on
/// a connection the peer already ended).
pub(crate) fn disconnect(env: &mut Env<'_>, id: CmId, done: bool) {
    let data: &[u8] = if done { DONE } else { &[] };
    if cm::send_dreq(env.core, env.cm, id, data).is_ok() && done {
        let _ = wait_cm(env, id, "the client's DREP", DREP_TIMEOUT);
    }
    let _ = cm::destroy_id(env.core, env.cm, id);
}

/// The client's end of the closing handshake: waits for the server's DREQ
/// saying it finished. The client ends nothing before that: its DREQ
/// would take the server's QP to the error state while the server may
/// still wait for the ACK of its last message (lost on the wire, sent
/// again), which would end in a flush error there.
pub(crate) fn await_done(env: &mut Env<'_>, id: CmId) -> Result<(), String> {
    loop {
        match wait_cm(env, id, "the server to finish (its DREQ)", CLOSE_TIMEOUT)? {
            CmEvent::Disconnected {
                by_peer: true,
                private_data,
                ..
            } => {
                return if private_data.starts_with(DONE) {
                    Ok(())
                } else {
                    Err(String::from(
                        "the server ended the connection before finishing the run (see its console)",
                    ))
                };
            }
            CmEvent::MraReceived { .. } | CmEvent::Established { .. } => {}
            other => {
                return Err(format!(
                    "the connection ended while waiting for the server to finish ({other:?})"
                ));
            }
        }
    }
}
/// The clients' CM REQ on `path` (its packet life time capped at
/// [`PACKET_LIFE_CAP`]) with [`CM_RESPONSE_TIMEOUT`] and [`CM_RETRIES`].
pub(crate) fn cm_req(mut path: PathRecord, service_id: u64, qp: Qp) -> CmReqParam {
    // perftest sets the QP's ACK timeout (14) itself; through the CM the
    // timeout follows the path's packet life time, so cap that: the CM
    // then gives the QPs 17 (537 ms a try, about 4.3 s for the 7 retries)
    // instead of over 4 s per try with an SM's default of 18.
    path.packet_life_time = path.packet_life_time.min(PACKET_LIFE_CAP);
    let mut req = CmReqParam::new(path, service_id, qp);
    req.remote_cm_response_timeout = CM_RESPONSE_TIMEOUT;
    req.local_cm_response_timeout = CM_RESPONSE_TIMEOUT;
    req.max_cm_retries = CM_RETRIES;
    req
}

/// The servers' wait for the client's RTU after their REP.
pub(crate) fn wait_rtu(env: &mut Env<'_>, id: CmId) -> Result<(), String> {
    match wait_cm(env, id, "the client's RTU", CONNECT_TIMEOUT)? {
        CmEvent::Established { .. } => Ok(()),
        CmEvent::Rejected { reason, .. } => Err(format!(
            "the client rejected the connection (reason {reason})"
        )),
        CmEvent::TimedOut => Err(String::from(
            "the client's RTU never came (our REP was sent again until the CM gave up)",
        )),
        other => Err(format!(
            "the connection failed while waiting for the RTU ({other:?})"
        )),
    }
}

pub(super) fn server(
    env: &mut Env<'_>,
    p: &Params,
    link: &LinkInfo,
    lid: u16,
    out: &mut dyn Write,
) -> (Option<Res>, Step<Option<CmId>>) {
    let mut res = None;
    let r = serve(env, p, link, lid, out, &mut res);
    (res, r)
}

fn serve(
    env: &mut Env<'_>,
    p: &Params,
    link: &LinkInfo,
    lid: u16,
    out: &mut dyn Write,
    slot_res: &mut Option<Res>,
) -> Step<Option<CmId>> {
    let listen = cm::listen(env.core, env.cm, env.dev, PERFTEST_SERVICE_ID)
        .map_err(|x| (e("listen", x), None))?;
    let _ = writeln!(out, "{RESULT_LINE}");
    let _ = writeln!(
        out,
        " Waiting for client to connect... (LID {lid}, up to {} s; Ctrl-C stops)",
        CONNECT_TIMEOUT.as_secs()
    );
    let got = socket::accept_either(env, p, listen);
    let _ = cm::destroy_id(env.core, env.cm, listen);
    let got = match got {
        Ok(socket::Incoming::Tcp(sock)) => {
            let r = socket::run(env, p, link, lid, socket::Way::Tcp(sock), out, slot_res);
            socket::close(env, sock);
            return r.map(|()| None).map_err(|m| (m, None));
        }
        Ok(socket::Incoming::RdmaCm(l, child)) => {
            let _ = writeln!(out, " A client came by rdma_cm (-R)");
            let ctl = Ctl::accept(env, l, child).map_err(|m| (m, None))?;
            let r = socket::run(env, p, link, lid, socket::Way::Cm(&ctl), out, slot_res);
            ctl.finish(env);
            return r.map(|()| None).map_err(|m| (m, None));
        }
        Ok(socket::Incoming::Cm(ev)) => Ok(ev),
        Err(m) => Err(m),
    };
    let (id, private, remote_lid, remote_qpn) = match got {
        Ok(CmEvent::ReqReceived {
            id,
            private_data,
            remote_lid,
            remote_qpn,
            ..
        }) => (id, private_data, remote_lid, remote_qpn),
        Ok(_) => return Err((String::from("unexpected CM event on the listener"), None)),
        Err(m) => return Err((m, None)),
    };
    let hello = match Hello::decode(&private).and_then(|h| {
        h.accept(p.tool, 0)?;
        Ok(h)
    }) {
        Ok(h) => h,
        Err(x) => {
            let _ = cm::send_rej(env.core, env.cm, id, 28, &[], &[]);
            return Err((format!("refused the client: {x}"), Some(id)));
        }
    };
    // The server runs with the client's parameters.
    let mut q = p.clone();
    q.size = hello.size;
    q.iters = hello.iters;
    q.all_sizes = hello.all_sizes;
    q.check = hello.check;
    q.atomic_type = hello.atomic_type;
    q.duration = (hello.duration != 0).then_some(hello.duration);
    let (slot, slots) = slots_for(&q);
    let res = match setup(env, &q, slot, slots) {
        Ok(r) => slot_res.insert(r),
        Err(m) => {
            let _ = cm::send_rej(env.core, env.cm, id, 28, &[], &[]);
            return Err((m, Some(id)));
        }
    };
    let mut rep = CmRepParam::new(res.qp);
    rep.private_data = Reply {
        status: 0,
        vaddr: res.buf.bus_addr().0,
        rkey: res.mr.rkey,
        len: res.slot * res.slots,
    }
    .encode();
    let psn = rep.starting_psn;
    if q.tool.verb == Verb::Read {
        // What the client's reads fetch (and --check verifies): pattern k
        // in slot k, written before the REP: the client reads as soon as
        // it has the REP, before our RTU wait even starts.
        for k in 0..res.slots {
            fill_slot(res, k, res.slot, k);
        }
    }
    cm::send_rep(env.core, env.cm, id, &rep).map_err(|x| (e("CM REP", x), Some(id)))?;
    // Receives for the client's SENDs: the REP took the QP out of RESET;
    // the client sends nothing before our RTU arrives.
    let recvs = if (q.tool.verb, q.tool.kind) == (Verb::Send, TestKind::Bw) {
        u64::from(q.rx_depth).min(res.slots)
    } else {
        1
    };
    post_recvs(env, res, q.tool.kind, 0..recvs).map_err(|m| (m, Some(id)))?;
    wait_rtu(env, id).map_err(|m| (m, Some(id)))?;
    let _ = print_test_info(out, &q, link);
    let local = Dest {
        lid,
        qpn: res.qp.qp_num,
        psn,
        rkey: res.mr.rkey,
        vaddr: res.buf.bus_addr().0,
        out_reads: q.out_reads,
    };
    let remote = Dest {
        lid: remote_lid,
        qpn: remote_qpn,
        psn: peer_psn(env, id),
        rkey: hello.rkey,
        vaddr: hello.vaddr,
        out_reads: q.out_reads,
    };
    let _ = print_pingpong_data(out, false, q.tool.verb, &local);
    let _ = print_pingpong_data(out, true, q.tool.verb, &remote);
    let _ = writeln!(out, "{RESULT_LINE}");
    for size in q.sizes() {
        serve_size(env, &q, res, size, &hello).map_err(|m| (m, Some(id)))?;
    }
    let _ = remote_qpn;
    let _ = writeln!(out, "{RESULT_LINE}");
    Ok(Some(id))
}

pub(super) fn client(
    env: &mut Env<'_>,
    p: &Params,
    res: &mut Res,
    link: &LinkInfo,
    lid: u16,
    peer: Peer,
    out: &mut dyn Write,
) -> Step<Option<CmId>> {
    let whom = match peer {
        Peer::Lid(l) => format!("LID {l}"),
        Peer::Guid(g) => format!("port GUID {g:#018x}"),
        Peer::Gid(g) => format!("GID {}", gid_text(&g)),
        Peer::Ip(ip) => format!("{ip}"),
    };
    let _ = writeln!(
        out,
        " Asking the SA for a path to {whom} (up to {} s)",
        CONNECT_TIMEOUT.as_secs()
    );
    let path = path_from(env, p.ib_port, p.gid_index, peer).map_err(|m| (m, None))?;
    let remote_lid = path.dlid;
    let (sgid, dgid) = (path.sgid.0, path.dgid.0);
    let mut req = cm_req(path, PERFTEST_SERVICE_ID, res.qp);
    req.private_data =
        Hello::from_params(p, res.buf.bus_addr().0, res.mr.rkey, res.slot * res.slots).encode();
    let psn = req.starting_psn;
    let _ = writeln!(
        out,
        " Connecting to the server (CM REQ, service {PERFTEST_SERVICE_ID:#x})"
    );
    let (id, rep) = cm::connect(env.core, env.cm, env.dev, p.ib_port, &req, CONNECT_TIMEOUT)
        .map_err(|x| {
            let why = match x {
                ib_core::Error::Errno(cm::ECONNREFUSED) => String::from(
                    "the peer rejected the connection (is the server running the same tool there?)",
                ),
                other => format!("{other}"),
            };
            (format!("connecting to {whom}: {why}"), None)
        })?;
    let reply =
        Reply::decode(&rep, p.max_size()).map_err(|x| (e("server's answer", x), Some(id)))?;
    if p.tool.verb == Verb::Send && p.tool.kind == TestKind::Lat {
        // For the server's pongs (the first comes only after our first ping).
        post_recvs(env, res, TestKind::Lat, 0..1).map_err(|m| (m, Some(id)))?;
    }
    let _ = print_test_info(out, p, link);
    let local = Dest {
        lid,
        qpn: res.qp.qp_num,
        psn,
        rkey: res.mr.rkey,
        vaddr: res.buf.bus_addr().0,
        out_reads: p.out_reads,
    };
    let remote_qpn = cm::remote(env.core, env.cm, id).map_or(0, |r| r.1);
    let remote = Dest {
        lid: remote_lid,
        qpn: remote_qpn,
        psn: peer_psn(env, id),
        rkey: reply.rkey,
        vaddr: reply.vaddr,
        out_reads: p.out_reads,
    };
    let _ = print_pingpong_data(out, false, p.tool.verb, &local);
    if link.link_type == "Ethernet" {
        let _ = super::super::print_gid(out, &sgid);
    }
    let _ = print_pingpong_data(out, true, p.tool.verb, &remote);
    if link.link_type == "Ethernet" {
        let _ = super::super::print_gid(out, &dgid);
    }
    let _ = print_result_header(out, p);
    for size in p.sizes() {
        drive_size(env, p, res, size, &reply, out).map_err(|m| (m, Some(id)))?;
    }
    let _ = writeln!(out, "{RESULT_LINE}");
    await_done(env, id).map_err(|m| (m, Some(id)))?;
    Ok(Some(id))
}

/// The starting PSN the peer's CM message named (the client's REQ for the
/// server, the server's REP for the client): the PSN our QP sends from,
/// as the CM gives it for RTS.
fn peer_psn(env: &mut Env<'_>, id: CmId) -> u32 {
    cm::init_qp_attr(env.core, env.cm, id, QpState::Rts).map_or(0, |(a, _)| a.sq_psn)
}
