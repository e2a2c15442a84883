//! The RDMA CM's side of the IB CM (Linux `cma.c`'s `cma_ib_handler`, `cma_ib_req_handler`, `cma_sidr_rep_handler`) and the time limits of the IDs' requests.
//!
//! Split from [`super`] (the consumer's calls) along the seam Linux's
//! file draws between the calls and the IB CM's callbacks; what is left
//! out is in the parent module's doc.

use super::*;

pub(super) fn cma_poll(core: &mut IbCore, st: &mut Cma) -> usize {
    let mut work = 0;
    let now = core.clock().now_ns();
    // Address requests past their time (addr.c's process_one_req).
    for p in st.ids.iter_mut() {
        if p.addr_req.as_ref().is_some_and(|r| now >= r.deadline_ns) {
            work += 1;
            p.addr_req = None;
            p.state = RdmaCmState::AddrBound;
            st.counters.addr_timeouts += 1;
            let h = p.handle();
            p.push(RdmaCmEvent::new(
                RdmaCmEventType::AddrError,
                -errno::ETIMEDOUT,
                h,
            ));
        }
    }
    // Route queries (cma_query_handler).
    for i in 0..st.ids.len() {
        let Some((q, deadline)) = st.ids[i].route_query else {
            continue;
        };
        let r = match sa_query::query_result(core, st.sa, q) {
            Some(r) => r,
            None if now >= deadline => {
                let _ = sa_query::cancel_query(core, st.sa, q);
                Err(Error::TimedOut)
            }
            None => continue,
        };
        work += 1;
        let p = &mut st.ids[i];
        p.route_query = None;
        let h = p.handle();
        match r.and_then(|resp| resp.path_records()) {
            Ok(v) if !v.is_empty() => {
                p.path = Some(v[0]);
                p.state = RdmaCmState::RouteResolved;
                p.push(RdmaCmEvent::new(RdmaCmEventType::RouteResolved, 0, h));
            }
            Ok(_) => {
                p.state = RdmaCmState::AddrResolved;
                p.push(RdmaCmEvent::new(
                    RdmaCmEventType::RouteError,
                    -errno::EHOSTUNREACH,
                    h,
                ));
            }
            Err(e) => {
                p.state = RdmaCmState::AddrResolved;
                p.push(RdmaCmEvent::new(
                    RdmaCmEventType::RouteError,
                    errno_of(&e),
                    h,
                ));
            }
        }
    }
    // Requests on the shared IB CM listeners.
    for li in 0..st.listeners.len() {
        let cm_id = st.listeners[li].cm_id;
        while let Some(ev) = cm::get_event(core, st.cm, cm_id) {
            work += 1;
            cma_req_handler(core, st, ev);
        }
    }
    // Each connection's IB CM events.
    for i in 0..st.ids.len() {
        let Some(cm_id) = st.ids[i].cm_id else {
            continue;
        };
        while let Some(ev) = cm::get_event(core, st.cm, cm_id) {
            work += 1;
            cma_ib_handler(core, st, i, ev);
        }
    }
    work
}

/// `cma_ib_handler` (and `cma_sidr_rep_handler`): one IB CM event of a
/// connection as the consumer hears it.
pub(super) fn cma_ib_handler(core: &mut IbCore, st: &mut Cma, i: usize, ev: CmEvent) {
    let p = &mut st.ids[i];
    let h = p.handle();
    let mut out = match ev {
        CmEvent::Established { private_data } => {
            if p.state != RdmaCmState::Connect {
                return;
            }
            let mut e = RdmaCmEvent::new(RdmaCmEventType::Established, 0, h);
            e.conn.private_data = private_data;
            e
        }
        CmEvent::Rejected {
            reason,
            private_data,
            ..
        } => {
            p.state = RdmaCmState::Idle;
            let mut e = RdmaCmEvent::new(RdmaCmEventType::Rejected, i32::from(reason), h);
            e.conn.private_data = private_data;
            e
        }
        CmEvent::TimedOut => {
            p.state = RdmaCmState::Idle;
            RdmaCmEvent::new(RdmaCmEventType::Unreachable, -errno::ETIMEDOUT, h)
        }
        CmEvent::Disconnected {
            private_data,
            dreq_timed_out,
            ..
        } => {
            // Only the first of the two ends (DREQ in, DREP in) is told.
            if p.state != RdmaCmState::Connect {
                return;
            }
            p.state = RdmaCmState::Disconnect;
            let status = if dreq_timed_out { -errno::ETIMEDOUT } else { 0 };
            let mut e = RdmaCmEvent::new(RdmaCmEventType::Disconnected, status, h);
            e.conn.private_data = private_data;
            e
        }
        CmEvent::SidrRepReceived {
            status,
            qpn,
            qkey,
            private_data,
            ..
        } => {
            if status != sidr_status::SUCCESS {
                p.state = RdmaCmState::Idle;
                RdmaCmEvent::new(RdmaCmEventType::Unreachable, -errno::ECONNRESET, h)
            } else if p.ps == PortSpace::Udp && qkey != RDMA_UDP_QKEY {
                // cma_set_qkey: a UDP service must use the UDP Q_Key.
                RdmaCmEvent::new(RdmaCmEventType::AddrError, -errno::EINVAL, h)
            } else {
                let ah_attr = match (p.path, p.port) {
                    (Some(path), Some((d, port))) => core
                        .device(d)
                        .and_then(|dev| sa_query::init_ah_from_path(dev, port, &path).ok())
                        .unwrap_or_default(),
                    _ => AhAttr::default(),
                };
                let mut e = RdmaCmEvent::new(RdmaCmEventType::Established, 0, h);
                e.ud = Some(RdmaUdParam {
                    private_data,
                    ah_attr,
                    qp_num: qpn,
                    qkey,
                });
                e
            }
        }
        CmEvent::MraReceived { .. }
        | CmEvent::ReqReceived { .. }
        | CmEvent::SidrReqReceived { .. } => {
            return;
        }
    };
    out.id = h;
    p.push(out);
}

/// Refuses a request the RDMA CM will not hand on (the IB CM then forgets
/// its ID).
pub(super) fn refuse(core: &mut IbCore, st: &Cma, cm_id: CmId, sidr: bool) {
    if sidr {
        let _ = cm::send_sidr_rep(core, st.cm, cm_id, sidr_status::REJECT, 0, 0, &[]);
    } else {
        let _ = cm::send_rej(core, st.cm, cm_id, rej_reason::CONSUMER_DEFINED, &[], &[]);
    }
    let _ = cm::destroy_id(core, st.cm, cm_id);
}

/// `cma_ib_req_handler` with `cma_ib_id_from_event`: a REQ or SIDR_REQ on
/// an IB CM listener is checked (cma header, the device of its port and
/// P_Key owning the destination address, the listener by port space, port
/// and address, the QP type) and becomes a new ID and a CONNECT_REQUEST on
/// the listener, or is refused.
pub(super) fn cma_req_handler(core: &mut IbCore, st: &mut Cma, ev: CmEvent) {
    let mut offer = RdmaConnParam::default();
    let (cm_id, port, pkey, sid, data, sidr, remote_lid, remote_qpn) = match ev {
        CmEvent::ReqReceived {
            id,
            port,
            private_data,
            pkey,
            service_id,
            remote_lid,
            remote_qpn,
            responder_resources,
            initiator_depth,
            retry_count,
            rnr_retry_count,
            ..
        } => {
            offer.responder_resources = responder_resources;
            offer.initiator_depth = initiator_depth;
            offer.retry_count = retry_count;
            offer.rnr_retry_count = rnr_retry_count;
            offer.qp_num = remote_qpn;
            (
                id,
                port,
                pkey,
                service_id,
                private_data,
                false,
                remote_lid,
                remote_qpn,
            )
        }
        CmEvent::SidrReqReceived {
            id,
            port,
            pkey,
            service_id,
            private_data,
            remote_lid,
            remote_qpn,
        } => (
            id,
            port,
            pkey,
            service_id,
            private_data,
            true,
            remote_lid,
            remote_qpn,
        ),
        _ => return,
    };
    let what = if sidr { "SIDR_REQ" } else { "REQ" };
    // cma_save_ip_info.
    let Some(hdr) = CmaHdr::parse(&data) else {
        return refuse(core, st, cm_id, sidr);
    };
    if hdr.cma_version != CMA_VERSION {
        st.counters.bad_version += 1;
        log::warn!(
            "rdma_cm: {what} from LID {remote_lid} for service {sid:#018x}: cma version {:#04x}, not {CMA_VERSION:#04x}: refused",
            hdr.cma_version
        );
        return refuse(core, st, cm_id, sidr);
    }
    if hdr.ip_version != 4 {
        st.counters.bad_ip_version += 1;
        log::warn!(
            "rdma_cm: {what} from LID {remote_lid}: IP version {} (only IPv4 here): refused",
            hdr.ip_version
        );
        return refuse(core, st, cm_id, sidr);
    }
    let (src, dst) = (hdr.src_ip4(), hdr.dst_ip4());
    let dport = port_from_service_id(sid);
    // cma_get_net_dev + validate_net_dev: the IPoIB device of this port
    // and P_Key (on RoCE: the port's Ethernet device) must own the
    // destination address.
    let dev = cm_id.dev;
    let nd = st
        .netdevs
        .iter()
        .find(|d| {
            d.rdma_port == Some((dev, port))
                && (d.dev_type == addr::ARPHRD_ETHER
                    || u16::from_be_bytes([d.broadcast[8], d.broadcast[9]]) & 0x7fff
                        == pkey & 0x7fff)
                && d.has_addr(dst)
        })
        .cloned();
    let Some(nd) = nd.filter(|_| addr::is_unicast(src) && addr::is_unicast(dst)) else {
        st.counters.no_netdev += 1;
        log::warn!(
            "rdma_cm: {what} from {src}:{} (LID {remote_lid}) for {dst}:{dport}: no IP device of port {port} P_Key {pkey:#06x} has that address: refused",
            hdr.port
        );
        return refuse(core, st, cm_id, sidr);
    };
    // cma_find_listener: port space and port from the service ID, then
    // the bound address (any, or the destination), then the device.
    let ps = ps_from_service_id(sid);
    let li = st.ids.iter().position(|l| {
        l.state == RdmaCmState::Listen
            && l.ps.value() == ps
            && l.src.port() == dport
            && (l.src.ip().is_unspecified() || *l.src.ip() == dst)
            && l.port.is_none_or(|(d, _)| d == dev)
    });
    let Some(li) = li else {
        st.counters.no_listener += 1;
        log::warn!(
            "rdma_cm: {what} from {src}:{} for {dst}:{dport}: no listener on that address: refused",
            hdr.port
        );
        return refuse(core, st, cm_id, sidr);
    };
    // cma_ib_check_req_qp_type.
    let want = if sidr { QpType::Ud } else { QpType::Rc };
    if st.ids[li].qp_type != want {
        st.counters.bad_qp_type += 1;
        log::warn!("rdma_cm: {what} for {dst}:{dport}: the listener's QP type differs: refused");
        return refuse(core, st, cm_id, sidr);
    }
    let lps = st.ids[li].ps;
    let listen_h = st.ids[li].handle();
    let ni = st.alloc(lps, want);
    let mut a = addr::copy_src_l2_addr(&nd);
    a.rdma_port = Some((dev, port));
    a.set_roce_ips(dst, src);
    let p = &mut st.ids[ni];
    p.state = RdmaCmState::Connect;
    p.src = SocketAddrV4::new(dst, dport);
    p.dst = SocketAddrV4::new(src, hdr.port);
    p.bound = false;
    p.port = Some((dev, port));
    p.dev_addr = Some(a);
    p.cm_id = Some(cm_id);
    p.sidr = sidr;
    p.req_conn = offer;
    let new_h = p.handle();
    let user = data.get(CMA_HDR_LEN..).unwrap_or(&[]).to_vec();
    let mut e = RdmaCmEvent::new(RdmaCmEventType::ConnectRequest, 0, new_h);
    e.listen_id = Some(listen_h);
    if sidr {
        e.ud = Some(RdmaUdParam {
            private_data: user,
            ah_attr: AhAttr {
                dlid: remote_lid,
                port_num: port,
                ..AhAttr::default()
            },
            qp_num: remote_qpn,
            qkey: 0,
        });
    } else {
        let mut conn = p.req_conn.clone();
        conn.private_data = user;
        e.conn = conn;
    }
    st.counters.requests += 1;
    st.ids[li].push(e);
}

/// `rdma_init_qp_attr` for an RC connection: the attributes the IB CM
/// computes for `state`.
#[doc(alias = "rdma_init_qp_attr")]
pub fn init_qp_attr(
    core: &mut IbCore,
    cma: ClientId,
    id: RdmaCmId,
    state: QpState,
) -> Result<(QpAttr, QpAttrMask)> {
    let (cm, cm_id) = st_id(core, cma, id, |_, st, i| {
        Ok((
            st.cm,
            st.ids[i].cm_id.ok_or(Error::Invalid("not connected"))?,
        ))
    })?;
    cm::init_qp_attr(core, cm, cm_id, state)
}
